"""Plots from the result tables (metrics.parquet, steps.parquet), with matplotlib; the pipeline timeline
alone reads a file of one run folder (TIMELINE_FILE), and says so where there is none.

Each function takes the run table (and steps where needed) and returns the matplotlib
figure, or (figure, note) where the figure shows something other than usual (the note
follows the caption). Names, captions and file formats are declared once, in
scalelab.report.figures, which saves the figures with `save`. Runs that did not finish
`ok` are never silent gaps: every figure lists them, and the heatmap marks their cells.

What a figure draws comes from scalelab.report.tables, and each artist carries a label
(precision, stage, formula) so that tests/unit/test_figures.py can read the plotted data back and
hold it against the table. World sizes are drawn on a log2 axis ticked at the sizes run.
"""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator  # noqa: E402

from scalelab.formulas.pipeline import TIMELINE_FILE  # noqa: E402  (a pipeline run's traced step, in its folder)
from scalelab.report.tables import (  # noqa: E402,F401  (re-exported for callers of plots)
    MFU_LIMIT,
    PRECISION_ORDER,
    MiB,
    device_peak_bytes,
    largest_deviation_vs_stage0,
    loss_deviation_vs_stage0,
    loss_vs_fp32_twin,
    mfu_flagged,
    mfu_grid,
    pipeline_bubbles,
    pipeline_rows,
    precisions,
    pruned_rows,
    strategies,
    strategy_tick,
    throughput_table,
    timeline_candidates,
)

DPI = 150  # PNG resolution; the report shows them at 96 dpi (crisp on high-density screens)
# Fixed colours: a precision (or a stage) has the same colour in every figure.
PALETTE = sns.color_palette("deep", 8).as_hex()  # seaborn's default palette; the figures draw with matplotlib alone
STAGE_MARKERS = ["o", "s", "^", "D", "v", "P"]
FLAG_HATCH = "////"


def precision_colors(names) -> dict[str, str]:
    order = PRECISION_ORDER + [p for p in names if p not in PRECISION_ORDER]
    return {p: PALETTE[order.index(p) % len(PALETTE)] for p in names}


def stage_color(stage: int) -> str:
    return PALETTE[int(stage) % len(PALETTE)]


def strategy_color(label: str) -> str:
    """A stage's colour (stage_color); hybrid sharding after the stages, one colour per replica count."""
    if label.startswith("hybrid"):
        return PALETTE[(4 + int(label.split(", ")[1].split()[0])) % len(PALETTE)]
    return stage_color(int(label.rsplit(" ", 1)[1]))


def strategy_marker(label: str) -> str:
    return STAGE_MARKERS[5] if label.startswith("hybrid") else STAGE_MARKERS[int(label.rsplit(" ", 1)[1]) % len(STAGE_MARKERS)]


# What `save` draws around the figure: room for legends right of the panels and notes below
# them, cropped away again where it stays blank (inches: left, bottom, right, top).
PAD_INCHES = (0.3, 1.6, 3.2, 0.4)
CROP_MARGIN_PX = 6


