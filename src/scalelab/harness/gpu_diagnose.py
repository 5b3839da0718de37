"""The GPU check's diagnose part: what a scalelab/plain gap comes from, one of scalelab's differences from the
plain loop at a time."""
from __future__ import annotations

import statistics

from scalelab.harness.gpu_measure import Key, _fmt, _status
from scalelab.harness.gpu_session import Check


def diagnose_points(dry_run: bool) -> list[Key]:
    """The plain loop's variants, each one of scalelab's differences from it, at bf16 compiled on a
    GPU (the first GPU check's gap: scalelab compiled ran 0.889 of the plain loop): compile scope and DDP.
    A dry run takes the DDP variant eager (a CPU compilation costs half a minute for nothing)."""
    if dry_run:
        return [Key("tiny", "fp32", variant="ddp")]
    return [Key("350M", "bf16", compiled=True, variant=v) for v in ("blocks", "ddp")]



def diagnose(check: Check) -> dict:
    """What a scalelab/plain gap comes from: the plain loop with one of scalelab's differences at a
    time (compile scope, DDP at world size 1) against the plain loop itself; each variant's ratio
    below 1 is what that difference costs. What is left of the gap is scalelab's own (instrumentation,
    per-step synchronisation)."""
    rows = []
    for key in diagnose_points(check.dry_run):
        if not any(m["status"] == "ok" for m in check.plain.get(key.base, [])):
            check.measure_plain(key.base)
        last = check.measure_plain(key)
        base = [m["tokens_per_s"] for m in check.plain.get(key.base, []) if m["status"] == "ok"]
        mine = [m["tokens_per_s"] for m in check.plain.get(key, []) if m["status"] == "ok"]
        ratio = statistics.median(mine) / statistics.median(base) if base and mine else None
        rows.append({"label": key.label, "status": _status(check.plain.get(key) or [last]), "ratio_to_plain": ratio})
        print(f"plain loop {key.label}: {_fmt(ratio, '.3f')} of the plain loop as a user writes it"
              + (" (CPU figure)" if check.dry_run else ""), flush=True)
    return {"status": _status([{"status": r["status"]} for r in rows]), "variants": rows,
            "figures": "; ".join(f"{r['label']}: {_fmt(r['ratio_to_plain'], '.3f')} of plain" for r in rows)}

