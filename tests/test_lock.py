"""One writer per results folder (scalelab.results.lock): unit tests with real holder processes, and
two Snakemake workflows from two checkouts sharing one absolute results_dir."""
import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import scalelab
from conftest import tiny_config, write_workdir
from scalelab.harness.testing import run_snakemake, snakemake_cmd, snakemake_env
from scalelab.plan.sweep import RUN_DIR_GLOB
from scalelab.results.lock import LOCK_NAME, LockHeld, ResultsLock, holder, results_lock

SRC = str(Path(scalelab.__file__).resolve().parents[1])

# A holder process: waits for `go`, takes the lock, says so, then ends as `mode` says.
HOLDER = r"""
import sys, time, pathlib
from scalelab.results.lock import LockHeld, results_lock
results, go, mode = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
deadline = time.time() + 60
while not go.exists() and time.time() < deadline:
    time.sleep(0.005)
try:
    note = results_lock(results).acquire()
except LockHeld as err:
    print("refused", err, flush=True)
    sys.exit(3)
print("won", note or "", flush=True)
if mode == "raise":
    raise RuntimeError("the workflow crashed")
if mode == "hold":
    sys.stdin.read()  # until the test closes stdin (or kills it)
"""


def _holder(tmp_path, results, mode, go=None, cwd=None):
    go = go or tmp_path / "go"
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(results), str(go), mode], cwd=cwd or tmp_path,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SRC}, start_new_session=True)


