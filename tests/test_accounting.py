"""Accounting: hand-computed cases, published figures, the estimate CLI, planning in a sweep."""
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import snakemake, tiny_config, write_workdir
from scalelab.config import ModelConfig
from scalelab.formulas import accounting
from scalelab.plan.sweep import RunPoint
from scalelab.run.model import GPT

SCALELAB = str(Path(sys.executable).parent / "scalelab")


@pytest.mark.unit
@pytest.mark.parametrize("layers, d, heads, seq, vocab, tied", [(2, 64, 4, 64, 256, True), (3, 48, 4, 32, 300, False),
                                                                 (1, 8, 2, 4, 11, True)])
def test_param_count_is_exact(layers, d, heads, seq, vocab, tied):
    cfg = ModelConfig(layers, d, heads, seq, tied, vocab)
    assert accounting.param_count(cfg) == GPT(cfg).num_parameters()


@pytest.mark.unit
def test_flops_per_token_hand_computed():
    cfg = ModelConfig(2, 64, 4, 64, True, 256)
    # 6 * (2 * 12 * 64^2 + 256 * 64) + 12 * 2 * 64 * 64
    assert accounting.flops_per_token(cfg) == 6 * (98304 + 16384) + 98304 == 786432
    assert accounting.flops_per_token(cfg, causal_halved=True) == 688128 + 49152
    assert accounting.mfu(1000, 786432, 786432 * 4000, 1) == pytest.approx(0.25)


@pytest.mark.unit
def test_loss_path_bytes_per_precision():
    """Issue #14: the logits (compute width), their fp32 copy (autocast only) and the fp32
    log-softmax in forward; its two fp32 gradients in backward, the larger moment."""
    cfg = ModelConfig(2, 64, 4, 64, True, 256)
    btv = 4 * 64 * 256
    fp32, bf16 = accounting.loss_path_bytes(cfg, 4, "fp32"), accounting.loss_path_bytes(cfg, 4, "bf16")
    assert (fp32.logits, fp32.logits_fp32, fp32.log_softmax, fp32.gradients) == (4 * btv, 0, 4 * btv, 8 * btv)
    assert (bf16.logits, bf16.logits_fp32, bf16.log_softmax, bf16.gradients) == (2 * btv, 4 * btv, 4 * btv, 8 * btv)
    assert accounting.loss_path_bytes(cfg, 4, "fp8") == accounting.loss_path_bytes(cfg, 4, "fp16") == bf16
    assert (fp32.forward_transient, bf16.forward_transient) == (4 * btv, 6 * btv)
    assert fp32.transient == bf16.transient == 8 * btv
    # outside the blocks: the log-softmax output dominates; under autocast the head input is a
    # 16-bit copy (-2 B T C) and the head weight's 16-bit copy is kept (+2 V C)
    out32 = accounting.outside_block_activation_bytes(cfg, 4, "fp32")
    assert out32 == 4 * btv + 4 * 4 * 64 * 64 + 8 * 4 * 64 + 4 * 4 * 64 * 64 + 8 * 4 * 65 + 8 * 64 + 8 * 4 * 64 + 8
    assert accounting.outside_block_activation_bytes(cfg, 4, "bf16") == out32 - 2 * 4 * 64 * 64 + 2 * 256 * 64
    # micro-batch 1 of 4: the token batch holds all four; the targets are a view, not a copy
    assert (accounting.outside_block_activation_bytes(cfg, 1, "fp32", accumulation_steps=4)
            == 4 * 64 * 256 + 4 * 64 * 64 + 8 * 64 + 4 * 64 * 64 + 8 * 4 * 65 + 8 * 64 + 8)
    peak = accounting.peak_memory(cfg, 1000, 0, 1, "bf16", 4)
    assert peak.activations == (accounting.block_activation_bytes(cfg, 4, "bf16", False)
                                + accounting.outside_block_activation_bytes(cfg, 4, "bf16") + 8 * btv)


