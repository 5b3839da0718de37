"""Tensor parallelism (Megatron-LM's, on torch's DTensor): each block's linears split over a
tensor-parallel mesh of T ranks as the family record's plan says (scalelab.registries.families,
``Family.tensor_parallel``), everything else replicated.

A colwise linear keeps 1/T of its output features (its weight's rows and its bias); the rowwise linear
after it keeps 1/T of its input features (its weight's columns) and all-reduces the partial outputs
over the mesh: one all-reduce after attention and one after the MLP in forward, and one before each
(the colwise inputs' gradients: once per module where several colwise linears share an input, as
attention's q, k, v do) in backward, of B T d values each. The embeddings, the norms, a
rowwise bias and the head stay whole on every rank; without sequence parallelism their gradients are the
same on every rank, for their inputs are (Megatron's f and g operators, torch's ColwiseParallel and
RowwiseParallel).

GPT-2's fused ``qkv`` ("colwise by head"): its 3d output rows are q, k, v one after the other, so a
plain split would hand rank 0 all of q. :func:`apply_tensor_parallel` reorders them first, by head, so
that rank r's contiguous share is its heads' q, then k, then v (the attention views heads by their
width: a rank attends over its own heads), and :func:`full_state` puts them back in the model's order,
so that a tensor-parallel run's parameters compare byte for byte with any other run's.

Sequence parallelism (Megatron's, ``sequence_parallel=True``; torchtitan's styles): between the
linears each rank holds 1/T of the tokens (the residual stream and the norms, ``Family.norms``, on
a (B, T/T', d) share). Before a module's colwise linears the norm's output is all-gathered over the
sequence; after a rowwise linear the partial outputs are reduce-scattered over it instead of
all-reduced (the same volume, the two halves of an all-reduce). The replicated embeddings hand the
first block its share (a slice; in backward the input gradient is all-gathered back), and the final
norm's output is all-gathered for the replicated head. The norms' parameters meet each rank's tokens only,
so their gradients are partial sums over the mesh: FSDP2 sums them in its reduction, and where none runs
scalelab.run.parallel.reduce_partial_grads does after backward. (A rowwise bias is added before the
reduce-scatter, to the whole partial output: its gradient is whole.)
"""
from __future__ import annotations

import inspect
import re

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module

from scalelab.planning.run_plan import tensor_parallel_problem
from scalelab.registries.families import family

STYLES = {"colwise": ColwiseParallel, "colwise by head": ColwiseParallel, "rowwise": RowwiseParallel}
TOKENS = Shard(1)
"""A sequence-parallel activation's placement: (B, T, d) split over its tokens."""


def head_major_rows(d_model: int, degree: int) -> torch.Tensor:
    """The permutation of a fused q, k, v projection's 3 d output rows that makes rank r's contiguous
    share (rows r 3d/T .. (r+1) 3d/T) its heads' q rows, then k, then v."""
    share = d_model // degree
    return torch.cat([torch.arange(part * d_model + r * share, part * d_model + (r + 1) * share)
                      for r in range(degree) for part in range(3)])


