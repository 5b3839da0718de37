"""Data-parallel strategies: one function per strategy, named by its record in
scalelab.strategies (which says what each shards and communicates).

| stage | PyTorch                                                    |
| 0     | DistributedDataParallel + local AdamW                      |
| 1     | DDP + torch.distributed.optim.ZeroRedundancyOptimizer      |
| 2     | FSDP2 fully_shard(reshard_after_forward=False) per block   |
| 3     | FSDP2 fully_shard(reshard_after_forward=True) per block    |

Levers: ``bucket_mb`` sets DDP's gradient bucket size (stages 0, 1); ``cpu_offload`` gives
stage 3 FSDP2's CPUOffloadPolicy (sharded state in pinned host memory, optimizer step on
the CPU); ``compile`` is :func:`apply_compile`, applied before any of these wrappers.
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
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from scalelab.strategies import strategy
from scalelab.sweep import DDP_BUCKET_MB
from scalelab.training.model import GPT


@dataclass
class Parallelized:
    """A model wrapped for a stage, its optimizer, and how to skip gradient sync."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    no_sync: Callable[[bool], contextlib.AbstractContextManager]
    """no_sync(is_last_micro_batch): context for one micro-batch's backward."""
    state_on_host: bool = False
    """Parameters, gradients and optimizer state live in host memory (CPU offload)."""
    throwaway_backward: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """Context for a forward and backward whose gradients are dropped (the compile warm-up):
    DDP's no_sync, so no all-reduce runs and DDP's reducer (its bucket rebuild after the first
    synchronised backward) is left as the first real step expects it. FSDP2 keeps its
    reduce-scatter: its no-sync mode accumulates unsharded gradients that dropping ``.grad``
    would not free."""

    def local_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer that holds this rank's state (ZeRO-1 wraps a local one)."""
        opt = self.optimizer
        return opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (dim >= 2), not biases and norms; a tied weight appears once (parameters()
    yields each shared Parameter once)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def _adamw_kwargs(lr: float, device: torch.device, state_on_host: bool = False) -> dict:
    # Fused AdamW on GPU (one kernel for all parameters); foreach on CPU and for offloaded state.
    return {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-8, "fused": device.type == "cuda" and not state_on_host}


def _ddp(model: nn.Module, device: torch.device, bucket_mb: float) -> DDP:
    # gradient_as_bucket_view: gradients live in the all-reduce buckets instead of beside
    # them, so DDP holds 4 bytes of gradient per parameter, not 8. An explicit bucket_cap_mb
    # caps the first bucket too (PyTorch's default alone starts with a 1 MiB bucket).
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
              gradient_as_bucket_view=True, bucket_cap_mb=bucket_mb)
    # The stock all-reduce hook, registered so DDP's all-reduce goes through
    # torch.distributed.all_reduce, where scalelab.training.comm counts it.
    ddp.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    return ddp


def parallelize_ddp(model: GPT, device, lr, weight_decay, bucket_mb=DDP_BUCKET_MB, cpu_offload=False) -> Parallelized:
    ddp = _ddp(model, device, bucket_mb)
    opt = torch.optim.AdamW(param_groups(model, weight_decay), **_adamw_kwargs(lr, device))
    return Parallelized(ddp, opt, lambda last: contextlib.nullcontext() if last else ddp.no_sync(),
                        throwaway_backward=ddp.no_sync)


def parallelize_zero1(model: GPT, device, lr, weight_decay, bucket_mb=DDP_BUCKET_MB, cpu_offload=False) -> Parallelized:
    ddp = _ddp(model, device, bucket_mb)
    # ZeroRedundancyOptimizer takes one parameter group; the second is added after, so
    # weight decay is handled as in the other stages.
    groups = param_groups(model, weight_decay)
    opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW,
                                  weight_decay=weight_decay, **_adamw_kwargs(lr, device))
    opt.add_param_group({"params": groups[1]["params"], "weight_decay": 0.0})
    return Parallelized(ddp, opt, lambda last: contextlib.nullcontext() if last else ddp.no_sync(),
                        throwaway_backward=ddp.no_sync)


