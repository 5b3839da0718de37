"""A plan's pick as a trainer's configuration, and whose implementation a configuration was priced as.

``scalelab plan ... --json > plan.json`` then ``scalelab export config plan.json --to torchtitan|hf|lightning``
writes the plan's best configuration (or ``--rank K``, the K-th fastest that fits) as that trainer's own, as
``export config RESULTS`` writes a measured run. A plan prices each strategy as one trainer runs it
(``--trainer``: scalelab.registries.strategies.TRAINERS); the trainer a configuration is exported to may run the same
degrees another way (torchtitan has no ZeRO-1, and splits the head over the vocabulary under tensor
parallelism). The export names the trainer priced and says, for each such difference, what the target runs
instead: the step time and memory predicted (or measured) are then not that trainer's.
"""
from __future__ import annotations

import json
from pathlib import Path

from scalelab.registries.strategies import HYBRID_KEY, TRAINERS

PRICED_ZERO1 = {
    "scalelab": "PyTorch's ZeroRedundancyOptimizer (an fp32 all-reduce of the gradients, then an fp32 broadcast of the "
                "updated shards)",
    "megatron": "a distributed optimizer (gradients reduce-scattered, parameters all-gathered in the compute dtype, "
                "bf16 parameters beside an fp32 gradient buffer)",
}
"""ZeRO-1 as each trainer scalelab prices runs it (scalelab.formulas.communication, megatron_style)."""
TARGET_NAMES = {"torchtitan": "torchtitan", "hf": "Hugging Face's Trainer", "lightning": "Lightning"}
TARGET_ZERO1 = {
    "torchtitan": "FSDP2 with fsdp_reshard_after_forward 'never' (parameters sharded too and all-gathered once per "
                  "step, gradients reduce-scattered in fp32)",
    "hf": "FSDP SHARD_GRAD_OP (gradients sharded too)",
    "lightning": "FSDP SHARD_GRAD_OP (gradients sharded too)",
}
"""What each export target runs for ZeRO stage 1: none of them has an optimizer-only sharding."""
PRICED_TENSOR_PARALLEL = {
    "scalelab": "the embedding and head whole on every rank, its backward all-reduces in fp32",
    "megatron": "the embedding, head and loss split over the vocabulary, its collectives in the compute dtype",
}
TORCHTITAN_TENSOR_PARALLEL = ("megatron", "the embedding, head and loss split over the vocabulary (RowwiseParallel "
                              "embedding, loss_parallel), its norms always sequence-parallel, DTensor collectives in "
                              "the compute dtype (torchtitan's apply_tp)")
"""torchtitan's tensor parallelism, and the priced form it matches (hf and lightning do not carry tensor parallelism)."""


def is_plan(source: Path) -> bool:
    """Whether ``export config``'s source is a plan's JSON (a file) rather than a results folder."""
    return Path(source).is_file()


def read_plan(source: Path) -> dict:
    """The plan ``scalelab plan --json`` wrote; ValueError in one line where the file is not one."""
    try:
        plan = json.loads(Path(source).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{source}: not a plan's JSON ({err}); write one with scalelab plan ... --json > FILE, or give a "
                         "results folder") from None
    if not isinstance(plan, dict) or not plan.get("prediction") or "rows" not in plan or "assumptions" not in plan:
        raise ValueError(f"{source}: not a plan's JSON (scalelab plan ... --json writes one: its keys prediction, rows, "
                         "assumptions)")
    return plan


