"""Peak memory of a rank within a training step: the model state, the gathered parameters and the
activations at the start of backward, or the model state at the optimizer step; whether the figure
models the step or bounds it, and whether it proves an OOM.
"""
from __future__ import annotations

from dataclasses import dataclass

from scalelab.config import ModelConfig
from scalelab.formulas import activation_memory, model_state
from scalelab.formulas.communication import comm_dtypes
from scalelab.formulas.flops import block_param_count
from scalelab.formulas.rank_step import RankStep
from scalelab.registries.families import family, tensor_parallel_split_params
from scalelab.registries.precisions import precision as precision_record
from scalelab.registries.strategies import check_replicas, strategy

MODELLED = "model"
"""PeakMemory.bound of a prediction that models what the step keeps (activation_bound)."""
UPPER_BOUND = "upper bound"
"""How PeakMemory.bound starts where the prediction may exceed what the step holds."""
LOWER_BOUND = "lower bound"
"""How PeakMemory.bound starts where the prediction leaves something out (a user's module's activations)."""
RECIPE = ("scalelab's own runs: fused attention (scaled_dot_product_attention: no a s^2 scores, an fp32 log-sum-exp), "
          "CUDA autocast's LayerNorm (an fp32 copy of a 16-bit input kept), no dropout, the eager fp32 cross-entropy "
          "(the fp32 log-softmax kept, 4 B T V, and 8 B T V of fp32 gradients beside it at its backward); at ZeRO-3, FSDP2's "
          "gathers of two blocks and the root group")
"""The activation recipe peak_memory assumes, in a line: what scalelab's runs measure. Other trainers' recipes are
conventions of their own (scalelab.formulas.megatron_style, foundry_style)."""


def activation_bound(cfg: ModelConfig, precision: str, compiled: bool = False, activation_checkpointing: bool = False,
                     device_type: str = "cuda", tensor_parallel: int = 1) -> str:
    """What kind of figure peak_memory's activations are for a run: ``"model"`` (MODELLED) where
    the formulas model what the step keeps (checked against saved-tensor hooks, or the compiled
    graph's partitioner), else ``"upper bound: <why>"`` or ``"lower bound: <why>"``:

    * ``upper bound``: fp8 without per-block checkpointing, eager or compiled, is predicted as bf16
      (the same run without Float8Linear), and keeps less: Float8Linear saves no 16-bit weight copies
      (eager, measured on the CPU), and compiled the partitioner recomputes its inputs' float8 casts
      (tests/*/test_compiled_memory.py; on an H200: the bf16 compiled figure is 11-12% above
      the fp8 compiled runs' peaks); the llama family's fp32 grouped-query attention compiled on a
      GPU (SDPA's math path traced into the graph: the eager figure);
    * ``lower bound``: a user's module (ModelConfig.module), whose activations are not predicted (0:
      model state and parameter gathers only).

    A predicted total above the device memory means a certain OOM only for a model or a lower
    bound (predicts_oom)."""
    if cfg.module:
        return f"{LOWER_BOUND}: a user's module has no activation formula (model state and parameter gathers only)"
    if activation_checkpointing:  # each block keeps its input only, whatever it computes in
        return MODELLED
    if precision_record(precision).linears:
        return (f"{UPPER_BOUND}: {precision} is predicted as {precision_record(precision).matmul_precision}"
                f"{' under torch.compile' if compiled else ''}; its float8 linears keep less "
                f"({'their float8 casts are recomputed in backward, ' if compiled else ''}no 16-bit weight copies)")
    if compiled and tensor_parallel > 1:
        return (f"{UPPER_BOUND}: compiled blocks under tensor parallelism are predicted as unsplit (their partition is "
                "not modelled; a rank keeps less)")
    if compiled and family(cfg.family).compiled_unmodelled(cfg, activation_memory.activation_case(precision, device_type=device_type,
                                                                                  compiled=True)):
        return (f"{UPPER_BOUND}: fp32 grouped-query attention on a GPU runs SDPA's math path, whose compiled "
                "partition is not modelled (the eager figure)")
    return MODELLED


@dataclass(frozen=True)
class PeakMemory:
    """Predicted peak memory of one rank within a training step, in bytes."""

    model_state: float
    """Model state at the start of backward: parameters + optimizer state (PyTorch convention), +
    gradients where they exist then (grads_at_peak: DDP's buckets, or gradient accumulation)."""
    transient_params: float
    """Parameters materialised unsharded during the step (FSDP2 all-gather buffers)."""
    activations: float
    """Activations of one micro-batch at the step's peak: the blocks' (Korthikanti et al.), what
    the step keeps outside them, and the loss path's largest transient (the logits in forward,
    or the fp32 gradients of the log-softmax in backward)."""
    bound: str = MODELLED
    """What kind of figure ``activations`` (and so ``total``) is: ``"model"``, or ``"upper bound: <why>"``
    / ``"lower bound: <why>"`` (activation_bound)."""
    at_rest: float = 0.0
    """Model state at rest, gradients included: what the optimizer step holds, after backward made
    every gradient."""

    @property
    def start_of_backward(self) -> float:
        """The model state then, the gathered parameters and the activations."""
        return self.model_state + self.transient_params + self.activations

    @property
    def at_optimizer_step(self) -> bool:
        """Whether the optimizer step is the peak: with few activations (checkpointed, a small
        micro-batch) the gradients made in backward outweigh them."""
        return self.at_rest > self.start_of_backward

    @property
    def total(self) -> float:
        """The larger of the two peaks of a step: the start of backward and the optimizer step (the
        model state at rest)."""
        return self.at_rest if self.at_optimizer_step else self.start_of_backward

    @property
    def exact(self) -> bool:
        """The prediction models the step (no bound)."""
        return self.bound == MODELLED

    @property
    def upper_bound(self) -> bool:
        """The step may hold less than predicted: a total above the device memory is no proof of an OOM."""
        return self.bound.startswith(UPPER_BOUND)


