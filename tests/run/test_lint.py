"""The code style the project keeps: `ruff check` with the settings in pyproject.toml."""
import subprocess
import sys
from pathlib import Path

from support import REPO


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests", "workflow"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
"""Lines a function of the package may run to (issue #42): past it, a function does more than one thing."""


def test_the_import_contracts_hold():
    """pyproject.toml's import-linter contracts (issue #42): the layers by workflow stage, each importing
    only the layers below it, and torch only in the run layer."""
    import os

    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 0 and "0 broken" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