def plan_row(plan: dict, rank: int | None) -> dict:
    """The plan's pick (its best, or the rank-th fastest configuration that fits) as an export row: the keys a measured
    run's row gives the trainer configurations, and who priced it (``_priced_by``)."""
    fitting = [r for r in plan["rows"] if r.get("fits")]
    if not fitting:
        raise ValueError("the plan has no configuration that fits its memory budget: nothing to export")
    rank = rank or 1
    if rank > len(fitting):
        raise ValueError(f"--rank {rank}: the plan has {len(fitting)} configuration(s) that fit")
    row = fitting[rank - 1]
    hybrid = row["strategy"] == HYBRID_KEY
    trainer = plan["assumptions"]["trainer"]
    return {"run_id": None, "world_size": int(row["gpus"]), "nodes_used": int(row["nodes"]),
            "zero_stage": 3 if hybrid else int(row["strategy"]), "replicas": int(row.get("replicas") or 1),
            "tensor_parallel": int(row.get("tensor_parallel") or 1), "pipeline_parallel": int(row.get("pipeline_parallel") or 1),
            "pipeline_schedule": row.get("pipeline_schedule"), "sequence_parallel": bool(row.get("sequence_parallel")),
            "micro_batch": int(row["micro_batch"]), "accumulation_steps": int(row["accumulation_steps"]),
            "precision": row["precision"], "seq_len": plan.get("seq_len"), "compile": False,
            "activation_checkpointing": bool(row["activation_checkpointing"]), "grad_clip": 1.0,
            "grad_reduce": "fp32" if plan["assumptions"].get("grad_reduce") == "fp32" else "compute",
            "device_name": plan.get("gpu", ""), "tokens_per_s": float(row["tokens_per_s"]), "_priced_by": trainer,
            "_headline": (f"scalelab plan (predicted, not measured): {plan.get('model') or 'the model'}, "
                          f"{row['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU on {row['gpus']} x {plan.get('gpu', '')}"
                          f" ({'the best' if rank == 1 else f'rank {rank}'} of the configurations that fit; "
                          f"{row['peak_memory_gib']:.1f} GiB per GPU predicted); clipping and compile are not planned: "
                          "the trainer's defaults")}


def priced_with(row: dict) -> str:
    """The trainer whose implementation the configuration's figures are: the plan's --trainer, or scalelab's own for a
    measured run."""
    trainer = row.get("_priced_by")
    if trainer is None:
        return measured_with(row)
    return (f"priced by scalelab plan --trainer {trainer}: {TRAINERS[trainer].description}")


def measured_with(row: dict) -> str:
    """The trainer the exported run was measured with, and its strategy as it ran: what another trainer's configuration
    carries over, and how (its ZeRO-1 is DDP with ZeroRedundancyOptimizer, not a distributed optimizer)."""
    from scalelab.registries.strategies import strategy

    record = strategy(int(row["zero_stage"]), int(row.get("replicas") or 1))
    tp, pp = int(row.get("tensor_parallel") or 1), int(row.get("pipeline_parallel") or 1)
    return (f"measured with scalelab's own trainer ({record.name}" + (f", tensor parallel {tp}" if tp > 1 else "")
            + (f", pipeline parallel {pp} ({row.get('pipeline_schedule')})" if pp > 1 else "")
            + f", {row['precision']}): scalelab plan --trainer scalelab prices this")


def measured_or_priced(row: dict) -> str:
    """Whether an exported configuration was measured (a run) or priced (a plan's pick)."""
    return "priced" if row.get("_priced_by") else "measured"


def runs_otherwise(row: dict, target: str) -> list[str]:
    """Where the target trainer runs this configuration otherwise than the trainer it was priced (or measured) as: each a
    sentence; empty where it runs it as priced."""
    trainer = TRAINERS[row.get("_priced_by") or "scalelab"]
    priced = trainer.form  # whose strategies priced ZeRO-1 and tensor parallelism (nemo's are megatron's)
    what = measured_or_priced(row)
    name = TARGET_NAMES[target]
    out = []
    if int(row["zero_stage"]) == 1:
        out.append(f"ZeRO-1 was {what} as {PRICED_ZERO1[priced]}; {name} runs {TARGET_ZERO1[target]}: its "
                   "communication and memory are not those " + what)
    tp = int(row.get("tensor_parallel") or 1)
    if tp > 1 and target == "torchtitan":
        form, how = TORCHTITAN_TENSOR_PARALLEL
        if form != priced:
            out.append(f"tensor parallelism was {what} with {PRICED_TENSOR_PARALLEL[priced]}; torchtitan runs {how}: its "
                       f"tensor-parallel bytes and memory are not those {what}")
        elif not row.get("sequence_parallel"):
            out.append(f"tensor parallelism was {what} without sequence parallelism; torchtitan's always runs it (its "
                       "norms sequence-parallel: all-gathers and reduce-scatters, smaller activations)")
    if trainer.memory == "llm-foundry":
        out.append("memory was priced with llm-foundry's MPT recipe (scalelab.formulas.foundry_style: Triton flash "
                   f"attention, the fused cross-entropy over bf16 logits, FSDP PURE); {name} runs its own kernels and loss, "
                   "whose memory may differ")
    if trainer.memory == "megatron" and int(row["zero_stage"]) == 0:
        out.append("memory was priced with bf16 parameters beside an fp32 gradient buffer and fp32 master weights "
                   f"(scalelab.formulas.megatron_style); {name} keeps fp32 parameters and casts them for compute")
    return out  # a reduce dtype the target cannot set is export.not_carried's
