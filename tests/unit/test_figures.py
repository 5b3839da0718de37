"""Each registered figure draws what the tables say: the data of the matplotlib figure its drawing
function returns (Line2D, bar and QuadMesh data) read back and held against the table,
computed here again the plain way (not through the functions the figure used)."""
import math

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import QuadMesh
from matplotlib.patches import Rectangle

from devtools.fixtures import synthetic_results
from scalelab.report import plot_style, plots
from scalelab.report.figures import FIGURES, Tables
from scalelab.report.levers import baseline, lever_table
from scalelab.report.report import load_tables
from scalelab.report.tables import mfu_grid

MiB = 2 ** 20


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """192 runs: fp32 baselines with each lever, then the whole precision x stage x world-size grid."""
    path = tmp_path_factory.mktemp("figures")
    synthetic_results(path, n_runs=192, n_steps=20)
    return load_tables(path)


def draw(name, runs, steps, results_dir=None, with_note=False):
    """The figure as draw_figures makes it, main figures from the baseline rows, less hybrid sharding's
    (draw_figures adds them as a strategy of their own: their own test below); results_dir: the results folder
    whose run folders it may read."""
    plot_style.use_theme()
    figure = next(f for f in FIGURES if f.name == name)
    levers = lever_table(runs)
    base = baseline(runs)
    tables = Tables(base, steps[steps["run_id"].isin(base["run_id"])], levers, results_dir) if figure.kind == "main" \
        else Tables(runs, steps, levers, results_dir)
    out = figure.draw(tables)
    fig, note = out if isinstance(out, tuple) else (out, None)
    return (fig, tables, note) if with_note else (fig, tables)


def panel(fig, title):
    return next(ax for ax in fig.axes if ax.get_title() == title)


def lines(ax, label_part):
    return [ln for ln in ax.get_lines() if label_part in ln.get_label()]


def marks(ax, label):
    """(x, y) of the points of that label drawn without a line (plot_style.marks), shown in the legend or not ('_label')."""
    line = next(ln for ln in ax.get_lines() if ln.get_linestyle() == "None" and ln.get_label() in (label, "_" + label))
    return np.asarray(line.get_xydata())


def points(xy):
    """(world size, y) of dodged points: x back on the world sizes (log2, rounded)."""
    return sorted((2 ** round(math.log2(x)), y) for x, y in xy)


def assert_world_size_axis(ax, sizes):
    """A log2 axis ticked at the world sizes, labelled 1, 2, 4 (on the bottom row where panels share it)."""
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert [int(t) for t in ax.get_xticks()] == sorted(sizes)
    if ax.get_subplotspec().is_last_row():
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(s) for s in sorted(sizes)]
        assert ax.xaxis.get_label().get_text().startswith("world size")


def check_memory_model_state(runs, steps):
    fig, t = draw("memory_model_state", runs, steps)
    ok = t.runs[t.runs["status"] == "ok"]
    for stage, at_stage in ok.groupby("zero_stage"):
        ax = panel(fig, f"ZeRO stage {stage}")
        assert_world_size_axis(ax, t.runs["world_size"].unique())
        assert "MiB" in fig.axes[0].get_ylabel()
        for precision, g in at_stage.groupby("precision"):
            expected = sorted(zip(g["world_size"], g["model_state_bytes_measured"] / MiB))
            np.testing.assert_allclose(points(marks(ax, precision)), expected)
        # each formula line named in the legend, drawn at the table's values
        (pytorch,) = lines(ax, "PyTorch AMP")
        expected = at_stage.groupby("world_size")["model_state_bytes_predicted"].mean() / MiB
        np.testing.assert_allclose(pytorch.get_xdata(), expected.index)
        np.testing.assert_allclose(pytorch.get_ydata(), expected.to_numpy())
        for label, rows in (("paper, fp32", at_stage["precision"] == "fp32"), ("paper, mixed", at_stage["precision"] != "fp32")):
            (line,) = lines(ax, label)
            expected = at_stage[rows].groupby("world_size")["model_state_bytes_predicted_paper"].mean() / MiB
            np.testing.assert_allclose(line.get_ydata(), expected.to_numpy())
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"fp32", "fp16", "bf16"} <= set(legend) and sum("predicted" in label for label in legend) == 3


def check_memory_peak(runs, steps):
    # CPU results: process peak RSS, precisions apart, on an axis from 0 (no magnified noise)
    fig, t = draw("memory_peak", runs, steps)
    ok = t.runs[t.runs["status"] == "ok"]
    for stage, at_stage in ok.groupby("zero_stage"):
        ax = panel(fig, f"ZeRO stage {stage}")
        assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0 and "RSS" in fig.axes[0].get_ylabel()
        for precision, g in at_stage.groupby("precision"):
            np.testing.assert_allclose(points(marks(ax, precision)), sorted(zip(g["world_size"], g["peak_rss_bytes"] / MiB)))
    # GPU results: max allocated, with each precision's predicted peak as its own named line
    gpu = runs.assign(peak_mem_allocated_bytes=runs["peak_rss_bytes"] // 7 * (1 + runs["zero_stage"]),
                      predicted_peak_bytes=runs["peak_rss_bytes"] / 6.5)
    fig, t = draw("memory_peak", gpu, steps)
    ok = t.runs[t.runs["status"] == "ok"]
    for stage, at_stage in ok.groupby("zero_stage"):
        ax = panel(fig, f"ZeRO stage {stage}")
        for precision, g in at_stage.groupby("precision"):
            np.testing.assert_allclose(points(marks(ax, precision)), sorted(zip(g["world_size"], g["peak_mem_allocated_bytes"] / MiB)))
            (line,) = lines(ax, f"predicted in-step peak, {precision}")
            np.testing.assert_allclose(line.get_ydata(), (g.groupby("world_size")["predicted_peak_bytes"].mean() / MiB).to_numpy())


def check_throughput(runs, steps):
    fig, t = draw("throughput", runs, steps)
    ok = t.runs[t.runs["status"] == "ok"]
    single = ok[ok["world_size"] == 1].groupby(["precision", "zero_stage"])["tokens_per_s"].mean()
    for (precision, stage), g in ok.groupby(["precision", "zero_stage"]):
        mean = g.groupby("world_size")["tokens_per_s"].mean()
        per_device = (g["tokens_per_s"] / g["world_size"]).groupby(g["world_size"]).mean()
        efficiency = (g["tokens_per_s"] / (g["world_size"] * single[(precision, stage)])).groupby(g["world_size"]).mean()
        for title, expected in ((f"{precision}: tokens/s, all ranks", mean), (f"{precision}: tokens/s per device", per_device),
                                (f"{precision}: scaling efficiency (1 = linear)", efficiency)):
            ax = panel(fig, title)
            assert_world_size_axis(ax, t.runs["world_size"].unique())
            (line,) = lines(ax, f"ZeRO stage {stage}")
            np.testing.assert_allclose(line.get_xdata(), expected.index)
            np.testing.assert_allclose(line.get_ydata(), expected.to_numpy())
            if "per device" in title or "efficiency" in title:
                assert ax.get_ylim()[0] == 0


