"""The result tables built and written from what runs leave (scalelab.planning.columns declares their columns): a run's
steps.parquet from the worker's step records, a row of metrics.parquet from a run's summary.json (older summaries'
missing keys filled), the runs' table with pandas' integer metadata, the Parquet files written atomically, and the
schema version a file was written with."""
from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from scalelab.io import atomic_path
from scalelab.planning.columns import (
    COLLECTIVES,
    FLATTENED,
    LAUNCHER_STATUSES,
    RUN,
    RUN_SCHEMA,
    STEP_SCHEMA,
)
from scalelab.planning.sweep import AXES
from scalelab.registries.families import DEFAULT_FAMILY
from scalelab.registries.strategies import strategy


def steps_table(identity: dict, records: list[dict]) -> pa.Table:
    """A run's steps.parquet from the worker's step records.

    Built by Arrow's JSON reader, not ``pa.Table.from_pydict``: pyarrow imports pandas the first time
    it converts Python objects to an array (~0.4 s of CPU, half of each training job's, which uses
    no pandas). The reader parses NaN and Infinity, as a diverged run's losses need. Unlike
    ``from_pydict`` it refuses a null in a non-null column, so it reads every column as nullable
    (a run's steps are written whatever happened; steps_problems holds them to the contract), and
    the schema gives the fields back their nullability and metadata."""
    rows = []
    for rec in records:
        row = {**rec, **identity}
        t = rec.get("step_time_s")
        row["tokens_per_s"] = rec["tokens"] / t if t else None
        rows.append({name: row.get(name) for name in STEP_SCHEMA.names})
    if not rows:  # (Schema.empty_table imports pandas too)
        return pa.Table.from_batches([], schema=STEP_SCHEMA)
    lines = "\n".join(json.dumps(row) for row in rows).encode()
    nullable = pa.schema([field.with_nullable(True) for field in STEP_SCHEMA])
    options = pa_json.ParseOptions(explicit_schema=nullable, unexpected_field_behavior="error")
    try:
        parsed = pa_json.read_json(io.BytesIO(lines), pa_json.ReadOptions(use_threads=False), options)
    except pa.ArrowInvalid:  # a value the reader converts more strictly (256.0 in an integer column): pyarrow's own way
        return pa.Table.from_pylist(rows, schema=STEP_SCHEMA)
    return pa.Table.from_arrays(parsed.columns, schema=STEP_SCHEMA)


LEGACY_SUMMARY: dict[str, Callable[[dict], object]] = {
    "param_gather_dtype": lambda row: "float32" if strategy(row["zero_stage"]).shards[0] else None,
    "grad_reduce_dtype": lambda row: "float32",
}
"""Keys an ok summary written by an older scalelab lacks, filled with what that code did: before
FSDP2's MixedPrecisionPolicy every run gathered and reduced in fp32 (a bf16 stage 2 run of then
reads float32, not the compute dtype its rerun gathers in)."""


def run_row(summary: dict, run_path: str) -> dict:
    """Flatten a run's summary.json into one row of RUN_SCHEMA (an older ok summary's missing
    recipe keys filled as LEGACY_SUMMARY says)."""
    row = dict(summary)
    if row.get("status") in LAUNCHER_STATUSES:
        row.setdefault("model_family", DEFAULT_FAMILY)  # written before families: every model was GPT-2, the default
    if row.get("status") == "ok" and row.get("zero_stage") is not None:
        row.update({key: fill(row) for key, fill in LEGACY_SUMMARY.items() if key not in row})
    for key, column in FLATTENED.items():
        for c in COLLECTIVES:
            row[column.format(c)] = (summary.get(key) or {}).get(c)
    row["run_path"] = run_path
    return {f.name: row.get(f.name) for f in RUN_SCHEMA}


def runs_table(rows: list[dict]) -> pa.Table:
    table = pa.Table.from_pylist(rows, schema=RUN_SCHEMA)
    return table.replace_schema_metadata({**table.schema.metadata, b"pandas": _pandas_integers()})


def _pandas_integers() -> bytes:
    """pandas' own metadata naming every integer column of the runs (RUN) a nullable integer (Int64,
    Int32): pd.read_parquet then reads n_params as an integer even where a skipped row leaves it
    null (without it pandas makes such a column float, numpy's int64 holding no null). Not the
    sweep axes (IDENTITY): their null is a value ("no accumulation", "no LoRA") that filters compare
    with == and !=, which pandas' NA answers with NA; they read as pyarrow's types say, as before."""
    import pandas as pd  # here, not at import: the training worker imports this module

    ints = {c.name: f"Int{c.type.bit_width}" for c in RUN if pa.types.is_integer(c.type)}
    empty = pd.DataFrame({name: pd.array([], dtype=dtype) for name, dtype in ints.items()})
    return pa.Schema.from_pandas(empty, preserve_index=False).metadata[b"pandas"]


def unknown_summary_keys(summary: dict) -> list[str]:
    """Keys of a run's summary that no column of RUN_SCHEMA holds (they would be lost), a
    collective no column counts as ``comm_calls_per_step.<name>``."""
    lost = set(summary) - set(RUN_SCHEMA.names) - set(FLATTENED)
    lost |= {f"{key}.{c}" for key in FLATTENED for c in (summary.get(key) or {}) if c not in COLLECTIVES}
    return sorted(lost)


def type_problems(row: dict) -> list[str]:
    """'field=value (expected type)' for each value of a row its RUN_SCHEMA column cannot hold."""
    bad = []
    for f in RUN_SCHEMA:
        try:
            pa.array([row.get(f.name)], type=f.type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            bad.append(f"{f.name}={row.get(f.name)!r} (expected {f.type})")
    return bad


def write_parquet(table: pa.Table, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_runs(path: str | Path):
    """metrics.parquet as a DataFrame of today's columns (:func:`with_todays_columns`)."""
    return with_todays_columns(pq.read_table(path), RUN_SCHEMA).to_pandas()


def read_steps(path: str | Path, read_dictionary: list[str] | None = None):
    """steps.parquet as a DataFrame of today's columns (:func:`with_todays_columns`); ``read_dictionary``: columns
    read as categoricals."""
    return with_todays_columns(pq.read_table(path, read_dictionary=read_dictionary), STEP_SCHEMA).to_pandas()


def with_todays_columns(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A result table an earlier version wrote, with the columns added since: a sweep axis added later reads as its
    default (as an older run's point.json does), every other column as null; the columns in today's order. A table
    of today's schema is returned as it is. Cached results make reports without being collected again."""
    if table.schema.names == schema.names:
        return table
    defaults = {axis.name: axis.default for axis in AXES}
    columns = [table.column(f.name) if f.name in table.column_names else
               pa.array([defaults.get(f.name)] * table.num_rows, type=f.type) for f in schema]
    fields = [table.schema.field(f.name) if f.name in table.column_names else f for f in schema]
    metadata = {**(schema.metadata or {}), **(table.schema.metadata or {})}
    if schema is RUN_SCHEMA:  # pandas' nullable integers, as runs_table writes them
        metadata[b"pandas"] = _pandas_integers()
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=metadata))


def schema_version(path: str | Path) -> str | None:
    meta = pq.read_schema(path).metadata or {}
    value = meta.get(b"scalelab.schema_version")
    return value.decode() if value else None
