"""Model state per rank: the parameters, gradients and optimizer state a rank holds at rest, by
strategy and precision, and the largest model whose state fits a device.

One source of truth: training runs take their *predicted* columns from here.

Memory conventions (bytes per parameter, Psi = parameter count, N = world size):

* ``paper`` - the ZeRO paper (Rajbhandari et al. 2020), mixed-precision Adam:
  2 Psi fp16 parameters + 2 Psi fp16 gradients + K Psi optimizer state, K = 12
  (fp32 master weights, momentum, variance). For fp32 training: 4 + 4 + 8.
  stage 0: (2+2+K) Psi; 1: (2+2) Psi + K Psi/N; 2: 2 Psi + (2+K) Psi/N; 3: (2+2+K) Psi/N.
* ``pytorch`` - what this project's strategies really hold *at rest* (after the
  optimizer step). Autocast keeps fp32 parameters and fp32 gradients in every precision,
  and AdamW keeps two fp32 moments: 4 + 4 + 8 = 16 bytes per parameter.
  stage 0 (DDP): 16 Psi; 1 (DDP + ZeroRedundancyOptimizer): 8 Psi + 8 Psi/N;
  2 and 3 (FSDP2): 16 Psi/N. FSDP2's stage 2 reshards parameters after backward, so at
  rest it holds what stage 3 holds; the stages differ within a step (stage 2 keeps the
  unsharded parameters from forward to backward).
  The same 16 bytes in every precision and with either grad_reduce value: FSDP2's
  MixedPrecisionPolicy (fp16, bf16 at stages 2 and 3) keeps the sharded fp32 parameters the
  optimizer steps, frees the 16-bit unsharded copies after use and casts reduced gradients
  back to fp32; DDP's compression hooks decompress into the fp32 buckets.
"""
from __future__ import annotations

from dataclasses import dataclass

from scalelab.registries.precisions import precision as precision_record
from scalelab.registries.strategies import check_replicas, strategy


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes per rank of model state, split by kind."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def model_state_bytes(n_params: int, zero_stage: int, world_size: int, precision: str,
                      convention: str = "pytorch", replicas: int = 1) -> ModelStateBytes:
    """Model-state bytes per rank (the largest rank of an even split) at rest. ``replicas`` > 1:
    hybrid sharding (stage 3), whose sharded kinds are divided over a shard group of N/R ranks."""
    record = strategy(zero_stage, replicas)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    psi, n = float(n_params), check_replicas(world_size, replicas)
    if convention == "pytorch":
        kinds, shards = (4 * psi, 4 * psi, 8 * psi), record.shards  # fp32 params, fp32 grads, AdamW m and v
    elif convention == "paper":
        # fp32 training: 4 + 4 + 8; mixed precision: fp16 params and grads, K = 12 (fp32 master + m + v)
        kinds = tuple(b * psi for b in precision_record(precision).paper_state_bytes)
        shards = record.shards_paper
    else:
        raise ValueError(f"unknown convention {convention!r}: 'pytorch' or 'paper'")
    return ModelStateBytes(*(b / n if sharded else b for b, sharded in zip(kinds, shards, strict=True)))

def bytes_per_param_per_rank(zero_stage: int, world_size: int, precision: str, convention: str) -> float:
    """Model-state bytes per rank per parameter: the slope of model_state_bytes in Psi."""
    return model_state_bytes(1, zero_stage, world_size, precision, convention).total


def largest_model(device_bytes: float, zero_stage: int, world_size: int, precision: str, convention: str) -> float:
    """Most parameters whose model state fits device_bytes per rank (activations excluded)."""
    if device_bytes <= 0:
        raise ValueError(f"device memory must be positive, got {device_bytes}")
    return device_bytes / bytes_per_param_per_rank(zero_stage, world_size, precision, convention)
