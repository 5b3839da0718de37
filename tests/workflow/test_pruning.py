"""planning.top_k through the real workflow (issue #44): a sweep runs only what its forecast ranks worth
running, records the rest as pruned with their forecast, shows them apart in the report, and trains a
pruned point once top_k is raised, without retraining anything that ran."""
import json
import socket

import pyarrow.parquet as pq
import pytest

from support import snakemake, tiny_config, write_workdir


@pytest.mark.workflow(cost_s=40)
def test_a_top_k_sweep_runs_the_ranked_points_and_records_the_rest_with_their_forecast(tmp_path):
    cfg = tiny_config(train={"steps": 4, "warmup_steps": 1}, repeats={"points": 1, "baseline": 1},
                      prediction={"bench_comm": False}, planning={"top_k": 1},
                      sweep={"precision": ["fp32", "bf16"], "zero_stage": [0, 3], "world_size": [2]})
    workdir = write_workdir(tmp_path, cfg)
    first = snakemake(workdir, "--cores", "2")
    plan = json.loads((tmp_path / "results/plan/forecast.json").read_text())
    pruned = sorted(run_id for run_id, d in plan.items() if d["reason"])
    # one world size, one model: the baseline (fp32 z0) and the points of rank 1 run (DDP's one all-reduce, in
    # both precisions: a CPU's forecast times every precision at fp32's peak), ZeRO-3's are pruned
    assert pruned == ["bf16-z3-w2", "fp32-z3-w2"] and all(plan[r]["forecast"]["forecast_rank"] > 1 for r in pruned), plan
    assert f"{len(pruned)} pruned" in first.stderr

    runs = pq.read_table(tmp_path / "results/metrics.parquet").to_pandas().set_index("run_id")
    ran = runs.drop(index=pruned)
    assert (ran["status"] == "ok").all() and (runs.loc[pruned, "status"] == "skipped").all(), runs[["status", "reason"]]
    assert runs.loc[pruned, "reason"].str.startswith("pruned by prediction, rank ").all()
    assert runs.loc[pruned, "completed_steps"].isna().all()  # nothing started
    assert runs["forecast_tokens_per_s"].gt(0).all() and runs["forecast_rank"].notna().all()
    # the note names the host that measured the peak (under SLURM the planning node, not the runs')
    assert runs["forecast_note"].str.contains(f"sweep's calibration on {socket.gethostname()}", regex=False).all()
    assert runs.loc[pruned, "forecast_decision"].str.startswith("pruned: rank ").all()
    assert runs.loc["bf16-z0-w2", "forecast_decision"].startswith("run: rank 1 of 4 ")
    html = (tmp_path / "results/report/report.html").read_text()
    section = html.split("id=\"forecast\"")[1].split("id=\"warnings\"")[0]
    ran_part, pruned_part = section.split("Pruned: forecast only")
    assert all(r in ran_part for r in ran.index) and not any(r in ran_part for r in pruned)
    assert all(r in pruned_part for r in pruned)
    warnings = html.split("id=\"warnings\"")[1].split("<h2")[0]
    assert not any(r in warnings for r in pruned)  # a decision, not a warning
    assert "every run ok" not in warnings or f"but the {len(pruned)} the forecast pruned" in warnings
    assert f"{len(pruned)} pruned by the forecast" in html.split("id=\"best\"")[0]

    # raise top_k past every rank: the pruned points train; the runs that ended ok are not retrained
    started = {r: json.loads((tmp_path / "results/runs" / r / "summary.json").read_text())["started_utc"] for r in ran.index}
    cfg["planning"]["top_k"] = 4
    write_workdir(tmp_path, cfg)
    snakemake(workdir, "--cores", "2", "collect")  # the tables from here on: the report was read above
    after = pq.read_table(tmp_path / "results/metrics.parquet").to_pandas().set_index("run_id")
    assert (after["status"] == "ok").all(), after[["status", "reason"]]
    for run_id, when in started.items():
        assert json.loads((tmp_path / "results/runs" / run_id / "summary.json").read_text())["started_utc"] == when, run_id


    # top_k unset: its record goes (no new run may take an earlier forecast), and new points train without one
    del cfg["planning"]["top_k"]
    cfg["sweep"]["precision"].append("fp16")
    write_workdir(tmp_path, cfg)
    snakemake(workdir, "--cores", "2", "collect")
    assert not (tmp_path / "results/plan/forecast.json").exists()
    plain = pq.read_table(tmp_path / "results/metrics.parquet").to_pandas().set_index("run_id")
    assert plain.loc[["fp16-z0-w2", "fp16-z3-w2"], "forecast_decision"].isna().all()
    assert plain.loc["bf16-z3-w2", "forecast_rank"] > 1  # a run launched under top_k keeps its own

    # top_k set again over runs measured without it: nothing trains, collection gives them the plan's forecast
    cfg["planning"]["top_k"] = 1
    write_workdir(tmp_path, cfg)
    again = snakemake(workdir, "--cores", "2", "collect")
    assert "rule train" not in again.stdout + again.stderr and "starts train" not in again.stdout + again.stderr
    plan = json.loads((tmp_path / "results/plan/forecast.json").read_text())
    ranked = pq.read_table(tmp_path / "results/metrics.parquet").to_pandas().set_index("run_id")
    for run_id in ("fp16-z0-w2", "fp16-z3-w2"):
        assert ranked.loc[run_id, "forecast_rank"] == plan[run_id]["forecast"]["forecast_rank"], ranked.loc[run_id]
        assert ranked.loc[run_id, "forecast_decision"] == plan[run_id]["forecast"]["forecast_decision"]
    assert ranked.loc["fp16-z3-w2", "forecast_decision"].startswith("run: ended ok before")
