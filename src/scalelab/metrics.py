"""Result tables: explicit pyarrow schemas with a schema version, atomic Parquet writes."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .io import atomic_path

SCHEMA_VERSION = "1"
_META = {b"scalelab.schema_version": SCHEMA_VERSION.encode()}

# Identity columns repeated on every row of every table.
IDENTITY_FIELDS = [
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("precision", pa.string(), nullable=False),
    pa.field("zero_stage", pa.int8(), nullable=False),
    pa.field("world_size", pa.int32(), nullable=False),
]

STEP_SCHEMA = pa.schema(IDENTITY_FIELDS + [
    pa.field("step", pa.int32(), nullable=False),
    pa.field("loss", pa.float64()),
    pa.field("grad_norm", pa.float64()),
    pa.field("lr", pa.float64()),
    pa.field("loss_scale", pa.float64()),
    pa.field("skipped", pa.bool_()),
    pa.field("step_time_s", pa.float64()),
    pa.field("tokens", pa.int64()),
    pa.field("tokens_per_s", pa.float64()),
], metadata=_META)


def steps_table(identity: dict, records: list[dict]) -> pa.Table:
    columns = {f.name: [] for f in STEP_SCHEMA}
    for rec in records:
        row = {**rec, **identity}
        t = rec.get("step_time_s")
        row["tokens_per_s"] = rec["tokens"] / t if t else None
        for name in columns:
            columns[name].append(row.get(name))
    return pa.Table.from_pydict(columns, schema=STEP_SCHEMA)


def write_parquet(table: pa.Table, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def schema_version(path: str | Path) -> str | None:
    meta = pq.read_schema(path).metadata or {}
    value = meta.get(b"scalelab.schema_version")
    return value.decode() if value else None
