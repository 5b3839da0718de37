"""A fault drill's counted facts (Drill: faults injected and recovered, rows lost or duplicated, corrupt files,
orphan processes, checks failed) and how a finished sweep is audited for them (audit, count_orphans)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.harness.testing import processes_mentioning
from scalelab.planning.sweep import RUN_DIR_GLOB, sweep_points


@dataclass
class Drill:
    name: str
    faults_injected: int = 0
    faults_recovered: int = 0
    rows_lost: int = 0
    rows_duplicated: int = 0
    corrupt_files: int = 0
    orphan_processes: int = 0
    bad_configs_tried: int = 0
    bad_configs_rejected: int = 0
    timeouts_tried: int = 0
    timeouts_honoured: int = 0
    checks_failed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> bool:
        if not ok:
            self.checks_failed.append(what)
        return ok


def audit(workdir: Path, cfg: dict, drill: Drill) -> None:
    """Count lost/duplicated rows and corrupt or stray files of a finished sweep."""
    import pandas as pd
    import pyarrow.parquet as pq

    results = workdir / cfg["results_dir"]
    expected = {p.run_id for p in sweep_points(cfg)}
    for summary in results.glob(f"runs/{RUN_DIR_GLOB}/summary.json"):
        try:
            json.loads(summary.read_text())["status"]
        except (ValueError, KeyError):
            drill.corrupt_files += 1
            drill.notes.append(f"corrupt {summary}")
    tables = {}
    for name in ["metrics.parquet", "steps.parquet", *[str(p.relative_to(results)) for p in results.glob(f"runs/{RUN_DIR_GLOB}/steps.parquet")]]:
        try:
            tables[name] = pq.read_table(results / name).to_pandas()
        except Exception as err:  # unreadable or missing
            drill.corrupt_files += 1
            drill.notes.append(f"unreadable {name}: {type(err).__name__}")
    stray = [p for p in results.rglob(".*.tmp")]
    drill.corrupt_files += len(stray)
    drill.notes += [f"stray temporary {p}" for p in stray]
    runs = tables.get("metrics.parquet", pd.DataFrame(columns=["run_id", "status"]))
    drill.rows_lost += len(expected - set(runs["run_id"]))
    drill.rows_duplicated += int(runs["run_id"].duplicated().sum())
    steps = tables.get("steps.parquet", pd.DataFrame(columns=["run_id", "step"]))
    drill.rows_duplicated += int(steps.duplicated(["run_id", "step"]).sum())
    for run in runs[runs["status"] == "ok"].itertuples():
        got = steps.loc[steps["run_id"] == run.run_id, "step"].nunique()
        drill.rows_lost += cfg["train"]["steps"] - got


def count_orphans(marker: str, drill: Drill, grace_s: float = 5.0) -> None:
    deadline = time.time() + grace_s
    while (left := processes_mentioning(marker)) and time.time() < deadline:
        time.sleep(0.2)
    drill.orphan_processes += len(left)
    drill.notes += [f"orphan: {p}" for p in left]
