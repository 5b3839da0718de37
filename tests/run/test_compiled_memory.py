"""Issue #40: memory of compiled runs (the compile lever: each block and the loss under torch.compile).

What a compiled graph keeps for backward is what AOTAutograd's min-cut partitioner saves from its
forward graph, not what eager autograd's ops save. ``partitioned`` compiles a function with a backend
built from AOTAutograd and inductor's own partition function (its joint-graph passes, then
``min_cut_rematerialization_partition``), with inductor's decompositions, and reads the forward
graph's saved outputs: their fake values' storages, less the parameters (static-lifetime inputs).
No code is generated, so it takes about a second and starts no process; the run-tier test checks
that real inductor, through scalelab's own ``apply_compile``, keeps the same.
"""
from __future__ import annotations

import pytest
import torch

from scalelab.config import ModelConfig
from scalelab.formulas import activation_memory, flops, peak_memory
from scalelab.formulas.rank_step import RankStep
from scalelab.run.activations import SavedActivationMeter
from scalelab.run.model import GPT, Block, Llama, LlamaBlock, cross_entropy_loss, rope_tables
from support.compiled_memory import MODES, partitioned, partitioner_backend

pytestmark = pytest.mark.filterwarnings(  # inductor's import of torch.utils.mkldnn, torch's own
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def compile_model(model, backend) -> None:
    """What scalelab.run.parallel.apply_compile does, with another backend: each block and the loss."""
    for i, block in enumerate(model.blocks):
        model.blocks.register_module(str(i), torch.compile(block, backend=backend, fullgraph=True))
    model.loss_fn = torch.compile(model.loss_fn, backend=backend, fullgraph=True)


def one_block(family: str, mode: str, batch: int, seq: int, d: int, heads: int, kv_heads: int | None = None,
              checkpointing: bool = False):
    """(the block, its arguments, its ModelConfig of one layer) in a mode of MODES."""
    _, _, _, dtype = MODES[mode]
    cfg = ModelConfig(1, d, heads, seq, family != "llama", 256, family=family, n_kv_heads=kv_heads)
    torch.manual_seed(0)
    block = (LlamaBlock if family == "llama" else Block)(cfg).to(dtype)
    block.activation_checkpointing = checkpointing
    x = torch.randn(batch, seq, d, dtype=dtype, requires_grad=True)
    if family == "llama":
        return block, (x, *(t.to(dtype) for t in rope_tables(cfg))), cfg
    return block, (x,), cfg


# ----------------------------------------------------------------------------- against the partitioner
@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("mode", list(MODES))
# two shapes, one with checkpointing (a checkpointed block keeps its input whatever its shape)
@pytest.mark.parametrize("shape, checkpointing", [((2, 64, 64, 4), False), ((3, 32, 96, 6), True)])
def test_partitioner_saves_what_the_formulas_say(family, mode, shape, checkpointing):
    """Every family, precision, two shapes, with and without per-block checkpointing: the compiled
    formula is exactly what the partitioner keeps (llama with grouped-query attention). About a
    second each (no code is generated), 32 in all: the run tier."""
    precision, stage, autocast, _ = MODES[mode]
    batch, seq, d, heads = shape
    block, args, cfg = one_block(family, mode, batch, seq, d, heads, heads // 2 if family == "llama" else None,
                                 checkpointing)
    saved = partitioned(block, *args, autocast=autocast)
    formula = activation_memory.block_activation_bytes(cfg, batch, precision, checkpointing, zero_stage=stage,
                                                device_type="cpu", compiled=True)
    assert saved.bytes == formula, f"saved {saved.bytes}, formula {formula}:\n{saved}"
    assert len(saved.uncounted) == checkpointing  # the generator state for SDPA's recomputation
    eager = activation_memory.block_activation_bytes(cfg, batch, precision, checkpointing, zero_stage=stage, device_type="cpu")
    if family == "gpt2" and autocast and stage == 0 and not checkpointing:
        assert formula < eager  # the fp32 residual x + attn is recomputed in backward


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_compiled_loss_partition(precision):
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    b, t, v = 2, 64, 256
    logits = torch.randn(b, t, v, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, v, (b, t + 1))[:, 1:]  # as the worker hands them: a view of the token windows
    saved = partitioned(cross_entropy_loss, logits, targets, autocast=None if precision == "fp32" else dtype)
    w = activation_memory.DTYPE_BYTES[precision]
    # the logits, the targets' storage (the token windows, counted with the ids), the row max and
    # log-sum-exp, the total weight
    assert saved.bytes == w * b * t * v + 8 * b * (t + 1) + 2 * 4 * b * t + 4, str(saved)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("precision, micro_batch", [("fp32", 2), ("bf16", 2), ("bf16", 1)])
def test_meter_measures_compiled_models(family, precision, micro_batch):
    """Saved-tensor hooks see what compiled graphs save (AOTAutograd saves them through autograd), so
    SavedActivationMeter measures a compiled model as it does an eager one: both compiled formulas
    hold exactly, inside the blocks and outside them (the compiled loss beside the eager head)."""
    cfg = ModelConfig(2, 64, 4, 64, family != "llama", 256, family=family, n_kv_heads=2 if family == "llama" else None)
    torch.manual_seed(0)
    model = (Llama if family == "llama" else GPT)(cfg)
    compile_model(model, partitioner_backend([]))
    tokens = torch.randint(0, 256, (micro_batch, 65))
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32"):
        with SavedActivationMeter(model, model.blocks) as meter:
            loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    assert meter.inside_blocks == activation_memory.block_activation_bytes(cfg, micro_batch, precision, False, compiled=True)
    assert meter.outside_blocks == activation_memory.outside_block_activation_bytes(cfg, micro_batch, precision, compiled=True)


@pytest.mark.parametrize("emulate", [True, False])
def test_fp8_compiled_keeps_less_than_its_bound(emulate):
    """fp8 under torch.compile (torchao's Float8Linear; emulate=False traces torch._scaled_mm as a
    GPU does): the partitioner recomputes the float8 casts and keeps no weight copies, so the
    blocks keep less than the bf16 compiled figure that bounds them (on this CPU: x in fp32, q, k,
    v, the attention output and projection, the fc output: 4 + 9 w bytes per s b h value)."""
    from scalelab.run.precision import convert_to_fp8

    cfg = ModelConfig(2, 64, 4, 64, True, 256)
    torch.manual_seed(0)
    model = GPT(cfg)
    assert convert_to_fp8(model, emulate=emulate) == 8
    compile_model(model, partitioner_backend(graphs := []))
    tokens = torch.randint(0, 256, (2, 65))
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with SavedActivationMeter(model, model.blocks) as meter:
            loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    bound = activation_memory.block_activation_bytes(cfg, 2, "fp8", False, compiled=True)
    assert bound == activation_memory.block_activation_bytes(cfg, 2, "bf16", False, compiled=True)
    sbh = 2 * 64 * 64
    scales = 4 if emulate else 8  # fp32 scalars per block: the inputs' scales, and their inverses for _scaled_mm
    small = 2 * (2 * 2 * 4 * 2 * 64 + 4 * 2 * 4 * 64 + 4 * scales)  # per block: LayerNorm stats, logsumexp, scales
    assert meter.inside_blocks == 2 * (4 + 9 * 2) * sbh + small < bound, str(graphs[0])
    assert meter.outside_blocks == activation_memory.outside_block_activation_bytes(cfg, 2, "fp8", compiled=True)
    peak = peak_memory.peak_memory(cfg, flops.param_count(cfg), RankStep("fp8", 0, 1, 2, compiled=True))
    assert peak.upper_bound


@pytest.mark.run(cost_s=60)
def test_apply_compile_keeps_what_the_partitioner_says():
    """scalelab's own compile lever (real inductor: C++ code generation) keeps what the partitioner
    backend reads, so the formulas hold for it too."""
    from scalelab.run.parallel import apply_compile

    cfg = ModelConfig(1, 64, 4, 64, True, 256)
    torch.manual_seed(0)
    model = GPT(cfg)
    torch._dynamo.reset()
    apply_compile(model)
    tokens = torch.randint(0, 256, (2, 65))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with SavedActivationMeter(model, model.blocks) as meter:
            loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    assert meter.inside_blocks == activation_memory.block_activation_bytes(cfg, 2, "bf16", False, compiled=True)
    assert meter.outside_blocks == activation_memory.outside_block_activation_bytes(cfg, 2, "bf16", compiled=True)
