"""The main figures, from the result tables (metrics.parquet, steps.parquet), with matplotlib: memory (model state,
peak), throughput, the MFU heatmap, loss curves, the loss scale and communication. The pipeline's figures are
scalelab.report.pipeline_plots; the look they share (colours, theme, axes, notes, saving) scalelab.report.plot_style.

Each function takes the run table (and steps where needed) and returns the matplotlib
figure, or (figure, note) where the figure shows something other than usual (the note
follows the caption). Names, captions and file formats are declared once, in
scalelab.report.figures, which saves the figures with plot_style.save. Runs that did not finish
`ok` are never silent gaps: every figure lists them, and the heatmap marks their cells.

What a figure draws comes from scalelab.report.tables, and each artist carries a label
(precision, stage, formula) so that tests/unit/test_figures.py can read the plotted data back and
hold it against the table. World sizes are drawn on a log2 axis ticked at the sizes run.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from scalelab.report.plot_style import (  # noqa: E402
    FLAG_HATCH,
    PALETTE,
    STAGE_MARKERS,
    dodge,
    empty_figure,
    figure_legend,
    join_notes,
    log_y,
    marks,
    not_ok_note,
    note_below_axes,
    precision_colors,
    si_label,
    strategy_color,
    strategy_marker,
    world_size_axis,
    y_range,
    zero_log_y,
)
from scalelab.report.tables import (  # noqa: E402
    MFU_LIMIT,
    PRECISION_ORDER,
    MiB,
    largest_deviation_vs_stage0,
    loss_vs_fp32_twin,
    mfu_grid,
    precisions,
    strategies,
    strategy_tick,
    throughput_table,
)

# Beyond this many runs at one point (replicas of a configuration), a memory figure draws their
# median and range instead: a stack of a hundred markers shows neither how many nor how spread.
RUNS_PER_POINT = 8


def _memory_panels(runs: pd.DataFrame, ok: pd.DataFrame, measured, lines: list[tuple], ylabel: str):
    """One panel per ZeRO stage (and hybrid sharding: tables.strategies): measured points per precision (dodged around their world size)
    and formula lines [(column, label, line style, which precisions or None for all)], each
    named in the legend (the mean over the runs it covers, per world size). Returns (figure,
    note): the note says so where points are medians (more than RUNS_PER_POINT runs at a point)."""
    stages = list(strategies(runs).cat.remove_unused_categories().cat.categories)
    ok = ok.assign(_strategy=strategies(ok).astype(str))
    precs = precisions(runs)
    colors = precision_colors(precs)
    fig, axes = plt.subplots(1, len(stages), figsize=(2.9 * len(stages) + 0.4, 3.3), sharey=True, squeeze=False)
    most = int(ok.groupby(["_strategy", "precision", "world_size"], observed=True).size().max()) if len(ok) else 0
    summarise = most > RUNS_PER_POINT
    values = []
    for ax, stage in zip(axes[0], stages):
        sub = ok[ok["_strategy"] == stage]
        for i, precision in enumerate(precs):
            g = sub[sub["precision"] == precision]
            y = measured(g) / MiB
            style = dict(size=22, color=colors[precision], label=precision, marker=STAGE_MARKERS[i % len(STAGE_MARKERS)], zorder=3,
                         edgecolor="white", edgewidth=0.4)
            if summarise:
                stats = y.groupby(g["world_size"].to_numpy()).agg(["median", "min", "max"])
                x = stats.index.to_numpy() * dodge(len(precs), i)
                ax.vlines(x, stats["min"], stats["max"], color=colors[precision], lw=1.0, zorder=2.5, label=f"_{precision} range")
                marks(ax, x, stats["median"], **style)
            else:
                marks(ax, g["world_size"] * dodge(len(precs), i), y, **style)
            values += list(y)
        for column, label, style, only in lines:
            # .astype(bool): an empty stage's mask would be an object Series, read as column labels
            g = sub.loc[sub["precision"].map(only).astype(bool)] if only else sub
            curve = g.groupby("world_size")[column].mean().dropna() / MiB
            if not curve.empty:  # one world size: a line of one point draws nothing, so a tick marks it
                one = {"marker": "_", "markersize": 22, "markeredgewidth": style.get("lw", 1.0) + 0.4} if len(curve) == 1 else {}
                ax.plot(curve.index, curve.to_numpy(), label=label, zorder=2, **one, **style)
                values += list(curve)
        world_size_axis(ax, runs["world_size"].unique())
        ax.set_title(stage)
    axes[0][0].set_ylabel(ylabel)
    for ax in axes[0]:
        y_range(ax, values)
    fig.subplots_adjust(wspace=0.12)
    figure_legend(fig, axes)
    note = (f"Up to {most} runs at a point: each point is their median, its bar their range (more than "
            f"{RUNS_PER_POINT} runs at one point are not drawn one by one).") if summarise else None
    return fig, note


# The formula lines of the model-state figure: (column, legend label, style, which precisions).
MODEL_STATE_LINES = [
    ("model_state_bytes_predicted", "predicted: PyTorch AMP,\nfp32 master weights (16 B/param)", {"color": "black", "lw": 1.1}, None),
    ("model_state_bytes_predicted_paper", "predicted: ZeRO paper, fp32\n(4+4+8 B/param)", {"color": "grey", "lw": 1.1, "ls": "--"},
     lambda p: p == "fp32"),
    ("model_state_bytes_predicted_paper", "predicted: ZeRO paper, mixed\nprecision (2+2+12 B/param)", {"color": "grey", "lw": 1.3, "ls": ":"},
     lambda p: p != "fp32"),
]


def model_state_memory(runs: pd.DataFrame):
    ok = runs[runs["status"] == "ok"]
    if ok.empty:
        return empty_figure("no ok runs")
    fig, note = _memory_panels(runs, ok, lambda g: g["model_state_bytes_measured"], MODEL_STATE_LINES, "model state per rank (MiB)")
    not_ok_note(fig, runs)
    return (fig, note) if note else fig


def peak_device_memory(runs: pd.DataFrame):
    """Max allocated device memory of GPU runs; without GPU runs, process peak RSS, with a note saying so."""
    gpu = runs[(runs["status"] == "ok") & runs["peak_mem_allocated_bytes"].notna()]
    if gpu.empty:
        note = "No GPU runs in these results: process peak RSS per rank (CPU; includes the framework, not device memory)."
        data = runs[(runs["status"] == "ok") & runs["peak_rss_bytes"].notna()]
        if data.empty:
            return empty_figure("no ok runs"), note
        fig, summary = _memory_panels(runs, data, lambda g: g["peak_rss_bytes"], [], "peak RSS per rank (MiB)")
        not_ok_note(fig, runs)
        return fig, join_notes(note, summary)
    colors = precision_colors(precisions(runs))
    fig, note = _memory_panels(runs, gpu, lambda g: g["peak_mem_allocated_bytes"], [
        ("predicted_peak_bytes", f"predicted in-step peak, {p}", {"color": colors[p], "lw": 1.0, "ls": "--"}, lambda x, p=p: x == p)
        for p in precisions(gpu)], "peak allocated per rank (MiB)")
    not_ok_note(fig, runs)
    return (fig, note) if note else fig


def throughput(runs: pd.DataFrame):
    """Rows: precisions; columns: total tokens/s, tokens/s per device, scaling efficiency; a line per
    stage through the median of each point's repeats, a bar from their lowest to their highest."""
    table = throughput_table(runs)
    if table.empty:
        return empty_figure("no ok runs")
    precs = precisions(table)
    columns = [("tokens_per_s", "tokens/s, all ranks"), ("tokens_per_s_per_device", "tokens/s per device"),
               ("scaling_efficiency", "scaling efficiency (1 = linear)")]
    fig, axes = plt.subplots(len(precs), 3, figsize=(10.5, 2.3 * len(precs) + 0.3), sharex=True, squeeze=False)
    for row, precision in zip(axes, precs):
        sub = table[table["precision"] == precision]
        for ax, (column, label) in zip(row, columns):
            for stage, g in sub.groupby("strategy", observed=True):
                g = g.sort_values("world_size")
                ax.plot(g["world_size"], g[column], marker=strategy_marker(stage), lw=1.2,
                        color=strategy_color(stage), label=stage)
                spread = g[g["runs"] > 1]  # the run-to-run spread, where the point ran more than once
                if not spread.empty:
                    ax.vlines(spread["world_size"], spread[f"{column}_lo"], spread[f"{column}_hi"], color=strategy_color(stage),
                              lw=3, alpha=0.45, zorder=1)
            ax.set_title(f"{precision}: {label}")
            ax.set_ylabel(label.split(",")[0].replace(" (1 = linear)", ""))
            world_size_axis(ax, runs["world_size"].unique())
            if column == "scaling_efficiency":
                ax.axhline(1.0, color="grey", lw=0.8, ls=":")
                if not sub[column].notna().any():
                    ax.text(0.5, 0.5, "no world-size-1 run:\nefficiency unknown", transform=ax.transAxes, ha="center",
                            va="center", fontsize=8, color="#666666")
                ax.set_ylim(0, max(1.1, float(np.nanmax(sub[column])) * 1.1) if sub[column].notna().any() else 1.1)
            elif column == "tokens_per_s":
                ax.yaxis.set_major_formatter(FuncFormatter(si_label))
                y_range(ax, sub[column])
            else:
                ax.yaxis.set_major_formatter(FuncFormatter(si_label))
                ax.set_ylim(0, float(np.nanmax(sub[column])) * 1.15 if sub[column].notna().any() else 1)
    for ax in axes[:-1].flat:
        ax.set_xlabel("")
    fig.subplots_adjust(wspace=0.3, hspace=0.35)
    figure_legend(fig, axes)
    not_ok_note(fig, runs)
    return fig


