"""The model families, one record each: what a family is (its ``nn.Module`` class, named by import
path so this module imports no torch), the config keys only it takes, and its shape formulas:
parameters, the block's matmul weights, the activations its blocks and loss path keep, the
parameter tensors its strategies communicate, its LoRA targets, and the same in words for the
report. scalelab.formulas, the config's checks, the result columns, the estimates, the
report and the worker read these records; nothing else branches on a family's name.

Adding a family touches its record here, its ``nn.Module`` (the class ``module`` names), its
presets (scalelab.registries.presets) and the schema's ``family`` enum (a test pins the enum to
:data:`FAMILIES`). A family with config keys of its own also adds them to ModelConfig and to the
result columns.

Shapes: ``cfg`` is a scalelab.config.ModelConfig (read by attribute); s = T the sequence length,
b the micro-batch, h = d the width, L the blocks, H the heads, kv = key/value heads x head width
(grouped-query attention), f the MLP width, V the vocabulary, w the compute width in bytes.
A user's own module (ModelConfig.module) is no family: it has no formula (scalelab.formulas.flops.require_formula says so).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ActivationCase:
    """What decides a block's saved tensors besides its shape (scalelab.formulas.activation_memory builds it
    from the run's precision, stage and levers)."""

    micro_batch: int
    width: int
    """w: bytes per value of the compute dtype."""
    amp: bool
    """Autocast over fp32 parameters (fp16, bf16, fp8 where the parameters stay fp32)."""
    sixteen_bit_params: bool
    """fp16 and bf16 at stages 2 and 3: FSDP2's MixedPrecisionPolicy hands the blocks 16-bit parameters."""
    checkpointing: bool
    """Per-block activation checkpointing: each block keeps its input only."""
    gpu: bool
    """On a CUDA device (its kernels save differently from the CPU's for some ops)."""
    compiled: bool
    """The blocks under torch.compile: what AOTAutograd's min-cut partitioner saves."""
    tensor_parallel: int = 1
    """T ranks split the block's planned linears (Family.tensor_parallel): a rank keeps 1/T of what they
    and the attention between them make (q, k, v, the attention output, the MLP's hidden values, the
    weight copies), and all of what the norms and the residual stream keep (Korthikanti et al. 2022's
    split without sequence parallelism). Eager only: compiled blocks under tensor parallelism are not
    modelled (scalelab.formulas.peak_memory.activation_bound)."""
    sequence_parallel: bool = False
    """With tensor_parallel > 1: what the norms keep of the residual stream (their inputs, statistics) and the
    residual stream itself are each rank's 1/T of the tokens; the norms' outputs, all-gathered for the split
    linears, are kept whole by the linears (torch's colwise style saves its gathered input)."""


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    """One line: what sets it apart (the result column model_family and the docs)."""
    module: str
    """``pkg.mod:Class``: the ``nn.Module`` built with the ModelConfig (scalelab.run.model.build_model)."""
    own_keys: tuple[str, ...]
    """ModelConfig keys only this family reads (a ``models:`` entry of another family may not set them)."""
    untied_head: bool
    """True: the family's head is untied by default: a ``models:`` entry's head is untied unless the entry (or its
    preset: Llama 3.2 1B, 3B) sets ``tie_embeddings: true``, whatever ``model:`` says for GPT-2's."""
    block_matmul_params: Callable
    """cfg -> weights of one block's matrix products."""
    block_other_params: Callable
    """cfg -> one block's parameters outside matrix products (norms, biases)."""
    outside_params: Callable
    """cfg -> every parameter outside the blocks (embeddings, final norm, an untied head)."""
    parameter_tensors: Callable
    """cfg -> the model's parameter tensors (the units FSDP2 and DDP's buckets move)."""
    mlp_width: Callable
    """cfg -> the MLP's hidden width f."""
    kv_heads: Callable
    """cfg -> key/value heads (the query heads where attention is not grouped)."""
    block_activation_bytes: Callable
    """(cfg, ActivationCase) -> bytes every block keeps for backward, one micro-batch."""
    outside_block_bytes: Callable
    """(cfg, ActivationCase) -> what the final norm, the head's input and the position ids keep."""
    lora_targets: Callable
    """cfg -> {linear's path in a block: (d_in, d_out)}: the linears LoRA adapts."""
    own_columns: Callable
    """cfg -> the family's own result columns (its own keys, resolved: scalelab.planning.columns)."""
    tensor_parallel: dict[str, str] = field(default_factory=dict)
    """{linear's path in a block: how tensor parallelism shards it}, Megatron's: "colwise" (its output
    features: weight rows and bias split), "rowwise" (its input features: weight columns split, the
    partial outputs summed by an all-reduce, the bias replicated), "colwise by head" (a fused q, k, v
    projection: its rows reordered so that each rank's share holds its heads' q, k and v). Everything
    else of a block (norms, a rowwise bias) and outside the blocks is replicated. Empty: no tensor
    parallelism (scalelab.run.tensor_parallel applies the plan)."""
    linear_biases: bool = False
    """Whether a block's linears have biases (a colwise bias is split with its rows, a rowwise one is not)."""
    norms: tuple[str, ...] = ()
    """A block's norms (paths in the block), then the final norm's (a path in the model): what sequence
    parallelism runs on each rank's share of the tokens (scalelab.run.tensor_parallel)."""
    norm_params: Callable = lambda cfg: 0
    """cfg -> one norm's parameters (LayerNorm's weight and bias, RMSNorm's weight)."""
    norm_tensors: int = 1
    """One norm's parameter tensors (LayerNorm: weight and bias)."""
    formulas: dict[str, str] = field(default_factory=dict)
    """The report's words for parameters, flops, activations and recompute (scalelab.report.formula_section)."""
    shape_problem: Callable = lambda cfg: None
    """cfg -> (key, message) where the shape cannot be built, else None (scalelab.planning.validation)."""
    compiled_unmodelled: Callable = lambda cfg, case: False
    """(cfg, ActivationCase) -> True where the compiled partition of the blocks is not modelled (the
    eager figure stands as an upper bound: scalelab.formulas.peak_memory.activation_bound)."""


