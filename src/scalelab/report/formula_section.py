"""The report's formulas section, written for the sweep it reports: the model families, strategies
and levers its runs used, the strategy lines generated from their records (scalelab.registries.strategies),
so a Llama sweep reads Llama's formulas and a hybrid run its replica all-reduce (the
section was GPT-2's for every sweep)."""
from __future__ import annotations

import pandas as pd

from scalelab.formulas.pipeline import SCHEDULES
from scalelab.registries.families import DEFAULT_FAMILY, FAMILIES
from scalelab.registries.strategies import HYBRID, STRATEGIES, Strategy
from scalelab.report.tables import pipeline_rows

FAMILY_FORMULAS = {
    **{name: record.formulas for name, record in FAMILIES.items()},
    "custom": {
        "parameters": "counted from the module (torch's meta device)",
        "flops": "counted by torch.utils.flop_counter on one forward and backward",
        "activations": "not predicted (no formula for a user's module): measured only",
        "recompute": "one more forward of every block, counted",
    },
}
"""Each model family's formulas in words, from its record (scalelab.registries.families; custom: a user's module)."""

BYTES = (4, 4, 8)
"""PyTorch AMP's bytes per parameter of (parameters, gradients, AdamW moments), in every precision."""


def _psi(coefficient: float) -> str:
    return "" if coefficient == 1 else f"{coefficient:g}"


def _sum(terms: list[str]) -> str:
    return " + ".join(terms) if terms else "0"


def model_state_text(record: Strategy, paper: bool = False) -> str:
    """Model state per rank of a strategy from its record: the unsharded bytes per parameter in Ψ,
    the sharded ones in Ψ/N (PyTorch's 4 + 4 + 8, or the paper's 2 + 2 + 12 at K = 12); hybrid
    sharding shards over its shard group, Ψ/S."""
    sizes = (2, 2, 12) if paper else BYTES
    shards = record.shards_paper if paper else record.shards
    whole = sum(b for b, sharded in zip(sizes, shards, strict=True) if not sharded)
    split = sum(b for b, sharded in zip(sizes, shards, strict=True) if sharded)
    over = "S" if record.replicate_psi else "N"
    return _sum(([f"{whole}Ψ"] if whole else []) + ([f"{split}Ψ/{over}"] if split else []))


def comm_text(record: Strategy) -> str:
    """Elements handed to collectives per step, in Ψ, with k accumulation micro-batches where they count."""
    one, two = record.comm_psi(1), record.comm_psi(2)
    slope = two - one
    text = f"{one:g}Ψ" if slope == 0 else f"{one:g}Ψ, ({_psi(slope)}k + {one - slope:g})Ψ with k micro-batches"
    if record.replicate_psi:
        text += f", plus {record.replicate_psi:g}Ψ/S all-reduced across the replicas (S = N/R, a shard group)"
    return text


def pipeline_text(schedules: list[str]) -> str:
    """Pipeline parallelism's formulas in words (scalelab.formulas.pipeline), naming the schedules the sweep ran."""
    ran = ", ".join(f"{name} (V = {SCHEDULES[name].chunks_per_rank})" for name in schedules if name in SCHEDULES)
    return ("<b>Pipeline</b> (P stages, m micro-batches per step, V chunks of consecutive blocks per rank: 2 for "
            "interleaved 1F1B, else 1" + (f"; this sweep: {ran}" if ran else "") + "; the embeddings on the first chunk, "
            "the final norm, head and loss on the last). <b>Bubble</b>, the share of a step each stage idles: "
            "(P − 1)/(V m + P − 1) (Narayanan et al. 2021: equal chunks, sends that cost no time); measured: one minus "
            "a stage's forward and backward time over the schedule's, the mean over rank 0's pipeline's stages. "
            "<b>Point-to-point bytes</b> per step: at every boundary between chunks, each micro-batch's activations "
            "forward and their gradient backward, b·s·h values each (s/T under sequence parallelism) at the residual "
            "stream's width (4 bytes; the compute dtype's where FSDP2 gathers 16-bit parameters); each side of a chunk "
            "that has a neighbour sends m of them and receives m (the first stage under GPipe or 1F1B: m·b·s·h values "
            "sent and as many received; a middle stage twice that). <b>Micro-batches in flight</b> (activations "
            "held at once on stage i): GPipe m per chunk, 1F1B min(m, P − i), interleaved 1F1B (V − 1)·r + "
            "2·(P − 1 − i) + 1 chunk-micro-batches, at most V·m (r micro-batches per round). A tied head is the last "
            "stage's own copy of the embedding, its gradient summed with the first stage's every step (an all-reduce "
            "of the embedding's fp32 gradient).")


