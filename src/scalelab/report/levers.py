"""The levers in the report: baseline rows, variant-vs-baseline pairs, one figure per lever.

A lever is an optional sweep axis (scalelab.planning.sweep.LEVER_AXES: micro-batch size, activation
checkpointing, CPU offload, DDP bucket size, torch.compile, LoRA, gradient reductions in the
compute dtype; fp8 is a precision). The main figures use *baseline* rows (every lever at
its default) so that they compare precision x stage x world size alone. Each run with a
lever away from its default is paired with the baseline run that differs only in that lever,
and the pair's measured ratios are set against the formulas: PAIR_COLUMNS for every lever, and
each lever's own evidence in EVIDENCE. The lever figures' names, captions and when each is drawn
are declared in scalelab.report.figures.
"""
from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, NullLocator

from scalelab.planning.sweep import AXIS, LEVER_AXES, SWEEP_AXES
from scalelab.registries.precisions import PRECISIONS
from scalelab.registries.strategies import strategy
from scalelab.report.plot_style import log_y, marks, si_label
from scalelab.report.tables import MiB, device_peak_bytes


def _is_default(runs: pd.DataFrame) -> dict[str, pd.Series]:
    """Per lever: which rows have it at its default (each axis's own rule)."""
    return {name: AXIS[name].is_default(runs) for name in LEVER_AXES}


def baseline(runs: pd.DataFrame, strategies: bool = False) -> pd.DataFrame:
    """Rows with every lever at its default. A lever no row has at its default (a sweep that
    lists only other values) does not filter. ``strategies``: hybrid sharding's replicas too (a
    strategy of its own, which the main figures draw beside its ZeRO-3 twin)."""
    keep = pd.Series(True, index=runs.index)
    for lever, is_default in _is_default(runs).items():
        if strategies and lever == "replicas":
            continue
        if is_default.any():
            keep &= is_default
    return runs[keep]


def _others_at_default(runs: pd.DataFrame, lever: str, defaults: dict[str, pd.Series] | None = None) -> pd.Series:
    """Which rows have every lever but `lever` (and those it runs beside, Axis.beside and theirs in turn: a variant
    and its twin share them; a pipeline schedule runs beside a pipeline, which runs beside a micro-batch) at its default
    (defaults: _is_default(runs), if known)."""
    chain = [lever]
    while AXIS[chain[-1]].beside:
        chain.append(AXIS[chain[-1]].beside)
    others = [v for k, v in (defaults or _is_default(runs)).items() if k not in chain]
    return pd.concat(others, axis=1).all(axis=1) if others and not runs.empty else pd.Series(True, index=runs.index)


def _paired(runs: pd.DataFrame, lever: str, defaults: dict[str, pd.Series]) -> pd.DataFrame:
    """Rows away from the default in `lever` only, joined to their baseline twin (suffix _base).
    defaults: _is_default of the runs."""
    at_default, rest = defaults[lever], _others_at_default(runs, lever, defaults)
    variants, bases = runs[~at_default & rest], runs[at_default & rest]
    if variants.empty or bases.empty:
        return pd.DataFrame()
    # Every other axis equal: the main ones (precision, stage, world size, model) and the other levers,
    # whose default may take more than one value (bucket_mb: 25 under DDP, none under FSDP2).
    key = [a for a in SWEEP_AXES if a != lever and a in runs]
    if lever == "tensor_parallel":
        # a split run's micro-batch is its data-parallel rank's share (T times its twin's), and it has no DDP buckets
        key = [a for a in key if a not in ("micro_batch", "bucket_mb")]
    elif lever == "pipeline_parallel":  # a pipeline's stages have no DDP buckets (FSDP2's replicate at stage 0)
        key = [a for a in key if a != "bucket_mb"]
    merged = variants.merge(bases, on=key, suffixes=("", "_base"))
    if lever == "tensor_parallel" and "accumulation_steps" in merged:  # the same accumulation where both ran to say it
        mine, theirs = merged["accumulation_steps"], merged["accumulation_steps_base"]
        merged = merged[(mine == theirs) | mine.isna() | theirs.isna()]
    # One twin per variant: where several baseline runs share its configuration (results copied
    # together, replicas), the one whose run id sorts first (fp32-z0-w2 before fp32-z0-w2-r1).
    merged = merged.sort_values(["run_id", "run_id_base"]).drop_duplicates("run_id", keep="first")
    return merged.assign(peak_bytes=_device_peak(merged), peak_bytes_base=_device_peak(merged, "_base"))