def tensor_parallel_split_params(cfg) -> int:
    """A block's parameters tensor parallelism splits (its record's plan): the planned linears' weights
    and the colwise ones' biases; the rest of the block (norms, rowwise biases) stays whole."""
    fam = family(cfg.family)
    sizes = fam.lora_targets(cfg)  # every planned linear is one LoRA adapts: (d_in, d_out)
    return sum(sizes[path][0] * sizes[path][1] + (sizes[path][1] if fam.linear_biases and how.startswith("colwise") else 0)
               for path, how in fam.tensor_parallel.items())


def head_width(cfg) -> int:
    return cfg.d_model // cfg.n_heads


# ----------------------------------------------------------------------------- gpt2
def _gpt2_block_activations(cfg, case: ActivationCase) -> float:
    """GPT-2's blocks (the terms scalelab.formulas.activation_memory.block_activation_bytes derives): 16 s b h
    values per layer at w, the LayerNorms' statistics (4 s b values at their input's width) and the
    attention's fp32 logsumexp (b H s); under autocast the fp32 residual stream and LayerNorm inputs and the w-byte
    weight copies; with 16-bit parameters on a GPU, eager, the LayerNorms' fp32 input copies; compiled,
    the partitioner's set (LayerNorm statistics, the attention logsumexp and, on a GPU, flash
    attention's RNG state); with checkpointing the block input alone. Sequence parallelism: x and x + attn
    (the LayerNorms' inputs, and the fp32 copies of them where kept) per rank's tokens, the LayerNorms'
    outputs whole (all-gathered, kept by qkv and fc)."""
    s, b, h, L, w = cfg.seq_len, case.micro_batch, cfg.d_model, cfg.n_layers, case.width
    residual_width = 4 if case.amp else w
    share = 1 / case.tensor_parallel if case.sequence_parallel else 1  # of the residual stream's terms
    if case.checkpointing:  # the block input, this rank's tokens under sequence parallelism (compiled too)
        return L * s * b * h * residual_width * share
    t = 1 if case.compiled else case.tensor_parallel  # compiled: the unsplit figure, an upper bound
    share = 1 if case.compiled else share
    # both LayerNorm outputs whole on every rank, x and x + attn too (per rank's tokens under sequence parallelism);
    # q, k, v, the attention output, the projection's output and the MLP's 4h fc and GELU outputs split (measured on
    # the CPU with saved-tensor hooks, T = 2)
    per_layer = (2 + 2 * share + 12 / t) * s * b * h * w
    if case.compiled:  # what the partitioner saves
        stats_width = 4 if case.gpu else residual_width  # CUDA's LayerNorm keeps fp32 mean and rstd for 16-bit inputs
        flash_rng = 16 if case.gpu else 0  # flash attention's philox seed and offset, two int64 scalars
        per_layer += 2 * 2 * stats_width * s * b + 4 * b * cfg.n_heads * s + flash_rng
        if case.amp:
            per_layer += s * b * h * (4 - w) + 2 * _gpt2_matmul(cfg)
        return L * per_layer
    # the LayerNorms' mean and rstd (2 x 2 per token, at their input's width; fp32 on a GPU) and the attention's
    # fp32 logsumexp (per head: split with them); measured on the CPU with saved-tensor hooks
    stats_width = 4 if case.gpu else residual_width
    per_layer += 2 * 2 * stats_width * s * b * share + 4 * b * cfg.n_heads * s / t
    if case.amp:
        per_layer += 2 * s * b * h * (4 - w) * share + 2 * _gpt2_matmul(cfg) / t
    elif case.sixteen_bit_params and case.gpu:
        # CUDA's autocast runs layer_norm in fp32 (the CPU's keeps its input dtype): each LayerNorm saves an
        # fp32 copy of its 16-bit input (an H200: eager bf16 at stage 3 measured 13.7% over the formula without it)
        per_layer += 2 * s * b * h * (4 - w) * share
    return L * per_layer


