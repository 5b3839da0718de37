"""The sweep: one registry entry per axis, and the run points built from it.

Everything that varies between training runs is an axis here: its type and default, how it
reads in run ids, its column type in the result tables, where it applies and what "at its
default" means to the report. A run's folder is ``<results>/runs/<run id>/``; its ``point.json``
holds every axis value. Run ids name only values away from their defaults, so an axis added later
with a default changes no existing run's id, folder or params (a ``point.json`` without it reads
as the default). ``RunPoint`` (its fields), the sweep plan, the
identity columns, the launcher's run plan and the report's lever tables all loop over
``AXES``; ``tests/*/test_config.py`` checks the config schema's ``sweep`` keys against it.
Adding an axis: an entry here, its key in the schema and ``config.yaml``, and the code
that implements the lever.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.config import ConfigError, TrainConfig, section, train_config
from scalelab.formulas.communication import GRAD_REDUCE, MIXED_COMM
from scalelab.formulas.pipeline import DEFAULT_SCHEDULE, SCHEDULES, microbatches_problem
from scalelab.registries.precisions import PRECISIONS
from scalelab.registries.strategies import DDP_BUCKET_MB, HYBRID, strategy

BASE_MODEL = "base"
"""The model axis's default: the shape in the config's ``model:`` section."""


def _flag(text: str) -> bool:
    if text not in ("true", "false"):
        raise ValueError(f"expected true or false, got {text!r}")
    return text == "true"


def _optional(parse: Callable[[str], Any], none: str) -> Callable[[str], Any]:
    return lambda text: None if text == none else parse(text)


@dataclass(frozen=True)
class Axis:
    name: str
    doc: str
    type: Any
    """Python type of a value (for RunPoint's field)."""
    default: Any
    """The value when the config's sweep section leaves the axis out (levers: their one default)."""
    arrow: str
    """pyarrow type of its identity column (int8, int32, float64, bool, string)."""
    nullable: bool
    """Whether its identity column may be null."""
    from_path: Callable[[str], Any] = str
    """A value as written in the run folders of the layouts before run-id folders
    (``micro_batch~auto``, ``bucket_mb~none``), read by ``scalelab migrate`` (ValueError on bad text)."""
    run_id: Callable[[Any], str | None] = lambda value: None
    """The run-id part of a value (``z3``, ``ac``); None adds nothing (a lever at its default)."""
    normalise: Callable[[Any, Any], Any] = lambda point, value: value
    """The value a point holds given its other axes (no DDP buckets under FSDP2)."""
    left_out: Callable[[Any, TrainConfig], str | None] = lambda point, train: None
    """Why a combination is not run (the lever does not apply to it); None = run it."""
    is_default: Callable[[Any], Any] | None = None
    """Report: which rows of a runs table have this lever at its default (None: not a lever)."""
    id_pattern: str | None = None
    """Regular expression of the run-id parts this axis writes: a model name that reads as one
    (a model named ``ac``) would make one run id name two different runs, and is refused."""
    swept: bool = True
    """Whether the config's ``sweep:`` section lists its values (``repeat`` comes from ``repeats:``)."""
    beside: str | None = None
    """The lever this one runs only beside, away from that one's default (sequence parallelism: tensor
    parallelism); a run of it pairs with its twin at the same value of that lever (scalelab.report.levers)."""
    changes_compute: bool = True
    """Whether it changes a rank's compute per token, so that a run's compute reference in the step-time
    model must share it (scalelab.results.prediction.COMPUTE_KEY); False where the token share or the
    communication carries it (world size, micro-batch, buckets, replicas, repeats)."""


def _bucket_run_id(value):
    if value is None or value == DDP_BUCKET_MB:
        return None
    text = f"{value:g}"  # 25.0 reads bucket25; 25.0000001 must not read as 25 (the default, no part at all)
    return f"bucket{text if float(text) == value else repr(value)}"


def data_parallel_ranks(point) -> int:
    """A point's data-parallel ranks: its world size over its tensor-parallel and pipeline degrees (each
    data-parallel rank's tensor-parallel groups, one per pipeline stage, take one share of the global batch)."""
    model_ranks = point.tensor_parallel * point.pipeline_parallel
    return point.world_size // model_ranks if point.world_size % model_ranks == 0 else point.world_size


def _micro_batch_left_out(point, train: TrainConfig) -> str | None:
    try:
        micro_batch_plan(train, data_parallel_ranks(point), point.micro_batch)
    except ConfigError as err:
        return str(err)
    return None


def _replicas_left_out(point, train: TrainConfig) -> str | None:
    if point.replicas == 1:
        return None
    if point.zero_stage != HYBRID.stage:
        return (f"replicas={point.replicas} applies to zero_stage {HYBRID.stage} (hybrid sharding: FSDP2 over a "
                f"replicate x shard mesh); zero_stage {point.zero_stage} has no replicas")
    if point.world_size % point.replicas:
        return (f"replicas={point.replicas} does not divide world_size={point.world_size} (every replica holds "
                "world_size / replicas ranks)")
    if data_parallel_ranks(point) % point.replicas:
        return (f"replicas={point.replicas} does not divide the {data_parallel_ranks(point)} data-parallel ranks of a "
                f"pipeline stage (world_size={point.world_size} / pipeline_parallel={point.pipeline_parallel})")
    return None


def _tensor_parallel_left_out(point, train: TrainConfig) -> str | None:
    """What tensor parallelism is not run with (scalelab.run.tensor_parallel), each with why."""
    t = point.tensor_parallel
    if t == 1:
        return None
    if point.world_size % t:
        return f"tensor_parallel={t} does not divide world_size={point.world_size} (world = data-parallel ranks x {t})"
    if point.zero_stage == 1:
        return "zero_stage 1 with tensor parallelism: ZeroRedundancyOptimizer takes no DTensor parameters"
    for reason, applies in ((f"replicas={point.replicas}: hybrid sharding with tensor parallelism (a 3-D mesh) is not run",
                             point.replicas > 1),
                            ("fp8's float8 linears are not split (torchao's float8 tensor-parallel styles are not wired)",
                             point.precision == "fp8"),
                            ("tensor parallelism needs train.warmup_steps >= 1 (its collectives are counted over the warm-up "
                             "steps)", bool(train is not None and train.warmup_steps < 1)),
                            (f"lora_rank={point.lora_rank}: LoRA adapters on split linears are not run", bool(point.lora_rank)),
                            ("compile with activation_checkpointing under tensor parallelism: torch's compiled checkpoint "
                             "saves a DTensor's DeviceMesh for backward and fails (torch 2.13: 'expected all "
                             "tensors_saved_with_vc_check to be Tensors'); each lever runs alone",
                             point.compile and point.activation_checkpointing),
                            ("cpu_offload with tensor parallelism is not run", point.cpu_offload),
                            ("checkpoints of tensor-parallel runs are not written yet (set train.checkpoint_every: 0)",
                             bool(train is not None and train.checkpoint_every))):
        if applies:
            return reason
    return None


def _pipeline_left_out(point, train: TrainConfig) -> str | None:
    """What pipeline parallelism is not run with (scalelab.run.pipeline), each with why; a model whose blocks do not
    split is refused by the run plan (scalelab.planning.run_plan.pipeline_problem)."""
    p = point.pipeline_parallel
    if p == 1:
        return None
    if point.world_size % (p * point.tensor_parallel):
        return (f"pipeline_parallel={p} x tensor_parallel={point.tensor_parallel} does not divide world_size="
                f"{point.world_size} (world = data-parallel ranks x tensor_parallel x pipeline_parallel)")
    for reason, applies in (
            ("cpu_offload with pipeline parallelism is not run", point.cpu_offload),
            ("sequence_parallel with pipeline parallelism is not run", point.sequence_parallel),
            (f"lora_rank={point.lora_rank}: LoRA with pipeline parallelism is not run", bool(point.lora_rank)),
            ("pipeline parallelism needs train.warmup_steps >= 2 (the first step infers the shapes its stages send, the "
             "second measures the activations they hold)", bool(train is not None and train.warmup_steps < 2))):
        if applies:
            return reason
    if train is not None:
        try:
            _, m = micro_batch_plan(train, data_parallel_ranks(point), point.micro_batch)
        except ConfigError:
            return None  # the micro_batch axis says why
        return microbatches_problem(p, m, point.pipeline_schedule)
    return None


def _strategy_of(point):
    """The point's strategy record: hybrid sharding where its replicas apply, else its stage's."""
    return strategy(point.zero_stage, point.replicas if _replicas_left_out(point, None) is None else 1)


AXES: tuple[Axis, ...] = (
    Axis("precision", " | ".join(f"{p.name} ({p.doc})" for p in PRECISIONS.values()),
         str, None, "string", False, run_id=lambda v: v, id_pattern="|".join(map(re.escape, PRECISIONS))),
    Axis("zero_stage", "the data-parallel strategy (scalelab.registries.strategies)", int, None, "int8", False,
         from_path=int, run_id=lambda v: f"z{v}", id_pattern=r"z\d+"),
    Axis("world_size", "ranks per run", int, None, "int32", False, from_path=int, run_id=lambda v: f"w{v}", id_pattern=r"w\d+",
         changes_compute=False),
    # Levers: optional axes with one default value, so a sweep stays small unless asked.
    Axis("micro_batch", "sequences per rank per forward (gradient accumulation); None = the whole per-rank batch",
         int | None, None, "int32", True,
         from_path=_optional(int, "auto"),
         run_id=lambda v: None if v is None else f"mb{v}", id_pattern=r"mb\d+", left_out=_micro_batch_left_out,
         # 'auto' resolves to the whole per-rank batch, i.e. one micro-batch per step
         is_default=lambda runs: runs["accumulation_steps"].isna() | (runs["accumulation_steps"] == 1), changes_compute=False),
    Axis("activation_checkpointing", "recompute every transformer block's activations in backward", bool, False,
         "bool", False, from_path=_flag, run_id=lambda v: "ac" if v else None, id_pattern="ac",
         is_default=lambda runs: ~runs["activation_checkpointing"].astype(bool)),
    Axis("cpu_offload", "sharded parameters, gradients and optimizer state in host memory", bool, False,
         "bool", False, from_path=_flag, run_id=lambda v: "offload" if v else None, id_pattern="offload",
         left_out=lambda point, train: None if not point.cpu_offload or _strategy_of(point).cpu_offload else
         f"cpu_offload applies to {', '.join(f'ZeRO stage {s}' for s in _stages_with('cpu_offload'))} "
         "(FSDP2's offload policy)" + (", without replicas (hybrid sharding is not run offloaded here)"
                                       if point.replicas > 1 else ""),
         is_default=lambda runs: ~runs["cpu_offload"].astype(bool)),
    Axis("bucket_mb", "DDP gradient bucket size, MiB; None for strategies without buckets", float | None,
         DDP_BUCKET_MB, "float64", True,
         from_path=_optional(float, "none"), run_id=_bucket_run_id, id_pattern=r"bucket.*",
         normalise=lambda point, v: (float(v) if v is not None and strategy(point.zero_stage).ddp_buckets_apply(
             point.tensor_parallel, point.pipeline_parallel) else None),
         is_default=lambda runs: runs["bucket_mb"].isna() | (runs["bucket_mb"] == DDP_BUCKET_MB), changes_compute=False),
    Axis("compile", "torch.compile (inductor) of every transformer block and of the loss, before DDP/FSDP2 wrapping",
         bool, False, "bool", False, from_path=_flag,
         run_id=lambda v: "compiled" if v else None, id_pattern="compiled", is_default=lambda runs: ~runs["compile"].astype(bool)),
    # A main axis, not a lever: every other axis is crossed with it; 'base' is the config's model: section.
    Axis("model", "named model shape: 'base' (the model: section) or a name of the models: table", str, BASE_MODEL,
         "string", False, run_id=lambda v: None if v == BASE_MODEL else v),
    Axis("lora_rank", "LoRA rank r (frozen base weights, trainable B A on every block's linears); None = full training",
         int | None, None, "int32", True,
         from_path=_optional(int, "none"), run_id=lambda v: None if v is None else f"lora{v}", id_pattern=r"lora\d+",
         is_default=lambda runs: runs["lora_rank"].isna()),
    # Gradients reduced in fp32 (default: torchtitan's reduce_dtype) or in the compute dtype. fp16
    # and bf16 runs gather parameters in their compute dtype at stages 2 and 3 either way.
    Axis("grad_reduce", "dtype gradients are reduced in: fp32 | compute (the run's compute dtype: FSDP2 "
         "MixedPrecisionPolicy reduce_dtype at stages 2 and 3, DDP's bf16/fp16 compress hook at 0 and 1; fp16 and "
         "bf16 runs only)", str, GRAD_REDUCE[0], "string", False,
         run_id=lambda v: None if v == GRAD_REDUCE[0] else "reduce16", id_pattern="reduce16",
         left_out=lambda point, train: None if point.grad_reduce == GRAD_REDUCE[0] or point.precision in MIXED_COMM else
         f"grad_reduce={point.grad_reduce} applies to {' and '.join(MIXED_COMM)} (fp32 reduces in its compute dtype "
         "already; fp8 keeps torchao's recipe, see scalelab.formulas.communication.MIXED_COMM)",
         is_default=lambda runs: runs["grad_reduce"].isna() | (runs["grad_reduce"] == GRAD_REDUCE[0])),
    # Hybrid sharding: zero_stage 3 over R replicas of N/R-rank shard groups (scalelab.registries.strategies.HYBRID).
    # Added with its default (1: no id part), so no earlier run's id changes.
    Axis("replicas", "replica groups of hybrid sharding (HSDP: FSDP2 over a replicate x shard mesh, zero_stage 3 "
         "only): parameters, gradients and optimizer state sharded over world_size / replicas ranks (a node), "
         "replicated across the groups; 1 = no replication (plain ZeRO-3 at stage 3)", int, 1, "int16", False,
         from_path=int, run_id=lambda v: None if v == 1 else f"hsdp{v}", id_pattern=r"hsdp\d+",
         left_out=_replicas_left_out, is_default=lambda runs: runs["replicas"].isna() | (runs["replicas"] == 1),
         changes_compute=False),
    # Tensor parallelism: the blocks' linears split over T ranks (scalelab.run.tensor_parallel), the
    # world size T x the data-parallel ranks (a 2-D mesh, tensor-parallel inner: within a node). Added with its
    # default (1: no id part), so no earlier run's id changes.
    Axis("tensor_parallel", "tensor-parallel degree T: every block's linears split over T ranks (Megatron's column and "
         "row parallel linears on DTensor), world_size / T data-parallel ranks; 1 = none", int, 1, "int16", False,
         from_path=int, run_id=lambda v: None if v == 1 else f"tp{v}", id_pattern=r"tp\d+",
         left_out=_tensor_parallel_left_out, is_default=lambda runs: runs["tensor_parallel"].isna() | (runs["tensor_parallel"] == 1)),
    # Sequence parallelism: with T > 1, the norms and the residual stream on 1/T of the tokens per rank.
    Axis("sequence_parallel", "sequence parallelism (Megatron's, with tensor_parallel > 1): the norms and the residual "
         "stream on each rank's 1/T of the tokens, all-gathered before the split linears and reduce-scattered after "
         "them instead of all-reduced", bool, False, "bool", False, from_path=_flag,
         run_id=lambda v: "sp" if v else None, id_pattern="sp", beside="tensor_parallel",
         left_out=lambda point, train: None if not point.sequence_parallel or point.tensor_parallel > 1 else
         "sequence_parallel needs tensor_parallel > 1 (it splits the tokens over the tensor-parallel ranks)",
         is_default=lambda runs: ~runs["sequence_parallel"].fillna(False).astype(bool)),
    # Pipeline parallelism: the blocks split into stages on P ranks each (scalelab.run.pipeline), world size = data-parallel
    # ranks x T x P (a 3-D mesh: pipeline outermost, tensor-parallel innermost). Added with its default (1: no id part).
    Axis("pipeline_parallel", "pipeline-parallel degree P: the blocks split into P stages (the embeddings with the first, "
         "the final norm, head and loss with the last), each step's micro-batches passed through them by "
         "torch.distributed.pipelining's schedule; world_size / (T x P) data-parallel ranks; 1 = none", int, 1, "int16",
         False, from_path=int, run_id=lambda v: None if v == 1 else f"pp{v}", id_pattern=r"pp\d+",
         left_out=_pipeline_left_out, beside="micro_batch",  # a step's one micro-batch cannot fill a pipeline
         is_default=lambda runs: runs["pipeline_parallel"].isna() | (runs["pipeline_parallel"] == 1)),
    Axis("pipeline_schedule", "the pipeline's schedule (with pipeline_parallel > 1): " + "; ".join(
         f"{s.name}: {s.doc}" for s in SCHEDULES.values()), str, DEFAULT_SCHEDULE, "string", False,
         run_id=lambda v: None if v == DEFAULT_SCHEDULE else v.replace("_", ""),
         id_pattern="|".join(s.replace("_", "") for s in SCHEDULES if s != DEFAULT_SCHEDULE), beside="pipeline_parallel",
         normalise=lambda point, v: v if point.pipeline_parallel > 1 else DEFAULT_SCHEDULE,  # one point without a pipeline
         is_default=lambda runs: runs["pipeline_schedule"].isna() | (runs["pipeline_schedule"] == DEFAULT_SCHEDULE),
         changes_compute=False),
    # Last, so that a repeat's run id is its first run's plus "-r2", "-r3" (scalelab.results.noise).
    # Repeats of a point differ in nothing but what cannot be held equal (timing): same seed, same data,
    # bit-identical losses; their spread in time is the sweep's run-to-run noise.
    Axis("repeat", "which run of a repeated point (1 = the first; the config's repeats: section)", int, 1, "int16", False,
         from_path=int, run_id=lambda v: None if v == 1 else f"r{v}", id_pattern=r"r\d+", swept=False, changes_compute=False),
)
AXIS = {axis.name: axis for axis in AXES}


def run_id_grammar() -> str:
    """How a run id is built, from the axes: the three main parts, then one per axis away from its default."""
    def example(axis: Axis) -> str:
        return f"<{axis.name} name>" if axis.id_pattern is None else re.sub(r"\\d\+", "2", axis.id_pattern).replace(".*", "1")

    main = [a.name for a in AXES[:3]]
    assert main == ["precision", "zero_stage", "world_size"], main  # the grammar below names them
    return ("<precision>-z<stage>-w<world size> (e.g. fp32-z0-w2), then a part per axis away from its default, in this "
            "order: " + ", ".join("-" + example(axis) for axis in AXES[3:]))
RUN_ID_CHARACTERS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
"""What every run id is made of (axis values and model names): one folder name, never '..' nor a path."""


def run_id_problem(run_id: object) -> str | None:
    """Why a run id read back from disk (a summary, a table) cannot name a run folder; None when it can.
    Checked before any path is built from it: a hand-edited summary must not write outside its folder."""
    if not isinstance(run_id, str) or not RUN_ID_CHARACTERS.fullmatch(run_id) or ".." in run_id:
        return (f"run id {str(run_id)[:80]!r} is not one (a run id is one folder name of letters, digits, "
                "'.', '_', '+' and '-', as " + run_id_grammar().split(" (")[0] + ")")
    return None


SWEEP_AXES = tuple(AXIS)
LEVER_AXES = tuple(a.name for a in AXES if a.is_default is not None)
RUN_DIR_GLOB = "[!.]*"
"""Matches every run folder under <results_dir>/runs: one level, named by the run id."""
POINT_FILE = "point.json"
"""In every run folder: the run's value for every axis (``RunPoint.to_json``)."""
LAUNCHER_FILE = "launcher.json"
"""In a run folder while its launcher runs (until summary.json): the launcher process
(scalelab.run.processes.holder_record), which `scalelab status` checks to tell running from killed."""


def _stages_with(feature: str) -> list[int]:
    from scalelab.registries.strategies import STRATEGIES

    return [s.stage for s in STRATEGIES.values() if getattr(s, feature)]


@dataclasses.dataclass(frozen=True)
class RunPoint:
    """One point of the sweep: one value per axis of AXES, in that order (a new axis adds its field here, with the
    axis's type and default; tests/unit/test_sweep_axes.py holds the two equal)."""

    precision: str
    zero_stage: int
    world_size: int
    micro_batch: int | None = None
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    bucket_mb: float | None = 25.0
    compile: bool = False
    model: str = "base"
    lora_rank: int | None = None
    grad_reduce: str = "fp32"
    replicas: int = 1
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    pipeline_parallel: int = 1
    pipeline_schedule: str = "1f1b"
    repeat: int = 1

    def __post_init__(self):
        for axis in AXES:
            object.__setattr__(self, axis.name, axis.normalise(self, getattr(self, axis.name)))

    def values(self) -> dict:
        return {axis.name: getattr(self, axis.name) for axis in AXES}

    def to_json(self) -> dict:
        """What ``point.json`` holds: every axis value, JSON types."""
        return self.values()

    @classmethod
    def from_json(cls, values: dict) -> "RunPoint":
        """A point from ``point.json`` (or from an old layout's folder names): an axis it lacks
        takes its default (the axis was added later); one without a default, or a name that is no
        axis, is a ValueError naming it."""
        unknown = sorted(set(values) - set(AXIS))
        if unknown:
            raise ValueError(f"not sweep axes: {', '.join(unknown)} (axes: {', '.join(AXIS)})")
        missing = [a.name for a in AXES if a.name not in values and a.default is None and not a.nullable]
        if missing:
            raise ValueError(f"no value for {', '.join(missing)}")
        point = cls(**values)
        for axis in AXES:  # after normalise: bucket_mb 25 from JSON is 25.0
            value = getattr(point, axis.name)
            if not isinstance(value, axis.type):
                raise ValueError(f"{axis.name}={value!r} is not of type {axis.type}")
        return point

    @property
    def path(self) -> str:
        """The run's folder relative to <results>/runs: its run id."""
        return self.run_id

    @property
    def run_id(self) -> str:
        """Short unique id: ``fp32-z0-w1``, plus a part per lever away from its default
        (``-mb2``, ``-ac``, ``-offload``, ``-bucket1``, ``-compiled``)."""
        parts = (axis.run_id(getattr(self, axis.name)) for axis in AXES)
        return "-".join(part for part in parts if part is not None)

    @property
    def first_run_id(self) -> str:
        """The run id of this point's first run (a repeat's without its ``-rN``): what its repeats share."""
        return dataclasses.replace(self, repeat=1).run_id

    def identity(self, **resolved) -> dict:
        """The identity columns of this run's rows; ``resolved`` gives values known only at
        launch (the resolved micro_batch size)."""
        values = self.values()
        values.update({k: v for k, v in resolved.items() if v is not None})
        return {"run_id": self.run_id, **values}


def micro_batch_plan(train: TrainConfig, world_size: int, micro_batch: int | None = None) -> tuple[int, int]:
    """(micro_batch, accumulation_steps) per rank for a world size of data-parallel ranks (a tensor-parallel
    group shares one rank's batch: data_parallel_ranks); raises ConfigError."""
    if train.global_batch % world_size:
        raise ConfigError(
            f"train.global_batch={train.global_batch} is not divisible by "
            f"sweep.world_size={world_size}: every rank must get the same share"
        )
    per_rank = train.global_batch // world_size
    micro = micro_batch or per_rank
    if micro > per_rank or per_rank % micro:
        raise ConfigError(
            f"sweep.micro_batch={micro_batch} does not divide the per-rank batch "
            f"{per_rank} (train.global_batch={train.global_batch} / world_size={world_size})"
        )
    return micro, per_rank // micro


def sweep_values(config: dict) -> dict[str, list]:
    """Every axis's values as the sweep lists them (its default alone where it lists none), in AXES order."""
    sweep = section(config, "sweep")
    return {axis.name: sweep.get(axis.name, [axis.default]) if axis.swept else [axis.default] for axis in AXES}


def sweep_plan(config: dict) -> tuple[list, list[tuple[Any, str]]]:
    """(points to run, [(point left out, why)]) from the sweep section, in a stable order.

    Combinations a lever does not apply to are left out (each axis's ``left_out`` rule);
    values an axis normalises away (bucket_mb under FSDP2) give one point. Raises
    ConfigError for a global batch a world size does not split, and for a lever value that
    fits no point at all."""
    train = train_config(config)
    values = sweep_values(config)
    _check_model_names({*section(config, "models"), *values["model"]} - {BASE_MODEL})
    for world_size in values["world_size"]:
        micro_batch_plan(train, int(world_size))  # raises when the global batch does not split evenly
    points, left_out, seen, blamed = [], [], set(), {}
    for combo in itertools.product(*values.values()):
        point = RunPoint(**dict(zip(SWEEP_AXES, combo, strict=True)))
        if point in seen:
            continue
        seen.add(point)
        axis, reason = next(((a.name, r) for a in AXES if (r := a.left_out(point, train))), (None, None))
        if reason:
            left_out.append((point, reason))
            blamed[reason] = axis  # the axis whose rule left it out: the key an error names
        else:
            points.append(point)
    _check_distinct([*points, *(p for p, _ in left_out)], values)
    listed = section(config, "sweep")
    for name in LEVER_AXES:  # replicas among them: hybrid sharding pairs with its ZeRO-3 twin
        for value in values[name]:
            if not any(getattr(p, name) == value for p in points) and any(getattr(p, name) == value for p, _ in left_out):
                point, reason = next((p, r) for p, r in left_out if getattr(p, name) == value)
                culprit = blamed[reason]  # the axis whose rule left it out, not the lever found without a point
                raise ConfigError(f"sweep.{culprit}={getattr(point, culprit)} fits no world size, stage or precision of "
                                  f"the sweep: {reason}", key=("sweep", culprit) if culprit in listed else ())
    if not points:
        axis = blamed[left_out[0][1]] if left_out else "world_size"
        raise ConfigError(f"the sweep has no runnable point: sweep.{axis}={listed.get(axis, values[axis])}: "
                          + "; ".join(sorted({r for _, r in left_out})), key=("sweep", axis) if axis in listed else ())
    return with_repeats(points, values, section(config, "repeats")), left_out


def is_baseline(point, values: dict) -> bool:
    """A baseline point: the sweep's first value of every axis but the world size and the model
    (the first precision and stage listed, levers at their first value), at any world size, of
    every model. The report's comparisons divide by these (scaling efficiency, precision and stage
    ratios), and each model's noise is pooled from its own repeats (scalelab.results.like): a
    model without repeated points would have no noise to rank its configurations by."""
    first = RunPoint(**{name: vals[0] for name, vals in values.items()} | {"world_size": point.world_size,
                                                                          "model": point.model})
    return dataclasses.replace(point, repeat=1) == first


def with_repeats(points: list, values: dict, repeats: dict) -> list:
    """Every point followed by its repeats (``repeats.points`` runs of each, ``repeats.baseline``
    of the baseline points: the sweep measures its own noise)."""
    every, baseline = int(repeats.get("points", 1)), int(repeats.get("baseline", 1))
    out = []
    for point in points:
        n = max(every, baseline) if is_baseline(point, values) else every
        out += [dataclasses.replace(point, repeat=k) for k in range(1, n + 1)]
    return out


def _check_model_names(names) -> None:
    """A model name is a run-id part: one that reads as another axis's part would let one run id
    (and its folder) name two different runs, in this sweep or across sweeps of one results folder."""
    for name in sorted(names):
        for axis in AXES:
            if axis.id_pattern and re.fullmatch(axis.id_pattern, str(name)):
                raise ConfigError(f"models.{name}: a model name must not read as a run-id part of {axis.name} "
                                  f"(/{axis.id_pattern}/): run ids such as fp32-z0-w1-{name} would be ambiguous; rename it")


def _check_distinct(points: list, values: dict) -> None:
    """Two points of the sweep never share a run id, which names their folder (``bucket_mb`` 25 and
    25.0000001 both read ``bucket25``): one folder would hold two points' rows."""
    seen: dict = {}
    for point in points:
        other = seen.setdefault(point.run_id, point)
        if other == point:
            continue
        axis = next(a for a in AXES if getattr(other, a.name) != getattr(point, a.name))
        a, b = getattr(other, axis.name), getattr(point, axis.name)
        raise ConfigError(
            f"sweep.{axis.name}={values[axis.name]!r}: {a!r} and {b!r} give the same run id ({point.run_id}), "
            "so two points would write one run's files; list values that differ as written in run ids")


def sweep_points(config: dict) -> list:
    """Every runnable combination of the sweep axes, in a stable order."""
    return sweep_plan(config)[0]


def read_point(run_dir) -> RunPoint:
    """A run folder's point, from its ``point.json`` (axes it lacks at their default). Raises
    FileNotFoundError without one, ValueError for one that does not hold a point."""
    path = Path(run_dir) / POINT_FILE
    try:
        values = json.loads(path.read_text())
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: {err}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected an object of axis values, got {type(values).__name__}")
    try:
        return RunPoint.from_json(values)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: {err}") from None


DATASET_KEYS_RECORDED_WHOLE = ("name", "source", "path", "tokenizer", "bpe_vocab_size", "decode_errors",
                               "tokenized_dtype", "vocab_size", "val_fraction", "synthetic_bytes", "seed")
"""The dataset keys when data params were the whole ``dataset:`` section: still recorded whatever their
value, so that data prepared then is not prepared again (and every run retrained) after an upgrade."""


def data_result_params(config: dict) -> dict:
    """What the prepared data depends on (the data step's Snakemake params): the dataset keys above,
    and any key added since only when set away from its default (a new key at its default
    re-prepares nothing). In the config's own key order, as they were recorded: Snakemake compares
    the text of params, and the same values in another order would re-prepare the data."""
    from scalelab.config import DatasetConfig

    defaults = {f.name: f.default for f in dataclasses.fields(DatasetConfig)}
    return {key: value for key, value in section(config, "dataset").items()
            if key in DATASET_KEYS_RECORDED_WHOLE or value != defaults.get(key, dataclasses.MISSING)}
