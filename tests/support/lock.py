"""What tests/*/test_lock.py share: the helpers tests of more than one tier use."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import scalelab
from scalelab.results.lock import LOCK_NAME

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
