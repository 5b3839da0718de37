"""Pipeline parallelism on real gloo ranks, against the run without it: GPT-2 (tied head: the last stage's copy,
its gradient summed with the embedding's) and Llama split into 2 stages, under GPipe, 1F1B and interleaved 1F1B,
alone (stage 0, world size 2), over 2 data-parallel ranks (stages 0 and 3, world size 4) and with tensor parallelism
(world size 4). The same losses, clipped norms and final parameters as one process; every rank's point-to-point
bytes, its tied-embedding sum, the activations each stage holds and the strategy's collectives exactly as the
formulas say; model state per rank within 1% (FSDP2's padding)."""
import numpy as np
import pytest
import torch

PP_STEPS = 4
GPT = {"n_layers": 4, "n_heads": 2, "d_model": 32, "tie_embeddings": True}
LLAMA = {"family": "llama", "n_layers": 4, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 64,
         "tie_embeddings": False}
# (stage, world size, tensor parallel, schedule); micro-batch 1: the data-parallel rank's share of the global batch in
# micro-batches per step
POINTS = {
    "gpt2": ((0, 2, 1, "1f1b"), (0, 2, 1, "gpipe"), (3, 4, 1, "1f1b"), (0, 4, 2, "1f1b"), (0, 2, 1, "interleaved_1f1b"),
             (3, 8, 1, "1f1b", 2),  # hybrid sharding: 2 replicas of 2-rank shard groups per stage
             (1, 4, 1, "1f1b"),  # ZeRO-1: DDP per stage and ZeroRedundancyOptimizer over its data-parallel ranks
             (1, 4, 1, "interleaved_1f1b"),  # ZeRO-1 with a DDP per chunk, two a rank
             (2, 4, 1, "interleaved_1f1b"), (3, 4, 1, "interleaved_1f1b")),  # FSDP2 on each of a rank's two chunks
    "llama": ((0, 2, 1, "1f1b"), (3, 4, 1, "gpipe")),
}
CASES = [(family, point) for family, points in POINTS.items() for point in points]
IDS = [f"{family}-z{p[0]}-w{p[1]}-tp{p[2]}-{p[3]}" + (f"-hsdp{p[4]}" if len(p) > 4 else "") for family, p in CASES]


