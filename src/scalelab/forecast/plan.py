"""One answer before renting GPUs: ``scalelab plan`` ranks every configuration a model could
train in on a given cluster by its predicted time, keeps those whose predicted memory fits with a
stated reserve, and prints the best, the runners-up with why each lost, and every assumption.

Each configuration (precision x strategy x tensor-parallel degree x micro-batch x activation checkpointing) is
timed and sized
by the same code as ``scalelab estimate scaling`` (predict.predict_point: compute at an assumed
efficiency, each collective on the link its group uses, the strategy's overlap, the in-step peak
memory of one micro-batch), at a fixed global batch whose per-GPU share is accumulated. A
configuration fits when its predicted peak stays within the GPU's memory less the reserve
(RESERVE: what the model does not count). fp8 is timed from bf16 by the tokens/s ratio measured on
a GPU (scalelab.registries.hardware.fp8_outlook), not at its datasheet peak, which its casts never reach.
Every figure is a prediction: the output says so, and where each input comes from.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

from scalelab.forecast.estimate import _human, _mfu_text
from scalelab.forecast.estimate_command import cluster_flags, trainer_flag
from scalelab.forecast.estimate_text import _mfu_origin
from scalelab.forecast.inputs import (
    RESERVE,
    UNITS,
    Cluster,
    EstimateError,
    ModelChoice,
    PlanAsk,
    cluster_from_args,
    memory_reserve_bytes,
    non_negative,
    plan_ask_from_args,
    positive_count,
    positive_whole,
)
from scalelab.forecast.model_input import model_flags, model_from_flags, shape_text
from scalelab.forecast.predict import predict_point
from scalelab.forecast.runnable import not_run, runs, stage_not_priced
from scalelab.forecast.scaling import LINK_RULE, PIPELINE_READING, machine_of
from scalelab.forecast.step import Point, fp8_machine
from scalelab.formulas import communication, flops, links
from scalelab.formulas.pipeline import SCHEDULES
from scalelab.registries import hardware
from scalelab.registries.precisions import PRECISION_NAMES
from scalelab.registries.strategies import HYBRID_KEY, TRAINERS, ZERO_STAGES, strategy

TIE = 0.05
"""Runners-up predicted within this of the best are not ranked against it: the step-time model's own error
is larger (docs/prediction.md)."""
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
"""Micro-batches per GPU tried (each dividing the GPU's share of the global batch)."""
TENSOR_PARALLEL = (1, 2, 4, 8)
"""Tensor-parallel degrees tried: those within a node that split the model's heads and MLP evenly."""
PIPELINE_PARALLEL = (1, 2, 4, 8)
"""Pipeline-parallel degrees tried: those whose stages split the blocks evenly and whose data-parallel share of the
global batch gives the schedule enough micro-batches."""
PLAN_SCHEDULES = ("1f1b", "interleaved_1f1b")
"""The schedules tried under pipelining: GPipe has 1F1B's bubble and holds every micro-batch's activations, so it never
wins on time or memory (scalelab estimate scaling --schedule gpipe prices it)."""


def tensor_parallel_degrees(cfg, gpus: int, per_node: int, asked: list[int] | None = None) -> list[int]:
    """The degrees a model can be split by on this cluster (a family's plan; heads, key/value heads and the
    MLP's width divisible; within a node, so its all-reduces stay on the intra-node link). A degree asked
    for (--tensor-parallel) that cannot be is an EstimateError naming why."""
    from scalelab.forecast.step import check_tensor_parallel

    fits = []
    for t in asked or TENSOR_PARALLEL:
        try:
            check_tensor_parallel(cfg, t)
            if t > per_node or gpus % t:
                raise EstimateError(f"--tensor-parallel {t} does not fit a node of {per_node} GPUs and divide --gpus {gpus}")
            fits.append(t)
        except EstimateError:
            if asked:
                raise
    return fits




def candidates(product, precisions: list[str] | None, gpus: int, per_node: int,
               trainer: str = "scalelab") -> list[tuple[str, int | str]]:
    """(precision, strategy key) pairs worth timing: bf16 (fp16 on a GPU without it) and fp8 where the GPU
    has FP8 tensor cores, or the precisions asked for; ZeRO stages 0-3, and hybrid sharding where the
    GPUs fill several nodes (a trainer priced at some stages alone: those, scalelab.registries.strategies.TRAINERS)."""
    if precisions is None:
        precisions = ["bf16" if product.peak("bf16") else "fp16"] + (["fp8"] if product.peak("fp8") else [])
    stages = TRAINERS[trainer].stages
    keys: list[int | str] = list(stages or ZERO_STAGES)
    if gpus > per_node and gpus % per_node == 0 and stages is None:
        keys.append(HYBRID_KEY)
    return [(p, k) for p in precisions for k in keys]


def _trainer_left_out(trainer: str) -> list[str]:
    """The stages a trainer priced at some stages alone leaves out, and why."""
    if TRAINERS[trainer].stages is None:
        return []
    others = [str(s) for s in ZERO_STAGES if s not in TRAINERS[trainer].stages]
    out = [f"ZeRO stages {', '.join(others)} and hybrid sharding: {stage_not_priced(trainer, HYBRID_KEY)}"]
    if TRAINERS[trainer].memory == "llm-foundry":
        out.append("pipeline parallelism and precisions other than bf16: the llm-foundry trainer is priced as its MPT "
                   "benchmarks run (FSDP alone, in bf16)")
    return out


def _left_out(pairs, degrees: list[int], gpus: int, per_node: int, trainer: str) -> list[str]:
    """The (precision, strategy, tensor-parallel degree) combinations the plan does not time, each with why: what
    the trainer priced does not run (for scalelab, the sweep's own rule)."""
    out: dict[str, list[str]] = {}
    for precision, key in pairs:
        for t in degrees:
            why = not_run(precision, key, gpus, per_node, t, trainer)
            if why is None:
                continue
            out.setdefault(why, []).append(f"{precision} {'hybrid' if key == HYBRID_KEY else f'ZeRO-{key}'} x TP {t}")
    return [f"{', '.join(which)}: {why}" for why, which in out.items()]


def _pipeline_not_run(pairs, pipelines: list[tuple[int, int, str]], gpus: int, per_node: int, trainer: str) -> list[str]:
    """The pipelined configurations the plan times only without sequence parallelism, because the trainer priced
    does not run it with a pipeline (scalelab: the sweep's pipeline rule), in one line per reason."""
    out: dict[str, dict[str, set]] = {}
    for precision, key in pairs:
        for t, p, sched in pipelines:
            if p == 1 or t == 1 or not runs(precision, key, gpus, per_node, t, trainer, p, sched):
                continue  # no pipeline, no tensor parallelism, or left out already (and said so) without it
            why = not_run(precision, key, gpus, per_node, t, trainer, p, sched, sequence_parallel=True)
            if why is not None:
                seen = out.setdefault(why, {"precision": set(), "ZeRO": set(), "TP": set(), "PP": set()})
                for name, value in (("precision", precision), ("ZeRO", key), ("TP", t), ("PP", p)):
                    seen[name].add(value)
    lines = []
    for why, seen in out.items():  # e.g. (precision bf16, ZeRO 0/2/3, TP 2/4, PP 2/4)
        which = ", ".join(f"{name} {'/'.join(map(str, sorted(values, key=str)))}" for name, values in seen.items())
        lines.append(f"sequence parallelism with a pipeline ({which}): {why}")
    return lines


PLAN_REMEDY = "even at one sequence per micro-batch; a larger --global-batch"
"""What a plan's user can change where a pipeline has too few micro-batches: the plan tries one sequence per
micro-batch already."""


def pipeline_choices(cfg, gpus: int, degrees: list[int], global_batch: int, pipelines: list[int],
                     schedules: list[str]) -> tuple[list[tuple[int, int, str]], list[str]]:
    """The (tensor-parallel degree, pipeline degree, schedule) combinations a plan times, and why each other was left
    out: the blocks split evenly, the GPUs and the global batch split over DP x TP x P, and each data-parallel rank's
    share fills the schedule with one sequence per micro-batch at least."""
    from scalelab.forecast.pipeline_step import pipeline_problem

    out, why = [], {}
    for t in degrees:
        for p in pipelines:
            for sched in (schedules if p > 1 else ["1f1b"]):
                if gpus % (t * p):
                    why.setdefault(f"PP {p} x TP {t}: does not divide --gpus {gpus}", None)
                    continue
                dp = gpus // (t * p)
                problem = (f"--global-batch {global_batch} does not split over its {dp} data-parallel ranks"
                           if global_batch % dp else pipeline_problem(cfg, p, sched, global_batch // dp,
                                                                      remedy=PLAN_REMEDY))
                if problem:
                    why.setdefault(f"PP {p} ({sched}) x TP {t}: {problem}", None)
                else:
                    out.append((t, p, sched))
    return out, list(why)


def _rows(ask: PlanAsk, cluster: Cluster, cfg, n_params: int, pairs, machine, budget: float,
          pipelines: list[tuple[int, int, str]]) -> tuple[list, list]:
    """Every configuration's row (precision x strategy x tensor-parallel degree x pipeline degree and schedule x
    micro-batch x checkpointing) at --gpus, and the notes on how fp8 was timed."""
    from scalelab.forecast.pipeline_step import pipeline_problem

    n, rows, notes = ask.gpus, [], []
    bf16_peak = machine.product.peak("bf16")
    for precision, key in pairs:
        if precision == "fp8":
            timed, note = fp8_machine(machine, cfg.d_model)  # its datasheet peak, the measured fp8/bf16 ratio apart
            notes = [note]
        else:
            timed = replace(machine, peak_flops=flops.gpu_peak_flops(cluster.gpu, precision))
        for t, pp, sched in [(t, p, s) for t, p, s in pipelines if runs(precision, key, n, machine.per_node, t,
                                                                          cluster.trainer, p, s) and (p == 1 or key != HYBRID_KEY)]:
            share = ask.global_batch // (n // (t * pp))  # each data-parallel rank's share
            levers = [(m, c, sp) for m in MICRO_BATCHES if share % m == 0
                      and pipeline_problem(cfg, pp, sched, share // m) is None for c in (False, True)
                      for sp in ((False, True) if t > 1 else (False,))
                      if not sp or runs(precision, key, n, machine.per_node, t, cluster.trainer, pp, sched, True)]
            for micro, checkpointing, sp in levers:
                point = Point(cfg=cfg, n_params=n_params, key=key, precision=precision, micro_batch=micro,
                              trainer=cluster.trainer, grad_reduce=cluster.reduce_dtype, global_batch=ask.global_batch,
                              activation_checkpointing=checkpointing, tensor_parallel=t, sequence_parallel=sp,
                              pipeline_parallel=pp, pipeline_schedule=sched)
                row = predict_point(point, timed, n)
                row.setdefault("pipeline_parallel", 1)
                fpt = row["flops_per_token"]
                rows.append({**row, "precision": precision, "strategy": key, "strategy_name": strategy(point.priced).name,
                             "activation_checkpointing": checkpointing, "sequence_parallel": sp,
                             "fits": row["peak_memory_bytes"] <= budget,
                             "mfu_of_bf16_peak": row["tokens_per_s_per_gpu"] * fpt / bf16_peak if bf16_peak else None,
                             "days": ask.tokens / (row["tokens_per_s_per_gpu"] * n) / 86400})
    rows.sort(key=lambda r: (not r["fits"], -r["tokens_per_s_per_gpu"], r["peak_memory_bytes"]))
    return rows, notes


def _runners_up(rows: list[dict], best: dict | None, budget: float) -> list[dict]:
    """The fastest of each other (precision, strategy, degree) that fits, else its smallest, with why it lost: those
    at the best's precision first (like against like), then the other precisions."""
    group = lambda r: (r["precision"], r["strategy"], r["tensor_parallel"], r["pipeline_parallel"],  # noqa: E731
                       r.get("pipeline_schedule"))
    out = []
    for key in dict.fromkeys(group(r) for r in rows):
        if best is not None and key == group(best):
            continue
        mine = [r for r in rows if group(r) == key]
        shown = mine[0] if mine[0]["fits"] else min(mine, key=lambda r: r["peak_memory_bytes"])
        out.append({**shown, "why": _why_lost(shown, best, budget)})
    same = (best or {}).get("precision")
    return sorted(out, key=lambda r: (r["precision"] != same, not r["fits"], -r["tokens_per_s_per_gpu"]))


def plan(args) -> dict:
    """`scalelab plan`'s answer for its flags (the command's edge: plan_for computes it)."""
    return plan_for(model_from_flags(args), cluster_from_args(args), plan_ask_from_args(args))


def plan_for(model: ModelChoice, cluster: Cluster, ask: PlanAsk) -> dict:
    """Every configuration's prediction at the GPU count asked, ranked; the best and the runners-up with reasons."""
    n_params, cfg, n = model.n_params, model.cfg, ask.gpus
    try:
        product = hardware.gpu_by_name(cluster.gpu)
    except ValueError as err:
        raise EstimateError(f"--gpu {cluster.gpu}: {err}") from None
    pairs = candidates(product, ask.precisions, n, int(cluster.gpus_per_node), cluster.trainer)
    machine, source, notes = machine_of(cluster, pairs[0][0], [n])  # --mfu-from reads that precision's runs
    memory = machine.product.memory_gib * UNITS["GiB"]
    reserve = memory_reserve_bytes(memory, ask.reserve_gib) / UNITS["GiB"]  # the reserve advise keeps too
    budget = memory - reserve * UNITS["GiB"]
    splits, pipelines, left_out = _searched(ask, cluster, cfg, pairs, machine.per_node)
    rows, fp8_notes = _rows(ask, cluster, cfg, n_params, pairs, machine, budget, pipelines)
    if not rows:  # every configuration left out before pricing (the trainer's limits, the batch): say why, not "none fits"
        # pipeline degrees asked for: their layouts' reasons first, as they leave out every configuration
        ordered = sorted(left_out, key=lambda why: not why.startswith("PP ")) if ask.pipeline_parallel else left_out
        shown = ordered[:3] + ([f"{len(ordered) - 3} more left out"] if len(ordered) > 3 else [])
        raise EstimateError("no configuration to price: " + ("; ".join(shown) if shown else
                                                             "none of the precisions and strategies asked runs here"))
    best = next((r for r in rows if r["fits"]), None)
    return {"prediction": True, "model": model.named.get("model"), "shape": shape_text(cfg), "n_params": n_params,
            "gpus": n, "gpu": machine.product.name, "gpus_per_node": machine.per_node, "global_batch": ask.global_batch,
            "seq_len": cfg.seq_len, "tokens": ask.tokens, "memory_gib": machine.product.memory_gib,
            "reserve_gib": reserve, "budget_gib": budget / UNITS["GiB"], "best": best,
            "runners_up": _runners_up(rows, best, budget), "rows": rows, "left_out": left_out,
            "assumptions": {**_assumptions(cluster, ask, machine, source, splits, cfg, fp8_notes),
                            "pipeline_parallel": _pipeline_text(pipelines)},
            **({"note": "; ".join(notes)} if notes else {})}


def _searched(ask: PlanAsk, cluster: Cluster, cfg, pairs, per_node: int) -> tuple[list[int], list, list[str]]:
    """(the tensor-parallel degrees whose data-parallel ranks split the global batch, the (TP, PP, schedule) layouts
    tried, what is left out and why)."""
    n, trainer = ask.gpus, cluster.trainer
    degrees = tensor_parallel_degrees(cfg, n, per_node, ask.tensor_parallel)
    splits = [t for t in degrees if ask.global_batch % (n // t) == 0]  # every data-parallel rank the same share
    if not splits:
        raise EstimateError(f"--global-batch {ask.global_batch} does not split evenly over the data-parallel ranks of "
                            f"--gpus {n} at any tensor-parallel degree tried ({', '.join(map(str, degrees))})")
    left_out = [f"TP {t}: --global-batch {ask.global_batch} does not split over its {n // t} data-parallel ranks"
                for t in degrees if t not in splits] + _left_out(pairs, splits, n, per_node, trainer)
    left_out += _trainer_left_out(trainer)
    pipelines, pipeline_left_out = pipeline_choices(cfg, n, degrees, ask.global_batch,
                                                    _pipeline_degrees(cfg, ask.pipeline_parallel),
                                                    ask.schedules or list(PLAN_SCHEDULES))
    left_out += [why for why in pipeline_left_out if not why.startswith("PP 1 ")] + _pipeline_not_run(
        pairs, pipelines, n, per_node, trainer)
    if any(p > 1 for _, p, _ in pipelines) and any(key == HYBRID_KEY for _, key in pairs):
        left_out.append("hybrid sharding with pipeline parallelism: not predicted")
    return splits, pipelines, left_out


def _assumptions(cluster: Cluster, ask: PlanAsk, machine, source, degrees: list[int], cfg, fp8_notes: list[str]) -> dict:
    return {
        "mfu_without_communication": machine.mfu, "mfu_default": cluster.mfu is None and source is None,
        **({"mfu_source": source} if source else {}),
        "mfu_note": "the hardware's efficiency on what it computes: activation checkpointing's recompute is "
                    "computed at it too; MFU columns count model FLOPs",
        "intra_node": f"{machine.intra.name} ({machine.intra.source})",
        "inter_node": f"{machine.inter.name} ({machine.inter.source})" if machine.inter else None,
        "link_efficiency": cluster.link_efficiency if cluster.link_efficiency is not None else links.DEFAULT_EFFICIENCY,
        "link_rule": LINK_RULE,
        "overlap_efficiency": machine.overlap_efficiency,
        "overlap_efficiency_default": cluster.overlap_efficiency is None,
        "trainer": cluster.trainer, "trainer_priced": TRAINERS[cluster.trainer].description,
        "grad_reduce": cluster.reduce_dtype,
        "reserve": RESERVE["source"] if ask.reserve_gib is None else "--reserve-gib",
        "fp8": {**hardware.fp8_outlook(cfg.d_model), "timing": fp8_notes[0]} if fp8_notes else None,
        "tensor_parallel": f"degrees {', '.join(map(str, degrees))} within a node (their all-reduces on the critical "
                           "path but where the trainer overlaps them: estimate scaling --tensor-parallel), each with and "
                           "without sequence parallelism; the combinations timed are the rows, those left "
                           "out are listed with why",
        "out_of_scope": "context parallelism, hybrid sharding with tensor or pipeline parallelism, CPU offload, "
                        f"LoRA; the model's memory is {MEMORY_RECIPES[TRAINERS[cluster.trainer].memory]}"}


MEMORY_RECIPES = {"scalelab": "the formula a run measures (scalelab.formulas.peak_memory.peak_memory)",
                  "megatron": "the megatron trainers' stated recipe (scalelab.formulas.megatron_style)",
                  "llm-foundry": "llm-foundry's MPT recipe (scalelab.formulas.foundry_style)"}
"""Each trainer's memory recipe (scalelab.registries.strategies.Trainer.memory), in the plan's words."""


def _pipeline_degrees(cfg, asked: list[int] | None) -> list[int]:
    """The pipeline degrees tried: --pipeline-parallel's, else PIPELINE_PARALLEL's (1 always: no pipelining)."""
    return sorted(set(asked)) if asked else list(PIPELINE_PARALLEL)


def _pipeline_text(pipelines: list[tuple[int, int, str]]) -> str:
    timed = sorted({(p, s) for _, p, s in pipelines if p > 1})
    if not timed:
        return "none timed (degree 1 alone: no degree > 1 split the blocks and gave its schedule enough micro-batches)"
    return (", ".join(f"PP {p} {s}" for p, s in timed) + " (mesh order pp, dp, tp: consecutive stages on different "
            f"nodes once DP x TP fills one); {PIPELINE_READING}; GPipe not tried (1F1B's bubble, every micro-batch's "
            "activations held)")


def _why_lost(row: dict, best: dict | None, budget: float) -> str:
    if not row["fits"]:
        return (f"does not fit: {row['peak_memory_gib']:.1f} GiB at its smallest (micro-batch {row['micro_batch']}, "
                f"{'with' if row['activation_checkpointing'] else 'without'} activation checkpointing) > the "
                f"{budget / UNITS['GiB']:.1f} GiB budget")
    if best is None:
        return ""
    slower = best["tokens_per_s_per_gpu"] / row["tokens_per_s_per_gpu"] - 1
    if row["precision"] != best["precision"]:  # across precisions: compute and casts differ, say so first
        return (f"{slower:.1%} slower than the best at {best['precision']} (another precision: its compute at the "
                f"{row['precision']} efficiency, {row['compute_s'] * 1e3:.1f} against {best['compute_s'] * 1e3:.1f} ms per step)")
    if slower < TIE:
        return f"{slower:.1%} slower: within {TIE:.0%} of the best, no ranking (the model's error is larger): measure both"
    exposed = row["exposed_comm_s"] - best["exposed_comm_s"]
    compute = row["compute_s"] - best["compute_s"]
    cause = (f"{exposed * 1e3:.1f} ms more exposed communication per step" if exposed >= compute else
             f"{compute * 1e3:.1f} ms more compute per step" + (" (recompute)" if row["activation_checkpointing"] and
                                                                not best["activation_checkpointing"] else ""))
    return f"{slower:.1%} slower: {cause}"


def _label(r: dict) -> str:
    how = "hybrid sharding" if r["strategy"] == HYBRID_KEY else f"ZeRO stage {r['strategy']}"
    if r.get("tensor_parallel", 1) > 1:
        how += f" x tensor parallel {r['tensor_parallel']}" + (" with sequence parallelism" if r.get("sequence_parallel") else "")
    if r.get("pipeline_parallel", 1) > 1:
        p = r["pipeline"]
        how += (f" x pipeline parallel {r['pipeline_parallel']} ({r['pipeline_schedule']}, bubble "
                f"{p['bubble_fraction']:.1%}, sends {'across nodes' if p['p2p_across_nodes'] else 'within a node'})")
    return (f"{r['precision']}, {how}, micro-batch {r['micro_batch']} x {r['accumulation_steps']} accumulated, "
            f"activation checkpointing {'on' if r['activation_checkpointing'] else 'off'}")


def render(result: dict) -> str:
    a = result["assumptions"]
    model = result["model"] or "the model"
    lines = [f"PLAN: predicted, not measured. {model} ({result['n_params'] / 1e9:.3g}B parameters) on {result['gpus']} x "
             f"{result['gpu']} ({result['gpus_per_node']} per node), global batch {result['global_batch']} x "
             f"{result['seq_len']} tokens, {_human(result['tokens'])} tokens to train",
             f"model: {result['shape']}",
             f"memory budget per GPU: {result['memory_gib']:g} GiB less a {result['reserve_gib']:.1f} GiB reserve = "
             f"{result['budget_gib']:.1f} GiB"]
    best = result["best"]
    if best is None:
        lines.append("NO configuration fits: every one's predicted peak exceeds the budget (more GPUs, a larger "
                     "GPU, or LoRA: scalelab estimate advise)")
    else:
        mfu = best["mfu_of_bf16_peak"]
        lines += [f"best: {_label(best)}",
                  f"  {best['peak_memory_gib']:.1f} GiB per GPU; {best['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU "
                  f"({best['tokens_per_s']:,.0f} in all)" + (f", MFU {mfu:.1%} of the bf16 peak" if mfu else "")
                  + f"; step {best['step_time_s']:.3g} s (exposed communication {best['exposed_comm_s'] * 1e3:.1f} ms); "
                  f"{_human(result['tokens'])} tokens in {best['days']:.1f} days"]
    lines.append("runners-up (the fastest of each other precision and strategy):")
    for r in result["runners_up"]:
        lines.append(f"  {_label(r)}: {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, {r['peak_memory_gib']:.1f} GiB; "
                     f"{r['why']}")
    lines.append("assumptions (each with its source):")
    lines.append(f"  compute: MFU {_mfu_text(a['mfu_without_communication'], 'mfu_source' in a, a['mfu_default'])} "
                 "without communication "
                 f"({_mfu_origin(a)}); {a['mfu_note']}")
    lines.append(f"  links: within a node {a['intra_node']}" + (f"; between nodes {a['inter_node']}" if a["inter_node"] else "")
                 + f"; link efficiency {a['link_efficiency']:g}; {a['link_rule']}")
    lines.append(f"  overlap efficiency {a['overlap_efficiency']:g}" + (" (default: fitted to published multi-node runs; measured "
                 "traces set it: train.profile, --overlap-efficiency)" if a["overlap_efficiency_default"] else ""))
    lines.append(f"  trainer priced: {a['trainer']} ({a['trainer_priced']}); gradients reduced in "
                 f"{'fp32' if a['grad_reduce'] == 'fp32' else 'the compute dtype'}")
    lines.append(f"  memory reserve: {a['reserve']}")
    lines.append(f"  tensor parallelism: {a['tensor_parallel']}")
    lines.append(f"  pipeline parallelism: {a['pipeline_parallel']}")
    for line in result["left_out"]:
        lines.append(f"    left out: {line}")
    if a["fp8"]:
        lines.append(f"  fp8: {a['fp8']['verdict']} ({a['fp8']['basis']}); {a['fp8']['timing']}")
    lines.append(f"  out of scope: {a['out_of_scope']}")
    if "note" in result:
        lines.append(f"note: {result['note']}")
    return "\n".join(lines)


def _run(args) -> int:
    try:
        result = plan(args)
    except EstimateError as err:
        args.usage_parser.error(str(err))
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(render(result))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="one answer before renting GPUs: every precision x strategy x micro-batch x "
                       "checkpointing ranked by predicted time, within the GPU's memory and a reserve",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_flags(p, params=False)  # a plan needs the shape (its memory): --model, the shape flags or --config
    p.add_argument("--gpus", type=positive_whole, required=True, help="GPUs in all")
    cluster_flags(p)
    p.add_argument("--global-batch", type=positive_whole, required=True, metavar="SEQUENCES", help="sequences per optimizer step")
    p.add_argument("--tokens", type=positive_count, required=True, help="tokens to train: 1T, 300B")
    p.add_argument("--precision", nargs="+", choices=list(PRECISION_NAMES), default=None,
                   help="only these precisions (default: bf16, and fp8 where the GPU has FP8 tensor cores)")
    p.add_argument("--reserve-gib", type=non_negative, default=None, help="device memory the prediction does not count "
                   f"(default {RESERVE['fixed_gib']:g} GiB + {RESERVE['share'] * 100:.0f}%% of the GPU's memory)")
    p.add_argument("--tensor-parallel", nargs="+", type=positive_whole, default=None, metavar="T",
                   help=f"only these tensor-parallel degrees (default: {', '.join(map(str, TENSOR_PARALLEL))}, those within a "
                        "node that split the model evenly; 1 = none)")
    p.add_argument("--pipeline-parallel", nargs="+", type=positive_whole, default=None, metavar="P",
                   help=f"only these pipeline-parallel degrees (default: {', '.join(map(str, PIPELINE_PARALLEL))}, those "
                        "whose stages split the blocks and whose global batch fills the schedule; 1 = none)")
    p.add_argument("--schedule", nargs="+", choices=list(SCHEDULES), default=None,
                   help=f"only these pipeline schedules (default: {', '.join(PLAN_SCHEDULES)})")
    trainer_flag(p)
    p.add_argument("--grad-reduce", default=None, choices=list(communication.GRAD_REDUCE),
                   help="dtype gradients are reduced in (default the trainer's: fp32 for scalelab, the compute dtype for "
                        "megatron, nemo and llm-foundry)")
    p.add_argument("--json", action="store_true", help="every configuration's row as JSON")
    p.set_defaults(func=_run, usage_parser=p)