def plan_of(model: nn.Module) -> dict[str, str]:
    """The family's plan (scalelab.registries.families); a model without one cannot be split."""
    model = getattr(model, "module", model)  # DDP's wrapper
    cfg = getattr(model, "cfg", None)
    plan = family(cfg.family).tensor_parallel if cfg is not None and not cfg.module else {}
    if not plan:
        raise ValueError(f"tensor parallelism needs a family's plan; {type(model).__name__} has none "
                         "(a user's own module is not split)")
    return plan


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh, sequence_parallel: bool = False) -> nn.Module:
    """Split every block's linears over ``mesh`` (1-D: the tensor-parallel ranks) in place; with
    ``sequence_parallel`` the norms and the residual stream over the tokens as well (the module doc)."""
    plan, norms = plan_of(model), family(model.cfg.family).norms
    parents = _colwise_parents(plan)
    degree = mesh.size()
    tensor_parallel_problem(model.cfg, degree, sequence_parallel)  # the planner's check (ConfigError), should a caller not have planned
    for block in model.blocks:
        for path, how in plan.items():
            if how == "colwise by head":
                linear = block.get_submodule(path)
                rows = head_major_rows(model.cfg.d_model, degree)
                with torch.no_grad():
                    linear.weight.copy_(linear.weight[rows])
                    if linear.bias is not None:
                        linear.bias.copy_(linear.bias[rows])
        styles = {path: _style(path, how, parents, sequence_parallel) for path, how in plan.items()}
        for parent in parents:
            styles[parent] = _shared_input(block.get_submodule(parent), sequence_parallel)
        if sequence_parallel:
            styles.update({norm: SequenceParallel() for norm in norms[:-1]})
        parallelize_module(block, mesh, styles)
    if sequence_parallel:
        parallelize_module(model, mesh, {
            "blocks.0": _first_input(model.blocks[0], Replicate(), TOKENS),  # the embeddings' output: this rank's tokens
            norms[-1]: SequenceParallel(),
            "head": PrepareModuleInput(input_layouts=(TOKENS,), desired_input_layouts=(Replicate(),), use_local_output=True)})
    return model


def _style(path: str, how: str, shared_parents: list[str], sequence_parallel: bool):
    """A planned linear's style: under sequence parallelism a colwise linear gathers its input's tokens
    (unless its module gathered them once for all its colwise linears) and a rowwise one scatters them."""
    if not sequence_parallel:
        return STYLES[how]()
    if how == "rowwise":
        return RowwiseParallel(output_layouts=TOKENS)
    shared = "." in path and path.rsplit(".", 1)[0] in shared_parents
    return ColwiseParallel() if shared else ColwiseParallel(input_layouts=TOKENS)


def _colwise_parents(plan: dict[str, str]) -> list[str]:
    """The modules whose colwise linears share one input (attention's q, k, v; SwiGLU's gate and up)."""
    parents = [path.rsplit(".", 1)[0] for path, how in plan.items() if how.startswith("colwise") and "." in path]
    return [p for p in dict.fromkeys(parents) if parents.count(p) > 1]


def _shared_input(module: nn.Module, sequence_parallel: bool = False) -> PrepareModuleInput:
    """The module's first input as one replicated DTensor for all its colwise linears: in backward their
    input gradients add up on it and are all-reduced once (torchtitan's PrepareModuleInput), not once per
    linear; under sequence parallelism it arrives as this rank's tokens and is all-gathered once."""
    return _first_input(module, TOKENS if sequence_parallel else Replicate(), Replicate(), use_local_output=False)


def _first_input(module: nn.Module, layout, desired, use_local_output: bool = True) -> PrepareModuleInput:
    """A module's first input from ``layout`` to ``desired``; its other inputs (RoPE's tables) pass as they are."""
    n_inputs = len([p for p in inspect.signature(module.forward).parameters.values()
                    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)])
    rest = (None,) * (n_inputs - 1)
    return PrepareModuleInput(input_layouts=(layout,) + rest, desired_input_layouts=(desired,) + rest,
                              use_local_output=use_local_output)


def full_state(model: nn.Module, degree: int) -> dict[str, torch.Tensor]:
    """The model's whole parameters in its own layout (DTensors gathered, a fused q, k, v projection's
    rows put back in q, k, v order), on the CPU: what a run of any strategy saves."""
    state = {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()
             for name, t in model.state_dict().items()}
    if degree > 1:
        inverse = torch.argsort(head_major_rows(model.cfg.d_model, degree))
        fused = [path for path, how in plan_of(model).items() if how == "colwise by head"]
        for key in state:
            # blocks.<i>.[_orig_mod.]<path>.<weight|bias>: a compiled block's parameters sit under _orig_mod
            plain = key.replace("_orig_mod.", "")
            if any(re.fullmatch(rf"blocks\.\d+\.{re.escape(path)}\.(weight|bias)", plain) for path in fused):
                state[key] = state[key][inverse]
    return state
