"""scalelab plan (issue #44): one answer before renting GPUs, from the same predictions as estimate scaling."""
import json

import pytest

from scalelab.cli import main

ASK = ["plan", "--model", "llama3-8b", "--gpus", "64", "--gpu", "H100", "--inter-node", "ib-ndr", "--global-batch", "512",
       "--seq", "8192", "--tokens", "1T"]


def _plan(capsys, *args):
    code = main([*args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_plan_ranks_what_fits_and_says_why_the_others_lost(capsys):
    code, out, err = _plan(capsys, *ASK, "--json")
    assert code == 0, err
    result = json.loads(out)
    best, rows = result["best"], result["rows"]
    budget = result["budget_gib"]
    assert result["reserve_gib"] == pytest.approx(2.0 + 0.05 * 80) and budget == pytest.approx(80 - 6)
    assert best["fits"] and best["peak_memory_gib"] <= budget
    assert best["tokens_per_s_per_gpu"] == max(r["tokens_per_s_per_gpu"] for r in rows if r["fits"])
    assert all(not r["fits"] for r in rows if r["peak_memory_gib"] > budget)
    assert best["days"] == pytest.approx(1e12 / (best["tokens_per_s_per_gpu"] * 64) / 86400)
    pairs = {(r["precision"], str(r["strategy"]), r["tensor_parallel"]) for r in rows}
    assert {("bf16", s, 1) for s in ("0", "1", "2", "3", "hybrid")} <= pairs and ("fp8", "3", 1) in pairs  # H100: fp8 too
    # tensor parallelism within a node (8 GPUs): degrees 2, 4, 8 split llama3-8b's 32 heads, 8 key/value heads, 14336
    assert {t for _, _, t in pairs} == {1, 2, 4, 8} and not [p for p in pairs if p[1] == "hybrid" and p[2] > 1]
    # one runner-up per other (precision, strategy, tensor-parallel degree, pipeline degree and schedule)
    group = lambda r: (r["precision"], str(r["strategy"]), r["tensor_parallel"], r["pipeline_parallel"],  # noqa: E731
                       r.get("pipeline_schedule"))
    shown = {group(r) for r in result["runners_up"]}
    assert shown == {group(r) for r in rows} - {group(best)}
    for r in result["runners_up"]:
        if not r["fits"]:  # its smallest configuration, against the budget
            assert r["why"].startswith(f"does not fit: {r['peak_memory_gib']:.1f} GiB at its smallest"), r["why"]
            mine = [x for x in rows if group(x) == group(r)]
            assert r["peak_memory_gib"] == min(x["peak_memory_gib"] for x in mine)
        elif r["precision"] != best["precision"]:  # across precisions: said so, never ranked as like against like
            slower = best["tokens_per_s_per_gpu"] / r["tokens_per_s_per_gpu"] - 1
            assert r["why"].startswith(f"{slower:.1%} slower than the best at {best['precision']} (another precision"), r["why"]
        else:
            slower = best["tokens_per_s_per_gpu"] / r["tokens_per_s_per_gpu"] - 1
            assert r["why"].startswith(f"{slower:.1%} slower: ") and ("no ranking" in r["why"]) == (slower < 0.05), r["why"]
    # the best's precision first, then the others
    same = [r["precision"] == best["precision"] for r in result["runners_up"]]
    assert same == sorted(same, reverse=True)
    # the same numbers as estimate scaling for that configuration: one prediction, two commands
    strategy = str(best["strategy"])
    scaling = ["estimate", "scaling", "--model", "llama3-8b", "--seq", "8192", "--gpu", "H100", "--gpus", "64",
               "--inter-node", "ib-ndr", "--global-batch", "512", "--zero-stage", strategy, "--precision", best["precision"],
               "--micro-batch", str(best["micro_batch"]), "--tensor-parallel", str(best["tensor_parallel"]),
               "--pipeline-parallel", str(best["pipeline_parallel"]), "--schedule", best.get("pipeline_schedule", "1f1b"),
               "--json"] + (["--activation-checkpointing"]
                                                                        if best["activation_checkpointing"] else [])
    code, out, _ = _plan(capsys, *scaling)
    (row,) = json.loads(out)["rows"]
    assert row["tokens_per_s_per_gpu"] == pytest.approx(best["tokens_per_s_per_gpu"])
    assert row["peak_memory_gib"] == pytest.approx(best["peak_memory_gib"])
    code, text, _ = _plan(capsys, *ASK)
    assert "PLAN: predicted, not measured" in text and "best: " in text and "days" in text and "runners-up" in text
    assert "memory reserve: scalelab's default, not yet measured on a GPU" in text and "MFU 40.0% without communication" in text
    assert "tensor parallelism: degrees 1, 2, 4, 8 within a node" in text
    # the notes match the rows: every combination left out is named with why, and none of them is a row
    left = "\n".join(result["left_out"])
    assert "bf16 ZeRO-1 x TP 2, bf16 ZeRO-1 x TP 4, bf16 ZeRO-1 x TP 8, fp8 ZeRO-1 x TP 2, fp8 ZeRO-1 x TP 4, fp8 ZeRO-1 x TP 8: " \
           "scalelab does not run it: zero_stage 1" in left
    assert "fp8 ZeRO-3 x TP 2" in left and not [p for p in pairs if p[1] == "1" and p[2] > 1]
    code, out, _ = _plan(capsys, *ASK, "--tensor-parallel", "1", "--json")  # without it, as before tensor parallelism
    assert {r["tensor_parallel"] for r in json.loads(out)["rows"]} == {1}


def test_a_gpu_without_bf16_plans_in_fp16(capsys):
    code, out, err = _plan(capsys, "plan", "--model", "gpt2", "--gpus", "8", "--gpu", "V100 SXM2 32GB", "--global-batch", "64",
                           "--tokens", "1B", "--json")
    assert code == 0, err
    assert {r["precision"] for r in json.loads(out)["rows"]} == {"fp16"}


def test_a_plan_without_room_says_nothing_fits_and_a_bad_batch_is_named(capsys):
    code, out, _ = _plan(capsys, *ASK, "--reserve-gib", "79")
    assert code == 0 and "NO configuration fits" in out
    with pytest.raises(SystemExit):
        main([*ASK[:-6], "--global-batch", "500", "--seq", "8192", "--tokens", "1T"])
    assert "--global-batch 500 does not split evenly over the data-parallel ranks of --gpus 64" in capsys.readouterr().err


def test_a_plan_for_a_distributed_optimizer_prices_zero1_as_it_runs_and_times_it_with_tensor_parallelism(capsys):
    """ZeRO-1 as DeepSpeed, Megatron's distributed optimizer and nanotron run it: a reduce-scatter and an all-gather
    in the compute dtype (2 Psi x 2 bytes), where scalelab's ZeroRedundancyOptimizer all-reduces and broadcasts fp32
    (3 Psi x 4 bytes); such trainers run it under tensor parallelism, so the plan times it."""
    ours = json.loads(_plan(capsys, *ASK, "--precision", "bf16", "--json")[1])
    theirs = json.loads(_plan(capsys, *ASK, "--precision", "bf16", "--trainer", "megatron", "--json")[1])
    pick = lambda result, t: next(r for r in result["rows"] if r["strategy"] == 1 and r["tensor_parallel"] == t  # noqa: E731
                                  and r["pipeline_parallel"] == 1)
    assert set(pick(ours, 1)["collective_bytes"]) == {"all_reduce", "broadcast"}
    assert set(pick(theirs, 1)["collective_bytes"]) == {"reduce_scatter", "all_gather"}
    local = pick(theirs, 1)["collective_bytes"]
    assert local["reduce_scatter"] == pytest.approx(2 * theirs["n_params"]) == pytest.approx(local["all_gather"])
    assert pick(ours, 1)["collective_bytes"]["all_reduce"] == pytest.approx(4 * ours["n_params"])
    assert pick(theirs, 1)["exposed_comm_s"] < pick(ours, 1)["exposed_comm_s"]
    assert pick(theirs, 4)["strategy_name"].startswith("ZeRO-1, distributed optimizer")
    assert theirs["assumptions"]["trainer"] == "megatron" and theirs["assumptions"]["grad_reduce"] == "compute"
    assert not [line for line in theirs["left_out"] if "ZeRO-1" in line]


def test_a_plan_with_nothing_to_price_says_why_instead_of_that_nothing_fits(capsys):
    """llm-foundry is priced in bf16 at ZeRO-3 alone: asked for fp32 only, plan refuses in one line naming the trainer's
    limit, where it printed "NO configuration fits" (nothing had been priced)."""
    from scalelab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", "gpt2", "--gpus", "16", "--gpu", "H100", "--inter-node", "ib-ndr", "--global-batch", "256",
              "--tokens", "1e9", "--trainer", "llm-foundry", "--precision", "fp32"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "no configuration to price" in err and "llm-foundry trainer" in err
    assert "NO configuration fits" not in err and len(err.strip().splitlines()[-1]) < 600


def test_a_plan_priced_as_scalelab_runs_times_no_pipeline_with_sequence_parallelism(capsys):
    """scalelab does not run sequence parallelism with a pipeline (the sweep's rule): the plan times those
    configurations without it and says why in one line; a trainer that runs it (megatron) has them timed."""
    ask = ["plan", "--model", "llama3-8b", "--gpus", "64", "--gpu", "H100", "--inter-node", "ib-ndr",
           "--global-batch", "256", "--tokens", "1T", "--precision", "bf16", "--pipeline-parallel", "1", "2",
           "--tensor-parallel", "1", "2", "--json"]
    both = lambda r: r["pipeline_parallel"] > 1 and r["sequence_parallel"]
    ours = json.loads(_plan(capsys, *ask)[1])
    assert any(r["pipeline_parallel"] > 1 for r in ours["rows"]) and not [r for r in ours["rows"] if both(r)]
    (line,) = [why for why in ours["left_out"] if why.startswith("sequence parallelism with a pipeline")]
    assert "TP 2, PP 2" in line and "sequence_parallel with pipeline parallelism is not run" in line
    theirs = json.loads(_plan(capsys, *ask[:-1], "--trainer", "megatron", "--json")[1])
    assert [r for r in theirs["rows"] if both(r)]


def test_a_plan_priced_as_scalelab_runs_times_zero1_under_interleaved_1f1b(capsys):
    """scalelab runs ZeRO-1 under interleaved 1F1B (a DDP per chunk): the plan times it."""
    ask = ["plan", "--model", "llama3-8b", "--gpus", "64", "--gpu", "H100", "--inter-node", "ib-ndr",
           "--global-batch", "256", "--tokens", "1T", "--precision", "bf16", "--pipeline-parallel", "2",
           "--tensor-parallel", "1", "--schedule", "interleaved_1f1b", "--json"]
    result = json.loads(_plan(capsys, *ask)[1])
    assert [r for r in result["rows"] if r["strategy"] == 1 and r["pipeline_schedule"] == "interleaved_1f1b"]
    assert not [why for why in result["left_out"] if "ZeRO-1" in why]
