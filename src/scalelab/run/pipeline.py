"""Pipeline parallelism (``sweep.pipeline_parallel``): the model's blocks split into stages over P ranks, each step's
micro-batches passed through them by a schedule of ``torch.distributed.pipelining`` (PipelineStage, ScheduleGPipe,
Schedule1F1B, ScheduleInterleaved1F1B), as torchtitan runs it.

The mesh is (pp, dp[, tp]): pipeline stages outermost, tensor-parallel ranks innermost (consecutive ranks: one
node), so rank = (pp_rank x DP + dp_rank) x T + tp_rank. Every rank builds the whole model from the run's seed (the
weights of the run without pipelining) and keeps its chunks' parts (scalelab.formulas.pipeline.chunks): its blocks,
under their whole-model names (scalelab.run.model.StageBlocks), the embeddings on the first chunk, the final norm and
the head on the last. A tied head is the last chunk's own copy of the embedding; the two gradients are summed every
step over the tied group (first and last pipeline rank of one data- and tensor-parallel coordinate), so both copies
step alike, and the gradient norm counts it once.

Each chunk is split by tensor parallelism, then wrapped for data parallelism over the dp sub-mesh
(scalelab.run.parallel.data_parallel_wrap: FSDP2 at stages 2 and 3, its replicate at stage 0), and handed to a
PipelineStage; torch's schedule drives FSDP2's gradient sync (only the last micro-batch's backward reduces) and
divides the gradients by the micro-batches (scale_grads), as the run without pipelining divides each loss.

What a step measures, besides the step time: the bytes each rank's stages send and receive (the ops torch's stages
hand to batch_isend_irecv: activations forward, their gradients backward), each chunk's forward and backward
intervals (the timeline: the bubble is the share of the pipeline's time a rank computed nothing), and, on the
measured step, the most bytes of block activations the rank held at once (scalelab.run.activations.LiveSavedBytes):
the schedule's in-flight micro-batches times a micro-batch's.
"""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

from scalelab.formulas.pipeline import chunks as chunk_blocks
from scalelab.formulas.pipeline import rank_chunks
from scalelab.formulas.pipeline import schedule as schedule_record
from scalelab.run.model import StageBlocks


