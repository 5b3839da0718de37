"""The step-time model under pipeline parallelism (predict_point's row for a pipelined point): P stages of consecutive
blocks (scalelab.formulas.pipeline), each timed, sized and sent from as the schedule runs it, with the strategy over
each stage's data-parallel ranks (scalelab.forecast.step).
"""
from __future__ import annotations

import math
from dataclasses import replace

from scalelab.forecast.inputs import UNITS, EstimateError
from scalelab.forecast.step import (
    _strategy_comm,
    _tensor_parallel_step,
    batch_plan,
    fits_memory,
    groups_link,
    point_step,
)
from scalelab.formulas import activation_memory, flops, links, megatron_style, peak_memory, pipeline, tensor_parallelism
from scalelab.registries.families import tensor_parallel_split_params
from scalelab.registries.strategies import HYBRID_KEY, ZERO1_SHARDED_KEY, strategy

# The mesh is (pp, dp, tp), tensor-parallel ranks innermost: a stage is DP x TP consecutive ranks, so consecutive
# stages sit on different nodes once DP x TP reaches the GPUs of a node. A step, as priced here:
#
# * compute: each stage computes its blocks' share of the data-parallel rank's tokens (the last stage the head too,
#   the first the embedding's lookup, no FLOPs), with its tensor-parallel all-reduces (on the critical path, as without
#   pipelining); the slowest stage paces the pipeline, and the schedule's bubble stretches it: pipelined = slowest /
#   (1 - bubble), bubble = (P - 1) / (V m + P - 1) (scalelab.formulas.pipeline.bubble_fraction, equal chunks, the
#   slowest one's time for every chunk);
# * point-to-point: each micro-batch's boundary activations forward and their gradient back (B x seq x d_model values at
#   the compute dtype's width: 2 bytes in bf16), on the link between consecutive stages (within a node, or one NIC each
#   across nodes), for the rank that sends the most; counted exposed (sends and receives wait on each other in 1F1B's
#   steady state: no overlap is assumed), latency per message;
# * the strategy's collectives over each stage's DP ranks on that stage's parameters (the largest stage's: first or last,
#   which hold the embedding and the head), with the strategy's overlap against the slowest stage's compute (a gradient
#   sync against its last micro-batch's backward alone: nanotron's 1F1B and torch's schedules sync there); FSDP2
#   (stages 2 and 3) as a pipelined run gathers and reduces (scalelab.formulas.pipeline.sharded_comm_bytes, what the
#   gloo runs measure: stage 2 gathers once a step, stage 3 once whole and then m times all but each chunk's kept
#   last block, the gradients reduced once; under an interleaved schedule of more than 3 chunks per rank, whose chunks
#   torch reshards mid-step, priced as the other strategies), not as gradient accumulation would (a gather per
#   micro-batch's forward and backward);
# * a tied embedding's gradient all-reduced between the first and the last stage (tied_sync_bytes), exposed;
# * memory per stage: its parameters (rank_params, the strategy's sharding over the DP ranks), its in-flight
#   micro-batches' block activations (in_flight: 1F1B's first stage holds the most, GPipe all m), and on the last stage
#   what the loss path holds.


def _flag_text(text: str) -> str:
    """A formula's message (written for the config's keys) in the command line's flags."""
    return (text.replace("sweep.micro_batch", "--micro-batch").replace("train.global_batch", "--global-batch")
            .replace("pipeline_parallel=", "--pipeline-parallel "))


def pipeline_problem(cfg, pp: int, schedule_name: str, microbatches: int | None = None,
                     virtual: int | None = None, remedy: str = pipeline.SWEEP_REMEDY) -> str | None:
    """Why this model cannot be pipelined P ways under the schedule (``virtual``: an interleaved schedule's chunks per
    rank, None: the schedule's own) with ``microbatches`` per step (None: the micro-batches unchecked; too few: what
    the caller's user can change, ``remedy``), in one line naming the flag; None where it can."""
    if pp == 1:
        return None
    if schedule_name not in pipeline.SCHEDULES:
        return f"--schedule {schedule_name}: one of {', '.join(pipeline.SCHEDULES)}"
    if cfg is None or cfg.module:
        return "--pipeline-parallel needs a family's shape (--model NAME or the shape flags): its stages are the blocks"
    try:
        pipeline.chunks(cfg.n_layers, pp, schedule_name, virtual)
    except ValueError as err:
        return f"--pipeline-parallel {pp}: {_flag_text(str(err))}"
    if microbatches is not None:
        why = pipeline.microbatches_problem(pp, microbatches, schedule_name, remedy)
        if why:
            return f"--pipeline-parallel {pp} --schedule {schedule_name}: {_flag_text(why)}"
    return None