def save(fig, out_dir: Path, name: str, formats: tuple[str, ...]) -> list[str]:
    """Write fig as <name>.<format> for each format (PNG at DPI), close it, return the file names.

    What savefig(bbox_inches="tight") does, at one drawing instead of two (tight draws the figure
    once more to measure it; measured side by side, this saves 22% of a 1,000-run report's build):
    the figure is drawn once over a padded area, the blank border cropped from its pixels, the PNG
    written by matplotlib's imsave and an SVG (text kept as text) drawn for the same box."""
    from matplotlib.transforms import Bbox

    files = [f"{name}.{fmt}" for fmt in formats]
    w, h = fig.get_size_inches()
    left, bottom, right, top = PAD_INCHES
    fig.savefig(io.BytesIO(), format="rgba", dpi=DPI, bbox_inches=Bbox.from_extents(-left, -bottom, w + right, h + top))
    rgba = np.asarray(fig.canvas.buffer_rgba())  # the pixels savefig just drew, (height, width, 4)
    height, width = rgba.shape[:2]
    if abs(width - (w + left + right) * DPI) > 2:
        raise RuntimeError(f"the canvas holds {width} px, not the padded drawing: plots.save must be adapted to matplotlib "
                           f"{matplotlib.__version__}")
    ink = rgba.view(np.uint32)[..., 0] != 0xFFFFFFFF  # not opaque white
    ink_rows, ink_cols = np.nonzero(ink.any(axis=1))[0], np.nonzero(ink.any(axis=0))[0]
    if ink_rows.size:
        y0, y1 = max(0, ink_rows[0] - CROP_MARGIN_PX), min(height, ink_rows[-1] + 1 + CROP_MARGIN_PX)
        x0, x1 = max(0, ink_cols[0] - CROP_MARGIN_PX), min(width, ink_cols[-1] + 1 + CROP_MARGIN_PX)
    else:
        y0, y1, x0, x1 = 0, height, 0, width
    for file, fmt in zip(files, formats):
        if fmt == "png":
            plt.imsave(out_dir / file, rgba[y0:y1, x0:x1], format="png", dpi=DPI)
        else:  # the cropped box, in inches from the figure's lower left corner
            box = Bbox.from_extents(-left + x0 / DPI, -bottom + (height - y1) / DPI, -left + x1 / DPI, -bottom + (height - y0) / DPI)
            fig.savefig(out_dir / file, format=fmt, bbox_inches=box)
    plt.close(fig)
    return files


def use_theme() -> None:
    """A light grid style (seaborn's whitegrid look, set without seaborn: it is not needed to draw)."""
    plt.rcdefaults()
    plt.rcParams.update({
        "figure.facecolor": "white", "axes.facecolor": "white", "axes.edgecolor": "#cccccc", "axes.grid": True,
        "grid.color": "#e5e5e5", "grid.linewidth": 0.8, "axes.axisbelow": True, "axes.titlesize": 9,
        "axes.labelsize": 8.5, "xtick.labelsize": 7.5, "ytick.labelsize": 7.5, "legend.fontsize": 7.5,
        "legend.title_fontsize": 8, "font.size": 8.5, "axes.prop_cycle": matplotlib.cycler(color=PALETTE),
        # no tick marks (the grid shows where ticks are): not drawn at all rather than drawn at size 0
        "xtick.major.size": 0, "ytick.major.size": 0, "xtick.bottom": False, "ytick.left": False,
        "axes.spines.top": False, "axes.spines.right": False,
        "svg.fonttype": "none", "lines.markersize": 4.5, "legend.frameon": False,
        "axes.titley": 1.0,
        # Glyphs as drawn, without FreeType running the font's hinting program for each one: it
        # was half the cost of the text (measured), and at 150 dpi hinting changes no legible detail.
        "text.hinting": "no_hinting",
    })


def marks(ax, x, y, *, size: float, color, marker: str = "o", edgecolor=None, edgewidth: float | None = None, **kwargs):
    """Points without a line, as ax.scatter draws them for one colour and size (size: the marker's
    area in pt², scatter's `s`), but as one Line2D: a scatter's PathCollection cost several times
    more to build and draw. Line markers ("_") keep scatter's line width."""
    if edgewidth is None:
        edgewidth = plt.rcParams["lines.linewidth"] if marker == "_" else plt.rcParams["lines.markeredgewidth"]
    return ax.plot(x, y, ls="none", marker=marker, ms=size ** 0.5, color=color, mec=color if edgecolor is None else edgecolor,
                   mew=edgewidth, **kwargs)[0]


def _not_ok_note(fig, runs: pd.DataFrame) -> None:
    """Name the runs missing from a figure because they did not finish ok."""
    bad = runs.loc[(runs["status"] != "ok") & ~pruned_rows(runs), ["run_id", "status"]]  # a pruned point: a decision
    if bad.empty:
        return
    shown = ", ".join(f"{r.run_id}: {r.status}" for r in bad.head(12).itertuples())
    more = f" (+{len(bad) - 12} more)" if len(bad) > 12 else ""
    _below_axes(fig, f"not ok, not plotted: {shown}{more}", color="firebrick")


