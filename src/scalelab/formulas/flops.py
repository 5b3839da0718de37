"""Parameters and FLOPs of a model: the counts each family's formulas give, the training FLOPs per
token, MFU, and the days a training run takes on a datasheet GPU.

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

from scalelab.config import ModelConfig
from scalelab.registries import hardware
from scalelab.registries.families import Family, family
from scalelab.registries.precisions import peak_key

# Per family (scalelab.registries.families: one record each): the block's matmul weights, its norms, the
# embeddings, the activations. A user's own module (ModelConfig.module) has no formula: its parameters are counted from the
# module, its FLOPs by torch.utils.flop_counter (scalelab.run.worker_result), and no activation
# prediction is made.


def require_formula(cfg: ModelConfig, what: str) -> None:
    """Raise for a user's module, which no formula describes."""
    if cfg.module:
        raise ValueError(f"{cfg.module}: a user's module has no {what} formula (counted from the module instead)")


def formula_family(cfg: ModelConfig, what: str) -> Family:
    """The family record whose formulas describe ``cfg`` (a user's module has none)."""
    require_formula(cfg, what)
    return family(cfg.family)


def block_matmul_params(cfg: ModelConfig) -> int:
    """Weights of one block's matrix products (the family's record): GPT-2: 12 d^2 (qkv 3 d^2, proj
    d^2, MLP 8 d^2); llama: 2 d^2 + 2 d kv (q, o; k, v) + 3 d f (gate, up, down)."""
    return formula_family(cfg, "parameter").block_matmul_params(cfg)


def block_param_count(cfg: ModelConfig) -> int:
    """Every parameter of one block: its matmul weights, plus GPT-2's biases and two LayerNorms
    (13 d) or the llama family's two RMSNorm weights (2 d, no biases)."""
    record = formula_family(cfg, "parameter")
    return record.block_matmul_params(cfg) + record.block_other_params(cfg)


def param_count(cfg: ModelConfig) -> int:
    """Exact parameter count of the family's model (scalelab.run.model), as published
    checkpoints count it: the blocks and what the family keeps outside them. GPT-2: token and
    position embeddings, the final LayerNorm, and the head unless tied (a tied weight counts once).
    llama: token embedding, the final RMSNorm and the untied head (no position embedding: RoPE has
    no parameters)."""
    return formula_family(cfg, "parameter").outside_params(cfg) + cfg.n_layers * block_param_count(cfg)


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
    see scalelab.registries.hardware.peak_flops_for)."""
    if math.isnan(peak_flops_per_device):
        return math.nan
    if peak_flops_per_device <= 0 or n_devices < 1:
        raise ValueError("peak FLOP/s and device count must be positive")
    return tokens_per_s * flops_per_tok / (peak_flops_per_device * n_devices)


def recompute_flops_per_token(cfg: ModelConfig) -> float:
    """Extra FLOPs per token of per-block activation checkpointing: one more forward of every
    block (2 x the block's matmul weights per layer, 12 L d^2 for GPT-2; 4 L d T for attention),
    i.e. about a third more block compute. MFU ignores it (model FLOPs); HFU counts it (hardware FLOPs)."""
    return 2 * cfg.n_layers * block_matmul_params(cfg) + 4 * cfg.n_layers * cfg.d_model * cfg.seq_len

def gpu_peak_flops(gpu: str, precision: str) -> float:
    """Dense datasheet peak of a GPU named on the command line (see hardware.gpu_by_name), for a
    precision or a datasheet column (tf32) of scalelab.registries.precisions."""
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
