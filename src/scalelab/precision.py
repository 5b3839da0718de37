"""Precision policies: autocast dtype and loss scaling.

All precisions keep fp32 parameters, gradients and optimizer state (the PyTorch AMP
recipe); fp16 and bf16 run the forward/backward matmuls under autocast. fp16 needs
dynamic loss scaling; ShardedGradScaler all-reduces its inf/NaN check across ranks, so a
non-finite gradient on one rank (or in one shard) makes *every* rank skip the step.
"""
from __future__ import annotations

import contextlib

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

AUTOCAST_DTYPE = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
COMPUTE_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def autocast(precision: str, device: torch.device):
    dtype = AUTOCAST_DTYPE[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device, init_scale: float) -> ShardedGradScaler:
    """Dynamic loss scaler; a no-op (enabled=False) outside fp16."""
    return ShardedGradScaler(device.type, init_scale=init_scale, enabled=precision == "fp16")


def unsupported_reason(precision: str, device: torch.device) -> str | None:
    """Why this device cannot run this precision, or None if it can."""
    if device.type == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        return f"bf16 is not supported by {torch.cuda.get_device_name(device)}"
    try:
        a = torch.randn(8, 8, device=device)
        with autocast(precision, device):
            (a @ a).sum().item()
    except Exception as err:  # an autocast dtype this device/build lacks
        return f"{precision} autocast fails on {device.type}: {err}"
    return None
