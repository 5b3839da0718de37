"""Sweeps that run what the forecast ranks (``planning.top_k``, issue #44): before any job starts, every
point of the sweep is forecast by ``scalelab plan``'s model (estimate.predict_point: compute at an
assumed efficiency, each collective on its link, the strategy's overlap, the in-step peak memory), and
only the ``top_k`` fastest of each model and world size among those predicted to fit run, plus the
baselines the report's comparisons divide by. Every other point is recorded ``skipped``, its reason
naming its rank, with its forecast (the rows' ``forecast_*`` columns), so the report can show it apart
from what was measured.

Ranked within one model and one world size: a comparison is made between like runs only (a model's
tokens cost what its shape makes them cost; a world size's tokens/s is the scaling question, which the
baselines at every world size answer).

The decision is made once per Snakemake invocation by the planning process and written to
``<results>/plan/forecast.json``; the sweep's jobs (another host under SLURM) read it, never forecast
again. It depends on the config and, on a CPU, the results folder's one calibration of the peak
FLOP/s (measured here if the folder has none yet, as the first run would), so a resumed sweep makes
the same decision. A point that already ended ok is never pruned afterwards: pruning decides what to
launch, not what to forget.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from scalelab.config import ConfigError, section
from scalelab.forecast.estimate import DEFAULT_MFU, EstimateError, Machine, Point, predict_point
from scalelab.forecast.plan import TIE
from scalelab.formulas import accounting, links, predicted_columns
from scalelab.io import write_json
from scalelab.plan.columns import PRUNED_REASON
from scalelab.plan.run_plan import RunPlan
from scalelab.plan.sweep import is_baseline, sweep_values
from scalelab.spec import hardware
from scalelab.spec.strategies import HYBRID_KEY

FORECAST_FILE = Path("plan") / "forecast.json"
"""Below the results folder: the planning process's forecast and decision, read by the jobs."""

CPU_LINK = links.Link("gloo on one host (assumed)", 2.0e9, 250e-6,
                      "assumed: the order `scalelab bench comm` measured for gloo between CPU ranks of one 2-core VM "
                      "(about 2.4 GB/s bus bandwidth, 260 us per call); the forecast does not read a sweep's own table, "
                      "so that a resumed sweep ranks as its first invocation did")
"""The link a CPU sweep's forecast puts every collective on."""

NOT_FORECAST = {"lora_rank": "LoRA (the forecast trains every weight)", "cpu_offload": "CPU offload"}
"""Levers the forecast cannot tell from their default: points with them on are never pruned (they run)."""

UNMODELLED = "compile, DDP bucket size and the gradient-reduction dtype are forecast as at their defaults"


@dataclass(frozen=True)
class Decision:
    """What the plan decided for one point."""
    run_id: str
    forecast: dict | None
    """forecast_step_time_s, forecast_tokens_per_s, forecast_rank, forecast_note (the rows' columns);
    None where the point is not forecast (a user's module, a lever the forecast cannot tell apart)."""
    pruned: bool
    reason: str | None
    """Why it is not run (status skipped); None when it runs."""


def forecast_path(results_dir: str | Path) -> Path:
    return Path(results_dir) / FORECAST_FILE


def top_k(config: dict) -> int | None:
    return section(config, "planning").get("top_k")


def _machine(config: dict, device: str, point, per_node: int, calibration: dict | None, d_model: int) -> tuple[Machine, str]:
    """The forecast's machine for one point's precision, and where its figures come from."""
    from scalelab.results import prediction

    forecast = section(config, "planning").get("forecast") or {}
    mfu = forecast.get("mfu") or DEFAULT_MFU
    eta = prediction.DEFAULT_OVERLAP_EFFICIENCY[device]
    precision = point.precision
    if device == "cpu":
        from scalelab.spec.precisions import precision as precision_record

        dtype = precision_record(precision).matmul_precision
        peak = (calibration or {}).get("peaks_flops", {}).get(dtype)
        if not peak:
            raise ConfigError(f"planning.top_k: the CPU forecast needs the sweep's measured {dtype} matmul peak "
                              "(<results>/calibration/cpu.json), and measuring it failed; see the message above")
        source = (f"CPU {dtype} matmul peak {peak / 1e9:.1f} GFLOP/s (the sweep's calibration, "
                  f"{calibration['measured_utc']}) x MFU {mfu:g}; {CPU_LINK.name}; overlap {eta:g}")
        return Machine(product=None, peak_flops=peak, mfu=mfu, per_node=per_node, intra=CPU_LINK, inter=CPU_LINK,
                       overlap_efficiency=eta), source
    product = _gpu(config)
    if precision == "fp8":  # as scalelab plan times it: bf16's peak by the tokens/s ratio measured on a GPU
        peak = (accounting.gpu_peak_flops(product.name, "bf16")
                * hardware.fp8_outlook(d_model, compiled=bool(point.compile))["ratio_estimate"])
    else:
        peak = accounting.gpu_peak_flops(product.name, precision)
    intra_spec = forecast.get("intra_node") or links.DEFAULT_INTRA_NODE.get(product.name)
    if intra_spec is None:
        raise ConfigError(f"planning.forecast.intra_node: no default link for {product.name}; give a product "
                          f"({', '.join(links.known_names())}) or a bandwidth in GB/s")
    intra = links.parse_link(intra_spec)
    inter = links.parse_link(forecast["inter_node"]) if forecast.get("inter_node") else None
    if inter is None and point.world_size > per_node:
        raise ConfigError(f"planning.forecast.inter_node: {point.run_id} spans nodes of {per_node} GPUs; give the link "
                          f"between nodes the forecast puts its collectives on ({', '.join(links.known_names())}, or GB/s)")
    source = (f"{product.name} datasheet {precision} peak x MFU {mfu:g}; {intra.name} within a node"
              + (f", {inter.name} between nodes" if inter else "") + f"; overlap {eta:g}")
    return Machine(product=product, peak_flops=peak, mfu=mfu, per_node=per_node, intra=intra, inter=inter,
                   overlap_efficiency=eta), source


def _gpu(config: dict):
    """The GPU product a GPU sweep's forecast reads: planning.forecast.gpu, else the one nvidia-smi lists."""
    from scalelab.plan.placement import visible_gpus

    name = (section(config, "planning").get("forecast") or {}).get("gpu")
    if name is None:
        seen = visible_gpus()
        if not seen:
            raise ConfigError("planning.top_k on a GPU sweep needs the GPU the forecast reads: set "
                              "planning.forecast.gpu (a product of `scalelab estimate gpus`, e.g. H100)")
        name = seen[0]
    try:
        return hardware.gpu_by_name(name)
    except ValueError as err:
        raise ConfigError(f"planning.forecast.gpu {name!r}: {err}") from None


def _forecast(config: dict, plan: RunPlan, calibration: dict | None) -> tuple[dict | None, bool, str | None]:
    """(the point's forecast columns or None, whether it is predicted to fit, why it is not forecast)."""
    point, model = plan.point, plan.model
    if model.module:
        return None, True, f"model {point.model} is a user's module (its size is counted by torch at launch)"
    unmodelled = [text for name, text in NOT_FORECAST.items() if getattr(point, name) not in (None, False)]
    if unmodelled:
        return None, True, f"{', '.join(unmodelled)} on"
    n_params = accounting.param_count(model)
    stage, replicas = point.zero_stage, point.replicas
    per_node = point.world_size // replicas if replicas > 1 else plan.launch.ranks_per_launcher
    machine, source = _machine(config, plan.device, point, per_node, calibration, model.d_model)
    forecast_point = Point(cfg=model, n_params=n_params, key=HYBRID_KEY if replicas > 1 else stage,
                           precision=point.precision, micro_batch=plan.micro_batch, global_batch=plan.train.global_batch,
                           activation_checkpointing=point.activation_checkpointing, tensor_parallel=point.tensor_parallel)
    try:
        row = predict_point(forecast_point, machine, point.world_size)
    except EstimateError as err:
        return None, True, str(err)
    # fits as the launcher decides (planning.device_memory_gib, else the GPU's memory; a CPU has no limit)
    limit_gib = section(config, "planning").get("device_memory_gib")
    limit = limit_gib * 2 ** 30 if limit_gib else (machine.product.memory_gib * 2 ** 30 if machine.product else None)
    fits = not accounting.predicts_oom(predicted_columns.peak(model, n_params, plan.formula_row()), limit)
    columns = {"forecast_step_time_s": row["step_time_s"], "forecast_tokens_per_s": row["tokens_per_s"],
               "forecast_note": f"{source}; {UNMODELLED}"}
    return columns, fits, None


