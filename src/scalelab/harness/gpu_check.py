"""The first GPU check, in one command: `make gpu-check` on a machine with an NVIDIA GPU.

    python -m scalelab.harness.gpu_check                  every part, within --deadline-s (needs CUDA)
    python -m scalelab.harness.gpu_check --only bench     some parts: suite | bench | large | fp8 | sweep | diagnose | fsdp | memory | profile | rest | stages
    python -m scalelab.harness.gpu_check --dry-run        the same steps on the CPU with tiny models
    python -m scalelab.harness.gpu_check --bundle-requirements   what `make gpu-bundle` downloads

The parts, in order of value (each gets the time the ones before it left, see --deadline-s):

1. suite: the GPU tests (`pytest -m gpu`);
2. bench: scalelab against a plain PyTorch loop (scalelab.harness.plain_loop: nanoGPT's shape,
   nothing of scalelab's code) at the ~350M GPT (24 layers, d 1024, 16 heads, seq 1024, vocab
   50304, batch 16), bf16 eager and compiled: each a world-size-1 stage-0 scalelab run and the
   plain loop of the same shape and batch, each a fresh process, alternated;
3. large: the same at 1.3B (24 x 2048), bf16 compiled: the 1.3B MFU target's point against
   what the plain loop reaches at that size;
4. fp8: scalelab's fp8 against its bf16, compiled, at the ~350M shape (the bench's bf16 run
   counts) and at 1.3B (24 layers, d 2048, 16 heads, seq 1024, batch 16): fp8/bf16 tokens/s per size;
5. sweep: a small world-size-1 sweep through the workflow into results/reference/<device>-<date>/,
   with the commit recorded (SCALELAB_GIT_COMMIT: a copied tree has no .git);
6. diagnose: what a scalelab/plain gap comes from: the plain loop with one of scalelab's
   differences at a time, bf16 compiled (compiled per block and loss instead of the whole model;
   in DDP at world size 1, as scalelab's one-rank stage 0 ran before the H100 measured it costing
   3%), each against the plain loop as a user writes it;
7. fsdp: what FSDP2 costs over one GPU, where it shards nothing: scalelab at stages 3 and 2, bf16
   compiled, each with one step traced, against its stage-0 run (tokens/s, device busy time);
8. memory: where a memory prediction misses: the GPU test's memory case (12 x 768, seq 1024, batch
   8), eager bf16 at stages 3 and 0, with the CUDA allocator's history over one step: what was live
   at its peak, by the line that allocated it, beside the measured and predicted peaks;
9. profile: one step of each side traced by torch.profiler (bf16 compiled): kernel time by class
   (matmul, attention, compiled, copies, optimizer, communication...), the busiest kernels, the time
   the device was busy; the traces kept under <out>/traces;
10. rest: fp16 and fp32 with TF32, eager and compiled, against the plain loop;
11. stages: every sharded stage (1, 2, 3, hybrid) against the plain FSDP2 loop (torchtitan's recipe), bf16 eager
    and compiled at 350M and 1.3B, with each side's device-busy share and kernel count from one traced step
    (scalelab.harness.stage_check). New, so last here: a session lent a GPU for it runs ``--only stages``.

Once every part has had its turn, the time left repeats the comparisons of parts 2, 3, 4 and 10 (a
second scalelab run, then a second plain run; bf16, then fp8), up to --rounds measurements of
each side, and each side's figure becomes the median of its rounds. Tokens/s of both sides is
from the median step time after the warm-up steps (the same steps, batch and shape); scalelab's
MFU is its run's.

The GPU targets: scalelab/plain >= 0.98, eager and compiled; 350M bf16 compiled MFU >= 0.45;
1.3B bf16 compiled MFU >= 0.55.

The deadline (--deadline-s, default 540 s: the GPU machine gives a command 10 minutes) bounds
the whole check: each process it starts gets the time that is left as its timeout, and a part or
point that would start with too little left is recorded as "not run: deadline". The summary
table comes last; every result is in <out>/gpu-check.json (written after each part, so a check
cut short keeps what it measured), with the logs beside it.

The dry run takes every step on the CPU, one round, one thread per process, and labels its
figures as CPU figures (they say nothing about a GPU): scalelab against the plain loop at a tiny
GPT (2 x 64) in bf16 eager and compiled and fp32 eager, fp8 emulated by torchao against bf16
(eager) at the tiny shape and a small one (2 x 128), a reference sweep kept under --out, and
the plain loop in DDP (eager).
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.harness import REPO_ROOT
from scalelab.harness.gpu_measure import MIN_LEFT_S, Key, _fmt, _status, trace_summary
from scalelab.harness.stage_check import plain_fsdp_args, plain_launcher, stages
from scalelab.harness.testing import local_plan

# ----------------------------------------------------------------------------- what the GPU machine lacks
GPU_MACHINE_HAS = frozenset({
    "numpy", "pandas", "pyarrow", "matplotlib", "seaborn", "pyyaml", "tokenizers", "jinja2", "psutil",
    "pytest", "pytest-xdist", "pytest-timeout", "torch",
})
"""The distributions the GPU machine has installed (Python 3.12, torch with CUDA, no network).
Every runtime dependency of pyproject.toml not named here goes into `make gpu-bundle`'s wheels."""
BUNDLE_EXTRAS = ("torchao",)
"""Beyond the runtime dependencies, what the check needs there: torchao for fp8, at the version
the tests pin (pyproject.toml's ``test`` extra)."""


