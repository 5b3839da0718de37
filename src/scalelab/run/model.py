"""Small, readable decoders: the model families a run trains, and the user's own model.

``gpt2`` (:class:`GPT`, after nanoGPT's model.py): pre-LayerNorm blocks, causal self-attention
through ``scaled_dot_product_attention`` (flash/efficient kernels where the device has them),
GELU MLP of 4d, learned positions, optional weight tying.
``llama`` (:class:`Llama`, after Meta's reference model and Hugging Face's LlamaForCausalLM):
pre-RMSNorm blocks (torch.nn.RMSNorm), rotary position embeddings (the rotate-half form, base
``rope_base``), grouped-query attention (``n_kv_heads`` key/value heads shared by the query
heads: scaled_dot_product_attention's ``enable_gqa``), a SwiGLU MLP (gate, up, down; no biases)
and an untied output head.
``module`` (:class:`UserModel`): a callable ``pkg.mod:build`` returning the user's nn.Module and
its block class (:func:`build_model`).
Shapes: B batch, T sequence, C = d_model, H heads, D = C / H, V vocabulary.

Given targets, ``GPT.forward`` returns the loss alone: the (B, T, V) logits are freed as soon
as the loss is computed instead of being held by the caller through backward (at
V = 50k the logits of one micro-batch are as large as several blocks' activations).
"""
from __future__ import annotations

import importlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from scalelab.config import ModelConfig
from scalelab.registries.families import family, llama_ffn_dim


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in fp32 whatever the compute dtype (the loss is what runs compare).

    logits (B, T, V) in the compute dtype, targets (B, T). Under autocast ``.float()`` makes an
    fp32 copy of the logits (in fp32 it is the same tensor); log_softmax keeps its fp32 output
    for backward (scalelab.formulas.activation_memory.loss_path_bytes counts both)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Heads by their width, not their count: under tensor parallelism a rank holds some of the heads
        # (scalelab.run.tensor_parallel orders qkv's rows so that each rank's share is its heads' q, k, v).
        B, T, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.activation_checkpointing = False
        """Keep only the block's input for backward and recompute the rest there."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Checkpointing inside forward (not a wrapper module around the block) keeps FSDP2's
        # hooks outside it: in backward the block's parameters are gathered once, then the
        # forward is recomputed and differentiated with them.
        if self.activation_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class StageBlocks(nn.ModuleDict):
    """One pipeline stage's blocks (scalelab.run.pipeline), under their indices in the whole model, so that parameter
    names (``blocks.6.attn.qkv.weight``) are the whole model's; iterated and indexed as a list, as ``blocks`` are."""

    def __iter__(self):
        return iter(self.values())

    def __getitem__(self, key):
        return list(self.values())[key] if isinstance(key, int) else super().__getitem__(key)


class GPT(nn.Module):
    FIRST_STAGE_PARTS = ("wte", "wpe")
    """What a pipeline's first stage holds beside its blocks (scalelab.run.pipeline), and its last stage:"""
    LAST_STAGE_PARTS = ("ln_f", "head")

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.wte.weight
        self.loss_fn = cross_entropy_loss
        """The loss of the logits; scalelab.run.parallel.apply_compile swaps in a compiled one."""
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layers).
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """The logits (B, T, V) without targets; with targets the loss only (a scalar), so that
        nothing holds the logits once the loss is computed. A pipeline stage without the embeddings takes the
        previous stage's activations (B, T, C) and, without the head, returns its own."""
        if self.wte is not None:
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        else:
            x = idx
        for block in self.blocks:
            x = block(x)
        if self.head is None:
            return x
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits
        return self.loss_fn(logits, targets)

    def set_activation_checkpointing(self, enabled: bool) -> None:
        for block in self.blocks:
            block.activation_checkpointing = enabled

    def num_parameters(self) -> int:
        """Unique parameters (a tied weight counts once)."""
        return sum(p.numel() for p in self.parameters())  # parameters() yields a shared one once


# ----------------------------------------------------------------------------- the Llama family
def n_kv_heads(cfg: ModelConfig) -> int:
    return cfg.n_kv_heads or cfg.n_heads


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, D) of the rotary embedding: angle t / base^(2i/D) for pair i, repeated
    over the two halves of a head (the rotate-half layout)."""
    head_dim = cfg.d_model // cfg.n_heads
    inv_freq = 1.0 / (cfg.rope_base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class GroupedQueryAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg.n_heads, n_kv_heads(cfg)
        self.head_dim = cfg.d_model // cfg.n_heads
        kv_dim = self.n_kv_heads * self.head_dim
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k = nn.Linear(cfg.d_model, kv_dim, bias=False)
        self.v = nn.Linear(cfg.d_model, kv_dim, bias=False)
        self.o = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape  # heads by their width: a tensor-parallel rank holds some of them (as GPT's)
        q = self.q(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.k(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        cos, sin = cos[:T].to(q.dtype), sin[:T].to(q.dtype)  # no-ops unless autocast made q 16-bit
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = llama_ffn_dim(cfg)
        self.gate = nn.Linear(cfg.d_model, hidden, bias=False)
        self.up = nn.Linear(cfg.d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model, eps=LLAMA_NORM_EPS)
        self.attn = GroupedQueryAttention(cfg)
        self.norm2 = nn.RMSNorm(cfg.d_model, eps=LLAMA_NORM_EPS)
        self.mlp = SwiGLU(cfg)
        self.activation_checkpointing = False
        """Keep only the block's input for backward and recompute the rest there (as Block)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.activation_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._forward, x, cos, sin, use_reentrant=False)
        return self._forward(x, cos, sin)

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


LLAMA_NORM_EPS = 1e-5
"""RMSNorm's epsilon (Llama 2 and 3's rms_norm_eps)."""