def mfu_heatmap(runs: pd.DataFrame):
    g = mfu_grid(runs)
    n_rows, n_cols = len(g["rows"]), len(g["world_sizes"])
    fig, ax = plt.subplots(figsize=(1.5 + 0.85 * n_cols + 1.0, 0.9 + 0.32 * n_rows))
    ax.grid(False)
    ax.set_facecolor("#f4cccc")  # non-ok / missing cells show through in red
    apart = g["flagged"] | g["emulated"]  # drawn grey and hatched, out of the colour scale
    shown = np.ma.masked_invalid(np.where(apart, np.nan, g["mfu"]))
    mesh = ax.pcolormesh(np.arange(n_cols + 1), np.arange(n_rows + 1), shown, cmap="viridis",
                         norm=Normalize(g["vmin"], g["vmax"]), edgecolors="white", linewidth=0.6)
    mesh.set_label("mfu")
    norm = mesh.norm
    for i in range(n_rows):
        for j in range(n_cols):
            v, st = g["mfu"][i, j], g["status"][i, j]
            if g["flagged"][i, j]:
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#dddddd", edgecolor="#888888", hatch=FLAG_HATCH, lw=0.6,
                                       label="_flagged"))
                text, color = f"{v:.2f}‡", "black"
            elif g["emulated"][i, j]:
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#ececec", edgecolor="#c4c4c4", hatch="...", lw=0.6,
                                       label="_emulated"))
                text, color = f"{v:.3f}†", "#555555"
            elif st == "ok":
                text = f"{v:.3f}" if pd.notna(v) else "n/a"
                if pd.notna(v) and np.isfinite(g["spread"][i, j]):  # a point that ran more than once: its spread
                    text += f" ±{g['spread'][i, j] / 2:.0%}"
                color = "white" if pd.notna(v) and norm(v) < 0.6 else "black"
                if pd.isna(v):
                    ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#eeeeee", edgecolor="white", lw=0.6))
            elif st == "not run":
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#f2f2f2", edgecolor="white", lw=0.6))
                text, color = "not run", "#888888"
            else:
                text, color = st, "firebrick"
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=7, color=color)
    ax.set_xticks(np.arange(n_cols) + 0.5, [str(w) for w in g["world_sizes"]])
    ax.set_yticks(np.arange(n_rows) + 0.5, g["rows"])
    ax.set_xlim(0, n_cols)
    ax.set_ylim(n_rows, 0)
    ax.set(xlabel="world size (ranks)", ylabel="precision, ZeRO stage", title="MFU (fraction of the dense peak per device)")
    bar = fig.colorbar(mesh, ax=ax, fraction=0.05, pad=0.02)
    bar.set_label("MFU")
    notes = []
    if g["emulated"].any():
        notes.append("† dotted grey: 16-bit precisions on a CPU, whose matmuls it emulates, against a peak measured on that "
                     "same emulated path: a high MFU there is not speed (compare tokens/s); left out of the colour scale.")
    if g["flagged"].any():
        notes.append(f"‡ hatched: MFU above {MFU_LIMIT:g} (100% of the peak recorded for the run): that peak is too low "
                     "for this path (e.g. emulated fp16 on a CPU), so the value means nothing; left out of the colour scale.")
    if notes:
        note_below_axes(fig, " ".join(notes))
    return fig


