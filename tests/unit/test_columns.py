"""The column table (scalelab.plan.columns) against real runs of every status and lever: each column
written by its writer, no summary key that no column holds, null only where its contract says."""

import pyarrow as pa

from scalelab.plan import columns
from scalelab.plan.columns import (
    IDENTITY,
    RUN_COLUMNS,
    RUN_SCHEMA,
    STEP_COLUMNS,
    STEP_SCHEMA,
)
from scalelab.plan.sweep import AXES
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
    assert docs == columns.markdown(), "docs/data-dictionary.md is stale: python -m scalelab.plan.columns > docs/data-dictionary.md"


def test_worker_columns_are_null_unless_the_run_ended_ok():
    """The launcher reads the worker's result back only from a run whose ranks all finished:
    a worker column that claims a value in any other row would be a writer the table does not name."""
    for column in RUN_COLUMNS.values():
        if column.writer == "worker":
            assert column.filled.at_most is not None and not column.filled.at_most({"status": "failed"}), column.name
