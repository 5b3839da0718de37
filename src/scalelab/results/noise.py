"""Run-to-run noise: the repeats of a point, their median and spread, and which differences exceed it.

A sweep repeats points (the config's ``repeats:``: at least its baseline): repeats differ in nothing
but timing (same seed, same data, bit-identical losses), so their tokens/s say how far a second run
of the same sweep could move any figure. Every comparison the report draws (best configuration,
scaling efficiency, precision and stage ratios) and ``scalelab compare`` read it from here: a
difference that noise alone could produce is labelled "within noise", never ranked. The noise is
pooled within one model (``model_noise``; scalelab.results.like): another model's step takes
another time, and its repeats do not say how far this one's move.

Two figures describe the noise:
- the spread, (max - min) / median of a point's ok repeats, the largest over repeated points: what
  a user reads ("identical runs differed by up to 20%");
- sigma, the standard deviation of one run's log tokens/s, pooled over every repeated point (each
  around its own mean), with its degrees of freedom (runs - points). The verdicts use it: a figure
  built from points (a point's median, a ratio of two points, a scaling efficiency) moves by the
  variances of its points added; a difference is called real only where noise alone would exceed it
  less than 1 time in 100 (two-sided 99%, Student's t for the few repeats a sweep has).
Why not the spread itself: the range of three runs is about 1.7 sigma, while the difference of two
single runs has sigma * sqrt(2) and a ratio of two points' ratios twice that again. Compared with the
spread, two sweeps of one commit disagreed on a scaling efficiency they each had from two single runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scalelab.registries.hardware import unsteady

MEASURED = "tokens_per_s"
"""The figure repeats are compared on (step time and MFU move with it)."""

CONFIDENCE = 0.99
"""Two-sided: a difference is real where noise alone exceeds it less than 1 time in 100. A report
draws dozens of comparisons; at 95% two sweeps of pure noise would disagree on a few of them."""

_T_99 = ((1, 63.657), (2, 9.925), (3, 5.841), (4, 4.604), (5, 4.032), (6, 3.707), (7, 3.499), (8, 3.355), (9, 3.250),
         (10, 3.169), (12, 3.055), (15, 2.947), (20, 2.845), (30, 2.750), (60, 2.660), (120, 2.617))
"""Student's t, two-sided 99% quantile (0.995), by degrees of freedom (standard tables)."""


def t_quantile(dof: int) -> float:
    """Student's t quantile of CONFIDENCE at the largest tabulated dof not above ``dof`` (conservative
    between rows); the normal quantile beyond the table."""
    if dof < 1:
        raise ValueError("no degrees of freedom: the noise is unknown")
    return next((t for d, t in reversed(_T_99) if d <= dof), 63.657) if dof <= 120 else 2.576


_MEDIAN_VARIANCE = {1: 1.0, 2: 0.5, 3: 0.4487, 4: 0.3613, 5: 0.2868}
"""Variance of the median of n normal runs in units of one run's (exact; n = 2 and 4 average the middle two)."""


def median_variance(n: int) -> float:
    """The variance of the median of ``n`` runs, in units of one run's variance: exact for normal
    noise up to five runs, pi / (2n) beyond (its limit, approached from below: conservative)."""
    n = int(n)
    if n < 1:
        raise ValueError("a median of no runs")
    return _MEDIAN_VARIANCE.get(n, math.pi / (2 * n))


def config_ids(runs: pd.DataFrame) -> pd.Series:
    """The run id of each row's first run: its repeats share it (``fp32-z0-w1-r2`` -> ``fp32-z0-w1``).
    Rows of a table written before repeats existed are first runs."""
    ids = runs["run_id"].astype(str)
    if "repeat" not in runs:
        return ids
    return ids.where(runs["repeat"].fillna(1) <= 1, ids.str.replace(r"-r\d+$", "", regex=True))


def repeat_spreads(runs: pd.DataFrame, value: str = MEASURED) -> pd.DataFrame:
    """Per point (config_id) over its ok runs: n, median, min, max, the relative spread
    (max - min) / median (NaN with one run), the sum of squared deviations of log value from the
    point's mean (``ss_log``: what sigma pools), the largest host_steal_share of its runs (``steal_max``) and how many
    of them changed speed beyond DRIFT_WARN while timed (``drifted``, from step_time_drift)."""
    ok = runs[(runs["status"] == "ok") & runs[value].notna() & (runs[value] > 0)]
    ok = ok.assign(config_id=config_ids(ok), _log=np.log(ok[value].astype(float)))
    grouped = ok.groupby("config_id")
    table = grouped[value].agg(n="size", median="median", min="min", max="max")
    table["spread"] = np.where(table["n"] >= 2, (table["max"] - table["min"]) / table["median"], np.nan)
    # whole columns, then one grouped sum each: a function per point (groupby's agg(lambda)) made this a tenth
    # of a report's time, which asks for the noise of its runs many times
    table["ss_log"] = ((ok["_log"] - grouped["_log"].transform("mean")) ** 2).groupby(ok["config_id"]).sum()
    # the most the hypervisor took from any of the point's runs (tables before schema 10: unknown)
    table["steal_max"] = grouped["host_steal_share"].max() if "host_steal_share" in ok else np.nan
    # runs whose speed was not steady while they were timed (tables before schema 11: none known)
    table["drifted"] = (unsteady(ok["step_time_drift"]).groupby(ok["config_id"]).sum().astype(int)
                        if "step_time_drift" in ok else 0)
    return table


