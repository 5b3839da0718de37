"""Accounting: hand-computed cases, published figures, the estimate CLI, planning in a sweep."""

import pytest

from scalelab.config import ModelConfig
from scalelab.formulas import activation_memory, communication, flops, model_state, peak_memory
from scalelab.formulas.rank_step import RankStep
from scalelab.run.model import GPT


@pytest.mark.parametrize("layers, d, heads, seq, vocab, tied", [(2, 64, 4, 64, 256, True), (3, 48, 4, 32, 300, False),
                                                                 (1, 8, 2, 4, 11, True)])
def test_param_count_is_exact(layers, d, heads, seq, vocab, tied):
    cfg = ModelConfig(layers, d, heads, seq, tied, vocab)
    assert flops.param_count(cfg) == GPT(cfg).num_parameters()


def test_flops_per_token_hand_computed():
    cfg = ModelConfig(2, 64, 4, 64, True, 256)
    # 6 * (2 * 12 * 64^2 + 256 * 64) + 12 * 2 * 64 * 64
    assert flops.flops_per_token(cfg) == 6 * (98304 + 16384) + 98304 == 786432
    assert flops.flops_per_token(cfg, causal_halved=True) == 688128 + 49152
    assert flops.mfu(1000, 786432, 786432 * 4000, 1) == pytest.approx(0.25)


def test_loss_path_bytes_per_precision():
    """Issue #14: the logits (compute width), their fp32 copy (autocast only) and the fp32
    log-softmax in forward; its two fp32 gradients in backward, the larger moment."""
    cfg = ModelConfig(2, 64, 4, 64, True, 256)
    btv = 4 * 64 * 256
    fp32, bf16 = activation_memory.loss_path_bytes(cfg, 4, "fp32"), activation_memory.loss_path_bytes(cfg, 4, "bf16")
    assert (fp32.logits, fp32.logits_fp32, fp32.log_softmax, fp32.gradients) == (4 * btv, 0, 4 * btv, 8 * btv)
    assert (bf16.logits, bf16.logits_fp32, bf16.log_softmax, bf16.gradients) == (2 * btv, 4 * btv, 4 * btv, 8 * btv)
    assert activation_memory.loss_path_bytes(cfg, 4, "fp8") == activation_memory.loss_path_bytes(cfg, 4, "fp16") == bf16
    assert (fp32.forward_transient, bf16.forward_transient) == (4 * btv, 6 * btv)
    assert fp32.transient == bf16.transient == 8 * btv
    # outside the blocks: the log-softmax output dominates; under autocast the head input is a
    # 16-bit copy (-2 B T C) and the head weight's 16-bit copy is kept (+2 V C)
    out32 = activation_memory.outside_block_activation_bytes(cfg, 4, "fp32")
    assert out32 == 4 * btv + 4 * 4 * 64 * 64 + 8 * 4 * 64 + 4 * 4 * 64 * 64 + 8 * 4 * 65 + 8 * 64 + 8 * 4 * 64 + 8
    assert activation_memory.outside_block_activation_bytes(cfg, 4, "bf16") == out32 - 2 * 4 * 64 * 64 + 2 * 256 * 64
    # micro-batch 1 of 4: the token batch holds all four; the targets are a view, not a copy
    assert (activation_memory.outside_block_activation_bytes(cfg, 1, "fp32", accumulation_steps=4)
            == 4 * 64 * 256 + 4 * 64 * 64 + 8 * 64 + 4 * 64 * 64 + 8 * 4 * 65 + 8 * 64 + 8)
    peak = peak_memory.peak_memory(cfg, 1000, RankStep("bf16", 0, 1, 4, device_type="cpu"))
    assert peak.activations == (activation_memory.block_activation_bytes(cfg, 4, "bf16", False, zero_stage=0)
                                + activation_memory.outside_block_activation_bytes(cfg, 4, "bf16", zero_stage=0) + 8 * btv)


def test_mfu_against_the_bf16_peak_on_a_gpu(monkeypatch):
    """Issue #14 point 2: on an H100 an fp8 run's own peak is the fp8 one, twice the bf16 peak
    that mfu_bf16_peak divides by; a bf16 run's two peaks are one."""
    import torch

    from scalelab.run.rank_setup import bf16_peak_flops, peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    gpu = torch.device("cuda", 0)
    fp8 = peak_flops(gpu, "fp8", False)
    bf16 = bf16_peak_flops(gpu, "fp8", False, fp8)
    assert fp8[0] == 2 * bf16[0] == pytest.approx(1979e12) and "dense bf16" in bf16[1] and "H100 SXM" in bf16[1]
    assert bf16_peak_flops(gpu, "bf16", False, bf16) == bf16
    assert bf16_peak_flops(gpu, "fp32", True, peak_flops(gpu, "fp32", True)) == bf16
    tokens_per_s, fpt = 1e5, 1e9
    assert flops.mfu(tokens_per_s, fpt, bf16[0], 8) == pytest.approx(2 * flops.mfu(tokens_per_s, fpt, fp8[0], 8))


