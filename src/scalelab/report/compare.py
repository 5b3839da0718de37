"""What changed between two sweeps (another torch, machine or commit): `scalelab compare A B`.

Runs are matched by run_id within one model (scalelab.results.like: a run id whose model's name, family,
shape, sequence length or vocabulary differs between the sides is two runs, listed as one side's only).
For each run in both: status on each side, throughput and memory ratios (B / A), whether the throughput
change exceeds the run-to-run noise either sweep measured on the repeats of its model (scalelab.results.noise),
and loss agreement: the largest |loss B - loss A| / |loss A| over the steps both recorded, for runs that trained
the same model on the same data (TRAINED). What was trained (model shape, sequence length, batch, lr, steps,
dataset) and provenance (devices, versions, commits, over the ok runs) side by side; runs found on one side only
listed. Written as compare.html (the report's templates) and compare.md.
"""
from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from scalelab import __version__
from scalelab.io import building_dir
from scalelab.registries.hardware import STEAL_WARN
from scalelab.report.tables import MiB, device_peak_bytes
from scalelab.results.like import MODEL, model_key, model_labels
from scalelab.results.noise import CONFIDENCE, margin_between, relative_change, sweep_noise

PROVENANCE = ["device_type", "device_name", "backend", "torch_version", "cuda_version", "nccl_version", "python_version",
              "hostname", "git_commit", "git_dirty", "threads_per_rank"]
"""Where and with what the runs ran. Read over the runs that carry it: a run skipped or failed before
its first step records no device or versions, and counting its blanks made identical sweeps differ."""
NOT_COMPARED = {"config_hash": "not compared: it hashes the whole config, results_dir included (two results folders differ "
                               "in it whatever they ran); what was trained is compared above"}
"""Columns shown side by side but never called a difference: config_hash differs between any two results
folders of one config, so every compare flagged it."""
TRAINED = ["model", "model_family", "n_params", "n_layers", "d_model", "n_heads", "seq_len", "vocab_size", "global_batch", "tokens_per_step",
           "peak_lr", "steps", "warmup_steps", "dataset", "dataset_sha256_train", "seed"]
"""What was trained (peak_lr: the largest lr of a run's steps, from steps.parquet). Losses of a run in both
sweeps are compared only where all of these match: otherwise they trained different things."""


