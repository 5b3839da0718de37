"""The report's predicted-against-measured figure (scalelab.results.prediction's step-time model)."""
from __future__ import annotations

import numpy as np

from scalelab.results.prediction import outside_band
from scalelab.results.step_model import MEASURED


def predicted_vs_measured_plot(runs):
    """The report's figure: predicted against measured step time per run (log-log), the band as a
    bar, colour by precision, marker by ZeRO stage, filled where the prediction is out of sample;
    (figure, note) with the runs left out and why."""
    import matplotlib.pyplot as plt

    from scalelab.report import plot_style

    ok = runs[runs["status"] == "ok"]
    known = ok[ok["predicted_step_time_s"].notna()] if "predicted_step_time_s" in ok else ok.iloc[:0]
    if known.empty:
        reasons = sorted(set(ok.get("prediction_note", runs.iloc[:0]).dropna()))
        return plot_style.empty_figure("no step-time prediction" + (f": {reasons[0]}" if reasons else "")), None
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    colors = plot_style.precision_colors(sorted(known["precision"].unique()))
    for r in known.itertuples():
        m, p = getattr(r, MEASURED) * 1e3, r.predicted_step_time_s * 1e3
        in_sample = str(r.prediction_note).startswith("in-sample")
        color = colors[r.precision]
        ax.plot([m, m], [r.predicted_step_time_s_low * 1e3, r.predicted_step_time_s_high * 1e3], color=color, lw=0.8, alpha=0.6)
        plot_style.marks(ax, [m], [p], size=28, color="white" if in_sample else color, edgecolor=color,
                    marker=plot_style.STAGE_MARKERS[int(r.zero_stage) % len(plot_style.STAGE_MARKERS)])
    values = np.concatenate([known[MEASURED], known["predicted_step_time_s_low"], known["predicted_step_time_s_high"]]) * 1e3
    lo, hi = np.nanmin(values[values > 0]) / 1.3, np.nanmax(values) * 1.3
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls="--", zorder=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured step time, ms ({MEASURED})")
    ax.set_ylabel("predicted step time, ms (bar: band)")
    handles = [plt.Line2D([], [], ls="none", marker="o", color=c, label=p) for p, c in colors.items()]
    handles += [plt.Line2D([], [], ls="none", marker=plot_style.STAGE_MARKERS[s % len(plot_style.STAGE_MARKERS)], color="grey",
                           label=f"stage {s}") for s in sorted(known["zero_stage"].astype(int).unique())]
    handles += [plt.Line2D([], [], ls="none", marker="o", color="grey", mfc="white", label="in-sample (own reference)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1))
    outside = outside_band(known)
    missing = ok[ok["predicted_step_time_s"].isna()]
    notes = []
    if len(outside):
        notes.append(f"outside their band: {', '.join(outside['run_id'].astype(str).head(8))}"
                     + (f" (+{len(outside) - 8})" if len(outside) > 8 else ""))
    if len(missing):
        notes.append(f"not predicted: {', '.join(missing['run_id'].astype(str).head(6))}: {missing['prediction_note'].iloc[0]}")
    return fig, "; ".join(notes) or None
