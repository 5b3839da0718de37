"""Collection: every run folder's summary.json and steps.parquet into the two result tables
(the schemas come from the column table, scalelab.planning.columns)."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from scalelab.formulas.predicted_columns import refreshed
from scalelab.planning import forecast_record
from scalelab.planning.columns import IDENTITY_FIELDS, STEP_SCHEMA
from scalelab.planning.result_tables import run_row, runs_table, type_problems, unknown_summary_keys, write_parquet
from scalelab.planning.sweep import POINT_FILE, RUN_DIR_GLOB, read_point
from scalelab.results.migrate import check_layout


def _point_of(run_dir: Path):
    """A run folder's point, from its point.json (None without a readable one)."""
    try:
        return read_point(run_dir)
    except (OSError, ValueError):
        return None


def _with_identity(table: pa.Table, identity: dict | None) -> pa.Table:
    """A run's steps with every identity column of STEP_SCHEMA: steps written before an axis
    existed lack its column, which holds the run's value (its point.json says it: the default)."""
    for f in IDENTITY_FIELDS:
        if f.name not in table.column_names and identity is not None:
            table = table.append_column(f.name, pa.array([identity.get(f.name)] * table.num_rows, type=f.type))
    return table.select(STEP_SCHEMA.names).cast(STEP_SCHEMA)


def with_collected_columns(runs: pa.Table, results_dir: Path | None = None) -> pa.Table:
    """The run columns collection fills from the runs together (scalelab.planning.columns, writer
    "collect"): tokens_per_s_per_device, and scaling_efficiency by the report's own function
    (scalelab.results.like.scaling_efficiency: one formula, the world-size-1 median of the same
    model, precision, stage and levers as baseline: scalelab.results.like), and the step-time model's
    prediction (with_predictions). Null in rows that did not end ok."""
    import numpy as np

    from scalelab.results.like import READS, scaling_efficiency

    frame = runs.select([c for c in dict.fromkeys((*READS, "tokens_per_s")) if c in runs.column_names]).to_pandas()
    ok = (frame["status"] == "ok").to_numpy()
    tokens_per_s = frame["tokens_per_s"].to_numpy(dtype=float, na_value=np.nan)
    filled = {"tokens_per_s_per_device": tokens_per_s / frame["world_size"].to_numpy(dtype=float),
              "scaling_efficiency": scaling_efficiency(frame).to_numpy(dtype=float, na_value=np.nan)}
    for name, values in filled.items():
        i = runs.schema.get_field_index(name)
        values = np.where(ok, values, np.nan)
        runs = runs.set_column(i, runs.schema.field(i), pa.array(values, type=pa.float64(), from_pandas=True))
    return with_predictions(runs, results_dir)


def with_predictions(runs: pa.Table, results_dir: Path | None) -> pa.Table:
    """The step-time model's columns (scalelab.results.prediction.sweep_predictions), ok rows only: fitted on the
    sweep's own runs and its bench comm table (<results>/calibration/comm.parquet), where it has one."""
    import pandas as pd

    from scalelab.results.prediction import PREDICTED_COLUMNS, sweep_predictions

    frame = runs.to_pandas()
    predicted = sweep_predictions(frame, results_dir)
    ok = (frame["status"] == "ok").to_numpy()
    for name in PREDICTED_COLUMNS:
        i = runs.schema.get_field_index(name)
        values = [v if keep and not pd.isna(v) else None for v, keep in zip(predicted[name].tolist(), ok, strict=True)]
        runs = runs.set_column(i, runs.schema.field(i), pa.array(values, type=runs.schema.field(i).type, from_pandas=True))
    return runs


def _with_steps(row: dict, summary: dict, steps_path: Path, identity: dict | None, run_path: str, step_tables: list,
                problems: list) -> dict:
    """The run's steps.parquet into step_tables; the row, or where the table cannot be read a corrupt row (its step
    rows are gone: never an `ok` row without them; scalelab retry --status corrupt reruns it)."""
    try:
        table = pq.read_table(steps_path)
        step_tables.append(_with_identity(table, identity))
    except FileNotFoundError:
        problems.append(f"{steps_path}: missing")
        row["steps_problem"] = f"{steps_path.name} is missing"
    except Exception as err:  # pyarrow raises several types for damaged files
        problems.append(f"{steps_path}: corrupt ({type(err).__name__}: {err})")
        damage = f"{steps_path.name} is corrupt: {type(err).__name__}: {err}"[:500]
        # its step rows are gone: a corrupt row as for a damaged summary, never an `ok` one without them (scalelab
        # retry --status corrupt reruns it)
        known = identity or {f.name: summary.get(f.name) for f in IDENTITY_FIELDS}  # no point.json: the summary's
        row = run_row({**known, "status": "corrupt", "steps_problem": damage,
                       "reason": f"{damage} (its summary says {summary['status']})"}, run_path)
    return row


