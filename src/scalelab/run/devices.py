"""Where run code still branches on the device type, and why: the one inventory.

CPU runs take the GPU's code path wherever torch allows it, so that the CPU suite exercises what a
GPU runs (the first GPU run failed on paths that only a GPU took: fp16's fused optimizer).
Each branch that remains is listed here with its reason; tests/unit/test_devices.py finds every
comparison with "cuda" or "cpu" (and every ``torch.cuda.is_available()``) in the run code by
reading its syntax tree, and fails on one this inventory lacks, or on an entry whose branch is gone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from scalelab.registries import hardware

RUN_CODE = ("run",)
"""What the inventory covers, under src/scalelab/: the run layer, the code that runs on the device (planning and
reporting code reads the device type as data, e.g. a row's device_type)."""


@dataclass(frozen=True)
class Branch:
    module: str  # path under src/scalelab/
    function: str  # the innermost enclosing function ("<module>" at the top level)
    reason: str


BRANCHES = (
    # what the device is
    Branch("run/devices.py", "device_name", "torch names a GPU; a CPU's model comes from /proc/cpuinfo"),
    Branch("run/rank_setup.py", "peak_flops", "a GPU's peak is its datasheet figure (scalelab.registries.hardware); a CPU has none: measured"),
    Branch("run/rank_setup.py", "bf16_peak_flops", "fp8 on a CPU computes in bf16 (emulated float8): its own peak is the bf16 one"),
    Branch("run/rank_setup.py", "rank_device", "a GPU rank takes its own GPU and makes it current; the CPU is one device"),
    Branch("run/worker_result.py", "environment", "NCCL exists only with CUDA: its version is a GPU run's"),
    Branch("run/worker.py", "rank_main", "the process group's backend: NCCL carries CUDA tensors, gloo CPU tensors"),
    Branch("run/worker.py", "<module>", "a new CPU rank runs in a child forked after the imports, as the prefork server's "
           "ranks do (the same peak RSS); CUDA does not survive a fork"),
    Branch("run/pipeline.py", "wrapper", "a GPU stage's forward or backward ends when its kernels do: synchronized before "
           "its interval is timed (the bubble's timeline); a CPU computes as it is called"),
    Branch("run/worker.py", "pin_cpu_rank", "CPU ranks are pinned to disjoint cores; a GPU rank's compute is its GPU"),
    # measuring on the device
    Branch("run/devices.py", "gpu_state", "nvidia-smi reports a GPU's power cap, clocks and temperature; a CPU has none"),
    Branch("run/devices.py", "synchronize", "CUDA kernels run asynchronously: a step ends when the GPU is done; CPU ops return done"),
    Branch("run/worker.py", "compile_warm_up", "the CUDA generator's state is kept apart from the CPU's and restored apart"),
    Branch("run/worker.py", "train", "the CUDA caching allocator's peak is reset before the steps; a CPU run's peak is its RSS"),
    Branch("run/worker_result.py", "gather", "device memory peaks (allocated, reserved) exist on a GPU; a CPU run reports its RSS"),
    Branch("run/worker_result.py", "memory_and_placement_columns", "device memory columns are a GPU run's (the column "
           "table: null on a CPU run)"),
    Branch("run/trace.py", "StepTracer.__init__", "the CUDA allocator's history exists on a GPU only"),
    Branch("run/trace.py", "StepTracer.step", "a GPU run's trace holds its CUDA kernels too"),
    Branch("run/worker_result.py", "trace_figures", "memory snapshots are the CUDA allocator's: a GPU run's"),
    Branch("run/progress.py", "Progress.line", "the progress line shows device memory on a GPU, the peak RSS on a CPU"),
    # what torch offers on each device
    Branch("run/parallel.py", "_ddp", "DDP takes device_ids for a CUDA module only"),
    Branch("run/parallel.py", "_ddp", "DDP refuses bf16_compress_hook by name without CUDA and NCCL; gloo sums bf16 on a CPU"),
    Branch("run/precision.py", "fp8_unsupported_reason", "float8 matmuls need FP8 tensor cores (or torchao's emulation)"),
    Branch("run/precision.py", "unsupported_reason", "bf16 support is a property of the GPU (torch.cuda.is_bf16_supported)"),
    # where a run trains (train.device) and how it starts
    *[Branch("run/launch.py", "resolve_device", "train.device: cpu imports no torch; auto takes a GPU where torch "
             "sees one; a run planned for a GPU on a machine without one is skipped with the reason")] * 6,
    Branch("run/launch.py", "skip_reason", "cpu_offload moves state from a GPU to the host: nothing to move on a CPU run"),
    Branch("run/launch.py", "skip_reason", "GPU placement checks (GPUs per node, precision support) apply to GPU runs"),
    Branch("run/launch.py", "plan_memory", "the device memory limit is the GPU's, unless planning.device_memory_gib says"),
    Branch("run/launch.py", "plan_memory", "the GPU's memory is read only where torch sees one (else the run is skipped)"),
    Branch("run/launch.py", "_launch", "CPU ranks share the host's cores: an over-committed CPU run is refused"),
    Branch("run/launch.py", "_run_workers", "CPU ranks fork from the prefork server (torch imported once); a GPU rank "
           "starts fresh (CUDA cannot be used in a child forked after the parent initialised it)"),
    # the collective benchmark (scalelab bench comm)
    Branch("run/commbench.py", "_start_ranks", "CPU ranks fork from the prefork server, as a CPU run's do; a GPU rank "
           "starts fresh (CUDA and fork)"),
    Branch("run/commbench.py", "_rank_main", "CPU ranks are pinned to disjoint cores"),
    Branch("run/commbench.py", "_rank_main", "the process group's backend: NCCL carries CUDA tensors, gloo CPU tensors"),
    Branch("run/commbench.py", "_rank_main", "a GPU rank times its own GPU"),
    Branch("run/commbench.py", "_rank_main", "a GPU rank makes its GPU current"),
    Branch("run/commbench.py", "_rank_main", "NCCL binds the process group to the GPU (device_id)"),
    Branch("run/commbench.py", "bench_comm", "message sizes: gloo over host memory is timed to 16 MiB, NCCL further"),
    Branch("run/commbench.py", "bench_comm", "a CPU benchmark's cores are watched for other processes before its ranks "
           "start (a GPU's collectives hardly depend on the host's cores)"),
    Branch("run/commbench.py", "_bench_comm", "message sizes: gloo over host memory is timed to 16 MiB, NCCL further"),
    Branch("run/commbench.py", "_bench_comm", "CPU ranks need cores of their own: refused when they would share"),
    Branch("run/commbench.py", "_bench_comm", "a busy host skews a CPU benchmark: warned"),
)


def device_name(device: torch.device) -> str:
    """The GPU's product name, or the CPU's model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return hardware.cpu_name()


def synchronize(device: torch.device) -> None:
    """Wait until the device has done the work queued on it (a step's end, a timed matmul)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


GPU_STATE_QUERY = {"power.limit": "gpu_power_limit_w", "clocks.sm": "gpu_sm_clock_mhz", "clocks.mem": "gpu_mem_clock_mhz",
                   "temperature.gpu": "gpu_temperature_c", "driver_version": "gpu_driver_version"}
"""What nvidia-smi says of a GPU beside a run (``--query-gpu`` field -> column stem): the numbers that explain an
MFU gap between two machines of one product (a lower power cap, a hot card throttling its clocks)."""


def gpu_state(device: torch.device, timeout_s: float = 10) -> dict:
    """The rank's GPU as nvidia-smi reports it now (GPU_STATE_QUERY's fields, by column stem; numbers as
    floats, the driver as text); {} on a CPU, without nvidia-smi, or where it fails (a run does not stop
    for it: its columns stay null)."""
    import shutil
    import subprocess

    if device.type != "cuda" or shutil.which("nvidia-smi") is None:
        return {}
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(GPU_STATE_QUERY)}", "--format=csv,noheader,nounits",
                              "-i", uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"],
                             capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    fields = [f.strip() for f in out.stdout.strip().splitlines()[0].split(",")] if out.returncode == 0 and out.stdout.strip() else []
    if len(fields) != len(GPU_STATE_QUERY):
        return {}
    state = {}
    for (query, stem), value in zip(GPU_STATE_QUERY.items(), fields, strict=True):
        if query == "driver_version":
            state[stem] = value
        else:
            try:
                state[stem] = float(value)
            except ValueError:  # "[N/A]", "[Not Supported]"
                state[stem] = None
    return state