def check_mfu_heatmap(runs, steps):
    # CPU fp16 against an emulated peak: an MFU of 1.38 means nothing and must not set the scale
    runs = runs.copy()
    flagged = runs.index[(runs["run_id"] == "fp16-z1-w2-r2") & (runs["status"] == "ok")]
    assert len(flagged) == 1
    runs.loc[flagged, "mfu"] = 1.38
    # on a CPU, 16-bit precisions are emulated: drawn apart, out of the colour scale (fp32 sets it); on a GPU, not
    for device in ("cpu", "cuda"):
        _check_mfu_heatmap(runs.assign(device_type=device), steps, emulated=device == "cpu")


def _check_mfu_heatmap(runs, steps, emulated):
    fig, t = draw("mfu_heatmap", runs, steps)
    ax = fig.axes[0]
    (mesh,) = [c for c in ax.collections if isinstance(c, QuadMesh)]
    rows = [label.get_text() for label in ax.get_yticklabels()]
    sizes = [int(label.get_text()) for label in ax.get_xticklabels()]
    drawn = np.ma.masked_invalid(mesh.get_array()).reshape(len(rows), len(sizes))
    ok = t.runs[t.runs["status"] == "ok"]
    texts = {(round(tx.get_position()[1] - 0.5), round(tx.get_position()[0] - 0.5)): tx.get_text() for tx in ax.texts}
    for i, row in enumerate(rows):
        precision, stage = row.split(" z")
        for j, ws in enumerate(sizes):
            cell = ok[(ok["precision"] == precision) & (ok["zero_stage"] == int(stage)) & (ok["world_size"] == ws)]
            if (precision, int(stage), ws) == ("fp16", 1, 2):
                assert drawn.mask[i, j] and texts[i, j] == "1.38‡", "flagged: out of the colour scale, marked"
                assert any(isinstance(p, Rectangle) and p.get_hatch() and p.get_xy() == (j, i) for p in ax.patches)
            elif len(cell) and emulated and precision != "fp32":
                assert drawn.mask[i, j] and texts[i, j] == f"{cell['mfu'].median():.3f}†", "emulated: apart, marked"
                assert any(isinstance(p, Rectangle) and p.get_hatch() == "..." and p.get_xy() == (j, i) for p in ax.patches)
            elif len(cell):
                assert drawn[i, j] == pytest.approx(cell["mfu"].mean())
            else:
                everything = t.runs[(t.runs["precision"] == precision) & (t.runs["zero_stage"] == int(stage)) & (t.runs["world_size"] == ws)]
                assert drawn.mask[i, j] and texts[i, j] == (everything["status"].iloc[0] if len(everything) else "not run")
    meaningful = ok[(ok["mfu"] <= 1) & ((ok["precision"] == "fp32") | (not emulated))]
    assert mesh.norm.vmax == pytest.approx(meaningful.groupby(["precision", "zero_stage", "world_size"])["mfu"].mean().max())
    assert mesh.norm.vmax < 1
    notes = " ".join(" ".join(tx.get_text().split()) for a in fig.axes for tx in a.texts)  # the note below, unwrapped
    assert ("† dotted grey: 16-bit precisions on a CPU" in notes) == emulated


def _brute_force_dloss_vs_stage0(steps):
    """{(precision, world size, stage): largest |loss - mean stage-0 loss| over steps}, by loops."""
    out = {}
    for (precision, ws), g in steps.groupby(["precision", "world_size"], observed=True):
        ref = g[g["zero_stage"] == 0].groupby("step")["loss"].mean()
        for stage, h in g.groupby("zero_stage"):
            out[(precision, ws, stage)] = (h.set_index("step")["loss"] - ref.reindex(h["step"]).to_numpy()).abs().max()
    return out


def check_loss_curves(runs, steps):
    # Deviations that differ by world size: the figure must show the largest, not the mean.
    steps = steps.copy()
    scale = np.where(steps["zero_stage"] == 0, 0.0, 1e-4 * steps["world_size"].to_numpy() * (1 + steps["zero_stage"].to_numpy()))
    ref = steps[steps["zero_stage"] == 0].groupby(["precision", "world_size", "step"], observed=True)["loss"].mean()
    steps["loss"] = ref.reindex(pd.MultiIndex.from_frame(steps[["precision", "world_size", "step"]])).to_numpy() + scale
    fig, t = draw("loss_curves", runs, steps)
    ok_steps = t.steps[t.steps["run_id"].isin(t.runs.loc[t.runs["status"] == "ok", "run_id"])]
    right = panel(fig, "largest |Δloss| vs stage 0 (over world sizes)")
    per_size = _brute_force_dloss_vs_stage0(ok_steps)
    stages = sorted({s for _, _, s in per_size if s != 0})
    assert [t.get_text() for t in right.get_xticklabels()] == [f"stage {s}" for s in stages]
    assert {c.get_label() for c in right.containers} == {"fp32", "fp16", "bf16"}
    for container in right.containers:
        precision = container.get_label()
        heights = [bar.get_height() for bar in container]
        over_sizes = [[v for (p, _, s2), v in per_size.items() if p == precision and s2 == s] for s in stages]
        np.testing.assert_allclose(heights, [max(v) for v in over_sizes], rtol=1e-9)  # the largest...
        assert all(h > np.mean(v) * 1.5 for h, v in zip(heights, over_sizes))  # ...not the mean over world sizes
    assert right.get_yscale() == "symlog" and "nats/token" in right.get_ylabel()
    # Middle: each precision's largest |loss - loss of its fp32 twin| per step (log scale).
    mid = panel(fig, "|loss − loss of the fp32 twin|")
    assert mid.get_yscale() == "symlog" and mid.get_ylim()[0] == 0, "an exact 0 stays on the axis"
    twin_key = ["zero_stage", "world_size", "micro_batch", "activation_checkpointing", "cpu_offload", "bucket_mb", "step"]
    plain = ok_steps.astype({"precision": str, "run_id": str})
    fp32 = plain[plain["precision"] == "fp32"].groupby(twin_key, dropna=False)["loss"].mean()
    for precision in ("fp16", "bf16"):
        mine = plain[plain["precision"] == precision]
        d = (mine["loss"].to_numpy() - fp32.reindex(pd.MultiIndex.from_frame(mine[twin_key])).to_numpy())
        expected = pd.Series(np.abs(d), index=mine["step"].to_numpy()).groupby(level=0).max()
        (line,) = lines(mid, precision)
        np.testing.assert_allclose(line.get_xdata(), expected.index)
        np.testing.assert_allclose(line.get_ydata(), expected.to_numpy())
    # Left: the fp32 reference, mean over its runs.
    (mean,) = lines(panel(fig, "fp32 loss (the reference)"), "fp32, mean")
    np.testing.assert_allclose(mean.get_ydata(), plain[plain["precision"] == "fp32"].groupby("step")["loss"].mean().to_numpy())


