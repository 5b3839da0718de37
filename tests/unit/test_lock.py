"""One writer per results folder (scalelab.results.lock): unit tests with real holder processes, and
two Snakemake workflows from two checkouts sharing one absolute results_dir."""
import errno
import fcntl
import json
import os
import socket

import pytest

from scalelab.results.lock import LockHeld, ResultsLock, holder, results_lock
from support.lock import _write_record


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


def test_a_filesystem_that_cannot_lock_is_refused_by_name(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(LockHeld, match=r"cannot lock files.*unlocked"):
        ResultsLock(tmp_path / "results").acquire()


def test_results_lock_is_one_object_per_folder(tmp_path):
    assert results_lock(tmp_path / "r") is results_lock(str(tmp_path / "r"))
