"""Tensor parallelism's planning (issue #43): which points run and why the others do not, the models
that cannot be split, and the reordering of GPT-2's fused q, k, v projection (tests/run/ runs it)."""
import pytest
import torch

from scalelab.config import ConfigError, ModelConfig
from scalelab.formulas import flops, tensor_parallelism
from scalelab.planning.run_plan import run_plan
from scalelab.planning.sweep import RunPoint, sweep_plan
from support import tiny_config


def test_tensor_parallel_runs_at_stage_0_and_with_fsdp2_over_the_data_parallel_ranks():
    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [0, 1, 3], "world_size": [2, 4], "tensor_parallel": [1, 2]})
    cfg["model"].update(n_heads=4, d_model=32)
    points, left_out = sweep_plan(cfg)
    split = sorted(p.run_id for p in points if p.tensor_parallel == 2)
    assert split == ["fp32-z0-w2-tp2", "fp32-z0-w4-tp2", "fp32-z3-w2-tp2", "fp32-z3-w4-tp2"]
    why = {p.run_id: reason for p, reason in left_out}
    assert "ZeroRedundancyOptimizer takes no DTensor parameters" in why["fp32-z1-w2-tp2"]
    assert all(p.bucket_mb is None for p in points if p.tensor_parallel == 2)  # no DDP, no buckets
    # the data-parallel ranks share the global batch: at w4 x tp2, two shares of 4 sequences
    plan = run_plan(cfg, next(p for p in points if p.run_id == "fp32-z3-w4-tp2"))
    assert (plan.micro_batch, plan.accumulation_steps) == (cfg["train"]["global_batch"] // 2, 1)


@pytest.mark.parametrize("overrides, left_out", [
    ({"zero_stage": [3], "world_size": [4], "replicas": [2]}, "hybrid sharding with tensor parallelism"),
    ({"zero_stage": [3], "world_size": [2], "tp": 4}, "does not divide world_size=2"),
    ({"zero_stage": [3], "world_size": [2], "lora_rank": [4]}, "LoRA adapters on split linears"),
    ({"zero_stage": [3], "world_size": [2], "precision": ["fp8"]}, "float8 linears are not split"),
    ({"zero_stage": [3], "world_size": [2], "compile": [True], "activation_checkpointing": [True]},
     "compiled checkpoint saves a DTensor's DeviceMesh"),
])
def test_what_tensor_parallelism_is_not_run_with_is_said(overrides, left_out):
    """A tensor-parallel degree no point of the sweep can take stops the plan with the reason."""
    overrides = dict(overrides)
    cfg = tiny_config(sweep={"precision": ["fp32"], "tensor_parallel": [1, overrides.pop("tp", 2)], **overrides})
    cfg["model"].update(n_heads=4, d_model=32)
    with pytest.raises(ConfigError, match=f"sweep.tensor_parallel=.*{left_out}"):
        sweep_plan(cfg)


def test_checkpoints_of_tensor_parallel_runs_are_refused_with_the_key_to_change():
    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [3], "world_size": [2], "tensor_parallel": [2]},
                      train={"checkpoint_every": 2})
    cfg["model"].update(n_heads=4, d_model=32)
    with pytest.raises(ConfigError, match=r"train\.checkpoint_every: 0"):
        sweep_plan(cfg)


@pytest.mark.parametrize("model, message", [
    ({"n_heads": 2, "d_model": 32}, "does not divide the model's n_heads 2"),
    ({"n_heads": 4, "d_model": 32, "family": "llama", "n_kv_heads": 1, "tie_embeddings": False}, "n_kv_heads 1"),
])
def test_a_model_that_cannot_be_split_stops_the_plan_naming_the_dimension(model, message):
    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [3], "world_size": [4], "tensor_parallel": [4]})
    cfg["model"].update(model)
    with pytest.raises(ConfigError, match=message):
        run_plan(cfg, RunPoint("fp32", 3, 4, tensor_parallel=4))


def test_gpt2s_fused_qkv_rows_are_reordered_by_head_and_back():
    """Rank r's contiguous third of the rows is its heads' q, then k, then v; the inverse restores the order."""
    from scalelab.run.tensor_parallel import head_major_rows

    rows = head_major_rows(4, 2).tolist()  # d 4 over 2 ranks: 2 rows of q, k and v each per rank
    assert rows == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]
    weight = torch.arange(12.0)
    assert torch.equal(weight[head_major_rows(4, 2)][torch.argsort(head_major_rows(4, 2))], weight)


def test_a_ranks_parameters_are_its_share_of_the_split_linears_and_the_rest_whole():
    cfg = ModelConfig(2, 64, 4, 32, True, 256)
    n = flops.param_count(cfg)
    split = 2 * (12 * 64 * 64 + 7 * 64)  # per block: qkv, proj, fc, proj weights and the colwise biases
    assert tensor_parallelism.tensor_parallel_params(cfg, n, 1) == n
    assert tensor_parallelism.tensor_parallel_params(cfg, n, 4) == n - split + split / 4
    assert tensor_parallelism.data_parallel_size(8, 2) == 4
    with pytest.raises(ValueError, match="does not divide"):
        tensor_parallelism.data_parallel_size(6, 4)


