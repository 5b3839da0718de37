"""Sweeps that run what the forecast ranks (``planning.top_k``): before any job starts, every
point of the sweep is forecast by ``scalelab plan``'s model (predict.predict_point: compute at an
assumed efficiency, each collective on its link, the strategy's overlap, the in-step peak memory), and
only the points ranked 1..``top_k`` by forecast tokens/s within each model and world size (among those
predicted to fit) run, plus the baselines the report's comparisons divide by. Every other point is
recorded ``skipped``, its reason naming its rank, with its forecast (the rows' ``forecast_*`` columns),
so the report can show it apart from what was measured.

Ranked within one model and one world size: a comparison is made between like runs only (a model's
tokens cost what its shape makes them cost; a world size's tokens/s is the scaling question, which the
baselines at every world size answer).

The planning process decides once per Snakemake invocation (rules/common.smk); the process that runs
the jobs writes the decision to ``<results>/plan/forecast.json`` under the results folder's lock (the
workflow's onstart, rules/hooks.smk), and the sweep's jobs (another host under SLURM) read it, never forecast again.
It depends on the config and, on a CPU, the results folder's one calibration of the peak FLOP/s
(measured when planning if the folder has none yet, as the first run would). A point any of whose
runs already ended ok is never pruned afterwards: pruning decides what to launch, not what to forget.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from scalelab.config import ConfigError, section
from scalelab.forecast.estimate import DEFAULT_MFU
from scalelab.forecast.inputs import EstimateError
from scalelab.forecast.plan import TIE
from scalelab.forecast.predict import predict_point
from scalelab.forecast.step import Machine, Point
from scalelab.formulas import flops, links, peak_memory, predicted_columns
from scalelab.planning.forecast_record import PRUNED_REASON, Decision
from scalelab.planning.placement import device_memory_limit
from scalelab.planning.run_plan import RunPlan
from scalelab.planning.sweep import is_baseline, sweep_values
from scalelab.registries import hardware
from scalelab.registries.strategies import HYBRID_KEY

CPU_LINK = links.Link("gloo on one host (assumed)", 2.0e9, 250e-6,
                      "assumed: the order `scalelab bench comm` measured for gloo between CPU ranks of one 2-core VM "
                      "(about 2.4 GB/s bus bandwidth, 260 us per call); the forecast does not read a sweep's own table, "
                      "so that a resumed sweep ranks as its first invocation did")
"""The link a CPU sweep's forecast puts every collective on."""

NOT_FORECAST = {"lora_rank": "LoRA (the forecast trains every weight)", "cpu_offload": "CPU offload"}
"""Levers the forecast cannot tell from their default: points with them on are never pruned (they run)."""

UNMODELLED = "compile, DDP bucket size and sequence parallelism are forecast as at their defaults"


class _Forecast(NamedTuple):
    columns: dict | None
    """forecast_step_time_s, forecast_tokens_per_s, forecast_note; None where not forecast."""
    why_not: str | None = None
    """Why the point is not ranked (not forecast, or predicted not to fit); None when it is."""


def top_k(config: dict) -> int | None:
    return section(config, "planning").get("top_k")


def _link(key: str, spec, per_node: int) -> links.Link:
    """planning.forecast.<key> as a link, read as estimate scaling reads its flag (links.side_link)."""
    try:
        return links.side_link(str(spec), per_node, key == "inter_node")
    except ValueError as err:
        raise ConfigError(f"planning.forecast.{key}: {err}") from None


def _gpu(config: dict):
    """(the GPU product a GPU sweep's forecast reads, where its name came from): planning.forecast.gpu,
    else the first GPU nvidia-smi lists on the planning machine."""
    from scalelab.planning.placement import visible_gpus

    name, origin = (section(config, "planning").get("forecast") or {}).get("gpu"), "planning.forecast.gpu"
    if name is None:
        seen = visible_gpus()
        if not seen:
            raise ConfigError("planning.top_k on a GPU sweep needs the GPU the forecast reads: set "
                              "planning.forecast.gpu (a product of `scalelab estimate gpus`, e.g. H100)")
        name, origin = seen[0], "the GPU nvidia-smi lists (set planning.forecast.gpu to name another)"
    try:
        return hardware.gpu_by_name(name)
    except ValueError as err:
        raise ConfigError(f"planning.forecast.gpu: {name!r} from {origin}: {err}") from None


