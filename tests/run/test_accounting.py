"""Accounting: hand-computed cases, published figures, the estimate CLI, planning in a sweep."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.config import ModelConfig
from scalelab.formulas import accounting

SCALELAB = str(Path(sys.executable).parent / "scalelab")


def _cli(*args):
    return subprocess.run([SCALELAB, "estimate", *args], capture_output=True, text=True, timeout=60)


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


def test_advise_climbs_the_ladder():
    """8 x 80 GiB for a 6.6B model: DDP (16 bytes per parameter, unsharded) does not fit; ZeRO-2 does."""
    out = json.loads(_cli("advise", *SEVEN_B, "--gpu-memory", "80", "--gpus", "8", "--json").stdout)
    fits = [r["fits"] for r in out["rungs"]]
    assert fits == [False, False, True, True] and out["advice"].startswith("use ZeRO stage 2")
    n = out["n_params"]
    assert out["rungs"][0]["model_state_gib"] == pytest.approx(16 * n / 2**30)
    assert out["rungs"][3]["model_state_gib"] == pytest.approx(16 * n / 8 / 2**30)


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


def test_claim_check_says_when_a_throughput_exceeds_the_hardware():
    impossible = json.loads(_cli("claim", "--params", "70e9", "--tokens-per-s", "2e6", "--gpus", "64", "--gpu", "H100",
                                 "--json").stdout)
    assert impossible["implied_mfu"] == pytest.approx(2e6 * 6 * 70e9 / (64 * 989.5e12))
    assert impossible["verdict"].startswith("impossible as stated")
    plausible = _cli("claim", "--params", "7e9", "--tokens", "1e12", "--days", "30", "--gpus", "256", "--gpu", "H100").stdout
    assert "plausible: " in plausible and "implausible" not in plausible


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