def _below_axes(fig, text: str, **kwargs) -> None:
    """A note under the lowest x-axis label (never on top of it), wrapped to the figure's width."""
    import textwrap

    axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    lowest = min(axes or fig.axes, key=lambda ax: ax.get_position().y0)
    width = max(40, int(fig.get_figwidth() * 15))
    lowest.annotate("\n".join(textwrap.wrap(text, width)), xy=(0.01, 0), xycoords=("figure fraction", lowest.xaxis.label),
                    xytext=(0, -6), textcoords="offset points", ha="left", va="top", fontsize=7.5, annotation_clip=False,
                    **kwargs)


def _empty(message: str):
    """A figure that says why there is nothing to draw: wrapped to its width, so that a long reason
    (a run's prediction note) reads whole instead of running off both edges."""
    import textwrap

    lines = textwrap.wrap(message, width=90) or [""]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.22 * len(lines)))
    ax.axis("off")
    ax.text(0.0, 0.5, "\n".join(lines), ha="left", va="center", fontsize=9)
    return fig


def _world_size_axis(ax, sizes) -> None:
    """A log2 axis ticked at the world sizes run (1, 2, 4, ...), labelled as integers."""
    sizes = sorted({int(s) for s in sizes})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.xaxis.set_minor_locator(NullLocator())
    lo, hi = min(sizes), max(sizes)
    ax.set_xlim(lo / 2 ** 0.5, hi * 2 ** 0.5)
    ax.set_xlabel("world size (ranks, log2)")


def _si(value, _pos=None) -> str:
    """Tick labels in plain numbers: 3.5k, 120k, 1.2M."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:g}{suffix}"
    return f"{value:g}"


def _sci(value, _pos=None) -> str:
    """Log-axis tick labels as plain text (1e-04, 0.01, 10, 1k): mathtext is slow and heavy."""
    if value == 0:
        return "0"
    if 1e-2 <= abs(value) < 1e4:
        return _si(value) if abs(value) >= 1 else f"{value:g}"
    return f"{value:.0e}".replace("e-0", "e-").replace("e+0", "e")


def log_y(ax) -> None:
    """A log y axis, ticked at powers of ten (also 2 and 5 when it spans less than two decades), plain labels."""
    ax.set_yscale("log")
    _log_ticks(ax.yaxis, *ax.get_ylim())


def log_x(ax) -> None:
    """log_y's ticks on the x axis."""
    ax.set_xscale("log")
    _log_ticks(ax.xaxis, *ax.get_xlim())