_device_peak = device_peak_bytes


# What lever_table reads of a run besides its sweep axes (a column missing here fails loudly there).
_LEVER_TABLE_READS = (
    "run_id", "status", "reason", "step_time_s_median", "tokens_per_s", "peak_mem_allocated_bytes", "peak_rss_bytes",
    "activation_bytes_measured", "activation_bytes_predicted", "activation_bytes_predicted_paper",
    "recompute_flops_per_token", "flops_per_token", "model_state_bytes_measured", "model_state_bytes_predicted",
    "n_trainable_params", "n_params", "comm_all_reduce_calls_per_step", "ddp_buckets_predicted",
    "compile_time_s", "compile_graphs_in_loop", "final_loss", "comm_bytes_per_step_measured", "comm_bytes_per_step_predicted",
    "comm_tensor_parallel_bytes_per_step_measured", "comm_tensor_parallel_bytes_per_step_predicted", "accumulation_steps",
    "comm_pipeline_bytes_per_step_measured", "comm_pipeline_bytes_per_step_predicted", "bubble_fraction_measured",
    "bubble_fraction_predicted", "pipeline_activation_bytes_measured_per_stage", "pipeline_activation_bytes_predicted_per_stage")


def _first_stage(values) -> float:
    """The first stage's figure of a per-stage column (the stage holding the most under 1F1B); NaN where null."""
    return float(values[0]) if values is not None and len(values) else float("nan")


def _mib(value) -> float:
    """Bytes in MiB; NaN where null (a pipeline run measures its stages' activations, not one micro-batch's)."""
    return float("nan") if value is None or value is pd.NA else value / MiB


Pair = Callable[[SimpleNamespace], float]
"""A column of a lever's pair, from the variant's values (``r.tokens_per_s``) and its baseline twin's (``r.tokens_per_s_base``)."""

PAIR_COLUMNS: dict[str, Pair] = {
    "step_time_ratio": lambda r: r.step_time_s_median / r.step_time_s_median_base,
    "tokens_per_s_ratio": lambda r: r.tokens_per_s / r.tokens_per_s_base,
    "peak_mib": lambda r: r.peak_bytes / MiB,
    "baseline_peak_mib": lambda r: r.peak_bytes_base / MiB,
    "activation_mib_measured": lambda r: _mib(r.activation_bytes_measured),
    "activation_mib_predicted": lambda r: r.activation_bytes_predicted / MiB,
    "activation_mib_predicted_paper": lambda r: r.activation_bytes_predicted_paper / MiB,
    "baseline_activation_mib_measured": lambda r: _mib(r.activation_bytes_measured_base),
    "baseline_activation_mib_predicted": lambda r: r.activation_bytes_predicted_base / MiB,
    "baseline_activation_mib_predicted_paper": lambda r: r.activation_bytes_predicted_paper_base / MiB,
}
"""What every pair whose two runs ended ok shows: speed, memory and activations, both sides."""

