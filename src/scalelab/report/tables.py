"""Derived tables the figures, the report, `scalelab compare` and the tests share.

Pure pandas (no matplotlib): what a figure draws is computed here, so a test can hold the
figure's plotted data against the same table.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from scalelab.planning.forecast_record import is_pruned
from scalelab.planning.result_tables import read_runs
from scalelab.planning.sweep import LEVER_AXES
from scalelab.registries.precisions import PRECISION_NAMES
from scalelab.results.like import (
    MODEL,
    OVER_PRECISION,
    OVER_STAGE,
    by_model,
    lever_text,
    like_key,
    model_labels,
    scaling_efficiency,
)
from scalelab.results.noise import CONFIDENCE, ModelNoise, config_ids, medians, sweep_noise

PRECISION_ORDER = list(PRECISION_NAMES)  # the registry's order (scalelab.registries.precisions)
MiB = 2 ** 20
MFU_LIMIT = 1.0
"""An MFU above this is not a utilisation: the peak recorded for the run is too low for its path
(e.g. fp16 emulated on a CPU against the measured fp32 matmul rate). Such runs are warned about,
marked in the heatmap and left out of its colour scale."""
NOT_FIT = ("oom", "predicted_oom")
"""Statuses of configurations that did not fit in memory."""


def precisions(df: pd.DataFrame) -> list[str]:
    """The precisions present, in the usual order (fp32 first), unknown ones after."""
    present = list(df["precision"].unique())  # a categorical's unique() reads its codes, not 500k strings
    return [p for p in PRECISION_ORDER if p in present] + [p for p in present if p not in PRECISION_ORDER]


def strategies(runs: pd.DataFrame) -> pd.Series:
    """The series a main figure draws per row: its ZeRO stage ("ZeRO stage 3"), or hybrid sharding
    with its replicas ("hybrid, 2 replicas") beside its ZeRO-3 twin; an ordered categorical (stages,
    then hybrid by replicas), so that a groupby or a sort keeps that order."""
    stage = runs["zero_stage"].astype(int)
    replicas = pd.to_numeric(runs["replicas"], errors="coerce").fillna(1).astype(int) if "replicas" in runs \
        else pd.Series(1, index=runs.index)
    labels = [f"hybrid, {r} replicas" if r > 1 else f"ZeRO stage {s}" for s, r in zip(stage, replicas, strict=True)]
    order = sorted(set(zip(stage, replicas, labels, strict=True)))
    return pd.Series(pd.Categorical(labels, categories=list(dict.fromkeys(lab for _, _, lab in order)), ordered=True),
                     index=runs.index)


def strategy_tick(label: str) -> str:
    """A strategy's short name for an axis tick or a heatmap row: z3, or hsdp2 (hybrid, 2 replicas)."""
    return f"hsdp{label.split(', ')[1].split()[0]}" if label.startswith("hybrid") else f"z{label.rsplit(' ', 1)[1]}"


EMULATED_ON_CPU = tuple(p for p in PRECISION_NAMES if p != "fp32")
"""Precisions whose matmuls a CPU runs on emulated or narrow kernels (no tensor cores): their MFU is against a
peak measured on that same path, so it does not compare with fp32's (it read brightest where it runs slowest)."""


def mfu_flagged(runs: pd.DataFrame) -> pd.Series:
    """Which ok runs have an MFU that means nothing (above MFU_LIMIT)."""
    return (runs["status"] == "ok") & (runs["mfu"] > MFU_LIMIT)


def device_peak_bytes(runs: pd.DataFrame, suffix: str = "") -> pd.Series:
    """Peak allocated device memory on GPU runs, else the process peak RSS (CPU)."""
    gpu = runs.get(f"peak_mem_allocated_bytes{suffix}")
    # as floats: nullable integer columns (metrics.parquet's) refuse another column's values as fill
    rss = runs[f"peak_rss_bytes{suffix}"].astype("float64")
    return gpu.astype("float64").fillna(rss) if gpu is not None else rss


