"""Run start-up cut to what a run needs (#27, point 1): the launcher of a CPU run imports no torch,
the worker module imports no FSDP/DTensor/DCP/torchao/dynamo by itself, and the ranks the
launcher starts itself (no torchrun agent) end together: a rank that dies takes the others
down, the time limit stops them all, and nothing of the process group outlives the attempt."""
import json
import os
import subprocess
import sys
import time

from scalelab.harness.testing import processes_mentioning
from scalelab.run.ranks import run_ranks


def test_a_cpu_runs_launcher_imports_no_torch(tmp_path, tiny_data):
    """What the Snakemake job script does (launch_run on the workflow's plan of the point),
    in a fresh interpreter: the run trains, and torch was never imported in that process."""
    script = f"""
import json, sys
from scalelab.harness.testing import local_plan, tiny_config
from scalelab.planning.sweep import RunPoint
from scalelab.run.launch import launch_run
cfg = tiny_config(train={{"steps": 4, "warmup_steps": 1}})
summary = launch_run(cfg, local_plan(cfg, RunPoint("fp32", 0, 1)), {str(tiny_data)!r}, {str(tmp_path / "run")!r},
                     {str(tmp_path / "run.log")!r}, threads=1)
print(json.dumps({{"status": summary["status"], "reason": summary["reason"], "torch": "torch" in sys.modules}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == "ok", result["reason"]
    assert result["torch"] is False, "the launcher of a CPU run imported torch"


def test_the_worker_module_imports_no_strategy_it_may_not_use():
    """FSDP2, DTensor, DCP, ZeroRedundancyOptimizer (whose package imports FSDP), torchao and
    TorchDynamo are imported by the code that uses them, not with the worker module (each rank
    imports it first thing)."""
    heavy = ["torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint",
             "torch.distributed.optim", "torchao", "torch._dynamo"]
    script = f"import sys, scalelab.run.worker; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


def _rank(code: str, marker: str) -> tuple[list[str], dict]:
    return [sys.executable, "-c", code, marker], {**os.environ}


SLEEPER = "import subprocess, sys, time; subprocess.Popen(['sleep', '600', sys.argv[1]]); time.sleep(600)"
"""A rank that never ends by itself, with a child of its own (killed with the group, not by its parent)."""


def test_a_rank_that_dies_takes_the_others_down(tmp_path):
    marker = f"scalelab-test-marker-{os.getpid()}-dies"
    (tmp_path / "run").mkdir()
    start = time.monotonic()
    status, reason, warning, _ = run_ranks([_rank(SLEEPER, marker), _rank("import sys; sys.exit(5)", marker)],
                                         tmp_path / "run.log", timeout_s=300, run_dir=tmp_path / "run")
    assert time.monotonic() - start < 60, "the surviving rank was left to its time limit"
    assert status == "failed" and reason.endswith("(rank 1 exit code 5)") and warning is None
    assert processes_mentioning(marker) == []


def test_a_failure_names_the_process_that_really_ran(tmp_path):
    """A world-size-1 run is one rank the launcher started, not a torchrun (issue #40: the reason
    said "torchrun exit code 1")."""
    (tmp_path / "run").mkdir()
    status, reason, _, _ = run_ranks([_rank("import sys; sys.exit(3)", "one-rank")], tmp_path / "run.log",
                                      timeout_s=60, run_dir=tmp_path / "run")
    assert status == "failed" and reason.endswith("(rank 0 exit code 3)") and "torchrun" not in reason


def test_the_time_limit_stops_every_rank_and_their_children(tmp_path):
    marker = f"scalelab-test-marker-{os.getpid()}-limit"
    (tmp_path / "run").mkdir()
    start = time.monotonic()
    status, reason, _, _ = run_ranks([_rank(SLEEPER, marker), _rank(SLEEPER, marker)],
                                   tmp_path / "run.log", timeout_s=3, run_dir=tmp_path / "run")
    assert 3 <= time.monotonic() - start < 60
    assert status == "timeout" and "train.run_timeout_s=3 s" in reason
    assert processes_mentioning(marker) == []


def test_a_rendezvous_port_taken_before_rank_0_listens_is_retried_on_a_new_one(tmp_path, tiny_data, monkeypatch):
    """free_port's port is free when chosen and bound only by rank 0's TCPStore: another process can
    take it in between (8 GPU test workers did, on an H100). The launcher starts the ranks again on
    a new port, and the run is ok; the log says what happened."""
    import socket

    from scalelab.planning.sweep import RunPoint
    from scalelab.run import ranks
    from support import run_point, taken_port_first

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        first_the_taken_port, handed = taken_port_first(taken.getsockname()[1], ranks.free_port)
        monkeypatch.setattr(ranks, "free_port", first_the_taken_port)
        summary, steps, run_dir = run_point(tmp_path, tiny_data, RunPoint("fp32", 0, 2))
    assert summary["status"] == "ok", summary["reason"]
    assert len(handed) == 2  # the taken port, then a new one for the second attempt
    log = (tmp_path / "fp32-z0-w2.log").read_text()
    assert log.count("name: EADDRINUSE") == 1  # TCPStore's own message, once: the first attempt's
    assert "starting the ranks again on a new port (attempt 2 of 3)" in log
    assert len(steps) > 0


def test_a_port_taken_every_time_ends_the_run_failed_with_its_reason(tmp_path, tiny_data, monkeypatch):
    """Three attempts, then a failed run that names the cause: never a retry loop without end."""
    import socket

    from scalelab.planning.sweep import RunPoint
    from scalelab.run import ranks
    from support import run_point

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(ranks, "free_port", lambda: taken.getsockname()[1])
        summary, _, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", 0, 2))
    assert summary["status"] == "failed"
    assert "could not listen on its rendezvous port (EADDRINUSE" in summary["reason"], summary["reason"]
    assert (tmp_path / "fp32-z0-w2.log").read_text().count("starting the ranks again on a new port") == 2
