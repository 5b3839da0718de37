"""Tensor parallelism (issue #43) on real gloo ranks: both families split over 2 ranks, alone (stage 0,
world size 2), replicated over 2 data-parallel ranks (stage 0, world size 4: FSDP2's replicate) and under
FSDP2 over 2 data-parallel ranks (stage 3, world size 4), in fp32 and bf16, against the single process:
the same losses, the same final parameters (a fused q, k, v projection back in its order), each rank's
model state and the collectives' bytes as the formulas say."""
import numpy as np
import pytest
import torch

from scalelab.formulas import model_state, tensor_parallelism

TP_STEPS = 4
LLAMA = {"family": "llama", "n_layers": 2, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 64,
         "tie_embeddings": False}
POINTS = (("fp32", 0, 1, 1), ("fp32", 0, 2, 2), ("fp32", 3, 4, 2), ("bf16", 3, 4, 2), ("fp32", 0, 4, 2), ("bf16", 0, 4, 2))
IDS = ["tp2", "tp2-dp2-z3", "tp2-dp2-z3-bf16", "tp2-dp2-z0", "tp2-dp2-z0-bf16"]  # of POINTS[1:]
FP32 = [p for p in POINTS[1:] if p[0] == "fp32"]
SP_POINTS = (("fp32", 0, 2, False), ("fp32", 3, 4, False), ("bf16", 0, 4, False), ("fp32", 3, 2, True))
"""Sequence parallelism over TP 2: (precision, stage, world size, activation checkpointing); each one's twin with
tensor parallelism alone is a point of POINTS, or run beside it (checkpointing)."""
SP_IDS = ["z0-w2", "z3-w4", "bf16-z0-w4", "z3-w2-ac"]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def tp_runs(request, tmp_path_factory, tiny_data):
    """Each family at world size 1, TP 2 alone and TP 2 x DP 2 at stages 0 and 3 (fp32, and bf16's recipe), and
    sequence parallelism (SP_POINTS)."""
    from scalelab.planning.sweep import RunPoint
    from support import run_point, tiny_config

    tmp = tmp_path_factory.mktemp(f"tp-{request.param}")
    cfg = tiny_config(train={"steps": TP_STEPS, "warmup_steps": 1}, planning={"launch_overcommitted": True})
    if request.param == "llama":
        cfg["model"].update(LLAMA)
    else:
        # two heads per rank; wide enough that what GPT-2's eager formula leaves out (the LayerNorms' statistics, the
        # attention's logsumexp: about 0.6 / d_model of a layer) stays under the 1% the activations are held to
        cfg["model"].update(n_heads=4, d_model=128)
    runs = {(p, s, w, t): run_point(tmp, tiny_data, RunPoint(p, s, w, tensor_parallel=t), cfg=cfg, save_final_params=True)
            for p, s, w, t in POINTS}
    for p, s, w, ac in SP_POINTS:  # with sequence parallelism ("sp"), and the checkpointed point's twin without it
        for sp in (True, False) if ac else (True,):
            point = RunPoint(p, s, w, tensor_parallel=2, sequence_parallel=sp, activation_checkpointing=ac)
            runs["sp" if sp else "tp", p, s, w, ac] = run_point(tmp, tiny_data, point, cfg=cfg, save_final_params=True)
    return runs


def _sp_pair(tp_runs, point):
    """A sequence-parallel run's summary and its twin's, tensor parallelism alone."""
    p, s, w, ac = point
    return tp_runs["sp", p, s, w, ac][0], (tp_runs["tp", p, s, w, ac] if ac else tp_runs[p, s, w, 2])[0]


@pytest.mark.parametrize("point", FP32, ids=[i for p, i in zip(POINTS[1:], IDS) if p in FP32])
def test_tensor_parallel_fp32_follows_the_single_process(tp_runs, point):
    summary, steps, run_dir = tp_runs[point]
    assert summary["status"] == "ok", summary["reason"]
    assert summary["run_id"] == f"fp32-z{point[1]}-w{point[2]}-tp2"
    single, single_steps, single_dir = tp_runs[POINTS[0]]
    np.testing.assert_allclose(steps["loss"].to_numpy(), single_steps["loss"].to_numpy(), rtol=1e-5, atol=0)
    # the clipped norm too: AdamW alone would not show a wrong one (it is invariant to a gradient's scale)
    np.testing.assert_allclose(steps["grad_norm"].to_numpy(), single_steps["grad_norm"].to_numpy(), rtol=1e-5)
    final, reference = torch.load(run_dir / "final_params.pt"), torch.load(single_dir / "final_params.pt")
    assert final.keys() == reference.keys()
    for name, ref in reference.items():
        # atol 1e-4: the all-reduces sum in another order, and AdamW's first steps move a weight whose
        # gradient is near zero by about lr (6e-4) either way; a misplaced row would be off by ~0.1
        torch.testing.assert_close(final[name], ref, atol=1e-4, rtol=1e-5, msg=name)


