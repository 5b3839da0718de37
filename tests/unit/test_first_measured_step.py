"""Which step of an attempt is its first measured one (scalelab.run.worker.first_measured_step): the first after
warm-up, and after a resume past warm-up under pipelining the one after the step torch's schedule infers its shapes
in, unless a compile warm-up inferred them before the loop or nothing would be measured after it."""
from types import SimpleNamespace

import pytest

from scalelab.run.worker import first_measured_step, infers_shapes


def _run(start_step: int, pipelined: bool = True, compiled: bool = False, steps: int = 12, measure_s: float = 0.0):
    return SimpleNamespace(pipe=object() if pipelined else None, start_step=start_step,
                           point=SimpleNamespace(compile=compiled), plan=SimpleNamespace(compile_warm_up=True),
                           train_cfg=SimpleNamespace(warmup_steps=2, steps=steps, measure_s=measure_s))


@pytest.mark.parametrize("start_step, pipelined, compiled, measure_s, first", [
    (0, True, False, 0.0, 2),   # a fresh run: its warm-up hides the shape inference
    (8, True, False, 0.0, 9),   # resumed past warm-up: step 8 infers the shapes
    (8, False, False, 0.0, 2),  # no pipeline, nothing inferred: every resumed step is measured
    (8, True, True, 0.0, 2),    # compiled: the compile warm-up ran a whole step of the schedule before the loop
    (11, True, False, 0.0, 2),  # the last step alone: measured, shape inference and all (nothing else would be)
    (11, True, False, 2.0, 12),  # ... unless timing steps follow it
])
def test_the_first_measured_step(start_step, pipelined, compiled, measure_s, first):
    run = _run(start_step, pipelined, compiled, measure_s=measure_s)
    assert first_measured_step(run) == first
    assert infers_shapes(run, start_step) == (pipelined and not compiled)
    assert not infers_shapes(run, start_step + 1)
