"""Pipeline parallelism in the forecasts: estimate scaling --pipeline-parallel, scalelab plan's search over it, and the
published pipelined runs it is validated against."""
import json

import pytest

from scalelab.cli import main
from scalelab.config import ModelConfig
from scalelab.forecast.predict import predict_point
from scalelab.forecast.step import Machine, Point
from scalelab.formulas import flops, links, pipeline
from scalelab.formulas.rank_step import RankStep
from scalelab.registries import hardware
from scalelab.registries.presets import PRESETS

LLAMA8B = ModelConfig(**{**PRESETS["llama3-8b"].shape, "seq_len": 4096})
SCALING = ["estimate", "scaling", "--model", "llama3-8b", "--seq", "4096", "--zero-stage", "1", "--gpu", "H100",
           "--inter-node", "ib-ndr", "--global-batch", "256", "--json"]


def _machine(mfu: float = 0.4) -> Machine:
    return Machine(product=hardware.gpu_by_name("H100"), peak_flops=flops.gpu_peak_flops("H100", "bf16"), mfu=mfu,
                   per_node=8, intra=links.parse_link("nvlink-h100", None), inter=links.parse_link("ib-ndr", None),
                   overlap_efficiency=0.5)


def _point(**kw) -> Point:
    base = {"cfg": LLAMA8B, "n_params": flops.param_count(LLAMA8B), "key": 1, "precision": "bf16",
            "global_batch": 256, "trainer": "megatron"}
    return Point(**{**base, **kw})


