"""Data-parallel strategies: one function per strategy, named by its record in
scalelab.registries.strategies (which says what each shards and communicates).

| stage | PyTorch                                                    |
| 0     | DistributedDataParallel + local AdamW (one rank: the model alone) |
| 1     | DDP + torch.distributed.optim.ZeroRedundancyOptimizer      |
| 2     | FSDP2 fully_shard(reshard_after_forward=False) per block   |
| 3     | FSDP2 fully_shard(reshard_after_forward=True) per block    |
| 3, replicas R > 1 | hybrid sharding (HSDP): the same over a 2-D mesh (R replicas x N/R shards) |
| 0, tensor parallel | the split model alone, or FSDP2's replicate per block over the data-parallel ranks |

Hybrid sharding builds torchtitan's mesh, ``init_device_mesh(..., (R, N/R),
mesh_dim_names=("dp_replicate", "dp_shard"))``, and hands it to ``fully_shard``, which shards
over the inner dimension (consecutive ranks: one node under torchrun's placement) and
all-reduces each reduced gradient shard over the outer one (across nodes).

Levers: ``bucket_mb`` sets DDP's gradient bucket size (stages 0, 1); ``cpu_offload`` gives
stage 3 FSDP2's CPUOffloadPolicy (sharded state in pinned host memory, optimizer step on
the CPU); ``compile`` is :func:`apply_compile`, applied before any of these wrappers.

Collective dtypes (scalelab.formulas.communication.comm_dtypes says which for a run): ``param_dtype`` and
``reduce_dtype`` of :func:`parallelize`. FSDP2 takes both as its MixedPrecisionPolicy
(torchtitan's bf16 recipe: param_dtype=bf16, reduce_dtype=fp32): the fp32 shards stay what the
optimizer steps, the unsharded parameters are gathered, used and freed in param_dtype, gradients
are reduce-scattered in reduce_dtype and land in fp32. Autocast still runs around the forward
(its casts of 16-bit weights are no-ops; LayerNorm and the loss still run in fp32), so the
ShardedGradScaler, activation checkpointing (recomputation gathers again, in param_dtype),
compile (the blocks are compiled before fully_shard wraps them; FSDP2's casts run in its hooks,
outside the graphs), LoRA (frozen weights are gathered in param_dtype too; gradients exist for A
and B only) and cpu_offload (the fp32 shards live on the host, the copy on the device is cast
before its all-gather) work unchanged. DDP (stages 0, 1) has no parameter gather; a 16-bit
``reduce_dtype`` registers torch's bf16_compress_hook / fp16_compress_hook in place of its
plain all-reduce hook (fp32 buckets cast down, all-reduced, decompressed in place).
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from scalelab.registries.strategies import DDP_BUCKET_MB, HYBRID, check_replicas, strategy
from scalelab.run.model import GPT


@dataclass
class Parallelized:
    """A model wrapped for a stage, its optimizer, and how to skip gradient sync."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    no_sync: Callable[[bool], contextlib.AbstractContextManager]
    """no_sync(is_last_micro_batch): context for one micro-batch's backward."""
    state_on_host: bool = False
    """Parameters, gradients and optimizer state live in host memory (CPU offload)."""
    tensor_parallel: int = 1
    """The tensor-parallel degree its blocks are split over (scalelab.run.tensor_parallel)."""
    throwaway_backward: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """Context for a forward and backward whose gradients are dropped (the compile warm-up):
    DDP's no_sync, so no all-reduce runs and DDP's reducer (its bucket rebuild after the first
    synchronised backward) is left as the first real step expects it. FSDP2 keeps its
    reduce-scatter: its no-sync mode accumulates unsharded gradients that dropping ``.grad``
    would not free."""

    pipeline_group: object = None
    """The pipeline-parallel group of this rank's stage (scalelab.run.pipeline): the gradient norm sums over it."""
    norm_excluded: frozenset = frozenset()
    """ids of parameters the gradient norm leaves out: a tied head's copy on the last pipeline stage (its gradient is
    the embedding's, counted on the first)."""

    def local_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer that holds this rank's state (ZeRO-1 wraps a local one)."""
        opt = self.optimizer
        optim = sys.modules.get("torch.distributed.optim")  # not imported: no ZeRO-1 optimizer exists
        return opt.optim if optim is not None and isinstance(opt, optim.ZeroRedundancyOptimizer) else opt


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (dim >= 2), not biases and norms; a tied weight appears once (parameters()
    yields each shared Parameter once). Under tensor parallelism each of the two is split by the
    mesh its parameters live on (none: plain tensors): a fused or foreach kernel takes a group's
    tensors at once and refuses DTensors beside plain tensors or another mesh's."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = []
    for decay in (True, False):
        by_mesh: dict[int, list] = {}
        for p in params:
            if (p.dim() >= 2) == decay:
                by_mesh.setdefault(id(getattr(p, "device_mesh", None)), []).append(p)
        groups += [{"params": members, "weight_decay": weight_decay if decay else 0.0}
                   for members in (list(by_mesh.values()) or [[]])]
    return groups


