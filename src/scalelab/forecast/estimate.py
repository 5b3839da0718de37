"""`scalelab estimate`'s computations: napkin math made exact, before spending GPU hours (the scaling table:
scalelab.forecast.scaling; the text: estimate_text; the options: estimate_command).

    scalelab estimate memory --params 7.5e9 --world-size 64
    scalelab estimate memory --layers 24 --d-model 1024 --vocab 50257 --seq 1024 --world-size 8 --micro-batch 8
    scalelab estimate memory --config config.yaml
    scalelab estimate memory --params 1.3B --world-size 8 --precision bf16 --zero-stage 2 3
    scalelab estimate time   --params 7B --tokens 1T --gpus 256 --gpu H100 --mfu 0.4
    scalelab estimate time   --params 7B --tokens 1T --gpus 256 --gpu H100 --precision fp32 --mfu-from results
    scalelab estimate fit    --gpu-memory 80 --unit GB --world-size 8
    scalelab estimate advise --layers 32 --d-model 4096 --vocab 32000 --seq 4096 --micro-batch 1 --gpu-memory 80 --gpus 8
    scalelab estimate claim  --params 70e9 --tokens-per-s 2e6 --gpus 64 --gpu H100
    scalelab estimate memory --model llama3-8b --world-size 8 --micro-batch 1
    scalelab estimate time   --model llama3-70b --tokens 15T --gpus 2048 --gpu H100
    scalelab estimate models                      (the presets --model takes, with their parameter counts)
    scalelab estimate scaling --layers 24 --d-model 2048 --heads 16 --vocab 50257 --seq 2048 --micro-batch 4 \
                              --zero-stage 3 --gpu H100 --inter-node ib-ndr --gpus 8,16,32,64,128,256,512
                                                  (predicted step time, tokens/s per GPU, MFU, exposed
                                                   communication and scaling efficiency per GPU count)
    scalelab estimate links                       (the link products --intra-node/--inter-node take, with sources)
"""
from __future__ import annotations

import math

from scalelab.config import ModelConfig
from scalelab.forecast.inputs import (
    UNITS,
    EstimateError,
    ModelChoice,
    memory_reserve_bytes,
)
from scalelab.forecast.inputs import positive as _positive
from scalelab.forecast.step import (  # the step-time model, shared by plan, pruning and the published validation
    check_tensor_parallel,
)
from scalelab.formulas import flops, lora_training, model_state, peak_memory, tensor_parallelism
from scalelab.formulas.rank_step import RankStep
from scalelab.registries import hardware
from scalelab.registries.families import family
from scalelab.registries.precisions import ESTIMATE_MEMORY, PEAK_KEYS, PRECISION_NAMES
from scalelab.registries.strategies import ZERO_STAGES, strategy

# The precisions whose records say they have a memory convention of their own (fp8 holds bf16's
# fp32 model state, and the ZeRO paper has no fp8 convention): fp32, fp16, bf16.
MEMORY_PRECISIONS = ESTIMATE_MEMORY
# `estimate time` and `claim` take a precision or a datasheet column (tf32).
PEAK_CHOICES = tuple(dict.fromkeys((*PRECISION_NAMES, *PEAK_KEYS)))



def _percent(fraction: float) -> str:
    """A fraction as a percentage that never rounds a nonzero value to 0.0%."""
    return f"{fraction:.1%}" if fraction == 0 or abs(fraction) >= 0.001 else f"{fraction * 100:.2g}%"


def _as_given(fraction: float) -> str:
    """A fraction the user wrote (--mfu 0.3975) as a percentage to the digit given: 39.75%, 40.0% for 0.4."""
    digits = f"{fraction * 100:.10g}"  # its own digits, past float noise
    decimals = min(max(len(digits.split(".")[1]) if "." in digits else 0, 1), 6)
    return f"{fraction * 100:.{decimals}f}%"


def _mfu_text(mfu: float, measured: bool, default: bool) -> str:
    """The MFU an estimate used: a measured or default one to one decimal, the user's --mfu to the digit given."""
    return _percent(mfu) if measured or default else _as_given(mfu)


