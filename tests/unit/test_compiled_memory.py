"""Issue #40: memory of compiled runs, without compiling: the formulas against hand-computed figures, the
measurements recorded on GPUs, the launcher's bounds (the partitioner's checks: tests/run/test_compiled_memory.py)."""
from __future__ import annotations

import dataclasses

import pytest

from scalelab.config import ModelConfig
from scalelab.formulas import activation_memory, flops, model_state, peak_memory
from scalelab.formulas.rank_step import RankStep
from support.compiled_memory import GIB

pytestmark = pytest.mark.filterwarnings(  # inductor's import of torch.utils.mkldnn, torch's own
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


# ----------------------------------------------------------------------------- formulas (no compiling)
def test_compiled_formulas_hand_computed():
    """GPT-2, one layer, s b h = 8192: 16 s b h values (at w; under autocast x stays fp32) and the
    weight copies, plus the LayerNorms' mean and rstd (4 s b values) and the logsumexp (4 b H s)."""
    cfg = ModelConfig(1, 64, 4, 64, True, 256)
    sbh, sb, bhs = 2 * 64 * 64, 2 * 64, 2 * 4 * 64
    assert activation_memory.block_activation_bytes(cfg, 2, "fp32", False, compiled=True) == 16 * sbh * 4 + 16 * sb + 4 * bhs
    assert (activation_memory.block_activation_bytes(cfg, 2, "bf16", False, compiled=True)
            == 4 * sbh + 15 * sbh * 2 + 2 * 12 * 64 * 64 + 16 * sb + 4 * bhs)
    assert (activation_memory.block_activation_bytes(cfg, 2, "bf16", False, zero_stage=3, compiled=True)
            == 16 * sbh * 2 + 8 * sb + 4 * bhs)
    # eager keeps the fp32 residual x + attn where compiled keeps the 16-bit attention output (both keep the
    # LayerNorms' statistics and the logsumexp)
    eager = activation_memory.block_activation_bytes(cfg, 2, "bf16", False)
    assert eager - activation_memory.block_activation_bytes(cfg, 2, "bf16", False, compiled=True) == 2 * sbh
    for precision in ("fp32", "bf16"):  # per-block checkpointing: the block input, as in eager
        assert (activation_memory.block_activation_bytes(cfg, 2, precision, True, compiled=True)
                == activation_memory.block_activation_bytes(cfg, 2, precision, True) == 4 * sbh)
    # llama, f = 256, kv = 32: (r + 5w) s b h + 2w s b kv + 3w s b f + 8 s b + 4 b H s (+ 2 P, RoPE)
    llama = ModelConfig(1, 64, 4, 64, False, 256, family="llama", n_kv_heads=2)
    sbkv, sbf, rope = 2 * 64 * 32, 2 * 64 * 256, 2 * 64 * 16
    assert (activation_memory.block_activation_bytes(llama, 2, "bf16", False, compiled=True)
            == 14 * sbh + 4 * sbkv + 6 * sbf + 8 * sb + 4 * bhs + 2 * flops.block_matmul_params(llama) + 2 * rope)
    assert (activation_memory.block_activation_bytes(llama, 2, "fp32", False, compiled=True, device_type="cpu")
            == 24 * sbh + 8 * sbkv + 12 * sbf + 8 * sb + 4 * bhs + 4 * rope)
    # fp32 grouped-query attention compiled on a GPU: the eager figure (an upper bound)
    assert (activation_memory.block_activation_bytes(llama, 2, "fp32", False, device_type="cuda", compiled=True)
            == activation_memory.block_activation_bytes(llama, 2, "fp32", False, device_type="cuda"))


@pytest.mark.parametrize("precision, micro_batch", [("fp32", 4), ("bf16", 4), ("bf16", 1)])
def test_compiled_loss_keeps_the_logits_not_the_log_softmax(precision, micro_batch):
    """The compiled loss keeps the logits (w B T V) and two fp32 values per row, not the fp32
    log-softmax (4 B T V) nor a copy of the targets; its backward writes one w-byte gradient."""
    cfg = ModelConfig(2, 64, 4, 64, True, 256)
    b, t, v, w = micro_batch, 64, 256, activation_memory.DTYPE_BYTES[precision]
    path = activation_memory.loss_path_bytes(cfg, micro_batch, precision, compiled=True)
    assert path.transient == path.backward_transient == w * b * t * v and path.forward_transient == 0
    assert activation_memory.loss_path_bytes(cfg, micro_batch, precision).transient == 8 * b * t * v  # eager
    eager = activation_memory.outside_block_activation_bytes(cfg, micro_batch, precision)
    compiled = activation_memory.outside_block_activation_bytes(cfg, micro_batch, precision, compiled=True)
    on_gpu = activation_memory.outside_block_activation_bytes(cfg, micro_batch, precision, zero_stage=0, device_type="cuda",
                                                              compiled=True)
    assert compiled == eager - 4 * b * t * v - (8 * b * t if b > 1 else 0) + w * b * t * v + 8 * b * t
    peak = peak_memory.peak_memory(cfg, 1000, RankStep(precision, 0, 1, micro_batch, compiled=True))
    assert peak.activations == (activation_memory.block_activation_bytes(cfg, micro_batch, precision, False, zero_stage=0,
                                                                  device_type="cuda", compiled=True) + on_gpu + w * b * t * v)


# Max allocated at world size 1, micro-batch 16, seq 1024, vocab 50304, 24 layers, 16 heads, tied
# embeddings: (d_model, precision, zero_stage, compiled, GiB measured). Stage 0 on an H100 (torch 2.11,
# gpu_check at a28d347, results/reference/nvidia-h100-80gb-hbm3-2026-11-26): one rank without DDP, as a
# plain loop trains (the plain loop measured the same 27.52 GiB eager); stage 3 on an H200 (issue #40).
# (The H200's stage-0 figures held DDP's gradient buckets too: 4 bytes per parameter more.)
GPU_PEAKS = {"350M bf16 eager": (1024, "bf16", 0, False, 27.52), "350M fp32 eager": (1024, "fp32", 0, False, 37.40),
             "350M fp16 eager": (1024, "fp16", 0, False, 27.52), "350M bf16 compiled": (1024, "bf16", 0, True, 20.63),
             "350M fp16 compiled": (1024, "fp16", 0, True, 20.63), "350M fp8 compiled": (1024, "fp8", 0, True, 15.57),
             "350M bf16 compiled stage 3 (H200)": (1024, "bf16", 3, True, 19.32),
             "1.3B bf16 compiled": (2048, "bf16", 0, True, 45.98), "1.3B fp8 compiled": (2048, "fp8", 0, True, 34.73)}


@pytest.mark.parametrize("case", GPU_PEAKS)
def test_gpu_measurements(case):
    """Modelled cases within 2% of the GPU's max allocated; fp8 compiled is an upper bound (the bf16
    compiled figure), above the measurement (by 32% on the H100: not modelled, the row says so)."""
    d, precision, stage, compiled, measured = GPU_PEAKS[case]
    cfg = ModelConfig(24, d, 16, 1024, True, 50304)
    peak = peak_memory.peak_memory(cfg, flops.param_count(cfg), RankStep(precision, stage, 1, 16, compiled=compiled))
    error = peak.total / GIB / measured - 1
    if precision == "fp8":
        assert peak.upper_bound and not peak.exact and 0 <= error < 0.40, (peak.total / GIB, peak.bound)
    else:
        assert peak.exact and abs(error) < 0.02, peak.total / GIB


def test_bounds_for_the_launcher():
    gpt, llama = ModelConfig(2, 64, 4, 64, True, 256), ModelConfig(2, 64, 4, 64, False, 256, family="llama",
                                                                   n_kv_heads=2)
    custom = ModelConfig(2, 64, 4, 64, True, 256, module="pkg.mod:build")
    assert peak_memory.activation_bound(gpt, "bf16", compiled=True) == peak_memory.MODELLED
    assert peak_memory.activation_bound(llama, "bf16", compiled=True) == "model"
    for compiled in (False, True):
        assert peak_memory.activation_bound(gpt, "fp8", compiled).startswith("upper bound: fp8 is predicted as bf16")
        assert peak_memory.activation_bound(gpt, "fp8", compiled, activation_checkpointing=True) == "model"
        assert peak_memory.activation_bound(custom, "bf16", compiled).startswith("lower bound: ")
    assert peak_memory.activation_bound(llama, "fp32", compiled=True).startswith("upper bound: fp32 grouped-query")
    assert peak_memory.activation_bound(llama, "fp32", compiled=True, device_type="cpu") == "model"
    assert peak_memory.activation_bound(llama, "fp32") == "model"  # eager: modelled on both devices

    # PeakMemory: positional construction as before (a model), and the bound survives dataclasses.replace
    assert peak_memory.PeakMemory(1.0, 2.0, 3.0).exact
    peak = peak_memory.peak_memory(gpt, 10 ** 6, RankStep("fp8", 0, 1, 4, compiled=True))
    assert peak.upper_bound and dataclasses.replace(peak, model_state=0.0).bound == peak.bound
    assert not peak_memory.predicts_oom(peak, peak.total / 2)  # an upper bound alone never says OOM
    modelled = peak_memory.peak_memory(gpt, 10 ** 6, RankStep("bf16", 0, 1, 4, compiled=True))
    assert peak_memory.predicts_oom(modelled, modelled.total / 2) and not peak_memory.predicts_oom(modelled, None)
    assert not peak_memory.predicts_oom(modelled, modelled.total)
    lower = peak_memory.peak_memory(custom, 10 ** 6, RankStep("bf16", 0, 1, 4), block_params=1000)
    assert lower.activations == 0 and peak_memory.predicts_oom(lower, lower.total / 2)
    # the default stays eager, and a model
    eager = peak_memory.peak_memory(gpt, 10 ** 6, RankStep("bf16", 0, 1, 4))
    assert eager.exact and eager.activations > modelled.activations


def test_the_peak_is_at_least_the_model_state_at_rest():
    """The optimizer step holds every gradient backward made: with few activations (checkpointed, one
    sequence) that outweighs the start of backward, whose gradients the optimizer had freed."""
    cfg = ModelConfig(24, 1024, 16, 1024, True, 50304)
    n = flops.param_count(cfg)
    at_rest = model_state.model_state_bytes(n, 0, 1, "bf16").total
    small = peak_memory.peak_memory(cfg, n, RankStep("bf16", 0, 1, 1, activation_checkpointing=True))
    assert small.model_state + small.transient_params + small.activations < at_rest == small.at_rest == small.total
    assert small.at_optimizer_step
    large = peak_memory.peak_memory(cfg, n, RankStep("bf16", 0, 1, 16))
    assert large.total == large.model_state + large.transient_params + large.activations > at_rest
    assert not large.at_optimizer_step
    offloaded = peak_memory.peak_memory(cfg, n, RankStep("bf16", 3, 2, 1, cpu_offload=True))
    assert offloaded.at_rest == 0 and offloaded.total == offloaded.transient_params + offloaded.activations
