"""Hybrid sharding (HSDP, issue #28 point 3) and traffic per link (point 4): the formulas by hand,
the classification of a collective's group by placement, and real gloo runs against ZeRO-3."""
import pytest

from scalelab.formulas import communication, model_state
from scalelab.formulas.rank_step import RankStep
from scalelab.registries.strategies import HYBRID, STRATEGIES, check_replicas, strategy
from scalelab.registries.topology import contiguous_nodes, link_of

PSI = 1000


def test_hybrid_is_stage_3_with_replicas():
    assert strategy(3, 2) is HYBRID and strategy("hybrid") is HYBRID and strategy(3, 1) is STRATEGIES[3]
    with pytest.raises(ValueError, match="zero_stage 3"):
        strategy(0, 2)
    with pytest.raises(ValueError, match="replicas=3 does not divide world_size=4"):
        check_replicas(4, 3)
    with pytest.raises(ValueError, match="whole number >= 1"):
        check_replicas(4, 0)


def test_hybrid_model_state_is_sharded_over_the_shard_group():
    # 16 bytes per parameter (fp32 params, grads, AdamW m and v) over S = N/R ranks
    assert model_state.model_state_bytes(PSI, 3, 4, "fp32", replicas=2).total == 16 * PSI / 2
    assert model_state.model_state_bytes(PSI, 3, 8, "bf16", replicas=2).total == 16 * PSI / 4
    assert model_state.model_state_bytes(PSI, 3, 2, "fp32", replicas=2).total == 16 * PSI  # 2 x 1: replicated
    assert model_state.model_state_bytes(PSI, 3, 4, "fp32", "paper", replicas=2).total == 16 * PSI / 2
    assert model_state.model_state_bytes(PSI, 3, 4, "fp32", replicas=1) == model_state.model_state_bytes(PSI, 3, 4, "fp32")


@pytest.mark.parametrize("precision, grad_reduce, gather, reduce, scaler", [
    ("fp32", "fp32", 4, 4, 0), ("bf16", "fp32", 2, 4, 0), ("bf16", "compute", 2, 2, 0), ("fp16", "compute", 2, 2, 8)])
def test_hybrid_collective_bytes_by_type(precision, grad_reduce, gather, reduce, scaler):
    """R = 2 replicas of S = 2 shards, k = 2 micro-batches: 2k Psi gathered and Psi reduce-scattered
    within the shard group, 2 Psi / S all-reduced across replicas (+ fp16's 8-byte flag)."""
    step = RankStep(precision, 3, 4, 1, 2, replicas=2, grad_reduce=grad_reduce)  # its micro-batch: no bytes read it
    by_type = communication.comm_bytes_by_type(PSI, step)
    assert by_type == {"all_gather": 4 * PSI * gather, "reduce_scatter": PSI * reduce,
                       "all_reduce": 2 * PSI * reduce / 2 + scaler}
    assert communication.comm_bytes_per_step(PSI, step) == sum(by_type.values())
    # 2 x 1: no gathers or reduce-scatter on a one-rank shard group, a plain all-reduce of Psi across
    assert communication.comm_bytes_by_type(PSI, RankStep(precision, 3, 2, 1, 2, replicas=2, grad_reduce=grad_reduce)) == {
        "all_reduce": 2 * PSI * reduce + scaler}
    # the elements agree with the bytes at fp32's width
    assert 4 * communication.comm_elements_per_step(PSI, 3, 4, 2, replicas=2) == \
        communication.comm_bytes_per_step(PSI, RankStep("fp32", 3, 4, 1, 2, replicas=2))


def test_link_of_a_group_by_placement():
    hosts = ["n1", "n1", "n2", "n2"]
    assert link_of([0, 1], hosts) == "intra_node" and link_of([2, 3], hosts) == "intra_node"
    assert link_of([0, 2], hosts) == "inter_node" and link_of(range(4), hosts) == "inter_node"
    assert link_of([0], hosts) == "intra_node"
    assert contiguous_nodes(6, 2) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="no ranks"):
        link_of([], hosts)


@pytest.mark.parametrize("stage, replicas", [(0, 1), (1, 1), (2, 1), (3, 1), (3, 2), (3, 4)])
@pytest.mark.parametrize("world_size, per_node", [(1, 1), (4, 4), (4, 2), (8, 2), (8, 4)])
def test_bytes_by_link_add_up_and_cross_nodes_only_when_a_group_spans_them(stage, replicas, world_size, per_node):
    if world_size % replicas:
        return
    step = RankStep("fp16", stage, world_size, 1, 2, replicas=replicas)
    by_link = communication.comm_bytes_by_link(PSI, step, per_node)
    total = communication.comm_bytes_per_step(PSI, step)
    assert sum(sum(v.values()) for v in by_link.values()) == total
    if world_size <= per_node:
        assert by_link["inter_node"] == {}
    elif replicas == 1:
        assert by_link["intra_node"] == {}  # every collective over the world, which spans nodes
    elif world_size // replicas <= per_node:
        # hybrid with a shard group inside a node: only the all-reduce across replicas (and fp16's
        # flag, over the world) crosses nodes
        assert by_link["inter_node"] == {"all_reduce": 2 * PSI * 4 / (world_size // replicas) + 8}


def test_bytes_by_link_hand_computed_two_nodes():
    """The two-nodes experiment's shape: 2 nodes x 2 ranks, fp32. ZeRO-3 sends 3 Psi x 4 bytes
    over the inter-node link; hybrid 2 x 2 sends 2 Psi/2 x 4 and keeps 3 Psi x 4 within a node."""
    assert communication.comm_bytes_by_link(PSI, RankStep("fp32", 3, 4, 1), 2) == {
        "intra_node": {}, "inter_node": {"reduce_scatter": 4 * PSI, "all_gather": 8 * PSI}}
    assert communication.comm_bytes_by_link(PSI, RankStep("fp32", 3, 4, 1, replicas=2), 2) == {
        "intra_node": {"reduce_scatter": 4 * PSI, "all_gather": 8 * PSI}, "inter_node": {"all_reduce": 4 * PSI}}
    assert communication.comm_bytes_by_link(PSI, RankStep("fp32", 0, 4, 1), 2) == {
        "intra_node": {}, "inter_node": {"all_reduce": 8 * PSI}}


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


def test_the_replicas_axis_keeps_old_run_ids_and_leaves_out_what_it_does_not_apply_to():
    from scalelab.config import ConfigError
    from scalelab.planning.sweep import RunPoint, sweep_plan
    from support import tiny_config

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


def test_the_schema_refuses_a_bad_replica_count():
    from scalelab.config import ConfigError
    from scalelab.planning.validation import validate_config
    from support import tiny_config

    for bad in (0, 1.5, "two"):
        with pytest.raises(ConfigError, match="replicas"):
            validate_config(tiny_config(sweep={"replicas": [bad]}))


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
