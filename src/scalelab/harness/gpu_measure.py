"""What the GPU check's parts share to measure and report a point: its key, the time a measurement needs, one
status for several, and a traced step's kernels by class (every module of the check imports these, and this
imports none of them)."""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Key:
    """One measured configuration: a shape, a precision, TF32, compiled or eager."""

    shape: str
    precision: str
    tf32: bool = False
    compiled: bool = False
    variant: str = ""
    """The plain loop's variant (plain_loop's module doc): "" as a user writes it, "blocks" (compiled
    per block and loss, as scalelab's compile lever), "ddp" (in DDP at world size 1, as scalelab's stage 0
    was); "traced" (either side): one step traced by torch.profiler, for the profile part."""
    stage: int = 0
    """scalelab's ZeRO stage (world size 1): 0 trains the model as a user does, 2 and 3 are FSDP2 over
    one device (the fsdp part); the plain side of a key with a stage is the plain FSDP2 loop (the stages part)."""
    replicas: int = 1
    """Hybrid sharding over this many replicas of one shard each (world size = replicas): the stages part."""

    @property
    def label(self) -> str:
        return (f"{self.shape} {self.precision}{'+tf32' if self.tf32 else ''} {'compiled' if self.compiled else 'eager'}"
                + (f" stage {self.stage}" if self.stage and self.replicas == 1 else "")
                + (f" hybrid x{self.replicas}" if self.replicas > 1 else "") + (f" [{self.variant}]" if self.variant else ""))

    @property
    def traced(self) -> bool:
        return self.variant.startswith("traced")

    @property
    def base(self) -> "Key":
        return dataclasses.replace(self, variant="", stage=0, replicas=1)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9.]+", "-", self.label)


MIN_LEFT_S = {("gpu", False): 40, ("gpu", True): 100, ("dry", False): 8, ("dry", True): 25}
"""Seconds a measurement needs left to start, by (mode, compiled)."""


def _status(measurements: list[dict]) -> str:
    """One status for several: "ok", or "partial: <the others>" where some are ok, else theirs."""
    if not measurements:
        return "not run"
    statuses = set()
    for m in measurements:  # a combined status counts as its parts
        status = m["status"]
        if status.startswith("partial: "):
            statuses.add("ok")
            status = status[len("partial: "):]
        statuses.update(status.split(", "))
    others = ", ".join(sorted(statuses - {"ok"}))
    return "ok" if not others else f"partial: {others}" if "ok" in statuses else others


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


# Kernel classes of a trace, by a piece of the kernel's name (the first class that matches).
KERNEL_CLASSES = (("communication", ("nccl",)), ("attention", ("flash", "fmha", "attention", "sdpa")),
                  ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "wgmma")),
                  ("optimizer", ("adam", "multi_tensor")),
                  # before the copies: inductor names its fused kernels after their ops ("triton_per_fused__to_copy_add_
                  # native_layer_norm_..."), which would read as copies
                  ("compiled (triton)", ("triton",)), ("copy, fill", ("memcpy", "memset", "copy", "fill")),
                  ("elementwise", ("elementwise", "vectorized", "unrolled")),
                  ("reduction", ("reduce", "norm")))


def kernel_class(name: str) -> str:
    low = name.lower()
    return next((cls for cls, pieces in KERNEL_CLASSES if any(p in low for p in pieces)), "other")


def trace_summary(path: str | Path) -> dict:
    """What one traced step did on the device: its GPU kernels (and copies) by class and the
    busiest ones, their summed time, the time the GPU was busy (their union) and the span from the
    first to the last. On a CPU (a dry run) the top-level CPU operators stand in for kernels."""
    from scalelab.run.trace import covered

    events = json.loads(Path(path).read_text())["traceEvents"]
    work = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    device = "gpu"
    if not work:
        device = "cpu"
        ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
        work, end = [], -1.0
        for e in ops:  # the outermost operators only: nested ones are inside their parent's time
            if e["ts"] >= end:
                work.append(e)
                end = e["ts"] + e.get("dur", 0)
    intervals = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in work)
    busy = covered(intervals)
    by_class: dict[str, list[float]] = {}
    by_name: dict[str, list[float]] = {}
    for e in work:
        for table, k in ((by_class, kernel_class(e["name"]) if device == "gpu" else "cpu operators"), (by_name, e["name"])):
            entry = table.setdefault(k, [0, 0.0])
            entry[0] += 1
            entry[1] += e.get("dur", 0) / 1e3
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:12]
    return {"device": device, "kernels": len(work), "kernel_ms": sum(e.get("dur", 0) for e in work) / 1e3,
            "busy_ms": busy / 1e3, "span_ms": (intervals[-1][1] - intervals[0][0]) / 1e3 if intervals else 0.0,
            "by_class": {k: {"count": v[0], "ms": v[1]} for k, v in sorted(by_class.items(), key=lambda kv: -kv[1][1])},
            "top": [{"name": k[:120], "count": v[0], "ms": v[1]} for k, v in top]}
