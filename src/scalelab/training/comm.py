"""Count the data handed to collectives, by collective type.

Every strategy issues its collectives through ``torch.distributed`` Python functions
(DDP through its registered all-reduce hook, ZeRO-1 through ``broadcast``, FSDP2 through
``all_gather_single`` / ``reduce_scatter_single``), so wrapping those functions sees all
of them. Volumes use the ZeRO paper's unit (see scalelab.accounting): an all-reduce of S
elements counts 2S, an all-gather counts its output, a reduce-scatter its input, a
broadcast its tensor.
"""
from __future__ import annotations

import collections
import contextlib
import functools

import torch
import torch.distributed as dist

# function name -> (argument holding the counted tensor, position, volume factor)
_COUNTED = {
    "all_reduce": ("tensor", 0, 2),
    "broadcast": ("tensor", 0, 1),
    "all_gather_single": ("output_tensor", 0, 1),
    "all_gather_into_tensor": ("output_tensor", 0, 1),
    "reduce_scatter_single": ("input", 1, 1),
    "reduce_scatter_tensor": ("input", 1, 1),
}


class CommCounter:
    """Counts collective calls and bytes while ``enabled``."""

    def __init__(self):
        self.enabled = False
        self.calls = collections.Counter()
        self.bytes = collections.Counter()
        self._originals = {}

    def install(self) -> "CommCounter":
        for name, (kw, pos, factor) in _COUNTED.items():
            original = getattr(dist, name, None)
            if original is None:
                continue
            self._originals[name] = original
            setattr(dist, name, self._wrap(name, original, kw, pos, factor))
        return self

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals.clear()

    def _wrap(self, name, original, kw, pos, factor):
        @functools.wraps(original)
        def counted(*args, **kwargs):
            if self.enabled:
                tensor = kwargs.get(kw, args[pos] if len(args) > pos else None)
                if torch.is_tensor(tensor):
                    self.calls[name] += 1
                    self.bytes[name] += factor * tensor.numel() * tensor.element_size()
            return original(*args, **kwargs)

        return counted

    @contextlib.contextmanager
    def paused(self):
        """Leave the measurement's own collectives (loss logging) out of the count."""
        was, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = was