def _gpt2_outside(cfg, case: ActivationCase) -> float:
    """The final LayerNorm's input (the residual stream: fp32, or w with 16-bit parameters on a CPU;
    on a GPU autocast's fp32 copy of it, the final LayerNorm being eager in compiled runs too) with its
    mean and rstd (per rank's tokens under sequence parallelism), the head's input at w (and autocast's
    16-bit copy of the head weight), the positions."""
    b, t, c, v, w = case.micro_batch, cfg.seq_len, cfg.d_model, cfg.vocab_size, case.width
    width = w if case.sixteen_bit_params and not case.gpu else 4  # its input's, and its statistics'
    final_norm = width * b * t * c + 2 * width * b * t
    final_norm /= case.tensor_parallel if case.sequence_parallel else 1
    head = w * b * t * c + (2 * v * c if case.amp else 0)
    return float(final_norm + head + 8 * t)


def _gpt2_matmul(cfg) -> int:
    return 12 * cfg.d_model * cfg.d_model  # qkv 3 d^2, proj d^2, MLP 8 d^2


_GPT2_LORA = {"attn.qkv": (1, 3), "attn.proj": (1, 1), "mlp.fc": (1, 4), "mlp.proj": (4, 1)}
"""Every block's attention (qkv, proj) and MLP (fc, proj) linears, in units of d (the common choice)."""

