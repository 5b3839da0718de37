"""Every comparison within its like (issue #41): a sweep of several models compares each model with
itself. A real sweep of the default GPT-2-shaped model and a llama-tiny one (fp32 and bf16, ZeRO
stages 0 and 3, world sizes 1 and 2; the base model's baseline repeated) through Snakemake, and the
grouping helper (scalelab.results.like) on synthetic frames."""
import re
import shutil

import pandas as pd
import pytest

from scalelab.report.compare import build_compare, compare_runs, noise_limits
from scalelab.report.report import load_tables
from scalelab.report.tables import best_configurations, loss_deviation_vs_stage0, scaling_efficiency
from scalelab.results.like import (
    model_labels,
    models,
)
from scalelab.results.noise import ModelNoise, margin_between, model_noise, sweep_noise
from support import snakemake, tiny_config, write_workdir

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
    for r in best.itertuples():  # the end-of-sweep text, a line per model and world size: its point, or the points
        # tied with it within the run-to-run noise (which a busy machine widens), first by median
        line = f"model {r.model}, world size {r.world_size}: "
        assert (f"{line}{r.run_id} " in sweep["out"]
                or re.search(re.escape(line) + r"tied within run-to-run noise: [^\n]*; first by median: " + re.escape(r.run_id) + " ",
                             sweep["out"])), sweep["out"][-3000:]


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