EVIDENCE: dict[str, dict[str, Pair]] = {
    # the predicted recompute cost, beside the measured step-time ratio (lever_activation_checkpointing)
    "activation_checkpointing": {
        "step_time_ratio_predicted": lambda r: 1 + r.recompute_flops_per_token / r.flops_per_token},
    # model state per rank, measured vs formula, and what LoRA saved (no figure: the table shows it)
    "lora_rank": {
        "model_state_mib": lambda r: r.model_state_bytes_measured / MiB,
        "model_state_mib_predicted": lambda r: r.model_state_bytes_predicted / MiB,
        "baseline_model_state_mib": lambda r: r.model_state_bytes_measured_base / MiB,
        "trainable_fraction": lambda r: r.n_trainable_params / r.n_params},
    # all-reduce calls per step, measured vs the bucket count (lever_bucket_mb)
    "bucket_mb": {
        "all_reduce_calls_per_step": lambda r: r.comm_all_reduce_calls_per_step,
        "all_reduce_calls_predicted": lambda r: r.ddp_buckets_predicted},
    # each rank's model state and the bytes per step, the strategy's and tensor parallelism's, measured and
    # predicted, beside the twin without it at the same world size (lever_tensor_parallel)
    "tensor_parallel": {
        "model_state_mib": lambda r: r.model_state_bytes_measured / MiB,
        "model_state_mib_predicted": lambda r: r.model_state_bytes_predicted / MiB,
        "baseline_model_state_mib": lambda r: r.model_state_bytes_measured_base / MiB,
        "baseline_model_state_mib_predicted": lambda r: r.model_state_bytes_predicted_base / MiB,
        "strategy_mb": lambda r: r.comm_bytes_per_step_measured / 1e6,
        "strategy_mb_predicted": lambda r: r.comm_bytes_per_step_predicted / 1e6,
        "tensor_parallel_mb": lambda r: r.comm_tensor_parallel_bytes_per_step_measured / 1e6,
        "tensor_parallel_mb_predicted": lambda r: r.comm_tensor_parallel_bytes_per_step_predicted / 1e6,
        "baseline_strategy_mb": lambda r: r.comm_bytes_per_step_measured_base / 1e6,
        "baseline_strategy_mb_predicted": lambda r: r.comm_bytes_per_step_predicted_base / 1e6},
    # tensor parallelism's bytes per step with and without it (its all-gathers and reduce-scatters against the
    # all-reduces), measured and predicted; the activations are every pair's (lever_sequence_parallel)
    "sequence_parallel": {
        "tensor_parallel_mb": lambda r: r.comm_tensor_parallel_bytes_per_step_measured / 1e6,
        "tensor_parallel_mb_predicted": lambda r: r.comm_tensor_parallel_bytes_per_step_predicted / 1e6,
        "baseline_tensor_parallel_mb": lambda r: r.comm_tensor_parallel_bytes_per_step_measured_base / 1e6,
        "baseline_tensor_parallel_mb_predicted": lambda r: r.comm_tensor_parallel_bytes_per_step_predicted_base / 1e6},
    # each rank's model state (the largest stage's) beside the twin's, the bytes its stages send, the bubble and the
    # activations the first stage holds, measured and predicted (lever_pipeline_parallel)
    "pipeline_parallel": {
        "model_state_mib": lambda r: r.model_state_bytes_measured / MiB,
        "model_state_mib_predicted": lambda r: r.model_state_bytes_predicted / MiB,
        "baseline_model_state_mib": lambda r: r.model_state_bytes_measured_base / MiB,
        "pipeline_mb": lambda r: r.comm_pipeline_bytes_per_step_measured / 1e6,
        "pipeline_mb_predicted": lambda r: r.comm_pipeline_bytes_per_step_predicted / 1e6,
        "bubble_measured": lambda r: r.bubble_fraction_measured,
        "bubble_predicted": lambda r: r.bubble_fraction_predicted,
        "first_stage_activation_mib": lambda r: _first_stage(r.pipeline_activation_bytes_measured_per_stage) / MiB,
        "first_stage_activation_mib_predicted": lambda r: _first_stage(r.pipeline_activation_bytes_predicted_per_stage) / MiB},
    # one schedule against 1F1B: the bubble and the first stage's activations, both sides (lever_pipeline_schedule)
    "pipeline_schedule": {
        "bubble_measured": lambda r: r.bubble_fraction_measured,
        "bubble_predicted": lambda r: r.bubble_fraction_predicted,
        "baseline_bubble_measured": lambda r: r.bubble_fraction_measured_base,
        "baseline_bubble_predicted": lambda r: r.bubble_fraction_predicted_base,
        "first_stage_activation_mib": lambda r: _first_stage(r.pipeline_activation_bytes_measured_per_stage) / MiB,
        "baseline_first_stage_activation_mib": lambda r: _first_stage(r.pipeline_activation_bytes_measured_per_stage_base) / MiB},
    # step time without compilation, which is timed apart before the first step, and the losses (lever_compile)
    "compile": {
        "step_ms": lambda r: r.step_time_s_median * 1e3,
        "baseline_step_ms": lambda r: r.step_time_s_median_base * 1e3,
        "compile_time_s": lambda r: r.compile_time_s,
        "compile_graphs_in_loop": lambda r: r.compile_graphs_in_loop,
        "final_loss_rel_diff": lambda r: abs(r.final_loss - r.final_loss_base) / abs(r.final_loss_base)},
    # bytes per step with gradients reduced in the compute dtype vs fp32, measured and predicted, and
    # what the 16-bit reduction did to the loss (no figure: the table shows it)
    "grad_reduce": {
        "comm_mib_per_step": lambda r: r.comm_bytes_per_step_measured / MiB,
        "comm_mib_per_step_predicted": lambda r: r.comm_bytes_per_step_predicted / MiB,
        "baseline_comm_mib_per_step": lambda r: r.comm_bytes_per_step_measured_base / MiB,
        "final_loss_rel_diff": lambda r: abs(r.final_loss - r.final_loss_base) / abs(r.final_loss_base)},
}
"""Each lever's own evidence: the columns its pairs compare beyond PAIR_COLUMNS, declared beside
the figure that draws them. A lever with none (micro_batch, cpu_offload) shows the common ones."""
if set(EVIDENCE) - set(LEVER_AXES):
    raise ValueError(f"EVIDENCE names no lever of scalelab.planning.sweep: {sorted(set(EVIDENCE) - set(LEVER_AXES))}")


