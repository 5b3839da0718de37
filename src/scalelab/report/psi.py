"""The memory-vs-Psi figure: model state per rank against the parameter count, per world size.

Measured points are the full-training runs (LoRA rows are levers, outside the main figures'
baseline), one per model shape of the sweep's ``model`` axis, stage, precision. The lines are
the ZeRO formulas over Psi (in MiB, as every memory figure), for the stages the sweep ran: PyTorch's at-rest split (solid: 16 Psi, 8 Psi + 8 Psi/N, 16 Psi/N,
16 Psi/N) and the paper's mixed precision (dashed: 16 Psi, 4 Psi + 12 Psi/N, 2 Psi + 14 Psi/N,
16 Psi/N). Where a run records a device budget (``planning.device_memory_gib``, or the GPU's
own memory: ``device_memory_bytes``), the budget is a horizontal line and each stage's largest
Psi whose model state fits it is marked on the x axis: predicted (PyTorch's line, a tick) and,
on GPU runs, measured (the measured bytes per parameter extrapolated, a cross).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from scalelab.formulas import model_state
from scalelab.registries.strategies import ZERO_STAGES
from scalelab.report.plot_style import dodge, log_x, log_y, marks
from scalelab.report.tables import MiB

STAGES = ZERO_STAGES  # every strategy record of scalelab.registries.strategies: a line (and a colour) each
LINE_PRECISION = "bf16"
"""The precision of the formula lines: the paper's mixed-precision convention (PyTorch's lines are
the same in every precision)."""
PANELS_PER_ROW = 4
PSI_COLUMNS = ("world_size", "zero_stage", "n_params", "model_state_bytes_measured", "device_memory_bytes",
               "peak_mem_allocated_bytes")


def memory_vs_psi(runs: pd.DataFrame):
    """The figure (the module's doc), with its notes where it has any."""
    ok = runs[(runs["status"] == "ok") & runs["model_state_bytes_measured"].notna()]
    if "lora_rank" in ok:
        ok = ok[ok["lora_rank"].isna()]
    if ok.empty:
        fig, ax = plt.subplots(figsize=(6, 1.5))
        ax.axis("off")
        ax.text(0.5, 0.5, "no ok full-training runs", ha="center", va="center")
        return fig
    ok = ok[[c for c in PSI_COLUMNS if c in ok]]  # a narrow copy: the panels filter it a hundred times
    sizes = sorted(ok["world_size"].unique())
    fig, grid, axes = _panels(len(sizes))
    colors = dict(zip(STAGES, sns.color_palette("deep")))
    swept = [s for s in STAGES if s in set(ok["zero_stage"])]  # lines only for the stages the sweep ran
    notes = []
    # One model shape: every stage's dot sits at the one Psi, where equal model states (every stage
    # at world size 1) drew one dot; each stage's is set a little apart, as the world-size figures do.
    one_model = ok["n_params"].nunique() == 1
    if one_model:
        notes.append(f"one model shape ({ok['n_params'].iloc[0]:,} parameters): its dots are set slightly apart per stage "
                     "so that equal ones stay visible; the lines extrapolate the formulas to other sizes")
    for ax, n in zip(axes, sizes):
        notes += _world_size_panel(ax, ok[ok["world_size"] == n], n, swept, colors, one_model)
    for ax in grid[:, 0]:
        ax.set_ylabel("model state per rank (MiB)")
    for ax in axes:  # after every panel is drawn: the y axis is shared
        log_y(ax)
    axes[0].legend(fontsize=7, title="solid: PyTorch, dashed: paper", title_fontsize=7)
    return (fig, "; ".join(notes)) if notes else fig


def _panels(n_panels: int):
    """The figure, its grid of axes and the axes in use: one panel per world size."""
    # At most PANELS_PER_ROW panels side by side: a sweep of 8 world sizes in one row made a figure
    # 35 inches wide, which the report shrinks to illegible.
    cols = min(PANELS_PER_ROW, n_panels)
    rows = -(-n_panels // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.8 * rows), sharey=True, squeeze=False)
    for ax in grid.flat[n_panels:]:  # the last row's empty places
        fig.delaxes(ax)
    if rows > 1:
        fig.subplots_adjust(hspace=0.45)
    return fig, grid, list(grid.flat[:n_panels])


def _world_size_panel(ax, sub: pd.DataFrame, n, swept: list, colors: dict, one_model: bool) -> list[str]:
    """One world size's panel: each swept stage's formula lines and measured dots, and the device budget with
    the largest model that fits it; returns the panel's notes."""
    notes = []
    budget = sub["device_memory_bytes"].dropna().min() if "device_memory_bytes" in sub else np.nan
    lo, hi = sub["n_params"].min() / 4, sub["n_params"].max() * 4
    fits = {s: model_state.largest_model(budget, s, int(n), LINE_PRECISION, "pytorch") for s in swept} if budget > 0 else {}
    if fits:
        hi = max(hi, max(fits.values()) * 2)
    psi = np.geomspace(lo, hi, 50)
    for stage in swept:
        # In MiB as every other memory figure; the paper's dashed line over PyTorch's solid one
        # (where they coincide, at stage 0 and 3, the dashes stay visible on it).
        for convention, style, z in (("pytorch", "-", 1.5), ("paper", "--", 2.0)):
            slope = model_state.bytes_per_param_per_rank(stage, int(n), LINE_PRECISION, convention)
            ax.plot(psi, slope * psi / MiB, style, color=colors[stage], alpha=0.55 if style == "-" else 0.95,
                    lw=1.2 if style == "-" else 1.4, zorder=z, label=f"stage {stage}" if convention == "pytorch" else None)
        runs_s = sub[sub["zero_stage"] == stage]
        x = runs_s["n_params"] * (dodge(len(swept), swept.index(stage)) if one_model else 1.0)
        marks(ax, x, runs_s["model_state_bytes_measured"] / MiB, color=colors[stage], size=30,
              edgecolor="black", edgewidth=0.5, zorder=3)
        if stage in fits:
            ax.axvline(fits[stage], color=colors[stage], linestyle=":", alpha=0.8)
            gpu = runs_s[runs_s.get("peak_mem_allocated_bytes", pd.Series(dtype=float)).notna()]
            if not gpu.empty:  # measured bytes per parameter, extrapolated to the budget
                measured_fit = budget / (gpu["model_state_bytes_measured"] / gpu["n_params"]).max()
                ax.plot([measured_fit], [budget / MiB], "x", color=colors[stage], markersize=9, mew=2, zorder=4)
            notes.append(f"N={n} stage {stage}: fits up to {fits[stage] / 1e9:.3g}B params (predicted)")
    if fits:
        ax.axhline(budget / MiB, color="black", linewidth=1)
    ax.set(title=f"world size {n}", xlabel="parameters Ψ")
    log_x(ax)
    return notes
