"""Links fitted to a ``scalelab bench comm`` table: latency per call and bus bandwidth per collective
(relative least squares on the mean times), and what the table says about the host it was measured on.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scalelab.formulas import links
from scalelab.registries.comm_table import cpu_table
from scalelab.registries.hardware import largest_steal


@dataclass(frozen=True)
class LinkFit:
    """A link fitted to bench rows, and how well it fits them."""

    link: links.Link
    rows: int
    residual: float
    """Root mean square of (fitted - measured) / measured over the rows."""
    scatter: float
    """Root mean square over the rows of the repetitions' relative spread about their mean
    ((max - min) / mean / 4: about one sigma); 0 where the table has no spread columns."""


def _time_column(table) -> str:
    return "time_s_mean" if "time_s_mean" in table.columns else "time_s"


def fit_link_rows(table, world_size: int | None = None, collective: str | None = None, batched: bool = False) -> LinkFit:
    """Fit latency and bus bandwidth to a bench table's rows (world size >= 2; of ``world_size`` and
    ``collective`` when given; calls timed one at a time, or in batches with ``batched``):
    time = alpha + bus_factor x bytes / B, least squares on the relative error, on the mean times
    (a step pays a collective's mean, stalls included) or the medians of a table without means.
    ValueError when the rows cannot determine both."""
    from scalelab.registries.comm_table import TABLE_COLUMNS

    missing = [c for c in TABLE_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"not a bench comm table: lacks {', '.join(missing)}")
    rows = table[table["world_size"] >= 2]
    if world_size is not None:
        rows = rows[rows["world_size"] == world_size]
    if collective is not None:
        rows = rows[rows["collective"] == collective]
    # a table without batches timed one call at a time
    batch = rows["batch"].to_numpy() if "batch" in rows.columns else np.ones(len(rows), dtype=int)
    rows = rows[(batch > 1) if batched else (batch == 1)]
    column = _time_column(rows)
    rows = rows[rows[column] > 0]
    what = (f"{'world size ' + str(world_size) if world_size else 'world sizes >= 2'}{', ' + collective if collective else ''}"
            f"{', batched calls' if batched else ''}")
    if rows["bytes"].nunique() < 2:
        raise ValueError(f"the bench table has fewer than two message sizes for {what}: nothing to fit")
    x = np.array([links.bus_factor(c, int(n)) for c, n in zip(rows["collective"], rows["world_size"], strict=True)]) \
        * rows["bytes"].to_numpy(float)
    y = rows[column].to_numpy(float)
    design = np.stack([np.ones_like(y), x], axis=1) / y[:, None]
    (alpha, inverse_bw), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    if alpha < 0:  # latency below resolution: refit the bandwidth alone
        alpha, inverse_bw = 0.0, float(np.sum(x / y) / np.sum((x / y) ** 2))
    if inverse_bw <= 0:
        raise ValueError(f"the bench table's times for {what} do not grow with the message size: no bandwidth to fit")
    fitted = alpha + x * inverse_bw
    residual = float(np.sqrt(np.mean(((fitted - y) / y) ** 2)))
    scatter = 0.0
    if {"time_s_min", "time_s_max"} <= set(rows.columns):
        scatter = float(np.sqrt(np.mean(((rows["time_s_max"] - rows["time_s_min"]) / y / 4) ** 2)))
    first = rows.iloc[0]
    source = (f"bench comm table: {len(rows)} rows ({what}), {first.get('backend', '?')} on {first.get('device_name', '?')}, "
              f"measured {first.get('measured_utc', '?')}; alpha-beta fit of the {column} column (relative least squares)")
    name = f"bench {first.get('backend', '')} {collective or 'all collectives'}{' batched' if batched else ''}".replace("  ", " ")
    return LinkFit(links.Link(name, 1.0 / inverse_bw, float(alpha), source), len(rows), residual, scatter)


def fit_link(table, world_size: int | None = None) -> links.Link:
    """The link a bench comm table measured: latency per call and bus bandwidth, fitted over every
    collective of its rows at world size >= 2 (of ``world_size`` when given). See fit_link_rows."""
    return fit_link_rows(table, world_size).link


def link_fits(table, world_size: int, batched: tuple[str, ...] = ()) -> dict[str, LinkFit]:
    """Per collective, the fit for ``world_size``: the table's rows of that world size where it
    has them, else of every world size >= 2 (bus bandwidth is comparable across them); of its
    batched rows for the collectives in ``batched`` (Strategy.batched) where it has them; a
    collective the table lacks gets the fit over all its collectives."""
    sizes = set(table["world_size"])
    ws = world_size if world_size in sizes else None
    fits = {}
    for c in links.COLLECTIVES:
        for attempt in ((ws, c, True), (ws, c, False), (ws, None, False)) if c in batched else ((ws, c, False), (ws, None, False)):
            try:
                fits[c] = fit_link_rows(table, *attempt)
                break
            except ValueError:
                continue
        else:
            fits[c] = fit_link_rows(table, ws)  # raises, naming what the table lacks
    return fits

def bench_load(table) -> float | None:
    """A CPU table's largest 1-minute load average before the bench's ranks started (bench comm records it per world
    size), or None for a table without it or a GPU's: context only, the whole machine's over the past minute (bench_busy_share
    says whether the ranks' own cores were busy)."""
    if table is None or "load_1min_before" not in table.columns or not cpu_table(table):  # a GPU's: beside the point
        return None
    return float(table["load_1min_before"].max())


def bench_steal(table) -> float | None:
    """The largest share of its ranks' cores the hypervisor took while bench comm timed the rows the model fits (CPU
    rows of two ranks or more: fit_link_rows), or None for a table without it (written before bench comm measured it,
    off Linux, or a GPU's: NCCL's times hardly depend on the host's cores)."""
    if table is None or "host_steal_share" not in table.columns:
        return None
    fitted = (table["world_size"] >= 2) & (table["device_type"] == "cpu") if "device_type" in table else table["world_size"] >= 2
    return largest_steal(table.loc[fitted, "host_steal_share"])
