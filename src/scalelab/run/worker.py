"""The training worker: one process per rank (``python -m scalelab.run.worker``), started by the launcher.

It reads the run's plan (scalelab.plan.run_plan, spec.json) written by :mod:`scalelab.run.launch`, trains for ``train.steps`` steps,
and has rank 0 write ``worker_result.json`` (run-level measurements) and
``progress.jsonl`` (one line per step) into the run folder. The launcher turns those into
the run's ``summary.json`` and ``steps.parquet``, and decides the status when a rank fails.
A rank that raises writes ``rank<R>.error.json`` first, so the launcher can tell OOM from
a timeout from a crash.

:func:`train` is :func:`setup` (everything before the first step), with the ``compile``
lever :func:`compile_warm_up` (compilation, timed apart), a loop of :func:`train_step` (one
optimizer step), then :func:`gather` (every rank) and :func:`results` (rank 0's
``worker_result.json``). Tests and fault drills inject faults
from ``SCALELAB_FAULT`` through one hook, :meth:`Fault.inject`.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib
import json
import math
import os
import platform
import resource
import socket
import statistics
import sys
import time
import traceback
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # imported by torch itself: free

from scalelab.config import HALF_BATCH_SHARE, ModelConfig, TrainConfig
from scalelab.formulas import communication, flops, predicted_columns
from scalelab.io import write_json
from scalelab.plan.placement import LAUNCHER_SLOT_ENV, gpu_index
from scalelab.plan.run_plan import RunPlan
from scalelab.plan.sweep import RunPoint
from scalelab.run.activations import SavedActivationMeter
from scalelab.run.calibration import measure_matmul_peak, pin_this_rank, steal_share, this_rank_ticks
from scalelab.run.calibration import peak_for as calibration_peak
from scalelab.run.comm import CommCounter, FunctionalCollectiveCounter, bytes_by_link
from scalelab.run.data import BatchSampler
from scalelab.run.devices import device_name, gpu_state, synchronize
from scalelab.run.lora import apply_lora
from scalelab.run.model import build_model
from scalelab.run.model import counted as counted_by_module
from scalelab.run.parallel import (
    Parallelized,
    apply_compile,
    clip_grad_norm,
    compiled_graphs,
    local_shard,
    model_state_bytes,
    parallelize,
    reduce_partial_grads,
)
from scalelab.run.precision import autocast, convert_linears, grad_scaler, unsupported_reason
from scalelab.run.progress import Progress
from scalelab.run.trace import MEMORY_DIR, TRACE_DIR, StepTracer, read_exposed_comm
from scalelab.spec import hardware
from scalelab.spec.precisions import precision as precision_record
from scalelab.spec.strategies import strategy

if TYPE_CHECKING:
    from scalelab.run.pipeline import Pipeline


def lr_at(step: int, train: TrainConfig) -> float:
    """Linear warm-up over warmup_steps, then cosine decay to 10% of the peak."""
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    progress = (step - train.warmup_steps) / max(1, train.steps - train.warmup_steps)
    return train.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def peak_flops(device: torch.device, precision: str, tf32: bool,
               configured_tflops: dict[str, float] | None = None, calibration: dict | None = None) -> tuple[float, str]:
    """(dense peak FLOP/s per device, where the figure came from). On a GPU: the datasheet
    figure of the exact product (scalelab.spec.hardware), or train.peak_tflops for one the table
    lacks; otherwise NaN and the reason, never a timed guess (small timed matmuls sit far
    below a GPU's peak and would inflate MFU). On a CPU, which has no datasheet figure here:
    the sweep's calibration (scalelab.run.calibration: measured once per results folder, with the load it saw) where it
    applies, else the best matmul rate measured at start, beside whatever else runs."""
    if device.type == "cuda":
        return hardware.peak_flops_for(torch.cuda.get_device_name(device), precision, tf32, configured_tflops)
    if calibrated := calibration_peak(calibration, precision, torch.get_num_threads()):
        return calibrated
    # named by the dtype it measures: an fp8 run's is a bf16 matmul (float8 is emulated on a CPU)
    dtype = precision_record(precision).matmul_precision
    return (measure_matmul_peak(device, precision_record(dtype).compute),
            f"measured {dtype} matmul at run start, {torch.get_num_threads()} threads (no sweep calibration)")


def bf16_peak_flops(device: torch.device, precision: str, tf32: bool, run_peak: tuple[float, str],
                    configured_tflops: dict[str, float] | None = None, calibration: dict | None = None) -> tuple[float, str]:
    """(dense bf16 peak FLOP/s per device, its source): the denominator of ``mfu_bf16_peak``,
    every run's MFU on one scale (scalelab.formulas.flops's docstring). A run whose own peak is
    the bf16 one (bf16; fp8 on a CPU, whose fp8 runs compute in bf16) reuses it."""
    if precision == "bf16" or (device.type != "cuda" and precision_record(precision).matmul_precision == "bf16"):
        return run_peak
    return peak_flops(device, "bf16", tf32, configured_tflops, calibration)


def nccl_version() -> str:
    """NCCL's version: a tuple in recent torch, an int (e.g. 21803) in older releases."""
    version = torch.cuda.nccl.version()
    if isinstance(version, int):
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return ".".join(map(str, version))


class Fault:
    """Fault injection for tests and drills, from SCALELAB_FAULT="kind@step=S,rank=R".

    kinds: inf_grad (a non-finite gradient element on that rank), crash (raise), oom (raise
    torch's out-of-memory error, as a GPU would), hang
    (sleep before the step's collectives), delay (sleep ``ms=`` milliseconds before each step
    of ``step=A-B``: a straggler the other ranks wait for in their first collective), exit (hard
    exit without cleanup), teardown (abort in process-group teardown, after the results are
    written). Any other value (scalelab.io.fault_point's names) injects nothing here.
    """

    # The moment each kind strikes: the hook is called at every one of them.
    MOMENT = {"hang": "before_step", "crash": "before_step", "oom": "before_step", "exit": "before_step",
              "delay": "before_step", "inf_grad": "after_backward", "teardown": "teardown"}

    def __init__(self, spec: str | None):
        self.kind = None
        if spec:
            self.kind, _, args = spec.partition("@")
            kv = dict(item.split("=") for item in args.split(",") if item)
            first, _, last = str(kv.get("step", 0)).partition("-")
            self.steps = range(int(first), int(last or first) + 1)
            self.step, self.rank = int(first), int(kv.get("rank", 0))
            self.ms = float(kv.get("ms", 0))

    @classmethod
    def from_env(cls) -> "Fault":
        return cls(os.environ.get("SCALELAB_FAULT"))

    def inject(self, moment: str, step: int, rank: int, model: torch.nn.Module | None = None) -> None:
        """The one hook: inject this fault if it is due at this moment of this step on this rank.
        model: the wrapped model whose gradients inf_grad spoils (at "after_backward")."""
        if self.MOMENT.get(self.kind) != moment or step not in self.steps or rank != self.rank:
            return
        if self.kind == "delay":
            time.sleep(self.ms / 1e3)
        elif self.kind == "hang":
            time.sleep(10 ** 6)
        elif self.kind == "crash":
            raise RuntimeError(f"injected crash at step {step} on rank {rank}")
        elif self.kind == "oom":
            raise torch.OutOfMemoryError(f"injected: out of memory at step {step} on rank {rank}")
        elif self.kind == "exit":
            os._exit(17)
        elif self.kind == "inf_grad":
            grad = next(p.grad for p in model.parameters() if p.grad is not None)
            (grad.to_local() if hasattr(grad, "to_local") else grad).view(-1)[0] = float("inf")
        elif self.kind == "teardown":
            os.abort()