def loss_curves(runs: pd.DataFrame, steps: pd.DataFrame):
    """Left: the fp32 reference loss. Middle: |loss - loss of the fp32 twin| per step, per
    precision (largest over configurations, log). Right: largest |Δloss| vs stage 0 per stage."""
    ok_ids = set(runs.loc[runs["status"] == "ok", "run_id"])
    st = steps[steps["run_id"].isin(ok_ids)]
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(12.5, 3.3))
    fig.subplots_adjust(wspace=0.32)
    if st.empty:
        left.text(0.5, 0.5, "no ok runs", ha="center")
        not_ok_note(fig, runs)
        return fig
    precs = precisions(st)
    colors = precision_colors(precs)
    ref_precision = "fp32" if "fp32" in precs else precs[0]
    ref_steps = st[st["precision"] == ref_precision]
    ref = ref_steps.groupby("step")["loss"].agg(["mean", "min", "max"])
    # one curve and a band however many runs: hundreds of curves would be a blot
    n_ref = ref_steps["run_id"].nunique()
    left.plot(ref.index, ref["mean"].to_numpy(), color=colors[ref_precision], lw=1.2,
              label=f"{ref_precision}, mean of {n_ref} run{'s' if n_ref != 1 else ''}")
    left.fill_between(ref.index, ref["min"].to_numpy(), ref["max"].to_numpy(), color=colors[ref_precision], alpha=0.25,
                      lw=0, label="min-max over runs")
    left.set(title=f"{ref_precision} loss (the reference)", xlabel="step", ylabel="loss (nats/token)")
    left.legend()
    twin = loss_vs_fp32_twin(st, runs)  # each against its like (scalelab.results.like), the model from the runs
    for precision in precs:
        curve = twin[twin["precision"] == precision]
        if curve.empty:
            continue
        y = curve["max_abs_dloss"].to_numpy(dtype=float)
        mid.plot(curve["step"], y, color=colors[precision], lw=1.0, label=precision)
    if twin.empty:
        mid.text(0.5, 0.5, "no fp32 twin to compare with", ha="center", va="center", transform=mid.transAxes)
    else:
        zero_log_y(mid, twin["max_abs_dloss"])  # an exact 0 (identical losses) stays on the axis, at 0
        mid.legend(title="precision")
    mid.set(title="|loss − loss of the fp32 twin|", xlabel="step", ylabel="largest |Δloss| (nats/token, log)")
    dev = largest_deviation_vs_stage0(st, runs)
    dev = dev[dev["zero_stage"] != 0]
    if not dev.empty:
        stages = sorted(dev["zero_stage"].unique())
        width = 0.8 / len(precs)
        for i, precision in enumerate(precs):
            d = dev[dev["precision"] == precision].set_index("zero_stage").reindex(stages)["max_abs_dloss"]
            x = np.arange(len(stages)) + (i - (len(precs) - 1) / 2) * width
            bars = right.bar(x, d.fillna(0).to_numpy(), width, color=colors[precision], label=precision)
            for bar, v in zip(bars, d):
                if pd.notna(v):
                    right.annotate(f"{v:.2g}" if v else "0", (bar.get_x() + width / 2, v if v > 0 else 0), fontsize=6.5,
                                   ha="center", va="bottom", xytext=(0, 1), textcoords="offset points")
        right.set_xticks(np.arange(len(stages)), [f"stage {s}" for s in stages])
        zero_log_y(right, dev["max_abs_dloss"], top=4)
        right.legend(title="precision")
    right.set(title="largest |Δloss| vs stage 0 (over world sizes)", xlabel="ZeRO stage", ylabel="max |Δloss| (nats/token, log)")
    not_ok_note(fig, runs)
    return fig


