"""Every comparison within its like (issue #41): a sweep of several models compares each model with
itself. A real sweep of the default GPT-2-shaped model and a llama-tiny one (fp32 and bf16, ZeRO
stages 0 and 3, world sizes 1 and 2; the base model's baseline repeated) through Snakemake, and the
grouping helper (scalelab.results.like) on synthetic frames."""
import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import snakemake, tiny_config, write_workdir
from scalelab.report.compare import build_compare, compare_runs, noise_limits
from scalelab.report.report import load_tables
from scalelab.report.tables import best_configurations, loss_deviation_vs_stage0, scaling_efficiency
from scalelab.results.like import (
    OVER_CONFIGURATION,
    OVER_POINTS,
    OVER_STAGE,
    OVER_WORLD_SIZE,
    like_key,
    model_labels,
    models,
)
from scalelab.results.noise import ModelNoise, margin_between, model_noise, sweep_noise

MODELS = {"ltiny": {"preset": "llama-tiny", "n_layers": 1, "d_model": 32, "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 64}}
"""llama-tiny's family (grouped-query attention, SwiGLU, RoPE), one block narrower, beside the base model (GPT-2, 2 x 32)."""
SWEEP = {"model": ["base", "ltiny"], "precision": ["fp32", "bf16"], "zero_stage": [0, 3], "world_size": [1, 2]}


# ----------------------------------------------------------------------------- a real sweep of two models

@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The sweep run once for the module: 16 points and each model's baseline repeated (fp32-z0-w1
    and -w2 twice, of base and of ltiny), so that each model measures its own noise."""
    tmp = tmp_path_factory.mktemp("multi_model")
    cfg = tiny_config(models=MODELS, sweep=SWEEP, train={"steps": 8, "warmup_steps": 2}, repeats={"baseline": 2})
    workdir = write_workdir(tmp, cfg)
    proc = snakemake(workdir, "--cores", "2", timeout=420)
    runs, steps = load_tables(tmp / "results")
    assert len(runs) == 16 + 4 and (runs["status"] == "ok").all(), runs.loc[runs["status"] != "ok", ["run_id", "reason"]]
    assert set(runs["model_family"]) == {"gpt2", "llama"}
    return {"dir": tmp / "results", "runs": runs, "steps": steps, "out": proc.stdout + proc.stderr,
            "html": (tmp / "results/report/report.html").read_text(), "summary": (tmp / "results/report/summary.md").read_text()}


def _table(html: str, marker: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows of cell texts) of the report's table after marker."""
    table = html[html.index(marker):]
    table = table[:table.index("</table>")]
    header = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.+?)</th>", table)]
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
    return header, [r for r in rows if r]


@pytest.mark.workflow(cost_s=90)
def test_efficiency_divides_by_the_world_size_1_median_of_its_own_model(sweep):
    """metrics.parquet's and the report's scaling_efficiency: every model's world-size-1 runs read 1
    (the base model's repeated baseline by its median), and a world-size-2 run divides by its own
    model's world-size-1 median, never a median pooled over models."""
    runs = sweep["runs"].set_index("run_id")
    for (model, precision, stage), group in runs.groupby(["model", "precision", "zero_stage"]):
        single = group[group["world_size"] == 1]
        assert single["scaling_efficiency"].median() == pytest.approx(1.0, abs=1e-12), (model, precision, stage)
        if len(single) == 1:
            assert single["scaling_efficiency"].iloc[0] == 1.0, (model, precision, stage)
        base = single["tokens_per_s"].median()
        for run_id, r in group[group["world_size"] == 2].iterrows():
            assert r["scaling_efficiency"] == pytest.approx(r["tokens_per_s"] / (2 * base), rel=1e-12), run_id
    # what a baseline pooled over models gives (the bug: fp32-z0-w1-mine read 0.537): a model's world-size-1 runs off 1
    w1 = runs[runs["world_size"] == 1]
    pooled = w1["tokens_per_s"] / w1.groupby(["precision", "zero_stage"])["tokens_per_s"].transform("median")
    assert (pooled.groupby([w1["model"], w1["precision"], w1["zero_stage"]]).median() - 1).abs().max() > 1e-3, pooled
    # the report's run table shows the same efficiency (its own function over the same rows)
    header, rows = _table(sweep["html"], 'id="run-table"')
    header = [h.replace("<wbr>", "") for h in header]
    shown = {row[header.index("run_id")]: row[header.index("scaling_efficiency")] for row in rows}
    for run_id, r in runs.iterrows():
        assert shown[run_id] == f"{r['scaling_efficiency']:.3f}", run_id
    # a world-size-1 point of one run is its own baseline (the repeated baselines read about 1: their median is 1)
    assert shown["bf16-z0-w1-ltiny"] == shown["bf16-z3-w1-ltiny"] == shown["fp32-z3-w1"] == "1.000"
    pd.testing.assert_series_equal(scaling_efficiency(sweep["runs"]), sweep["runs"]["scaling_efficiency"], check_names=False)