def _adamw_kwargs(lr: float, state_on_host: bool = False) -> dict:
    """Fused AdamW (one kernel for all parameters) on every device: torch has it on the CPU too,
    so CPU runs take the GPU's path, the loss scaler's hand-over into the kernel included
    (scalelab.run.precision.sharded_grad_scaler). Offloaded state steps on the host while
    the fp16 scaler's inf check stays on the device, which one fused kernel cannot take: foreach."""
    return {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-8, "fused": not state_on_host}


def _ddp(model: nn.Module, device: torch.device, bucket_mb: float, reduce_dtype: torch.dtype | None = None,
         group: dist.ProcessGroup | None = None) -> DDP:
    """DDP over ``group`` (the world; a pipeline stage's data-parallel ranks)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    # gradient_as_bucket_view: gradients live in the all-reduce buckets instead of beside
    # them, so DDP holds 4 bytes of gradient per parameter, not 8. An explicit bucket_cap_mb
    # caps the first bucket too (PyTorch's default alone starts with a 1 MiB bucket).
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
              gradient_as_bucket_view=True, bucket_cap_mb=bucket_mb, process_group=group)
    # The stock hooks, registered so DDP's all-reduce goes through torch.distributed.all_reduce,
    # where scalelab.run.comm counts it: the plain one (fp32 buckets), or the compression
    # hook of the reduce dtype (the grad_reduce lever at 'compute').
    hooks = {None: default_hooks.allreduce_hook, torch.float32: default_hooks.allreduce_hook,
             torch.bfloat16: default_hooks.bf16_compress_hook, torch.float16: default_hooks.fp16_compress_hook}
    hook = hooks[reduce_dtype]
    if hook is default_hooks.bf16_compress_hook and device.type == "cpu":
        # DDP refuses this hook by its name without CUDA and NCCL >= 2.10 (NCCL's bf16 sum); on a
        # CPU the all-reduce is gloo's, which sums bf16 (measured: tests/*/test_mixed_precision.py).
        # The same hook under another name; on a GPU the stock hook and DDP's check stay.
        def bf16_compress_hook_gloo(process_group, bucket):
            return default_hooks.bf16_compress_hook(process_group, bucket)

        hook = bf16_compress_hook_gloo
    ddp.register_comm_hook(group or dist.group.WORLD, hook)
    return ddp


def parallelize_ddp(model: GPT, device, lr, weight_decay, bucket_mb=DDP_BUCKET_MB, cpu_offload=False,
                    param_dtype=None, reduce_dtype=None) -> Parallelized:
    opt = torch.optim.AdamW(param_groups(model, weight_decay), **_adamw_kwargs(lr))
    if dist.get_world_size() == 1:
        # One rank: the model as a user trains it on one GPU, the baseline scaling is measured
        # against. DDP would only copy the gradients into its buckets and all-reduce them over
        # one rank (a 16-bit reduce dtype would even round them), for nothing.
        return Parallelized(model, opt, lambda last: contextlib.nullcontext())
    ddp = _ddp(model, device, bucket_mb, reduce_dtype)
    return Parallelized(ddp, opt, lambda last: contextlib.nullcontext() if last else ddp.no_sync(),
                        throwaway_backward=ddp.no_sync)


def parallelize_zero1(model: GPT, device, lr, weight_decay, bucket_mb=DDP_BUCKET_MB, cpu_offload=False,
                      param_dtype=None, reduce_dtype=None) -> Parallelized:
    ddp = _ddp(model, device, bucket_mb, reduce_dtype)
    opt = zero1_optimizer(model, lr, weight_decay)
    return Parallelized(ddp, opt, lambda last: contextlib.nullcontext() if last else ddp.no_sync(),
                        throwaway_backward=ddp.no_sync)


def zero1_optimizer(model: nn.Module, lr: float, weight_decay: float, group: dist.ProcessGroup | None = None):
    """ZeroRedundancyOptimizer (AdamW's state sharded over ``group``: the world, or a pipeline stage's data-parallel
    ranks). It takes one parameter group; the second is added after, so weight decay is handled as in the other
    stages."""
    # imported here, as FSDP2 below: torch.distributed.optim's __init__ imports FSDP, DTensor and
    # sympy, about 1 s of a rank's start-up on 2 cores, which a stage 0 run does not need
    from torch.distributed.optim import ZeroRedundancyOptimizer

    groups = param_groups(model, weight_decay)
    opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW, process_group=group,
                                  weight_decay=weight_decay, **_adamw_kwargs(lr))
    opt.add_param_group({"params": groups[1]["params"], "weight_decay": 0.0})
    return opt


def _parallelize_fsdp(model: GPT, device, lr, weight_decay, reshard_after_forward: bool,
                      cpu_offload: bool = False, param_dtype=None, reduce_dtype=None, replicas: int = 1,
                      mesh: DeviceMesh | None = None) -> Parallelized:
    # FSDP2 needs an explicit mesh on CPU; one dimension = plain data parallelism, two = hybrid
    # sharding (replicate x shard: FSDP2 shards over the last, replicates over the first); a tensor-parallel
    # model's data-parallel mesh where given.
    world_size = dist.get_world_size()
    if mesh is None and replicas == 1:
        mesh = init_device_mesh(device.type, (world_size,))
    elif mesh is None:
        shard = check_replicas(world_size, replicas)
        mesh = init_device_mesh(device.type, (replicas, shard), mesh_dim_names=HYBRID.mesh_dims)
    fsdp_wrap(model, mesh, reshard_after_forward, cpu_offload, param_dtype, reduce_dtype)
    opt = torch.optim.AdamW(param_groups(model, weight_decay), **_adamw_kwargs(lr, cpu_offload))

    def no_sync(last: bool):
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    return Parallelized(model, opt, no_sync, state_on_host=cpu_offload)


def fsdp_wrap(model: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool, cpu_offload: bool = False,
              param_dtype=None, reduce_dtype=None) -> None:
    """FSDP2 over ``mesh``: one all-gather/reduce-scatter group per block, and the root's."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    # None, None: FSDP2's default, everything in the parameters' own fp32. reduce_dtype is given
    # explicitly (fp32 by default): left None, FSDP2 would reduce in param_dtype.
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = list(model.blocks)
    for i, block in enumerate(blocks):  # one all-gather/reduce-scatter group per transformer block
        # torchtitan's recipe: the last block stays gathered after its forward (backward starts with it, and would
        # gather it straight back); the strategies' records say so (last_block_kept), and the formulas count it
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward and i < len(blocks) - 1,
                    offload_policy=offload, mp_policy=mp)
    # The root (embeddings, final norm, tied head) is resharded after forward as torchtitan does without pipeline
    # parallelism, and gathered again as backward starts: the formulas count that re-gather (2 Psi gathered).
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, offload_policy=offload, mp_policy=mp)
    assert isinstance(model, FSDPModule)


