"""Run-to-run noise: the repeats of a point, their median and spread, and which differences exceed it.

A sweep repeats points (the config's ``repeats:``: at least its baseline): repeats differ in nothing
but timing (same seed, same data, bit-identical losses), so the spread of their tokens/s is what a
second run of the same sweep could move any figure by. Every comparison the report draws (best
configuration, scaling efficiency, precision and stage ratios) and ``scalelab compare`` read it from
here: a difference no larger than the noise is labelled "within noise", never ranked.

Spread of a point = (max - min) / median of its ok repeats' tokens/s. The sweep's noise = the
largest spread over its repeated points: conservative, so that a difference called real is larger
than anything identical runs were seen to differ by.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MEASURED = "tokens_per_s"
"""The figure repeats are compared on (step time and MFU move with it)."""


def config_ids(runs: pd.DataFrame) -> pd.Series:
    """The run id of each row's first run: its repeats share it (``fp32-z0-w1-r2`` -> ``fp32-z0-w1``).
    Rows of a table written before repeats existed are first runs."""
    ids = runs["run_id"].astype(str)
    if "repeat" not in runs:
        return ids
    return ids.where(runs["repeat"].fillna(1) <= 1, ids.str.replace(r"-r\d+$", "", regex=True))


def repeat_spreads(runs: pd.DataFrame, value: str = MEASURED) -> pd.DataFrame:
    """Per point (config_id) over its ok runs: n, median, min, max and the relative spread
    (max - min) / median (NaN with one run)."""
    ok = runs[(runs["status"] == "ok") & runs[value].notna()]
    grouped = ok.assign(config_id=config_ids(ok)).groupby("config_id")[value]
    table = grouped.agg(n="size", median="median", min="min", max="max")
    table["spread"] = np.where(table["n"] >= 2, (table["max"] - table["min"]) / table["median"], np.nan)
    return table


@dataclass(frozen=True)
class Noise:
    """The run-to-run spread a sweep measured on its repeated points."""
    spread: float | None
    """The largest (max - min) / median over repeated points; None when no point ran twice."""
    worst: str | None
    """The point with that spread."""
    points: int
    """Points that ran at least twice."""
    runs: int
    """Runs of those points."""

    def within(self, a: float, b: float) -> bool | None:
        """Whether two tokens/s figures differ by no more than the noise (None: unknown, no repeats)."""
        if self.spread is None or not (np.isfinite(a) and np.isfinite(b)) or min(a, b) <= 0:
            return None
        return relative_change(a, b) <= self.spread

    def sentence(self) -> str:
        """``text`` as a sentence of a paragraph (capitalised, with its full stop)."""
        text = self.text()
        return text[0].upper() + text[1:] + "."

    def text(self) -> str:
        if self.spread is None:
            return ("run-to-run spread unknown: no point ran twice (set repeats.baseline or repeats.points above 1); "
                    "differences below ~35% between single runs on a shared machine may be noise")
        return (f"run-to-run spread of tokens/s: up to {self.spread:.1%} between identical runs "
                f"({self.worst}; {self.points} point(s) repeated, {self.runs} runs)")


def relative_change(a, b):
    """|a - b| over the smaller of the two (scalars or arrays): what the noise is compared with."""
    return np.abs(a - b) / np.minimum(a, b)


def sweep_noise(runs: pd.DataFrame, value: str = MEASURED) -> Noise:
    spreads = repeat_spreads(runs, value)
    repeated = spreads[spreads["n"] >= 2]
    if repeated.empty:
        return Noise(None, None, 0, 0)
    worst = repeated["spread"].idxmax()
    return Noise(float(repeated.loc[worst, "spread"]), str(worst), len(repeated), int(repeated["n"].sum()))


def medians(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per point: its first run's row, with the timing figures replaced by the median of
    its ok repeats, and how many runs the median is of (``repeats``) and their tokens/s range
    (``tokens_per_s_min``, ``tokens_per_s_max``). Non-ok points keep their first run's row."""
    runs = runs.assign(config_id=config_ids(runs))
    first = runs.sort_values("repeat" if "repeat" in runs else "run_id").drop_duplicates("config_id").set_index("config_id")
    ok = runs[runs["status"] == "ok"]
    timing = [c for c in ("tokens_per_s", "step_time_s_median", "step_time_s_mean", "mfu", "mfu_bf16_peak", "hfu")
              if c in runs]
    stats = ok.groupby("config_id")[timing].median()
    rng = ok.groupby("config_id")[MEASURED].agg(["size", "min", "max"])
    out = first.copy()
    # The median point is 'ok' when any repeat was: a repeat that failed is warned about on its own.
    has_ok = out.index.isin(stats.index)
    out.loc[has_ok, timing] = stats.reindex(out.index[has_ok])
    out.loc[has_ok, "status"] = "ok"
    out["repeats"] = rng["size"].reindex(out.index).fillna(0).astype(int)
    out["tokens_per_s_min"] = rng["min"].reindex(out.index)
    out["tokens_per_s_max"] = rng["max"].reindex(out.index)
    out["run_id"] = out.index
    return out.reset_index(drop=True)
