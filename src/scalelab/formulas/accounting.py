"""Napkin math made exact: parameters, FLOPs, MFU, memory per rank, communication.

One source of truth: training runs take their *predicted* columns from here.

Memory conventions (bytes per parameter, Psi = parameter count, N = world size):

* ``paper`` - the ZeRO paper (Rajbhandari et al. 2020), mixed-precision Adam:
  2 Psi fp16 parameters + 2 Psi fp16 gradients + K Psi optimizer state, K = 12
  (fp32 master weights, momentum, variance). For fp32 training: 4 + 4 + 8.
  stage 0: (2+2+K) Psi; 1: (2+2) Psi + K Psi/N; 2: 2 Psi + (2+K) Psi/N; 3: (2+2+K) Psi/N.
* ``pytorch`` - what this project's strategies really hold *at rest* (after the
  optimizer step). Autocast keeps fp32 parameters and fp32 gradients in every precision,
  and AdamW keeps two fp32 moments: 4 + 4 + 8 = 16 bytes per parameter.
  stage 0 (DDP): 16 Psi; 1 (DDP + ZeroRedundancyOptimizer): 8 Psi + 8 Psi/N;
  2 and 3 (FSDP2): 16 Psi/N. FSDP2's stage 2 reshards parameters after backward, so at
  rest it holds what stage 3 holds; the stages differ within a step (stage 2 keeps the
  unsharded parameters from forward to backward).
  The same 16 bytes in every precision and with either grad_reduce value: FSDP2's
  MixedPrecisionPolicy (fp16, bf16 at stages 2 and 3) keeps the sharded fp32 parameters the
  optimizer steps, frees the 16-bit unsharded copies after use and casts reduced gradients
  back to fp32; DDP's compression hooks decompress into the fp32 buckets.

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

MFU is recorded against two peaks. ``mfu`` (and ``hfu``) divide by the
dense peak of the run's own precision (``peak_flops_per_device``: fp8 runs by the fp8
tensor-core peak, twice the bf16 one on Hopper); ``mfu_bf16_peak`` divides every run, whatever
its precision, by the dense bf16 peak (``peak_flops_bf16``), the common convention (torchtitan's)
that makes fp8 and bf16 runs comparable on one scale: an fp8 run that only matches its bf16
twin's speed shows the same ``mfu_bf16_peak`` and half the ``mfu``. On a CPU both peaks are
measured matmul rates (the run's compute dtype; bf16 for the second). The report's figures
(``mfu_heatmap``), its run table and its MFU warnings use ``mfu``; its fp8-against-bf16 table
shows both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from scalelab.config import ModelConfig
from scalelab.spec import hardware
from scalelab.spec.families import ActivationCase, Family, family, tensor_parallel_split_params
from scalelab.spec.precisions import AUTOCAST, PRECISIONS, peak_key
from scalelab.spec.precisions import precision as precision_record
from scalelab.spec.strategies import check_replicas, strategy
from scalelab.spec.topology import LINKS, contiguous_nodes, link_of

# Bytes per activation value by precision (fp8 runs autocast to bf16 around float8 matmuls).
DTYPE_BYTES = {p.name: p.activation_bytes for p in PRECISIONS.values()}


# ----------------------------------------------------------------------------- model families
# Per family (scalelab.spec.families: one record each): the block's matmul weights, its norms, the
# embeddings, the activations. A user's own module (ModelConfig.module) has no formula: its parameters are counted from the
# module, its FLOPs by torch.utils.flop_counter (scalelab.run.worker), and no activation
# prediction is made.


def _no_formula(cfg: ModelConfig, what: str) -> None:
    if cfg.module:
        raise ValueError(f"{cfg.module}: a user's module has no {what} formula (counted from the module instead)")


def _family(cfg: ModelConfig, what: str) -> Family:
    _no_formula(cfg, what)
    return family(cfg.family)


def block_matmul_params(cfg: ModelConfig) -> int:
    """Weights of one block's matrix products (the family's record): GPT-2: 12 d^2 (qkv 3 d^2, proj
    d^2, MLP 8 d^2); llama: 2 d^2 + 2 d kv (q, o; k, v) + 3 d f (gate, up, down)."""
    return _family(cfg, "parameter").block_matmul_params(cfg)


def block_param_count(cfg: ModelConfig) -> int:
    """Every parameter of one block: its matmul weights, plus GPT-2's biases and two LayerNorms
    (13 d) or the llama family's two RMSNorm weights (2 d, no biases)."""
    record = _family(cfg, "parameter")
    return record.block_matmul_params(cfg) + record.block_other_params(cfg)


def param_count(cfg: ModelConfig) -> int:
    """Exact parameter count of the family's model (scalelab.run.model), as published
    checkpoints count it: the blocks and what the family keeps outside them. GPT-2: token and
    position embeddings, the final LayerNorm, and the head unless tied (a tied weight counts once).
    llama: token embedding, the final RMSNorm and the untied head (no position embedding: RoPE has
    no parameters)."""
    return _family(cfg, "parameter").outside_params(cfg) + cfg.n_layers * block_param_count(cfg)


def matmul_params(cfg: ModelConfig) -> int:
    """Weights that take part in matrix products per token (embedding lookups excluded,
    the output head included whether tied or not)."""
    return cfg.n_layers * block_matmul_params(cfg) + cfg.vocab_size * cfg.d_model


def flops_per_token(cfg: ModelConfig, causal_halved: bool = False) -> float:
    """Training FLOPs per token: 6 N (forward 2N + backward 4N over matmul weights) plus
    the attention term 12 L d T (QK^T and AV, forward and backward; PaLM appendix B).

    The same attention term for both families: with grouped-query attention every query head
    still takes its dot products with T keys (H x D = d), only the key/value projections shrink,
    which N counts. PaLM and nanoGPT count the attention term in full; causal masking makes half
    of it useless work, so ``causal_halved=True`` gives the stricter 6 L d T. scalelab's MFU
    uses the full count (the convention most published MFU figures use, and what
    torch.utils.flop_counter counts for scaled_dot_product_attention with is_causal).
    Norms, activations, RoPE and the softmax are not counted (a few FLOPs per value, not per weight).
    """
    attention = 12 * cfg.n_layers * cfg.d_model * cfg.seq_len
    return 6 * matmul_params(cfg) + (attention / 2 if causal_halved else attention)


