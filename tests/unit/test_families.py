"""Model families (issue #30): the Llama family beside GPT-2, presets of published shapes, the
user's own module. In process: parameter counts (exact, and each preset's published figure),
FLOPs per token against torch.utils.flop_counter, activations against autograd's saved tensors,
LoRA on the SwiGLU projections, config errors, the estimate CLI. Real torchrun/gloo runs: fp32
loss parity across stages and world sizes with the single-process reference, model state and
activations against the formulas, the levers, and a model the test suite defines."""
import json

import pytest
import torch
import yaml

from scalelab.config import SCHEMA, ConfigError, ModelConfig, model_config
from scalelab.formulas import activation_memory, flops, lora_training
from scalelab.harness import REPO_ROOT
from scalelab.planning.run_plan import result_params, run_plan
from scalelab.planning.sweep import RunPoint, sweep_points
from scalelab.planning.validation import check_config
from scalelab.registries.families import FAMILIES, llama_ffn_dim
from scalelab.registries.presets import PRESETS
from scalelab.run.activations import SavedActivationMeter
from scalelab.run.lora import LoRALinear, apply_lora, trainable_parameters
from scalelab.run.model import Llama, build_model, counted
from scalelab.run.precision import autocast
from support.families import LLAMA, _llama

"""The llama shape the runs train: grouped-query attention 4:2, SwiGLU 96 (seq_len 32 from tiny_config)."""


# ----------------------------------------------------------------------------- formulas, in process
@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_count_as_the_published_checkpoints(name):
    """Each preset's parameter count is the figure its source states (embedding, untied head and
    norms included; GPT-2's tied head once); scalelab's own tiny shape is held to its module."""
    preset = PRESETS[name]
    cfg = ModelConfig(**preset.shape)
    if preset.published_params is None:
        assert flops.param_count(cfg) == build_model(cfg).num_parameters()
    else:
        assert flops.param_count(cfg) == preset.published_params, preset.source
    assert preset.source


def test_the_schema_lists_the_presets():
    models = SCHEMA["properties"]["models"]["additionalProperties"]["properties"]
    assert models["preset"]["enum"] == list(PRESETS)
    assert models["family"]["enum"] == list(FAMILIES) == ["gpt2", "llama"]


@pytest.mark.parametrize("shape", [
    {},  # grouped-query 4:2
    {"n_kv_heads": None, "ffn_dim": None},  # full multi-head attention, SwiGLU by Meta's rule (256)
    {"n_kv_heads": 1, "n_layers": 3, "d_model": 48, "n_heads": 6, "ffn_dim": 128},  # multi-query
])
def test_llama_counts_and_flops_are_the_modules(shape):
    """Parameters exact; FLOPs per token (6N + the attention term in full, causal or not) and the
    recompute of checkpointing equal what torch.utils.flop_counter counts on the module."""
    cfg = _llama(**shape)
    assert flops.param_count(cfg) == Llama(cfg).num_parameters()
    assert flops.block_param_count(cfg) == sum(p.numel() for p in Llama(cfg).blocks[0].parameters())
    own = counted(cfg)
    assert own["flops_per_token"] == flops.flops_per_token(cfg)
    assert own["block_forward_flops_per_token"] == flops.recompute_flops_per_token(cfg)
    # the causal convention: the attention term 12 L d T in full, 6 L d T halved
    assert flops.flops_per_token(cfg) - flops.flops_per_token(cfg, causal_halved=True) == 6 * cfg.n_layers * cfg.d_model * 32
    # GPT-2's formula is unchanged and equally the module's
    gpt = ModelConfig(2, 64, 4, 64, True, 256)
    assert counted(gpt)["flops_per_token"] == flops.flops_per_token(gpt) == 786432


