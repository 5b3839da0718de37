"""LoRA (Hu et al. 2021) as a lever: frozen base weights, a trainable low-rank update.

:func:`apply_lora` freezes every parameter of a built GPT and wraps the linears named in
``scalelab.formulas.lora_training.lora_targets`` (GPT-2: each block's attn.qkv, attn.proj, mlp.fc, mlp.proj;
llama: attn.q, k, v, o and the SwiGLU's mlp.gate, up, down; a user's module: every nn.Linear of
its blocks) in
:class:`LoRALinear`: y = W0 x + b0 + (alpha / r) B A x, A (r x d_in) Kaiming-uniform as in
Hu et al.'s reference code, B (d_out x r) zeros. With B = 0 the adapted model computes exactly
what the model did before wrapping, so a LoRA run built after its full-training twin's model
(same seed) starts from the twin's weights and its first-step loss equals the twin's.

What the strategies see: only A and B require gradients. DDP buckets only parameters that
require gradients, the optimizers take only those (scalelab.run.parallel.param_groups),
and FSDP2 shards frozen and trainable parameters in one group (it reduce-scatters only the
gradients that exist), so every strategy wraps the adapted model unchanged.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from scalelab.formulas.lora_training import lora_targets


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus the trainable update (alpha / rank) B A."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.base = base
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        weight = base.weight
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, device=weight.device, dtype=weight.dtype))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=weight.device, dtype=weight.dtype))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # nn.Linear's own init, as Hu et al.'s loralib

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}"


def apply_lora(model: nn.Module, rank: int, alpha: float) -> int:
    """Freeze every parameter of ``model`` and wrap each block's target linears (lora_targets);
    return the number of trainable parameters added. Call it after the model is built
    (and before fp8 conversion and sharding)."""
    for p in model.parameters():
        p.requires_grad_(False)
    added = 0
    for block in model.blocks:
        # a family's targets (scalelab.formulas.lora_training.lora_targets); in a user's module every nn.Linear of the block
        targets = (lora_targets(model.cfg) if not model.cfg.module else
                   [name for name, m in block.named_modules() if isinstance(m, nn.Linear)])
        for target in targets:
            parent_name, _, child = target.rpartition(".")
            parent = block.get_submodule(parent_name)
            base = getattr(parent, child)
            if not isinstance(base, nn.Linear):
                raise TypeError(f"LoRA target {target} is a {type(base).__name__}, not an nn.Linear")
            adapted = LoRALinear(base, rank, alpha)
            setattr(parent, child, adapted)
            added += adapted.lora_a.numel() + adapted.lora_b.numel()
    return added


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