def memory_table(model: ModelChoice, world_size: int, unit: str, points: list[tuple[str, int]],
                 tensor_parallel: int = 1, micro_batch: int | None = None) -> dict:
    """Model state per rank at each (precision, stage) of ``points``, and with a micro-batch the in-step peak."""
    n_params, cfg = model.n_params, model.cfg
    world_size = int(_positive("world-size", world_size))
    scale, u = UNITS[unit], unit.lower()  # JSON keys follow the unit: *_gib or *_gb
    t = int(_positive("tensor-parallel", tensor_parallel))
    local, data_ranks = n_params, world_size
    if t > 1:  # each rank's share of the split linears, the strategy over the data-parallel ranks
        check_tensor_parallel(cfg, t)
        if world_size % t:
            raise EstimateError(f"--tensor-parallel {t} does not divide --world-size {world_size}")
        local, data_ranks = tensor_parallelism.tensor_parallel_params(cfg, n_params, t), world_size // t
    rows = []
    for precision, stage in points:
        real = model_state.model_state_bytes(local, stage, data_ranks, precision, "pytorch")
        paper = model_state.model_state_bytes(local, stage, data_ranks, precision, "paper")
        row = {"precision": precision, "zero_stage": stage, "world_size": world_size, "tensor_parallel": t,
               f"pytorch_params_{u}": real.params / scale, f"pytorch_grads_{u}": real.grads / scale,
               f"pytorch_optimizer_{u}": real.optimizer / scale, f"pytorch_total_{u}": real.total / scale,
               f"paper_total_{u}": paper.total / scale}
        if cfg is not None and micro_batch:
            peak = peak_memory.peak_memory(cfg, local, RankStep(precision, stage, data_ranks, micro_batch,
                                                                             tensor_parallel=t))
            row[f"activations_{u}"] = peak.activations / scale
            row[f"peak_{u}"] = peak.total / scale
        rows.append(row)
    return {**model.named, "n_params": n_params, "world_size": world_size, "unit": unit, "rows": rows,
            **({"fp8": hardware.fp8_outlook(cfg.d_model)} if cfg is not None else {}),
            "note": "model state per rank at rest; 'pytorch' = fp32 master params + fp32 grads + AdamW (what scalelab's "
                    "strategies hold), 'paper' = ZeRO paper 2+2+12 (fp32: 4+4+8); peak: the start of backward (model state less "
                    "the gradients no bucket or earlier micro-batch holds, in-step parameters, activations) or the "
                    "optimizer step (model state at rest), whichever is larger"}


def table_points(precisions: list[str] | None, stages: list[int] | None) -> list[tuple[str, int]]:
    """The (precision, ZeRO stage) rows of a memory or fit table: every one, or those --precision
    and --zero-stage name (in the table's own order)."""
    return [(precision, stage) for precision in MEMORY_PRECISIONS if not precisions or precision in precisions
            for stage in ZERO_STAGES if stages is None or stage in stages]


def measured_mfu(results, precision: str, world_size: int | None = None) -> dict:
    """The MFU a sweep measured: the median ``mfu`` of RESULTS/metrics.parquet's ok runs of this
    precision (of ``world_size`` when given: 1 is compute without communication), with the runs it
    came from and, for CPU runs, that it says nothing about a GPU."""
    from pathlib import Path

    import pandas as pd

    table = Path(results) / "metrics.parquet"
    if not table.exists():
        raise EstimateError(f"--mfu-from {results}: no {table} (collect the runs first: scalelab collect {results})")
    runs = pd.read_parquet(table, columns=["run_id", "status", "precision", "mfu", "device_type", "device_name",
                                           *(["world_size"] if world_size is not None else [])])
    ok = runs[(runs["status"] == "ok") & runs["mfu"].notna()]
    if world_size is not None:
        ok = ok[ok["world_size"] == world_size]
    mine = ok[ok["precision"] == precision]
    if mine.empty:
        measured = ", ".join(sorted(ok["precision"].unique())) or "none"
        at = f" at world size {world_size}" if world_size is not None else ""
        raise EstimateError(f"--mfu-from {results}: no ok run of precision {precision}{at} with an MFU "
                            f"(precisions measured{at}: {measured}); pick one with --precision")
    mfu = float(mine["mfu"].median())
    if not 0 < mfu <= 1:
        raise EstimateError(f"--mfu-from {results}: the median MFU of its {precision} runs is {mfu:.3g}, not in (0, 1]")
    devices = sorted(set(mine["device_type"].dropna()))
    source = {"results": str(results), "precision": precision, "runs": sorted(mine["run_id"]), "median_mfu": mfu,
              "devices": sorted(set(mine["device_name"].dropna())), "device_types": devices}
    if "cpu" in devices:
        source["warning"] = ("measured on CPU: a CPU's MFU (against its own measured matmul peak) says nothing about "
                             "what a GPU reaches; give --mfu for a GPU estimate")
    return source


