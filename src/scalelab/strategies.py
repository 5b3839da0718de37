"""The data-parallel strategies, one record each: how a strategy wraps the model, what it
shards, what it communicates, which levers it takes. The formulas (scalelab.accounting),
the sweep's rules (scalelab.sweep), the wrappers (scalelab.training.parallel) and the
report read these records; nothing else knows what a stage means.

Keyed by the sweep's ``zero_stage``. A strategy that is no ZeRO stage (HSDP, say) gets a
record of its own with a new key, and the code that implements it in
``scalelab.training.parallel``.

Shard factors are per model-state kind (parameters, gradients, optimizer state): True = that
kind is divided over the N ranks at rest, False = every rank holds all of it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ShardFactors = tuple[bool, bool, bool]
"""(parameters, gradients, optimizer state) sharded over the ranks at rest."""


@dataclass(frozen=True)
class Strategy:
    stage: int
    """Key in the sweep (``zero_stage``)."""
    name: str
    """What PyTorch runs, in a few words (report, README)."""
    wrapper: str
    """Function in scalelab.training.parallel that wraps the model and builds the optimizer."""
    shards: ShardFactors
    """What PyTorch's implementation holds sharded at rest (fp32 master weights, fp32 grads, AdamW)."""
    shards_paper: ShardFactors
    """What the ZeRO paper's stage shards (its 2 + 2 + K convention)."""
    grad_psi: float
    """Gradient elements handed to collectives per optimizer step, in units of Psi (PyTorch's
    implementation; ZeRO paper's unit: all-reduce 2 Psi, reduce-scatter Psi). They travel in the
    run's reduce dtype (scalelab.accounting.comm_dtypes)."""
    param_psi: Callable[[int], float]
    """Parameter elements handed to collectives per optimizer step, in units of Psi, for k
    accumulation micro-batches: ZeroRedundancyOptimizer's broadcast of updated shards (fp32),
    FSDP2's all-gathers (in the gather dtype: the compute dtype under a MixedPrecisionPolicy)."""
    comm_psi_paper: float
    """The same in the ZeRO paper (no accumulation)."""
    transient_psi: Callable[[float, float, int, int], float]
    """Parameter bytes materialised within a step beyond model state: f(n_params, block_params, N,
    bytes per gathered element: 4, or 2 where FSDP2 gathers in a 16-bit compute dtype)."""
    silent_at_world_size_1: bool
    """Issues no collective at all on a one-rank mesh (FSDP2), where DDP still all-reduces."""
    ddp_buckets: bool
    """Has DDP gradient buckets (the bucket_mb lever applies)."""
    cpu_offload: bool
    """Can keep its sharded state in host memory (the cpu_offload lever applies)."""
    overlap: tuple[tuple[str, str], ...] = ()
    """Collectives that run behind compute, each with the window it hides in (scalelab.prediction:
    ``backward`` or the whole ``step``): DDP's gradient buckets all-reduce during backward, FSDP2
    prefetches its all-gathers and reduce-scatters during backward. A collective not listed
    (ZeroRedundancyOptimizer's broadcast after the step) is waited for; none listed: all exposed."""

    def comm_psi(self, k: int) -> float:
        """Elements handed to collectives per optimizer step, in units of Psi, for k accumulation
        micro-batches: gradients plus parameters."""
        return self.grad_psi + self.param_psi(k)


STRATEGIES: dict[int, Strategy] = {s.stage: s for s in (
    Strategy(0, "DDP", "parallelize_ddp", (False, False, False), (False, False, False),
             grad_psi=2, param_psi=lambda k: 0, comm_psi_paper=2, transient_psi=lambda psi, block, n, b: 0.0,
             silent_at_world_size_1=False, ddp_buckets=True, cpu_offload=False,
             overlap=(("all_reduce", "backward"),)),
    # PyTorch all-reduces gradients and then broadcasts the updated shards: 3 Psi, not the paper's 2.
    Strategy(1, "DDP + ZeroRedundancyOptimizer", "parallelize_zero1", (False, False, True), (False, False, True),
             grad_psi=2, param_psi=lambda k: 1, comm_psi_paper=2, transient_psi=lambda psi, block, n, b: 0.0,
             silent_at_world_size_1=False, ddp_buckets=True, cpu_offload=False,
             overlap=(("all_reduce", "backward"),)),  # its broadcast follows the optimizer step: exposed
    # FSDP2 reshards after backward, so at rest stage 2 holds what stage 3 holds; it keeps every
    # block's unsharded parameters (fp32, or the compute dtype under a MixedPrecisionPolicy) from
    # forward to backward (+b Psi (N-1)/N in the step), and all-gathers once per micro-batch:
    # k Psi of parameters + Psi of gradients reduce-scattered.
    Strategy(2, "FSDP2, reshard_after_forward=False", "parallelize_fsdp_keep", (True, True, True), (False, True, True),
             grad_psi=1, param_psi=lambda k: k, comm_psi_paper=2, transient_psi=lambda psi, block, n, b: b * psi * (n - 1) / n,
             silent_at_world_size_1=True, ddp_buckets=False, cpu_offload=False,
             overlap=(("all_gather", "step"), ("reduce_scatter", "backward"))),
    # Stage 3 gathers one block at a time (two in flight with prefetch), forward and backward: 2k Psi + Psi.
    Strategy(3, "FSDP2, reshard_after_forward=True", "parallelize_fsdp_reshard", (True, True, True), (True, True, True),
             grad_psi=1, param_psi=lambda k: 2 * k, comm_psi_paper=3,
             transient_psi=lambda psi, block, n, b: 2 * b * block * (n - 1) / n,
             silent_at_world_size_1=True, ddp_buckets=False, cpu_offload=True,
             overlap=(("all_gather", "step"), ("reduce_scatter", "backward"))),
)}
ZERO_STAGES = tuple(STRATEGIES)


def strategy(stage: int) -> Strategy:
    """The record of a stage; ValueError naming the known ones."""
    if stage not in STRATEGIES:
        raise ValueError(f"zero_stage must be one of {', '.join(map(str, ZERO_STAGES))}, got {stage!r}")
    return STRATEGIES[stage]