GPT2 = Family(
    name="gpt2",
    description="LayerNorm, GELU MLP of 4d, learned positions, full attention, tied head by default",
    module="scalelab.run.model:GPT",
    own_keys=(),
    untied_head=False,
    block_matmul_params=_gpt2_matmul,
    block_other_params=lambda cfg: 13 * cfg.d_model,  # biases and two LayerNorms
    outside_params=lambda cfg: (cfg.vocab_size * cfg.d_model + cfg.seq_len * cfg.d_model + 2 * cfg.d_model
                                + (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)),
    # 12 per block (qkv, proj, fc, proj and their biases, two LayerNorms) + wte, wpe, ln_f (+ an untied head)
    parameter_tensors=lambda cfg: 12 * cfg.n_layers + 4 + (0 if cfg.tie_embeddings else 1),
    mlp_width=lambda cfg: 4 * cfg.d_model,
    kv_heads=lambda cfg: cfg.n_heads,
    block_activation_bytes=_gpt2_block_activations,
    outside_block_bytes=_gpt2_outside,
    lora_targets=lambda cfg: {name: (i * cfg.d_model, o * cfg.d_model) for name, (i, o) in _GPT2_LORA.items()},
    own_columns=lambda cfg: {},
    tensor_parallel={"attn.qkv": "colwise by head", "attn.proj": "rowwise", "mlp.fc": "colwise", "mlp.proj": "rowwise"},
    linear_biases=True,
    norms=("ln1", "ln2", "ln_f"),
    norm_params=lambda cfg: 2 * cfg.d_model,
    norm_tensors=2,
    formulas={
        "parameters": "Ψ = V·d + T·d + L·(12d² + 13d) + 2d (+ V·d if the head is untied)",
        "flops": "6·(12·L·d² + V·d) + 12·L·d·T",
        "activations": ("scaled_dot_product_attention never stores the a·s² scores and there is no dropout, which leaves "
                        "16·s·b·h values per layer; under autocast (fp16, bf16, fp8) the residual stream and LayerNorm inputs "
                        "stay fp32 and the 16-bit copies of the 12·d² block weights are kept"),
        "recompute": "24·L·d² + 4·L·d·T",
    },
)


