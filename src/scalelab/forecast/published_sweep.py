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


def plan_check(models=("1B", "3B"), counts=PLAN_COUNTS) -> list[dict]:
    """`scalelab plan`'s pick for the sweep's models at each count, and the sweep's own runs there: the best of any
    configuration, and the best of the pick's family (its tensor-parallel degree and ZeRO stage, any micro-batch)."""
    from scalelab.forecast.plan import plan_for

    out = []
    for model in models:
        for gpus in counts:
            best = plan_for(*_plan_inputs(model, gpus))["best"]
            ran = [(tp, zero, tokens) for m, tp, zero, _, points in playbook_sweep.SWEEP if m == model
                   for nodes, tokens, _ in points if 8 * nodes == gpus]
            family = [tokens for tp, zero, tokens in ran if (tp, zero) == (best["tensor_parallel"], best["strategy"])]
            top = max(ran, key=lambda r: r[2])
            out.append({"model": model, "gpus": gpus, "tensor_parallel": best["tensor_parallel"], "zero_stage": best["strategy"],
                        "predicted": best["tokens_per_s_per_gpu"], "published_best": top[2], "best_family": top[:2],
                        "family_best": max(family) if family else None})
    return out


def plan_markdown(rows: list[dict]) -> str:
    lines = ["| model | GPUs | plan's pick | predicted tok/s/GPU | its family's best run | the best run (TP, ZeRO) | family vs best |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        family = f"{r['family_best']:,}" if r["family_best"] else "not run"
        gap = f"{r['family_best'] / r['published_best'] - 1:+.0%}" if r["family_best"] else "-"
        lines.append(f"| {r['model']} | {r['gpus']} | TP {r['tensor_parallel']}, ZeRO-{r['zero_stage']} | "
                     f"{r['predicted']:,.0f} | {family} | {r['published_best']:,} (TP {r['best_family'][0]}, "
                     f"ZeRO-{r['best_family'][1]}) | {gap} |")
    return "\n".join(lines)


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
    return "\n\n".join([
        f"Ultra-Scale Playbook sweep (nanotron, {len(SWEEP_ROWS)} runs in {len({r.series for r in SWEEP_ROWS})} series), "
        f"as `--trainer megatron` prices it, at its overlap efficiency {MEGATRON_OVERLAP_EFFICIENCY:g} (fitted on the 1B "
        "series, in-sample; the 3B and 8B series held out), per GPU count:",
        by_count_markdown(rows),
        f"Tensor-parallel rows at 64-256 GPUs: {t['tp_rows']}, mean absolute error {t['tp_mae']:.1%} (held out "
        f"{t['tp_held_out_mae']:.1%}), {t['tp_within_20']:.0%} within 20%; {t['mfu_at_most_0_65']:.0%} of the "
        f"{t['tp_series']} tensor-parallel series calibrate at an MFU <= 0.65. Pure data-parallel ZeRO-1 of the 3B model, "
        f"mean absolute error up to 256 GPUs: {zero1}. Memory (the recipe of scalelab.formulas.megatron_style against the "
        f"GPU memory each run states): {t['memory_within_20']:.0%} of {len(memory)} runs within 20%, median predicted/stated "
        f"{t['memory_median_ratio']:.2f}; {t['ran_predicted_to_fit']:.0%} of the runs (all ran in 80 GB) predicted to fit.",
        "The overlap efficiency fitted: each series recalibrated and predicted at each value:",
        "\n".join(eta_lines),
        "`scalelab plan` for the sweep's 1B and 3B models on its cluster (`--trainer megatron`, the measured links as "
        "`busbw:GBPS/RANKS`, the default MFU), against the sweep's runs at each count:",
        plan_markdown(plan_check()),
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