class _Machines:
    """The forecast's machine per point: the same GPU product and links for the whole sweep (a CPU's: its
    calibrated peak per precision and the assumed gloo link), the peak of the point's precision."""

    def __init__(self, config: dict, device: str, calibration: dict | None):
        from scalelab.formulas import overlap

        forecast = section(config, "planning").get("forecast") or {}
        self.calibration = calibration
        self.mfu = forecast.get("mfu") or DEFAULT_MFU
        self.eta = overlap.DEFAULT_OVERLAP_EFFICIENCY[device]
        self.per_node = int(section(config, "cluster").get("ranks_per_node", 1))
        if device == "cpu":
            self.product, self.intra, self.inter = None, CPU_LINK, CPU_LINK
            return
        self.product = _gpu(config)
        intra = forecast.get("intra_node") or links.DEFAULT_INTRA_NODE.get(self.product.name)
        if intra is None:
            raise ConfigError(f"planning.forecast.intra_node: no default link for {self.product.name}; give a product "
                              f"({', '.join(links.known_names())}) or a bandwidth in GB/s")
        self.intra = _link("intra_node", intra, self.per_node)
        self.inter = (_link("inter_node", forecast["inter_node"], self.per_node)
                      if forecast.get("inter_node") is not None else None)

    def of(self, plan: RunPlan) -> tuple[Machine | None, str]:
        """(the point's machine, its figures' sources), or (None, why the point cannot be forecast)."""
        point, train = plan.point, plan.train
        if self.product is None:
            # Every precision at fp32's measured peak: a CPU's 16-bit matmul rate at the calibration's sizes says little
            # about a small model's step (here bf16 measured 4.9x fp32's peak, and its runs 0.57x fp32's tokens/s), so
            # the forecast ranks a CPU sweep's points by what it can tell apart: their communication and recompute.
            peak = (self.calibration or {}).get("peaks_flops", {}).get("fp32")
            if not peak:
                raise ConfigError("planning.top_k: the CPU forecast needs the sweep's measured fp32 matmul peak "
                                  "(<results>/calibration/cpu.json), and measuring it failed (see above); the sweep "
                                  "stops here rather than rank without it")
            # the host is named: under SLURM the planning (login) node measured it, not the nodes the runs take, so
            # the figures are on its scale; the ranking is not (every point at one peak)
            source = (f"CPU fp32 matmul peak {peak / 1e9:.1f} GFLOP/s for every precision (the sweep's calibration on "
                      f"{self.calibration.get('hostname', 'an unnamed host')}, {self.calibration['measured_utc']}) x MFU "
                      f"{self.mfu:g}; {CPU_LINK.name}; overlap {self.eta:g}")
        else:
            if point.world_size > self.per_node and self.inter is None:
                raise ConfigError(f"planning.forecast.inter_node: {point.run_id} spans nodes of {self.per_node} GPUs; "
                                  "give the link between nodes the forecast puts its collectives on "
                                  f"({', '.join(links.known_names())}, or GB/s)")
            if point.precision == "fp8":  # as scalelab plan times it: bf16's peak by the tokens/s ratio measured on a GPU
                if self.product.peak("fp8") is None and not train.fp8_emulate:
                    return None, f"fp8 on {self.product.name}, which has no FP8: the launcher skips it"
                ratio = hardware.fp8_outlook(plan.model.d_model, compiled=bool(point.compile))["ratio_estimate"]
                peak, where = hardware.product_peak_flops(self.product, self.product.name, "bf16", False, train.peak_tflops)
                peak, where = peak * ratio, f"{where} x the fp8/bf16 tokens/s ratio measured on a GPU ({ratio:.2f})"
            else:
                peak, where = hardware.product_peak_flops(self.product, self.product.name, point.precision, train.tf32,
                                                          train.peak_tflops)
            if math.isnan(peak):  # no figure for this precision
                return None, where
            source = (f"{where}, x MFU {self.mfu:g}; {self.intra.name} within a node"
                      + (f", {self.inter.name} between nodes" if self.inter else "") + f"; overlap {self.eta:g}")
        return Machine(product=self.product, peak_flops=peak, mfu=self.mfu, per_node=self.per_node, intra=self.intra,
                       inter=self.inter, overlap_efficiency=self.eta), source