def lever_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant run, baseline twin): what the lever bought, measured and predicted."""
    rows = []
    defaults = _is_default(runs)  # from every column: a lever's default may be read off another one
    # Paired and taken apart row by row below: with its ~100 columns, not the ~40 read, a 1,000-run
    # report spends a fifth of a second here.
    runs = runs[[c for c in dict.fromkeys((*SWEEP_AXES, *_LEVER_TABLE_READS)) if c in runs]]
    for lever in LEVER_AXES:
        columns = {**PAIR_COLUMNS, **EVIDENCE.get(lever, {})}
        pairs = _paired(runs, lever, defaults)
        if lever == "bucket_mb" and not pairs.empty:  # where DDP does not wrap (one rank at stage 0) buckets change nothing
            pairs = pairs[_ddp_wraps(pairs)]
        # Records, not itertuples: itertuples takes each of the pairs' ~200 columns apart first.
        for d in pairs.to_dict("records"):
            r = SimpleNamespace(**d)
            row = {"lever": lever, "run_id": r.run_id, "baseline_run_id": r.run_id_base,
                   "status": r.status, "value": d[lever], "baseline_value": d[f"{lever}_base"]}
            if r.status == "ok" and r.status_base == "ok":
                row.update((name, value(r)) for name, value in columns.items())
            else:
                row["reason"] = r.reason if r.status != "ok" else f"baseline {r.run_id_base}: {r.status_base}"
            rows.append(row)
    return pd.DataFrame(rows)


def fp8_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs of each precision whose record names a twin (scalelab.registries.precisions: fp8 against bf16) beside
    their twin runs (same stage, world size, levers): the speed-up, and MFU against each run's own
    precision peak (``mfu``: fp8's is twice bf16's on Hopper) and against the bf16 peak for both
    (``mfu_bf16_peak``: one scale). Columns of the twin end in ``_<twin>``."""
    key = [c for c in SWEEP_AXES if c != "precision"]
    tables = []
    for record in PRECISIONS.values():
        runs_p = runs[runs["precision"] == record.name] if record.twin else runs.iloc[:0]
        if runs_p.empty:
            continue
        t = f"_{record.twin}"
        merged = runs_p.merge(runs[runs["precision"] == record.twin], on=key, how="left", suffixes=("", t))
        columns = ["run_id", "status", "reason", "tokens_per_s", "mfu", "mfu_bf16_peak",
                   f"run_id{t}", f"status{t}", f"tokens_per_s{t}", f"mfu{t}"]  # the twin's mfu is against its own peak
        out = merged.reindex(columns=columns).copy()  # results older than mfu_bf16_peak lack it
        out[f"speedup_over{t}"] = merged["tokens_per_s"] / merged[f"tokens_per_s{t}"]
        tables.append(out)
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


