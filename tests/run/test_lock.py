"""One writer per results folder (scalelab.results.lock): unit tests with real holder processes, and
two Snakemake workflows from two checkouts sharing one absolute results_dir."""
import json
import os
import signal
import socket
import time

import pytest

from scalelab.results.lock import LOCK_NAME, LockHeld, ResultsLock, holder
from support.lock import _first_line, _holder, _stop, _write_record


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
