"""Seeing inside a run: a torch.profiler trace of chosen steps, the CUDA allocator's
history, and the communication a traced step left exposed, read from the trace.

``train.profile: [first, last]`` traces those steps (inclusive) on every rank into
``<run>/trace/rank<R>.json`` (Chrome trace format: open it in Perfetto, ui.perfetto.dev, or
chrome://tracing), CPU activities and, on a GPU, CUDA kernels; Python stacks only with
``train.profile_stacks`` (they are the slow part of a dump). Each traced step is the span
``scalelab step N`` on the main thread. A traced step runs the profiler's bookkeeping, so the
run's timings leave the traced steps out (the measurement window extends past them).

**Exposed communication** (``exposed_comm_per_step``): per traced step, the time during which
communication ran and nothing computed, the union of the communication intervals less their
overlap with the union of the compute intervals:

* on a GPU, communication is the NCCL kernels (``nccl`` in the kernel's name) and compute every
  other kernel, each on its own stream's timeline;
* on a CPU, communication is gloo's work as its threads record it (``gloo:all_gather`` …) and compute
  the main thread's ``aten::`` operators (a wait is not compute).

Waiting for a slower rank counts as exposed: its collective runs, nothing computes (a straggler
is what a trace shows). The step's own loss all-reduce (the measurement's, one scalar) is in the
span too: microseconds. ``train.memory_snapshot`` (GPU runs) records the CUDA allocator's history
from the first step; the snapshot (``<run>/memory/rank<R>.pickle``, open it at
pytorch.org/memory_viz) is dumped after the traced steps, or at the last step without a trace,
and always when the run ends out of memory (``rank<R>.oom.pickle``).
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

TRACE_DIR = "trace"
MEMORY_DIR = "memory"
STEP_SPAN = "scalelab step "
"""The name of a traced step's span on the main thread: its step number follows."""
MEMORY_HISTORY_ENTRIES = 100_000
"""Allocator events the CUDA history keeps (torch's default is unbounded: a long run would hold them all)."""


def trace_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / TRACE_DIR / f"rank{rank}.json"


def snapshot_file(run_dir: Path, rank: int, oom: bool = False) -> Path:
    return Path(run_dir) / MEMORY_DIR / (f"rank{rank}.oom.pickle" if oom else f"rank{rank}.pickle")


class StepTracer:
    """Starts torch.profiler before the first traced step and exports each rank's trace after the
    last (``step(n)``: the context of one step); records the CUDA allocator's history where asked."""

    def __init__(self, profile: list[int] | None, stacks: bool, memory: bool, device: torch.device, run_dir: Path, rank: int):
        self.first, self.last = profile if profile is not None else (None, None)
        self.stacks, self.device, self.run_dir, self.rank = stacks, device, Path(run_dir), rank
        self.memory = memory and device.type == "cuda"
        self.profiler = None
        if self.memory:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)

    def traced(self, step: int) -> bool:
        return self.first is not None and self.first <= step <= self.last

    @contextlib.contextmanager
    def step(self, step: int):
        if not self.traced(step):
            yield
            return
        if self.profiler is None:  # the first traced step (of this attempt: a resumed run may start inside the range)
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities, with_stack=self.stacks, record_shapes=False)
            self.profiler.__enter__()
        with torch.profiler.record_function(f"{STEP_SPAN}{step}"):
            yield
        if step == self.last:
            self.profiler.__exit__(None, None, None)
            path = trace_file(self.run_dir, self.rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.profiler.export_chrome_trace(str(path))
            self.profiler = None
            if self.memory:
                self.dump_memory()

    def dump_memory(self, oom: bool = False) -> Path | None:
        """The CUDA allocator's snapshot (history included) to <run>/memory/; None where none is recorded."""
        if not self.memory:
            return None
        path = snapshot_file(self.run_dir, self.rank, oom)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
        return path


# ----------------------------------------------------------------------------- reading a trace

def _union(intervals: list[tuple[float, float]]) -> list[list[float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def covered(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals`` (the time a device was busy with any of them)."""
    return sum(end - start for start, end in _union(intervals))


def uncovered(intervals: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals`` that the union of ``cover`` does not overlap."""
    covering = _union(cover)
    total = 0.0
    for start, end in _union(intervals):
        overlap = sum(max(0.0, min(end, c_end) - max(start, c_start)) for c_start, c_end in covering)
        total += (end - start) - overlap
    return total


def _is_kernel(event: dict) -> bool:
    return str(event.get("cat", "")).lower() == "kernel"


def exposed_comm_per_step(trace: dict) -> dict[int, float]:
    """Per traced step (its ``scalelab step N`` span), the seconds during which communication ran and
    nothing computed (module doc): GPU kernels where the trace has any, else gloo's threads against
    the main thread's operators."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    # the host's span of each step (on a GPU, record_function also writes one per stream: gpu_user_annotation)
    spans = [e for e in events if str(e.get("name", "")).startswith(STEP_SPAN) and e.get("cat") != "gpu_user_annotation"]
    kernels = [e for e in events if _is_kernel(e)]
    out = {}
    for span in spans:
        start, end = float(span["ts"]), float(span["ts"]) + float(span["dur"])

        def inside(e, start=start, end=end):
            return float(e["ts"]) < end and float(e["ts"]) + float(e["dur"]) > start

        def clipped(e, start=start, end=end):
            return max(float(e["ts"]), start), min(float(e["ts"]) + float(e["dur"]), end)

        if kernels:  # the device's timeline: a step ends with a device synchronize, so its kernels lie within its span
            mine = [e for e in kernels if inside(e)]
            comm = [clipped(e) for e in mine if "nccl" in str(e["name"]).lower()]
            compute = [clipped(e) for e in mine if "nccl" not in str(e["name"]).lower()]
        else:
            comm = [clipped(e) for e in events if str(e.get("name", "")).startswith("gloo:") and inside(e)]
            compute = [clipped(e) for e in events if e.get("tid") == span.get("tid") and e.get("pid") == span.get("pid")
                       and str(e.get("name", "")).startswith("aten::") and "wait" not in str(e["name"]) and inside(e)]
        out[int(str(span["name"])[len(STEP_SPAN):])] = uncovered(comm, compute) / 1e6  # the trace's unit: microseconds
    return out


def read_exposed_comm(run_dir: Path, rank: int = 0) -> dict[int, float] | None:
    """Exposed communication per traced step from a rank's exported trace; None without one."""
    path = trace_file(run_dir, rank)
    if not path.exists():
        return None
    return exposed_comm_per_step(json.loads(path.read_text()))