def _note(ax, text: str) -> None:
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=9)


def _not_run_text(pairs: pd.DataFrame) -> str | None:
    bad = pairs if pairs.empty else pairs[(pairs["status"] != "ok") | (pairs["reason"].notna() if "reason" in pairs else False)]
    if not pairs.empty and len(bad) < len(pairs):
        return None
    reasons = sorted(set(bad["reason"].fillna("").str.slice(0, 150))) if "reason" in bad else []
    return "no run with this lever finished ok:\n" + "\n".join(reasons[:3])


def _pair_panels(pairs: pd.DataFrame):
    """(figure, panels) for a lever's variant/baseline pairs. panels = (left axis, right axis,
    ok pairs, x positions, labels: the baseline run ids), or None when no pair finished ok (the
    figure then says why)."""
    text = _not_run_text(pairs)
    if text:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4))
        _note(left, text)
        right.axis("off")
        return fig, None
    # pairs where both runs ended ok (lever_table gives the others a reason)
    ok = pairs[(pairs["status"] == "ok") & (pairs["reason"].isna() if "reason" in pairs else True)]
    if len(ok) > 10:  # many pairs: one panel above the other, as wide as the pairs need
        fig, (left, right) = plt.subplots(2, 1, figsize=(min(20.0, 3 + 0.32 * len(ok)), 7.0))
        fig.subplots_adjust(hspace=0.75)
    else:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4))
        fig.subplots_adjust(wspace=0.45)
    return fig, (left, right, ok, np.arange(len(ok)), ok["baseline_run_id"])


def _bars_off_on(ax, x, labels, off: pd.Series, on: pd.Series, off_label: str, on_label: str, on_color: str) -> None:
    """Baseline (left) and lever (right) bars per pair, labelled by their baseline configuration."""
    ax.bar(x - 0.2, off, 0.4, label=off_label, color="C0")
    ax.bar(x + 0.2, on, 0.4, label=on_label, color=on_color)
    _pair_ticks(ax, x, labels)


def _pair_ticks(ax, x, labels) -> None:
    ax.set_xticks(x, labels, rotation=90 if len(x) > 10 else 45, ha="center" if len(x) > 10 else "right", fontsize=7)
    ax.set_xlim(-0.6, len(x) - 0.4)
    ax.grid(axis="x", visible=False)


def _side_legend(ax) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)


def _legend_below(ax) -> None:
    """Under the panel, clear of its rotated tick labels and of the panel beside it."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.38), ncol=2, fontsize=7)


def _config_label(runs: pd.DataFrame) -> pd.Series:
    """'z0 w2 fp32': the configuration a lever curve belongs to."""
    return "z" + runs["zero_stage"].astype(str) + " w" + runs["world_size"].astype(str) + " " + runs["precision"]


def _ticks_off_on(ax, x, off: pd.Series, on: pd.Series, label: str, color: str = "black") -> None:
    """Predicted ticks over _bars_off_on's bars: the baseline's (left, labelled) and the lever's (right)."""
    marks(ax, x - 0.2, off, marker="_", size=300, color=color, zorder=3, label=label)
    marks(ax, x + 0.2, on, marker="_", size=300, color=color, zorder=3)


