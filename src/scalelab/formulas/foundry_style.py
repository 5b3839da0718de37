"""GPU memory of an FSDP step as llm-foundry runs MPT in its training benchmarks: a named activation recipe beside
scalelab's own (scalelab.formulas.peak_memory, which scalelab's runs measure) and the megatron trainer's
(scalelab.formulas.megatron_style). It prices llm-foundry's published runs (scalelab.forecast.published_memory).

The recipe, as llm-foundry's benchmark sweep set it for its A100 tables (scripts/train/benchmarking/
submit_benchmarks.py and the model yamls it reads, scripts/train/yamls/mosaic_gpt/*.yaml, llmfoundry/models/):
* FSDP FULL_SHARD with ``mixed_precision: PURE``: each block is gathered, computed and reduced in bf16; the sharded
  parameters, their gradients and Adam's two moments stay fp32 (16 bytes per parameter over the ranks; the gradients
  only where an earlier micro-batch of the step made them); ``limit_all_gathers: true``: at most two blocks gathered
  ahead, beside the root unit (the embeddings and the final norm), which stays gathered from forward to backward;
* autocast to bf16 over bf16 parameters: the residual stream is bf16;
* attention ``attn_impl: triton`` (flash attention in Triton): no a s^2 scores; q, k, v (views of the fused qkv
  projection) and the output are kept, with an fp32 log-sum-exp per head and token (rows padded to 128);
* ``low_precision_layernorm``: LayerNorm in bf16 with autocast off, keeping its bf16 input and fp32 mean and rstd (no
  fp32 copy of the input, which CUDA autocast's layer_norm keeps in scalelab's own runs);
* no dropout (``resid_pdrop``, ``emb_pdrop``, ``attn_pdrop`` 0): no masks;
* the loss ``fused_crossentropy`` (flash-attn's CrossEntropyLoss, a fused kernel over the bf16 logits): it keeps the
  bf16 logits (2 B T V) with an fp32 log-sum-exp per token, and its backward writes a bf16 gradient of the logits
  (2 B T V, not in place) beside them: the step's peak. scalelab's own eager fp32 cross-entropy keeps 4 B T V and
  holds 8 B T V beside it there (activation_memory.LossPathBytes);
* activation checkpointing off (the rows checked); with it each block keeps its input alone, and backward
  recomputes one block's set at a time.
So a block keeps 16 s b h bf16 values (its input, both LayerNorm outputs, q, k, v, the attention output, the
residual after attention, the MLP's 4h input and GELU output), 32 s b h bytes, plus the LayerNorms' statistics and the
log-sum-exp. Not counted: the CUDA context, NCCL's buffers and the allocator's fragmentation (a plan's reserve).
"""
from __future__ import annotations

import math

from scalelab.config import ModelConfig
from scalelab.formulas.flops import block_param_count
from scalelab.formulas.peak_memory import MODELLED, PeakMemory
from scalelab.formulas.rank_step import RankStep

RECIPE = ("llm-foundry's MPT benchmarks: FSDP FULL_SHARD, mixed precision PURE (bf16 gathers and reductions, fp32 "
          "shards and Adam), limit_all_gathers (two blocks gathered ahead), Triton flash attention, low-precision "
          "LayerNorm, no dropout, the fused cross-entropy over bf16 logits (2 B T V kept, 2 B T V gradient)")
"""The recipe in a line, for the tables that use it."""
VALUES_PER_TOKEN_PER_LAYER = 16
"""bf16 values of width d_model a block keeps per token (the module doc's list; the MLP's two terms are 4 each)."""
ROW_PADDING = 128
"""Triton flash attention's log-sum-exp rows are padded to a multiple of this."""


def _gpt_like(cfg: ModelConfig) -> None:
    if cfg.family != "gpt2" or cfg.module:
        raise ValueError(f"the llm-foundry recipe prices MPT's blocks (LayerNorm, GELU MLP of 4d, learned positions): "
                         f"the gpt2 family's shape, not {cfg.module or cfg.family!r}")


