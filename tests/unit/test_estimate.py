"""`scalelab estimate` as a new user meets it (#32): counts written as the output prints them,
row filters, a subcommand's own usage on a bad option, claims that cannot be right said so,
and the MFU a sweep measured; each subcommand's JSON, the advice ladder down to LoRA, and bad input
refused with a clear error. In process (unit tier); tests/run/test_accounting.py runs the installed command."""
import argparse
import json

import pandas as pd
import pytest

from scalelab.cli import main
from scalelab.config import ModelConfig
from scalelab.forecast.estimate import _human
from scalelab.forecast.inputs import count
from scalelab.formulas import flops, lora_training, model_state


def _estimate(capsys, *args) -> tuple[int, str, str]:
    """`scalelab estimate ARGS` in process: (exit status, stdout, stderr), ended as the command ends (argparse's
    refusals exit 2)."""
    try:
        code = main(["estimate", *args])
    except SystemExit as exited:
        code = exited.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("text, value", [("1B", 1e9), ("20B", 20e9), ("350M", 350e6), ("1.3B", 1.3e9), ("2k", 2e3),
                                         ("1T", 1e12), ("7.5e9", 7.5e9), ("120", 120.0)])
def test_counts_are_read_as_the_output_prints_them(text, value):
    assert count(text) == pytest.approx(value)
    assert count(_human(value)) == pytest.approx(value, rel=1e-3)  # what it prints, it reads


def test_a_count_that_is_not_one_is_refused_by_the_subcommand(capsys):
    with pytest.raises(argparse.ArgumentTypeError, match="1.3X"):
        count("1.3X")
    code, out, _ = _estimate(capsys, "time", "--params", "20B", "--tokens", "1T", "--gpus", "1K", "--gpu", "H100", "--json")
    result = json.loads(out)
    assert code == 0 and (result["n_params"], result["tokens"], result["gpus"]) == (20_000_000_000, 1e12, 1000)


def test_memory_and_fit_tables_filter_by_precision_and_stage(capsys):
    code, out, _ = _estimate(capsys, "memory", "--params", "1B", "--world-size", "8", "--precision", "bf16",
                             "--zero-stage", "2", "3", "--json")
    assert code == 0 and [(r["precision"], r["zero_stage"]) for r in json.loads(out)["rows"]] == [("bf16", 2), ("bf16", 3)]
    code, out, _ = _estimate(capsys, "fit", "--gpu-memory", "80", "--world-size", "8", "--zero-stage", "3", "--json")
    assert code == 0 and [(r["precision"], r["zero_stage"]) for r in json.loads(out)["rows"]] == [
        ("fp32", 3), ("fp16", 3), ("bf16", 3)]


