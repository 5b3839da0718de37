"""Tensor parallelism's formulas: the parameters one rank holds and the collectives its tensor-parallel
group issues per step.

T ranks split every block's planned linears (scalelab.registries.families: Family.tensor_parallel; Megatron's
column and row parallel linears, scalelab.run.tensor_parallel); a run of world size N holds N/T data-parallel
replicas of that split, and its strategy (stage 0, or FSDP2 at 2 and 3) works over those N/T ranks on each
rank's share of the parameters, as it works over N ranks on the whole model without tensor parallelism.
"""
from __future__ import annotations

from scalelab.config import ModelConfig
from scalelab.formulas.activation_memory import DTYPE_BYTES
from scalelab.formulas.communication import sixteen_bit_params
from scalelab.formulas.rank_step import RankStep
from scalelab.registries.families import family, tensor_parallel_split_params


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


def tensor_parallel_comm(cfg: ModelConfig, step: RankStep) -> dict[str, tuple[float, int]]:
    """Tensor parallelism's collectives in one optimizer step of a rank running ``step``, over the T ranks (its
    ``tensor_parallel``) of its tensor-parallel group: {collective: (bytes in scalelab.formulas.communication's unit,
    calls)} (an all-reduce of S bytes counts 2 S, an all-gather its output, a reduce-scatter its input); V = B T d
    values per micro-batch and block, over the step's accumulation_steps micro-batches of micro_batch B.

    Without sequence parallelism, four all-reduces per block and micro-batch of V values each: in forward the
    rowwise linears' partial outputs (after attention, after the MLP), at the matmul's width w (4 in fp32; 2 under
    autocast); in backward the gradients of the colwise linears' inputs (the norms' outputs), at the norm output's
    width n: fp32 under autocast over fp32 parameters (a norm of an fp32 residual stream), the compute width with
    FSDP2's 16-bit parameters on a CPU, fp32 on a GPU (CUDA's autocast runs norms in fp32). With checkpointing,
    backward recomputes each block's forward up to the last tensor it needs, the attention projection's all-reduce
    again but not the MLP's (torch's non-reentrant checkpoint stops there; measured): a fifth per block.

    The step's ``sequence_parallel``: each all-reduce becomes its two halves, the same bytes: before each colwise
    module an all-gather of the norm's output (forward, n) and in backward a reduce-scatter of its gradient (n); after
    each rowwise linear a reduce-scatter (forward, w) and in backward an all-gather of its gradient (w). Outside the
    blocks, per micro-batch: the final norm's output all-gathered for the head (forward, n) and the first block's
    input gradient all-gathered for the embeddings (backward, the residual's width r). With checkpointing the
    recomputed forward runs up to the MLP's gathered input (which fc or gate and up keep): two all-gathers (n) and
    attention's reduce-scatter (w) again per block. Per step: the norms' parameter gradients, partial over the
    ranks' tokens, all-reduced in their dtype (fp32; w with FSDP2's 16-bit parameters, before its reduce_dtype
    cast), one call per parameter tensor (measured, FSDP2 and scalelab.run.parallel.reduce_partial_grads alike)."""
    if step.tensor_parallel == 1:
        return {}
    L, k = cfg.n_layers, step.accumulation_steps
    values = k * step.micro_batch * cfg.seq_len * cfg.d_model  # per collective and block, over the step's micro-batches
    width = DTYPE_BYTES[step.precision]
    sixteen = sixteen_bit_params(step.precision, step.zero_stage)
    norm_width = width if sixteen and step.device_type != "cuda" else 4
    ac = step.activation_checkpointing
    if not step.sequence_parallel:
        forward = 3 if ac else 2
        return {"all_reduce": (2 * L * values * (forward * width + 2 * norm_width), L * k * (forward + 2))}
    residual_width = width if sixteen else 4
    fam = family(cfg.family)
    norms = 2 * L + 1
    return {"all_gather": (L * values * (2 * norm_width + 2 * width + (2 * norm_width if ac else 0))
                           + values * (norm_width + residual_width), k * (4 * L + 2 + (2 * L if ac else 0))),
            "reduce_scatter": (L * values * (2 * width + 2 * norm_width + (width if ac else 0)), k * (4 * L + (L if ac else 0))),
            "all_reduce": (2 * norms * fam.norm_params(cfg) * (width if sixteen else 4), norms * fam.norm_tensors)}


def tensor_parallel_bytes(cfg: ModelConfig, step: RankStep) -> float:
    """Tensor parallelism's bytes per step of a rank running ``step``, all its collectives (tensor_parallel_comm)."""
    return float(sum(nbytes for nbytes, _ in tensor_parallel_comm(cfg, step).values()))