@pytest.mark.unit
def test_mfu_against_the_bf16_peak_on_a_gpu(monkeypatch):
    """Issue #14 point 2: on an H100 an fp8 run's own peak is the fp8 one, twice the bf16 peak
    that mfu_bf16_peak divides by; a bf16 run's two peaks are one."""
    import torch

    from scalelab.run.worker import bf16_peak_flops, peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    gpu = torch.device("cuda", 0)
    fp8 = peak_flops(gpu, "fp8", False)
    bf16 = bf16_peak_flops(gpu, "fp8", False, fp8)
    assert fp8[0] == 2 * bf16[0] == pytest.approx(1979e12) and "dense bf16" in bf16[1] and "H100 SXM" in bf16[1]
    assert bf16_peak_flops(gpu, "bf16", False, bf16) == bf16
    assert bf16_peak_flops(gpu, "fp32", True, peak_flops(gpu, "fp32", True)) == bf16
    tokens_per_s, fpt = 1e5, 1e9
    assert accounting.mfu(tokens_per_s, fpt, bf16[0], 8) == pytest.approx(2 * accounting.mfu(tokens_per_s, fpt, fp8[0], 8))


@pytest.mark.unit
def test_zero_paper_figure_7_5b_on_64_devices():
    """ZeRO paper, Figure 1: Psi = 7.5B, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB."""
    psi = 7.5e9
    got = [accounting.model_state_bytes(psi, stage, 64, "fp16", "paper").total / 1e9 for stage in (0, 1, 2, 3)]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]


@pytest.mark.unit
def test_pytorch_convention_hand_computed():
    psi, n = 1000, 4
    assert accounting.model_state_bytes(psi, 0, n, "bf16").total == 16000
    s1 = accounting.model_state_bytes(psi, 1, n, "bf16")
    assert (s1.params, s1.grads, s1.optimizer) == (4000, 4000, 2000)
    for stage in (2, 3):
        assert accounting.model_state_bytes(psi, stage, n, "fp32").total == 4000
    with pytest.raises(ValueError, match="zero_stage"):
        accounting.model_state_bytes(psi, 4, n, "fp32")


@pytest.mark.unit
def test_comm_volume():
    psi = 1000
    assert [accounting.comm_elements_per_step(psi, z, 4) for z in (0, 1, 2, 3)] == [2000, 3000, 2000, 3000]
    assert [accounting.comm_elements_per_step(psi, z, 4, convention="paper") for z in (0, 1, 2, 3)] == [2000, 2000, 2000, 3000]
    assert accounting.comm_elements_per_step(psi, 3, 4, accumulation_steps=4) == 9000
    assert accounting.comm_elements_per_step(psi, 2, 1) == 0  # FSDP2 on one rank: no collectives


@pytest.mark.unit
def test_activation_memory_korthikanti():
    # GPT-3 175B layer (s=2048, b=1, h=12288, a=96): sbh(34 + 5as/h) = sbh * 114 bytes.
    s, b, h, a = 2048, 1, 12288, 96
    assert accounting.activation_bytes_per_layer(s, b, h, a) == s * b * h * 114
    assert accounting.activation_bytes_per_layer(s, b, h, a, recompute="selective") == s * b * h * 34
    assert accounting.activation_bytes_per_layer(s, b, h, a, recompute="full") == 2 * s * b * h


@pytest.mark.unit
def test_training_days_and_largest_model():
    days = accounting.training_days(6 * 7e9 * 1e12, 256, "H100", "bf16", 0.4)
    assert days == pytest.approx(4.2e22 / (256 * 989.5e12 * 0.4) / 86400)
    assert accounting.largest_model(80 * 2 ** 30, 0, 8, "bf16", "pytorch") == pytest.approx(80 * 2 ** 30 / 16)
    assert accounting.largest_model(80 * 2 ** 30, 3, 8, "bf16", "pytorch") == pytest.approx(8 * 80 * 2 ** 30 / 16)
    with pytest.raises(ValueError, match="unknown GPU"):
        accounting.gpu_peak_flops("Foo9000", "bf16")


