"""planning.top_k (issue #44): the forecast that ranks a sweep before any run, what it prunes and keeps,
and how the report and `scalelab status` show the pruned points apart."""
import pandas as pd
import pytest

from scalelab.config import ConfigError
from scalelab.forecast import pruning
from scalelab.forecast.predict import predict_point
from scalelab.forecast.step import Machine, Point
from scalelab.formulas import flops
from scalelab.harness.testing import tiny_config
from scalelab.planning import forecast_record
from scalelab.planning.forecast_record import is_pruned
from scalelab.planning.run_plan import run_plan
from scalelab.planning.sweep import sweep_plan
from scalelab.report.tables import forecast_ranking
from scalelab.results.status import RunState, format_status

CALIBRATION = {"peaks_flops": {"fp32": 1.0e11, "bf16": 6.0e10, "fp16": 2.0e10}, "measured_utc": "2026-11-27T00:00:00+00:00"}


def _plans(cfg, device="cpu"):
    points, _ = sweep_plan(cfg)
    return {p.run_id: run_plan(cfg, p, device=device) for p in points}


def _cpu_sweep(**planning):
    return tiny_config(sweep={"precision": ["fp32", "bf16", "fp16"], "zero_stage": [0, 3], "world_size": [1, 2]},
                       repeats={"points": 1, "baseline": 3}, planning={"top_k": 1, **planning})


def test_each_model_and_world_size_runs_its_top_k_and_the_baselines_the_rest_pruned_with_their_rank():
    cfg = _cpu_sweep()
    decisions = pruning.decide(cfg, _plans(cfg), CALIBRATION)
    # a CPU forecasts every precision at fp32's peak: at world size 1 nothing tells the points apart (no
    # communication), they tie and ties share a rank, so all run; at world size 2 DDP's one all-reduce beats
    # ZeRO-3's gathers and reduce-scatters per block (exposed on a CPU), and fp16's loss scaler adds calls
    assert sorted(r for r, d in decisions.items() if d.pruned) == ["bf16-z3-w2", "fp16-z0-w2", "fp16-z3-w2", "fp32-z3-w2"]
    w2 = {r: d.forecast["forecast_rank"] for r, d in decisions.items() if r.endswith("-w2")}
    assert w2["fp32-z0-w2"] == w2["bf16-z0-w2"] == 1 < w2["fp16-z0-w2"] < w2["fp32-z3-w2"]
    assert decisions["fp32-z0-w2-r3"].forecast["forecast_decision"].startswith("run: rank 1 of 6")  # a repeat follows its point
    pruned = decisions["bf16-z3-w2"]
    assert pruned.pruned and is_pruned("skipped", pruned.reason)
    assert f"rank {w2['bf16-z3-w2']} of 6 of model base at world size 2" in pruned.reason and "planning.top_k = 1" in pruned.reason
    # the forecast is the plan's model: compute at the calibrated peak x MFU, DDP's all-reduce on the assumed gloo link
    plan = _plans(cfg)["fp32-z0-w2"]
    expected = predict_point(Point(cfg=plan.model, n_params=flops.param_count(plan.model), key=0, precision="fp32",
                                   micro_batch=plan.micro_batch, global_batch=8), Machine(
        product=None, peak_flops=1.0e11, mfu=0.4, per_node=2, intra=pruning.CPU_LINK, inter=pruning.CPU_LINK,
        overlap_efficiency=0.0), 2)
    assert decisions["fp32-z0-w2"].forecast["forecast_step_time_s"] == pytest.approx(expected["step_time_s"])
    assert "CPU fp32 matmul peak 100.0 GFLOP/s for every precision" in decisions["bf16-z0-w2"].forecast["forecast_note"]
    # the baseline runs whatever its rank: with a forecast that ranks it last (ZeRO-3 made the first stage listed)
    cfg["sweep"]["zero_stage"] = [3, 0]
    flipped = pruning.decide(cfg, _plans(cfg), CALIBRATION)
    assert flipped["fp32-z3-w2"].forecast["forecast_decision"].startswith("run: a baseline (rank ")


def test_a_point_that_already_ended_ok_is_never_pruned_and_without_top_k_nothing_is():
    cfg = _cpu_sweep()
    cfg["repeats"]["points"] = 2
    kept = pruning.decide(cfg, _plans(cfg), CALIBRATION, measured_ok=frozenset({"bf16-z3-w2"}))
    assert not kept["bf16-z3-w2"].pruned and not kept["bf16-z3-w2-r2"].pruned and kept["fp16-z3-w2"].pruned
    assert kept["bf16-z3-w2-r2"].forecast["forecast_decision"].startswith("run: ended ok before (rank ")
    cfg["planning"]["top_k"] = None
    assert not any(d.pruned or d.forecast for d in pruning.decide(cfg, _plans(cfg), CALIBRATION).values())