def loss_scale(runs: pd.DataFrame, steps: pd.DataFrame):
    fp16 = steps[steps["precision"] == "fp16"]
    if fp16.empty:
        return empty_figure("no fp16 runs in these results")
    agg = fp16.groupby("step").agg(median=("loss_scale", "median"), lo=("loss_scale", "min"), hi=("loss_scale", "max"),
                                    skipped=("skipped", "sum"))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot(agg.index, agg["median"].to_numpy(), color=PALETTE[1], label="median")
    top.fill_between(agg.index, agg["lo"].to_numpy(), agg["hi"].to_numpy(), color=PALETTE[1], alpha=0.25, lw=0, label="min-max")
    top.set(ylabel="loss scale (log)", title=f"fp16 dynamic loss scale ({fp16['run_id'].nunique()} runs)")
    log_y(top)
    top.legend()
    # one artist for all the steps (a bar per step is hundreds of patches)
    bottom.stairs(agg["skipped"].to_numpy(), np.append(agg.index.to_numpy() - 0.5, agg.index[-1] + 0.5), color="firebrick",
                  fill=True, label="skipped")
    bottom.set(xlabel="step", ylabel="skipped steps\n(runs)")
    # counts of runs: whole numbers from 0 (with none skipped the axis ran from -0.05 to 0.05)
    bottom.set_ylim(0, max(1, int(agg["skipped"].max())) * 1.1)
    bottom.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=3))
    if not agg["skipped"].any():
        bottom.text(0.5, 0.5, "no step skipped", ha="center", va="center", transform=bottom.transAxes, fontsize=8)
    not_ok_note(fig, runs[runs["precision"] == "fp16"])
    return fig


