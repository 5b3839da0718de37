"""LoRA's formulas: the adapted linears, their trainable parameters, and the model state and
communication of a run that trains them alone.

LoRA (Hu et al. 2021) freezes the weights W0 and trains a low-rank update B A on chosen
linear layers, each family's (scalelab.registries.families: GPT-2 every block's attention qkv and proj
and MLP fc and proj, the common choice; llama the four attention and three SwiGLU projections).
A linear d_in -> d_out gains r (d_in + d_out) trainable parameters.
"""
from __future__ import annotations

from scalelab.config import ModelConfig
from scalelab.formulas.flops import formula_family
from scalelab.formulas.model_state import ModelStateBytes, model_state_bytes
from scalelab.registries.precisions import precision as precision_record
from scalelab.registries.strategies import check_replicas, strategy


def lora_targets(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """The adapted linears of a block by name, with their (d_in, d_out)."""
    return formula_family(cfg, "LoRA").lora_targets(cfg)


def lora_trainable_params(cfg: ModelConfig, rank: int) -> int:
    """Trainable LoRA parameters: rank x (d_in + d_out) per adapted linear, every block."""
    per_block = sum(d_in + d_out for d_in, d_out in lora_targets(cfg).values())
    return cfg.n_layers * rank * per_block


def lora_model_state_bytes(n_frozen: int, n_trainable: int, zero_stage: int, world_size: int, precision: str,
                           convention: str = "pytorch", replicas: int = 1) -> ModelStateBytes:
    """Model state per rank at rest with LoRA: the frozen weights (fp32 in PyTorch's AMP; 2
    bytes in the paper's mixed precision), sharded as the strategy shards parameters, and no
    gradient or optimizer state for them; the trainable A and B carry the full 16 bytes per
    parameter (PyTorch: fp32 weight, grad, AdamW m and v)."""
    frozen_bytes = 4 if convention == "pytorch" else precision_record(precision).paper_state_bytes[0]
    shards = strategy(zero_stage).shards if convention == "pytorch" else strategy(zero_stage).shards_paper
    frozen = frozen_bytes * float(n_frozen) / (check_replicas(world_size, replicas) if shards[0] else 1)
    trainable = model_state_bytes(n_trainable, zero_stage, world_size, precision, convention, replicas)
    return ModelStateBytes(frozen + trainable.params, trainable.grads, trainable.optimizer)


def lora_comm_elements_per_step(n_frozen: int, n_trainable: int, zero_stage: int, world_size: int,
                                accumulation_steps: int = 1, convention: str = "pytorch", replicas: int = 1) -> float:
    """Elements handed to collectives per step with LoRA (scalelab.formulas.communication's unit).

    Only the trainable parameters have gradients, so every gradient collective (all-reduce,
    reduce-scatter) and every update of sharded optimizer state (ZeroRedundancyOptimizer's
    broadcast) moves T = n_trainable elements where full training moves Psi. A strategy that
    shards the parameters themselves (FSDP2, the paper's stage 3) all-gathers every
    parameter, frozen or not, before using it: those gathers stay at Psi_all = n_frozen +
    n_trainable. So, of the strategy's comm_psi(k) Psi, one Psi (the gradient reduce-scatter)
    becomes T and the rest (the gathers) Psi_all:

    * PyTorch: stage 0: 2 T; 1: 3 T; 2: k Psi_all + T; 3: 2k Psi_all + T (0 at world size 1).
    * paper: stages 0-2: 2 T; stage 3: 2 Psi_all + T.
    * hybrid sharding (``replicas`` R > 1) adds its all-reduce across replicas, 2 T / S.
    """
    record = strategy(zero_stage, replicas)
    shard = check_replicas(world_size, replicas)
    n_all, t = float(n_frozen + n_trainable), float(n_trainable)
    across = record.replicate_psi * t / shard if replicas > 1 else 0.0
    if convention == "paper":
        total, gathers_params = record.comm_psi_paper, record.shards_paper[0]
    elif convention == "pytorch":
        if record.silent_at_world_size_1 and shard == 1:
            return across
        total, gathers_params = record.comm_psi(accumulation_steps), record.shards[0]
    else:
        raise ValueError(f"unknown convention {convention!r}: 'pytorch' or 'paper'")
    return ((total - 1) * n_all + t if gathers_params else total * t) + across
