"""The fault drills (devtools.faults) as tests: real processes, counted outcomes.

Run them alone with `pytest -m faults`; `PYTHONPATH=tests python -m devtools.faults` prints their figures.
"""
import pytest

pytestmark = pytest.mark.faults  # not a tier: `pytest -m faults` runs the drills


def test_the_drills_run_as_the_docs_say():
    """`PYTHONPATH=tests python -m devtools.faults` runs the drills, and names them where one is unknown."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run([sys.executable, "-m", "devtools.faults", "no_such_drill"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 2
    assert "unknown drill(s) ['no_such_drill']" in out.stderr and "teardown_crash" in out.stderr
