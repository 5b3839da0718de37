"""A small, readable GPT-style decoder (after nanoGPT's model.py).

Pre-LayerNorm blocks, causal self-attention through ``scaled_dot_product_attention``
(flash/efficient kernels where the device has them), GELU MLP, optional weight tying.
Shapes: B batch, T sequence, C = d_model, H heads, D = C / H, V vocabulary.

Given targets, ``GPT.forward`` returns the loss alone: the (B, T, V) logits are freed as soon
as the loss is computed instead of being held by the caller through backward (issue #14; at
V = 50k the logits of one micro-batch are as large as several blocks' activations).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from scalelab.config import ModelConfig


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in fp32 whatever the compute dtype (the loss is what runs compare).

    logits (B, T, V) in the compute dtype, targets (B, T). Under autocast ``.float()`` makes an
    fp32 copy of the logits (in fp32 it is the same tensor); log_softmax keeps its fp32 output
    for backward (scalelab.accounting.loss_path_bytes counts both)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


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


class GPT(nn.Module):
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
        """The loss of the logits; scalelab.training.parallel.apply_compile swaps in a compiled one."""
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
        nothing holds the logits once the loss is computed."""
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
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
