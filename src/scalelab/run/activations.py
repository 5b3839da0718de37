"""Measured activation memory: the bytes autograd keeps for backward during one forward.

Works on every device (the CPU has no allocator statistics to read a peak from), so it is
the measured counterpart of Korthikanti et al.'s prediction everywhere; on GPU the run's
``peak_mem_allocated_bytes`` is measured as well.

What is counted: every distinct storage that a saved-tensor pack hook sees, plus the input of
each checkpointed transformer block (activation checkpointing keeps it for the recomputation, out of
our hooks' sight; without checkpointing the input counts only where an op saves it: a norm that
upcasts a 16-bit input saves the copy, and the input itself is freed once the block is done, its
address free for a later tensor that a count by address would then miss), plus what the model's forward
returns (outside the blocks: the training step holds it until its backward, so the logits
would count here if the forward returned them; it returns the loss alone). Parameter
storages are not activations and are left out. Under autocast the 16-bit copies of weights are saved too and
are counted (they occupy memory until backward). Inside a checkpointed block
``torch.utils.checkpoint``'s own hooks replace ours, so nothing it will recompute is counted:
exactly the memory checkpointing saves.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def _storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    if hasattr(t, "to_local"):  # DTensor: its local shard is what this rank holds
        t = t.to_local()
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. fake/meta)
        return None
    return storage.data_ptr(), storage.nbytes()


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in a forward's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


class SavedActivationMeter:
    """Context manager around one forward: ``inside_blocks`` and ``outside_blocks`` bytes.

    ``with SavedActivationMeter(model, model.blocks) as meter: loss = model(x, y)``
    """

    def __init__(self, model: nn.Module, blocks: list[nn.Module]):
        self.model, self.blocks = model, list(blocks)
        self.inside_blocks = 0
        self.outside_blocks = 0
        self._seen: set[int] = set()
        # Storages of parameters live right now: the model's (noted as its forward starts) and
        # the running block's. A block's set is dropped when it ends, because FSDP2 (stage 3)
        # frees its gathered parameters then and the allocator hands the addresses to activations.
        self._model_params: set[int] = set()
        self._block_params: set[int] = set()
        self._in_block = 0
        self._handles = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    @staticmethod
    def _param_ptrs(module: nn.Module) -> set[int]:
        # Called once the module's parameters are materialised (FSDP2 gathers them in its
        # own pre-forward hook, which runs before ours).
        return {key[0] for key in map(_storage_key, module.parameters()) if key}

    def _count(self, t: torch.Tensor) -> None:
        key = _storage_key(t)
        if key is None or key[0] in self._seen or key[0] in self._model_params or key[0] in self._block_params:
            return
        self._seen.add(key[0])
        if self._in_block:
            self.inside_blocks += key[1]
        else:
            self.outside_blocks += key[1]

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._count(t)
        return t

    def _block_pre(self, module, args):
        self._block_params = self._param_ptrs(module)
        self._in_block += 1
        if getattr(module, "activation_checkpointing", False):  # the recomputation's input, kept by checkpoint
            self._count(args[0])

    def _block_post(self, module, args, output):
        self._in_block -= 1
        self._block_params = set()

    def __enter__(self) -> "SavedActivationMeter":
        def note_model_params(module, args):
            self._model_params = self._param_ptrs(module)

        def count_returned(module, args, output):
            for t in _tensors(output):
                self._count(t)

        self._handles.append(self.model.register_forward_pre_hook(note_model_params))
        self._handles.append(self.model.register_forward_hook(count_returned))
        for block in self.blocks:
            self._handles.append(block.register_forward_pre_hook(self._block_pre))
            self._handles.append(block.register_forward_hook(self._block_post))
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
