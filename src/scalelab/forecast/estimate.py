"""`scalelab estimate`: napkin math made exact, before spending GPU hours.

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

import argparse
import json
import math
import sys

from scalelab.config import ModelConfig
from scalelab.forecast.inputs import (
    UNITS,
    EstimateError,
    finite_number,
    non_negative,
    positive_count,
    positive_number,
    positive_whole,
    whole_count,
)
from scalelab.forecast.inputs import positive as _positive
from scalelab.forecast.model_input import described as _named
from scalelab.forecast.model_input import model_flags
from scalelab.forecast.model_input import model_from_args as _model
from scalelab.forecast.step import (  # the step-time model, shared by plan, pruning and the published validation
    Machine,
    Point,
    check_tensor_parallel,
    fp8_machine,
    pipeline_problem,
    predict_point,
)
from scalelab.formulas import communication, flops, links, lora_training, model_state, peak_memory, tensor_parallelism
from scalelab.formulas.pipeline import DEFAULT_SCHEDULE, SCHEDULES
from scalelab.spec import hardware
from scalelab.spec.families import family
from scalelab.spec.precisions import ESTIMATE_MEMORY, PEAK_KEYS, PRECISION_NAMES
from scalelab.spec.strategies import HYBRID_KEY, TRAINERS, ZERO_STAGES, strategy

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


def memory_table(args) -> dict:
    n_params, cfg = _model(args)
    world_size = int(_positive("world-size", args.world_size))
    scale, u = UNITS[args.unit], args.unit.lower()  # JSON keys follow the unit: *_gib or *_gb
    t = int(_positive("tensor-parallel", getattr(args, "tensor_parallel", 1)))
    local, data_ranks = n_params, world_size
    if t > 1:  # each rank's share of the split linears, the strategy over the data-parallel ranks
        check_tensor_parallel(cfg, t)
        if world_size % t:
            raise EstimateError(f"--tensor-parallel {t} does not divide --world-size {world_size}")
        local, data_ranks = tensor_parallelism.tensor_parallel_params(cfg, n_params, t), world_size // t
    rows = []
    for precision, stage in _table_points(args):
        real = model_state.model_state_bytes(local, stage, data_ranks, precision, "pytorch")
        paper = model_state.model_state_bytes(local, stage, data_ranks, precision, "paper")
        row = {"precision": precision, "zero_stage": stage, "world_size": world_size, "tensor_parallel": t,
               f"pytorch_params_{u}": real.params / scale, f"pytorch_grads_{u}": real.grads / scale,
               f"pytorch_optimizer_{u}": real.optimizer / scale, f"pytorch_total_{u}": real.total / scale,
               f"paper_total_{u}": paper.total / scale}
        if cfg is not None and args.micro_batch:
            peak = peak_memory.peak_memory(cfg, local, stage, data_ranks, precision, args.micro_batch, tensor_parallel=t)
            row[f"activations_{u}"] = peak.activations / scale
            row[f"peak_{u}"] = peak.total / scale
        rows.append(row)
    return {**_named(args), "n_params": n_params, "world_size": world_size, "unit": args.unit, "rows": rows,
            **({"fp8": hardware.fp8_outlook(cfg.d_model)} if cfg is not None else {}),
            "note": "model state per rank at rest; 'pytorch' = fp32 master params + fp32 grads + AdamW (what scalelab's "
                    "strategies hold), 'paper' = ZeRO paper 2+2+12 (fp32: 4+4+8); peak: the start of backward (model state less "
                    "the gradients no bucket or earlier micro-batch holds, in-step parameters, activations) or the "
                    "optimizer step (model state at rest), whichever is larger"}


def _table_points(args) -> list[tuple[str, int]]:
    """The (precision, ZeRO stage) rows of a memory or fit table: every one, or those --precision
    and --zero-stage name (in the table's own order)."""
    return [(precision, stage) for precision in MEMORY_PRECISIONS if not args.precision or precision in args.precision
            for stage in ZERO_STAGES if args.zero_stage is None or stage in args.zero_stage]


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


def time_estimate(args) -> dict:
    tokens = _positive("tokens", args.tokens)
    if args.mfu is not None and args.mfu_from is not None:
        raise EstimateError("give --mfu or --mfu-from, not both")
    # the MFU scalelab plan and estimate scaling read too (world-size-1 runs: compute without communication), so
    # that one sweep gives them one figure; this estimate adds no communication, plan does
    source = measured_mfu(args.mfu_from, args.precision, world_size=1) if args.mfu_from is not None else None
    mfu = source["median_mfu"] if source else (DEFAULT_MFU if args.mfu is None else args.mfu)
    if not 0 < mfu <= 1:
        raise EstimateError(f"--mfu must be in (0, 1], got {mfu}")
    gpus = int(_positive("gpus", args.gpus))
    try:
        product = hardware.gpu_by_name(args.gpu)
        peak = flops.gpu_peak_flops(args.gpu, args.precision)
    except ValueError as err:
        raise EstimateError(f"--gpu {args.gpu}: {err}") from None
    n_params, cfg = _model(args)
    fpt = flops.flops_per_token(cfg) if cfg is not None else 6.0 * n_params
    total = fpt * tokens
    days = flops.training_days(total, gpus, args.gpu, args.precision, mfu)
    result = {**_named(args), "n_params": n_params, "tokens": tokens, "flops_per_token": fpt,
              "flops_rule": "6N + attention term" if cfg is not None else "6N",
              "total_flops": total, "gpus": gpus, "gpu": product.name, "precision": args.precision,
              "peak_flops_per_gpu": peak, "mfu": mfu, "days": days, "gpu_hours": days * 24 * gpus}
    if source:
        result["mfu_source"] = source
        if "warning" in source:
            result["note"] = source["warning"]
    return result


def _gpu_memory(args) -> float:
    """Bytes per GPU from --gpu-memory in --unit (or the older --gpu-memory-gib)."""
    if args.gpu_memory is not None and args.gpu_memory_gib is not None:
        raise EstimateError("give --gpu-memory (with --unit) or --gpu-memory-gib, not both")
    if args.gpu_memory_gib is not None:
        return _positive("gpu-memory-gib", args.gpu_memory_gib) * UNITS["GiB"]
    if args.gpu_memory is None:
        raise EstimateError("give the memory per GPU: --gpu-memory N (in --unit, default GiB)")
    return _positive("gpu-memory", args.gpu_memory) * UNITS[args.unit]


def fit_table(args) -> dict:
    mem = _gpu_memory(args)
    world_size = int(_positive("world-size", args.world_size))
    rows = []
    for precision, stage in _table_points(args):
        rows.append({"precision": precision, "zero_stage": stage,
                     "pytorch_max_params": model_state.largest_model(mem, stage, world_size, precision, "pytorch"),
                     "paper_max_params": model_state.largest_model(mem, stage, world_size, precision, "paper")})
    return {f"gpu_memory_{args.unit.lower()}": mem / UNITS[args.unit], "unit": args.unit, "world_size": world_size,
            "rows": rows, "note": "model state only: leave room for activations, buffers and fragmentation"}


def _rung(name: str, state: model_state.ModelStateBytes, extra: float, mem: float, scale: float, u: str) -> dict:
    total = state.total + extra
    return {"rung": name, f"model_state_{u}": state.total / scale, f"in_step_{u}": extra / scale,
            f"total_{u}": total / scale, "fits": total <= mem}


RESERVE = {"fixed_gib": 2.0, "share": 0.05,
           "source": "scalelab's default, not yet measured on a GPU: the CUDA context and the libraries' workspaces "
                     "(about 1 GiB), NCCL's buffers (NCCL_BUFFSIZE 4 MiB per channel and peer: up to about 1 GiB at "
                     "scale), and 5% of the device for the caching allocator's fragmentation; --reserve-gib sets it"}
"""Device memory the predicted peak does not count: reserve = fixed_gib + share x the GPU's memory."""


def memory_reserve_bytes(memory_bytes: float, reserve_gib: float | None) -> float:
    """Device memory a prediction does not count (the CUDA context, NCCL's buffers, fragmentation):
    --reserve-gib, else RESERVE's default (the one advise and scalelab plan share)."""
    if reserve_gib is not None:
        if reserve_gib * UNITS["GiB"] >= memory_bytes:
            raise EstimateError(f"--reserve-gib {reserve_gib:g} leaves nothing of the GPU's {memory_bytes / UNITS['GiB']:g} GiB")
        return reserve_gib * UNITS["GiB"]
    return RESERVE["fixed_gib"] * UNITS["GiB"] + RESERVE["share"] * memory_bytes


def advise(args) -> dict:
    """The memory ladder made quantitative: DDP, then ZeRO stages 1, 2, 3, then LoRA, each against the
    GPU's memory less the reserve plan keeps (what the formulas do not count)."""
    n_params, cfg = _model(args)
    device, gpus, precision = _gpu_memory(args), int(_positive("gpus", args.gpus)), args.precision
    reserve = memory_reserve_bytes(device, getattr(args, "reserve_gib", None))
    mem = device - reserve
    scale, u = UNITS[args.unit], args.unit.lower()
    micro = int(_positive("micro-batch", args.micro_batch)) if args.micro_batch else None
    if micro and cfg is None:
        raise EstimateError("--micro-batch needs the model's shape (--model, or --layers/--d-model/--vocab/--seq)")

    peaks = {stage: peak_memory.peak_memory(cfg, n_params, stage, gpus, precision, micro, args.activation_checkpointing)
             for stage in ZERO_STAGES} if micro else {}

    def in_step(stage: int) -> float:  # what the step's peak adds to the model state at rest (the freed gradients counted out)
        return peaks[stage].total - peaks[stage].at_rest if micro else 0.0

    def beside_frozen(stage: int) -> float:  # LoRA: frozen weights have no gradients; the step adds its gathers and activations
        return peaks[stage].transient_params + peaks[stage].activations if micro else 0.0

    rungs = [_rung(f"ZeRO stage {stage} ({strategy(stage).name})",
                   model_state.model_state_bytes(n_params, stage, gpus, precision, "pytorch"), in_step(stage), mem, scale, u)
             for stage in ZERO_STAGES]
    fitting = [r for r in rungs if r["fits"]]
    result = {"n_params": n_params, "gpus": gpus, f"gpu_memory_{u}": device / scale, f"reserve_{u}": reserve / scale,
              f"budget_{u}": mem / scale, "unit": args.unit,
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


def claim_check(args) -> dict:
    """The MFU a published throughput implies, and whether any GPU of that kind could do it."""
    n_params, cfg = _model(args)
    gpus = int(_positive("gpus", args.gpus))
    total = (args.tokens, args.days)
    if (args.tokens_per_s is None) == all(v is None for v in total) or (args.tokens_per_s is None and None in total):
        raise EstimateError("give the claim as --tokens-per-s, or as --tokens and --days")
    tokens_per_s = (_positive("tokens-per-s", args.tokens_per_s) if args.tokens_per_s is not None
                    else _positive("tokens", args.tokens) / (_positive("days", args.days) * 86400))
    try:
        product = hardware.gpu_by_name(args.gpu)
        peak = flops.gpu_peak_flops(args.gpu, args.precision)
    except ValueError as err:
        raise EstimateError(f"--gpu {args.gpu}: {err}") from None
    fpt = flops.flops_per_token(cfg) if cfg is not None else 6.0 * n_params
    implied = flops.mfu(tokens_per_s, fpt, peak, gpus)
    if math.isnan(implied):
        verdict = f"unknown: no {args.precision} dense peak for {product.name}"
    elif implied > 1:
        verdict = (f"impossible as stated: it needs {implied:.0%} of the {args.precision} dense peak of {gpus} x "
                   f"{product.name}; no hardware runs above its peak")
    elif implied > 0.6:
        verdict = f"implausible: {implied:.0%} MFU is above the best published training runs (about 40-60%)"
    elif implied < 0.01:  # no lower bound printed "implied MFU 0.0%: plausible"
        verdict = (f"implausibly low: {_percent(implied)} MFU, under 1% of the dense peak; check the units (tokens per "
                   "second of all GPUs together, the parameter count as a count: 1.3B, not 1.3)")
    else:
        verdict = f"plausible: {_percent(implied)} MFU"
    return {"n_params": n_params, "tokens_per_s": tokens_per_s, "flops_per_token": fpt, "gpus": gpus,
            "gpu": product.name, "precision": args.precision, "peak_flops_per_gpu": peak, "implied_mfu": implied,
            "verdict": verdict}


def models_table(args) -> dict:
    """The presets --model takes: family, shape and parameter count (with the published figure)."""
    from scalelab.spec.presets import PRESETS

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


# ----------------------------------------------------------------------------- scaling
DEFAULT_MFU = 0.4
"""The MFU assumed when none is given: ``estimate time``'s end-to-end figure, and ``estimate
scaling``'s compute efficiency without communication (the model adds the communication)."""
SCALING_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)
SCALING_STAGES = (*(str(s) for s in ZERO_STAGES), HYBRID_KEY)
LINK_RULE = ("a collective within a node runs at the intra-node link; one whose group spans nodes at the "
             "inter-node link times the group's ranks per node, a NIC each (NCCL's ring channels, one per rail), "
             "up to the intra-node link")
OUT_OF_SCOPE = ("hierarchical and tree algorithms (NCCL's tree, NVLink SHARP, in-network reduction), the "
                "network's topology beyond one NIC per GPU (shared NICs, oversubscribed spines), algorithm "
                "switching by message size, power or clock limits")


PIPELINE_READING = ("the slowest stage's compute and tensor-parallel time over (1 - bubble), bubble = (P - 1) / "
                    "(V m + P - 1) (V chunks per rank, m micro-batches per step); the sends between consecutive stages "
                    "exposed, on their link; the strategy's collectives over each stage's data-parallel ranks on its "
                    "parameters; memory per stage with its in-flight micro-batches (scalelab.forecast.step)")


def gpu_counts(text: str) -> tuple[int, ...]:
    """--gpus: whole counts separated by commas (1K as count() reads), sorted. ``...`` continues the
    two counts before it up to the one after it: multiplying where the second is a multiple of the
    first (8,16,...,1024 doubles), else in equal steps (8,16,24,...,64)."""
    def bad(why: str) -> argparse.ArgumentTypeError:
        return argparse.ArgumentTypeError(f"{text!r}: {why}, e.g. 8,16,32 or 8,16,...,1024")

    parts = [p.strip() for p in text.split(",")]
    counts: list[int] = []
    for i, part in enumerate(parts):
        if part == "...":
            if len(counts) < 2 or i + 1 >= len(parts) or parts[i + 1] == "...":
                raise bad("'...' needs two counts before it and one after it")
            continue
        try:
            value = whole_count(part)
        except argparse.ArgumentTypeError:
            value = 0
        if value < 1:
            raise bad("every GPU count must be a whole number >= 1")
        if i and parts[i - 1] == "...":
            a, b = counts[-2], counts[-1]
            if b <= a:
                raise bad("the two counts before '...' must grow")
            ratio = b // a if b % a == 0 else None  # a multiple: keep multiplying; else equal steps
            while counts[-1] < value:
                counts.append(counts[-1] * ratio if ratio else counts[-1] + b - a)
            if counts[-1] != value:
                raise bad(f"'...' from {a},{b} does not reach {value}")
            continue
        counts.append(value)
    return tuple(sorted(set(counts)))


def _link(option: str, spec: str, efficiency: float | None, notes: list[str], per_node: int = 8) -> links.Link:
    """--intra-node / --inter-node: a product, a number in GB/s, or a `bench comm` Parquet table
    (fitted by scalelab.results.link_fit.fit_link: measured, so no efficiency applies). What a table
    cannot say about a GPU cluster (measured on CPU, or within one host for --inter-node) goes
    to ``notes``."""
    from pathlib import Path

    if spec.endswith(".parquet") or Path(spec).is_file():
        import pandas as pd

        from scalelab.results import link_fit

        path = Path(spec)
        if not path.is_file():
            raise EstimateError(f"{option} {spec}: no such file (a `scalelab bench comm` table, a link product "
                                f"or a bandwidth in GB/s)")
        try:
            table = pd.read_parquet(path)
            link = link_fit.fit_link(table)
        except (ValueError, KeyError, OSError) as err:
            raise EstimateError(f"{option} {spec}: {err}") from None
        if "device_type" in table and (table["device_type"] == "cpu").any():
            notes.append(f"{option} {path.name} was measured on CPU (gloo): a CPU's link, not a GPU cluster's")
        if option == "--inter-node" and "hostname" in table and table["hostname"].nunique() < 2:
            notes.append(f"{option} {path.name} was measured within one host: its ranks shared no inter-node link")
        return link
    try:
        if spec.strip().startswith("busbw:"):  # what nccl-tests printed, over its ranks
            return links.measured_busbw(spec, per_node, option == "--inter-node")
        return links.parse_link(spec, efficiency)
    except ValueError as err:
        raise EstimateError(f"{option}: {err}") from None


def links_table(args) -> dict:
    """The link products --intra-node and --inter-node take (scalelab.formulas.links), with their sources."""
    rows = [{"link": p.name, "bandwidth_gb_per_s": p.bandwidth_Bps / links.GB, "latency_us": p.latency_s * 1e6,
             "aliases": list(p.aliases), "source": p.source, "note": p.note} for p in links.PRODUCTS]
    return {"rows": rows, "default_efficiency": links.DEFAULT_EFFICIENCY,
            "note": "bus bandwidth per GPU, unidirectional, nominal (collectives run at it x the link efficiency, "
                    f"default {links.DEFAULT_EFFICIENCY}; a group spanning nodes at it x its ranks per node, one NIC "
                    "each, up to the intra-node link); latency per collective call, assumed; a number given "
                    "instead of a name is GB/s per GPU, unidirectional"}


def _overlap_text(stage) -> str:
    """The strategy's overlap facts (Strategy.overlap, scalelab.formulas.overlap's windows) in words."""
    from scalelab.formulas import overlap

    windows = {"backward": f"backward ({overlap.OVERLAP_WINDOWS['backward']:.0%} of compute)",
               "step": "forward and backward (all of compute)"}
    hidden = [f"{c} behind {windows.get(w, w)}" for c, w in strategy(stage).overlap]
    if not hidden:
        return "none stated in the strategy record (Strategy.overlap): every collective counted exposed"
    return "; ".join(hidden) + ", all calls but the last; the rest is exposed"


def machine_of(args, precision: str, gpus: list[int]) -> tuple[Machine, dict | None, list[str]]:
    """The GPUs, links and assumed efficiencies of the command line (estimate scaling's and plan's flags):
    (machine, the measured MFU's source or None, notes); ``gpus``, the counts asked about, need the
    inter-node link where they span nodes."""
    from scalelab.formulas import overlap

    if args.mfu is not None and args.mfu_from is not None:
        raise EstimateError("give --mfu or --mfu-from, not both")
    source = measured_mfu(args.mfu_from, precision, world_size=1) if args.mfu_from is not None else None
    mfu = source["median_mfu"] if source else (DEFAULT_MFU if args.mfu is None else args.mfu)
    if not (math.isfinite(mfu) and 0 < mfu <= 1):
        raise EstimateError(f"--mfu must be in (0, 1], got {mfu:g}")
    efficiency = args.link_efficiency
    if efficiency is not None and not (math.isfinite(efficiency) and 0 < efficiency <= 1):
        raise EstimateError(f"--link-efficiency must be in (0, 1], got {efficiency:g}")
    per_node = int(_positive("gpus-per-node", args.gpus_per_node))
    try:
        product = hardware.gpu_by_name(args.gpu)
        peak = flops.gpu_peak_flops(args.gpu, precision)
    except ValueError as err:
        raise EstimateError(f"--gpu {args.gpu}: {err}") from None
    intra_spec = args.intra_node or links.DEFAULT_INTRA_NODE.get(product.name)
    if intra_spec is None:
        raise EstimateError(f"--intra-node: no default link for {product.name}; give a product "
                            f"({', '.join(links.known_names())}) or a bandwidth in GB/s")
    notes: list[str] = [source["warning"]] if source and "warning" in source else []
    intra = _link("--intra-node", intra_spec, efficiency, notes, per_node)
    spanning = [n for n in gpus if n > per_node]
    if spanning and args.inter_node is None:
        raise EstimateError(f"--inter-node: {spanning[0]} GPUs span nodes of {per_node} (--gpus-per-node); give the "
                            f"link between nodes: a product ({', '.join(links.known_names())}), a bandwidth in GB/s "
                            "or a `scalelab bench comm` table")
    inter = _link("--inter-node", args.inter_node, efficiency, notes, per_node) if args.inter_node is not None else None
    eta = args.overlap_efficiency
    if eta is None:  # the trainer's, where fitted to its published runs; else the GPU's
        eta = TRAINERS[getattr(args, "trainer", "scalelab")].overlap_efficiency
        eta = overlap.DEFAULT_OVERLAP_EFFICIENCY["cuda"] if eta is None else eta
    if not (math.isfinite(eta) and 0 <= eta <= 1):
        raise EstimateError(f"--overlap-efficiency must be in [0, 1], got {eta:g}")
    return Machine(product=product, peak_flops=peak, mfu=mfu, per_node=per_node, intra=intra, inter=inter,
                   overlap_efficiency=eta), source, notes


def scaling_table(args) -> dict:
    """Predicted step time, tokens/s per GPU, MFU, exposed communication and scaling efficiency per
    GPU count: at a fixed micro-batch per GPU (weak scaling: the global batch grows with the GPUs), or
    with --global-batch at a fixed global batch (each GPU's share shrinks as GPUs grow, accumulated in
    micro-batches of at most --micro-batch); --activation-checkpointing adds the recompute to the time
    and takes the checkpointed activations in the memory."""
    n_params, cfg = _model(args)
    if cfg is None:
        raise EstimateError("estimate scaling needs the model's shape: --model NAME, or --layers/--d-model/--vocab/--seq "
                            "(FSDP's collectives per step follow its blocks)")
    machine, source, notes = machine_of(args, args.precision, args.gpus)
    if args.precision == "fp8" and machine.product.peak("bf16"):
        machine, fp8_note = fp8_machine(machine, cfg.d_model)  # its datasheet peak, the measured ratio apart
        notes.append(fp8_note)
    product, peak, mfu, per_node, gpus = machine.product, machine.peak_flops, machine.mfu, machine.per_node, args.gpus
    intra, inter, eta, efficiency = machine.intra, machine.inter, machine.overlap_efficiency, args.link_efficiency
    micro = int(_positive("micro-batch", args.micro_batch))
    key = HYBRID_KEY if args.zero_stage == HYBRID_KEY else int(args.zero_stage)  # the strategy record's key
    global_batch = getattr(args, "global_batch", None)
    checkpointing = bool(getattr(args, "activation_checkpointing", False))
    tensor_parallel = int(_positive("tensor-parallel", getattr(args, "tensor_parallel", 1)))
    check_tensor_parallel(cfg, tensor_parallel)
    pipeline_parallel = int(_positive("pipeline-parallel", getattr(args, "pipeline_parallel", 1)))
    schedule = getattr(args, "schedule", DEFAULT_SCHEDULE)
    why = pipeline_problem(cfg, pipeline_parallel, schedule)
    if why:
        raise EstimateError(why)
    grad_reduce = grad_reduce_of(args)
    point = Point(cfg=cfg, n_params=n_params, key=key, precision=args.precision, grad_reduce=grad_reduce, trainer=args.trainer,
                  micro_batch=micro, global_batch=global_batch, activation_checkpointing=checkpointing,
                  tensor_parallel=tensor_parallel, sequence_parallel=bool(getattr(args, "sequence_parallel", False)),
                  pipeline_parallel=pipeline_parallel, pipeline_schedule=schedule)
    machine = Machine(product=product, peak_flops=peak, mfu=mfu, per_node=per_node, intra=intra, inter=inter,
                      overlap_efficiency=eta)
    rows = [predict_point(point, machine, n) for n in gpus]
    for row in rows:
        row["scaling_efficiency"] = row["tokens_per_s_per_gpu"] / rows[0]["tokens_per_s_per_gpu"]

    def described(link: links.Link | None) -> dict | None:
        if link is None:
            return None
        return {"name": link.name, "bandwidth_gb_per_s": link.bandwidth_Bps / links.GB, "efficiency": link.efficiency,
                "achievable_gb_per_s": link.achievable_Bps / links.GB, "latency_us": link.latency_s * 1e6,
                "source": link.source}

    return {"prediction": True, **_named(args), "n_params": n_params, "zero_stage": key,
            "shape": {"family": cfg.family, "n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_heads": cfg.n_heads},
            "strategy": strategy(point.priced).name, "trainer": args.trainer, "trainer_priced": TRAINERS[args.trainer].description,
            "precision": args.precision, "grad_reduce": grad_reduce,
            "seq_len": cfg.seq_len, "micro_batch": micro, "global_batch": global_batch, "activation_checkpointing": checkpointing,
            "tensor_parallel": tensor_parallel, "pipeline_parallel": pipeline_parallel,
            **({"pipeline_schedule": schedule, "pipeline_reading": PIPELINE_READING} if pipeline_parallel > 1 else {}),
            "tokens_per_gpu_per_step": rows[0]["tokens_per_gpu_per_step"], "flops_per_token": rows[0]["flops_per_token"],
            "recompute_flops_per_token": rows[0]["recompute_flops_per_token"],
            "gpu": product.name, "peak_flops_per_gpu": peak, "gpus_per_node": per_node,
            "assumptions": {"mfu_without_communication": mfu, "mfu_default": args.mfu is None and source is None,
                            **({"mfu_source": source} if source else {}),
                            "link_efficiency": efficiency if efficiency is not None else links.DEFAULT_EFFICIENCY,
                            "link_efficiency_default": efficiency is None,
                            "intra_node": described(intra), "inter_node": described(inter),
                            "overlap_efficiency": eta, "overlap_efficiency_default": args.overlap_efficiency is None,
                            "overlap": _overlap_text(point.priced),
                            "link_rule": LINK_RULE, "out_of_scope": OUT_OF_SCOPE,
                            "collective_sizes": "nccl-tests' size: the whole buffer (an all-gather's output, a "
                                                "reduce-scatter's input); seconds = calls x latency + bus factor x "
                                                "bytes / achievable bus bandwidth"},
            "rows": rows, **({"fp8": hardware.fp8_outlook(cfg.d_model)} if args.precision == "fp8" else {}),
            **({"note": "; ".join(notes)} if notes else {})}


def _size(value: float) -> str:
    """A memory figure in a table's unit to three decimals, or to three significant digits where those would print a
    nonzero size as 0.000 (a tiny model's)."""
    return f"{value:>10.3f}" if value == 0 or value >= 0.0005 else f"{value:>10.3g}"


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


_COLLECTIVE_SHORT = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "broadcast": "BC"}