def time_estimate(model: ModelChoice, tokens: float, gpus: int, gpu: str, precision: str, mfu: float | None = None,
                  mfu_from: str | None = None) -> dict:
    """Days to train ``tokens`` on ``gpus`` GPUs at an MFU: given, measured (``mfu_from``) or the default."""
    tokens = _positive("tokens", tokens)
    if mfu is not None and mfu_from is not None:
        raise EstimateError("give --mfu or --mfu-from, not both")
    # the MFU scalelab plan and estimate scaling read too (world-size-1 runs: compute without communication), so
    # that one sweep gives them one figure; this estimate adds no communication, plan does
    source = measured_mfu(mfu_from, precision, world_size=1) if mfu_from is not None else None
    mfu = source["median_mfu"] if source else (DEFAULT_MFU if mfu is None else mfu)
    if not 0 < mfu <= 1:
        raise EstimateError(f"--mfu must be in (0, 1], got {mfu}")
    gpus = int(_positive("gpus", gpus))
    try:
        product = hardware.gpu_by_name(gpu)
        peak = flops.gpu_peak_flops(gpu, precision)
    except ValueError as err:
        raise EstimateError(f"--gpu {gpu}: {err}") from None
    n_params, cfg = model.n_params, model.cfg
    fpt = flops.flops_per_token(cfg) if cfg is not None else 6.0 * n_params
    total = fpt * tokens
    days = flops.training_days(total, gpus, gpu, precision, mfu)
    result = {**model.named, "n_params": n_params, "tokens": tokens, "flops_per_token": fpt,
              "flops_rule": "6N + attention term" if cfg is not None else "6N",
              "total_flops": total, "gpus": gpus, "gpu": product.name, "precision": precision,
              "peak_flops_per_gpu": peak, "mfu": mfu, "days": days, "gpu_hours": days * 24 * gpus}
    if source:
        result["mfu_source"] = source
        if "warning" in source:
            result["note"] = source["warning"]
    return result


def gpu_memory_bytes(gpu_memory: float | None, gpu_memory_gib: float | None, unit: str) -> float:
    """Bytes per GPU from --gpu-memory in --unit (or the older --gpu-memory-gib)."""
    if gpu_memory is not None and gpu_memory_gib is not None:
        raise EstimateError("give --gpu-memory (with --unit) or --gpu-memory-gib, not both")
    if gpu_memory_gib is not None:
        return _positive("gpu-memory-gib", gpu_memory_gib) * UNITS["GiB"]
    if gpu_memory is None:
        raise EstimateError("give the memory per GPU: --gpu-memory N (in --unit, default GiB)")
    return _positive("gpu-memory", gpu_memory) * UNITS[unit]


def fit_table(mem: float, world_size: int, unit: str, points: list[tuple[str, int]]) -> dict:
    """The largest model whose model state fits ``mem`` bytes per GPU, at each (precision, stage) of ``points``."""
    world_size = int(_positive("world-size", world_size))
    rows = []
    for precision, stage in points:
        rows.append({"precision": precision, "zero_stage": stage,
                     "pytorch_max_params": model_state.largest_model(mem, stage, world_size, precision, "pytorch"),
                     "paper_max_params": model_state.largest_model(mem, stage, world_size, precision, "paper")})
    return {f"gpu_memory_{unit.lower()}": mem / UNITS[unit], "unit": unit, "world_size": world_size,
            "rows": rows, "note": "model state only: leave room for activations, buffers and fragmentation"}


