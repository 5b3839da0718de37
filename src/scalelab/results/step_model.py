"""The step-time model, fitted: a training step's time from measured compute, each strategy's
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

The prediction of each run from the fitted model, and its band: scalelab.results.prediction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from scalelab.formulas.comm_time import run_comm, tokens_or_nan
from scalelab.formulas.link_fit import LinkFit, link_fits
from scalelab.formulas.overlap import DEFAULT_OVERLAP_EFFICIENCY, step_time
from scalelab.formulas.predicted_columns import missing
from scalelab.planning.sweep import AXES
from scalelab.registries.strategies import STRATEGIES

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
compute (scalelab.planning.sweep.Axis.changes_compute; the world size, micro-batch and accumulation may
differ: the token share carries compute across them) and the device and threads it ran on."""

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


def ok_runs(runs):
    """The rows that ended ok with a measured step time."""
    return runs[(runs["status"] == "ok") & runs[MEASURED].notna()]


def compute_key(row) -> tuple:
    """A row's COMPUTE_KEY values, nulls as None."""
    return tuple(None if missing(row.get(k)) else row.get(k) for k in COMPUTE_KEY)

def fit(runs, table=None, table_path: str | None = None) -> Model:
    """Fit the model to ``runs`` (a metrics table's rows: the fit set) and a bench table (None: no
    communication figures; predictions of runs that communicate are then null, with the reason)."""
    import pandas as pd

    from scalelab.results.noise import sweep_noise

    model = Model(table_path, table=table)
    ok = ok_runs(runs).copy()
    model.fit_runs = len(ok)
    if ok.empty:
        raise ValueError("the fit set holds no run that ended ok with a measured step time")
    ok["_key"] = [compute_key(r) for r in ok.to_dict("records")]
    ok["_tokens"] = [tokens_or_nan(r) for r in ok.to_dict("records")]
    ok = ok[ok["_tokens"].notna()]  # a row without micro-batch or sequence length cannot be a reference
    if "pipeline_parallel" in ok:  # nor a pipeline's (not modelled: parts_of)
        ok = ok[ok["pipeline_parallel"].fillna(1) == 1]
    # The compute references: each key's runs at its smallest world size, less their communication.
    refs = [frame for frame in (_references(model, key, group) for key, group in ok.groupby("_key", sort=False))
            if frame is not None]
    model.references = pd.concat(refs, ignore_index=True) if refs else None
    noise = sweep_noise(ok.assign(_t=1.0 / ok[MEASURED]), "_t")
    if noise.known:
        model.sigma, model.sigma_source = noise.sigma, f"pooled over {noise.points} repeated point(s) of the fit set ({noise.runs} runs)"
    else:
        model.sigma_source = "unknown: no point of the fit set ran twice (the band holds the model's other parts only)"
    _fit_across_ranks(model, ok)
    return model


def _references(model: Model, key: tuple, group):
    """One configuration's compute references (a frame, one row per token count), from its runs at its smallest
    world size, with its token share; None where no run's compute is known."""
    import pandas as pd

    smallest = group[group["world_size"] == group["world_size"].min()]
    n = int(smallest["world_size"].iloc[0])
    per_tokens = [ref for tokens, at in smallest.groupby("_tokens") if (ref := _reference(model, key, n, tokens, at))]
    if not per_tokens:
        return None
    frame = pd.DataFrame(per_tokens)
    _token_share(frame)
    return frame


def _reference(model: Model, key: tuple, n: int, tokens: float, at) -> dict | None:
    """The compute reference of one configuration's runs at one token count and world size ``n``: their median step
    less the communication the model gives them, and their own token share; None where that compute is unknown."""
    import pandas as pd

    first = at.iloc[0].to_dict()
    exposed = 0.0
    if n > 1:
        measured = run_comm(model, first)
        if isinstance(measured, str):
            return None  # no bench table (or no model of its collectives): communication unknown, so is compute
        comm, calls, _ = measured
        eta = DEFAULT_OVERLAP_EFFICIENCY.get(first.get("device_type"), 0.0)
        exposed = step_time(first["zero_stage"], 0.0, comm, calls=calls, overlap_efficiency=eta).exposed_comm_s
    step = float(at[MEASURED].median())
    compute = step - exposed
    if compute <= 0:  # the modelled communication outlasts the measured step: its compute is unknown
        return None
    flops = first["flops_per_token"] * tokens / first["peak_flops_per_device"] \
        if not missing(first.get("peak_flops_per_device")) and first.get("peak_flops_per_device") else math.nan
    # the runs' own token share (half-batch steps), of their step: as a share of its compute
    shares = pd.to_numeric(at["token_share_measured"], errors="coerce").dropna() \
        if "token_share_measured" in at else pd.Series(dtype=float)
    share = min(float(shares.median()) * step / compute, 1.0) if len(shares) and compute > 0 else math.nan
    # its error: the runs' spread where several measured it, else the one run's own (the scatter of its steps)
    sems = pd.to_numeric(at.get("token_share_measured_sem", pd.Series(dtype=float)), errors="coerce").dropna()
    sem = (float(shares.std(ddof=1) / math.sqrt(len(shares))) if len(shares) > 1
           else float(sems.iloc[0]) if len(shares) == 1 and len(sems) else math.nan)
    return {**dict(zip(COMPUTE_KEY, key, strict=True)), "world_size": n, "tokens_per_rank": tokens,
            "compute_s": compute, "runs": len(at), "flop_s": flops, "share_measured": share,
            "share_runs": len(shares), "share_sem": sem}