def _mfu_origin(a: dict) -> str:
    if "mfu_source" in a:
        source = a["mfu_source"]
        return (f"measured: the median of {len(source['runs'])} ok world-size-1 run(s) of {source['results']}, "
                f"{', '.join(source['devices']) or 'an unnamed device'}")
    return "default; --mfu" if a["mfu_default"] else "--mfu"


def _render_pipeline(r: dict, first: dict) -> list[str]:
    """estimate scaling's pipeline lines (none without pipelining): at the largest count, its bubble, sends and memory
    per stage, and how a pipelined step is read."""
    lines: list[str] = []
    if r.get("pipeline_parallel", 1) > 1:
        pl = first["pipeline"]
        memory = ", ".join(f"{s['peak_memory_bytes'] / UNITS['GiB']:.1f}" for s in pl["stages"])
        lines.append(f"pipeline parallelism: {r['pipeline_parallel']} stages, {r['pipeline_schedule']}, at {first['gpus']} "
                     f"GPUs {pl['microbatches']} micro-batches per step: bubble {_percent(pl['bubble_fraction'])} "
                     f"({pl['bubble_s'] * 1e3:.1f} ms); sends {pl['boundary_bytes'] / 1e6:.3g} MB per micro-batch and "
                     f"boundary, {pl['p2p_sent_bytes'] / 1e9:.3g} GB per step from the busiest rank over {pl['p2p_link']} "
                     f"({'across nodes' if pl['p2p_across_nodes'] else 'within a node'}), {pl['p2p_s'] * 1e3:.1f} ms"
                     + (f"; tied embedding sync {pl['tied_sync_s'] * 1e3:.1f} ms" if pl["tied_sync_bytes"] else "")
                     + f"; peak GiB per stage: {memory}")
        lines.append(f"pipeline step: {r['pipeline_reading']}")
    return lines


