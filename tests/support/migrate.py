"""What tests/*/test_migrate.py share: the helpers tests of more than one tier use."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from scalelab.results.lock import LOCK_NAME

OLD = Path(__file__).parents[1] / "data" / "old_layouts"
TREES = sorted(p.name for p in OLD.iterdir() if p.is_dir())


def _copy(name: str, dest: Path) -> Path:
    shutil.copytree(OLD / name, dest)
    return dest


def _files(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under root, but the results lock's (scalelab.results.lock: the file
    stays, emptied, once migrate has held and released the lock)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != LOCK_NAME}