def build_mesh(device_type: str, world_size: int, pp: int, tp: int, replicas: int = 1):
    """The run's (pp, dp[, tp]) mesh; under hybrid sharding (replicas R > 1) (pp, dp_replicate, dp_shard[, tp]), the
    data-parallel ranks of a stage R replicas of consecutive shard groups, as hybrid sharding lays them out without a
    pipeline (scalelab.registries.strategies.HYBRID)."""
    from scalelab.registries.strategies import HYBRID

    dp = world_size // (pp * tp)
    data = (("dp", dp),) if replicas == 1 else tuple(zip(HYBRID.mesh_dims, (replicas, dp // replicas), strict=True))
    dims = (("pp", pp), *data, *((("tp", tp),) if tp > 1 else ()))
    return init_device_mesh(device_type, tuple(n for _, n in dims), mesh_dim_names=tuple(name for name, _ in dims))


def data_parallel_mesh(mesh):
    """A stage's data-parallel sub-mesh: 1-D, or hybrid sharding's (replicate, shard)."""
    from scalelab.registries.strategies import HYBRID

    return mesh[HYBRID.mesh_dims] if HYBRID.mesh_dims[0] in mesh.mesh_dim_names else mesh["dp"]


def chunk_modules(model: nn.Module, pp_rank: int, pp: int, schedule_name: str) -> list[tuple[int, nn.Module]]:
    """This rank's chunks of a whole model: (chunk index, module holding only its parts), sharing the model's
    parameters (nothing copied); the parts it does not hold are None (the families' forwards skip them). Each chunk
    has registries of its own (its modules, parameters, buffers and every hook dict): a hook one chunk gets, FSDP2's
    root hooks under interleaving's two chunks a rank, must not run in the other chunk's passes, where it gathered
    that chunk's root parameters again and resharded its groups early. (A hook put on the whole model before this
    split is copied into each chunk, where its handle no longer removes it: chunks are made right after the model.)"""
    all_chunks = chunk_blocks(model.cfg.n_layers, pp, schedule_name)
    out = []
    for c in rank_chunks(pp_rank, pp, schedule_name):
        part = nn.Module.__new__(type(model))
        own = {k: copy.copy(v) for k, v in model.__dict__.items() if isinstance(v, (dict, set))}
        part.__dict__ = {**model.__dict__, **own}
        part.blocks = StageBlocks({str(i): model.blocks[i] for i in all_chunks[c]})
        if c > 0:
            for name in type(model).FIRST_STAGE_PARTS:
                setattr(part, name, None)
        if c < len(all_chunks) - 1:
            for name in type(model).LAST_STAGE_PARTS:
                setattr(part, name, None)
        out.append((c, part))
    return out


@dataclass
class Pipeline:
    """One rank's part of the pipeline, and what it measures."""
    schedule: object
    stages: list
    pp_rank: int
    pp_size: int
    has_first: bool
    has_last: bool
    group: dist.ProcessGroup
    tied: tuple | None = None  # (this rank's copy of a tied embedding, the tied group) on the first and last rank
    scaler: object = None  # fp16's loss scaler (ShardedGradScaler: one inf check over every stage), set by the worker
    counting: bool = False
    p2p: dict = field(default_factory=lambda: {"sent": 0, "received": 0})
    tied_bytes: float = 0.0
    timeline: list = field(default_factory=list)  # this step's (kind, chunk, micro-batch, start, end), seconds
    step_start: float = 0.0
    step_start_unix: float = 0.0  # the same moment on the machine's clock: the stages' timelines share it
    pipeline_s: float = 0.0  # this step's schedule time (every micro-batch's forward and backward)

    def busy_share(self) -> float:
        """The share of this step's pipeline time the rank computed: 1 - its bubble."""
        busy = sum(end - start for _, _, _, start, end in self.timeline)
        return busy / self.pipeline_s if self.pipeline_s else 0.0


def build(chunks: list[tuple[int, nn.Module]], pp_mesh, device: torch.device, schedule_name: str, n_microbatches: int,
          loss_fn, precision_context) -> Pipeline:
    """PipelineStages for this rank's (wrapped) chunks and the schedule over them, with counting and timing
    wrapped around each stage's sends, receives, forwards and backwards."""
    from torch.distributed.pipelining import PipelineStage, schedules

    record = schedule_record(schedule_name)
    pp, pp_rank = pp_mesh.size(), pp_mesh.get_local_rank()
    n_chunks = pp * record.chunks_per_rank
    group = pp_mesh.get_group()
    stages = [PipelineStage(module, c, n_chunks, device, group=group) for c, module in chunks]
    pipe = Pipeline(schedule=None, stages=stages, pp_rank=pp_rank, pp_size=pp, has_first=chunks[0][0] == 0,
                    has_last=chunks[-1][0] == n_chunks - 1, group=group)
    for stage in stages:
        _instrument(stage, pipe, precision_context)
    cls = getattr(schedules, record.torch_class)
    pipe.schedule = cls(stages if record.chunks_per_rank > 1 else stages[0], n_microbatches=n_microbatches,
                        loss_fn=loss_fn, scale_grads=True)
    return pipe


def _instrument(stage, pipe: Pipeline, precision_context) -> None:
    """Count what the stage's point-to-point ops carry and time its computations (autocast around each forward,
    as the run without pipelining enters it per micro-batch)."""
    def counted(method, key):
        def wrapper(*args, **kwargs):
            ops = method(*args, **kwargs)
            if pipe.counting:
                pipe.p2p[key] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
            return ops
        return wrapper

    def timed(method, kind, autocast: bool):
        def wrapper(chunk_id, *args, **kwargs):
            start = time.perf_counter()
            with precision_context() if autocast else contextlib.nullcontext():
                out = method(chunk_id, *args, **kwargs)
            if stage.device.type == "cuda":
                torch.cuda.synchronize(stage.device)  # the interval ends when its kernels do
            pipe.timeline.append((kind, stage.stage_index, chunk_id, start - pipe.step_start,
                                  time.perf_counter() - pipe.step_start))
            return out
        return wrapper

    for name, key in (("get_fwd_send_ops", "sent"), ("get_bwd_send_ops", "sent"),
                      ("get_fwd_recv_ops", "received"), ("get_bwd_recv_ops", "received")):
        setattr(stage, name, counted(getattr(stage, name), key))
    stage.forward_one_chunk = timed(stage.forward_one_chunk, "F", autocast=True)
    stage.backward_one_chunk = timed(stage.backward_one_chunk, "B", autocast=False)


def tie(pipe: Pipeline, chunks: list[tuple[int, nn.Module]], mesh) -> frozenset:
    """Sum a tied head's gradient with its embedding's every step (first and last pipeline rank of each data- and
    tensor-parallel coordinate: every rank creates every such group, as new_group asks); returns the ids of the
    parameters the gradient norm leaves out (the last rank's copy)."""
    ranks = mesh.mesh.reshape(mesh.mesh.shape[0], -1)  # (pp, dp x tp)
    mine = None
    for column in range(ranks.shape[1]):
        pair = sorted({int(ranks[0, column]), int(ranks[-1, column])})
        group = dist.new_group(pair)
        if dist.get_rank() in pair:
            mine = group
    first = next((m for c, m in chunks if c == 0), None)
    last = next((m for c, m in chunks if m.head is not None), None) if pipe.has_last else None
    if first is not None:
        pipe.tied = (first.wte.weight, mine)
    if last is not None:
        pipe.tied = (last.head.weight, mine)
        return frozenset({id(last.head.weight)})
    return frozenset()


def sync_tied(pipe: Pipeline) -> None:
    """The tied embedding's and head's gradients summed on both ranks (fp32, this rank's shard)."""
    if pipe.tied is None:
        return
    param, group = pipe.tied
    grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
    dist.distributed_c10d.all_reduce(grad, group=group)
    if pipe.counting:
        pipe.tied_bytes += 2 * grad.numel() * grad.element_size()


def ddp_unarmed(pipe: Pipeline) -> contextlib.ExitStack:
    """DDP's no_sync over a whole step of the schedule, for each stage DDP wraps (ZeRO-1): the schedule arms DDP's
    reducer itself before a stage's last backward, and nothing else may. torch 2.13's schedule runs its forwards under
    no_sync, but not the first step's shape inference, a forward with gradients enabled that arms the reducer and a
    backward to the stage's inputs alone that leaves it armed: the first micro-batch's backward then all-reduced its
    gradients ahead of the last one's. So the first step of every attempt rounded otherwise (a resumed run's first
    step differed from the uninterrupted run's in the last bits, and counted the extra all-reduce in its measured
    bytes), and a rank holding two chunks saw each parameter ready twice, failing DDP's bucket rebuild."""
    stack = contextlib.ExitStack()
    for stage in pipe.stages:
        if isinstance(stage.submod, nn.parallel.DistributedDataParallel):
            stack.enter_context(stage.submod.no_sync())
    return stack


def step(pipe: Pipeline, tokens: torch.Tensor) -> torch.Tensor:
    """One step's forwards and backwards over this rank's stages; the sum of its micro-batches' losses on the ranks
    holding the last chunk (zero on the others)."""
    pipe.timeline = []
    pipe.step_start, pipe.step_start_unix = time.perf_counter(), time.time()
    losses: list[torch.Tensor] = []
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    with ddp_unarmed(pipe):
        if pipe.has_first:
            pipe.schedule.step(inputs, target=targets, losses=losses, return_outputs=False)
        else:
            pipe.schedule.step(target=targets, losses=losses, return_outputs=False)
    pipe.pipeline_s = time.perf_counter() - pipe.step_start
    sync_tied(pipe)
    if losses:
        total = torch.stack([loss.detach().float() for loss in losses]).sum()
        return total / pipe.scaler._get_scale_async() if pipe.scaler is not None else total  # the loss as computed
    return torch.zeros((), device=tokens.device)


def parallelize(chunks: list[tuple[int, nn.Module]], mesh, plan, device: torch.device, param_dtype, reduce_dtype,
                precision_context):
    """This rank's chunks wrapped for data parallelism over the dp sub-mesh, one optimizer over them all, and the
    pipeline that runs them: (Parallelized, Pipeline)."""
    from scalelab.run.parallel import Parallelized, _adamw_kwargs, _ddp, data_parallel_wrap, param_groups, zero1_optimizer

    point, train = plan.point, plan.train
    holder = chunks[0][1] if len(chunks) == 1 else nn.ModuleList(chunk for _, chunk in chunks)
    if point.zero_stage == 1:  # DDP per chunk over the stage's data-parallel ranks (torch's schedules drive its sync)
        group = mesh["dp"].get_group()
        staged = [(c, _ddp(chunk, device, point.bucket_mb, reduce_dtype, group)) for c, chunk in chunks]
        opt = zero1_optimizer(holder, train.lr, train.weight_decay, group)
    else:
        for _, chunk in chunks:
            data_parallel_wrap(chunk, point.zero_stage, param_dtype, reduce_dtype, data_parallel_mesh(mesh))
        staged = chunks
        opt = torch.optim.AdamW(param_groups(holder, train.weight_decay), **_adamw_kwargs(train.lr))
    last = chunks[-1][1]

    def loss_fn(logits, targets):  # the model's loss (a compiled one under compile), under the run's autocast,
        with precision_context():  # scaled where fp16 scales it: torch's schedule runs the backward of what it returns
            loss = last.loss_fn(logits, targets)
        return pipe.scaler.scale(loss) if pipe.scaler is not None else loss

    pipe = build(staged, mesh["pp"], device, point.pipeline_schedule, plan.accumulation_steps, loss_fn, precision_context)
    excluded = tie(pipe, chunks, mesh) if plan.model.tie_embeddings else frozenset()
    par = Parallelized(holder, opt, lambda last_micro_batch: contextlib.nullcontext(), tensor_parallel=point.tensor_parallel,
                       pipeline_group=pipe.group, norm_excluded=excluded)
    return par, pipe


def rank_figures(pipe: Pipeline, busy: list[float], held: int | None, timeline: list, timeline_start: float) -> dict:
    """What one rank measured of its stages over the run (gathered to rank 0); ``timeline_start``: the unix time its
    timeline's step started (the stages' clocks are one machine's, or NTP's across nodes)."""
    import statistics

    return {"pp_rank": pipe.pp_rank, "sent": pipe.p2p["sent"], "received": pipe.p2p["received"],
            "tied": pipe.tied_bytes, "busy": statistics.median(busy) if busy else None, "held": held,
            "timeline": timeline, "timeline_start": timeline_start}


def measured_columns(stages: list[dict], n_measured: int) -> dict:
    """The measured columns of one pipeline (its ranks' figures, stage order); bytes per measured step."""
    per_stage = [(f["sent"] + f["received"]) / n_measured for f in stages]
    bubbles = [1 - f["busy"] for f in stages if f["busy"] is not None]
    return {"bubble_fraction_stage_times": stage_time_bubble(stages), "comm_pipeline_bytes_per_step_measured": per_stage[0],
            "comm_pipeline_bytes_per_step_measured_per_stage": per_stage,
            "comm_pipeline_tied_bytes_per_step_measured": stages[0]["tied"] / n_measured,
            "bubble_fraction_measured": sum(bubbles) / len(bubbles) if bubbles else None,
            "bubble_fraction_measured_per_stage": [1 - f["busy"] if f["busy"] is not None else None for f in stages],
            "pipeline_activation_bytes_measured_per_stage": [f["held"] for f in stages]}


def stage_time_bubble(stages: list[dict]) -> float | None:
    """The bubble these stages would leave with free sends, from their own compute in the timed step the timeline
    holds: each rank's time per chunk-micro-batch t (its forwards' and backwards' time over their count), the schedule
    then lasting (V m - 1) max t + sum of t (the slowest rank sets the steady state, every rank's time fills and
    drains the pipeline; (V m + P - 1) t for equal stages, the formula's), and each rank idle for what its own work
    leaves of that; their mean. Between it and the measured bubble: the sends and the schedule's own work."""
    per_rank = []
    for f in stages:
        intervals = f["timeline"]
        if not intervals:
            return None
        busy = sum(end - start for _, _, _, start, end in intervals)
        per_rank.append((busy, busy / (len(intervals) / 2)))  # one forward and one backward per chunk-micro-batch
    chunk_micro_batches = len(stages[0]["timeline"]) / 2
    span = (chunk_micro_batches - 1) * max(t for _, t in per_rank) + sum(t for _, t in per_rank)
    return sum(1 - busy / span for busy, _ in per_rank) / len(per_rank)


def timeline_record(stages: list[dict], schedule_name: str, n_microbatches: int) -> dict:
    """The timeline file: each stage's intervals in seconds from the earliest stage's start of the step (rank 0's
    pipeline steps together: the stages' timed steps are one step)."""
    first = min(f.get("timeline_start", 0.0) for f in stages)
    return {"schedule": schedule_name, "microbatches": n_microbatches,
            "stages": [{"pp_rank": f["pp_rank"], "intervals": [
                {"kind": kind, "chunk": chunk, "microbatch": mb, "start_s": start + shift, "end_s": end + shift}
                for kind, chunk, mb, start, end in f["timeline"]]}
                for f in stages for shift in [f.get("timeline_start", 0.0) - first]]}


def whole_state(pipe: Pipeline, degree: int, sends: bool) -> dict[str, torch.Tensor] | None:
    """The whole model's parameters on rank 0 (None elsewhere): every rank gathers its chunks' DTensors (a collective
    over its meshes), and one rank per stage (``sends``: data- and tensor-parallel index 0) hands its chunks' to
    rank 0, under their whole-model names."""
    from scalelab.run.tensor_parallel import full_state

    mine: dict[str, torch.Tensor] = {}
    for stage in pipe.stages:
        mine.update(full_state(stage.submod, degree))
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine if sends else None, parts, dst=0)
    if parts is None:
        return None
    return {name: tensor for part in parts if part for name, tensor in part.items()}
