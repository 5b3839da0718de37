"""The step-time model: a training step's time from measured compute, each strategy's
collectives on links fitted to a ``scalelab bench comm`` table, and the strategy's overlap.

    step_s = compute_s + exposed_comm_s
    compute_s = c_ref x ((1 - s) + s x tokens / tokens_ref)
    comm_s[c] = calls_c x (alpha_c + bus_factor(c, n) x bytes_c / calls_c / B_c)       (scalelab.formulas.links)
    exposed_comm_s = sum_c comm_s[c] - eta x hidden

* ``c_ref``: the compute time of the same configuration (precision, strategy, model, levers, device,
  threads per rank) measured in the fit set: a run's step time less the communication the model
  gives it there (none at world size 1: a one-rank group moves nothing), the median over repeats,
  at ``tokens_ref`` tokens per rank per step (the nearest the fit set has).
* ``s``, the **token share**: the part of a step's compute that grows with the tokens a rank
  processes (forward, backward); the rest (optimizer, clipping, per-operator dispatch on tiny
  shapes) is paid once per step. Fitted when the fit set holds one configuration at two or more
  token counts; else measured by the reference runs themselves (their half-batch steps, with
  train.measure_s: ``token_share_measured``); otherwise, per configuration, the share of its step
  that its model FLOPs take at the device's peak (FLOPs x tokens / peak over c_ref, at most 1),
  an assumption whose band reaches to a share of 1: stated in every prediction.
* ``alpha_c``, ``B_c``: latency per call and bus bandwidth per collective, fitted to the bench
  table's mean times (relative least squares; ``fit_link``), from its batched rows for what a
  strategy issues as a batch of async calls (Strategy.batched: ZeroRedundancyOptimizer's
  broadcasts); calls and sizes per step from the strategy records (scalelab.formulas.links.collective_sizes
  / collective_calls).
* ``hidden``: what the strategy's overlap facts (Strategy.overlap) let run behind compute: every
  overlapped collective's time but its last call (DDP's last bucket, FSDP2's first gather), at most
  the compute of the window it hides in (backward: 2/3 of compute; the step: all of it).
  ``eta``, the **overlap efficiency**, is fitted (least squares, clipped to [0, 1]) where the fit set
  holds runs that communicate beyond their reference, else DEFAULT_OVERLAP_EFFICIENCY: 0 on CPU (one core
  per rank computes and communicates: gloo has no other core to run on), 0.05 on GPU (fitted to published runs).
* ``f``, the **rank factor**: a rank's compute at a world size above its reference's, over the
  reference's (applied to such runs only). Fitted where the fit set's runs beyond their reference ran
  slower than even no overlap (the residual's sign chooses between eta and f), else DEFAULT_RANK_FACTOR.

Every parameter is printed with its source by ``scalelab predict`` (Model.parameters).

The band (99%): the step moved by 2.576 sigma of its parts' noise: the run-to-run sigma of a step
(scalelab.results.noise, pooled over the fit set's repeated points) on the run and on its compute
reference's median, the link fit's relative residual on each collective's time, a measured token
share's own error carried to the run's token count and, for a run beyond its reference's world size,
the model's own error there (``sigma_model``: fitted from the fit set's runs beyond their reference,
else DEFAULT_MODEL_SIGMA; unknown on a GPU, which the row's note says); widened, where the token share was defaulted,
to the compute it would take at a share of 1. Where no bench table
exists, or a configuration has no compute reference in the fit set, the prediction is null and
``prediction_note`` says why.

On a CPU, ranks on one host share its memory bandwidth, caches and the cores the OS and the
launcher also need: with every core busy a rank computes slower than alone, which no input of the
model measures (contention, not scaling).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from scalelab.formulas import links
from scalelab.formulas.predicted_columns import last_block_kept, model_of_row
from scalelab.plan.comm_table import BUSY_COLUMN, busy_before, busy_text, cpu_table
from scalelab.plan.sweep import AXES
from scalelab.spec.hardware import STEAL_WARN, largest_steal
from scalelab.spec.strategies import STRATEGIES, strategy

OVERLAP_WINDOWS = {"backward": 2 / 3, "step": 1.0}
"""Share of a step's compute a collective can hide behind: gradient reductions run during backward
(about 2/3 of a step's FLOPs: 4N of 6N per token), prefetched gathers during forward and backward."""
DEFAULT_OVERLAP_EFFICIENCY = {"cpu": 0.0, "cuda": 0.05}
"""eta where the fit set cannot fit it (module doc). On a CPU, 0: one core per rank computes and communicates.
On a GPU, 0.05: the value (on a grid of 0.05) at which the step-time model, each series calibrated at its smallest
GPU count (one node), follows 18 published multi-node rows best (scalelab.forecast.published, docs/prediction.md: DDP
on 16-256 H100s and A100s, FSDP on 16-128 H100s; mean absolute error 2.8%, worst 7.5%). Anything from 0 to 0.25 fits
about as well (2.8-3.1%): the rows say that little of the communication added between nodes hides, not a precise
figure. At 1, which NCCL's own stream suggests, DDP over EFA was predicted up to 60% fast. The within-node overlap
is folded into each series' calibrated efficiency, so the rows do not measure it. A traced run of the user's own
(train.profile) measures eta. The compute reference of ``scalelab predict`` on a GPU subtracts the communication
exposed at this value too, so a GPU configuration whose reference runs at more than one rank predicts differently
when it changes, fitted eta or not."""
DEFAULT_RANK_FACTOR = {"cpu": {0: {"bf16": 1.18, None: 1.25},
                                1: {None: 1.65},
                                2: {"fp32": 1.50, None: 1.35},
                                3: {"fp32": 1.75, None: 1.52}}}
"""f per device type, ZeRO stage (hybrid sharding: 3's) and precision (None: any precision without its own value)
where the fit set cannot fit it; 1 elsewhere (a GPU rank owns its device). On a CPU: the medians, over the 96
world-size-2 runs of six default sweeps (2-core VM, torch 2.13, 2026-11-27: one at fa0e9bf, one at 25dada1, four
back to back at 2f1dc55), of (measured step - predicted communication) over the compute predicted from world size
1; None's is the stage's median over every precision. The ranks' gloo threads and the OS share the ranks' cores,
and a sharded strategy's per-call work (FSDP2's copies and hooks, ZeroRedundancyOptimizer's per-parameter
broadcasts) is nearly free at world size 1. A precision has its own value where it stood apart from the others in
at least five of the six sweeps: fp32 above bf16 and fp16 at stage 3 in all six (1.49-2.22 against 1.38-1.60) and
at stage 2 in five (FSDP2 gathers fp32 parameters, twice the 16-bit policies' bytes, on the cores that compute);
bf16 below the others at stage 0 in five. At stage 1 the order changed from sweep to sweep. Per sweep a stage's
median moved with the host's state (stage 1: 1.47-1.97, -11% to +19% of its default): DEFAULT_MODEL_SIGMA
holds that move, and the run-to-run noise terms widen the band further on a noisy host."""
DEFAULT_MODEL_SIGMA = {"cpu": 0.074}
"""The model's own error on a run predicted from a reference at a smaller world size (sigma of log
measured / predicted) where the fit set cannot measure it; the band adds the sweep's own noise terms to it.
On a CPU: the same 96 runs at their 12 medians per stage and precision, rms 0.074 per degree of freedom left.
Not less the 0.059 the noise terms held on average over those six sweeps: most of that error is how far one
sweep's rank factors sit from the six sweeps' medians (the host's state moves a sweep's world-size-2 runs
together, by up to +-15%), which no world-size-1 run sees and a quiet sweep's small noise terms do not hold.
On one default sweep's 16 world-size-2 runs (2026-12-06, 2-core VM; mean error 8.6%, largest 20.6%), bands at
an idle sweep's run-to-run sigma (2-3%) held 81% of them at 0.044 (half-width 15-16%), 94% at 0.074 (21-22%).
None for a GPU: none has been measured there, and the band says so."""


def default_rank_factor(device, stage, precision=None) -> float:
    """f where the fit set has no run of the stage beyond its reference: DEFAULT_RANK_FACTOR's, 1 for a device
    without one."""
    by_precision = DEFAULT_RANK_FACTOR.get(device, {}).get(int(stage))
    if by_precision is None:
        return 1.0
    return by_precision.get(precision, by_precision[None])


MEASURED = "step_time_s_mean"
"""The measured figure the model predicts: the mean step time (tokens_per_s = tokens per step / it)."""
COMPUTE_KEY = (*(axis.name for axis in AXES if axis.changes_compute), "device_type", "device_name", "threads_per_rank")
"""What a compute reference must share with the run it predicts: every axis that changes a rank's
compute (scalelab.plan.sweep.Axis.changes_compute; the world size, micro-batch and accumulation may
differ: the token share carries compute across them) and the device and threads it ran on."""


# ----------------------------------------------------------------------------- one step

TENSOR_PARALLEL = "tensor_parallel "
"""The prefix of tensor parallelism's collectives among a step's (``tensor_parallel all_reduce``): no strategy's
overlap names them, so step_time leaves them on the critical path, where each block's forward and backward wait
for their own (the asynchronous overlaps of Megatron and torchtitan are not run here)."""

@dataclass(frozen=True)
class StepTime:
    """One optimizer step, predicted: seconds."""

    compute_s: float
    comm_s: Mapping[str, float]
    """Seconds per step of each collective type, all calls."""
    exposed_comm_s: float
    """Communication the step waits for: comm_s's total less what overlaps compute."""
    step_s: float


def step_time(zero_stage, compute_s: float, comm_s: Mapping[str, float], *, calls: Mapping[str, int] | None = None,
              overlap_efficiency: float = 1.0) -> StepTime:
    """A step of the strategy keyed ``zero_stage``: compute plus the communication its overlap
    facts (Strategy.overlap) leave exposed. An overlapped collective hides all its calls but the
    last (``calls``; without them, all of it) behind the compute of its window, at most that
    window, scaled by ``overlap_efficiency`` (eta, in [0, 1])."""
    if not (math.isfinite(compute_s) and compute_s >= 0):
        raise ValueError(f"compute_s must be >= 0 seconds, got {compute_s!r}")
    if not 0 <= overlap_efficiency <= 1:
        raise ValueError(f"overlap_efficiency must be in [0, 1], got {overlap_efficiency!r}")
    for c, s in comm_s.items():
        if c.removeprefix(TENSOR_PARALLEL) not in links.COLLECTIVES or not (math.isfinite(s) and s >= 0):
            raise ValueError(f"comm_s[{c!r}] = {s!r}: collectives are {', '.join(links.COLLECTIVES)} (tensor parallelism's "
                             f"prefixed {TENSOR_PARALLEL!r}), seconds >= 0")
    windows = dict(strategy(zero_stage).overlap)
    by_window: dict[str, float] = {}
    for c, seconds in comm_s.items():
        if c in windows:
            n_calls = (calls or {}).get(c)
            hideable = seconds * (1 - 1 / n_calls) if n_calls else seconds
            by_window[windows[c]] = by_window.get(windows[c], 0.0) + hideable
    hidden = 0.0
    for window in sorted(by_window, key=OVERLAP_WINDOWS.get):  # the narrower window first
        hidden = min(hidden + min(by_window[window], OVERLAP_WINDOWS[window] * compute_s), compute_s)
    total = float(sum(comm_s.values()))
    exposed = total - overlap_efficiency * hidden
    return StepTime(float(compute_s), dict(comm_s), exposed, float(compute_s) + exposed)


# ----------------------------------------------------------------------------- links from a bench table

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
    from scalelab.plan.comm_table import TABLE_COLUMNS

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


# ----------------------------------------------------------------------------- a sweep's runs

def _missing(value) -> bool:
    """None, NaN or pandas' NA (a nullable column's null)."""
    import pandas as pd

    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def collectives_of(row: dict, world_size: int | None = None) -> tuple[dict[str, float], dict[str, int]]:
    """(bytes per step as nccl-tests sizes them, calls per step) per collective of a run's row at
    ``world_size`` (its own by default): scalelab.formulas.links' collective_sizes and collective_calls, with
    the row's own bucket size for DDP's all-reduce calls. ValueError saying why a row has none the
    model can use (a custom module, LoRA)."""
    from scalelab.formulas import flops, tensor_parallelism
    from scalelab.formulas.links import collective_calls, collective_sizes

    if row.get("model_family") == "custom":
        raise ValueError("a custom module: its FSDP units and parameter tensors are not known to the model")
    if not _missing(row.get("lora_rank")):
        raise ValueError("a LoRA run: its collectives move the trainable parameters only, which the model does not size")
    if not _missing(row.get("replicas")) and int(row["replicas"]) > 1:
        raise ValueError("hybrid sharding: its collectives over replica and shard groups are not sized by the model yet")
    n = int(world_size or row["world_size"])
    stage, precision = int(row["zero_stage"]), row["precision"]
    k = int(row.get("accumulation_steps") or 1)
    cfg = model_of_row(row)
    n_params = row.get("n_params")
    n_params = flops.param_count(cfg) if _missing(n_params) else int(n_params)
    degree = _tensor_parallel(row)
    if degree > 1:  # the strategy over the data-parallel ranks, on each rank's share
        n, n_params = tensor_parallelism.data_parallel_size(n, degree), int(tensor_parallelism.tensor_parallel_params(cfg, n_params, degree))
    grad_reduce = row.get("grad_reduce") or "fp32"
    kept = last_block_kept(row)
    sizes = collective_sizes(n_params, stage, n, precision, accumulation_steps=k, grad_reduce=grad_reduce,
                             last_block_params=kept)
    bucket_mb = row.get("bucket_mb")  # the run's own bucket cap (null for strategies without buckets)
    calls = collective_calls(cfg, stage, precision, sizes, accumulation_steps=k,
                             bucket_mb=None if _missing(bucket_mb) else float(bucket_mb), tensor_parallel=degree,
                             last_block_kept=kept > 0)
    return sizes, calls


def comm_seconds(sizes: Mapping[str, float], calls: Mapping[str, int], world_size: int,
                 fits: Mapping[str, LinkFit]) -> dict[str, float]:
    """Seconds per step of each collective: its calls, each of its share of the bytes (a tensor-parallel one's
    kind read past its prefix)."""
    return {c: calls[c] * links.collective_seconds(c.removeprefix(TENSOR_PARALLEL), sizes[c] / calls[c], world_size,
                                                   fits[c].link) for c in sizes}


def _tensor_parallel(row) -> int:
    return 1 if _missing(row.get("tensor_parallel")) else int(row["tensor_parallel"])


def _flag(value) -> bool:
    """A lever's flag, null (an older table's NaN or NA) read as off."""
    return not _missing(value) and bool(value)


def tensor_parallel_collectives(row: dict) -> tuple[dict[str, float], dict[str, int]]:
    """(bytes per step as nccl-tests sizes them, calls per step) of a run's tensor-parallel collectives over its
    group (tensor_parallelism.tensor_parallel_comm), keyed ``tensor_parallel <collective>``; none without it."""
    from scalelab.formulas import tensor_parallelism

    degree = _tensor_parallel(row)
    if degree == 1:
        return {}, {}
    comm = tensor_parallelism.tensor_parallel_comm(
        model_of_row(row), int(row["micro_batch"]), int(row.get("accumulation_steps") or 1), degree, row["precision"],
        int(row["zero_stage"]), row.get("device_type") or "cpu", _flag(row.get("activation_checkpointing")),
        _flag(row.get("sequence_parallel")))
    sizes = {TENSOR_PARALLEL + c: nbytes / links.handed_per_size(c) for c, (nbytes, _) in comm.items()}
    return sizes, {TENSOR_PARALLEL + c: calls for c, (_, calls) in comm.items()}


def run_comm(model: "Model", row: dict) -> tuple[dict[str, float], dict[str, int], float] | str:
    """A run's communication: (seconds per collective, calls, the link fits' error in seconds), or why there is
    none. The strategy's collectives over its data-parallel ranks; tensor parallelism's over its group
    (TENSOR_PARALLEL), each on the bench table's links fitted at that group's size."""
    from scalelab.formulas import tensor_parallelism

    degree = _tensor_parallel(row)
    data_ranks = tensor_parallelism.data_parallel_size(int(row["world_size"]), degree)
    try:
        sizes, calls = collectives_of(row)
        tp_sizes, tp_calls = tensor_parallel_collectives(row)
    except (ValueError, TypeError, KeyError) as err:  # TypeError, KeyError: a row without the model's shape
        return f"no communication model: {err}"
    comm, sigma2 = {}, 0.0
    for group, group_sizes, group_calls, batched in ((data_ranks, sizes, calls, strategy(row["zero_stage"]).batched),
                                                     (degree, tp_sizes, tp_calls, ())):
        if group < 2 or not group_sizes:
            continue  # a one-rank group moves nothing
        fits = model.link_fits(group, batched)
        if fits is None:
            return (f"no bench comm table: communication over {group} ranks unknown (measure one: snakemake bench_comm, "
                    "or scalelab bench comm)")
        fitted = {c: fits[c.removeprefix(TENSOR_PARALLEL)] for c in group_sizes}
        seconds = comm_seconds(group_sizes, group_calls, group, fitted)
        comm.update(seconds)
        # the fit's own error on the bench (systematic); a call's scatter about its mean averages out over a run's calls
        sigma2 += sum((seconds[c] * fitted[c].residual) ** 2 for c in seconds)
    return comm, {**calls, **tp_calls}, math.sqrt(sigma2)


def _tokens_or_nan(row) -> float:
    try:
        return tokens_per_rank(row)
    except (TypeError, ValueError, KeyError):
        return math.nan


def tokens_per_rank(row) -> float:
    """Tokens one rank processes per optimizer step: micro-batch x accumulation steps x sequence length."""
    return float(row["micro_batch"]) * float(row.get("accumulation_steps") or 1) * float(row["seq_len"])


@dataclass
class Model:
    """A fitted step-time model: its parameters, each named with where it came from."""

    table_path: str | None
    fits: dict[tuple, dict[str, LinkFit]] = field(default_factory=dict)
    """Per (world size, batched collectives), per collective: the link fit (computed on demand from the table)."""
    table: object = None
    references: object = None
    """One row per compute reference: the COMPUTE_KEY columns, tokens per rank, compute seconds, runs,
    and the per-step and per-token seconds where the fit set gives two token counts."""
    overlap_efficiency: dict[str, float] = field(default_factory=dict)
    overlap_source: dict[str, str] = field(default_factory=dict)
    rank_factor: dict[tuple[str, int], float | None] = field(default_factory=dict)
    """f per (device type, ZeRO stage): a rank's compute at a world size above its reference's, over the reference's
    (None: defaulted per precision, default_rank_factor)."""
    rank_factor_source: dict[tuple[str, int], str] = field(default_factory=dict)
    model_sigma: dict[str, float | None] = field(default_factory=dict)
    """Per device type: the model's error on a run predicted across world sizes (None: unknown)."""
    model_sigma_source: dict[str, str] = field(default_factory=dict)
    sigma: float | None = None
    """Run-to-run sigma of a run's log step time (scalelab.results.noise), pooled over repeated points."""
    sigma_source: str = ""
    fit_runs: int = 0

    def link_fits(self, world_size: int, batched: tuple[str, ...] = ()) -> dict[str, LinkFit] | None:
        if self.table is None:
            return None
        if (world_size, batched) not in self.fits:
            self.fits[(world_size, batched)] = link_fits(self.table, world_size, batched)
        return self.fits[(world_size, batched)]

    def parameters(self) -> list[dict]:
        """Every fitted or defaulted parameter: name, value, unit, source (what `scalelab predict` prints)."""
        out = []
        sizes = sorted(set(self.table["world_size"])) if self.table is not None else []
        batched = tuple(sorted({c for s in STRATEGIES.values() for c in s.batched}))
        for n in [s for s in sizes if s >= 2]:
            fits = {**{c: f for c, f in self.link_fits(n).items()},
                    **{f"{c} batched": f for c, f in self.link_fits(n, batched).items() if c in batched}}
            for c, f in fits.items():
                out.append({"name": f"alpha[{c}, n={n}]", "value": f.link.latency_s, "unit": "s per call",
                            "source": f"fitted: {f.rows} bench rows, residual {f.residual:.0%} rms"})
                out.append({"name": f"B[{c}, n={n}]", "value": f.link.bandwidth_Bps, "unit": "B/s bus bandwidth",
                            "source": f"fitted: {f.rows} bench rows"})
        for device, eta in self.overlap_efficiency.items():
            out.append({"name": f"eta[{device}]", "value": eta, "unit": "overlap efficiency", "source": self.overlap_source[device]})
        for (device, stage), f in self.rank_factor.items():
            values = list(DEFAULT_RANK_FACTOR[device][int(stage)].items()) if f is None else [(None, f)]
            for precision, value in values:
                out.append({"name": f"f[{device}, z{stage}{', ' + precision if precision else ''}]", "value": value,
                            "unit": "compute, across world sizes", "source": self.rank_factor_source[device, stage]
                            + (": any other precision" if precision is None and len(values) > 1 else "")})
        for device, m in self.model_sigma.items():
            out.append({"name": f"sigma_model[{device}]", "value": m, "unit": "log step, across world sizes",
                        "source": self.model_sigma_source[device]})
        out.append({"name": "sigma", "value": self.sigma, "unit": "log step time, one run", "source": self.sigma_source})
        if self.references is not None:
            for ref in self.references.itertuples():
                key = "/".join(str(getattr(ref, k)) for k in ("precision", "zero_stage", "model") if hasattr(ref, k))
                out.append({"name": f"c_ref[{key}, {ref.tokens_per_rank:g} tok]", "value": ref.compute_s, "unit": "s",
                            "source": f"measured: median of {ref.runs} run(s), less their communication"})
                out.append({"name": f"s[{key}, {ref.tokens_per_rank:g} tok]", "value": ref.token_share, "unit": "token share",
                            "source": ref.token_share_source})
        return out


def _ok(runs):
    return runs[(runs["status"] == "ok") & runs[MEASURED].notna()]


def _key(row) -> tuple:
    return tuple(None if _missing(row.get(k)) else row.get(k) for k in COMPUTE_KEY)


def fit(runs, table=None, table_path: str | None = None) -> Model:
    """Fit the model to ``runs`` (a metrics table's rows: the fit set) and a bench table (None: no
    communication figures; predictions of runs that communicate are then null, with the reason)."""
    import pandas as pd

    from scalelab.results.noise import sweep_noise

    model = Model(table_path, table=table)
    ok = _ok(runs).copy()
    model.fit_runs = len(ok)
    if ok.empty:
        raise ValueError("the fit set holds no run that ended ok with a measured step time")
    ok["_key"] = [_key(r) for r in ok.to_dict("records")]
    ok["_tokens"] = [_tokens_or_nan(r) for r in ok.to_dict("records")]
    ok = ok[ok["_tokens"].notna()]  # a row without micro-batch or sequence length cannot be a reference
    if "pipeline_parallel" in ok:  # nor a pipeline's (not modelled: _parts)
        ok = ok[ok["pipeline_parallel"].fillna(1) == 1]
    # The compute references: each key's runs at its smallest world size, less their communication.
    refs = []
    for key, group in ok.groupby("_key", sort=False):
        smallest = group[group["world_size"] == group["world_size"].min()]
        n = int(smallest["world_size"].iloc[0])
        per_tokens = []
        for tokens, at in smallest.groupby("_tokens"):
            first = at.iloc[0].to_dict()
            exposed = 0.0
            if n > 1:
                measured = run_comm(model, first)
                if isinstance(measured, str):
                    continue  # no bench table (or no model of its collectives): communication unknown, so is compute
                comm, calls, _ = measured
                eta = DEFAULT_OVERLAP_EFFICIENCY.get(first.get("device_type"), 0.0)
                exposed = step_time(first["zero_stage"], 0.0, comm, calls=calls, overlap_efficiency=eta).exposed_comm_s
            step = float(at[MEASURED].median())
            compute = step - exposed
            if compute <= 0:  # the modelled communication outlasts the measured step: its compute is unknown
                continue
            flops = first["flops_per_token"] * tokens / first["peak_flops_per_device"] \
                if not _missing(first.get("peak_flops_per_device")) and first.get("peak_flops_per_device") else math.nan
            # the runs' own token share (half-batch steps), of their step: as a share of its compute
            shares = pd.to_numeric(at["token_share_measured"], errors="coerce").dropna() \
                if "token_share_measured" in at else pd.Series(dtype=float)
            measured = min(float(shares.median()) * step / compute, 1.0) if len(shares) and compute > 0 else math.nan
            # its error: the runs' spread where several measured it, else the one run's own (the scatter of its steps)
            sems = pd.to_numeric(at.get("token_share_measured_sem", pd.Series(dtype=float)), errors="coerce").dropna()
            sem = (float(shares.std(ddof=1) / math.sqrt(len(shares))) if len(shares) > 1
                   else float(sems.iloc[0]) if len(shares) == 1 and len(sems) else math.nan)
            per_tokens.append({**dict(zip(COMPUTE_KEY, key, strict=True)), "world_size": n, "tokens_per_rank": tokens,
                               "compute_s": compute, "runs": len(at), "flop_s": flops, "share_measured": measured,
                               "share_runs": len(shares), "share_sem": sem})
        if not per_tokens:
            continue
        frame = pd.DataFrame(per_tokens)
        if len(frame) >= 2:  # a line through the key's token counts: per-step and per-token seconds
            slope, intercept = np.polyfit(frame["tokens_per_rank"], frame["compute_s"], 1)
            slope, intercept = max(float(slope), 0.0), float(intercept)
            for i in frame.index:
                total = intercept + slope * frame.loc[i, "tokens_per_rank"]
                frame.loc[i, "token_share"] = min(max(slope * frame.loc[i, "tokens_per_rank"] / total, 0.0), 1.0) if total > 0 else 1.0
            frame["token_share_source"] = f"fitted: {len(frame)} token counts of this configuration"
        elif np.isfinite(frame["share_measured"].iloc[0]):
            frame["token_share"] = frame["share_measured"]
            frame["token_share_source"] = (f"measured: the half-batch steps of {int(frame['share_runs'].iloc[0])} run(s) "
                                           "of this configuration (token_share_measured)")
        else:
            flop_s = frame["flop_s"].iloc[0]
            share = min(flop_s / frame["compute_s"].iloc[0], 1.0) if np.isfinite(flop_s) and frame["compute_s"].iloc[0] > 0 else 1.0
            frame["token_share"] = share
            frame["token_share_source"] = ("defaulted: one token count in the fit set; the model FLOPs' share of the step "
                                           "at the device's peak" if np.isfinite(flop_s) else
                                           "defaulted to 1 (compute grows with tokens): one token count, no peak FLOP/s")
        refs.append(frame)
    model.references = pd.concat(refs, ignore_index=True) if refs else None
    noise = sweep_noise(ok.assign(_t=1.0 / ok[MEASURED]), "_t")
    if noise.known:
        model.sigma, model.sigma_source = noise.sigma, f"pooled over {noise.points} repeated point(s) of the fit set ({noise.runs} runs)"
    else:
        model.sigma_source = "unknown: no point of the fit set ran twice (the band holds the model's other parts only)"
    _fit_across_ranks(model, ok)
    return model


PREDICTED_COLUMNS = ("predicted_step_time_s", "predicted_step_time_s_low", "predicted_step_time_s_high",
                     "predicted_tokens_per_s", "predicted_exposed_comm_s", "prediction_note")
"""What predict() adds per run: the metrics table's prediction block (scalelab.plan.columns). The compute
part is the step less its exposed communication."""


BAND_GOAL = 0.25
"""A band wider than this either side of its prediction names what widens it, in its note."""
BAND_Z = 2.576
"""The band's half-width in sigmas: 99% of a normal error (the report's confidence, scalelab.results.noise),
not Student's t of the few repeats a sweep has (t = 9.9 at 2 degrees of freedom would make every band
wider than the step)."""


@dataclass(frozen=True)
class _Parts:
    """A run's predicted parts before overlap: its reference, compute, and each collective's time."""
    ref: dict
    tokens: float
    compute_s: float
    """The compute predicted for the run: base_compute_s times f where it runs across world sizes."""
    comm_s: dict
    calls: dict
    comm_sigma_s: float
    base_compute_s: float
    """The reference's compute carried to the run's tokens per rank."""
    across: bool
    """Whether the run's world size exceeds its reference's (f and the model's error apply)."""


def _parts(model: Model, row: dict) -> _Parts | str:
    """The parts of a run's prediction, or the reason there are none."""
    if int(row.get("pipeline_parallel") or 1) > 1:
        return ("pipeline runs are not predicted by the step-time model yet (its compute reference and collectives "
                "take every rank to hold the whole model; scalelab estimate scaling --pipeline-parallel prices them)")
    refs = model.references
    key = _key(row)
    mine = None if refs is None else refs[[tuple(None if _missing(v) else v for v in r) == key
                                           for r in refs[list(COMPUTE_KEY)].itertuples(index=False, name=None)]]
    if mine is None or mine.empty:
        return ("no compute reference: the fit set has no ok run of this configuration "
                f"({', '.join(f'{k}={v}' for k, v in zip(COMPUTE_KEY, key, strict=True) if v is not None)})")
    tokens = _tokens_or_nan(row)
    if math.isnan(tokens):
        return "no micro-batch or sequence length in the row"
    ref = mine.iloc[int(np.argmin(np.abs(np.log(mine["tokens_per_rank"].to_numpy(float) / tokens))))].to_dict()
    share = float(ref["token_share"])
    base = ref["compute_s"] * ((1 - share) + share * tokens / ref["tokens_per_rank"])
    n = int(row["world_size"])
    across = n > int(ref["world_size"])
    device = row.get("device_type")
    stage = int(row["zero_stage"])
    fitted = model.rank_factor.get((device, stage))  # None: defaulted, per precision
    compute = base * ((default_rank_factor(device, stage, row.get("precision")) if fitted is None else fitted)
                      if across else 1.0)
    comm, calls, comm_sigma = {}, {}, 0.0
    if n > 1:
        measured = run_comm(model, row)
        if isinstance(measured, str):
            return measured
        comm, calls, comm_sigma = measured
    return _Parts(ref, tokens, compute, comm, calls, comm_sigma, base, across)


def _noise_terms(model: Model, parts: _Parts, step_s: float) -> dict[str, float]:
    """The variances (s^2) of a prediction's measured inputs: run-to-run noise on the run and on its
    reference's median, the link fit's residual, a measured token share's error."""
    from scalelab.results.noise import median_variance

    ref, sigma = parts.ref, model.sigma or 0.0
    ratio = parts.tokens / ref["tokens_per_rank"]
    # a measured token share's own uncertainty, carried to this token count (d compute / d s = c_ref (ratio - 1)):
    # the spread of the reference's runs' shares, or the one run's own (token_share_measured_sem); in a table
    # without it, the run-to-run noise of its two medians (s ~ 2 (1 - t'/t)): far wider than the within-run error
    share_sigma = 0.0
    if str(ref["token_share_source"]).startswith("measured"):
        sem = ref.get("share_sem")
        share_sigma = float(sem) if sem is not None and np.isfinite(sem) else 2 * math.sqrt(2) * sigma
    return {"run-to-run noise": (sigma * step_s) ** 2 + (sigma * parts.compute_s) ** 2 * median_variance(int(ref["runs"])),
            "the link fit's residual": parts.comm_sigma_s ** 2,
            "the measured token share's error": (ref["compute_s"] * (ratio - 1) * share_sigma) ** 2}


def predict_row(model: Model, row: dict) -> dict:
    """The prediction block of one run's row (PREDICTED_COLUMNS): null figures and the reason
    where the model has none."""
    out = dict.fromkeys(PREDICTED_COLUMNS)
    out["predicted_compute_s"] = None
    parts = _parts(model, row)
    if isinstance(parts, str):
        out["prediction_note"] = parts
        return out
    ref, compute, n = parts.ref, parts.compute_s, int(row["world_size"])
    eta = model.overlap_efficiency.get(row.get("device_type"), DEFAULT_OVERLAP_EFFICIENCY.get(row.get("device_type"), 0.0))
    st = step_time(row["zero_stage"], compute, parts.comm_s, calls=parts.calls, overlap_efficiency=eta)
    model_sigma = model.model_sigma.get(row.get("device_type")) if parts.across else 0.0
    terms = {**_noise_terms(model, parts, st.step_s),
             "the model's error across world sizes": ((model_sigma or 0.0) * st.step_s) ** 2}
    ratio, sigma = parts.tokens / ref["tokens_per_rank"], model.sigma or 0.0
    half = BAND_Z * math.sqrt(sum(terms.values()))
    # a defaulted token share is an assumption between its estimate and 1 (all compute grows with tokens)
    other = ref["compute_s"] * ratio if str(ref["token_share_source"]).startswith("defaulted") else compute
    low, high = min(compute, other) - compute, max(compute, other) - compute
    width = {**{k: BAND_Z * math.sqrt(v) for k, v in terms.items()},
             "the assumed token share (measure it: train.measure_s)": high - low}
    wide = ""
    if (high - low + 2 * half) / 2 > BAND_GOAL * st.step_s:
        wide = (f"; band +-{(high - low + 2 * half) / 2 / st.step_s:.0%}, wider than +-{BAND_GOAL:.0%}: mostly "
                f"{max(width, key=width.get)}" + ("" if sigma else " (run-to-run noise unknown: no repeats)"))
    if parts.across and model_sigma is None:
        wide += (f"; the model's error across world sizes on {row.get('device_type') or 'this device'} is unknown (no run of the fit set "
                 "beyond its reference, no measured default): the band holds noise and the link fit only")
    tokens_per_step = row.get("tokens_per_step")
    if _missing(tokens_per_step):
        tokens_per_step = float(row["global_batch"]) * float(row["seq_len"])
    in_sample = ref["world_size"] == n and ref["tokens_per_rank"] == parts.tokens
    out.update({
        "predicted_step_time_s": st.step_s, "predicted_step_time_s_low": max(st.step_s + low - half, 0.0),
        "predicted_step_time_s_high": st.step_s + high + half, "predicted_tokens_per_s": float(tokens_per_step) / st.step_s,
        "predicted_compute_s": compute, "predicted_exposed_comm_s": st.exposed_comm_s,
        "prediction_note": ("in-sample: compute measured on this configuration at this world size and micro-batch"
                            if in_sample else f"compute from world size {int(ref['world_size'])}, "
                            f"{ref['tokens_per_rank']:g} tokens per rank (token share {float(ref['token_share']):.2f}, "
                            f"{str(ref['token_share_source']).split(':')[0]})") + wide,
    })
    return out


def _fit_across_ranks(model: Model, ok) -> None:
    """Per device type, from the fit set's runs beyond their reference (a larger world size):
    eta, f and the model's error; each device's defaults where it has no such run.

    eta: least squares of (measured - compute - all communication = -eta x what the strategy could
    hide), clipped to [0, 1]. Runs slower than even no overlap (eta clipped at 0) carry f instead,
    the median of (measured - exposed communication) / compute: the residual's sign decides which,
    so the two never trade against each other; f per ZeRO stage. sigma_model: the rms of log measured /
    predicted over those runs (per degree of freedom left by the fitted f: 2 at least), less the
    variance the band's other terms (_noise_terms) already hold."""
    across: dict[str, list[tuple[dict, _Parts]]] = {}
    for row in ok.to_dict("records"):
        parts = _parts(model, row)
        if not isinstance(parts, str) and parts.across and parts.comm_s:
            across.setdefault(row.get("device_type"), []).append((row, parts))
    for device in sorted({d for d in ok["device_type"].dropna()}):
        mine = across.get(device, [])
        _fit_overlap(model, device, mine)
        eta = model.overlap_efficiency[device]
        # what overlap leaves exposed depends on the compute it hides behind: the reference's, carried (f is not known yet)
        exposed = [step_time(r["zero_stage"], p.base_compute_s, p.comm_s, calls=p.calls, overlap_efficiency=eta).exposed_comm_s
                   for r, p in mine]
        stages = sorted({int(s) for s in ok.loc[ok["device_type"] == device, "zero_stage"]})
        for stage in stages:
            of_stage = [((r, p), e) for (r, p), e in zip(mine, exposed, strict=True) if int(r["zero_stage"]) == stage]
            if not of_stage:  # None: DEFAULT_RANK_FACTOR's, per precision, where a run is predicted
                tabled = stage in DEFAULT_RANK_FACTOR.get(device, {})
                model.rank_factor[device, stage] = None if tabled else 1.0
                model.rank_factor_source[device, stage] = (
                    "defaulted: no run of the fit set at this stage beyond its reference ("
                    + ("DEFAULT_RANK_FACTOR, per precision)" if tabled else "none measured for this device: 1)"))
            elif eta > 0 and model.overlap_source[device].startswith("fitted"):  # the step times chose eta over f
                model.rank_factor[device, stage] = 1.0
                model.rank_factor_source[device, stage] = "1: the fit set's runs beyond their reference fit an overlap instead (eta)"
            else:
                ratios = [(float(r[MEASURED]) - e) / p.base_compute_s for (r, p), e in of_stage]
                # at least 0: a negative median says the communication model alone exceeds those steps
                model.rank_factor[device, stage] = max(float(np.median(ratios)), 0.0)
                model.rank_factor_source[device, stage] = (f"fitted: median of {len(of_stage)} run(s) of the fit set at this "
                                                           "stage beyond their reference")
        fitted = sum(1 for (d, _), src in model.rank_factor_source.items() if d == device and src.startswith("fitted"))
        if len(mine) - fitted >= 2:  # degrees of freedom left once each fitted stage's f took one
            # each run's parts at its stage's fitted f (they were taken before f was known)
            mine = [(r, replace(p, compute_s=p.base_compute_s * model.rank_factor[device, int(r["zero_stage"])])) for r, p in mine]
            steps = [step_time(r["zero_stage"], p.compute_s, p.comm_s, calls=p.calls, overlap_efficiency=eta).step_s
                     for r, p in mine]
            logs = [math.log(float(r[MEASURED]) / step) for (r, _), step in zip(mine, steps, strict=True)]
            # what the band's other terms already hold (relative variance), so that the band is not wider than the errors
            known = [sum(_noise_terms(model, p, step).values()) / step ** 2 for (_, p), step in zip(mine, steps, strict=True)]
            mean_square = float(np.sum(np.square(logs))) / (len(mine) - fitted)
            model.model_sigma[device] = math.sqrt(max(mean_square - float(np.mean(known)), 0.0))
            model.model_sigma_source[device] = (f"fitted: rms of log measured / predicted over {len(mine)} run(s) of the fit "
                                                f"set beyond their reference ({len(mine) - fitted} degrees of freedom), "
                                                "less the band's noise terms")
        else:
            model.model_sigma[device] = DEFAULT_MODEL_SIGMA.get(device)
            model.model_sigma_source[device] = ("defaulted: " + ("too few runs of the fit set beyond their reference (2 more "
                                                                 "than the stages whose f they fit)"
                                                                 if mine else "no run of the fit set beyond its reference")
                                                + (" (DEFAULT_MODEL_SIGMA)" if device in DEFAULT_MODEL_SIGMA else
                                                   "; none measured for this device: unknown"))


def _fit_overlap(model: Model, device: str, mine: list[tuple[dict, _Parts]]) -> None:
    """eta of one device type from its runs beyond their reference (least squares, clipped to [0, 1]):
    from their traces where some were traced (exposed_comm_s_measured = all communication - eta x
    hidden), else from their step times; DEFAULT_OVERLAP_EFFICIENCY where none of them hides anything."""
    # per run that could hide something: what it could hide, and what it hid (all communication less what was
    # exposed: its trace's measure where it has one, else its step less its compute)
    hiding, traced = [], []
    for row, parts in mine:
        total = sum(parts.comm_s.values())
        hidden = total - step_time(row["zero_stage"], parts.base_compute_s, parts.comm_s, calls=parts.calls,
                                   overlap_efficiency=1.0).exposed_comm_s
        if hidden <= 0:
            continue
        hiding.append((hidden, total - (float(row[MEASURED]) - parts.base_compute_s)))
        if not _missing(row.get("exposed_comm_s_measured")):
            traced.append((hidden, total - float(row["exposed_comm_s_measured"])))
    pairs = traced or hiding
    if pairs:  # least squares of hid = eta x hidden, clipped to [0, 1]
        eta = sum(h * hid for h, hid in pairs) / sum(h * h for h, _ in pairs)
        model.overlap_efficiency[device] = min(max(eta, 0.0), 1.0)
        model.overlap_source[device] = (
            f"measured: the traces of {len(traced)} run(s) of the fit set beyond their reference (exposed_comm_s_measured)"
            if traced else f"fitted: {len(hiding)} run(s) of the fit set that communicate beyond their reference")
    else:
        model.overlap_efficiency[device] = DEFAULT_OVERLAP_EFFICIENCY.get(device, 0.0)
        model.overlap_source[device] = ("defaulted: no run of the fit set communicates beyond its reference ("
                                        + ("one core per rank computes and communicates" if device == "cpu"
                                           else "fitted to published multi-node runs: docs/prediction.md") + ")")


def predict(model: Model, runs):
    """``runs`` with the prediction block (PREDICTED_COLUMNS) set, one prediction per row (replacing
    the block a collected table already holds: the sweep's own fit)."""
    import pandas as pd

    runs = runs.drop(columns=[c for c in PREDICTED_COLUMNS if c in runs.columns]).reset_index(drop=True)
    rows = [predict_row(model, r) for r in runs.to_dict("records")]
    return pd.concat([runs, pd.DataFrame(rows, columns=list(PREDICTED_COLUMNS))], axis=1)


# ----------------------------------------------------------------------------- validation

def validate(runs, fit_query: str, table=None, table_path: str | None = None) -> dict:
    """Fit on the rows of ``runs`` that ``fit_query`` (a pandas query) selects, predict the other
    ok runs: per held-out run measured, predicted, error (predicted / measured - 1), inside its band;
    then the mean and max absolute error and the share inside their bands."""
    try:
        chosen = runs.query(fit_query)
    except Exception as err:  # pandas raises many types for a bad expression
        raise ValueError(f"--fit {fit_query!r} is not a pandas query over the metrics columns: {err}") from None
    held = _ok(runs.drop(index=chosen.index))
    if held.empty:
        raise ValueError(f"--fit {fit_query!r} leaves no ok run to predict ({len(chosen)} of {len(runs)} rows fit)")
    model = fit(chosen, table, table_path)
    predicted = predict(model, held)
    points = []
    for r in predicted.to_dict("records"):
        p, m = r["predicted_step_time_s"], float(r[MEASURED])
        known = p is not None and not _missing(p)
        points.append({"run_id": r["run_id"], "precision": r["precision"], "zero_stage": int(r["zero_stage"]),
                       "world_size": int(r["world_size"]), "measured_step_time_s": m,
                       "predicted_step_time_s": p if known else None,
                       "band_low_s": r["predicted_step_time_s_low"] if known else None,
                       "band_high_s": r["predicted_step_time_s_high"] if known else None,
                       "error": p / m - 1 if known else None,
                       "inside_band": bool(r["predicted_step_time_s_low"] <= m <= r["predicted_step_time_s_high"]) if known else None,
                       "note": r["prediction_note"]})
    errors = [abs(p["error"]) for p in points if p["error"] is not None]
    inside = [p["inside_band"] for p in points if p["inside_band"] is not None]
    half_widths = [(p["band_high_s"] - p["band_low_s"]) / 2 / p["predicted_step_time_s"] for p in points
                   if p["predicted_step_time_s"]]
    summary = {"fit": fit_query, "fit_runs": model.fit_runs, "held_out": len(points), "predicted": len(errors),
               "mean_abs_error": float(np.mean(errors)) if errors else None,
               "max_abs_error": float(np.max(errors)) if errors else None,
               "inside_band_share": float(np.mean(inside)) if inside else None,
               "median_band_half_width": float(np.median(half_widths)) if half_widths else None,
               "measured": MEASURED, "bench_table": table_path, "bench_host_load": bench_load(table), "bench_busy_share": busy_before(table),
               "bench_busy_recorded": table is not None and BUSY_COLUMN in table.columns,
               "bench_steal_share": bench_steal(table)}
    return {"points": points, "summary": summary, "parameters": model.parameters()}


# ----------------------------------------------------------------------------- the command

def format_validation(result: dict) -> str:
    """The validation as text: the fitted parameters, one line per held-out run, the summary."""
    lines = ["PREDICTION against measurement (step time: " + result["summary"]["measured"] + ")",
             "parameters (fitted or defaulted, each with its source):"]
    for p in result["parameters"]:
        value = "unknown" if p["value"] is None else f"{p['value']:.4g}"
        lines.append(f"  {p['name']:<40} {value:>11} {p['unit']:<22} {p['source']}")
    lines.append(f"{'run':<24}{'measured ms':>12}{'predicted ms':>13}{'band ms':>17}{'error':>8}  inside")
    for p in result["points"]:
        if p["predicted_step_time_s"] is None:
            lines.append(f"{p['run_id']:<24}{p['measured_step_time_s'] * 1e3:>12.2f}{'-':>13}{'-':>17}{'-':>8}  -   {p['note']}")
            continue
        band = f"{p['band_low_s'] * 1e3:.1f}-{p['band_high_s'] * 1e3:.1f}"
        lines.append(f"{p['run_id']:<24}{p['measured_step_time_s'] * 1e3:>12.2f}{p['predicted_step_time_s'] * 1e3:>13.2f}"
                     f"{band:>17}{p['error']:>+8.1%}  {'yes' if p['inside_band'] else 'NO'}")
    s = result["summary"]
    if s["mean_abs_error"] is None:
        lines.append(f"no held-out run could be predicted ({s['held_out']} held out): see the notes above")
    else:
        lines.append(f"fit on {s['fit']!r} ({s['fit_runs']} runs); predicted {s['predicted']} of {s['held_out']} held-out runs: "
                     f"mean absolute error {s['mean_abs_error']:.1%}, max {s['max_abs_error']:.1%}, "
                     f"inside their bands {s['inside_band_share']:.0%}, median band half-width "
                     f"{s['median_band_half_width']:.0%} of the prediction (a band says something only when both are good: "
                     f"most inside, narrow)")
    busy, load = s.get("bench_busy_share"), s.get("bench_host_load")
    if busy is not None:
        lines.append(busy_text(busy, "the bench ranks'"))
    elif load is not None:  # a CPU table without a busy share: written before the column, or /proc/stat unreadable
        lines.append(f"the bench table was measured with a 1-minute load of {load:.2f} on the whole machine before its ranks "
                     "started (whether their own cores were busy, this table cannot say"
                     + (": /proc/stat could not be read)" if s.get("bench_busy_recorded") else
                        ": `scalelab bench comm` now records it)"))
    steal = s.get("bench_steal_share")
    if steal is not None:
        lines.append(f"the hypervisor took {steal:.1%} of the bench ranks' cores' time while they were timed"
                     + (" (other guests of the physical host were busy): its times (and this model's communication) run "
                        "high; `scalelab bench comm` on a quiet host measures them again" if steal > STEAL_WARN else ""))
    return "\n".join(lines)


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


def reference_rows(runs):
    """Each configuration's runs at the smallest world size it ran (COMPUTE_KEY): what collection
    fits on, so that every larger world size is predicted, none fitted (eta keeps its default)."""
    keys = [_key(r) for r in runs.to_dict("records")]
    smallest: dict[tuple, int] = {}
    for key, n, status in zip(keys, runs["world_size"], runs["status"], strict=True):
        if status == "ok":
            smallest[key] = min(smallest.get(key, n), n)
    mask = np.array([smallest.get(key) == n for key, n in zip(keys, runs["world_size"], strict=True)], dtype=bool)
    return runs.loc[mask]


def sweep_predictions(runs, results_dir=None):
    """The prediction block (PREDICTED_COLUMNS) of every row of a sweep's metrics table, fitted on
    the sweep's reference runs (reference_rows: each configuration at the smallest world size it
    ran) and its bench comm table (``<results_dir>/calibration/comm.parquet``) where there is one.
    A table that cannot be read, or a fit that fails, leaves every row null with the reason."""
    from pathlib import Path

    import pandas as pd

    from scalelab.plan.comm_table import BENCH_FILE, read_table

    frame = pd.DataFrame(index=range(len(runs)), columns=list(PREDICTED_COLUMNS), dtype=object)
    table, path = None, Path(results_dir) / BENCH_FILE if results_dir is not None else None
    try:
        if path is not None and path.exists():
            table = read_table(path)
        model = fit(reference_rows(runs), table, str(path) if table is not None else None)
    except (ValueError, OSError) as err:
        frame["prediction_note"] = f"no prediction: {err}"
        return frame
    rows = [predict_row(model, r) for r in runs.reset_index(drop=True).to_dict("records")]
    return pd.DataFrame(rows, columns=list(PREDICTED_COLUMNS))


# ----------------------------------------------------------------------------- the report

def outside_band(runs):
    """The ok rows whose measured step time lies outside their predicted band."""
    ok = runs[(runs["status"] == "ok") & runs["predicted_step_time_s"].notna() & runs[MEASURED].notna()]
    return ok[(ok[MEASURED] < ok["predicted_step_time_s_low"]) | (ok[MEASURED] > ok["predicted_step_time_s_high"])]
