"""The step-time and memory models against the Ultra-Scale Playbook's benchmark sweep (scalelab.forecast.playbook_sweep:
nanotron on nodes of 8 H100s over EFA; tensor parallelism 2, 4 and 8 with ZeRO-0 and ZeRO-1, and pure data-parallel
ZeRO-1), priced as nanotron runs them (``--trainer megatron``: scalelab.formulas.megatron_style) on the links the sweep
measured. Each series (model, TP, ZeRO stage, micro-batch) is calibrated at its smallest count (its compute efficiency:
the MFU at which the model gives that row's tokens/s) and predicted at the larger counts.

What is fitted, on which rows: the megatron trainer's overlap efficiency (scalelab.registries.strategies.
MEGATRON_OVERLAP_EFFICIENCY) on the 1B series up to 256 GPUs (FIT_MODELS: in-sample); the 3B and 8B series are held out
(out-of-sample). The tables report the two apart, per GPU count; 512-GPU rows are shown but outside the fit and the
targets (several of the sweep's 64-node runs ran at a tenth of their 32-node speed). Memory is not fitted: the recipe of
scalelab.formulas.megatron_style against each run's stated GPU memory.

Stalled runs (stalled_by_model, MODEL_STALL_FACTOR): a run the model, its series calibrated at its smallest count, puts over three times
its published speed spent its step waiting, not on what the model prices. The factor is read off the fit set and checked
on the held-out series (stall_fit); every run it names is at 512 GPUs. The errors at 512 GPUs are printed with and
without them, and `scalelab plan`'s pick is compared with healthy runs only (plan_check), saying where none is left.
The pipelined runs are judged by their slot instead (scalelab.forecast.published_pipeline.stalled_by_slot): a series
whose smallest count stalled would calibrate the model on the stall, which only a model-free rule sees (on those rows
this one leaves the 8B PP 2-4 rows at 8-64 GPUs at 30% error, the slot rule at 4%); without pipelining a step at one
or two micro-batches is one slot, which that rule would read as a stall at healthy counts.

``python -m scalelab.forecast.published`` prints these tables after the data-parallel and FSDP ones; docs/prediction.md
holds them and tests/unit/test_published.py holds the two to each other.
"""
from __future__ import annotations

import statistics

from scalelab.forecast import playbook_sweep
from scalelab.forecast.published_runs import (
    CROSS_MODEL_ROWS,
    SWEEP_ROWS,
    Published,
    calibrated_mfu,
    predicted_row,
    validation,
)

FIT_MODELS = ("1B",)
"""The models whose series fit the megatron trainer's overlap efficiency (in-sample); the others are held out."""
FIT_MAX_GPUS = 256
"""The largest count fitted on and held to the targets."""
TARGET_GPUS = (64, 256)
"""The counts the targets are stated at (tensor-parallel rows within them)."""
FITS_GB = 80.0
"""The GPU memory a run is checked to fit in (the H100's 80 GB), less nothing: the stated figures include what the
recipe leaves out."""
MODEL_STALL_FACTOR = 3.0
"""A sweep run counts as stalled where the model predicts over this many times its published tokens/s per GPU, its series
calibrated at its smallest count (stalled_by_model). Read off the fit set: the 1B series' runs up to 256 GPUs come within 1.6
times the published speed, their three runs at 512 GPUs at 6.9-12.5 times; 3 lies between (the pipelined runs' looser
factor, scalelab.forecast.published_pipeline.STALL_FACTORS). The held-out series check it (stall_fit: none of their
runs up to 256 GPUs beyond 1.5 times; at 512 GPUs a gap between 2.3 and 4.3 times)."""


def model_of(row: Published) -> str:
    return row.series.split()[0]


