"""Ranks forked from the prefork server (scalelab.run.prefork) are the processes the launcher
would have started: the same losses, the same command line in `ps`, the same process-group and
lifetime guarantees (they die with the launcher, with the server, at the time limit); and where
the server could differ from a new process, it refuses and the run starts new processes, saying why."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from scalelab.harness.testing import processes_mentioning
from scalelab.planning.sweep import RunPoint
from scalelab.run.prefork import FORKED_LAUNCH, PREFORK_ENV, start_server, stop_server
from scalelab.run.ranks import LOCAL_LAUNCH
from support import PARITY_STEPS, run_point


def _wait_for(predicate, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_forked_run_trains_as_a_new_process_does(tmp_path, tiny_data, monkeypatch):
    """Stage 3 at world size 2 (the most collectives), forked and then as new processes: the same
    losses to the bit, the same peak RSS (a new process runs its rank in a child forked after the same
    imports: scalelab.run.prefork.run_forked; it read ~45 MiB, 14%, higher before), the launch recorded
    as it happened, and no refusal in the log."""
    assert os.environ.get(PREFORK_ENV), "the suite's worker has a prefork server (tests/conftest.py)"
    point = RunPoint("fp32", 3, 2)
    forked, forked_steps, _ = run_point(tmp_path / "forked", tiny_data, point)
    monkeypatch.delenv(PREFORK_ENV)
    new, new_steps, _ = run_point(tmp_path / "new", tiny_data, point)
    assert (forked["status"], new["status"]) == ("ok", "ok")
    assert (forked["launch"], new["launch"]) == (FORKED_LAUNCH, LOCAL_LAUNCH)
    assert forked_steps["loss"].tolist() == new_steps["loss"].tolist() and len(new_steps) == PARITY_STEPS
    rss = forked["peak_rss_bytes"], new["peak_rss_bytes"]
    assert abs(rss[0] - rss[1]) <= 0.05 * min(rss), f"peak RSS forked {rss[0] / 2**20:.1f} MiB, new {rss[1] / 2**20:.1f} MiB"
    assert "ranks started as new processes" not in (tmp_path / "forked" / f"{point.run_id}.log").read_text()


def test_a_server_refuses_what_a_new_process_would_import_differently(tmp_path, tiny_data, monkeypatch):
    """A variable torch reads while loading, set after the server started: the run starts new
    processes and its log names the variable; a server that is gone: the same, and says so."""
    point = RunPoint("fp32", 0, 1)
    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")
    summary, _, _ = run_point(tmp_path / "a", tiny_data, point)
    log = (tmp_path / "a" / f"{point.run_id}.log").read_text()
    assert summary["status"] == "ok" and summary["launch"] == LOCAL_LAUNCH
    assert "refused: import-time environment differs from the server's: TORCH_SHOW_CPP_STACKTRACES" in log
    monkeypatch.delenv("TORCH_SHOW_CPP_STACKTRACES")
    monkeypatch.setenv(PREFORK_ENV, "scalelab-prefork-nobody-listens")
    summary, _, _ = run_point(tmp_path / "b", tiny_data, point)
    log = (tmp_path / "b" / f"{point.run_id}.log").read_text()
    assert summary["status"] == "ok" and summary["launch"] == LOCAL_LAUNCH
    assert "prefork server scalelab-prefork-nobody-listens not reachable" in log


LAUNCH_RUN = ("import sys; from scalelab.harness.testing import local_plan, tiny_config; from scalelab.planning.sweep import RunPoint; "
              "from scalelab.run.launch import launch_run; "
              "cfg = tiny_config(train={'steps': 20, 'warmup_steps': 1, 'run_timeout_s': float(sys.argv[3]) if sys.argv[3:] else 300}, "
              "planning={'launch_overcommitted': True})")
"""A launcher script's set-up: arguments data folder, output folder[, run time limit]."""

LAUNCH_HANGING_RUN = LAUNCH_RUN + """
import json
summary = launch_run(cfg, local_plan(cfg, RunPoint("fp32", 0, 2)), sys.argv[1], sys.argv[2] + "/run", sys.argv[2] + "/run.log", threads=2)
print(json.dumps({k: summary[k] for k in ("status", "reason", "launch")}))
"""


