"""Activation memory: what one micro-batch's forward keeps for backward, inside the transformer blocks
(Korthikanti et al., and each family's own terms) and outside them (the loss path, the ids).
"""
from __future__ import annotations

from dataclasses import dataclass

from scalelab.config import ModelConfig
from scalelab.formulas.communication import sixteen_bit_params
from scalelab.formulas.flops import require_formula
from scalelab.registries.families import ActivationCase, family
from scalelab.registries.precisions import AUTOCAST, PRECISIONS

# Bytes per activation value by precision (fp8 runs autocast to bf16 around float8 matmuls).
DTYPE_BYTES = {p.name: p.activation_bytes for p in PRECISIONS.values()}


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

def activation_case(precision: str, micro_batch: int = 1, activation_checkpointing: bool = False,
                    zero_stage: int | None = None, device_type: str = "cpu", compiled: bool = False,
                    tensor_parallel: int = 1, sequence_parallel: bool = False) -> ActivationCase:
    """What decides a block's saved tensors besides its shape, for the family records
    (scalelab.registries.families): the compute width, autocast over fp32 parameters or 16-bit parameters,
    the levers and the device."""
    sixteen = sixteen_bit_params(precision, zero_stage)
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
    Each family's terms are its record's (scalelab.registries.families: the llama family's kernels save
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
    require_formula(cfg, "activation")
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
    require_formula(cfg, "activation")
    b, t, v = micro_batch, cfg.seq_len, cfg.vocab_size
    width = DTYPE_BYTES[precision]
    # the loss's saved tensors: eager, log_softmax's fp32 output and the flattened targets (a copy when
    # B > 1); compiled, the logits at w with each row's max and log-sum-exp, and the targets as given
    loss = (width * b * t * v + 2 * 4 * b * t) if compiled else (4 * b * t * v + (8 * b * t if b > 1 else 0))
    ids = 8 * accumulation_steps * b * (t + 1)
    # the family's final norm, the head's input and the positions (scalelab.registries.families)
    case = activation_case(precision, micro_batch, zero_stage=zero_stage, device_type=device_type, compiled=compiled,
                           tensor_parallel=tensor_parallel, sequence_parallel=sequence_parallel)
    return float(loss + family(cfg.family).outside_block_bytes(cfg, case) + ids + 2 * 4)