def test_meta_rule_for_the_swiglu_width():
    assert llama_ffn_dim(ModelConfig(d_model=4096, n_heads=32, family="llama")) == 11008  # Llama 2 7B's
    assert llama_ffn_dim(ModelConfig(d_model=64, family="llama")) == 256
    assert llama_ffn_dim(ModelConfig(d_model=64, family="llama", ffn_dim=100)) == 100


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("micro_batch, accumulation", [(4, 1), (1, 4)])
def test_llama_activations_are_predicted_exactly(precision, checkpointing, micro_batch, accumulation):
    """Autograd's saved tensors (SavedActivationMeter, as runs measure them) inside and outside
    the blocks equal the llama formulas, with fp32 parameters (stages 0 and 1: fp32, or autocast)."""
    cfg, cpu = _llama(), torch.device("cpu")
    torch.manual_seed(0)
    model = Llama(cfg)
    model.set_activation_checkpointing(checkpointing)
    tokens = torch.randint(0, 256, (micro_batch * accumulation, 33), generator=torch.Generator().manual_seed(0))
    chunk = tokens[:micro_batch]
    with SavedActivationMeter(model, model.blocks) as meter, autocast(precision, cpu):
        model(chunk[:, :-1], chunk[:, 1:])
    assert meter.inside_blocks == activation_memory.block_activation_bytes(cfg, micro_batch, precision, checkpointing, zero_stage=0)
    assert meter.outside_blocks == activation_memory.outside_block_activation_bytes(cfg, micro_batch, precision, accumulation, 0)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("micro_batch", [1, 4])
def test_llama_activations_with_16_bit_parameters_are_predicted_exactly(precision, checkpointing, micro_batch):
    """16-bit parameters (as FSDP2's MixedPrecisionPolicy gathers them at stages 2 and 3; its cast of each block's
    inputs as the fp32 RoPE tables' per-block cast): each RMSNorm upcasts its 16-bit input and keeps the copy, so
    without checkpointing nothing keeps a block's input, and it is not counted. It was, once: its address, freed
    after the block, went to a later tensor of the same size now and then, which a count by address then missed."""
    cfg, cpu = _llama(), torch.device("cpu")
    torch.manual_seed(0)
    model = Llama(cfg).to(getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[precision]))
    model.rope_cos, model.rope_sin = model.rope_cos.float(), model.rope_sin.float()
    model.set_activation_checkpointing(checkpointing)
    chunk = torch.randint(0, 256, (micro_batch, 33), generator=torch.Generator().manual_seed(0))
    for _ in range(3):  # the same count each time, whatever addresses the allocator hands out
        with SavedActivationMeter(model, model.blocks) as meter, autocast(precision, cpu):
            model(chunk[:, :-1], chunk[:, 1:])
        assert meter.inside_blocks == activation_memory.block_activation_bytes(cfg, micro_batch, precision, checkpointing,
                                                                        zero_stage=3)
        assert meter.outside_blocks == activation_memory.outside_block_activation_bytes(cfg, micro_batch, precision, 1, 3)


H100_SAVED = [  # (shape, precision, bytes inside the blocks), micro-batch 4, no checkpointing, fp32 parameters
    ((4, 512, 8, 2, 1376, 1024), "fp32", 1166671872), ((4, 512, 8, 2, 1376, 1024), "bf16", 397148224),
    ((2, 256, 4, 4, 704, 512), "fp32", 80052256), ((2, 256, 4, 4, 704, 512), "bf16", 53903392),
    ((3, 384, 6, 1, 1024, 256), "fp32", 107110400), ((3, 384, 6, 1, 1024, 256), "bf16", 61341744),
]
"""Measured on an NVIDIA H100 (torch 2.11, CUDA 13) by SavedActivationMeter around one forward of
scalelab's Llama (the same code as here): the GPU's kernels save less than the CPU's (a fused
RMSNorm) and, for fp32 grouped-query attention, more (SDPA's math path keeps the probabilities)."""


@pytest.mark.parametrize("shape, precision, measured", H100_SAVED)
def test_llama_activations_measured_on_a_gpu(shape, precision, measured):
    layers, d, heads, kv, ffn, seq = shape
    cfg = ModelConfig(layers, d, heads, seq, False, 8192, "llama", kv, ffn)
    predicted = activation_memory.block_activation_bytes(cfg, 4, precision, False, zero_stage=0, device_type="cuda")
    assert abs(predicted - measured) <= 64, (predicted, measured)  # a few bytes of CUDA kernels' own state
    assert activation_memory.block_activation_bytes(cfg, 4, precision, False, zero_stage=0) != predicted  # the CPU's differ


def test_lora_adapts_the_attention_and_swiglu_projections():
    cfg = _llama()
    torch.manual_seed(0)
    full = Llama(cfg)
    torch.manual_seed(0)
    lora = Llama(cfg)
    added = apply_lora(lora, 4, alpha=16)
    adapted = {name.split(".", 2)[2] for name, m in lora.named_modules() if isinstance(m, LoRALinear)}
    assert adapted == set(lora_training.lora_targets(cfg)) == {"attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down"}
    assert added == trainable_parameters(lora) == lora_training.lora_trainable_params(cfg, 4)
    # q 32+32, k and v 32+16, o 32+32, gate and up 32+96, down 96+32 per rank, per block
    assert added == 2 * 4 * (64 + 48 + 48 + 64 + 128 + 128 + 128)
    idx = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    assert lora(idx[:, :-1], idx[:, 1:]).item() == full(idx[:, :-1], idx[:, 1:]).item()  # B = 0: the twin's loss