def _render_scaling(r: dict) -> list[str]:
    a = r["assumptions"]
    shape = r["shape"]
    model = (f"{r['model']} ({_human(r['n_params'])} parameters)" if "model" in r else
             f"a {shape['family']} of {_human(r['n_params'])} parameters ({shape['n_layers']} layers, d_model "
             f"{shape['d_model']}, {shape['n_heads']} heads)")
    how = "hybrid sharding" if r["zero_stage"] == HYBRID_KEY else f"ZeRO stage {r['zero_stage']}"
    t = r.get("tensor_parallel", 1)
    per = "GPU" if t == 1 else f"tensor-parallel group of {t} GPUs"
    batch = (f"global batch {r['global_batch']} sequences (each {per}'s share in micro-batches of at most "
             f"{r['micro_batch']}, accumulated)" if r.get("global_batch") else
             f"micro-batch {r['micro_batch']} per {per} ({r['tokens_per_gpu_per_step']:,.0f} tokens per GPU per step)")
    recompute = (f" + {r['recompute_flops_per_token']:.3g} recomputed (activation checkpointing; MFU counts model FLOPs only)"
                 if r.get("activation_checkpointing") else "")
    lines = [f"PREDICTION, not a measurement: {model}, {how} "
             f"({r['strategy']}), {r['precision']}, seq {r['seq_len']}, {batch}, {r['gpu']}, {r['gpus_per_node']} GPUs per node",
             f"compute: {r['flops_per_token']:.3g} FLOP/token{recompute} at MFU "
             f"{_mfu_text(a['mfu_without_communication'], 'mfu_source' in a, a['mfu_default'])} "
             f"without communication ({_mfu_origin(a)}) of the {r['precision']} dense peak "
             f"{r['peak_flops_per_gpu'] / 1e12:.1f} TFLOP/s = {r['rows'][0]['compute_s'] * 1e3:.1f} ms per step"
             + (f" at {r['rows'][0]['gpus']} GPUs (each GPU's share of the global batch shrinks as GPUs grow)"
                if r.get("global_batch") else "")]
    lines.append(f"trainer priced: {r['trainer']} ({r['trainer_priced']}); gradients reduced in "
                 f"{'fp32' if r['grad_reduce'] == 'fp32' else 'the compute dtype'}")
    for side in ("intra_node", "inter_node"):
        link = a[side]
        if link:
            eff = (f" x efficiency {link['efficiency']:.2f}" + (" (default; --link-efficiency)" if a["link_efficiency_default"]
                                                                 and link["efficiency"] != 1 else "")
                   if link["efficiency"] != 1 else " (measured)")
            lines.append(f"{side.replace('_', '-')} link: {link['name']}, {link['bandwidth_gb_per_s']:.4g} GB/s per GPU{eff} = "
                         f"{link['achievable_gb_per_s']:.4g} GB/s, latency {link['latency_us']:.3g} us per call "
                         f"({link['source']})")
    first = r["rows"][-1]
    lines.append("collectives per step (nccl-tests size, calls): " + ", ".join(
        f"{c} {first['collective_bytes'][c] / 1e9:.3g} GB in {first['collective_calls'][c]}" for c in first["collective_bytes"]))
    if r.get("tensor_parallel", 1) > 1:
        tp = first["tensor_parallel_comm"]
        kinds = ", ".join(f"{c} {v['size_bytes'] / 1e9:.3g} GB in {v['calls']}" for c, v in tp["collectives"].items())
        lines.append(f"tensor parallelism: {r['tensor_parallel']} GPUs split every block (the strategy runs over "
                     f"GPUs / {r['tensor_parallel']} data-parallel ranks, each GPU holds 1/{r['tensor_parallel']} of the "
                     f"blocks' linears): per step {kinds} (nccl-tests size: the buffers reduced or gathered); a ring moves "
                     f"{tp['ring_bytes_per_gpu'] / 1e9:.3g} GB per GPU of it (x the bus factor) over {tp['link']}, "
                     f"{tp['seconds'] * 1e3:.1f} ms on the critical path (exposed: no schedule here hides them)")
    lines += _render_pipeline(r, first)
    lines.append(f"overlap: {a['overlap']}; overlap efficiency {a['overlap_efficiency']:g}"
                 + (" (default; --overlap-efficiency)" if a["overlap_efficiency_default"] else ""))
    lines.append(f"rule: {a['link_rule']}; out of scope: {a['out_of_scope']}")
    piped = r.get("pipeline_parallel", 1) > 1
    lines.append(f"{'gpus':>5} {'nodes':>5} {'mb x acc':>8} {'step ms':>8} {'compute':>8} {'comm':>8} {'exposed':>8} "
                 + (f"{'bubble':>7} {'P2P ms':>7} " if piped else "")
                 + f"{'tok/s/GPU':>10} {'MFU':>6} {'scaling':>7} {'memory':>9}  links")
    for row in r["rows"]:
        comm = sum(row["comm_s"].values()) + row.get("tensor_parallel_comm", {}).get("seconds", 0.0)
        by_link: dict[str, list[str]] = {}
        for c, name in row["links"].items():
            by_link.setdefault(name, []).append(_COLLECTIVE_SHORT[c])
        link = next(iter(by_link)) if len(by_link) == 1 else " ".join(f"{'+'.join(cs)}:{name}" for name, cs in by_link.items())
        if row.get("tensor_parallel", 1) > 1:
            link = f"TP AR:{row['tensor_parallel_comm']['link']}" + (f", {link}" if by_link else "")
        memory = f"{row['peak_memory_gib']:.1f} GiB" + ("" if row["fits_memory"] else "!")
        batching = f"{row['micro_batch']} x {row['accumulation_steps']}"
        lines.append(f"{row['gpus']:>5} {row['nodes']:>5} {batching:>8} "
                     f"{row['step_time_s'] * 1e3:>8.1f} "
                     f"{row['compute_s'] * 1e3:>8.1f} {comm * 1e3:>8.1f} {row['exposed_comm_s'] * 1e3:>8.1f} "
                     + (f"{row['pipeline']['bubble_fraction']:>7.1%} {row['pipeline']['p2p_s'] * 1e3:>7.1f} " if piped else "")
                     + f"{row['tokens_per_s_per_gpu']:>10,.0f} {row['mfu']:>6.1%} {row['scaling_efficiency']:>7.1%} "
                     f"{memory:>9}  {link or '-'}")
    if not all(row["fits_memory"] for row in r["rows"]):
        lines.append(f"! the predicted peak per GPU exceeds the {r['gpu']}'s memory: the run would not fit")
    lines.append("every figure above is predicted; times in ms per optimizer step; comm = every collective's time, "
                 "exposed = what overlap leaves on the step; scaling = tokens/s per GPU against the smallest count"
                 + ("; AR all-reduce, RS reduce-scatter, AG all-gather, BC broadcast" if any(
                     len(set(row["links"].values())) > 1 for row in r["rows"]) else ""))
    return lines