def check_loss_scale(runs, steps):
    fig, t = draw("loss_scale", runs, steps)
    top, bottom = fig.axes
    fp16 = t.steps[t.steps["precision"] == "fp16"]
    (median,) = lines(top, "median")
    np.testing.assert_allclose(median.get_ydata(), fp16.groupby("step")["loss_scale"].median().to_numpy())
    (stairs,) = [p for p in bottom.patches if p.get_label() == "skipped"]
    np.testing.assert_allclose(stairs.get_data().values, fp16.groupby("step")["skipped"].sum().to_numpy())
    assert bottom.get_ylim()[0] == 0 and bottom.get_ylim()[1] >= 1, "a count of runs: from 0, never -0.05 to 0.05"
    assert all(float(t).is_integer() for t in bottom.get_yticks() if 0 <= t <= bottom.get_ylim()[1])
    assert top.get_yscale() == "log"


def check_communication(runs, steps):
    fig, t = draw("communication", runs, steps)
    ax = fig.axes[0]
    ok = t.runs[t.runs["status"] == "ok"]
    cols = ["comm_bytes_per_step_measured", "comm_bytes_per_step_predicted"]
    mean = ok.groupby(["zero_stage", "world_size", "precision"], observed=True)[cols].mean() / MiB
    for precision in ok["precision"].unique():  # a bar per precision in each stage and world size
        (bars,) = [c for c in ax.containers if c.get_label() == f"{precision}, measured"]
        mine = mean.xs(precision, level="precision")
        np.testing.assert_allclose([b.get_height() for b in bars], mine["comm_bytes_per_step_measured"].to_numpy())
    heights = {(b.get_x() + b.get_width() / 2): b.get_height() for c in ax.containers for b in c}
    np.testing.assert_allclose(sorted(marks(ax, "predicted (PyTorch)")[:, 1]), sorted(mean["comm_bytes_per_step_predicted"]))
    assert len(heights) == len(mean)
    groups = mean.reset_index()[["zero_stage", "world_size"]].drop_duplicates()
    assert [tx.get_text() for tx in ax.get_xticklabels()] == [f"z{z}\nw{w}" for z, w in groups.itertuples(index=False)]
    assert "MiB" in ax.get_ylabel()
    # fp16 and bf16 gather 16-bit parameters at stages 2 and 3 (more than one rank): fewer bytes than fp32 there
    at = mean["comm_bytes_per_step_measured"].unstack("precision")
    sharded = at[(at.index.get_level_values("zero_stage") >= 2) & (at.index.get_level_values("world_size") > 1)]
    for precision in {"fp16", "bf16"} & set(sharded.columns) if "fp32" in sharded else ():
        both = sharded[[precision, "fp32"]].dropna()
        assert (both[precision] < both["fp32"]).all(), both


def check_predicted_vs_measured(runs, steps):
    # the fixture has no bench table (no prediction): the figure says so
    fig, _ = draw("predicted_vs_measured", runs, steps)
    assert "no step-time prediction" in fig.axes[0].texts[0].get_text()
    # every ok run given a prediction: each drawn at (measured, predicted) ms, its band a vertical bar
    ok = runs["status"] == "ok"
    measured = 0.01 + 0.001 * np.arange(len(runs))
    runs = runs.assign(step_time_s_mean=np.where(ok, measured, np.nan), predicted_step_time_s=np.where(ok, measured * 1.1, np.nan),
                       predicted_step_time_s_low=measured * 1.05, predicted_step_time_s_high=measured * 1.2,
                       prediction_note=np.where(runs["world_size"] == 1, "in-sample: ...", "compute from world size 1"))
    fig, t = draw("predicted_vs_measured", runs, steps)
    ax = fig.axes[0]
    drawn = t.runs[t.runs["status"] == "ok"]
    points = sorted(tuple(xy) for ln in ax.get_lines() if ln.get_linestyle() == "None" for xy in ln.get_xydata())
    np.testing.assert_allclose(points, sorted(zip(drawn["step_time_s_mean"] * 1e3, drawn["predicted_step_time_s"] * 1e3)))
    bars = sorted(tuple(ln.get_ydata()) for ln in ax.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) == 2
                  and ln.get_xdata()[0] == ln.get_xdata()[1])
    np.testing.assert_allclose(bars, sorted(zip(drawn["predicted_step_time_s_low"] * 1e3, drawn["predicted_step_time_s_high"] * 1e3)))
    assert ax.get_xscale() == ax.get_yscale() == "log" and "measured" in ax.get_xlabel()


def _pairs(runs, lever):
    table = lever_table(runs)
    table = table[(table["lever"] == lever) & (table["status"] == "ok")]
    return table[table["reason"].isna()] if "reason" in table else table


def check_lever_activation_checkpointing(runs, steps):
    fig, t = draw("lever_activation_checkpointing", runs, steps)
    pairs = _pairs(runs, "activation_checkpointing")
    left = panel(fig, "activations kept for backward")
    right = panel(fig, "recompute cost")
    off, on = (next(c for c in left.containers if c.get_label() == label) for label in ("off, measured", "on, measured"))
    np.testing.assert_allclose([b.get_height() for b in off], pairs["baseline_activation_mib_measured"])
    np.testing.assert_allclose([b.get_height() for b in on], pairs["activation_mib_measured"])
    (ratio,) = right.containers
    np.testing.assert_allclose([b.get_height() for b in ratio], pairs["step_time_ratio"])
    np.testing.assert_allclose(marks(right, "predicted")[:, 1], pairs["step_time_ratio_predicted"])
    assert [tx.get_text() for tx in right.get_xticklabels()] == list(pairs["baseline_run_id"])


