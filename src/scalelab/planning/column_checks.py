"""A run's outputs held to the column table (scalelab.planning.columns): what in its summary.json or steps.parquet
breaks a column's null contract, names a key no column holds, or leaves out a column its writer fills. Empty
lists where they agree; the tests of real runs of every status and lever read them."""
from __future__ import annotations

import pyarrow as pa

from scalelab.planning.columns import (
    COLLECTED_STATUSES,
    COLLECTIVES,
    FLATTENED,
    IDENTITY,
    RUN,
    RUN_COLUMNS,
    STEP_COLUMNS,
    STEP_SCHEMA,
    Column,
)
from scalelab.planning.result_tables import run_row, unknown_summary_keys


def null_problems(row: dict, columns: dict[str, Column]) -> list[str]:
    """What in one row (of either table) breaks its columns' null contract."""
    if row.get("status") in COLLECTED_STATUSES:
        kept = {c.name for c in IDENTITY} | {"status", "reason", "run_path", "steps_problem"}
        return [f"{n}: holds {row[n]!r} in a {row['status']} row" for n in columns if n not in kept and row.get(n) is not None]
    bad = []
    for name, column in columns.items():
        value, filled = row.get(name), column.filled
        if value is None and filled.rows is not None and filled.rows(row):
            bad.append(f"{name}: null, but the table says filled: {filled.text}")
        elif value is not None and filled.at_most is not None and not filled.at_most(row):
            bad.append(f"{name}: holds {value!r}, but the table says filled only: {filled.text}")
    return bad


def summary_problems(summary: dict) -> list[str]:
    """Where a run's summary.json (the launcher's) and the column table disagree: a key no column
    holds, a column its writer leaves out or fills against its null contract, a column only
    collection writes. Empty when they agree."""
    bad = [f"{key}: no column holds it" for key in unknown_summary_keys(summary)]
    flattened = {pattern.format(c) for pattern in FLATTENED.values() for c in COLLECTIVES}
    for column in RUN:
        if column.writer == "collect" and column.name in summary:
            bad.append(f"{column.name}: written by the launcher, but a collection column")
        # the worker writes every key of its result, null or not; the launcher merges it on status ok
        elif column.writer == "worker" and summary.get("status") == "ok" and column.name not in summary \
                and column.name not in flattened:
            bad.append(f"{column.name}: the worker's result lacks it")
    # the launcher's columns only: collection fills its own (tokens_per_s_per_device) from every run
    return bad + null_problems(run_row(summary, "-"), {n: c for n, c in RUN_COLUMNS.items() if c.writer != "collect"})


def steps_problems(steps: pa.Table, identity: dict) -> list[str]:
    """Where a run's steps.parquet breaks the contract: identity other than its run's, nulls."""
    bad = [] if steps.schema.equals(STEP_SCHEMA, check_metadata=True) else ["schema differs from STEP_SCHEMA"]
    for row in steps.to_pylist():
        bad += [f"{k}: {row[k]!r}, the run's is {v!r}" for k, v in identity.items() if row[k] != v]
        bad += [f"step {row['step']}: {p}" for p in null_problems(row, STEP_COLUMNS)]
    return sorted(set(bad))
