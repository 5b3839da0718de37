"""The first GPU check, in one command: `make gpu-check` on a machine with an NVIDIA GPU.

    python -m scalelab.harness.gpu_check               suite + benchmark + reference sweep (needs CUDA)
    python -m scalelab.harness.gpu_check --only bench  one part: suite | bench | sweep
    python -m scalelab.harness.gpu_check --dry-run     the same steps on the CPU with a tiny model

1. the GPU tests (`pytest -m gpu`);
2. a benchmark of the ~350M GPT (24 layers, d 1024, 16 heads, seq 1024, vocab 50304) at world
   size 1, bf16 / fp16 / fp32 with TF32 / fp8, eager and compiled: tokens/s, MFU (against
   the precision's dense peak and against the bf16 peak), peak memory measured vs predicted;
3. a small world-size-1 sweep through the workflow into results/reference/<device>-<date>/,
   with the commit recorded (SCALELAB_GIT_COMMIT: a copied tree has no .git).

Each part prints what it measured and writes it as JSON under --out (default
results/gpu-check/). The dry run exercises every step that does not need CUDA, on the CPU,
and labels its figures as CPU figures: they say nothing about a GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scalelab.harness import REPO_ROOT

# The ~350M GPT of the MFU goal (GPT-2 medium's shape, vocab padded to a multiple of 64).
GPT_350M = {"n_layers": 24, "d_model": 1024, "n_heads": 16, "seq_len": 1024, "tie_embeddings": True}
VOCAB_350M = 50304
TINY = {"n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 64, "tie_embeddings": True}
# (label, precision, tf32, compile)
BENCH_POINTS = [(f"{p}{'+tf32' if tf32 else ''}{' compiled' if comp else ''}", p, tf32, comp)
                for p, tf32 in (("bf16", False), ("fp16", False), ("fp32", True), ("fp8", False))
                for comp in (False, True)]


def _bench_config(dry_run: bool, data_dir: Path, tf32: bool) -> dict:
    from scalelab.harness.testing import tiny_config

    cfg = tiny_config()
    cfg["model"].update(TINY if dry_run else GPT_350M)
    cfg["train"].update(steps=6 if dry_run else 30, warmup_steps=2 if dry_run else 10,
                        global_batch=4 if dry_run else 16, device="cpu" if dry_run else "cuda",
                        tf32=tf32 and not dry_run, fp8_emulate=dry_run, run_timeout_s=600)
    cfg["dataset"].update(name="bench", source="tokenized", path=str(data_dir / "corpus"),
                          vocab_size=256 if dry_run else VOCAB_350M)
    return cfg


def _tokens(data_dir: Path, vocab: int, n_tokens: int) -> None:
    """A tokenized corpus of random ids (speed does not depend on the text)."""
    import numpy as np

    corpus = data_dir / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rng.integers(0, vocab, n_tokens, dtype=np.uint16).tofile(corpus / "train.bin")
    rng.integers(0, vocab, n_tokens // 10, dtype=np.uint16).tofile(corpus / "val.bin")


def benchmark(out: Path, dry_run: bool) -> list[dict]:
    """One world-size-1 run per benchmark point, side by side in this one process."""
    from scalelab.config import dataset_config
    from scalelab.data import prepare_dataset
    from scalelab.sweep import AXIS, RunPoint
    from scalelab.training.launch import launch_run

    work = Path(tempfile.mkdtemp(prefix="scalelab-bench-"))
    _tokens(work, 256 if dry_run else VOCAB_350M, 200_000 if dry_run else 4_000_000)
    base = _bench_config(dry_run, work, tf32=False)
    prepare_dataset(dataset_config(base), work / "data", seq_len=base["model"]["seq_len"])
    points = [p for p in BENCH_POINTS if "compile" in AXIS or not p[3]]
    if dry_run:  # fp16, TF32 and compile speed mean nothing on a CPU: eager fp32 and emulated fp8 show the path
        points = [("fp32", "fp32", False, False), ("fp8", "fp8", False, False)]
    rows = []
    for label, precision, tf32, compiled in points:
        cfg = _bench_config(dry_run, work, tf32)
        lever = {"compile": compiled} if "compile" in AXIS else {}
        point = RunPoint(precision, 0, 1, **lever)
        started = time.time()
        s = launch_run(cfg, point, work / "data", work / "runs" / label.replace(" ", "-"),
                       work / "logs" / f"{label.replace(' ', '-')}.log", threads=os.cpu_count() or 1)
        peak = s.get("peak_mem_allocated_bytes") or s.get("peak_rss_bytes")  # device memory; on a CPU the process RSS
        rows.append({"label": label, "status": s["status"], "reason": s.get("reason"),
                     "tokens_per_s": s.get("tokens_per_s"), "mfu": s.get("mfu"), "mfu_bf16_peak": s.get("mfu_bf16_peak"),
                     "peak_flops_source": s.get("peak_flops_source"), "peak_bytes_measured": peak,
                     "peak_bytes_predicted": s.get("predicted_peak_bytes"), "compile_time_s": s.get("compile_time_s"),
                     "wall_s": time.time() - started, "device_name": s.get("device_name"),
                     "n_params": s.get("n_params")})
        print(_bench_line(rows[-1]), flush=True)
    (out / "bench.json").write_text(json.dumps({"dry_run": dry_run, "rows": rows}, indent=2, default=str))
    return rows


def _bench_line(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['label']:<18} {r['status']}: {r['reason']}"
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    ratio = (r["peak_bytes_measured"] / r["peak_bytes_predicted"]) if r["peak_bytes_measured"] and r["peak_bytes_predicted"] else None
    return (f"{r['label']:<18} {fmt(r['tokens_per_s'], ',.0f'):>10} tok/s  MFU {fmt(r['mfu'], '.3f')} "
            f"(bf16 peak {fmt(r['mfu_bf16_peak'], '.3f')})  peak {fmt((r['peak_bytes_measured'] or 0) / 2**30, '.2f')} GiB "
            f"measured / {fmt((r['peak_bytes_predicted'] or 0) / 2**30, '.2f')} predicted device memory ({fmt(ratio, '.3f')}; "
            "on a CPU the measured figure is the process RSS)"
            f"  compile {fmt(r['compile_time_s'], '.1f')} s")


def gpu_suite(out: Path, dry_run: bool) -> int:
    """`pytest -m gpu`: on a GPU machine it runs them, elsewhere it shows they skip with a reason."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=540)
    (out / "gpu-suite.log").write_text(proc.stdout + proc.stderr)
    print(proc.stdout[-3000:], flush=True)
    return proc.returncode


