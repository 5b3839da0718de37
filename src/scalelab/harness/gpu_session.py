"""One run of the GPU check (Check): its clock against the deadline, each side's measurements (a
scalelab run, the plain loop's process), the figures derived from them and the JSON record; and
run_bounded, which starts a process that the deadline can stop."""
from __future__ import annotations

import functools
import json
import os
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.harness.gpu_measure import MIN_LEFT_S, Key, _status
from scalelab.harness.gpu_points import (
    COMPARISON_PARTS,
    DRY_SHAPES,
    GPU_SHAPES,
    LAUNCH_TEARDOWN_S,
    MAX_MEASURE_S,
    RESERVE_S,
    STEPS,
    TARGETS,
    TARGETS_TEXT,
    comparison_points,
    fp8_points,
)
from scalelab.harness.gpu_tables import measure_line
from scalelab.harness.stage_check import plain_fsdp_args, plain_launcher
from scalelab.harness.testing import local_plan


@dataclass
class Check:
    """One run of the check: where it writes, its deadline, and both sides' measurements, by key."""

    out: Path
    dry_run: bool
    deadline_s: float
    work: Path
    rounds: int = 2
    started: float = field(default_factory=lambda: time.monotonic())
    scalelab: dict = field(default_factory=dict)  # Key -> [measurement]
    plain: dict = field(default_factory=dict)  # Key -> [measurement]
    parts: dict = field(default_factory=dict)  # part name -> record
    data_dir: Path | None = None

    @property
    def kind(self) -> str:
        return "dry" if self.dry_run else "gpu"

    @property
    def threads(self) -> int:
        """CPU threads of each measured process, the same for both sides: one in a dry run (two
        threads of a busy 2-core machine wait on each other for tens of milliseconds a step)."""
        return 1 if self.dry_run else os.cpu_count() or 1

    @property
    def shapes(self) -> dict:
        return DRY_SHAPES if self.dry_run else GPU_SHAPES

    def left(self) -> float:
        """Seconds left for work (the deadline less what the summary keeps back)."""
        return self.deadline_s - (time.monotonic() - self.started) - RESERVE_S

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # -- measurements
    def measure_scalelab(self, key: Key) -> dict:
        need = MIN_LEFT_S[(self.kind, key.compiled)]
        if self.left() < need:
            return self._not_run("scalelab", key, need)
        from scalelab.planning.sweep import AXIS, RunPoint
        from scalelab.run.launch import launch_run

        data_dir = self._data()
        n = sum(m["status"] != "not run: deadline" for m in self.scalelab.get(key, []))
        cfg = self._config(key)
        if key.traced:  # one step after the warm-up; the measurement window leaves it out
            cfg["train"]["profile"] = [cfg["train"]["warmup_steps"] + 1] * 2
        if self.dry_run and key.replicas > 1:  # hybrid's ranks on a small CPU: a check of the path, not a measurement
            cfg["planning"]["launch_overcommitted"] = True
        lever = {"compile": key.compiled} if "compile" in AXIS else {}
        point = RunPoint(key.precision, key.stage, key.replicas, replicas=key.replicas, **lever)
        started = time.monotonic()
        name = f"scalelab-{key.slug}-{n + 1}"
        try:
            s = launch_run(cfg, local_plan(cfg, point), data_dir, self.work / "runs" / name, self.out / "logs" / f"{name}.log",
                           threads=self.threads, calibration=self.cpu_calibration)
        except Exception as err:  # a check on a lent machine goes on to its other points
            s = {"status": "failed", "reason": f"launch_run raised {type(err).__name__}: {err}"}
        per_step = s.get("tokens_per_step")
        median = s.get("step_time_s_median")
        peak = s.get("peak_mem_allocated_bytes") or s.get("peak_rss_bytes")  # device memory; on a CPU the process RSS
        m = {"side": "scalelab", "key": key.label, "round": n + 1, "status": s["status"], "reason": s.get("reason"),
             "tokens_per_s": per_step / median if per_step and median else None,
             "tokens_per_s_mean": s.get("tokens_per_s"), "step_time_s_median": median, "mfu": s.get("mfu"),
             "mfu_bf16_peak": s.get("mfu_bf16_peak"), "peak_flops_source": s.get("peak_flops_source"),
             "peak_bytes_measured": peak, "peak_bytes_measured_is": "device" if s.get("peak_mem_allocated_bytes") else "process RSS",
             "peak_bytes_predicted": s.get("predicted_peak_bytes"), "compile_time_s": s.get("compile_time_s"),
             "wall_s": time.monotonic() - started, "device_name": s.get("device_name"), "n_params": s.get("n_params"),
             "fp8_emulated": s.get("fp8_emulated"), "log": str(self.out / "logs" / f"{name}.log"),
             "trace": str(self.work / "runs" / name / "trace" / "rank0.json") if key.traced else None}
        return self._keep("scalelab", key, m)

    def measure_plain(self, key: Key) -> dict:
        need = MIN_LEFT_S[(self.kind, key.compiled)]
        if self.left() < need:
            return self._not_run("plain", key, need)
        shape = self.shapes[key.shape]
        steps, warmup = STEPS[self.kind]
        n = sum(m["status"] != "not run: deadline" for m in self.plain.get(key, []))
        name = f"plain-{key.slug}-{n + 1}"
        result_path = self.work / f"{name}.json"
        cmd = [*plain_launcher(key), "-m", "scalelab.harness.plain_loop", "--n-layers", str(shape["n_layers"]),
               "--d-model", str(shape["d_model"]), "--n-heads", str(shape["n_heads"]), "--seq-len", str(shape["seq_len"]),
               "--vocab-size", str(shape["vocab_size"]), "--batch-size", str(shape["batch"] // key.replicas), "--steps", str(steps),
               "--warmup-steps", str(warmup), "--precision", key.precision, "--device", "cpu" if self.dry_run else "cuda",
               "--json", str(result_path)]
        cmd += ["--compile"] if key.compiled else []
        cmd += ["--compile-scope", "blocks"] if key.variant == "blocks" else []
        cmd += ["--ddp"] if key.variant == "ddp" else []
        cmd += ["--tf32"] if key.tf32 else []
        cmd += plain_fsdp_args(key)
        trace = self.work / f"{name}.trace.json" if key.traced else None
        cmd += ["--trace", str(trace)] if trace else []
        cmd += ["--threads", str(self.threads)]
        started = time.monotonic()
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "PYTHONUNBUFFERED": "1"}
        rc, output = run_bounded(cmd, min(self.left(), MAX_MEASURE_S[self.kind]), env=env)
        log = self.out / "logs" / f"{name}.log"
        log.write_text(" ".join(cmd) + "\n" + output)
        m = {"side": "plain", "key": key.label, "round": n + 1, "wall_s": time.monotonic() - started, "log": str(log)}
        if rc == 0 and result_path.exists():
            r = json.loads(result_path.read_text())
            m.update(status="ok", reason=None, tokens_per_s=r["tokens_per_s"], tokens_per_s_mean=r["tokens_per_s_mean"],
                     step_time_s_median=r["step_time_s_median"], peak_bytes_measured=r["peak_mem_allocated_bytes"],
                     first_step_s=r["first_step_s"], n_params=r["n_params"], device_name=r["device_name"],
                     final_loss=r["final_loss"], trace=str(trace) if trace else None)
        elif rc is None:
            m.update(status="timeout", reason=f"stopped after {time.monotonic() - started:.0f} s (at most "
                                              f"{MAX_MEASURE_S[self.kind]} s a measurement, within the {self.deadline_s:g} s deadline)")
        else:
            oom = "out of memory" in output.lower()
            m.update(status="oom" if oom else "failed", reason=f"exit code {rc}: {output.strip()[-500:]}")
        return self._keep("plain", key, m)

    def _keep(self, side: str, key: Key, m: dict) -> dict:
        """Record a measurement (in place of a "not run" one of the same key)."""
        store = getattr(self, side)
        store[key] = [old for old in store.get(key, []) if not old["status"].startswith("not run")] + [m]
        print(measure_line(m), flush=True)
        return m

    def _not_run(self, side: str, key: Key, need: float) -> dict:
        m = {"side": side, "key": key.label, "status": "not run: deadline",
             "reason": f"{max(self.left(), 0):.0f} s left, a run needs {need} s"}
        if not getattr(self, side).get(key):
            getattr(self, side)[key] = [m]
        print(measure_line(m), flush=True)
        return m

    @functools.cached_property
    def cpu_calibration(self) -> Path | None:
        """A dry run's CPU peak, measured once for all its scalelab runs as a sweep measures one
        (scalelab.run.sweep_calibration): their MFU on one scale, and no run timing its own matmuls at
        start. None on a GPU (datasheet peaks), or where measuring failed (each run then measures its own)."""
        if not self.dry_run:
            return None
        from scalelab.run.sweep_calibration import ensure_calibration

        return ensure_calibration(self.work / "calibration" / "cpu.json", self.threads)

    def _config(self, key: Key) -> dict:
        from scalelab.harness.testing import tiny_config

        shape = self.shapes[key.shape]
        steps, warmup = STEPS[self.kind]
        cfg = tiny_config()
        cfg["model"].update({k: shape[k] for k in ("n_layers", "d_model", "n_heads", "seq_len")}, tie_embeddings=True)
        cfg["train"].update(steps=steps, warmup_steps=warmup, global_batch=shape["batch"],
                            device="cpu" if self.dry_run else "cuda", tf32=key.tf32 and not self.dry_run,
                            fp8_emulate=self.dry_run, run_timeout_s=max(1.0, self.left() - LAUNCH_TEARDOWN_S))
        cfg["dataset"].update(name="bench", source="tokenized", path=str(self.work / "corpus"),
                              vocab_size=shape["vocab_size"])
        return cfg

    def _data(self) -> Path:
        """The random-token corpus, prepared once (speed does not depend on the text)."""
        if self.data_dir is None:
            import numpy as np

            from scalelab.config import dataset_config
            from scalelab.run.data import prepare_dataset

            shape = next(iter(self.shapes.values()))
            corpus = self.work / "corpus"
            corpus.mkdir(parents=True, exist_ok=True)
            rng = np.random.default_rng(0)
            n_tokens = 200_000 if self.dry_run else 4_000_000
            rng.integers(0, shape["vocab_size"], n_tokens, dtype=np.uint16).tofile(corpus / "train.bin")
            rng.integers(0, shape["vocab_size"], n_tokens // 10, dtype=np.uint16).tofile(corpus / "val.bin")
            self.data_dir = self.work / "data"
            prepare_dataset(dataset_config(self._config(Key(next(iter(self.shapes)), "fp32"))), self.data_dir,
                            seq_len=shape["seq_len"])
        return self.data_dir

    def memory_data(self, cfg: dict) -> Path:
        """The memory case's byte-token data (the GPU test's), prepared once."""
        from scalelab.config import dataset_config
        from scalelab.run.data import prepare_dataset

        data = self.work / "memory-data"
        if not data.exists():
            prepare_dataset(dataset_config(cfg), data, seq_len=cfg["model"]["seq_len"])
        return data

    # -- derived figures
    def comparison(self, key: Key) -> dict:
        """scalelab against the plain loop at one key: each side's median over its rounds."""
        s = [m for m in self.scalelab.get(key, []) if m["status"] == "ok"]
        p = [m for m in self.plain.get(key, []) if m["status"] == "ok"]
        s_tps = statistics.median(m["tokens_per_s"] for m in s) if s else None
        p_tps = statistics.median(m["tokens_per_s"] for m in p) if p else None
        mfu = statistics.median(m["mfu"] for m in s) if s and all(m["mfu"] is not None for m in s) else None
        ratio = s_tps / p_tps if s_tps and p_tps else None
        # the plain loop's MFU: its tokens/s at scalelab's FLOPs per token and peak (MFU / tokens/s of a run)
        plain_mfu = (statistics.median(m["mfu"] / m["tokens_per_s_mean"] for m in s) * p_tps
                     if mfu is not None and p_tps and all(m["tokens_per_s_mean"] for m in s) else None)
        row = {"label": key.label, "shape": key.shape, "precision": key.precision, "tf32": key.tf32,
               "compiled": key.compiled, "scalelab_tokens_per_s": s_tps, "plain_tokens_per_s": p_tps, "ratio": ratio,
               "scalelab_mfu": mfu, "plain_mfu": plain_mfu,
               "rounds": [len(s), len(p)], "status": _status(self.scalelab.get(key, []) + self.plain.get(key, [])),
               "targets": self.targets(key, ratio, mfu)}
        return row

    def fp8_row(self, bf16: Key, fp8: Key) -> dict:
        b = [m for m in self.scalelab.get(bf16, []) if m["status"] == "ok"]
        f = [m for m in self.scalelab.get(fp8, []) if m["status"] == "ok"]
        b_tps = statistics.median(m["tokens_per_s"] for m in b) if b else None
        f_tps = statistics.median(m["tokens_per_s"] for m in f) if f else None
        b_mfu = statistics.median(m["mfu"] for m in b) if b and all(m["mfu"] is not None for m in b) else None
        f_mfu = statistics.median(m["mfu_bf16_peak"] for m in f) if f and all(m["mfu_bf16_peak"] is not None for m in f) else None
        return {"shape": bf16.shape, "model": self.shapes[bf16.shape], "compiled": bf16.compiled,
                "bf16_tokens_per_s": b_tps, "fp8_tokens_per_s": f_tps, "fp8_over_bf16": f_tps / b_tps if b_tps and f_tps else None,
                "bf16_mfu": b_mfu, "fp8_mfu_bf16_peak": f_mfu, "rounds": [len(b), len(f)],
                "fp8_emulated": self.dry_run or any(m.get("fp8_emulated") for m in f),
                "status": _status(self.scalelab.get(bf16, []) + self.scalelab.get(fp8, [])),
                "targets": self.targets(bf16, None, b_mfu, with_ratio=False)}

    def targets(self, key: Key, ratio: float | None, mfu: float | None, with_ratio: bool = True) -> list[dict]:
        """The GPU targets of a key and whether they were met (None: no figure, or a dry run,
        whose CPU figures are held against no target)."""
        met = lambda value, goal: None if value is None or self.dry_run else value >= goal  # noqa: E731
        out = [{"target": f"ratio >= {TARGETS['ratio']}", "met": met(ratio, TARGETS["ratio"])}] if with_ratio else []
        goal = TARGETS.get((key.shape, key.precision, key.compiled))
        if goal is not None and not key.tf32:
            out.append({"target": f"MFU >= {goal}", "met": met(mfu, goal)})
        return out

    # -- JSON
    def record(self) -> dict:
        points = comparison_points(self.dry_run)
        return {"dry_run": self.dry_run, "figures": "CPU figures: they say nothing about a GPU" if self.dry_run else "GPU figures",
                "deadline_s": self.deadline_s, "elapsed_s": self.elapsed(), "targets": TARGETS_TEXT,
                "shapes": self.shapes, "steps": dict(zip(("steps", "warmup_steps"), STEPS[self.kind])),
                "parts": self.parts,
                "comparisons": [self.comparison(k) for part in COMPARISON_PARTS if part in self.parts for k in points[part]
                                if k in self.scalelab or k in self.plain],  # not the fp8 part's 1.3B bf16 run alone
                "fp8": [self.fp8_row(b, f) for b, f in fp8_points(self.dry_run) if b in self.scalelab or f in self.scalelab],
                "measurements": {"scalelab": {k.label: v for k, v in self.scalelab.items()},
                                 "plain": {k.label: v for k, v in self.plain.items()}}}

    def write(self) -> None:
        (self.out / "gpu-check.json").write_text(json.dumps(self.record(), indent=2, default=str))


def run_bounded(cmd: list[str], timeout_s: float, **kwargs) -> tuple[int | None, str]:
    """(exit code, stdout and stderr) of cmd in a process group of its own; at the timeout the
    whole group is stopped (SIGTERM, then SIGKILL) and the exit code is None."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            **kwargs)
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout_s))
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, _ = proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                out = ""
        return None, out or ""

