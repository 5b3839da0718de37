"""Hybrid sharding (HSDP, issue #28 point 3) and traffic per link (point 4): the formulas by hand,
the classification of a collective's group by placement, and real gloo runs against ZeRO-3."""
import pytest

from scalelab.formulas import communication
from scalelab.formulas.rank_step import RankStep

# ----------------------------------------------------------------------------- real gloo runs
# World size 4 on 2 cores over-commits them (conftest.run_point allows it): a few steps only.
HYBRID_STEPS = 4


@pytest.fixture(scope="module")
def hybrid_runs(tmp_path_factory, tiny_data):
    """fp32 ZeRO-3 and hybrid (2 replicas x 2 shards) at world size 4, and 2 x 1 beside ZeRO-3 at 2."""
    from scalelab.planning.sweep import RunPoint
    from support import run_point, tiny_config

    tmp = tmp_path_factory.mktemp("hybrid")
    cfg = tiny_config(train={"steps": HYBRID_STEPS, "warmup_steps": 1}, planning={"launch_overcommitted": True})
    return {(w, r): run_point(tmp, tiny_data, RunPoint("fp32", 3, w, replicas=r), cfg=cfg, save_final_params=True)
            for w, r in ((4, 1), (4, 2), (2, 1), (2, 2))}


@pytest.mark.parametrize("world_size, replicas", [(4, 2), (2, 2)])
def test_hybrid_fp32_parity_with_zero3(hybrid_runs, world_size, replicas):
    import numpy as np
    import torch

    summary, steps, run_dir = hybrid_runs[world_size, replicas]
    assert summary["status"] == "ok", summary["reason"]
    assert summary["run_id"] == f"fp32-z3-w{world_size}-hsdp{replicas}"
    zero3, zero3_steps, zero3_dir = hybrid_runs[world_size, 1]
    assert list(steps["step"]) == list(range(HYBRID_STEPS))
    np.testing.assert_allclose(steps["loss"].to_numpy(), zero3_steps["loss"].to_numpy(), rtol=1e-5, atol=0)
    final, reference = torch.load(run_dir / "final_params.pt"), torch.load(zero3_dir / "final_params.pt")
    assert final.keys() == reference.keys()
    for name, ref in reference.items():
        torch.testing.assert_close(final[name], ref, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("world_size, replicas", [(4, 2), (2, 2)])
def test_hybrid_model_state_and_collective_bytes_match_their_formulas(hybrid_runs, world_size, replicas):
    summary = hybrid_runs[world_size, replicas][0]
    n = summary["n_params"]
    shard = world_size // replicas
    assert summary["model_state_bytes_predicted"] == 16 * n / shard
    for rank_bytes in summary["model_state_bytes_measured_per_rank"]:
        assert abs(rank_bytes - summary["model_state_bytes_predicted"]) / summary["model_state_bytes_predicted"] < 0.01
    # exact, by type: gathers and the reduce-scatter within the shard group (none on one rank; the last block
    # gathered once per micro-batch, kept from its forward to its backward), the all-reduce of each shard across replicas
    kept = summary["last_block_params_kept"]
    assert 0 < kept < n / 2
    step = RankStep("fp32", 3, world_size, summary["micro_batch"], replicas=replicas)
    by_type = communication.comm_bytes_by_type(n, step, last_block_params=kept)
    assert summary["comm_bytes_per_step_by_type"] == {
        {"all_gather": "all_gather_single", "reduce_scatter": "reduce_scatter_single"}.get(k, k): v for k, v in by_type.items()}
    assert summary["comm_bytes_per_step_measured"] == summary["comm_bytes_per_step_predicted"]
    # one host: every byte intra-node, measured and predicted
    assert summary["comm_intra_node_bytes_per_step_measured"] == summary["comm_intra_node_bytes_per_step_predicted"] \
        == summary["comm_bytes_per_step_measured"]
    assert summary["comm_inter_node_bytes_per_step_measured"] == summary["comm_inter_node_bytes_per_step_predicted"] == 0
    # hybrid sharding holds more than ZeRO-3 over the world (shards over N/R ranks)
    zero3 = hybrid_runs[world_size, 1][0]
    assert summary["model_state_bytes_measured"] > zero3["model_state_bytes_measured"]


@pytest.mark.parametrize("precision, grad_reduce", [("bf16", "compute"), ("fp16", "fp32")])
def test_hybrid_bytes_are_exact_in_16_bit_precisions(tmp_path, tiny_data, precision, grad_reduce):
    """MixedPrecisionPolicy gathers in the compute dtype; gradients are reduce-scattered and
    all-reduced across replicas in the reduce dtype; fp16 adds its scaler's flag over the world."""
    from scalelab.planning.sweep import RunPoint
    from support import run_point, tiny_config

    cfg = tiny_config(train={"steps": HYBRID_STEPS, "warmup_steps": 1}, planning={"launch_overcommitted": True})
    summary = run_point(tmp_path, tiny_data, RunPoint(precision, 3, 4, replicas=2, grad_reduce=grad_reduce), cfg=cfg)[0]
    assert summary["status"] == "ok", summary["reason"]
    n, reduce = summary["n_params"], 2 if grad_reduce == "compute" else 4
    kept = summary["last_block_params_kept"]  # the last block: gathered once per micro-batch, not twice
    assert summary["comm_bytes_per_step_by_type"] == {
        "all_gather_single": (2 * n - kept) * 2, "reduce_scatter_single": n * reduce,
        "all_reduce": 2 * n * reduce / 2 + (8 if precision == "fp16" else 0)}
    assert summary["comm_bytes_per_step_measured"] == summary["comm_bytes_per_step_predicted"]
    assert abs(summary["model_state_bytes_measured"] - 16 * n / 2) / (16 * n / 2) < 0.01
