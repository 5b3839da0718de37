"""Precision policies: autocast dtype, loss scaling, converted linears; each precision's
dtypes and choices are its record in scalelab.registries.precisions.

All precisions keep fp32 parameters, gradients and optimizer state (the PyTorch AMP
recipe); fp16 and bf16 run the forward/backward matmuls under autocast. fp16 needs
dynamic loss scaling; ShardedGradScaler all-reduces its inf/NaN check across ranks, so a
non-finite gradient on one rank (or in one shard) makes *every* rank skip the step
(:func:`sharded_grad_scaler`: its inf check shaped for the fused optimizer).

fp8 follows torchao's float8 training recipe: the transformer blocks' linear layers become
Float8Linear (dynamic tensorwise scaling, matmuls in float8 on the tensor cores), the rest
runs under bf16 autocast. It needs torchao and a GPU with FP8 tensor cores (compute
capability 8.9 or newer); anywhere else a run asking for it is skipped with the reason.
"""
from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import torch

from scalelab.registries.precisions import PRECISIONS
from scalelab.registries.precisions import precision as precision_record

AUTOCAST_DTYPE = {p.name: getattr(torch, p.autocast) if p.autocast else None for p in PRECISIONS.values()}
COMPUTE_DTYPE = {p.name: getattr(torch, p.compute) for p in PRECISIONS.values()}
FP8_MIN_CAPABILITY = (8, 9)  # Ada and Hopper: the first GPUs with FP8 tensor cores


class _KnownNoise(logging.Filter):
    """Drops, by exact message, torch's own deprecation notices that a run triggers through a
    library it uses and cannot fix here (torchao's float8 registers its enums with torch's pytree);
    anything else still shows."""

    MESSAGES = ("is an Enum subclass and is now natively supported by torch.compile as an opaque value type. "
                "Calling register_constant() on Enum subclasses is deprecated",)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(known in message for known in self.MESSAGES)


logging.getLogger("torch.utils._pytree").addFilter(_KnownNoise())


def autocast(precision: str, device: torch.device):
    dtype = AUTOCAST_DTYPE[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device, init_scale: float) -> torch.amp.GradScaler:
    """Dynamic loss scaler; a no-op (enabled=False) outside fp16.

    fp16: :func:`sharded_grad_scaler` at every stage, so one inf check spans the ranks (a
    non-finite gradient in one shard skips the step everywhere). Disabled, torch.amp's
    GradScaler (its base class) does exactly the same nothing without importing
    torch.distributed.fsdp (DTensor, sympy: about 1 s of a rank's start-up)."""
    if not precision_record(precision).loss_scaling:
        return torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=False)
    return sharded_grad_scaler(device, init_scale)


def _local_grad(param: torch.Tensor) -> torch.Tensor | None:
    grad = param.grad
    return grad.to_local() if grad is not None and hasattr(grad, "to_local") else grad


