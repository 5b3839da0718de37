"""The figures' common look and drawing helpers: fixed colours and markers per precision, stage and strategy, the
theme, saving a figure (padded, then cropped), points drawn as one line, log axes with plain tick labels, the
world-size axis, one legend per figure, and the notes drawn under a figure (the runs not plotted, a reason to
draw nothing)."""

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402

from scalelab.report.tables import (  # noqa: E402
    PRECISION_ORDER,
    pruned_rows,
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


def not_ok_note(fig, runs: pd.DataFrame) -> None:
    """Name the runs missing from a figure because they did not finish ok."""
    bad = runs.loc[(runs["status"] != "ok") & ~pruned_rows(runs), ["run_id", "status"]]  # a pruned point: a decision
    if bad.empty:
        return
    shown = ", ".join(f"{r.run_id}: {r.status}" for r in bad.head(12).itertuples())
    more = f" (+{len(bad) - 12} more)" if len(bad) > 12 else ""
    note_below_axes(fig, f"not ok, not plotted: {shown}{more}", color="firebrick")


def note_below_axes(fig, text: str, **kwargs) -> None:
    """A note under the lowest x-axis label (never on top of it), wrapped to the figure's width."""
    import textwrap

    axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    lowest = min(axes or fig.axes, key=lambda ax: ax.get_position().y0)
    width = max(40, int(fig.get_figwidth() * 15))
    lowest.annotate("\n".join(textwrap.wrap(text, width)), xy=(0.01, 0), xycoords=("figure fraction", lowest.xaxis.label),
                    xytext=(0, -6), textcoords="offset points", ha="left", va="top", fontsize=7.5, annotation_clip=False,
                    **kwargs)


def empty_figure(message: str):
    """A figure that says why there is nothing to draw: wrapped to its width, so that a long reason
    (a run's prediction note) reads whole instead of running off both edges."""
    import textwrap

    lines = textwrap.wrap(message, width=90) or [""]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.22 * len(lines)))
    ax.axis("off")
    ax.text(0.0, 0.5, "\n".join(lines), ha="left", va="center", fontsize=9)
    return fig


def world_size_axis(ax, sizes) -> None:
    """A log2 axis ticked at the world sizes run (1, 2, 4, ...), labelled as integers."""
    sizes = sorted({int(s) for s in sizes})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.xaxis.set_minor_locator(NullLocator())
    lo, hi = min(sizes), max(sizes)
    ax.set_xlim(lo / 2 ** 0.5, hi * 2 ** 0.5)
    ax.set_xlabel("world size (ranks, log2)")


def si_label(value, _pos=None) -> str:
    """Tick labels in plain numbers: 3.5k, 120k, 1.2M."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:g}{suffix}"
    return f"{value:g}"


def sci_label(value, _pos=None) -> str:
    """Log-axis tick labels as plain text (1e-04, 0.01, 10, 1k): mathtext is slow and heavy."""
    if value == 0:
        return "0"
    if 1e-2 <= abs(value) < 1e4:
        return si_label(value) if abs(value) >= 1 else f"{value:g}"
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
    axis.set_major_formatter(FuncFormatter(sci_label))
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
    ax.yaxis.set_major_formatter(FuncFormatter(sci_label))
    ax.yaxis.set_minor_locator(NullLocator())


def y_range(ax, values, unit_floor: float = 0.0) -> None:
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


def dodge(k: int, i: int) -> float:
    """Multiplicative x offset (log2 axis) of series i of k, so that equal values stay visible."""
    return 2 ** ((i - (k - 1) / 2) * 0.14)


def figure_legend(fig, axes) -> None:
    """One legend for the figure, right of the panels, with each label once."""
    seen = {}
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if not label.startswith("_"):
                seen.setdefault(label, handle)
    if seen:
        right = max(ax.get_position().x1 for ax in np.ravel(axes))
        fig.legend(list(seen.values()), list(seen), loc="center left", bbox_to_anchor=(right + 0.005, 0.5), fontsize=7.5)



def join_notes(*notes: str | None) -> str | None:
    return " ".join(n for n in notes if n) or None