def render(kind: str, result: dict) -> str:
    lines = []
    if kind == "memory":
        u = result["unit"].lower()
        named = f"{result['model']} ({result['family']}, {result['n_params']:,} parameters)" if "model" in result else \
            f"{_human(result['n_params'])} parameters"
        tp = result["rows"][0].get("tensor_parallel", 1) if result["rows"] else 1
        lines.append(f"model state per rank for {named} at world size {result['world_size']}"
                     + (f" = {result['world_size'] // tp} data-parallel x {tp} tensor-parallel ranks (each holds 1/{tp} of "
                        "the blocks' linears; the stage works over the data-parallel ranks)" if tp > 1 else "")
                     + f" ({result['unit']})")
        extra = f"activations_{u}" in result["rows"][0]
        head = f"{'precision':<9} {'stage':>5} {'params':>10} {'grads':>10} {'optimizer':>10} {'total':>10} {'paper':>10}"
        lines.append(head + (f" {'activ.':>10} {'peak':>10}" if extra else ""))
        keys = ["pytorch_params", "pytorch_grads", "pytorch_optimizer", "pytorch_total", "paper_total",
                *(["activations", "peak"] if extra else [])]
        for r in result["rows"]:
            lines.append(f"{r['precision']:<9} {r['zero_stage']:>5} " + " ".join(_size(r[f"{k}_{u}"]) for k in keys))
    elif kind == "time":
        r = result
        lines += [(f"{r['model']} ({r['family']}): " if "model" in r else "") +
                  f"{_human(r['n_params'])} parameters x {_human(r['tokens'])} tokens = {r['total_flops']:.3e} FLOPs ({r['flops_rule']})",
                  f"on {r['gpus']} x {r['gpu']} ({r['precision']} dense peak {r['peak_flops_per_gpu'] / 1e12:.1f} TFLOP/s) "
                  f"at MFU {_mfu_text(r['mfu'], 'mfu_source' in r, r.get('mfu_default', False))}:",
                  f"  {r['days']:.2f} days ({r['gpu_hours']:.4g} GPU-hours)"]
        if "mfu_source" in r:
            source = r["mfu_source"]
            lines.append(f"MFU {_percent(r['mfu'])} measured: the median of {len(source['runs'])} ok {source['precision']} "
                         f"run(s) of {source['results']} ({', '.join(source['runs'])}) on "
                         f"{', '.join(source['devices']) or 'an unnamed device'}")
    elif kind == "advise":
        u = result["unit"].lower()
        lines.append(f"{_human(result['n_params'])} parameters, {result['precision']}, {result['gpus']} GPUs of "
                     f"{result[f'gpu_memory_{u}']:g} {result['unit']}" + (f", micro-batch {result['micro_batch']}" if result["micro_batch"] else ""))
        lines.append(f"fits: within {result[f'budget_{u}']:.3g} {result['unit']} per GPU, the GPU's memory less a "
                     f"{result[f'reserve_{u}']:.3g} {result['unit']} reserve (CUDA context, NCCL buffers, fragmentation: "
                     "--reserve-gib; scalelab plan keeps the same and ranks what fits by time)")
        lines.append(f"{'rung':<52} {'state':>9} {'in-step':>9} {'total':>9}  fits")
        for r in result["rungs"]:
            lines.append(f"{r['rung']:<52} {r[f'model_state_{u}']:>9.2f} {r[f'in_step_{u}']:>9.2f} {r[f'total_{u}']:>9.2f}  "
                         + ("yes" if r["fits"] else "no"))
        if "lora" in result and "max_rank" in result["lora"]:
            lora = result["lora"]
            lines.append(f"{'LoRA at ZeRO stage ' + str(lora['zero_stage']):<52} {lora[f'frozen_and_in_step_{u}']:>9.2f} "
                         f"+ {lora[f'per_rank_{u}']:.4f} per rank: up to r={lora['max_rank']}")
        lines.append(f"advice: {result['advice']}")
    elif kind == "claim":
        r = result
        lines += [f"{_human(r['n_params'])} parameters at {_human(r['tokens_per_s'])} tokens/s on {r['gpus']} x {r['gpu']}: "
                  f"{r['tokens_per_s'] * r['flops_per_token']:.3e} FLOP/s against {r['gpus']} x "
                  f"{r['peak_flops_per_gpu'] / 1e12:.1f} TFLOP/s ({r['precision']} dense peak)",
                  f"implied MFU {_percent(r['implied_mfu'])}: {r['verdict']}"]
    elif kind == "models":
        lines.append(f"{'model':<12} {'family':<6} {'params':>15} {'layers':>6} {'d_model':>7} {'heads':>5} {'kv':>3} "
                     f"{'ffn':>6} {'vocab':>6} {'seq':>5}  source")
        for r in result["rows"]:
            lines.append(f"{r['model']:<12} {r['family']:<6} {r['n_params']:>15,} {r['n_layers']:>6} {r['d_model']:>7} "
                         f"{r['n_heads']:>5} {r['n_kv_heads'] or '-':>3} {r['ffn_dim']:>6} {r['vocab_size']:>6} "
                         f"{r['seq_len']:>5}  {r['source']}")
    elif kind == "links":
        lines.append(f"{'link':<16} {'GB/s':>7} {'lat us':>6}  source")
        for r in result["rows"]:
            lines.append(f"{r['link']:<16} {r['bandwidth_gb_per_s']:>7.4g} {r['latency_us']:>6g}  {r['source']}")
    elif kind == "scaling":
        lines += _render_scaling(result)
    else:
        u = result["unit"].lower()
        lines.append(f"largest model whose model state fits {result[f'gpu_memory_{u}']:g} {result['unit']} per GPU x {result['world_size']} GPUs")
        lines.append(f"{'precision':<9} {'stage':>5} {'pytorch':>10} {'paper':>10}")
        for r in result["rows"]:
            lines.append(f"{r['precision']:<9} {r['zero_stage']:>5} {_human(r['pytorch_max_params']):>10} {_human(r['paper_max_params']):>10}")
    if "fp8" in result:
        lines.append(f"fp8 against bf16: {result['fp8']['verdict']} (an estimate: {result['fp8']['basis']})")
    if "note" in result:
        lines.append(f"note: {result['note']}")
    return "\n".join(lines)