def sharded_grad_scaler(device: torch.device, init_scale: float) -> torch.amp.GradScaler:
    """torch's ShardedGradScaler, with its inf check shaped as fused optimizers need it.

    A fused AdamW (scalelab.run.parallel: fused on every device) takes the scaler's
    ``found_inf`` into its kernel (GradScaler.step's ``_step_supports_amp_scaling`` path), and
    torch's fused kernels (CUDA and CPU) need it to be
    - 0-dim: the CUDA kernel subtracts it from the 0-dim step counters in place.
      ShardedGradScaler.unscale_ makes it with shape [1] (pytorch/pytorch#140514): "output with
      shape [] doesn't match the broadcast shape [1]" on every fp16 GPU run, while torch 2.13's
      CPU kernel accepts it. Viewed as 0-dim before the per-device copies are made from it, it is
      what every later use (the all-reduce, the optimizer, update()) sees;
    - a flag, 0 or 1: the kernels skip the update only where ``found_inf == 1``.
      ShardedGradScaler all-reduces it with a sum, so a non-finite gradient seen by two ranks (an
      fp16 overflow in backward reaches every rank through the gradient reduction) reads 2, and
      the kernel applies the step: non-finite parameters (seen here on the CPU at stages 2 and 3).
      Clamped to 1 after the sum.
    And its scale update on the CPU is torch's own kernel (``torch._amp_update_scale_``), the one
    it runs on a GPU: ShardedGradScaler's CPU version reads found_inf on the host, which on a GPU
    would be a mid-step synchronisation, so the CPU suite would not see the GPU's step.
    tests/run/test_fused_contract.py checks all three on two ranks at every stage."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    class FusedReadyShardedGradScaler(ShardedGradScaler):
        def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16=True):
            # Each gradient as this rank holds it: tensor parallelism over one data-parallel rank leaves DTensor
            # gradients (the split linears') beside plain ones (the embeddings'), which one foreach kernel refuses
            # to mix; their local tensors are unscaled in place, and the flag is summed over all ranks as before.
            local = SimpleNamespace(param_groups=[{"params": [SimpleNamespace(grad=_local_grad(p)) for p in group["params"]]}
                                                  for group in optimizer.param_groups])
            return super()._unscale_grads_(local, inv_scale, found_inf.reshape(()), allow_fp16)

        def unscale_(self, optimizer):
            super().unscale_(optimizer)  # checks every rank's gradients, sums the flags over the ranks
            if self._enabled:
                for found_inf in self._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values():
                    found_inf.clamp_(max=1.0)

        def _amp_update_scale_cpu_(self, found_inf):
            torch._amp_update_scale_(self._scale, self._growth_tracker, found_inf, self._growth_factor,
                                     self._backoff_factor, self._growth_interval)

    return FusedReadyShardedGradScaler(device.type, init_scale=init_scale, enabled=True)


def fp8_unsupported_reason(device: torch.device, emulate: bool = False) -> str | None:
    if emulate:  # torchao's emulated float8 casts run anywhere: a check of the recipe, not of speed
        return _torchao_missing()
    if device.type != "cuda":
        return (f"fp8 needs a GPU with FP8 tensor cores (compute capability >= "
                f"{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]}); this run is on {device.type}")
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        return (f"fp8 needs compute capability >= {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]}; "
                f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}")
    return _torchao_missing()


def _torchao_missing() -> str | None:
    try:
        import torchao.float8  # noqa: F401
    except ImportError as err:
        return f"fp8 needs torchao (pip install torchao, or `pip install -e .[fp8]`): {err}"
    return None


def convert_to_fp8(model: torch.nn.Module, emulate: bool = False) -> int:
    """Swap the transformer blocks' nn.Linear layers for torchao's Float8Linear; returns how
    many. Float8 matmuls need both dimensions divisible by 16; the output head (tied to the
    embedding) and the embeddings stay in bf16."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    converted = []
    blocks = {id(block) for block in model.blocks}
    prefixes = tuple(f"{name}." for name, module in model.named_modules() if id(module) in blocks)

    def in_blocks(module: torch.nn.Module, fqn: str) -> bool:
        ok = (fqn.startswith(prefixes) and isinstance(module, torch.nn.Linear)
              and module.in_features % 16 == 0 and module.out_features % 16 == 0)
        if ok:
            converted.append(fqn)
        return ok

    convert_to_float8_training(model, module_filter_fn=in_blocks, config=Float8LinearConfig(emulate=emulate))
    return len(converted)


# The linear-layer recipes a precision record may name (its ``linears``): the converter, and
# why a device cannot run it (None if it can).
LINEAR_RECIPES = {"convert_to_fp8": (convert_to_fp8, fp8_unsupported_reason)}


def convert_linears(precision: str, model: torch.nn.Module, emulate: bool = False) -> int | None:
    """Convert the blocks' linears as the precision's record says (fp8: Float8Linear); how
    many, or None for a precision that keeps the model as built."""
    recipe = precision_record(precision).linears
    return LINEAR_RECIPES[recipe][0](model, emulate) if recipe else None


def unsupported_reason(precision: str, device: torch.device, fp8_emulate: bool = False) -> str | None:
    """Why this device cannot run this precision, or None if it can."""
    record = precision_record(precision)
    if record.linears:
        return LINEAR_RECIPES[record.linears][1](device, fp8_emulate)
    if device.type == "cuda" and record.compute == "bfloat16" and not torch.cuda.is_bf16_supported():
        return f"{precision} computes in bf16, which {torch.cuda.get_device_name(device)} does not support"
    try:
        a = torch.randn(8, 8, device=device)
        with autocast(precision, device):
            (a @ a).sum().item()
    except Exception as err:  # an autocast dtype this device/build lacks
        return f"{precision} autocast fails on {device.type}: {err}"
    return None
