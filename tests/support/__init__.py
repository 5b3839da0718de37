"""What tests of several files share (``from support import ...``: pyproject.toml puts tests/ on pytest's
pythonpath): the paths and workdir helpers of scalelab.harness.testing (the fault drills use them too), a
real run of one sweep point, real ranks over gloo, a dry run's planned jobs. Helpers that only one
subject's tests of several tiers share sit beside it, in tests/support/<subject>.py. Fixtures stay in
tests/conftest.py."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow.parquet as pq

from scalelab.formulas.predicted_columns import refreshed
from scalelab.harness import REPO_ROOT as REPO
from scalelab.harness.testing import BIN, SNAKEMAKE, local_plan, tiny_config, write_workdir
from scalelab.harness.testing import run_snakemake as snakemake
from scalelab.planning.column_checks import steps_problems, summary_problems
from scalelab.planning.columns import IDENTITY as COLUMNS_IDENTITY
from scalelab.planning.run_plan import run_plan
from scalelab.run.launch import launch_run

__all__ = ["BIN", "PARITY_STEPS", "REPO", "SNAKEMAKE", "fake_nvidia_smi", "path_without", "planned_jobs", "run_point", "snakemake",
           "strategy_steps", "suite_calibration", "taken_port_first", "tiny_config", "write_workdir"]

PARITY_STEPS = 10


def suite_calibration(tiny_data: Path) -> Path:
    """This worker's CPU peak record for one-thread ranks (scalelab.run.calibration), measured once, in
    process, beside the shared data. A run a test launches outside the workflow otherwise times
    its own matmuls at start (its dtype's and bf16's, ~0.3-1 s of every run), which no test reads.
    A rank of another thread count (world size 1: two threads here) still measures its own, so that
    path stays exercised. In process, not scalelab.run.sweep_calibration's child: unit
    tests reach this through run_point (points that are skipped, never launched) and start no process."""
    path = tiny_data.parent / "cpu-calibration.json"
    if not path.exists():
        import torch

        from scalelab.run.calibration import write_calibration

        threads = torch.get_num_threads()
        try:
            write_calibration(path, threads=1)
        finally:
            torch.set_num_threads(threads)  # this process's own tests keep theirs
    return path


def run_point(tmp_path, tiny_data, point, cfg=None, fault=None, device_plan=None, **kwargs):
    """Launch one sweep point for real (torchrun, gloo); return (summary with its formula columns as collection
    computes them, steps table, run folder).
    fault: a SCALELAB_FAULT spec for this run only; device_plan: the workflow's device decision (a DevicePlan),
    else the one it would make for cfg."""
    # Parity runs up to world size 4 on 2 cores: correctness, not measurement, so over-commit is allowed.
    cfg = cfg or tiny_config(train={"steps": PARITY_STEPS, "warmup_steps": 2}, planning={"launch_overcommitted": True})
    kwargs.setdefault("calibration", suite_calibration(tiny_data))
    run_dir = tmp_path / point.path
    plan = (local_plan(cfg, point) if device_plan is None else
            run_plan(cfg, point, device=device_plan.device, device_reason=device_plan.why))
    old = os.environ.pop("SCALELAB_FAULT", None)
    if fault:
        os.environ["SCALELAB_FAULT"] = fault
    try:
        summary = launch_run(cfg, plan, tiny_data, run_dir, tmp_path / f"{point.run_id}.log", threads=2, **kwargs)
    finally:
        os.environ.pop("SCALELAB_FAULT", None)
        if old is not None:
            os.environ["SCALELAB_FAULT"] = old
    assert json.loads((run_dir / "summary.json").read_text()) == json.loads(json.dumps(summary, default=str))
    # no deprecation warning of the project's making between the progress lines and the status
    log = (tmp_path / f"{point.run_id}.log").read_text()
    assert "deprecated" not in log, [line for line in log.splitlines() if "deprecated" in line]
    steps = pq.read_table(run_dir / "steps.parquet")
    # Every real run of the suite against the column table (scalelab.planning.columns). A compiled run
    # without its warm-up (tests only) has no compile time, which the table says it has.
    if kwargs.get("compile_warm_up", True):
        assert summary_problems(summary) == [], (point.run_id, summary_problems(summary))
        identity = {c.name: summary[c.name] for c in COLUMNS_IDENTITY}
        assert steps_problems(steps, identity) == [], (point.run_id, steps_problems(steps, identity))
    # with the formula columns beside the measurements, as collection computes them (the worker writes none)
    return refreshed(summary), steps.to_pandas(), run_dir


def strategy_steps(out: Path, world_size: int, *args: str, timeout_s: float = 180, script: str = "strategy_steps.py"):
    """Run tests/ranks/<script> (strategy_steps.py unless said) on world_size real ranks (gloo) with
    these arguments, started and waited for as the launcher's (scalelab.run.ranks.start_and_wait: the first
    rank to fail ends the attempt); what rank 0 wrote to out, or an assertion with the ranks' output's tail."""
    import sys
    import tempfile

    from scalelab.run.ranks import RENDEZVOUS_ATTEMPTS, free_port, rendezvous_port_taken, start_and_wait

    for _ in range(RENDEZVOUS_ATTEMPTS):  # a new port when rank 0 found its own taken, as the launcher does
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world_size),
               "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
        processes = [([sys.executable, str(REPO / "tests" / "ranks" / script), "--out", str(out), *args],
                      {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}) for rank in range(world_size)]
        with tempfile.TemporaryFile() as log:
            codes, timed_out, _, _ = start_and_wait(processes, log, timeout_s)
            log.seek(0)
            tail = log.read().decode(errors="replace")[-12000:]
        if not (codes[0] and rendezvous_port_taken(tail)):
            break
    assert not timed_out, f"ranks still running after {timeout_s} s:\n{tail}"
    assert codes == [0] * world_size, f"exit codes {codes}:\n{tail}"
    return json.loads(out.read_text())


def taken_port_first(taken_port: int, free_port):
    """(a stand-in for free_port, the ports it handed out): the taken port to the first attempt, then what free_port
    finds, as another process taking a run's rendezvous port before rank 0 binds it would leave it."""
    handed = []

    def first_the_taken_port() -> int:
        handed.append(free_port() if handed else taken_port)
        return handed[-1]

    return first_the_taken_port, handed


