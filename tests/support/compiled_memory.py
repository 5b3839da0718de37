"""What tests/*/test_compiled_memory.py share: the helpers tests of more than one tier use."""
from __future__ import annotations

import dataclasses

import torch

GIB = 2 ** 30


# ----------------------------------------------------------------------------- the partitioner's saved tensors
@dataclasses.dataclass
class Saved:
    bytes: int
    """Distinct storages the forward graph saves for backward, parameters left out."""
    tensors: list[tuple[str, tuple, str, int]]
    """(node, shape, dtype, storage bytes) of each one counted."""
    uncounted: list[str]
    """Generator states saved to replay a random op in the recomputation (a checkpointed block's
    SDPA, which may drop out: the CPU generator's 5 kB, 16 bytes of philox state on a GPU)."""

    def __str__(self) -> str:
        return "\n".join(f"  {name} {shape} {dtype} {size}" for name, shape, dtype, size in self.tensors)


def partitioner_backend(graphs: list[Saved]):
    """A torch.compile backend: inductor's decompositions and partition, the graphs run as traced;
    appends what each compiled forward saves to ``graphs``."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table
    from torch.multiprocessing.reductions import StorageWeakRef

    def partition(joint, joint_inputs, **kwargs):
        fw, bw = partition_fn(joint, joint_inputs, **kwargs)
        params = set(kwargs.get("static_lifetime_input_indices") or ())
        inputs = [n for n in fw.graph.nodes if n.op == "placeholder"]
        outputs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
        seen, counted, uncounted = set(), [], []
        for node in outputs[kwargs["num_fwd_outputs"]:]:
            value = node.meta.get("val")
            if not isinstance(value, torch.Tensor) or (node.op == "placeholder" and inputs.index(node) in params):
                continue
            parent = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else node
            if "rng_state" in str(parent.target):  # the generator's state, for a recomputed random op
                uncounted.append(node.name)
                continue
            storage = value.untyped_storage()
            if StorageWeakRef(storage).cdata not in seen:
                seen.add(StorageWeakRef(storage).cdata)
                counted.append((node.name, tuple(value.shape), str(value.dtype).removeprefix("torch."),
                                int(storage.nbytes())))
        graphs.append(Saved(sum(c[3] for c in counted), counted, uncounted))
        return fw, bw

    def boxed(gm, example_inputs):
        from functorch.compile import make_boxed_func

        return make_boxed_func(gm)

    return aot_autograd(fw_compiler=boxed, bw_compiler=boxed, partition_fn=partition,
                        decompositions=select_decomp_table())


def partitioned(fn, *args, autocast: torch.dtype | None = None) -> Saved:
    """What the compiled forward of ``fn(*args)`` saves for backward (one graph: fullgraph)."""
    torch._dynamo.reset()
    graphs: list[Saved] = []
    compiled = torch.compile(fn, backend=partitioner_backend(graphs), fullgraph=True)
    device = args[0].device.type
    with torch.autocast(device, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        compiled(*args)
    assert len(graphs) == 1
    return graphs[0]


# A precision as a compiled block sees it: (scalelab precision, zero_stage, autocast dtype, parameter dtype)
MODES = {"fp32": ("fp32", 0, None, torch.float32), "bf16": ("bf16", 0, torch.bfloat16, torch.float32),
         "fp16": ("fp16", 0, torch.float16, torch.float32),
         # stages 2 and 3: FSDP2's MixedPrecisionPolicy hands the block 16-bit parameters and inputs
         "bf16 stage 3": ("bf16", 3, torch.bfloat16, torch.bfloat16)}