def test_a_users_module_is_counted_not_formulated():
    from models.mixer import param_count

    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, seq_len=32, vocab_size=256, module="models.mixer:build")
    own = counted(cfg)
    assert own["n_params"] == param_count(cfg) == build_model(cfg).num_parameters()
    d, T, V = 32, 32, 256  # per token: 6 x (blocks' 4 d^2 + head V d) + the token mixing (6 T d per block)
    assert own["flops_per_token"] == 6 * (2 * 4 * d * d + V * d) + 2 * 6 * T * d
    with pytest.raises(ValueError, match="user's module has no parameter formula"):
        flops.param_count(cfg)
    with pytest.raises(ValueError, match="no activation formula"):
        activation_memory.block_activation_bytes(cfg, 4, "fp32", False)
    assert len(build_model(cfg).blocks) == 2


# ----------------------------------------------------------------------------- config
def _config(models: dict, names: list[str]) -> dict:
    config = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    config["models"] = models
    config["sweep"]["model"] = names
    return config


def test_a_models_entry_takes_a_family_or_a_preset():
    config = _config({"llama": LLAMA, "tiny": {"preset": "llama-tiny", "n_layers": 1},
                      "gpt": {"n_layers": 1, "d_model": 32, "n_heads": 2}}, ["gpt", "llama", "tiny"])
    check_config(config, REPO_ROOT)
    llama = model_config(config, name="llama")
    assert (llama.family, llama.n_kv_heads, llama.ffn_dim, llama.tie_embeddings) == ("llama", 2, 96, False)
    tiny = model_config(config, name="tiny")  # the preset's shape, its own n_layers, the config's seq_len
    assert (tiny.family, tiny.n_layers, tiny.d_model, tiny.n_kv_heads, tiny.seq_len) == ("llama", 1, 64, 2, config["model"]["seq_len"])
    assert model_config(config, name="gpt").family == "gpt2"
    ids = {p.run_id for p in sweep_points(config)}
    assert {"fp32-z0-w1-gpt", "fp32-z0-w1-llama", "fp32-z0-w1-tiny"} <= ids


def test_gpt2_runs_keep_their_params_and_ids():
    """The new model keys have defaults: a GPT-2 run's Snakemake params (what reruns it) and run id
    are what they were, so an upgrade reruns no cached run."""
    config = _config({"small": {"n_layers": 1, "d_model": 16, "n_heads": 2}}, ["base", "small"])
    check_config(config, REPO_ROOT)
    for point in sweep_points(config)[:4]:
        params = result_params(config, run_plan(config, point, device="cpu"))
        assert set(params["model"]) <= {"n_layers", "d_model", "n_heads", "seq_len", "tie_embeddings"}, params
    assert result_params(config, run_plan(config, RunPoint("fp32", 0, 1), device="cpu"))["model"] == {}
    assert result_params(config, run_plan(config, RunPoint("fp32", 0, 1, model="small"), device="cpu"))["model"] == {"n_layers": 1, "d_model": 16, "n_heads": 2}