@dataclass
class Run:
    """What one rank sets up before its first step and keeps for the whole run."""
    plan: RunPlan  # what the launcher decided (scalelab.plan.run_plan): the point, configs, batch split
    rank: int
    world_size: int
    device: torch.device
    micro: int  # sequences per micro-batch: the plan's, halved while measure_token_share times half batches
    fault: Fault
    peak: float  # dense peak FLOP/s per device, and where that figure came from
    peak_source: str
    peak_bf16: float  # the dense bf16 peak (mfu_bf16_peak), and its source
    peak_bf16_source: str
    n_params: int
    param_bytes: list[int]  # per parameter, in model order (predicts DDP's buckets)
    fp8_linears: int | None
    blocks: list[torch.nn.Module]  # the transformer blocks, whose saved activations are measured
    par: Parallelized
    scaler: torch.amp.GradScaler  # fp16: torch.distributed.fsdp's ShardedGradScaler
    sampler: BatchSampler
    counter: CommCounter
    start_step: int  # 0, or the step after the checkpoint this attempt resumed from
    progress: TextIO | None  # rank 0's progress.jsonl, open for appending step records
    n_trainable: int | None = None  # LoRA's trainable parameters (A and B); None = full training
    last_block_kept: int = 0  # the last block's parameters (this rank's tensor-parallel share) FSDP2 keeps gathered
    rank_cores: str | None = None  # the launcher's CPU core plan (pin_cpu_rank); None on a GPU
    tp_bytes: float = 0.0  # tensor parallelism's collective bytes counted over the warm-up steps (FunctionalCollectiveCounter)
    tp_steps: int = 0  # the warm-up steps they were counted over
    tp_by_group: dict = field(default_factory=dict)  # (collective, group ranks) -> those bytes
    pipe: Pipeline | None = None  # this rank's pipeline stages (scalelab.run.pipeline), under pipeline parallelism
    pipe_busy: list[float] = field(default_factory=list)  # per timed step: the share of the schedule's time it computed
    pipe_timeline: list = field(default_factory=list)  # the last timed step's forward and backward intervals
    pipe_held: int | None = None  # the most bytes of block activations held at once on the measured step
    pipe_timeline_start: float = 0.0  # the unix time that step started

    @property
    def tensor_parallel(self) -> int:
        return self.plan.point.tensor_parallel

    @property
    def pipeline_parallel(self) -> int:
        return self.plan.point.pipeline_parallel

    @property
    def data_rank(self) -> int:
        """This rank's data-parallel index on the (pp, dp, tp) mesh: a tensor-parallel group (consecutive ranks) of
        every pipeline stage shares one share of the batch."""
        return (self.rank // self.tensor_parallel) % self.data_ranks

    @property
    def data_ranks(self) -> int:
        return self.world_size // (self.tensor_parallel * self.pipeline_parallel)

    @property
    def point(self) -> RunPoint:
        return self.plan.point

    @property
    def model_cfg(self) -> ModelConfig:
        return self.plan.model

    @property
    def train_cfg(self) -> TrainConfig:
        return self.plan.train

    @property
    def accum(self) -> int:  # micro-batches per step
        return self.plan.accumulation_steps

    @property
    def run_dir(self) -> Path:
        return Path(self.plan.run_dir)

    @property
    def tokens_per_step(self) -> int:
        return self.train_cfg.global_batch * self.model_cfg.seq_len

    @property
    def ckpt_root(self) -> Path:
        return self.run_dir / "checkpoint"


@dataclass
class StepOutcome:
    """What train_step hands the loop to record."""
    loss: torch.Tensor  # the global batch's mean loss over every rank
    grad_norm: torch.Tensor  # before clipping
    loss_scale: float | None  # the fp16 loss scale this step used; None without a scaler
    skipped: bool  # the scaler skipped the optimizer step (a non-finite gradient on some rank)
    time_s: float
    activations: dict | None  # bytes saved for backward by the first micro-batch, when asked to measure


@dataclass
class Tally:
    """What the loop accumulates for the run-level results (this attempt's steps only)."""
    compile_time_s: float | None = None  # compile_warm_up's wall time (the compile lever)
    compile_graphs: int | None = None  # graphs TorchDynamo compiled in it
    compile_graphs_in_loop: int | None = None  # graphs compiled during the steps: 0 keeps compilation out of step times
    step_times: list[float] = field(default_factory=list)  # steps after warm-up
    skipped_steps: int = 0
    first_step_at: float | None = None  # unix time
    activations: dict | None = None  # measured on this attempt's first micro-batch
    loop_start: float = 0.0  # perf_counter at the first step after warm-up (the loop's start before it)
    loop_time: float = 0.0  # the whole loop after warm-up, measurement included
    ticks_start: tuple[int, int] | None = None  # this rank's cores' (steal, total) ticks at loop_start, and at loop_time's end
    ticks_end: tuple[int, int] | None = None
    timing_steps: int = 0  # steps past train.steps that only lengthened the measurement (extend_measurement)
    half_batch_step_times: list[float] = field(default_factory=list)  # measure_token_share's steps
    gpu_start: dict = field(default_factory=dict)  # rank 0's GPU before the steps and after them (devices.gpu_state)
    gpu_end: dict = field(default_factory=dict)

    def start_loop(self) -> None:
        self.loop_start = time.perf_counter()
        self.ticks_start = this_rank_ticks()

    def end_loop(self) -> None:
        self.loop_time = time.perf_counter() - self.loop_start
        self.ticks_end = this_rank_ticks()


@dataclass
class Gathered:
    """Measurements every rank contributes after the last step."""
    held: list[dict]  # model state bytes at rest, per rank, by kind
    mem: list[dict]  # peak memory per rank
    comm: dict  # this rank's counted collective calls and bytes, by type
    pipe: list | None = None  # every rank's pipeline figures (scalelab.run.pipeline.rank_figures); None without one


def rank_device(requested: str) -> torch.device:
    """This rank's device: the CPU, or its own GPU (scalelab.plan.placement.gpu_index), made current."""
    device = torch.device(requested)
    if device.type == "cuda":
        device = torch.device("cuda", gpu_index(int(os.environ.get("LOCAL_RANK", 0)),
                                                int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                                                int(os.environ.get(LAUNCHER_SLOT_ENV) or 0), torch.cuda.device_count()))
        torch.cuda.set_device(device)
    return device


def setup(plan: RunPlan, rank_cores: str | None = None) -> Run:
    """Everything before the first step: device, model, strategy, scaler, sampler, communication
    counter, resume from a checkpoint, progress file; the rest is the plan's (scalelab.plan.run_plan)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    run_dir = Path(plan.run_dir)
    device = rank_device(plan.device)
    model_cfg, train_cfg, point = plan.model, plan.train, plan.point
    fault = Fault.from_env()
    torch.backends.cuda.matmul.allow_tf32 = train_cfg.tf32  # CUDA's switches: no effect on a CPU (which tf32 refuses)
    torch.backends.cudnn.allow_tf32 = train_cfg.tf32

    calibration = plan.calibration  # the sweep's CPU peaks (scalelab.run.calibration), None outside the workflow
    peak, peak_source = peak_flops(device, point.precision, train_cfg.tf32, train_cfg.peak_tflops, calibration)
    peak_bf16, peak_bf16_source = bf16_peak_flops(device, point.precision, train_cfg.tf32, (peak, peak_source),
                                                  train_cfg.peak_tflops, calibration)

    torch.manual_seed(train_cfg.seed)  # identical initial weights on every rank
    model = build_model(model_cfg).to(device)  # its family's class, or the user's module
    mesh, dp_mesh, chunks = split_model(model, point, device, world_size)
    # LoRA after the model is built: the base weights are those of the full-training twin.
    n_trainable = apply_lora(model, point.lora_rank, train_cfg.lora_alpha) if point.lora_rank else None
    n_params = model.num_parameters()  # the whole model's (a pipeline rank's chunks share its parameters)
    # what FSDP2 keeps gathered from each chunk's last block's forward to its backward (scalelab.run.parallel): counted
    # here, after tensor parallelism split it and LoRA added to it, as the formulas count it
    last_block_kept = sum(sum(local_shard(p).numel() for p in chunk.blocks[-1].parameters())
                          for _, chunk in chunks) if plan.strategy.last_block_kept else 0
    # DDP fills buckets (trainable parameters only) in gradient-ready order, about the reverse of this one.
    param_bytes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
    model.set_activation_checkpointing(point.activation_checkpointing)
    fp8_linears = convert_linears(point.precision, model, train_cfg.fp8_emulate)
    if fp8_linears is not None and not point.compile and rank == 0:
        print(f"scalelab worker: warning: fp8 without compile: {hardware.fp8_outlook(model_cfg.d_model, compiled=False)['verdict']}",
              flush=True)
    # (converted before sharding: FSDP2 then shards the Float8Linear weights)
    if point.compile:  # after checkpointing and fp8, before wrapping (torchtitan's order)
        for _, chunk in chunks:
            apply_compile(chunk)
    # The dtypes its collectives carry (the plan's, scalelab.formulas.communication.comm_dtypes): fp16 and bf16
    # gather in their compute dtype at stages 2 and 3 (FSDP2's MixedPrecisionPolicy); fp32 is FSDP2's default.
    dtypes = plan.comm
    param_dtype = None if dtypes.param_gather in (None, "float32") else getattr(torch, dtypes.param_gather)
    pipe = None
    if point.pipeline_parallel > 1:
        from scalelab.run import pipeline

        par, pipe = pipeline.parallelize(chunks, mesh, plan, device, param_dtype, getattr(torch, dtypes.grad_reduce),
                                         lambda: autocast(point.precision, device))
        model = chunks[-1][1]
    else:
        par = parallelize(model, point.zero_stage, device, train_cfg.lr, train_cfg.weight_decay,
                          bucket_mb=point.bucket_mb, cpu_offload=point.cpu_offload, replicas=point.replicas,
                          param_dtype=param_dtype, reduce_dtype=getattr(torch, dtypes.grad_reduce), dp_mesh=dp_mesh,
                          tensor_parallel=point.tensor_parallel)
    blocks = [block for _, chunk in chunks for block in chunk.blocks]
    scaler = grad_scaler(point.precision, device, train_cfg.fp16_init_scale)
    if pipe is not None and scaler.is_enabled():
        pipe.scaler = scaler  # the schedule's loss scaled as each micro-batch's is without a pipeline
        scaler.scale(torch.zeros((), device=device))  # makes its scale on every stage: only the last one scales losses
    sampler = BatchSampler(plan.train_bin, plan.token_dtype, model_cfg.seq_len, train_cfg.seed)
    counter = CommCounter().install()
    start_step, progress = resume(run_dir, train_cfg, par, scaler, rank)
    return Run(plan=plan, rank=rank, world_size=world_size, device=device, micro=plan.micro_batch, fault=fault, peak=peak,
               peak_source=peak_source, peak_bf16=peak_bf16, peak_bf16_source=peak_bf16_source, n_params=n_params,
               param_bytes=param_bytes, fp8_linears=fp8_linears,
               blocks=blocks, par=par, scaler=scaler, sampler=sampler, counter=counter, start_step=start_step,
               progress=progress, n_trainable=n_trainable, rank_cores=rank_cores, last_block_kept=last_block_kept, pipe=pipe)


def split_model(model: torch.nn.Module, point: RunPoint, device: torch.device, world_size: int):
    """(mesh, data-parallel mesh, this rank's chunks [(chunk index, module)]): the model split for model parallelism.
    Tensor parallelism first, as torchtitan orders it (then checkpointing, compile, the data-parallel wrapper): a 2-D
    mesh, tensor-parallel ranks inner (consecutive: within a node), the strategy over the outer one; under pipeline
    parallelism a (pp, dp, tp) mesh, and this rank's chunks of the model (scalelab.run.pipeline), each split by
    tensor parallelism. Without either: no mesh, the whole model one chunk."""
    dp_mesh, tp_mesh, mesh, chunks = None, None, None, [(0, model)]
    if point.pipeline_parallel > 1:
        from scalelab.run import pipeline

        mesh = pipeline.build_mesh(device.type, world_size, point.pipeline_parallel, point.tensor_parallel, point.replicas)
        chunks = pipeline.chunk_modules(model, mesh["pp"].get_local_rank(), point.pipeline_parallel, point.pipeline_schedule)
        tp_mesh = mesh["tp"] if point.tensor_parallel > 1 else None
    elif point.tensor_parallel > 1:
        mesh = init_device_mesh(device.type, (world_size // point.tensor_parallel, point.tensor_parallel),
                                mesh_dim_names=("dp", "tp"))
        dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]
    if tp_mesh is not None:
        from scalelab.run.tensor_parallel import apply_tensor_parallel  # here: DTensor's import costs a rank ~0.7 s

        for _, chunk in chunks:
            apply_tensor_parallel(chunk, tp_mesh, point.sequence_parallel)
    return mesh, dp_mesh, chunks


def resume(run_dir: Path, train_cfg: TrainConfig, par: Parallelized, scaler: torch.amp.GradScaler,
           rank: int) -> tuple[int, TextIO | None]:
    """(first step to run, rank 0's progress file or None): resumes from the newest complete
    checkpoint, and rank 0 keeps the step records up to it."""
    start_step = 0
    found = None
    if train_cfg.checkpoint_every:
        # here, not at the top: torch.distributed.checkpoint imports DTensor (about 0.7 s per rank)
        from scalelab.run import checkpoint

        found = checkpoint.latest(run_dir / "checkpoint")
    kept = []
    if found:
        checkpoint.load(found[1], par, scaler)
        start_step = found[0] + 1
        if rank == 0 and (run_dir / "progress.jsonl").exists():
            kept = [line for line in (run_dir / "progress.jsonl").read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] < start_step]
    progress = None
    if rank == 0:
        progress = open(run_dir / "progress.jsonl", "w")
        progress.writelines(line + "\n" for line in kept)
        progress.flush()
    return start_step, progress


def train_step(run: Run, step: int, measure_activations: bool) -> StepOutcome:
    """One optimizer step on this rank's share of the global batch: the micro-batches with
    gradient accumulation, loss scaling, clipping; then the global loss, outside the
    communication count. Fault points: before the step and after backward."""
    par, scaler, device = run.par, run.scaler, run.device
    run.fault.inject("before_step", step, run.rank)
    start = time.perf_counter()

    tokens = torch.from_numpy(run.sampler.batch(step, run.data_rank, run.micro * run.accum, run.data_ranks)).to(device, non_blocking=True)
    loss_sum = torch.zeros((), device=device)
    activations = None
    if run.pipe is not None:  # the schedule runs every micro-batch's forward and backward over the stages
        loss_sum = pipeline_step(run, tokens, measure_activations)
    for m in range(run.accum if run.pipe is None else 0):
        chunk = tokens[m * run.micro:(m + 1) * run.micro]
        measure = measure_activations and m == 0
        with par.no_sync(m == run.accum - 1):
            meter = SavedActivationMeter(par.model, run.blocks) if measure else contextlib.nullcontext()
            with meter, autocast(run.point.precision, device):
                loss = par.model(chunk[:, :-1], chunk[:, 1:])
            if measure:
                activations = {"inside": meter.inside_blocks, "outside": meter.outside_blocks}
            scaler.scale(loss / run.accum).backward()
        loss_sum += loss.detach()
    reduce_partial_grads(par)  # sequence parallelism's partial gradients, where no FSDP2 reduction summed them
    run.fault.inject("after_backward", step, run.rank, model=par.model)
    # The scale the step used, kept on the device until the step ends: get_scale() (.item()) here
    # would make the host wait for the backward mid-step, a synchronisation a plain loop has not.
    scale_before = scaler._get_scale_async().clone() if scaler.is_enabled() else None
    scaler.unscale_(par.optimizer)
    max_norm = run.train_cfg.grad_clip if run.train_cfg.grad_clip > 0 else float("inf")
    grad_norm = clip_grad_norm(par, max_norm, device)
    scaler.step(par.optimizer)
    scaler.update()
    synchronize(device)
    step_time = time.perf_counter() - start
    scale_before = float(scale_before) if scale_before is not None else 1.0

    # Measurement: the global batch's loss (mean over ranks) and the skip flag.
    with run.counter.paused():
        loss_global = loss_sum / run.accum
        dist.all_reduce(loss_global, op=dist.ReduceOp.SUM)  # gloo has no AVG
        loss_global /= run.world_size // run.pipeline_parallel  # the last stage's ranks hold the losses
    scale_after = scaler.get_scale() if scaler.is_enabled() else 1.0
    return StepOutcome(loss=loss_global, grad_norm=grad_norm,
                       loss_scale=scale_before if scaler.is_enabled() else None,
                       skipped=bool(scaler.is_enabled() and scale_after < scale_before),
                       time_s=step_time, activations=activations)


def pipeline_step(run: Run, tokens: torch.Tensor, measure_held: bool) -> torch.Tensor:
    """One step's schedule on this rank's stages (scalelab.run.pipeline), counted while the step is, its busy share
    and timeline kept for a timed step; ``measure_held``: the block activations it holds at most, measured."""
    from scalelab.run import pipeline

    pipe = run.pipe
    pipe.counting = run.counter.enabled
    meter = pipeline.LiveSavedBytes(run.blocks) if measure_held else contextlib.nullcontext()
    with meter:
        loss_sum = pipeline.step(pipe, tokens)
    if measure_held:
        meter.remove()
        run.pipe_held = meter.peak
    if run.counter.enabled:
        run.pipe_busy.append(pipe.busy_share())
        run.pipe_timeline, run.pipe_timeline_start = list(pipe.timeline), pipe.step_start_unix
    return loss_sum


def compile_warm_up(run: Run) -> tuple[float, int]:
    """Compile before the first step, so that no step time holds compilation: one forward and
    backward of the first step's first micro-batch (the shapes every step uses), under the
    run's autocast, gradients dropped. Returns (seconds, graphs compiled).

    It leaves what the loop computes unchanged: no optimizer step, no loss scaler, the
    gradients set to None (as between steps), the RNG state restored, DDP's all-reduce
    skipped (Parallelized.throwaway_backward), communication uncounted. The seconds are
    compilation plus one micro-batch's compiled forward and backward (milliseconds); a warm
    inductor cache (TORCHINDUCTOR_CACHE_DIR) makes a repeated run compile faster."""
    par, device = run.par, run.device
    graphs_before = compiled_graphs()
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    tokens = torch.from_numpy(run.sampler.batch(run.start_step, run.data_rank, run.micro * run.accum, run.data_ranks)).to(device)
    chunk = tokens[:run.micro]
    start = time.perf_counter()
    with run.counter.paused(), par.throwaway_backward():
        with autocast(run.point.precision, device):
            loss = par.model(chunk[:, :-1], chunk[:, 1:])
        loss.backward()
    synchronize(device)
    seconds = time.perf_counter() - start
    for p in par.model.parameters():
        p.grad = None
    torch.set_rng_state(rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state(cuda_rng, device)
    return seconds, compiled_graphs() - graphs_before


class Diverged(RuntimeError):
    """The loss is no longer finite: every further step would measure nothing."""


class Unsupported(RuntimeError):
    """The error type of a rank whose device cannot run the point (written by :func:`preflight`):
    the launcher records the run `skipped` with the message as the reason
    (scalelab.run.ranks.classify_failure)."""


def train(plan: RunPlan, rank_cores: str | None = None) -> None:
    """Set up, run the steps this attempt has left, and have rank 0 write the results."""
    run = setup(plan, rank_cores)
    cfg = run.train_cfg
    tally = Tally()
    if run.point.compile and plan.compile_warm_up:
        tally.compile_time_s, tally.compile_graphs = compile_warm_up(run)
    graphs_before_loop = compiled_graphs()
    if run.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(run.device)
    tally.start_loop()
    log = Progress(cfg.steps, run.tokens_per_step, run.device, run.start_step, measure_s=cfg.measure_s,
                   warmup_steps=cfg.warmup_steps, half_batch_share=HALF_BATCH_SHARE if run.micro >= 2 else 0.0)
    tracer = StepTracer(cfg.profile, cfg.profile_stacks, cfg.memory_snapshot, run.device, run.run_dir, run.rank)
    tally.gpu_start = gpu_state(run.device) if run.rank == 0 else {}
    try:
        _steps(run, tally, tracer, log)
    except torch.OutOfMemoryError:
        tracer.dump_memory(oom=True)  # what the allocator held when it ran out (train.memory_snapshot)
        raise
    if tracer.memory and cfg.profile is None:
        tracer.dump_memory()  # no traced steps to dump after: the whole run's history
    if plan.save_final_params:
        save_final_params(run)  # the trained model: before any timing step moves it
    tally.timing_steps = extend_measurement(run, tally)
    tally.half_batch_step_times = measure_token_share(run, tally)
    run.counter.enabled = False
    tally.end_loop()
    tally.gpu_end = gpu_state(run.device) if run.rank == 0 else {}
    if run.point.compile:
        tally.compile_graphs_in_loop = compiled_graphs() - graphs_before_loop

    gathered = gather(run, steal_share(tally.ticks_start, tally.ticks_end))
    if run.rank == 0:
        result = results(run, tally, gathered)
        run.progress.close()
        write_json(run.run_dir / "worker_result.json", result)


@contextlib.contextmanager
def tensor_parallel_count(run: Run, step: int):
    """Counts tensor parallelism's collectives (DTensor's functional ones, which CommCounter's wrappers do
    not see) over the warm-up steps of an eager run, with a dispatch mode the timed steps do without
    (it sees every operator); a compiled block runs them inside its graph, out of the mode's sight."""
    # (a pipeline's first step also runs a forward that infers the shapes its stages send: not counted)
    if (run.tensor_parallel == 1 or step >= run.train_cfg.warmup_steps or run.point.compile
            or (run.pipe is not None and step == run.start_step)):
        yield
        return
    counter = FunctionalCollectiveCounter()
    with counter:
        yield
    run.tp_bytes += sum(counter.group_bytes.values())
    run.tp_steps += 1
    for key, nbytes in counter.group_bytes.items():
        run.tp_by_group[key] = run.tp_by_group.get(key, 0) + nbytes


def _steps(run: Run, tally: Tally, tracer: StepTracer, log: Progress) -> None:
    """The training steps this attempt has left (traced ones, train.profile, left out of the timings)."""
    cfg = run.train_cfg
    for step in range(run.start_step, cfg.steps):
        lr = lr_at(step, cfg)
        for group in run.par.optimizer.param_groups:
            group["lr"] = lr
        run.counter.enabled = step >= cfg.warmup_steps
        if step == cfg.warmup_steps:
            tally.start_loop()  # whole-loop time, measurement included
        if tally.first_step_at is None:
            tally.first_step_at = time.time()
        # the first step of an attempt measures a micro-batch's activations; under pipelining the second measures what
        # the stages hold at once (the first infers the shapes its stages send)
        measure = step == run.start_step + 1 if run.pipe is not None else tally.activations is None
        with tracer.step(step), tensor_parallel_count(run, step):
            out = train_step(run, step, measure_activations=measure)
        if out.activations is not None:
            tally.activations = out.activations
        tally.skipped_steps += out.skipped
        if step >= cfg.warmup_steps and not tracer.traced(step):  # a traced step pays the profiler's bookkeeping
            tally.step_times.append(out.time_s)
        if run.progress is not None:
            record = {
                "step": step, "loss": out.loss.item(), "grad_norm": float(out.grad_norm),
                "lr": lr, "loss_scale": out.loss_scale,
                "skipped": out.skipped, "step_time_s": out.time_s, "tokens": run.tokens_per_step,
            }
            run.progress.write(json.dumps(record) + "\n")
            run.progress.flush()
            if log.due(step):  # rank 0's stdout is the run's log
                print(log.line(step, record["loss"], out.time_s), flush=True)
        loss = out.loss.item()  # the global batch's loss, the same on every rank: all stop together
        if not math.isfinite(loss):
            raise Diverged(f"the loss became {loss} at step {step}: training diverged (lr={lr:g})")
        if step < cfg.steps - 1:
            run.par.optimizer.zero_grad(set_to_none=True)
            if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                from scalelab.run import checkpoint  # imported by resume() already

                with run.counter.paused():
                    checkpoint.save(run.ckpt_root, step, run.par, run.scaler)


MAX_TIMING_STEPS = 10_000
"""At most this many timing steps past train.steps (extend_measurement): a bound, whatever measure_s says."""


def extend_measurement(run: Run, tally: Tally) -> int:
    """Timing steps: past train.steps, more optimizer steps until the measured steps (after warm-up)
    add up to train.measure_s seconds, so that a run's speed is measured over what it must resolve,
    not over a step count (a fast configuration's 50 steps last half a second, which a few seconds of
    anything else on the host swing). They train on (at the last step's learning rate) but
    are not training steps: no step record, no loss, not in final_params.pt or the loss curve; the
    summary counts them (timing_steps). Every rank stops at the same step: the decision is all-reduced
    (the smallest vote), outside the communication count."""
    cfg = run.train_cfg
    if not cfg.measure_s:
        return 0
    for group in run.par.optimizer.param_groups:
        group["lr"] = lr_at(cfg.steps - 1, cfg)
    return _until(run, tally.step_times, cfg.measure_s, cfg.steps)


def _until(run: Run, times: list[float], seconds: float, step_from: int, at_least: int = 0) -> int:
    """Take optimizer steps (numbered from step_from), appending each one's time to ``times``,
    until they add up to ``seconds`` and number at least ``at_least`` on every rank (each rank stops at
    the same step: the decision is all-reduced, any rank short of it takes one more, outside the
    communication count; rank 0's times are the run's, so a smallest vote left them short);
    at most MAX_TIMING_STEPS. Returns how many it took."""
    n = 0
    while n < MAX_TIMING_STEPS:
        more = torch.tensor(int(sum(times) < seconds or len(times) < at_least), device=run.device)
        with run.counter.paused():
            dist.all_reduce(more, op=dist.ReduceOp.MAX)
        if not more.item():
            break
        run.par.optimizer.zero_grad(set_to_none=True)
        times.append(train_step(run, step_from + n, measure_activations=False).time_s)
        n += 1
    return n


HALF_BATCH_MIN_STEPS = 5


def measure_token_share(run: Run, tally: Tally) -> list[float]:
    """Steps at half the micro-batch, after the measured steps: with the measured window's median
    step time they give the **token share** of this configuration's step, the part that grows with
    the tokens a rank processes (scalelab.results.prediction: it carries a measured step to another
    micro-batch or world size; a share assumed instead spans a band from its estimate to 1).
    Taken when train.measure_s is set, for HALF_BATCH_SHARE of it (at least
    HALF_BATCH_MIN_STEPS steps); none where the micro-batch is a single sequence. Like timing steps,
    they train on but are no training steps, and count in no run-level timing but this one."""
    cfg = run.train_cfg
    if not cfg.measure_s or run.micro < 2 or run.pipe is not None:  # a pipeline's stages send the shapes they inferred
        return []
    full, run.micro = run.micro, run.micro // 2
    times: list[float] = []
    try:
        with run.counter.paused():  # the run's bytes per step are its full batch's
            _until(run, times, HALF_BATCH_SHARE * cfg.measure_s, cfg.steps + tally.timing_steps, HALF_BATCH_MIN_STEPS)
    finally:
        run.micro = full
    return times


def token_share(step_s: float, half_step_s: float, micro: int) -> float:
    """The share s of a step that grows with the tokens, from its time t at micro-batch m and t' at
    m // 2 (step time = t ((1 - s) + s x tokens ratio)), clipped to [0, 1]."""
    ratio = (micro // 2) / micro
    return min(max((1 - half_step_s / step_s) / (1 - ratio), 0.0), 1.0)


def gpu_state_columns(start: dict, end: dict) -> dict:
    """Rank 0's GPU beside the run (devices.gpu_state): power cap and driver once, clocks and temperature
    before and after the steps; every column null where nvidia-smi said nothing (a CPU run)."""
    out = {"gpu_power_limit_w": start.get("gpu_power_limit_w"), "gpu_driver_version": start.get("gpu_driver_version")}
    for stem in ("gpu_sm_clock_mhz", "gpu_mem_clock_mhz", "gpu_temperature_c"):
        out[f"{stem}_start"], out[f"{stem}_end"] = start.get(stem), end.get(stem)
    return out


def trace_figures(run: Run) -> dict:
    """The trace columns (train.profile, train.memory_snapshot): which steps were traced, where each
    rank's files lie (relative to the run folder), and rank 0's exposed communication per traced step
    (their median), read from its trace."""
    cfg = run.train_cfg
    exposed = read_exposed_comm(run.run_dir, 0) if cfg.profile is not None else None
    snapshots = cfg.memory_snapshot and run.device.type == "cuda"
    return {"profiled_steps": f"{cfg.profile[0]}-{cfg.profile[1]}" if cfg.profile is not None else None,
            "trace_files": f"{TRACE_DIR}/rank*.json ({run.world_size})" if cfg.profile is not None else None,
            "memory_snapshot_files": f"{MEMORY_DIR}/rank*.pickle ({run.world_size})" if snapshots else None,
            "exposed_comm_s_measured": statistics.median(exposed.values()) if exposed else None}


def median_sem(times: list[float]) -> float:
    """The standard error of a median of step times: 1.2533 x sigma / sqrt(n), sigma from the
    median absolute deviation (1.4826 MAD: robust to the odd slow step)."""
    mid = statistics.median(times)
    return 1.2533 * 1.4826 * statistics.median(abs(t - mid) for t in times) / math.sqrt(len(times))


def half_batch_figures(step_times: list[float], half_times: list[float], micro: int) -> dict:
    """The half-batch columns: their steps, median, the token share and its standard error from the
    two medians' own scatter (within the run: the run-to-run noise is the step-time model's other term)."""
    if not half_times:
        return {"half_batch_steps": None, "step_time_s_median_half_batch": None, "token_share_measured": None,
                "token_share_measured_sem": None}
    t, h = statistics.median(step_times), statistics.median(half_times)
    ratio = (micro // 2) / micro
    sem = (h / t) / (1 - ratio) * math.hypot(median_sem(step_times) / t, median_sem(half_times) / h)
    return {"half_batch_steps": len(half_times), "step_time_s_median_half_batch": h,
            "token_share_measured": token_share(t, h, micro), "token_share_measured_sem": sem}


def save_final_params(run: Run) -> None:
    """The whole final parameters to final_params.pt (rank 0; every rank gathers its shards)."""
    from scalelab.run.tensor_parallel import full_state

    if run.pipe is not None:  # every stage's part, on rank 0
        from scalelab.run.pipeline import whole_state

        full = whole_state(run.pipe, run.tensor_parallel, sends=run.data_rank == 0 and run.rank % run.tensor_parallel == 0)
    else:
        full = full_state(run.par.model, run.tensor_parallel)  # DTensors gathered, a fused q, k, v in the model's order
    if run.rank == 0:
        torch.save({k.removeprefix("module.").replace("_orig_mod.", ""): v for k, v in full.items()},
                   run.run_dir / "final_params.pt")


def gather(run: Run, steal: float | None) -> Gathered:
    """The collective end of the run, on every rank: model state, peak memory and the hypervisor's share of its
    cores during the timed loop (``steal``) of each rank to rank 0; stops counting."""
    # Model state at rest: after the last optimizer step, gradients not yet freed.
    held = model_state_bytes(run.par)
    all_held = [None] * run.world_size
    dist.all_gather_object(all_held, held)
    mem = {}
    if run.device.type == "cuda":
        mem = {"peak_mem_allocated_bytes": torch.cuda.max_memory_allocated(run.device),
               "peak_mem_reserved_bytes": torch.cuda.max_memory_reserved(run.device)}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    all_mem = [None] * run.world_size
    dist.all_gather_object(all_mem, {**mem, "peak_rss_bytes": rss, "hostname": socket.gethostname(),  # each rank's host
                                     "boot_id": machine_id(), "host_steal_share": steal})
    counted = {"calls": dict(run.counter.calls), "bytes": dict(run.counter.bytes), "by_group": run.counter.by_group()}
    run.counter.uninstall()
    all_pipe = None
    if run.pipe is not None:
        from scalelab.run.pipeline import rank_figures

        all_pipe = [None] * run.world_size
        dist.all_gather_object(all_pipe, rank_figures(run.pipe, run.pipe_busy, run.pipe_held, run.pipe_timeline,
                                                      run.pipe_timeline_start))
    return Gathered(held=all_held, mem=all_mem, comm=counted, pipe=all_pipe)


def step_time_drift(step_times: list[float]) -> float | None:
    """The median step time of the second half of the timed steps over the first half's, less 1 (rank 0's steps,
    which its collectives keep in step with the others'): near 0 where the run's speed was steady, far from it where
    it changed while the run was timed (scalelab.spec.hardware.DRIFT_WARN). None under DRIFT_MIN_STEPS steps."""
    if len(step_times) < hardware.DRIFT_MIN_STEPS:
        return None
    half = len(step_times) // 2
    return statistics.median(step_times[half:]) / statistics.median(step_times[:half]) - 1


def results(run: Run, tally: Tally, gathered: Gathered) -> dict:
    """worker_result.json (rank 0): the run-level measurements beside their predictions."""
    model_cfg, point, world_size, accum = run.model_cfg, run.point, run.world_size, run.accum
    ac = point.activation_checkpointing
    step_times, all_held, all_mem, counted = tally.step_times, gathered.held, gathered.mem, gathered.comm
    rank_hosts = [m["hostname"] for m in all_mem]
    n_measured = max(1, len(step_times))  # this attempt's steps after warm-up
    total_time = sum(step_times)
    tokens_per_s = run.tokens_per_step * len(step_times) / total_time
    # a family's formulas; a user's module: its FLOPs counted (torch.utils.flop_counter), no activation prediction
    custom = counted_by_module(model_cfg) if model_cfg.module else None
    fpt = custom["flops_per_token"] if custom else flops.flops_per_token(model_cfg)
    recompute_fpt = (custom["block_forward_flops_per_token"] if custom else flops.recompute_flops_per_token(model_cfg)) if ac else 0.0
    return {
        "n_params": run.n_params,
        "n_trainable_params": run.n_params if run.n_trainable is None else run.n_trainable,
        "last_block_params_kept": run.last_block_kept,
        "lora_alpha": run.train_cfg.lora_alpha if run.n_trainable is not None else None,
        "accumulation_steps": accum,
        "tokens_per_step": run.tokens_per_step,
        "measured_steps": n_measured,
        "timing_steps": tally.timing_steps,
        **trace_figures(run),
        **gpu_state_columns(tally.gpu_start, tally.gpu_end),
        **half_batch_figures(step_times, tally.half_batch_step_times, run.micro),
        "tokens_per_s": tokens_per_s,
        "step_time_s_mean": total_time / len(step_times),
        "step_time_s_median": statistics.median(step_times),
        "step_time_drift": step_time_drift(step_times),
        "loop_time_s_per_step": tally.loop_time / n_measured,
        "compile_time_s": tally.compile_time_s,
        "compile_graphs": tally.compile_graphs,
        "compile_graphs_in_loop": tally.compile_graphs_in_loop,
        "flops_per_token": fpt,
        "flops_per_token_method": "counted (torch.utils.flop_counter)" if custom else "formula",
        "peak_flops_per_device": run.peak,
        "peak_flops_source": run.peak_source,
        "mfu": flops.mfu(tokens_per_s, fpt, run.peak, world_size),
        "peak_flops_bf16": run.peak_bf16,
        "peak_flops_bf16_source": run.peak_bf16_source,
        "mfu_bf16_peak": flops.mfu(tokens_per_s, fpt, run.peak_bf16, world_size),
        "recompute_flops_per_token": recompute_fpt,
        "fp8_linears": run.fp8_linears,
        "fp8_emulated": bool(run.train_cfg.fp8_emulate) if run.plan.precision.linears else None,
        "hfu": flops.mfu(tokens_per_s, fpt + recompute_fpt, run.peak, world_size),
        "activation_bytes_measured": tally.activations["inside"] if tally.activations else None,
        "activation_bytes_outside_blocks_measured": tally.activations["outside"] if tally.activations else None,
        "activation_measure": "bytes saved for backward by one micro-batch's forward on rank 0 (autograd saved-tensor hooks), "
                              "and outside the blocks what the forward returns",
        "ddp_buckets_predicted": (communication.ddp_bucket_count(run.param_bytes, point.bucket_mb)
                                  if point.bucket_mb and run.plan.strategy.ddp_wraps(run.data_ranks, point.tensor_parallel) else None),
        "skipped_steps": tally.skipped_steps,
        "resumed_from_step": run.start_step - 1 if run.start_step else None,
        "final_loss_scale": run.scaler.get_scale() if run.scaler.is_enabled() else None,
        **model_state_columns(run, all_held),
        **comm_columns(run, counted, rank_hosts, n_measured),
        # every formula beside them, from what the run counted (computed again at collection)
        **predicted_columns.worker_columns(model_cfg, {
            **run.plan.formula_row(), "n_params": run.n_params, "n_trainable_params": run.n_trainable,
            "last_block_params_kept": run.last_block_kept}, rank_hosts),
        **memory_and_placement_columns(run, all_mem),
        **pipeline_columns(run, gathered.pipe, n_measured),
        "first_step_unix": tally.first_step_at,
        **environment(run.device, run.rank_cores),
    }


def pipeline_columns(run: Run, figures: list[dict] | None, n_measured: int) -> dict:
    """The measured pipeline columns, of rank 0's pipeline (scalelab.run.pipeline.measured_columns); the timeline of
    its last timed step in the run folder (pipeline_timeline.json)."""
    from scalelab.formulas.pipeline import MEASURED_COLUMNS, TIMELINE_FILE

    if figures is None:
        return dict.fromkeys(MEASURED_COLUMNS)
    from scalelab.run.pipeline import measured_columns, timeline_record

    stride = run.world_size // run.pipeline_parallel  # rank 0's pipeline: one rank per stage, DP x TP apart
    stages = [figures[k * stride] for k in range(run.pipeline_parallel)]
    write_json(run.run_dir / TIMELINE_FILE, timeline_record(stages, run.point.pipeline_schedule, run.accum))
    return {"pipeline_microbatches": run.accum, **measured_columns(stages, n_measured)}


def model_state_columns(run: Run, all_held: list[dict]) -> dict:
    """The largest rank's model state at rest, measured (the formulas: scalelab.formulas.predicted_columns)."""
    largest = max(range(run.world_size), key=lambda r: sum(all_held[r].values()))
    return {
        "model_state_bytes_measured": sum(all_held[largest].values()),
        "model_state_params_bytes_measured": all_held[largest]["params"],
        "model_state_grads_bytes_measured": all_held[largest]["grads"],
        "model_state_optimizer_bytes_measured": all_held[largest]["optimizer"],
        "model_state_bytes_measured_per_rank": [sum(h.values()) for h in all_held],
    }


def comm_columns(run: Run, counted: dict, rank_hosts: list[str], n_measured: int) -> dict:
    """Rank 0's collectives per measured step, counted, in all and per link: traffic per link
    by the hosts its groups' ranks ran on (the formulas: scalelab.formulas.predicted_columns)."""
    dtypes = run.plan.comm
    measured_links = bytes_by_link(counted["by_group"], rank_hosts)
    return {
        "comm_calls_per_step": {k: v / n_measured for k, v in counted["calls"].items()},
        "comm_bytes_per_step_by_type": {k: v / n_measured for k, v in counted["bytes"].items()},
        "comm_bytes_per_step_measured": sum(counted["bytes"].values()) / n_measured,
        **{f"comm_{link}_bytes_per_step_measured": sum(by_type.values()) / n_measured
           for link, by_type in measured_links.items()},
        "param_gather_dtype": dtypes.param_gather,
        "grad_reduce_dtype": dtypes.grad_reduce,
        **tensor_parallel_comm_columns(run, rank_hosts),
    }


def tensor_parallel_comm_columns(run: Run, rank_hosts: list[str]) -> dict:
    """Tensor parallelism's collectives, counted apart from the strategy's (scalelab.run.comm's
    FunctionalCollectiveCounter, over the warm-up steps of an eager run), and the link its group ran on."""
    from scalelab.spec.topology import link_of

    if run.tensor_parallel == 1:
        return {"comm_tensor_parallel_bytes_per_step_measured": 0.0, "comm_tensor_parallel_link": None}
    group = list(range(run.tensor_parallel))  # rank 0's tensor-parallel group: the mesh's inner dimension
    return {"comm_tensor_parallel_bytes_per_step_measured": run.tp_bytes / run.tp_steps if run.tp_steps else None,
            "comm_tensor_parallel_link": link_of(group, rank_hosts)}


def memory_and_placement_columns(run: Run, all_mem: list[dict]) -> dict:
    """Peak memory over the ranks (device memory on a GPU, the process RSS everywhere) and where the ranks ran."""
    on_gpu = run.device.type == "cuda"
    hosts = [m["hostname"] for m in all_mem]
    return {
        "peak_mem_allocated_bytes": max((m.get("peak_mem_allocated_bytes", 0) for m in all_mem), default=None) if on_gpu else None,
        "peak_mem_reserved_bytes": max((m.get("peak_mem_reserved_bytes", 0) for m in all_mem), default=None) if on_gpu else None,
        "peak_rss_bytes": max(m["peak_rss_bytes"] for m in all_mem),
        # the slowest rank sets the step: the largest share any rank's cores lost to the hypervisor
        "host_steal_share": hardware.largest_steal(m["host_steal_share"] for m in all_mem),
        "rank_hostnames": ",".join(hosts),
        "node_list": ",".join(dict.fromkeys(hosts)),
        "nodes_used": len(set(hosts)),
        # nodes of one kernel (a virtual cluster's namespaces): their ranks share its cores and memory
        "nodes_share_machine": (len({m["boot_id"] for m in all_mem}) == 1 if len(set(hosts)) > 1
                                and all(m["boot_id"] for m in all_mem) else None),
    }


def machine_id() -> str | None:
    """The running kernel's boot id: the same for every network namespace of one machine (the
    virtual cluster's nodes), different between machines; None where the kernel has none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def pin_cpu_rank(plan: RunPlan) -> str | None:
    """A CPU rank takes its own cores (its launcher's allowed cores split by local rank) before
    torch's intra-op threads start, which inherit the affinity: ranks neither share a core nor
    migrate. Returns the launcher's core plan the row states (``rank_cores``); None on a GPU."""
    if plan.device != "cpu":
        return None
    return pin_this_rank(int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                         plan.threads_per_rank, int(os.environ.get(LAUNCHER_SLOT_ENV) or 0))


def environment(device: torch.device, rank_cores: str | None) -> dict:
    """Where the run ran: device, backend, threads, cores (pin_cpu_rank's plan), library versions, host."""
    return {
        "device_type": device.type,
        "device_name": device_name(device),
        "backend": dist.get_backend(),
        "threads_per_rank": torch.get_num_threads(),
        "rank_cores": rank_cores,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "nccl_version": nccl_version() if device.type == "cuda" else None,
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
    }


def preflight(plan: RunPlan) -> bool:
    """Whether this device cannot run this point's precision; if so, this rank says why in its
    error file (type Unsupported: the launcher records the run `skipped` with the reason) before
    any process group exists. The launcher checks what it can without importing torch
    (scalelab.run.launch.skip_reason); this check needs torch, so a CPU run's is made here."""
    reason = unsupported_reason(plan.point.precision, torch.device(plan.device), plan.train.fp8_emulate)
    if reason is None:
        return False
    rank = int(os.environ.get("RANK", 0))
    write_json(Path(plan.run_dir) / f"rank{rank}.error.json", {
        "rank": rank, "type": Unsupported.__name__, "message": reason, "time": time.time(), "traceback": ""})
    if rank == 0:
        print(f"scalelab worker: not run: {reason}", flush=True)
    return True


def modules_this_run_imports(zero_stage: int, precision: str, checkpointing: bool) -> list[str]:
    """The heavy modules this run's code imports on its way to the first step, to import before
    the process group exists. Imported for the first time deeper down (TorchDynamo from DDP's
    constructor or FSDP2, torch 2.13; ZeroRedundancyOptimizer's package once DDP is built; DCP in
    resume(), the fp16 loss scaler), they left the process group referenced after destroy_process_group() (shutdown()'s
    warning in the run's log, measured on stages 0, 1 and 3); imported here they cost no more."""
    modules = ["torch._dynamo"]
    if strategy(zero_stage).wrapper == "parallelize_zero1":
        modules.append("torch.distributed.optim")
    if precision_record(precision).loss_scaling:
        modules.append("torch.distributed.fsdp.sharded_grad_scaler")  # scalelab.run.precision.grad_scaler
    if checkpointing:
        modules.append("scalelab.run.checkpoint")
    return modules


def read_plan(argv: list[str] | None = None) -> RunPlan:
    parser = argparse.ArgumentParser(description="scalelab training worker (one rank; started by scalelab.run.launch)")
    parser.add_argument("--spec", required=True, help="the run's plan (spec.json) written by scalelab.run.launch")
    return RunPlan.read(parser.parse_args(argv).spec)


def main(argv: list[str] | None = None) -> int:
    return rank_main(read_plan(argv))


def rank_main(plan: RunPlan) -> int:
    """One rank of the plan: pinned, checked, in its process group, trained, torn down."""
    rank_cores = pin_cpu_rank(plan)  # what the run's row states; set before the threads start
    torch.set_num_threads(plan.threads_per_rank)
    if preflight(plan):
        return 3
    for module in modules_this_run_imports(plan.point.zero_stage, plan.point.precision, bool(plan.train.checkpoint_every)):
        importlib.import_module(module)
    backend = "nccl" if plan.device == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=float(plan.train.collective_timeout_s))
    dist.init_process_group(backend, timeout=timeout)
    rank = dist.get_rank()
    try:
        train(plan, rank_cores)
    except BaseException as err:
        write_json(Path(plan.run_dir) / f"rank{rank}.error.json", {
            "rank": rank, "type": type(err).__name__, "message": str(err)[:4000], "time": time.time(),
            "traceback": traceback.format_exc()[-8000:],
        })
        raise
    Fault.from_env().inject("teardown", 0, rank)  # a teardown fault names no step: step 0
    shutdown()
    return 0


def shutdown() -> None:
    """Tear the process group down while the interpreter is whole.

    gloo's worker threads free a finished collective (its tensors, and through a barrier's
    weak references the collectives before it) after the caller has moved on, and freeing a
    tensor that Python created takes the GIL. A thread that asks for the GIL once the
    interpreter is finalizing is ended by Python with pthread_exit inside a C++ destructor:
    std::terminate, "terminate called without an active exception", SIGABRT. The process
    group's destructor joins those threads with the GIL released, so it must run here, inside
    destroy_process_group(), which drops only torch's own references. Others remain: DDP
    (stages 0, 1) keeps the group in its comm-hook list, in reference cycles that only the
    finalizing interpreter's collection frees; FSDP2's DeviceMesh (stages 2, 3) keeps it in its
    group registry, and DTensor's global caches keep the mesh, so that group is never destroyed.
    """
    world = weakref.ref(dist.group.WORLD)
    # A barrier right before tear-down: without it gloo's destroy_process_group() hung
    # intermittently on torch 2.13 CPU.
    dist.barrier()
    gc.collect()  # the strategy's wrappers, left in reference cycles by train()
    for obj in gc.get_objects():
        # the class, not isinstance: DeviceMesh's metaclass inspects the instance, and one object
        # here is torch.distributed's deprecated reduce_op, which warns when touched (a
        # FutureWarning per rank in every run's log)
        if issubclass(type(obj), DeviceMesh):
            getattr(obj, "_pg_registry", {}).clear()
    dist.destroy_process_group()  # drops the last reference: the group joins its threads
    if world() is not None:
        print("scalelab worker: the process group is still referenced after destroy_process_group(); "
              "its gloo threads outlive the interpreter and may abort the process at exit", file=sys.stderr, flush=True)


if __name__ == "__main__":
    from scalelab.run.prefork import run_forked

    # A CPU rank runs in a child forked after the imports, as the prefork server's ranks do: the same
    # peak RSS either way (run_forked). A GPU rank never forks (CUDA and fork do not mix).
    plan = read_plan()
    # an exception propagates: its traceback and exit status
    code = run_forked(lambda: rank_main(plan)) if plan.device == "cpu" else rank_main(plan)
    # Results written, process group torn down: skip the interpreter's finalization, which takes
    # about a second with torch and TorchDynamo loaded (measured: main returned 1.2 s before the
    # launcher saw the rank exit), i.e. ~25 s of a default sweep, and is where gloo threads used to
    # abort a finished run (shutdown's docstring). The launcher kills the run's process group once
    # its ranks exit, so nothing a library started (inductor's compile workers) outlives the run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
