"""Which configurations the trainer a forecast prices runs: for scalelab the sweep's own rules (the tensor_parallel
and pipeline_parallel axes of scalelab.planning.sweep), for the trainers that scale every stage they are priced at.
`scalelab plan` leaves out what is not run and says why; `scalelab estimate scaling` refuses it in one line: the two
read this one rule, so that they give one answer from the same inputs."""
from __future__ import annotations

from scalelab.forecast.step import _replicas
from scalelab.formulas import foundry_style
from scalelab.formulas.rank_step import RankStep
from scalelab.planning.sweep import AXIS, RunPoint
from scalelab.registries.strategies import HYBRID_KEY, TRAINERS, strategy


def runs(precision: str, key, gpus: int, per_node: int, degree: int, trainer: str = "scalelab", pipeline: int = 1,
         schedule: str = "1f1b", sequence_parallel: bool = False) -> bool:
    """Whether the trainer priced runs tensor parallelism of ``degree`` (with sequence parallelism or not) and a
    pipeline of ``pipeline`` stages with this precision and strategy: for scalelab (which can then check it) the
    sweep's own rules (scalelab.planning.sweep, the tensor_parallel and pipeline_parallel axes); the trainers that
    scale run them with every stage but hybrid sharding (a 3-D mesh, not predicted)."""
    return not_run(precision, key, gpus, per_node, degree, trainer, pipeline, schedule, sequence_parallel) is None


def not_run(precision: str, key, gpus: int, per_node: int, degree: int, trainer: str, pipeline: int = 1,
            schedule: str = "1f1b", sequence_parallel: bool = False) -> str | None:
    """Why the trainer priced does not run this combination (:func:`runs`); None where it does."""
    if TRAINERS[trainer].memory == "llm-foundry":
        # the recipe's rule reads the strategy and the levers, not the batch: one micro-batch stands for any
        step = RankStep(precision, strategy(key).stage, gpus // degree, 1, tensor_parallel=degree,
                        sequence_parallel=sequence_parallel, replicas=_replicas(gpus, per_node) if key == HYBRID_KEY else 1)
        return (None if pipeline == 1 and foundry_style.unpriced(step) is None else
                "the llm-foundry trainer is priced as its MPT benchmarks run: FSDP alone, in bf16")
    if trainer != "scalelab":
        split = "tensor" if pipeline == 1 else "pipeline"
        return None if (degree == 1 and pipeline == 1) or key != HYBRID_KEY else \
            f"hybrid sharding with {split} parallelism (a 3-D mesh) is not predicted"
    point = RunPoint(precision, strategy(key).stage, gpus, replicas=_replicas(gpus, per_node) if key == HYBRID_KEY else 1,
                     tensor_parallel=degree, sequence_parallel=sequence_parallel, pipeline_parallel=pipeline,
                     pipeline_schedule=schedule)
    why = AXIS["tensor_parallel"].left_out(point, None) or AXIS["pipeline_parallel"].left_out(point, None)
    return None if why is None else "scalelab does not run it: " + why


def stage_not_priced(trainer: str, key) -> str | None:
    """Why a trainer priced at some ZeRO stages alone (its own implementation: TRAINERS' ``stages``) does not price
    this strategy; None where it does."""
    stages = TRAINERS[trainer].stages
    if stages is None or key in stages:
        return None
    named = " and ".join(map(str, stages))
    return (f"the {trainer} trainer is priced at ZeRO stage{'s' if len(stages) > 1 else ''} {named} (its own "
            "implementation); the others as scalelab runs them: --trainer scalelab")
