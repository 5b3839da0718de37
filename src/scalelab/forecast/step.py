"""The step-time model every forecast shares (estimate scaling, scalelab plan, the sweep's pruning, the published
validation): one training configuration (Point) on a cluster (Machine) at n GPUs, timed from an assumed compute
efficiency and each collective on the link its group uses, with the strategy's overlap, and sized by its in-step
peak memory. The trainer priced is the Point's: scalelab's own strategies as it runs them, or ZeRO-1 as the
trainers that scale run it (scalelab.spec.strategies.TRAINERS).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

from scalelab.config import ModelConfig
from scalelab.forecast.inputs import UNITS, EstimateError
from scalelab.formulas import activation_memory, communication, flops, links, megatron_style, peak_memory, pipeline, tensor_parallelism
from scalelab.formulas.links import collective_calls
from scalelab.spec.families import tensor_parallel_split_params
from scalelab.spec.strategies import HYBRID_KEY, ZERO1_SHARDED_KEY, strategy


def _replicas(gpus: int, per_node: int) -> int:
    """Hybrid sharding's replica count at a GPU count: shard groups of one node each (--gpus-per-node),
    one replica within a node."""
    if gpus <= per_node:
        return 1
    if gpus % per_node:
        raise EstimateError(f"--gpus {gpus}: hybrid sharding shards within a node of {per_node} GPUs (--gpus-per-node) "
                            "and replicates across nodes: a count above one node must be a whole number of nodes")
    return gpus // per_node




@dataclass(frozen=True)
class Point:
    """One training configuration of a model, whatever the GPU count: what predict_point times and sizes."""
    cfg: ModelConfig
    n_params: int
    key: int | str  # the strategy record's key: a ZeRO stage, or HYBRID_KEY
    precision: str
    grad_reduce: str = "fp32"
    micro_batch: int = 1
    global_batch: int | None = None  # None: a fixed per-GPU batch (micro_batch), no accumulation
    activation_checkpointing: bool = False
    tensor_parallel: int = 1  # T GPUs split every block (scalelab.run.tensor_parallel); the strategy runs over N / T
    replicas: int | None = None  # hybrid sharding's replicas; None: one shard group per node (_replicas)
    trainer: str = "scalelab"  # whose implementation of the strategy is priced (scalelab.spec.strategies.TRAINERS)
    sequence_parallel: bool = False  # with tensor parallelism: the norms and residual split over the tokens
    pipeline_parallel: int = 1  # P stages of consecutive blocks (scalelab.forecast.pipeline_step); world = DP x TP x P
    pipeline_schedule: str = "1f1b"  # one of scalelab.formulas.pipeline.SCHEDULES

    @property
    def megatron(self) -> bool:
        """Priced as Megatron-LM and nanotron run it (scalelab.formulas.megatron_style): stages 0 and 1."""
        return self.trainer == "megatron" and self.key in (0, 1)

    @property
    def priced(self) -> int | str:
        """The strategy record the step is priced by: ZeRO-1's distributed-optimizer form (the megatron trainer's) where the trainer runs it so."""
        return ZERO1_SHARDED_KEY if self.trainer == "megatron" and self.key == 1 else self.key


@dataclass(frozen=True)
class Machine:
    """The GPUs and links a point runs on, and the assumed compute efficiency and overlap."""
    product: object  # hardware's GPU record; None for a CPU (a sweep's forecast: scalelab.forecast.pruning)
    peak_flops: float  # of the point's precision
    mfu: float  # compute efficiency without communication (of the hardware FLOPs: the recompute included)
    per_node: int
    intra: links.Link
    inter: links.Link | None
    overlap_efficiency: float


def predict_point(point: Point, machine: Machine, n: int) -> dict:
    """A point's predicted step at n GPUs: compute at the assumed efficiency, every collective on the link
    its group uses (communication.comm_bytes_by_link: placement.link_of's rule), the strategy's overlap, and the in-step peak
    memory per GPU (one micro-batch's activations)."""
    from scalelab.formulas import overlap

    if point.pipeline_parallel > 1:  # the stages, their bubble and the sends between them
        return predict_pipeline(point, machine, n)
    cfg, key, t = point.cfg, point.key, point.tensor_parallel
    stage = strategy(key).stage  # hybrid sharding is stage 3 over a 2-D mesh (scalelab.spec.strategies)
    if n % t or (t > 1 and key == HYBRID_KEY):
        raise EstimateError(f"--tensor-parallel {t} does not divide {n} GPUs" if n % t else
                            "hybrid sharding with tensor parallelism (a 3-D mesh) is not predicted")
    dp = n // t  # data-parallel ranks: each is a tensor-parallel group of t GPUs sharing one share of the batch
    micro, accumulation = batch_plan(point.global_batch, point.micro_batch, dp)
    tokens = micro * accumulation * cfg.seq_len / t  # per GPU per optimizer step
    fpt = flops.flops_per_token(cfg)
    # the assumed MFU is the hardware's efficiency on what it computes: checkpointing computes every block's
    # forward again (recompute_flops_per_token), which model FLOPs (MFU) do not count; under tensor parallelism
    # each GPU computes 1/t of the blocks and the whole head (replicated: its 6 V d FLOPs per token on every GPU)
    hardware_fpt = fpt + (flops.recompute_flops_per_token(cfg) if point.activation_checkpointing else 0.0)
    head = 6 * cfg.vocab_size * cfg.d_model if t > 1 and not point.megatron else 0.0  # split over the vocabulary there
    compute_s = ((hardware_fpt - head) / t + head) * tokens * t / (machine.peak_flops * machine.mfu)
    replicas = (point.replicas or _replicas(n, machine.per_node)) if key == HYBRID_KEY else 1
    # what each GPU holds of the parameters: the embedding and head split over the vocabulary too where the trainer does
    n_local = (megatron_style.local_params(cfg, point.n_params, t) if point.megatron
               else tensor_parallelism.tensor_parallel_params(cfg, point.n_params, t))
    comm, calls, sizes, used = _strategy_comm(point, machine, n, n_local, replicas, accumulation)
    # one replica is plain stage 3 (strategy(3, 1)): its record's overlap facts apply
    step = overlap.step_time(key if replicas > 1 else (ZERO1_SHARDED_KEY if point.priced == ZERO1_SHARDED_KEY else stage),
                                compute_s, comm, calls=calls,
                                overlap_efficiency=machine.overlap_efficiency)
    tp = _tensor_parallel_step(point, machine, n, micro, accumulation)
    step_s, exposed = step.step_s + tp["seconds"], step.exposed_comm_s + tp["seconds"]  # on the critical path
    per_gpu = tokens / step_s
    peak_mem = _peak_memory(point, n_local, dp, micro, accumulation, replicas)
    return {"gpus": n, "nodes": math.ceil(n / machine.per_node), "replicas": replicas, "links": used,
            "tensor_parallel": t, "data_parallel": dp, "tensor_parallel_comm": tp,
            "micro_batch": micro, "accumulation_steps": accumulation, "tokens_per_gpu_per_step": tokens,
            "step_time_s": step_s, "compute_s": step.compute_s, "comm_s": dict(step.comm_s),
            "exposed_comm_s": exposed, "tokens_per_s_per_gpu": per_gpu,
            "tokens_per_s": per_gpu * n, "mfu": flops.mfu(per_gpu, fpt, machine.peak_flops, 1),
            "collective_bytes": sizes, "collective_calls": calls, "peak_memory_bytes": peak_mem,
            "peak_memory_gib": peak_mem / UNITS["GiB"],
            "fits_memory": peak_mem <= machine.product.memory_gib * UNITS["GiB"] if machine.product else None,
            "flops_per_token": fpt, "recompute_flops_per_token": hardware_fpt - fpt}


def _strategy_comm(point: Point, machine: Machine, n: int, n_local: float, replicas: int, accumulation: int,
                   stage_cfg: ModelConfig | None = None):
    """Every collective of the strategy in a step over its group: the world (the data-parallel ranks under tensor
    parallelism), or under hybrid sharding the shard group and the replicate group (fp16's one-flag all-reduce over the
    world counted with the replicate group's); each kind of group on the link its slowest member needs (groups_link).
    Under pipeline parallelism each stage's data-parallel ranks (mesh order pp, dp, tp: a stage is DP x TP consecutive
    ranks) reduce that stage's parameters (n_local), its blocks (stage_cfg) counting the calls.
    (seconds, calls, nccl-tests sizes, links) by collective."""
    cfg, t, pp = point.cfg, point.tensor_parallel, point.pipeline_parallel
    dp = n // (t * pp)
    by_group = communication.comm_bytes_by_group(n_local, strategy(point.key).stage, dp, point.precision, replicas=replicas,
                                              grad_reduce=point.grad_reduce, accumulation_steps=accumulation,
                                              last_block_params=tensor_parallelism.last_block_params(cfg, t))
    if point.priced == ZERO1_SHARDED_KEY:
        by_group = {"world": communication.sharded_zero1_bytes(n_local, point.precision, point.grad_reduce)} if dp > 1 else {}
    if replicas > 1:
        shard = dp // replicas
        replicate = dict(by_group.get("replicate", {}))
        for c, b in by_group.get("world", {}).items():
            replicate[c] = replicate.get(c, 0.0) + b
        kinds = [(by_group.get("shard", {}), shard, [range(s * shard, (s + 1) * shard) for s in range(replicas)]),
                 (replicate, replicas, [range(j, dp, shard) for j in range(shard)])]
    else:
        slab = dp * t  # one pipeline stage's ranks
        kinds = [(by_group.get("world", {}), dp, [range(p * slab + j, (p + 1) * slab, t) for p in range(pp) for j in range(t)])]
    comm, calls, sizes, used = {}, {}, {}, {}
    # each kind of group: (bytes by collective, ranks in one group, every group of the kind, as global ranks)
    for kind_bytes, group_size, groups in kinds:
        link = groups_link(groups, machine)
        kind_sizes = {c: b / links.handed_per_size(c) for c, b in kind_bytes.items()}
        kind_calls = collective_calls(stage_cfg or cfg, point.priced, point.precision, kind_sizes, accumulation_steps=accumulation,
                                      tensor_parallel=t, last_block_kept=True)
        for c, size in kind_sizes.items():
            seconds = kind_calls[c] * links.collective_seconds(c, size / kind_calls[c], group_size, link)
            comm[c], calls[c] = comm.get(c, 0.0) + seconds, calls.get(c, 0) + kind_calls[c]
            sizes[c] = sizes.get(c, 0.0) + size
            if group_size > 1:
                used[c] = link.name
    return comm, calls, sizes, used


def _peak_memory(point: Point, n_local: float, dp: int, micro: int, accumulation: int, replicas: int) -> float:
    """The in-step peak per GPU: the megatron trainer's recipe (scalelab.formulas.megatron_style) or what scalelab's
    runs measure (scalelab.formulas.peak_memory.peak_memory)."""
    stage, t = strategy(point.key).stage, point.tensor_parallel
    if point.megatron:
        return megatron_style.peak_memory(point.cfg, n_local, stage, dp, point.precision, micro, t, point.sequence_parallel,
                                          point.activation_checkpointing)["total"]
    return peak_memory.peak_memory(point.cfg, n_local, stage, dp, point.precision, micro, replicas=replicas,
                                  activation_checkpointing=point.activation_checkpointing,
                                  accumulation_steps=accumulation, tensor_parallel=t).total


def check_tensor_parallel(cfg: ModelConfig | None, degree: int) -> None:
    """EstimateError where a model cannot be split ``degree`` ways as a run would refuse it (no shape, no family
    plan, heads, key/value heads or the MLP's width the degree does not divide: scalelab.plan.run_plan)."""
    from scalelab.config import ConfigError
    from scalelab.plan.run_plan import tensor_parallel_problem

    if degree == 1:
        return
    if cfg is None:
        raise EstimateError("--tensor-parallel needs the model's shape (--model NAME or the shape flags): what it splits "
                            "is the blocks' linears")
    try:
        tensor_parallel_problem(cfg, degree)
    except ConfigError as err:
        raise EstimateError(str(err).replace("sweep.tensor_parallel=", "--tensor-parallel ")) from None


def groups_link(groups, machine: Machine) -> links.Link:
    """The link a kind of group (its groups run at once, each of global ranks placed as torchrun places them:
    ``machine.per_node`` consecutive ranks per node) moves at: the intra-node link where every group stays in a
    node; else between nodes, on the NICs of the spanning group that holds the fewest ranks on one of its nodes
    (links.across_nodes: the slowest group paces the step, and a ring runs at its thinnest node's rails)."""
    fewest = None
    for group in groups:
        per_node = Counter(rank // machine.per_node for rank in group)
        if len(per_node) > 1:
            fewest = min(per_node.values()) if fewest is None else min(fewest, *per_node.values())
    if fewest is None:
        return machine.intra
    if machine.inter is None:
        raise EstimateError(f"--inter-node: groups of {len(groups[0])} GPUs span nodes of {machine.per_node} "
                            "(--gpus-per-node); give the link between nodes")
    return links.across_nodes(machine.inter, machine.intra, fewest)


def _tensor_parallel_step(point: Point, machine: Machine, gpus: int, micro: int, accumulation: int) -> dict:
    """Tensor parallelism's collectives in a step over each group of T GPUs, on the link its groups need (groups_link):
    scalelab's (tensor_parallelism.tensor_parallel_comm: four all-reduces per block and micro-batch of B T d values, backward's
    in fp32) or the megatron trainer's (scalelab.formulas.megatron_style). Their time is on the critical path, for every
    block's forward waits for its own (no schedule here hides them: asynchronous tensor parallelism is out of scope).
    ``size_bytes``: nccl-tests' size summed over the calls; ``ring_bytes_per_gpu``: what a ring moves per GPU (size x
    the bus factor); the time is calls x latency + ring bytes / the link's bus bandwidth."""
    t, cfg = point.tensor_parallel, point.cfg
    if t == 1:
        return {"size_bytes": 0.0, "ring_bytes_per_gpu": 0.0, "calls": 0, "seconds": 0.0, "link": None, "exposed": True,
                "collectives": {}}
    if point.megatron:
        by_type = megatron_style.tensor_parallel_comm(cfg, micro, accumulation, t, point.precision, point.sequence_parallel,
                                                      point.activation_checkpointing)
    else:  # the communication formulas' unit counts an all-reduce of S bytes as 2 S: back to nccl-tests' size
        by_type = {c: (b / links.handed_per_size(c), n) for c, (b, n) in tensor_parallelism.tensor_parallel_comm(
            cfg, micro, accumulation, t, point.precision, strategy(point.key).stage, "cuda", point.activation_checkpointing,
            point.sequence_parallel).items()}
    try:  # every tensor-parallel group at once: one that straddles a node boundary paces the step
        link = groups_link([range(k * t, (k + 1) * t) for k in range(gpus // t)], machine)
    except EstimateError:
        raise EstimateError(f"--tensor-parallel {t} spans nodes of {machine.per_node} GPUs: give --inter-node") from None
    seconds = sum(n * links.collective_seconds(c, size / n, t, link) for c, (size, n) in by_type.items() if n)
    return {"size_bytes": sum(size for size, _ in by_type.values()), "calls": sum(n for _, n in by_type.values()),
            "ring_bytes_per_gpu": sum(links.bus_factor(c, t) * size for c, (size, _) in by_type.items()),
            "seconds": seconds, "link": link.name, "exposed": True,
            "collectives": {c: {"size_bytes": size, "calls": n} for c, (size, n) in by_type.items()}}


def batch_plan(global_batch: int | None, micro_batch: int, gpus: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) per GPU: the micro-batch itself at a fixed per-GPU batch (no
    global batch: weak scaling); at a fixed global batch, each GPU's share G / n in micro-batches of the
    largest size up to ``micro_batch`` that divides it (as the sweep plans accumulation)."""
    if global_batch is None:
        return micro_batch, 1
    if global_batch % gpus:
        raise EstimateError(f"--global-batch {global_batch} does not split evenly over {gpus} GPUs (every GPU takes "
                            "the same number of sequences): choose a global batch divisible by every --gpus count")
    share = global_batch // gpus
    micro = max(m for m in range(1, min(micro_batch, share) + 1) if share % m == 0)
    return micro, share // micro


def fp8_machine(machine: Machine, d_model: int) -> tuple[Machine, str]:
    """The machine an fp8 point runs on: the GPU's fp8 datasheet peak, at the efficiency that times fp8 as a GPU
    measured it against bf16 (the assumed bf16 MFU x the fp8/bf16 tokens/s ratio at this width: fp8's casts never
    let it near its datasheet peak), with the sentence that says so. The ratio stays apart from the peak."""
    from dataclasses import replace

    from scalelab.spec import hardware

    fp8_peak, bf16_peak = machine.product.peak("fp8"), machine.product.peak("bf16")
    ratio = hardware.fp8_outlook(d_model)["ratio_estimate"]
    mfu = machine.mfu * bf16_peak * ratio / fp8_peak
    note = (f"fp8: the {machine.product.name}'s fp8 datasheet peak {fp8_peak / 1e12:,.1f} TFLOP/s at MFU {mfu:.1%}, i.e. "
            f"the bf16 MFU {machine.mfu:.1%} x the fp8/bf16 tokens/s ratio {ratio:.3g} measured at d_model {d_model} "
            f"(scalelab.spec.hardware.fp8_outlook) / the fp8/bf16 peak ratio {fp8_peak / bf16_peak:.3g}; its memory at "
            "stages 2 and 3 holds 4 bytes per gathered parameter where bf16 holds 2: torchao's float8 linears cast from the "
            "fp32 masters inside each matmul, so FSDP2 gathers fp32 (scalelab.formulas.communication.MIXED_COMM)")
    return replace(machine, peak_flops=fp8_peak, mfu=mfu), note


# ----------------------------------------------------------------------------- pipeline parallelism
# The step-time model under pipeline parallelism: P stages of consecutive blocks (scalelab.formulas.pipeline), each
# timed, sized and sent from as the schedule runs it, with the strategy over each stage's data-parallel ranks.
#
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
#   which hold the embedding and the head), with the strategy's overlap against the slowest stage's compute;
# * a tied embedding's gradient all-reduced between the first and the last stage (tied_sync_bytes), exposed;
# * memory per stage: its parameters (rank_params, the strategy's sharding over the DP ranks), its in-flight
#   micro-batches' block activations (in_flight: 1F1B's first stage holds the most, GPipe all m), and on the last stage
#   what the loss path holds.


def _flag_text(text: str) -> str:
    """A formula's message (written for the config's keys) in the command line's flags."""
    return (text.replace("sweep.micro_batch", "--micro-batch").replace("train.global_batch", "--global-batch")
            .replace("pipeline_parallel=", "--pipeline-parallel "))


def pipeline_problem(cfg, pp: int, schedule_name: str, microbatches: int | None = None) -> str | None:
    """Why this model cannot be pipelined P ways under the schedule with ``microbatches`` per step (None: the
    micro-batches unchecked), in one line naming the flag; None where it can."""
    if pp == 1:
        return None
    if schedule_name not in pipeline.SCHEDULES:
        return f"--schedule {schedule_name}: one of {', '.join(pipeline.SCHEDULES)}"
    if cfg is None or cfg.module:
        return "--pipeline-parallel needs a family's shape (--model NAME or the shape flags): its stages are the blocks"
    try:
        pipeline.chunks(cfg.n_layers, pp, schedule_name)
    except ValueError as err:
        return f"--pipeline-parallel {pp}: {_flag_text(str(err))}"
    if microbatches is not None:
        why = pipeline.microbatches_problem(pp, microbatches, schedule_name)
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
    held = pipeline.rank_params(cfg, _block_params(cfg, t), rank, pp, sched)
    if point.megatron and t > 1:
        mine, last = pipeline.rank_chunks(rank, pp, sched), pp * pipeline.schedule(sched).chunks_per_rank - 1
        held -= cfg.vocab_size * cfg.d_model * (1 - 1 / t) * ((0 in mine) + (last in mine))
    return held


def _stage_memory(point, rank: int, blocks: int, last: bool, n_local: float, dp: int, micro: int, m: int) -> dict:
    """Bytes at the step's peak on pipeline rank ``rank``: model state and gathers as without pipelining, the in-flight
    micro-batches' block activations, and on the last stage the head's and the loss's."""
    cfg, t, pp, sched = point.cfg, point.tensor_parallel, point.pipeline_parallel, point.pipeline_schedule
    stage, sp, ac = strategy(point.key).stage, point.sequence_parallel, point.activation_checkpointing
    mine = replace(cfg, n_layers=blocks)
    if point.megatron:
        def acts(k: int) -> float:
            return megatron_style.activation_bytes(replace(cfg, n_layers=k), micro, point.precision, t, sp, ac)
        per_block = acts(2) - acts(1)
        outside = acts(1) - per_block
        optimizer = megatron_style.STATE_BYTES["optimizer"] * n_local / (dp if stage == 1 else 1)
        state = (megatron_style.STATE_BYTES["params"] + megatron_style.STATE_BYTES["grads"]) * n_local + optimizer
        held = pipeline.held_block_activations(per_block, cfg.n_layers, rank, pp, m, sched) + (outside if last else 0.0)
        return {"model_state": state, "activations": held, "total": state + held}
    peak = peak_memory.peak_memory(mine, n_local, stage, dp, point.precision, micro, ac, accumulation_steps=m,
                                  tensor_parallel=t, sequence_parallel=sp)
    block_acts = activation_memory.block_activation_bytes(mine, micro, point.precision, ac, zero_stage=stage, tensor_parallel=t,
                                                   sequence_parallel=sp)
    outside = peak.activations - block_acts  # outside the blocks and the loss path: the last stage's
    held = pipeline.held_block_activations(block_acts / blocks, cfg.n_layers, rank, pp, m, sched) + (outside if last else 0.0)
    at_peak = replace(peak, activations=held)
    return {"model_state": at_peak.model_state, "activations": held, "total": at_peak.total}


def _send_seconds(sent: float, boundary: float, link: links.Link) -> float:
    """A rank's sends in a step: a latency per message and the bytes at the link's achievable bandwidth."""
    return (sent / boundary) * link.latency_s + sent / link.achievable_Bps if sent else 0.0


def _stage(point, machine, n: int, rank: int, all_chunks, dp: int, micro: int, m: int, boundary: float, p2p_link) -> dict:
    """One pipeline rank's blocks, compute, tensor-parallel time, sends and memory in a step."""
    cfg, t, pp, sched = point.cfg, point.tensor_parallel, point.pipeline_parallel, point.pipeline_schedule
    fpt = flops.flops_per_token(cfg)
    hardware_fpt = fpt + (flops.recompute_flops_per_token(cfg) if point.activation_checkpointing else 0.0)
    head = 6 * cfg.vocab_size * cfg.d_model
    tokens_dp = micro * m * cfg.seq_len  # one data-parallel rank's tokens per step, worked on by its T x P GPUs
    rate = machine.peak_flops * machine.mfu
    mine = pipeline.rank_chunks(rank, pp, sched)
    blocks = sum(len(all_chunks[c]) for c in mine)
    last = len(all_chunks) - 1 in mine
    per_token = (hardware_fpt - head) * blocks / cfg.n_layers / t + (head / (t if point.megatron else 1) if last else 0.0)
    stage_cfg = replace(cfg, n_layers=blocks)
    tp = _tensor_parallel_step(replace(point, cfg=stage_cfg), machine, n, micro, m)
    sent = pipeline.p2p_bytes(rank, pp, m, boundary, sched)
    n_local = stage_params(point, rank)
    memory = _stage_memory(point, rank, blocks, last, n_local, dp, micro, m)
    return {"rank": rank, "blocks": blocks, "holds": list(mine), "params": n_local,
            "compute_s": per_token * tokens_dp / rate, "tensor_parallel_s": tp["seconds"], "tp": tp,
            "p2p_sent_bytes": sent["sent"], "p2p_received_bytes": sent["received"],
            "p2p_s": _send_seconds(max(sent["sent"], sent["received"]), boundary, p2p_link),
            "in_flight": pipeline.in_flight(rank, pp, m, sched),
            "peak_memory_bytes": memory["total"], "activations_bytes": memory["activations"], "cfg": stage_cfg}


def predict_pipeline(point, machine, n: int) -> dict:
    """predict_point's row for a pipelined point (the module doc's model), with ``pipeline``: its micro-batches,
    bubble, point-to-point traffic and every stage's compute and memory."""
    from scalelab.formulas import overlap

    cfg, key, t, pp, sched = point.cfg, point.key, point.tensor_parallel, point.pipeline_parallel, point.pipeline_schedule
    if key == HYBRID_KEY:
        raise EstimateError("--pipeline-parallel with hybrid sharding is not predicted: give a ZeRO stage")
    if n % (t * pp):
        raise EstimateError(f"--pipeline-parallel {pp} x --tensor-parallel {t} does not divide {n} GPUs")
    why = pipeline_problem(cfg, pp, sched)
    if why:
        raise EstimateError(why)
    dp = n // (t * pp)
    micro, m = batch_plan(point.global_batch, point.micro_batch, dp)
    why = pipeline_problem(cfg, pp, sched, m)
    if why:
        raise EstimateError(why + ("" if point.global_batch else "; give --global-batch: a step's micro-batches are "
                                                                    "each data-parallel rank's share of it"))
    all_chunks = pipeline.chunks(cfg.n_layers, pp, sched)
    fpt = flops.flops_per_token(cfg)
    hardware_fpt = fpt + (flops.recompute_flops_per_token(cfg) if point.activation_checkpointing else 0.0)
    tokens_dp = micro * m * cfg.seq_len  # one data-parallel rank's tokens per step, worked on by its T x P GPUs
    width = 4 if point.precision == "fp32" else 2  # the activations' dtype at the boundaries
    boundary = pipeline.boundary_values(micro, cfg.seq_len, cfg.d_model, t, point.sequence_parallel) * width
    slab = dp * t  # one stage's ranks
    pairs = [[r, r + slab] for r in range(n - slab)]
    if pipeline.schedule(sched).chunks_per_rank > 1:  # chunk P - 1 on the last rank sends to chunk P on the first
        pairs += [[r + (pp - 1) * slab, r] for r in range(slab)]
    try:
        p2p_link = groups_link(pairs, machine)
    except EstimateError:
        raise EstimateError(f"--pipeline-parallel {pp}: consecutive stages sit on different nodes of {machine.per_node} "
                            "GPUs: give --inter-node") from None
    stages = [_stage(point, machine, n, rank, all_chunks, dp, micro, m, boundary, p2p_link) for rank in range(pp)]
    slowest = max(stages, key=lambda s: s["compute_s"] + s["tensor_parallel_s"] + s["p2p_s"])
    largest = max(stages, key=lambda s: s["params"])
    comm, calls, sizes, used = _strategy_comm(point, machine, n, largest["params"], 1, m, stage_cfg=largest["cfg"])
    step = overlap.step_time(ZERO1_SHARDED_KEY if point.priced == ZERO1_SHARDED_KEY else strategy(key).stage,
                                slowest["compute_s"], comm, calls=calls, overlap_efficiency=machine.overlap_efficiency)
    bubble = pipeline.bubble_fraction(pp, m, sched)
    busy = slowest["compute_s"] + slowest["tensor_parallel_s"]
    bubble_s = busy * bubble / (1 - bubble)
    p2p_s = max(s["p2p_s"] for s in stages)
    sharded = dp if strategy(key).stage >= 2 else 1  # gradients sharded over the DP ranks at stages 2 and 3
    tied = pipeline.tied_sync_bytes(cfg, pp, 0, sharded)
    tied_s = 0.0
    if tied:
        ends = [[r, r + (pp - 1) * slab] for r in range(slab)]
        tied_s = links.collective_seconds("all_reduce", tied / links.handed_per_size("all_reduce"), 2,
                                          groups_link(ends, machine))
    extra = slowest["tensor_parallel_s"] + p2p_s + tied_s  # on the critical path
    step_s = step.step_s + slowest["tensor_parallel_s"] + bubble_s + p2p_s + tied_s
    tokens = tokens_dp / (t * pp)  # per GPU per optimizer step
    per_gpu = tokens / step_s
    peak_mem = max(s["peak_memory_bytes"] for s in stages)
    public = [{k: v for k, v in s.items() if k not in ("cfg", "tp")} for s in stages]
    return {"gpus": n, "nodes": math.ceil(n / machine.per_node), "replicas": 1, "links": used,
            "tensor_parallel": t, "data_parallel": dp, "tensor_parallel_comm": slowest["tp"],
            "pipeline_parallel": pp, "pipeline_schedule": sched,
            "micro_batch": micro, "accumulation_steps": m, "tokens_per_gpu_per_step": tokens,
            "step_time_s": step_s, "compute_s": step.compute_s, "comm_s": dict(step.comm_s),
            "exposed_comm_s": step.exposed_comm_s + extra, "tokens_per_s_per_gpu": per_gpu,
            "tokens_per_s": per_gpu * n, "mfu": flops.mfu(per_gpu, fpt, machine.peak_flops, 1),
            "collective_bytes": sizes, "collective_calls": calls, "peak_memory_bytes": peak_mem,
            "peak_memory_gib": peak_mem / UNITS["GiB"],
            "fits_memory": peak_mem <= machine.product.memory_gib * UNITS["GiB"] if machine.product else None,
            "flops_per_token": fpt, "recompute_flops_per_token": hardware_fpt - fpt,
            "pipeline": {"microbatches": m, "bubble_fraction": bubble, "bubble_s": bubble_s,
                         "boundary_bytes": boundary, "p2p_link": p2p_link.name,
                         "p2p_across_nodes": p2p_link is not machine.intra, "p2p_s": p2p_s,
                         "p2p_sent_bytes": max(s["p2p_sent_bytes"] for s in stages),
                         "tied_sync_bytes": tied, "tied_sync_s": tied_s, "slowest_stage": slowest["rank"],
                         "stages": public}}
