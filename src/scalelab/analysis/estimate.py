"""`scalelab estimate`: napkin math made exact, before spending GPU hours.

    scalelab estimate memory --params 7.5e9 --world-size 64
    scalelab estimate memory --layers 24 --d-model 1024 --vocab 50257 --seq 1024 --world-size 8 --micro-batch 8
    scalelab estimate memory --config config.yaml
    scalelab estimate time   --params 7e9 --tokens 1e12 --gpus 256 --gpu H100 --mfu 0.4
    scalelab estimate fit    --gpu-memory 80 --unit GB --world-size 8
    scalelab estimate advise --layers 32 --d-model 4096 --vocab 32000 --seq 4096 --micro-batch 1 --gpu-memory 80 --gpus 8
    scalelab estimate claim  --params 70e9 --tokens-per-s 2e6 --gpus 64 --gpu H100
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from scalelab import accounting, hardware
from scalelab.config import ModelConfig
from scalelab.precisions import ESTIMATE_MEMORY, PEAK_KEYS, PRECISION_NAMES
from scalelab.strategies import ZERO_STAGES, strategy

# The precisions whose records say they have a memory convention of their own (fp8 holds bf16's
# fp32 model state, and the ZeRO paper has no fp8 convention): fp32, fp16, bf16.
MEMORY_PRECISIONS = ESTIMATE_MEMORY
# `estimate time` and `claim` take a precision or a datasheet column (tf32).
PEAK_CHOICES = tuple(dict.fromkeys((*PRECISION_NAMES, *PEAK_KEYS)))

UNITS = {"GiB": 2 ** 30, "GB": 1e9}


class EstimateError(ValueError):
    pass


def _positive(name: str, value, allow_zero: bool = False):
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise EstimateError(f"--{name} must be a positive number, got {value:g}")
    return value


def _model(args) -> tuple[int, ModelConfig | None]:
    """(parameter count, model config if given by shape)."""
    if args.config:
        from scalelab.config import model_config
        from scalelab.config.validation import load_config

        config = load_config(args.config)
        cfg = model_config(config, vocab_size=args.vocab or 256)
        return accounting.param_count(cfg), cfg
    shape = [args.layers, args.d_model, args.vocab, args.seq]
    if args.params is not None:
        if any(v is not None for v in shape):
            raise EstimateError("give the model either as --params or as --layers/--d-model/--vocab/--seq, not both")
        return int(_positive("params", args.params)), None
    if any(v is None for v in shape):
        raise EstimateError("give the model as --params N, or all of --layers, --d-model, --vocab and --seq")
    for name, v in zip(("layers", "d-model", "vocab", "seq"), shape):
        _positive(name, v)
    heads = args.heads or max(1, args.d_model // 64)
    if args.d_model % heads:
        raise EstimateError(f"--heads {heads} does not divide --d-model {args.d_model}")
    cfg = ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=heads, seq_len=args.seq,
                      tie_embeddings=not args.untied, vocab_size=args.vocab)
    return accounting.param_count(cfg), cfg


def memory_table(args) -> dict:
    n_params, cfg = _model(args)
    world_size = int(_positive("world-size", args.world_size))
    scale, u = UNITS[args.unit], args.unit.lower()  # JSON keys follow the unit: *_gib or *_gb
    rows = []
    for precision in MEMORY_PRECISIONS:
        for stage in ZERO_STAGES:
            real = accounting.model_state_bytes(n_params, stage, world_size, precision, "pytorch")
            paper = accounting.model_state_bytes(n_params, stage, world_size, precision, "paper")
            row = {"precision": precision, "zero_stage": stage, "world_size": world_size,
                   f"pytorch_params_{u}": real.params / scale, f"pytorch_grads_{u}": real.grads / scale,
                   f"pytorch_optimizer_{u}": real.optimizer / scale, f"pytorch_total_{u}": real.total / scale,
                   f"paper_total_{u}": paper.total / scale}
            if cfg is not None and args.micro_batch:
                peak = accounting.peak_memory(cfg, n_params, stage, world_size, precision, args.micro_batch)
                row[f"activations_{u}"] = peak.activations / scale
                row[f"peak_{u}"] = peak.total / scale
            rows.append(row)
    return {"n_params": n_params, "world_size": world_size, "unit": args.unit, "rows": rows,
            "note": "model state per rank at rest; 'pytorch' = fp32 master params + fp32 grads + AdamW (what scalelab's "
                    "strategies hold), 'paper' = ZeRO paper 2+2+12 (fp32: 4+4+8); peak adds in-step parameters and activations"}


def time_estimate(args) -> dict:
    tokens = _positive("tokens", args.tokens)
    mfu = args.mfu
    if not (mfu is not None and 0 < mfu <= 1):
        raise EstimateError(f"--mfu must be in (0, 1], got {mfu}")
    gpus = int(_positive("gpus", args.gpus))
    try:
        product = hardware.gpu_by_name(args.gpu)
        peak = accounting.gpu_peak_flops(args.gpu, args.precision)
    except ValueError as err:
        raise EstimateError(str(err)) from None
    n_params, cfg = _model(args)
    fpt = accounting.flops_per_token(cfg) if cfg is not None else 6.0 * n_params
    total = fpt * tokens
    days = accounting.training_days(total, gpus, args.gpu, args.precision, mfu)
    return {"n_params": n_params, "tokens": tokens, "flops_per_token": fpt,
            "flops_rule": "6N + attention term" if cfg is not None else "6N",
            "total_flops": total, "gpus": gpus, "gpu": product.name, "precision": args.precision,
            "peak_flops_per_gpu": peak, "mfu": mfu, "days": days, "gpu_hours": days * 24 * gpus}


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
    for precision in MEMORY_PRECISIONS:
        for stage in ZERO_STAGES:
            rows.append({"precision": precision, "zero_stage": stage,
                         "pytorch_max_params": accounting.largest_model(mem, stage, world_size, precision, "pytorch"),
                         "paper_max_params": accounting.largest_model(mem, stage, world_size, precision, "paper")})
    return {f"gpu_memory_{args.unit.lower()}": mem / UNITS[args.unit], "unit": args.unit, "world_size": world_size,
            "rows": rows, "note": "model state only: leave room for activations, buffers and fragmentation"}


def _rung(name: str, state: accounting.ModelStateBytes, extra: float, mem: float, scale: float, u: str) -> dict:
    total = state.total + extra
    return {"rung": name, f"model_state_{u}": state.total / scale, f"in_step_{u}": extra / scale,
            f"total_{u}": total / scale, "fits": total <= mem}


def advise(args) -> dict:
    """The memory ladder made quantitative: DDP, then ZeRO stages 1, 2, 3, then LoRA."""
    n_params, cfg = _model(args)
    mem, gpus, precision = _gpu_memory(args), int(_positive("gpus", args.gpus)), args.precision
    scale, u = UNITS[args.unit], args.unit.lower()
    micro = int(_positive("micro-batch", args.micro_batch)) if args.micro_batch else None
    if micro and cfg is None:
        raise EstimateError("--micro-batch needs the model's shape (--layers/--d-model/--vocab/--seq)")

    def in_step(stage: int) -> float:  # what a step adds to the model state: in-step parameters, activations
        if not micro:
            return 0.0
        peak = accounting.peak_memory(cfg, n_params, stage, gpus, precision, micro, args.activation_checkpointing)
        return peak.transient_params + peak.activations

    rungs = [_rung(f"ZeRO stage {stage} ({strategy(stage).name})",
                   accounting.model_state_bytes(n_params, stage, gpus, precision, "pytorch"), in_step(stage), mem, scale, u)
             for stage in ZERO_STAGES]
    fitting = [r for r in rungs if r["fits"]]
    result = {"n_params": n_params, "gpus": gpus, f"gpu_memory_{u}": mem / scale, "unit": args.unit,
              "precision": precision, "micro_batch": micro, "rungs": rungs,
              "advice": f"use {fitting[0]['rung']}: the first rung of the ladder that fits" if fitting else None}
    if not fitting:
        result["lora"] = _lora_budget(cfg, n_params, gpus, precision, mem, in_step, scale, u)
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
        fixed = accounting.lora_model_state_bytes(n_params, 0, stage, gpus, precision).total + in_step(stage)
        per_rank = (accounting.lora_model_state_bytes(n_params, accounting.lora_trainable_params(cfg, 1), stage, gpus,
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
    best["trainable_params"] = accounting.lora_trainable_params(cfg, power)
    best["advice"] = (f"switch to LoRA: ZeRO stage {best['zero_stage']} with rank up to {best['max_rank']} "
                      f"(e.g. r={power}: {_human(best['trainable_params'])} trainable parameters) fits")
    return best


def claim_check(args) -> dict:
    """The MFU a published throughput implies, and whether any GPU of that kind could do it."""
    n_params, cfg = _model(args)
    gpus = int(_positive("gpus", args.gpus))
    if (args.tokens_per_s is None) == (args.tokens is None or args.days is None):
        raise EstimateError("give the claim as --tokens-per-s, or as --tokens and --days")
    tokens_per_s = (_positive("tokens-per-s", args.tokens_per_s) if args.tokens_per_s is not None
                    else _positive("tokens", args.tokens) / (_positive("days", args.days) * 86400))
    try:
        product = hardware.gpu_by_name(args.gpu)
        peak = accounting.gpu_peak_flops(args.gpu, args.precision)
    except ValueError as err:
        raise EstimateError(str(err)) from None
    fpt = accounting.flops_per_token(cfg) if cfg is not None else 6.0 * n_params
    implied = accounting.mfu(tokens_per_s, fpt, peak, gpus)
    if implied > 1:
        verdict = (f"impossible as stated: it needs {implied:.0%} of the {args.precision} dense peak of {gpus} x "
                   f"{product.name}; no hardware runs above its peak")
    elif implied > 0.6:
        verdict = f"implausible: {implied:.0%} MFU is above the best published training runs (about 40-60%)"
    else:
        verdict = f"plausible: {implied:.0%} MFU"
    return {"n_params": n_params, "tokens_per_s": tokens_per_s, "flops_per_token": fpt, "gpus": gpus,
            "gpu": product.name, "precision": args.precision, "peak_flops_per_gpu": peak, "implied_mfu": implied,
            "verdict": verdict}


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def render(kind: str, result: dict) -> str:
    lines = []
    if kind == "memory":
        u = result["unit"].lower()
        lines.append(f"model state per rank for {_human(result['n_params'])} parameters at world size {result['world_size']} ({result['unit']})")
        extra = f"activations_{u}" in result["rows"][0]
        head = f"{'precision':<9} {'stage':>5} {'params':>10} {'grads':>10} {'optimizer':>10} {'total':>10} {'paper':>10}"
        lines.append(head + (f" {'activ.':>10} {'peak':>10}" if extra else ""))
        for r in result["rows"]:
            line = (f"{r['precision']:<9} {r['zero_stage']:>5} {r[f'pytorch_params_{u}']:>10.3f} {r[f'pytorch_grads_{u}']:>10.3f} "
                    f"{r[f'pytorch_optimizer_{u}']:>10.3f} {r[f'pytorch_total_{u}']:>10.3f} {r[f'paper_total_{u}']:>10.3f}")
            lines.append(line + (f" {r[f'activations_{u}']:>10.3f} {r[f'peak_{u}']:>10.3f}" if extra else ""))
    elif kind == "time":
        r = result
        lines += [f"{_human(r['n_params'])} parameters x {_human(r['tokens'])} tokens = {r['total_flops']:.3e} FLOPs ({r['flops_rule']})",
                  f"on {r['gpus']} x {r['gpu']} ({r['precision']} dense peak {r['peak_flops_per_gpu'] / 1e12:.1f} TFLOP/s) at MFU {r['mfu']:.0%}:",
                  f"  {r['days']:.2f} days ({r['gpu_hours']:.4g} GPU-hours)"]
    elif kind == "advise":
        u = result["unit"].lower()
        lines.append(f"{_human(result['n_params'])} parameters, {result['precision']}, {result['gpus']} GPUs of "
                     f"{result[f'gpu_memory_{u}']:g} {result['unit']}" + (f", micro-batch {result['micro_batch']}" if result["micro_batch"] else ""))
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
                  f"implied MFU {r['implied_mfu']:.1%}: {r['verdict']}"]
    else:
        u = result["unit"].lower()
        lines.append(f"largest model whose model state fits {result[f'gpu_memory_{u}']:g} {result['unit']} per GPU x {result['world_size']} GPUs")
        lines.append(f"{'precision':<9} {'stage':>5} {'pytorch':>10} {'paper':>10}")
        for r in result["rows"]:
            lines.append(f"{r['precision']:<9} {r['zero_stage']:>5} {_human(r['pytorch_max_params']):>10} {_human(r['paper_max_params']):>10}")
    if "note" in result:
        lines.append(f"note: {result['note']}")
    return "\n".join(lines)


def add_parser(sub) -> None:
    est = sub.add_parser("estimate", help="memory per rank, days to train, largest model that fits",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = est.add_subparsers(dest="kind", required=True)

    def model_flags(p):
        g = p.add_argument_group("model (either --params, or the shape, or --config)")
        g.add_argument("--params", type=float, help="parameter count, e.g. 7.5e9")
        g.add_argument("--layers", type=int, help="transformer blocks")
        g.add_argument("--d-model", type=int, help="residual width")
        g.add_argument("--heads", type=int, help="attention heads (default d_model / 64)")
        g.add_argument("--vocab", type=int, help="vocabulary size")
        g.add_argument("--seq", type=int, help="sequence length")
        g.add_argument("--untied", action="store_true", help="output head not tied to the embedding")
        g.add_argument("--config", help="read the model from a scalelab config.yaml (vocab from --vocab, default 256)")

    def gpu_memory_flags(p):
        p.add_argument("--gpu-memory", type=float, help="memory per GPU in --unit (e.g. 80)")
        p.add_argument("--gpu-memory-gib", type=float, help="memory per GPU in GiB (same as --gpu-memory N --unit GiB)")
        p.add_argument("--unit", choices=list(UNITS), default="GiB", help="GiB (2^30 bytes, default) or GB (10^9)")

    def gpu_flags(p):
        p.add_argument("--gpu", required=True,
                       help=f"GPU product (case-insensitive): {', '.join(hardware.known_names())}; "
                            "bare A100, H100 and H200 mean the SXM parts")
        p.add_argument("--precision", default="bf16", choices=list(PEAK_CHOICES),
                       help="compute precision (default bf16; fp8 only on GPUs with fp8 tensor cores)")

    m = kinds.add_parser("memory", help="model-state memory per rank, every stage x precision")
    model_flags(m)
    m.add_argument("--world-size", type=int, default=1, help="ranks (GPUs) sharing the model (default 1)")
    m.add_argument("--unit", choices=list(UNITS), default="GiB", help="GiB (2^30 bytes, default) or GB (10^9, the ZeRO paper's)")
    m.add_argument("--micro-batch", type=int, help="sequences per rank per step: adds activations and the in-step peak (needs the shape)")
    t = kinds.add_parser("time", help="days to train")
    model_flags(t)
    t.add_argument("--tokens", type=float, required=True, help="training tokens, e.g. 1e12")
    t.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    gpu_flags(t)
    t.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation in (0, 1] (default 0.4)")
    f = kinds.add_parser("fit", help="largest model whose model state fits the GPUs")
    gpu_memory_flags(f)
    f.add_argument("--world-size", type=int, default=1, help="number of GPUs sharing the model (default 1)")
    a = kinds.add_parser("advise", help="the memory ladder: the first of DDP, ZeRO 1, 2, 3 that fits, else LoRA's rank budget")
    model_flags(a)
    gpu_memory_flags(a)
    a.add_argument("--gpus", type=int, required=True, help="GPUs the model is trained on")
    a.add_argument("--micro-batch", type=int, help="sequences per GPU per step: adds activations (needs the shape)")
    a.add_argument("--activation-checkpointing", action="store_true", help="activations with every block recomputed in backward")
    a.add_argument("--precision", default="bf16", choices=list(MEMORY_PRECISIONS), help="training precision (default bf16)")
    c = kinds.add_parser("claim", help="the MFU a stated throughput implies, and whether the hardware can reach it")
    model_flags(c)
    c.add_argument("--tokens-per-s", type=float, help="the claimed training throughput, tokens per second (all GPUs)")
    c.add_argument("--tokens", type=float, help="or: the claimed training tokens ...")
    c.add_argument("--days", type=float, help="... in this many days")
    c.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    gpu_flags(c)
    for p in (m, t, f, a, c):
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    est.set_defaults(func=run)


def run(args) -> int:
    compute = {"memory": memory_table, "time": time_estimate, "fit": fit_table, "advise": advise, "claim": claim_check}[args.kind]
    try:
        result = compute(args)
    except EstimateError as err:
        print(f"scalelab estimate {args.kind}: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else render(args.kind, result))
    return 0
