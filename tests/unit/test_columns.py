"""The column table (scalelab.planning.columns) against real runs of every status and lever: each column
written by its writer, no summary key that no column holds, null only where its contract says."""

import pyarrow as pa

from scalelab.formulas.predicted_columns import TRAINED_RUN_COLUMNS
from scalelab.planning import columns, result_tables
from scalelab.planning.columns import (
    IDENTITY,
    RUN_COLUMNS,
    RUN_SCHEMA,
    STEP_COLUMNS,
    STEP_SCHEMA,
)
from scalelab.planning.sweep import AXES
from scalelab.report import dictionary
from support import REPO


def test_schemas_metadata_dictionary_and_docs_derive_from_the_table():
    assert RUN_SCHEMA.names == list(RUN_COLUMNS) == [c.name for c in IDENTITY] + [c.name for c in columns.RUN]
    assert STEP_SCHEMA.names == list(STEP_COLUMNS)
    # identity: the run id, then the sweep axes in the registry's order, typed and nullable as it says
    assert [c.name for c in IDENTITY] == ["run_id", *(a.name for a in AXES)]
    for axis in AXES:
        field = RUN_SCHEMA.field(axis.name)
        assert (field.type, field.nullable) == (pa.type_for_alias(axis.arrow), axis.nullable), axis.name
    for schema, table in ((RUN_SCHEMA, RUN_COLUMNS), (STEP_SCHEMA, STEP_COLUMNS)):
        for field in schema:
            column = table[field.name]
            assert field.type == column.type and field.metadata == {
                b"unit": column.unit.encode(), b"description": column.meaning.encode(),
                b"writer": column.writer.encode(), b"filled": column.filled.text.encode()}
    assert dictionary.run_columns() == {c.name: (c.unit, c.meaning) for c in RUN_COLUMNS.values()}
    assert dictionary.RUN["mfu"] == ("fraction", RUN_COLUMNS["mfu"].meaning)
    docs = (REPO / "docs" / "data-dictionary.md").read_text()
    assert docs == columns.markdown(), "docs/data-dictionary.md is stale: python -m scalelab.planning.columns > docs/data-dictionary.md"


def test_worker_columns_are_null_unless_the_run_ended_ok():
    """The launcher reads the worker's result back only from a run whose ranks all finished:
    a worker column that claims a value in any other row would be a writer the table does not name; and so are the
    formula columns collection computes beside a trained run's measurements."""
    for column in RUN_COLUMNS.values():
        if column.writer == "worker" or column.name in TRAINED_RUN_COLUMNS:
            assert column.filled.at_most is not None and not column.filled.at_most({"status": "failed"}), column.name


def test_steps_table_holds_what_arrow_makes_of_the_records():
    """steps_table (read through Arrow's JSON reader) equals the table pyarrow builds from the same rows: NaN
    and infinite losses of a diverged run, nulls, an int where a float goes, no rows, more rows than one
    of the reader's blocks holds, and a float where an int goes (which the reader refuses)."""
    import math

    identity = {"run_id": "fp16-z0-w1", "precision": "fp16", "zero_stage": 0, "world_size": 1, "micro_batch": 4,
                "activation_checkpointing": False, "cpu_offload": False, "bucket_mb": None, "compile": False,
                "model": "base", "lora_rank": None, "grad_reduce": "fp32", "replicas": 1, "tensor_parallel": 1,
                "sequence_parallel": False, "pipeline_parallel": 1, "pipeline_schedule": "1f1b", "repeat": 1}
    assert set(identity) == {c.name for c in IDENTITY}
    records = [{"step": 0, "loss": 5.0, "grad_norm": 1, "lr": 0, "loss_scale": 65536.0, "skipped": False,
                "step_time_s": 0.25, "tokens": 256},
               {"step": 1, "loss": math.nan, "grad_norm": math.inf, "lr": 1e-3, "loss_scale": 32768.0, "skipped": True,
                "step_time_s": None, "tokens": 256},
               {"step": 2, "loss": -math.inf, "grad_norm": None, "lr": 1e-3, "loss_scale": None, "skipped": None,
                "step_time_s": 0.0, "tokens": 256}]
    many = [{**records[0], "step": i} for i in range(5000)]  # ~2.5 MB of rows: several of the reader's 1 MiB blocks
    integral_float = [{**records[0], "tokens": 256.0}]  # the reader refuses it where pyarrow converts it: still written
    for recs in (records, [], many, integral_float):
        built = result_tables.steps_table(identity, recs)
        rows = [{**r, **identity, "tokens_per_s": r["tokens"] / r["step_time_s"] if r["step_time_s"] else None} for r in recs]
        expected = pa.Table.from_pylist(rows, schema=STEP_SCHEMA)
        assert built.schema.equals(STEP_SCHEMA, check_metadata=True)
        assert _nan_equal(built.to_pylist(), expected.to_pylist()), recs[:3]


def _nan_equal(a: list[dict], b: list[dict]) -> bool:
    import math

    same = lambda x, y: x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))  # noqa: E731
    return len(a) == len(b) and all(r.keys() == s.keys() and all(same(r[k], s[k]) for k in r) for r, s in zip(a, b))