def _dist_name(requirement: str) -> str:
    """The normalised distribution name of a requirement string ("Jinja2>=3" -> "jinja2")."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)
    return re.sub(r"[-_.]+", "-", name).lower()


def _pyproject(root: Path = REPO_ROOT) -> dict:
    import tomllib

    return tomllib.loads((root / "pyproject.toml").read_text())


def bundle_requirements(root: Path = REPO_ROOT) -> list[str]:
    """The requirements `make gpu-bundle` downloads wheels for: pyproject.toml's runtime
    dependencies that the GPU machine lacks (GPU_MACHINE_HAS), then BUNDLE_EXTRAS as the
    ``test`` extra pins them."""
    project = _pyproject(root)["project"]
    wanted = [r.strip() for r in project["dependencies"] if _dist_name(r) not in GPU_MACHINE_HAS]
    pinned = {_dist_name(r): r.strip() for r in project.get("optional-dependencies", {}).get("test", [])}
    return wanted + [pinned.get(name, name) for name in BUNDLE_EXTRAS if name not in {_dist_name(r) for r in wanted}]


# ----------------------------------------------------------------------------- shapes and points
# GPT shapes of the check: the model (GPT-2's layout, tied embeddings), vocabulary and batch. One
# prepared dataset serves every shape of a run of the check: they share seq_len and vocabulary.
GPU_SHAPES = {
    "350M": {"n_layers": 24, "d_model": 1024, "n_heads": 16, "seq_len": 1024, "vocab_size": 50304, "batch": 16},
    "1.3B": {"n_layers": 24, "d_model": 2048, "n_heads": 16, "seq_len": 1024, "vocab_size": 50304, "batch": 16},
}
DRY_SHAPES = {
    "tiny": {"n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 64, "vocab_size": 256, "batch": 4},
    "small": {"n_layers": 2, "d_model": 128, "n_heads": 4, "seq_len": 64, "vocab_size": 256, "batch": 4},
}
STEPS = {"gpu": (30, 10), "dry": (6, 2)}  # (steps, warm-up steps) of every measured run
TARGETS = {"ratio": 0.98, ("350M", "bf16", True): 0.45, ("1.3B", "bf16", True): 0.55}
TARGETS_TEXT = ("GPU targets: scalelab/plain tokens/s >= 0.98, eager and compiled; "
                "350M bf16 compiled MFU >= 0.45; 1.3B (24 x 2048) bf16 compiled MFU >= 0.55")


COMPARISON_PARTS = ("bench", "large", "rest")
"""The parts that hold scalelab against the plain loop, point by point."""


def comparison_points(dry_run: bool) -> dict[str, list[Key]]:
    """The scalelab-against-plain points of the parts bench, large and rest."""
    shape = "tiny" if dry_run else "350M"
    bench = [Key(shape, "bf16", compiled=c) for c in (False, True)]
    # large: the 1.3B MFU target's point, so a miss can be told apart from what torch reaches there
    large = [Key("small", "bf16")] if dry_run else [Key("1.3B", "bf16", compiled=True)]
    if dry_run:  # fp16 and TF32 mean nothing on a CPU; bf16 took the compiled path of both sides already
        rest = [Key(shape, "fp32")]
    else:  # compiled first: the scalelab/plain gap the first GPU found was a compiled one
        rest = [Key(shape, p, tf32=p == "fp32", compiled=c) for c in (True, False) for p in ("fp16", "fp32")]
    return {"bench": bench, "large": large, "rest": rest}


def diagnose_points(dry_run: bool) -> list[Key]:
    """The plain loop's variants, each one of scalelab's differences from it, at bf16 compiled on a
    GPU (the first GPU check's gap: scalelab compiled ran 0.889 of the plain loop): compile scope and DDP.
    A dry run takes the DDP variant eager (a CPU compilation costs half a minute for nothing)."""
    if dry_run:
        return [Key("tiny", "fp32", variant="ddp")]
    return [Key("350M", "bf16", compiled=True, variant=v) for v in ("blocks", "ddp")]


def fp8_points(dry_run: bool) -> list[tuple[Key, Key]]:
    """(bf16, fp8) pairs at two sizes: compiled on a GPU; eager in a dry run, where fp8 is emulated
    (torchao's float8 casts in bf16) and a compilation per point would cost half a minute of CPU
    for figures that mean nothing (tests/*/test_levers.py compiles emulated fp8)."""
    shapes = DRY_SHAPES if dry_run else GPU_SHAPES
    return [(Key(s, "bf16", compiled=not dry_run), Key(s, "fp8", compiled=not dry_run)) for s in shapes]


# The least time a measurement may start with (seconds): what one needs, start-up and compilation
# included, on each kind of machine; with less left it is recorded as "not run: deadline".
MIN_LEFT_SUITE_S = {"gpu": 30, "dry": 10}
MIN_LEFT_SWEEP_S = {"gpu": 150, "dry": 20}
MAX_MEASURE_S = {"gpu": 300, "dry": 120}
"""The longest one plain-loop measurement may take (a 1.3B compiled run takes ~70 s on a GPU): one that
hangs is stopped there, not at the whole check's deadline, and the parts after it still run."""
RESERVE_S = 5.0  # kept back for the summary and the JSON
LAUNCH_TEARDOWN_S = 15.0  # what a scalelab run may take past its run_timeout_s (stopping its ranks, its results)


# ----------------------------------------------------------------------------- the check
@dataclass
class Check:
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
        from scalelab.plan.sweep import AXIS, RunPoint
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
        print(_measure_line(m), flush=True)
        return m

    def _not_run(self, side: str, key: Key, need: float) -> dict:
        m = {"side": side, "key": key.label, "status": "not run: deadline",
             "reason": f"{max(self.left(), 0):.0f} s left, a run needs {need} s"}
        if not getattr(self, side).get(key):
            getattr(self, side)[key] = [m]
        print(_measure_line(m), flush=True)
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


def _measure_line(m: dict) -> str:
    head = f"  {m['side']:<8} {m['key']:<34}"
    if m["status"] != "ok":
        return f"{head} {m['status']}: {m.get('reason')}"
    gib = lambda v: "-" if not v else f"{v / 2**30:.2f} GiB"  # noqa: E731
    line = f"{head} {m['tokens_per_s']:>12,.0f} tok/s (median step {m['step_time_s_median'] * 1e3:.1f} ms)"
    if m["side"] == "scalelab":
        ratio = m["peak_bytes_measured"] / m["peak_bytes_predicted"] if m["peak_bytes_measured"] and m["peak_bytes_predicted"] else None
        line += (f"  MFU {_fmt(m['mfu'], '.3f')} (bf16 peak {_fmt(m['mfu_bf16_peak'], '.3f')})  peak {gib(m['peak_bytes_measured'])} "
                 f"{m['peak_bytes_measured_is']} / {gib(m['peak_bytes_predicted'])} predicted ({_fmt(ratio, '.2f')})"
                 f"  compile {_fmt(m['compile_time_s'], '.1f')} s")
    else:
        line += f"  peak {gib(m['peak_bytes_measured'])}  first step {m['first_step_s']:.1f} s"
    return line + f"  [{m['wall_s']:.0f} s]"


def _targets_text(targets: list[dict]) -> str:
    return "; ".join(f"{t['target']}: {'n/a' if t['met'] is None else 'met' if t['met'] else 'MISSED'}" for t in targets)


def comparison_table(rows: list[dict], dry_run: bool) -> str:
    head = (f"{'label':<26} {'scalelab tok/s':>15} {'plain tok/s':>13} {'ratio':>7} {'scalelab MFU':>13}  targets"
            + ("   (CPU figures: they say nothing about a GPU)" if dry_run else ""))
    lines = [head]
    for r in rows:
        lines.append(f"{r['label']:<26} {_fmt(r['scalelab_tokens_per_s'], ',.0f'):>15} {_fmt(r['plain_tokens_per_s'], ',.0f'):>13} "
                     f"{_fmt(r['ratio'], '.3f'):>7} {_fmt(r['scalelab_mfu'], '.3f'):>13}  {_targets_text(r['targets'])}"
                     + ("" if r["status"] == "ok" else f"  [{r['status']}]"))
    return "\n".join(lines)


def fp8_table(rows: list[dict], dry_run: bool) -> str:
    lines = [f"{'size':<6} {'model':<22} {'bf16 tok/s':>12} {'fp8 tok/s':>12} {'fp8/bf16':>9} {'bf16 MFU':>9} "
             f"{'fp8 MFU*':>9}  targets (* against the bf16 peak)"
             + ("   (fp8 EMULATED on the CPU: CPU figures, they say nothing about a GPU)" if dry_run else "")]
    for r in rows:
        m = r["model"]
        model = f"{m['n_layers']}x{m['d_model']}, seq {m['seq_len']}, b{m['batch']}"
        lines.append(f"{r['shape']:<6} {model:<22} {_fmt(r['bf16_tokens_per_s'], ',.0f'):>12} {_fmt(r['fp8_tokens_per_s'], ',.0f'):>12} "
                     f"{_fmt(r['fp8_over_bf16'], '.3f'):>9} {_fmt(r['bf16_mfu'], '.3f'):>9} {_fmt(r['fp8_mfu_bf16_peak'], '.3f'):>9}  "
                     f"{_targets_text(r['targets'])}"
                     + ("" if r["status"] == "ok" else f"  [{r['status']}]"))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the parts
def gpu_suite(check: Check) -> dict:
    """`pytest -m gpu`: on a GPU machine it runs them, elsewhere it shows they skip with a reason."""
    if check.left() < MIN_LEFT_SUITE_S[check.kind]:
        return {"status": "not run: deadline", "figures": f"{max(check.left(), 0):.0f} s left"}
    # Each GPU test starts runs of its own (seconds of start-up each, the GPU mostly idle): on a GPU
    # machine several workers share it (8 workers: 33 tests in 83 s on an H200, 50 in 171 s on an H100; one by one
    # they would not fit the deadline). A dry run on a small machine runs them one by one.
    workers = [] if check.dry_run else ["-n", str(max(1, min(8, (os.cpu_count() or 2) // 2))), "--dist", "load"]
    # A test's tier is its folder (tests/conftest.py): collecting tests/gpu alone finds every gpu test, without
    # importing the rest of the suite's modules first (~7 s of CPU before the first test)
    rc, output = run_bounded([sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", *workers],
                             check.left(), cwd=REPO_ROOT)
    (check.out / "gpu-suite.log").write_text(output)
    print(output[-3000:], flush=True)
    tail = next((line.strip("= ") for line in reversed(output.splitlines()) if line.strip()), "")  # "33 skipped, ... in 5.2s"
    if rc is None:
        return {"status": "timeout", "figures": f"stopped at the deadline; {tail}"}
    # 5: no test collected (none marked gpu) is no failure
    return {"status": "ok" if rc in (0, 5) else f"failed (pytest exit {rc})", "figures": tail, "returncode": rc,
            "failed": rc not in (0, 5)}


def _compare(check: Check, part: str) -> dict:
    rows = []
    for key in comparison_points(check.dry_run)[part]:
        if key not in check.scalelab or not any(m["status"] == "ok" for m in check.scalelab[key]):
            check.measure_scalelab(key)
        check.measure_plain(key)
        rows.append(check.comparison(key))
    print(comparison_table(rows, check.dry_run), flush=True)
    return {"status": _status([{"status": r["status"]} for r in rows]),
            "points": [r["label"] for r in rows]}


def bench(check: Check) -> dict:
    """scalelab against the plain loop, bf16 eager and compiled."""
    return _compare(check, "bench")


def large(check: Check) -> dict:
    """scalelab against the plain loop at 1.3B, bf16 compiled (the fp8 part reuses scalelab's run)."""
    return _compare(check, "large")


def rest(check: Check) -> dict:
    """The other precisions against the plain loop."""
    return _compare(check, "rest")


def fp8(check: Check) -> dict:
    """fp8 against bf16, compiled, at two sizes (a bf16 run the bench part measured counts)."""
    rows = []
    for bf16, f8 in fp8_points(check.dry_run):
        for key in (bf16, f8):
            if not any(m["status"] == "ok" for m in check.scalelab.get(key, [])):
                check.measure_scalelab(key)
        rows.append(check.fp8_row(bf16, f8))
    print(fp8_table(rows, check.dry_run), flush=True)
    return {"status": _status([{"status": r["status"]} for r in rows]), "points": [r["shape"] for r in rows]}


def reference_sweep(check: Check) -> dict:
    """A small world-size-1 sweep through the workflow, kept as reference results."""
    import yaml

    from scalelab.harness.testing import snakemake_cmd, tiny_config
    from scalelab.run.launch import git_provenance

    if check.left() < MIN_LEFT_SWEEP_S[check.kind]:
        return {"status": "not run: deadline", "figures": f"{max(check.left(), 0):.0f} s left"}
    date = datetime.date.today().isoformat()
    # reference results (kept, committed) only from a GPU; a dry run's stay in --out
    results = (check.out / f"reference-cpu-dry-run-{date}" if check.dry_run
               else REPO_ROOT / "results" / "reference" / f"{_gpu_slug()}-{date}")
    cfg = tiny_config(sweep={"precision": ["fp32", "bf16"] if check.dry_run else ["fp32", "bf16", "fp16"],
                             "zero_stage": [0, 3], "world_size": [1]})
    cfg["results_dir"] = str(results)
    cfg["train"]["device"] = "cpu" if check.dry_run else "cuda"
    work = check.work / "reference"
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ}
    provenance = git_provenance(REPO_ROOT)
    if provenance["git_commit"] and "SCALELAB_GIT_COMMIT" not in env:
        env["SCALELAB_GIT_COMMIT"] = provenance["git_commit"]
    rc, output = run_bounded(snakemake_cmd(work, "--cores", str(os.cpu_count() or 1)), check.left(), env=env)
    (check.out / "reference-sweep.log").write_text(output)
    if rc != 0:
        why = "stopped at the deadline" if rc is None else f"snakemake exit {rc}"
        print(f"the reference sweep failed ({why}); see {check.out / 'reference-sweep.log'}", flush=True)
        return {"status": "timeout" if rc is None else "failed", "figures": why, "failed": rc is not None}
    summaries = [json.loads(p.read_text()) for p in sorted((results / "runs").glob("*/summary.json"))]
    ok = sum(s.get("status") == "ok" for s in summaries)
    print(f"reference results: {results} (report: {results / 'report' / 'report.html'})", flush=True)
    return {"status": "ok", "figures": f"{ok}/{len(summaries)} runs ok; {results}", "results": str(results)}


def repeat_rounds(check: Check, parts: list[str]) -> None:
    """With the time every part left: further rounds of the comparisons (scalelab then plain) and
    of the fp8 pairs (bf16 then fp8), in the parts' order of value, up to check.rounds
    measurements of each side; a round only where its first one's time fits in what is left."""
    points = comparison_points(check.dry_run)
    todo = []  # (what, [(side, key)])
    for part in ("bench", "large", "fp8", "rest"):
        if part in parts and part == "fp8":
            todo += [(f"fp8 against bf16 at {b.shape}", [("scalelab", b), ("scalelab", f)]) for b, f in fp8_points(check.dry_run)]
        elif part in parts:
            todo += [(k.label, [("scalelab", k), ("plain", k)]) for k in points[part]]
    for round_ in range(2, check.rounds + 1):
        for what, sides in todo:
            ok = {(side, key): [m for m in getattr(check, side).get(key, []) if m["status"] == "ok"] for side, key in sides}
            if not all(ok.values()):
                continue  # a side that never ran, or failed, is not repeated
            due = [(side, key) for side, key in sides if len(ok[(side, key)]) < round_]
            if not due:
                continue
            needed = sum(max(m["wall_s"] for m in ok[s]) for s in due) * 1.2
            if check.left() < needed:
                print(f"  no round {round_} of {what}: {max(check.left(), 0):.0f} s left, it took ~{needed / 1.2:.0f} s",
                      flush=True)
                continue
            for side, key in due:
                (check.measure_scalelab if side == "scalelab" else check.measure_plain)(key)


def _gpu_slug() -> str:
    import torch

    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-")


def diagnose(check: Check) -> dict:
    """What a scalelab/plain gap comes from: the plain loop with one of scalelab's differences at a
    time (compile scope, DDP at world size 1) against the plain loop itself; each variant's ratio
    below 1 is what that difference costs. What is left of the gap is scalelab's own (instrumentation,
    per-step synchronisation)."""
    rows = []
    for key in diagnose_points(check.dry_run):
        if not any(m["status"] == "ok" for m in check.plain.get(key.base, [])):
            check.measure_plain(key.base)
        last = check.measure_plain(key)
        base = [m["tokens_per_s"] for m in check.plain.get(key.base, []) if m["status"] == "ok"]
        mine = [m["tokens_per_s"] for m in check.plain.get(key, []) if m["status"] == "ok"]
        ratio = statistics.median(mine) / statistics.median(base) if base and mine else None
        rows.append({"label": key.label, "status": _status(check.plain.get(key) or [last]), "ratio_to_plain": ratio})
        print(f"plain loop {key.label}: {_fmt(ratio, '.3f')} of the plain loop as a user writes it"
              + (" (CPU figure)" if check.dry_run else ""), flush=True)
    return {"status": _status([{"status": r["status"]} for r in rows]), "variants": rows,
            "figures": "; ".join(f"{r['label']}: {_fmt(r['ratio_to_plain'], '.3f')} of plain" for r in rows)}


def fsdp_points(dry_run: bool) -> list[Key]:
    """scalelab's FSDP2 stages over one device, bf16 compiled on a GPU (eager in a dry run), each
    with one step traced: stage 3 (the first GPU check's figure: 0.79 of its stage-0 twin on an H200), then
    stage 2 (no re-gather in backward: what resharding costs)."""
    shape = "tiny" if dry_run else "350M"
    return [Key(shape, "bf16", compiled=not dry_run, stage=s, variant="traced") for s in (3, 2)]


def fsdp(check: Check) -> dict:
    """What FSDP2 costs on one device, where it shards nothing: each stage's tokens/s against scalelab's
    stage-0 run of the same shape (the bench's, else measured here), and its traced step's device
    time (busy against first-to-last: a device waiting on the host shows as the gap), the traces
    kept under <out>/traces beside the profile part's."""
    points = fsdp_points(check.dry_run)
    base = points[0].base
    if not any(m["status"] == "ok" for m in check.scalelab.get(base, [])):
        check.measure_scalelab(base)
    base_tps = [m["tokens_per_s"] for m in check.scalelab.get(base, []) if m["status"] == "ok"]
    rows, summaries = [], {}
    (check.out / "traces").mkdir(exist_ok=True)
    for key in points:
        m = check.measure_scalelab(key)
        ratio = m["tokens_per_s"] / statistics.median(base_tps) if m["status"] == "ok" and base_tps else None
        row = {"label": key.label, "status": m["status"], "ratio_to_stage_0": ratio, "mfu": m.get("mfu"),
               "peak_bytes_measured": m.get("peak_bytes_measured"), "peak_bytes_predicted": m.get("peak_bytes_predicted")}
        if m["status"] == "ok" and m.get("trace") and Path(m["trace"]).exists():
            shutil.copy(m["trace"], check.out / "traces" / f"scalelab-{key.slug}.json")
            summaries[f"stage {key.stage}"] = row["trace"] = trace_summary(m["trace"])
        rows.append(row)
        print(f"scalelab {key.label}: {_fmt(ratio, '.3f')} of its stage-0 run"
              + (" (CPU figure)" if check.dry_run else ""), flush=True)
    if summaries:
        print(profile_table(summaries), flush=True)
    if all(r["status"] == "not run: deadline" for r in rows):
        return {"status": "not run: deadline", "figures": f"{max(check.left(), 0):.0f} s left"}
    return {"status": _status([{"status": r["status"]} for r in rows]), "variants": rows,
            "figures": "; ".join(f"{r['label']}: {_fmt(r['ratio_to_stage_0'], '.3f')} of stage 0" for r in rows),
            "failed": any("failed" in r["status"] for r in rows)}


# The GPU test's memory case (tests/gpu/test_gpu.py: 12 x 768, seq 1024, batch 8, byte tokens), eager:
# bf16 at stage 3 measured 13.7% over its prediction on an H200, stage 0 within 1%.
MEMORY_MODEL = {"gpu": {"n_layers": 12, "d_model": 768, "n_heads": 12, "seq_len": 1024},
                "dry": {"n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 64}}
MEMORY_CASES = (("bf16", 3), ("bf16", 0))
ALLOCATOR_FRAMES = ("c10::", "CUDACachingAllocator", "at::empty", "at::native::empty", "at::detail::empty",
                    "at::TensorBase::", "at::_ops::empty", "allocate", "Allocator", "??", "torch::unwrap_dispatch",
                    "_record_memory_history", "gather_traceback", "at::native::_to_copy", "at::_ops::",
                    "c10::impl::", "at::(anonymous", "torch::autograd::VariableType", "wrap_kernel_functor",
                    "c10::BoxedKernel", "c10::Dispatcher", "at::native::", "torch::unwind", "CapturedTraceback")


def allocation_site(frames: list[dict]) -> str:
    """Where an allocation came from, short: its innermost Python frame and the first scalelab frame
    above it, or (an allocation of autograd's engine thread, which has no Python frames) its
    innermost C++ frames that are neither the allocator nor the dispatcher."""
    py = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    fmt = lambda f: f"{Path(f['filename']).name}:{f['line']} {f['name']}"  # noqa: E731
    if py:
        ours = next((f for f in py if "scalelab" in f["filename"]), None)
        return fmt(py[0]) + (f" <- {fmt(ours)}" if ours is not None and ours is not py[0] else "")
    names = [f["name"] for f in frames if not any(a in f["name"] for a in ALLOCATOR_FRAMES)]
    return " <- ".join(n[:60] for n in names[:2]) or "(no frames)"


def snapshot_peak(path: str | Path, top: int = 15) -> dict:
    """What a CUDA allocator snapshot (torch.cuda.memory._dump_snapshot, history included) held at
    the peak of its history: allocated bytes then (those allocated before the history began, the
    model state, counted from the segments at the dump), and the live allocations made within the
    history grouped by allocation_site, largest first."""
    import pickle

    snap = pickle.loads(Path(path).read_bytes())
    events = max(snap["device_traces"], key=len)
    allocated_at_dump = sum(b["size"] for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated")

    def replay(until: int | None = None):
        live, now, peak, at = {}, 0, 0, -1
        for i, e in enumerate(events[: None if until is None else until + 1]):
            if e["action"] == "alloc":
                live[e["addr"]] = e
                now += e["size"]
            elif e["action"] == "free_completed" and e["addr"] in live:
                now -= live.pop(e["addr"])["size"]
            if now > peak:
                peak, at = now, i
        return live, now, peak, at

    live_end, now_end, peak, at = replay()
    before = allocated_at_dump - now_end  # allocated before the history began and alive at the dump
    live, _, _, _ = replay(at)
    groups: dict[str, list] = {}
    for e in live.values():
        g = groups.setdefault(allocation_site(e.get("frames", [])), [0, 0])
        g[0] += 1
        g[1] += e["size"]
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])
    return {"events": len(events), "before_history_bytes": before, "peak_in_history_bytes": peak,
            "peak_bytes": before + peak, "at_peak": allocation_site(events[at].get("frames", [])) if at >= 0 else None,
            "live_at_peak": [{"site": k[:200], "count": v[0], "bytes": v[1]} for k, v in ranked[:top]],
            "live_at_peak_other_bytes": sum(v[1] for _, v in ranked[top:])}


def memory(check: Check) -> dict:
    """Where a memory prediction misses: the GPU test's memory case (MEMORY_MODEL), eager, bf16 at
    stages 3 and 0, each run with the CUDA allocator's history recorded through one step after the
    warm-up (train.memory_snapshot), then what was live at the history's peak, by the line that
    allocated it (snapshot_peak), beside the measured and predicted peaks. A dry run takes the CPU
    path and has no allocator history (the GPU's alone)."""
    from scalelab.harness.testing import tiny_config
    from scalelab.plan.sweep import RunPoint
    from scalelab.run.launch import launch_run

    rows = []
    for precision, stage in MEMORY_CASES:
        label = f"{precision} stage {stage}"
        need = MIN_LEFT_S[(check.kind, False)]
        if check.left() < need:
            rows.append({"label": label, "status": "not run: deadline"})
            continue
        cfg = tiny_config(dataset={"synthetic_bytes": 2_000_000},
                          train={"device": "cpu" if check.dry_run else "cuda", "steps": 6, "warmup_steps": 3,
                                 "global_batch": 8 if not check.dry_run else 4, "profile": [4, 4], "memory_snapshot": True,
                                 "run_timeout_s": max(1.0, check.left() - LAUNCH_TEARDOWN_S)})
        cfg["model"].update(MEMORY_MODEL[check.kind])
        data = check.memory_data(cfg)
        run_dir = check.work / "runs" / f"memory-{precision}-{stage}"
        try:
            s = launch_run(cfg, local_plan(cfg, RunPoint(precision, stage, 1)), data, run_dir, check.out / "logs" / f"memory-{precision}-{stage}.log",
                           threads=check.threads)
        except Exception as err:  # a check on a lent machine goes on to its other points
            s = {"status": "failed", "reason": f"launch_run raised {type(err).__name__}: {err}"}
        measured, predicted = s.get("peak_mem_allocated_bytes"), s.get("predicted_peak_bytes")
        row = {"label": label, "status": s["status"], "reason": s.get("reason"), "measured_bytes": measured,
               "predicted_bytes": predicted, "measured_over_predicted": measured / predicted if measured and predicted else None}
        snapshot = run_dir / "memory" / "rank0.pickle"
        if snapshot.exists():
            row["snapshot"] = snapshot_peak(snapshot)
        rows.append(row)
        print(f"memory {label}: measured {_fmt(measured and measured / 2**20, ',.1f')} MiB, predicted "
              f"{_fmt(predicted and predicted / 2**20, ',.1f')} MiB ({_fmt(row['measured_over_predicted'], '.3f')})"
              + (" (CPU: process RSS is not measured here)" if check.dry_run else ""), flush=True)
        if "snapshot" in row:
            p = row["snapshot"]
            print(f"  the history's peak: {p['peak_bytes'] / 2**20:,.1f} MiB ({p['before_history_bytes'] / 2**20:,.1f} MiB from "
                  f"before it); reached at {p['at_peak']}; live then, by site:", flush=True)
            for g in p["live_at_peak"]:
                print(f"  {g['bytes'] / 2**20:10.1f} MiB {g['count']:5d}x  {g['site'][:150]}", flush=True)
    return {"status": _status([{"status": r["status"]} for r in rows]), "cases": rows,
            "figures": "; ".join(f"{r['label']}: {_fmt(r.get('measured_over_predicted'), '.3f')} of predicted" for r in rows),
            "failed": any("failed" in r["status"] for r in rows)}


def profile_table(summaries: dict[str, dict]) -> str:
    """The traced steps side by side: totals, then milliseconds per kernel class."""
    sides = list(summaries)
    lines = [f"{'one traced step':<22}" + "".join(f"{side:>22}" for side in sides)]
    for field_, label in (("kernels", "kernels"), ("kernel_ms", "kernel time (ms)"), ("busy_ms", "device busy (ms)"),
                          ("span_ms", "first to last (ms)")):
        lines.append(f"{label:<22}" + "".join(f"{_fmt(summaries[s][field_], ',.1f'):>22}" for s in sides))
    classes = sorted({c for s in sides for c in summaries[s]["by_class"]},
                     key=lambda c: -max(summaries[s]["by_class"].get(c, {"ms": 0})["ms"] for s in sides))
    for c in classes:
        cells = [summaries[s]["by_class"].get(c) for s in sides]
        texts = [f"{x['ms']:,.1f} ms / {x['count']}" if x else "-" for x in cells]
        lines.append(f"{c:<22}" + "".join(f"{t:>22}" for t in texts))
    return "\n".join(lines)


def profile(check: Check) -> dict:
    """One step of scalelab's run and of the plain loop, bf16 compiled (eager in a dry run), traced
    by torch.profiler: where the device's time goes on each side, kernel class by class, and the
    busiest kernels (gpu-check.json), so that a gap the bench part measures has its cause on record.
    The traces are kept under <out>/traces."""
    key = Key("tiny" if check.dry_run else "350M", "bf16", compiled=not check.dry_run, variant="traced")
    sides = {"scalelab": check.measure_scalelab(key), "plain loop": check.measure_plain(key)}
    summaries, failed = {}, []
    (check.out / "traces").mkdir(exist_ok=True)
    for side, m in sides.items():
        trace = m.get("trace")
        if m["status"] != "ok" or not trace or not Path(trace).exists():
            failed.append(f"{side}: {m['status']}" + ("" if m["status"] != "ok" else " (no trace written)"))
            continue
        shutil.copy(trace, check.out / "traces" / f"{side.replace(' ', '-')}.json")
        summaries[side] = trace_summary(trace)
    if summaries:
        print(profile_table(summaries), flush=True)
        for side, summary_ in summaries.items():
            print(f"{side}: the busiest kernels", flush=True)
            for k in summary_["top"][:8]:
                print(f"  {k['ms']:9.2f} ms {k['count']:5d}x  {k['name'][:100]}", flush=True)
    figures = "; ".join(f"{side}: {s['kernels']} kernels, {s['kernel_ms']:.1f} ms of kernels, busy {s['busy_ms']:.1f} ms"
                        for side, s in summaries.items())
    if all(m["status"] == "not run: deadline" for m in sides.values()):
        return {"status": "not run: deadline", "figures": f"{max(check.left(), 0):.0f} s left"}
    return {"status": "ok" if not failed else "; ".join(failed), "figures": figures, "summaries": summaries,
            "failed": bool(failed) and not any(m["status"].startswith("not run") for m in sides.values())}


PARTS = {"suite": gpu_suite, "bench": bench, "large": large, "fp8": fp8, "sweep": reference_sweep, "diagnose": diagnose, "fsdp": fsdp,
         "memory": memory, "profile": profile, "rest": rest, "stages": stages}
"""The parts in order of value: each runs with the time the ones before it left. The stages part, new, comes
last in a whole check; a session lent a GPU for it runs it alone (``--only stages``)."""


def summary(check: Check, parts: list[str]) -> str:
    record = check.record()
    lines = [f"== summary: {check.elapsed():.0f} s of the {check.deadline_s:g} s deadline"
             + (" -- DRY RUN on the CPU: CPU figures, they say nothing about a GPU" if check.dry_run else ""),
             TARGETS_TEXT,
             f"{'part':<8} {'point':<24} {'status':<27} figures"]
    for name in PARTS:
        part = check.parts.get(name)
        if part is None:
            status = "not selected" if name not in parts else "not run"
            lines.append(f"{name:<8} {'':<24} {status:<27}")
            continue
        if name in COMPARISON_PARTS:
            for r in (c for c in record["comparisons"] if c["label"] in part.get("points", [])):
                lines.append(f"{name:<8} {r['label']:<24} {r['status']:<27} scalelab {_fmt(r['scalelab_tokens_per_s'], ',.0f')} "
                             f"plain {_fmt(r['plain_tokens_per_s'], ',.0f')} tok/s, ratio {_fmt(r['ratio'], '.3f')}, "
                             f"MFU {_fmt(r['scalelab_mfu'], '.3f')}, rounds {r['rounds'][0]}+{r['rounds'][1]}; "
                             f"{_targets_text(r['targets'])}")
        elif name == "fp8":
            for r in record["fp8"]:
                lines.append(f"{name:<8} {r['shape'] + (' (emulated)' if r['fp8_emulated'] else ''):<24} {r['status']:<27} "
                             f"bf16 {_fmt(r['bf16_tokens_per_s'], ',.0f')} fp8 {_fmt(r['fp8_tokens_per_s'], ',.0f')} tok/s, "
                             f"fp8/bf16 {_fmt(r['fp8_over_bf16'], '.3f')}, bf16 MFU {_fmt(r['bf16_mfu'], '.3f')}, "
                             f"rounds {r['rounds'][0]}+{r['rounds'][1]}"
                             + (f"; {_targets_text(r['targets'])}" if r["targets"] else ""))
        else:
            lines.append(f"{name:<8} {'':<24} {part['status']:<27} {part.get('figures', '')}")
    lines.append(f"results: {check.out / 'gpu-check.json'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalelab.harness.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU, tiny models")
    parser.add_argument("--only", choices=list(PARTS), action="append", help="run only these parts (repeatable)")
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "gpu-check"), help="where the JSON and logs go")
    parser.add_argument("--deadline-s", type=float, default=540.0, help="the whole check's time (default 540 s)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="at most this many rounds of each comparison, time allowing (default 2; dry run 1)")
    parser.add_argument("--bundle-requirements", action="store_true",
                        help="print the requirements `make gpu-bundle` downloads wheels for, and exit")
    args = parser.parse_args(argv)
    if args.bundle_requirements:
        print("\n".join(bundle_requirements()))
        return 0
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible (use --dry-run to check the CPU path)", file=sys.stderr)
        return 2
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          + (f"{torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "no GPU")
          + (" -- DRY RUN on the CPU: these figures are CPU figures" if args.dry_run else "")
          + f"; deadline {args.deadline_s:g} s", flush=True)
    print(TARGETS_TEXT + (" (a dry run measures none of them)" if args.dry_run else ""), flush=True)
    parts = [name for name in PARTS if name in (args.only or PARTS)]
    with tempfile.TemporaryDirectory(prefix="scalelab-gpu-check-") as work:
        check = Check(out, args.dry_run, args.deadline_s, Path(work),
                      rounds=args.rounds if args.rounds is not None else 1 if args.dry_run else 2)
        for name in parts:
            print(f"== {name} ({max(check.left(), 0):.0f} s left)", flush=True)
            try:
                check.parts[name] = PARTS[name](check)
            except Exception as err:  # a check on a lent machine goes on to its other parts
                import traceback

                traceback.print_exc()
                check.parts[name] = {"status": "failed", "figures": f"{type(err).__name__}: {err}"[:300], "failed": True}
            check.write()
        if check.rounds > 1:
            print(f"== further rounds ({max(check.left(), 0):.0f} s left)", flush=True)
            repeat_rounds(check, parts)
        record = check.record()
        for name, part in check.parts.items():  # the measuring parts' status, further rounds included
            if "points" in part:
                rows = ([r for r in record["comparisons"] if r["label"] in part["points"]] if name != "fp8"
                        else [r for r in record["fp8"] if r["shape"] in part["points"]])
                part["status"] = _status([{"status": r["status"]} for r in rows])
                part["failed"] = any("failed" in r["status"] for r in rows)
        check.write()
        if any(n in check.parts for n in COMPARISON_PARTS):
            print("== scalelab against the plain loop (tokens/s from the median step; ratio = scalelab / plain)", flush=True)
            print(comparison_table(check.record()["comparisons"], args.dry_run), flush=True)
        if "fp8" in check.parts:
            print(f"== fp8 against bf16, {'eager, fp8 EMULATED' if args.dry_run else 'compiled'}", flush=True)
            print(fp8_table(check.record()["fp8"], args.dry_run), flush=True)
        print(summary(check, parts), flush=True)
    return 1 if any(p.get("failed") for p in check.parts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
