"""The data-parallel strategies, one record each: how a strategy wraps the model, what it
shards, what it communicates, which levers it takes. The formulas (scalelab.formulas),
the sweep's rules (scalelab.planning.sweep), the wrappers (scalelab.run.parallel) and the
report read these records; nothing else knows what a stage means.

Keyed by the sweep's ``zero_stage``. Hybrid sharding (HSDP, :data:`HYBRID`) is ZeRO stage 3
with ``replicas`` > 1 (the sweep's ``replicas`` axis): FSDP2 over a 2-D mesh (replicate x shard),
parameters, gradients and optimizer state sharded over the N/R ranks of a shard group (a node)
and replicated over the R groups (across nodes). It is selected that way, not by a new
``zero_stage`` key, because it *is* stage 3 inside each shard group (same shards, same per-block
gathers, same wrapper code with a 2-D mesh), ``replicas=1`` is exactly stage 3, and so the one
``replicas`` axis spans the whole family (2 = 2 x 1 is plain replication through FSDP2) while
``zero_stage`` stays the small integer every table, run id and figure already keys on (no cached
run id changes). ``strategy(3, replicas)`` returns its record; ``strategy("hybrid")`` too.

Shard factors are per model-state kind (parameters, gradients, optimizer state): True = that
kind is divided over the ranks of a shard group at rest (all N ranks; N/R under hybrid
sharding), False = every rank holds all of it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

DDP_BUCKET_MB = 25.0
"""PyTorch DDP's default bucket size (MiB): stages 0 and 1 reduce gradients in buckets of this
size unless the sweep's bucket_mb axis says otherwise."""

ShardFactors = tuple[bool, bool, bool]
"""(parameters, gradients, optimizer state) sharded over the ranks at rest."""


