"""Data-parallel strategies by ZeRO stage: one function per strategy, chosen by stage.

| stage | PyTorch                                                    |
| 0     | DistributedDataParallel + local AdamW                      |
| 1     | DDP + torch.distributed.optim.ZeroRedundancyOptimizer      |
| 2     | FSDP2 fully_shard(reshard_after_forward=False) per block   |
| 3     | FSDP2 fully_shard(reshard_after_forward=True) per block    |
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from .model import GPT


@dataclass
class Parallelized:
    """A model wrapped for a stage, its optimizer, and how to skip gradient sync."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    no_sync: Callable[[bool], contextlib.AbstractContextManager]
    """no_sync(is_last_micro_batch): context for one micro-batch's backward."""

    def local_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer that holds this rank's state (ZeRO-1 wraps a local one)."""
        opt = self.optimizer
        return opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (dim >= 2), not biases and norms; a tied weight appears once."""
    params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def _adamw_kwargs(lr: float, device: torch.device) -> dict:
    # Fused AdamW on GPU (one kernel for all parameters); foreach on CPU.
    return {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-8, "fused": device.type == "cuda"}


def _ddp(model: nn.Module, device: torch.device) -> DDP:
    # gradient_as_bucket_view: gradients live in the all-reduce buckets instead of beside
    # them, so DDP holds 4 bytes of gradient per parameter, not 8.
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
              gradient_as_bucket_view=True)
    # The stock all-reduce hook, registered so DDP's all-reduce goes through
    # torch.distributed.all_reduce, where scalelab.comm counts it.
    ddp.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    return ddp


def parallelize_stage0(model: GPT, device, lr, weight_decay) -> Parallelized:
    ddp = _ddp(model, device)
    opt = torch.optim.AdamW(param_groups(model, weight_decay), **_adamw_kwargs(lr, device))
    return Parallelized(ddp, opt, lambda last: contextlib.nullcontext() if last else ddp.no_sync())


def parallelize_stage1(model: GPT, device, lr, weight_decay) -> Parallelized:
    ddp = _ddp(model, device)
    # ZeroRedundancyOptimizer takes one parameter group; the second is added after, so
    # weight decay is handled as in the other stages.
    groups = param_groups(model, weight_decay)
    opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW,
                                  weight_decay=weight_decay, **_adamw_kwargs(lr, device))
    opt.add_param_group({"params": groups[1]["params"], "weight_decay": 0.0})
    return Parallelized(ddp, opt, lambda last: contextlib.nullcontext() if last else ddp.no_sync())


def _parallelize_fsdp(model: GPT, device, lr, weight_decay, reshard_after_forward: bool) -> Parallelized:
    # FSDP2 needs an explicit mesh on CPU; one dimension = plain data parallelism.
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.blocks:  # one all-gather/reduce-scatter group per transformer block
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    opt = torch.optim.AdamW(param_groups(model, weight_decay), **_adamw_kwargs(lr, device))
    assert isinstance(model, FSDPModule)

    def no_sync(last: bool):
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    return Parallelized(model, opt, no_sync)


def parallelize_stage2(model, device, lr, weight_decay) -> Parallelized:
    return _parallelize_fsdp(model, device, lr, weight_decay, reshard_after_forward=False)


def parallelize_stage3(model, device, lr, weight_decay) -> Parallelized:
    return _parallelize_fsdp(model, device, lr, weight_decay, reshard_after_forward=True)


STRATEGIES = {0: parallelize_stage0, 1: parallelize_stage1, 2: parallelize_stage2, 3: parallelize_stage3}


def parallelize(model: GPT, zero_stage: int, device: torch.device, lr: float, weight_decay: float) -> Parallelized:
    return STRATEGIES[zero_stage](model, device, lr, weight_decay)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def model_state_bytes(par: Parallelized) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank really holds."""
    params = {id(p): p for p in par.model.parameters()}.values()  # a tied weight once
    p_bytes = sum(_local(p).numel() * p.element_size() for p in params)
    g_bytes = sum(_local(p.grad).numel() * p.grad.element_size() for p in params if p.grad is not None)
    o_bytes = 0
    for state in par.local_optimizer().state.values():
        for value in state.values():
            if torch.is_tensor(value):
                o_bytes += _local(value).numel() * value.element_size()
    return {"params": p_bytes, "grads": g_bytes, "optimizer": o_bytes}
