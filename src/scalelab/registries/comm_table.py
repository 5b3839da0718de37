"""The collective benchmark's table (``scalelab bench comm``, scalelab.run.commbench): where a sweep keeps
it, the columns it must hold, writing and reading it. Torch-free: the step-time model
(scalelab.formulas.link_fit) and the CLI read it without the benchmark's run code."""
from __future__ import annotations

from pathlib import Path

from scalelab.registries.hardware import OTHER_WORK_WARN

BENCH_FILE = Path("calibration") / "comm.parquet"
"""Below the results folder: a sweep's calibration lives with its results."""

TABLE_COLUMNS = ("collective", "world_size", "bytes", "time_s", "algbw_Bps", "busbw_Bps")
"""The columns a benchmark table must hold (scalelab.formulas.link_fit.fit_link reads them)."""


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


BUSY_COLUMN = "busy_share_before"
"""The share of the ranks' cores other processes kept busy in the half second before each world size's ranks
started (scalelab.run.calibration.busy_share); tables from before it hold only the machine's 1-minute load."""


def busy_before(table) -> float | None:
    """The largest share of a CPU table's ranks' cores other processes kept busy as its ranks started, over its world
    sizes; None for a GPU table (NCCL's times hardly depend on the host's cores), a table from before the column,
    or where /proc/stat could not say."""
    if table is None or BUSY_COLUMN not in table.columns or not cpu_table(table):
        return None
    known = table[BUSY_COLUMN].dropna()
    return float(known.max()) if len(known) else None


def cpu_table(table) -> bool:
    """A CPU benchmark's table (tables without device_type are taken as CPU ones: bench comm wrote it from the start)."""
    return "device_type" not in table.columns or bool((table["device_type"] == "cpu").all())


def busy_warns(share: float | None) -> bool:
    """Whether a busy share (busy_before) is beyond OTHER_WORK_WARN."""
    return share is not None and share > OTHER_WORK_WARN


def busy_text(share: float, whose: str) -> str:
    """What a table's busy share says, one sentence: the share, and beyond OTHER_WORK_WARN what it means."""
    text = f"other processes kept {share:.1%} of {whose} cores busy as the ranks started"
    if busy_warns(share):
        text += " (if they went on, they shared the cores: these times may include their work; measure again on an idle machine)"
    return text


def format_table(table) -> str:
    """nccl-tests' columns, one line per row."""
    lines = [f"{'collective':<15}{'n':>3}{'batch':>6}{'bytes':>12}{'time us':>12}{'mean us':>12}{'algbw GB/s':>12}"
             f"{'busbw GB/s':>12}"]
    for row in table.itertuples():
        lines.append(f"{row.collective:<15}{row.world_size:>3}{row.batch:>6}{row.bytes:>12}{row.time_s * 1e6:>12.1f}"
                     f"{row.time_s_mean * 1e6:>12.1f}"
                     f"{row.algbw_Bps / 1e9:>12.3f}{row.busbw_Bps / 1e9:>12.3f}")
    return "\n".join(lines)
