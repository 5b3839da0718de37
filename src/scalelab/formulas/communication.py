"""Communication per step: the dtypes a run's collectives carry, and the elements and bytes each
strategy hands them per optimizer step, by collective, by process group and by link.

Communication per step in the ZeRO paper's unit (elements handed to collectives: an
all-reduce of Psi counts 2 Psi, a reduce-scatter or all-gather of Psi counts Psi, a
broadcast of Psi counts Psi). On a ring each rank sends (N-1)/N of that.
stage 0: 2 Psi; 1: 2 Psi (paper) / 3 Psi (PyTorch's ZeroRedundancyOptimizer all-reduces
gradients and broadcasts updated parameter shards); 2: 2 Psi; 3: 3 Psi. With k
micro-batches of gradient accumulation FSDP2 all-gathers parameters for every
micro-batch: stage 2: (k + 1) Psi, stage 3: (2k + 1) Psi. At world size 1 FSDP2 issues
no collectives (measured: 0 bytes), nor does stage 0 (one rank trains the model without DDP), while
ZeRO-1's DDP and ZeroRedundancyOptimizer still do.

Bytes per step (comm_bytes_per_step, what runs predict and CommCounter measures): the
gradient elements at the reduce dtype's width plus the parameter elements at the gather
dtype's width (comm_dtypes): fp32 everywhere, except that fp16 and bf16 runs at stages 2 and 3
all-gather parameters in their compute dtype (FSDP2 MixedPrecisionPolicy, param_dtype = compute
dtype: half of fp32's all-gather bytes) and, with the grad_reduce lever at ``compute``, reduce
gradients in it at every stage; fp16 adds its loss scaler's 8-byte inf/NaN flag.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from scalelab.formulas.rank_step import RankStep
from scalelab.registries.precisions import PRECISIONS
from scalelab.registries.precisions import precision as precision_record
from scalelab.registries.strategies import check_replicas, strategy
from scalelab.registries.topology import LINKS, contiguous_nodes, link_of

MIXED_COMM = tuple(p.name for p in PRECISIONS.values() if p.autocast and not p.linears)
"""Precisions that communicate in their compute dtype where people do (fp16, bf16): FSDP2's
MixedPrecisionPolicy gathers their parameters in it at stages 2 and 3, and the grad_reduce lever
reduces their gradients in it. fp8 is not one: its Float8Linear weights are cast to float8 from
the fp32 masters inside each matmul, and torchao's sharded recipe is a float8 all-gather of its
own (``enable_fsdp_float8_all_gather``), not a bf16 one; its runs gather and reduce fp32 as before."""
GRAD_REDUCE = ("fp32", "compute")
"""Values of the grad_reduce lever: gradients reduced in fp32 (torchtitan's default,
MixedPrecisionPolicy reduce_dtype=float32 at stages 2 and 3; DDP's plain all-reduce of its fp32
buckets at 0 and 1), or in the compute dtype (reduce_dtype = the compute dtype; DDP's
bf16_compress_hook / fp16_compress_hook)."""
DTYPE_SIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes per element of the dtypes collectives carry (torch attribute names)."""
LOSS_SCALER_COMM_BYTES = 2 * 4
"""ShardedGradScaler all-reduces its one-element fp32 inf/NaN flag every step (fp16): 8 bytes in
the paper's unit, at every stage and world size."""


@dataclass(frozen=True)
class CommDtypes:
    """The dtypes a run's collectives carry (torch attribute names)."""

    param_gather: str | None
    """What FSDP2 all-gathers parameters in: float32, or the compute dtype of fp16/bf16
    (MixedPrecisionPolicy param_dtype); None for strategies that gather none (stages 0, 1, whose
    ZeroRedundancyOptimizer broadcasts its fp32 shards)."""
    grad_reduce: str
    """What gradients are reduced in (all-reduce, reduce-scatter): float32, or the compute dtype
    with grad_reduce=compute. Reduced gradients land in fp32 either way."""

    @property
    def gather_bytes(self) -> int:
        """Bytes per parameter element gathered (fp32's 4 where nothing is gathered)."""
        return DTYPE_SIZE[self.param_gather or "float32"]

    @property
    def reduce_bytes(self) -> int:
        return DTYPE_SIZE[self.grad_reduce]


