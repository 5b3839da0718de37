"""GPU memory against another trainer's published runs: llm-foundry's MPT on A100 40GB cards ran at every row, so a
memory model of the recipe those runs used must predict each to fit; scalelab's own convention (its runs' recipe)
rejects most of them, which is why the recipe is a convention of its own."""
import pytest

from scalelab.config import ModelConfig
from scalelab.forecast import published_memory as pm
from scalelab.formulas import flops, foundry_style
from scalelab.formulas.rank_step import RankStep


def test_the_shapes_count_the_tables_parameters():
    for model, n_params in pm.NUM_PARAMS.items():
        layers, width, heads = pm.SHAPES[model]
        cfg = ModelConfig(n_layers=layers, d_model=width, n_heads=heads, seq_len=2048, tie_embeddings=True, vocab_size=pm.VOCAB)
        assert flops.param_count(cfg) == n_params, model
    # learned positions: the 1b at 16,384 tokens (the table's 1345310720)
    assert flops.param_count(pm.MemoryRun("1b", 16384, 8, 1, 8).cfg) == 1345310720


def test_every_run_that_ran_is_predicted_to_fit_under_its_recipe_and_most_not_under_scalelabs():
    rows = pm.validation()
    card, budget = pm.budget_gib()
    assert len(rows) == 51 and card == 40 and budget == pytest.approx(36.0)
    assert all(r["foundry_gib"] <= budget for r in rows)
    over = [r for r in rows if r["scalelab_gib"] > card]
    assert len(over) == 34  # the eager fp32 loss and autocast's LayerNorm copies: 42-52 GiB at sequence 2,048
    assert all(r["foundry_gib"] < r["scalelab_gib"] for r in rows)
    assert "| MPT-1b | 2,048 | 64 | 10 x 1 | 46.2 ! | 34.7 |" in pm.memory_document()


def test_the_recipe_by_hand_for_the_1b_at_64_gpus():
    """MPT-1b, sequence 2,048, micro-batch 10, 64 GPUs, no accumulation: 12 bytes of fp32 shards and Adam per parameter
    over 64 ranks; the bf16 root unit and two blocks; 24 blocks of 32 s b h bytes with the LayerNorms' statistics and the
    log-sum-exp; the final norm's and the head's inputs; the bf16 logits, kept and their gradient."""
    run = pm.MemoryRun("1b", 2048, 64, 10, 1)
    cfg, n = run.cfg, 1315950592
    s, b, h, v = 2048, 10, 2048, 50368
    block = 12 * h * h + 13 * h
    blocks = 24 * (32 * s * b * h + 16 * s * b + 4 * b * 16 * s)
    outside = 2 * b * s * h + 8 * b * s + 2 * b * s * h + 2 * b * s * v + 4 * b * s + 8 * b * (s + 1)
    expected = 12 * n / 64 + 2 * (2 * block + (n - 24 * block)) + blocks + outside + 2 * b * s * v
    assert foundry_style.peak_memory(cfg, n, RankStep("bf16", 3, 64, 10)).total == pytest.approx(expected)
    with pytest.raises(ValueError, match="gpt2 family"):
        foundry_style.block_activation_bytes(ModelConfig(family="llama", n_layers=2, d_model=64, n_heads=4), 1)


@pytest.mark.parametrize("change, named", [({"zero_stage": 2}, "ZeRO stage 2"), ({"precision": "fp16"}, "fp16"),
                                           ({"tensor_parallel": 2}, "tensor parallel 2"),
                                           ({"sequence_parallel": True}, "sequence parallelism"),
                                           ({"replicas": 2}, "2 replicas"), ({"cpu_offload": True}, "cpu offload"),
                                           ({"compiled": True}, "compile")])
def test_the_recipe_prices_only_the_step_it_describes(change, named):
    """FSDP FULL_SHARD over every rank in bf16, nothing else: any other step is refused, naming what differs, by the
    recipe itself and by the forecast (one rule: foundry_style.unpriced)."""
    import dataclasses

    from scalelab.forecast.inputs import EstimateError
    from scalelab.forecast.step import _foundry_memory

    run = pm.MemoryRun("1b", 2048, 64, 10, 1)
    step = RankStep("bf16", 3, 64, 10)
    assert foundry_style.unpriced(step) is None
    other = dataclasses.replace(step, **change)
    assert named in foundry_style.unpriced(other)
    with pytest.raises(ValueError, match=named):
        foundry_style.peak_memory(run.cfg, flops.param_count(run.cfg), other)
    with pytest.raises(EstimateError, match="--trainer llm-foundry prices"):
        _foundry_memory(_foundry_point(run), other)