def planned_jobs(dry_run_output: str) -> list[dict]:
    """The jobs of a `snakemake -n` printout: rule, wildcards and resources of each."""
    jobs = []
    for block in re.split(r"^(?:localrule|rule) ", dry_run_output, flags=re.M)[1:]:
        job = {"rule": block.split(":", 1)[0], "wildcards": {}, "resources": {}}
        threads = re.search(r"^\s+threads: (\d+)$", block, flags=re.M)
        job["threads"] = int(threads.group(1)) if threads else 1
        for key in ("wildcards", "resources"):
            line = re.search(rf"^\s+{key}: (.*)$", block, flags=re.M)
            if line:
                job[key] = dict(item.split("=", 1) for item in line.group(1).split(", "))
        jobs.append(job)
    return jobs


def path_without(tool: str, *first: Path) -> str:
    """PATH with `first` in front and no folder holding `tool` (simulates a machine without it)."""
    folders = [str(f) for f in first] + [d for d in os.environ["PATH"].split(os.pathsep)
                                          if d and not (Path(d) / tool).exists()]
    return os.pathsep.join(folders)


def fake_nvidia_smi(folder, names):
    """An `nvidia-smi` on PATH that lists these GPUs (`-L`), as the real one prints them."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"GPU {i}: {name} (UUID: GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd)\\n" for i, name in enumerate(names))
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] && printf '{lines}' && exit 0\nexit 9\n")
    script.chmod(0o755)
    return folder
