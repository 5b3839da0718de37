"""Pipeline parallelism's formulas: how the blocks split into stages, what each rank holds and sends, and the
bubble its schedule leaves. Torch-free; scalelab.run.pipeline runs what these predict, on
``torch.distributed.pipelining``.

P ranks of one pipeline each hold V consecutive-block chunks ("virtual stages": V = 1 for GPipe and 1F1B, V = 2
for interleaved 1F1B as scalelab runs it; a forecast of another trainer's interleaved schedule gives its own V as
``virtual``), P V chunks in all; chunk c lives on rank c mod P. The embeddings go with chunk 0, the final
norm, the head and the loss with chunk P V - 1. A step's micro-batches m are the data-parallel rank's share of the
global batch in micro-batches (the accumulation steps of the run without pipelining).

* Bubble (Narayanan et al. 2021, with equal chunks and no communication time): each rank idles (P - 1) chunk-times
  of forward and backward while the pipeline fills and drains, against m V chunk-times of work:
  (P - 1) / (V m + P - 1) of the step.
* Activations held: a micro-batch's activations on a chunk live from its forward to its backward. GPipe runs every
  forward first: m per chunk. 1F1B runs P - i forwards on rank i before its first backward, then one backward per
  forward: min(m, P - i). torch's interleaved 1F1B runs (V - 1) r + 2 (P - 1 - i) warm-up forwards (r: micro-batches
  per round), then backward-first pairs: that many plus one chunk-micro-batches, at most m V.
* Point-to-point bytes: at every boundary between chunks, each micro-batch's output activations forward and their
  gradient backward, B x seq_len x d_model values (1/T of the tokens under sequence parallelism) at the residual
  stream's width.
"""
from __future__ import annotations

from dataclasses import dataclass

from scalelab.config import ModelConfig
from scalelab.formulas.communication import comm_dtypes
from scalelab.formulas.rank_step import RankStep
from scalelab.registries.families import family


@dataclass(frozen=True)
class Schedule:
    name: str
    torch_class: str
    """Its class in torch.distributed.pipelining.schedules."""
    chunks_per_rank: int
    """V: consecutive-block chunks per rank (interleaved: 2)."""
    doc: str


SCHEDULES: dict[str, Schedule] = {s.name: s for s in (
    Schedule("gpipe", "ScheduleGPipe", 1, "every micro-batch's forward, then every backward (fill and drain)"),
    Schedule("1f1b", "Schedule1F1B", 1, "P - i warm-up forwards on rank i, then one forward and one backward in turn"),
    Schedule("interleaved_1f1b", "ScheduleInterleaved1F1B", 2,
             "1F1B over two chunks of blocks per rank (chunk c on rank c mod P): a smaller bubble for twice the messages"),
)}
DEFAULT_SCHEDULE = "1f1b"


def schedule(name: str) -> Schedule:
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ValueError(f"pipeline_schedule {name!r}: one of {', '.join(SCHEDULES)}") from None


def chunks_per_rank(schedule_name: str, virtual: int | None = None) -> int:
    """V of a schedule: its record's, or for an interleaved schedule the ``virtual`` chunks per rank a trainer runs
    (Megatron's ``virtual_pipeline_model_parallel_size``; forecasts only: scalelab's runs take the record's 2)."""
    own = schedule(schedule_name).chunks_per_rank
    if virtual is None or own == 1:
        return own
    if virtual < 2:
        raise ValueError(f"{schedule_name} runs at least 2 chunks per rank, got {virtual}")
    return virtual


def chunks(n_layers: int, pp: int, schedule_name: str = DEFAULT_SCHEDULE, virtual: int | None = None) -> list[range]:
    """The blocks of each chunk (P V of them, in model order); ValueError where the blocks do not split evenly."""
    n = pp * chunks_per_rank(schedule_name, virtual)
    if n_layers % n:
        raise ValueError(f"{n_layers} blocks do not split into {n} equal pipeline chunks "
                         f"(pipeline_parallel={pp}, {schedule_name}: {n // pp} per rank)")
    size = n_layers // n
    return [range(c * size, (c + 1) * size) for c in range(n)]