def throughput_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (precision, stage or hybrid strategy, world size) over ok runs: median tokens/s in total and per device, and
    the scaling efficiency (what the throughput figure draws), each with the lowest and highest of
    the runs it is the median of (``_lo``, ``_hi``: equal for a single run), and how many (``runs``)."""
    ok = runs[runs["status"] == "ok"]
    ok = ok.assign(tokens_per_s_per_device=ok["tokens_per_s"] / ok["world_size"], scaling_efficiency=scaling_efficiency(ok))
    columns = ["tokens_per_s", "tokens_per_s_per_device", "scaling_efficiency"]
    grouped = ok.assign(strategy=strategies(ok)).groupby(["precision", "zero_stage", "strategy", "world_size"], observed=True)[columns]
    table = grouped.median()
    table = table.join(grouped.min().add_suffix("_lo")).join(grouped.max().add_suffix("_hi"))
    table["runs"] = grouped.size()
    return table.reset_index()


def _run_codes(steps: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """(an integer per step row naming its run, the runs: one row each, in that numbering). Uses
    the categorical codes when run_id is categorical (load_tables reads it so), no string work."""
    run_id = steps["run_id"]
    if isinstance(run_id.dtype, pd.CategoricalDtype):
        codes = run_id.cat.codes.to_numpy().astype(np.int64)
    else:
        codes, _ = pd.factorize(run_id)
    first = np.unique(codes, return_index=True)[1]
    per_run = steps.iloc[first].assign(_code=codes[first]).set_index("_code")
    return codes, per_run


def _with_model(per_run: pd.DataFrame, runs: pd.DataFrame | None) -> pd.DataFrame:
    """The per-run rows of a steps table with the model's identity columns of the runs table (the
    steps hold the model axis's name only; a name may hold another shape in results copied together)."""
    if runs is None or runs.empty:
        return per_run
    first = runs.drop_duplicates("run_id")
    lookup = first.set_index(first["run_id"].astype(str))
    ids = per_run["run_id"].astype(str)
    extra = {c: ids.map(lookup[c]) for c in MODEL if c in lookup and c not in per_run}
    return per_run.assign(**extra) if extra else per_run


