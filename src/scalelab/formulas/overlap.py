"""A training step's time from its parts: compute plus the communication its strategy's overlap facts
(Strategy.overlap) leave exposed,

    step_s = compute_s + exposed_comm_s
    exposed_comm_s = sum_c comm_s[c] - eta x hidden

``hidden``: every overlapped collective's time but its last call (DDP's last bucket, FSDP2's first gather), at most
the compute of the window it hides in (backward: 2/3 of compute; the step: all of it). ``eta``, the overlap
efficiency, is fitted to a sweep's runs by scalelab.results.step_model, else DEFAULT_OVERLAP_EFFICIENCY. The
forecast (before any run) and collection (after) time a step with the same equation.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scalelab.formulas import links
from scalelab.registries.strategies import strategy

OVERLAP_WINDOWS = {"backward": 2 / 3, "step": 1.0}
"""Share of a step's compute a collective can hide behind: gradient reductions run during backward
(about 2/3 of a step's FLOPs: 4N of 6N per token), prefetched gathers during forward and backward."""
DEFAULT_OVERLAP_EFFICIENCY = {"cpu": 0.0, "cuda": 0.05}
"""eta where the fit set cannot fit it (scalelab.results.step_model). On a CPU, 0: one core per rank computes and communicates.
On a GPU, 0.05: the value (on a grid of 0.05) at which the step-time model, each series calibrated at its smallest
GPU count (one node), follows 18 published multi-node rows best (scalelab.forecast.published, docs/prediction.md: DDP
on 16-256 H100s and A100s, FSDP on 16-128 H100s; mean absolute error 2.8%, worst 7.5%). Anything from 0 to 0.25 fits
about as well (2.8-3.1%): the rows say that little of the communication added between nodes hides, not a precise
figure. At 1, which NCCL's own stream suggests, DDP over EFA was predicted up to 60% fast. The within-node overlap
is folded into each series' calibrated efficiency, so the rows do not measure it. A traced run of the user's own
(train.profile) measures eta. The compute reference of ``scalelab predict`` on a GPU subtracts the communication
exposed at this value too, so a GPU configuration whose reference runs at more than one rank predicts differently
when it changes, fitted eta or not."""

TENSOR_PARALLEL = "tensor_parallel "
"""The prefix of tensor parallelism's collectives among a step's (``tensor_parallel all_reduce``): no strategy's
overlap names them, so step_time leaves them on the critical path, where each block's forward and backward wait
for their own (the asynchronous overlaps of Megatron and torchtitan are not run here)."""

@dataclass(frozen=True)
class StepTime:
    """One optimizer step, predicted: seconds."""

    compute_s: float
    comm_s: Mapping[str, float]
    """Seconds per step of each collective type, all calls."""
    exposed_comm_s: float
    """Communication the step waits for: comm_s's total less what overlaps compute."""
    step_s: float


def step_time(zero_stage, compute_s: float, comm_s: Mapping[str, float], *, calls: Mapping[str, int] | None = None,
              overlap_efficiency: float = 1.0) -> StepTime:
    """A step of the strategy keyed ``zero_stage``: compute plus the communication its overlap
    facts (Strategy.overlap) leave exposed. An overlapped collective hides all its calls but the
    last (``calls``; without them, all of it) behind the compute of its window, at most that
    window, scaled by ``overlap_efficiency`` (eta, in [0, 1])."""
    if not (math.isfinite(compute_s) and compute_s >= 0):
        raise ValueError(f"compute_s must be >= 0 seconds, got {compute_s!r}")
    if not 0 <= overlap_efficiency <= 1:
        raise ValueError(f"overlap_efficiency must be in [0, 1], got {overlap_efficiency!r}")
    for c, s in comm_s.items():
        if c.removeprefix(TENSOR_PARALLEL) not in links.COLLECTIVES or not (math.isfinite(s) and s >= 0):
            raise ValueError(f"comm_s[{c!r}] = {s!r}: collectives are {', '.join(links.COLLECTIVES)} (tensor parallelism's "
                             f"prefixed {TENSOR_PARALLEL!r}), seconds >= 0")
    windows = dict(strategy(zero_stage).overlap)
    by_window: dict[str, float] = {}
    for c, seconds in comm_s.items():
        if c in windows:
            n_calls = (calls or {}).get(c)
            hideable = seconds * (1 - 1 / n_calls) if n_calls else seconds
            by_window[windows[c]] = by_window.get(windows[c], 0.0) + hideable
    hidden = 0.0
    for window in sorted(by_window, key=OVERLAP_WINDOWS.get):  # the narrower window first
        hidden = min(hidden + min(by_window[window], OVERLAP_WINDOWS[window] * compute_s), compute_s)
    total = float(sum(comm_s.values()))
    exposed = total - overlap_efficiency * hidden
    return StepTime(float(compute_s), dict(comm_s), exposed, float(compute_s) + exposed)
