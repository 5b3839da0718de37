"""A point the forecast pruned (planning.top_k) is recorded where it was planned, without starting a rank or
looking for its device: on a SLURM login node without a GPU, a GPU sweep's pruned point must read as pruned,
not as "no CUDA device is visible" (the launcher's own skip)."""
from scalelab.planning.forecast_record import is_pruned
from scalelab.planning.placement import DevicePlan
from scalelab.planning.sweep import RunPoint
from support import run_point


def test_a_pruned_gpu_point_is_recorded_as_pruned_on_a_machine_without_a_gpu(tmp_path, tiny_data):
    reason = "pruned by prediction, rank 3 of 4 of model base at world size 2 by forecast tokens/s (1e5; planning.top_k = 1)"
    forecast = {"forecast_step_time_s": 0.01, "forecast_tokens_per_s": 1e5, "forecast_rank": 3,
                "forecast_decision": "pruned: rank 3 of 4 > top_k 1", "forecast_note": "assumed"}
    summary, steps, _ = run_point(tmp_path, tiny_data, RunPoint("bf16", 3, 2),
                                  device_plan=DevicePlan("cuda", "cluster.gpus_per_node=8"), forecast=forecast, pruned=reason)
    assert summary["status"] == "skipped" and summary["reason"] == reason and is_pruned(summary["status"], summary["reason"])
    assert summary["device_type"] == "cuda" and summary.get("completed_steps") is None and steps.empty
    assert summary["forecast_rank"] == 3 and summary["predicted_peak_bytes"] > 0  # its forecast and memory plan recorded
