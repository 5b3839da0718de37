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

import weakref

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


def param_storages(module: nn.Module) -> set[int]:
    """The storage addresses of a module's parameters as they are now: called once they are materialised (FSDP2
    gathers them in its own pre-forward hook, which runs before ours)."""
    return {key[0] for key in map(_storage_key, module.parameters()) if key}


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in a forward's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


class _SavedTensorScope:
    """What both meters share: module hooks and saved-tensor hooks that hold for the ``with`` block alone.
    Subclasses set ``_hooks`` (torch.autograd.graph.saved_tensors_hooks) and add their module hooks with ``_hook``."""

    def __init__(self):
        self._handles = []

    def _hook(self, *handles) -> None:
        self._handles += handles

    def _enter(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class SavedActivationMeter(_SavedTensorScope):
    """Context manager around one forward: ``inside_blocks`` and ``outside_blocks`` bytes.

    ``with SavedActivationMeter(model, model.blocks) as meter: loss = model(x, y)``
    """

    def __init__(self, model: nn.Module, blocks: list[nn.Module]):
        super().__init__()
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
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

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
        self._block_params = param_storages(module)
        self._in_block += 1
        if getattr(module, "activation_checkpointing", False):  # the recomputation's input, kept by checkpoint
            self._count(args[0])

    def _block_post(self, module, args, output):
        self._in_block -= 1
        self._block_params = set()

    def __enter__(self) -> "SavedActivationMeter":
        def note_model_params(module, args):
            self._model_params = param_storages(module)

        def count_returned(module, args, output):
            for t in _tensors(output):
                self._count(t)

        self._hook(self.model.register_forward_pre_hook(note_model_params), self.model.register_forward_hook(count_returned))
        for block in self.blocks:
            self._hook(block.register_forward_pre_hook(self._block_pre), block.register_forward_hook(self._block_post))
        return self._enter()


class LiveSavedBytes(_SavedTensorScope):
    """Context manager around a pipeline's step: ``peak``, the most bytes the blocks' saved tensors hold at once
    (a storage counts while autograd keeps any tensor of it for backward, once however many keep it; released as
    autograd frees them), where SavedActivationMeter counts one forward's; parameters left out (the running block's,
    as SavedActivationMeter leaves them out)."""

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = list(blocks)
        self.now = self.peak = 0
        self._live: dict[int, list[int]] = {}  # storage address -> [holders, bytes]
        self._params: set[int] = set()
        self._inside = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _block_enter(self, block, args):
        self._inside += 1
        self._params = param_storages(block)

    def _block_leave(self, block, args, out):
        self._inside -= 1

    def _pack(self, t: torch.Tensor):
        key = None if not self._inside or isinstance(t, nn.Parameter) else _storage_key(t)
        if key is None or key[0] in self._params:
            return t
        entry = self._live.setdefault(key[0], [0, key[1]])
        if entry[0] == 0:
            self.now += entry[1]
            self.peak = max(self.peak, self.now)
        entry[0] += 1
        holder = _Held(t)
        weakref.finalize(holder, self._release, key[0])
        return holder

    @staticmethod
    def _unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def _release(self, ptr: int) -> None:
        entry = self._live[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self._live[ptr]

    def __enter__(self) -> "LiveSavedBytes":
        for block in self.blocks:
            self._hook(block.register_forward_pre_hook(self._block_enter), block.register_forward_hook(self._block_leave))
        return self._enter()


class _Held:
    """What autograd keeps in a saved tensor's place: the tensor, and a weak reference's hook for its release."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor
