"""The run-level results rank 0 writes (``worker_result.json``): what the training loop tallied (:class:`Tally`),
what every rank contributes after the last step (:func:`gather`), and :func:`results`, the measurements beside
their predictions, column group by column group (timings, the token share, model state, communication, memory and
placement, the pipeline's figures, the environment)."""
from __future__ import annotations

import math
import platform
import resource
import socket
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from scalelab.formulas import communication, flops
from scalelab.io import write_json
from scalelab.registries import hardware
from scalelab.run.calibration import this_rank_ticks
from scalelab.run.comm import bytes_by_link
from scalelab.run.devices import device_name
from scalelab.run.model import counted as counted_by_module
from scalelab.run.parallel import (
    model_state_bytes,
)
from scalelab.run.rank_setup import Run
from scalelab.run.trace import MEMORY_DIR, TRACE_DIR, read_exposed_comm


def nccl_version() -> str:
    """NCCL's version: a tuple in recent torch, an int (e.g. 21803) in older releases."""
    version = torch.cuda.nccl.version()
    if isinstance(version, int):
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return ".".join(map(str, version))


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
    it changed while the run was timed (scalelab.registries.hardware.DRIFT_WARN). None under DRIFT_MIN_STEPS steps."""
    if len(step_times) < hardware.DRIFT_MIN_STEPS:
        return None
    half = len(step_times) // 2
    return statistics.median(step_times[half:]) / statistics.median(step_times[:half]) - 1


def results(run: Run, tally: Tally, gathered: Gathered) -> dict:
    """worker_result.json (rank 0): the run-level measurements (their formulas are computed at collection)."""
    point = run.point
    step_times, all_held, all_mem, counted = tally.step_times, gathered.held, gathered.mem, gathered.comm
    rank_hosts = [m["hostname"] for m in all_mem]
    n_measured = max(1, len(step_times))  # this attempt's steps after warm-up
    total_time = sum(step_times)
    tokens_per_s = run.tokens_per_step * len(step_times) / total_time
    return {
        "n_params": run.n_params,
        "n_trainable_params": run.n_params if run.n_trainable is None else run.n_trainable,
        "last_block_params_kept": run.last_block_kept,
        "lora_alpha": run.train_cfg.lora_alpha if run.n_trainable is not None else None,
        "accumulation_steps": run.accum,
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
        **flops_columns(run, tokens_per_s),
        "activation_bytes_measured": tally.activations["inside"] if tally.activations else None,
        "activation_bytes_outside_blocks_measured": tally.activations["outside"] if tally.activations else None,
        "activation_measure": "bytes saved for backward by one micro-batch's forward on rank 0 (autograd saved-tensor hooks), "
                              "and outside the blocks what the forward returns",
        "ddp_buckets_predicted": (sum(communication.ddp_bucket_count(chunk, point.bucket_mb) for chunk in run.param_bytes)
                                  if point.bucket_mb and run.plan.strategy.ddp_wraps(run.data_ranks, point.tensor_parallel,
                                                                                     point.pipeline_parallel) else None),
        "skipped_steps": tally.skipped_steps,
        "resumed_from_step": run.start_step - 1 if run.start_step else None,
        "final_loss_scale": run.scaler.get_scale() if run.scaler.is_enabled() else None,
        **model_state_columns(run, all_held),
        **comm_columns(run, counted, rank_hosts, n_measured),
        # the formulas beside them are computed at collection (scalelab.formulas.predicted_columns.refreshed)
        **memory_and_placement_columns(run, all_mem),
        **pipeline_columns(run, gathered.pipe, n_measured),
        "first_step_unix": tally.first_step_at,
        **environment(run.device, run.rank_cores),
    }


def flops_columns(run: Run, tokens_per_s: float) -> dict:
    """FLOPs per token, the peaks and the utilisations they give (MFU on the run's own peak and on the bf16 one, HFU
    with the recomputed forward): a family's FLOPs by its formulas, a user's module's counted
    (torch.utils.flop_counter)."""
    model_cfg, world_size = run.model_cfg, run.world_size
    custom = counted_by_module(model_cfg) if model_cfg.module else None
    fpt = custom["flops_per_token"] if custom else flops.flops_per_token(model_cfg)
    recompute_fpt = 0.0
    if run.point.activation_checkpointing:
        recompute_fpt = custom["block_forward_flops_per_token"] if custom else flops.recompute_flops_per_token(model_cfg)
    return {
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
    from scalelab.registries.topology import link_of

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