def _block_params(cfg, t: int) -> float:
    """One block's parameters on one GPU: its tensor-parallel share of the split linears."""
    block = float(flops.block_param_count(cfg))
    return block - tensor_parallel_split_params(cfg) * (1 - 1 / t) if t > 1 else block


def stage_params(point, rank: int) -> float:
    """Parameters pipeline rank ``rank`` holds on one GPU (rank_params with the blocks' tensor-parallel share; the
    megatron trainer splits the embedding and the head over the vocabulary too)."""
    cfg, t, pp, sched = point.cfg, point.tensor_parallel, point.pipeline_parallel, point.pipeline_schedule
    v = point.chunks_per_rank
    held = pipeline.rank_params(cfg, _block_params(cfg, t), rank, pp, sched, v)
    if point.megatron and t > 1:
        mine, last = pipeline.rank_chunks(rank, pp, sched, v), pp * pipeline.chunks_per_rank(sched, v) - 1
        held -= cfg.vocab_size * cfg.d_model * (1 - 1 / t) * ((0 in mine) + (last in mine))
    return held


def _stage_memory(point, rank: int, blocks: int, last: bool, n_local: float, step) -> dict:
    """Bytes at the step's peak on pipeline rank ``rank``: model state and gathers as without pipelining, the in-flight
    micro-batches' block activations, and on the last stage the head's and the loss's; ``step``: what each GPU runs
    (point_step)."""
    cfg, pp, sched = point.cfg, point.pipeline_parallel, point.pipeline_schedule
    dp, micro, m = step.data_parallel, step.micro_batch, step.accumulation_steps
    mine = replace(cfg, n_layers=blocks)
    if point.megatron:
        def acts(k: int) -> float:
            return megatron_style.activation_bytes(replace(cfg, n_layers=k), step)
        per_block = acts(2) - acts(1)
        outside = acts(1) - per_block
        optimizer = megatron_style.STATE_BYTES["optimizer"] * n_local / (dp if step.zero_stage == 1 else 1)
        state = (megatron_style.STATE_BYTES["params"] + megatron_style.STATE_BYTES["grads"]) * n_local + optimizer
        held = pipeline.held_block_activations(per_block, cfg.n_layers, rank, pp, m, sched, virtual=point.chunks_per_rank)
        held += outside if last else 0.0
        return {"model_state": state, "activations": held, "total": state + held}
    peak = peak_memory.peak_memory(mine, n_local, step)
    # the blocks' share of the same step's activations (on the GPU planned for, as the peak's)
    block_acts = activation_memory.block_activation_bytes(mine, micro, point.precision, step.activation_checkpointing,
                                                          **step.activation_levers)
    outside = peak.activations - block_acts  # outside the blocks and the loss path: the last stage's
    held = pipeline.held_block_activations(block_acts / blocks, cfg.n_layers, rank, pp, m, sched,
                                           virtual=point.chunks_per_rank) + (outside if last else 0.0)
    at_peak = replace(peak, activations=held)
    return {"model_state": at_peak.model_state, "activations": held, "total": at_peak.total}


def _send_seconds(sent: float, boundary: float, link: links.Link) -> float:
    """A rank's sends in a step: a latency per message and the bytes at the link's achievable bandwidth."""
    return (sent / boundary) * link.latency_s + sent / link.achievable_Bps if sent else 0.0


def _stage(point, machine, n: int, rank: int, all_chunks, step, boundary: float, p2p_link) -> dict:
    """One pipeline rank's blocks, compute, tensor-parallel time, sends and memory in a step; ``step``: what each GPU
    runs (point_step)."""
    cfg, t, pp, sched = point.cfg, point.tensor_parallel, point.pipeline_parallel, point.pipeline_schedule
    micro, m = step.micro_batch, step.accumulation_steps
    fpt = flops.flops_per_token(cfg)
    hardware_fpt = fpt + (flops.recompute_flops_per_token(cfg) if point.activation_checkpointing else 0.0)
    head = 6 * cfg.vocab_size * cfg.d_model
    tokens_dp = micro * m * cfg.seq_len  # one data-parallel rank's tokens per step, worked on by its T x P GPUs
    rate = machine.peak_flops * machine.mfu
    mine = pipeline.rank_chunks(rank, pp, sched, point.chunks_per_rank)
    blocks = sum(len(all_chunks[c]) for c in mine)
    last = len(all_chunks) - 1 in mine
    per_token = (hardware_fpt - head) * blocks / cfg.n_layers / t + (head / (t if point.megatron else 1) if last else 0.0)
    stage_cfg = replace(cfg, n_layers=blocks)
    blocks_s = (hardware_fpt - head) * blocks / cfg.n_layers / t * tokens_dp / rate
    tp = _tensor_parallel_step(replace(point, cfg=stage_cfg), machine, n, step, blocks_s)
    sent = pipeline.p2p_bytes(rank, pp, m, boundary, sched, point.chunks_per_rank)
    n_local = stage_params(point, rank)
    memory = _stage_memory(point, rank, blocks, last, n_local, step)
    return {"rank": rank, "blocks": blocks, "holds": list(mine), "params": n_local,
            "compute_s": per_token * tokens_dp / rate, "tensor_parallel_s": tp["exposed_s"], "tp": tp,
            "p2p_sent_bytes": sent["sent"], "p2p_received_bytes": sent["received"],
            "p2p_s": _send_seconds(max(sent["sent"], sent["received"]), boundary, p2p_link),
            "in_flight": pipeline.in_flight(rank, pp, m, sched, point.chunks_per_rank),
            "peak_memory_bytes": memory["total"], "activations_bytes": memory["activations"], "cfg": stage_cfg,
            "recompute_flops_per_token": hardware_fpt - fpt}


def _plan(point, n: int) -> tuple[int, int, int]:
    """(data-parallel ranks, micro-batch, micro-batches per step) of a pipelined point, or EstimateError naming the flag
    where it cannot be pipelined at n GPUs."""
    cfg, key, t, pp, sched = point.cfg, point.key, point.tensor_parallel, point.pipeline_parallel, point.pipeline_schedule
    if key == HYBRID_KEY:
        raise EstimateError("--pipeline-parallel with hybrid sharding is not predicted: give a ZeRO stage")
    if n % (t * pp):
        raise EstimateError(f"--pipeline-parallel {pp} x --tensor-parallel {t} does not divide {n} GPUs")
    why = pipeline_problem(cfg, pp, sched, virtual=point.chunks_per_rank)
    if why:
        raise EstimateError(why)
    dp = n // (t * pp)
    micro, m = batch_plan(point.global_batch, point.micro_batch, dp)
    why = pipeline_problem(cfg, pp, sched, m, point.chunks_per_rank)
    if why:
        raise EstimateError(why + ("" if point.global_batch else "; give --global-batch: a step's micro-batches are "
                                                                    "each data-parallel rank's share of it"))
    return dp, micro, m


def _p2p_link(point, machine, n: int, slab: int) -> links.Link:
    """The link consecutive stages send over: each rank to the rank ``slab`` (one stage's DP x TP ranks) above it,
    and under an interleaved schedule the last rank's chunk back to the first's."""
    pp = point.pipeline_parallel
    pairs = [[r, r + slab] for r in range(n - slab)]
    if pipeline.schedule(point.pipeline_schedule).chunks_per_rank > 1:
        pairs += [[r + (pp - 1) * slab, r] for r in range(slab)]
    try:
        return groups_link(pairs, machine)
    except EstimateError:
        raise EstimateError(f"--pipeline-parallel {pp}: consecutive stages sit on different nodes of {machine.per_node} "
                            "GPUs: give --inter-node") from None


