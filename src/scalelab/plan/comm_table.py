"""The collective benchmark's table (``scalelab bench comm``, scalelab.run.commbench): where a sweep keeps
it, the columns it must hold, writing and reading it. Torch-free: the step-time model
(scalelab.results.prediction) and the CLI read it without the benchmark's run code."""
from __future__ import annotations

from pathlib import Path

BENCH_FILE = Path("calibration") / "comm.parquet"
"""Below the results folder: a sweep's calibration lives with its results."""

TABLE_COLUMNS = ("collective", "world_size", "bytes", "time_s", "algbw_Bps", "busbw_Bps")
"""The columns a benchmark table must hold (scalelab.results.prediction.fit_link reads them)."""


def write_table(table, path: str | Path) -> Path:
    """Write the table atomically as Parquet."""
    from scalelab.io import atomic_path

    path = Path(path)
    with atomic_path(path) as tmp:
        table.to_parquet(tmp, index=False)
    return path


def read_table(path: str | Path):
    """A benchmark table, checked for its columns; ValueError naming the file and what it lacks."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no collective benchmark table (measure one: scalelab bench comm --out {path})")
    table = pd.read_parquet(path)
    missing = [c for c in TABLE_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: not a bench comm table (lacks {', '.join(missing)})")
    return table


def format_table(table) -> str:
    """nccl-tests' columns, one line per row."""
    lines = [f"{'collective':<15}{'n':>3}{'batch':>6}{'bytes':>12}{'time us':>12}{'mean us':>12}{'algbw GB/s':>12}"
             f"{'busbw GB/s':>12}"]
    for row in table.itertuples():
        lines.append(f"{row.collective:<15}{row.world_size:>3}{row.batch:>6}{row.bytes:>12}{row.time_s * 1e6:>12.1f}"
                     f"{row.time_s_mean * 1e6:>12.1f}"
                     f"{row.algbw_Bps / 1e9:>12.3f}{row.busbw_Bps / 1e9:>12.3f}")
    return "\n".join(lines)