def communication_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean bytes per step of the ok runs by stage, world size and precision (in the report's
    precision order): fp16 and bf16 gather 16-bit parameters at stages 2 and 3, so precisions
    are bars of their own, not averaged together."""
    ok = runs[runs["status"] == "ok"]
    ok = ok.assign(strategy=strategies(ok))
    agg = ok.groupby(["zero_stage", "strategy", "world_size", "precision"], as_index=False, observed=True)[
        ["comm_bytes_per_step_measured", "comm_bytes_per_step_predicted", "comm_bytes_per_step_predicted_paper"]].mean()
    order = {p: (PRECISION_ORDER.index(p) if p in PRECISION_ORDER else len(PRECISION_ORDER)) for p in agg["precision"].unique()}
    agg = agg.assign(_order=agg["precision"].map(order)).sort_values(["strategy", "world_size", "_order"])
    agg["label"] = agg["strategy"].astype(str).map(strategy_tick) + "\nw" + agg["world_size"].astype(str)
    return agg.drop(columns="_order").reset_index(drop=True)


def communication(runs: pd.DataFrame):
    """Per stage and world size, a bar per precision (its colour): the bytes measured, with the
    PyTorch prediction (black) and the paper's (grey) on each bar."""
    agg = communication_table(runs)
    if agg.empty:
        return empty_figure("no ok runs")
    names = sorted(agg["precision"].unique(), key=lambda p: (PRECISION_ORDER.index(p) if p in PRECISION_ORDER else len(PRECISION_ORDER), p))
    colors = precision_colors(names)
    groups = agg[["label"]].drop_duplicates().reset_index(drop=True)
    slot = {p: i for i, p in enumerate(names)}
    width = 0.8 / len(slot)
    group_index = {key: i for i, key in enumerate(groups["label"])}
    group_of = np.array([group_index[key] for key in agg["label"]])
    x = group_of + (agg["precision"].map(slot).to_numpy() - (len(slot) - 1) / 2) * width
    fig, ax = plt.subplots(figsize=(max(5, 0.42 * len(groups) * max(1, len(slot) / 2) + 2), 3.4))
    for precision in slot:  # one container per precision, labelled by it
        mine = (agg["precision"] == precision).to_numpy()
        ax.bar(x[mine], agg["comm_bytes_per_step_measured"][mine] / MiB, width=width * 0.95, color=colors[precision],
               label=f"{precision}, measured")
    tick = 260 * min(1.0, width / 0.8) ** 2  # a tick as wide as its bar
    marks(ax, x, agg["comm_bytes_per_step_predicted"] / MiB, marker="_", size=tick, color="black", label="predicted (PyTorch)", zorder=3)
    marks(ax, x, agg["comm_bytes_per_step_predicted_paper"] / MiB, marker="_", size=tick, color="grey", label="predicted (paper, fp32 elements)", zorder=3)
    ax.set_xticks(np.arange(len(groups)), groups["label"])
    ax.grid(axis="x", visible=False)
    ax.set(ylabel="MiB per optimizer step", xlabel="ZeRO stage (z) or hybrid sharding's replicas (hsdp), world size (w)",
           title="bytes handed to collectives per step")
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    not_ok_note(fig, runs)
    return fig

