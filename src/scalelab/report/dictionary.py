"""The data dictionary as the report reads it: unit and meaning of every column, by name.

A view of the column table (scalelab.planning.columns), where each column is declared once with its
type, writer and null contract; docs/data-dictionary.md is generated there too.
"""
from __future__ import annotations

from scalelab.planning.columns import IDENTITY as _IDENTITY
from scalelab.planning.columns import RUN as _RUN
from scalelab.planning.columns import RUN_COLUMNS, STEP_COLUMNS
from scalelab.planning.columns import STEP as _STEP


def _units_and_meanings(columns) -> dict[str, tuple[str, str]]:
    return {c.name: (c.unit, c.meaning) for c in columns}


IDENTITY = _units_and_meanings(_IDENTITY)
RUN = _units_and_meanings(_RUN)
STEP = _units_and_meanings(_STEP)


def run_columns() -> dict[str, tuple[str, str]]:
    """metrics.parquet's columns in schema order: identity, then the run fields."""
    return _units_and_meanings(RUN_COLUMNS.values())


def step_columns() -> dict[str, tuple[str, str]]:
    return _units_and_meanings(STEP_COLUMNS.values())
