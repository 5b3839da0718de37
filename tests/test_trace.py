"""Seeing inside a run (issue #45): train.profile's traces, and the exposed communication read from them
(scalelab.run.trace). The analysis on hand-made traces; the traces of real gloo runs where the answer
is known: nothing exposed at world size 1, an injected straggler's delay exposed at stage 3."""
import json

import pytest

from conftest import run_point
from scalelab.config import ConfigError
from scalelab.harness.testing import tiny_config
from scalelab.plan.sweep import RunPoint
from scalelab.plan.validation import validate_config
from scalelab.run.trace import exposed_comm_per_step, trace_file, uncovered


def _event(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 7, "cat": cat}


@pytest.mark.unit
def test_exposed_communication_is_what_no_compute_overlaps():
    assert uncovered([(0, 10), (5, 20)], [(2, 4), (15, 30)]) == 20 - 2 - 5
    assert uncovered([(0, 10)], []) == 10 and uncovered([], [(0, 5)]) == 0
    cpu = {"traceEvents": [
        _event("scalelab step 3", 0, 1000),
        _event("aten::mm", 0, 300), _event("aten::add", 250, 100),       # compute 0-350
        _event("gloo:all_gather", 200, 400, tid=2),                      # 200-600: 350-600 exposed
        _event("c10d::wait", 350, 250),                                  # a wait is not compute
        _event("aten::mm", 700, 100), _event("gloo:all_reduce", 650, 100, tid=3),  # 650-700 exposed
        _event("scalelab step 4", 2000, 100), _event("aten::mm", 2000, 100),
        _event("gloo:all_reduce", 5000, 10, tid=2),                      # outside every step
    ]}
    assert exposed_comm_per_step(cpu) == {3: pytest.approx(300e-6), 4: 0.0}
    # a GPU trace: NCCL kernels against the other kernels, on the device's timeline (a step ends with a device
    # synchronize, so its kernels lie within its span on the host)
    gpu = {"traceEvents": [
        _event("scalelab step 0", 0, 1000),
        _event("scalelab step 0", 700, 200, tid=7, cat="gpu_user_annotation"),  # the same span on a stream: not the step
        _event("ampere_sgemm", 50, 400, tid=7, cat="kernel"),
        _event("ncclDevKernel_AllGather_RING_LL", 300, 300, tid=8, cat="kernel"),
        _event("aten::mm", 0, 10),
    ]}
    assert exposed_comm_per_step(gpu) == {0: pytest.approx(150e-6)}


@pytest.mark.unit
def test_the_traced_steps_are_checked_against_the_run():
    for profile, words in (([5, 3], "first <= last"), ([2, 60], "first <= last < train.steps"),
                           ([2, 5], "traces every measured step")):
        cfg = tiny_config(train={"steps": 6, "warmup_steps": 2, "profile": profile})
        with pytest.raises(ConfigError, match="train.profile") as err:
            validate_config(cfg)
        assert words in str(err.value)
    validate_config(tiny_config(train={"steps": 6, "warmup_steps": 2, "profile": [2, 4]}))


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
