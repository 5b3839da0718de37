"""Count the data handed to collectives, by collective type and by process group.

Every strategy issues its collectives through ``torch.distributed`` Python functions
(DDP through its registered all-reduce hook, ZeRO-1 through ``broadcast``, FSDP2 through
``all_gather_single`` / ``reduce_scatter_single``), so wrapping those functions sees all
of them. Volumes use the ZeRO paper's unit (see scalelab.formulas.communication): an all-reduce of S
elements counts 2S, an all-gather counts its output, a reduce-scatter its input, a
broadcast its tensor.

Each call is also counted under its process group's global ranks (``group=`` or its position;
none = the world), so a run can say which bytes crossed nodes: scalelab.planning.placement.link_of
classifies a group from the hosts its ranks ran on (a group spanning nodes is inter-node).
Hybrid sharding's shard group, its replicate group and the world are told apart this way.
"""
from __future__ import annotations

import collections
import contextlib
import functools

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

# function name -> (argument holding the counted tensor, position, volume factor, position of group=)
_COUNTED = {
    "all_reduce": ("tensor", 0, 2, 2),
    "broadcast": ("tensor", 0, 1, 2),
    "all_gather_single": ("output_tensor", 0, 1, 2),
    "all_gather_into_tensor": ("output_tensor", 0, 1, 2),
    "reduce_scatter_single": ("input", 1, 1, 3),
    "reduce_scatter_tensor": ("input", 1, 1, 3),
}


class CommCounter:
    """Counts collective calls and bytes while ``enabled``."""

    def __init__(self):
        self.enabled = False
        self.calls = collections.Counter()
        self.bytes = collections.Counter()
        self.group_bytes = collections.Counter()
        """(collective, the group's global ranks) -> bytes."""
        self._originals = {}
        self._ranks = {}  # id(group) -> its global ranks (groups live as long as the run)

    def install(self) -> "CommCounter":
        for name, (kw, pos, factor, group_pos) in _COUNTED.items():
            original = getattr(dist, name, None)
            if original is None:
                continue
            self._originals[name] = original
            setattr(dist, name, self._wrap(name, original, kw, pos, factor, group_pos))
        return self

    def _group_ranks(self, group) -> tuple[int, ...]:
        group = group or dist.group.WORLD
        if id(group) not in self._ranks:
            self._ranks[id(group)] = tuple(dist.get_process_group_ranks(group))
        return self._ranks[id(group)]

    def by_group(self) -> list[dict]:
        """The counted bytes per (collective, group): JSON-ready records."""
        return [{"collective": name, "ranks": list(ranks), "bytes": nbytes}
                for (name, ranks), nbytes in sorted(self.group_bytes.items())]

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals.clear()

    def _wrap(self, name, original, kw, pos, factor, group_pos):
        @functools.wraps(original)
        def counted(*args, **kwargs):
            if self.enabled:
                tensor = kwargs.get(kw, args[pos] if len(args) > pos else None)
                if torch.is_tensor(tensor):
                    nbytes = factor * tensor.numel() * tensor.element_size()
                    self.calls[name] += 1
                    self.bytes[name] += nbytes
                    group = kwargs.get("group", args[group_pos] if len(args) > group_pos else None)
                    self.group_bytes[name, self._group_ranks(group)] += nbytes
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


class FunctionalCollectiveCounter(TorchDispatchMode):
    """Counts torch's functional collectives, the ones DTensor issues (tensor parallelism's all-reduces),
    which call no torch.distributed function CommCounter wraps: by (collective, the group's global ranks),
    in CommCounter's unit. A dispatch mode sees every operator: the worker runs it over warm-up steps only."""

    # op name -> (volume factor, position of the group's name among the op's arguments)
    OPS = {"all_reduce": (2, 2), "all_reduce_": (2, 2), "all_gather_into_tensor": (None, 2),
           "reduce_scatter_tensor": (1, 3), "all_to_all_single": (1, 3)}

    def __init__(self):
        super().__init__()
        self.group_bytes = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name.startswith("_c10d_functional::") and name.split("::")[1] in self.OPS:
            op = name.split("::")[1]
            factor, group_pos = self.OPS[op]
            tensor = args[0]
            nbytes = tensor.numel() * tensor.element_size()
            nbytes *= args[1] if factor is None else factor  # an all-gather counts its output: input x group size
            from torch.distributed.distributed_c10d import _resolve_process_group

            ranks = tuple(dist.get_process_group_ranks(_resolve_process_group(args[group_pos])))
            self.group_bytes[op.rstrip("_"), ranks] += nbytes
        return func(*args, **kwargs)


def bytes_by_link(by_group: list[dict], rank_hosts: list[str]) -> dict[str, dict[str, float]]:
    """Counted bytes (CommCounter.by_group's records) by link and collective, each group's link
    from the hosts its ranks ran on (``rank_hosts[r]``: rank r's host; scalelab.planning.placement.link_of)."""
    from scalelab.registries.topology import LINKS, link_of

    out: dict[str, dict[str, float]] = {link: {} for link in LINKS}
    for record in by_group:
        by_type = out[link_of(record["ranks"], rank_hosts)]
        by_type[record["collective"]] = by_type.get(record["collective"], 0) + record["bytes"]
    return out