def cluster_flags(p) -> None:
    """The GPUs, links and assumed efficiencies (estimate scaling's and scalelab plan's; read by machine_of)."""
    p.add_argument("--gpu", required=True, help=f"GPU product (case-insensitive): {', '.join(hardware.known_names())}")
    p.add_argument("--gpus-per-node", type=positive_whole, default=8, help="GPUs per node (default 8)")
    p.add_argument("--intra-node", metavar="LINK",
                   help=f"link within a node: a product ({', '.join(links.known_names())}), a bandwidth in GB/s "
                        "per GPU, unidirectional, each with an optional @EFFICIENCY for this link alone (46@1: a measured "
                        "bus bandwidth), busbw:GBPS/RANKS (nccl-tests' all-reduce busbw within a node, e.g. busbw:436/8), "
                        "or a `scalelab bench comm` Parquet table (default: the GPU's NVLink or PCIe generation)")
    p.add_argument("--inter-node", metavar="LINK",
                   help="link between nodes, one GPU's NIC: as --intra-node, or what nccl-tests measured: busbw:GBPS/RANKS "
                        "(the all-reduce busbw over RANKS ranks, every GPU of their nodes, e.g. busbw:64.9/256; scalelab "
                        "divides by the NICs per node); a group spanning nodes runs on as many NICs as it has ranks on a "
                        "node, up to the intra-node link (a bench table: as measured); needed once GPUs span nodes"),
    p.add_argument("--link-efficiency", type=finite_number, default=None,
                   help=f"achievable over nominal bus bandwidth of products and numbers (default {links.DEFAULT_EFFICIENCY}; "
                        "a measured table is taken as measured)")
    p.add_argument("--overlap-efficiency", type=finite_number, default=None,
                   help="share of the overlappable communication that really hides behind compute, in [0, 1] "
                        "(default: fitted to published multi-node runs, docs/prediction.md; the output prints it)")
    p.add_argument("--mfu", type=finite_number, default=None,
                   help=f"compute efficiency without communication, MFU in (0, 1] (default {DEFAULT_MFU})")
    p.add_argument("--mfu-from", metavar="RESULTS", default=None,
                   help="use the MFU a sweep measured without communication: the median of RESULTS/metrics.parquet's "
                        "ok world-size-1 runs of --precision (run one node's sweep of your model on the GPU first)")