def _side(results_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    from scalelab.report.report import load_tables

    return load_tables(results_dir)


def loss_agreement(steps_a: pd.DataFrame, steps_b: pd.DataFrame) -> pd.DataFrame:
    """Per run in both: the steps both recorded and the largest |loss B - loss A| / |loss A| over them."""
    cols = ["run_id", "step", "loss"]
    a = steps_a[cols].astype({"run_id": str})
    b = steps_b[cols].astype({"run_id": str})
    both = a.merge(b, on=["run_id", "step"], suffixes=("_a", "_b"))
    with np.errstate(divide="ignore", invalid="ignore"):
        both["rel"] = (both["loss_b"] - both["loss_a"]).abs() / both["loss_a"].abs()
    return both.groupby("run_id").agg(common_steps=("step", "size"), loss_max_rel_diff=("rel", "max")).reset_index()


def with_peak_lr(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """runs with peak_lr: the largest learning rate a run's steps recorded (NaN without steps)."""
    peak = steps.groupby(steps["run_id"].astype(str), observed=True)["lr"].max() if "lr" in steps else pd.Series(dtype=float)
    return runs.assign(peak_lr=runs["run_id"].astype(str).map(peak))


def trained_differences(runs_a: pd.DataFrame, runs_b: pd.DataFrame) -> pd.Series:
    """Per run_id in both: '' where model, data, seed, batch and schedule match, else what differs
    ('seq_len 32 vs 64; ...'). Both sides need peak_lr (with_peak_lr)."""
    cols = [c for c in TRAINED if c in runs_a and c in runs_b]
    merged = runs_a[["run_id", *cols]].merge(runs_b[["run_id", *cols]], on="run_id", suffixes=("_a", "_b"))
    out = {}
    for row in merged.to_dict("records"):
        diffs = []
        for c in cols:
            va, vb = row[f"{c}_a"], row[f"{c}_b"]
            if pd.isna(va) and pd.isna(vb):
                continue
            if pd.isna(va) or pd.isna(vb) or va != vb:
                diffs.append(f"{c} {'-' if pd.isna(va) else va} vs {'-' if pd.isna(vb) else vb}")
        out[row["run_id"]] = "; ".join(diffs)
    return pd.Series(out, dtype=object)


def _keyed(runs: pd.DataFrame) -> pd.DataFrame:
    """runs with their model's key (``_model``, scalelab.results.like) and label (``model_label``)."""
    return runs.assign(_model=model_key(runs).to_numpy(), model_label=model_labels(runs).to_numpy())


def compare_runs(runs_a: pd.DataFrame, runs_b: pd.DataFrame, steps_a: pd.DataFrame, steps_b: pd.DataFrame) -> pd.DataFrame:
    """One row per run in both sides *of one model* (scalelab.results.like): matched by run_id and the
    model's identity (name, family, shape, sequence length, vocabulary), so that a run id whose model
    differs between the sides (another ``model:`` section) is no pair: only_one_side lists it. Loss
    agreement only for runs that trained the same thing (trained_differences): with another batch,
    schedule or dataset, losses differ by design, and `loss_not_compared` says why. Each throughput
    change is judged against the noise of its own model in either sweep (noise_limits)."""
    keep = ["run_id", "status", "tokens_per_s", "step_time_s_median", "model_state_bytes_measured", "mfu", "final_loss"]

    def prepared(runs):
        runs = _keyed(runs)
        steal = runs["host_steal_share"] if "host_steal_share" in runs else np.nan  # tables before schema 10: unknown
        return runs[keep + ["_model", "model_label"]].assign(host_steal_share=steal,peak_mib=device_peak_bytes(runs) / MiB,
                                                             model_state_mib=runs["model_state_bytes_measured"] / MiB)

    a, b = prepared(runs_a), prepared(runs_b)
    merged = a.merge(b.drop(columns="model_label"), on=["run_id", "_model"], suffixes=("_a", "_b"))
    out = pd.DataFrame({
        "run_id": merged["run_id"], "model": merged["model_label"], "status_a": merged["status_a"], "status_b": merged["status_b"],
        "tokens_per_s_a": merged["tokens_per_s_a"], "tokens_per_s_b": merged["tokens_per_s_b"],
        "tokens_per_s_ratio": merged["tokens_per_s_b"] / merged["tokens_per_s_a"],
        "step_time_ratio": merged["step_time_s_median_b"] / merged["step_time_s_median_a"],
        "peak_mib_a": merged["peak_mib_a"], "peak_mib_b": merged["peak_mib_b"], "peak_mib_ratio": merged["peak_mib_b"] / merged["peak_mib_a"],
        "model_state_mib_ratio": merged["model_state_mib_b"] / merged["model_state_mib_a"],
        "mfu_a": merged["mfu_a"], "mfu_b": merged["mfu_b"],
        # the most the hypervisor took from the run's cores on either side (host_steal_share): a change it can explain
        "host_steal_share_max": merged[["host_steal_share_a", "host_steal_share_b"]].astype(float).max(axis=1),
    })
    out["noise_limit"] = merged["_model"].map(noise_limits(runs_a, runs_b)).astype(float).to_numpy()
    out["throughput_change"] = throughput_verdicts(out, out["noise_limit"])
    differs = trained_differences(with_peak_lr(runs_a, steps_a), with_peak_lr(runs_b, steps_b))
    out["loss_not_compared"] = out["run_id"].map(differs).fillna("")
    same = set(out.loc[out["loss_not_compared"] == "", "run_id"])
    agreement = loss_agreement(steps_a[steps_a["run_id"].astype(str).isin(same)], steps_b[steps_b["run_id"].astype(str).isin(same)])
    out = out.merge(agreement, on="run_id", how="left")
    out["common_steps"] = out["common_steps"].fillna(0).astype(int)
    if out["model"].nunique() < 2:
        out = out.drop(columns="model")
    return out.sort_values("run_id").reset_index(drop=True)


def noise_limits(runs_a: pd.DataFrame, runs_b: pd.DataFrame) -> pd.Series:
    """Per model (its key, scalelab.results.like): the change of one run's tokens/s between the two
    sweeps that noise alone exceeds less than 1 time in 100, from the repeats of that model in either
    sweep (scalelab.results.noise.margin_between; never another model's); NaN where neither repeated
    a point of it."""
    a, b = _keyed(runs_a), _keyed(runs_b)
    limits = {}
    for key in dict.fromkeys([*a["_model"], *b["_model"]]):
        limit = margin_between(sweep_noise(a[a["_model"] == key]), (1,), sweep_noise(b[b["_model"] == key]), (1,))
        limits[key] = np.nan if limit is None else limit
    return pd.Series(limits, dtype=float)


def noise_limit(runs_a: pd.DataFrame, runs_b: pd.DataFrame) -> float | None:
    """noise_limits of two sweeps of one model: its limit (None when neither repeated a point). Two
    sweeps of several models have one limit per model: a ValueError names noise_limits."""
    limits = noise_limits(runs_a, runs_b)
    if len(limits) > 1:
        raise ValueError(f"{len(limits)} models: each has its own noise (noise_limits)")
    return None if limits.empty or pd.isna(limits.iloc[0]) else float(limits.iloc[0])


def throughput_verdicts(table: pd.DataFrame, limit) -> pd.Series:
    """Per run in both: whether its tokens/s changed by more than the noise of either sweep. limit:
    one figure, or one per row (its model's; NaN or None: unknown)."""
    ratio = table["tokens_per_s_ratio"]
    change = relative_change(table["tokens_per_s_a"], table["tokens_per_s_b"])
    limit = pd.Series(np.nan if limit is None else limit, index=table.index, dtype=float)
    verdict = np.where(ratio.isna(), "-", np.where(limit.isna(), "unknown (no repeats)",
                                                   np.where(change > limit, "beyond noise", "within noise")))
    return pd.Series(verdict, index=table.index)


def only_one_side(runs_a: pd.DataFrame, runs_b: pd.DataFrame) -> pd.DataFrame:
    """Runs found on one side only: a run id the other side lacks, or holds for another model (``note``
    says what differs: scalelab.results.like's model identity)."""
    a, b = _keyed(runs_a), _keyed(runs_b)
    pairs_a, pairs_b = set(zip(a["run_id"], a["_model"])), set(zip(b["run_id"], b["_model"]))
    a_only = a[[pair not in pairs_b for pair in zip(a["run_id"], a["_model"])]].assign(side="A only")
    b_only = b[[pair not in pairs_a for pair in zip(b["run_id"], b["_model"])]].assign(side="B only")
    models = [c for c in MODEL if c in runs_a and c in runs_b]
    other = trained_differences(runs_a[["run_id", *models]], runs_b[["run_id", *models]]).to_dict()
    both = pd.concat([a_only, b_only])
    both["note"] = [f"the other side's run of this id trained another model: {other[r]}" if other.get(r) else ""
                    for r in both["run_id"]]
    columns = ["side", "run_id", "model_label", "status", "tokens_per_s", "note"]
    # the model where the sides hold several, the note where a run id names another model on the other side
    columns = [c for c in columns if not (c == "model_label" and pd.concat([a["model_label"], b["model_label"]]).nunique() < 2)
               and not (c == "note" and not (both["note"] != "").any())]
    return both[columns].rename(columns={"model_label": "model"}).sort_values(["side", "run_id"]).reset_index(drop=True)


def provenance(runs_a: pd.DataFrame, runs_b: pd.DataFrame, steps_a: pd.DataFrame | None = None,
               steps_b: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per column, what was trained (TRAINED, over every run that records it) and where it ran
    (PROVENANCE, over the ok runs: the ones that carry it): each side's distinct values, with run
    counts where there are several. Same means the same set of values (run counts differ whenever a
    run's status did, which the summary says apart). Differing columns first."""
    if steps_a is not None and steps_b is not None:
        runs_a, runs_b = with_peak_lr(runs_a, steps_a), with_peak_lr(runs_b, steps_b)

    def values(runs: pd.DataFrame, col: str) -> tuple[str, frozenset]:
        if col not in runs:
            return "-", frozenset()
        counted = runs[col].dropna().astype("string").value_counts()
        shown = "; ".join(f"{v} ({n})" if len(counted) > 1 else str(v) for v, n in counted.items()) or "-"
        return shown, frozenset(counted.index)

    rows = []
    for kind, cols, over in (("trained", TRAINED, lambda r: r), ("ran on", PROVENANCE, lambda r: r[r["status"] == "ok"]),
                             ("config", list(NOT_COMPARED), lambda r: r[r["status"] == "ok"])):
        for col in cols:
            (va, sa), (vb, sb) = values(over(runs_a), col), values(over(runs_b), col)
            same = "yes" if sa == sb else NOT_COMPARED.get(col, "no")
            rows.append({"what": kind, "column": col, "A": va, "B": vb, "same": same})
    table = pd.DataFrame(rows)
    order = table["same"].map({"no": 0, "yes": 1}).fillna(2)  # differing columns first, the ones never compared last
    return table.iloc[np.argsort(order.to_numpy(), kind="stable")].reset_index(drop=True)


def without_provenance(runs: pd.DataFrame) -> int:
    """Runs that carry no provenance: not ok (skipped, failed before the first step, ...)."""
    return int((runs["status"] != "ok").sum())


def _median_range(series: pd.Series, what: str) -> str | None:
    s = series.replace([np.inf, -np.inf], np.nan).dropna()
    if s.empty:
        return None
    low, high = f"{s.min():.3f}", f"{s.max():.3f}"
    if low == high:  # one value at the precision shown: a range "from 1.000 (x) to 1.000 (x)" says nothing
        return f"{what} (B / A): {low} in all {len(s)} run(s)" + (": unchanged" if low == "1.000" else "")
    return f"{what} (B / A): median {s.median():.3f}, from {low} ({s.idxmin()}) to {high} ({s.idxmax()})"


def summary_lines(table: pd.DataFrame, only: pd.DataFrame, prov: pd.DataFrame, limit: float | None = None,
                  unrecorded: tuple[int, int, int, int] | None = None) -> list[str]:
    """unrecorded: (runs of A without provenance, runs of A, of B without, runs of B)."""
    lines = []
    trained = prov[(prov["same"] == "no") & (prov.get("what", "ran on") == "trained")]
    if not trained.empty:
        lines.append("what was trained differs: " + "; ".join(f"{r.column} {r.A} vs {r.B}" for r in trained.itertuples()))
    changed = prov[(prov["same"] == "no") & (prov.get("what", "ran on") == "ran on")]["column"].tolist()
    lines.append("provenance differs in: " + (", ".join(changed) if changed else "nothing (same versions, devices, commit)")
                 + (f" (over the ok runs; {unrecorded[0]} of {unrecorded[1]} runs in A and {unrecorded[2]} of {unrecorded[3]} "
                    "in B were not ok and record none)" if unrecorded and (unrecorded[0] or unrecorded[2]) else ""))
    indexed = table.set_index("run_id")
    both_ok = indexed[(indexed["status_a"] == "ok") & (indexed["status_b"] == "ok")]
    for column, what in (("tokens_per_s_ratio", "throughput"), ("peak_mib_ratio", "peak memory per rank"),
                         ("model_state_mib_ratio", "model state per rank")):
        line = _median_range(both_ok[column], what)
        if line:
            lines.append(line)
    # the limit of each run's model (compare_runs' noise_limit), else the one given
    limits = both_ok["noise_limit"] if "noise_limit" in both_ok else pd.Series(np.nan if limit is None else limit,
                                                                               index=both_ok.index, dtype=float)
    if limits.notna().any():
        beyond = both_ok.index[both_ok["throughput_change"] == "beyond noise"].tolist()
        named = f" ({', '.join(beyond[:8])}" + (", ..." if len(beyond) > 8 else "") + ")" if beyond else ""
        per_model = (pd.Series(limits.to_numpy(), index=both_ok["model"].to_numpy()).groupby(level=0, sort=False).first()
                     if "model" in both_ok else None)
        stated = (f"{limits.dropna().iloc[0]:.1%}" if per_model is None else
                  "per model: " + ", ".join(f"{m} {'unknown' if pd.isna(v) else f'{v:.1%}'}" for m, v in per_model.items()))
        lines.append(f"throughput changes beyond the run-to-run noise ({stated}: what noise alone exceeds between a run in A "
                     f"and in B {1 - CONFIDENCE:.0%} of the time, from both sweeps' repeats"
                     + (" of the run's model" if per_model is not None else "") + f"): {len(beyond)} of {len(both_ok)} runs" + named)
        if "host_steal_share_max" in both_ok:  # the worst first, as the report's steal warning
            stolen = both_ok[(both_ok["throughput_change"] == "beyond noise") & (both_ok["host_steal_share_max"] > STEAL_WARN)]
            stolen = stolen["host_steal_share_max"].sort_values(ascending=False)
            if not stolen.empty:
                lines.append(f"of those, {len(stolen)} lost more than {STEAL_WARN:.0%} of their cores' time to the hypervisor "
                             f"on a side ({', '.join(f'{r} {v:.1%}' for r, v in stolen.head(8).items())}"
                             + (", ..." if len(stolen) > 8 else "") + "): their change may be the host's, not the sweep's "
                             "(column host_steal_share_max)")
    elif not both_ok.empty:
        lines.append("throughput changes: neither sweep repeated a point, so which changes are noise is unknown "
                     "(identical sweeps on a shared machine have differed by up to 1.77x per run)")
    apart = both_ok[both_ok["loss_not_compared"] != ""] if "loss_not_compared" in both_ok else both_ok.iloc[:0]
    if not apart.empty:
        lines.append(f"losses not compared for {len(apart)} run(s) in both ({', '.join(apart.index[:4])}"
                     + (", ..." if len(apart) > 4 else "") + f"): they trained different things ({apart['loss_not_compared'].iloc[0]})")
    agree = both_ok["loss_max_rel_diff"].dropna()
    if not agree.empty:
        lines.append(f"loss agreement: largest relative difference {agree.max():.3g} ({agree.idxmax()}), over "
                     f"{int(both_ok.loc[agree.index, 'common_steps'].sum())} common steps of {len(agree)} runs; "
                     f"{int((agree == 0).sum())} run(s) identical")
    moved = indexed[indexed["status_a"] != indexed["status_b"]]
    if not moved.empty:
        lines.append("status changed: " + ", ".join(f"{r} ({x.status_a} → {x.status_b})" for r, x in moved.iterrows()))
    if not only.empty:
        other = only[only["note"] != ""] if "note" in only else only.iloc[:0]
        lines.append(f"runs on one side only: {int((only['side'] == 'A only').sum())} in A, {int((only['side'] == 'B only').sum())} in B"
                     + (f"; {other['run_id'].nunique()} run id(s) on both sides trained another model on each, so they are not "
                        f"paired ({other['note'].iloc[0].split(': ', 1)[-1]})" if not other.empty else ""))
    return lines


def build_compare(a: str | Path, b: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write <out_dir>/compare.html and compare.md (default out_dir: B/compare); return the HTML path."""
    from scalelab.io import check_replaceable
    from scalelab.report.report import render
    from scalelab.report.table_format import markdown_table, markdown_text, table_model

    a, b = Path(a), Path(b)
    out_dir = Path(out_dir) if out_dir else b / "compare"
    check_replaceable(out_dir, ("compare.html", "compare.md"))
    runs_a, steps_a = _side(a)
    runs_b, steps_b = _side(b)
    table = compare_runs(runs_a, runs_b, steps_a, steps_b)
    only = only_one_side(runs_a, runs_b)
    prov = provenance(runs_a, runs_b, steps_a, steps_b)
    unrecorded = (without_provenance(runs_a), len(runs_a), without_provenance(runs_b), len(runs_b))
    lines = summary_lines(table, only, prov, None, unrecorded)  # each run against its model's noise: the table's noise_limit
    built = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    html = render("compare.html.j2", a=str(a), b=str(b), n_a=len(runs_a), n_b=len(runs_b), n_common=len(table), built=built,
                  version=__version__, summary=lines, provenance=table_model(prov), runs=table_model(table),
                  only=table_model(only) if not only.empty else None)
    md = (f"# scalelab compare\n\nA: `{a}` ({len(runs_a)} runs)  \nB: `{b}` ({len(runs_b)} runs)  \n"
          f"{len(table)} runs in both (matched by run_id within one model); ratios are B / A.\n\n## Summary\n\n"
          + "".join(f"- {markdown_text(line)}\n" for line in lines)
          + "\n## Provenance\n\n" + markdown_table(prov) + "\n## Runs in both\n\n" + markdown_table(table)
          + "\n## Runs in one side only\n\n" + (markdown_table(only) if not only.empty else "None.\n"))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = building_dir(out_dir)
    try:
        (building / "compare.html").write_text(html, encoding="utf-8")
        (building / "compare.md").write_text(md, encoding="utf-8")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        building.rename(out_dir)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return out_dir / "compare.html"
