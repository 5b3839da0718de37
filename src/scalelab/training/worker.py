"""The training worker: one process per rank, started by torchrun (``python -m scalelab.training.worker``).

It reads a run spec written by :mod:`scalelab.training.launch`, trains for ``train.steps`` steps,
and has rank 0 write ``worker_result.json`` (run-level measurements) and
``progress.jsonl`` (one line per step) into the run folder. The launcher turns those into
the run's ``summary.json`` and ``steps.parquet``, and decides the status when a rank fails.
A rank that raises writes ``rank<R>.error.json`` first, so the launcher can tell OOM from
a timeout from a crash.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
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
from pathlib import Path

import torch
import torch.distributed as dist

from scalelab import accounting, hardware
from scalelab.config import ModelConfig, TrainConfig
from scalelab.data import BatchSampler
from scalelab.io import write_json
from scalelab.placement import LAUNCHER_SLOT_ENV, gpu_index
from scalelab.sweep import RunPoint, micro_batch_plan
from scalelab.training import checkpoint
from scalelab.training.activations import SavedActivationMeter
from scalelab.training.comm import CommCounter
from scalelab.training.model import GPT
from scalelab.training.parallel import clip_grad_norm, model_state_bytes, parallelize
from scalelab.training.precision import COMPUTE_DTYPE, autocast, convert_to_fp8, grad_scaler


def lr_at(step: int, train: TrainConfig) -> float:
    """Linear warm-up over warmup_steps, then cosine decay to 10% of the peak."""
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    progress = (step - train.warmup_steps) / max(1, train.steps - train.warmup_steps)
    return train.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def measure_matmul_peak(device: torch.device, precision: str, seconds: float = 0.1) -> float:
    """Best FLOP/s of square matmuls in the run's compute dtype: the device's practical peak.

    Several sizes, because on a CPU the best size differs by dtype (emulated fp16 is
    fastest on small matrices, bf16 on large ones)."""
    dtype = COMPUTE_DTYPE[precision]
    best = 0.0
    for n in (128, 512):
        a = torch.randn(n, n, device=device, dtype=dtype)
        a @ a  # warm-up
        reps, start = 0, time.perf_counter()
        while True:
            a @ a
            reps += 1
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds and reps >= 2:
                break
        best = max(best, 2 * n ** 3 * reps / elapsed)
    return best


def peak_flops(device: torch.device, precision: str, tf32: bool,
               configured_tflops: dict[str, float] | None = None) -> tuple[float, str]:
    """(dense peak FLOP/s per device, where the figure came from). On a GPU: the datasheet
    figure of the exact product (scalelab.hardware), or train.peak_tflops for one the table
    lacks; otherwise NaN and the reason, never a timed guess (small timed matmuls sit far
    below a GPU's peak and would inflate MFU). On a CPU, which has no datasheet figure here:
    the best matmul rate measured at start."""
    if device.type == "cuda":
        return hardware.peak_flops_for(torch.cuda.get_device_name(device), precision, tf32, configured_tflops)
    return measure_matmul_peak(device, precision), f"measured {precision} matmul, {torch.get_num_threads()} threads"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nccl_version() -> str:
    """NCCL's version: a tuple in recent torch, an int (e.g. 21803) in older releases."""
    version = torch.cuda.nccl.version()
    if isinstance(version, int):
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return ".".join(map(str, version))


class Fault:
    """Fault injection for tests, from SCALELAB_FAULT="kind@step=S,rank=R".

    kinds: inf_grad (a non-finite gradient element on that rank), crash (raise), hang
    (sleep before the step's collectives), exit (hard exit without cleanup), teardown
    (abort in process-group teardown, after the results are written).
    """

    def __init__(self, spec: str | None):
        self.kind = None
        if spec:
            self.kind, _, args = spec.partition("@")
            kv = dict(item.split("=") for item in args.split(",") if item)
            self.step, self.rank = int(kv.get("step", 0)), int(kv.get("rank", 0))

    def due(self, kind: str, step: int, rank: int) -> bool:
        return self.kind == kind and self.step == step and self.rank == rank


def train(spec: dict) -> None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    run_dir = Path(spec["run_dir"])
    device = torch.device(spec["device"])
    if device.type == "cuda":
        device = torch.device("cuda", gpu_index(int(os.environ.get("LOCAL_RANK", 0)),
                                                int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                                                int(os.environ.get(LAUNCHER_SLOT_ENV) or 0), torch.cuda.device_count()))
        torch.cuda.set_device(device)
    model_cfg = ModelConfig(**spec["model"])
    train_cfg = TrainConfig(**spec["train"])
    point = RunPoint(**spec["point"])
    precision, stage = point.precision, point.zero_stage
    ac, bucket_mb, offload = point.activation_checkpointing, point.bucket_mb, point.cpu_offload
    micro, accum = micro_batch_plan(train_cfg, world_size, point.micro_batch)
    fault = Fault(os.environ.get("SCALELAB_FAULT"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = train_cfg.tf32
        torch.backends.cudnn.allow_tf32 = train_cfg.tf32

    peak, peak_source = peak_flops(device, precision, train_cfg.tf32, train_cfg.peak_tflops)

    torch.manual_seed(train_cfg.seed)  # identical initial weights on every rank
    model = GPT(model_cfg).to(device)
    n_params = model.num_parameters()
    # DDP fills buckets in gradient-ready order, about the reverse of this one.
    param_bytes = [p.numel() * p.element_size() for p in model.parameters()]
    model.set_activation_checkpointing(ac)
    fp8_linears = convert_to_fp8(model, train_cfg.fp8_emulate) if precision == "fp8" else None
    # (converted before sharding: FSDP2 then shards the Float8Linear weights)
    blocks = list(model.blocks)
    par = parallelize(model, stage, device, train_cfg.lr, train_cfg.weight_decay, bucket_mb=bucket_mb, cpu_offload=offload)
    scaler = grad_scaler(precision, device, train_cfg.fp16_init_scale)
    sampler = BatchSampler(spec["train_bin"], spec["token_dtype"], model_cfg.seq_len, train_cfg.seed)
    counter = CommCounter().install()
    tokens_per_step = train_cfg.global_batch * model_cfg.seq_len

    # Resume from the newest complete checkpoint, keeping the step records up to it.
    start_step, ckpt_root = 0, run_dir / "checkpoint"
    found = checkpoint.latest(ckpt_root) if train_cfg.checkpoint_every else None
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
    step_times, skipped_steps, first_step_at = [], 0, None
    activations = None  # measured on this attempt's first micro-batch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    loop_start = time.perf_counter()
    for step in range(start_step, train_cfg.steps):
        lr = lr_at(step, train_cfg)
        for group in par.optimizer.param_groups:
            group["lr"] = lr
        counter.enabled = step >= train_cfg.warmup_steps
        if step == train_cfg.warmup_steps:
            loop_start = time.perf_counter()  # whole-loop time, measurement included
        if first_step_at is None:
            first_step_at = time.time()
        if fault.due("hang", step, rank):
            time.sleep(10 ** 6)
        if fault.due("crash", step, rank):
            raise RuntimeError(f"injected crash at step {step} on rank {rank}")
        if fault.due("exit", step, rank):
            os._exit(17)
        start = time.perf_counter()

        tokens = torch.from_numpy(sampler.batch(step, rank, micro * accum, world_size)).to(device, non_blocking=True)
        loss_sum = torch.zeros((), device=device)
        for m in range(accum):
            chunk = tokens[m * micro:(m + 1) * micro]
            with par.no_sync(m == accum - 1):
                meter = SavedActivationMeter(par.model, blocks) if activations is None else contextlib.nullcontext()
                with meter, autocast(precision, device):
                    _, loss = par.model(chunk[:, :-1], chunk[:, 1:])
                if activations is None:
                    activations = {"inside": meter.inside_blocks, "outside": meter.outside_blocks}
                scaler.scale(loss / accum).backward()
            loss_sum += loss.detach()
        if fault.due("inf_grad", step, rank):
            grad = next(p.grad for p in par.model.parameters() if p.grad is not None)
            (grad.to_local() if hasattr(grad, "to_local") else grad).view(-1)[0] = float("inf")
        scale_before = scaler.get_scale() if scaler.is_enabled() else 1.0
        scaler.unscale_(par.optimizer)
        max_norm = train_cfg.grad_clip if train_cfg.grad_clip > 0 else float("inf")
        grad_norm = clip_grad_norm(par, max_norm, device)
        scaler.step(par.optimizer)
        scaler.update()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_time = time.perf_counter() - start

        # Measurement: the global batch's loss (mean over ranks) and the skip flag.
        with counter.paused():
            loss_global = loss_sum / accum
            dist.all_reduce(loss_global, op=dist.ReduceOp.SUM)  # gloo has no AVG
            loss_global /= world_size
        scale_after = scaler.get_scale() if scaler.is_enabled() else 1.0
        skipped = bool(scaler.is_enabled() and scale_after < scale_before)
        skipped_steps += skipped
        if step >= train_cfg.warmup_steps:
            step_times.append(step_time)
        if progress is not None:
            record = {
                "step": step, "loss": loss_global.item(), "grad_norm": float(grad_norm),
                "lr": lr, "loss_scale": scale_before if scaler.is_enabled() else None,
                "skipped": skipped, "step_time_s": step_time, "tokens": tokens_per_step,
            }
            progress.write(json.dumps(record) + "\n")
            progress.flush()
        if step < train_cfg.steps - 1:
            par.optimizer.zero_grad(set_to_none=True)
            if train_cfg.checkpoint_every and (step + 1) % train_cfg.checkpoint_every == 0:
                with counter.paused():
                    checkpoint.save(ckpt_root, step, par, scaler)
    counter.enabled = False
    loop_time = time.perf_counter() - loop_start

    # Model state at rest: after the last optimizer step, gradients not yet freed.
    held = model_state_bytes(par)
    all_held = [None] * world_size
    dist.all_gather_object(all_held, held)
    mem = {}
    if device.type == "cuda":
        mem = {"peak_mem_allocated_bytes": torch.cuda.max_memory_allocated(device),
               "peak_mem_reserved_bytes": torch.cuda.max_memory_reserved(device)}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    all_mem = [None] * world_size
    dist.all_gather_object(all_mem, {**mem, "peak_rss_bytes": rss})
    if spec.get("save_final_params"):
        full = {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()
                for name, t in par.model.state_dict().items()}
        if rank == 0:
            torch.save({k.removeprefix("module."): v for k, v in full.items()}, run_dir / "final_params.pt")
    counted = {"calls": dict(counter.calls), "bytes": dict(counter.bytes)}
    counter.uninstall()
    if rank != 0:
        return

    n_measured = max(1, len(step_times))  # this attempt's steps after warm-up
    total_time = sum(step_times)
    tokens_per_s = tokens_per_step * len(step_times) / total_time
    fpt = accounting.flops_per_token(model_cfg)
    recompute_fpt = accounting.recompute_flops_per_token(model_cfg) if ac else 0.0
    largest = max(range(world_size), key=lambda r: sum(all_held[r].values()))
    predicted = accounting.model_state_bytes(n_params, stage, world_size, precision, "pytorch")
    predicted_paper = accounting.model_state_bytes(n_params, stage, world_size, precision, "paper")
    elem_bytes = accounting.reduce_dtype_bytes(precision)
    result = {
        "n_params": n_params,
        "accumulation_steps": accum,
        "tokens_per_step": tokens_per_step,
        "measured_steps": n_measured,
        "tokens_per_s": tokens_per_s,
        "step_time_s_mean": total_time / len(step_times),
        "step_time_s_median": statistics.median(step_times),
        "loop_time_s_per_step": loop_time / n_measured,
        "flops_per_token": fpt,
        "peak_flops_per_device": peak,
        "peak_flops_source": peak_source,
        "mfu": accounting.mfu(tokens_per_s, fpt, peak, world_size),
        "recompute_flops_per_token": recompute_fpt,
        "fp8_linears": fp8_linears,
        "fp8_emulated": bool(train_cfg.fp8_emulate) if precision == "fp8" else None,
        "hfu": accounting.mfu(tokens_per_s, fpt + recompute_fpt, peak, world_size),
        "activation_bytes_measured": activations["inside"] if activations else None,
        "activation_bytes_outside_blocks_measured": activations["outside"] if activations else None,
        "activation_measure": "bytes saved for backward by one micro-batch's forward on rank 0 (autograd saved-tensor hooks)",
        "activation_bytes_predicted": accounting.block_activation_bytes(model_cfg, micro, precision, ac),
        "activation_bytes_predicted_paper": accounting.block_activation_bytes(model_cfg, micro, precision, ac, "paper"),
        "ddp_buckets_predicted": accounting.ddp_bucket_count(param_bytes, bucket_mb) if bucket_mb else None,
        "skipped_steps": skipped_steps,
        "resumed_from_step": start_step - 1 if start_step else None,
        "final_loss_scale": scaler.get_scale() if scaler.is_enabled() else None,
        "model_state_bytes_measured": sum(all_held[largest].values()),
        "model_state_params_bytes_measured": all_held[largest]["params"],
        "model_state_grads_bytes_measured": all_held[largest]["grads"],
        "model_state_optimizer_bytes_measured": all_held[largest]["optimizer"],
        "model_state_bytes_measured_per_rank": [sum(h.values()) for h in all_held],
        "model_state_bytes_predicted": predicted.total,
        "model_state_params_bytes_predicted": predicted.params,
        "model_state_grads_bytes_predicted": predicted.grads,
        "model_state_optimizer_bytes_predicted": predicted.optimizer,
        "model_state_bytes_predicted_paper": predicted_paper.total,
        "comm_calls_per_step": {k: v / n_measured for k, v in counted["calls"].items()},
        "comm_bytes_per_step_by_type": {k: v / n_measured for k, v in counted["bytes"].items()},
        "comm_bytes_per_step_measured": sum(counted["bytes"].values()) / n_measured,
        "comm_bytes_per_step_predicted": elem_bytes * accounting.comm_elements_per_step(n_params, stage, world_size, accum, "pytorch"),
        "comm_bytes_per_step_predicted_paper": elem_bytes * accounting.comm_elements_per_step(n_params, stage, world_size, accum, "paper"),
        "peak_mem_allocated_bytes": max((m.get("peak_mem_allocated_bytes", 0) for m in all_mem), default=None) if mem else None,
        "peak_mem_reserved_bytes": max((m.get("peak_mem_reserved_bytes", 0) for m in all_mem), default=None) if mem else None,
        "peak_rss_bytes": max(m["peak_rss_bytes"] for m in all_mem),
        "first_step_unix": first_step_at,
        "device_type": device.type,
        "device_name": device_name(device),
        "backend": dist.get_backend(),
        "threads_per_rank": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "nccl_version": nccl_version() if device.type == "cuda" else None,
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
    }
    progress.close()
    write_json(run_dir / "worker_result.json", result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="scalelab training worker (run under torchrun)")
    parser.add_argument("--spec", required=True, help="run spec JSON written by scalelab.training.launch")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    torch.set_num_threads(int(spec["threads_per_rank"]))
    backend = "nccl" if spec["device"] == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=float(spec["train"]["collective_timeout_s"]))
    dist.init_process_group(backend, timeout=timeout)
    rank = dist.get_rank()
    try:
        train(spec)
    except BaseException as err:
        write_json(Path(spec["run_dir"]) / f"rank{rank}.error.json", {
            "rank": rank, "type": type(err).__name__, "message": str(err)[:4000], "time": time.time(),
            "traceback": traceback.format_exc()[-8000:],
        })
        raise
    if Fault(os.environ.get("SCALELAB_FAULT")).due("teardown", 0, rank):
        os.abort()
    # A barrier right before tear-down: without it gloo's destroy_process_group() hung
    # intermittently on torch 2.13 CPU.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