def test_a_gpu_sweep_ranks_by_its_gpus_datasheet_and_never_prunes_a_point_predicted_not_to_fit():
    cfg = tiny_config(sweep={"precision": ["fp32", "bf16"], "zero_stage": [0, 3], "world_size": [8]},
                      cluster={"ranks_per_node": 8}, repeats={"points": 1, "baseline": 1},
                      planning={"top_k": 1, "forecast": {"gpu": "H100"}})
    cfg["model"].update(n_layers=24, d_model=2048, n_heads=16, seq_len=1024)
    decisions = pruning.decide(cfg, _plans(cfg, "cuda"))
    rank = {r: d.forecast["forecast_rank"] for r, d in decisions.items()}
    # bf16 at the datasheet's bf16 peak, ~15x fp32's; within a precision ZeRO-3's bf16 gathers and fp32 reduce-scatters
    # take about as long as DDP's fp32 all-reduce (3% apart at the GPU's default overlap): tied, both run
    assert rank == {"bf16-z3-w8": 1, "bf16-z0-w8": 1, "fp32-z0-w8": 3, "fp32-z3-w8": 3}, rank
    assert [r for r, d in decisions.items() if d.pruned] == ["fp32-z3-w8"]  # fp32-z0: the baseline
    assert "datasheet dense bf16: H100 SXM" in decisions["bf16-z0-w8"].forecast["forecast_note"]
    # at 10 GiB a device, DDP's full model state (1.3B x 16 B) cannot fit: such points are left to the launcher
    # (predicted_oom), neither ranked nor pruned; ZeRO-3's shards fit and are the ones ranked
    cfg["planning"]["device_memory_gib"] = 10
    small = pruning.decide(cfg, _plans(cfg, "cuda"))
    assert not small["bf16-z0-w8"].pruned and "forecast_rank" not in small["bf16-z0-w8"].forecast
    assert "predicted not to fit" in small["bf16-z0-w8"].forecast["forecast_decision"]
    assert {r: d.forecast.get("forecast_rank") for r, d in small.items() if d.pruned} == {"fp32-z3-w8": 2}


def test_a_gpu_sweep_without_a_known_gpu_says_which_key_to_set(monkeypatch):
    monkeypatch.setattr("scalelab.planning.placement.visible_gpus", lambda: [])
    cfg = tiny_config(sweep={"precision": ["fp32", "bf16"], "zero_stage": [0], "world_size": [1]}, planning={"top_k": 1})
    with pytest.raises(ConfigError, match="planning.forecast.gpu"):
        pruning.decide(cfg, _plans(cfg, "cuda"))


def test_points_the_forecast_cannot_tell_apart_run_and_say_why():
    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [0, 3], "world_size": [2], "lora_rank": [None, 4]},
                      repeats={"points": 1, "baseline": 1}, planning={"top_k": 1})
    decisions = pruning.decide(cfg, _plans(cfg), CALIBRATION)
    lora = [d for r, d in decisions.items() if "lora" in r]
    assert lora and not any(d.pruned for d in lora)
    assert all(d.forecast["forecast_decision"].startswith("run: not ranked: LoRA") for d in lora)
    assert "not ranked, so run: LoRA" in pruning.summary_line(decisions, 1)


def test_the_report_lists_pruned_points_apart_with_measured_ranks_beside_the_forecast():
    rows = [("fp32-z0-w2", 1, "ok", None, 1, 900.0, 1000.0, "run: a baseline"),
            ("fp32-z0-w2-r2", 2, "ok", None, 1, 900.0, 1100.0, "run: a baseline"),
            ("bf16-z0-w2", 1, "ok", None, 2, 800.0, 1200.0, "run: rank 2 <= top_k 2"),
            ("fp16-z0-w2", 1, "skipped", "pruned by prediction, rank 3 of 3 ...", 3, 500.0, None, "pruned: rank 3 > top_k 2"),
            ("fp16-z3-w2", 1, "skipped", "world_size=2 needs 2 GPUs", None, None, None, "run: not ranked: fp8")]
    runs = pd.DataFrame(rows, columns=["run_id", "repeat", "status", "reason", "forecast_rank", "forecast_tokens_per_s",
                                       "tokens_per_s", "forecast_decision"]).assign(model="base", world_size=2,
                                                                                    predicted_peak_bytes=2 ** 20)
    table = forecast_ranking(runs)
    assert list(table["point"]) == ["fp32-z0-w2", "bf16-z0-w2", "fp16-z0-w2", "fp16-z3-w2"]
    first = table.iloc[0]
    assert first["measured_tokens_per_s"] == 1050.0 and first["runs"] == 2 and first["measured_rank"] == 2
    assert table.iloc[1]["measured_rank"] == 1  # the forecast ranked it second; measured, it was first
    assert list(table["pruned"]) == [False, False, True, False]  # a skip of the launcher's is no pruning
    assert pd.isna(table.iloc[2]["measured_tokens_per_s"])
    assert forecast_ranking(runs.drop(columns="forecast_decision")).empty