def mfu(tokens_per_s: float, flops_per_tok: float, peak_flops_per_device: float, n_devices: int) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the devices' summed dense peak.

    NaN when the peak is NaN (an unknown GPU, or a precision its datasheet has no figure for:
    see scalelab.spec.hardware.peak_flops_for)."""
    if math.isnan(peak_flops_per_device):
        return math.nan
    if peak_flops_per_device <= 0 or n_devices < 1:
        raise ValueError("peak FLOP/s and device count must be positive")
    return tokens_per_s * flops_per_tok / (peak_flops_per_device * n_devices)


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes per rank of model state, split by kind."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def model_state_bytes(n_params: int, zero_stage: int, world_size: int, precision: str,
                      convention: str = "pytorch", replicas: int = 1) -> ModelStateBytes:
    """Model-state bytes per rank (the largest rank of an even split) at rest. ``replicas`` > 1:
    hybrid sharding (stage 3), whose sharded kinds are divided over a shard group of N/R ranks."""
    record = strategy(zero_stage, replicas)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    psi, n = float(n_params), check_replicas(world_size, replicas)
    if convention == "pytorch":
        kinds, shards = (4 * psi, 4 * psi, 8 * psi), record.shards  # fp32 params, fp32 grads, AdamW m and v
    elif convention == "paper":
        # fp32 training: 4 + 4 + 8; mixed precision: fp16 params and grads, K = 12 (fp32 master + m + v)
        kinds = tuple(b * psi for b in precision_record(precision).paper_state_bytes)
        shards = record.shards_paper
    else:
        raise ValueError(f"unknown convention {convention!r}: 'pytorch' or 'paper'")
    return ModelStateBytes(*(b / n if sharded else b for b, sharded in zip(kinds, shards, strict=True)))


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


# ----------------------------------------------------------------------------- collective dtypes
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


def comm_bytes_per_step(n_params: int, zero_stage: int, world_size: int, precision: str,
                        accumulation_steps: int = 1, grad_reduce: str = "fp32", n_trainable: int | None = None,
                        replicas: int = 1, last_block_params: float = 0.0) -> float:
    """Bytes handed to collectives per optimizer step, PyTorch's strategies (the module doc's
    unit: an all-reduce of S bytes counts 2S), what CommCounter measures, exactly:

        grad_psi T r + param_psi(k) P g + 8 [fp16]

    T = trainable parameters (Psi, or LoRA's A and B), P = the parameters a collective moves
    (FSDP2 gathers every parameter, frozen or not: Psi; ZeroRedundancyOptimizer broadcasts its
    trainable shards: T), r and g the bytes per element of the reduce and gather dtypes
    (comm_dtypes; ZeroRedundancyOptimizer's broadcast is fp32), and 8 bytes for the fp16 loss
    scaler's inf/NaN flag. At world size 1 FSDP2 issues no gather or reduce-scatter and stage 0 no
    all-reduce (no DDP): only the scaler's flag remains. In fp32 bytes (r = g = 4) this is 4 x comm_elements_per_step
    (lora_comm_elements_per_step with LoRA). Hybrid sharding (``replicas`` R > 1) adds the
    all-reduce of each rank's gradient shard across replicas, 2 T r / S (S = N/R), and its
    gathers and reduce-scatter run within the shard group (none when S = 1): the sum of
    comm_bytes_by_type."""
    return sum(comm_bytes_by_type(n_params, zero_stage, world_size, precision, accumulation_steps, grad_reduce,
                                  n_trainable, replicas, last_block_params).values())


def _comm_terms(n_params, zero_stage, world_size, precision, accumulation_steps, grad_reduce, n_trainable,
                replicas, last_block_params: float = 0.0) -> list[tuple[str, str, float]]:
    """(collective, group, bytes in the module doc's unit) of one optimizer step; group: ``world``,
    ``shard`` (hybrid sharding's shard group, N/R ranks) or ``replicate`` (its R replicas). ``last_block_params``:
    the elements of the block FSDP2 keeps gathered from its forward to its backward (Strategy.last_block_kept), whose
    second gather per micro-batch a strategy that reshards after forward does not issue (0: a run that re-gathered it)."""
    record, dtypes = strategy(zero_stage, replicas), comm_dtypes(precision, zero_stage, grad_reduce)
    shard = check_replicas(world_size, replicas)
    terms = []
    if precision_record(precision).loss_scaling:  # ShardedGradScaler's flag, over the world
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


def comm_bytes_by_type(n_params: int, zero_stage: int, world_size: int, precision: str,
                       accumulation_steps: int = 1, grad_reduce: str = "fp32", n_trainable: int | None = None,
                       replicas: int = 1, last_block_params: float = 0.0) -> dict[str, float]:
    """comm_bytes_per_step split by collective (scalelab.formulas.links.COLLECTIVES' names: all_reduce,
    reduce_scatter, all_gather, broadcast), the module doc's unit; collectives a run does not
    issue are left out."""
    out: dict[str, float] = {}
    for collective, _, nbytes in _comm_terms(n_params, zero_stage, world_size, precision, accumulation_steps,
                                             grad_reduce, n_trainable, replicas, last_block_params):
        out[collective] = out.get(collective, 0.0) + nbytes
    return {c: b for c, b in out.items() if b}


def comm_bytes_by_group(n_params: float, zero_stage: int, world_size: int, precision: str, replicas: int = 1,
                        grad_reduce: str = "fp32", accumulation_steps: int = 1,
                        last_block_params: float = 0.0) -> dict[str, dict[str, float]]:
    """comm_bytes_per_step by the group each collective runs over (``world``; under hybrid sharding also
    ``shard`` and ``replicate``: comm_groups) and by collective, the module doc's unit; groups and collectives a
    run does not use are left out."""
    out: dict[str, dict[str, float]] = {}
    for collective, group, nbytes in _comm_terms(n_params, zero_stage, world_size, precision, accumulation_steps,
                                                 grad_reduce, None, replicas, last_block_params):
        if nbytes:
            by_type = out.setdefault(group, {})
            by_type[collective] = by_type.get(collective, 0.0) + nbytes
    return out


def sharded_zero1_bytes(n_params: float, precision: str, grad_reduce: str = "compute") -> dict[str, float]:
    """ZeRO-1 as distributed optimizers run it (scalelab.spec.strategies.ZERO1_SHARDED), per optimizer step over the
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


def comm_bytes_by_link(n_params: float, zero_stage: int, world_size: int, precision: str, ranks_per_node: int,
                       replicas: int = 1, grad_reduce: str = "fp32", accumulation_steps: int = 1,
                       n_trainable: int | None = None, rank: int = 0, tensor_parallel: int = 1,
                       last_block_params: float = 0.0) -> dict[str, dict[str, float]]:
    """Bytes one rank (rank 0 by default: the rank a run measures) hands to collectives per
    optimizer step, by link and collective: ``{"intra_node": {collective: bytes}, "inter_node":
    {...}}``, the module doc's unit, summing to comm_bytes_per_step. Ranks sit on nodes as torchrun
    places them (``ranks_per_node`` P consecutive ranks per node); a collective counts wholly on
    the inter-node link when its group spans nodes (scalelab.plan.placement.link_of's convention).

    DDP, ZeRO-1 and ZeRO-3 issue everything over the world: inter-node once N > P. Hybrid
    sharding with its shard group inside a node (S <= P) keeps the gathers and the reduce-scatter
    within it and sends only the all-reduce across replicas, 2 Psi r / S, between nodes.

    Under tensor parallelism (``tensor_parallel`` T > 1: ``world_size`` and ``n_params`` are then the
    data-parallel ranks and one rank's share: scalelab.formulas.predicted_columns.split_of) the world is
    T x world_size ranks and the strategy's collectives run over rank 0's data-parallel group, every
    T-th rank (tensor parallelism's own, over ranks 0..T-1: tensor_parallel_comm, counted apart)."""
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
    if tensor_parallel > 1:
        nodes = contiguous_nodes(world_size * tensor_parallel, ranks_per_node)
        out = {link: {} for link in LINKS}
        data_group = list(range(0, world_size * tensor_parallel, tensor_parallel))
        for collective, _, nbytes in _comm_terms(n_params, zero_stage, world_size, precision, accumulation_steps,
                                                 grad_reduce, n_trainable, 1, last_block_params):
            if nbytes:
                by_type = out[link_of(data_group, nodes)]
                by_type[collective] = by_type.get(collective, 0.0) + nbytes
        return out
    nodes, groups = contiguous_nodes(world_size, ranks_per_node), comm_groups(world_size, replicas, rank)
    out: dict[str, dict[str, float]] = {link: {} for link in LINKS}
    for collective, group, nbytes in _comm_terms(n_params, zero_stage, world_size, precision, accumulation_steps,
                                                 grad_reduce, n_trainable, replicas, last_block_params):
        if nbytes:
            by_type = out[link_of(groups[group], nodes)]
            by_type[collective] = by_type.get(collective, 0.0) + nbytes
    return out


# ----------------------------------------------------------------------------- tensor parallelism
# T ranks split every block's planned linears (scalelab.spec.families: Family.tensor_parallel; Megatron's
# column and row parallel linears, scalelab.run.tensor_parallel); a run of world size N holds N/T data-parallel
# replicas of that split, and its strategy (stage 0, or FSDP2 at 2 and 3) works over those N/T ranks on each
# rank's share of the parameters, as it works over N ranks on the whole model without tensor parallelism.
def tensor_parallel_params(cfg: ModelConfig, n_params: float, degree: int) -> float:
    """Parameters one rank holds under tensor parallelism of ``degree``: 1/T of what the plan splits,
    the rest (embeddings, norms, rowwise biases, the head) whole."""
    if degree == 1:
        return n_params
    split = cfg.n_layers * tensor_parallel_split_params(cfg)
    return n_params - split + split / degree


def last_block_params(cfg: ModelConfig, degree: int = 1) -> float:
    """Parameters of a family model's last block on one rank (1/T of what tensor parallelism splits): what FSDP2 keeps
    gathered from that block's forward to its backward at a stage that reshards after forward."""
    record = family(cfg.family)
    whole = record.block_matmul_params(cfg) + record.block_other_params(cfg)
    split = tensor_parallel_split_params(cfg) if degree > 1 else 0
    return whole - split + split / degree


def data_parallel_size(world_size: int, tensor_parallel: int) -> int:
    """The data-parallel ranks of a run: its world size over its tensor-parallel degree."""
    if tensor_parallel < 1 or world_size % tensor_parallel:
        raise ValueError(f"tensor_parallel {tensor_parallel} does not divide world_size {world_size}")
    return world_size // tensor_parallel


def tensor_parallel_comm(cfg: ModelConfig, micro_batch: int, accumulation_steps: int, degree: int, precision: str,
                         zero_stage: int = 0, device_type: str = "cpu", activation_checkpointing: bool = False,
                         sequence_parallel: bool = False) -> dict[str, tuple[float, int]]:
    """Tensor parallelism's collectives in one optimizer step of one rank, over the T ranks of its tensor-parallel
    group: {collective: (bytes in the module doc's unit, calls)} (an all-reduce of S bytes counts 2 S, an
    all-gather its output, a reduce-scatter its input); V = B T d values per micro-batch and block.

    Without sequence parallelism, four all-reduces per block and micro-batch of V values each: in forward the
    rowwise linears' partial outputs (after attention, after the MLP), at the matmul's width w (4 in fp32; 2 under
    autocast); in backward the gradients of the colwise linears' inputs (the norms' outputs), at the norm output's
    width n: fp32 under autocast over fp32 parameters (a norm of an fp32 residual stream), the compute width with
    FSDP2's 16-bit parameters on a CPU, fp32 on a GPU (CUDA's autocast runs norms in fp32). With checkpointing,
    backward recomputes each block's forward up to the last tensor it needs, the attention projection's all-reduce
    again but not the MLP's (torch's non-reentrant checkpoint stops there; measured): a fifth per block.

    ``sequence_parallel``: each all-reduce becomes its two halves, the same bytes: before each colwise module an
    all-gather of the norm's output (forward, n) and in backward a reduce-scatter of its gradient (n); after each
    rowwise linear a reduce-scatter (forward, w) and in backward an all-gather of its gradient (w). Outside the
    blocks, per micro-batch: the final norm's output all-gathered for the head (forward, n) and the first block's
    input gradient all-gathered for the embeddings (backward, the residual's width r). With checkpointing the
    recomputed forward runs up to the MLP's gathered input (which fc or gate and up keep): two all-gathers (n) and
    attention's reduce-scatter (w) again per block. Per step: the norms' parameter gradients, partial over the
    ranks' tokens, all-reduced in their dtype (fp32; w with FSDP2's 16-bit parameters, before its reduce_dtype
    cast), one call per parameter tensor (measured, FSDP2 and scalelab.run.parallel.reduce_partial_grads alike)."""
    if degree == 1:
        return {}
    L, k = cfg.n_layers, accumulation_steps
    values = k * micro_batch * cfg.seq_len * cfg.d_model  # per collective and block, over the step's micro-batches
    width = DTYPE_BYTES[precision]
    sixteen = _sixteen_bit_params(precision, zero_stage)
    norm_width = width if sixteen and device_type != "cuda" else 4
    ac = activation_checkpointing
    if not sequence_parallel:
        forward = 3 if ac else 2
        return {"all_reduce": (2 * L * values * (forward * width + 2 * norm_width), L * k * (forward + 2))}
    residual_width = width if sixteen else 4
    fam = family(cfg.family)
    norms = 2 * L + 1
    return {"all_gather": (L * values * (2 * norm_width + 2 * width + (2 * norm_width if ac else 0))
                           + values * (norm_width + residual_width), k * (4 * L + 2 + (2 * L if ac else 0))),
            "reduce_scatter": (L * values * (2 * width + 2 * norm_width + (width if ac else 0)), k * (4 * L + (L if ac else 0))),
            "all_reduce": (2 * norms * fam.norm_params(cfg) * (width if sixteen else 4), norms * fam.norm_tensors)}


def tensor_parallel_bytes(*args, **kwargs) -> float:
    """Tensor parallelism's bytes per step, all its collectives (tensor_parallel_comm's arguments)."""
    return float(sum(nbytes for nbytes, _ in tensor_parallel_comm(*args, **kwargs).values()))


def activation_bytes_per_layer(seq_len: int, micro_batch: int, d_model: int, n_heads: int,
                               recompute: str = "none", bytes_per_value: int = 2, tensor_parallel: int = 1,
                               sequence_parallel: bool = False) -> float:
    """Activation memory of one transformer layer (Korthikanti et al. 2022, eq. 1): s b h (34 + 5 a s / h)
    bytes for 16-bit activations; with tensor parallelism of t (eq. 2, no sequence parallelism)
    s b h (10 + 24 / t + 5 a s / (h t)): the layer norms' and dropouts' 10 stay whole on every rank;
    with sequence parallelism (eq. 4) every term / t: s b h (34 + 5 a s / h) / t (full recomputation: the
    layer input's share, 2 s b h / t).

    ``recompute='selective'`` drops the attention-score term (s b h 34): what a layer saves
    when the attention core is recomputed, and also what a fused attention kernel
    (scaled_dot_product_attention's flash/efficient paths) saves, since it never stores the
    a s^2 b scores. ``recompute='full'`` keeps only the layer input (2 s b h). The paper's
    constants assume 2-byte activations (1-byte dropout masks); other widths scale them by
    bytes_per_value / 2.
    """
    s, b, h, a, t = seq_len, micro_batch, d_model, n_heads, tensor_parallel
    scale = bytes_per_value / 2
    whole = 10 / t if sequence_parallel else 10  # the norms' and dropouts' terms: split over the tokens with SP
    if recompute == "none":
        return s * b * h * (whole + 24 / t + 5 * a * s / (h * t)) * scale
    if recompute == "selective":
        return s * b * h * (whole + 24 / t) * scale
    if recompute == "full":
        return 2 * s * b * h * scale / (t if sequence_parallel else 1)
    raise ValueError(f"recompute must be none, selective or full, got {recompute!r}")


def _sixteen_bit_params(precision: str, zero_stage: int | None) -> bool:
    """Whether a run computes with 16-bit parameters: fp16 and bf16 under FSDP2's MixedPrecisionPolicy
    (stages 2 and 3: comm_dtypes), whose gathered parameters are already in the compute dtype, so the
    embedding, the residual stream and the LayerNorms run in it and autocast copies no weight."""
    return zero_stage is not None and comm_dtypes(precision, zero_stage).gather_bytes < 4


def activation_case(precision: str, micro_batch: int = 1, activation_checkpointing: bool = False,
                    zero_stage: int | None = None, device_type: str = "cpu", compiled: bool = False,
                    tensor_parallel: int = 1, sequence_parallel: bool = False) -> ActivationCase:
    """What decides a block's saved tensors besides its shape, for the family records
    (scalelab.spec.families): the compute width, autocast over fp32 parameters or 16-bit parameters,
    the levers and the device."""
    sixteen = _sixteen_bit_params(precision, zero_stage)
    return ActivationCase(micro_batch=micro_batch, width=DTYPE_BYTES[precision], amp=precision in AUTOCAST and not sixteen,
                          sixteen_bit_params=sixteen, checkpointing=activation_checkpointing, gpu=device_type == "cuda",
                          compiled=compiled, tensor_parallel=tensor_parallel,
                          sequence_parallel=sequence_parallel and tensor_parallel > 1)


def block_activation_bytes(cfg: ModelConfig, micro_batch: int, precision: str, activation_checkpointing: bool,
                           convention: str = "model", zero_stage: int | None = None, device_type: str = "cpu",
                           compiled: bool = False, tensor_parallel: int = 1, sequence_parallel: bool = False) -> float:
    """Predicted activations all transformer blocks keep for backward, one micro-batch.

    ``convention='paper'``: Korthikanti et al. as published at the run's width: s b h (34 +
    5 a s / h) per layer, or 2 s b h with full recomputation.
    ``convention='model'``: the same terms for this model. scaled_dot_product_attention never
    stores the a s^2 b scores and the model has no dropout (no masks), which leaves 16 s b h
    values per layer (32 s b h bytes at 2 bytes), plus the LayerNorms' mean and rstd (4 s b values at the
    LayerNorm input's width; fp32 on a GPU) and the attention's fp32 logsumexp (a s b values). Under autocast (fp16, bf16, fp8) the residual
    stream and the LayerNorm inputs stay fp32 (2 s b h values at 4 bytes instead of 2) and
    the 16-bit copies of the 12 d^2 block weights are kept too. With per-block checkpointing
    only each block's input stays: s b h values at the residual's width. fp16 and bf16 at stages 2
    and 3 (``zero_stage``: 16-bit parameters under MixedPrecisionPolicy) keep neither: the residual
    stream is 16-bit and there are no weight copies, 16 s b h values at 2 bytes (exact on the CPU,
    measured with saved-tensor hooks).
    Each family's terms are its record's (scalelab.spec.families: the llama family's kernels save
    differently on a GPU, ``device_type``; the GPT-2 terms are the same on both but for the compiled
    LayerNorm statistics and flash attention's RNG state).

    ``tensor_parallel`` T: a rank of T that split the blocks' linears (ActivationCase.tensor_parallel:
    Korthikanti et al.'s split without sequence parallelism, their (10 + 24/T) s b h bytes per layer at 2 bytes
    in the paper's terms; here each family's split and whole terms, measured).

    ``compiled=True``: the blocks under torch.compile (the compile lever: inductor, one graph per
    block), which keep what AOTAutograd's min-cut partitioner (``min_cut_rematerialization_partition``,
    behind inductor's joint-graph passes) saves from the block's forward graph, not what eager
    autograd's ops save. Read from the partitioner's saved tensors (torch 2.13, CPU; the partitioner
    is device-independent; tests/*/test_compiled_memory.py), per layer:

    * the same 16 s b h values (x, the LayerNorm outputs at w, q, k, v, the attention output, the
      attention projection's output, the MLP's fc output and GELU output): at w in fp32 and with
      16-bit parameters, but under autocast with fp32 parameters the block input x stays fp32 (4
      bytes) and the rest is at w: the partitioner keeps the attention projection's 16-bit output and
      recomputes the fp32 residual x + attn (the second LayerNorm's input, 4 bytes in eager) in
      backward, so s b h (4 - w) bytes where eager keeps 2 s b h (4 - w); the w-byte copies of the
      12 d^2 weights stay (2 x 12 d^2 bytes);
    * counted here, unlike the eager formula: the LayerNorms' mean and rstd (4 x s b values at the
      residual's width; on a GPU always fp32) and the attention kernel's fp32 logsumexp (4 b H s), and
      on a GPU flash attention's philox seed and offset (16 bytes), which makes the compiled formula
      exact against the partitioner (the CPU's; an H100's, torch 2.11, in tests/*/test_compiled_memory.py);
    * per-block checkpointing (traced into the graph) keeps the block input only, as in eager.

    fp8 under torch.compile is predicted as bf16 under torch.compile, an upper bound: the
    partitioner recomputes the Float8Linear inputs' float8 casts and keeps no weight copies (on the
    CPU: 4 + 9w bytes per s b h value, the fc output and attention terms); an H200 measured more
    than that and less than the bound, so it is not modelled (activation_bound).
    """
    _no_formula(cfg, "activation")
    s, b, h, L = cfg.seq_len, micro_batch, cfg.d_model, cfg.n_layers
    width = DTYPE_BYTES[precision]
    if convention == "paper":
        recompute = "full" if activation_checkpointing else "none"
        return L * activation_bytes_per_layer(s, b, h, cfg.n_heads, recompute, width, tensor_parallel, sequence_parallel)
    if convention != "model":
        raise ValueError(f"unknown convention {convention!r}: 'model' or 'paper'")
    case = activation_case(precision, micro_batch, activation_checkpointing, zero_stage, device_type, compiled,
                           tensor_parallel, sequence_parallel)
    return family(cfg.family).block_activation_bytes(cfg, case)


@dataclass(frozen=True)
class LossPathBytes:
    """What the output head and the fp32 cross-entropy hold for one micro-batch, in bytes
    (scalelab.run.model: ``head(ln_f(x))`` then ``cross_entropy_loss``). Each term is
    B T V values; w is the compute width (4 in fp32, 2 under fp16/bf16/fp8 autocast, which
    leaves the head in 16 bits).

    Forward: the head writes the logits (w B T V); ``.float()`` copies them to fp32 under
    autocast (4 B T V; in fp32 it is the same tensor, 0); log_softmax writes its fp32 output
    (4 B T V), which it saves for backward. The logits and their copy are freed once the loss
    is computed (the forward returns the loss alone). Backward: nll_loss's backward writes the
    gradient of the log-softmax output (4 B T V), and log_softmax's backward the gradient of
    its input (4 B T V) while its saved output is still alive.

    ``compiled`` (the compile lever compiles ``cross_entropy_loss``): inductor fuses the fp32 cast,
    log_softmax and nll_loss into reductions over the logits, and the partitioner saves the logits
    themselves (w B T V: the loss's input) with each row's max and log-sum-exp (8 B T, counted by
    outside_block_activation_bytes with the logits); neither the fp32 copy nor the log-softmax
    output is ever written (0 here). Its backward is one fused kernel that writes the gradient of
    the logits at w (w B T V, ``gradients``), alive beside the saved logits: the transient is
    w B T V, where eager's is 8 B T V. (Read from inductor's generated code on the CPU: the only
    B T V buffer of the compiled backward is its w-byte output.)
    """

    logits: float
    logits_fp32: float
    log_softmax: float
    gradients: float
    compiled: bool = False
    """The compiled loss: the logits are kept (counted outside the blocks), no transient in forward."""

    @property
    def forward_transient(self) -> float:
        """Alive beside the saved log-softmax output while it is computed: the logits and their fp32
        copy (compiled: nothing beyond the saved logits)."""
        return 0.0 if self.compiled else self.logits + self.logits_fp32

    @property
    def backward_transient(self) -> float:
        """Alive beside the saved log-softmax output in its backward: the two fp32 gradients
        (compiled: beside the saved logits, their w-byte gradient)."""
        return self.gradients

    @property
    def transient(self) -> float:
        """The larger of the two moments' transients: 8 B T V bytes for every precision here
        (forward: 4 in fp32, 2 + 4 = 6 under autocast; backward: 4 + 4); compiled, w B T V."""
        return max(self.forward_transient, self.backward_transient)


def loss_path_bytes(cfg: ModelConfig, micro_batch: int, precision: str, compiled: bool = False) -> LossPathBytes:
    """The logits, their fp32 copy, the log-softmax output and its gradients (see LossPathBytes)."""
    values = float(micro_batch * cfg.seq_len * cfg.vocab_size)
    width = DTYPE_BYTES[precision]
    if compiled:
        return LossPathBytes(logits=width * values, logits_fp32=0.0, log_softmax=0.0, gradients=width * values,
                             compiled=True)
    return LossPathBytes(logits=width * values, logits_fp32=4 * values if width != 4 else 0.0,
                         log_softmax=4 * values, gradients=2 * 4 * values)


def outside_block_activation_bytes(cfg: ModelConfig, micro_batch: int, precision: str,
                                   accumulation_steps: int = 1, zero_stage: int | None = None,
                                   device_type: str = "cpu", compiled: bool = False, tensor_parallel: int = 1,
                                   sequence_parallel: bool = False) -> float:
    """Predicted bytes kept for backward outside the transformer blocks by one micro-batch's
    forward, plus what that forward returns: what SavedActivationMeter measures as
    ``outside_blocks``. B = micro_batch, w = the compute width (LossPathBytes).

    * log_softmax's fp32 output: 4 B T V (the largest term: V is the vocabulary);
    * the final LayerNorm's input, the fp32 residual stream (4 B T C), and its mean and
      reciprocal standard deviation (2 x 4 B T);
    * the head's input, the LayerNorm output at the compute width (w B T C; under autocast
      the 16-bit copy) and, under autocast, the 16-bit copy of the head weight (2 V C);
    * integer ids (int64): the rank's token batch, of which the embedding keeps a view
      (8 x accumulation_steps B (T + 1)), the positions (8 T), and the flattened targets,
      a copy when B > 1 (they are a strided view of the token windows; 8 B T);
    * nll_loss's total weight and the returned loss: two fp32 scalars.

    Not counted: the logits and their fp32 copy, which nothing keeps (LossPathBytes), and
    parameters (the fp32 head weight). fp16 and bf16 at stages 2 and 3 (``zero_stage``; 16-bit
    parameters, block_activation_bytes) keep a 16-bit residual stream (w B T C) and no head weight copy.

    ``compiled=True``: the loss under torch.compile (the compile lever; the final norm, the head and
    the embeddings stay eager, so their terms stand). Its partitioner saves the logits (w B T V) in
    place of the fp32 log-softmax output (4 B T V), each row's max and log-sum-exp (2 x 4 B T), and
    the targets as handed in (a view of the token batch: no flattened copy).

    ``sequence_parallel`` over ``tensor_parallel`` T ranks: the final norm keeps its share of the tokens
    (its input and statistics / T); the head's input, all-gathered, is whole."""
    _no_formula(cfg, "activation")
    b, t, v = micro_batch, cfg.seq_len, cfg.vocab_size
    width = DTYPE_BYTES[precision]
    # the loss's saved tensors: eager, log_softmax's fp32 output and the flattened targets (a copy when
    # B > 1); compiled, the logits at w with each row's max and log-sum-exp, and the targets as given
    loss = (width * b * t * v + 2 * 4 * b * t) if compiled else (4 * b * t * v + (8 * b * t if b > 1 else 0))
    ids = 8 * accumulation_steps * b * (t + 1)
    # the family's final norm, the head's input and the positions (scalelab.spec.families)
    case = activation_case(precision, micro_batch, zero_stage=zero_stage, device_type=device_type, compiled=compiled,
                           tensor_parallel=tensor_parallel, sequence_parallel=sequence_parallel)
    return float(loss + family(cfg.family).outside_block_bytes(cfg, case) + ids + 2 * 4)


def recompute_flops_per_token(cfg: ModelConfig) -> float:
    """Extra FLOPs per token of per-block activation checkpointing: one more forward of every
    block (2 x the block's matmul weights per layer, 12 L d^2 for GPT-2; 4 L d T for attention),
    i.e. about a third more block compute. MFU ignores it (model FLOPs); HFU counts it (hardware FLOPs)."""
    return 2 * cfg.n_layers * block_matmul_params(cfg) + 4 * cfg.n_layers * cfg.d_model * cfg.seq_len


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


def gpu_peak_flops(gpu: str, precision: str) -> float:
    """Dense datasheet peak of a GPU named on the command line (see hardware.gpu_by_name), for a
    precision or a datasheet column (tf32) of scalelab.spec.precisions."""
    product = hardware.gpu_by_name(gpu)
    key = peak_key(precision)
    peak = product.peak(key)
    if peak is None:
        raise ValueError(f"{product.name} has no dense {key!r} figure; known: {', '.join(product.peaks)}")
    return peak


def training_days(total_flops: float, n_gpus: int, gpu: str, precision: str, mfu_fraction: float) -> float:
    """Wall-clock days to do total_flops on n_gpus of a type at a given MFU."""
    if not 0 < mfu_fraction <= 1:
        raise ValueError(f"MFU must be in (0, 1], got {mfu_fraction}")
    if n_gpus < 1:
        raise ValueError(f"number of GPUs must be >= 1, got {n_gpus}")
    return total_flops / (n_gpus * gpu_peak_flops(gpu, precision) * mfu_fraction) / 86400


def bytes_per_param_per_rank(zero_stage: int, world_size: int, precision: str, convention: str) -> float:
    """Model-state bytes per rank per parameter: the slope of model_state_bytes in Psi."""
    return model_state_bytes(1, zero_stage, world_size, precision, convention).total


def largest_model(device_bytes: float, zero_stage: int, world_size: int, precision: str, convention: str) -> float:
    """Most parameters whose model state fits device_bytes per rank (activations excluded)."""
    if device_bytes <= 0:
        raise ValueError(f"device memory must be positive, got {device_bytes}")
    return device_bytes / bytes_per_param_per_rank(zero_stage, world_size, precision, convention)


MODELLED = "model"
"""PeakMemory.bound of a prediction that models what the step keeps (activation_bound)."""
UPPER_BOUND = "upper bound"
"""How PeakMemory.bound starts where the prediction may exceed what the step holds."""
LOWER_BOUND = "lower bound"
"""How PeakMemory.bound starts where the prediction leaves something out (a user's module's activations)."""


def activation_bound(cfg: ModelConfig, precision: str, compiled: bool = False, activation_checkpointing: bool = False,
                     device_type: str = "cuda", tensor_parallel: int = 1) -> str:
    """What kind of figure peak_memory's activations are for a run: ``"model"`` (MODELLED) where
    the formulas model what the step keeps (checked against saved-tensor hooks, or the compiled
    graph's partitioner), else ``"upper bound: <why>"`` or ``"lower bound: <why>"``:

    * ``upper bound``: fp8 without per-block checkpointing, eager or compiled, is predicted as bf16
      (the same run without Float8Linear), and keeps less: Float8Linear saves no 16-bit weight copies
      (eager, measured on the CPU), and compiled the partitioner recomputes its inputs' float8 casts
      (tests/*/test_compiled_memory.py; on an H200: the bf16 compiled figure is 11-12% above
      the fp8 compiled runs' peaks); the llama family's fp32 grouped-query attention compiled on a
      GPU (SDPA's math path traced into the graph: the eager figure);
    * ``lower bound``: a user's module (ModelConfig.module), whose activations are not predicted (0:
      model state and parameter gathers only).

    A predicted total above the device memory means a certain OOM only for a model or a lower
    bound (predicts_oom)."""
    if cfg.module:
        return f"{LOWER_BOUND}: a user's module has no activation formula (model state and parameter gathers only)"
    if activation_checkpointing:  # each block keeps its input only, whatever it computes in
        return MODELLED
    if precision_record(precision).linears:
        return (f"{UPPER_BOUND}: {precision} is predicted as {precision_record(precision).matmul_precision}"
                f"{' under torch.compile' if compiled else ''}; its float8 linears keep less "
                f"({'their float8 casts are recomputed in backward, ' if compiled else ''}no 16-bit weight copies)")
    if compiled and tensor_parallel > 1:
        return (f"{UPPER_BOUND}: compiled blocks under tensor parallelism are predicted as unsplit (their partition is "
                "not modelled; a rank keeps less)")
    if compiled and family(cfg.family).compiled_unmodelled(cfg, activation_case(precision, device_type=device_type,
                                                                                  compiled=True)):
        return (f"{UPPER_BOUND}: fp32 grouped-query attention on a GPU runs SDPA's math path, whose compiled "
                "partition is not modelled (the eager figure)")
    return MODELLED


@dataclass(frozen=True)
class PeakMemory:
    """Predicted peak memory of one rank within a training step, in bytes."""

    model_state: float
    """Model state at the start of backward: parameters + optimizer state (PyTorch convention), +
    gradients where they exist then (grads_at_peak: DDP's buckets, or gradient accumulation)."""
    transient_params: float
    """Parameters materialised unsharded during the step (FSDP2 all-gather buffers)."""
    activations: float
    """Activations of one micro-batch at the step's peak: the blocks' (Korthikanti et al.), what
    the step keeps outside them, and the loss path's largest transient (the logits in forward,
    or the fp32 gradients of the log-softmax in backward)."""
    bound: str = MODELLED
    """What kind of figure ``activations`` (and so ``total``) is: ``"model"``, or ``"upper bound: <why>"``
    / ``"lower bound: <why>"`` (activation_bound)."""
    at_rest: float = 0.0
    """Model state at rest, gradients included: what the optimizer step holds, after backward made
    every gradient."""

    @property
    def start_of_backward(self) -> float:
        """The model state then, the gathered parameters and the activations."""
        return self.model_state + self.transient_params + self.activations

    @property
    def at_optimizer_step(self) -> bool:
        """Whether the optimizer step is the peak: with few activations (checkpointed, a small
        micro-batch) the gradients made in backward outweigh them."""
        return self.at_rest > self.start_of_backward

    @property
    def total(self) -> float:
        """The larger of the two peaks of a step: the start of backward and the optimizer step (the
        model state at rest)."""
        return self.at_rest if self.at_optimizer_step else self.start_of_backward

    @property
    def exact(self) -> bool:
        """The prediction models the step (no bound)."""
        return self.bound == MODELLED

    @property
    def upper_bound(self) -> bool:
        """The step may hold less than predicted: a total above the device memory is no proof of an OOM."""
        return self.bound.startswith(UPPER_BOUND)


def predicts_oom(peak: PeakMemory, limit_bytes: float | None) -> bool:
    """Whether a prediction shows the step cannot fit ``limit_bytes`` (None: no limit known): its
    total exceeds the limit and is a model or a lower bound, never an upper bound alone."""
    return limit_bytes is not None and peak.total > limit_bytes and not peak.upper_bound


def grads_at_peak(zero_stage: int, world_size: int, accumulation_steps: int = 1, replicas: int = 1,
                  tensor_parallel: int = 1) -> bool:
    """Whether gradients exist at a step's peak, the start of the (last micro-batch's) backward:
    only where DDP's buckets hold them between steps, or where an earlier micro-batch of the step
    made them. Otherwise the optimizer's zero_grad(set_to_none=True) freed them (an H100, one rank
    without DDP: bf16 and fp32, eager and compiled, within 0.3% once counted so; with them, 4 bytes
    per parameter over)."""
    return strategy(zero_stage, replicas).ddp_wraps(world_size, tensor_parallel) or accumulation_steps > 1


def peak_memory(cfg: ModelConfig, n_params: int, zero_stage: int, world_size: int, precision: str,
                micro_batch: int, activation_checkpointing: bool = False, cpu_offload: bool = False,
                accumulation_steps: int = 1, block_params: int | None = None, device_type: str = "cuda",
                replicas: int = 1, compiled: bool = False, tensor_parallel: int = 1,
                sequence_parallel: bool = False) -> PeakMemory:
    """Predicted in-step peak per rank on the device: model state at rest (less the gradients where
    none exist at the start of backward: no DDP buckets and one micro-batch), plus what a step
    materialises; at least the model state at rest with its gradients (the optimizer step:
    PeakMemory.total). FSDP2 with accumulation keeps unsharded gradients between micro-batches
    (set_requires_gradient_sync(False)), which only their sharded 4 bytes per parameter count for:
    not modelled, an underestimate there.

    Stage 2 keeps every group's unsharded parameters from forward to backward: +b Psi, b = 4 bytes
    (fp32), 2 for fp16 and bf16, which FSDP2's MixedPrecisionPolicy gathers in their compute dtype
    (comm_dtypes); FSDP2 gathers into a buffer of its own, the whole group at any world size (an
    H200 at world size 1). Stage 3 gathers one block at a time (two in flight with
    prefetch), beside the root group (the parameters of no block, whose backward runs first): +b
    (2 blocks + the rest). Activations, at the start of backward, when every block's are still
    kept: block_activation_bytes (Korthikanti et al.), outside_block_activation_bytes (the
    fp32 log-softmax output, the final LayerNorm's and the head's inputs, ids) and the loss
    path's transient (LossPathBytes: 8 B T V, the two fp32 gradients at log_softmax's
    backward). Before the model returned the loss alone, the step also held the logits through backward (w B T V
    more) and the prediction counted 2 x 4 B T V in all. With cpu_offload (stage 3) the
    model state lives in host memory and only the gathered blocks occupy the device.
    block_params: one block's parameters where no formula gives them (a user's module, counted);
    such a model's activations are not predicted (0 here: model state and gathers only).
    device_type: where the step runs (a GPU by default: this is planning for one; the llama
    family's kernels save differently on a CPU). replicas > 1: hybrid sharding, whose shards and
    gathers are over a shard group of N/R ranks. compiled: the compile lever (blocks and loss under
    torch.compile): the blocks' and the loss's compiled models (block_activation_bytes,
    outside_block_activation_bytes, LossPathBytes: the loss's transient drops from 8 B T V to w B T V).
    ``bound`` says whether the figure models the step or bounds it (activation_bound).
    """
    at_rest = model_state_bytes(n_params, zero_stage, world_size, precision, "pytorch", replicas)
    if block_params is None:  # a block of the family's formula; under tensor parallelism this rank's share of it
        block_params = block_param_count(cfg)
        if tensor_parallel > 1:
            block_params -= tensor_parallel_split_params(cfg) * (1 - 1 / tensor_parallel)
    check_replicas(world_size, replicas)  # a replica count the world size cannot take raises here
    state = (at_rest.total if grads_at_peak(zero_stage, world_size, accumulation_steps, replicas, tensor_parallel)
             else at_rest.total - at_rest.grads)
    gathered = comm_dtypes(precision, zero_stage).gather_bytes  # 2 for fp16/bf16 under FSDP2's MixedPrecisionPolicy
    outside_params = max(0.0, n_params - cfg.n_layers * block_params)  # embeddings, final norm, head: FSDP2's root group
    transient = strategy(zero_stage, replicas).transient_psi(n_params, block_params, outside_params, gathered)
    held = at_rest.total
    if cpu_offload:  # copied to the device, then gathered
        state, held, transient = 0.0, 0.0, gathered * (2 * block_params + outside_params)
    acts = 0.0 if cfg.module else (  # a user's module: no activation formula (model state and gathers only)
        block_activation_bytes(cfg, micro_batch, precision, activation_checkpointing, zero_stage=zero_stage,
                               device_type=device_type, compiled=compiled, tensor_parallel=tensor_parallel,
                               sequence_parallel=sequence_parallel)
        + outside_block_activation_bytes(cfg, micro_batch, precision, accumulation_steps, zero_stage, device_type,
                                         compiled, tensor_parallel, sequence_parallel)
        + loss_path_bytes(cfg, micro_batch, precision, compiled).transient)
    return PeakMemory(state, transient, acts,
                      activation_bound(cfg, precision, compiled, activation_checkpointing, device_type, tensor_parallel),
                      at_rest=held)


# ----------------------------------------------------------------------------- LoRA (the last rung)
# LoRA (Hu et al. 2021) freezes the weights W0 and trains a low-rank update B A on chosen
# linear layers, each family's (scalelab.spec.families: GPT-2 every block's attention qkv and proj
# and MLP fc and proj, the common choice; llama the four attention and three SwiGLU projections).
# A linear d_in -> d_out gains r (d_in + d_out) trainable parameters.
def lora_targets(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """The adapted linears of a block by name, with their (d_in, d_out)."""
    return _family(cfg, "LoRA").lora_targets(cfg)


def lora_trainable_params(cfg: ModelConfig, rank: int) -> int:
    """Trainable LoRA parameters: rank x (d_in + d_out) per adapted linear, every block."""
    per_block = sum(d_in + d_out for d_in, d_out in lora_targets(cfg).values())
    return cfg.n_layers * rank * per_block


def lora_model_state_bytes(n_frozen: int, n_trainable: int, zero_stage: int, world_size: int, precision: str,
                           convention: str = "pytorch", replicas: int = 1) -> ModelStateBytes:
    """Model state per rank at rest with LoRA: the frozen weights (fp32 in PyTorch's AMP; 2
    bytes in the paper's mixed precision), sharded as the strategy shards parameters, and no
    gradient or optimizer state for them; the trainable A and B carry the full 16 bytes per
    parameter (PyTorch: fp32 weight, grad, AdamW m and v)."""
    frozen_bytes = 4 if convention == "pytorch" else precision_record(precision).paper_state_bytes[0]
    shards = strategy(zero_stage).shards if convention == "pytorch" else strategy(zero_stage).shards_paper
    frozen = frozen_bytes * float(n_frozen) / (check_replicas(world_size, replicas) if shards[0] else 1)
    trainable = model_state_bytes(n_trainable, zero_stage, world_size, precision, convention, replicas)
    return ModelStateBytes(frozen + trainable.params, trainable.grads, trainable.optimizer)


def lora_comm_elements_per_step(n_frozen: int, n_trainable: int, zero_stage: int, world_size: int,
                                accumulation_steps: int = 1, convention: str = "pytorch", replicas: int = 1) -> float:
    """Elements handed to collectives per step with LoRA (module doc's unit).

    Only the trainable parameters have gradients, so every gradient collective (all-reduce,
    reduce-scatter) and every update of sharded optimizer state (ZeroRedundancyOptimizer's
    broadcast) moves T = n_trainable elements where full training moves Psi. A strategy that
    shards the parameters themselves (FSDP2, the paper's stage 3) all-gathers every
    parameter, frozen or not, before using it: those gathers stay at Psi_all = n_frozen +
    n_trainable. So, of the strategy's comm_psi(k) Psi, one Psi (the gradient reduce-scatter)
    becomes T and the rest (the gathers) Psi_all:

    * PyTorch: stage 0: 2 T; 1: 3 T; 2: k Psi_all + T; 3: 2k Psi_all + T (0 at world size 1).
    * paper: stages 0-2: 2 T; stage 3: 2 Psi_all + T.
    * hybrid sharding (``replicas`` R > 1) adds its all-reduce across replicas, 2 T / S.
    """
    record = strategy(zero_stage, replicas)
    shard = check_replicas(world_size, replicas)
    n_all, t = float(n_frozen + n_trainable), float(n_trainable)
    across = record.replicate_psi * t / shard if replicas > 1 else 0.0
    if convention == "paper":
        total, gathers_params = record.comm_psi_paper, record.shards_paper[0]
    elif convention == "pytorch":
        if record.silent_at_world_size_1 and shard == 1:
            return across
        total, gathers_params = record.comm_psi(accumulation_steps), record.shards[0]
    else:
        raise ValueError(f"unknown convention {convention!r}: 'pytorch' or 'paper'")
    return ((total - 1) * n_all + t if gathers_params else total * t) + across