@dataclass(frozen=True)
class Noise:
    """The run-to-run noise a sweep measured on its repeated points."""
    spread: float | None
    """The largest (max - min) / median over repeated points; None when no point ran twice."""
    worst: str | None
    """The point with that spread."""
    points: int
    """Points that ran at least twice."""
    runs: int
    """Runs of those points."""
    sigma: float | None = None
    """Standard deviation of one run's log tokens/s, pooled over the repeated points."""
    dof: int = 0
    """Its degrees of freedom: runs - points."""

    @property
    def known(self) -> bool:
        return self.sigma is not None and self.dof >= 1

    def margin(self, *runs_per_point: int) -> float | None:
        """The relative change (larger / smaller - 1) that noise alone exceeds less than 1 time in 100
        for a figure of these points (the median of each point's runs, combined by products and
        quotients: a difference of two points, a ratio, an efficiency): None when unknown."""
        if not self.known:
            return None
        variance = self.sigma ** 2 * sum(median_variance(n) for n in runs_per_point)
        return math.expm1(t_quantile(self.dof) * math.sqrt(variance))

    def within(self, a: float, b: float, runs_a: int = 1, runs_b: int = 1) -> bool | None:
        """Whether two tokens/s figures (medians of ``runs_a`` and ``runs_b`` runs) differ by no more
        than noise alone could (None: unknown, no repeats)."""
        if not self.known or not (np.isfinite(a) and np.isfinite(b)) or min(a, b) <= 0:
            return None
        return relative_change(a, b) <= self.margin(runs_a, runs_b)

    def sentence(self) -> str:
        """``text`` as a sentence of a paragraph (capitalised, with its full stop)."""
        text = self.text()
        return text[0].upper() + text[1:] + "."

    def text(self) -> str:
        if self.spread is None:
            return ("run-to-run spread unknown: no point ran twice (set repeats.baseline or repeats.points above 1); "
                    "differences below ~35% between single runs on a shared machine may be noise")
        text = (f"run-to-run spread of tokens/s: up to {self.spread:.1%} between identical runs "
                f"({self.worst}; {self.points} point(s) repeated, {self.runs} runs)")
        if self.known:
            text += (f"; noise alone moves two single runs apart by up to {self.margin(1, 1):.0%} "
                     f"({CONFIDENCE:.0%}; sigma {self.sigma:.1%} per run, {self.dof} degree(s) of freedom)")
        return text


def relative_change(a, b):
    """|a - b| over the smaller of the two (scalars or arrays): what the noise is compared with."""
    return np.abs(a - b) / np.minimum(a, b)


def sweep_noise(runs: pd.DataFrame, value: str = MEASURED) -> Noise:
    """The noise pooled over the repeated points of ``runs``. Pool one model's runs only
    (``model_noise``): another model's steps take another time, and its repeats say nothing of these."""
    spreads = repeat_spreads(runs, value)
    repeated = spreads[spreads["n"] >= 2]
    if repeated.empty:
        return Noise(None, None, 0, 0)
    worst = repeated["spread"].idxmax()
    runs_n, dof = int(repeated["n"].sum()), int((repeated["n"] - 1).sum())
    return Noise(float(repeated.loc[worst, "spread"]), str(worst), len(repeated), runs_n,
                 sigma=math.sqrt(float(repeated["ss_log"].sum()) / dof), dof=dof)


@dataclass(frozen=True)
class ModelNoise:
    """The run-to-run noise of a sweep of several models: each pooled over its own model's repeated
    points (scalelab.results.like), never over another's. ``of(model)`` is one model's Noise."""
    by_model: dict[str, Noise]

    def of(self, model: str) -> Noise:
        return self.by_model[model]

    @property
    def known(self) -> bool:
        """Whether every model's noise is known."""
        return all(n.known for n in self.by_model.values())

    def text(self) -> str:
        """One line per model."""
        return "\n".join(f"model {m}: {n.text()}" for m, n in self.by_model.items())

    def sentence(self) -> str:
        return " ".join(f"Model {m}: {n.text()}." for m, n in self.by_model.items())


def model_noise(runs: pd.DataFrame, value: str = MEASURED) -> Noise | ModelNoise:
    """The run-to-run noise of a sweep, pooled within each model (scalelab.results.like): a Noise
    where the runs hold one model, else a ModelNoise."""
    from scalelab.results.like import by_model

    noises = {label: sweep_noise(mine, value) for label, mine in by_model(runs)}
    return next(iter(noises.values())) if len(noises) == 1 else ModelNoise(noises) if noises else sweep_noise(runs, value)


def margin_between(noise_a: Noise, runs_a: tuple[int, ...], noise_b: Noise, runs_b: tuple[int, ...]) -> float | None:
    """The relative change between one figure as two sweeps measured it (from the points of
    ``runs_a`` in A and ``runs_b`` in B) that noise alone exceeds less than 1 time in 100. Each
    side's variance is its own sigma's; a sweep that repeated nothing borrows the other's (same
    machine assumed; None when neither did). Degrees of freedom add up."""
    known = [n for n in (noise_a, noise_b) if n.known]
    if not known:
        return None
    a = noise_a if noise_a.known else known[0]
    b = noise_b if noise_b.known else known[0]
    variance = (a.sigma ** 2 * sum(median_variance(n) for n in runs_a)
                + b.sigma ** 2 * sum(median_variance(n) for n in runs_b))
    dof = sum(n.dof for n in known)
    return math.expm1(t_quantile(dof) * math.sqrt(variance))


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