@pytest.mark.workflow(cost_s=1)
def test_the_dloss_table_compares_each_model_with_its_own_stage_0(sweep):
    """|Δloss| against stage 0 per model, precision and world size: stage 3 against the same model's
    stage 0 (fp32: ~1e-6, not the nats between two models), and no stage-0 row (0 by definition)."""
    runs, steps = sweep["runs"], sweep["steps"]
    dev = loss_deviation_vs_stage0(steps, runs)
    assert set(dev["model"]) == {"base", "ltiny"} and (dev["zero_stage"] == 3).all() and len(dev) == 2 * 2 * 2
    plain = steps.astype({"run_id": str, "precision": str, "model": str})
    for r in dev.itertuples():
        here = plain[(plain["model"] == r.model) & (plain["precision"] == r.precision) & (plain["world_size"] == r.world_size)]
        ref = here[here["zero_stage"] == 0].groupby("step")["loss"].mean()
        mine = here[here["zero_stage"] == 3].set_index("step")["loss"]
        assert r.max_abs_dloss == pytest.approx((mine - ref.reindex(mine.index)).abs().max(), rel=1e-9, abs=1e-12)
        assert r.max_abs_dloss < (1e-4 if r.precision == "fp32" else 0.05), r
    between = plain[(plain["zero_stage"] == 0) & (plain["precision"] == "fp32")].groupby(["model", "step"])["loss"].mean().unstack(0)
    assert (between["base"] - between["ltiny"]).abs().max() > 10 * dev["max_abs_dloss"].max(), "pooled, it would read the models' gap"
    header, rows = _table(sweep["html"], "Largest |Δloss| against stage 0")
    assert header[:4] == ["model", "precision", "world_size", "zero_stage"] and len(rows) == len(dev)
    assert {row[0] for row in rows} == {"base", "ltiny"} and all(row[3] == "3" for row in rows)
    assert "stage 0 itself is the reference" in sweep["html"]
    assert "fp32 parity broken" not in sweep["html"], "fp32 runs of one model agree across stages and world sizes"


@pytest.mark.workflow(cost_s=1)
def test_best_configuration_per_world_size_within_each_model(sweep):
    runs = sweep["runs"]
    best = best_configurations(runs)
    assert best[["model", "world_size"]].values.tolist() == [["base", 1], ["base", 2], ["ltiny", 1], ["ltiny", 2]]
    label = dict(zip(runs["run_id"], model_labels(runs)))
    for r in best.itertuples():
        assert label[r.run_id] == r.model and r.ok_runs == 4, r  # fastest of its own model's four points
        here = runs[(model_labels(runs) == r.model).to_numpy() & (runs["world_size"] == r.world_size)]
        assert r.tokens_per_s == here.groupby(here["run_id"].str.replace(r"-r\d+$", "", regex=True))["tokens_per_s"].median().max()
        for other in filter(None, [r.runner_up, *str(r.within_noise or "").split(", ")]):
            assert label[other] == r.model, (r.run_id, other)
    header, rows = _table(sweep["html"], 'id="best-table"')
    assert header[:2] == ["model", "world size"] and [row[:2] for row in rows] == [["base", "1"], ["base", "2"], ["ltiny", "1"], ["ltiny", "2"]]
    assert "| model | world size |" in sweep["summary"]
    for r in best.itertuples():  # the end-of-sweep text, a line per model and world size
        assert f"model {r.model}, world size {r.world_size}: {r.run_id} " in sweep["out"], sweep["out"][-3000:]


