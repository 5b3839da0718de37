"""Hybrid sharding (HSDP, issue #28 point 3) and traffic per link (point 4): the formulas by hand,
the classification of a collective's group by placement, and real gloo runs against ZeRO-3."""
import pytest

from scalelab.formulas import accounting
from scalelab.spec.strategies import HYBRID, STRATEGIES, check_replicas, strategy
from scalelab.spec.topology import contiguous_nodes, link_of

PSI = 1000


@pytest.mark.unit
def test_hybrid_is_stage_3_with_replicas():
    assert strategy(3, 2) is HYBRID and strategy("hybrid") is HYBRID and strategy(3, 1) is STRATEGIES[3]
    with pytest.raises(ValueError, match="zero_stage 3"):
        strategy(0, 2)
    with pytest.raises(ValueError, match="replicas=3 does not divide world_size=4"):
        check_replicas(4, 3)
    with pytest.raises(ValueError, match="whole number >= 1"):
        check_replicas(4, 0)


@pytest.mark.unit
def test_hybrid_model_state_is_sharded_over_the_shard_group():
    # 16 bytes per parameter (fp32 params, grads, AdamW m and v) over S = N/R ranks
    assert accounting.model_state_bytes(PSI, 3, 4, "fp32", replicas=2).total == 16 * PSI / 2
    assert accounting.model_state_bytes(PSI, 3, 8, "bf16", replicas=2).total == 16 * PSI / 4
    assert accounting.model_state_bytes(PSI, 3, 2, "fp32", replicas=2).total == 16 * PSI  # 2 x 1: replicated
    assert accounting.model_state_bytes(PSI, 3, 4, "fp32", "paper", replicas=2).total == 16 * PSI / 2
    assert accounting.model_state_bytes(PSI, 3, 4, "fp32", replicas=1) == accounting.model_state_bytes(PSI, 3, 4, "fp32")


@pytest.mark.unit
@pytest.mark.parametrize("precision, grad_reduce, gather, reduce, scaler", [
    ("fp32", "fp32", 4, 4, 0), ("bf16", "fp32", 2, 4, 0), ("bf16", "compute", 2, 2, 0), ("fp16", "compute", 2, 2, 8)])
def test_hybrid_collective_bytes_by_type(precision, grad_reduce, gather, reduce, scaler):
    """R = 2 replicas of S = 2 shards, k = 2 micro-batches: 2k Psi gathered and Psi reduce-scattered
    within the shard group, 2 Psi / S all-reduced across replicas (+ fp16's 8-byte flag)."""
    by_type = accounting.comm_bytes_by_type(PSI, 3, 4, precision, 2, grad_reduce, replicas=2)
    assert by_type == {"all_gather": 4 * PSI * gather, "reduce_scatter": PSI * reduce,
                       "all_reduce": 2 * PSI * reduce / 2 + scaler}
    assert accounting.comm_bytes_per_step(PSI, 3, 4, precision, 2, grad_reduce, replicas=2) == sum(by_type.values())
    # 2 x 1: no gathers or reduce-scatter on a one-rank shard group, a plain all-reduce of Psi across
    assert accounting.comm_bytes_by_type(PSI, 3, 2, precision, 2, grad_reduce, replicas=2) == {
        "all_reduce": 2 * PSI * reduce + scaler}
    # the elements agree with the bytes at fp32's width
    assert 4 * accounting.comm_elements_per_step(PSI, 3, 4, 2, replicas=2) == \
        accounting.comm_bytes_per_step(PSI, 3, 4, "fp32", 2, replicas=2)


@pytest.mark.unit
def test_link_of_a_group_by_placement():
    hosts = ["n1", "n1", "n2", "n2"]
    assert link_of([0, 1], hosts) == "intra_node" and link_of([2, 3], hosts) == "intra_node"
    assert link_of([0, 2], hosts) == "inter_node" and link_of(range(4), hosts) == "inter_node"
    assert link_of([0], hosts) == "intra_node"
    assert contiguous_nodes(6, 2) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="no ranks"):
        link_of([], hosts)