def _hanging_run(tmp_path, tiny_data, timeout_s: float = 300) -> subprocess.Popen:
    """A launcher (a new process, as a Snakemake job is) whose rank 1 hangs at step 2."""
    env = {**os.environ, "SCALELAB_FAULT": "hang@step=2,rank=1"}
    return subprocess.Popen([sys.executable, "-c", LAUNCH_HANGING_RUN, str(tiny_data), str(tmp_path), str(timeout_s)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ranks(tmp_path) -> list[str]:
    """The run's ranks as `ps` shows them: by their worker command line and its run folder."""
    return [p for p in processes_mentioning(str(tmp_path / "run" / "run_plan.json")) if "scalelab.run.worker" in p]


def test_forked_ranks_die_with_their_launcher(tmp_path, tiny_data):
    launcher = _hanging_run(tmp_path, tiny_data)
    try:
        ranks = _wait_for(lambda: len(_ranks(tmp_path)) == 2 and _ranks(tmp_path), what="two forked ranks in ps")
        assert all("-m scalelab.run.worker --plan" in r for r in ranks), ranks  # the title a new process has
        _wait_for(lambda: (tmp_path / "run" / "progress.jsonl").exists(), what="the first step")
    finally:
        launcher.kill()
        launcher.communicate()
    _wait_for(lambda: not _ranks(tmp_path), timeout_s=10, what="the ranks to die with their launcher")


def test_forked_ranks_stop_at_the_time_limit(tmp_path, tiny_data):
    launcher = _hanging_run(tmp_path, tiny_data, timeout_s=8)
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["launch"] == FORKED_LAUNCH
    assert result["status"] == "timeout" and "train.run_timeout_s=8 s" in result["reason"]
    assert not _ranks(tmp_path)


def test_forked_ranks_die_with_the_server_and_the_run_fails_loudly(tmp_path, tiny_data, monkeypatch):
    """A server of the test's own (so the suite's survives): SIGKILLed mid-run, its ranks get
    SIGTERM (PR_SET_PDEATHSIG) and the launcher records the run failed, not ok."""
    monkeypatch.delenv(PREFORK_ENV)
    server = start_server(owner_dir=tmp_path)
    try:
        launcher = _hanging_run(tmp_path, tiny_data)
        _wait_for(lambda: len(_ranks(tmp_path)) == 2, what="two forked ranks")
        os.kill(server.pid, signal.SIGKILL)
        out, err = launcher.communicate(timeout=60)
    finally:
        stop_server(server)
    assert launcher.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["launch"] == FORKED_LAUNCH and result["status"] == "failed", result
    assert "scalelab: the prefork server ended (or stopped answering) while the ranks ran; they were stopped" in (tmp_path / "run.log").read_text()
    assert not _ranks(tmp_path)


def test_the_server_answers_pids_in_rank_order(tmp_path):
    """The launcher names a failed rank by its place in the server's answer: rank 2 alone exits 2
    (argparse: no --plan), the others 1 (no such plan file)."""
    from scalelab.run.prefork import fork_ranks

    worker = [sys.executable, "-m", "scalelab.run.worker"]
    processes = [(worker + (["--no-such-option"] if rank == 2 else ["--plan", str(tmp_path / "absent.json")]),
                  dict(os.environ)) for rank in range(4)]
    with open(tmp_path / "ranks.log", "ab") as log:
        ranks, why = fork_ranks(processes, log.fileno())
    assert why is None and len(ranks) == 4
    try:
        assert [rank.wait() for rank in ranks] == [1, 1, 2, 1]
    finally:
        ranks[0].channel.close()
    assert "absent.json" in (tmp_path / "ranks.log").read_text()  # their tracebacks, in the log they were given


def test_a_forked_rank_takes_its_launchers_cores(tmp_path, tiny_data):
    """A launcher allowed core 1 only gives its forked rank that core, as a new process would
    inherit it, not the server's."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    script = (f"import json; {LAUNCH_RUN}; "
              "summary = launch_run(cfg, local_plan(cfg, RunPoint('fp32', 0, 1)), sys.argv[1], sys.argv[2] + '/run', sys.argv[2] + '/run.log', threads=1); "
              "print(json.dumps({k: summary[k] for k in ('status', 'launch', 'rank_cores')}))")
    out = subprocess.run([sys.executable, "-c", script, str(tiny_data), str(tmp_path / "one_core")], capture_output=True,
                         text=True, timeout=300, preexec_fn=lambda: os.sched_setaffinity(0, {1}))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"status": "ok", "launch": FORKED_LAUNCH, "rank_cores": "r0:1"}


def test_a_server_imports_torch_only_when_a_run_asks(tmp_path, monkeypatch):
    """A sweep that trains nothing on the CPU (a report from cached runs) never pays for the import,
    and the import never overlaps the calibration that the first training job makes before it asks."""
    monkeypatch.delenv(PREFORK_ENV)
    server = start_server(owner_dir=tmp_path)
    try:
        time.sleep(2)
        maps = open(f"/proc/{server.pid}/maps").read()
        assert server.poll() is None and "scalelab" in open(f"/proc/{server.pid}/cmdline").read()
        assert "libtorch" not in maps
    finally:
        stop_server(server)


def test_the_sweeps_calibration_is_forked_by_the_server_else_a_new_process(tmp_path, monkeypatch, capsys):
    """The first training job's calibration: forked by the invocation's server, which has imported torch (no
    interpreter starts); a server that refuses, a new process and why; without a server, a new process; a
    calibration that fails says why and returns None (each run then measures its own)."""
    from scalelab.run import calibration, sweep_calibration

    assert os.environ.get(PREFORK_ENV), "tests/conftest.py starts a server per pytest worker"
    real_run = subprocess.run

    def no_new_process(*args, **kwargs):
        raise AssertionError(f"a new process: {args[0]}")

    monkeypatch.setattr(subprocess, "run", no_new_process)
    forked = sweep_calibration.ensure_calibration(tmp_path / "forked.json", 1)
    assert forked == tmp_path / "forked.json" and calibration.read_calibration(forked)["threads"] == 1
    # the machine's load beside the peaks: idle or busy, whichever this host is as the test runs
    assert re.search(r"scalelab: CPU peak per rank \(1 thread\(s\)\), measured on the (idle|busy) machine \(load [\d.]+ on "
                     r"\d+ cores[^)]*\): bf16", capsys.readouterr().err)
    failed = sweep_calibration.ensure_calibration(tmp_path / "failed.json", 0)  # torch.set_num_threads(0) raises
    assert failed is None and not (tmp_path / "failed.json").exists()
    err = capsys.readouterr().err
    assert "measuring the CPU's peak FLOP/s failed; each run measures its own" in err and "RuntimeError" in err, err

    monkeypatch.setattr(subprocess, "run", real_run)
    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")  # read while torch loads: the server refuses, and says why
    refused = sweep_calibration.ensure_calibration(tmp_path / "refused.json", 1)
    assert refused == tmp_path / "refused.json" and calibration.read_calibration(refused)["threads"] == 1
    assert ("scalelab: the CPU calibration runs in a new process: prefork server" in (err := capsys.readouterr().err)
            and "refused: import-time environment differs from the server's: TORCH_SHOW_CPP_STACKTRACES" in err), err
    monkeypatch.delenv("TORCH_SHOW_CPP_STACKTRACES")
    monkeypatch.delenv(PREFORK_ENV)
    alone = sweep_calibration.ensure_calibration(tmp_path / "alone.json", 1)
    assert alone == tmp_path / "alone.json" and calibration.read_calibration(alone)["threads"] == 1
    assert "new process" not in capsys.readouterr().err  # no server at all: nothing to explain


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_a_server_serves_its_own_user_only(tmp_path):
    """An abstract socket has no file permissions: the server checks who connected (SO_PEERCRED)."""
    from scalelab.run.prefork import fork_ranks

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # as nobody, ask for a rank
        try:
            os.setuid(65534)
            ranks, why = fork_ranks([([sys.executable, "-m", "scalelab.run.worker", "--plan", "x"], dict(os.environ))], 1)
            os.write(write, str(why).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        why = answer.read()
    os.waitpid(pid, 0)
    assert "refused: the server serves user 0 only, not 65534" in why


def test_a_server_exits_with_its_owner(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c",
                              "import time; from scalelab.run.prefork import start_server; "
                              f"s = start_server(owner_dir={str(tmp_path)!r}); print(s.pid, flush=True); time.sleep(600)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(owner.stdout.readline())
        assert any(str(tmp_path) in p for p in processes_mentioning("scalelab.run.prefork")), processes_mentioning("prefork")
    finally:
        owner.kill()
        owner.wait()
    _wait_for(lambda: not processes_mentioning(str(tmp_path)), timeout_s=10, what=f"server {server_pid} to exit")


_RUN_FORKED = r'''
import os, signal, sys, time
import scalelab.run.prefork as prefork
prefork.import_rank_modules = lambda: None  # the imports are not what this checks
def main():
    how = sys.argv[1]
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "abort":
        os.abort()
    if how == "sleep":
        print("child", os.getpid(), flush=True)
        time.sleep(60)
    if how == "exit":
        sys.exit("the rank's message")
    if how == "raise":
        raise RuntimeError("the rank's error")
    return {"ok": 0, "three": 3}[how]
sys.exit(prefork.run_forked(main))
'''


@pytest.mark.parametrize("how, code, says", [("ok", 0, ""), ("three", 3, ""), ("exit", 1, "the rank's message"),
                                             ("raise", 1, "RuntimeError: the rank's error"),
                                             ("sigkill", -signal.SIGKILL, ""), ("abort", -signal.SIGABRT, "")])
def test_a_new_rank_forked_after_its_imports_ends_as_the_rank_ended(tmp_path, how, code, says):
    """scalelab.run.prefork.run_forked: the process the launcher started ends with its rank's exit status,
    or by its signal (the launcher reads SIGKILL as out of memory), and says what the rank said."""
    proc = subprocess.run([sys.executable, "-c", _RUN_FORKED, how], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert says in proc.stderr
    assert len(list(tmp_path.glob("core*"))) <= 1, "no second core file beside the rank's own"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_started_process_reaches_its_forked_rank(tmp_path, sig):
    """SIGINT and SIGTERM to the process the launcher started end its forked rank, by that signal. (SIGINT
    at its default, as a shell leaves it: a pytest-xdist worker ignores it, and an ignored signal stays
    ignored in the processes it starts, the rank too.)"""
    proc = subprocess.Popen([sys.executable, "-c", _RUN_FORKED, "sleep"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        child = int(proc.stdout.readline().split()[1])
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == -sig
        _wait_for(lambda: not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z",
                  what="the forked rank to end")
    finally:
        proc.kill()
        proc.wait()
