"""The step-time model every forecast shares (estimate scaling, scalelab plan, the sweep's pruning, the published
validation): one training configuration (Point) on a cluster (Machine) at n GPUs, timed from an assumed compute
efficiency and each collective on the link its group uses, with the strategy's overlap, and sized by its in-step
peak memory. The trainer priced is the Point's: scalelab's own strategies as it runs them, or ZeRO-1 as the
trainers that scale run it (scalelab.registries.strategies.TRAINERS).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

from scalelab.config import ModelConfig
from scalelab.forecast.inputs import UNITS, EstimateError, memory_reserve_bytes
from scalelab.formulas import communication, flops, links, megatron_style, peak_memory, tensor_parallelism
from scalelab.formulas.links import collective_calls
from scalelab.formulas.rank_step import RankStep
from scalelab.registries.strategies import HYBRID_KEY, TRAINERS, ZERO1_SHARDED_KEY, strategy


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
    """One training configuration of a model, whatever the GPU count: what predict.predict_point times and sizes."""
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
    trainer: str = "scalelab"  # whose implementation of the strategy is priced (scalelab.registries.strategies.TRAINERS)
    sequence_parallel: bool = False  # with tensor parallelism: the norms and residual split over the tokens
    pipeline_parallel: int = 1  # P stages of consecutive blocks (scalelab.forecast.pipeline_step); world = DP x TP x P
    pipeline_schedule: str = "1f1b"  # one of scalelab.formulas.pipeline.SCHEDULES
    chunks_per_rank: int | None = None  # an interleaved schedule's V as the trainer runs it; None: the schedule's (2)

    @property
    def megatron(self) -> bool:
        """Priced as Megatron-LM, nanotron and NeMo run it (scalelab.formulas.megatron_style): stages 0 and 1."""
        return TRAINERS[self.trainer].form == "megatron" and self.key in (0, 1)

    @property
    def priced(self) -> int | str:
        """The strategy record the step is priced by: ZeRO-1's distributed-optimizer form (the megatron trainers') where the trainer runs it so."""
        return ZERO1_SHARDED_KEY if TRAINERS[self.trainer].form == "megatron" and self.key == 1 else self.key


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


def predict_unpipelined(point: Point, machine: Machine, n: int) -> dict:
    """A point's predicted step at n GPUs without pipeline parallelism (scalelab.forecast.predict.predict_point
    dispatches: it is every forecast's entry): compute at the assumed efficiency, every collective on the link
    its group uses (communication.comm_bytes_by_link: placement.link_of's rule), the strategy's overlap, and the in-step peak
    memory per GPU (one micro-batch's activations)."""
    from scalelab.formulas import overlap

    if point.pipeline_parallel > 1:
        raise ValueError("a pipelined point is priced by scalelab.forecast.predict.predict_point")
    cfg, key, t = point.cfg, point.key, point.tensor_parallel
    stage = strategy(key).stage  # hybrid sharding is stage 3 over a 2-D mesh (scalelab.registries.strategies)
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
    gpu_step = point_step(point, dp, micro, accumulation, replicas)  # what each GPU runs
    comm, calls, sizes, used = _strategy_comm(point, machine, n, n_local, gpu_step)
    # one replica is plain stage 3 (strategy(3, 1)): its record's overlap facts apply
    step = overlap.step_time(key if replicas > 1 else (ZERO1_SHARDED_KEY if point.priced == ZERO1_SHARDED_KEY else stage),
                                compute_s, comm, calls=calls,
                                overlap_efficiency=machine.overlap_efficiency)
    blocks_s = compute_s * (1 - head_share(point, hardware_fpt))
    tp = _tensor_parallel_step(point, machine, n, gpu_step, blocks_s)
    step_s, exposed = step.step_s + tp["exposed_s"], step.exposed_comm_s + tp["exposed_s"]  # on the critical path
    per_gpu = tokens / step_s
    peak_mem = _peak_memory(point, n_local, gpu_step)
    return {"gpus": n, "nodes": math.ceil(n / machine.per_node), "replicas": replicas, "links": used,
            "tensor_parallel": t, "data_parallel": dp, "tensor_parallel_comm": tp,
            "micro_batch": micro, "accumulation_steps": accumulation, "tokens_per_gpu_per_step": tokens,
            "step_time_s": step_s, "compute_s": step.compute_s, "comm_s": dict(step.comm_s),
            "exposed_comm_s": exposed, "tokens_per_s_per_gpu": per_gpu,
            "tokens_per_s": per_gpu * n, "mfu": flops.mfu(per_gpu, fpt, machine.peak_flops, 1),
            "collective_bytes": sizes, "collective_calls": calls, "peak_memory_bytes": peak_mem,
            "peak_memory_gib": peak_mem / UNITS["GiB"],
            "fits_memory": fits_memory(peak_mem, machine.product),
            "flops_per_token": fpt, "recompute_flops_per_token": hardware_fpt - fpt}


def point_step(point: Point, data_parallel: int, micro: int, accumulation: int, replicas: int = 1) -> RankStep:
    """What one GPU of ``point`` runs in a step over ``data_parallel`` ranks (on a GPU: RankStep's default device)."""
    return RankStep(point.precision, strategy(point.key).stage, data_parallel, micro, accumulation,
                    point.activation_checkpointing, replicas=replicas, tensor_parallel=point.tensor_parallel,
                    sequence_parallel=point.sequence_parallel, grad_reduce=point.grad_reduce)


def _strategy_comm(point: Point, machine: Machine, n: int, n_local: float, step: RankStep,
                   stage_cfg: ModelConfig | None = None):
    """Every collective of the strategy in a step over its group: the world (the data-parallel ranks under tensor
    parallelism), or under hybrid sharding the shard group and the replicate group (fp16's one-flag all-reduce over the
    world counted with the replicate group's); each kind of group on the link its slowest member needs (groups_link).
    Under pipeline parallelism each stage's data-parallel ranks (mesh order pp, dp, tp: a stage is DP x TP consecutive
    ranks) reduce that stage's parameters (n_local), its blocks (stage_cfg) counting the calls; ``step``: what each GPU
    runs (point_step: its data-parallel ranks, replicas and micro-batches).
    (seconds, calls, nccl-tests sizes, links) by collective."""
    cfg, t, pp = point.cfg, point.tensor_parallel, point.pipeline_parallel
    dp, replicas, accumulation = step.data_parallel, step.replicas, step.accumulation_steps
    by_group = communication.comm_bytes_by_group(n_local, step, last_block_params=tensor_parallelism.last_block_params(cfg, t))
    if point.priced == ZERO1_SHARDED_KEY:
        by_group = {"world": communication.sharded_zero1_bytes(n_local, point.precision, point.grad_reduce)} if dp > 1 else {}
    every_micro = TRAINERS[point.trainer].reduce_every_micro_batch and accumulation > 1
    if every_micro:  # a reduce-scatter per micro-batch's backward, not one a step
        by_group = {g: {c: b * (accumulation if c == "reduce_scatter" else 1) for c, b in kind.items()}
                    for g, kind in by_group.items()}
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
        if every_micro and "reduce_scatter" in kind_calls:
            kind_calls["reduce_scatter"] *= accumulation
        for c, size in kind_sizes.items():
            seconds = kind_calls[c] * links.collective_seconds(c, size / kind_calls[c], group_size, link)
            comm[c], calls[c] = comm.get(c, 0.0) + seconds, calls.get(c, 0) + kind_calls[c]
            sizes[c] = sizes.get(c, 0.0) + size
            if group_size > 1:
                used[c] = link.name
    return comm, calls, sizes, used


def fits_memory(peak_bytes: float, product) -> bool | None:
    """Whether a predicted peak fits the GPU's memory less the reserve the prediction does not count (RESERVE: the
    budget `scalelab plan` ranks by); None where the GPU is not known."""
    if product is None:
        return None
    memory = product.memory_gib * UNITS["GiB"]
    return peak_bytes <= memory - memory_reserve_bytes(memory, None)


def _peak_memory(point: Point, n_local: float, step: RankStep) -> float:
    """The in-step peak per GPU running ``step``: the megatron trainer's recipe (scalelab.formulas.megatron_style) or
    what scalelab's runs measure (scalelab.formulas.peak_memory.peak_memory)."""
    if TRAINERS[point.trainer].memory == "llm-foundry":
        return _foundry_memory(point, step)
    if point.megatron:
        return megatron_style.peak_memory(point.cfg, n_local, step)["total"]
    return peak_memory.peak_memory(point.cfg, n_local, step).total


def _foundry_memory(point: Point, step: RankStep) -> float:
    """The peak under llm-foundry's recipe (scalelab.formulas.foundry_style: FSDP FULL_SHARD, PURE, MPT's blocks), or
    EstimateError in one line where the point is not what that recipe prices."""
    from scalelab.formulas import foundry_style

    if point.pipeline_parallel > 1 or foundry_style.unpriced(step) is not None:  # the step: stage 3, one replica
        raise EstimateError("--trainer llm-foundry prices its MPT benchmarks' FSDP FULL_SHARD in bf16: --zero-stage 3 "
                            "--precision bf16, no --tensor-parallel, --sequence-parallel or --pipeline-parallel")
    try:
        return foundry_style.peak_memory(point.cfg, point.n_params, step).total
    except ValueError as err:  # a shape the recipe has no formula for (its blocks are the gpt2 family's)
        raise EstimateError(f"--trainer llm-foundry: {err}") from None


def check_tensor_parallel(cfg: ModelConfig | None, degree: int) -> None:
    """EstimateError where a model cannot be split ``degree`` ways as a run would refuse it (no shape, no family
    plan, heads, key/value heads or the MLP's width the degree does not divide: scalelab.planning.run_plan)."""
    from scalelab.config import ConfigError
    from scalelab.planning.run_plan import tensor_parallel_problem

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
    node; else between nodes, on the NICs of the spanning group that holds the fewest ranks on one of its nodes,
    over the most nodes any spans (links.across_nodes: the slowest group paces the step, a ring runs at its thinnest
    node's rails, and NCCL's latency grows with the nodes and ranks)."""
    fewest, nodes = None, 1
    for group in groups:
        per_node = Counter(rank // machine.per_node for rank in group)
        if len(per_node) > 1:
            fewest = min(per_node.values()) if fewest is None else min(fewest, *per_node.values())
            nodes = max(nodes, len(per_node))
    if fewest is None:
        return machine.intra
    if machine.inter is None:
        raise EstimateError(f"--inter-node: groups of {len(groups[0])} GPUs span nodes of {machine.per_node} "
                            "(--gpus-per-node); give the link between nodes")
    return links.across_nodes(machine.inter, machine.intra, fewest, nodes, machine.per_node)


def head_share(point: Point, hardware_fpt: float) -> float:
    """The share of a GPU's compute in a step that is the head's (its 6 V d FLOPs per token: whole on every GPU, or
    split over the vocabulary where the trainer splits it), the rest the blocks'."""
    t, cfg = point.tensor_parallel, point.cfg
    head = 6 * cfg.vocab_size * cfg.d_model
    whole = t > 1 and not point.megatron
    per_gpu = (hardware_fpt - head) / t + (head if whole else head / t)
    return (head if whole else head / t) / per_gpu


def _tensor_parallel_step(point: Point, machine: Machine, gpus: int, step: RankStep, blocks_compute_s: float = 0.0) -> dict:
    """Tensor parallelism's collectives in a step over each group of T GPUs, on the link its groups need (groups_link):
    scalelab's (tensor_parallelism.tensor_parallel_comm: four all-reduces per block and micro-batch of B T d values, backward's
    in fp32) or the megatron trainer's (scalelab.formulas.megatron_style). Their time is on the critical path, for every
    block's forward waits for its own (no schedule here hides them: asynchronous tensor parallelism is out of scope).
    ``size_bytes``: nccl-tests' size summed over the calls; ``ring_bytes_per_gpu``: what a ring moves per GPU (size x
    the bus factor); the time is calls x latency + ring bytes / the link's bus bandwidth. ``step``: what each GPU runs
    (point_step)."""
    t, cfg = point.tensor_parallel, point.cfg
    if t == 1:
        return {"size_bytes": 0.0, "ring_bytes_per_gpu": 0.0, "calls": 0, "seconds": 0.0, "exposed_s": 0.0, "link": None,
                "exposed": True,
                "collectives": {}}
    if point.megatron:
        by_type = megatron_style.tensor_parallel_comm(cfg, step)
    else:  # the communication formulas' unit counts an all-reduce of S bytes as 2 S: back to nccl-tests' size
        by_type = {c: (b / links.handed_per_size(c), n) for c, (b, n) in tensor_parallelism.tensor_parallel_comm(
            cfg, step).items()}
    try:  # every tensor-parallel group at once: one that straddles a node boundary paces the step
        link = groups_link([range(k * t, (k + 1) * t) for k in range(gpus // t)], machine)
    except EstimateError:
        raise EstimateError(f"--tensor-parallel {t} spans nodes of {machine.per_node} GPUs: give --inter-node") from None
    seconds = sum(n * links.collective_seconds(c, size / n, t, link) for c, (size, n) in by_type.items() if n)
    exposed_s = seconds
    if TRAINERS[point.trainer].tensor_parallel_overlap and point.megatron:  # behind the blocks' GEMMs
        exposed_s = megatron_style.overlapped_tensor_parallel_seconds(
            seconds, cfg.n_layers, point.sequence_parallel, point.activation_checkpointing, blocks_compute_s)
    return {"size_bytes": sum(size for size, _ in by_type.values()), "calls": sum(n for _, n in by_type.values()),
            "ring_bytes_per_gpu": sum(links.bus_factor(c, t) * size for c, (size, _) in by_type.items()),
            "seconds": seconds, "exposed_s": exposed_s, "link": link.name, "exposed": exposed_s == seconds,
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

    from scalelab.registries import hardware

    fp8_peak, bf16_peak = machine.product.peak("fp8"), machine.product.peak("bf16")
    ratio = hardware.fp8_outlook(d_model)["ratio_estimate"]
    mfu = machine.mfu * bf16_peak * ratio / fp8_peak
    note = (f"fp8: the {machine.product.name}'s fp8 datasheet peak {fp8_peak / 1e12:,.1f} TFLOP/s at MFU {mfu:.1%}, i.e. "
            f"the bf16 MFU {machine.mfu:.1%} x the fp8/bf16 tokens/s ratio {ratio:.3g} measured at d_model {d_model} "
            f"(scalelab.registries.hardware.fp8_outlook) / the fp8/bf16 peak ratio {fp8_peak / bf16_peak:.3g}; its memory at "
            "stages 2 and 3 holds 4 bytes per gathered parameter where bf16 holds 2: torchao's float8 linears cast from the "
            "fp32 masters inside each matmul, so FSDP2 gathers fp32 (scalelab.formulas.communication.MIXED_COMM)")
    return replace(machine, peak_flops=fp8_peak, mfu=mfu), note