def comm_dtypes(precision: str, zero_stage: int, grad_reduce: str = "fp32") -> CommDtypes:
    """The dtypes of a run's collectives: parameters gathered in the compute dtype by the
    strategies that shard them (FSDP2, stages 2 and 3) for fp16 and bf16; gradients reduced in
    fp32, or in the compute dtype with ``grad_reduce='compute'`` (fp16 and bf16 only: fp32 has no
    lower dtype, fp8 keeps its recipe; see MIXED_COMM)."""
    if grad_reduce not in GRAD_REDUCE:
        raise ValueError(f"grad_reduce must be one of {', '.join(GRAD_REDUCE)}, got {grad_reduce!r}")
    compute = precision_record(precision).compute
    mixed = precision in MIXED_COMM
    gather = (compute if mixed else "float32") if strategy(zero_stage).shards[0] else None
    return CommDtypes(gather, compute if mixed and grad_reduce == "compute" else "float32")


def sixteen_bit_params(precision: str, zero_stage: int | None) -> bool:
    """Whether a run computes with 16-bit parameters: fp16 and bf16 under FSDP2's MixedPrecisionPolicy
    (stages 2 and 3: comm_dtypes), whose gathered parameters are already in the compute dtype, so the
    embedding, the residual stream and the LayerNorms run in it and autocast copies no weight."""
    return zero_stage is not None and comm_dtypes(precision, zero_stage).gather_bytes < 4

def comm_elements_per_step(n_params: int, zero_stage: int, world_size: int,
                           accumulation_steps: int = 1, convention: str = "pytorch", replicas: int = 1) -> float:
    """Elements handed to collectives per optimizer step (ZeRO paper's unit, see module doc).
    Hybrid sharding (``replicas`` R > 1) adds its all-reduce across replicas, 2 Psi/S (S = N/R),
    in both conventions; its shard group of S ranks issues stage 3's gathers and reduce-scatter
    unless S = 1."""
    record, psi = strategy(zero_stage, replicas), float(n_params)
    shard = check_replicas(world_size, replicas)
    across = record.replicate_psi * psi / shard if replicas > 1 else 0.0
    if convention == "paper":
        return record.comm_psi_paper * psi + across
    if record.silent_at_world_size_1 and shard == 1:
        return across  # one rank at stage 0 (no DDP), or FSDP2 on a one-rank shard group: no collective at all
    return record.comm_psi(accumulation_steps) * psi + across

def comm_bytes_per_step(n_params: int, step: RankStep, n_trainable: int | None = None,
                        last_block_params: float = 0.0) -> float:
    """Bytes handed to collectives per optimizer step by a rank running ``step``, PyTorch's strategies (the module
    doc's unit: an all-reduce of S bytes counts 2S), what CommCounter measures, exactly:

        grad_psi T r + param_psi(k) P g + 8 [fp16]

    T = trainable parameters (Psi, or LoRA's A and B), P = the parameters a collective moves
    (FSDP2 gathers every parameter, frozen or not: Psi; ZeroRedundancyOptimizer broadcasts its
    trainable shards: T), r and g the bytes per element of the reduce and gather dtypes
    (comm_dtypes of the step's precision, stage and grad_reduce; ZeroRedundancyOptimizer's broadcast is fp32),
    k the step's accumulation_steps, and 8 bytes for the fp16 loss scaler's inf/NaN flag. At world size 1 (the
    step's data_parallel ranks N) FSDP2 issues no gather or reduce-scatter and stage 0 no all-reduce (no DDP): only
    the scaler's flag remains. In fp32 bytes (r = g = 4) this is 4 x comm_elements_per_step
    (lora_comm_elements_per_step with LoRA). Hybrid sharding (the step's ``replicas`` R > 1) adds the all-reduce of
    each rank's gradient shard across replicas, 2 T r / S (S = N/R), and its gathers and reduce-scatter run within
    the shard group (none when S = 1): the sum of comm_bytes_by_type."""
    return sum(comm_bytes_by_type(n_params, step, n_trainable, last_block_params).values())


