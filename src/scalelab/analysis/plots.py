"""Plots from the result tables alone (metrics.parquet, steps.parquet), with seaborn.

Each function takes the run table (and steps where needed) and returns the matplotlib
figure, or (figure, note) where the figure shows something other than usual (the note
follows the caption). Names, captions and file formats are declared once, in
scalelab.analysis.figures, which saves the figures with `save`. Runs that did not finish
`ok` are never silent gaps: every figure lists them, and the heatmap marks their cells.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

PRECISION_ORDER = ["fp32", "fp16", "bf16", "fp8"]
MiB = 2 ** 20


def save(fig, out_dir: Path, name: str, formats: tuple[str, ...]) -> list[str]:
    """Write fig as <name>.<format> for each format (PNG at 90 dpi), close it, return the file names."""
    files = [f"{name}.{fmt}" for fmt in formats]
    for file, fmt in zip(files, formats):
        fig.savefig(out_dir / file, bbox_inches="tight", **({"dpi": 90} if fmt == "png" else {}))
    plt.close(fig)
    return files


def use_theme() -> None:
    sns.set_theme(style="whitegrid", context="paper")


def _not_ok_note(fig, runs: pd.DataFrame) -> None:
    """Name the runs missing from a figure because they did not finish ok."""
    bad = runs[runs["status"] != "ok"]
    if bad.empty:
        return
    shown = ", ".join(f"{r.run_id}: {r.status}" for r in bad.head(12).itertuples())
    more = f" (+{len(bad) - 12} more)" if len(bad) > 12 else ""
    fig.text(0.01, -0.02, f"not ok, not plotted: {shown}{more}", fontsize=8, color="firebrick", ha="left", va="top",
             wrap=True)


def _precisions(df: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(df["precision"]))
    return [p for p in PRECISION_ORDER if p in present] + [p for p in present if p not in PRECISION_ORDER]


def _empty(message: str):
    fig, ax = plt.subplots(figsize=(6, 1.5))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center")
    return fig


def model_state_memory(runs: pd.DataFrame):
    ok = runs[runs["status"] == "ok"]
    if ok.empty:
        return _empty("no ok runs")
    stages = sorted(runs["zero_stage"].unique())
    fig, axes = plt.subplots(1, len(stages), figsize=(3.6 * len(stages), 3.4), sharey=True, squeeze=False)
    palette = dict(zip(_precisions(runs), sns.color_palette("deep")))
    for ax, stage in zip(axes[0], stages):
        sub = ok[ok["zero_stage"] == stage]
        pred = (sub.groupby(["precision", "world_size"], as_index=False)
                [["model_state_bytes_predicted", "model_state_bytes_predicted_paper"]].mean())
        for precision, g in pred.groupby("precision"):
            g = g.sort_values("world_size")
            ax.plot(g["world_size"], g["model_state_bytes_predicted"] / MiB, "-", color=palette[precision], alpha=0.6)
            ax.plot(g["world_size"], g["model_state_bytes_predicted_paper"] / MiB, "--", color=palette[precision], alpha=0.4)
        sns.scatterplot(data=sub.assign(mib=sub["model_state_bytes_measured"] / MiB), x="world_size", y="mib",
                        hue="precision", palette=palette, ax=ax, s=50, legend=ax is axes[0][0])
        ax.set(title=f"stage {stage}", xlabel="world size", ylabel="model state per rank (MiB)")
        ax.set_xticks(sorted(runs["world_size"].unique()))
    _not_ok_note(fig, runs)
    return fig


def peak_device_memory(runs: pd.DataFrame):
    """Max allocated device memory of GPU runs; without GPU runs, process peak RSS, with a note saying so."""
    gpu = runs[(runs["status"] == "ok") & runs["peak_mem_allocated_bytes"].notna()]
    if gpu.empty:
        note = "No GPU runs in these results: process peak RSS per rank (CPU; includes the framework, not device memory)."
        data = runs[(runs["status"] == "ok") & runs["peak_rss_bytes"].notna()]
        if data.empty:
            return _empty("no ok runs"), note
        g = sns.catplot(data=data.assign(mib=data["peak_rss_bytes"] / MiB), x="world_size", y="mib", hue="precision",
                        col="zero_stage", kind="point", hue_order=_precisions(data), height=3.2, aspect=0.9, errorbar=None)
        g.set_axis_labels("world size", "peak RSS per rank (MiB)")
        _not_ok_note(g.figure, runs)
        return g.figure, note
    stages = sorted(gpu["zero_stage"].unique())
    fig, axes = plt.subplots(1, len(stages), figsize=(3.6 * len(stages), 3.4), sharey=True, squeeze=False)
    palette = dict(zip(_precisions(runs), sns.color_palette("deep")))
    for ax, stage in zip(axes[0], stages):
        sub = gpu[gpu["zero_stage"] == stage]
        pred = sub.groupby(["precision", "world_size"], as_index=False)["predicted_peak_bytes"].mean()
        for precision, p in pred.groupby("precision"):
            p = p.sort_values("world_size")
            ax.plot(p["world_size"], p["predicted_peak_bytes"] / MiB, "--", color=palette[precision], alpha=0.7)
        sns.scatterplot(data=sub.assign(mib=sub["peak_mem_allocated_bytes"] / MiB), x="world_size", y="mib",
                        hue="precision", palette=palette, ax=ax, s=50, legend=ax is axes[0][0])
        ax.set(title=f"stage {stage}", xlabel="world size", ylabel="peak allocated per rank (MiB)")
    _not_ok_note(fig, runs)
    return fig


def scaling_efficiency(runs: pd.DataFrame) -> pd.Series:
    """tokens/s at N over N x tokens/s at world size 1, same precision and stage."""
    ok = runs[runs["status"] == "ok"]
    base = ok[ok["world_size"] == 1].groupby(["precision", "zero_stage"])["tokens_per_s"].mean()
    key = pd.MultiIndex.from_frame(runs[["precision", "zero_stage"]])
    ref = base.reindex(key).to_numpy()
    return pd.Series(runs["tokens_per_s"].to_numpy() / (runs["world_size"].to_numpy() * ref), index=runs.index)


def throughput(runs: pd.DataFrame):
    ok = runs[runs["status"] == "ok"].copy()
    if ok.empty:
        return _empty("no ok runs")
    ok["scaling_efficiency"] = scaling_efficiency(ok)
    long = ok.melt(id_vars=["precision", "zero_stage", "world_size"], value_vars=["tokens_per_s", "scaling_efficiency"])
    g = sns.relplot(data=long, x="world_size", y="value", hue="precision", col="zero_stage", row="variable",
                    kind="line", marker="o", hue_order=_precisions(ok), height=2.8, aspect=1.0,
                    facet_kws={"sharey": "row"}, errorbar=None)
    g.set_titles("{row_name} | stage {col_name}")
    g.set_axis_labels("world size", "")
    _not_ok_note(g.figure, runs)
    return g.figure


def mfu_heatmap(runs: pd.DataFrame):
    sizes = sorted(runs["world_size"].unique())
    precisions, stages = _precisions(runs), sorted(runs["zero_stage"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.2 * len(sizes) + 1, 0.6 * len(precisions) + 1.6), squeeze=False)
    for ax, ws in zip(axes[0], sizes):
        sub = runs[runs["world_size"] == ws]
        grid = sub.pivot_table(index="precision", columns="zero_stage", values="mfu", aggfunc="mean").reindex(index=precisions, columns=stages)
        status = sub.groupby(["precision", "zero_stage"])["status"].agg(lambda s: s.iloc[0] if (s != "ok").all() else "ok")
        labels = np.empty(grid.shape, dtype=object)
        for i, p in enumerate(precisions):
            for j, z in enumerate(stages):
                st, v = status.get((p, z)), grid.iloc[i, j]
                labels[i, j] = "not run" if st is None else (st if st != "ok" else (f"{v:.3f}" if pd.notna(v) else "n/a"))
        sns.heatmap(grid.astype(float), annot=labels, fmt="", cmap="viridis", ax=ax, cbar=False,
                    linewidths=0.5, linecolor="white")
        ax.set_facecolor("#f4cccc")  # non-ok / missing cells show through in red
        ax.set(title=f"world size {ws}", xlabel="ZeRO stage", ylabel="precision")
    return fig


def loss_curves(runs: pd.DataFrame, steps: pd.DataFrame):
    ok_ids = set(runs.loc[runs["status"] == "ok", "run_id"])
    st = steps[steps["run_id"].isin(ok_ids)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    if st.empty:
        left.text(0.5, 0.5, "no ok runs", ha="center")
    else:
        mean = st.groupby(["precision", "step"])["loss"].mean()
        for i, precision in enumerate(_precisions(st)):
            curve = mean.loc[precision]
            left.plot(curve.index, curve.to_numpy(), label=precision, color=f"C{i}", lw=1.2)
        left.legend(title="precision")
        left.set(title="loss per precision", xlabel="step", ylabel="loss")
        dev = loss_deviation_vs_stage0(st)
        if not dev.empty:
            sns.barplot(data=dev, x="zero_stage", y="max_abs_dloss", hue="precision", hue_order=_precisions(dev), ax=right, errorbar=None)
            right.set_yscale("symlog", linthresh=1e-7)
        right.set(title="largest |Δloss| vs stage 0", xlabel="ZeRO stage", ylabel="max |Δloss|")
    _not_ok_note(fig, runs)
    return fig


def loss_deviation_vs_stage0(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (precision, world size, stage): the largest |loss - loss(stage 0)| over steps."""
    key = ["precision", "world_size", "step"]
    # One stage-0 reference per key (the mean if several stage-0 runs share it), so the
    # merge stays one-to-many.
    base = steps[steps["zero_stage"] == 0].groupby(key, as_index=False)["loss"].mean().rename(columns={"loss": "loss0"})
    merged = steps[key + ["zero_stage", "loss"]].merge(base, on=key)
    merged["dloss"] = (merged["loss"] - merged["loss0"]).abs()
    return merged.groupby(["precision", "world_size", "zero_stage"], as_index=False)["dloss"].max().rename(columns={"dloss": "max_abs_dloss"})