def _log_ticks(axis, lo: float, hi: float) -> None:
    axis.set_major_locator(LogLocator(base=10, subs=(1.0,) if hi / max(lo, 1e-300) > 100 else (1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(_sci))
    axis.set_minor_locator(NullLocator())  # minor ticks would cost a figure of small panels half its drawing
    axis.set_minor_formatter(NullFormatter())


def zero_log_y(ax, values, top: float = 1.6) -> None:
    """A log y axis that keeps exact zeros: symmetric log, linear below the smallest nonzero value
    (a zero |Δloss| is a result: identical losses; on a plain log axis it vanished), with 0 ticked.
    All zero: a linear axis from 0, the zeros drawn on it."""
    v = np.asarray(pd.Series(values, dtype=float).dropna())
    positive = v[v > 0]
    if positive.size == 0:
        ax.set_ylim(-0.05, 1)
        ax.set_yticks([0])
        return
    first = np.floor(np.log10(positive.min()))
    # 0 a whole decade's height below the first decade tick: squeezed into a third of one (linscale 0.3, its
    # threshold at the smallest value) the labels "0" and "1e-4" were drawn over each other
    ax.set_yscale("symlog", linthresh=10.0 ** first, linscale=1.0)
    ax.set_ylim(0, positive.max() * top)
    decades = np.arange(first, np.ceil(np.log10(positive.max() * top)) + 1)
    step = max(1, int(np.ceil(len(decades) / 5)))
    ax.yaxis.set_major_locator(FixedLocator([0.0, *10.0 ** decades[::step]]))
    ax.yaxis.set_major_formatter(FuncFormatter(_sci))
    ax.yaxis.set_minor_locator(NullLocator())


def _y_range(ax, values, unit_floor: float = 0.0) -> None:
    """A log axis for values spanning more than a decade; else linear from 0, so that noise of a
    few percent (a peak RSS of 332-346 MiB) is not magnified into a slope."""
    v = np.asarray([x for x in values if pd.notna(x) and x > 0], dtype=float)
    if v.size == 0:
        return
    if v.max() / v.min() > 10:
        ax.set_yscale("log")
        ax.set_ylim(v.min() / 1.6, v.max() * 1.6)
        log_y(ax)
    else:
        ax.set_ylim(unit_floor, v.max() * 1.15)


def _dodge(k: int, i: int) -> float:
    """Multiplicative x offset (log2 axis) of series i of k, so that equal values stay visible."""
    return 2 ** ((i - (k - 1) / 2) * 0.14)


def _figure_legend(fig, axes) -> None:
    """One legend for the figure, right of the panels, with each label once."""
    seen = {}
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if not label.startswith("_"):
                seen.setdefault(label, handle)
    if seen:
        right = max(ax.get_position().x1 for ax in np.ravel(axes))
        fig.legend(list(seen.values()), list(seen), loc="center left", bbox_to_anchor=(right + 0.005, 0.5), fontsize=7.5)


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
                x = stats.index.to_numpy() * _dodge(len(precs), i)
                ax.vlines(x, stats["min"], stats["max"], color=colors[precision], lw=1.0, zorder=2.5, label=f"_{precision} range")
                marks(ax, x, stats["median"], **style)
            else:
                marks(ax, g["world_size"] * _dodge(len(precs), i), y, **style)
            values += list(y)
        for column, label, style, only in lines:
            # .astype(bool): an empty stage's mask would be an object Series, read as column labels
            g = sub.loc[sub["precision"].map(only).astype(bool)] if only else sub
            curve = g.groupby("world_size")[column].mean().dropna() / MiB
            if not curve.empty:  # one world size: a line of one point draws nothing, so a tick marks it
                one = {"marker": "_", "markersize": 22, "markeredgewidth": style.get("lw", 1.0) + 0.4} if len(curve) == 1 else {}
                ax.plot(curve.index, curve.to_numpy(), label=label, zorder=2, **one, **style)
                values += list(curve)
        _world_size_axis(ax, runs["world_size"].unique())
        ax.set_title(stage)
    axes[0][0].set_ylabel(ylabel)
    for ax in axes[0]:
        _y_range(ax, values)
    fig.subplots_adjust(wspace=0.12)
    _figure_legend(fig, axes)
    note = (f"Up to {most} runs at a point: each point is their median, its bar their range (more than "
            f"{RUNS_PER_POINT} runs at one point are not drawn one by one).") if summarise else None
    return fig, note


def _notes(*notes: str | None) -> str | None:
    return " ".join(n for n in notes if n) or None


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
        return _empty("no ok runs")
    fig, note = _memory_panels(runs, ok, lambda g: g["model_state_bytes_measured"], MODEL_STATE_LINES, "model state per rank (MiB)")
    _not_ok_note(fig, runs)
    return (fig, note) if note else fig


def peak_device_memory(runs: pd.DataFrame):
    """Max allocated device memory of GPU runs; without GPU runs, process peak RSS, with a note saying so."""
    gpu = runs[(runs["status"] == "ok") & runs["peak_mem_allocated_bytes"].notna()]
    if gpu.empty:
        note = "No GPU runs in these results: process peak RSS per rank (CPU; includes the framework, not device memory)."
        data = runs[(runs["status"] == "ok") & runs["peak_rss_bytes"].notna()]
        if data.empty:
            return _empty("no ok runs"), note
        fig, summary = _memory_panels(runs, data, lambda g: g["peak_rss_bytes"], [], "peak RSS per rank (MiB)")
        _not_ok_note(fig, runs)
        return fig, _notes(note, summary)
    colors = precision_colors(precisions(runs))
    fig, note = _memory_panels(runs, gpu, lambda g: g["peak_mem_allocated_bytes"], [
        ("predicted_peak_bytes", f"predicted in-step peak, {p}", {"color": colors[p], "lw": 1.0, "ls": "--"}, lambda x, p=p: x == p)
        for p in precisions(gpu)], "peak allocated per rank (MiB)")
    _not_ok_note(fig, runs)
    return (fig, note) if note else fig


def throughput(runs: pd.DataFrame):
    """Rows: precisions; columns: total tokens/s, tokens/s per device, scaling efficiency; a line per
    stage through the median of each point's repeats, a bar from their lowest to their highest."""
    table = throughput_table(runs)
    if table.empty:
        return _empty("no ok runs")
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
            _world_size_axis(ax, runs["world_size"].unique())
            if column == "scaling_efficiency":
                ax.axhline(1.0, color="grey", lw=0.8, ls=":")
                if not sub[column].notna().any():
                    ax.text(0.5, 0.5, "no world-size-1 run:\nefficiency unknown", transform=ax.transAxes, ha="center",
                            va="center", fontsize=8, color="#666666")
                ax.set_ylim(0, max(1.1, float(np.nanmax(sub[column])) * 1.1) if sub[column].notna().any() else 1.1)
            elif column == "tokens_per_s":
                ax.yaxis.set_major_formatter(FuncFormatter(_si))
                _y_range(ax, sub[column])
            else:
                ax.yaxis.set_major_formatter(FuncFormatter(_si))
                ax.set_ylim(0, float(np.nanmax(sub[column])) * 1.15 if sub[column].notna().any() else 1)
    for ax in axes[:-1].flat:
        ax.set_xlabel("")
    fig.subplots_adjust(wspace=0.3, hspace=0.35)
    _figure_legend(fig, axes)
    _not_ok_note(fig, runs)
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
        _below_axes(fig, " ".join(notes))
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
        _not_ok_note(fig, runs)
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
    _not_ok_note(fig, runs)
    return fig


def loss_scale(runs: pd.DataFrame, steps: pd.DataFrame):
    fp16 = steps[steps["precision"] == "fp16"]
    if fp16.empty:
        return _empty("no fp16 runs in these results")
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
    _not_ok_note(fig, runs[runs["precision"] == "fp16"])
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
        return _empty("no ok runs")
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
    _not_ok_note(fig, runs)
    return fig


# Pipeline parallelism: the bubble against micro-batches, and one traced step's timeline per stage.

PIPELINE_LINESTYLES = ["-", "--", ":", "-."]
KIND_COLORS = {"F": PALETTE[0], "B": PALETTE[1]}
KIND_NAMES = {"F": "forward (F)", "B": "backward (B)"}


def pipeline_bubble(runs: pd.DataFrame):
    """The measured bubble of each ok pipeline run against its micro-batches per step (a colour per schedule, a marker
    per degree P), with the formula's curve per P and chunks per rank V from P micro-batches up; (figure, note): the
    measured bubble's ratio to the formula, and on a CPU what the formula leaves out."""
    from scalelab.formulas.pipeline import SCHEDULES, bubble_fraction

    table = pipeline_bubbles(runs)
    if table.empty:
        return _empty("no ok pipeline run measured its bubble")
    schedules = sorted(table["schedule"].unique(), key=lambda s: (list(SCHEDULES).index(s) if s in SCHEDULES else len(SCHEDULES), s))
    degrees = sorted(table["pp"].unique())
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    series = list(table.groupby(["schedule", "pp"], sort=False))
    for i, ((schedule, pp), g) in enumerate(series):  # side by side around their m, so that equal values stay visible
        marks(ax, g["m"] * _dodge(len(series), i), g["measured"], size=30, color=PALETTE[schedules.index(schedule) % len(PALETTE)],
              marker=STAGE_MARKERS[degrees.index(pp) % len(STAGE_MARKERS)], edgecolor="white", edgewidth=0.4, zorder=3,
              label=f"measured: {schedule}, P {pp}")
    timed = table[table["stage_times"].notna()]
    if len(timed):  # what the stages' own compute leaves idle with free sends: the imbalance, without the sends
        ax.scatter(timed["m"], timed["stage_times"], s=30, facecolors="none", edgecolors="black", linewidths=0.8, zorder=3,
                   label="from the stages' own times (free sends)")
    top = max(int(table["m"].max()), 2 * int(max(degrees)))
    curves = []
    for (pp, v), g in table.groupby(["pp", "chunks_per_rank"]):
        m = np.arange(int(pp), top + 1)  # from the fewest micro-batches that fill the pipeline
        y = np.array([bubble_fraction(int(pp), int(k), g["schedule"].iloc[0]) for k in m])
        named = ", ".join(s for s in schedules if s in set(g["schedule"]))
        ax.plot(m, y, color="black" if v == 1 else "grey", lw=1.0, ls=PIPELINE_LINESTYLES[degrees.index(pp) % len(PIPELINE_LINESTYLES)],
                zorder=2, label=f"formula: P {pp}, V {v} ({named})")
        curves += list(y)
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(k) for k in table["m"]) | {top})
    ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(int(min(degrees)), int(table["m"].min())) / 2 ** 0.5, top * 2 ** 0.5)
    ax.set_ylim(0, min(1.0, max(float(table["measured"].max()), max(curves)) * 1.15))
    ax.set(xlabel="micro-batches per step m (log2)", ylabel="bubble (share of the step idle)",
           title="pipeline bubble: measured (points) and (P − 1)/(V m + P − 1) (lines)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    _not_ok_note(fig, runs[pipeline_rows(runs)])
    return fig, _bubble_note(table)


def _bubble_note(table: pd.DataFrame) -> str:
    """The measured bubble against the formula's, as the runs say it (median and range of the ratio), and on a CPU
    what the measurement holds that the formula leaves out."""
    ratio = (table["measured"] / table["formula"]).replace([np.inf, -np.inf], np.nan).dropna()
    n = len(table)
    note = (f"Measured over the formula: {ratio.median():.2f}× (median of {len(ratio)} run{'s' if len(ratio) != 1 else ''}"
            + (f", {ratio.min():.2f}× to {ratio.max():.2f}×)." if len(ratio) > 1 else ").")) if len(ratio) else ""
    timed = table[table["stage_times"].notna()]
    if len(timed):
        gap = timed["measured"] - timed["formula"]
        share = ((timed["stage_times"] - timed["formula"]) / gap).where(gap > 0).dropna()
        note += (f" The stages' own times (hollow points: their compute, sends free) leave {timed['stage_times'].median():.0%} "
                 f"idle at the median against the formula's {timed['formula'].median():.0%}"
                 + (f": their unequal work explains {share.median():.0%} of the gap at the median, the sends and the "
                    "schedule's own work the rest." if len(share) else "."))
    cpu = table[table["device_type"] == "cpu"]
    if len(cpu):
        share = "These runs" if len(cpu) == n else f"{len(cpu)} of these {n} runs"
        note += (f" {share} trained on a CPU: their measured bubble also holds the waits for gloo's point-to-point "
                 "sends, the stages' unequal work (the last stage also computes the head and the loss) and ranks sharing "
                 "the machine's cores, which the formula leaves out; it is not a test of the formula there.")
    return note.strip()


def read_timeline(path: Path) -> dict | None:
    """A run's traced step (TIMELINE_FILE): {"schedule", "microbatches", "stages": [{"pp_rank", "intervals": [{"kind",
    "chunk", "microbatch", "start_s", "end_s"}]}]}; None where the file is missing or does not read as one."""
    import json

    try:
        record = json.loads(Path(path).read_text())
        stages = record["stages"]
        for stage in stages:
            int(stage["pp_rank"])
            for i in stage["intervals"]:
                int(i["chunk"]), int(i["microbatch"])
                if i["kind"] not in KIND_COLORS or not float(i["end_s"]) >= float(i["start_s"]):
                    raise ValueError(f"interval {i}")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if stages else None


def pipeline_timeline(runs: pd.DataFrame, results_dir: Path | None):
    """One traced step of one pipeline run (timeline_candidates' first whose folder holds TIMELINE_FILE): a row per
    stage, its forwards and backwards as bars numbered by micro-batch, idle time as gaps; (figure, note)."""
    candidates = timeline_candidates(runs)
    if candidates.empty:
        return _empty("no ok pipeline run")
    if results_dir is None:
        return _empty("no results folder given: the run folders holding the pipeline timelines were not read"), None
    skipped = []
    for row in candidates.itertuples():
        record = read_timeline(Path(results_dir) / "runs" / row.folder / TIMELINE_FILE)
        if record is not None:
            break
        skipped.append(row.run_id)
    else:
        return (_empty(f"no pipeline timeline to draw: no run folder holds a readable {TIMELINE_FILE} (results copied "
                       "without their run folders, or runs from before the timeline was written)"),
                f"Looked in runs/<run>/{TIMELINE_FILE} of {len(candidates)} ok pipeline run(s).")
    fig = _timeline_figure(row, record)
    note = f"The traced step of {row.run_id} (runs/{row.folder}/{TIMELINE_FILE})."
    if skipped:
        note += f" Before it, no readable timeline in the folder of {', '.join(map(str, skipped[:6]))}" + (
            f" (+{len(skipped) - 6})" if len(skipped) > 6 else "") + "."
    return fig, note


def _timeline_figure(row, record: dict):
    """The bars of one traced step: a row per stage (stage 0 on top), a container per kind and chunk of the rank."""
    stages = sorted(record["stages"], key=lambda s: int(s["pp_rank"]))
    pp = len(stages)
    intervals = [(k, i) for k, s in enumerate(stages) for i in s["intervals"]]
    t0 = min((float(i["start_s"]) for _, i in intervals), default=0.0)
    end = max((float(i["end_s"]) for _, i in intervals), default=0.0)
    per_rank = max((int(i["chunk"]) // pp for _, i in intervals), default=0) + 1  # V: the chunks each rank runs
    fig, ax = plt.subplots(figsize=(9.5, 0.9 + 0.5 * pp))
    ax.barh(range(pp), [(end - t0) * 1e3] * pp, left=0, height=0.8, color="#f1f1f1", lw=0, zorder=1, label="idle (no forward or backward)")
    busiest = max((len(s["intervals"]) for s in stages), default=1)
    size = 6.5 if busiest <= 24 else 5.5 if busiest <= 48 else 4.5
    for kind in ("F", "B"):
        for k in range(per_rank):
            mine = [(row_, i) for row_, i in intervals if i["kind"] == kind and int(i["chunk"]) // pp == k]
            if not mine:
                continue
            label = KIND_NAMES[kind] + (f", the rank's chunk {k + 1} of {per_rank}" if per_rank > 1 else "")
            bars = ax.barh([r for r, _ in mine], [(float(i["end_s"]) - float(i["start_s"])) * 1e3 for _, i in mine],
                           left=[(float(i["start_s"]) - t0) * 1e3 for _, i in mine], height=0.6, color=KIND_COLORS[kind],
                           alpha=1.0 if k == 0 else 0.6, hatch=None if k == 0 else "///", edgecolor="white", lw=0.4,
                           zorder=2, label=label)
            for bar, (_, i) in zip(bars, mine):
                ax.text(bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height() / 2, str(i["microbatch"]),
                        ha="center", va="center", fontsize=size, color="white", zorder=3, clip_on=True)
    measured = getattr(row, "bubble_fraction_measured_per_stage", None)
    measured = list(measured) if measured is not None and not isinstance(measured, float) else []
    labels = [f"stage {int(s['pp_rank'])}" + (f"\nbubble {measured[k]:.2f}" if k < len(measured) and measured[k] is not None
                                               and pd.notna(measured[k]) else "") for k, s in enumerate(stages)]
    ax.set_yticks(range(pp), labels)
    ax.set_ylim(pp - 0.5, -0.5)  # stage 0 on top
    ax.set_xlim(0, (end - t0) * 1e3 * 1.01 or 1)
    ax.grid(axis="y", visible=False)
    ax.set(xlabel="time in the step (ms, from the earliest stage's start of it)",
           title=f"{row.run_id}: {record.get('schedule', '?')}, P {pp}, {record.get('microbatches', '?')} micro-batches "
                 "(numbered on the bars), one traced step")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