def trainer_flag(p) -> None:
    """--trainer: whose implementation of the strategies a forecast prices (estimate scaling's and plan's)."""
    p.add_argument("--trainer", default="scalelab", choices=list(TRAINERS),
                   help="; ".join(f"{k}: {v.description}" for k, v in TRAINERS.items()) + " (default scalelab)")


def grad_reduce_of(args) -> str:
    """--grad-reduce as given, else the trainer's default: the compute dtype for a distributed optimizer, fp32 for
    scalelab's own strategies."""
    given = getattr(args, "grad_reduce", None)
    return given or ("compute" if getattr(args, "trainer", "scalelab") == "megatron" else "fp32")


def _add_scaling_parser(kinds):
    """`scalelab estimate scaling`'s options."""
    sc = kinds.add_parser("scaling", help="predicted step time, tokens/s per GPU, MFU and scaling efficiency per GPU count",
                          description="Predict, per GPU count, a step's time from an assumed compute efficiency (--mfu) "
                                      "and each collective's time on the link its group uses (scalelab.formulas.links): "
                                      "docs/prediction.md has the method and where it fails.")
    model_flags(sc)
    sc.add_argument("--zero-stage", required=True, choices=list(SCALING_STAGES),
                    help="strategy: 0 (DDP), 1 (+ ZeroRedundancyOptimizer), 2, 3 (FSDP2), hybrid (HSDP)")
    sc.add_argument("--precision", default="bf16", choices=list(PRECISION_NAMES), help="training precision (default bf16)")
    sc.add_argument("--grad-reduce", default=None, choices=list(communication.GRAD_REDUCE),
                    help="dtype gradients are reduced in: fp32 or the compute dtype (fp16, bf16); default fp32, the "
                         "compute dtype with --trainer megatron")
    trainer_flag(sc)
    sc.add_argument("--micro-batch", type=int, default=1, help="sequences per GPU per forward (default 1): fixed as GPUs "
                    "grow, or with --global-batch the largest micro-batch each GPU's share is accumulated in")
    sc.add_argument("--global-batch", type=positive_whole, default=None, metavar="SEQUENCES",
                    help="a fixed global batch in sequences (as studies that scale out keep it): each GPU's share is "
                         "global / GPUs, accumulated; time and memory follow (default: a fixed per-GPU batch)")
    sc.add_argument("--activation-checkpointing", action="store_true",
                    help="recompute every block's forward in backward: its FLOPs in the time, checkpointed activations "
                         "in the memory")
    sc.add_argument("--tensor-parallel", type=positive_whole, default=1, metavar="T",
                    help="GPUs that split every block (Megatron's tensor parallelism, within a node where T fits one); "
                         "the strategy runs over GPUs / T data-parallel ranks (default 1: none)")
    sc.add_argument("--sequence-parallel", action="store_true",
                    help="with --tensor-parallel: the norms and the residual stream split over the tokens (each all-reduce "
                         "a reduce-scatter and an all-gather)")
    sc.add_argument("--pipeline-parallel", type=positive_whole, default=1, metavar="P",
                    help="pipeline stages of consecutive blocks (the outermost mesh axis: world = DP x TP x P; "
                         "consecutive stages on different nodes once DP x TP fills one); the step gains the schedule's "
                         "bubble and the sends between stages, memory is per stage (default 1: none)")
    sc.add_argument("--schedule", default=DEFAULT_SCHEDULE, choices=list(SCHEDULES),
                    help="with --pipeline-parallel: the pipeline schedule (" + "; ".join(
                        f"{k}: {v.doc}" for k, v in SCHEDULES.items()) + f"; default {DEFAULT_SCHEDULE})")
    sc.add_argument("--gpus", type=gpu_counts, default=SCALING_GPUS, metavar="N,N,...",
                    help=f"GPU counts (default {','.join(map(str, SCALING_GPUS))}; 8,16,...,1024 doubles up to 1024); "
                         "efficiency is against the smallest")
    cluster_flags(sc)
    return sc