def _run(capsys, *args):
    code = main([*args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_pipelined_step_is_its_slowest_stage_over_one_less_the_bubble_plus_its_sends():
    """The reading stated: step = (slowest stage's compute and TP) / (1 - bubble) + exposed DP + sends; the bubble
    (P - 1) / (m + P - 1) with m the data-parallel rank's share in micro-batches."""
    row = predict_point(_point(pipeline_parallel=4), _machine(), 32)
    p = row["pipeline"]
    assert row["data_parallel"] == 8 and p["microbatches"] == 32 == row["accumulation_steps"]
    assert p["bubble_fraction"] == pytest.approx(3 / 35) == pipeline.bubble_fraction(4, 32, "1f1b")
    slowest = p["stages"][p["slowest_stage"]]
    busy = slowest["compute_s"] + slowest["tensor_parallel_s"]
    assert p["bubble_s"] == pytest.approx(busy / (1 - 3 / 35) - busy)
    assert row["step_time_s"] > busy / (1 - 3 / 35) + p["p2p_s"]
    # the last stage computes the head: it paces the pipeline
    assert p["slowest_stage"] == 3 and slowest["compute_s"] > p["stages"][1]["compute_s"]
    # a stage's data-parallel collectives carry its own parameters: the first and the last hold a vocabulary matrix each
    assert sum(s["params"] for s in p["stages"]) == pytest.approx(flops.param_count(LLAMA8B))
    assert row["collective_bytes"]["reduce_scatter"] == pytest.approx(4 * max(s["params"] for s in p["stages"]))  # fp32


def test_sends_cross_nodes_where_consecutive_stages_sit_on_different_nodes():
    """Mesh order (pp, dp, tp): a stage is DP x TP consecutive ranks. At 8 GPUs the stages share a node; at 32 with
    DP x TP = 8 each stage fills one, so its sends take the inter-node link. Bytes per micro-batch and boundary:
    B x seq x d_model x 2 (bf16); a middle rank sends forward and back on two boundaries."""
    inside = predict_point(_point(pipeline_parallel=4), _machine(), 8)["pipeline"]
    across = predict_point(_point(pipeline_parallel=4), _machine(), 32)["pipeline"]
    assert not inside["p2p_across_nodes"] and inside["p2p_link"] == "nvlink-h100"
    assert across["p2p_across_nodes"] and across["p2p_link"] == "ib-ndr"
    assert across["boundary_bytes"] == 1 * 4096 * 4096 * 2
    m = across["microbatches"]
    assert across["p2p_sent_bytes"] == pytest.approx(2 * m * across["boundary_bytes"])
    assert across["p2p_s"] / m > inside["p2p_s"] / inside["microbatches"]  # the slower link, per micro-batch


def test_memory_per_stage_follows_the_schedule():
    """1F1B: the first stage holds P in-flight micro-batches and the most memory; GPipe holds all m on every stage;
    the per-stage peak is what a pipelined point reports."""
    one = predict_point(_point(pipeline_parallel=4), _machine(), 8)
    gpipe = predict_point(_point(pipeline_parallel=4, pipeline_schedule="gpipe"), _machine(), 8)
    stages = one["pipeline"]["stages"]
    assert [s["in_flight"] for s in stages] == [4, 3, 2, 1]
    assert stages[0]["peak_memory_bytes"] == max(s["peak_memory_bytes"] for s in stages) == one["peak_memory_bytes"]
    assert all(s["in_flight"] == gpipe["pipeline"]["microbatches"] for s in gpipe["pipeline"]["stages"])
    assert gpipe["peak_memory_bytes"] > 5 * one["peak_memory_bytes"]
    # and pipelining four ways holds less than not pipelining at all
    assert one["peak_memory_bytes"] < predict_point(_point(), _machine(), 8)["peak_memory_bytes"]


def test_a_stage_priced_as_scalelab_runs_holds_the_gpus_block_activations():
    """Priced as scalelab runs, the first stage of a 1F1B pipeline holds P micro-batches of its blocks' activations,
    each the GPU's figure (the llama family keeps less on a GPU in bf16 than on a CPU, which the stages once took)."""
    from scalelab.formulas import activation_memory

    point = _point(pipeline_parallel=4, trainer="scalelab", micro_batch=1)
    result = predict_point(point, _machine(), 32)
    first = result["pipeline"]["stages"][0]
    per_block = activation_memory.block_activation_bytes(LLAMA8B, 1, "bf16", False, zero_stage=1,
                                                         device_type="cuda") / LLAMA8B.n_layers
    cpu = activation_memory.block_activation_bytes(LLAMA8B, 1, "bf16", False, zero_stage=1) / LLAMA8B.n_layers
    assert per_block != cpu  # the check below tells them apart
    held = pipeline.held_block_activations(per_block, LLAMA8B.n_layers, 0, 4, result["pipeline"]["microbatches"],
                                           "1f1b")
    assert first["activations_bytes"] == pytest.approx(held, rel=1e-12)


def test_estimate_scaling_prints_the_pipeline_and_matches_the_model(capsys):
    code, out, err = _run(capsys, *SCALING, "--pipeline-parallel", "2", "--gpus", "8,16")
    assert code == 0, err
    result = json.loads(out)
    assert result["pipeline_parallel"] == 2 and result["pipeline_schedule"] == "1f1b"
    assert "(1 - bubble)" in result["pipeline_reading"]
    assert [r["pipeline"]["microbatches"] for r in result["rows"]] == [64, 32]
    code, text, _ = _run(capsys, *SCALING[:-1], "--pipeline-parallel", "2", "--gpus", "8,16")
    assert "pipeline parallelism: 2 stages, 1f1b" in text and "bubble" in text and "P2P ms" in text


@pytest.mark.parametrize("flags, said", [
    (["--pipeline-parallel", "3"], "--pipeline-parallel 3: 32 blocks do not split into 3 equal pipeline chunks"),
    (["--pipeline-parallel", "8", "--gpus", "512"], "--pipeline-parallel 8 --schedule 1f1b: 4 micro-batch(es) per step "
                                                    "cannot fill 8 pipeline stages"),
    (["--pipeline-parallel", "32", "--schedule", "interleaved_1f1b"], "--pipeline-parallel 32: 32 blocks do not split "
                                                                      "into 64 equal pipeline chunks"),
    (["--pipeline-parallel", "0"], "--pipeline-parallel"),
])
def test_estimate_scaling_refuses_what_cannot_pipeline_in_one_line_naming_the_flag(capsys, flags, said):
    """Blocks that do not split (into P chunks, or 2 P interleaved), micro-batches too few for the stages (512 GPUs
    at PP 8 leave 64 data-parallel ranks 4 sequences each), a degree below 1: exit 2, one line, no traceback."""
    code = None
    try:
        code = main([*SCALING, *flags])
    except SystemExit as exit_:  # argparse's own refusal (a degree below 1)
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and said in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


def test_plan_proposes_pipelining_where_nothing_else_fits(capsys):
    """An 8B Llama on 8 H100s at global batch 256 x 4096, priced as the trainers that pipeline run it, without tensor
    parallelism: pure data parallelism does not fit 80 GB without recomputing, so the plan's pick pipelines, within
    the budget; every pipelined row splits the blocks and fills its schedule."""
    code, out, err = _run(capsys, "plan", "--model", "llama3-8b", "--seq", "4096", "--gpus", "8", "--gpu", "H100",
                          "--global-batch", "256", "--tokens", "1T", "--precision", "bf16", "--trainer", "megatron",
                          "--tensor-parallel", "1", "--json")
    assert code == 0, err
    result = json.loads(out)
    best, rows = result["best"], result["rows"]
    assert best["pipeline_parallel"] > 1 and best["fits"] and best["peak_memory_gib"] <= result["budget_gib"]
    plain = [r for r in rows if r["pipeline_parallel"] == 1 and not r["activation_checkpointing"]]
    assert plain and not [r for r in plain if r["fits"]]
    assert {r["pipeline_parallel"] for r in rows} == {1, 2, 4, 8}
    for r in rows:
        if r["pipeline_parallel"] > 1:
            assert pipeline.microbatches_problem(r["pipeline_parallel"], r["accumulation_steps"], r["pipeline_schedule"]) is None
    assert "PP 2 1f1b" in result["assumptions"]["pipeline_parallel"]


def test_plan_leaves_out_the_pipelines_that_cannot_run_and_says_why(capsys):
    """The Playbook sweep's 3B model (28 layers) on 64 GPUs: its blocks do not split into 8 stages, so the plan times
    no PP 8 and names why."""
    code, out, err = _run(capsys, "plan", "--family", "llama", "--layers", "28", "--d-model", "3072", "--heads", "32",
                          "--ffn-dim", "8192", "--vocab", "131072", "--seq", "4096", "--gpus", "64", "--gpu", "H100",
                          "--inter-node", "ib-ndr", "--global-batch", "256", "--tokens", "1T", "--precision", "bf16",
                          "--trainer", "megatron", "--pipeline-parallel", "1", "8", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert {r["pipeline_parallel"] for r in result["rows"]} == {1}
    assert any("PP 8" in line and "28 blocks do not split" in line for line in result["left_out"]), result["left_out"]


def test_the_published_pipelined_runs_are_validated_in_and_out_of_sample_and_the_issue_rows_within_20_percent():
    """The Playbook sweep's pipelined runs, each series calibrated at its smallest count, the stalled runs left out (and
    counted): in-sample (1B) and held out (3B, 8B) apart, each within 15% on average and 80% of rows within 20% up to
    256 GPUs; the 8B PP 2-4 rows at 8-64 GPUs within 20% (the figures the doc prints)."""
    from scalelab.forecast import published_pipeline, published_runs

    rows = published_pipeline.pipeline_validation()
    t = published_pipeline.pipeline_targets(rows)
    assert {r["model"] for r in rows} == {"1B", "3B", "8B"} and {r["pipeline_parallel"] for r in rows} == {2, 4, 8}
    assert t["in_sample_rows"] > 50 and t["held_out_rows"] > 50 and t["issue_rows"] >= 20
    assert t["in_sample_mae"] <= 0.15 and t["held_out_mae"] <= 0.15, t
    assert t["in_sample_within_20"] >= 0.8 and t["held_out_within_20"] >= 0.8, t
    assert t["issue_within_20"] == 1.0, t
    out = published_pipeline.stalled_by_slot()
    assert published_pipeline.degraded() <= out  # the stall rule holds the earlier one
    for r in rows:
        assert r["gpus"] > r["calibrated_at"] and r["error"] == pytest.approx(r["predicted"] / r["published"] - 1)
        assert (r["series"], r["gpus"]) not in out
    for row in published_runs.PIPELINE_ROWS:  # every row is one scalelab could run: blocks split, micro-batches fill
        m = row.accumulation
        assert row.cfg.n_layers % row.pipeline_parallel == 0 and m >= row.pipeline_parallel


def test_a_stalled_run_is_a_slot_over_twice_its_series_fastest_and_its_slot_does_not_follow_the_work():
    """A slot is step / (m + P - 1) (8B PP 4 TP 4 ZeRO-1 micro-batch 2 on 8 nodes: 1,048,576 / 64 tokens per GPU at 418
    tokens/s, 32 + 3 slots; on 4 nodes 3,887 tokens/s over 64 + 3 slots); stalled slots are over twice the kept ones
    at every degree and model, and the model gives a slot that long almost only at 512 GPUs."""
    from scalelab.forecast import published_pipeline as pp
    from scalelab.forecast.published_runs import PIPELINE_ROWS

    series = [r for r in PIPELINE_ROWS if r.series == "8B PP 4 TP 4 ZeRO-1 mb 2"]
    at = {r.gpus: r for r in series}
    assert pp.slot_seconds(at[64]) == pytest.approx(1_048_576 / 64 / 418 / 35)
    assert pp.slot_seconds(at[32]) == pytest.approx(1_048_576 / 32 / 3887 / 67)
    assert ("8B PP 4 TP 4 ZeRO-1 mb 2", 64) in pp.stalled_by_slot() and ("8B PP 4 TP 4 ZeRO-1 mb 2", 128) not in pp.stalled_by_slot()
    e = pp.stall_evidence()
    for t in e["table"]:
        if t["stalled"]:
            assert t["stalled_slot_s"] > 2 * t["kept_slot_s"], t
    assert e["model_over"] - e["model_over_512"] <= 2 and e["recovered"] > 0, e


def test_a_pipelined_steps_gradient_sync_hides_behind_the_last_micro_batchs_backward_only():
    """nanotron's 1F1B (and torch's schedules) sync the gradients in the last micro-batch's backward: DDP's all-reduce
    hides behind 2/3 of one micro-batch's compute, compute / m, at the overlap efficiency (0.5 here)."""
    row = predict_point(_point(key=0, pipeline_parallel=4), _machine(), 64)
    m, compute, p = row["accumulation_steps"], row["compute_s"], row["pipeline"]
    reduce_s, calls = row["comm_s"]["all_reduce"], row["collective_calls"]["all_reduce"]
    hidden = min(reduce_s * (1 - 1 / calls), 2 / 3 * compute / m)
    slowest = p["stages"][p["slowest_stage"]]
    on_path = slowest["tensor_parallel_s"] + p["p2p_s"] + p["tied_sync_s"]
    assert row["exposed_comm_s"] == pytest.approx(reduce_s - 0.5 * hidden + on_path)
    assert hidden < 2 / 3 * compute  # narrower than the whole step's backward


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved_1f1b", 2)])
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_fsdp2_under_a_pipeline_is_priced_with_the_formula_the_measured_runs_hold(zero_stage, schedule, v):
    """A pipelined FSDP2 row's collectives are sharded_comm_bytes' (stage 2: one gather a step; stage 3: the stage
    gathered whole once, then m times all but each chunk's kept last block: V of them; the gradients reduced once),
    the formula a measured run's prediction uses, not gradient accumulation's; the gathers' calls follow the same
    passes."""
    from scalelab.formulas import communication, tensor_parallelism

    row = predict_point(_point(key=zero_stage, trainer="scalelab", pipeline_parallel=4, pipeline_schedule=schedule),
                        _machine(), 32)
    p, m = row["pipeline"], row["accumulation_steps"]
    largest = max(p["stages"], key=lambda s: s["params"])
    dtypes = communication.comm_dtypes("bf16", zero_stage, "fp32")
    kept = v * tensor_parallelism.last_block_params(LLAMA8B, 1)
    step = RankStep("bf16", zero_stage, row["data_parallel"], row["micro_batch"], m)
    measured = pipeline.sharded_comm_bytes(largest["params"], kept, step, schedule)
    assert sum(row["collective_bytes"].values()) == pytest.approx(measured["shard"])
    gathered = largest["params"] if zero_stage == 2 else largest["params"] + m * (largest["params"] - kept)
    assert row["collective_bytes"]["all_gather"] == pytest.approx(gathered * dtypes.gather_bytes)
    assert row["collective_bytes"]["reduce_scatter"] == pytest.approx(largest["params"] * dtypes.reduce_bytes)
    units = largest["blocks"] + 1  # its blocks, and the one root of its chunks that holds parameters
    assert row["collective_calls"] == {"all_gather": units if zero_stage == 2 else units + m * (units - v),
                                       "reduce_scatter": units}


def test_sharded_comm_by_collective_splits_the_measured_formula_without_changing_it():
    """The forecast's split by collective sums to sharded_comm_bytes' shard figure; a shard group of one moves
    nothing; the interleaved schedule runs the same passes (its kept blocks: each chunk's last) up to the 3 chunks
    per rank torch keeps gathered at once, and more stay unmodelled (None) in both."""
    for schedule, virtual in (("1f1b", None), ("interleaved_1f1b", None), ("interleaved_1f1b", 3)):
        for stage in (2, 3):
            step = RankStep("bf16", stage, 4, 1, 8)  # bf16 gathers 2 bytes, reduces fp32's 4; 8 micro-batches
            parts = pipeline.sharded_comm_by_collective(1e9, 5e7, step, schedule, virtual)
            whole = pipeline.sharded_comm_bytes(1e9, 5e7, step, schedule, virtual)
            assert sum(parts.values()) == pytest.approx(whole["shard"])
            assert whole == pipeline.sharded_comm_bytes(1e9, 5e7, step, "1f1b")
    assert pipeline.sharded_comm_by_collective(1e9, 5e7, RankStep("bf16", 3, 1, 1, 8), "1f1b") == {}
    assert pipeline.sharded_comm_by_collective(1e9, 5e7, RankStep("bf16", 3, 4, 1, 8), "interleaved_1f1b", 4) is None
    assert pipeline.sharded_comm_bytes(1e9, 5e7, RankStep("bf16", 3, 4, 1, 8), "interleaved_1f1b", 4) is None
    assert pipeline.sharded_gather_calls(5, 4, 3, 2) == 5 + 4 * 3 and pipeline.sharded_gather_calls(5, 4, 2, 2) == 5


def test_an_interleaved_schedules_chunks_per_rank_are_the_forecasts_and_default_to_the_two_scalelab_runs():
    """Megatron's virtual_pipeline_model_parallel_size as a Point's chunks_per_rank: the bubble (P - 1) / (V m + P - 1),
    V chunks on each rank, V times the sends; None keeps scalelab's own interleaved schedule (V = 2) and its figures."""
    assert pipeline.bubble_fraction(8, 16, "interleaved_1f1b") == pipeline.bubble_fraction(8, 16, "interleaved_1f1b", None)
    assert pipeline.bubble_fraction(8, 16, "interleaved_1f1b", 12) == pytest.approx(7 / (12 * 16 + 7))
    assert pipeline.bubble_fraction(8, 16, "1f1b", 12) == pytest.approx(7 / (16 + 7))  # one chunk: V is the schedule's
    assert pipeline.rank_chunks(1, 8, "interleaved_1f1b", 12) == [1 + 8 * k for k in range(12)]
    assert len(pipeline.chunks(96, 8, "interleaved_1f1b", 12)) == 96
    assert pipeline.p2p_bytes(3, 8, 16, 1.0, "interleaved_1f1b", 12)["sent"] == 2 * 12 * 16
    with pytest.raises(ValueError, match="do not split"):
        pipeline.chunks(32, 8, "interleaved_1f1b", 12)
    point = _point(pipeline_parallel=8, pipeline_schedule="interleaved_1f1b", tensor_parallel=1, global_batch=512)
    default, given = (predict_point(p, _machine(), 64)["pipeline"] for p in (point, _point(
        pipeline_parallel=8, pipeline_schedule="interleaved_1f1b", tensor_parallel=1, global_batch=512, chunks_per_rank=2)))
    assert default == given
    four = predict_point(_point(pipeline_parallel=8, pipeline_schedule="interleaved_1f1b", global_batch=512,
                                chunks_per_rank=4), _machine(), 64)["pipeline"]
    assert four["bubble_fraction"] == pytest.approx(7 / (4 * 64 + 7)) and four["p2p_sent_bytes"] > default["p2p_sent_bytes"]


def test_estimate_scaling_takes_an_interleaved_schedules_chunks_per_rank_and_refuses_it_elsewhere(capsys):
    code, out, err = _run(capsys, *SCALING, "--gpus", "32", "--pipeline-parallel", "4", "--schedule", "interleaved_1f1b",
                          "--chunks-per-rank", "4")
    assert code == 0, err
    pipelined = json.loads(out)["rows"][0]["pipeline"]
    m = pipelined["microbatches"]
    assert pipelined["bubble_fraction"] == pytest.approx(3 / (4 * m + 3))
    code, _, err = _run(capsys, *SCALING, "--gpus", "32", "--chunks-per-rank", "4")
    assert code != 0 and "--chunks-per-rank" in err and len(err.strip().splitlines()) == 1


def test_a_plans_pipeline_with_too_few_micro_batches_names_the_global_batch_alone():
    """The plan tries one sequence per micro-batch already: a layout left out for too few micro-batches names the
    global batch as the remedy, never a --micro-batch the plan has no flag for; estimate scaling, which has one,
    names both."""
    from scalelab.forecast.pipeline_step import pipeline_problem
    from scalelab.forecast.plan import pipeline_choices

    _, why = pipeline_choices(LLAMA8B, 64, [1], 32, [4], ["1f1b"])  # 32 data-parallel ranks of 2 GPUs: 1 sequence each
    (line,) = [w for w in why if w.startswith("PP 4")]
    assert "cannot fill 4 pipeline stages" in line and "a larger --global-batch" in line and "--micro-batch" not in line
    said = pipeline_problem(LLAMA8B, 4, "1f1b", 1)
    assert "set a smaller --micro-batch or a larger --global-batch" in said