def check_lever_micro_batch(runs, steps):
    fig, t = draw("lever_micro_batch", runs, steps)
    loss_ax, tput_ax, _ = fig.axes
    ok = runs[(runs["status"] == "ok") & runs["cpu_offload"].eq(False) & ~runs["activation_checkpointing"]
              & (runs["bucket_mb"].isna() | (runs["bucket_mb"] == 25.0)) & ~runs["compile"] & runs["lora_rank"].isna()
              & (runs["tensor_parallel"].isna() | (runs["tensor_parallel"] == 1))
              & (runs["pipeline_parallel"].isna() | (runs["pipeline_parallel"] == 1))]
    label = "z" + ok["zero_stage"].astype(str) + " w" + ok["world_size"].astype(str) + " " + ok["precision"]
    varied = ok[ok.groupby(label)["micro_batch"].transform("nunique") > 1]
    fp32 = steps[steps["run_id"].isin(varied.loc[varied["precision"] == "fp32", "run_id"])]
    for mb, g in fp32.groupby("micro_batch"):
        (line,) = lines(loss_ax, f"micro-batch {mb}")
        np.testing.assert_allclose(line.get_ydata(), g.groupby("step")["loss"].mean().to_numpy())
    for name, g in varied.groupby(label[varied.index]):
        (line,) = lines(tput_ax, name)
        expected = g.groupby("micro_batch")["tokens_per_s"].mean()
        np.testing.assert_allclose(line.get_xdata(), expected.index)
        np.testing.assert_allclose(line.get_ydata(), expected.to_numpy())
    assert len(tput_ax.get_lines()) == label[varied.index].nunique()