def add_parser(sub) -> None:
    est = sub.add_parser("estimate", help="memory per rank, days to train, largest model that fits",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = est.add_subparsers(dest="kind", required=True)

    def gpu_memory_flags(p):
        p.add_argument("--gpu-memory", type=finite_number, help="memory per GPU in --unit (e.g. 80)")
        p.add_argument("--gpu-memory-gib", type=finite_number, help="memory per GPU in GiB (same as --gpu-memory N --unit GiB)")
        p.add_argument("--unit", choices=list(UNITS), default="GiB", help="GiB (2^30 bytes, default) or GB (10^9)")

    def table_filters(p):
        p.add_argument("--precision", nargs="+", choices=list(MEMORY_PRECISIONS), metavar="PRECISION",
                       help=f"only these precisions' rows ({', '.join(MEMORY_PRECISIONS)}; default all)")
        p.add_argument("--zero-stage", nargs="+", type=int, choices=list(ZERO_STAGES), metavar="STAGE",
                       help=f"only these ZeRO stages' rows ({', '.join(map(str, ZERO_STAGES))}; default all)")

    def gpu_flags(p):
        p.add_argument("--gpu", required=True,
                       help=f"GPU product (case-insensitive): {', '.join(hardware.known_names())}; "
                            "bare A100, H100 and H200 mean the SXM parts")
        p.add_argument("--precision", default="bf16", choices=list(PEAK_CHOICES),
                       help="compute precision (default bf16; fp8 only on GPUs with fp8 tensor cores)")

    m = kinds.add_parser("memory", help="model-state memory per rank, every stage x precision")
    model_flags(m)
    m.add_argument("--world-size", type=positive_whole, default=1, help="ranks (GPUs) sharing the model (default 1)")
    table_filters(m)
    m.add_argument("--unit", choices=list(UNITS), default="GiB", help="GiB (2^30 bytes, default) or GB (10^9, the ZeRO paper's)")
    m.add_argument("--micro-batch", type=positive_whole, help="sequences per rank per step: adds activations and the in-step peak (needs the shape)")
    m.add_argument("--tensor-parallel", type=positive_whole, default=1, metavar="T",
                   help="ranks that split every block's linears (needs the shape; default 1: none)")
    t = kinds.add_parser("time", help="days to train")
    model_flags(t)
    t.add_argument("--tokens", type=positive_count, required=True, help="training tokens, e.g. 1T or 1e12")
    t.add_argument("--gpus", type=positive_whole, required=True, help="number of GPUs")
    gpu_flags(t)
    t.add_argument("--mfu", type=finite_number, default=None, help="model FLOPs utilisation in (0, 1] (default 0.4)")
    t.add_argument("--mfu-from", metavar="RESULTS", default=None,
                   help="use the MFU a sweep measured: the median of RESULTS/metrics.parquet's ok runs of --precision "
                        "(names the runs; CPU runs' MFU says nothing about a GPU)")
    f = kinds.add_parser("fit", help="largest model whose model state fits the GPUs")
    gpu_memory_flags(f)
    f.add_argument("--world-size", type=positive_whole, default=1, help="number of GPUs sharing the model (default 1)")
    table_filters(f)
    a = kinds.add_parser("advise", help="the memory ladder: the first of DDP, ZeRO 1, 2, 3 that fits, else LoRA's rank budget")
    model_flags(a)
    gpu_memory_flags(a)
    a.add_argument("--gpus", type=positive_whole, required=True, help="GPUs the model is trained on")
    a.add_argument("--micro-batch", type=positive_whole, help="sequences per GPU per step: adds activations (needs the shape)")
    a.add_argument("--activation-checkpointing", action="store_true", help="activations with every block recomputed in backward")
    a.add_argument("--precision", default="bf16", choices=list(MEMORY_PRECISIONS), help="training precision (default bf16)")
    a.add_argument("--reserve-gib", type=non_negative, default=None, help="device memory the formulas do not count (CUDA context, "
                   "NCCL buffers, fragmentation; default 2 GiB + 5%% of the GPU's memory, as scalelab plan keeps)")
    c = kinds.add_parser("claim", help="the MFU a stated throughput implies, and whether the hardware can reach it")
    model_flags(c)
    c.add_argument("--tokens-per-s", type=positive_count, help="the claimed training throughput, tokens per second (all GPUs), e.g. 2M")
    c.add_argument("--tokens", type=positive_count, help="or: the claimed training tokens (e.g. 1T) ...")
    c.add_argument("--days", type=positive_number, help="... in this many days")
    c.add_argument("--gpus", type=positive_whole, required=True, help="number of GPUs")
    gpu_flags(c)
    ms = kinds.add_parser("models", help="the preset shapes --model takes, with their parameter counts and sources")
    sc = _add_scaling_parser(kinds)
    lk = kinds.add_parser("links", help="the link products estimate scaling takes, per GPU, with their sources")
    for p in (m, t, f, a, c, ms, sc, lk):
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.set_defaults(usage_parser=p)  # an unknown option is this subcommand's error, with its usage (scalelab.cli.main)
    est.set_defaults(func=run)


def run(args) -> int:
    compute = {"memory": memory_table, "time": time_estimate, "fit": fit_table, "advise": advise, "claim": claim_check,
               "models": models_table, "scaling": scaling_table, "links": links_table}[args.kind]
    try:
        result = compute(args)
    except EstimateError as err:
        print(f"scalelab estimate {args.kind}: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else render(args.kind, result))
    return 0
