"""Seeing inside a run (issue #45): train.profile's traces, and the exposed communication read from them
(scalelab.run.trace). The analysis on hand-made traces; the traces of real gloo runs where the answer
is known: nothing exposed at world size 1, an injected straggler's delay exposed at stage 3."""
import json

import pytest

from scalelab.harness.testing import tiny_config
from scalelab.planning.sweep import RunPoint
from scalelab.run.trace import trace_file
from support import run_point


def _traced(tmp_path, tiny_data, point, fault=None):
    cfg = tiny_config(train={"steps": 10, "warmup_steps": 2, "profile": [5, 7]}, planning={"launch_overcommitted": True})
    summary, steps, run_dir = run_point(tmp_path, tiny_data, point, cfg=cfg, fault=fault)
    assert summary["status"] == "ok", summary.get("reason")
    for rank in range(point.world_size):  # each rank's trace opens, with the three traced steps
        trace = json.loads(trace_file(run_dir, rank).read_text())
        spans = sorted(e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("scalelab step "))
        assert spans == ["scalelab step 5", "scalelab step 6", "scalelab step 7"]
    assert summary["profiled_steps"] == "5-7" and summary["trace_files"] == f"trace/rank*.json ({point.world_size})"
    assert summary["measured_steps"] == 10 - 2 - 3  # the traced steps are left out of the timings
    return summary


@pytest.mark.run(cost_s=12)
def test_a_world_size_1_run_exposes_no_communication(tmp_path, tiny_data):
    summary = _traced(tmp_path, tiny_data, RunPoint("fp32", 0, 1))
    # nothing but the step's own loss all-reduce over one rank (gloo, microseconds)
    assert 0 <= summary["exposed_comm_s_measured"] < 1e-3 < summary["step_time_s_median"]


@pytest.mark.run(cost_s=15)
def test_a_straggler_at_stage_3_exposes_about_its_delay(tmp_path, tiny_data):
    """Rank 1 sleeps 300 ms before each traced step: rank 0 waits that long in its first gather, which its
    trace shows as communication that nothing computed beside."""
    summary = _traced(tmp_path, tiny_data, RunPoint("fp32", 3, 2), fault="delay@step=5-7,rank=1,ms=300")
    assert summary["exposed_comm_s_measured"] == pytest.approx(0.3, rel=0.2)
