"""How the report shows a table: each column's number format (``column_format``) and title (its unit and meaning
from the data dictionary, or DERIVED for the columns the report derives), the table model the HTML templates
render (``table_model``), and the same table as Markdown (summary.md, compare's text)."""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
from markupsafe import Markup

from scalelab.report import dictionary

BEST_COLUMNS = {  # best_configurations' column -> the header shown (model: in a sweep of several models)
    "model": "model", "world_size": "world size", "run_id": "fastest ok point (or points tied within noise)", "tokens_per_s": "tokens/s (median of its runs)",
    "tokens_per_s_per_device": "tokens/s per device", "repeats": "runs", "standing": "against the next (run-to-run noise)",
    "peak_mib_per_rank": "peak MiB per rank", "model_state_mib_per_rank": "model state MiB per rank", "ok_runs": "ok points",
    "did_not_fit": "did not fit (oom, predicted_oom)",
}


# Columns derived for the tables (not in the Parquet files): their unit and meaning.
DERIVED = {
    "scaling_efficiency": ("fraction", "tokens/s at N / (N × the median tokens/s at world size 1 of the same model, precision, "
                                       "stage and levers)"),
    "step_ms_measured": ("ms", "step_time_s_mean x 1000: the mean optimizer step after warm-up"),
    "step_ms_predicted": ("ms", "predicted_step_time_s x 1000: the step-time model's prediction (band and how it was "
                                "made in metrics.parquet's predicted_step_time_s_low/_high and prediction_note)"),
    "model_state_mib_measured": ("MiB", "model_state_bytes_measured / 2^20"),
    "model_state_mib_predicted": ("MiB", "model_state_bytes_predicted / 2^20"),
    "comm_mib_per_step_measured": ("MiB/step", "comm_bytes_per_step_measured / 2^20"),
    "comm_mib_per_step_predicted": ("MiB/step", "comm_bytes_per_step_predicted / 2^20"),
    "peak_mib_predicted": ("MiB", "predicted_peak_bytes / 2^20"),
    "exposed_comm_ms_measured": ("ms", "exposed_comm_s_measured x 1000: communication nothing computed beside, per traced "
                                       "step, read from rank 0's trace"),
    "exposed_comm_ms_predicted": ("ms", "predicted_exposed_comm_s x 1000: the step-time model's exposed communication"),
    "peak_mib_measured_gpu": ("MiB", "peak_mem_allocated_bytes / 2^20 (GPU runs)"),
    "tokens_per_s_per_device": ("tokens/s", "tokens_per_s / world_size"),
    "peak_mib_per_rank": ("MiB", "peak memory per rank: GPU max allocated, else process peak RSS"),
    "model_state_mib_per_rank": ("MiB", "model state at rest on the largest rank"),
    "ok_runs": ("runs", "runs at this world size that ended ok"),
    "did_not_fit": ("-", "runs at this world size with status oom or predicted_oom"),
    "tokens_per_s_ratio": ("-", "tokens/s of B / tokens/s of A"),
    "host_steal_share_max": ("fraction", "the larger host_steal_share of the run in A and in B: the share of its cores' time "
                                         "the hypervisor gave to other guests (a change it can explain)"),
    "step_time_ratio": ("-", "median step time of B / of A (compare), or of the lever run / its baseline twin (levers)"),
    "peak_mib_ratio": ("-", "peak memory per rank of B / of A (GPU: max allocated, CPU: process RSS)"),
    "model_state_mib_ratio": ("-", "model state per rank of B / of A"),
    "loss_max_rel_diff": ("-", "largest |loss B - loss A| / |loss A| over the steps both recorded"),
    "common_steps": ("steps", "steps recorded by both sides"),
    "loss_not_compared": ("-", "why the losses of this run in A and B were not compared: what it trained differently"),
    "noise_limit": ("fraction", "the change of one run's tokens/s between A and B that noise alone exceeds 1 time in 100, from "
                                "the repeats of its model in either sweep (blank: neither repeated a point of it)"),
    "note": ("-", "why a run id on both sides is not paired: the other side's run trained another model"),
    "peak_lr": ("1", "the largest learning rate of a run's steps (after warm-up)"),
    "max_abs_dloss": ("nats/token", "largest |loss - loss of the stage-0 runs| over steps, same model, precision, world size and "
                                    "levers"),
    "levers": ("-", "the levers away from their defaults (none: every lever at its default)"),
}