@pytest.mark.parametrize("point", POINTS[1:], ids=IDS)
def test_each_ranks_model_state_and_the_collectives_are_the_formulas(tp_runs, point):
    """Model state: each rank holds 1/2 of the split linears and all the rest, then ZeRO-3 shards that
    over the data-parallel ranks (within 1%: FSDP2 pads its shards). Tensor parallelism's all-reduces:
    four per block of B T d values, exact; the strategy's collectives over the data-parallel group, exact;
    on one host, the tensor-parallel group's link is intra-node."""
    from scalelab.config import ModelConfig

    summary = tp_runs[point][0]
    assert summary["status"] == "ok", summary["reason"]
    precision, stage, world, degree = point
    cfg = ModelConfig(summary["n_layers"], summary["d_model"], summary["n_heads"], summary["seq_len"],
                      summary["tie_embeddings"], summary["vocab_size"], family=summary["model_family"],
                      n_kv_heads=summary.get("n_kv_heads"), ffn_dim=summary.get("ffn_dim"))
    local = tensor_parallelism.tensor_parallel_params(cfg, summary["n_params"], degree)
    assert local < summary["n_params"]
    expected = model_state.model_state_bytes(local, stage, world // degree, precision, "pytorch").total
    assert summary["model_state_bytes_predicted"] == pytest.approx(expected)
    for rank_bytes in summary["model_state_bytes_measured_per_rank"]:
        assert rank_bytes == pytest.approx(expected, rel=0.01)
    tp = summary["comm_tensor_parallel_bytes_per_step_measured"]
    assert tp == summary["comm_tensor_parallel_bytes_per_step_predicted"] > 0
    micro_tokens = summary["micro_batch"] * summary["seq_len"] * summary["d_model"] * summary["accumulation_steps"]
    # forward at the matmul's width; backward at the norm output's: fp32 over fp32 parameters (autocast at stage 0)
    widths = (4, 4) if precision == "fp32" else (2, 2) if stage == 3 else (2, 4)
    assert tp == 2 * 2 * cfg.n_layers * micro_tokens * sum(widths)
    assert summary["comm_bytes_per_step_measured"] == summary["comm_bytes_per_step_predicted"]
    if world > degree:  # the data-parallel group's collectives: stage 0's all-reduce of this rank's gradients
        assert summary["comm_bytes_per_step_measured"] >= (2 * local * 4 if stage == 0 else local * 4)
    assert summary["comm_tensor_parallel_link"] == "intra_node"


@pytest.mark.parametrize("point", POINTS[1:], ids=IDS)
def test_a_ranks_activations_are_the_split_formula(tp_runs, point):
    """Inside the blocks: the norms' and the residual's terms whole, the rest halved (exact); outside the blocks
    nothing is split (exact). Less than the same run without tensor parallelism."""
    summary = tp_runs[point][0]
    assert summary["activation_bytes_measured"] == summary["activation_bytes_predicted"]
    assert summary["activation_bytes_outside_blocks_measured"] == summary["activation_bytes_outside_blocks_predicted"]
    assert summary["activation_bytes_measured"] < 0.75 * tp_runs[POINTS[0]][0]["activation_bytes_measured"] * (
        1 if point[0] == "fp32" else 0.8)
    assert summary["predicted_peak_bound"] == "model"


@pytest.mark.parametrize("stage", [0, 3])
def test_bf16_under_tensor_parallelism_trains_beside_fp32(tp_runs, stage):
    bf16, fp32 = tp_runs[("bf16", stage, 4, 2)][1], tp_runs[("fp32", stage, 4, 2)][1]
    np.testing.assert_allclose(bf16["loss"].to_numpy(), fp32["loss"].to_numpy(), rtol=2e-2)


def test_checkpointing_and_compile_compose_with_tensor_parallelism(tmp_path, tiny_data):
    """GPT-2, TP 2 under ZeRO-3 over 2 ranks: with per-block checkpointing the same losses, each block's input
    kept (exact) and one more forward all-reduce per block (the recomputed attention projection's: exact);
    compiled, the same losses, no recompilation in the loop, its TP bytes not counted (its graphs run them) and
    its activations an upper bound, as the columns say."""
    from scalelab.planning.sweep import RunPoint
    from support import run_point, tiny_config

    cfg = tiny_config(train={"steps": TP_STEPS, "warmup_steps": 1}, planning={"launch_overcommitted": True})
    cfg["model"].update(n_heads=4, d_model=64)
    base = run_point(tmp_path, tiny_data, RunPoint("fp32", 3, 2), cfg=cfg)
    ac = run_point(tmp_path, tiny_data, RunPoint("fp32", 3, 2, tensor_parallel=2, activation_checkpointing=True), cfg=cfg)
    compiled = run_point(tmp_path, tiny_data, RunPoint("fp32", 3, 2, tensor_parallel=2, compile=True), cfg=cfg)
    for summary, steps, _ in (ac, compiled):
        assert summary["status"] == "ok", summary["reason"]
        np.testing.assert_allclose(steps["loss"].to_numpy(), base[1]["loss"].to_numpy(), rtol=1e-5)
    s = ac[0]
    assert s["activation_bytes_measured"] == s["activation_bytes_predicted"]
    assert s["comm_tensor_parallel_bytes_per_step_measured"] == s["comm_tensor_parallel_bytes_per_step_predicted"]
    assert s["comm_tensor_parallel_bytes_per_step_measured"] == 2 * 5 * cfg["model"]["n_layers"] * s["micro_batch"] * \
        s["seq_len"] * s["d_model"] * 4
    s = compiled[0]
    assert s["compile_graphs_in_loop"] == 0 and s["comm_tensor_parallel_bytes_per_step_measured"] is None
    assert s["predicted_peak_bound"].startswith("upper bound: compiled blocks under tensor parallelism")
    assert s["activation_bytes_measured"] < s["activation_bytes_predicted"]


@pytest.mark.parametrize("point", [p for p in SP_POINTS if p[0] == "fp32"], ids=[i for p, i in zip(SP_POINTS, SP_IDS)
                                                                                if p[0] == "fp32"])
def test_sequence_parallel_fp32_follows_the_single_process(tp_runs, point):
    """The same losses, clipped norms and final parameters as one process: the norms' gradients, each rank's
    share of the tokens, are summed before the step (by FSDP2, or after backward where none reduces)."""
    summary, steps, run_dir = tp_runs[("sp", *point)]
    assert summary["status"] == "ok", summary["reason"]
    assert summary["run_id"].endswith("-tp2-sp")
    _, single_steps, single_dir = tp_runs[POINTS[0]]
    np.testing.assert_allclose(steps["loss"].to_numpy(), single_steps["loss"].to_numpy(), rtol=1e-5, atol=0)
    np.testing.assert_allclose(steps["grad_norm"].to_numpy(), single_steps["grad_norm"].to_numpy(), rtol=1e-5)
    final, reference = torch.load(run_dir / "final_params.pt"), torch.load(single_dir / "final_params.pt")
    for name, ref in reference.items():
        torch.testing.assert_close(final[name], ref, atol=1e-4, rtol=1e-5, msg=name)


@pytest.mark.parametrize("point", SP_POINTS, ids=SP_IDS)
def test_sequence_parallel_bytes_and_memory_are_the_formulas(tp_runs, point):
    """Tensor parallelism's bytes exact (all-gathers and reduce-scatters, the head's and the embeddings' gathers,
    the norms' gradients; the recomputation's with checkpointing), the strategy's exact, the model state as
    without sequence parallelism (within 1%: FSDP2's padding); activations exact and less than the twin's."""
    summary, twin = _sp_pair(tp_runs, point)
    assert summary["status"] == twin["status"] == "ok"
    assert summary["comm_tensor_parallel_bytes_per_step_measured"] == summary["comm_tensor_parallel_bytes_per_step_predicted"]
    assert summary["comm_bytes_per_step_measured"] == summary["comm_bytes_per_step_predicted"] == twin["comm_bytes_per_step_measured"]
    assert summary["model_state_bytes_predicted"] == twin["model_state_bytes_predicted"]
    for rank_bytes in summary["model_state_bytes_measured_per_rank"]:
        assert rank_bytes == pytest.approx(summary["model_state_bytes_predicted"], rel=0.01)
    acts, twin_acts = summary["activation_bytes_measured"], twin["activation_bytes_measured"]
    assert acts == summary["activation_bytes_predicted"]
    assert summary["activation_bytes_outside_blocks_measured"] == summary["activation_bytes_outside_blocks_predicted"]
    assert acts < twin_acts and summary["activation_bytes_outside_blocks_measured"] < twin["activation_bytes_outside_blocks_measured"]
    assert summary["activation_bytes_predicted_paper"] < twin["activation_bytes_predicted_paper"]


@pytest.mark.parametrize("world_size, stages", [(2, "0"), (4, "0,3")], ids=["tp2", "tp2-dp2"])
def test_fp16_under_tensor_parallelism_skips_an_overflowing_step_on_every_rank(tmp_path, world_size, stages):
    """fp16's loss scaler over split and whole gradients (over one data-parallel rank the split linears' are DTensors
    beside the embeddings' plain ones): a non-finite gradient on one rank (step 1) and on every rank (step 2) skips
    the step on all ranks, the scale halves each time, the flag handed the fused optimizer is 0-dim, 0 or 1."""
    from support import strategy_steps

    out = tmp_path / "steps.json"
    by_rank = strategy_steps(out, world_size, "--steps", "3", "--stages", stages, "--precisions", "fp16", "--tensor-parallel",
                             "2", "--sequence-parallel", "--inject-inf", timeout_s=240)
    for cases in by_rank:
        for case in cases:
            assert "error" not in case, case.get("traceback")
            assert [s["params_unchanged"] for s in case["steps"]] == [False, True, True]
            assert [s["scale_after"] for s in case["steps"]] == [256.0, 128.0, 64.0]
            assert [h["found_inf"] for h in case["handed"]] == [{"shape": [], "value": v} for v in (0.0, 1.0, 1.0)]