def _token_share(frame) -> None:
    """Set one configuration's token share and its source on its references: fitted through two token counts or
    more, else measured by its runs' half-batch steps, else defaulted to its model FLOPs' share of the step."""
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


@dataclass(frozen=True)
class Parts:
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


def parts_of(model: Model, row: dict) -> Parts | str:
    """The parts of a run's prediction, or the reason there are none."""
    if int(row.get("pipeline_parallel") or 1) > 1:
        return ("pipeline runs are not predicted by the step-time model yet (its compute reference and collectives "
                "take every rank to hold the whole model; scalelab estimate scaling --pipeline-parallel prices them)")
    refs = model.references
    key = compute_key(row)
    mine = None if refs is None else refs[[tuple(None if missing(v) else v for v in r) == key
                                           for r in refs[list(COMPUTE_KEY)].itertuples(index=False, name=None)]]
    if mine is None or mine.empty:
        return ("no compute reference: the fit set has no ok run of this configuration "
                f"({', '.join(f'{k}={v}' for k, v in zip(COMPUTE_KEY, key, strict=True) if v is not None)})")
    tokens = tokens_or_nan(row)
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
    return Parts(ref, tokens, compute, comm, calls, comm_sigma, base, across)


def noise_terms(model: Model, parts: Parts, step_s: float) -> dict[str, float]:
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

def _fit_across_ranks(model: Model, ok) -> None:
    """Per device type, from the fit set's runs beyond their reference (a larger world size):
    eta, f and the model's error; each device's defaults where it has no such run.

    eta: least squares of (measured - compute - all communication = -eta x what the strategy could
    hide), clipped to [0, 1]. Runs slower than even no overlap (eta clipped at 0) carry f instead,
    the median of (measured - exposed communication) / compute: the residual's sign decides which,
    so the two never trade against each other; f per ZeRO stage. sigma_model: the rms of log measured /
    predicted over those runs (per degree of freedom left by the fitted f: 2 at least), less the
    variance the band's other terms (_noise_terms) already hold."""
    across: dict[str, list[tuple[dict, Parts]]] = {}
    for row in ok.to_dict("records"):
        parts = parts_of(model, row)
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
        _fit_model_sigma(model, device, mine, eta)


def _fit_model_sigma(model: Model, device: str, mine: list[tuple[dict, Parts]], eta: float) -> None:
    """sigma_model of one device type: the rms of log measured / predicted over its runs beyond their reference at
    their stage's f, per degree of freedom left by the fitted f, less what the band's noise terms hold; its default
    where too few runs are left."""
    fitted = sum(1 for (d, _), src in model.rank_factor_source.items() if d == device and src.startswith("fitted"))
    if len(mine) - fitted >= 2:  # degrees of freedom left once each fitted stage's f took one
        # each run's parts at its stage's fitted f (they were taken before f was known)
        mine = [(r, replace(p, compute_s=p.base_compute_s * model.rank_factor[device, int(r["zero_stage"])])) for r, p in mine]
        steps = [step_time(r["zero_stage"], p.compute_s, p.comm_s, calls=p.calls, overlap_efficiency=eta).step_s
                 for r, p in mine]
        logs = [math.log(float(r[MEASURED]) / step) for (r, _), step in zip(mine, steps, strict=True)]
        # what the band's other terms already hold (relative variance), so that the band is not wider than the errors
        known = [sum(noise_terms(model, p, step).values()) / step ** 2 for (_, p), step in zip(mine, steps, strict=True)]
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


def _fit_overlap(model: Model, device: str, mine: list[tuple[dict, Parts]]) -> None:
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
        if not missing(row.get("exposed_comm_s_measured")):
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
