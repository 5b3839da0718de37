"""The fault drills (scalelab.harness.faults) as tests: real processes, counted outcomes.

Run them alone with `pytest -m faults`; `python -m scalelab.harness.faults` prints their figures.
"""
import pytest

pytestmark = pytest.mark.faults  # not a tier: `pytest -m faults` runs the drills


def test_the_drills_run_under_their_first_name():
    """`python -m scalelab.harness.faults` (the name the issue tracker and older notes use) runs the same drills."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "scalelab.harness.faults", "no_such_drill"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "unknown drill(s) ['no_such_drill']" in out.stderr and "teardown_crash" in out.stderr
