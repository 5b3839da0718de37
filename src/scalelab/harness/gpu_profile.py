"""The GPU check's traced parts: what FSDP2 costs over one device (fsdp) and where a step's device time goes
on each side (profile), from one step traced by torch.profiler; the traces kept under <out>/traces."""
from __future__ import annotations

import shutil
import statistics
from pathlib import Path

from scalelab.harness.gpu_measure import Key, _fmt, _status, trace_summary
from scalelab.harness.gpu_session import Check
from scalelab.harness.gpu_tables import profile_table


def fsdp_points(dry_run: bool) -> list[Key]:
    """scalelab's FSDP2 stages over one device, bf16 compiled on a GPU (eager in a dry run), each
    with one step traced: stage 3 (the first GPU check's figure: 0.79 of its stage-0 twin on an H200), then
    stage 2 (no re-gather in backward: what resharding costs)."""
    shape = "tiny" if dry_run else "350M"
    return [Key(shape, "bf16", compiled=not dry_run, stage=s, variant="traced") for s in (3, 2)]


def fsdp(check: Check) -> dict:
    """What FSDP2 costs on one device, where it shards nothing: each stage's tokens/s against scalelab's
    stage-0 run of the same shape (the bench's, else measured here), and its traced step's device
    time (busy against first-to-last: a device waiting on the host shows as the gap), the traces
    kept under <out>/traces beside the profile part's."""
    points = fsdp_points(check.dry_run)
    base = points[0].base
    if not any(m["status"] == "ok" for m in check.scalelab.get(base, [])):
        check.measure_scalelab(base)
    base_tps = [m["tokens_per_s"] for m in check.scalelab.get(base, []) if m["status"] == "ok"]
    rows, summaries = [], {}
    (check.out / "traces").mkdir(exist_ok=True)
    for key in points:
        m = check.measure_scalelab(key)
        ratio = m["tokens_per_s"] / statistics.median(base_tps) if m["status"] == "ok" and base_tps else None
        row = {"label": key.label, "status": m["status"], "ratio_to_stage_0": ratio, "mfu": m.get("mfu"),
               "peak_bytes_measured": m.get("peak_bytes_measured"), "peak_bytes_predicted": m.get("peak_bytes_predicted")}
        if m["status"] == "ok" and m.get("trace") and Path(m["trace"]).exists():
            shutil.copy(m["trace"], check.out / "traces" / f"scalelab-{key.slug}.json")
            summaries[f"stage {key.stage}"] = row["trace"] = trace_summary(m["trace"])
        rows.append(row)
        print(f"scalelab {key.label}: {_fmt(ratio, '.3f')} of its stage-0 run"
              + (" (CPU figure)" if check.dry_run else ""), flush=True)
    if summaries:
        print(profile_table(summaries), flush=True)
    if all(r["status"] == "not run: deadline" for r in rows):
        return {"status": "not run: deadline", "figures": f"{max(check.left(), 0):.0f} s left"}
    return {"status": _status([{"status": r["status"]} for r in rows]), "variants": rows,
            "figures": "; ".join(f"{r['label']}: {_fmt(r['ratio_to_stage_0'], '.3f')} of stage 0" for r in rows),
            "failed": any("failed" in r["status"] for r in rows)}




def profile(check: Check) -> dict:
    """One step of scalelab's run and of the plain loop, bf16 compiled (eager in a dry run), traced
    by torch.profiler: where the device's time goes on each side, kernel class by class, and the
    busiest kernels (gpu-check.json), so that a gap the bench part measures has its cause on record.
    The traces are kept under <out>/traces."""
    key = Key("tiny" if check.dry_run else "350M", "bf16", compiled=not check.dry_run, variant="traced")
    sides = {"scalelab": check.measure_scalelab(key), "plain loop": check.measure_plain(key)}
    summaries, failed = {}, []
    (check.out / "traces").mkdir(exist_ok=True)
    for side, m in sides.items():
        trace = m.get("trace")
        if m["status"] != "ok" or not trace or not Path(trace).exists():
            failed.append(f"{side}: {m['status']}" + ("" if m["status"] != "ok" else " (no trace written)"))
            continue
        shutil.copy(trace, check.out / "traces" / f"{side.replace(' ', '-')}.json")
        summaries[side] = trace_summary(trace)
    if summaries:
        print(profile_table(summaries), flush=True)
        for side, summary_ in summaries.items():
            print(f"{side}: the busiest kernels", flush=True)
            for k in summary_["top"][:8]:
                print(f"  {k['ms']:9.2f} ms {k['count']:5d}x  {k['name'][:100]}", flush=True)
    figures = "; ".join(f"{side}: {s['kernels']} kernels, {s['kernel_ms']:.1f} ms of kernels, busy {s['busy_ms']:.1f} ms"
                        for side, s in summaries.items())
    if all(m["status"] == "not run: deadline" for m in sides.values()):
        return {"status": "not run: deadline", "figures": f"{max(check.left(), 0):.0f} s left"}
    return {"status": "ok" if not failed else "; ".join(failed), "figures": figures, "summaries": summaries,
            "failed": bool(failed) and not any(m["status"].startswith("not run") for m in sides.values())}

