"""Atomic file writes: a reader never sees a half-written result."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto ``path`` on success.

    The temporary file sits in the same folder so ``os.replace`` is an atomic rename on
    the same filesystem. On an exception the temporary file is removed and the target
    (if any) is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent, path.name)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results should be readable like any file
    try:
        yield tmp
        fault_point(f"before_replace:{path.name}")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def fault_point(name: str) -> None:
    """Fault drills (devtools.faults): SIGKILL this process here when SCALELAB_FAULT == name."""
    if os.environ.get("SCALELAB_FAULT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


# A writer's temporary: ".<target>.<pid>.tmp", or atomic_path's ".<target>.<pid>.<random>.tmp"; the pid is the first
# all-digit part after the target (the shortest target that fits: run folders' and data files' names have none)
_TEMPORARY = re.compile(r"^\.(?P<target>.+?)\.(?P<pid>\d+)(?:\.[^.]+)?\.tmp$")


def remove_stale_temporaries(folder: Path, target: str | None = None) -> None:
    """Temporaries in ``folder`` (of the file named ``target``, else of any file) that writers left when they were
    killed mid-write (their pid no longer alive): a rank killed while writing its error file leaves one that no later
    write of the same file would remove."""
    for tmp in Path(folder).glob(f".{target or '*'}.*.tmp"):
        if target is not None:  # the target's own name ends where its pid starts
            pid_text = tmp.name[len(target) + 2:].split(".", 1)[0]
        else:
            found = _TEMPORARY.match(tmp.name)
            pid_text = found["pid"] if found else ""
        try:
            pid = int(pid_text)
            if pid == os.getpid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except (ValueError, PermissionError):
            continue


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def building_dir(out_dir: Path) -> Path:
    """A fresh hidden sibling of out_dir to build it in, then rename into place (a failed build
    leaves the last complete one). Made with the user's umask, as ``mkdir`` would: ``mkdtemp``
    makes it 0700, and the renamed folder kept that, so on a shared machine colleagues could not
    open a report, nor could a web server serve it."""
    import tempfile

    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    os.chmod(building, 0o777 & ~_umask())
    return building


def write_json(path: str | Path, obj) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | Path):
    return json.loads(Path(path).read_text())


class OutputTaken(ValueError):
    """An output folder that holds something else than an earlier output of the same kind: never replaced."""


def check_replaceable(out_dir: Path, written: tuple[str, ...]) -> None:
    """A report or comparison replaces its output folder whole: only an absent one, or one holding nothing but what
    that output writes (``written``: its file and folder names; an earlier output, or what Snakemake left of one),
    so that an `--out` that names a file or a folder of one's own loses nothing."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if not out_dir.is_dir():
        raise OutputTaken(f"{out_dir} is a file, not an output folder: name a folder (it is created if missing)")
    others = sorted(p.name for p in out_dir.iterdir() if p.name not in written)
    if others:
        raise OutputTaken(f"{out_dir} holds files this output does not write ({', '.join(others[:3])}"
                          f"{', ...' if len(others) > 3 else ''}) and would be replaced whole: name a new or empty folder")
