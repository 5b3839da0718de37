"""One line in the run's log every few steps, so `tail -f` on it shows life:

    scalelab: step 30/60  loss 3.1415  21,845 tok/s  mem 412 MiB  elapsed 8.2 s  ETA 8.0 s
"""
from __future__ import annotations

import resource
import time

import torch

LINES_PER_RUN = 10
"""About this many progress lines per run (and always the first and the last step)."""


class Progress:
    """measure_s, warmup_steps, half_batch_share: the run's measurement window (scalelab.run.worker.extend_measurement
    and measure_token_share), timed after the last step: the ETA includes it."""

    def __init__(self, steps: int, tokens_per_step: int, device: torch.device, start_step: int = 0,
                 measure_s: float = 0.0, warmup_steps: int = 0, half_batch_share: float = 0.0):
        self.steps, self.tokens_per_step, self.device = steps, tokens_per_step, device
        self.every = max(1, steps // LINES_PER_RUN)
        self.start_step, self.started = start_step, time.perf_counter()
        self.measure_s, self.warmup_steps, self.half_batch_share = measure_s, warmup_steps, half_batch_share

    def eta_s(self, step: int, elapsed: float) -> float:
        """Seconds left: the steps left at the mean step time so far, then what the measurement window adds (its
        timing steps until the measured steps add up to measure_s, and the half-batch steps after them)."""
        per_step = elapsed / (step + 1 - self.start_step)
        steps_left = per_step * (self.steps - step - 1)
        if not self.measure_s:
            return steps_left
        measured_by_the_last_step = per_step * max(0, self.steps - self.warmup_steps)
        return steps_left + max(0.0, self.measure_s - measured_by_the_last_step) + self.half_batch_share * self.measure_s

    def due(self, step: int) -> bool:
        return step == self.start_step or (step + 1) % self.every == 0 or step == self.steps - 1

    def line(self, step: int, loss: float, step_time_s: float) -> str:
        elapsed = time.perf_counter() - self.started
        eta = self.eta_s(step, elapsed)
        if self.device.type == "cuda":
            mem = f"mem {torch.cuda.memory_allocated(self.device) / 2**20:,.0f} MiB allocated"
        else:
            mem = f"mem {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB peak RSS"
        return (f"scalelab: step {step + 1}/{self.steps}  loss {loss:.4f}  "
                f"{self.tokens_per_step / step_time_s:,.0f} tok/s  {mem}  elapsed {elapsed:.1f} s  ETA {eta:.1f} s")