def series_validation(rows, overlap_efficiency: float | None = None, skip: frozenset = frozenset()) -> list[dict]:
    """Per row beyond its series' smallest count (the (series, GPUs) in ``skip`` left out, calibration point included):
    published and predicted tokens/s per GPU, the error, whether the series is in the fit set, and the series'
    calibrated MFU."""
    out = []
    for series in dict.fromkeys(r.series for r in rows):
        mine = sorted((r for r in rows if r.series == series and (series, r.gpus) not in skip), key=lambda r: r.gpus)
        if len(mine) < 2:
            continue
        mfu = calibrated_mfu(mine[0], overlap_efficiency)
        for row in mine[1:]:
            predicted = predicted_row(row, mfu, overlap_efficiency)["tokens_per_s_per_gpu"]
            out.append({"series": series, "model": model_of(row), "fit": model_of(row) in FIT_MODELS,
                        "pipeline_parallel": row.pipeline_parallel, "tensor_parallel": row.tensor_parallel,
                        "zero_stage": row.key, "micro_batch": row.micro_batch, "calibrated_at": mine[0].gpus, "mfu": mfu,
                        "gpus": row.gpus, "published": row.tokens_per_s_per_gpu, "predicted": predicted,
                        "error": predicted / row.tokens_per_s_per_gpu - 1})
    return out


def sweep_validation(overlap_efficiency: float | None = None) -> list[dict]:
    """The sweep's rows without pipelining (series_validation), on the links as measured."""
    return series_validation(SWEEP_ROWS, overlap_efficiency)


def stalled_by_model(rows: list[dict], factor: float = MODEL_STALL_FACTOR) -> set[tuple[str, int]]:
    """(series, GPUs) of the validated runs (series_validation) the model puts over ``factor`` times their published
    tokens/s per GPU: their step went to waiting the model does not price (the sweep's 64-node runs at a tenth of their
    32-node speed), not to the work and the bytes it does. A series' calibration point is never one: it is the model's
    own."""
    return {(r["series"], r["gpus"]) for r in rows if r["predicted"] > factor * r["published"]}


def stall_fit(rows: list[dict], factor: float = MODEL_STALL_FACTOR) -> dict:
    """The stall rule's fit and check: predicted over published tokens/s per GPU, the fit set and the held-out series
    apart, up to FIT_MAX_GPUS and beyond it; the largest ratio kept and the smallest left out, and the runs each leaves
    out."""
    out = {}
    for name, fit in (("in_sample", True), ("held_out", False)):
        for span, inside in (("within", True), ("beyond", False)):
            ratios = sorted(r["predicted"] / r["published"] for r in rows
                            if r["fit"] == fit and (r["gpus"] <= FIT_MAX_GPUS) == inside)
            kept, left = [x for x in ratios if x <= factor], [x for x in ratios if x > factor]
            out[f"{name}_{span}"] = {"runs": len(ratios), "stalled": len(left), "kept_max": max(kept, default=None),
                                     "stalled_min": min(left, default=None), "stalled_max": max(left, default=None)}
    return out


def memory_validation() -> list[dict]:
    """Per sweep row: the stated GPU memory and the recipe's predicted peak (GB), and whether it is predicted to fit."""
    out = []
    for row in SWEEP_ROWS:
        predicted = predicted_row(row, 0.4)["peak_memory_bytes"] / 1e9  # memory does not depend on the efficiency
        out.append({"series": row.series, "gpus": row.gpus, "tensor_parallel": row.tensor_parallel,
                    "published_gb": row.memory_gb, "predicted_gb": predicted, "ratio": predicted / row.memory_gb,
                    "predicted_to_fit": predicted <= FITS_GB})
    return out


def mean_abs_error(rows: list[dict]) -> float:
    return sum(abs(r["error"]) for r in rows) / len(rows) if rows else float("nan")


def share_within(rows: list[dict], share: float = 0.20) -> float:
    return sum(abs(r["error"]) <= share for r in rows) / len(rows) if rows else float("nan")