# ----------------------------------------------------------------------------- llama
def llama_ffn_dim(cfg) -> int:
    """The SwiGLU hidden size: ``ffn_dim``, or Meta's rule: 2/3 of 4d, rounded up to a multiple of
    256 (4096 -> 11008, Llama 2 7B's)."""
    if cfg.ffn_dim is not None:
        return cfg.ffn_dim
    hidden = int(2 * 4 * cfg.d_model / 3)
    return 256 * ((hidden + 255) // 256)


def _llama_kv_dim(cfg) -> int:
    return (cfg.n_kv_heads or cfg.n_heads) * head_width(cfg)


def _llama_matmul(cfg) -> int:
    d = cfg.d_model
    return 2 * d * d + 2 * d * _llama_kv_dim(cfg) + 3 * d * llama_ffn_dim(cfg)  # q, o; k, v; gate, up, down


def _llama_math_attention(cfg, case: ActivationCase) -> bool:
    """fp32 grouped-query attention on a GPU: SDPA's math path (no fused kernel takes fp32 with
    enable_gqa), which keeps the attention probabilities."""
    return case.gpu and case.width == 4 and _llama_kv_dim(cfg) < cfg.d_model


def _llama_block_activations(cfg, case: ActivationCase) -> float:
    """What the llama family's blocks keep for backward, one micro-batch, in bytes: with per-block
    checkpointing, compiled, or eager (each function's doc says what it counts; fp32 grouped-query
    attention on a GPU takes SDPA's math path, which torch.compile traces into the graph: not
    modelled compiled, the eager figure stands, an upper bound). fp8 (Float8Linear's own casts) is
    predicted as bf16."""
    if case.checkpointing:
        return _llama_checkpointed_activations(cfg, case)
    if case.compiled and not _llama_math_attention(cfg, case):
        return _llama_compiled_activations(cfg, case)
    return _llama_eager_activations(cfg, case)


def _llama_rope(cfg, case: ActivationCase) -> tuple[float, float]:
    """The RoPE tables' cos and sin, (once for all blocks, in every block): the fp32 tables once, or their
    w-byte casts in every block (autocast: the cast to q's dtype; 16-bit parameters: FSDP2 casts the
    block's inputs)."""
    if case.amp or case.sixteen_bit_params:
        return 0.0, 2 * cfg.seq_len * head_width(cfg) * case.width
    return 2 * cfg.seq_len * head_width(cfg) * 4, 0.0


def _llama_checkpointed_activations(cfg, case: ActivationCase) -> float:
    """Per-block checkpointing: each block keeps its input (s b h at the residual's width: w with 16-bit
    parameters, else 4) and the cos and sin it is handed (the w-byte casts with 16-bit parameters, else
    the fp32 tables once)."""
    s, b, h, w = cfg.seq_len, case.micro_batch, cfg.d_model, case.width
    share = 1 / case.tensor_parallel if case.sequence_parallel else 1  # of the residual stream
    residual = w if case.sixteen_bit_params else 4
    rope_once, rope_per_layer = (0.0, 2 * s * head_width(cfg) * w) if case.sixteen_bit_params else (2 * s * head_width(cfg) * 4, 0.0)
    return cfg.n_layers * (s * b * h * residual * share + rope_per_layer) + rope_once


def _llama_compiled_activations(cfg, case: ActivationCase) -> float:
    """Compiled (torch.compile, read from the min-cut partitioner's saved tensors): RMSNorm is
    decomposed into the graph (on a GPU too), which keeps the block input at the residual's width r
    (4, or w with 16-bit parameters), each norm's rstd (4 s b) and its w-byte output (once: the
    linears share it), the rotated q and k, v, the attention output and the o projection's output
    (the second norm's input x + attn is recomputed), the logsumexp, and of SwiGLU gate's and up's
    outputs and their product (silu's output is recomputed); autocast's weight copies and the RoPE
    tables as in eager: (r + 5w) s b h + 2w s b kv + 3w s b f + 8 s b + 4 b H s per layer (+ 2 P
    under autocast)."""
    s, b, h, heads, w = cfg.seq_len, case.micro_batch, cfg.d_model, cfg.n_heads, case.width
    kv, f = _llama_kv_dim(cfg), llama_ffn_dim(cfg)
    rope_once, rope_per_layer = _llama_rope(cfg, case)
    residual = w if case.sixteen_bit_params else 4
    per_layer = ((residual + 5 * w) * s * b * h + 2 * w * s * b * kv + 3 * w * s * b * f
                 + 8 * s * b + 4 * b * heads * s + rope_per_layer)
    if case.amp:
        per_layer += 2 * _llama_matmul(cfg)
    return cfg.n_layers * per_layer + rope_once


def _llama_eager_activations(cfg, case: ActivationCase) -> float:
    """Eager, measured term by term with autograd's saved-tensor hooks (torch 2.13, CPU):

    * per RMSNorm (torch.nn.RMSNorm, computed in fp32): its fp32 input and x rstd (the latter
      saved for the weight's gradient), and rstd (4 s b); in fp32 also its output, which the
      next linears save; under autocast (fp32 parameters) the linears save their own w-byte
      casts of it instead (one each: q, k, v after the first norm, gate and up after the
      second); with 16-bit parameters (fp16 and bf16 at stages 2, 3) the norm upcasts its input
      to fp32 and returns w bytes, which the linears share; the w-byte block input itself is then
      kept by nothing (freed once the block is done) and not counted. Otherwise the block input is
      the first norm's input, counted once;
    * attention: the rotated q (s b h) and k (s b kv), v (s b kv) and the output (s b h) at w,
      and scaled_dot_product_attention's fp32 logsumexp (4 b H s); the rotation's cos and sin
      (_llama_rope);
    * SwiGLU: gate's output (silu's input), silu's output, up's output and the product (down's
      input): 4 s b f values at w;
    * autocast with fp32 parameters: the w-byte copies of the block's matmul weights.

    So per layer, fp32: 4 (8 s b h + 2 s b kv + 4 s b f); autocast: (16 + 5w + 2w) s b h + 2w s b kv
    + 4w s b f + 2 P; 16-bit parameters: (2w + 16 + 2w) s b h + 2w s b kv + 4w s b f; each + 8 s b
    + 4 b H s.

    On a GPU (measured on an H100, torch 2.11) RMSNorm is one fused kernel that keeps its input and
    rstd only, not x rstd: 8 s b h bytes less per layer (fp32 and autocast), and with 16-bit
    parameters the norms keep their w-byte inputs and outputs (4w s b h); and fp32 grouped-query
    attention has no fused kernel there (flash takes 16-bit inputs, the memory-efficient kernel no
    enable_gqa), so SDPA's math path keeps the attention probabilities (4 b H s^2) and k and v
    repeated to H heads (+ 2w s b (h - kv)), and no logsumexp.
    """
    s, b, h, heads, w, gpu = cfg.seq_len, case.micro_batch, cfg.d_model, cfg.n_heads, case.width, case.gpu
    kv, f, t = _llama_kv_dim(cfg), llama_ffn_dim(cfg), case.tensor_parallel
    share = 1 / t if case.sequence_parallel else 1  # of what the norms keep of the residual stream
    rope_once, rope_per_layer = _llama_rope(cfg, case)
    # the norms' bytes per s b h value: (what they keep of their inputs, per rank's tokens under sequence
    # parallelism; what the linears keep of their outputs, whole)
    if case.sixteen_bit_params:
        norms_in, norms_out = (2 * w if gpu else 16), 2 * w
    elif case.amp:
        norms_in, norms_out = (8 if gpu else 16), 5 * w
    else:
        norms_in, norms_out = (8 if gpu else 16), 8
    attention = 4 * b * heads * s  # the logsumexp of the fused kernels (flash; CPU's for every dtype)
    if _llama_math_attention(cfg, case):
        attention = 4 * b * heads * s * s + 2 * w * s * b * (h - kv)
    # the norms, their rstd and the RoPE casts whole on every rank; q, k, v, the attention output and its
    # kernel's keep, SwiGLU's hidden values and the weight copies split (measured on the CPU, T = 2)
    split = 2 * w * s * b * h + 2 * w * s * b * kv + 4 * w * s * b * f + attention + (2 * _llama_matmul(cfg) if case.amp else 0)
    per_layer = (norms_in * share + norms_out) * s * b * h + 8 * s * b * share + rope_per_layer + split / t
    return cfg.n_layers * per_layer + rope_once


def _llama_outside(cfg, case: ActivationCase) -> float:
    """The final RMSNorm keeps its fp32 input (or upcast) and x rstd (8 B T C) and rstd (4 B T); the
    head's input: the norm's output at w (fp32, 16-bit parameters) or autocast's w-byte cast of it,
    with the 16-bit copy of the untied head weight under autocast; no positions (on a GPU the fused
    RMSNorm keeps its input only: 4 B T C, or w B T C with 16-bit parameters); under sequence parallelism
    the norm's terms per rank's tokens, the head's input (all-gathered) whole."""
    b, t, c, v, w = case.micro_batch, cfg.seq_len, cfg.d_model, cfg.vocab_size, case.width
    head = w * b * t * c + (2 * v * c if case.amp else 0)
    norm = ((w if case.sixteen_bit_params else 4) if case.gpu else 8) * b * t * c + 4 * b * t
    norm /= case.tensor_parallel if case.sequence_parallel else 1
    return float(norm + head)


def _llama_lora(cfg) -> dict[str, tuple[int, int]]:
    """The four attention projections and the three SwiGLU ones (PEFT's q_proj ... down_proj)."""
    d, kv, f = cfg.d_model, _llama_kv_dim(cfg), llama_ffn_dim(cfg)
    return {"attn.q": (d, d), "attn.k": (d, kv), "attn.v": (d, kv), "attn.o": (d, d),
            "mlp.gate": (d, f), "mlp.up": (d, f), "mlp.down": (f, d)}


def _llama_shape_problem(cfg):
    kv = cfg.n_kv_heads or cfg.n_heads
    if cfg.n_heads % kv:
        return "n_kv_heads", (f"n_kv_heads={kv} does not divide n_heads={cfg.n_heads} (each key/value head serves "
                              "the same number of query heads)")
    if head_width(cfg) % 2:
        return "n_heads", (f"the head width d_model/n_heads={head_width(cfg)} is odd; rotary embeddings rotate pairs "
                           "of values (make it even)")
    return None


LLAMA = Family(
    name="llama",
    description="RMSNorm, SwiGLU, RoPE, grouped-query attention, untied head",
    module="scalelab.run.model:Llama",
    own_keys=("n_kv_heads", "ffn_dim", "rope_base"),
    untied_head=True,
    block_matmul_params=_llama_matmul,
    block_other_params=lambda cfg: 2 * cfg.d_model,  # two RMSNorm weights, no biases
    # embedding, final norm, and the head unless tied (Llama 3.2 1B and 3B tie theirs: the weight counts once)
    outside_params=lambda cfg: (1 if cfg.tie_embeddings else 2) * cfg.vocab_size * cfg.d_model + cfg.d_model,
    # 7 linears and 2 norms per block + wte, norm (+ an untied head)
    parameter_tensors=lambda cfg: 9 * cfg.n_layers + 2 + (0 if cfg.tie_embeddings else 1),
    mlp_width=llama_ffn_dim,
    kv_heads=lambda cfg: cfg.n_kv_heads or cfg.n_heads,
    block_activation_bytes=_llama_block_activations,
    outside_block_bytes=_llama_outside,
    lora_targets=_llama_lora,
    # torchtitan's plan: q, k, v and SwiGLU's gate and up colwise, the output and down projections rowwise
    tensor_parallel={"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.o": "rowwise",
                     "mlp.gate": "colwise", "mlp.up": "colwise", "mlp.down": "rowwise"},
    norms=("norm1", "norm2", "norm"),
    norm_params=lambda cfg: cfg.d_model,
    own_columns=lambda cfg: {"n_kv_heads": cfg.n_kv_heads or cfg.n_heads, "ffn_dim": llama_ffn_dim(cfg),
                             "rope_base": cfg.rope_base},
    formulas={
        "parameters": "Ψ = 2·V·d + L·(2d² + 2·d·kv + 3·d·f + 2d) + d (kv = key/value heads × head size, f the SwiGLU "
                      "width; untied head, V·d less where tied; no position embedding)",
        "flops": "6·(L·(2d² + 2·d·kv + 3·d·f) + V·d) + 12·L·d·T (grouped-query attention still takes every query "
                 "head's dot products)",
        "activations": ("RMSNorm, the rotated q and k, v, SwiGLU's gate, up and product, and the fused attention's "
                        "log-sum-exp (scalelab.registries.families, the llama record; on a GPU fp32 grouped-query "
                        "attention runs SDPA's math path and keeps the a·s² probabilities)"),
        "recompute": "2·L·(2d² + 2·d·kv + 3·d·f) + 4·L·d·T",
    },
    shape_problem=_llama_shape_problem,
    compiled_unmodelled=_llama_math_attention,
)


FAMILIES: dict[str, Family] = {f.name: f for f in (GPT2, LLAMA)}
"""The built-in model families by the name a ``models:`` entry gives as ``family``."""
DEFAULT_FAMILY = GPT2.name
"""``model.family``'s default, and the family of every run recorded before families were."""
OWN_KEYS = tuple(dict.fromkeys(key for f in FAMILIES.values() for key in f.own_keys))
"""Every family's own ModelConfig keys, in record order."""


def family(name: str) -> Family:
    """The record of a family name (ValueError naming the known ones)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}: {', '.join(FAMILIES)}")
    return FAMILIES[name]