def loss_scale(runs: pd.DataFrame, steps: pd.DataFrame):
    fp16 = steps[steps["precision"] == "fp16"]
    if fp16.empty:
        return _empty("no fp16 runs in these results")
    agg = fp16.groupby("step").agg(median=("loss_scale", "median"), lo=("loss_scale", "min"), hi=("loss_scale", "max"),
                                    skipped=("skipped", "sum"))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot(agg.index, agg["median"], color="C1", label="median")
    top.fill_between(agg.index, agg["lo"], agg["hi"], color="C1", alpha=0.25, label="min-max")
    top.set(yscale="log", ylabel="loss scale", title=f"fp16 loss scale ({fp16['run_id'].nunique()} runs)")
    top.legend()
    bottom.bar(agg.index, agg["skipped"], color="firebrick")
    bottom.set(xlabel="step", ylabel="skipped")
    _not_ok_note(fig, runs[runs["precision"] == "fp16"])
    return fig


def communication(runs: pd.DataFrame):
    ok = runs[runs["status"] == "ok"]
    if ok.empty:
        return _empty("no ok runs")
    agg = ok.groupby(["zero_stage", "world_size"], as_index=False)[
        ["comm_bytes_per_step_measured", "comm_bytes_per_step_predicted", "comm_bytes_per_step_predicted_paper"]].mean()
    agg["label"] = "z" + agg["zero_stage"].astype(str) + " w" + agg["world_size"].astype(str)
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(agg) + 2), 3.6))
    x = np.arange(len(agg))
    ax.bar(x, agg["comm_bytes_per_step_measured"] / MiB, color="C0", label="measured")
    ax.scatter(x, agg["comm_bytes_per_step_predicted"] / MiB, marker="_", s=400, color="black", label="predicted (PyTorch)", zorder=3)
    ax.scatter(x, agg["comm_bytes_per_step_predicted_paper"] / MiB, marker="_", s=400, color="grey", label="predicted (paper)", zorder=3)
    ax.set_xticks(x, agg["label"], rotation=45)
    ax.set(ylabel="MiB per step", xlabel="stage, world size")
    ax.legend(fontsize=8)
    _not_ok_note(fig, runs)
    return fig