def reference_sweep(out: Path, dry_run: bool) -> Path:
    """A small world-size-1 sweep through the workflow, kept as reference results."""
    import yaml

    from scalelab.harness.testing import snakemake_cmd, tiny_config
    from scalelab.training.launch import git_provenance

    date = datetime.date.today().isoformat()
    # reference results (kept, committed) only from a GPU; a dry run's stay in --out
    results = out / f"reference-cpu-dry-run-{date}" if dry_run else REPO_ROOT / "results" / "reference" / f"{_gpu_slug()}-{date}"
    cfg = tiny_config(sweep={"precision": ["fp32", "bf16"] if dry_run else ["fp32", "bf16", "fp16"],
                             "zero_stage": [0, 3], "world_size": [1]})
    cfg["results_dir"] = str(results)
    cfg["train"]["device"] = "cpu" if dry_run else "cuda"
    work = Path(tempfile.mkdtemp(prefix="scalelab-reference-"))
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ}
    provenance = git_provenance(REPO_ROOT)
    if provenance["git_commit"] and "SCALELAB_GIT_COMMIT" not in env:
        env["SCALELAB_GIT_COMMIT"] = provenance["git_commit"]
    proc = subprocess.run(snakemake_cmd(work, "--cores", str(os.cpu_count() or 1)), env=env, capture_output=True,
                          text=True, timeout=540)
    (out / "reference-sweep.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"the reference sweep failed; see {out / 'reference-sweep.log'}")
    print(f"reference results: {results} (report: {results / 'report' / 'report.html'})", flush=True)
    return results


def _gpu_slug() -> str:
    import torch

    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-")


PARTS = {"suite": gpu_suite, "bench": benchmark, "sweep": reference_sweep}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalelab.harness.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="every step that needs no CUDA, on the CPU, tiny model")
    parser.add_argument("--only", choices=list(PARTS), action="append", help="run only these parts (repeatable)")
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "gpu-check"), help="where the JSON and logs go")
    args = parser.parse_args(argv)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible (use --dry-run to check the CPU path)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          + (f"{torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "no GPU")
          + (" -- DRY RUN on the CPU: these figures are CPU figures" if args.dry_run else ""), flush=True)
    failed = 0
    for name in args.only or list(PARTS):
        print(f"== {name}", flush=True)
        result = PARTS[name](out, args.dry_run)
        failed += name == "suite" and result not in (0, 5)  # 5: no test collected (none marked gpu)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