def _comm_terms(n_params: float, step: RankStep, n_trainable: int | None = None,
                last_block_params: float = 0.0) -> list[tuple[str, str, float]]:
    """(collective, group, bytes in the module doc's unit) of one optimizer step; group: ``world``,
    ``shard`` (hybrid sharding's shard group, N/R ranks) or ``replicate`` (its R replicas). ``last_block_params``:
    the elements of the block FSDP2 keeps gathered from its forward to its backward (Strategy.last_block_kept), whose
    second gather per micro-batch a strategy that reshards after forward does not issue (0: a run that re-gathered it)."""
    zero_stage, replicas, accumulation_steps = step.zero_stage, step.replicas, step.accumulation_steps
    record, dtypes = strategy(zero_stage, replicas), comm_dtypes(step.precision, zero_stage, step.grad_reduce)
    shard = check_replicas(step.data_parallel, replicas)
    terms = []
    if precision_record(step.precision).loss_scaling:  # ShardedGradScaler's flag, over the world
        terms.append(("all_reduce", "world", float(LOSS_SCALER_COMM_BYTES)))
    psi = float(n_params)
    trainable = psi if n_trainable is None else float(n_trainable)
    within = "shard" if replicas > 1 else "world"
    if not (record.silent_at_world_size_1 and shard == 1):
        moved = psi if record.shards[0] else trainable  # gathered whole (FSDP2) or the trainable shards broadcast (ZeRO-1)
        terms.append(("reduce_scatter" if record.shards[1] else "all_reduce", within,
                      record.grad_psi * trainable * dtypes.reduce_bytes))
        kept = accumulation_steps * last_block_params if record.last_block_kept else 0.0
        terms.append(("all_gather" if record.shards[0] else "broadcast", within,
                      (record.param_psi(accumulation_steps) * moved - kept) * dtypes.gather_bytes))
    if replicas > 1:
        terms.append(("all_reduce", "replicate", record.replicate_psi * trainable * dtypes.reduce_bytes / shard))
    return terms


def comm_bytes_by_type(n_params: int, step: RankStep, n_trainable: int | None = None,
                       last_block_params: float = 0.0) -> dict[str, float]:
    """comm_bytes_per_step split by collective (scalelab.formulas.links.COLLECTIVES' names: all_reduce,
    reduce_scatter, all_gather, broadcast), the module doc's unit; collectives a run does not
    issue are left out."""
    out: dict[str, float] = {}
    for collective, _, nbytes in _comm_terms(n_params, step, n_trainable, last_block_params):
        out[collective] = out.get(collective, 0.0) + nbytes
    return {c: b for c, b in out.items() if b}


def comm_bytes_by_group(n_params: float, step: RankStep, last_block_params: float = 0.0) -> dict[str, dict[str, float]]:
    """comm_bytes_per_step by the group each collective runs over (``world``; under hybrid sharding also
    ``shard`` and ``replicate``: comm_groups) and by collective, the module doc's unit; groups and collectives a
    run does not use are left out."""
    out: dict[str, dict[str, float]] = {}
    for collective, group, nbytes in _comm_terms(n_params, step, None, last_block_params):
        if nbytes:
            by_type = out.setdefault(group, {})
            by_type[collective] = by_type.get(collective, 0.0) + nbytes
    return out


def sharded_zero1_bytes(n_params: float, precision: str, grad_reduce: str = "compute") -> dict[str, float]:
    """ZeRO-1 as distributed optimizers run it (scalelab.registries.strategies.ZERO1_SHARDED), per optimizer step over the
    data-parallel group, the module doc's unit: the gradients reduce-scattered (Psi in the reduce dtype:
    ``grad_reduce`` as comm_dtypes reads it), the updated parameters all-gathered in the compute dtype (fp16,
    bf16; fp32 otherwise), and fp16's loss-scaler flag."""
    dtypes = comm_dtypes(precision, 3, grad_reduce)  # the dtypes of a strategy that gathers its parameters
    out = {"reduce_scatter": float(n_params) * dtypes.reduce_bytes, "all_gather": float(n_params) * dtypes.gather_bytes}
    if precision_record(precision).loss_scaling:
        out["all_reduce"] = float(LOSS_SCALER_COMM_BYTES)
    return out