def targets(rows: list[dict], memory: list[dict]) -> dict:
    """The figures the targets are stated in: tensor-parallel rows at 64-256 GPUs (all, and held out), the calibrated
    MFUs, the runs predicted to fit, the memory within 20%, and the 3B pure data-parallel ZeRO-1 series."""
    low, high = TARGET_GPUS
    tp = [r for r in rows if r["tensor_parallel"] > 1 and low <= r["gpus"] <= high]
    mfus = {r["series"]: r["mfu"] for r in rows if r["tensor_parallel"] > 1}
    zero1 = {r["series"]: mean_abs_error([x for x in rows if x["series"] == r["series"] and x["gpus"] <= FIT_MAX_GPUS])
             for r in rows if r["model"] == "3B" and r["tensor_parallel"] == 1 and r["zero_stage"] == 1}
    return {"tp_rows": len(tp), "tp_mae": mean_abs_error(tp), "tp_within_20": share_within(tp),
            "tp_held_out_mae": mean_abs_error([r for r in tp if not r["fit"]]),
            "tp_series": len(mfus), "mfu_at_most_0_65": sum(m <= 0.65 for m in mfus.values()) / len(mfus),
            "ran_predicted_to_fit": sum(m["predicted_to_fit"] for m in memory) / len(memory),
            "memory_within_20": sum(abs(m["ratio"] - 1) <= 0.20 for m in memory) / len(memory),
            "memory_median_ratio": statistics.median(m["ratio"] for m in memory), "zero1_3b_mae": zero1}