@pytest.mark.workflow(cost_s=1)
def test_noise_is_pooled_within_each_model(sweep):
    """Each model's repeated baseline measures its own noise (the sweep repeats every model's
    baseline), pooled from that model's runs alone; each model's points are ranked by it. (A model
    without repeats is never ranked by another's spread: the unit test below.)"""
    runs = sweep["runs"]
    noise = model_noise(runs)
    assert isinstance(noise, ModelNoise) and list(noise.by_model) == models(runs) == ["base", "ltiny"]
    for model in ("base", "ltiny"):
        mine = runs[runs["model"] == model]
        assert noise.of(model) == sweep_noise(mine) and noise.of(model).known
        assert (noise.of(model).points, noise.of(model).runs, noise.of(model).dof) == (2, 4, 2)
    best = best_configurations(runs)
    assert best.attrs["noise"] == noise
    for model in ("base", "ltiny"):
        assert best.loc[best["model"] == model, "noise_margin"].dropna().gt(0).all()
        assert f"Model {model}: run-to-run spread of tokens/s: up to" in sweep["html"]


@pytest.mark.workflow(cost_s=5)
def test_compare_pairs_runs_within_each_model(sweep, tmp_path):
    """scalelab compare of the sweep with a copy whose base model has another shape (its model: section
    changed): the llama runs pair with themselves, judged against the llama model's own noise (not the
    base model's); the base runs, another model on each side, do not pair."""
    a, b = sweep["dir"], tmp_path / "b"
    shutil.copytree(a, b, ignore=shutil.ignore_patterns("report", "compare"))
    runs_b = pd.read_parquet(b / "metrics.parquet")
    runs_b.loc[runs_b["model"] == "base", "d_model"] = 64
    runs_b.to_parquet(b / "metrics.parquet")
    runs_a, steps_a = load_tables(a)
    runs_b, steps_b = load_tables(b)
    table = compare_runs(runs_a, runs_b, steps_a, steps_b)
    assert sorted(table["run_id"]) == sorted(runs_a.loc[runs_a["model"] == "ltiny", "run_id"])
    assert (table["tokens_per_s_ratio"] == 1).all() and not table["throughput_change"].str.startswith("unknown").any()
    assert table["loss_max_rel_diff"].eq(0).all()
    # the copy itself: every run pairs with its own model's, the base runs judged against the base model's noise
    same = compare_runs(runs_a, runs_a, steps_a, steps_a).set_index("run_id")
    assert len(same) == len(runs_a) and (same["model"] == same.index.map(lambda r: "ltiny" if "ltiny" in r else "base")).all()
    limits = {}
    for model in ("base", "ltiny"):
        noise = sweep_noise(runs_a[runs_a["model"] == model])
        limits[model] = margin_between(noise, (1,), noise, (1,))
        assert limits[model] and same.loc[same["model"] == model, "noise_limit"].eq(limits[model]).all()
    assert limits["base"] != limits["ltiny"], "each model judged by its own noise"
    assert noise_limits(runs_a, runs_a).notna().all()
    build_compare(a, b, tmp_path / "out")
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "10 run id(s) on both sides trained another model on each, so they are not paired (d_model 32 vs 64)" in md, md
    assert "- provenance differs in: nothing" in md, "config_hash (results_dir is in it) is never called a difference"


# ----------------------------------------------------------------------------- the helper, on synthetic frames