def predicts_oom(peak: PeakMemory, limit_bytes: float | None) -> bool:
    """Whether a prediction shows the step cannot fit ``limit_bytes`` (None: no limit known): its
    total exceeds the limit and is a model or a lower bound, never an upper bound alone."""
    return limit_bytes is not None and peak.total > limit_bytes and not peak.upper_bound


def grads_at_peak(zero_stage: int, world_size: int, accumulation_steps: int = 1, replicas: int = 1,
                  tensor_parallel: int = 1) -> bool:
    """Whether gradients exist at a step's peak, the start of the (last micro-batch's) backward:
    only where DDP's buckets hold them between steps, or where an earlier micro-batch of the step
    made them. Otherwise the optimizer's zero_grad(set_to_none=True) freed them (an H100, one rank
    without DDP: bf16 and fp32, eager and compiled, within 0.3% once counted so; with them, 4 bytes
    per parameter over)."""
    return strategy(zero_stage, replicas).ddp_wraps(world_size, tensor_parallel) or accumulation_steps > 1


def peak_memory(cfg: ModelConfig, n_params: float, step: RankStep, block_params: float | None = None) -> PeakMemory:
    """Predicted in-step peak per rank on the device: model state at rest (less the gradients where
    none exist at the start of backward: no DDP buckets and one micro-batch), plus what a step
    materialises; at least the model state at rest with its gradients (the optimizer step:
    PeakMemory.total). FSDP2 with accumulation keeps unsharded gradients between micro-batches
    (set_requires_gradient_sync(False)), which only their sharded 4 bytes per parameter count for:
    not modelled, an underestimate there.

    Stage 2 keeps every group's unsharded parameters from forward to backward: +b Psi, b = 4 bytes
    (fp32), 2 for fp16 and bf16, which FSDP2's MixedPrecisionPolicy gathers in their compute dtype
    (comm_dtypes); FSDP2 gathers into a buffer of its own, the whole group at any world size (an
    H200 at world size 1). Stage 3 gathers one block at a time (two in flight with
    prefetch), beside the root group (the parameters of no block, whose backward runs first): +b
    (2 blocks + the rest). Activations, at the start of backward, when every block's are still
    kept: block_activation_bytes (Korthikanti et al.), outside_block_activation_bytes (the
    fp32 log-softmax output, the final LayerNorm's and the head's inputs, ids) and the loss
    path's transient (LossPathBytes: 8 B T V, the two fp32 gradients at log_softmax's
    backward). Before the model returned the loss alone, the step also held the logits through backward (w B T V
    more) and the prediction counted 2 x 4 B T V in all. With cpu_offload (stage 3) the
    model state lives in host memory and only the gathered blocks occupy the device.
    block_params: one block's parameters where no formula gives them (a user's module, counted);
    such a model's activations are not predicted (0 here: model state and gathers only).
    Compiled (the compile lever): the blocks' and the loss's compiled models (block_activation_bytes,
    outside_block_activation_bytes, LossPathBytes: the loss's transient drops from 8 B T V to w B T V).
    ``bound`` says whether the figure models the step or bounds it (activation_bound).
    """
    zero_stage, world_size, replicas, t = step.zero_stage, step.data_parallel, step.replicas, step.tensor_parallel
    at_rest = model_state.model_state_bytes(n_params, zero_stage, world_size, step.precision, "pytorch", replicas)
    if block_params is None:  # a block of the family's formula; under tensor parallelism this rank's share of it
        block_params = block_param_count(cfg)
        if t > 1:
            block_params -= tensor_parallel_split_params(cfg) * (1 - 1 / t)
    check_replicas(world_size, replicas)  # a replica count the world size cannot take raises here
    state = (at_rest.total if grads_at_peak(zero_stage, world_size, step.accumulation_steps, replicas, t)
             else at_rest.total - at_rest.grads)
    gathered = comm_dtypes(step.precision, zero_stage).gather_bytes  # 2 for fp16/bf16 under FSDP2's MixedPrecisionPolicy
    outside_params = max(0.0, n_params - cfg.n_layers * block_params)  # embeddings, final norm, head: FSDP2's root group
    transient = strategy(zero_stage, replicas).transient_psi(n_params, block_params, outside_params, gathered)
    held = at_rest.total
    if step.cpu_offload:  # copied to the device, then gathered
        state, held, transient = 0.0, 0.0, gathered * (2 * block_params + outside_params)
    acts = 0.0 if cfg.module else step_activation_bytes(cfg, step)  # a user's module: model state and gathers only
    return PeakMemory(state, transient, acts, activation_bound(cfg, step.precision, step.compiled,
                                                               step.activation_checkpointing, step.device_type, t),
                      at_rest=held)


def step_activation_bytes(cfg: ModelConfig, step: RankStep) -> float:
    """One micro-batch's activations at the start of backward: the blocks', what the step keeps outside them, and the
    loss path's transient."""
    levers = step.activation_levers
    return (activation_memory.block_activation_bytes(cfg, step.micro_batch, step.precision,
                                                     step.activation_checkpointing, **levers)
            + activation_memory.outside_block_activation_bytes(cfg, step.micro_batch, step.precision,
                                                               step.accumulation_steps, **levers)
            + activation_memory.loss_path_bytes(cfg, step.micro_batch, step.precision, step.compiled).transient)