@pytest.fixture(scope="module")
def pp_runs(tmp_path_factory, tiny_data):
    """Each family's single process, and its pipeline points."""
    from scalelab.planning.sweep import RunPoint
    from support import run_point, tiny_config

    runs = {}
    for family, points in POINTS.items():
        tmp = tmp_path_factory.mktemp(f"pp-{family}")
        cfg = tiny_config(train={"steps": PP_STEPS, "warmup_steps": 2}, planning={"launch_overcommitted": True})
        cfg["model"].update(GPT if family == "gpt2" else LLAMA)
        runs[family, None] = run_point(tmp, tiny_data, RunPoint("fp32", 0, 1, micro_batch=1), cfg=cfg,
                                       save_final_params=True)
        for stage, world, tp, schedule, *replicas in points:
            point = RunPoint("fp32", stage, world, micro_batch=1, tensor_parallel=tp, pipeline_parallel=2,
                             pipeline_schedule=schedule, replicas=replicas[0] if replicas else 1)
            runs[family, (stage, world, tp, schedule, *replicas)] = run_point(tmp, tiny_data, point, cfg=cfg,
                                                                               save_final_params=True)
    return runs


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_pipeline_trains_as_one_process(pp_runs, case):
    summary, steps, run_dir = pp_runs[case]
    assert summary["status"] == "ok", summary["reason"]
    _, single_steps, single_dir = pp_runs[case[0], None]
    np.testing.assert_allclose(steps["loss"].to_numpy(), single_steps["loss"].to_numpy(), rtol=1e-5, atol=0)
    # the clipped norm summed over the stages, a tied weight once
    np.testing.assert_allclose(steps["grad_norm"].to_numpy(), single_steps["grad_norm"].to_numpy(), rtol=1e-5)
    final, reference = torch.load(run_dir / "final_params.pt"), torch.load(single_dir / "final_params.pt")
    assert final.keys() == reference.keys()
    for name, ref in reference.items():  # atol: as tensor parallelism's test says why
        torch.testing.assert_close(final[name], ref, atol=1e-4, rtol=1e-5, msg=name)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bytes_and_held_activations_are_the_formulas(pp_runs, case):
    """Point-to-point: each micro-batch's B x seq_len x d_model fp32 values forward and back at each boundary of a
    rank's chunks; the tied sum (GPT-2); the activations each stage holds at once: GPipe all micro-batches, 1F1B
    P - i on stage i, interleaved 1F1B torch's warm-up plus one (exact: saved-tensor hooks)."""
    from scalelab.formulas import pipeline

    summary = pp_runs[case][0]
    stage, world, tp, schedule = case[1][:4]
    m = summary["pipeline_microbatches"]
    data_parallel = world // (2 * tp)
    assert m == summary["accumulation_steps"] == summary["tokens_per_step"] // summary["seq_len"] // data_parallel
    values = summary["micro_batch"] * summary["seq_len"] * summary["d_model"]
    chunks_per_rank = pipeline.SCHEDULES[schedule].chunks_per_rank
    boundaries = [2 * chunks_per_rank - 1] * 2  # rank 0: chunk 0 out, chunk 2 in and out; rank 1 mirrors it
    assert summary["comm_pipeline_bytes_per_step_measured_per_stage"] == [2 * b * m * values * 4 for b in boundaries]
    assert summary["comm_pipeline_bytes_per_step_predicted_per_stage"] == summary[
        "comm_pipeline_bytes_per_step_measured_per_stage"]
    tied = summary["comm_pipeline_tied_bytes_per_step_measured"]
    assert tied == summary["comm_pipeline_tied_bytes_per_step_predicted"]
    assert (tied > 0) == summary["tie_embeddings"]
    held = summary["pipeline_activation_bytes_measured_per_stage"]
    assert held == summary["pipeline_activation_bytes_predicted_per_stage"]
    in_flight = [pipeline.in_flight(k, 2, m, schedule) for k in range(2)]
    if summary["model_family"] == "gpt2":  # the same micro-batch's bytes, in flight times (llama adds its RoPE tables once)
        assert held[0] * in_flight[1] == held[1] * in_flight[0]
    assert summary["comm_bytes_per_step_measured"] == summary["comm_bytes_per_step_predicted"]
    assert summary["comm_tensor_parallel_bytes_per_step_measured"] == summary["comm_tensor_parallel_bytes_per_step_predicted"]
    for rank_bytes in summary["model_state_bytes_measured_per_rank"]:
        assert rank_bytes <= summary["model_state_bytes_predicted"] * 1.01
    assert max(summary["model_state_bytes_measured_per_rank"]) == pytest.approx(summary["model_state_bytes_predicted"],
                                                                               rel=0.01)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_bubble_is_measured_beside_its_formula(pp_runs, case):
    """Each stage's timeline: forwards and backwards of every micro-batch, inside the schedule's time; the bubble
    measured from it, and the formula's (P - 1) / (V m + P - 1)."""
    import json

    from scalelab.formulas import pipeline
    from scalelab.formulas.pipeline import TIMELINE_FILE

    summary, _, run_dir = pp_runs[case]
    schedule = case[1][3]
    m = summary["pipeline_microbatches"]
    assert summary["bubble_fraction_predicted"] == pytest.approx(pipeline.bubble_fraction(2, m, schedule))
    per_stage = summary["bubble_fraction_measured_per_stage"]
    assert len(per_stage) == 2 and all(0 < b < 1 for b in per_stage)
    assert summary["bubble_fraction_measured"] == pytest.approx(sum(per_stage) / 2)
    timeline = json.loads((run_dir / TIMELINE_FILE).read_text())
    v = pipeline.SCHEDULES[schedule].chunks_per_rank
    for stage in timeline["stages"]:
        kinds = [i["kind"] for i in stage["intervals"]]
        assert kinds.count("F") == kinds.count("B") == m * v
        assert all(0 <= i["start_s"] <= i["end_s"] for i in stage["intervals"])