@dataclass(frozen=True)
class Strategy:
    stage: int
    """Key in the sweep (``zero_stage``)."""
    name: str
    """What PyTorch runs, in a few words (report, README)."""
    wrapper: str
    """Function in scalelab.run.parallel that wraps the model and builds the optimizer."""
    shards: ShardFactors
    """What PyTorch's implementation holds sharded at rest (fp32 master weights, fp32 grads, AdamW)."""
    shards_paper: ShardFactors
    """What the ZeRO paper's stage shards (its 2 + 2 + K convention)."""
    grad_psi: float
    """Gradient elements handed to collectives per optimizer step, in units of Psi (PyTorch's
    implementation; ZeRO paper's unit: all-reduce 2 Psi, reduce-scatter Psi). They travel in the
    run's reduce dtype (scalelab.formulas.communication.comm_dtypes)."""
    param_psi: Callable[[int], float]
    """Parameter elements handed to collectives per optimizer step, in units of Psi, for k
    accumulation micro-batches: ZeroRedundancyOptimizer's broadcast of updated shards (fp32),
    FSDP2's all-gathers (in the gather dtype: the compute dtype under a MixedPrecisionPolicy)."""
    comm_psi_paper: float
    """The same in the ZeRO paper (no accumulation)."""
    transient_psi: Callable[[float, float, float, int], float]
    """Parameter bytes materialised at a step's peak (the start of backward) beyond model state:
    f(n_params, block_params, outside_params (those of no block: embeddings, final norm, head),
    bytes per gathered element: 4, or 2 where FSDP2 gathers in a 16-bit compute dtype). FSDP2
    all-gathers into a buffer of its own, the whole unsharded group at any world size (one GPU too:
    an H200's stage 2 and 3 peaks)."""
    silent_at_world_size_1: bool
    """Issues no collective at all on one rank: FSDP2, and stage 0, whose one rank trains the model
    without DDP; ZeRO-1's DDP and ZeroRedundancyOptimizer still all-reduce and broadcast there."""
    ddp_buckets: bool
    """Has DDP gradient buckets (the bucket_mb lever applies), where DDP wraps the model."""

    cpu_offload: bool
    """Can keep its sharded state in host memory (the cpu_offload lever applies)."""
    replicate_psi: float = 0.0
    """Gradient elements all-reduced across replicas per optimizer step, in units of Psi / S (S =
    the shard group's size, N/R): hybrid sharding all-reduces each rank's reduce-scattered shard
    over its replicate group (2 Psi/S in the paper's unit), in the reduce dtype; 0 elsewhere."""
    mesh_dims: tuple[str, ...] = ("dp",)
    """The device mesh's dimension names (FSDP2 strategies): one data-parallel dimension, or
    torchtitan's ("dp_replicate", "dp_shard") for hybrid sharding."""
    overlap: tuple[tuple[str, str], ...] = ()
    """Collectives that run behind compute, each with the window it hides in (scalelab.formulas.overlap:
    ``backward`` or the whole ``step``): DDP's gradient buckets all-reduce during backward, FSDP2
    prefetches its all-gathers and reduce-scatters during backward. A collective not listed
    (ZeroRedundancyOptimizer's broadcast after the step) is waited for; none listed: all exposed."""
    last_block_kept: bool = False
    """FSDP2 keeps the last block's parameters gathered from its forward to its backward (torchtitan's recipe: backward
    starts with that block, so a reshard would gather it straight back): one block's all-gather fewer per micro-batch
    at a stage that reshards after forward (scalelab.formulas.tensor_parallelism: ``last_block_params``)."""
    batched: tuple[str, ...] = ()
    """Collectives issued as one batch of async calls, then waited (ZeroRedundancyOptimizer: a broadcast
    per parameter tensor): timed per call from ``scalelab bench comm``'s batched rows (on gloo a call of
    a batch costs several times one call alone)."""

    def ddp_buckets_apply(self, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> bool:
        """Whether DDP's bucket size applies: its strategies on a whole model, or on ZeRO-1's pipeline stages. Never a
        model split by tensor parallelism (DDP takes no DTensor parameters: stage 0 replicates it with FSDP2's
        replicate, no buckets), nor stage 0's pipeline stages (FSDP2's replicate too: torch's schedules drive it)."""
        return self.ddp_buckets and tensor_parallel == 1 and (pipeline_parallel == 1 or self.stage == 1)

    def ddp_wraps(self, world_size: int, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> bool:
        """Whether DDP wraps the model (``world_size``: its data-parallel ranks): its buckets then hold the
        gradients between steps (:meth:`ddp_buckets_apply`; one rank at stage 0 trains without DDP)."""
        return self.ddp_buckets_apply(tensor_parallel, pipeline_parallel) and not (self.silent_at_world_size_1
                                                                                  and world_size == 1)

    def comm_psi(self, k: int) -> float:
        """Elements handed to collectives per optimizer step, in units of Psi, for k accumulation
        micro-batches: gradients plus parameters."""
        return self.grad_psi + self.param_psi(k)


STRATEGIES: dict[int, Strategy] = {s.stage: s for s in (
    # One rank trains the model alone (no DDP: scalelab.run.parallel.parallelize_ddp).
    Strategy(0, "DDP", "parallelize_ddp", (False, False, False), (False, False, False),
             grad_psi=2, param_psi=lambda k: 0, comm_psi_paper=2, transient_psi=lambda psi, block, outside, b: 0.0,
             silent_at_world_size_1=True, ddp_buckets=True, cpu_offload=False,
             overlap=(("all_reduce", "backward"),)),
    # PyTorch all-reduces gradients and then broadcasts the updated shards: 3 Psi, not the paper's 2.
    Strategy(1, "DDP + ZeroRedundancyOptimizer", "parallelize_zero1", (False, False, True), (False, False, True),
             grad_psi=2, param_psi=lambda k: 1, comm_psi_paper=2, transient_psi=lambda psi, block, outside, b: 0.0,
             silent_at_world_size_1=False, ddp_buckets=True, cpu_offload=False,
             overlap=(("all_reduce", "backward"),), batched=("broadcast",)),  # the broadcasts follow the step: exposed
    # FSDP2 reshards after backward, so at rest stage 2 holds what stage 3 holds; it keeps every
    # group's unsharded parameters (fp32, or the compute dtype under a MixedPrecisionPolicy) from
    # forward to backward (+b Psi in the step), and all-gathers once per micro-batch:
    # k Psi of parameters + Psi of gradients reduce-scattered.
    Strategy(2, "FSDP2, reshard_after_forward=False", "parallelize_fsdp_keep", (True, True, True), (False, True, True),
             grad_psi=1, param_psi=lambda k: k, comm_psi_paper=2, transient_psi=lambda psi, block, outside, b: b * psi,
             silent_at_world_size_1=True, ddp_buckets=False, cpu_offload=False,
             overlap=(("all_gather", "step"), ("reduce_scatter", "backward"))),
    # Stage 3 gathers one block at a time (two in flight with prefetch), forward and backward: 2k Psi + Psi, less the
    # last block's second gather (kept from its forward to its backward, as torchtitan keeps it). At the start of
    # backward the root group (the parameters of no block: the head's backward runs first) is gathered beside two blocks.
    Strategy(3, "FSDP2, reshard_after_forward=True", "parallelize_fsdp_reshard", (True, True, True), (True, True, True),
             grad_psi=1, param_psi=lambda k: 2 * k, comm_psi_paper=3,
             transient_psi=lambda psi, block, outside, b: b * (2 * block + outside),
             silent_at_world_size_1=True, ddp_buckets=False, cpu_offload=True,
             overlap=(("all_gather", "step"), ("reduce_scatter", "backward")), last_block_kept=True),
)}
ZERO_STAGES = tuple(STRATEGIES)

# Hybrid sharding (HSDP): stage 3 within a shard group of S = N/R ranks (a node), R replicas
# across nodes. Per step: 2k Psi all-gathered and Psi reduce-scattered within the shard group, then
# each rank's Psi/S gradient shard all-reduced over its replicate group (2 Psi/S): the only traffic
# that crosses nodes when a shard group is a node, where ZeRO-3 sends everything over the world.
# Derived from stage 3's record, so every field stage 3 has (shards, gathers, transient, and any
# step-time field added later) is hybrid's within its shard group; offload is not run with it here.
HYBRID = dataclasses.replace(STRATEGIES[3], name="FSDP2 HSDP, 2-D mesh (replicate x shard), reshard_after_forward=True",
                             wrapper="parallelize_hsdp", cpu_offload=False, replicate_psi=2,
                             mesh_dims=("dp_replicate", "dp_shard"),
                             # each block's all-reduce across replicas follows its reduce-scatter in backward
                             overlap=(*STRATEGIES[3].overlap, ("all_reduce", "backward")))
# ZeRO-1 as the trainers that scale run it (DeepSpeed's stage 1, Megatron-LM's distributed optimizer, nanotron's
# zero_stage 1): each rank reduce-scatters the gradients (Psi handed, in the reduce dtype), steps its optimizer
# shard, and all-gathers the updated parameters in the compute dtype (Psi): 2 Psi, the ZeRO paper's, where
# scalelab's own ZeroRedundancyOptimizer all-reduces (2 Psi) and broadcasts fp32 shards (Psi). Both follow backward
# and the step, exposed: Megatron's overlap_grad_reduce and overlap_param_gather are off by default, and nanotron
# reduce-scatters after backward (its sweep's ZeRO-1 runs fit so: scalelab.forecast.published).
# A record for forecasts (scalelab.forecast.step): scalelab's sweep does not run it.
ZERO1_SHARDED = dataclasses.replace(
    STRATEGIES[1], name="ZeRO-1, distributed optimizer (reduce-scatter, all-gather in the compute dtype)",
    wrapper="", grad_psi=1, overlap=(), batched=())
ZERO1_SHARDED_KEY = "zero1-sharded"
"""What ``strategy()`` takes for ZERO1_SHARDED (forecasts only)."""
@dataclass(frozen=True)
class Trainer:
    name: str
    description: str
    overlap_efficiency: float | None
    """The share of its overlappable communication that hides behind compute (scalelab.formulas.overlap's eta) where
    fitted to this trainer's published runs; None: the GPU's default there."""
    form: str = "scalelab"
    """Whose strategies price ZeRO 0/1 and tensor parallelism: ``scalelab`` (scalelab.formulas.communication) or
    ``megatron`` (the distributed optimizer and vocabulary-parallel tensor parallelism: scalelab.formulas.megatron_style)."""
    tensor_parallel_overlap: bool = False
    """Its blocks' sequence-parallel all-gathers and reduce-scatters run behind their own GEMMs (TransformerEngine's
    userbuffers: scalelab.formulas.megatron_style.overlapped_tensor_parallel_seconds); else on the critical path."""
    memory: str = "scalelab"
    """Whose memory recipe prices its peak: ``scalelab`` (scalelab.formulas.peak_memory), ``megatron``
    (megatron_style, at stages 0 and 1) or ``llm-foundry`` (foundry_style, FSDP FULL_SHARD)."""
    stages: tuple[int, ...] | None = None
    """The ZeRO stages it is priced at (``scalelab plan`` searches them); None: every stage and hybrid sharding."""
    grad_reduce: str = "fp32"
    """The dtype its gradients are reduced in unless --grad-reduce says otherwise: ``fp32`` or ``compute``."""
    reduce_every_micro_batch: bool = False
    """Reduce-scatters each micro-batch's gradients (FSDP without ``no_sync``) rather than once a step."""


MEGATRON_OVERLAP_EFFICIENCY = 0.0
"""eta of the megatron trainer: the value (on a grid of 0.05) at which the step-time model follows the Ultra-Scale
Playbook sweep's 1B series best at up to 256 GPUs, each series calibrated at its smallest count (the fit set:
scalelab.forecast.published_sweep.FIT_MODELS); its 3B and 8B series are held out (docs/prediction.md). 0: on the
sweep's measured links, each data-parallel group's all-reduce at the rate one group reached (links.across_nodes), the
runs show no communication hidden beyond what their one-node calibration holds."""
TRAINERS = {t.name: t for t in (
    Trainer("scalelab", "scalelab's own strategies as its runs run them (ZeRO-1: PyTorch's ZeroRedundancyOptimizer, an "
                        "fp32 all-reduce then an fp32 broadcast of the updated shards; tensor parallelism with the embedding "
                        "and head whole, its backward all-reduces in fp32)", None),
    Trainer("megatron", "Megatron-LM and nanotron (DeepSpeed's ZeRO-1 alike): ZeRO-1 as a distributed optimizer, gradients "
                        "reduce-scattered and parameters all-gathered in the compute dtype; bf16 parameters with an fp32 "
                        "gradient buffer; tensor parallelism with the embedding, head and loss split over the vocabulary, its "
                        "collectives in the compute dtype (scalelab.formulas.megatron_style)", MEGATRON_OVERLAP_EFFICIENCY,
            form="megatron", memory="megatron", stages=(0, 1), grad_reduce="compute"),
    # NeMo 24.x on Megatron-core and TransformerEngine, as NVIDIA's recipes set it (ub_tp_comm_overlap=True, sequence
    # parallelism): NeMo's docs (docs/source/features/optimizations/communication_overlap.rst) say userbuffers overlap
    # every tensor-parallel all-gather and reduce-scatter with the GEMM beside it, in bulk or pipelined in chunks
    Trainer("nemo", "NeMo (Megatron-core with TransformerEngine) as its recipes run it: the megatron trainer's distributed "
                    "optimizer, memory and vocabulary-parallel tensor parallelism, with the blocks' sequence-parallel "
                    "all-gathers and reduce-scatters overlapped with their GEMMs by userbuffers (ub_tp_comm_overlap: one "
                    "chunk of four of each forward row-parallel reduce-scatter exposed, and what outlasts the blocks' "
                    "compute); its data-parallel syncs exposed as the megatron trainer's", MEGATRON_OVERLAP_EFFICIENCY,
            form="megatron", tensor_parallel_overlap=True, memory="megatron", stages=(0, 1), grad_reduce="compute"),
    # llm-foundry's MPT benchmarks (scripts/train/benchmarking/submit_benchmarks.py): FSDP FULL_SHARD, mixed precision
    # PURE, which composer (composer/distributed/mosaic_parallelism.py, get_mixed_precision) makes param_dtype,
    # reduce_dtype and buffer_dtype all the compute dtype; composer's ddp_sync_context (dist_strategy.py) leaves a model
    # that is not DDP alone, so FSDP reduce-scatters every micro-batch's gradients
    Trainer("llm-foundry", "llm-foundry (composer) as its MPT benchmarks run: FSDP FULL_SHARD with mixed precision PURE "
                           "(each block all-gathered in bf16 for forward and again for backward, every micro-batch's "
                           "gradients reduce-scattered in bf16), its memory by scalelab.formulas.foundry_style's recipe "
                           "(MPT's blocks: the gpt2 family's shape), bf16, no tensor or pipeline parallelism", None,
            memory="llm-foundry", stages=(3,), grad_reduce="compute", reduce_every_micro_batch=True),
)}
HYBRID_KEY = "hybrid"
"""What ``strategy()`` and ``scalelab estimate`` accept for hybrid sharding beside the stages."""


def check_replicas(world_size: int, replicas: int) -> int:
    """The shard group's size N/R; ValueError naming the culprit when R does not divide N."""
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ValueError(f"replicas must be a whole number >= 1, got {replicas!r}")
    if world_size % replicas:
        raise ValueError(f"replicas={replicas} does not divide world_size={world_size}: every replica "
                         "(shard group) must have the same number of ranks")
    return world_size // replicas


def strategy(stage: int | str, replicas: int = 1) -> Strategy:
    """The record of a stage (with ``replicas`` > 1: hybrid sharding, stage 3 only), or of
    ``"hybrid"``; ValueError naming the known ones."""
    if stage == HYBRID_KEY:
        return HYBRID
    if stage == ZERO1_SHARDED_KEY:
        return ZERO1_SHARDED
    if stage not in STRATEGIES:
        raise ValueError(f"zero_stage must be one of {', '.join(map(str, ZERO_STAGES))} "
                         f"(or {HYBRID_KEY!r}), got {stage!r}")
    if replicas != 1:
        if stage != HYBRID.stage:
            raise ValueError(f"replicas={replicas} is hybrid sharding, which is zero_stage {HYBRID.stage} "
                             f"(FSDP2 over a replicate x shard mesh); zero_stage {stage} has no replicas")
        check_replicas(replicas, replicas)
        return HYBRID
    return STRATEGIES[stage]