def _loss_against(steps: pd.DataFrame, over: tuple[str, ...], is_reference: np.ndarray, runs: pd.DataFrame | None = None):
    """|loss - mean loss of the reference rows of the same like (scalelab.results.like, a comparison
    over ``over``) at the same step|, per row (NaN where there is none), with the run codes and the
    runs table of _run_codes (the model's columns added from ``runs`` where given)."""
    codes, per_run = _run_codes(steps)
    per_run = _with_model(per_run, runs)
    group_of_run, _ = pd.factorize(like_key(per_run, over))
    lookup = np.full(int(codes.max()) + 1, -1, dtype=np.int64)
    lookup[per_run.index.to_numpy()] = group_of_run
    group = lookup[codes]
    step = steps["step"].to_numpy(dtype=np.int64)
    loss = steps["loss"].to_numpy(dtype=float)
    n_steps = int(step.max()) + 1
    size = (int(group.max()) + 1) * n_steps
    use = is_reference & np.isfinite(loss)
    key = group * n_steps + step
    total = np.bincount(key[use], weights=loss[use], minlength=size)
    count = np.bincount(key[use], minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        ref = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return np.abs(loss - ref[key]), codes, per_run


def _max_per_run(values: np.ndarray, codes: np.ndarray, keep: np.ndarray, per_run: pd.DataFrame) -> pd.DataFrame:
    """The runs table with the largest value per run (rows kept only)."""
    out = np.full(int(codes.max()) + 1, -np.inf)
    np.maximum.at(out, codes[keep], values[keep])
    present = np.zeros(out.size, dtype=bool)
    present[codes[keep]] = True
    idx = per_run.index.to_numpy()
    sel = present[idx]
    return per_run[sel].assign(value=out[idx[sel]])


DEVIATION_COLUMNS = ["model", "precision", "world_size", "zero_stage", "levers", "max_abs_dloss"]


def loss_deviation_vs_stage0(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (model, precision, world size, stage other than 0, levers): the largest |loss - loss(stage 0)|
    over steps, stage 0 being the mean of the stage-0 runs of the same like (scalelab.results.like:
    model, precision, world size, levers) at that step. Stage 0 itself is the reference (left out:
    0 by definition). runs: the runs table, for the model's identity beyond its name."""
    if steps.empty:
        return pd.DataFrame(columns=DEVIATION_COLUMNS)
    dloss, codes, per_run = _loss_against(steps, OVER_STAGE, (steps["zero_stage"] == 0).to_numpy(), runs)
    found = _max_per_run(dloss, codes, np.isfinite(dloss), per_run)
    found = found[found["zero_stage"] != 0]
    if found.empty:
        return pd.DataFrame(columns=DEVIATION_COLUMNS)
    found = found.assign(precision=found["precision"].astype(str), model=model_labels(found), levers=lever_text(found))
    return (found.groupby(DEVIATION_COLUMNS[:-1], as_index=False, sort=True)["value"].max()
            .rename(columns={"value": "max_abs_dloss"})[DEVIATION_COLUMNS])


def largest_deviation_vs_stage0(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (precision, stage): the largest |Δloss| vs stage 0 over steps, world sizes, models and
    levers (each measured within its like)."""
    dev = loss_deviation_vs_stage0(steps, runs)
    return dev.groupby(["precision", "zero_stage"], as_index=False)["max_abs_dloss"].max()


def loss_vs_fp32_twin(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (precision, step), precisions other than fp32: the largest |loss - loss of the fp32
    twin| over configurations, the twin being the fp32 run of the same like (scalelab.results.like:
    model, stage, world size, levers; the mean of several such runs). Columns precision, step,
    max_abs_dloss, runs."""
    cols = ["precision", "step", "max_abs_dloss", "runs"]
    is_fp32 = (steps["precision"] == "fp32").to_numpy()
    if steps.empty or is_fp32.all() or not is_fp32.any():
        return pd.DataFrame(columns=cols)
    dloss, _, _ = _loss_against(steps, OVER_PRECISION, is_fp32, runs)
    keep = ~is_fp32 & np.isfinite(dloss)
    precision, names = pd.factorize(steps["precision"][keep])  # on the categorical's codes, no strings
    step = steps["step"].to_numpy(dtype=np.int64)[keep]
    n_steps = int(step.max()) + 1 if step.size else 1
    key = precision * n_steps + step
    largest = np.full(len(names) * n_steps, -np.inf)
    np.maximum.at(largest, key, dloss[keep])
    runs = np.bincount(key, minlength=largest.size)  # one row per run and step
    hit = np.nonzero(runs)[0]
    return pd.DataFrame({"precision": np.asarray(names, dtype=object)[hit // n_steps], "step": hit % n_steps,
                         "max_abs_dloss": largest[hit], "runs": runs[hit]})[cols]


BEST_COLUMNS = ["model", "world_size", "run_id", "precision", "zero_stage", "tokens_per_s", "tokens_per_s_per_device", "repeats",
                "within_noise", "runner_up", "lead", "noise_margin", "peak_mib_per_rank", "peak_memory", "model_state_mib_per_rank",
                "ok_runs", "did_not_fit"]


def best_configurations(runs: pd.DataFrame) -> pd.DataFrame:
    """Per model and world size (scalelab.results.like: configurations of one model ranked against
    each other, never against another model's, whose tokens cost otherwise): the fastest point that
    ended ok, by the median tokens/s of its repeats (its configuration, tokens/s in total and per
    device, peak and model-state memory per rank), the points within the model's run-to-run noise of
    it (scalelab.results.noise: a ranking between them means nothing), the runner-up's lead
    otherwise, and the configurations that did not fit (status oom / predicted_oom), by run id.
    ``attrs["noise"]``: the noise (a ModelNoise where the sweep holds several models)."""
    # The columns read below only: selecting rows of all ~100 columns, 8 world sizes over, costs a
    # 1,000-run report a tenth of a second.
    runs = runs[[c for c in dict.fromkeys(("run_id", "status", "world_size", "precision", "zero_stage", "tokens_per_s", "repeat",
                                           "model_state_bytes_measured", "peak_mem_allocated_bytes", "peak_rss_bytes",
                                           "accumulation_steps", *MODEL, *LEVER_AXES)) if c in runs]]
    tables, noises = [], {}
    for label, mine in by_model(runs):
        noises[label] = sweep_noise(mine)
        tables.append(_best_of_one_model(mine, noises[label]).assign(model=label))
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    table = table.reindex(columns=BEST_COLUMNS)
    table.attrs["noise"] = ModelNoise(noises) if len(noises) > 1 else next(iter(noises.values())) if noises else sweep_noise(runs)
    return table


def _best_of_one_model(runs: pd.DataFrame, noise) -> pd.DataFrame:
    rows = []
    points = medians(runs)
    ok = points[(points["status"] == "ok") & points["tokens_per_s"].notna()]
    for ws in sorted(runs["world_size"].dropna().unique()):
        row = {"world_size": int(ws)}
        here = ok[ok["world_size"] == ws].sort_values("tokens_per_s", ascending=False)
        if not here.empty:
            best = here.iloc[0]
            others = here.iloc[1:]
            tied = [r.run_id for r in others.itertuples()
                    if noise.within(best["tokens_per_s"], r.tokens_per_s, int(best["repeats"]), int(r.repeats))]
            row.update(run_id=best["run_id"], precision=best["precision"], zero_stage=int(best["zero_stage"]),
                       tokens_per_s=best["tokens_per_s"], tokens_per_s_per_device=best["tokens_per_s"] / ws,
                       repeats=int(best["repeats"]),
                       peak_mib_per_rank=device_peak_bytes(here.iloc[[0]]).iloc[0] / MiB,
                       peak_memory=("GPU allocated" if pd.notna(best.get("peak_mem_allocated_bytes")) else "process RSS"),
                       model_state_mib_per_rank=best["model_state_bytes_measured"] / MiB, ok_runs=len(here),
                       within_noise=", ".join(tied),
                       runner_up=others.iloc[0]["run_id"] if len(others) else None,
                       lead=best["tokens_per_s"] / others.iloc[0]["tokens_per_s"] - 1 if len(others) else np.nan,
                       noise_margin=noise.margin(int(best["repeats"]), int(others.iloc[0]["repeats"])) if len(others) else None)
        else:
            row.update(ok_runs=0)
        did_not_fit = runs[(runs["world_size"] == ws) & runs["status"].isin(NOT_FIT)]
        row["did_not_fit"] = ", ".join(f"{r.run_id} ({r.status})" for r in did_not_fit.sort_values("run_id").itertuples())
        rows.append(row)
    return pd.DataFrame(rows)


def noise_of(best: pd.DataFrame, model: str | None = None):
    """The run-to-run noise a row of best_configurations(runs) was judged by: its model's."""
    noise = best.attrs["noise"]
    return noise.of(model) if isinstance(noise, ModelNoise) else noise


def tied_points(r) -> list[str]:
    """The points a row of best_configurations cannot rank: its fastest by median and those within the
    run-to-run noise of it; [] where one point leads beyond noise (or no point ended ok)."""
    if not isinstance(r.run_id, str) or not (isinstance(r.within_noise, str) and r.within_noise):
        return []
    return [r.run_id, *r.within_noise.split(", ")]


def answer(r) -> str:
    """The one answer a row of best_configurations gives, worded alike wherever a best point is named
    (the report's tables, summary.md, the sweep's end): the fastest point by the median tokens/s of its
    repeats, or, where noise could overturn its lead, the points tied (no single winner)."""
    if not isinstance(r.run_id, str):
        return "no run ended ok"
    tied = tied_points(r)
    return f"tied within run-to-run noise: {', '.join(tied)}" if tied else r.run_id


def standing(r, noise) -> str:
    """How far the best point is ahead, against the noise (its model's): the part of the answer a ranking needs."""
    if not isinstance(r.run_id, str):  # no point of this world size ended ok
        return ""
    if tied_points(r):
        return (f"; no single fastest point: {r.run_id} leads {r.within_noise} by less than run-to-run noise "
                "alone can move them (a tie)")
    if pd.isna(r.lead):
        return ""
    if not noise.known:
        return f"; ahead of {r.runner_up} by {r.lead:.0%} (single runs: spread unknown)"
    return f"; ahead of {r.runner_up} by {r.lead:.0%}, beyond the {r.noise_margin:.0%} noise alone reaches ({CONFIDENCE:.0%})"


def best_configurations_text(runs: pd.DataFrame) -> str:
    """The best-configuration table as plain text (terminal, summary.md), each best point with how
    far it is ahead of the next, against the run-to-run noise of its model; a sweep of several
    models names the model on each line."""
    best = best_configurations(runs)
    several = isinstance(best.attrs["noise"], ModelNoise)
    lines = []
    for r in best.itertuples():
        where = (f"model {r.model}, " if several else "") + f"world size {r.world_size}"
        if pd.isna(r.run_id):
            head = f"{where}: no run ended ok"
        else:
            median = f"median of {r.repeats} runs, " if r.repeats > 1 else ""
            first = f"{answer(r)}; first by median: {r.run_id}" if tied_points(r) else r.run_id
            head = (f"{where}: {first}  {r.tokens_per_s:,.0f} tokens/s ({median}{r.tokens_per_s_per_device:,.0f} per device), "
                    f"peak {r.peak_mib_per_rank:,.1f} MiB per rank ({r.peak_memory}), model state {r.model_state_mib_per_rank:,.2f} MiB"
                    + standing(r, noise_of(best, r.model)))
        lines.append(head + (f"; did not fit: {r.did_not_fit}" if r.did_not_fit else ""))
    lines += best.attrs["noise"].text().split("\n")
    return "\n".join(lines)


def sweep_end_text(results_dir) -> str | None:
    """What the workflow prints when it ends: the best configuration per world size and where the
    report is; None while there is no report built from the current tables."""
    from pathlib import Path

    results_dir = Path(results_dir)
    metrics, html = results_dir / "metrics.parquet", results_dir / "report" / "report.html"
    if not (metrics.exists() and html.exists()) or html.stat().st_mtime < metrics.stat().st_mtime:
        return None
    runs = read_runs(metrics)
    if runs.empty:
        return f"scalelab: no runs; report: {html.resolve()}"
    n_ok = int((runs["status"] == "ok").sum())
    n_pruned = int(pruned_rows(runs).sum())
    n_wrong = len(runs) - n_ok - n_pruned
    import textwrap

    from scalelab.report.checks import cpu_best_note, cpu_notice
    from scalelab.results.invocation import rerun_command

    # CPU results say so before their best configuration, and beside it (scalelab.report.checks).
    notice, note = cpu_notice(runs), cpu_best_note(runs)
    return ((textwrap.fill(f"scalelab: {notice}", width=110, subsequent_indent="  ") + "\n" if notice else "")
            + f"scalelab: {len(runs)} runs, {n_ok} ok" + (f", {n_pruned} pruned by the forecast (planning.top_k)" if n_pruned else "")
            + ". Best configuration per world size:\n"
            + "\n".join("  " + line for line in best_configurations_text(runs).splitlines())
            + (f"\n  {note}" if note else "")
            + f"\nscalelab: report: {html.resolve()}"
            # rerun with the command that started this sweep (scalelab.results.invocation), not the default config's
            + (f"\nscalelab: {n_wrong} run(s) not ok: scalelab status {results_dir.resolve()}\n"
               f"scalelab: to rerun them: scalelab retry {results_dir.resolve()}, then: {rerun_command(results_dir)}"
               if n_wrong else ""))


def pruned_rows(runs: pd.DataFrame) -> pd.Series:
    """Which rows record a point the forecast pruned (planning.top_k; plan.forecast_record.is_pruned): decisions, which
    the report, its figures and the sweep's end count apart from runs that went wrong."""
    return pd.Series([is_pruned(status, reason) for status, reason in zip(runs["status"], runs["reason"])],
                     index=runs.index, dtype=bool)


def forecast_ranking(runs: pd.DataFrame) -> pd.DataFrame:
    """A sweep ranked by its forecast (planning.top_k, scalelab.forecast.pruning): one row per point the
    forecast decided on, by model, world size and forecast rank, with its decision (why it ran, or that it
    was pruned), and what was measured where the point ran (the median tokens/s of its ok runs, and its rank
    among the measured points of its model and world size); a pruned point (column ``pruned``) has no
    measurement: its figures are predictions only. Empty where no row carries a forecast decision."""
    if "forecast_decision" not in runs or runs["forecast_decision"].isna().all():
        return pd.DataFrame()
    ranked = runs[runs["forecast_decision"].notna()].assign(point=lambda df: config_ids(df))
    ranked["pruned"] = pruned_rows(ranked)
    measured = ranked[ranked["status"] == "ok"].groupby("point")["tokens_per_s"].median()
    rows = []
    for point, group in ranked.groupby("point", sort=False):
        first = group.iloc[0]
        peak = first.get("predicted_peak_bytes")
        rows.append({"model": first["model"], "world_size": int(first["world_size"]), "point": point,
                     "forecast_rank": first["forecast_rank"], "forecast_tokens_per_s": first["forecast_tokens_per_s"],
                     "predicted_peak_mib": float(peak) / MiB if pd.notna(peak) else np.nan,
                     "measured_tokens_per_s": measured.get(point, np.nan), "runs": len(group),
                     "decision": first["forecast_decision"], "pruned": bool(group["pruned"].all()),
                     "status": ", ".join(sorted(group["status"].unique())), "reason": first["reason"]})
    table = pd.DataFrame(rows)
    table["measured_rank"] = table.groupby(["model", "world_size"])["measured_tokens_per_s"].rank(ascending=False, method="min")
    return table.sort_values(["model", "world_size", "forecast_rank", "point"], na_position="last").reset_index(drop=True)


def mfu_grid(runs: pd.DataFrame) -> dict:
    """What the MFU heatmap draws: rows 'precision z<stage>' (or 'precision hsdp<replicas>'), columns world sizes; the median MFU of
    ok runs per cell, and its run-to-run spread where a cell has several (``spread``: (max - min) /
    median); which cells are flagged (an MFU above MFU_LIMIT) or emulated (EMULATED_ON_CPU on a CPU), both left out
    of the colour scale; the
    status shown in cells without an ok run ('not run' where no run exists)."""
    runs = runs.assign(_strategy=strategies(runs).astype(str))
    precs, sizes = precisions(runs), sorted(runs["world_size"].unique())
    stages = list(strategies(runs).cat.remove_unused_categories().cat.categories)
    rows = [(p, s) for p in precs for s in stages if ((runs["precision"] == p) & (runs["_strategy"] == s)).any()]
    ok = runs[runs["status"] == "ok"]
    cells = ok.groupby(["precision", "_strategy", "world_size"])["mfu"]
    mean = cells.median()  # of a point's repeats
    # the run-to-run spread of a cell with several runs: (max - min) / median, as scalelab.results.noise
    spread_of = ((cells.max() - cells.min()) / mean).where(cells.size() > 1)
    flagged = set(ok[mfu_flagged(ok)].set_index(["precision", "_strategy", "world_size"]).index)
    on_cpu = set(ok[ok["device_type"] == "cpu"].set_index(["precision", "_strategy", "world_size"]).index) \
        if "device_type" in ok else set()
    first_status = runs.groupby(["precision", "_strategy", "world_size"])["status"].first()
    value = np.full((len(rows), len(sizes)), np.nan)
    spread = np.full(value.shape, np.nan)
    flag = np.zeros(value.shape, dtype=bool)
    status = np.full(value.shape, "not run", dtype=object)
    for i, (p, s) in enumerate(rows):
        for j, w in enumerate(sizes):
            key = (p, s, w)
            if key in mean.index:
                value[i, j], status[i, j], flag[i, j], spread[i, j] = mean[key], "ok", key in flagged, spread_of[key]
            elif key in first_status.index:
                status[i, j] = first_status[key]
    # 16-bit precisions on a CPU: matmuls it emulates, divided by a peak measured on that emulated path, read
    # brightest while they run slowest; drawn apart and out of the colour scale, so fp32 sets it
    emulated = np.array([[p in EMULATED_ON_CPU and (p, s, w) in on_cpu for w in sizes] for p, s in rows], dtype=bool).reshape(value.shape)
    shown = np.where(flag | emulated, np.nan, value)
    vmax = float(np.nanmax(shown)) if np.isfinite(shown).any() else 1.0
    return {"rows": [f"{p} {strategy_tick(s)}" for p, s in rows], "world_sizes": [int(w) for w in sizes], "mfu": value, "flagged": flag,
            "emulated": emulated, "status": status, "vmin": 0.0, "vmax": vmax, "spread": spread}


def pipeline_rows(runs: pd.DataFrame) -> pd.Series:
    """Which rows are pipeline runs (pipeline_parallel above 1); none in results from before pipelining."""
    if "pipeline_parallel" not in runs:
        return pd.Series(False, index=runs.index)
    return pd.to_numeric(runs["pipeline_parallel"], errors="coerce").fillna(1) > 1


def pipeline_bubbles(runs: pd.DataFrame) -> pd.DataFrame:
    """What the bubble figure draws: the ok pipeline runs with a measured bubble, one row each (run_id, schedule,
    pp, chunks per rank V, micro-batches m, device_type), their measured bubble, the one their stages' own compute
    leaves with free sends (stage_times: bubble_fraction_stage_times) and the formula's (P - 1) / (V m + P - 1) at
    their m (scalelab.formulas.pipeline.bubble_fraction), sorted by schedule, P, m and run id."""
    from scalelab.formulas.pipeline import SCHEDULES, bubble_fraction

    mine = runs[pipeline_rows(runs) & (runs["status"] == "ok")]
    mine = mine[mine["bubble_fraction_measured"].notna() & mine["pipeline_microbatches"].notna()]
    table = pd.DataFrame({
        "run_id": mine["run_id"].astype(str), "schedule": mine["pipeline_schedule"].astype(str),
        "pp": mine["pipeline_parallel"].astype(int), "m": mine["pipeline_microbatches"].astype(int),
        "measured": mine["bubble_fraction_measured"].astype(float),
        "stage_times": pd.to_numeric(mine["bubble_fraction_stage_times"], errors="coerce") if "bubble_fraction_stage_times"
        in mine else float("nan"),
        "device_type": mine["device_type"].astype(str) if "device_type" in mine else "unknown"})
    table["chunks_per_rank"] = [SCHEDULES[s].chunks_per_rank if s in SCHEDULES else 1 for s in table["schedule"]]
    table["formula"] = [bubble_fraction(p, m, s) if s in SCHEDULES else float("nan")
                        for p, m, s in zip(table["pp"], table["m"], table["schedule"])]
    return table.sort_values(["schedule", "pp", "m", "run_id"]).reset_index(drop=True)


def timeline_candidates(runs: pd.DataFrame) -> pd.DataFrame:
    """The ok pipeline runs whose traced step the timeline figure may draw, in the order it tries them: the most
    micro-batches per step first (the most to see), then by run id; each with its folder under <results>/runs/
    (run_path, else the run id)."""
    mine = runs[pipeline_rows(runs) & (runs["status"] == "ok")]
    folder = mine["run_path"].astype("string").fillna(mine["run_id"].astype("string")) if "run_path" in mine \
        else mine["run_id"].astype("string")
    table = mine.assign(_m=pd.to_numeric(mine["pipeline_microbatches"], errors="coerce").fillna(0), _id=mine["run_id"].astype(str),
                        folder=folder.astype(str))
    return table.sort_values(["_m", "_id"], ascending=[False, True]).drop(columns=["_m", "_id"]).reset_index(drop=True)
