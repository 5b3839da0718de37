"""`scalelab estimate`: napkin math made exact, before spending GPU hours.

    scalelab estimate memory --params 7.5e9 --world-size 64
    scalelab estimate memory --layers 24 --d-model 1024 --vocab 50257 --seq 1024 --world-size 8 --micro-batch 8
    scalelab estimate memory --config config.yaml
    scalelab estimate time   --params 7e9 --tokens 1e12 --gpus 256 --gpu H100 --mfu 0.4
    scalelab estimate fit    --gpu-memory-gib 80 --world-size 8
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from scalelab import accounting, hardware
from scalelab.config import ModelConfig
from scalelab.strategies import ZERO_STAGES

# fp8 keeps the same fp32 model state as bf16 (torchao's float8 linears cast on the fly),
# and the ZeRO paper has no fp8 convention: the memory tables list the three AMP precisions.
MEMORY_PRECISIONS = ("fp32", "fp16", "bf16")

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
        from scalelab.config import load_config, model_config

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
    GiB = UNITS[args.unit]
    rows = []
    for precision in MEMORY_PRECISIONS:
        for stage in ZERO_STAGES:
            real = accounting.model_state_bytes(n_params, stage, world_size, precision, "pytorch")
            paper = accounting.model_state_bytes(n_params, stage, world_size, precision, "paper")
            row = {"precision": precision, "zero_stage": stage, "world_size": world_size,
                   "pytorch_params_gib": real.params / GiB, "pytorch_grads_gib": real.grads / GiB,
                   "pytorch_optimizer_gib": real.optimizer / GiB, "pytorch_total_gib": real.total / GiB,
                   "paper_total_gib": paper.total / GiB}
            if cfg is not None and args.micro_batch:
                peak = accounting.peak_memory(cfg, n_params, stage, world_size, precision, args.micro_batch)
                row["activations_gib"] = peak.activations / GiB
                row["peak_gib"] = peak.total / GiB
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


def fit_table(args) -> dict:
    mem = _positive("gpu-memory-gib", args.gpu_memory_gib) * UNITS["GiB"]
    world_size = int(_positive("world-size", args.world_size))
    rows = []
    for precision in MEMORY_PRECISIONS:
        for stage in ZERO_STAGES:
            rows.append({"precision": precision, "zero_stage": stage,
                         "pytorch_max_params": accounting.largest_model(mem, stage, world_size, precision, "pytorch"),
                         "paper_max_params": accounting.largest_model(mem, stage, world_size, precision, "paper")})
    return {"gpu_memory_gib": args.gpu_memory_gib, "world_size": world_size, "rows": rows,
            "note": "model state only: leave room for activations, buffers and fragmentation"}


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def render(kind: str, result: dict) -> str:
    lines = []
    if kind == "memory":
        lines.append(f"model state per rank for {_human(result['n_params'])} parameters at world size {result['world_size']} ({result['unit']})")
        extra = "activations_gib" in result["rows"][0]
        head = f"{'precision':<9} {'stage':>5} {'params':>10} {'grads':>10} {'optimizer':>10} {'total':>10} {'paper':>10}"
        lines.append(head + (f" {'activ.':>10} {'peak':>10}" if extra else ""))
        for r in result["rows"]:
            line = (f"{r['precision']:<9} {r['zero_stage']:>5} {r['pytorch_params_gib']:>10.3f} {r['pytorch_grads_gib']:>10.3f} "
                    f"{r['pytorch_optimizer_gib']:>10.3f} {r['pytorch_total_gib']:>10.3f} {r['paper_total_gib']:>10.3f}")
            lines.append(line + (f" {r['activations_gib']:>10.3f} {r['peak_gib']:>10.3f}" if extra else ""))
    elif kind == "time":
        r = result
        lines += [f"{_human(r['n_params'])} parameters x {_human(r['tokens'])} tokens = {r['total_flops']:.3e} FLOPs ({r['flops_rule']})",
                  f"on {r['gpus']} x {r['gpu']} ({r['precision']} dense peak {r['peak_flops_per_gpu'] / 1e12:.1f} TFLOP/s) at MFU {r['mfu']:.0%}:",
                  f"  {r['days']:.2f} days ({r['gpu_hours']:.4g} GPU-hours)"]
    else:
        lines.append(f"largest model whose model state fits {result['gpu_memory_gib']:g} GiB per GPU x {result['world_size']} GPUs")
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

    m = kinds.add_parser("memory", help="model-state memory per rank, every stage x precision")
    model_flags(m)
    m.add_argument("--world-size", type=int, default=1, help="ranks (GPUs) sharing the model (default 1)")
    m.add_argument("--unit", choices=list(UNITS), default="GiB", help="GiB (2^30 bytes, default) or GB (10^9, the ZeRO paper's)")
    m.add_argument("--micro-batch", type=int, help="sequences per rank per step: adds activations and the in-step peak (needs the shape)")
    t = kinds.add_parser("time", help="days to train")
    model_flags(t)
    t.add_argument("--tokens", type=float, required=True, help="training tokens, e.g. 1e12")
    t.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    t.add_argument("--gpu", required=True,
                   help=f"GPU product (case-insensitive): {', '.join(hardware.known_names())}; "
                        "bare A100, H100 and H200 mean the SXM parts")
    t.add_argument("--precision", default="bf16", choices=list(hardware.PRECISIONS),
                   help="compute precision (default bf16; fp8 only on GPUs with fp8 tensor cores)")
    t.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation in (0, 1] (default 0.4)")
    f = kinds.add_parser("fit", help="largest model whose model state fits the GPUs")
    f.add_argument("--gpu-memory-gib", type=float, required=True, help="memory per GPU, GiB (e.g. 80)")
    f.add_argument("--world-size", type=int, default=1, help="number of GPUs sharing the model (default 1)")
    for p in (m, t, f):
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    est.set_defaults(func=run)


def run(args) -> int:
    compute = {"memory": memory_table, "time": time_estimate, "fit": fit_table}[args.kind]
    try:
        result = compute(args)
    except EstimateError as err:
        print(f"scalelab estimate {args.kind}: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else render(args.kind, result))
    return 0
