"""Who runs something, and whether it certainly stopped: a process's record (pid, host, boot id and
the kernel's start time of the pid, which a reused pid does not share) and the reason it is gone.

A run's launcher writes its record into the run folder (scalelab.run.launch); `scalelab
status` tells a running run from a killed one by it (scalelab.results.status). The results folder's lock
(scalelab.results.lock) keeps the same record for its refusal message; the kernel releases that lock itself.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def process_start(pid: int) -> str | None:
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
    return {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": _boot_id(), "pid_start": process_start(os.getpid())}


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
    started = process_start(pid)
    if record.get("pid_start") and started and started != record["pid_start"]:
        return f"process {pid} is dead (its pid now belongs to another process)"
    return None