def _sharded_stage_comm(point, machine, n: int, stage: dict, step):
    """FSDP2's collectives over one stage's data-parallel ranks as a pipelined run makes them
    (scalelab.formulas.pipeline.sharded_comm_bytes, the formula the gloo runs measure: stage 2 gathers once a step,
    stage 3 once whole and m times all but each chunk's kept last block; the gradients reduced once), each collective
    timed on the link its groups need. (seconds, calls, nccl-tests sizes, links) by collective, as _strategy_comm;
    None where the schedule's gathers are not modelled (more chunks per rank than torch keeps gathered at once);
    ``step``: what each GPU runs (point_step)."""
    t, pp, zero = point.tensor_parallel, point.pipeline_parallel, step.zero_stage
    dp, m = step.data_parallel, step.accumulation_steps
    v = pipeline.chunks_per_rank(point.pipeline_schedule, point.chunks_per_rank)
    by_collective = pipeline.sharded_comm_by_collective(
        stage["params"], v * tensor_parallelism.last_block_params(point.cfg, t), step, point.pipeline_schedule,
        point.chunks_per_rank)
    if by_collective is None:
        return None
    # a unit: each block, and the root of the one chunk that holds the embeddings or the head (the largest stage is
    # the first or the last rank; its other chunks' roots hold no parameters, so gather nothing)
    slab, units = dp * t, stage["blocks"] + 1
    link = groups_link([range(p * slab + j, (p + 1) * slab, t) for p in range(pp) for j in range(t)], machine)
    calls = {"all_gather": pipeline.sharded_gather_calls(units, m, zero, v), "reduce_scatter": units}
    comm, sizes, used = {}, {}, {}
    for collective, nbytes in by_collective.items():
        size = nbytes / links.handed_per_size(collective)
        comm[collective] = calls[collective] * links.collective_seconds(collective, size / calls[collective], dp, link)
        sizes[collective], used[collective] = size, link.name
    return comm, {c: calls[c] for c in by_collective}, sizes, used


def _stage_comm(point, machine, n: int, largest: dict, step):
    """The strategy's collectives over the largest stage's data-parallel ranks: FSDP2 (stages 2 and 3) as a pipelined
    step gathers and reduces (_sharded_stage_comm), the other strategies as scalelab.forecast.step prices them with
    the step's micro-batches accumulated; ``step``: what each GPU runs (point_step)."""
    sharded = None
    if step.zero_stage in (2, 3):
        sharded = _sharded_stage_comm(point, machine, n, largest, step)
    return sharded or _strategy_comm(point, machine, n, largest["params"], step, stage_cfg=largest["cfg"])


def _tied_seconds(point, machine, dp: int, slab: int) -> tuple[float, float]:
    """(bytes, seconds) of a tied embedding's gradient all-reduced between the first and the last stage, exposed."""
    pp = point.pipeline_parallel
    sharded = dp if strategy(point.key).stage >= 2 else 1  # gradients sharded over the DP ranks at stages 2 and 3
    tied = pipeline.tied_sync_bytes(point.cfg, pp, 0, sharded)
    if not tied:
        return 0.0, 0.0
    ends = [[r, r + (pp - 1) * slab] for r in range(slab)]
    return tied, links.collective_seconds("all_reduce", tied / links.handed_per_size("all_reduce"), 2,
                                          groups_link(ends, machine))


def _exposed_comm(point, compute_s: float, m: int, comm: dict, calls: dict, overlap_efficiency: float) -> float:
    """The strategy's collectives left exposed in a pipelined step: the gradient syncs its overlap facts hide behind
    backward (DDP's all-reduce, FSDP's reduce-scatter) run in the last micro-batch's backward alone (nanotron's 1F1B
    and torch's schedules sync only there), so they hide behind one micro-batch's compute, compute_s / m; the rest
    (FSDP's prefetched gathers) behind the step's, as without pipelining."""
    from scalelab.formulas import overlap

    key = ZERO1_SHARDED_KEY if point.priced == ZERO1_SHARDED_KEY else strategy(point.key).stage
    windows = dict(strategy(key).overlap)
    sync = {c: s for c, s in comm.items() if windows.get(c) == "backward"}
    rest = {c: s for c, s in comm.items() if c not in sync}
    return (overlap.step_time(key, compute_s / m, sync, calls=calls, overlap_efficiency=overlap_efficiency).exposed_comm_s
            + overlap.step_time(key, compute_s, rest, calls=calls, overlap_efficiency=overlap_efficiency).exposed_comm_s)


