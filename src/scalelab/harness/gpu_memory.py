"""The GPU check's memory part: where a memory prediction misses, read from the CUDA allocator's history
over one step (what was live at its peak, by the line that allocated it)."""
from __future__ import annotations

from pathlib import Path

from scalelab.harness.gpu_measure import MIN_LEFT_S, _fmt, _status
from scalelab.harness.gpu_points import LAUNCH_TEARDOWN_S
from scalelab.harness.gpu_session import Check
from scalelab.harness.testing import local_plan

# The GPU test's memory case (tests/gpu/test_gpu.py: 12 x 768, seq 1024, batch 8, byte tokens), eager:
# bf16 at stage 3 measured 13.7% over its prediction on an H200, stage 0 within 1%.
MEMORY_MODEL = {"gpu": {"n_layers": 12, "d_model": 768, "n_heads": 12, "seq_len": 1024},
                "dry": {"n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 64}}
MEMORY_CASES = (("bf16", 3), ("bf16", 0))
ALLOCATOR_FRAMES = ("c10::", "CUDACachingAllocator", "at::empty", "at::native::empty", "at::detail::empty",
                    "at::TensorBase::", "at::_ops::empty", "allocate", "Allocator", "??", "torch::unwrap_dispatch",
                    "_record_memory_history", "gather_traceback", "at::native::_to_copy", "at::_ops::",
                    "c10::impl::", "at::(anonymous", "torch::autograd::VariableType", "wrap_kernel_functor",
                    "c10::BoxedKernel", "c10::Dispatcher", "at::native::", "torch::unwind", "CapturedTraceback")


def allocation_site(frames: list[dict]) -> str:
    """Where an allocation came from, short: its innermost Python frame and the first scalelab frame
    above it, or (an allocation of autograd's engine thread, which has no Python frames) its
    innermost C++ frames that are neither the allocator nor the dispatcher."""
    py = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    fmt = lambda f: f"{Path(f['filename']).name}:{f['line']} {f['name']}"  # noqa: E731
    if py:
        ours = next((f for f in py if "scalelab" in f["filename"]), None)
        return fmt(py[0]) + (f" <- {fmt(ours)}" if ours is not None and ours is not py[0] else "")
    names = [f["name"] for f in frames if not any(a in f["name"] for a in ALLOCATOR_FRAMES)]
    return " <- ".join(n[:60] for n in names[:2]) or "(no frames)"


def snapshot_peak(path: str | Path, top: int = 15) -> dict:
    """What a CUDA allocator snapshot (torch.cuda.memory._dump_snapshot, history included) held at
    the peak of its history: allocated bytes then (those allocated before the history began, the
    model state, counted from the segments at the dump), and the live allocations made within the
    history grouped by allocation_site, largest first."""
    import pickle

    snap = pickle.loads(Path(path).read_bytes())
    events = max(snap["device_traces"], key=len)
    allocated_at_dump = sum(b["size"] for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated")

    def replay(until: int | None = None):
        live, now, peak, at = {}, 0, 0, -1
        for i, e in enumerate(events[: None if until is None else until + 1]):
            if e["action"] == "alloc":
                live[e["addr"]] = e
                now += e["size"]
            elif e["action"] == "free_completed" and e["addr"] in live:
                now -= live.pop(e["addr"])["size"]
            if now > peak:
                peak, at = now, i
        return live, now, peak, at

    live_end, now_end, peak, at = replay()
    before = allocated_at_dump - now_end  # allocated before the history began and alive at the dump
    live, _, _, _ = replay(at)
    groups: dict[str, list] = {}
    for e in live.values():
        g = groups.setdefault(allocation_site(e.get("frames", [])), [0, 0])
        g[0] += 1
        g[1] += e["size"]
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])
    return {"events": len(events), "before_history_bytes": before, "peak_in_history_bytes": peak,
            "peak_bytes": before + peak, "at_peak": allocation_site(events[at].get("frames", [])) if at >= 0 else None,
            "live_at_peak": [{"site": k[:200], "count": v[0], "bytes": v[1]} for k, v in ranked[:top]],
            "live_at_peak_other_bytes": sum(v[1] for _, v in ranked[top:])}


def memory(check: Check) -> dict:
    """Where a memory prediction misses: the GPU test's memory case (MEMORY_MODEL), eager, bf16 at
    stages 3 and 0, each run with the CUDA allocator's history recorded through one step after the
    warm-up (train.memory_snapshot), then what was live at the history's peak, by the line that
    allocated it (snapshot_peak), beside the measured and predicted peaks. A dry run takes the CPU
    path and has no allocator history (the GPU's alone)."""
    from scalelab.harness.testing import tiny_config
    from scalelab.planning.sweep import RunPoint
    from scalelab.run.launch import launch_run

    rows = []
    for precision, stage in MEMORY_CASES:
        label = f"{precision} stage {stage}"
        need = MIN_LEFT_S[(check.kind, False)]
        if check.left() < need:
            rows.append({"label": label, "status": "not run: deadline"})
            continue
        cfg = tiny_config(dataset={"synthetic_bytes": 2_000_000},
                          train={"device": "cpu" if check.dry_run else "cuda", "steps": 6, "warmup_steps": 3,
                                 "global_batch": 8 if not check.dry_run else 4, "profile": [4, 4], "memory_snapshot": True,
                                 "run_timeout_s": max(1.0, check.left() - LAUNCH_TEARDOWN_S)})
        cfg["model"].update(MEMORY_MODEL[check.kind])
        data = check.memory_data(cfg)
        run_dir = check.work / "runs" / f"memory-{precision}-{stage}"
        try:
            s = launch_run(cfg, local_plan(cfg, RunPoint(precision, stage, 1)), data, run_dir, check.out / "logs" / f"memory-{precision}-{stage}.log",
                           threads=check.threads)
        except Exception as err:  # a check on a lent machine goes on to its other points
            s = {"status": "failed", "reason": f"launch_run raised {type(err).__name__}: {err}"}
        measured, predicted = s.get("peak_mem_allocated_bytes"), s.get("predicted_peak_bytes")
        row = {"label": label, "status": s["status"], "reason": s.get("reason"), "measured_bytes": measured,
               "predicted_bytes": predicted, "measured_over_predicted": measured / predicted if measured and predicted else None}
        snapshot = run_dir / "memory" / "rank0.pickle"
        if snapshot.exists():
            row["snapshot"] = snapshot_peak(snapshot)
        rows.append(row)
        print(f"memory {label}: measured {_fmt(measured and measured / 2**20, ',.1f')} MiB, predicted "
              f"{_fmt(predicted and predicted / 2**20, ',.1f')} MiB ({_fmt(row['measured_over_predicted'], '.3f')})"
              + (" (CPU: process RSS is not measured here)" if check.dry_run else ""), flush=True)
        if "snapshot" in row:
            p = row["snapshot"]
            print(f"  the history's peak: {p['peak_bytes'] / 2**20:,.1f} MiB ({p['before_history_bytes'] / 2**20:,.1f} MiB from "
                  f"before it); reached at {p['at_peak']}; live then, by site:", flush=True)
            for g in p["live_at_peak"]:
                print(f"  {g['bytes'] / 2**20:10.1f} MiB {g['count']:5d}x  {g['site'][:150]}", flush=True)
    return {"status": _status([{"status": r["status"]} for r in rows]), "cases": rows,
            "figures": "; ".join(f"{r['label']}: {_fmt(r.get('measured_over_predicted'), '.3f')} of predicted" for r in rows),
            "failed": any("failed" in r["status"] for r in rows)}