@pytest.mark.parametrize("entry, message", [
    ({**LLAMA, "n_kv_heads": 3}, "models.m.n_kv_heads=3 does not divide n_heads=4"),
    ({"n_layers": 1, "n_kv_heads": 2}, "models.m.n_kv_heads=2 applies to family llama"),
    ({**LLAMA, "d_model": 36}, "head width d_model/n_heads=9 is odd"),
    ({"module": "no_such_package.mod:build"}, "models.m.module='no_such_package.mod:build': no module 'no_such_package"),
    ({"module": "models.mixer:build", "family": "llama"}, "models.m: family does not apply to module="),
])
def test_bad_model_entries_are_one_line_naming_the_key(entry, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_config(_config({"m": entry}, ["m"]), REPO_ROOT)


def test_unknown_preset_and_family_are_schema_errors():
    from scalelab.planning.validation import validate_config

    with pytest.raises(ConfigError, match=r"models.m.preset: 'llama4' is not one of .*; did you mean llama3-8b\?"):
        validate_config(_config({"m": {"preset": "llama4"}}, ["m"]), REPO_ROOT)
    with pytest.raises(ConfigError, match=r"models.m.family: 'mistral' is not one of \['gpt2', 'llama'\]"):
        validate_config(_config({"m": {"family": "mistral"}}, ["m"]), REPO_ROOT)


# ----------------------------------------------------------------------------- estimate
def test_estimate_by_preset_name(capsys):
    from scalelab.cli import main

    assert main(["estimate", "memory", "--model", "llama3-8b", "--world-size", "8", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)
    assert memory["n_params"] == 8_030_261_248 and memory["model"] == "llama3-8b" and memory["family"] == "llama"
    row = next(r for r in memory["rows"] if (r["precision"], r["zero_stage"]) == ("bf16", 3))
    assert row["pytorch_total_gib"] == pytest.approx(16 * 8_030_261_248 / 8 / 2**30)
    assert main(["estimate", "time", "--model", "llama3-70b", "--tokens", "15T", "--gpus", "2048", "--gpu", "H100",
                 "--json"]) == 0
    time = json.loads(capsys.readouterr().out)
    cfg = ModelConfig(**PRESETS["llama3-70b"].shape)
    assert time["n_params"] == 70_553_706_496 and time["flops_per_token"] == flops.flops_per_token(cfg)
    assert main(["estimate", "advise", "--model", "llama2-70b", "--gpus", "8", "--gpu-memory", "80", "--micro-batch", "1",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_params"] == 68_976_648_192
    assert main(["estimate", "models"]) == 0
    listing = capsys.readouterr().out
    for name, preset in PRESETS.items():
        assert name in listing and (preset.published_params is None or f"{preset.published_params:,}" in listing)
    assert main(["estimate", "memory", "--model", "llama5"]) == 2
    assert "--model 'llama5' is not a preset" in capsys.readouterr().err
"""Every stage, both world sizes, in five runs (each held to the one single-process reference)."""


# ----------------------------------------------------------------------------- the report
def test_the_report_groups_a_sweep_that_mixes_families(tmp_path):
    """The synthetic baselines twice, once as a GPT-2 model and once as a llama one: the report's
    families table has a row per model, each family's figures are drawn apart (figures/<family>/),
    and fp32 parity is held within each model (two models' losses differ; that is no warning),
    while a broken trajectory within one model still is."""
    import pandas as pd

    from devtools.fixtures import synthetic_results
    from scalelab.report.report import build_report, find_warnings

    synthetic_results(tmp_path, n_runs=24)
    runs, steps = pd.read_parquet(tmp_path / "metrics.parquet"), pd.read_parquet(tmp_path / "steps.parquet")
    ok_runs = runs[runs["status"] == "ok"]
    steps = steps[steps["run_id"].isin(ok_runs["run_id"])]
    # one fp32 trajectory per model, the llama model's higher
    steps["loss"] = 5.0 - steps["step"] * 0.01
    gpt = ok_runs.assign(model="gpt", model_family="gpt2")
    llama = ok_runs.assign(model="llama", model_family="llama", run_id=ok_runs["run_id"] + "-llama", n_kv_heads=2)
    mixed_steps = pd.concat([steps.assign(model="gpt"),
                             steps.assign(model="llama", run_id=steps["run_id"] + "-llama", loss=steps["loss"] + 1.0)])
    mixed = pd.concat([gpt, llama], ignore_index=True)
    assert not any("fp32 parity" in w for w in find_warnings(mixed, mixed_steps))
    broken = mixed_steps.copy()
    broken.loc[broken["run_id"] == llama["run_id"].iloc[0], "loss"] += 0.5
    assert any("fp32 parity broken" in w for w in find_warnings(mixed, broken))
    mixed.to_parquet(tmp_path / "metrics.parquet")
    mixed_steps.to_parquet(tmp_path / "steps.parquet")
    html = build_report(tmp_path, workers=1).read_text()
    assert "id=\"families\"" in html and "id=\"figures-gpt2\"" in html and "id=\"figures-llama\"" in html
    for family in ("gpt2", "llama"):
        assert (tmp_path / "report/figures" / family / "throughput.png").stat().st_size > 1000
        assert f"figures/{family}/throughput.png" in html
    assert "gpt2 family" in html and "llama family" in html  # the Trained lines


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_record_agrees_with_the_module_it_names(name):
    """scalelab.registries.families is the one place a family is described: for each record, the module
    class it names builds, and its counts, LoRA targets and own keys are the module's and the
    config's and the result columns' (a family added with a wrong record fails here)."""
    import dataclasses

    from scalelab.config import MODEL_FAMILY_KEYS
    from scalelab.planning.columns import RUN_COLUMNS
    from scalelab.registries.families import family
    from scalelab.run.lora import apply_lora

    record = family(name)
    cfg = ModelConfig(**{**PRESETS["llama-tiny"].shape, "family": name,
                         **({"tie_embeddings": False} if record.untied_head else {})})
    model = build_model(cfg)
    assert type(model).__name__ == record.module.rpartition(":")[2]
    assert flops.param_count(cfg) == model.num_parameters() == sum(p.numel() for p in model.parameters())
    assert flops.block_param_count(cfg) == sum(p.numel() for p in model.blocks[0].parameters())
    assert record.parameter_tensors(cfg) == len(list(model.parameters()))
    block = model.blocks[0]
    for path, (d_in, d_out) in lora_training.lora_targets(cfg).items():
        linear = block.get_submodule(path)
        assert (linear.in_features, linear.out_features) == (d_in, d_out), path
    assert apply_lora(model, 2, 4.0) == lora_training.lora_trainable_params(cfg, 2)
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    assert set(record.own_keys) <= fields & set(MODEL_FAMILY_KEYS) & set(RUN_COLUMNS)
    assert set(record.own_columns(cfg)) == set(record.own_keys)
    assert set(record.formulas) == {"parameters", "flops", "activations", "recompute"}


def test_a_llama_entry_ties_its_head_where_it_or_its_preset_says_so():
    """Llama 3.2 1B and 3B tie their heads: a models: entry of the llama family is untied by default, whatever
    model.tie_embeddings says for GPT-2's, and tied where the entry or its preset says so; the module then trains
    one weight for both, counted once as the formulas count it."""
    import torch

    from scalelab.config import model_config
    from scalelab.run.model import build_model

    config = {"model": {"tie_embeddings": True, "seq_len": 32},
              "models": {"untied": LLAMA, "tied": {**LLAMA, "tie_embeddings": True}, "preset": {"preset": "llama3.2-1b"}}}
    assert model_config(config, name="untied").tie_embeddings is False
    assert model_config(config, name="tied").tie_embeddings is True
    assert model_config(config, name="preset").tie_embeddings is True
    for name, tied in (("untied", False), ("tied", True)):
        cfg = model_config(config, name=name)
        with torch.device("meta"):
            model = build_model(cfg)
        assert (model.head.weight is model.wte.weight) is tied
        assert model.num_parameters() == flops.param_count(cfg)


def test_every_familys_own_key_is_read_back_from_a_row_and_held_by_the_model_identity():
    """A family's own keys come from the registry wherever a row is read: a row's model (predicted_columns.model_of_row)
    and the identity comparisons hold by (results.like.MODEL). A key added to a family is never dropped silently."""
    from scalelab.formulas.predicted_columns import model_of_row
    from scalelab.registries.families import FAMILIES, OWN_KEYS
    from scalelab.results.like import MODEL

    assert set(OWN_KEYS) == {k for f in FAMILIES.values() for k in f.own_keys} and OWN_KEYS
    assert set(OWN_KEYS) <= set(MODEL)
    row = {"n_layers": 2, "d_model": 32, "n_heads": 4, "seq_len": 32, "vocab_size": 256, "tie_embeddings": False,
           "model_family": "llama", "model_module": None}
    for key in OWN_KEYS:
        given = {"n_kv_heads": 2, "ffn_dim": 96, "rope_base": 500000.0}.get(key, 3)
        assert getattr(model_of_row({**row, key: given}), key) == given, key


def test_a_forecast_of_a_config_prices_the_head_the_sweep_of_that_file_trains(tmp_path, capsys):
    """`estimate --config` reads a models: entry's head as the workflow does: a llama entry is untied whatever
    model.tie_embeddings says for GPT-2's, and tied where the entry says so."""
    from scalelab.cli import main

    for tie in (None, True):
        entry = {**LLAMA, **({"tie_embeddings": tie} if tie is not None else {})}
        config = {"model": {"tie_embeddings": True, "seq_len": 32}, "models": {"l": entry}, "sweep": {"model": ["l"]}}
        path = tmp_path / f"tie-{tie}.yaml"
        path.write_text(yaml.safe_dump(config))
        assert main(["estimate", "memory", "--config", str(path), "--world-size", "1", "--json"]) == 0
        n_params = json.loads(capsys.readouterr().out)["n_params"]
        assert n_params == flops.param_count(model_config(config, name="l")), tie
        assert model_config(config, name="l").tie_embeddings is bool(tie)
