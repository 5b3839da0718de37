"""The code style the project keeps: `ruff check` with the settings in pyproject.toml."""
import subprocess
import sys

from conftest import REPO


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests", "workflow"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