def _forecast(config: dict, plan: RunPlan, machines: _Machines) -> _Forecast:
    point, model = plan.point, plan.model
    if model.module:
        return _Forecast(None, f"model {point.model} is a user's module (its size is counted by torch at launch)")
    unmodelled = [text for name, text in NOT_FORECAST.items() if getattr(point, name) not in (None, False)]
    if unmodelled:
        return _Forecast(None, f"{', '.join(unmodelled)} on")
    machine, source = machines.of(plan)
    if machine is None:
        return _Forecast(None, source)
    n_params = flops.param_count(model)
    forecast_point = Point(cfg=model, n_params=n_params, key=HYBRID_KEY if point.replicas > 1 else point.zero_stage,
                           precision=point.precision, grad_reduce=point.grad_reduce, micro_batch=plan.micro_batch,
                           global_batch=plan.train.global_batch, activation_checkpointing=point.activation_checkpointing,
                           tensor_parallel=point.tensor_parallel, replicas=point.replicas if point.replicas > 1 else None)
    try:
        row = predict_point(forecast_point, machine, point.world_size)
    except EstimateError as err:
        return _Forecast(None, str(err))
    peak = predicted_columns.peak(model, n_params, plan.formula_row())
    columns = {"forecast_step_time_s": row["step_time_s"], "forecast_tokens_per_s": row["tokens_per_s"],
               "forecast_note": f"{source}; {UNMODELLED}"}
    datasheet_bytes = machines.product.memory_gib * 2 ** 30 if machines.product else None  # a CPU: none
    if peak_memory.predicts_oom(peak, device_memory_limit(config, datasheet_bytes)):
        return _Forecast(columns, f"predicted not to fit ({peak.total / 2**30:.2f} GiB per rank): left to the launcher "
                                  "(predicted_oom)")
    return _Forecast(columns)


def decide(config: dict, plans: dict[str, RunPlan], calibration: dict | None = None,
           measured_ok: frozenset[str] = frozenset()) -> dict[str, Decision]:
    """Every point's decision under planning.top_k (every point runs, with no forecast, where it is unset).
    ``measured_ok``: the first run ids of points any of whose runs already ended ok (kept, whatever their rank)."""
    k = top_k(config)
    if k is None:
        return {run_id: Decision(run_id, None) for run_id in plans}
    values = sweep_values(config)
    machines = _Machines(config, next(iter(plans.values())).device, calibration)
    forecasts = {run_id: _forecast(config, plan, machines) for run_id, plan in plans.items() if plan.point.repeat == 1}
    groups: dict[tuple, list[str]] = {}
    for run_id, plan in plans.items():
        if plan.point.repeat == 1 and forecasts[run_id].why_not is None:
            groups.setdefault((plan.point.model, plan.point.world_size), []).append(run_id)
    rank_of: dict[str, tuple[int, int]] = {}
    for members in groups.values():
        speed = {run_id: forecasts[run_id].columns["forecast_tokens_per_s"] for run_id in members}
        for run_id in members:  # 1 + the points forecast faster by more than the forecast's own error (ties share a rank)
            rank_of[run_id] = (1 + sum(other > speed[run_id] * (1 + TIE) for other in speed.values()), len(members))
    decisions = {}
    for run_id, plan in plans.items():
        point = plan.point
        first = point.first_run_id  # a repeat follows its point
        columns, why_not = forecasts[first]
        columns = dict(columns or {})
        reason = None
        if first in rank_of:
            rank, of = rank_of[first]
            columns["forecast_rank"] = rank
            where = f"rank {rank} of {of} of model {point.model} at world size {point.world_size}"
            if rank <= k:
                columns["forecast_decision"] = f"run: {where} <= top_k {k}"
            elif is_baseline(point, values):
                columns["forecast_decision"] = f"run: a baseline ({where})"
            elif first in measured_ok:
                columns["forecast_decision"] = f"run: ended ok before ({where} > top_k {k})"
            else:
                columns["forecast_decision"] = f"pruned: {where} > top_k {k}"
                reason = (f"{PRUNED_REASON}, {where} by forecast tokens/s ({columns['forecast_tokens_per_s']:.4g}; "
                          f"ties within {TIE:.0%} share a rank; planning.top_k = {k}); raise planning.top_k to run it")
        else:
            columns["forecast_decision"] = f"run: not ranked: {why_not}"
        decisions[run_id] = Decision(run_id, columns, reason)
    return decisions



def summary_line(decisions: dict[str, Decision], k: int) -> str:
    """What the planning process prints: how many runs the forecast selected, which it pruned, and why any
    point was not ranked."""
    pruned = [d.run_id for d in decisions.values() if d.pruned]
    unranked = sorted({d.forecast["forecast_decision"].removeprefix("run: not ranked: ") for d in decisions.values()
                       if d.forecast and d.forecast["forecast_decision"].startswith("run: not ranked")})
    text = (f"scalelab: planning.top_k={k}: {len(decisions) - len(pruned)} of {len(decisions)} runs selected (the points "
            f"of each model and world size ranked 1..{k} by forecast tokens/s, ties within {TIE:.0%} sharing a rank, "
            "the baselines, and the points that ran ok before); "
            f"{len(pruned)} pruned, recorded skipped with their forecast"
            + (f" ({', '.join(pruned[:4])}{', ...' if len(pruned) > 4 else ''})" if pruned else ""))
    return text + "".join(f"\nscalelab: not ranked, so run: {note}" for note in unranked)
