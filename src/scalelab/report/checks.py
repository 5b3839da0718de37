"""Checks of the results a reader would miss, and what CPU results do not show.

Pure pandas and numpy, from the two Parquet tables alone (metrics.parquet's runs, steps.parquet's
steps). The report (scalelab.report.report.find_warnings) adds their messages to its warnings;
the CPU notice opens the report, summary.md and the workflow's end-of-sweep text
(scalelab.report.tables.sweep_end_text).

Loss spikes and grad-norm jumps: each step is held against the previous ``SPIKE_WINDOW``
recorded steps of its own run (steps before a full window, and warm-up steps, are never held):

* a **loss spike**: loss above the window's median by more than ``LOSS_RELATIVE`` of it *and* by
  more than ``LOSS_DEVIATIONS`` robust deviations (1.4826 × the median absolute deviation, the
  standard deviation of normal noise). Both, because either alone misfires: a flat, quiet loss
  has a tiny deviation (a 3% wiggle would be "many deviations"), a noisy one a wide relative band.
* a **grad-norm jump**: grad norm above ``GRAD_NORM_FACTOR`` × the window's median.

Calibrated on the default sweep (24 runs of 60 steps, 2 and 4 layers): after warm-up its loss
wanders within ±5% of the window median and its grad norm within 0.3–2.6× of it; the spikes
these checks are for are 2.5–3.5× in loss and 100–900× in grad norm. Non-finite grad norms (the
fp16 loss scaler's skipped steps, reported as skipped_steps) are neither held nor part of a window.

Peaks out of line: MFU divides by a peak FLOP/s; on a CPU each run measured its own, under
whatever ran beside it, so a run whose peak is ``PEAK_TOLERANCE`` off the median peak of the
runs of its precision on the same device shows an MFU that says more about the moment of
measurement than about the run. Written against the columns alone: with one calibration per
sweep (or a datasheet) every peak is equal and nothing is flagged.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from scalelab.registries.hardware import DRIFT_WARN, STEAL_WARN, unsteady
from scalelab.registries.precisions import PRECISIONS

SPIKE_WINDOW = 10
"""Steps before a step that form its "recent range" (the default warm-up is 10 steps)."""
LOSS_RELATIVE = 0.25
"""A loss spike is more than this fraction above the window's median loss..."""
LOSS_DEVIATIONS = 6.0
"""...and more than this many robust deviations above it."""
GRAD_NORM_FACTOR = 10.0
"""A grad-norm jump is more than this many times the window's median grad norm."""
PEAK_TOLERANCE = 0.25
"""A run's peak FLOP/s more than this fraction off the median peak of its precision and device is flagged."""
MAD_TO_SIGMA = 1.4826
"""Median absolute deviation to the standard deviation of normal noise."""
NAMED_RUNS = 12
"""Runs named in one message; beyond, the first ones and a count."""
WORST_NAMED = 5
"""Runs named, worst first, in a one-line warning about the host (steal, drift); beyond, a count."""
LOW_PRECISIONS = tuple(p.name for p in PRECISIONS.values() if p.autocast)
"""The precisions that compute below fp32 (under autocast), each set against fp32 in the CPU notice."""


# --------------------------------------------------------------------------- loss spikes, grad-norm jumps

def _previous(values: np.ndarray, codes: np.ndarray, k: int, rows: np.ndarray) -> np.ndarray:
    """For each of rows: the k values before it in the same run (NaN where there is none). Rows sorted by run, then step."""
    before = rows[:, None] - np.arange(k, 0, -1)[None, :]
    inside = before >= 0
    before = np.where(inside, before, 0)
    return np.where(inside & (codes[before] == codes[rows][:, None]), values[before], np.nan)


def _floor(values: np.ndarray, codes: np.ndarray, k: int) -> np.ndarray:
    """Each row's smallest finite value over the k rows before it in the same run (NaN if none): a
    step k times above it may be k times above the window's median, one that is not cannot be. A
    cheap first pass (k vectorised shifts) so that medians are taken of the few rows it lets through."""
    out = np.full(len(values), np.nan)
    for j in range(1, min(k, len(values) - 1) + 1):
        shifted = np.where(codes[j:] == codes[:-j], values[:-j], np.nan)
        out[j:] = np.fmin(out[j:], shifted)
    return out