def _rung(name: str, state: model_state.ModelStateBytes, extra: float, mem: float, scale: float, u: str) -> dict:
    total = state.total + extra
    return {"rung": name, f"model_state_{u}": state.total / scale, f"in_step_{u}": extra / scale,
            f"total_{u}": total / scale, "fits": total <= mem}





def advise(model: ModelChoice, device: float, gpus: int, precision: str, unit: str, micro_batch: int | None = None,
           activation_checkpointing: bool = False, reserve_gib: float | None = None) -> dict:
    """The memory ladder made quantitative: DDP, then ZeRO stages 1, 2, 3, then LoRA, each against the
    GPU's memory (``device`` bytes) less the reserve plan keeps (what the formulas do not count)."""
    n_params, cfg = model.n_params, model.cfg
    gpus = int(_positive("gpus", gpus))
    reserve = memory_reserve_bytes(device, reserve_gib)
    mem = device - reserve
    scale, u = UNITS[unit], unit.lower()
    micro = int(_positive("micro-batch", micro_batch)) if micro_batch else None
    if micro and cfg is None:
        raise EstimateError("--micro-batch needs the model's shape (--model, or --layers/--d-model/--vocab/--seq)")

    peaks = {stage: peak_memory.peak_memory(cfg, n_params, RankStep(
        precision, stage, gpus, micro, activation_checkpointing=activation_checkpointing)) for stage in ZERO_STAGES} if micro else {}

    def in_step(stage: int) -> float:  # what the step's peak adds to the model state at rest (the freed gradients counted out)
        return peaks[stage].total - peaks[stage].at_rest if micro else 0.0

    def beside_frozen(stage: int) -> float:  # LoRA: frozen weights have no gradients; the step adds its gathers and activations
        return peaks[stage].transient_params + peaks[stage].activations if micro else 0.0

    rungs = [_rung(f"ZeRO stage {stage} ({strategy(stage).name})",
                   model_state.model_state_bytes(n_params, stage, gpus, precision, "pytorch"), in_step(stage), mem, scale, u)
             for stage in ZERO_STAGES]
    fitting = [r for r in rungs if r["fits"]]
    result = {"n_params": n_params, "gpus": gpus, f"gpu_memory_{u}": device / scale, f"reserve_{u}": reserve / scale,
              f"budget_{u}": mem / scale, "unit": unit,
              "precision": precision, "micro_batch": micro, "rungs": rungs,
              "advice": f"use {fitting[0]['rung']}: the first rung of the ladder that fits" if fitting else None}
    if not fitting:
        result["lora"] = _lora_budget(cfg, n_params, gpus, precision, mem, beside_frozen, scale, u)
        result["advice"] = result["lora"]["advice"]
    if not micro:
        result["note"] = "model state only (give the shape and --micro-batch to add activations and in-step parameters)"
    return result