def _activation_bars(ax, x, labels, ok: pd.DataFrame, off_label: str, on_label: str, color: str) -> None:
    """One micro-batch's activations of each pair, measured bars (baseline left, lever right) with the predicted
    ticks (black: the model's; grey: Korthikanti et al.'s)."""
    _bars_off_on(ax, x, labels, ok["baseline_activation_mib_measured"], ok["activation_mib_measured"], off_label, on_label,
                 color)
    _ticks_off_on(ax, x, ok["baseline_activation_mib_predicted"], ok["activation_mib_predicted"], "predicted")
    _ticks_off_on(ax, x, ok["baseline_activation_mib_predicted_paper"], ok["activation_mib_predicted_paper"],
                  "predicted (paper)", "grey")


def activation_checkpointing_plot(pairs: pd.DataFrame):
    fig, panels = _pair_panels(pairs)
    if panels is None:
        return fig
    left, right, ok, x, labels = panels
    _activation_bars(left, x, labels, ok, "off, measured", "on, measured", "C1")
    left.set(ylabel="MiB per micro-batch (log)", title="activations kept for backward")
    log_y(left)
    _side_legend(left)
    right.bar(x, ok["step_time_ratio"], 0.5, color="C1", label="measured")
    marks(right, x, ok["step_time_ratio_predicted"], marker="_", size=300, color="black", zorder=3, label="predicted")
    right.axhline(1, color="grey", lw=0.8)
    _pair_ticks(right, x, labels)
    right.set(ylabel="step time on / off (ratio)", title="recompute cost")
    _side_legend(right)
    return fig


def _varied_configs(data: pd.DataFrame, lever: str) -> pd.DataFrame:
    """Rows of the configurations (stage, world size, precision) that ran more than one value of lever."""
    label = _config_label(data)
    varied = data.groupby(label)[lever].transform("nunique") > 1
    return data[varied].assign(label=label[varied])


def _lines_by_config(ax, data: pd.DataFrame, x: str, y: pd.Series, marker: str = "o", ls: str = "-", legend: bool = True) -> None:
    """One line per configuration label (mean of y per x), coloured in turn."""
    for i, (label, g) in enumerate(data.assign(_y=y).groupby("label", sort=True)):
        curve = g.groupby(x)["_y"].mean()
        ax.plot(curve.index, curve.to_numpy(), marker=marker, ls=ls, lw=1.0, color=f"C{i % 8}", label=label if legend else "_" + label)


def micro_batch_plot(runs: pd.DataFrame, steps: pd.DataFrame):
    ok = runs[(runs["status"] == "ok") & runs["micro_batch"].notna()]
    ok = ok[_others_at_default(ok, "micro_batch")]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    data = _varied_configs(ok, "micro_batch") if not ok.empty else ok
    if data.empty or data["micro_batch"].nunique() < 2:
        _note(axes[0], "fewer than two micro-batch sizes finished ok in one configuration")
        axes[1].axis("off"), axes[2].axis("off")
        return fig
    fp32 = steps[steps["run_id"].isin(data.loc[data["precision"] == "fp32", "run_id"])]
    for i, (mb, group) in enumerate(fp32.groupby("micro_batch")):
        curve = group.groupby("step")["loss"].mean()
        axes[0].plot(curve.index, curve.to_numpy(), label=f"micro-batch {mb}", lw=1.0, color=f"C{i % 8}")
    axes[0].set(xlabel="step", ylabel="loss (nats/token)", title="fp32 loss per micro-batch size (mean over runs)")
    axes[0].legend(fontsize=7)
    many = data["label"].nunique() > 8  # a legend that tall hides the lines
    _lines_by_config(axes[1], data, "micro_batch", data["tokens_per_s"], legend=not many)
    axes[1].set(xlabel="micro-batch (sequences per rank, log)", ylabel="tokens/s, all ranks", title="throughput")
    axes[1].yaxis.set_major_formatter(FuncFormatter(si_label))
    axes[1].set_ylim(0, float(np.nanmax(data["tokens_per_s"])) * 1.1)
    if not many:
        axes[1].legend(fontsize=6.5)
    _lines_by_config(axes[2], data, "micro_batch", data["activation_bytes_measured"] / MiB, legend=False)
    _lines_by_config(axes[2], data, "micro_batch", _device_peak(data) / MiB, marker="s", ls="--", legend=False)
    log_y(axes[2])
    axes[2].set(xlabel="micro-batch (sequences per rank, log)", ylabel="MiB per rank (log)",
                title="activations (solid), peak memory (dashed)")
    for ax in axes[1:]:
        _log_ticks(ax, data["micro_batch"])
    return fig