def predict_pipeline(point, machine, n: int) -> dict:
    """predict_point's row for a pipelined point (the module doc's model), with ``pipeline``: its micro-batches,
    bubble, point-to-point traffic and every stage's compute and memory."""
    cfg, t, pp, sched = point.cfg, point.tensor_parallel, point.pipeline_parallel, point.pipeline_schedule
    dp, micro, m = _plan(point, n)
    width = 4 if point.precision == "fp32" else 2  # the activations' dtype at the boundaries
    boundary = pipeline.boundary_values(micro, cfg.seq_len, cfg.d_model, t, point.sequence_parallel) * width
    p2p_link = _p2p_link(point, machine, n, dp * t)
    all_chunks = pipeline.chunks(cfg.n_layers, pp, sched, point.chunks_per_rank)
    step = point_step(point, dp, micro, m)  # what each GPU runs: its stage's strategy over the data-parallel ranks
    stages = [_stage(point, machine, n, rank, all_chunks, step, boundary, p2p_link) for rank in range(pp)]
    slowest = max(stages, key=lambda s: s["compute_s"] + s["tensor_parallel_s"] + s["p2p_s"])
    comm, calls, sizes, used = _stage_comm(point, machine, n, max(stages, key=lambda s: s["params"]), step)
    exposed = _exposed_comm(point, slowest["compute_s"], m, comm, calls, machine.overlap_efficiency)
    bubble = pipeline.bubble_fraction(pp, m, sched, point.chunks_per_rank)
    busy = slowest["compute_s"] + slowest["tensor_parallel_s"]
    bubble_s = busy * bubble / (1 - bubble)
    p2p_s = max(s["p2p_s"] for s in stages)
    tied, tied_s = _tied_seconds(point, machine, dp, dp * t)
    extra = slowest["tensor_parallel_s"] + p2p_s + tied_s  # on the critical path
    step_s = slowest["compute_s"] + exposed + slowest["tensor_parallel_s"] + bubble_s + p2p_s + tied_s
    fpt = flops.flops_per_token(cfg)
    tokens = micro * m * cfg.seq_len / (t * pp)  # per GPU per optimizer step
    per_gpu = tokens / step_s
    peak_mem = max(s["peak_memory_bytes"] for s in stages)
    return {"gpus": n, "nodes": math.ceil(n / machine.per_node), "replicas": 1, "links": used,
            "tensor_parallel": t, "data_parallel": dp, "tensor_parallel_comm": slowest["tp"],
            "pipeline_parallel": pp, "pipeline_schedule": sched,
            "micro_batch": micro, "accumulation_steps": m, "tokens_per_gpu_per_step": tokens,
            "step_time_s": step_s, "compute_s": slowest["compute_s"], "comm_s": dict(comm),
            "exposed_comm_s": exposed + extra, "tokens_per_s_per_gpu": per_gpu,
            "tokens_per_s": per_gpu * n, "mfu": flops.mfu(per_gpu, fpt, machine.peak_flops, 1),
            "collective_bytes": sizes, "collective_calls": calls, "peak_memory_bytes": peak_mem,
            "peak_memory_gib": peak_mem / UNITS["GiB"],
            "fits_memory": fits_memory(peak_mem, machine.product),
            "flops_per_token": fpt, "recompute_flops_per_token": slowest["recompute_flops_per_token"],
            "pipeline": _pipeline_columns(stages, slowest, m, bubble, bubble_s, boundary, p2p_link, machine, p2p_s,
                                          tied, tied_s)}


def _pipeline_columns(stages, slowest, m, bubble, bubble_s, boundary, p2p_link, machine, p2p_s, tied, tied_s) -> dict:
    """A pipelined row's ``pipeline``: its micro-batches, bubble, sends, tied sync and every stage (public fields)."""
    return {"microbatches": m, "bubble_fraction": bubble, "bubble_s": bubble_s, "boundary_bytes": boundary,
            "p2p_link": p2p_link.name, "p2p_across_nodes": p2p_link is not machine.intra, "p2p_s": p2p_s,
            "p2p_sent_bytes": max(s["p2p_sent_bytes"] for s in stages), "tied_sync_bytes": tied, "tied_sync_s": tied_s,
            "slowest_stage": slowest["rank"],
            "stages": [{k: v for k, v in s.items() if k not in ("cfg", "tp", "recompute_flops_per_token")}
                       for s in stages]}