def comm_groups(world_size: int, replicas: int, rank: int = 0) -> dict[str, list[int]]:
    """The global ranks of the process groups ``rank`` issues collectives over: ``world``, and under
    hybrid sharding its ``shard`` group (S = N/R consecutive ranks: the mesh's inner dimension,
    torchtitan's dp_shard) and its ``replicate`` group (the ranks at its position in every shard
    group: dp_replicate)."""
    shard = check_replicas(world_size, replicas)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    first = rank - rank % shard
    return {"world": list(range(world_size)), "shard": list(range(first, first + shard)),
            "replicate": list(range(rank % shard, world_size, shard))}


def comm_bytes_by_link(n_params: float, step: RankStep, ranks_per_node: int, n_trainable: int | None = None,
                       rank: int = 0, last_block_params: float = 0.0) -> dict[str, dict[str, float]]:
    """Bytes one rank (rank 0 by default: the rank a run measures) hands to collectives per
    optimizer step, by link and collective: ``{"intra_node": {collective: bytes}, "inter_node":
    {...}}``, the module doc's unit, summing to comm_bytes_per_step. Ranks sit on nodes as torchrun
    places them (``ranks_per_node`` P consecutive ranks per node); a collective counts wholly on
    the inter-node link when its group spans nodes (scalelab.planning.placement.link_of's convention).

    DDP, ZeRO-1 and ZeRO-3 issue everything over the world: inter-node once N > P. Hybrid
    sharding with its shard group inside a node (S <= P) keeps the gathers and the reduce-scatter
    within it and sends only the all-reduce across replicas, 2 Psi r / S, between nodes.

    Under tensor parallelism (the step's ``tensor_parallel`` T > 1: its ``data_parallel`` N and ``n_params`` are then
    the data-parallel ranks and one rank's share: scalelab.formulas.predicted_columns.split_of) the world is
    T x N ranks and the strategy's collectives run over rank 0's data-parallel group, every
    T-th rank (tensor parallelism's own, over ranks 0..T-1: tensor_parallel_comm, counted apart)."""
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
    world_size, tensor_parallel = step.data_parallel, step.tensor_parallel
    if tensor_parallel > 1:
        nodes = contiguous_nodes(world_size * tensor_parallel, ranks_per_node)
        out = {link: {} for link in LINKS}
        data_group = list(range(0, world_size * tensor_parallel, tensor_parallel))
        # one data-parallel group: tensor parallelism runs without hybrid sharding's replicas (a 3-D mesh, not run)
        for collective, _, nbytes in _comm_terms(n_params, replace(step, replicas=1), n_trainable, last_block_params):
            if nbytes:
                by_type = out[link_of(data_group, nodes)]
                by_type[collective] = by_type.get(collective, 0.0) + nbytes
        return out
    nodes, groups = contiguous_nodes(world_size, ranks_per_node), comm_groups(world_size, step.replicas, rank)
    out: dict[str, dict[str, float]] = {link: {} for link in LINKS}
    for collective, group, nbytes in _comm_terms(n_params, step, n_trainable, last_block_params):
        if nbytes:
            by_type = out[link_of(groups[group], nodes)]
            by_type[collective] = by_type.get(collective, 0.0) + nbytes
    return out

def ddp_bucket_count(param_bytes_in_order: list[int], bucket_mb: float) -> int:
    """All-reduce calls per step of DDP with every bucket capped at bucket_mb MiB.

    DDP fills buckets with gradients in the order they become ready in backward (about the
    reverse of registration order); a bucket is closed once it holds at least the cap."""
    cap = bucket_mb * 2 ** 20
    buckets, filled = 0, 0.0
    for size in reversed(param_bytes_in_order):
        filled += size
        if filled >= cap:
            buckets, filled = buckets + 1, 0.0
    return buckets + (filled > 0)
