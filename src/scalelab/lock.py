"""One writer per results folder: ``<results_dir>/.scalelab.lock``.

Snakemake's own lock lives in the working directory's ``.snakemake/``, so two checkouts
whose configs name one absolute ``results_dir`` would both write into it: their runs delete
each other's scratch files (false ``failed`` rows) and read half-written JSON. This lock is
taken by the process that plans and drives the workflow (the Snakefile's ``onstart``: only
a workflow about to run jobs, never ``-n``, ``--lint``, ``--report`` or ``--unlock``; jobs
that Snakemake spawns, e.g. on SLURM nodes, run with ``--no-hooks`` and never take it) and
released when it ends (``onsuccess``/``onerror``, and at exit of that process).

The lock file is created atomically (``O_CREAT | O_EXCL``) and holds a JSON record: pid,
host, boot id and process start time, start time, working directory, command line and a
random token. A lock whose holder is provably gone (same host and boot, and that pid is
dead or now another process) is reclaimed: renamed to a name of our own (atomic: one
reclaimer wins), checked to be the very record judged stale, and removed. A holder on
another host cannot be checked from here: the refusal says how to proceed.
"""
from __future__ import annotations

import atexit
import datetime
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path

LOCK_NAME = ".scalelab.lock"


class LockHeld(RuntimeError):
    """Another live workflow holds the results folder; the message names it and what to do."""


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _process_start(pid: int) -> str | None:
    """The kernel's start time of pid (clock ticks since boot), which a reused pid does not share."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, after the parenthesised command name


def _pid_alive(pid: int) -> bool:
    """Whether pid runs: a zombie (ended, not yet reaped: its parent died too, and a container's
    init may never reap it) answers kill(0) but is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: kill(0) is all there is
    return state not in ("Z", "X")


def holder_record() -> dict:
    """This process as a lock or run record names it: pid, host, boot id and the pid's start time,
    which is what :func:`stale_reason` checks."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": _boot_id(), "pid_start": _process_start(os.getpid())}


def stale_reason(record: dict) -> str | None:
    """Why the holder of this lock record is certainly gone, or None (alive, or unknowable)."""
    if record.get("host") != socket.gethostname():
        return None  # another machine: its processes cannot be checked from here
    if record.get("boot_id") and _boot_id() and record["boot_id"] != _boot_id():
        return "its machine has rebooted since"
    pid = record.get("pid")
    if not isinstance(pid, int):
        return None
    if not _pid_alive(pid):
        return f"process {pid} is dead"
    started = _process_start(pid)
    if record.get("pid_start") and started and started != record["pid_start"]:
        return f"process {pid} is dead (its pid now belongs to another process)"
    return None


def read_lock(path: str | Path, settle_s: float = 2.0) -> tuple[dict | None, bytes | None]:
    """(record, raw bytes) of the lock file, (None, None) when there is none. A file being
    written (empty or partial just after its O_EXCL create) is read again until settle_s."""
    path, deadline = Path(path), time.monotonic() + settle_s
    while True:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None, None
        try:
            record = json.loads(raw)
            if isinstance(record, dict):
                return record, raw
        except ValueError:
            pass
        if time.monotonic() > deadline:
            return {}, raw  # unreadable: treated as held (refused), never as free
        time.sleep(0.05)


def describe(record: dict) -> str:
    if not record:
        return "an unreadable record"
    return (f"pid {record.get('pid')} on host {record.get('host')}, started {record.get('started_utc')}, "
            f"working directory {record.get('cwd')}")


class ResultsLock:
    """The lock of one results folder, as this process sees it."""

    def __init__(self, results_dir: str | Path):
        self.results_dir = Path(results_dir).absolute()
        self.path = self.results_dir / LOCK_NAME
        self.token: str | None = None  # set while this process holds the lock
        self.owner_pid: int | None = None

    @property
    def held(self) -> bool:
        return self.token is not None and self.owner_pid == os.getpid()

    def acquire(self, attempts: int = 5) -> str | None:
        """Take the lock; return a note when a stale lock was reclaimed (else None).
        Raises LockHeld when a live workflow (or one that cannot be checked) holds it."""
        if self.held:
            return None
        self.results_dir.mkdir(parents=True, exist_ok=True)
        note = None
        for _ in range(attempts):
            token = uuid.uuid4().hex
            record = {
                **holder_record(),
                "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "cwd": os.getcwd(), "command": " ".join(sys.argv)[:2000], "token": token,
            }
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                held, raw = read_lock(self.path)
                if held is None:
                    continue  # released meanwhile: try again
                why = stale_reason(held)
                if why is None:
                    raise LockHeld(self._refusal(held)) from None
                if self._reclaim(raw):
                    note = (f"scalelab: reclaimed the stale lock {self.path} ({describe(held)}): {why}")
                continue
            with os.fdopen(fd, "w") as handle:
                handle.write(json.dumps(record, indent=2) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            self.token, self.owner_pid = token, os.getpid()
            _HELD.append(self)
            return note
        raise LockHeld(f"could not take the lock {self.path} after {attempts} attempts "
                       "(other workflows kept taking or reclaiming it); try again")

    def _reclaim(self, stale_raw: bytes) -> bool:
        """Remove the lock file if it is still exactly the stale record; True if we removed it.
        The rename is atomic, so of several reclaimers only one moves the file; a mover that
        finds a different (fresh) record moved puts it back without overwriting anything."""
        aside = self.path.with_name(f"{LOCK_NAME}.stale.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False  # another reclaimer was first
        try:
            if aside.read_bytes() == stale_raw:
                return True
            try:  # a fresh lock was taken in between: restore it (link never overwrites)
                os.link(aside, self.path)
            except FileExistsError:
                pass
            return False
        finally:
            aside.unlink(missing_ok=True)

    def release(self) -> bool:
        """Remove the lock file if this process holds it (its token); True if removed."""
        if not self.held:
            return False
        token, self.token = self.token, None
        if self in _HELD:
            _HELD.remove(self)
        record, _ = read_lock(self.path, settle_s=0)
        if not record or record.get("token") != token:
            return False  # not ours any more: never remove another workflow's lock
        self.path.unlink(missing_ok=True)
        return True

    def _refusal(self, held: dict) -> str:
        here = socket.gethostname()
        if held and held.get("host") != here:
            gone = (f"if that workflow is gone (killed, or its machine {held.get('host')} went down), "
                    f"delete {self.path} and start again; a lock from another host ({here} is this one) "
                    "cannot be checked from here")
        else:
            gone = ("a lock left by a dead process on this host is taken over without asking, so this one is "
                    f"alive: if you are sure no workflow writes there, delete {self.path} and start again")
        return (f"results folder {self.results_dir} is in use by another scalelab workflow: the lock "
                f"{self.path} is held by {describe(held)}"
                + (f", command: {held.get('command')}" if held.get("command") else "")
                + f". Wait for it to finish, or give this workflow another results_dir; {gone}.")


_HELD: list[ResultsLock] = []
_LOCKS: dict[Path, ResultsLock] = {}


def results_lock(results_dir: str | Path) -> ResultsLock:
    """This process's one ResultsLock of the folder (the same object on every call)."""
    key = Path(results_dir).absolute()
    return _LOCKS.setdefault(key, ResultsLock(key))


@atexit.register
def _release_at_exit() -> None:
    """Whatever way the holder's interpreter ends (an exception, Ctrl-C), the lock goes with it.
    A kill -9 leaves the file; the next workflow on this host reclaims it."""
    for lock in list(_HELD):
        try:
            lock.release()
        except OSError:
            pass