class Llama(nn.Module):
    """The Llama family: token embedding, pre-RMSNorm blocks with RoPE and grouped-query
    attention, a final RMSNorm and a head, untied unless the config ties it (tie_embeddings: Llama 3.2
    1B and 3B). The RoPE tables are buffers (not parameters, not in the state dict), handed to every block."""
    FIRST_STAGE_PARTS = ("wte",)
    LAST_STAGE_PARTS = ("norm", "head")

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=LLAMA_NORM_EPS)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:  # Llama 3.2 1B and 3B tie theirs
            self.head.weight = self.wte.weight
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.loss_fn = cross_entropy_loss
        """The loss of the logits; scalelab.run.parallel.apply_compile swaps in a compiled one."""
        self.apply(GPT._init_weights)
        for name, p in self.named_parameters():  # the residual projections, as GPT-2's
            if name.endswith(("attn.o.weight", "mlp.down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """As GPT.forward: the logits without targets, the loss alone with them (a pipeline stage's as GPT's)."""
        x = self.wte(idx) if self.wte is not None else idx  # (B, T, C)
        for block in self.blocks:
            x = block(x, self.rope_cos, self.rope_sin)
        if self.head is None:
            return x
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return self.loss_fn(logits, targets)

    set_activation_checkpointing = GPT.set_activation_checkpointing
    num_parameters = GPT.num_parameters


# ----------------------------------------------------------------------------- the user's own model
class UserModel(nn.Module):
    """The user's nn.Module (``net``: token ids (B, T) in, logits (B, T, V) out) with scalelab's
    loss, and its blocks: every submodule of the block class the build callable names, in
    module order. FSDP2 shards each block as a group, activation checkpointing recomputes each
    (the block's forward wrapped in torch.utils.checkpoint, inside FSDP2's hooks as for the
    families), compile compiles each, LoRA adapts the nn.Linear layers inside them."""

    def __init__(self, net: nn.Module, block_class: type, cfg: ModelConfig):
        super().__init__()
        self.cfg, self.net = cfg, net
        self.block_paths = [f"net.{name}" for name, m in net.named_modules() if isinstance(m, block_class)]
        if not self.block_paths:
            raise ValueError(f"{cfg.module}: the module has no submodule of its block class {block_class.__name__}")
        self.loss_fn = cross_entropy_loss
        self._checkpointing = False

    @property
    def blocks(self) -> list[nn.Module]:
        return [self.get_submodule(path) for path in self.block_paths]

    def set_block(self, i: int, module: nn.Module) -> None:
        parent, _, child = self.block_paths[i].rpartition(".")
        self.get_submodule(parent).register_module(child, module)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.net(idx)
        if targets is None:
            return logits
        return self.loss_fn(logits, targets)

    def set_activation_checkpointing(self, enabled: bool) -> None:
        for block in self.blocks:
            block.activation_checkpointing = enabled  # as the families' blocks say it (SavedActivationMeter reads it)
            if enabled and "forward" not in block.__dict__:
                plain = block.forward

                def recomputed(*args, _plain=plain, **kwargs):
                    if torch.is_grad_enabled():
                        return checkpoint(_plain, *args, use_reentrant=False, **kwargs)
                    return _plain(*args, **kwargs)

                block.forward = recomputed
            elif not enabled:
                block.__dict__.pop("forward", None)

    num_parameters = GPT.num_parameters


def load_builder(spec: str):
    """The callable ``pkg.mod:build`` names (ValueError naming it when it cannot be imported)."""
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"module {spec!r}: cannot import it ({err})") from None


def build_user_model(cfg: ModelConfig) -> UserModel:
    result = load_builder(cfg.module)(cfg)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)
            and isinstance(result[1], type)):
        raise ValueError(f"module {cfg.module!r} must return (an nn.Module, its block class), got {result!r:.200}")
    return UserModel(*result, cfg)


def build_model(cfg: ModelConfig) -> nn.Module:
    """The model of a config: the user's module where one is named, else its family's class."""
    if cfg.module:
        return build_user_model(cfg)
    return load_builder(family(cfg.family).module)(cfg)  # the class its record names (scalelab.registries.families)


def counted(cfg: ModelConfig, lora_rank: int | None = None) -> dict:
    """What a model's module says of itself, built on the meta device (no memory, no compute):
    its parameters, one block's, and its training FLOPs per token counted by
    torch.utils.flop_counter over one sequence's forward and backward (``flops_per_token``)
    and over the blocks' forward alone (``block_forward_flops_per_token``: what per-block
    activation checkpointing recomputes). flop_counter counts matrix products and attention
    (scaled_dot_product_attention in full, causal or not: the convention of
    scalelab.formulas.flops.flops_per_token, which it equals for the built-in families)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = build_model(cfg)
    if lora_rank:  # the trainable parameters LoRA adds (scalelab.run.lora), counted
        from scalelab.run.lora import apply_lora

        with torch.device("meta"):
            return {"n_params": model.num_parameters(), "lora_trainable": apply_lora(model, lora_rank, 1.0)}
    idx = torch.zeros(1, cfg.seq_len, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as forward:
        loss = model(idx, idx)
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    by_module = forward.get_flop_counts()
    root = type(model).__name__
    paths = model.block_paths if isinstance(model, UserModel) else [f"blocks.{i}" for i in range(len(model.blocks))]
    block_forward = sum(sum(by_module.get(f"{root}.{path}", {}).values()) for path in paths)
    return {"n_params": model.num_parameters(), "block_params": sum(p.numel() for p in model.blocks[0].parameters()),
            "flops_per_token": (forward.get_total_flops() + backward.get_total_flops()) / cfg.seq_len,
            "block_forward_flops_per_token": block_forward / cfg.seq_len}
