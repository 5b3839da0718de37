"""Which step of an attempt is its first measured one (scalelab.run.worker.first_measured_step): the first after
warm-up; after a resume past warm-up, the one after its cold steps (the first, where a pipeline infers its shapes,
up to the one its activations are metered in), unless that would leave no training step measured and no timing
steps follow."""
from types import SimpleNamespace

import pytest

from scalelab.run.worker import first_measured_step, infers_shapes, metered_step


def _run(start_step: int, pipelined: bool = True, compiled: bool = False, steps: int = 12, measure_s: float = 0.0):
    return SimpleNamespace(pipe=object() if pipelined else None, start_step=start_step,
                           point=SimpleNamespace(compile=compiled), plan=SimpleNamespace(compile_warm_up=True),
                           train_cfg=SimpleNamespace(warmup_steps=2, steps=steps, measure_s=measure_s))


@pytest.mark.parametrize("start_step, pipelined, compiled, measure_s, first", [
    (0, True, False, 0.0, 2),    # a fresh run: its warm-up hides the shape inference and the metered step
    (0, False, False, 0.0, 2),
    (8, True, False, 0.0, 10),   # resumed past warm-up: step 8 infers the shapes, step 9 is metered
    (8, False, False, 0.0, 9),   # no pipeline: step 8 is metered
    (8, True, True, 0.0, 10),    # compiled: no shape inference in the loop, but the metered step is still the second
    (1, True, False, 0.0, 3),    # resumed within warm-up: the cold steps run past it
    (10, True, False, 0.0, 11),  # the last step is measured where nothing follows it, metered or not
    (11, True, False, 0.0, 11),
    (11, True, False, 2.0, 13),  # ... and left out where timing steps follow
])
def test_the_first_measured_step(start_step, pipelined, compiled, measure_s, first):
    run = _run(start_step, pipelined, compiled, measure_s=measure_s)
    assert first_measured_step(run) == first
    assert metered_step(run) == start_step + (1 if pipelined else 0)
    assert infers_shapes(run, start_step) == (pipelined and not compiled)
    assert not infers_shapes(run, start_step + 1)