def test_the_report_pairs_a_split_run_with_its_twin_whose_micro_batch_is_its_share(tmp_path):
    """At one world size and global batch a tensor-parallel run's data-parallel rank takes T times its twin's
    micro-batch: the lever table pairs them on everything else (the accumulation too), as the report draws them."""
    from devtools.fixtures import synthetic_results
    from scalelab.report.levers import lever_pairs, lever_table
    from scalelab.report.report import load_tables

    synthetic_results(tmp_path, n_runs=96, n_steps=5)
    runs, _ = load_tables(tmp_path)
    split = runs["tensor_parallel"] == 2
    assert split.any()
    runs.loc[split, "micro_batch"] *= 2  # as a real split run resolves it
    pairs = lever_pairs(lever_table(runs), "tensor_parallel")
    alone = split & ~runs["sequence_parallel"]  # a sequence-parallel run pairs with its twin without it (its own lever)
    assert sorted(pairs["run_id"]) == sorted(runs.loc[alone, "run_id"])
    assert all(b == r.removesuffix("-tp2") for r, b in zip(pairs["run_id"], pairs["baseline_run_id"]))


def test_estimate_memory_takes_each_ranks_share_under_tensor_parallelism(capsys):
    """--tensor-parallel T: each rank holds its share of the blocks' linears, the stage works over the N/T
    data-parallel ranks; without the model's shape it stops, naming why."""
    import json

    from scalelab.cli import main
    from scalelab.registries.presets import PRESETS

    assert main(["estimate", "memory", "--model", "llama3-8b", "--world-size", "16", "--tensor-parallel", "8",
                 "--precision", "bf16", "--zero-stage", "0", "3", "--micro-batch", "1", "--unit", "GB", "--json"]) == 0
    rows = {r["zero_stage"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    cfg = ModelConfig(**PRESETS["llama3-8b"].shape)
    local = tensor_parallelism.tensor_parallel_params(cfg, flops.param_count(cfg), 8)
    assert rows[0]["pytorch_total_gb"] == pytest.approx(16 * local / 1e9)
    assert rows[3]["pytorch_total_gb"] == pytest.approx(16 * local / 2 / 1e9)  # ZeRO-3 over 2 data-parallel ranks
    assert rows[3]["tensor_parallel"] == 8 and rows[3]["peak_gb"] < rows[0]["peak_gb"]
    assert main(["estimate", "memory", "--params", "7e9", "--world-size", "8", "--tensor-parallel", "8"]) == 2
    assert "--tensor-parallel needs the model's shape" in capsys.readouterr().err
    assert main(["estimate", "memory", "--model", "llama3-8b", "--world-size", "12", "--tensor-parallel", "8"]) == 2
    assert "--tensor-parallel 8 does not divide --world-size 12" in capsys.readouterr().err


def test_tensor_parallel_runs_need_a_warm_up_step_to_count_their_collectives():
    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [3], "world_size": [2], "tensor_parallel": [2]},
                      train={"warmup_steps": 0})
    cfg["model"].update(n_heads=4, d_model=32)
    with pytest.raises(ConfigError, match=r"train\.warmup_steps >= 1"):
        sweep_plan(cfg)


def test_plan_and_estimates_refuse_a_degree_that_does_not_split_the_model(capsys):
    """As a run would: the degree must divide the heads, key/value heads and MLP width (llama3-8b: 32, 8, 14336);
    the plan ranks tensor parallelism only as scalelab runs it (stages 0, 2 and 3; not stage 1)."""
    import json

    from scalelab.cli import main

    assert main(["estimate", "scaling", "--model", "llama3-8b", "--zero-stage", "3", "--gpu", "H100", "--gpus", "6",
                 "--tensor-parallel", "3"]) == 2
    assert "--tensor-parallel 3 does not divide the model's n_heads 32" in capsys.readouterr().err
    ask = ["plan", "--model", "llama3-8b", "--gpus", "64", "--gpu", "H100", "--inter-node", "ib-ndr", "--global-batch", "512",
           "--seq", "8192", "--tokens", "1T"]
    with pytest.raises(SystemExit):
        main([*ask, "--tensor-parallel", "3"])
    assert "--tensor-parallel 3 does not divide" in capsys.readouterr().err
    assert main([*ask, "--json"]) == 0
    split = [r for r in json.loads(capsys.readouterr().out)["rows"] if r["tensor_parallel"] > 1]
    assert split and {r["strategy"] for r in split} == {0, 2, 3} and {r["precision"] for r in split} == {"bf16"}


def test_an_exported_torchtitan_config_carries_the_tensor_parallel_degree():
    """The data-parallel degrees are the world over T, the global batch the data-parallel ranks' shares."""
    from scalelab.report.export import not_carried, torchtitan_toml

    row = {"run_id": "bf16-z3-w4-tp2", "tokens_per_s": 1000.0, "zero_stage": 3, "world_size": 4, "tensor_parallel": 2,
           "replicas": 1, "precision": "bf16", "micro_batch": 4, "accumulation_steps": 1, "seq_len": 64, "grad_clip": 1.0}
    toml = torchtitan_toml(row)
    assert "tensor_parallel_degree = 2" in toml and "data_parallel_shard_degree = 2" in toml
    assert "global_batch_size = 8" in toml  # 4 sequences x 2 data-parallel ranks
    assert any("tensor parallelism over 2 ranks" in line for line in not_carried(row))