def _foundry_point(run, trainer="llm-foundry", **kw):
    from scalelab.forecast.step import Point

    return Point(cfg=run.cfg, n_params=flops.param_count(run.cfg), key=3, precision="bf16", grad_reduce="compute",
                 micro_batch=run.micro_batch, global_batch=run.micro_batch * run.accumulation * run.gpus, trainer=trainer,
                 **kw)


def _a100_machine():
    from scalelab.forecast.step import Machine
    from scalelab.formulas import links
    from scalelab.registries import hardware

    return Machine(product=hardware.gpu_by_name(pm.GPU), peak_flops=flops.gpu_peak_flops(pm.GPU, "bf16"), mfu=0.4,
                   per_node=8, intra=links.parse_link("nvlink-a100", None), inter=links.parse_link("ib-hdr", None),
                   overlap_efficiency=0.05)


def test_the_llm_foundry_trainer_prices_every_published_row_by_its_recipe_and_each_fits():
    """--trainer llm-foundry: estimate scaling and plan take the recipe's peak (step._peak_memory), so each of the 51
    rows that ran on 40 GB cards is predicted to fit, where scalelab's own convention rejects 34."""
    from scalelab.forecast.predict import predict_point

    for r in pm.validation():
        row = predict_point(_foundry_point(r["run"]), _a100_machine(), r["run"].gpus)
        assert row["peak_memory_gib"] == pytest.approx(
            foundry_style.peak_memory(r["run"].cfg, flops.param_count(r["run"].cfg), RankStep(
                "bf16", 3, r["run"].gpus, r["run"].micro_batch, r["run"].accumulation)).total / 2**30)
        assert row["fits_memory"]


def test_the_llm_foundry_trainers_bytes_are_full_sharding_in_bf16_with_a_reduce_scatter_per_micro_batch():
    """FULL_SHARD under PURE: every block gathered in bf16 for forward and again for backward (2 k Psi x 2 bytes, as
    scalelab's stage 3 with a 16-bit gather), and composer reduce-scatters every micro-batch's gradients in bf16 (k Psi
    x 2 bytes, where scalelab's FSDP2 reduces once a step)."""
    from scalelab.forecast.predict import predict_point

    run = next(r for r in pm.ROWS if r.model == "1b" and r.seq_len == 2048 and r.gpus == 8)
    assert run.accumulation == 8
    foundry = predict_point(_foundry_point(run), _a100_machine(), 8)
    own = predict_point(_foundry_point(run, trainer="scalelab"), _a100_machine(), 8)
    psi = flops.param_count(run.cfg)
    assert foundry["collective_bytes"]["reduce_scatter"] == pytest.approx(8 * psi * 2)
    assert own["collective_bytes"]["reduce_scatter"] == pytest.approx(psi * 2)
    assert foundry["collective_bytes"]["all_gather"] == own["collective_bytes"]["all_gather"]
    assert foundry["collective_calls"]["reduce_scatter"] == 8 * own["collective_calls"]["reduce_scatter"]


def test_plan_and_estimate_with_the_llm_foundry_trainer(capsys):
    import json

    from scalelab.cli import main

    mpt = ["--layers", "24", "--d-model", "2048", "--heads", "16", "--vocab", "50368", "--seq", "2048"]
    assert main(["plan", *mpt, "--gpus", "64", "--gpu", pm.GPU, "--inter-node", "ib-hdr", "--global-batch", "640",
                 "--tokens", "1T", "--trainer", "llm-foundry", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {(r["strategy"], r["precision"], r.get("tensor_parallel") or 1) for r in plan["rows"]} == {(3, "bf16", 1)}
    assert plan["best"]["peak_memory_gib"] <= 40
    assert main(["estimate", "scaling", "--model", "llama3-8b", "--zero-stage", "3", "--gpus", "8", "--gpu", "H100",
                 "--trainer", "llm-foundry"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--trainer llm-foundry" in err and "gpt2" in err
    assert main(["estimate", "scaling", *mpt, "--zero-stage", "1", "--gpus", "8", "--gpu", "H100",
                 "--trainer", "llm-foundry"]) != 0
    err = capsys.readouterr().err
    assert "--zero-stage 1" in err and "priced at ZeRO stage 3" in err and "--trainer scalelab" in err