def block_activation_bytes(cfg: ModelConfig, micro_batch: int, activation_checkpointing: bool = False) -> float:
    """Every block's kept tensors for one micro-batch (the module doc's list): 32 s b h bytes per layer, the two
    LayerNorms' fp32 mean and rstd (16 s b) and the fp32 log-sum-exp (4 b H s, s padded); with checkpointing each
    block's bf16 input, and one block's whole set again while backward recomputes it."""
    _gpt_like(cfg)
    s, b, h, layers = cfg.seq_len, micro_batch, cfg.d_model, cfg.n_layers
    padded = math.ceil(s / ROW_PADDING) * ROW_PADDING
    per_layer = 2 * VALUES_PER_TOKEN_PER_LAYER * s * b * h + 2 * 2 * 4 * s * b + 4 * b * cfg.n_heads * padded
    if activation_checkpointing:
        return float(layers * 2 * s * b * h + per_layer)
    return float(layers * per_layer)


def outside_block_bytes(cfg: ModelConfig, micro_batch: int, accumulation_steps: int = 1) -> float:
    """Kept outside the blocks for one micro-batch: the final LayerNorm's bf16 input and fp32 statistics, the head's
    bf16 input, the fused loss's bf16 logits and fp32 log-sum-exp, and the int64 token batch."""
    _gpt_like(cfg)
    b, t, d, v = micro_batch, cfg.seq_len, cfg.d_model, cfg.vocab_size
    final_norm = 2 * b * t * d + 2 * 4 * b * t
    head_input = 2 * b * t * d
    loss = 2 * b * t * v + 4 * b * t
    ids = 8 * accumulation_steps * b * (t + 1)
    return float(final_norm + head_input + loss + ids)


def loss_backward_bytes(cfg: ModelConfig, micro_batch: int) -> float:
    """The fused loss's backward: the bf16 gradient of the logits, written beside the kept logits."""
    return 2.0 * micro_batch * cfg.seq_len * cfg.vocab_size


def unpriced(step: RankStep) -> str | None:
    """Why the recipe does not describe a step (None where it does): it is FSDP FULL_SHARD over every data-parallel
    rank in bf16, without tensor or sequence parallelism, hybrid sharding, offload or compile."""
    other = [what for what, differs in (
        (f"ZeRO stage {step.zero_stage}", step.zero_stage != 3), (step.precision, step.precision != "bf16"),
        (f"tensor parallel {step.tensor_parallel}", step.tensor_parallel > 1),
        ("sequence parallelism", step.sequence_parallel), (f"{step.replicas} replicas", step.replicas > 1),
        ("cpu offload", step.cpu_offload), ("compile", step.compiled)) if differs]
    return None if not other else ("llm-foundry's recipe prices FSDP FULL_SHARD (ZeRO stage 3) in bf16 alone, not "
                                   + ", ".join(other))


def peak_memory(cfg: ModelConfig, n_params: int, step: RankStep) -> PeakMemory:
    """The step's peak per GPU under the recipe: at the loss's backward, the fp32 shards and Adam (and the fp32 gradient
    shards where accumulation made them), the bf16 root unit and two gathered blocks, and one micro-batch's kept
    activations with the logits' gradient. The optimizer step's peak (every shard and its gradient) is ``at_rest``.
    Only the step the recipe describes is priced (unpriced): another is a ValueError."""
    why = unpriced(step)
    if why is not None:
        raise ValueError(why)
    micro_batch, accumulation_steps = step.micro_batch, step.accumulation_steps
    shard = n_params / step.data_parallel
    at_rest = 16 * shard
    state = at_rest if accumulation_steps > 1 else 12 * shard
    block = block_param_count(cfg)
    root = max(0, n_params - cfg.n_layers * block)
    transient = 2 * (2 * block + root)
    activations = (block_activation_bytes(cfg, micro_batch, step.activation_checkpointing)
                   + outside_block_bytes(cfg, micro_batch, accumulation_steps) + loss_backward_bytes(cfg, micro_batch))
    return PeakMemory(state, float(transient), activations, MODELLED, at_rest=at_rest)