def test_zero_paper_figure_7_5b_on_64_devices():
    """ZeRO paper, Figure 1: Psi = 7.5B, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB."""
    psi = 7.5e9
    got = [model_state.model_state_bytes(psi, stage, 64, "fp16", "paper").total / 1e9 for stage in (0, 1, 2, 3)]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]


def test_pytorch_convention_hand_computed():
    psi, n = 1000, 4
    assert model_state.model_state_bytes(psi, 0, n, "bf16").total == 16000
    s1 = model_state.model_state_bytes(psi, 1, n, "bf16")
    assert (s1.params, s1.grads, s1.optimizer) == (4000, 4000, 2000)
    for stage in (2, 3):
        assert model_state.model_state_bytes(psi, stage, n, "fp32").total == 4000
    with pytest.raises(ValueError, match="zero_stage"):
        model_state.model_state_bytes(psi, 4, n, "fp32")


def test_comm_volume():
    psi = 1000
    assert [communication.comm_elements_per_step(psi, z, 4) for z in (0, 1, 2, 3)] == [2000, 3000, 2000, 3000]
    assert [communication.comm_elements_per_step(psi, z, 4, convention="paper") for z in (0, 1, 2, 3)] == [2000, 2000, 2000, 3000]
    assert communication.comm_elements_per_step(psi, 3, 4, accumulation_steps=4) == 9000
    assert communication.comm_elements_per_step(psi, 2, 1) == 0  # FSDP2 on one rank: no collectives


def test_activation_memory_korthikanti():
    # GPT-3 175B layer (s=2048, b=1, h=12288, a=96): sbh(34 + 5as/h) = sbh * 114 bytes.
    s, b, h, a = 2048, 1, 12288, 96
    assert activation_memory.activation_bytes_per_layer(s, b, h, a) == s * b * h * 114
    assert activation_memory.activation_bytes_per_layer(s, b, h, a, recompute="selective") == s * b * h * 34
    assert activation_memory.activation_bytes_per_layer(s, b, h, a, recompute="full") == 2 * s * b * h


def test_training_days_and_largest_model():
    days = flops.training_days(6 * 7e9 * 1e12, 256, "H100", "bf16", 0.4)
    assert days == pytest.approx(4.2e22 / (256 * 989.5e12 * 0.4) / 86400)
    assert model_state.largest_model(80 * 2 ** 30, 0, 8, "bf16", "pytorch") == pytest.approx(80 * 2 ** 30 / 16)
    assert model_state.largest_model(80 * 2 ** 30, 3, 8, "bf16", "pytorch") == pytest.approx(8 * 80 * 2 ** 30 / 16)
    with pytest.raises(ValueError, match="unknown GPU"):
        flops.gpu_peak_flops("Foo9000", "bf16")


def test_the_schema_lists_the_precision_records():
    """One place per precision: the config schema's sweep enum and peak_tflops keys are the registry's."""
    from scalelab.config import SCHEMA
    from scalelab.registries.precisions import PEAK_KEYS, PRECISION_NAMES

    assert SCHEMA["properties"]["sweep"]["properties"]["precision"]["items"]["enum"] == list(PRECISION_NAMES)
    assert list(SCHEMA["properties"]["train"]["properties"]["peak_tflops"]["properties"]) == list(PEAK_KEYS)


def test_every_precision_table_is_read_off_the_records():
    """The autocast and compute dtypes, bytes per value, the paper's bytes per parameter, the
    plot order, the estimates' choices and the linear recipes all come from scalelab.registries.precisions."""
    import torch

    from scalelab.forecast import estimate
    from scalelab.registries.precisions import PEAK_KEYS, PRECISION_NAMES, PRECISIONS
    from scalelab.report import tables
    from scalelab.run import precision as policy

    assert tables.PRECISION_ORDER == list(PRECISION_NAMES) and PRECISION_NAMES[0] == "fp32"
    for p in PRECISIONS.values():
        assert policy.COMPUTE_DTYPE[p.name] == getattr(torch, p.compute)
        assert policy.AUTOCAST_DTYPE[p.name] == (getattr(torch, p.autocast) if p.autocast else None)
        assert activation_memory.DTYPE_BYTES[p.name] == p.activation_bytes == getattr(torch, p.compute).itemsize
        split = model_state.model_state_bytes(1, 0, 1, p.name, "paper")
        assert (split.params, split.grads, split.optimizer) == p.paper_state_bytes
        assert p.linears is None or p.linears in policy.LINEAR_RECIPES
        assert {p.peak_key, p.matmul_precision, p.twin or p.name} <= {*PEAK_KEYS, *PRECISION_NAMES}
        assert (p.name in estimate.MEMORY_PRECISIONS) == p.estimate_memory
        assert policy.grad_scaler(p.name, torch.device("cpu"), 1024.0).is_enabled() == p.loss_scaling
    assert estimate.MEMORY_PRECISIONS == ("fp32", "fp16", "bf16")  # fp8 holds bf16's model state