@pytest.mark.unit
@pytest.mark.parametrize("stage, replicas", [(0, 1), (1, 1), (2, 1), (3, 1), (3, 2), (3, 4)])
@pytest.mark.parametrize("world_size, per_node", [(1, 1), (4, 4), (4, 2), (8, 2), (8, 4)])
def test_bytes_by_link_add_up_and_cross_nodes_only_when_a_group_spans_them(stage, replicas, world_size, per_node):
    if world_size % replicas:
        return
    by_link = accounting.comm_bytes_by_link(PSI, stage, world_size, "fp16", per_node, replicas=replicas,
                                            accumulation_steps=2)
    total = accounting.comm_bytes_per_step(PSI, stage, world_size, "fp16", 2, replicas=replicas)
    assert sum(sum(v.values()) for v in by_link.values()) == total
    if world_size <= per_node:
        assert by_link["inter_node"] == {}
    elif replicas == 1:
        assert by_link["intra_node"] == {}  # every collective over the world, which spans nodes
    elif world_size // replicas <= per_node:
        # hybrid with a shard group inside a node: only the all-reduce across replicas (and fp16's
        # flag, over the world) crosses nodes
        assert by_link["inter_node"] == {"all_reduce": 2 * PSI * 4 / (world_size // replicas) + 8}


@pytest.mark.unit
def test_bytes_by_link_hand_computed_two_nodes():
    """The two-nodes experiment's shape: 2 nodes x 2 ranks, fp32. ZeRO-3 sends 3 Psi x 4 bytes
    over the inter-node link; hybrid 2 x 2 sends 2 Psi/2 x 4 and keeps 3 Psi x 4 within a node."""
    assert accounting.comm_bytes_by_link(PSI, 3, 4, "fp32", 2) == {
        "intra_node": {}, "inter_node": {"reduce_scatter": 4 * PSI, "all_gather": 8 * PSI}}
    assert accounting.comm_bytes_by_link(PSI, 3, 4, "fp32", 2, replicas=2) == {
        "intra_node": {"reduce_scatter": 4 * PSI, "all_gather": 8 * PSI}, "inter_node": {"all_reduce": 4 * PSI}}
    assert accounting.comm_bytes_by_link(PSI, 0, 4, "fp32", 2) == {"intra_node": {}, "inter_node": {"all_reduce": 8 * PSI}}


@pytest.mark.unit
def test_counted_bytes_by_link_from_the_ranks_hosts():
    from scalelab.run.comm import bytes_by_link

    by_group = [{"collective": "all_gather_single", "ranks": [0, 1], "bytes": 800},
                {"collective": "reduce_scatter_single", "ranks": [0, 1], "bytes": 400},
                {"collective": "all_reduce", "ranks": [0, 2], "bytes": 400},
                {"collective": "all_reduce", "ranks": [0, 1, 2, 3], "bytes": 8}]
    assert bytes_by_link(by_group, ["n1", "n1", "n2", "n2"]) == {
        "intra_node": {"all_gather_single": 800, "reduce_scatter_single": 400},
        "inter_node": {"all_reduce": 408}}
    assert bytes_by_link(by_group, ["h"] * 4) == {
        "intra_node": {"all_gather_single": 800, "reduce_scatter_single": 400, "all_reduce": 408}, "inter_node": {}}


@pytest.mark.unit
def test_the_replicas_axis_keeps_old_run_ids_and_leaves_out_what_it_does_not_apply_to():
    from conftest import tiny_config
    from scalelab.config import ConfigError
    from scalelab.plan.sweep import RunPoint, sweep_plan

    assert RunPoint("fp32", 3, 4).run_id == "fp32-z3-w4"  # replicas 1: no id part, no cached run changes
    assert RunPoint("fp32", 3, 4, replicas=2).run_id == "fp32-z3-w4-hsdp2"
    assert RunPoint.from_json({"precision": "fp32", "zero_stage": 3, "world_size": 4}).replicas == 1  # an older point.json
    points, left_out = sweep_plan(tiny_config(sweep={"precision": ["fp32"], "zero_stage": [0, 3], "world_size": [1, 2, 4],
                                                     "replicas": [1, 2]}))
    assert {p.run_id for p in points if p.replicas == 2} == {"fp32-z3-w2-hsdp2", "fp32-z3-w4-hsdp2"}
    reasons = {p.run_id: r for p, r in left_out}
    assert "zero_stage 0 has no replicas" in reasons["fp32-z0-w4-hsdp2"]
    assert "replicas=2 does not divide world_size=1" in reasons["fp32-z3-w1-hsdp2"]
    with pytest.raises(ConfigError, match="sweep.replicas=3 fits no"):
        sweep_plan(tiny_config(sweep={"precision": ["fp32"], "zero_stage": [3], "world_size": [2], "replicas": [1, 3]}))


@pytest.mark.unit
def test_the_schema_refuses_a_bad_replica_count():
    from conftest import tiny_config
    from scalelab.config import ConfigError
    from scalelab.plan.validation import validate_config

    for bad in (0, 1.5, "two"):
        with pytest.raises(ConfigError, match="replicas"):
            validate_config(tiny_config(sweep={"replicas": [bad]}))


@pytest.mark.unit
def test_the_report_shows_inter_node_bytes_only_for_runs_that_spanned_nodes():
    import pandas as pd

    from scalelab.report.report import inter_node_table

    def row(run_id, stage, replicas, nodes, inter, shared):
        return {"run_id": run_id, "status": "ok", "precision": "fp32", "zero_stage": stage, "world_size": 4,
                "replicas": replicas, "nodes_used": nodes, "nodes_share_machine": shared, "tokens_per_s": 100.0,
                "comm_inter_node_bytes_per_step_measured": inter, "comm_inter_node_bytes_per_step_predicted": inter,
                "comm_intra_node_bytes_per_step_measured": 0.0, "comm_intra_node_bytes_per_step_predicted": 0.0}

    one_host = pd.DataFrame([row("fp32-z3-w4", 3, 1, 1, 0.0, None)])
    assert inter_node_table(one_host).empty
    runs = pd.DataFrame([row("fp32-z3-w4", 3, 1, 2, 3 * 2 ** 20, True), row("fp32-z3-w4-hsdp2", 3, 2, 2, 2 ** 20, True)])
    table = inter_node_table(runs)
    assert list(table["inter_node_mib_per_step"]) == [1.0, 3.0]  # sorted by strategy name: FSDP2 HSDP first
    assert table["strategy"][0].startswith("FSDP2 HSDP") and set(table["timings"]) == {
        "nodes share one machine's cores: over-committed"}


# ----------------------------------------------------------------------------- real gloo runs
# World size 4 on 2 cores over-commits them (conftest.run_point allows it): a few steps only.
HYBRID_STEPS = 4


@pytest.fixture(scope="module")
def hybrid_runs(tmp_path_factory, tiny_data):
    """fp32 ZeRO-3 and hybrid (2 replicas x 2 shards) at world size 4, and 2 x 1 beside ZeRO-3 at 2."""
    from conftest import run_point, tiny_config
    from scalelab.plan.sweep import RunPoint

    tmp = tmp_path_factory.mktemp("hybrid")
    cfg = tiny_config(train={"steps": HYBRID_STEPS, "warmup_steps": 1}, planning={"launch_overcommitted": True})
    return {(w, r): run_point(tmp, tiny_data, RunPoint("fp32", 3, w, replicas=r), cfg=cfg, save_final_params=True)
            for w, r in ((4, 1), (4, 2), (2, 1), (2, 2))}


@pytest.mark.run
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


@pytest.mark.run
@pytest.mark.parametrize("world_size, replicas", [(4, 2), (2, 2)])
def test_hybrid_model_state_and_collective_bytes_match_their_formulas(hybrid_runs, world_size, replicas):
    summary = hybrid_runs[world_size, replicas][0]
    n = summary["n_params"]
    shard = world_size // replicas
    assert summary["model_state_bytes_predicted"] == 16 * n / shard
    for rank_bytes in summary["model_state_bytes_measured_per_rank"]:
        assert abs(rank_bytes - summary["model_state_bytes_predicted"]) / summary["model_state_bytes_predicted"] < 0.01
    # exact, by type: gathers and the reduce-scatter within the shard group (none on one rank), the
    # all-reduce of each shard across replicas
    by_type = accounting.comm_bytes_by_type(n, 3, world_size, "fp32", replicas=replicas)
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


@pytest.mark.run
@pytest.mark.parametrize("precision, grad_reduce", [("bf16", "compute"), ("fp16", "fp32")])
def test_hybrid_bytes_are_exact_in_16_bit_precisions(tmp_path, tiny_data, precision, grad_reduce):
    """MixedPrecisionPolicy gathers in the compute dtype; gradients are reduce-scattered and
    all-reduced across replicas in the reduce dtype; fp16 adds its scaler's flag over the world."""
    from conftest import run_point, tiny_config
    from scalelab.plan.sweep import RunPoint

    cfg = tiny_config(train={"steps": HYBRID_STEPS, "warmup_steps": 1}, planning={"launch_overcommitted": True})
    summary = run_point(tmp_path, tiny_data, RunPoint(precision, 3, 4, replicas=2, grad_reduce=grad_reduce), cfg=cfg)[0]
    assert summary["status"] == "ok", summary["reason"]
    n, reduce = summary["n_params"], 2 if grad_reduce == "compute" else 4
    assert summary["comm_bytes_per_step_by_type"] == {
        "all_gather_single": 2 * n * 2, "reduce_scatter_single": n * reduce,
        "all_reduce": 2 * n * reduce / 2 + (8 if precision == "fp16" else 0)}
    assert summary["comm_bytes_per_step_measured"] == summary["comm_bytes_per_step_predicted"]
    assert abs(summary["model_state_bytes_measured"] - 16 * n / 2) / (16 * n / 2) < 0.01