def _cli(*args):
    return subprocess.run([SCALELAB, "estimate", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.run
def test_estimate_help_documents_every_flag():
    for kind, flags in {"memory": ["--params", "--layers", "--d-model", "--heads", "--vocab", "--seq", "--untied", "--config",
                                   "--world-size", "--micro-batch", "--unit", "--json"],
                        "time": ["--tokens", "--gpus", "--gpu", "--precision", "--mfu", "--json"],
                        "fit": ["--gpu-memory", "--gpu-memory-gib", "--unit", "--world-size", "--json"],
                        "advise": ["--gpu-memory", "--unit", "--gpus", "--micro-batch", "--activation-checkpointing", "--json"],
                        "claim": ["--tokens-per-s", "--tokens", "--days", "--gpus", "--gpu", "--precision", "--json"]}.items():
        out = _cli(kind, "--help").stdout
        for flag in flags:
            assert flag in out, (kind, flag)


@pytest.mark.run
def test_estimate_json_outputs():
    mem = json.loads(_cli("memory", "--params", "7.5e9", "--world-size", "64", "--unit", "GB", "--json").stdout)
    paper = {(r["precision"], r["zero_stage"]): r["paper_total_gb"] for r in mem["rows"]}  # keys follow --unit
    assert round(paper[("bf16", 1)], 1) == 31.4
    shaped = json.loads(_cli("memory", "--layers", "24", "--d-model", "1024", "--vocab", "50257", "--seq", "1024",
                             "--micro-batch", "8", "--world-size", "8", "--json").stdout)
    assert shaped["n_params"] == accounting.param_count(ModelConfig(24, 1024, 16, 1024, True, 50257))
    assert all(r["peak_gib"] > r["pytorch_total_gib"] for r in shaped["rows"])
    t = json.loads(_cli("time", "--params", "7e9", "--tokens", "1e12", "--gpus", "256", "--gpu", "h100", "--mfu", "0.4", "--json").stdout)
    assert t["days"] == pytest.approx(4.797, abs=1e-3)
    fit = json.loads(_cli("fit", "--gpu-memory-gib", "80", "--world-size", "8", "--json").stdout)
    assert len(fit["rows"]) == 12
    fit_gb = json.loads(_cli("fit", "--gpu-memory", "80", "--unit", "GB", "--world-size", "8", "--json").stdout)
    assert fit_gb["gpu_memory_gb"] == 80 and fit_gb["unit"] == "GB"
    by_row = {(r["precision"], r["zero_stage"]): r["pytorch_max_params"] for r in fit_gb["rows"]}
    assert by_row[("bf16", 3)] == pytest.approx(80e9 * 8 / 16)  # 16 bytes per parameter, sharded 8 ways
    assert json.loads(_cli("time", "--params", "7e9", "--tokens", "1e12", "--gpus", "256", "--gpu", "h100",
                           "--precision", "fp8", "--json").stdout)["peak_flops_per_gpu"] == pytest.approx(1979e12)


SEVEN_B = ["--layers", "32", "--d-model", "4096", "--vocab", "32000", "--seq", "4096", "--micro-batch", "1"]


@pytest.mark.run
def test_advise_climbs_the_ladder():
    """8 x 80 GiB for a 6.6B model: DDP (16 bytes per parameter, unsharded) does not fit; ZeRO-2 does."""
    out = json.loads(_cli("advise", *SEVEN_B, "--gpu-memory", "80", "--gpus", "8", "--json").stdout)
    fits = [r["fits"] for r in out["rungs"]]
    assert fits == [False, False, True, True] and out["advice"].startswith("use ZeRO stage 2")
    n = out["n_params"]
    assert out["rungs"][0]["model_state_gib"] == pytest.approx(16 * n / 2**30)
    assert out["rungs"][3]["model_state_gib"] == pytest.approx(16 * n / 8 / 2**30)


@pytest.mark.run
def test_advise_falls_back_to_lora_with_its_rank_budget():
    """One 80 GiB GPU: no stage shards anything at world size 1, so LoRA: frozen fp32 weights
    (4 bytes each) plus 16 bytes per trainable parameter, 16 x d_model x rank per block."""
    out = json.loads(_cli("advise", *SEVEN_B, "--gpu-memory", "80", "--gpus", "1", "--json").stdout)
    assert not any(r["fits"] for r in out["rungs"])
    lora, n = out["lora"], out["n_params"]
    cfg = ModelConfig(32, 4096, 64, 4096, True, 32000)
    assert accounting.lora_trainable_params(cfg, 1) == 32 * 16 * 4096
    assert lora["per_rank_gib"] == pytest.approx(16 * 32 * 16 * 4096 / 2**30)
    assert out["budget_gib"] == pytest.approx(80 - 2 - 0.05 * 80)  # less the reserve plan keeps (CUDA, NCCL, fragmentation)
    budget = (out["budget_gib"] - lora["frozen_and_in_step_gib"]) / lora["per_rank_gib"]
    # the largest power of two within the budget (1024 since fp16/bf16 stages 2 and 3 compute with 16-bit
    # parameters under MixedPrecisionPolicy: smaller activations leave LoRA more room; 512 before)
    power = lora["rank_power_of_two"]
    assert lora["max_rank"] == int(budget) and power & (power - 1) == 0 and power <= lora["max_rank"] < 2 * power
    assert lora["frozen_and_in_step_gib"] > 4 * n / 2**30, "frozen weights plus the step's activations"
    assert out["advice"].startswith("switch to LoRA")
    tight = json.loads(_cli("advise", "--layers", "80", "--d-model", "8192", "--vocab", "32000", "--seq", "4096",
                            "--micro-batch", "1", "--gpu-memory", "80", "--gpus", "8", "--json").stdout)
    assert tight["lora"]["max_rank"] == 0 and "does not fit even with LoRA" in tight["advice"]


@pytest.mark.run
def test_claim_check_says_when_a_throughput_exceeds_the_hardware():
    impossible = json.loads(_cli("claim", "--params", "70e9", "--tokens-per-s", "2e6", "--gpus", "64", "--gpu", "H100",
                                 "--json").stdout)
    assert impossible["implied_mfu"] == pytest.approx(2e6 * 6 * 70e9 / (64 * 989.5e12))
    assert impossible["verdict"].startswith("impossible as stated")
    plausible = _cli("claim", "--params", "7e9", "--tokens", "1e12", "--days", "30", "--gpus", "256", "--gpu", "H100").stdout
    assert "plausible: " in plausible and "implausible" not in plausible


@pytest.mark.run
@pytest.mark.parametrize("args, message", [
    (["memory", "--params", "-5"], "--params must be a positive number"),
    (["memory", "--layers", "2"], "all of --layers, --d-model, --vocab and --seq"),
    (["time", "--params", "1e9", "--tokens", "1e9", "--gpus", "8", "--gpu", "Foo9000"], "unknown GPU type 'Foo9000'"),
    (["time", "--params", "1e9", "--tokens", "1e9", "--gpus", "8", "--gpu", "H100", "--mfu", "0"], "--mfu must be in (0, 1]"),
    (["time", "--params", "1e9", "--tokens", "1e9", "--gpus", "8", "--gpu", "H100", "--mfu", "1.5"], "--mfu must be in (0, 1]"),
    (["fit", "--gpu-memory-gib", "-80"], "--gpu-memory-gib must be a positive number"),
    (["fit", "--gpu-memory", "80", "--gpu-memory-gib", "80"], "not both"),
    (["claim", "--params", "7e9", "--gpus", "8", "--gpu", "H100"], "give the claim as --tokens-per-s, or as --tokens and --days"),
    (["advise", "--params", "7e9", "--gpus", "8", "--gpu-memory", "80", "--micro-batch", "2"], "--micro-batch needs the model's shape"),
])
def test_estimate_bad_input_is_a_clear_error(args, message):
    proc = _cli(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@pytest.mark.workflow
def test_point_that_cannot_fit_is_recorded_without_launch(tmp_path):
    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [0, 3], "world_size": [2]})
    model = ModelConfig(2, 32, 2, 32, True, 256)
    n = accounting.param_count(model)
    big = accounting.peak_memory(model, n, 0, 2, "fp32", 4).total
    small = accounting.peak_memory(model, n, 3, 2, "fp32", 4).total
    assert small < big
    cfg["planning"] = {"device_memory_gib": (small + big) / 2 / 2 ** 30, "launch_predicted_oom": False}
    workdir = write_workdir(tmp_path, cfg)
    snakemake(workdir, "--cores", "2")
    runs = pq.read_table(tmp_path / "results/metrics.parquet").to_pandas().set_index("run_id")
    assert runs.loc["fp32-z0-w2", "status"] == "predicted_oom"
    assert "exceeds the device memory" in runs.loc["fp32-z0-w2", "reason"]
    assert runs.loc["fp32-z0-w2", "predicted_peak_bytes"] == pytest.approx(big)
    assert runs.loc["fp32-z3-w2", "status"] == "ok"
    log = tmp_path / "results/logs/runs" / f"{RunPoint('fp32', 0, 2).path}.log"
    assert not log.exists() or "torch.distributed.run" not in log.read_text(), "the point was launched"
    assert "predicted_oom" in (tmp_path / "results/report/report.html").read_text()


@pytest.mark.unit
def test_the_schema_lists_the_precision_records():
    """One place per precision: the config schema's sweep enum and peak_tflops keys are the registry's."""
    from scalelab.config import SCHEMA
    from scalelab.spec.precisions import PEAK_KEYS, PRECISION_NAMES

    assert SCHEMA["properties"]["sweep"]["properties"]["precision"]["items"]["enum"] == list(PRECISION_NAMES)
    assert list(SCHEMA["properties"]["train"]["properties"]["peak_tflops"]["properties"]) == list(PEAK_KEYS)


@pytest.mark.unit
def test_every_precision_table_is_read_off_the_records():
    """The autocast and compute dtypes, bytes per value, the paper's bytes per parameter, the
    plot order, the estimates' choices and the linear recipes all come from scalelab.spec.precisions."""
    import torch

    from scalelab.forecast import estimate
    from scalelab.report import tables
    from scalelab.run import precision as policy
    from scalelab.spec.precisions import PEAK_KEYS, PRECISION_NAMES, PRECISIONS

    assert tables.PRECISION_ORDER == list(PRECISION_NAMES) and PRECISION_NAMES[0] == "fp32"
    for p in PRECISIONS.values():
        assert policy.COMPUTE_DTYPE[p.name] == getattr(torch, p.compute)
        assert policy.AUTOCAST_DTYPE[p.name] == (getattr(torch, p.autocast) if p.autocast else None)
        assert accounting.DTYPE_BYTES[p.name] == p.activation_bytes == getattr(torch, p.compute).itemsize
        split = accounting.model_state_bytes(1, 0, 1, p.name, "paper")
        assert (split.params, split.grads, split.optimizer) == p.paper_state_bytes
        assert p.linears is None or p.linears in policy.LINEAR_RECIPES
        assert {p.peak_key, p.matmul_precision, p.twin or p.name} <= {*PEAK_KEYS, *PRECISION_NAMES}
        assert (p.name in estimate.MEMORY_PRECISIONS) == p.estimate_memory
        assert policy.grad_scaler(p.name, torch.device("cpu"), 1024.0).is_enabled() == p.loss_scaling
    assert estimate.MEMORY_PRECISIONS == ("fp32", "fp16", "bf16")  # fp8 holds bf16's model state
