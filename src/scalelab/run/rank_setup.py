"""Everything one rank sets up before its first step (:func:`setup`): its device, the peak FLOP/s its MFU divides
by, the model split for tensor and pipeline parallelism, the strategy's wrapper, the loss scaler, the sampler, the
communication counter and the resume from a checkpoint, kept in a :class:`Run` for the whole run."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # imported by torch itself: free

from scalelab.config import ModelConfig, TrainConfig
from scalelab.planning.placement import LAUNCHER_SLOT_ENV, gpu_index
from scalelab.planning.run_plan import RunPlan
from scalelab.planning.sweep import RunPoint
from scalelab.registries import hardware
from scalelab.registries.precisions import precision as precision_record
from scalelab.run.calibration import measure_matmul_peak
from scalelab.run.calibration import peak_for as calibration_peak
from scalelab.run.comm import CommCounter
from scalelab.run.data import BatchSampler
from scalelab.run.fault_injection import Fault
from scalelab.run.lora import apply_lora
from scalelab.run.model import build_model
from scalelab.run.parallel import (
    Parallelized,
    apply_compile,
    local_shard,
    parallelize,
)
from scalelab.run.precision import autocast, convert_linears, grad_scaler

if TYPE_CHECKING:
    from scalelab.run.pipeline import Pipeline


def peak_flops(device: torch.device, precision: str, tf32: bool,
               configured_tflops: dict[str, float] | None = None, calibration: dict | None = None) -> tuple[float, str]:
    """(dense peak FLOP/s per device, where the figure came from). On a GPU: the datasheet
    figure of the exact product (scalelab.registries.hardware), or train.peak_tflops for one the table
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


@dataclass
class Run:
    """What one rank sets up before its first step and keeps for the whole run."""
    plan: RunPlan  # what the launcher decided (scalelab.planning.run_plan): the point, configs, batch split
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
    param_bytes: list[list[int]]  # per parameter of each of this rank's chunks, in model order (predicts DDP's buckets)
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


def rank_device(requested: str) -> torch.device:
    """This rank's device: the CPU, or its own GPU (scalelab.planning.placement.gpu_index), made current."""
    device = torch.device(requested)
    if device.type == "cuda":
        device = torch.device("cuda", gpu_index(int(os.environ.get("LOCAL_RANK", 0)),
                                                int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                                                int(os.environ.get(LAUNCHER_SLOT_ENV) or 0), torch.cuda.device_count()))
        torch.cuda.set_device(device)
    return device


def setup(plan: RunPlan, rank_cores: str | None = None) -> Run:
    """Everything before the first step: device, model, strategy, scaler, sampler, communication
    counter, resume from a checkpoint, progress file; the rest is the plan's (scalelab.planning.run_plan)."""
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
    param_bytes = [[p.numel() * p.element_size() for p in chunk.parameters() if p.requires_grad] for _, chunk in chunks]
    model.set_activation_checkpointing(point.activation_checkpointing)
    fp8_linears = convert_linears(point.precision, model, train_cfg.fp8_emulate)
    if fp8_linears is not None and not point.compile and rank == 0:
        print(f"scalelab worker: warning: fp8 without compile: {hardware.fp8_outlook(model_cfg.d_model, compiled=False)['verdict']}",
              flush=True)
    # (converted before sharding: FSDP2 then shards the Float8Linear weights)
    if point.compile:  # after checkpointing and fp8, before wrapping (torchtitan's order)
        for _, chunk in chunks:
            apply_compile(chunk)
    par, pipe = wrap_model(model, chunks, mesh, dp_mesh, plan, device)
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


def wrap_model(model: torch.nn.Module, chunks: list, mesh: DeviceMesh | None, dp_mesh: DeviceMesh | None, plan: RunPlan,
               device: torch.device) -> tuple[Parallelized, Pipeline | None]:
    """(the strategy's wrapper, this rank's pipeline or None): the model wrapped by its ZeRO strategy, or under
    pipeline parallelism each of this rank's chunks wrapped and scheduled (scalelab.run.pipeline). The dtypes its
    collectives carry are the plan's (scalelab.formulas.communication.comm_dtypes): fp16 and bf16 gather in their
    compute dtype at stages 2 and 3 (FSDP2's MixedPrecisionPolicy); fp32 is FSDP2's default."""
    point, train_cfg, dtypes = plan.point, plan.train, plan.comm
    param_dtype = None if dtypes.param_gather in (None, "float32") else getattr(torch, dtypes.param_gather)
    if point.pipeline_parallel > 1:
        from scalelab.run import pipeline

        return pipeline.parallelize(chunks, mesh, plan, device, param_dtype, getattr(torch, dtypes.grad_reduce),
                                    lambda: autocast(point.precision, device))
    par = parallelize(model, point.zero_stage, device, train_cfg.lr, train_cfg.weight_decay,
                      bucket_mb=point.bucket_mb, cpu_offload=point.cpu_offload, replicas=point.replicas,
                      param_dtype=param_dtype, reduce_dtype=getattr(torch, dtypes.grad_reduce), dp_mesh=dp_mesh,
                      tensor_parallel=point.tensor_parallel)
    return par, None


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