def _title(name: str) -> str | None:
    name = {v: k for k, v in BEST_COLUMNS.items()}.get(name, name)
    unit, meaning = DERIVED.get(name) or dictionary.RUN.get(name) or dictionary.IDENTITY.get(name) or (None, None)
    return f"{meaning} [{unit}]" if meaning else None


def column_format(name: str, values: pd.Series):
    """How a column's numbers are written: one format per column (never 1.455e+04 beside 3728)."""
    if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
        return str
    name = {v: k for k, v in BEST_COLUMNS.items()}.get(name, name)
    if name in ("bucket_mb",):
        return lambda v: f"{v:g}"
    if name.startswith(("mfu", "hfu")) or name == "scaling_efficiency" or "ratio" in name or "speedup" in name:
        return lambda v: f"{v:.3f}"
    if name.startswith("tokens_per_s") or name in ("tokens", "n_params", "tokens_per_step"):
        return lambda v: f"{v:,.0f}"
    if "dloss" in name or "rel_diff" in name:
        return lambda v: f"{v:.2e}"
    if "mib" in name or name.startswith("step_ms"):
        return lambda v: f"{v:,.2f}"
    if "loss" in name:
        return lambda v: f"{v:.4f}"
    if name.endswith("_s") or name.endswith("_s_median") or name.endswith("_s_mean"):
        return lambda v: f"{v:,.2f}"
    if pd.api.types.is_integer_dtype(values) or (values.dropna() == values.dropna().round()).all():
        return lambda v: f"{int(v)}"
    biggest = float(values.abs().max()) if values.notna().any() else 0.0
    decimals = 0 if biggest >= 1000 else 2 if biggest >= 10 else 3
    return lambda v: f"{v:,.{decimals}f}"


def table_model(df: pd.DataFrame, long: tuple[str, ...] = ("reason", "did_not_fit", "meaning", "teardown_warning",
                                                          "loss_not_compared"), wrap_headers: bool = False) -> dict:
    """What the template's table macro draws: columns (name, title, kind) and rows of cells, each
    (its CSS class, its text). Cells are plain tuples: the macro unpacks them instead of looking up
    attributes (a 1,000-run report has ~26,000 cells)."""
    columns, formatted = [], []
    for name in df.columns:
        values = df[name]
        numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
        kind = "num" if numeric else ("text long" if name in long else "text")
        # wrap_headers (the run table): a header may wrap at its underscores, no wider than its numbers
        columns.append({"name": name, "title": _title(name), "kind": kind,
                        "label": Markup("_<wbr>").join(str(name).split("_")) if wrap_headers else name})
        fmt = column_format(name, values)
        formatted.append(["" if v is None or (not isinstance(v, (str, list, np.ndarray)) and pd.isna(v)) else fmt(v)
                          for v in values.tolist()])
    cells = [[(f"{c['kind']} status-{'ok' if t == 'ok' else 'bad'}" if c["name"] == "status" and t else c["kind"], t) for t in col]
             for c, col in zip(columns, formatted)]  # a status is coloured by outcome
    return {"columns": columns, "rows": list(zip(*cells)) if cells else [() for _ in range(len(df))]}


def markdown_text(text: str) -> str:
    """Text of the results (model names, reasons, paths) made inert in Markdown: a renderer shows raw HTML
    (a model named ``<script>``) as HTML, as the HTML pages' autoescaping never does."""
    return html.escape(str(text), quote=False)


def markdown_table(df: pd.DataFrame) -> str:
    """The same formats, as a Markdown table (every cell escaped: markdown_text)."""
    model = table_model(df)
    lines = ["| " + " | ".join(markdown_text(c["name"]) for c in model["columns"]) + " |",
             "|" + "".join("---:|" if c["kind"] == "num" else "---|" for c in model["columns"])]
    lines += ["| " + " | ".join(markdown_text(text).replace("|", "\\|").replace("\n", " ") for _, text in row) + " |"
              for row in model["rows"]]
    return "\n".join(lines) + "\n"