def _ddp_wraps(runs: pd.DataFrame) -> pd.Series:
    """The rows whose model DDP wraps (scalelab.registries.strategies.Strategy.ddp_wraps)."""
    return pd.Series([strategy(int(z)).ddp_wraps(int(n)) for z, n in zip(runs["zero_stage"], runs["world_size"], strict=True)],
                     index=runs.index, dtype=bool)


def bucket_plot(runs: pd.DataFrame):
    ddp = runs[(runs["status"] == "ok") & runs["bucket_mb"].notna()]
    ddp = ddp[_ddp_wraps(ddp)]  # one rank at stage 0 trains without DDP: no buckets
    ddp = ddp[_others_at_default(ddp, "bucket_mb")]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4))
    data = _varied_configs(ddp, "bucket_mb") if not ddp.empty else ddp
    if data.empty or data["bucket_mb"].nunique() < 2:
        _note(left, "fewer than two bucket sizes finished ok in one configuration")
        right.axis("off")
        return fig
    many = data["label"].nunique() > 8  # colours repeat past 8: a legend would mislead (and cost more than the panel)
    for i, (label, g) in enumerate(data.groupby("label", sort=True)):
        marks(left, g["bucket_mb"], g["comm_all_reduce_calls_per_step"], size=18, color=f"C{i % 8}", label=("_" if many else "") + label,
              zorder=3)
    pred = data.groupby("bucket_mb")["ddp_buckets_predicted"].mean()
    left.plot(pred.index, pred.to_numpy(), color="black", lw=1, label="predicted")
    left.set(xlabel="bucket size (MiB, log)", ylabel="all-reduce calls per step", title="buckets")
    left.legend(fontsize=6.5, title=f"{data['label'].nunique()} configurations" if many else None)
    _lines_by_config(right, data, "bucket_mb", data["step_time_s_median"] * 1e3, legend=False)
    right.set(xlabel="bucket size (MiB, log)", ylabel="median step time (ms)", title="step time")
    right.set_ylim(0, float(np.nanmax(data["step_time_s_median"])) * 1e3 * 1.15)
    for ax in (left, right):
        _log_ticks(ax, data["bucket_mb"])
    return fig


def _log_ticks(ax, values) -> None:
    """A log x axis ticked at the values run, with limits from them (not from plotted NaNs)."""
    values = sorted(set(float(v) for v in values if pd.notna(v) and v > 0))
    ax.set_xscale("log")
    ax.set_xlim(values[0] / 1.5, values[-1] * 1.5)
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.xaxis.set_minor_locator(NullLocator())


def offload_plot(pairs: pd.DataFrame):
    fig, panels = _pair_panels(pairs)
    if panels is None:
        return fig
    left, right, ok, x, labels = panels
    _bars_off_on(left, x, labels, ok["baseline_peak_mib"], ok["peak_mib"], "on device", "offloaded", "C2")
    left.set(ylabel="peak memory per rank (MiB)", title="memory")
    _side_legend(left)
    right.bar(x, ok["step_time_ratio"], 0.5, color="C2")
    right.axhline(1, color="grey", lw=0.8)
    _pair_ticks(right, x, labels)
    right.set(ylabel="step time offloaded / on device (ratio)", title="cost")
    return fig


def compile_plot(pairs: pd.DataFrame):
    fig, panels = _pair_panels(pairs)
    if panels is None:
        return fig
    left, right, ok, x, labels = panels
    _bars_off_on(left, x, labels, ok["baseline_step_ms"], ok["step_ms"], "eager", "compiled", "C4")
    left.set(ylabel="median step time (ms)", title="step time (compilation excluded)")
    left.legend(fontsize=8)
    right.bar(x, ok["compile_time_s"], 0.5, color="C4")
    right.set_xticks(x, labels, rotation=45, ha="right")
    right.set(ylabel="seconds", title="compilation (before the first step)")
    return fig