def _run_row(run_dir: Path, run_path: str, forecasts: dict, step_tables: list, problems: list) -> dict | None:
    """One run folder's row, its steps into step_tables and what is wrong with it into problems; None for a
    folder whose summary cannot be read and that has no point.json to name it by."""
    point = _point_of(run_dir)
    identity = point.identity() if point else None
    summary_path, steps_path = run_dir / "summary.json", run_dir / "steps.parquet"
    try:
        summary = json.loads(summary_path.read_text())
        if not isinstance(summary, dict) or "status" not in summary:
            raise ValueError("no 'status' field")
    except FileNotFoundError:
        problems.append(f"{summary_path}: missing")
        return run_row({**identity, "status": "missing", "reason": f"{summary_path} is missing"}, run_path) if identity else None
    except (ValueError, UnicodeDecodeError) as err:
        problems.append(f"{summary_path}: corrupt ({err})")
        return (run_row({**identity, "status": "corrupt", "reason": f"{summary_path} is corrupt: {err}"}, run_path)
                if identity else None)
    summary = _with_forecast(summary, forecasts, run_path, point)
    lost = unknown_summary_keys(summary)
    if lost:  # a writer and the schema disagree: say so, never drop a field silently
        problems.append(f"{summary_path}: fields not in the metrics schema, not collected: {', '.join(lost)}")
    # identity from point.json under the summary's own (micro_batch resolved at launch): a summary
    # written before an axis existed lacks it
    row = run_row({**(identity or {}), **{k: v for k, v in summary.items() if v is not None or k not in (identity or {})}},
                  run_path)
    wrong = type_problems(row)
    if wrong:  # one bad field makes a 'corrupt' row naming it; the other runs are still collected
        problems.append(f"{summary_path}: corrupt ({'; '.join(wrong)})")
        row = run_row({**(identity or {}), "status": "corrupt",
                       "reason": f"{summary_path} does not match the metrics schema: {'; '.join(wrong)}"}, run_path)
        if not identity:
            return None
    row = _with_steps(row, summary, steps_path, identity, run_path, step_tables, problems)
    try:  # the formula columns by today's formulas: a fix reaches cached runs
        return refreshed(row)
    except (ValueError, KeyError, TypeError) as err:  # the row kept as written (measurements, no new formulas), and said
        problems.append(f"{summary_path}: its formula columns not computed, the row kept as the run wrote it "
                        f"({type(err).__name__}: {err})")
        return row


def _with_forecast(summary: dict, forecasts: dict, run_path: str, point) -> dict:
    """A summary with the forecast that kept its run, where the summary has none."""
    if "forecast_decision" not in summary:
        # measured before planning.top_k was set (a full sweep, then top_k): the forecast that kept it, as its
        # rank beside the measured one is what the report's forecast table is for; a repeat the config no longer
        # lists (an earlier repeats.baseline) takes its point's, as the listed repeats do
        forecast = forecasts.get(run_path) or (forecasts.get(point.first_run_id) if point else None)
        if forecast:
            return {**forecast, **summary}
    return summary


def collect(results_dir: str | Path, run_paths: list[str] | None = None) -> dict:
    """Gather every run's summary.json and steps.parquet under results_dir/runs/<run id>/ into
    results_dir/metrics.parquet (one row per run) and results_dir/steps.parquet (one row per
    step). A missing or corrupt file is reported by name and kept as a row with status
    'missing' or 'corrupt'; the rest is still collected. Returns {'runs', 'steps', 'problems'}.
    Raises OldLayout for a results folder holding run folders of an earlier layout.
    """
    results_dir = Path(results_dir)
    runs_root = results_dir / "runs"
    check_layout(results_dir)
    if run_paths is None:
        run_paths = sorted({p.parent.name for name in ("summary.json", "steps.parquet", POINT_FILE)
                            for p in runs_root.glob(f"{RUN_DIR_GLOB}/{name}")})
    rows, step_tables, problems = [], [], []
    # a pruned point's record carries its forecast: a row without one under a pruned decision is an older run, not it
    forecasts = {run_id: d.forecast for run_id, d in forecast_record.read(results_dir).items() if d.forecast and not d.pruned}
    for run_path in run_paths:
        row = _run_row(runs_root / run_path, run_path, forecasts, step_tables, problems)
        if row is not None:
            rows.append(row)
    runs = with_collected_columns(runs_table(rows), results_dir)
    steps = pa.concat_tables(step_tables) if step_tables else STEP_SCHEMA.empty_table()
    write_parquet(runs, results_dir / "metrics.parquet")
    write_parquet(steps, results_dir / "steps.parquet")
    return {"runs": runs.num_rows, "steps": steps.num_rows, "problems": problems}