def by_count_markdown(rows: list[dict]) -> str:
    """Per GPU count: the in-sample and out-of-sample rows, their mean absolute error and share within 20%, all rows and
    the tensor-parallel ones."""
    lines = ["| GPUs | in-sample rows | MAE | within 20% | out-of-sample rows | MAE | within 20% | of them TP: rows | MAE |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in sorted({r["gpus"] for r in rows}):
        at = [r for r in rows if r["gpus"] == n]
        fit, held = [r for r in at if r["fit"]], [r for r in at if not r["fit"]]
        tp = [r for r in held if r["tensor_parallel"] > 1]
        lines.append(f"| {n} | {len(fit)} | {mean_abs_error(fit):.1%} | {share_within(fit):.0%} | {len(held)} | {mean_abs_error(held):.1%} | "
                     f"{share_within(held):.0%} | {len(tp)} | {mean_abs_error(tp):.1%} |")
    return "\n".join(lines).replace("nan%", "-")


def series_markdown(rows: list[dict]) -> str:
    """One line per series: its fit set, where it was calibrated and at what MFU, and its error at each larger count."""
    counts = sorted({r["gpus"] for r in rows})
    lines = ["| series | set | calibrated at (MFU) | " + " | ".join(f"{n}" for n in counts) + " |",
             "|---|---|---|" + "---:|" * len(counts)]
    for series in dict.fromkeys(r["series"] for r in rows):
        mine = {r["gpus"]: r for r in rows if r["series"] == series}
        first = next(iter(mine.values()))
        cells = " | ".join(f"{mine[n]['error']:+.0%}" if n in mine else "" for n in counts)
        lines.append(f"| {series} | {'in' if first['fit'] else 'out'} | {first['calibrated_at']} ({first['mfu']:.1%}) | "
                     f"{cells} |")
    return "\n".join(lines)


def eta_fit(grid=None) -> list[dict]:
    """Per overlap efficiency: the fit set's mean absolute error (up to 256 GPUs) and the held-out rows' (64-256)."""
    out = []
    for eta in grid or [i / 20 for i in range(21)]:
        rows = [r for r in sweep_validation(eta) if r["gpus"] <= FIT_MAX_GPUS]
        held = [r for r in rows if not r["fit"] and r["gpus"] >= TARGET_GPUS[0]]
        out.append({"overlap_efficiency": eta, "fit": mean_abs_error([r for r in rows if r["fit"]]), "held_out": mean_abs_error(held)})
    return out


PLAN_COUNTS = (64, 128, 256, 512)


def _plan_inputs(model: str, gpus: int):
    """`scalelab plan`'s inputs for a sweep model on the sweep's cluster: its measured links as nccl-tests printed them,
    the megatron trainer with fp32 gradient reduction, bf16, no pipelining (SWEEP holds the runs without it: like
    against like)."""
    from scalelab.forecast.inputs import Cluster, ModelChoice, PlanAsk
    from scalelab.formulas import flops

    cfg = playbook_sweep.MODELS[model]
    return (ModelChoice(flops.param_count(cfg), cfg, {}),
            Cluster(gpu="H100", intra_node=f"busbw:{playbook_sweep.BUSBW_GB[1]:g}/8",
                    inter_node=playbook_sweep.measured_inter_node(), trainer="megatron", grad_reduce="fp32"),
            PlanAsk(gpus=gpus, global_batch=playbook_sweep.GLOBAL_BATCH, tokens=1e12, precisions=["bf16"],
                    pipeline_parallel=[1]))


def _runs_at(model: str, gpus: int, stalls: set[tuple[str, int]]) -> list[dict]:
    """The sweep's runs of ``model`` at ``gpus`` (playbook_sweep.SWEEP, pure data parallelism included), each marked
    where ``stalls`` names it (by SWEEP_ROWS' series names; a run no validated series holds is kept)."""
    return [{"tensor_parallel": tp, "zero_stage": zero, "micro_batch": micro, "tokens": tokens,
             "stalled": (f"{m} TP {tp} ZeRO-{zero} mb {micro}", gpus) in stalls}
            for m, tp, zero, micro, points in playbook_sweep.SWEEP if m == model
            for nodes, tokens, _ in points if 8 * nodes == gpus]


def plan_check(models=("1B", "3B"), counts=PLAN_COUNTS, stall_rule: bool = True) -> list[dict]:
    """`scalelab plan`'s pick for the sweep's models at each count, and the sweep's own runs there, the stalled ones
    left out and listed (``stall_rule``; False: every run kept): the best healthy run of any configuration, and the best
    of the pick's family (its tensor-parallel degree and ZeRO stage, any micro-batch). None where no healthy run is
    left: the sweep cannot test the pick there."""
    from scalelab.forecast.plan import plan_for

    stalls = stalled_by_model(sweep_validation()) if stall_rule else set()
    out = []
    for model in models:
        for gpus in counts:
            best = plan_for(*_plan_inputs(model, gpus))["best"]
            runs = _runs_at(model, gpus, stalls)
            family = [r for r in runs if (r["tensor_parallel"], r["zero_stage"]) == (best["tensor_parallel"], best["strategy"])]
            top = max((r for r in runs if not r["stalled"]), key=lambda r: r["tokens"], default=None)
            own = max((r for r in family if not r["stalled"]), key=lambda r: r["tokens"], default=None)
            out.append({"model": model, "gpus": gpus, "tensor_parallel": best["tensor_parallel"], "zero_stage": best["strategy"],
                        "predicted": best["tokens_per_s_per_gpu"], "published_best": top and top["tokens"],
                        "best_family": top and (top["tensor_parallel"], top["zero_stage"]),
                        "best_micro_batch": top and top["micro_batch"], "family_best": own and own["tokens"],
                        "family_runs": len(family), "family_stalled": [r["tokens"] for r in family if r["stalled"]],
                        "stalled": [(r["tensor_parallel"], r["zero_stage"], r["micro_batch"], r["tokens"])
                                    for r in runs if r["stalled"]]})
    return out


def plan_tested(row: dict) -> bool:
    """Whether the sweep tests the pick at this count: a healthy run of its family to set against the best healthy run."""
    return row["family_best"] is not None and row["published_best"] is not None


def plan_markdown(rows: list[dict]) -> str:
    lines = ["| model | GPUs | plan's pick | predicted tok/s/GPU | its family's best run | the best run (TP, ZeRO) | "
             "family vs best | stalled runs left out |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        stalled_family = ", ".join(f"{t:,}" for t in r["family_stalled"])
        family = (f"{r['family_best']:,}" if r["family_best"] is not None else
                  f"none healthy (stalled at {stalled_family})" if r["family_runs"] else "not run")
        best = (f"{r['published_best']:,} (TP {r['best_family'][0]}, ZeRO-{r['best_family'][1]})"
                if r["published_best"] is not None else f"none healthy ({len(r['stalled'])} runs stalled)")
        gap = f"{r['family_best'] / r['published_best'] - 1:+.0%}" if plan_tested(r) else "untested"
        lines.append(f"| {r['model']} | {r['gpus']} | TP {r['tensor_parallel']}, ZeRO-{r['zero_stage']} | "
                     f"{r['predicted']:,.0f} | {family} | {best} | {gap} | {len(r['stalled'])} |")
    return "\n".join(lines)


def plan_verdict(rows: list[dict], within: float = 0.10) -> str:
    """In words: where the sweep tests the pick and whether its family is within ``within`` of the best healthy run, and
    where it cannot test it, and why (a comparison with nothing is no pass)."""
    tested = [r for r in rows if plan_tested(r)]
    close = [r for r in tested if r["family_best"] >= (1 - within) * r["published_best"]]
    misses = "; ".join(f"{r['model']} at {r['gpus']} GPUs {r['family_best'] / r['published_best'] - 1:+.0%}"
                       for r in tested if r not in close)
    untested = []
    for r in rows:
        if plan_tested(r):
            continue
        pick = f"TP {r['tensor_parallel']}, ZeRO-{r['zero_stage']}"
        if r["published_best"] is None:
            why = f"where all {len(r['stalled'])} runs stalled (no healthy run of any configuration)"
        elif r["family_runs"]:
            why = (f"where the pick's family, {pick}, ran {r['family_runs']} times and stalled each time (the best "
                   f"healthy run there: TP {r['best_family'][0]}, ZeRO-{r['best_family'][1]}, micro-batch "
                   f"{r['best_micro_batch']}, {r['published_best']:,} tokens/s per GPU)")
        else:
            why = f"where the pick's family, {pick}, was not run"
        untested.append(f"{r['model']} at {r['gpus']} GPUs, {why}")
    text = (f"Where the sweep has a healthy run of the pick's family ({len(tested)} of {len(rows)} model and count pairs), it "
            f"is "
            f"within {within:.0%} of the best healthy run at {len(close)} of them" + (f" (not: {misses})" if misses else "")
            + ".")
    if untested:
        text += (f" The sweep cannot test the pick at the other {len(untested)}, which are neither a pass nor a miss: "
                 + "; ".join(untested) + ".")
    return text


def stall_document(rows: list[dict]) -> str:
    """The stall rule in words: its fit on the 1B series, its check on the held-out ones, and the 512-GPU errors with
    and without the runs it names."""
    f, out = stall_fit(rows), stalled_by_model(rows)
    ins, held = f["in_sample_beyond"], f["held_out_beyond"]
    beyond = [r for r in rows if r["gpus"] > FIT_MAX_GPUS]
    healthy = [r for r in beyond if (r["series"], r["gpus"]) not in out]

    def errors(sel):
        return (f"{len(sel)} rows, mean absolute error {mean_abs_error(sel):.1%} ({share_within(sel):.0%} within 20%)"
                if sel else "none left")

    return (f"Stalled runs: a run the model puts over {MODEL_STALL_FACTOR:g} times its published tokens/s per GPU (its series "
            f"calibrated at its smallest count) is taken as stalled, its step spent waiting the model does not price. "
            f"Fitted on the 1B series: their {f['in_sample_within']['runs']} runs up to {FIT_MAX_GPUS} GPUs come within "
            f"{f['in_sample_within']['kept_max']:.2f} times, their {ins['runs']} runs beyond at "
            f"{ins['stalled_min']:.1f}-{ins['stalled_max']:.1f} times ({ins['stalled']} stalled). Held out: the 3B and "
            f"8B runs up to {FIT_MAX_GPUS} GPUs come within {f['held_out_within']['kept_max']:.2f} times "
            f"({f['held_out_within']['stalled']} stalled); beyond, {held['runs'] - held['stalled']} of {held['runs']} "
            f"within {held['kept_max']:.2f} times and {held['stalled']} stalled at {held['stalled_min']:.2f}-"
            f"{held['stalled_max']:.2f} times. Beyond {FIT_MAX_GPUS} GPUs with the stalled runs left out: in-sample "
            f"{errors([r for r in healthy if r['fit']])}; held out {errors([r for r in healthy if not r['fit']])} "
            f"(every run: in-sample {errors([r for r in beyond if r['fit']])}; held out "
            f"{errors([r for r in beyond if not r['fit']])}).")


def zero1_document(rows: list[dict]) -> str:
    """The tensor-parallel ZeRO-1 rows' mean error per model and count at TARGET_GPUS: their reduce-scatters and
    all-gathers run on their rails (links.across_nodes says why), the fit set and the held-out series apart."""
    low, high = TARGET_GPUS
    cells = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model and r["zero_stage"] == 1 and r["tensor_parallel"] > 1]
        per = [(n, [r["error"] for r in mine if r["gpus"] == n]) for n in sorted({r["gpus"] for r in mine})
               if low <= n <= high]
        cells.append(f"{model} ({'in-sample' if model in FIT_MODELS else 'held out'}) "
                     + ", ".join(f"{statistics.mean(e):+.1%} at {n} ({len(e)})" for n, e in per if e))
    return ("Tensor-parallel ZeRO-1 rows, their reduce-scatters and all-gathers on the rails (links.across_nodes), mean "
            f"error (predicted / published - 1) at {low}-{high} GPUs (rows): " + "; ".join(cells) + ".")


def sweep_document() -> str:
    """The sweep's section of docs/prediction.md's published-validation block."""
    from scalelab.registries.strategies import MEGATRON_OVERLAP_EFFICIENCY

    rows, memory = sweep_validation(), memory_validation()
    t = targets(rows, memory)
    fit = eta_fit(sorted({i / 4 for i in range(5)} | {MEGATRON_OVERLAP_EFFICIENCY}))
    eta_lines = ["| overlap efficiency | fit set (1B, up to 256 GPUs) | held out (3B, 8B, 64-256 GPUs) |", "|---:|---:|---:|"]
    eta_lines += [f"| {f['overlap_efficiency']:g} | {f['fit']:.1%} | {f['held_out']:.1%} |"
                  for f in sorted(fit, key=lambda f: f["overlap_efficiency"])]
    zero1 = ", ".join(f"{s} {e:.1%}" for s, e in t["zero1_3b_mae"].items())
    plans = plan_check()
    return "\n\n".join([
        f"Ultra-Scale Playbook sweep (nanotron, {len(SWEEP_ROWS)} runs in {len({r.series for r in SWEEP_ROWS})} series), "
        f"as `--trainer megatron` prices it, at its overlap efficiency {MEGATRON_OVERLAP_EFFICIENCY:g} (fitted on the 1B "
        "series, in-sample; the 3B and 8B series held out), per GPU count:",
        by_count_markdown(rows),
        stall_document(rows),
        f"Tensor-parallel rows at 64-256 GPUs: {t['tp_rows']}, mean absolute error {t['tp_mae']:.1%} (held out "
        f"{t['tp_held_out_mae']:.1%}), {t['tp_within_20']:.0%} within 20%; {t['mfu_at_most_0_65']:.0%} of the "
        f"{t['tp_series']} tensor-parallel series calibrate at an MFU <= 0.65. Pure data-parallel ZeRO-1 of the 3B model, "
        f"mean absolute error up to 256 GPUs: {zero1}. Memory (the recipe of scalelab.formulas.megatron_style against the "
        f"GPU memory each run states): {t['memory_within_20']:.0%} of {len(memory)} runs within 20%, median predicted/stated "
        f"{t['memory_median_ratio']:.2f}; {t['ran_predicted_to_fit']:.0%} of the runs (all ran in 80 GB) predicted to fit.",
        "The overlap efficiency fitted: each series recalibrated and predicted at each value:",
        "\n".join(eta_lines),
        zero1_document(rows),
        "`scalelab plan` for the sweep's 1B and 3B models on its cluster (`--trainer megatron`, the measured links as "
        "`busbw:GBPS/RANKS`, the default MFU), against the sweep's healthy runs at each count (the stalled ones left out):",
        plan_markdown(plans),
        plan_verdict(plans),
        cross_model_markdown(),
        "Each series: calibrated at its smallest count (MFU), its error at each larger count:",
        series_markdown(rows)])


def cross_model_markdown() -> str:
    """The second source's tensor-parallel run (scalelab.forecast.published_runs.CROSS_MODEL_ROWS), out-of-sample, apart."""
    rows = validation(rows=CROSS_MODEL_ROWS)
    cells = "; ".join(f"{r['gpus']} GPUs ({r['strategy']}, {'70B' if r['gpus'] == 256 else '8B'}): published "
                      f"{r['published']:,.0f}, predicted {r['predicted']:,.0f}, {r['error']:+.1%}" for r in rows)
    return (f"A second source, across model sizes (out-of-sample, not in the targets): torchtitan's only tensor-parallel "
            f"run, from its 8B FSDP runs' efficiency (calibrated at 8 GPUs, MFU {rows[0]['mfu']:.1%} of the fp8 peak): {cells}.")