def check_lever_cpu_offload(runs, steps):
    # GPU-like results with offload variants of the stage-3 runs: less device memory, slower steps
    base = runs[(runs["zero_stage"] == 3) & runs["run_id"].str.fullmatch(r"\w+-z3-w\d+")]  # twins sort before replicas
    variants = base.assign(cpu_offload=True, run_id=base["run_id"] + "-offload", peak_mem_allocated_bytes=base["peak_rss_bytes"] // 10,
                           step_time_s_median=base["step_time_s_median"] * 1.7)
    runs = runs[~runs["cpu_offload"]]  # the fixture's own offload runs slow down by another factor
    gpu = pd.concat([runs.assign(peak_mem_allocated_bytes=runs["peak_rss_bytes"] // 3), variants], ignore_index=True)
    fig, t = draw("lever_cpu_offload", gpu, steps)
    pairs = _pairs(gpu, "cpu_offload")
    assert len(pairs) > 3
    left, right = panel(fig, "memory"), panel(fig, "cost")
    on_device, offloaded = (next(c for c in left.containers if c.get_label() == label) for label in ("on device", "offloaded"))
    np.testing.assert_allclose([b.get_height() for b in on_device], pairs["baseline_peak_mib"])
    np.testing.assert_allclose([b.get_height() for b in offloaded], pairs["peak_mib"])
    np.testing.assert_allclose([b.get_height() for b in right.containers[0]], pairs["step_time_ratio"])
    np.testing.assert_allclose(pairs["step_time_ratio"], 1.7)


def check_lever_bucket_mb(runs, steps):
    fig, t = draw("lever_bucket_mb", runs, steps)
    left, right = fig.axes
    ddp = runs[(runs["status"] == "ok") & runs["bucket_mb"].notna() & ~runs["activation_checkpointing"] & ~runs["cpu_offload"]
               & (runs["accumulation_steps"] == 1) & ~runs["compile"] & runs["lora_rank"].isna()
               # one data-parallel rank at stage 0 (world size 1, or all ranks tensor-parallel): no DDP, no buckets
               & ((runs["zero_stage"] != 0) | (runs["world_size"] > runs["tensor_parallel"].fillna(1)))]
    label = "z" + ddp["zero_stage"].astype(str) + " w" + ddp["world_size"].astype(str) + " " + ddp["precision"]
    varied = ddp[ddp.groupby(label)["bucket_mb"].transform("nunique") > 1]
    for name, g in varied.groupby(label[varied.index]):
        got = sorted(map(tuple, marks(left, name)))
        assert got == sorted(zip(g["bucket_mb"], g["comm_all_reduce_calls_per_step"]))
    (pred,) = lines(left, "predicted")
    np.testing.assert_allclose(pred.get_ydata(), varied.groupby("bucket_mb")["ddp_buckets_predicted"].mean().to_numpy())
    assert [float(x) for x in left.get_xticks()] == sorted(varied["bucket_mb"].unique())


def check_memory_vs_psi(runs, steps):
    fig, t = draw("memory_vs_psi", runs, steps)
    out = next(f for f in FIGURES if f.name == "memory_vs_psi").draw(t)  # the figure's note too
    note = out[1] if isinstance(out, tuple) else ""
    ok = t.runs[t.runs["status"] == "ok"]
    one_model = ok["n_params"].nunique() == 1
    # the fixture's baseline runs share one shape: their dots are set apart per stage, and the note says so
    assert one_model == ("one model shape" in note), note
    for ax in fig.axes:
        n = int(ax.get_title().removeprefix("world size "))
        sub = ok[ok["world_size"] == n]
        measured = [ln for ln in ax.get_lines() if ln.get_linestyle() == "None" and ln.get_marker() == "o"]
        stages = sorted(sub["zero_stage"].unique())
        dodge = {s: plot_style.dodge(len(stages), i) if one_model else 1.0 for i, s in enumerate(stages)}
        drawn = np.array(sorted(tuple(xy) for ln in measured for xy in ln.get_xydata()))
        expected = sorted(zip(sub["n_params"].astype(float) * sub["zero_stage"].map(dodge), sub["model_state_bytes_measured"] / MiB))
        np.testing.assert_allclose(drawn, expected)
        if one_model and len(stages) > 1:  # no two stages' dots at one place
            assert len({round(x, 6) for x, _ in drawn}) == len(stages)
        assert ax.get_ylabel() in ("", "model state per rank (MiB)"), "MiB, as every other memory figure"
        # PyTorch's at-rest lines: 16 B/param at stage 0, 8 + 8/N at stage 1, 16/N at stages 2 and 3, in MiB
        solid = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
        slopes = [ln.get_ydata()[0] / ln.get_xdata()[0] * MiB for ln in solid]
        np.testing.assert_allclose(slopes, [16, 8 + 8 / n, 16 / n, 16 / n])
        dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        assert min(ln.get_zorder() for ln in dashed) > max(ln.get_zorder() for ln in solid), "the paper's dashes on top"
    # only the stages swept: a sweep of stages 0 and 2 draws their lines, not 1's and 3's
    fig, _ = draw("memory_vs_psi", runs[runs["zero_stage"].isin([0, 2])], steps)
    for ax in fig.axes:
        assert sorted(ln.get_label() for ln in ax.get_lines() if ln.get_label().startswith("stage")) == ["stage 0", "stage 2"]


def check_lever_compile(runs, steps):
    # compiled twins of the fp32 baseline runs (one replica each, so every twin is its source):
    # 20% faster steps, 12 s of compilation each
    runs = runs[~runs["run_id"].str.contains(r"-r\d+$") & ~runs["compile"]]  # not the fixture's own compiled runs
    base = baseline(runs)
    base = base[(base["precision"] == "fp32") & (base["status"] == "ok")]
    variants = base.assign(compile=True, run_id=base["run_id"] + "-compiled", compile_time_s=12.0,
                           step_time_s_median=base["step_time_s_median"] * 0.8)
    both = pd.concat([runs, variants], ignore_index=True)
    fig, t = draw("lever_compile", both, steps)
    left, right = panel(fig, "step time (compilation excluded)"), panel(fig, "compilation (before the first step)")
    eager, compiled = (next(c for c in left.containers if c.get_label() == label) for label in ("eager", "compiled"))
    order = [label.get_text() for label in left.get_xticklabels()]
    expected = base.set_index("run_id").loc[order, "step_time_s_median"] * 1000
    np.testing.assert_allclose([b.get_height() for b in eager], expected)
    np.testing.assert_allclose([b.get_height() for b in compiled], expected * 0.8)
    np.testing.assert_allclose([b.get_height() for b in right.containers[0]], 12.0)


def check_lever_tensor_parallel(runs, steps):
    """Each split run beside its twin without tensor parallelism: memory per rank stacked (model state, then
    activations) and bytes per step stacked (the strategy's, then the tensor-parallel all-reduces)."""
    fig, t = draw("lever_tensor_parallel", runs, steps)
    pairs = _pairs(runs, "tensor_parallel")
    assert len(pairs) > 0
    left, right = panel(fig, "memory per rank"), panel(fig, "communication")
    memory = {c.get_label(): c for c in left.containers}
    np.testing.assert_allclose([b.get_height() for b in memory["without: model state"]], pairs["baseline_model_state_mib"])
    np.testing.assert_allclose([b.get_height() for b in memory["tensor parallel: model state"]], pairs["model_state_mib"])
    split_acts = memory["tensor parallel: activations"]
    np.testing.assert_allclose([b.get_height() for b in split_acts], pairs["activation_mib_measured"])
    np.testing.assert_allclose([b.get_y() for b in split_acts], pairs["model_state_mib"])  # stacked on the model state
    comm = {c.get_label(): c for c in right.containers}
    np.testing.assert_allclose([b.get_height() for b in comm["without: strategy"]], pairs["baseline_strategy_mb"])
    np.testing.assert_allclose([b.get_height() for b in comm["tensor parallel: strategy"]], pairs["strategy_mb"])
    np.testing.assert_allclose([b.get_height() for b in comm["tensor parallel: all-reduces"]],
                               pairs["tensor_parallel_mb"].fillna(0))
    assert [tx.get_text() for tx in left.get_xticklabels()] == list(pairs["baseline_run_id"])


def check_lever_sequence_parallel(runs, steps):
    """Each sequence-parallel run beside its twin with tensor parallelism alone (the same degree): activations per
    rank and tensor parallelism's bytes per step, measured bars."""
    fig, t = draw("lever_sequence_parallel", runs, steps)
    pairs = _pairs(runs, "sequence_parallel")
    assert len(pairs) > 0
    twins = runs.set_index("run_id").loc[pairs["baseline_run_id"]]
    assert (twins["tensor_parallel"] == 2).all() and not twins["sequence_parallel"].any()  # its twin: TP alone
    left, right = panel(fig, "activations kept for backward, per rank"), panel(fig, "tensor-parallel communication")
    acts = {c.get_label(): c for c in left.containers}
    np.testing.assert_allclose([b.get_height() for b in acts["TP alone, measured"]], pairs["baseline_activation_mib_measured"])
    np.testing.assert_allclose([b.get_height() for b in acts["TP + SP, measured"]], pairs["activation_mib_measured"])
    comm = {c.get_label(): c for c in right.containers}
    np.testing.assert_allclose([b.get_height() for b in comm["TP + SP: all-gathers, reduce-scatters"]],
                               pairs["tensor_parallel_mb"].fillna(0))
    assert [tx.get_text() for tx in left.get_xticklabels()] == list(pairs["baseline_run_id"])


def _pipelines(runs):
    """The fixture's pipeline runs (P 2 under 1F1B and GPipe, 4 micro-batches each) and more of them: each again at 2
    and 8 micro-batches, an interleaved 1F1B and a P 4 series, each measuring a bubble 1.4 times the formula's
    (computed here the plain way), and one pipeline run that ran out of memory."""
    pipe = runs[(runs["pipeline_parallel"] > 1) & (runs["status"] == "ok")].astype({"run_id": str, "run_path": str})
    assert len(pipe) >= 2 and set(pipe["pipeline_schedule"]) == {"1f1b", "gpipe"}
    more = []
    for m, schedule, pp in ((2, None, 2), (8, None, 2), (4, "interleaved_1f1b", 2), (8, "interleaved_1f1b", 2), (8, "1f1b", 4)):
        copy = pipe.assign(pipeline_microbatches=m, pipeline_parallel=pp,
                           pipeline_schedule=schedule or pipe["pipeline_schedule"],
                           run_id=pipe["run_id"] + f"-m{m}-{schedule or 'same'}-p{pp}")
        v = np.where(copy["pipeline_schedule"] == "interleaved_1f1b", 2, 1)
        formula = (pp - 1) / (v * m + pp - 1)
        more.append(copy.assign(run_path=copy["run_id"], bubble_fraction_predicted=formula, bubble_fraction_measured=1.4 * formula,
                                bubble_fraction_measured_per_stage=[[1.4 * f + 0.01 * k for k in range(pp)] for f in formula]))
    failed = pipe.head(1).assign(run_id="pp-oom", run_path="pp-oom", status="oom", bubble_fraction_measured=np.nan)
    return pd.concat([runs.astype({"run_id": str, "run_path": str}), *more, failed], ignore_index=True)


def check_lever_pipeline_bubble(runs, steps):
    """Each ok pipeline run's measured bubble at its micro-batches (a series per schedule and degree, side by side around
    m), and the formula's curve per degree and chunks per rank; the note gives the ratio, and on a CPU says what the
    formula leaves out."""
    runs = _pipelines(runs)
    fig, t, note = draw("lever_pipeline_bubble", runs, steps, with_note=True)
    ax = fig.axes[0]
    ok = runs[(runs["pipeline_parallel"] > 1) & (runs["status"] == "ok")]
    assert len(ok) == len(t.runs[(t.runs["pipeline_parallel"] > 1) & (t.runs["status"] == "ok")]), "drawn from every run"
    for (schedule, pp), g in ok.groupby(["pipeline_schedule", "pipeline_parallel"]):
        drawn = np.array(sorted(map(tuple, marks(ax, f"measured: {schedule}, P {pp}"))))
        expected = np.array(sorted(zip(g["pipeline_microbatches"].astype(float), g["bubble_fraction_measured"])))
        np.testing.assert_allclose(drawn[:, 1], expected[:, 1])
        dodge = drawn[:, 0] / expected[:, 0]  # beside its m, by one factor per series
        np.testing.assert_allclose(dodge, dodge[0])
        assert 0.8 < dodge[0] < 1.25
    curves = {ln.get_label(): ln for ln in ax.get_lines() if ln.get_label().startswith("formula")}
    v_of = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2}
    assert set(curves) == {"formula: P 2, V 1 (gpipe, 1f1b)", "formula: P 2, V 2 (interleaved_1f1b)", "formula: P 4, V 1 (1f1b)"}
    for label, line in curves.items():
        pp, v = int(label.split("P ")[1].split(",")[0]), int(label.split("V ")[1].split(" ")[0])
        x = np.asarray(line.get_xdata(), dtype=float)
        assert x[0] == pp, "from the fewest micro-batches that fill the pipeline"
        np.testing.assert_allclose(line.get_ydata(), (pp - 1) / (v * x + pp - 1))
        mine = ok[(ok["pipeline_parallel"] == pp) & (ok["pipeline_schedule"].map(v_of) == v)]
        # each run's predicted column lies on its curve
        np.testing.assert_allclose(np.interp(mine["pipeline_microbatches"].astype(float), x, line.get_ydata()),
                                   mine["bubble_fraction_predicted"])
    assert ax.get_ylim()[0] == 0 and "micro-batches" in ax.get_xlabel()
    assert note.startswith("Measured over the formula: 1.40× (median of") and "trained on a CPU" in note
    texts = " ".join(" ".join(tx.get_text().split()) for tx in ax.texts)
    assert "pp-oom: oom" in texts, "the pipeline run that did not end ok is named"
    # elsewhere than a CPU, the note says nothing of one
    _, _, note = draw("lever_pipeline_bubble", runs.assign(device_type="cuda"), steps, with_note=True)
    assert "CPU" not in note and "1.40×" in note


def _write_timeline(results_dir, folder, schedule, m, pp, v=1):
    """A traced step as the worker writes it (scalelab.run.pipeline.timeline_record): every chunk's forwards, then
    its backwards (GPipe's order), stage k starting k ms late; returns the intervals by stage."""
    import json

    from scalelab.formulas.pipeline import TIMELINE_FILE
    from scalelab.run.pipeline import timeline_record

    stages = []
    for k in range(pp):
        t, timeline = 1e-3 * k, []
        for kind, duration in (("F", 2e-3), ("B", 3e-3)):
            for c in range(v):
                for mb in range(m):
                    timeline.append((kind, k + c * pp, mb, t, t + duration))
                    t += duration + 5e-4
        stages.append({"pp_rank": k, "timeline": timeline})
    (results_dir / "runs" / folder).mkdir(parents=True, exist_ok=True)
    (results_dir / "runs" / folder / TIMELINE_FILE).write_text(json.dumps(timeline_record(stages, schedule, m)))
    return [s["timeline"] for s in stages]


def _bars(ax, label):
    (bars,) = [c for c in ax.containers if c.get_label() == label]
    return sorted((b.get_y() + b.get_height() / 2, b.get_x(), b.get_width()) for b in bars)


def check_lever_pipeline_timeline(runs, steps):
    """The traced step of the ok pipeline run with the most micro-batches (then the first run id) whose folder holds
    its timeline: a row per stage, each interval a bar at its times (ms from the earliest start), numbered by
    micro-batch, the rank's second chunk apart; without a timeline file, a line that says so."""
    import tempfile
    from pathlib import Path

    runs = _pipelines(runs)
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp)
        fig, _, note = draw("lever_pipeline_timeline", runs, steps, results, with_note=True)
        assert "no pipeline timeline to draw" in fig.axes[0].texts[0].get_text() and "pipeline_timeline.json" in note
        ok = runs[(runs["pipeline_parallel"] > 1) & (runs["status"] == "ok")]
        most = ok[ok["pipeline_microbatches"] == ok["pipeline_microbatches"].max()].sort_values("run_id")
        (first, first_pp), (second, second_pp) = most[["run_id", "pipeline_parallel"]].head(2).itertuples(index=False)
        assert ok["pipeline_microbatches"].max() == 8 and "pp-oom" not in most["run_id"].to_list()
        expected = _write_timeline(results, first, "1f1b", 8, first_pp)
        _write_timeline(results, second, "1f1b", 8, second_pp)
        fig, _, note = draw("lever_pipeline_timeline", runs, steps, results, with_note=True)
        ax = fig.axes[0]
        assert ax.get_title().startswith(f"{first}: 1f1b, P {first_pp}, 8 micro-batches") and first in note
        t0 = min(start for stage in expected for _, _, _, start, _ in stage)
        end = max(stop for stage in expected for *_, stop in stage)
        for kind, label in (("F", "forward (F)"), ("B", "backward (B)")):
            want = sorted((k, (start - t0) * 1e3, (stop - start) * 1e3) for k, stage in enumerate(expected)
                          for what, _, _, start, stop in stage if what == kind)
            np.testing.assert_allclose(_bars(ax, label), want, atol=1e-9)
        # behind them each row's whole span, idle where no bar covers it
        np.testing.assert_allclose(_bars(ax, "idle (no forward or backward)"), [(k, 0, (end - t0) * 1e3) for k in range(first_pp)])
        numbers = sorted(int(tx.get_text()) for tx in ax.texts)
        assert numbers == sorted(mb for stage in expected for _, _, mb, _, _ in stage), "every bar numbered by micro-batch"
        labels = [tx.get_text() for tx in ax.get_yticklabels()]
        per_stage = runs.set_index("run_id").loc[first, "bubble_fraction_measured_per_stage"]
        assert labels == [f"stage {k}\nbubble {b:.2f}" for k, b in enumerate(per_stage)]
        assert ax.get_ylim()[0] > ax.get_ylim()[1], "stage 0 on top"
        # the first's file gone: the next in order is drawn, and the note says whose folder had none
        (results / "runs" / first / "pipeline_timeline.json").unlink()
        _write_timeline(results, second, "interleaved_1f1b", 8, second_pp, v=2)
        fig, _, note = draw("lever_pipeline_timeline", runs, steps, results, with_note=True)
        ax = fig.axes[0]
        assert ax.get_title().startswith(f"{second}: interleaved_1f1b") and f"no readable timeline in the folder of {first}" in note
        second_chunk = [c for c in ax.containers if "chunk 2 of 2" in c.get_label()]
        assert len(second_chunk) == 2 and all(b.get_hatch() for c in second_chunk for b in c)
        assert sum(len(c) for c in ax.containers if c.get_label() != "idle (no forward or backward)") == second_pp * 2 * 8 * 2
        # a file that does not read as a timeline is passed over, not a failed report
        (results / "runs" / second / "pipeline_timeline.json").write_text("{\"stages\": [{\"pp_rank\": 0}]}")
        fig, _, note = draw("lever_pipeline_timeline", runs, steps, results, with_note=True)
        assert "no pipeline timeline to draw" in fig.axes[0].texts[0].get_text()
    # no results folder (the tables alone): a line that says so
    fig, _ = draw("lever_pipeline_timeline", runs, steps)
    assert "no results folder" in fig.axes[0].texts[0].get_text()


CHECKS = {name.removeprefix("check_"): fn for name, fn in globals().items() if name.startswith("check_")}


def test_every_registered_figure_has_a_check():
    assert sorted(CHECKS) == sorted(f.name for f in FIGURES)


@pytest.mark.parametrize("name", [f.name for f in FIGURES])
def test_figure_draws_what_the_table_says(name, results):
    runs, steps = results
    CHECKS[name](runs, steps)
    matplotlib.pyplot.close("all")


def test_images_are_crisp_and_cropped(tmp_path, results):
    runs, steps = results
    fig, _ = draw("throughput", runs, steps)
    width_in = fig.get_figwidth()
    files = plot_style.save(fig, tmp_path, "throughput", ("png", "svg"))
    from PIL import Image

    with Image.open(tmp_path / files[0]) as png:
        assert plot_style.DPI >= 150 and png.size[0] > 0.8 * width_in * plot_style.DPI  # drawn at 150 dpi, not 90
        corner = png.convert("RGB").getpixel((0, 0))
        assert corner == (255, 255, 255)
    svg = (tmp_path / files[1]).read_text()
    assert "<text" in svg and "tokens/s per device" in svg, "SVG keeps its text as text"


def test_save_stops_if_the_canvas_does_not_hold_the_padded_drawing(tmp_path, monkeypatch):
    """plot_style.save crops the pixels savefig drew over the padded area, read from the canvas; a matplotlib
    whose canvas holds another drawing after savefig stops the build with a message, not a figure cut short."""
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buffer_rgba = FigureCanvasAgg.buffer_rgba

    def unpadded(self):
        FigureCanvasAgg.draw(self)  # the figure at its own size
        return buffer_rgba(self)

    monkeypatch.setattr(FigureCanvasAgg, "buffer_rgba", unpadded)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    with pytest.raises(RuntimeError, match="not the padded drawing"):
        plot_style.save(fig, tmp_path, "unpadded", ("png",))
    plt.close(fig)
    assert not (tmp_path / "unpadded.png").exists()


def test_notes_below_the_panels_are_inside_the_image(tmp_path, results):
    """The crop keeps what is drawn outside the axes: the red not-ok note under the lowest x label."""
    from PIL import Image

    runs, steps = results
    assert (runs["status"] != "ok").any()
    fig, _ = draw("throughput", runs, steps)
    (file,) = plot_style.save(fig, tmp_path, "throughput", ("png",))
    with Image.open(tmp_path / file) as png:
        rgb = np.asarray(png.convert("RGB")).astype(int)
    red = (rgb[..., 0] > 140) & (rgb[..., 1] < 60) & (rgb[..., 2] < 60)  # firebrick (178, 34, 34) text, not stage 3's lighter red
    rows = np.nonzero(red.any(axis=1))[0]
    assert rows.size and rows.min() > 0.8 * rgb.shape[0], "the note is drawn, below the panels"
    assert rows.max() < rgb.shape[0] - 3, "and not cut off at the bottom"


def test_figures_summarise_many_runs_at_a_point(results):
    """Twelve replicas of every run, their memory a little apart: over plots.RUNS_PER_POINT runs at a
    point, the memory figures draw each point as the median of its runs with a bar for their range,
    and their note says so; the loss figure stays one curve and a band, its legend naming the runs."""
    runs, steps = results
    runs, steps = runs.astype({"run_id": str}), steps.astype({"run_id": str})
    copies = 12
    assert copies > plots.RUNS_PER_POINT
    big = pd.concat([runs.assign(run_id=runs["run_id"] + f"-x{k}", model_state_bytes_measured=runs["model_state_bytes_measured"] * (1 + k / 50),
                                 peak_rss_bytes=runs["peak_rss_bytes"] * (1 + k / 50)) for k in range(copies)], ignore_index=True)
    big_steps = pd.concat([steps.assign(run_id=steps["run_id"] + f"-x{k}") for k in range(copies)], ignore_index=True)
    plot_style.use_theme()
    base = baseline(big)
    tables = Tables(base, big_steps[big_steps["run_id"].isin(base["run_id"])], lever_table(big))
    ok = base[base["status"] == "ok"]
    most = ok.groupby(["zero_stage", "precision", "world_size"], observed=True).size().max()
    assert most > plots.RUNS_PER_POINT
    for name, column in (("memory_model_state", "model_state_bytes_measured"), ("memory_peak", "peak_rss_bytes")):
        fig, note = next(f for f in FIGURES if f.name == name).draw(tables)
        assert f"Up to {most} runs at a point" in note and "median" in note
        for stage, at_stage in ok.groupby("zero_stage"):
            ax = panel(fig, f"ZeRO stage {stage}")
            for precision, g in at_stage.groupby("precision", observed=True):
                stats = (g[column].astype("float64") / MiB).groupby(g["world_size"]).agg(["median", "min", "max"])
                np.testing.assert_allclose(points(marks(ax, precision)), list(zip(stats.index, stats["median"])))
                (bars,) = [c for c in ax.collections if c.get_label() == f"_{precision} range"]
                np.testing.assert_allclose([(seg[0][1], seg[1][1]) for seg in bars.get_segments()], stats[["min", "max"]].to_numpy())
        matplotlib.pyplot.close(fig)
    # the usual fixture (at most two runs at a point): every run drawn, no note
    assert not isinstance(next(f for f in FIGURES if f.name == "memory_model_state").draw(Tables(baseline(runs), steps, lever_table(runs))), tuple)
    fig = next(f for f in FIGURES if f.name == "loss_curves").draw(tables)
    left = panel(fig, "fp32 loss (the reference)")
    n_fp32 = tables.steps.loc[(tables.steps["precision"] == "fp32") & tables.steps["run_id"].isin(ok["run_id"]), "run_id"].nunique()
    assert [ln.get_label() for ln in left.get_lines()] == [f"fp32, mean of {n_fp32} runs"] and len(left.collections) == 1
    matplotlib.pyplot.close("all")


def test_exact_zero_dloss_stays_on_the_axis(results):
    """Identical losses (|Δloss| exactly 0, as fp32 across stages should give) were NaN on a log axis
    and vanished: the symmetric-log axis keeps them, at 0."""
    runs, steps = results
    steps = steps.copy()
    early = steps["step"] < 5  # every run the same loss at these steps: fp16 equals its fp32 twin exactly
    steps.loc[early, "loss"] = 5.0 - 0.1 * steps.loc[early, "step"]
    fig, _ = draw("loss_curves", runs, steps)
    mid = panel(fig, "|loss − loss of the fp32 twin|")
    (line,) = lines(mid, "fp16")
    y = np.asarray(line.get_ydata(), dtype=float)
    assert (y[:5] == 0).all() and np.isfinite(y).all(), "the zeros drawn, not dropped as NaN"
    assert mid.get_ylim()[0] == 0 and 0 in mid.get_yticks()
    matplotlib.pyplot.close("all")


def test_loss_scale_figure_left_out_without_fp16_runs(results, tmp_path):
    """No fp16 run, no loss scale: the figure, its placeholder and its caption are left out."""
    from scalelab.report.figures import draw_figures

    runs, steps = results
    fp32 = runs[runs["precision"] != "fp16"]
    figure = next(f for f in FIGURES if f.name == "loss_scale")
    assert figure.applies(runs) and not figure.applies(fp32)
    drawn = draw_figures(fp32, steps[steps["run_id"].isin(fp32["run_id"])], lever_table(fp32), tmp_path, workers=1)
    assert "loss_scale" not in [d.figure.name for d in drawn] and not (tmp_path / "loss_scale.png").exists()
    matplotlib.pyplot.close("all")


def test_a_figure_with_nothing_to_draw_says_why_in_lines_that_fit():
    """The two-node report's predicted-vs-measured figure was a strip of clipped text: a long reason
    on one line of a short figure ran off both edges (issue #41)."""
    import matplotlib.pyplot as plt

    from scalelab.report import plot_style

    reason = "no step-time prediction: " + "no compute reference: the fit set has no ok run of this configuration " * 3
    fig = plot_style.empty_figure(reason)
    try:
        fig.canvas.draw()
        (text,) = fig.axes[0].texts
        lines = text.get_text().split("\n")
        assert len(lines) > 1 and all(len(line) <= 90 for line in lines) and " ".join(lines) == " ".join(reason.split())
        box = text.get_window_extent(renderer=fig.canvas.get_renderer())
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y0 >= 0 and box.y1 <= fig.bbox.height
    finally:
        plt.close(fig)


def test_hybrid_sharding_is_a_strategy_of_its_own_beside_zero3_in_the_main_figures(results):
    """The main figures draw hybrid runs (replicas > 1, zero_stage 3) as their own panel, line, heatmap row
    and bar group beside their ZeRO-3 twin (issue #41: the two-node experiment's point was left out)."""
    runs, steps = results
    drawn = baseline(runs, strategies=True)  # what draw_figures hands the main figures
    hybrid = drawn[(drawn["replicas"] == 2) & (drawn["status"] == "ok")]
    assert len(hybrid) >= 2 and hybrid["run_id"].str.endswith("-hsdp2").all()
    assert not set(hybrid["run_id"]) & set(baseline(runs)["run_id"])  # the tables' baseline stays the stages'
    plot_style.use_theme()
    tables = Tables(drawn, steps[steps["run_id"].isin(drawn["run_id"])], lever_table(runs))
    out = next(f for f in FIGURES if f.name == "memory_model_state").draw(tables)
    fig = out[0] if isinstance(out, tuple) else out
    np.testing.assert_allclose(points(marks(panel(fig, "hybrid, 2 replicas"), "fp32")),
                               sorted(zip(hybrid["world_size"], hybrid["model_state_bytes_measured"] / MiB)))
    twin = drawn[(drawn["zero_stage"] == 3) & (drawn["replicas"] == 1) & (drawn["precision"] == "fp32") & (drawn["status"] == "ok")]
    np.testing.assert_allclose(points(marks(panel(fig, "ZeRO stage 3"), "fp32")),
                               sorted(zip(twin["world_size"], twin["model_state_bytes_measured"] / MiB)))
    fig = next(f for f in FIGURES if f.name == "throughput").draw(tables)
    (line,) = lines(panel(fig, "fp32: tokens/s, all ranks"), "hybrid, 2 replicas")
    expected = hybrid.groupby("world_size")["tokens_per_s"].median()
    np.testing.assert_allclose(line.get_xdata(), expected.index)
    np.testing.assert_allclose(line.get_ydata(), expected.to_numpy())
    assert "fp32 hsdp2" in mfu_grid(drawn)["rows"]
    assert "hsdp2\nw2" in set(plots.communication_table(drawn)["label"])


def test_a_formula_at_one_world_size_is_drawn_as_a_tick(results):
    """A sweep of one world size (the two-node experiment): a formula's 'line' has one point, which a plain
    line would not show."""
    runs, steps = results
    one = runs[runs["world_size"] == 2]
    fig, _ = draw("memory_model_state", one, steps)
    (pytorch,) = lines(panel(fig, "ZeRO stage 3"), "PyTorch AMP")
    assert len(pytorch.get_xdata()) == 1 and pytorch.get_marker() == "_"


@pytest.mark.parametrize("values", [[0.0, 7e-4, 0.06], [0.0, 3e-8, 2e-3, 0.4], [0.0, 0.05, 0.09]])
def test_a_zero_keeping_log_axis_draws_its_tick_labels_apart(values):
    """The |Δloss| panels drew "0" over the first decade's label (0 sat a third of a decade below it)."""
    import matplotlib.pyplot as plt

    plot_style.use_theme()
    fig, ax = plt.subplots(figsize=(4, 3.3))
    ax.plot(range(len(values)), values)
    plot_style.zero_log_y(ax, values)
    fig.canvas.draw()
    labels = [t for t in ax.get_yticklabels() if t.get_text() and ax.get_ylim()[0] <= t.get_position()[1] <= ax.get_ylim()[1]]
    boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.y0)
    assert [t.get_text() for t in labels][0] == "0" and len(labels) >= 3
    assert all(low.y1 <= high.y0 for low, high in zip(boxes, boxes[1:])), [(t.get_text(), b.y0, b.y1) for t, b in zip(labels, boxes)]
    plt.close(fig)