def _nan_median(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(median of each row's finite values, how many there are). A sort puts NaN last: cheaper than
    np.nanmedian on half a million rows."""
    ordered = np.sort(windows, axis=1)
    count = np.isfinite(windows).sum(axis=1)
    lo, hi = np.maximum((count - 1) // 2, 0), np.maximum(count // 2, 0)
    rows = np.arange(len(windows))
    with np.errstate(invalid="ignore"):
        median = np.where(count > 0, (ordered[rows, lo] + ordered[rows, hi]) / 2, np.nan) if len(windows) else np.empty(0)
    return median, count


def step_outliers(steps: pd.DataFrame, runs: pd.DataFrame | None = None, window: int = SPIKE_WINDOW) -> pd.DataFrame:
    """One row per (run, step) whose loss spikes or whose grad norm jumps (module docstring): run_id,
    step, loss_spike, grad_jump, loss, loss_median, loss_lo, loss_hi (the window's), grad_norm,
    grad_median, next_step, next_loss (the run's following record).
    runs (optional): its warmup_steps keep each run's warm-up out."""
    cols = ["run_id", "step", "loss_spike", "grad_jump", "loss", "loss_median", "loss_lo", "loss_hi", "grad_norm",
            "grad_median", "next_step", "next_loss"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    run_id = steps["run_id"]
    codes, names = pd.factorize(run_id, sort=False)  # a categorical's codes: no string work
    step = steps["step"].to_numpy(dtype=np.int64)
    order = np.lexsort((step, codes))
    codes, step = codes[order], step[order]
    loss = steps["loss"].to_numpy(dtype=float)[order]
    grad = steps["grad_norm"].to_numpy(dtype=float)[order]
    grad = np.where(np.isfinite(grad), grad, np.nan)
    start = np.full(len(names), window, dtype=np.int64)
    if runs is not None and "warmup_steps" in runs:
        warmup = runs.set_index("run_id")["warmup_steps"]
        warmup = warmup[~warmup.index.duplicated()].reindex(np.asarray(names, dtype=object))
        start = np.maximum(start, warmup.fillna(0).to_numpy(dtype=np.int64))
    held = step >= start[codes]

    with np.errstate(invalid="ignore"):
        # Medians only where the floor of the window lets a spike through (a few rows of half a million).
        rows = np.nonzero(held & ((loss > _floor(loss, codes, window) * (1 + LOSS_RELATIVE))
                                  | (grad > _floor(grad, codes, window) * GRAD_NORM_FACTOR)))[0]
        loss_prev = _previous(loss, codes, window, rows)
        loss_med, loss_n = _nan_median(loss_prev)
        loss_dev, _ = _nan_median(np.abs(loss_prev - loss_med[:, None]))
        loss_spike = ((loss_n == window) & (loss[rows] > loss_med * (1 + LOSS_RELATIVE))
                      & (loss[rows] > loss_med + LOSS_DEVIATIONS * MAD_TO_SIGMA * loss_dev))
        grad_med, grad_n = _nan_median(_previous(grad, codes, window, rows))
        grad_jump = (grad_n > window // 2) & (grad_med > 0) & (grad[rows] > GRAD_NORM_FACTOR * grad_med)
    flagged = loss_spike | grad_jump
    hit, loss_prev, loss_med, grad_med = rows[flagged], loss_prev[flagged], loss_med[flagged], grad_med[flagged]
    loss_spike, grad_jump = loss_spike[flagged], grad_jump[flagged]
    if not hit.size:
        return pd.DataFrame(columns=cols)
    after = np.minimum(hit + 1, len(step) - 1)
    has_next = (hit + 1 < len(step)) & (codes[after] == codes[hit])
    return pd.DataFrame({
        "run_id": np.asarray(names, dtype=object)[codes[hit]], "step": step[hit], "loss_spike": loss_spike,
        "grad_jump": grad_jump, "loss": loss[hit], "loss_median": loss_med,
        "loss_lo": np.nanmin(loss_prev, axis=1), "loss_hi": np.nanmax(loss_prev, axis=1),
        "grad_norm": grad[hit], "grad_median": grad_med,
        "next_step": np.where(has_next, step[after], -1), "next_loss": np.where(has_next, loss[after], np.nan),
    })[cols]


def _g(value: float) -> str:
    return f"{value:.3g}"


def _span(values: pd.Series) -> str:
    """'2.84' for one value (or equal ones), '6.8–7.2' for several."""
    lo, hi = _g(values.min()), _g(values.max())
    return lo if lo == hi else f"{lo}–{hi}"


def _named(run_ids: list[str], limit: int = NAMED_RUNS) -> str:
    shown = ", ".join(run_ids[:limit])
    return shown + (f" and {len(run_ids) - limit} more" if len(run_ids) > limit else "")


def _recovery(group: pd.DataFrame) -> str:
    """Whether the loss is back in its recent range at each run's next recorded step."""
    if (group["next_step"] < 0).all():
        return "the last recorded step"
    back = group["next_loss"] <= group["loss_median"] * (1 + LOSS_RELATIVE)
    nxt = group.loc[group["next_step"] >= 0, "next_step"]
    where = f"step {nxt.iloc[0]}" if nxt.nunique() == 1 else "the next step"
    if back.all():
        return f"back at {where}" if len(group) == 1 else f"back at {where} in every run"
    if not back.any():
        return f"still {_span(group['next_loss'].dropna())} at {where}"
    return f"back at {where} in {int(back.sum())} of {len(group)} runs"


def spike_warnings(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> list[str]:
    """The report's lines on loss spikes and grad-norm jumps: one per step that several runs share
    (a bad batch or a learning-rate setting hits every configuration at the same step), else one per run."""
    found = step_outliers(steps, runs)
    if found.empty:
        return []
    recorded = steps.groupby("step", observed=True)["run_id"].nunique()
    window = f"the previous {SPIKE_WINDOW} steps"
    lines = []
    for (step, is_loss), group in found.groupby(["step", "loss_spike"], sort=True):
        ids = sorted(group["run_id"])
        grad = (f"grad norm {_span(group['grad_norm'])} against a median of {_span(group['grad_median'])}"
                if group["grad_norm"].notna().any() else "grad norm not recorded")
        if is_loss:
            what = (f"loss {_span(group['loss'])} against {_span(pd.concat([group['loss_lo'], group['loss_hi']]))} over "
                    f"{window} (median {_span(group['loss_median'])}); {grad}; {_recovery(group)}")
            kind = "loss spike"
        else:
            what = f"{grad} ({_span(group['grad_norm'] / group['grad_median'])}× it); loss {_span(group['loss'])}, not spiking"
            kind = "grad-norm jump"
        if len(group) == 1:
            lines.append(f"{ids[0]}: {kind} at step {step}: {what}")
        else:
            of = recorded.get(step, len(group))
            share = f"all {len(group)} runs" if len(group) == of else f"{len(group)} of {of} runs"
            lines.append(f"{kind} at step {step} in {share} ({_named(ids)}): {what}")
    return lines


# --------------------------------------------------------------------------- peaks out of line

def _device(row) -> str:
    name = row.get("device_name")
    return name if isinstance(name, str) and name else str(row.get("device_type") or "an unnamed device")


GROUPED_ABOVE = 3
"""More runs than this sharing one MFU warning (a precision and a peak) get one line, not one each."""


def mfu_over_peak_warnings(over: pd.DataFrame) -> list[str]:
    """``over``: the ok runs whose MFU is above MFU_LIMIT (scalelab.report.tables.mfu_flagged, which imports this
    module): the peak they divide by is no peak for their path. One line per run, or
    one per precision and peak where more than 3 share it (an AVX2 CPU emulates bf16 and fp16 matmuls, and every
    16-bit run of a sweep reads above 100% against the calibration's square matmuls: 10 lines said one thing)."""
    lines = []
    for (precision, source), group in over.groupby([over["precision"], over["peak_flops_source"].fillna("unknown")], sort=True):
        if len(group) > GROUPED_ABOVE:
            on_cpu = "device_type" in group and (group["device_type"] == "cpu").all()
            why = (f"{precision} matmuls a CPU emulates, where the calibration's square matmuls run slower than the model's"
                   if on_cpu else "a datasheet figure of another variant of the device, or train.peak_tflops set low")
            lines.append(f"{len(group)} {precision} runs have an MFU above 100% of the peak used ({group['mfu'].min():.2f} to "
                         f"{group['mfu'].max():.2f}: {_named(sorted(group['run_id']))}; {source}): the peak is too low "
                         f"for this path (e.g. {why}); compare their tokens/s, not their MFU")
            continue
        lines += [f"{r.run_id}: MFU {r.mfu:.2f} is above 100% of the peak used ({source}); the peak is too low for this path "
                  "(e.g. emulated fp16 on a CPU)" for r in group.itertuples()]
    return lines


def peak_warnings(runs: pd.DataFrame) -> list[str]:
    """Runs whose peak FLOP/s (MFU's denominator) is more than PEAK_TOLERANCE off the median peak of
    the ok runs of the same precision on the same device (and threads per rank): their MFU moves
    where their throughput does not. One line per run, or one per group where more than 3 are off.
    Across models on purpose: a peak is the device's matmul rate (a datasheet, or a calibration
    measured the same way whatever the model), not the run's step, so every model's runs measure it alike."""
    need = ["run_id", "status", "precision", "peak_flops_per_device", "mfu", "tokens_per_s", "world_size"]
    if not set(need) <= set(runs.columns):
        return []
    keys = [c for c in ("precision", "device_type", "device_name", "threads_per_rank") if c in runs]
    cols = list(dict.fromkeys(need + keys + [c for c in ("peak_flops_source",) if c in runs]))
    ok = runs.loc[(runs["status"] == "ok") & (runs["peak_flops_per_device"] > 0), cols]
    lines = []
    for _, group in ok.groupby(keys, dropna=False, sort=True):
        if len(group) < 2:
            continue
        median = group["peak_flops_per_device"].median()
        ratio = group["peak_flops_per_device"] / median
        off = group[(ratio - 1).abs() > PEAK_TOLERANCE]
        if off.empty:
            continue
        first = group.iloc[0]
        precision = first["precision"]
        where = f"the {len(group)} ok {precision} runs on {_device(first)}"
        if len(off) > 3:
            lines.append(
                f"peaks out of line: {where} used peaks from {_g(group['peak_flops_per_device'].min())} to "
                f"{_g(group['peak_flops_per_device'].max())} FLOP/s (median {_g(median)}); {len(off)} are more than "
                f"{PEAK_TOLERANCE:.0%} off it ({_named(sorted(off['run_id']))}): their MFUs compare the moments the peaks "
                "were measured (under load or not), not the runs; compare tokens/s, or measure the peak once per sweep")
            continue
        for r in off.itertuples():
            side = "below" if r.peak_flops_per_device < median else "above"
            source = f" ({r.peak_flops_source})" if isinstance(getattr(r, "peak_flops_source", None), str) else ""
            lines.append(
                f"{r.run_id}: peak {_g(r.peak_flops_per_device)} FLOP/s{source} is "
                f"{abs(r.peak_flops_per_device / median - 1):.0%} {side} the median {_g(median)} of {where}: its MFU "
                f"{r.mfu:.3f} would be {r.mfu * r.peak_flops_per_device / median:.3f} against the median peak, at the "
                f"same {r.tokens_per_s / r.world_size:,.0f} tokens/s per device: the peak's measurement (under another "
                "load), not the run, sets it apart")
    return lines


# --------------------------------------------------------------------------- what CPU results do not show

def _range(values, unit: str) -> str:
    vals = sorted({int(v) for v in values if pd.notna(v)})
    if not vals:
        return ""
    text = str(vals[0]) if len(vals) == 1 else f"{vals[0]}–{vals[-1]}"
    return f"{text} {unit}{'' if text == '1' else 's'}"


def _cpu_runs(runs: pd.DataFrame) -> pd.DataFrame:
    if "device_type" not in runs:
        return runs.iloc[:0]
    return runs[runs["device_type"] == "cpu"]


def _cpu_setup(cpu: pd.DataFrame) -> str:
    """'AMD EPYC, 1 thread per rank, 1–2 ranks per run' from the rows."""
    names = sorted(set(cpu["device_name"].dropna())) if "device_name" in cpu else []
    per_rank = cpu["threads_per_rank"] if "threads_per_rank" in cpu else pd.Series(dtype=float)
    if per_rank.isna().all() and "threads" in cpu:  # runs that did not start: the launch's threads per run
        per_rank = cpu["threads"] / cpu["world_size"]
    parts = [" and ".join(names) if names else "an unnamed CPU", _range(per_rank, "thread") + " per rank" if per_rank.notna().any() else "",
             _range(cpu["world_size"], "rank") + " per run"]
    return ", ".join(p for p in parts if p)


def _speed_ratios(cpu: pd.DataFrame) -> str:
    """'bf16 at 0.48× and fp16 at 0.13× fp32's tokens/s': per low precision, the median over
    configurations (same stage, world size and levers) of its tokens/s over fp32's."""
    ok = cpu[(cpu["status"] == "ok") & cpu["tokens_per_s"].notna()]
    if "fp32" not in set(ok["precision"]):
        return ""
    from scalelab.results.like import OVER_PRECISION, by_model, like_key

    models = list(by_model(ok))
    said = []
    for model, mine in models:
        # each low-precision run against its fp32 twin: the same model, stage, world size and levers
        table = mine.assign(_like=like_key(mine, OVER_PRECISION)).pivot_table(
            index="_like", columns="precision", values="tokens_per_s", aggfunc="median")
        parts = []
        for p in LOW_PRECISIONS:
            if p in table and "fp32" in table:
                ratio = (table[p] / table["fp32"]).dropna()
                if not ratio.empty:
                    parts.append(f"{p} at {ratio.median():.2f}×")
        if parts:
            said.append(" and ".join(parts) + (f" in model {model}" if len(models) > 1 else ""))
    if not said:
        return ""
    # 'bf16 at 0.48× fp32's tokens/s here', or per model: '... here in model base, and bf16 at 0.61× in model ltiny'
    first, *rest = said
    if len(models) > 1:
        head, model = first.rsplit(" in model ", 1)
        return f"{head} fp32's tokens/s here in model {model}" + "".join(f", and {s}" for s in rest)
    return f"{first} fp32's tokens/s here"


def cpu_notice(runs: pd.DataFrame) -> str | None:
    """What results from a CPU show and what they do not, made of the runs' own rows (device,
    threads, ranks, the precisions present and their speeds); None when no run trained on a CPU."""
    cpu = _cpu_runs(runs)
    # the runs that trained: a skipped or predicted_oom run has a device in its row but never started
    cpu = cpu[~cpu["status"].isin(("skipped", "predicted_oom"))] if "status" in cpu else cpu
    if cpu.empty:
        return None
    n = (("the one run" if len(cpu) == 1 else f"all {len(cpu)} runs") if len(cpu) == len(runs)
         else f"{len(cpu)} of the {len(runs)} runs")
    shows = ("They show what each strategy holds and moves in bytes (device-independent, held against the formulas), "
             "whether configurations agree in loss, and how the configurations rank on this CPU.")
    nots = []
    low = [p for p in LOW_PRECISIONS if p in set(cpu["precision"])]
    if low:
        ratios = _speed_ratios(cpu)
        fp8 = " (fp8 through torchao's emulated float8 casts)" if "fp8" in low else ""
        nots.append(f"what {' and '.join(low)} buy on a GPU: on this CPU they run on CPU kernels, partly emulated, "
                    f"without tensor cores{fp8}" + (f" ({ratios})" if ratios else ""))
    widest = int(cpu["world_size"].max()) if cpu["world_size"].notna().any() else 1
    if widest > 1:
        nodes = pd.to_numeric(cpu["nodes_used"], errors="coerce") if "nodes_used" in cpu else pd.Series(dtype=float)
        spanning = nodes.fillna(1) > 1
        one_machine = cpu.loc[spanning, "nodes_share_machine"].fillna(False).astype(bool).all() \
            if "nodes_share_machine" in cpu and spanning.any() else False
        how = "talk over gloo through host memory"
        if spanning.all():
            how = ("talk over gloo across nodes" + (" (network namespaces of one machine, whose cores they share)"
                                                     if one_machine else " (TCP between the nodes' CPUs)"))
        elif spanning.any():
            how = ("talk over gloo through host memory within a node and across nodes"
                   + (" (network namespaces of one machine)" if one_machine else " over TCP"))
        nots.append(f"how the strategies scale across GPUs: a run's ranks (up to {widest}) share CPU cores "
                    f"and {how}, so scaling efficiency and communication times say nothing about NVLink or InfiniBand")
    # One run's source as an example, fp32's where there is one (on a CPU: "measured fp32 matmul, 1 threads").
    sources = cpu.sort_values("precision", key=lambda p: p != "fp32")["peak_flops_source"].dropna() \
        if "peak_flops_source" in cpu else pd.Series(dtype=object)
    measured = f" (e.g. {sources.iloc[0]})" if len(sources) else ""
    nots.append(f"a GPU's utilisation: MFU is against a CPU matmul rate measured on this machine{measured}, not a datasheet peak")
    return (f"CPU results: {n} trained on a CPU ({_cpu_setup(cpu)}). {shows} They do not show "
            + "; nor ".join(nots) + ".")


def cpu_best_note(runs: pd.DataFrame) -> str | None:
    """The short note beside "best configuration" when runs trained on a CPU; None otherwise."""
    cpu = _cpu_runs(runs)
    if cpu.empty:
        return None
    low = [p for p in LOW_PRECISIONS if p in set(cpu["precision"])]
    why = ["its ranks shared the machine's cores over gloo"] if cpu["world_size"].max() > 1 else []
    why = ([f"{'/'.join(low)} ran without tensor cores"] if low else []) + why
    return (f"Fastest on this CPU ({_cpu_setup(cpu)})" + (f": {' and '.join(why)}" if why else "")
            + "; not a recommendation for a GPU.")


# ----------------------------------------------------------------------------- run-to-run noise

NOISY_SPREAD = 0.10
"""A point whose identical runs differ by more than this is named in the warnings: on an idle machine
with runs measured one at a time, repeats stay within a few percent."""


def noise_warnings(runs: pd.DataFrame, best: pd.DataFrame) -> list[str]:
    """Repeated points whose runs differ by more than NOISY_SPREAD, and world sizes whose fastest points
    are within the sweep's run-to-run noise of each other (scalelab.results.noise; ``best``: the table of
    scalelab.report.tables.best_configurations): comparisons the spread of identical runs could overturn."""
    from scalelab.results.noise import repeat_spreads

    spreads = repeat_spreads(runs)
    warnings = [f"{point}: its {int(r['n'])} identical runs differ by {r['spread']:.0%} in tokens/s ({r['min']:,.0f} to "
                f"{r['max']:,.0f}); a difference between points smaller than that is noise ("
                + (f"the hypervisor took up to {r['steal_max']:.1%} of their cores' time: other guests of the physical "
                   "host were busy)"
                   if r["steal_max"] > STEAL_WARN else
                   f"{int(r['drifted'])} of them changed speed while timed: step_time_drift)" if r["drifted"] else
                   "was the machine busy?)")
                for point, r in spreads[spreads["spread"] > NOISY_SPREAD].iterrows()]
    several = "model" in best and best["model"].nunique() > 1
    for r in best[best["within_noise"].fillna("") != ""].itertuples():
        warnings.append(f"{f'model {r.model}, ' if several else ''}world size {r.world_size}: no single fastest point: "
                        f"{r.run_id} and {r.within_noise} are within run-to-run noise of each other (tied): "
                        f"the sweep cannot rank them (more repeats narrow the noise: repeats.points)")
    return warnings


def steal_warnings(runs: pd.DataFrame) -> list[str]:
    """Runs whose cores the hypervisor took more than STEAL_WARN of during the timed steps (host_steal_share):
    one line for all, the worst first (a busy host slows every run of a stretch; naming each would bury the other
    warnings)."""
    if "host_steal_share" not in runs:
        return []
    stolen = runs[(runs["status"] == "ok") & (runs["host_steal_share"] > STEAL_WARN)].sort_values("host_steal_share", ascending=False)
    if stolen.empty:
        return []
    ids = _named([f"{r.run_id} {r.host_steal_share:.1%}" for r in stolen.itertuples()], WORST_NAMED)
    return [f"{len(stolen)} run(s) lost more than {STEAL_WARN:.0%} of their cores' time to the hypervisor (steal: other "
            f"guests of the physical host were busy): {ids}. Their speed reads low by about as much; a difference "
            "involving them may come from the host, not the configuration (column host_steal_share; rerun them on a quiet "
            "host)"]


def drift_warnings(runs: pd.DataFrame) -> list[str]:
    """Runs whose median step time moved more than DRIFT_WARN between the halves of their timed steps
    (step_time_drift): their speed was not steady while timed. One line for all, the largest change first."""
    if "step_time_drift" not in runs:  # tables before schema 11
        return []
    ok = runs[runs["status"] == "ok"]
    moved = ok[unsteady(ok["step_time_drift"])].sort_values("step_time_drift", key=abs, ascending=False)
    if moved.empty:
        return []
    ids = _named([f"{r.run_id} {r.step_time_drift:+.1%}" for r in moved.itertuples()], WORST_NAMED)
    return [f"{len(moved)} run(s) changed speed by more than {DRIFT_WARN:.0%} between the first and the second half of "
            f"their timed steps (median step time, second half against first): {ids}. Their speed was not steady "
            "while they were timed (a cloud VM's host can change its speed by 1.45x for seconds, without steal), so their "
            "figures mix two speeds; a difference involving them may come from the host (column step_time_drift; repeat "
            "those points: repeats.points)"]


def prediction_warnings(runs: pd.DataFrame) -> list[str]:
    """Runs whose measured step time lies outside the step-time model's band (scalelab.results.prediction)."""
    from scalelab.results.prediction import outside_band
    from scalelab.results.step_model import MEASURED

    if "predicted_step_time_s" not in runs:
        return []
    return [f"{r.run_id}: measured step time {getattr(r, MEASURED) * 1e3:.2f} ms is outside its predicted band "
            f"{r.predicted_step_time_s_low * 1e3:.2f}-{r.predicted_step_time_s_high * 1e3:.2f} ms (predicted "
            f"{r.predicted_step_time_s * 1e3:.2f} ms; {r.prediction_note})" for r in outside_band(runs).itertuples()]


def fp8_warnings(runs: pd.DataFrame) -> list[str]:
    """fp8 runs: whether fp8 is expected to pay against bf16 at their model's width on a GPU
    (scalelab.registries.hardware.fp8_outlook, from one GPU's measurements), once per width and compile
    setting, and that fp8 without compile runs unfused."""
    from scalelab.registries.hardware import fp8_outlook

    fp8 = runs[(runs["precision"] == "fp8") & (runs["status"] == "ok")]
    if fp8.empty or "d_model" not in fp8:
        return []
    compiled = fp8["compile"].fillna(False).astype(bool) if "compile" in fp8 else pd.Series(False, index=fp8.index)
    warnings = []
    for (d_model, on), group in fp8.groupby([fp8["d_model"], compiled]):
        outlook = fp8_outlook(int(d_model), compiled=bool(on))
        ids = ", ".join(group["run_id"].head(3)) + (" ..." if len(group) > 3 else "")
        cpu = " These runs are on a CPU (float8 emulated): their speed says nothing about it." \
            if (group.get("device_type") == "cpu").any() else ""
        warnings.append(f"fp8 ({ids}): on a GPU, fp8 against bf16 {outlook['verdict']} (an estimate: "
                        f"{outlook['basis']}).{cpu}")
    return warnings


# ----------------------------------------------------------------------------- runs out of line with their twins

OUTLIER_CHANGE = 0.5
"""A run whose tokens/s is more than this (relative: |a - b| over the smaller) away from the median of its
twins (the other runs of its configuration: the repeats of its point, or identical configurations) is
named as an outlier, where it is also beyond OUTLIER_SPREADS times its twins' own spread. Repeats on an
idle machine stay within a few percent (NOISY_SPREAD names those beyond 10%); a run 1.5x off its twins
was disturbed (a busy machine, a stall), and its figures say nothing of its configuration."""
OUTLIER_SPREADS = 3.0


def _ok_timed(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[(runs["status"] == "ok") & (pd.to_numeric(runs["tokens_per_s"], errors="coerce") > 0)]


def outliers(runs: pd.DataFrame) -> list[tuple[str, float, pd.Series]]:
    """(run id, its tokens/s, its twins' tokens/s by run id) per ok run far outside its twins' spread
    (OUTLIER_CHANGE, OUTLIER_SPREADS); a pair too far apart gives its slower run."""
    from scalelab.results.like import like_key
    from scalelab.results.noise import relative_change

    ok = _ok_timed(runs)
    found = []
    for _, group in ok.groupby(like_key(ok).to_numpy(), sort=False) if not ok.empty else ():
        tps = group.set_index(group["run_id"].astype(str))["tokens_per_s"].astype(float)
        for run_id, value in tps.items() if len(tps) >= 2 else ():
            twins = tps.drop(run_id)
            centre = float(twins.median())
            spread = float(twins.max() - twins.min()) / centre
            far = float(relative_change(value, centre)) > max(OUTLIER_CHANGE, OUTLIER_SPREADS * spread)
            if far and (len(twins) > 1 or value < centre):  # a pair is said once, from its slower run
                found.append((run_id, value, twins))
    return found


def outlier_warnings(runs: pd.DataFrame) -> list[str]:
    """Ok runs far outside their twins' spread (outliers): one line each. Two runs alone cannot say which
    of them was disturbed; three or more name the one out of line."""
    warnings = []
    for run_id, value, twins in outliers(runs):
        centre = float(twins.median())
        how = f"{max(value, centre) / min(value, centre):.1f}x"
        if len(twins) == 1:
            warnings.append(f"{run_id} and its twin {twins.index[0]} (the same configuration) differ {how} in tokens/s "
                            f"({value:,.0f} against {centre:,.0f}): one of them was disturbed (was the machine busy?); "
                            "a figure built on either is in doubt (repeat the point: repeats.points)")
        else:
            spread = float(twins.max() - twins.min()) / centre
            warnings.append(f"{run_id}: an outlier, {how} {'slower' if value < centre else 'faster'} than the median of "
                            f"its {len(twins)} twins (the same configuration: {value:,.0f} against {centre:,.0f} tokens/s; "
                            f"they differ among themselves by {spread:.0%}): it was disturbed (was the machine busy?); its "
                            "point's median keeps it out of the ranking, but its own figures say nothing of its configuration")
    return warnings


def superlinear_warnings(runs: pd.DataFrame) -> list[str]:
    """Points whose scaling efficiency (tokens/s at N over N x the world-size-1 median of their like) is above 1
    by more than run-to-run noise alone reaches (scalelab.results.noise; any excess where the noise is unknown).
    Ranks that share one machine do not compute faster together: the baseline was slowed. One line for all."""
    from scalelab.results.like import OVER_WORLD_SIZE, by_model, like_key, scaling_efficiency
    from scalelab.results.noise import sweep_noise

    ok = _ok_timed(runs)
    # the noise without the runs out of line with three or more twins: one disturbed run would widen it past any test
    ok = ok[~ok["run_id"].astype(str).isin([run_id for run_id, _, twins in outliers(ok) if len(twins) > 1])]
    found = []
    for _, mine in by_model(ok):
        noise = sweep_noise(mine)
        mine = mine.assign(_eff=scaling_efficiency(mine), _like=like_key(mine, OVER_WORLD_SIZE).to_numpy(),
                           _point=like_key(mine).to_numpy())
        base_runs = mine[mine["world_size"] == 1].groupby("_like")["run_id"].agg(list)
        for _, point in mine[mine["world_size"] > 1].groupby("_point", sort=False):
            eff = float(point["_eff"].median())
            if not np.isfinite(eff) or eff <= 1:
                continue
            baseline = base_runs.get(point["_like"].iloc[0], [])
            margin = noise.margin(len(point), len(baseline)) if noise.known else 0.0
            if eff - 1 > margin:
                found.append((eff, str(point["run_id"].iloc[0]), baseline))
    if not found:
        return []
    found.sort(reverse=True)
    named = _named([f"{run_id} {eff:.2f} (baseline {', '.join(base[:3])}{' ...' if len(base) > 3 else ''})"
                    for eff, run_id, base in found], WORST_NAMED)
    return [f"{len(found)} point(s) scaled superlinearly, scaling efficiency above 1 by more than run-to-run noise "
            f"alone reaches: {named}. More ranks do not compute faster per rank than one alone: their world-size-1 "
            "baseline was likely slowed (a busy machine, a disturbed run), so these efficiencies overstate; rerun the "
            "baseline on a quiet machine"]


def busy_calibration_warnings(runs: pd.DataFrame) -> list[str]:
    """CPU runs whose peak FLOP/s was measured on a busy machine (scalelab.run.calibration.load_text): one line."""
    if "peak_flops_source" not in runs:
        return []
    source = runs["peak_flops_source"].astype("string")
    busy = runs[source.str.contains("busy machine", regex=False, na=False).to_numpy()]
    if busy.empty:
        return []
    return [f"{len(busy)} run(s) divide their MFU by a CPU peak measured on a busy machine ({busy['peak_flops_source'].iloc[0]}): "
            f"the peak reads low and their MFU high ({_named(busy['run_id'].astype(str).tolist(), WORST_NAMED)}); "
            "run the sweep on an idle machine (load below its core count) for an MFU that means something"]