def test_status_lists_pruned_points_apart_from_the_runs_that_went_wrong(tmp_path):
    states = [RunState("fp32-z0-w1", "fp32-z0-w1", "ok"),
              RunState("bf16-z3-w1", "bf16-z3-w1", "skipped", "pruned by prediction, rank 4 of 4"),
              RunState("fp16-z0-w1", "fp16-z0-w1", "failed", "boom")]
    text = format_status(tmp_path, states)
    wrong = text.split("not ok:")[1].split("pruned by the forecast")[0]
    assert "fp16-z0-w1" in wrong and "bf16-z3-w1" not in wrong
    assert "pruned by the forecast (planning.top_k; raise it to run them): 1, bf16-z3-w1" in text


def test_the_forecast_record_round_trips(tmp_path):
    cfg = _cpu_sweep()
    decisions = pruning.decide(cfg, _plans(cfg), CALIBRATION)
    forecast_record.write(tmp_path, decisions)
    assert forecast_record.read(tmp_path) == decisions
    assert forecast_record.read(tmp_path / "elsewhere") == {}
    forecast_record.forget(tmp_path)
    assert forecast_record.read(tmp_path) == {}
    assert decisions["fp16-z3-w2"].pruned and decisions["fp16-z3-w2"].rank > 1


def test_a_gpu_sweep_spanning_nodes_needs_the_link_between_them():
    cfg = tiny_config(sweep={"precision": ["bf16"], "zero_stage": [0, 3], "world_size": [16]}, cluster={"ranks_per_node": 8},
                      train={"global_batch": 32}, repeats={"points": 1, "baseline": 1},
                      planning={"top_k": 1, "forecast": {"gpu": "H100"}})
    with pytest.raises(ConfigError, match="planning.forecast.inter_node: bf16-z0-w16 spans nodes of 8 GPUs"):
        pruning.decide(cfg, _plans(cfg, "cuda"))
    cfg["planning"]["forecast"]["inter_node"] = "ib-ndr"
    decisions = pruning.decide(cfg, _plans(cfg, "cuda"))
    assert "ib-ndr between nodes" in decisions["bf16-z3-w16"].forecast["forecast_note"]


def test_a_measured_busbw_in_the_config_is_read_over_its_gpus_per_node():
    """planning.forecast.inter_node: busbw:GBPS/RANKS is nccl-tests' all-reduce over RANKS GPUs of nodes of
    cluster.ranks_per_node: one NIC's share is GBPS / ranks_per_node, as `estimate scaling --inter-node` reads it."""
    from scalelab.formulas import links

    for per_node in (4, 8):
        link = pruning._link("inter_node", "busbw:40/16", per_node)
        assert link == links.measured_busbw("busbw:40/16", per_node, True)
        assert link.achievable_Bps == pytest.approx(40e9 / per_node)


def test_the_gpu_forecast_reads_tf32_a_hybrid_within_a_node_and_leaves_fp8_to_a_gpu_that_has_it():
    cfg = tiny_config(sweep={"precision": ["fp32", "fp8"], "zero_stage": [3], "world_size": [8], "replicas": [1, 2]},
                      cluster={"ranks_per_node": 8}, repeats={"points": 1, "baseline": 1},
                      planning={"top_k": 1, "forecast": {"gpu": "A100"}})
    cfg["model"].update(n_layers=24, d_model=2048, n_heads=16, seq_len=1024)  # compute-bound: the peak shows
    plain = pruning.decide(cfg, _plans(cfg, "cuda"))
    assert "dense fp32" in plain["fp32-z3-w8"].forecast["forecast_note"]
    # hybrid sharding within one node of 8: shard groups of 4, every collective on NVLink (no link between nodes asked)
    assert plain["fp32-z3-w8-hsdp2"].rank is not None
    # the A100 has no FP8: the launcher skips such a point, so it takes no rank from one that runs
    assert plain["fp8-z3-w8"].forecast["forecast_decision"].startswith("run: not ranked: fp8 on A100")
    cfg["train"]["tf32"] = True
    tf32 = pruning.decide(cfg, _plans(cfg, "cuda"))
    assert "dense tf32" in tf32["fp32-z3-w8"].forecast["forecast_note"]
    assert tf32["fp32-z3-w8"].forecast["forecast_tokens_per_s"] > 5 * plain["fp32-z3-w8"].forecast["forecast_tokens_per_s"]


def test_a_link_the_forecast_cannot_read_names_its_key():
    cfg = tiny_config(sweep={"precision": ["bf16"], "zero_stage": [0], "world_size": [2]},
                      planning={"top_k": 1, "forecast": {"gpu": "H100", "intra_node": "bogus"}})
    with pytest.raises(ConfigError, match="planning.forecast.intra_node: "):
        pruning.decide(cfg, _plans(cfg, "cuda"))
    cfg["planning"]["forecast"]["intra_node"] = 300  # a bandwidth in GB/s, as a number
    assert "300 GB/s within a node" in pruning.decide(cfg, _plans(cfg, "cuda"))["bf16-z0-w2"].forecast["forecast_note"]