def parallelize_fsdp_keep(model, device, lr, weight_decay, bucket_mb=None, cpu_offload=False,
                          param_dtype=None, reduce_dtype=None) -> Parallelized:
    return _parallelize_fsdp(model, device, lr, weight_decay, reshard_after_forward=False,
                             param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def parallelize_fsdp_reshard(model, device, lr, weight_decay, bucket_mb=None, cpu_offload=False,
                             param_dtype=None, reduce_dtype=None) -> Parallelized:
    return _parallelize_fsdp(model, device, lr, weight_decay, reshard_after_forward=True, cpu_offload=cpu_offload,
                             param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def parallelize_hsdp(model, device, lr, weight_decay, bucket_mb=None, cpu_offload=False,
                     param_dtype=None, reduce_dtype=None, replicas: int = 2) -> Parallelized:
    return _parallelize_fsdp(model, device, lr, weight_decay, reshard_after_forward=True,
                             param_dtype=param_dtype, reduce_dtype=reduce_dtype, replicas=replicas)


def apply_compile(model: GPT) -> None:
    """torch.compile (inductor, fullgraph) each transformer block and the loss, as torchtitan
    does (its ``apply_compile`` and compiled loss): per block, because the blocks are alike
    (one graph serves them all) and the embeddings stay out; after activation checkpointing
    (set inside Block.forward, traced into the graph, so backward recomputes the compiled
    forward) and fp8 conversion (the Float8Linear layers are traced too), before DDP/FSDP2
    wrap the blocks, so their hooks stay outside the compiled code. ``fullgraph``: a graph
    break is an error, never a silent fall back to eager. Compilation itself happens at the
    first forward and backward (scalelab.run.worker.compile_warm_up runs one before the
    first step). The compiled blocks replace the blocks in ``model.blocks``
    (``blocks.0._orig_mod.…`` in state dicts; DCP's helpers drop the ``_orig_mod``)."""
    if isinstance(model.blocks, (nn.ModuleList, nn.ModuleDict)):  # a pipeline stage's StageBlocks: a ModuleDict
        for name, block in model.blocks.named_children():
            model.blocks.register_module(name, torch.compile(block, fullgraph=True))
    else:  # a user's module (scalelab.run.model.UserModel): each block replaced where it sits
        for i, block in enumerate(model.blocks):
            model.set_block(i, torch.compile(block, fullgraph=True))
    model.loss_fn = torch.compile(model.loss_fn, fullgraph=True)


def compiled_graphs() -> int:
    """Graphs TorchDynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def parallelize(model: GPT, zero_stage: int, device: torch.device, lr: float, weight_decay: float,
                bucket_mb: float | None = DDP_BUCKET_MB, cpu_offload: bool = False,
                param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
                replicas: int = 1, dp_mesh: DeviceMesh | None = None, tensor_parallel: int = 1) -> Parallelized:
    """Wrap the model as the stage's strategy record says (scalelab.registries.strategies). param_dtype: what
    FSDP2 gathers parameters in (None: their fp32; strategies that gather none ignore it);
    reduce_dtype: what gradients are reduced in (None: fp32); replicas > 1: hybrid sharding
    (stage 3). A model split by tensor parallelism (scalelab.run.tensor_parallel, ``tensor_parallel``
    ranks) is wrapped over its data-parallel mesh ``dp_mesh``: FSDP2 shards each rank's share over it;
    stage 0 with one data-parallel rank trains it as it is (scalelab.planning.sweep leaves the rest out).
    See the module doc."""
    record = strategy(zero_stage, replicas)
    if cpu_offload and not record.cpu_offload:
        raise ValueError(f"cpu_offload does not apply to {record.name} (zero_stage {zero_stage})")
    if tensor_parallel > 1:
        return _parallelize_split(model, zero_stage, device, lr, weight_decay, param_dtype, reduce_dtype, dp_mesh,
                                  tensor_parallel)
    wrap = globals()[record.wrapper]
    extra = {"replicas": replicas} if replicas != 1 else {}
    return wrap(model, device, lr, weight_decay, bucket_mb=bucket_mb, cpu_offload=cpu_offload,
                param_dtype=param_dtype, reduce_dtype=reduce_dtype, **extra)


def _parallelize_split(model, zero_stage, device, lr, weight_decay, param_dtype, reduce_dtype, dp_mesh: DeviceMesh,
                       tensor_parallel: int) -> Parallelized:
    """A tensor-parallel model's data parallelism (:func:`data_parallel_wrap`), its optimizer, its no_sync."""
    wrapped = data_parallel_wrap(model, zero_stage, param_dtype, reduce_dtype, dp_mesh)
    opt = torch.optim.AdamW(param_groups(model, weight_decay), **_adamw_kwargs(lr))
    if not wrapped:
        return Parallelized(model, opt, lambda last: contextlib.nullcontext(), tensor_parallel=tensor_parallel)

    def no_sync(last: bool):
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    return Parallelized(model, opt, no_sync, tensor_parallel=tensor_parallel)


def data_parallel_wrap(model: nn.Module, zero_stage: int, param_dtype, reduce_dtype, dp_mesh: DeviceMesh) -> bool:
    """Data parallelism over ``dp_mesh`` for a model split by tensor parallelism or a pipeline stage (whose
    data-parallel ranks are a sub-mesh): FSDP2 at stages 2 and 3; at stage 0 with one data-parallel rank, nothing;
    with several, torch's FSDP2-based ``replicate`` (torch.distributed._composable.replicate_with_fsdp: DDP takes no
    DTensor parameters, and torch's pipeline schedules drive FSDP2's gradient sync) per block and at the root, as
    fully_shard groups them: each block's gradients all-reduced over the data-parallel ranks in reduce_dtype as its
    backward ends, freed by the step (no buckets). Returns whether it wrapped the model."""
    if zero_stage in (2, 3):
        fsdp_wrap(model, dp_mesh, reshard_after_forward=zero_stage == 3, param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        return True
    if zero_stage != 0:
        raise ValueError(f"zero_stage {zero_stage} with tensor or pipeline parallelism is not run (scalelab.planning.sweep says why)")
    if dp_mesh.size() == 1:
        return False
    if torch.__version__ < (2, 10):  # torch 2.10 on: a one-dimensional mesh (torch 2.9's replicate takes a 2-D one)
        raise RuntimeError(f"stage 0 over a sub-mesh of {dp_mesh.size()} data-parallel ranks needs torch's "
                           f"FSDP2-based replicate of torch >= 2.10 (this is {torch.__version__}): use stage 2 or 3")
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in model.blocks:
        replicate(block, mesh=dp_mesh, mp_policy=mp)
    replicate(model, mesh=dp_mesh, mp_policy=mp)
    return True


def reduce_partial_grads(par: Parallelized) -> None:
    """Sum the gradients sequence parallelism leaves partial over the tensor-parallel ranks (the parameters its
    sharded tokens reach whole: the norms'; each rank's gradient covers its own tokens) into whole ones, one
    all-reduce each. FSDP2 (stages 2 and 3, and its replicate at stage 0) does this in its reduction already;
    a split model trained alone would step each rank's norms with its own share, and the replicas drift apart."""
    if par.tensor_parallel == 1:
        return
    for p in par.model.parameters():
        grad = p.grad
        if grad is not None and any(placement.is_partial() for placement in getattr(grad, "placements", ())):
            p.grad = grad.redistribute(grad.device_mesh, p.placements)


def clip_grad_norm(par: Parallelized, max_norm: float, comm_device: torch.device) -> torch.Tensor:
    """Clip the global gradient norm to max_norm; return the norm before clipping.

    torch's clip_grad_norm_ in every case but two, where it cannot reduce the norm: offloaded state
    (DTensors in host memory over a GPU mesh: NCCL cannot reduce them) and tensor parallelism (DTensors
    split over the tensor-parallel mesh beside plain replicated tensors, which torch's norm refuses to
    mix), and pipeline stages (each holds its own parameters). There the squares of each rank's parts are summed,
    all-reduced on comm_device over the mesh dimensions each part is split along (global_squares) and over the
    pipeline, and the parts scaled in place."""
    params = [p for p in par.model.parameters() if p.grad is not None]
    if not par.state_on_host and par.tensor_parallel == 1 and par.pipeline_group is None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    squares = global_squares([p.grad for p in params if id(p) not in par.norm_excluded], comm_device)
    if par.pipeline_group is not None:  # each stage's parameters are its own: their squares add up over the pipeline
        dist.distributed_c10d.all_reduce(squares, group=par.pipeline_group)
    norm = squares.sqrt()
    local = [local_shard(p.grad) for p in params]
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0).to(local[0].device)
    if coef.item() < 1.0:
        torch._foreach_mul_(local, coef)
    return norm


def global_squares(tensors: list[torch.Tensor], comm_device: torch.device) -> torch.Tensor:
    """The sum of squares over whole tensors that may be DTensors split along some dimensions of their
    mesh (each rank holds a part: its squares are all-reduced over those dimensions' groups) or plain
    and replicated (every rank holds the whole: counted once)."""
    parts: dict[tuple, list] = {}  # (mesh, the dims it is split along) -> [mesh, dims, squares]
    for t in tensors:
        squares = local_shard(t).detach().float().pow(2).sum()
        mesh = getattr(t, "device_mesh", None)
        dims = tuple(i for i, p in enumerate(getattr(t, "placements", ())) if not p.is_replicate())  # Shard, _StridedShard
        entry = parts.setdefault((id(mesh), dims), [mesh, dims, 0.0])
        entry[2] = entry[2] + squares
    total = torch.zeros((), device=comm_device)
    for mesh, dims, squares in parts.values():
        squares = torch.as_tensor(squares, dtype=torch.float32).to(comm_device)
        for dim in dims:  # c10d's own function: a scalar of the clipping, left out of the strategy's count (CommCounter)
            dist.distributed_c10d.all_reduce(squares, group=mesh.get_group(dim))
        total = total + squares
    return total


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local shard (tensor parallelism, FSDP2), a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def model_state_bytes(par: Parallelized) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank really holds."""
    params = list(par.model.parameters())  # a tied weight once
    p_bytes = sum(local_shard(p).numel() * p.element_size() for p in params)
    g_bytes = sum(local_shard(p.grad).numel() * p.grad.element_size() for p in params if p.grad is not None)
    o_bytes = 0
    for state in par.local_optimizer().state.values():
        for value in state.values():
            if torch.is_tensor(value):
                o_bytes += local_shard(value).numel() * value.element_size()
    return {"params": p_bytes, "grads": g_bytes, "optimizer": o_bytes}
