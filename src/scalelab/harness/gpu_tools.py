"""The parts that run the checkout's own tools: its GPU tests (suite) and a small sweep through its workflow,
kept as reference results (sweep)."""
from __future__ import annotations

import datetime
import json
import os
import re
import sys

from scalelab.harness import REPO_ROOT
from scalelab.harness.gpu_points import MIN_LEFT_SUITE_S, MIN_LEFT_SWEEP_S
from scalelab.harness.gpu_session import Check, run_bounded


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


def _gpu_slug() -> str:
    import torch

    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-")