def _lora_budget(cfg, n_params, gpus, precision, mem, in_step, scale, u) -> dict:
    """The largest LoRA rank that fits at the stage that leaves it most room."""
    if cfg is None:
        return {"advice": "even ZeRO stage 3 does not fit; LoRA's rank budget needs the model's shape "
                          "(--layers/--d-model/--vocab/--seq)"}
    best = None
    for stage in ZERO_STAGES:
        fixed = lora_training.lora_model_state_bytes(n_params, 0, stage, gpus, precision).total + in_step(stage)
        per_rank = (lora_training.lora_model_state_bytes(n_params, lora_training.lora_trainable_params(cfg, 1), stage, gpus,
                                                      precision).total + in_step(stage)) - fixed
        rank = int((mem - fixed) // per_rank) if mem > fixed else 0
        # the most rank, and where none fits, the least memory short
        if best is None or (rank, -fixed) > (best["max_rank"], -best[f"frozen_and_in_step_{u}"] * scale):
            best = {"zero_stage": stage, "max_rank": rank, f"frozen_and_in_step_{u}": fixed / scale,
                    f"per_rank_{u}": per_rank / scale}
    if best["max_rank"] < 1:
        best["advice"] = (f"does not fit even with LoRA: frozen weights and one step need "
                          f"{best[f'frozen_and_in_step_{u}']:.3g} {u.upper() if u == 'gb' else 'GiB'} per GPU at stage "
                          f"{best['zero_stage']}; add GPUs or shrink the micro-batch")
        return best
    power = 2 ** int(math.log2(best["max_rank"]))
    best["rank_power_of_two"] = power
    best["trainable_params"] = lora_training.lora_trainable_params(cfg, power)
    best["advice"] = (f"switch to LoRA: ZeRO stage {best['zero_stage']} with rank up to {best['max_rank']} "
                      f"(e.g. r={power}: {_human(best['trainable_params'])} trainable parameters) fits")
    return best


def claim_check(model: ModelChoice, gpus: int, gpu: str, precision: str, tokens_per_s: float | None = None,
                tokens: float | None = None, days: float | None = None) -> dict:
    """The MFU a published throughput implies, and whether any GPU of that kind could do it."""
    n_params, cfg = model.n_params, model.cfg
    gpus = int(_positive("gpus", gpus))
    if (tokens_per_s is None) == (tokens is None and days is None) or (tokens_per_s is None and None in (tokens, days)):
        raise EstimateError("give the claim as --tokens-per-s, or as --tokens and --days")
    tokens_per_s = (_positive("tokens-per-s", tokens_per_s) if tokens_per_s is not None
                    else _positive("tokens", tokens) / (_positive("days", days) * 86400))
    try:
        product = hardware.gpu_by_name(gpu)
        peak = flops.gpu_peak_flops(gpu, precision)
    except ValueError as err:
        raise EstimateError(f"--gpu {gpu}: {err}") from None
    fpt = flops.flops_per_token(cfg) if cfg is not None else 6.0 * n_params
    implied = flops.mfu(tokens_per_s, fpt, peak, gpus)
    if math.isnan(implied):
        verdict = f"unknown: no {precision} dense peak for {product.name}"
    elif implied > 1:
        verdict = (f"impossible as stated: it needs {implied:.0%} of the {precision} dense peak of {gpus} x "
                   f"{product.name}; no hardware runs above its peak")
    elif implied > 0.6:
        verdict = f"implausible: {implied:.0%} MFU is above the best published training runs (about 40-60%)"
    elif implied < 0.01:  # no lower bound printed "implied MFU 0.0%: plausible"
        verdict = (f"implausibly low: {_percent(implied)} MFU, under 1% of the dense peak; check the units (tokens per "
                   "second of all GPUs together, the parameter count as a count: 1.3B, not 1.3)")
    else:
        verdict = f"plausible: {_percent(implied)} MFU"
    return {"n_params": n_params, "tokens_per_s": tokens_per_s, "flops_per_token": fpt, "gpus": gpus,
            "gpu": product.name, "precision": precision, "peak_flops_per_gpu": peak, "implied_mfu": implied,
            "verdict": verdict}


def models_table() -> dict:
    """The presets --model takes: family, shape and parameter count (with the published figure)."""
    from scalelab.registries.presets import PRESETS

    rows = []
    for p in PRESETS.values():
        cfg = ModelConfig(**p.shape)
        rows.append({"model": p.name, "family": cfg.family, "n_params": flops.param_count(cfg),
                     "published_params": p.published_params, "n_layers": cfg.n_layers, "d_model": cfg.d_model,
                     "n_heads": cfg.n_heads, "n_kv_heads": family(cfg.family).own_columns(cfg).get("n_kv_heads"),
                     "ffn_dim": family(cfg.family).mlp_width(cfg),
                     "vocab_size": cfg.vocab_size, "seq_len": cfg.seq_len, "tied_head": cfg.tie_embeddings,
                     "flops_per_token": flops.flops_per_token(cfg), "source": p.source})
    return {"rows": rows, "note": "parameters counted as the published checkpoints (embedding, head, norms); "
                                  "flops_per_token at the preset's context, attention counted in full"}


DEFAULT_MFU = 0.4
"""The MFU assumed when none is given: ``estimate time``'s end-to-end figure, and ``estimate
scaling``'s compute efficiency without communication (the model adds the communication)."""


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"