def test_fp16_loss_scaling_spans_the_stages(tmp_path, tiny_data):
    """fp16 under a pipeline: the last stage scales each micro-batch's loss as the run without a pipeline does, and
    one inf check spans the stages (ShardedGradScaler): a non-finite gradient on the last stage's rank alone skips the
    step on both, and the scale halves."""
    from scalelab.planning.sweep import RunPoint
    from support import run_point, tiny_config

    cfg = tiny_config(train={"steps": 6, "warmup_steps": 2}, planning={"launch_overcommitted": True})
    cfg["model"].update(GPT)
    _, single, _ = run_point(tmp_path / "one", tiny_data, RunPoint("fp16", 0, 1, micro_batch=1), cfg=cfg)
    point = RunPoint("fp16", 0, 2, micro_batch=1, pipeline_parallel=2)
    summary, steps, _ = run_point(tmp_path / "pp", tiny_data, point, cfg=cfg)
    assert summary["status"] == "ok", summary["reason"]
    np.testing.assert_allclose(steps["loss"].to_numpy(), single["loss"].to_numpy(), rtol=1e-5)
    summary, steps, _ = run_point(tmp_path / "inf", tiny_data, point, cfg=cfg, fault="inf_grad@step=3,rank=1")
    assert summary["status"] == "ok" and summary["skipped_steps"] == 1, summary["reason"]
    assert steps["skipped"].tolist() == [s == 3 for s in range(6)]
    assert steps["loss_scale"].iloc[4] == steps["loss_scale"].iloc[3] / 2


def test_fp8_linears_under_a_pipeline_train_as_one_process(tmp_path, tiny_data):
    """fp8 (torchao's float8 linears, emulated on the CPU) converted on the whole model before it is split: every
    stage's blocks carry them, and the losses equal one process's."""
    pytest.importorskip("torchao")
    from scalelab.planning.sweep import RunPoint
    from support import run_point, tiny_config

    cfg = tiny_config(train={"steps": 4, "warmup_steps": 2, "fp8_emulate": True})
    cfg["model"].update(n_layers=4, d_model=64, n_heads=2)
    _, single, _ = run_point(tmp_path, tiny_data, RunPoint("fp8", 0, 1, micro_batch=1), cfg=cfg)
    summary, steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp8", 0, 2, micro_batch=1, pipeline_parallel=2), cfg=cfg)
    assert summary["status"] == "ok", summary["reason"]
    assert summary["fp8_linears"] == 4 * 4  # every block's four linears, on whichever stage holds it
    np.testing.assert_allclose(steps["loss"].to_numpy(), single["loss"].to_numpy(), rtol=1e-5)


def test_a_compiled_pipeline_compiles_before_its_steps(pp_runs, tmp_path, tiny_data):
    """compile under a pipeline: one whole step of the schedule compiles every stage's blocks before the first step
    (timed apart), no timed step compiles, and the losses equal one process's."""
    from scalelab.planning.sweep import RunPoint
    from support import run_point, tiny_config

    cfg = tiny_config(train={"steps": PP_STEPS, "warmup_steps": 2}, planning={"launch_overcommitted": True})
    cfg["model"].update(GPT)
    summary, steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", 0, 2, micro_batch=1, pipeline_parallel=2,
                                                               compile=True), cfg=cfg)
    assert summary["status"] == "ok", summary["reason"]
    assert summary["compile_time_s"] > 0 and summary["compile_graphs"] >= 1 and summary["compile_graphs_in_loop"] == 0
    np.testing.assert_allclose(steps["loss"].to_numpy(), pp_runs["gpt2", None][1]["loss"].to_numpy(), rtol=1e-5)