def _first_line(proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if line:
            return line
        if proc.poll() is not None:
            break
    raise AssertionError(f"no line from holder (rc {proc.poll()}): {proc.stderr.read() if proc.poll() is not None else ''}")


def _stop(*procs):
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream:
                stream.close()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _write_record(results: Path, **record) -> Path:
    """A record left in the lock file by a holder that is gone (no flock on it)."""
    results.mkdir(parents=True, exist_ok=True)
    base = {"pid": _dead_pid(), "host": socket.gethostname(), "started_utc": "2026-01-01T00:00:00+00:00",
            "cwd": "/some/other/checkout", "command": "snakemake --cores all"}
    (results / LOCK_NAME).write_text(json.dumps({**base, **record}))
    return results / LOCK_NAME


@pytest.mark.unit
def test_taken_with_its_holder_and_released(tmp_path):
    lock = ResultsLock(tmp_path / "results")
    assert holder(tmp_path / "results") is None
    assert lock.acquire() is None
    record = json.loads(lock.path.read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname() and record["cwd"] == os.getcwd()
    assert record["started_utc"] and record["command"]
    assert lock.acquire() is None, "taking it again in the same holder is a no-op"
    assert lock.release() and lock.path.read_text() == "", "released: the record emptied, the file kept"
    assert not lock.release()
    assert holder(tmp_path / "results") is None


@pytest.mark.run
def test_live_lock_refused_naming_holder_then_free_after_kill_9(tmp_path):
    """The kernel releases the lock of a killed holder: the next taker finds it free and says the last
    holder ended without releasing it."""
    results, elsewhere = tmp_path / "results", tmp_path / "checkout_a"
    elsewhere.mkdir()
    (tmp_path / "go").touch()
    proc = _holder(tmp_path, results, "hold", cwd=elsewhere)
    try:
        assert _first_line(proc).startswith("won")
        assert holder(results)["pid"] == proc.pid
        with pytest.raises(LockHeld) as err:
            ResultsLock(results).acquire()
        message = str(err.value)
        for part in (str(results / LOCK_NAME), f"pid {proc.pid}", f"host {socket.gethostname()}", str(elsewhere),
                     "deleting the file does not stop"):
            assert part in message, (part, message)
        os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: the record stays behind, the lock does not
        proc.wait(timeout=30)
        assert holder(results) is None
        lock = ResultsLock(results)
        note = lock.acquire()
        assert note and f"pid {proc.pid}" in note and "ended without releasing" in note and str(elsewhere) in note
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
        lock.release()
    finally:
        _stop(proc)


@pytest.mark.run
@pytest.mark.parametrize("mode", ["exit", "raise"])
def test_released_when_the_holder_ends(tmp_path, mode):
    (tmp_path / "go").touch()
    proc = _holder(tmp_path, tmp_path / "results", mode)
    try:
        assert _first_line(proc).startswith("won")
        assert proc.wait(timeout=30) == (0 if mode == "exit" else 1)
        assert holder(tmp_path / "results") is None
        assert (tmp_path / "results" / LOCK_NAME).read_text() == "", "an ordinary end empties the record"
    finally:
        _stop(proc)


@pytest.mark.unit
def test_a_record_without_its_lock_is_no_lock(tmp_path):
    """What a killed holder leaves (its record, from this host or another, even a damaged one) holds
    nothing: the kernel released its lock. The taker says whose record it found."""
    results = tmp_path / "results"
    for record in ({}, {"host": "node-that-is-not-this-one"}, {"pid": os.getpid(), "pid_start": "1"}):
        path = _write_record(results, **record)
        assert holder(results) is None
        lock = ResultsLock(results)
        assert "ended without releasing it" in lock.acquire()
        lock.release()
    path.write_text("{not json")  # damaged: nothing to name, and still no lock
    lock = ResultsLock(results)
    assert lock.acquire() is None and lock.release()


@pytest.mark.unit
def test_a_filesystem_that_cannot_lock_is_refused_by_name(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(LockHeld, match=r"cannot lock files.*unlocked"):
        ResultsLock(tmp_path / "results").acquire()


@pytest.mark.run
def test_release_is_only_the_holders(tmp_path):
    """Another process's release (or this one's, not holding it) never frees a live holder's lock."""
    (tmp_path / "go").touch()
    proc = _holder(tmp_path, tmp_path / "results", "hold")
    try:
        assert _first_line(proc).startswith("won")
        assert not ResultsLock(tmp_path / "results").release()
        assert holder(tmp_path / "results")["pid"] == proc.pid
    finally:
        _stop(proc)


@pytest.mark.run
def test_one_of_many_simultaneous_takers_wins(tmp_path):
    """Six processes take one free lock (a killed holder's record in it) at once: exactly one holds it."""
    results, go = tmp_path / "results", tmp_path / "go"
    _write_record(results)
    procs = [_holder(tmp_path, results, "hold", go=go) for _ in range(6)]
    try:
        time.sleep(1.0)  # let them all start and wait on `go`
        go.touch()
        outcomes = [_first_line(p).split()[0] for p in procs]
        assert sorted(outcomes) == ["refused"] * 5 + ["won"], outcomes
        winner = procs[outcomes.index("won")]
        assert holder(results)["pid"] == winner.pid
        assert [p.name for p in results.iterdir()] == [LOCK_NAME], "no file beside it"
    finally:
        _stop(*procs)


@pytest.mark.unit
def test_results_lock_is_one_object_per_folder(tmp_path):
    assert results_lock(tmp_path / "r") is results_lock(str(tmp_path / "r"))


@pytest.mark.workflow
def test_two_checkouts_one_results_dir(tmp_path):
    """Two Snakemake workflows from two working directories whose configs name one absolute
    results_dir, started together: one runs, the other is refused naming the lock and its
    holder; no failed row, no corrupt or temporary file; afterwards a rerun works."""
    results = tmp_path / "shared_results"
    cfg = tiny_config(results_dir=str(results), train={"steps": 150})
    works = [write_workdir(tmp_path / name, cfg) for name in ("checkout_a", "checkout_b")]
    procs = [subprocess.Popen(snakemake_cmd(w, "--cores", "1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True, env=snakemake_env()) for w in works]
    try:
        outputs = [p.communicate(timeout=420)[0] for p in procs]
    finally:
        _stop(*procs)
    codes = [p.returncode for p in procs]
    assert sorted(codes)[0] == 0 and sorted(codes)[1] != 0, (codes, outputs)
    winner, refused = (0, 1) if codes[0] == 0 else (1, 0)
    message = " ".join(outputs[refused].split())
    for part in ("is in use by another scalelab workflow", str(results / LOCK_NAME), f"pid {procs[winner].pid}",
                 f"host {socket.gethostname()}", f"working directory {works[winner]}"):
        assert part in message, (part, outputs[refused][-3000:])
    assert holder(results) is None, "released when the workflow ended"

    def audit():
        summaries = sorted(results.glob(f"runs/{RUN_DIR_GLOB}/summary.json"))
        assert len(summaries) == 1
        assert all(json.loads(p.read_text())["status"] == "ok" for p in summaries)
        runs = pq.read_table(results / "metrics.parquet").to_pandas()
        assert list(runs["status"]) == ["ok"]
        assert pq.read_table(results / "steps.parquet").num_rows == 150
        json.loads((results / "data/tiny/meta.json").read_text())
        assert not [p for p in results.rglob("*") if p.name.endswith(".tmp") or ".stale." in p.name]

    audit()
    # the refused checkout, once the first is done: it takes the lock and writes
    rerun = run_snakemake(works[refused], "--cores", "1", "--forcerun", "collect", timeout=300)
    assert "is in use" not in rerun.stderr and "collect" in rerun.stderr
    assert holder(results) is None
    audit()


@pytest.mark.workflow
def test_dry_run_not_refused_by_a_running_workflow(tmp_path):
    """Only a workflow about to run jobs takes the lock: -n plans past a live holder."""
    cfg = tiny_config(results_dir=str(tmp_path / "results"))
    work = write_workdir(tmp_path / "checkout", cfg)
    (tmp_path / "go").touch()
    holder = _holder(tmp_path, tmp_path / "results", "hold")
    try:
        assert _first_line(holder).startswith("won")
        dry = run_snakemake(work, "-n", "--cores", "1", timeout=120)
        assert "prepare_data" in dry.stdout and "in use" not in dry.stdout + dry.stderr
        refused = run_snakemake(work, "--cores", "1", check=False, timeout=120)
        assert refused.returncode != 0 and f"pid {holder.pid}" in refused.stderr
        assert not (tmp_path / "results" / "data").exists(), "the refused workflow wrote nothing"
    finally:
        _stop(holder)