def _parallelize_fsdp(model: GPT, device, lr, weight_decay, reshard_after_forward: bool,
                      cpu_offload: bool = False) -> Parallelized:
    # FSDP2 needs an explicit mesh on CPU; one dimension = plain data parallelism.
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    for block in model.blocks:  # one all-gather/reduce-scatter group per transformer block
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, offload_policy=offload)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, offload_policy=offload)
    opt = torch.optim.AdamW(param_groups(model, weight_decay), **_adamw_kwargs(lr, device, cpu_offload))
    assert isinstance(model, FSDPModule)

    def no_sync(last: bool):
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    return Parallelized(model, opt, no_sync, state_on_host=cpu_offload)


def parallelize_fsdp_keep(model, device, lr, weight_decay, bucket_mb=None, cpu_offload=False) -> Parallelized:
    return _parallelize_fsdp(model, device, lr, weight_decay, reshard_after_forward=False)


def parallelize_fsdp_reshard(model, device, lr, weight_decay, bucket_mb=None, cpu_offload=False) -> Parallelized:
    return _parallelize_fsdp(model, device, lr, weight_decay, reshard_after_forward=True, cpu_offload=cpu_offload)


def apply_compile(model: GPT) -> None:
    """torch.compile (inductor, fullgraph) each transformer block and the loss, as torchtitan
    does (its ``apply_compile`` and compiled loss): per block, because the blocks are alike
    (one graph serves them all) and the embeddings stay out; after activation checkpointing
    (set inside Block.forward, traced into the graph, so backward recomputes the compiled
    forward) and fp8 conversion (the Float8Linear layers are traced too), before DDP/FSDP2
    wrap the blocks, so their hooks stay outside the compiled code. ``fullgraph``: a graph
    break is an error, never a silent fall back to eager. Compilation itself happens at the
    first forward and backward (scalelab.training.worker.compile_warm_up runs one before the
    first step). The compiled blocks replace the blocks in ``model.blocks``
    (``blocks.0._orig_mod.…`` in state dicts; DCP's helpers drop the ``_orig_mod``)."""
    for name, block in model.blocks.named_children():
        model.blocks.register_module(name, torch.compile(block, fullgraph=True))
    model.loss_fn = torch.compile(model.loss_fn, fullgraph=True)


def compiled_graphs() -> int:
    """Graphs TorchDynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def parallelize(model: GPT, zero_stage: int, device: torch.device, lr: float, weight_decay: float,
                bucket_mb: float | None = DDP_BUCKET_MB, cpu_offload: bool = False) -> Parallelized:
    """Wrap the model as the stage's strategy record says (scalelab.strategies)."""
    record = strategy(zero_stage)
    if cpu_offload and not record.cpu_offload:
        raise ValueError(f"cpu_offload does not apply to {record.name} (zero_stage {zero_stage})")
    wrap = globals()[record.wrapper]
    return wrap(model, device, lr, weight_decay, bucket_mb=bucket_mb, cpu_offload=cpu_offload)


def clip_grad_norm(par: Parallelized, max_norm: float, comm_device: torch.device) -> torch.Tensor:
    """Clip the global gradient norm to max_norm; return the norm before clipping.

    torch's clip_grad_norm_ in every case but offloaded state: there the gradients are
    DTensors in host memory over a GPU mesh, whose norm reduction NCCL cannot do. That path
    sums the squares of the local shards, all-reduces that one number on comm_device, and
    scales the shards in place."""
    params = [p for p in par.model.parameters() if p.grad is not None]
    if not par.state_on_host:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    grads = [_local(p.grad) for p in params]
    squares = torch.stack([g.detach().float().pow(2).sum() for g in grads]).sum().to(comm_device)
    if any(hasattr(p.grad, "to_local") for p in params):  # sharded: each rank holds a part
        dist.all_reduce(squares)
    norm = squares.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0).to(grads[0].device)
    if coef.item() < 1.0:
        torch._foreach_mul_(grads, coef)
    return norm


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def model_state_bytes(par: Parallelized) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank really holds."""
    params = list(par.model.parameters())  # a tied weight once
    p_bytes = sum(_local(p).numel() * p.element_size() for p in params)
    g_bytes = sum(_local(p.grad).numel() * p.grad.element_size() for p in params if p.grad is not None)
    o_bytes = 0
    for state in par.local_optimizer().state.values():
        for value in state.values():
            if torch.is_tensor(value):
                o_bytes += _local(value).numel() * value.element_size()
    return {"params": p_bytes, "grads": g_bytes, "optimizer": o_bytes}