def rank_chunks(pp_rank: int, pp: int, schedule_name: str = DEFAULT_SCHEDULE, virtual: int | None = None) -> list[int]:
    """The chunks pipeline rank i runs: i, i + P, ... (torch's looped placement)."""
    return [pp_rank + k * pp for k in range(chunks_per_rank(schedule_name, virtual))]


SWEEP_REMEDY = "set a smaller sweep.micro_batch or a larger train.global_batch"
"""What a sweep's config can change where a step has too few micro-batches for its pipeline."""


def microbatches_problem(pp: int, m: int, schedule_name: str, remedy: str = SWEEP_REMEDY) -> str | None:
    """Why m micro-batches per step cannot fill this pipeline's schedule, with what the caller's user can change
    (``remedy``); None where they can."""
    if pp == 1:
        return None
    if m < pp:
        return f"{m} micro-batch(es) per step cannot fill {pp} pipeline stages (at least {pp}: {remedy})"
    if schedule(schedule_name).chunks_per_rank > 1:
        rounds = max(1, m // pp)
        if m % rounds:
            return f"{schedule_name} takes a multiple of {rounds} micro-batches per step (got {m}: torch's rounds of {pp})"
    return None


def bubble_fraction(pp: int, m: int, schedule_name: str = DEFAULT_SCHEDULE, virtual: int | None = None) -> float:
    """The share of a step each rank idles: (P - 1) / (V m + P - 1); 0 without pipelining."""
    v = chunks_per_rank(schedule_name, virtual)
    return (pp - 1) / (v * m + pp - 1) if pp > 1 else 0.0


def in_flight(pp_rank: int, pp: int, m: int, schedule_name: str = DEFAULT_SCHEDULE, virtual: int | None = None) -> int:
    """Chunk-micro-batches whose activations rank ``pp_rank`` holds at once, at most (the module doc)."""
    if pp == 1:
        return 1
    if schedule_name == "gpipe":
        return m
    if schedule_name == "1f1b":
        return min(m, pp - pp_rank)
    v = chunks_per_rank(schedule_name, virtual)
    per_round = m // max(1, m // pp)
    warm_up = min((v - 1) * per_round + 2 * (pp - 1 - pp_rank), m * v)
    return min(warm_up + 1, m * v)


def held_block_activations(per_block: float, n_layers: int, pp_rank: int, pp: int, m: int,
                           schedule_name: str = DEFAULT_SCHEDULE, once: float = 0.0, virtual: int | None = None) -> float:
    """The most bytes of block activations rank ``pp_rank`` holds: in-flight chunk-micro-batches x blocks per chunk x
    one block's bytes for one micro-batch (per_block), plus what every block shares once (``once``: the llama
    family's fp32 RoPE tables, saved by every block and micro-batch but one storage)."""
    blocks_per_chunk = len(chunks(n_layers, pp, schedule_name, virtual)[0])
    return in_flight(pp_rank, pp, m, schedule_name, virtual) * blocks_per_chunk * per_block + once


def per_block_and_once(cfg: ModelConfig, micro_batch: int, precision: str, **case) -> tuple[float, float]:
    """(one block's activations for one micro-batch, what all blocks share once) from the families' formula for the
    whole model, L x per block + once, taken at one and two blocks."""
    import dataclasses

    from scalelab.formulas.activation_memory import block_activation_bytes

    one, two = (block_activation_bytes(dataclasses.replace(cfg, n_layers=n), micro_batch, precision, **case) for n in (1, 2))
    return two - one, 2 * one - two


def boundary_values(micro_batch: int, seq_len: int, d_model: int, tensor_parallel: int = 1,
                    sequence_parallel: bool = False) -> int:
    """Values one micro-batch sends across a boundary (each tensor-parallel rank its own copy, 1/T of the tokens
    under sequence parallelism)."""
    tokens = micro_batch * seq_len // (tensor_parallel if sequence_parallel else 1)
    return tokens * d_model


def p2p_bytes(pp_rank: int, pp: int, m: int, boundary_bytes: float, schedule_name: str = DEFAULT_SCHEDULE,
              virtual: int | None = None) -> dict[str, float]:
    """Bytes rank ``pp_rank`` sends and receives per step: {"sent", "received"}. Each of its chunks but the model's
    last sends each micro-batch's activations forward and receives their gradient; each but the first receives the
    activations and sends the gradient back."""
    if pp == 1:
        return {"sent": 0.0, "received": 0.0}
    n = pp * chunks_per_rank(schedule_name, virtual)
    sent = received = 0.0
    for c in rank_chunks(pp_rank, pp, schedule_name, virtual):
        if c < n - 1:  # activations out, their gradient in
            sent += m * boundary_bytes
            received += m * boundary_bytes
        if c > 0:  # activations in, their gradient out
            sent += m * boundary_bytes
            received += m * boundary_bytes
    return {"sent": sent, "received": received}


def outside_parts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters outside the blocks by the chunk that holds them: ``first`` (the embeddings) and ``last`` (the final
    norm and the head: under pipelining a tied head is its own copy on the last rank, its gradient summed with the
    embedding's every step)."""
    record = family(cfg.family)
    head = cfg.vocab_size * cfg.d_model
    outside = record.outside_params(cfg)  # embeddings, final norm, an untied head (a tied one counted once)
    norm = record.norm_params(cfg)
    return {"first": outside - norm - (0 if cfg.tie_embeddings else head), "last": norm + head}


def rank_params(cfg: ModelConfig, block_params: float, pp_rank: int, pp: int,
                schedule_name: str = DEFAULT_SCHEDULE, virtual: int | None = None) -> float:
    """Parameters pipeline rank ``pp_rank`` holds (block_params: one block's, on this rank: its tensor-parallel share),
    its blocks and the parts outside them its chunks hold; the whole model's count without pipelining."""
    if pp == 1:
        return cfg.n_layers * block_params + family(cfg.family).outside_params(cfg)
    parts = outside_parts(cfg)
    all_chunks = chunks(cfg.n_layers, pp, schedule_name, virtual)
    mine = rank_chunks(pp_rank, pp, schedule_name, virtual)
    held = sum(len(all_chunks[c]) for c in mine) * block_params
    held += parts["first"] if 0 in mine else 0
    held += parts["last"] if len(all_chunks) - 1 in mine else 0
    return held


def tied_sync_bytes(cfg: ModelConfig, pp: int, pp_rank: int, sharded_over: int = 1) -> float:
    """Bytes of the all-reduce that sums a tied embedding's gradient with its head copy's (fp32; this rank's shard
    where FSDP2 shards it over ``sharded_over`` data-parallel ranks: dim 0's rows, the first rank's ceil(V / N)), per
    step, on the first and the last pipeline rank; counted as the collectives are (an all-reduce of S bytes, 2 S)."""
    if pp == 1 or not cfg.tie_embeddings or pp_rank not in (0, pp - 1):
        return 0.0
    rows = -(-cfg.vocab_size // sharded_over)
    return 2 * 4 * rows * cfg.d_model


TIMELINE_FILE = "pipeline_timeline.json"
"""In a pipeline run's folder: every stage's forward and backward intervals in its last timed step (the report's
per-stage timeline; scalelab.run.pipeline.timeline_record)."""
MEASURED_COLUMNS = ("pipeline_microbatches", "comm_pipeline_bytes_per_step_measured",
                    "comm_pipeline_bytes_per_step_measured_per_stage", "comm_pipeline_tied_bytes_per_step_measured",
                    "bubble_fraction_measured", "bubble_fraction_measured_per_stage", "bubble_fraction_stage_times",
                    "pipeline_activation_bytes_measured_per_stage")
"""The worker's measured pipeline columns (scalelab.run.pipeline.measured_columns): null without a pipeline."""
PREDICTED_COLUMNS = ("comm_pipeline_bytes_per_step_predicted", "comm_pipeline_bytes_per_step_predicted_per_stage",
                     "comm_pipeline_tied_bytes_per_step_predicted", "bubble_fraction_predicted",
                     "pipeline_activation_bytes_predicted_per_stage")


def residual_width(precision: str, zero_stage: int) -> int:
    """Bytes of a value of the residual stream a stage sends: fp32 under autocast over fp32 parameters, the compute
    width where FSDP2 gathers 16-bit parameters (stages 2 and 3, bf16)."""
    from scalelab.formulas.activation_memory import DTYPE_BYTES
    from scalelab.formulas.communication import sixteen_bit_params

    return DTYPE_BYTES[precision] if sixteen_bit_params(precision, zero_stage) else 4


def predicted_columns(cfg: ModelConfig, step: RankStep, pp: int, schedule_name: str) -> dict:
    """The pipeline's predicted columns of a run (null without a pipeline) whose ranks run ``step`` (its
    accumulation_steps: the schedule's micro-batches): rank 0's point-to-point bytes per step and each stage's, rank
    0's tied-embedding sum, the schedule's bubble, and each stage's most block activations held (null under
    activation checkpointing: the measurement does not see a checkpointed block's input)."""
    if pp == 1:
        return dict.fromkeys(PREDICTED_COLUMNS)
    m, zero_stage = step.accumulation_steps, step.zero_stage
    boundary = boundary_values(step.micro_batch, cfg.seq_len, cfg.d_model, step.tensor_parallel,
                               step.sequence_parallel) * residual_width(step.precision, zero_stage)
    per_stage = [sum(p2p_bytes(k, pp, m, boundary, schedule_name).values()) for k in range(pp)]
    per_block, once = per_block_and_once(cfg, step.micro_batch, step.precision,
                                         activation_checkpointing=step.activation_checkpointing, **step.activation_levers)
    held = None if step.activation_checkpointing else [
        held_block_activations(per_block, cfg.n_layers, k, pp, m, schedule_name, once) for k in range(pp)]
    return {"comm_pipeline_bytes_per_step_predicted": per_stage[0],
            "comm_pipeline_bytes_per_step_predicted_per_stage": per_stage,
            "comm_pipeline_tied_bytes_per_step_predicted": tied_sync_bytes(
                cfg, pp, 0, step.data_parallel // step.replicas if zero_stage in (2, 3) else 1),
            "bubble_fraction_predicted": bubble_fraction(pp, m, schedule_name),
            "pipeline_activation_bytes_predicted_per_stage": held}


MAX_ACTIVE_CHUNKS = 3
"""The chunks of one rank torch's multi-chunk schedules keep gathered at once (``_add_unshard_reshard``'s
max_active_stages, the lowering ``_PipelineScheduleRuntime`` gives the interleaved schedule): with at most this many
chunks per rank none is resharded between its first action of a step and its last."""


def sharded_modelled(schedule_name: str, virtual: int | None = None) -> bool:
    """Whether sharded_comm_bytes models FSDP2 under this schedule: V chunks per rank, at most MAX_ACTIVE_CHUNKS."""
    return chunks_per_rank(schedule_name, virtual) <= MAX_ACTIVE_CHUNKS


def _gathered(stage_params: float, kept: float, m: int, zero_stage: int) -> float:
    """The parameters one pipeline rank's FSDP2 gathers per step (sharded_comm_bytes' passes)."""
    return stage_params if zero_stage == 2 else stage_params + m * (stage_params - kept)


def sharded_comm_bytes(stage_params: float, kept: float, step: RankStep, schedule_name: str = DEFAULT_SCHEDULE,
                       virtual: int | None = None) -> dict[str, float] | None:
    """FSDP2's bytes per step on one pipeline rank running ``step`` (stages 2 and 3; an all-gather counts its output,
    a reduce-scatter its input, an all-reduce of S bytes 2 S), by group: {"shard": over its shard group (the step's
    data_parallel ranks over its replicas), "replicate": across hybrid sharding's replicas}, each element at the width
    of the step's dtypes (scalelab.formulas.communication.comm_dtypes). Each of the rank's chunks is its own FSDP2
    root, which the schedule leaves to FSDP2's hooks from its first action of the step to its last: GPipe and 1F1B
    neither gather nor reshard it themselves; the interleaved schedule's lowering gathers each chunk whole before its
    first action and reshards it after its last, and no sooner while V is at most MAX_ACTIVE_CHUNKS. The hooks: stage 2
    keeps everything gathered; stage 3 reshards all but the chunk's last block after each forward (``kept``: those last
    blocks' parameters, one per chunk, as the worker counts them) and the chunk's next forward or backward gathers them
    again, while a backward leaves them gathered until the gradients are reduced, once, after the chunk's last
    backward. Each of a chunk's m forwards (the step's accumulation_steps) is followed by another of its actions, so
    stage 3 gathers the rank's parameters whole once and all but the kept blocks m more times, in any order of the
    forwards and backwards. A shard group of one rank moves nothing; hybrid sharding then all-reduces each reduced
    shard across the replicas. None for more than MAX_ACTIVE_CHUNKS chunks per rank (a forecast's ``virtual``), which
    torch reshards and gathers again mid-step (not run, not modelled)."""
    by_collective = sharded_comm_by_collective(stage_params, kept, step, schedule_name, virtual)
    if by_collective is None:
        return None
    reduce_bytes = comm_dtypes(step.precision, step.zero_stage, step.grad_reduce).reduce_bytes
    return {"shard": float(sum(by_collective.values())),
            "replicate": 0.0 if step.replicas == 1 else 2 * stage_params / _shard(step) * reduce_bytes}


def _shard(step: RankStep) -> int:
    """The ranks of a step's shard group: its data-parallel ranks over hybrid sharding's replicas."""
    return step.data_parallel // step.replicas


def sharded_comm_by_collective(stage_params: float, kept: float, step: RankStep, schedule_name: str = DEFAULT_SCHEDULE,
                               virtual: int | None = None) -> dict[str, float] | None:
    """sharded_comm_bytes' shard group by collective, in its unit: {"all_gather": the gathered parameters,
    "reduce_scatter": the gradients reduced once} (none for a shard group of one rank); their sum is
    sharded_comm_bytes' "shard" figure. A forecast times each collective on its own, so it needs them apart. None
    where sharded_comm_bytes is."""
    if not sharded_modelled(schedule_name, virtual):
        return None
    if _shard(step) == 1:
        return {}
    dtypes = comm_dtypes(step.precision, step.zero_stage, step.grad_reduce)
    return {"all_gather": _gathered(stage_params, kept, step.accumulation_steps, step.zero_stage) * dtypes.gather_bytes,
            "reduce_scatter": stage_params * dtypes.reduce_bytes}


def sharded_gather_calls(stage_units: int, m: int, zero_stage: int, chunks_held: int = 1) -> int:
    """FSDP2's all-gathers per step on one pipeline rank (sharded_comm_bytes' passes) of ``stage_units`` units (each
    block, and each chunk's root where it holds parameters: the embeddings' or the head's) over ``chunks_held``
    chunks (V): stage 2 gathers each unit once; stage 3 every unit once, then all but each chunk's kept last block
    for each of the m further passes."""
    return stage_units if zero_stage == 2 else stage_units + m * (stage_units - chunks_held)