def tensor_parallel_plot(pairs: pd.DataFrame):
    """Left: each rank's model state and one micro-batch's activations, the twin without tensor parallelism
    beside the split run (bars: measured; black ticks: predicted). Right: bytes per step, the twin's strategy
    beside the split run's strategy and tensor-parallel all-reduces stacked (ticks: predicted)."""
    fig, panels = _pair_panels(pairs)
    if panels is None:
        return fig
    left, right, ok, x, labels = panels
    for offset, state, acts, state_pred, acts_pred, name, color in (
            (-0.2, "baseline_model_state_mib", "baseline_activation_mib_measured", "baseline_model_state_mib_predicted",
             "baseline_activation_mib_predicted", "without", "C0"),
            (0.2, "model_state_mib", "activation_mib_measured", "model_state_mib_predicted", "activation_mib_predicted",
             "tensor parallel", "C5")):
        left.bar(x + offset, ok[state], 0.4, color=color, label=f"{name}: model state")
        left.bar(x + offset, ok[acts], 0.4, bottom=ok[state], color=color, alpha=0.45, label=f"{name}: activations")
        left.scatter(x + offset, ok[state_pred] + ok[acts_pred], marker="_", s=300, color="black", zorder=3,
                     label="predicted" if offset > 0 else None)
    _pair_ticks(left, x, labels)
    left.set(ylabel="per rank (MiB)", title="memory per rank")
    _legend_below(left)
    right.bar(x - 0.2, ok["baseline_strategy_mb"], 0.4, color="C0", label="without: strategy")
    right.bar(x + 0.2, ok["strategy_mb"], 0.4, color="C5", label="tensor parallel: strategy")
    right.bar(x + 0.2, ok["tensor_parallel_mb"].fillna(0), 0.4, bottom=ok["strategy_mb"], color="C5", alpha=0.45,
              label="tensor parallel: all-reduces")
    right.scatter(x - 0.2, ok["baseline_strategy_mb_predicted"], marker="_", s=300, color="black", zorder=3, label="predicted")
    right.scatter(x + 0.2, ok["strategy_mb_predicted"] + ok["tensor_parallel_mb_predicted"], marker="_", s=300,
                  color="black", zorder=3)
    _pair_ticks(right, x, labels)
    right.set(ylabel="MB per optimizer step (rank 0)", title="communication")
    _legend_below(right)
    return fig


def sequence_parallel_plot(pairs: pd.DataFrame):
    """Left: one micro-batch's activations per rank, tensor parallelism alone beside it with sequence parallelism
    (bars: measured; ticks: predicted, and Korthikanti et al.'s). Right: tensor parallelism's bytes per step,
    the same pair (ticks: predicted)."""
    fig, panels = _pair_panels(pairs)
    if panels is None:
        return fig
    left, right, ok, x, labels = panels
    _activation_bars(left, x, labels, ok, "TP alone, measured", "TP + SP, measured", "C5")
    left.set(ylabel="MiB per micro-batch", title="activations kept for backward, per rank")
    _legend_below(left)  # beside it, the legend would run into the right panel's axis label
    _bars_off_on(right, x, labels, ok["baseline_tensor_parallel_mb"].fillna(0), ok["tensor_parallel_mb"].fillna(0),
                 "TP alone: all-reduces", "TP + SP: all-gathers, reduce-scatters", "C5")
    _ticks_off_on(right, x, ok["baseline_tensor_parallel_mb_predicted"], ok["tensor_parallel_mb_predicted"], "predicted")
    right.set(ylabel="MB per optimizer step (rank 0)", title="tensor-parallel communication")
    _legend_below(right)
    return fig


def lever_pairs(table: pd.DataFrame, lever: str) -> pd.DataFrame:
    """The rows of lever_table(runs) for one lever (an empty frame with the columns the figures read if none)."""
    return table[table["lever"] == lever] if not table.empty else pd.DataFrame(columns=["status", "reason"])
