"""One writer per results folder: ``<results_dir>/.scalelab.lock``.

Snakemake's own lock lives in the working directory's ``.snakemake/``, so two checkouts
whose configs name one absolute ``results_dir`` would both write into it: their runs delete
each other's scratch files (false ``failed`` rows) and read half-written JSON. This lock is
taken by the process that plans and drives the workflow (the workflow's ``onstart``, rules/hooks.smk: only
a workflow about to run jobs, never ``-n``, ``--lint``, ``--report`` or ``--unlock``; jobs
that Snakemake spawns, e.g. on SLURM nodes, run with ``--no-hooks`` and never take it) and
released when it ends (``onsuccess``/``onerror``, and at exit of that process).

The lock is ``fcntl.flock`` on that file, held by the open file for as long as the holder runs:
the kernel releases it when the holder ends, however it ends (kill -9 and power loss included), so no
lock is ever stale and nothing is reclaimed. The file holds the holder's record (pid, host, boot id
and process start time, start time, working directory, command line), for the refusal message and
for ``scalelab resume``; it is emptied on release and stays between holders. On NFS, Linux maps flock
to the server's byte-range locks, so a holder on another host is seen too; a filesystem that cannot
lock at all (Lustre mounted without ``flock``) is refused by name rather than left unlocked.

Not the filelock package: it takes the same ``flock``, but keeps no record of its holder, which the refusal
("held by pid ... on host ..., started ...") and ``scalelab resume`` read.

"""
from __future__ import annotations

import atexit
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from scalelab.run.processes import holder_record

LOCK_NAME = ".scalelab.lock"


class LockHeld(RuntimeError):
    """The results folder cannot be taken: another live workflow holds it (the message names it and
    what to do), or its filesystem cannot lock files."""


def _read_record(fd: int) -> dict:
    """The record in the lock file ({} when empty or unreadable: a holder writes it just after
    taking the lock, so a reader may catch it half written: read again briefly)."""
    for _ in range(10):
        raw = os.pread(fd, 1 << 16, 0)
        try:
            record = json.loads(raw) if raw.strip() else {}
            if isinstance(record, dict):
                return record
        except ValueError:
            pass
        time.sleep(0.05)
    return {}


def describe(record: dict) -> str:
    if not record:
        return "a process whose record is not written yet (or unreadable)"
    return (f"pid {record.get('pid')} on host {record.get('host')}, started {record.get('started_utc')}, "
            f"working directory {record.get('cwd')}")


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by processes it starts (O_CLOEXEC)


def _try_lock(fd: int, path: Path) -> bool:
    """Take the flock without waiting: True if taken, False if another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno in (errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise LockHeld(f"the filesystem of {path} cannot lock files ({os.strerror(err.errno)}): scalelab will not "
                           "run a workflow there unlocked; give it a results_dir on a filesystem that supports flock "
                           "(on Lustre: mounted with -o flock)") from None
        raise


def holder(results_dir: str | Path) -> dict | None:
    """The record of the process that holds the folder's lock, or None when nobody holds it."""
    path = Path(results_dir) / LOCK_NAME
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDWR)
    try:
        if _try_lock(fd, path):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return _read_record(fd)
    finally:
        os.close(fd)


class ResultsLock:
    """The lock of one results folder, as this process sees it."""

    def __init__(self, results_dir: str | Path):
        self.results_dir = Path(results_dir).absolute()
        self.path = self.results_dir / LOCK_NAME
        self.fd: int | None = None  # the open lock file while this process holds the lock
        self.owner_pid: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None and self.owner_pid == os.getpid()

    def acquire(self) -> str | None:
        """Take the lock; return a note when the last holder ended without releasing it (else None).
        Raises LockHeld when a live workflow holds it, or the filesystem cannot lock."""
        if self.held:
            return None
        fd = _open(self.path)
        try:
            if not _try_lock(fd, self.path):
                raise LockHeld(self._refusal(_read_record(fd)))
            left = _read_record(fd)
            record = {**holder_record(), "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      "cwd": os.getcwd(), "command": " ".join(sys.argv)[:2000]}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record, indent=2) + "\n").encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)  # closing drops the flock too
            raise
        self.fd, self.owner_pid = fd, os.getpid()
        _HELD.append(self)
        if left:
            return (f"scalelab: the last holder of {self.path} ({describe(left)}) ended without releasing it "
                    "(killed?); its lock went with it")
        return None

    def release(self) -> bool:
        """Empty the record and let the lock go, if this process holds it; True if it did."""
        if not self.held:
            return False
        fd, self.fd = self.fd, None
        if self in _HELD:
            _HELD.remove(self)
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # the flock goes with the last close of the open file
        return True

    def _refusal(self, held: dict) -> str:
        here = socket.gethostname()
        where = (f" (host {held.get('host')}; this one is {here})" if held and held.get("host") != here else "")
        return (f"results folder {self.results_dir} is in use by another scalelab workflow: the lock "
                f"{self.path} is held by {describe(held)}"
                + (f", command: {held.get('command')}" if held.get("command") else "")
                + f"{where}. Wait for it to finish, or give this workflow another results_dir. The lock goes "
                "with its holder, however it ends: deleting the file does not stop that workflow writing there.")


_HELD: list[ResultsLock] = []
_LOCKS: dict[Path, ResultsLock] = {}


def results_lock(results_dir: str | Path) -> ResultsLock:
    """This process's one ResultsLock of the folder (the same object on every call)."""
    key = Path(results_dir).absolute()
    return _LOCKS.setdefault(key, ResultsLock(key))


@atexit.register
def _release_at_exit() -> None:
    """An ordinary end (an exception, Ctrl-C) empties the record too; any end releases the lock."""
    for lock in list(_HELD):
        try:
            lock.release()
        except OSError:
            pass