def _frame(rows) -> pd.DataFrame:
    """(run_id, model, d_model, status, tokens/s) with the axes read from the run id."""
    out = []
    for run_id, model, d_model, tps in rows:
        parts = run_id.split("-")
        out.append({"run_id": run_id, "model": model, "d_model": d_model, "status": "ok", "tokens_per_s": tps,
                    "precision": parts[0], "zero_stage": int(parts[1][1:]), "world_size": int(parts[2][1:]),
                    "repeat": int(parts[-1][1:]) if re.fullmatch(r"r\d+", parts[-1]) else 1,
                    "activation_checkpointing": "ac" in parts, "micro_batch": 2 if "mb2" in parts else 8 // int(parts[2][1:]),
                    "accumulation_steps": (8 // int(parts[2][1:])) // 2 if "mb2" in parts else 1,
                    "bucket_mb": 25.0 if int(parts[1][1:]) < 2 else None, "replicas": 2 if "hsdp2" in parts else 1,
                    "cpu_offload": "offload" in parts, "model_state_bytes_measured": 1e6, "peak_rss_bytes": 3e8})
    return pd.DataFrame(out)


@pytest.mark.unit
def test_the_like_holds_the_model_and_every_lever_but_the_axes_compared():
    runs = _frame([("fp32-z0-w1", "base", 64, 100.0), ("fp32-z0-w1-r2", "base", 64, 110.0), ("fp32-z0-w2", "base", 64, 180.0),
                   ("fp32-z0-w1-mine", "mine", 32, 400.0), ("fp32-z0-w2-mine", "mine", 32, 700.0),
                   ("fp32-z0-w1-ac", "base", 64, 70.0), ("fp32-z0-w2-ac", "base", 64, 120.0),
                   ("fp32-z0-w1-mb2", "base", 64, 90.0), ("fp32-z0-w2-mb2", "base", 64, 160.0),
                   ("fp32-z3-w1", "base", 64, 95.0), ("fp32-z3-w2-hsdp2", "base", 64, 150.0), ("fp32-z3-w2-offload", "base", 64, 60.0)])
    key = like_key(runs, OVER_WORLD_SIZE).set_axis(runs["run_id"])
    assert key["fp32-z0-w1"] == key["fp32-z0-w1-r2"] == key["fp32-z0-w2"], "repeats and world sizes of one point: one like"
    assert len({key["fp32-z0-w1"], key["fp32-z0-w1-mine"], key["fp32-z0-w1-ac"], key["fp32-z0-w1-mb2"]}) == 4
    # micro_batch by the value asked for (-mb2), not the size resolved per world size (8 at w1, 4 at w2 when not asked)
    assert key["fp32-z0-w1-mb2"] == key["fp32-z0-w2-mb2"]
    # hybrid sharding exists at world sizes its replicas divide: its single-rank baseline is stage 3's
    assert key["fp32-z3-w2-hsdp2"] == key["fp32-z3-w1"] != key["fp32-z3-w2-offload"]
    eff = scaling_efficiency(runs).set_axis(runs["run_id"])
    assert eff["fp32-z0-w2"] == pytest.approx(180 / (2 * 105)) and eff["fp32-z0-w2-mine"] == pytest.approx(700 / 800)
    assert eff["fp32-z0-w2-ac"] == pytest.approx(120 / 140) and eff["fp32-z0-w2-mb2"] == pytest.approx(160 / 180)
    assert eff["fp32-z3-w2-hsdp2"] == pytest.approx(150 / 190) and np.isnan(eff["fp32-z3-w2-offload"])
    assert eff[["fp32-z0-w1-mine", "fp32-z0-w1-ac", "fp32-z3-w1"]].tolist() == [1.0, 1.0, 1.0]
    # across stages, offload and replicas go with the stage: stage 3's runs compare with stage 0's
    stage = like_key(runs, OVER_STAGE).set_axis(runs["run_id"])
    assert stage["fp32-z3-w2-offload"] == stage["fp32-z3-w2-hsdp2"] == stage["fp32-z0-w2"] != stage["fp32-z0-w2-mine"]
    # the best configuration holds the model and world size only; a noise pool the model only
    best = like_key(runs, OVER_CONFIGURATION).set_axis(runs["run_id"])
    assert best["fp32-z0-w2-ac"] == best["fp32-z3-w2-offload"] != best["fp32-z0-w2-mine"] and best["fp32-z0-w1"] != best["fp32-z0-w2"]
    pool = like_key(runs, OVER_POINTS).set_axis(runs["run_id"])
    assert pool.nunique() == 2 and pool["fp32-z0-w1"] == pool["fp32-z3-w2-offload"] != pool["fp32-z0-w1-mine"]
    with pytest.raises(ValueError, match="not an axis a comparison runs over: seq_len"):
        like_key(runs, ("seq_len",))


@pytest.mark.unit
def test_one_model_name_with_two_shapes_is_two_models():
    """Results copied together from two configs whose base model differs: two models, named apart."""
    runs = _frame([("fp32-z0-w1", "base", 64, 100.0), ("fp32-z0-w2", "base", 64, 180.0),
                   ("fp32-z0-w1", "base", 128, 40.0), ("fp32-z0-w2", "base", 128, 60.0)])
    assert model_labels(runs).tolist() == ["base (d_model 64)"] * 2 + ["base (d_model 128)"] * 2
    assert scaling_efficiency(runs).tolist() == pytest.approx([1, 0.9, 1, 0.75])
    best = best_configurations(runs)
    assert best[["model", "world_size", "tokens_per_s"]].values.tolist() == [
        ["base (d_model 128)", 1, 40.0], ["base (d_model 128)", 2, 60.0], ["base (d_model 64)", 1, 100.0], ["base (d_model 64)", 2, 180.0]]
    # a table written before families (no model_family column) names the same model as one that says gpt2
    assert like_key(runs).tolist() == like_key(runs.assign(model_family="gpt2")).tolist()
    # a row without a shape (a missing run: its identity only) takes its model's, where the name holds one
    lone = _frame([("fp32-z0-w1-mine", "mine", 32, 400.0), ("fp32-z0-w2-mine", "mine", None, 0.0)])
    assert like_key(lone, OVER_WORLD_SIZE).nunique() == 1


@pytest.mark.unit
def test_noise_of_one_model_never_moves_another_models_verdicts():
    """Base's repeats agree to 1%, mine's spread 25%: each point is ranked against its own model's noise."""
    runs = _frame([("fp32-z0-w1", "base", 64, 1000.0), ("fp32-z0-w1-r2", "base", 64, 1010.0), ("fp32-z0-w1-r3", "base", 64, 1005.0),
                   ("bf16-z0-w1", "base", 64, 1080.0),
                   ("fp32-z0-w1-mine", "mine", 32, 400.0), ("fp32-z0-w1-mine-r2", "mine", 32, 500.0),
                   ("fp32-z0-w1-mine-r3", "mine", 32, 450.0), ("bf16-z0-w1-mine", "mine", 32, 480.0)])
    noise = model_noise(runs)
    sigma = {m: math.sqrt(sum((math.log(v) - np.mean(np.log(g))) ** 2 for v in g) / 2)
             for m, g in (("base", [1000, 1010, 1005]), ("mine", [400, 500, 450]))}
    assert noise.of("base").sigma == pytest.approx(sigma["base"]) and noise.of("mine").sigma == pytest.approx(sigma["mine"])
    best = best_configurations(runs).set_index("model")
    # base: bf16 7% ahead of a median of 3 is beyond base's noise; mine: bf16 7% ahead is within mine's
    assert best.loc["base", "run_id"] == "bf16-z0-w1" and best.loc["base", "within_noise"] == ""
    assert best.loc["mine", "run_id"] == "bf16-z0-w1-mine" and best.loc["mine", "within_noise"] == "fp32-z0-w1-mine"
    # pooled over both models (what this replaced), base's bf16 would have been "within noise" too
    assert sweep_noise(runs).within(1080, 1005, 1, 3)


@pytest.mark.unit
def test_warnings_compare_runs_of_one_model_and_levers():
    """fp32 parity holds each model, and each lever setting, to itself: two models' losses differ, and a
    LoRA run learns otherwise; a stage that breaks parity in one model is named with it. The CPU notice
    gives each model's bf16/fp32 speed apart."""
    from scalelab.report.checks import cpu_notice
    from scalelab.report.report import fp32_parity_warnings

    runs = _frame([("fp32-z0-w1", "base", 64, 100.0), ("fp32-z3-w2", "base", 64, 150.0), ("bf16-z0-w1", "base", 64, 50.0),
                   ("fp32-z0-w1-mine", "mine", 32, 400.0), ("fp32-z3-w2-mine", "mine", 32, 700.0), ("bf16-z0-w1-mine", "mine", 32, 300.0),
                   ("fp32-z0-w1-lora4", "base", 64, 120.0)])
    runs["lora_rank"] = [None] * 6 + [4]
    runs["device_type"], runs["device_name"], runs["threads_per_rank"] = "cpu", "a CPU", 1
    loss = {"base": 5.0, "mine": 4.0}
    steps = pd.DataFrame([{"run_id": r.run_id, "precision": r.precision, "zero_stage": r.zero_stage, "world_size": r.world_size,
                           "model": r.model, "step": step, "loss": loss[r.model] - 0.1 * step - (0.5 if r.lora_rank == 4 else 0)}
                          for r in runs.itertuples() for step in range(3)])
    assert fp32_parity_warnings(runs, steps) == [], "another model, a LoRA run: not the same trajectory, and no warning"
    broken = steps.assign(loss=np.where(steps["run_id"] == "fp32-z3-w2-mine", steps["loss"] * 1.01, steps["loss"]))
    [warning] = fp32_parity_warnings(runs, broken)
    assert warning.startswith("fp32 parity broken in model mine: losses of fp32 runs differ by up to 1.00e-02"), warning
    notice = cpu_notice(runs)
    assert "(bf16 at 0.50× fp32's tokens/s here in model base, and bf16 at 0.75× in model mine)" in notice, notice