def decide(config: dict, plans: dict[str, RunPlan], calibration: dict | None = None,
           measured_ok: frozenset[str] = frozenset()) -> dict[str, Decision]:
    """Every point's decision under planning.top_k (every point runs where it is unset). ``measured_ok``:
    run ids whose folders already hold an ok run (kept, whatever their rank)."""
    k = top_k(config)
    if k is None:
        return {run_id: Decision(run_id, None, False, None) for run_id in plans}
    values = sweep_values(config)
    forecasts = {run_id: _forecast(config, plan, calibration) for run_id, plan in plans.items() if plan.point.repeat == 1}
    groups: dict[tuple, list[str]] = {}
    for run_id, plan in plans.items():
        if plan.point.repeat == 1 and forecasts[run_id][0] is not None and forecasts[run_id][1]:
            groups.setdefault((plan.point.model, plan.point.world_size), []).append(run_id)
    rank_of: dict[str, tuple[int, int]] = {}
    for members in groups.values():
        speed = {run_id: forecasts[run_id][0]["forecast_tokens_per_s"] for run_id in members}
        for run_id in members:  # 1 + the points forecast faster by more than the forecast's own error (ties share a rank)
            rank_of[run_id] = (1 + sum(other > speed[run_id] * (1 + TIE) for other in speed.values()), len(members))
    decisions = {}
    for run_id, plan in plans.items():
        point = plan.point
        first = dataclasses.replace(point, repeat=1).run_id  # a repeat follows its point
        columns, fits, why_not = forecasts[first]
        rank, of = rank_of.get(first, (None, None))
        if columns is not None and rank is not None:
            columns = {**columns, "forecast_rank": rank}
        pruned = (rank is not None and rank > k and not is_baseline(point, values) and run_id not in measured_ok)
        reason = None
        if pruned:
            reason = (f"{PRUNED_REASON}, rank {rank} of {of} of model {point.model} at world size {point.world_size} "
                      f"by forecast tokens/s ({columns['forecast_tokens_per_s']:.4g}; ties within {TIE:.0%} share a rank; "
                      f"planning.top_k = {k}); "
                      "raise planning.top_k to run it")
        elif columns is None and why_not:
            columns = {"forecast_note": f"not forecast, so not pruned: {why_not}"}
        decisions[run_id] = Decision(run_id, columns, pruned, reason)
    return decisions


def plan_forecast(config: dict, plans: dict[str, RunPlan], results_dir: str | Path,
                  calibration: dict | None = None) -> dict[str, Decision]:
    """The planning process's decision under planning.top_k (a CPU sweep's: with the results folder's
    calibration, the record its runs read), every point decided and the record written."""
    decisions = decide(config, plans, calibration, measured_ok=_measured_ok(results_dir, plans))
    write(results_dir, decisions)
    return decisions


def _measured_ok(results_dir: str | Path, plans) -> frozenset[str]:
    ok = set()
    for run_id in plans:
        summary = Path(results_dir) / "runs" / run_id / "summary.json"
        try:
            if json.loads(summary.read_text()).get("status") == "ok":
                ok.add(run_id)
        except (OSError, ValueError):
            pass
    return frozenset(ok)


def write(results_dir: str | Path, decisions: dict[str, Decision]) -> Path:
    path = forecast_path(results_dir)
    write_json(path, {run_id: {"forecast": d.forecast, "pruned": d.pruned, "reason": d.reason}
                      for run_id, d in decisions.items()})
    return path


def read(results_dir: str | Path) -> dict[str, Decision]:
    """The planning process's decisions ({} where it made none: planning.top_k unset, or an older sweep)."""
    path = forecast_path(results_dir)
    if not path.exists():
        return {}
    return {run_id: Decision(run_id, d["forecast"], d["pruned"], d["reason"])
            for run_id, d in json.loads(path.read_text()).items()}


def summary_line(decisions: dict[str, Decision], k: int) -> str:
    pruned = [d.run_id for d in decisions.values() if d.pruned]
    unranked = sorted({d.forecast["forecast_note"] for d in decisions.values()
                       if d.forecast and "forecast_rank" not in d.forecast and d.forecast.get("forecast_note")})
    text = (f"scalelab: planning.top_k={k}: {len(decisions) - len(pruned)} of {len(decisions)} runs selected (the points "
            f"of each model and world size ranked 1..{k} by forecast tokens/s, ties within {TIE:.0%} sharing a rank, "
            "and the baselines); "
            f"{len(pruned)} pruned, recorded skipped with their forecast"
            + (f" ({', '.join(pruned[:4])}{', ...' if len(pruned) > 4 else ''})" if pruned else ""))
    return text + "".join(f"\nscalelab: {note}" for note in unranked)