def formulas_html(runs: pd.DataFrame) -> str:
    """The formulas section of the report, for the families, strategies and levers in ``runs``."""
    families = [f for f in FAMILY_FORMULAS if f in set(runs.get("model_family", pd.Series([DEFAULT_FAMILY])).dropna())] or [DEFAULT_FAMILY]
    stages = sorted(int(s) for s in runs["zero_stage"].dropna().unique()) if "zero_stage" in runs else sorted(STRATEGIES)
    hybrid = "replicas" in runs and bool((runs["replicas"].fillna(1) > 1).any())
    lora = "lora_rank" in runs and bool(runs["lora_rank"].notna().any())
    pipelined = bool(pipeline_rows(runs).any())
    several = len(families) > 1

    def per_family(key: str) -> str:
        return "; ".join((f"{f}: " if several else "") + FAMILY_FORMULAS[f][key] for f in families)

    records = [(f"stage {s} ({STRATEGIES[s].name})", STRATEGIES[s]) for s in stages] + (
        [(f"hybrid ({HYBRID.name})", HYBRID)] if hybrid else [])
    silent = [label for label, r in records if r.silent_at_world_size_1 and not r.replicate_psi]  # hybrid needs 2 ranks
    items = [
        f"<b>Parameters</b> {per_family('parameters')}.",
        f"<b>FLOPs per token</b> = {per_family('flops')} (matmul weights forward and backward, plus attention scores "
        "and values; causal masking not halved, PaLM's convention). <b>MFU</b> = tokens/s × FLOPs per token / (peak × "
        "world size), against the dense peak of the precision named in each row (datasheet on known GPUs; on CPU the "
        "best matmul rate measured at run start).",
        "<b>Model state per rank, at rest</b> (after the optimizer step). PyTorch AMP keeps fp32 parameters, fp32 "
        "gradients and fp32 AdamW moments in every precision: "
        + "; ".join(f"{label}: {model_state_text(r)}" for label, r in records)
        + ". The ZeRO paper (mixed precision, K = 12): "
        + "; ".join(f"{label.split(' (')[0]}: {model_state_text(r, paper=True)}" for label, r in records) + ".",
        "<b>Predicted in-step peak</b> = the larger of the start of backward (model state less the gradients none holds "
        "then: the optimizer frees them, and only DDP's buckets or an earlier micro-batch keep them; + parameters "
        "gathered in the step + activations) and the optimizer step (model state at rest, gradients included).",
        "<b>Communication per step</b>, in the ZeRO paper's unit (all-reduce of Ψ = 2Ψ; all-gather, reduce-scatter, "
        "broadcast of Ψ = Ψ): " + "; ".join(f"{label.split(' (')[0]}: {comm_text(r)}" for label, r in records)
        + (f". On one rank {', '.join(label.split(' (')[0] for label in silent)} issue no collectives (0 bytes)" if silent else "")
        + ". Bytes = gradient elements × the reduce width + parameter elements × the gather width: 4 bytes (fp32), "
        "except that fp16 and bf16 runs at stages 2 and 3 all-gather parameters in 2 bytes (FSDP2 MixedPrecisionPolicy) "
        "and, with the grad_reduce lever at compute, reduce gradients in 2 bytes; fp16 adds its loss scaler's 8-byte "
        "inf/NaN flag. On a ring each rank sends (N−1)/N of this.",
        "<b>Scaling efficiency</b> = tokens/s at N / (N × the median tokens/s at world size 1 of the same model, "
        "precision, stage and levers): never another model's (scalelab.results.like)."
        + (" Hybrid sharding divides by its stage's world-size-1 run (one rank has no replicas)." if hybrid else ""),
        "<b>Activations</b> kept for backward per layer and micro-batch. Korthikanti et al. 2022 (2-byte values, no "
        "tensor parallelism): s·b·h·(34 + 5·a·s/h), and 2·s·b·h with full recomputation (\"paper\" columns, scaled by "
        f"width / 2). This sweep's models: {per_family('activations')}; with per-block checkpointing only the block "
        "input remains. Measured: the bytes "
        "autograd saves during one micro-batch's forward on rank 0 (saved-tensor hooks, distinct storages, parameters "
        "excluded, block inputs included).",
        f"<b>Recompute cost</b> of checkpointing = one more forward of every block: {per_family('recompute')} FLOPs per "
        "token; predicted step-time ratio 1 + that / FLOPs per token. MFU counts model FLOPs only; HFU adds the recompute.",
    ]
    if lora:
        items.append("<b>LoRA</b> (rank r on every block's linears): the frozen weights keep 4 bytes per parameter, "
                     "sharded as the strategy shards parameters; the trainable A and B carry the full 16; gradient "
                     "collectives move the trainable parameters only, parameter gathers move every parameter.")
    if pipelined:
        items.append(pipeline_text(sorted(set(runs.loc[pipeline_rows(runs), "pipeline_schedule"].dropna().astype(str)))))
    if any(r.ddp_buckets for _, r in records):
        items.append("<b>DDP buckets</b>: gradients fill buckets of bucket_mb MiB in reverse registration order (about "
                     "the order they become ready); one all-reduce per bucket per step (none on one rank: no DDP).")
    return "<ul>\n" + "\n".join(f"<li>{item}</li>" for item in items) + "\n</ul>\n"
