"""The fault drills (scalelab.harness.faults) as tests: real processes, counted outcomes.

Run them alone with `pytest -m faults`; `python -m scalelab.harness.faults` prints their figures.
"""
import pytest

from scalelab.harness.faults import DRILLS

pytestmark = [pytest.mark.faults, pytest.mark.workflow]


@pytest.mark.parametrize("name", list(DRILLS))
def test_drill(tmp_path, name):
    drill = DRILLS[name](tmp_path)
    assert drill.checks_failed == [], drill.checks_failed
    assert (drill.rows_lost, drill.rows_duplicated, drill.corrupt_files, drill.orphan_processes) == (0, 0, 0, 0), drill.notes
    assert drill.faults_recovered == drill.faults_injected
    assert drill.bad_configs_rejected == drill.bad_configs_tried
    assert drill.timeouts_honoured == drill.timeouts_tried
    if name == "bad_configs":
        assert drill.bad_configs_tried >= 31
    if name == "hang":
        assert drill.timeouts_tried >= 1
