"""The sweep's forecast decision as a file (planning.top_k): ``<results>/plan/forecast.json``.

The planning process ranks the points (scalelab.forecast.pruning) and decides which run; the
process that runs the jobs writes the decision here, under the results folder's lock; the jobs
(which parse the Snakefile again, on another node under SLURM) and collection read it. Collection
gives a run measured before the forecast existed (a sweep run in full, then with top_k) the
forecast columns it lacks from here. Written by every invocation with top_k that runs jobs, removed
by every one without top_k that runs jobs (onstart); collection's params carry the decision's
``stamp``, so setting, changing or unsetting top_k is always such an invocation. A pruned point's
row says so by its reason (``PRUNED_REASON``, ``is_pruned``): status, the report and the launcher
read it from here, a module that imports no table library (a Snakefile's parse imports it).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from scalelab.io import write_json

PRUNED_REASON = "pruned by prediction"
"""How the reason of a point the sweep's forecast did not run begins (status skipped; planning.top_k,
scalelab.forecast.pruning): a decision, not a failure."""


def is_pruned(status, reason) -> bool:
    """Whether a run's row records a point the forecast pruned (planning.top_k)."""
    return status == "skipped" and str(reason or "").startswith(PRUNED_REASON)


FORECAST_FILE = Path("plan") / "forecast.json"
"""Below the results folder."""


@dataclass(frozen=True)
class Decision:
    """What the plan decided for one point."""
    run_id: str
    forecast: dict | None
    """The rows' forecast columns: forecast_decision always (why it runs or not); forecast_step_time_s,
    forecast_tokens_per_s, forecast_note where the point was forecast; forecast_rank where it was ranked.
    None where planning.top_k is unset."""
    reason: str | None = None
    """Why it is not run (status skipped, starting with PRUNED_REASON); None when it runs."""

    @property
    def pruned(self) -> bool:
        return self.reason is not None

    @property
    def rank(self) -> int | None:
        return (self.forecast or {}).get("forecast_rank")


def forecast_path(results_dir: str | Path) -> Path:
    return Path(results_dir) / FORECAST_FILE


def write(results_dir: str | Path, decisions: dict[str, Decision]) -> Path:
    path = forecast_path(results_dir)
    write_json(path, {run_id: {"forecast": d.forecast, "reason": d.reason} for run_id, d in decisions.items()})
    return path


def read(results_dir: str | Path) -> dict[str, Decision]:
    """The planning process's decisions ({} where it made none: planning.top_k unset, or an older sweep)."""
    path = forecast_path(results_dir)
    if not path.exists():
        return {}
    return {run_id: Decision(run_id, d["forecast"], d["reason"]) for run_id, d in json.loads(path.read_text()).items()}


def stamp(decisions: dict[str, Decision]) -> str | None:
    """A short digest of the decisions' forecasts (None without any): what collection gives rows changes with it."""
    if not decisions:
        return None
    forecasts = {run_id: d.forecast for run_id, d in sorted(decisions.items())}
    return hashlib.sha256(json.dumps(forecasts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def forget(results_dir: str | Path) -> None:
    """An invocation without planning.top_k: no decision of an earlier one is left for collection to read."""
    forecast_path(results_dir).unlink(missing_ok=True)
