"""The progress line's ETA covers what a run still does after its last step: the measurement window."""
import pytest
import torch

from scalelab.run.progress import Progress


def test_eta_adds_the_measurement_window_past_the_last_step():
    steps, warmup = 12, 2
    plain = Progress(steps, 256, torch.device("cpu"))
    windowed = Progress(steps, 256, torch.device("cpu"), measure_s=60.0, warmup_steps=warmup, half_batch_share=0.5)
    # after step 3 (4 steps done) in 4 s: 1 s a step, 8 steps left
    assert plain.eta_s(3, 4.0) == pytest.approx(8.0)
    # the 10 measured steps last ~10 s of the 60 s window: 50 s of timing steps, then 30 s at half the batch
    assert windowed.eta_s(3, 4.0) == pytest.approx(8.0 + 50.0 + 30.0)
    # at the last step, the window alone is left
    assert windowed.eta_s(steps - 1, 12.0) == pytest.approx(50.0 + 30.0)
    # a window the steps already fill adds only the half-batch steps
    assert Progress(steps, 256, torch.device("cpu"), measure_s=5.0, warmup_steps=warmup,
                    half_batch_share=0.5).eta_s(steps - 1, 12.0) == pytest.approx(2.5)