def test_an_unknown_option_is_the_subcommands_error_with_its_usage(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["estimate", "memory", "--params", "1e9", "--precison", "bf16"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.startswith("usage: scalelab estimate memory ")
    assert err.rstrip().endswith("scalelab estimate memory: error: unrecognized arguments: --precison bf16")


def test_claim_says_when_an_implied_mfu_is_too_low_to_be_right(capsys):
    """It printed 'implied MFU 0.0%: plausible': no lower bound, a percentage rounded to zero, and
    --params 1.3 (meaning billions) truncated by int() to one parameter."""
    code, _, err = _estimate(capsys, "claim", "--params", "1.3", "--tokens-per-s", "2M", "--gpus", "8", "--gpu", "H100")
    assert code == 2 and "--params 1.3 is 1.3 parameters, a count: write 1.3B" in err
    code, out, _ = _estimate(capsys, "claim", "--params", "1.3B", "--tokens", "1e9", "--days", "30", "--gpus", "8",
                             "--gpu", "H100")
    assert code == 0 and "implied MFU 0.038%: implausibly low" in out and "0.0%" not in out
    code, out, _ = _estimate(capsys, "claim", "--params", "1.3B", "--tokens-per-s", "100K", "--gpus", "8", "--gpu", "H100")
    assert code == 0 and "implied MFU 9.9%: plausible" in out


def test_time_and_plan_take_one_mfu_from_a_sweep_and_both_warn_of_a_cpu(tmp_path, capsys):
    """estimate time and plan read the same runs of a sweep (world size 1: compute without communication), so the
    same results give them one MFU; both say a CPU's MFU says nothing about a GPU."""
    pd.DataFrame({
        "run_id": ["fp32-z0-w1", "fp32-z0-w1-r2", "fp32-z0-w2", "fp32-z1-w1", "bf16-z0-w1", "bf16-z0-w1-r2"],
        "status": ["ok", "ok", "ok", "failed", "ok", "ok"],
        "precision": ["fp32", "fp32", "fp32", "fp32", "bf16", "bf16"],
        "world_size": [1, 1, 2, 1, 1, 1],
        "mfu": [0.10, 0.30, 0.20, None, 0.05, 0.07],
        "device_type": ["cpu"] * 6,
        "device_name": ["AMD EPYC"] * 6,
    }).to_parquet(tmp_path / "metrics.parquet")
    base = ["time", "--params", "1B", "--tokens", "1e10", "--gpus", "8", "--gpu", "H100", "--precision", "fp32"]
    code, out, _ = _estimate(capsys, *base, "--mfu-from", str(tmp_path), "--json")
    result = json.loads(out)
    assert code == 0 and result["mfu"] == pytest.approx(0.20)  # the median of the two ok fp32 runs at world size 1
    assert result["mfu_source"]["runs"] == ["fp32-z0-w1", "fp32-z0-w1-r2"]
    assert "says nothing about what a GPU reaches" in result["note"]
    code, out, _ = _estimate(capsys, *base, "--mfu-from", str(tmp_path))
    assert "MFU 20.0% measured: the median of 2 ok fp32 run(s)" in out and "measured on CPU" in out
    code, _, err = _estimate(capsys, *base[:-1], "fp16", "--mfu-from", str(tmp_path))
    assert code == 2 and "no ok run of precision fp16 at world size 1 with an MFU (precisions measured at world size 1: " \
                         "bf16, fp32)" in err
    code, _, err = _estimate(capsys, *base, "--mfu", "0.4", "--mfu-from", str(tmp_path))
    assert code == 2 and "not both" in err
    code, _, err = _estimate(capsys, *base, "--mfu-from", str(tmp_path / "nowhere"))
    assert code == 2 and "scalelab collect" in err
    bf16 = json.loads(_estimate(capsys, "time", "--model", "llama3.2-1b", "--tokens", "1e10", "--gpus", "8", "--gpu", "H100",
                                "--mfu-from", str(tmp_path), "--json")[1])
    try:
        code = main(["plan", "--model", "llama3.2-1b", "--gpus", "8", "--gpu", "H100", "--global-batch", "64", "--tokens",
                     "1e10", "--precision", "bf16", "--mfu-from", str(tmp_path)])
    except SystemExit as exited:
        code = exited.code
    out = capsys.readouterr().out
    assert code == 0 and bf16["mfu"] == pytest.approx(0.06) and "MFU 6.0% without communication" in out
    assert "note: measured on CPU" in out and "measured on CPU" in bf16["note"]


def test_estimate_says_whether_fp8_pays_at_the_models_width(capsys):
    code, out, _ = _estimate(capsys, "memory", "--model", "gpt2-medium", "--world-size", "8")
    assert code == 0 and "fp8 against bf16: costs at d_model 1024: about 0.84x bf16" in out and "H200" in out
    code, out, _ = _estimate(capsys, "memory", "--params", "1e9", "--world-size", "8")
    assert code == 0 and "fp8 against bf16" not in out  # no shape, no width to judge by


def test_an_mfu_prints_as_given_not_rounded_to_a_whole_percent(capsys):
    """`estimate time --mfu 0.397` printed "MFU 40%" (issue #41)."""
    code, out, _ = _estimate(capsys, "time", "--params", "1e9", "--tokens", "1e12", "--gpus", "8", "--gpu", "H100",
                             "--mfu", "0.397")
    assert code == 0 and "at MFU 39.7%:" in out, out
    # to the digit given (issue #44), in scaling and plan too; a default or measured MFU to one decimal
    for mfu, shown in (("0.3975", "39.75%"), ("0.4", "40.0%"), ("0.41234", "41.234%")):
        code, out, _ = _estimate(capsys, "time", "--params", "1e9", "--tokens", "1e12", "--gpus", "8", "--gpu", "H100",
                                 "--mfu", mfu)
        assert f"at MFU {shown}:" in out, out
        code, out, _ = _estimate(capsys, "scaling", "--model", "gpt2", "--zero-stage", "3", "--gpu", "H100", "--gpus", "8",
                                 "--mfu", mfu)
        assert f"at MFU {shown} without communication (--mfu)" in out, out
    from scalelab.cli import main

    assert main(["plan", "--model", "gpt2", "--gpus", "8", "--gpu", "H100", "--global-batch", "64", "--tokens", "1B",
                 "--mfu", "0.3975"]) == 0
    assert "compute: MFU 39.75% without communication (--mfu)" in capsys.readouterr().out


def test_every_override_flag_wins_over_a_presets_field(capsys):
    """--seq, --vocab and --untied with --model: the flag wins over the preset's own context, vocabulary and
    head (issue #44: `estimate scaling --model llama3-8b --seq 8192` stopped with a TypeError)."""
    import argparse

    from scalelab.forecast.model_input import model_from_args as _model
    from scalelab.registries.presets import PRESETS

    base = dict(model="gpt2-medium", params=None, config=None, layers=None, d_model=None, heads=None, vocab=None, seq=None,
                untied=False)
    _, plain = _model(argparse.Namespace(**base))
    assert (plain.seq_len, plain.vocab_size, plain.tie_embeddings) == tuple(
        PRESETS["gpt2-medium"].shape[k] for k in ("seq_len", "vocab_size", "tie_embeddings"))
    n, cfg = _model(argparse.Namespace(**{**base, "seq": 8192, "vocab": 50_000, "untied": True}))
    assert (cfg.seq_len, cfg.vocab_size, cfg.tie_embeddings) == (8192, 50_000, False) and n > _model(argparse.Namespace(**base))[0]
    for kind, extra in (("memory", ["--world-size", "8"]), ("time", ["--tokens", "1e9", "--gpus", "8", "--gpu", "H100"]),
                        ("scaling", ["--gpu", "H100", "--gpus", "8,16", "--zero-stage", "3", "--inter-node", "ib-ndr"])):
        for flags in (["--seq", "8192"], ["--vocab", "50000"], ["--untied"]):
            code, _, err = _estimate(capsys, kind, "--model", "llama3-8b", *flags, *extra)
            assert code == 0, (kind, flags, err)


def test_scaling_at_a_fixed_global_batch_accumulates_each_gpus_share(capsys):
    """--global-batch (issue #44): each GPU's share G/n in micro-batches of at most --micro-batch, accumulated; the
    time holds every micro-batch's compute and FSDP's per-micro-batch gathers, the memory one micro-batch's
    activations; --activation-checkpointing adds the recompute to the time (MFU counts model FLOPs) and
    takes the checkpointed activations."""
    from scalelab.forecast.inputs import EstimateError
    from scalelab.forecast.step import batch_plan

    assert batch_plan(None, 4, 64) == (4, 1)  # a fixed per-GPU batch: weak scaling, as before
    assert batch_plan(512, 2, 8) == (2, 32) and batch_plan(512, 2, 64) == (2, 4) and batch_plan(512, 16, 256) == (2, 1)
    assert batch_plan(48, 5, 8) == (3, 2)  # a share of 6 in the largest micro-batch up to 5 that divides it
    with pytest.raises(EstimateError, match="does not split evenly over 24 GPUs"):
        batch_plan(512, 2, 24)
    base = ["scaling", "--model", "llama3-8b", "--seq", "8192", "--zero-stage", "3", "--gpu", "H100", "--gpus", "8,64",
            "--inter-node", "ib-ndr", "--micro-batch", "2", "--json"]
    code, out, err = _estimate(capsys, *base, "--global-batch", "512")
    assert code == 0, err
    fixed = json.loads(out)
    (r8, r64) = fixed["rows"]
    assert (r8["micro_batch"], r8["accumulation_steps"], r64["accumulation_steps"]) == (2, 32, 4)
    assert r8["tokens_per_gpu_per_step"] == 64 * 8192 == 8 * r64["tokens_per_gpu_per_step"]
    assert r8["compute_s"] == pytest.approx(8 * r64["compute_s"])  # compute follows the share
    assert r8["collective_calls"]["all_gather"] == 8 * r64["collective_calls"]["all_gather"]  # gathers per micro-batch
    code, out, _ = _estimate(capsys, *base)  # a fixed per-GPU batch of 2 sequences holds the same micro-batch
    weak = json.loads(out)
    assert weak["rows"][0]["accumulation_steps"] == 1
    # the same micro-batch; accumulated, the gradients of the earlier micro-batches exist at the last one's peak
    grads = model_state.model_state_bytes(fixed["n_params"], 3, 8, "bf16").grads / 2 ** 30
    assert fixed["rows"][0]["peak_memory_gib"] == pytest.approx(weak["rows"][0]["peak_memory_gib"] + grads, rel=0.02)
    code, out, _ = _estimate(capsys, *base, "--global-batch", "512", "--activation-checkpointing")
    checkpointed = json.loads(out)
    cfg_ratio = 1 + checkpointed["recompute_flops_per_token"] / checkpointed["flops_per_token"]
    assert checkpointed["rows"][0]["compute_s"] == pytest.approx(r8["compute_s"] * cfg_ratio)
    assert checkpointed["rows"][0]["mfu"] < r8["mfu"] and checkpointed["rows"][0]["peak_memory_gib"] < r8["peak_memory_gib"] / 2
    code, out, _ = _estimate(capsys, *base[:-1], "--global-batch", "512")
    assert code == 0 and "global batch 512 sequences" in out and "2 x 32" in out
    from scalelab.registries.presets import PRESETS

    cfg = ModelConfig(**{**PRESETS["llama3-8b"].shape, "seq_len": 8192})
    assert checkpointed["recompute_flops_per_token"] == flops.recompute_flops_per_token(cfg)  # the run's own formula


def test_a_forecast_priced_as_scalelab_runs_counts_sequence_parallelism_in_its_memory(capsys):
    """Priced as scalelab runs, the forecast's peak is the run's own formula for the same step (peak_memory over
    RankStep), sequence parallelism included (it was left out, over-stating the peak)."""
    from scalelab.formulas.peak_memory import peak_memory
    from scalelab.formulas.rank_step import RankStep
    from scalelab.formulas.tensor_parallelism import tensor_parallel_params
    from scalelab.registries.presets import PRESETS

    base = ["scaling", "--model", "llama3-8b", "--zero-stage", "3", "--gpu", "H100", "--gpus", "64", "--inter-node",
            "ib-ndr", "--precision", "bf16", "--tensor-parallel", "4", "--micro-batch", "2", "--global-batch", "256",
            "--json"]
    peaks = {}
    for sp in (False, True):
        code, out, err = _estimate(capsys, *base, *(["--sequence-parallel"] if sp else []))
        assert code == 0, err
        peaks[sp] = json.loads(out)["rows"][0]["peak_memory_bytes"]
    cfg = ModelConfig(**PRESETS["llama3-8b"].shape)
    local = tensor_parallel_params(cfg, flops.param_count(cfg), 4)  # one rank's share under TP 4
    for sp in (False, True):
        step = RankStep("bf16", 3, 16, 2, 8, tensor_parallel=4, sequence_parallel=sp)
        assert peaks[sp] == pytest.approx(peak_memory(cfg, local, step).total, rel=1e-9), sp
    assert peaks[True] < peaks[False]


# ----------------------------------------------------------------------------- the subcommands' answers


def test_estimate_json_outputs(capsys):
    mem = json.loads(_estimate(capsys, "memory", "--params", "7.5e9", "--world-size", "64", "--unit", "GB", "--json")[1])
    paper = {(r["precision"], r["zero_stage"]): r["paper_total_gb"] for r in mem["rows"]}  # keys follow --unit
    assert round(paper[("bf16", 1)], 1) == 31.4
    shaped = json.loads(_estimate(capsys, "memory", "--layers", "24", "--d-model", "1024", "--vocab", "50257", "--seq", "1024",
                             "--micro-batch", "8", "--world-size", "8", "--json")[1])
    assert shaped["n_params"] == flops.param_count(ModelConfig(24, 1024, 16, 1024, True, 50257))
    assert all(r["peak_gib"] > r["pytorch_total_gib"] for r in shaped["rows"])
    t = json.loads(_estimate(capsys, "time", "--params", "7e9", "--tokens", "1e12", "--gpus", "256", "--gpu", "h100", "--mfu", "0.4", "--json")[1])
    assert t["days"] == pytest.approx(4.797, abs=1e-3)
    fit = json.loads(_estimate(capsys, "fit", "--gpu-memory-gib", "80", "--world-size", "8", "--json")[1])
    assert len(fit["rows"]) == 12
    fit_gb = json.loads(_estimate(capsys, "fit", "--gpu-memory", "80", "--unit", "GB", "--world-size", "8", "--json")[1])
    assert fit_gb["gpu_memory_gb"] == 80 and fit_gb["unit"] == "GB"
    by_row = {(r["precision"], r["zero_stage"]): r["pytorch_max_params"] for r in fit_gb["rows"]}
    assert by_row[("bf16", 3)] == pytest.approx(80e9 * 8 / 16)  # 16 bytes per parameter, sharded 8 ways
    assert json.loads(_estimate(capsys, "time", "--params", "7e9", "--tokens", "1e12", "--gpus", "256", "--gpu", "h100",
                           "--precision", "fp8", "--json")[1])["peak_flops_per_gpu"] == pytest.approx(1979e12)


SEVEN_B = ["--layers", "32", "--d-model", "4096", "--vocab", "32000", "--seq", "4096", "--micro-batch", "1"]


def test_advise_climbs_the_ladder(capsys):
    """8 x 80 GiB for a 6.6B model: DDP (16 bytes per parameter, unsharded) does not fit; ZeRO-2 does."""
    out = json.loads(_estimate(capsys, "advise", *SEVEN_B, "--gpu-memory", "80", "--gpus", "8", "--json")[1])
    fits = [r["fits"] for r in out["rungs"]]
    assert fits == [False, False, True, True] and out["advice"].startswith("use ZeRO stage 2")
    n = out["n_params"]
    assert out["rungs"][0]["model_state_gib"] == pytest.approx(16 * n / 2**30)
    assert out["rungs"][3]["model_state_gib"] == pytest.approx(16 * n / 8 / 2**30)


def test_advise_falls_back_to_lora_with_its_rank_budget(capsys):
    """One 80 GiB GPU: no stage shards anything at world size 1, so LoRA: frozen fp32 weights
    (4 bytes each) plus 16 bytes per trainable parameter, 16 x d_model x rank per block."""
    out = json.loads(_estimate(capsys, "advise", *SEVEN_B, "--gpu-memory", "80", "--gpus", "1", "--json")[1])
    assert not any(r["fits"] for r in out["rungs"])
    lora, n = out["lora"], out["n_params"]
    cfg = ModelConfig(32, 4096, 64, 4096, True, 32000)
    assert lora_training.lora_trainable_params(cfg, 1) == 32 * 16 * 4096
    assert lora["per_rank_gib"] == pytest.approx(16 * 32 * 16 * 4096 / 2**30)
    assert out["budget_gib"] == pytest.approx(80 - 2 - 0.05 * 80)  # less the reserve plan keeps (CUDA, NCCL, fragmentation)
    budget = (out["budget_gib"] - lora["frozen_and_in_step_gib"]) / lora["per_rank_gib"]
    # the largest power of two within the budget (1024 since fp16/bf16 stages 2 and 3 compute with 16-bit
    # parameters under MixedPrecisionPolicy: smaller activations leave LoRA more room; 512 before)
    power = lora["rank_power_of_two"]
    assert lora["max_rank"] == int(budget) and power & (power - 1) == 0 and power <= lora["max_rank"] < 2 * power
    assert lora["frozen_and_in_step_gib"] > 4 * n / 2**30, "frozen weights plus the step's activations"
    assert out["advice"].startswith("switch to LoRA")
    tight = json.loads(_estimate(capsys, "advise", "--layers", "80", "--d-model", "8192", "--vocab", "32000", "--seq", "4096",
                            "--micro-batch", "1", "--gpu-memory", "80", "--gpus", "8", "--json")[1])
    assert tight["lora"]["max_rank"] == 0 and "does not fit even with LoRA" in tight["advice"]


def test_claim_check_says_when_a_throughput_exceeds_the_hardware(capsys):
    impossible = json.loads(_estimate(capsys, "claim", "--params", "70e9", "--tokens-per-s", "2e6", "--gpus", "64", "--gpu", "H100",
                                 "--json")[1])
    assert impossible["implied_mfu"] == pytest.approx(2e6 * 6 * 70e9 / (64 * 989.5e12))
    assert impossible["verdict"].startswith("impossible as stated")
    plausible = _estimate(capsys, "claim", "--params", "7e9", "--tokens", "1e12", "--days", "30", "--gpus", "256", "--gpu", "H100")[1]
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
def test_estimate_bad_input_is_a_clear_error(capsys, args, message):
    code, _, err = _estimate(capsys, *args)
    assert code == 2 and message in err, err


SCALED = ["scaling", "--model", "llama3-8b", "--gpu", "H100", "--inter-node", "ib-ndr", "--gpus", "8,16,32",
          "--global-batch", "256"]


@pytest.mark.parametrize("args, message", [
    (["--zero-stage", "1", "--tensor-parallel", "2"],
     "--trainer scalelab, --gpus 8: scalelab does not run it: zero_stage 1 with tensor parallelism"),
    (["--zero-stage", "3", "--tensor-parallel", "2", "--sequence-parallel", "--pipeline-parallel", "2"],
     "scalelab does not run it: sequence_parallel with pipeline parallelism is not run"),
    (["--zero-stage", "3", "--sequence-parallel"], "--sequence-parallel splits the activations over a tensor-parallel"),
    (["--zero-stage", "3", "--trainer", "megatron"], "--zero-stage 3: the megatron trainer is priced at ZeRO stages 0 and 1"),
])
def test_estimate_refuses_what_the_trainer_priced_does_not_run_as_plan_leaves_it_out(capsys, args, message):
    """estimate scaling and plan read one rule (scalelab.forecast.runnable): what plan leaves out as not run by the
    trainer priced, estimate refuses in one line, instead of pricing it."""
    code, _, err = _estimate(capsys, *SCALED, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    if "megatron" not in args and "--tensor-parallel" in args and "--pipeline-parallel" not in args:
        code, _, err = _estimate(capsys, *SCALED, *args, "--trainer", "megatron")  # the trainers that scale run it
        assert code == 0, err


def test_a_plan_for_a_pipeline_degree_the_blocks_do_not_split_into_says_so_first(capsys):
    """Nothing to price at --pipeline-parallel 3 (64 GPUs, 32 blocks): the layouts' reasons lead the one-line refusal,
    not the strategies' (they followed them, and the cause was among the "more left out")."""
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", "llama3-8b", "--gpu", "H100", "--inter-node", "ib-ndr", "--seq", "8192", "--tokens",
              "1T", "--gpus", "64", "--global-batch", "512", "--pipeline-parallel", "3"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and "no configuration to price: PP 3 x TP 1: does not divide --gpus 64" in err, err


def test_estimate_and_plan_say_the_same_about_what_fits(capsys):
    """One budget: the GPU's memory less the reserve a prediction does not count. A peak of 77 GiB on an 80 GiB H100
    fits neither (it did fit estimate's full 80 GiB)."""
    from scalelab.forecast.step import fits_memory
    from scalelab.registries import hardware

    h100 = hardware.gpu_by_name("H100")
    assert main(["plan", "--model", "llama3-8b", "--gpus", "8", "--gpu", "H100", "--inter-node", "ib-ndr",
                 "--global-batch", "256", "--tokens", "1T", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    budget = plan["budget_gib"] * 2 ** 30
    assert fits_memory(budget, h100) and not fits_memory(budget + 1, h100) and fits_memory(1.0, None) is None
    assert fits_memory(77 * 2 ** 30, h100) is False
    for row in plan["rows"]:
        assert row["fits"] == fits_memory(row["peak_memory_bytes"], h100), row
