"""A CPU sweep's calibration (scalelab.run.calibration), measured once per invocation by its first training job
(and by the planning process where planning.top_k needs a peak): ``python -m scalelab.run.calibration``, forked
by the invocation's prefork server (scalelab.run.prefork), which has imported torch for the ranks anyway (2-3 s
of a new process's start-up on 2 cores), else a new process. Apart from the calibration module: the ranks import
that one, and the server imports the ranks' modules."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from scalelab.run import prefork
from scalelab.run.calibration import applies, read_calibration


def ensure_calibration(path: str | Path, threads: int, timeout_s: float = 120.0) -> Path | None:
    """The path of this invocation's calibration on this host, measured now when there is none (in a child of
    its own: the launcher imports no torch); None when measuring failed (the run then
    measures its own, and its row says so)."""
    path = Path(path)
    if path.exists() and applies(read_calibration(path), threads):
        return path
    cmd = [sys.executable, "-m", "scalelab.run.calibration", str(path), str(threads)]
    with tempfile.TemporaryFile() as out:
        forked, why_not = prefork.fork_ranks([(cmd, dict(os.environ))], out.fileno())
        if why_not:  # refused, or gone: a new process, and why (as the ranks' launcher logs it)
            print(f"scalelab: the CPU calibration runs in a new process: {why_not}", file=sys.stderr)
        if forked is not None:
            try:
                code = forked[0].wait(timeout_s)
            finally:
                forked[0].channel.close()  # the server kills what is left of it
        else:
            try:
                code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                code = None
        out.seek(0)
        output = out.read().decode(errors="replace").strip()
    if code != 0:
        print(f"scalelab: measuring the CPU's peak FLOP/s failed; each run measures its own:\n{output[-2000:]}",
              file=sys.stderr)
        return None
    print(output, file=sys.stderr)
    return path
