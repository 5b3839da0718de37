"""The GPU check's stages part (``python -m scalelab.harness.gpu_check --only stages``): what each sharded
stage costs on a GPU, held against the plain FSDP2 loop (scalelab.harness.plain_loop ``--fsdp``:
torchtitan's recipe), so that a gap can be told apart as FSDP2's own or the sweep's.

The points, bf16, in order of value: 350M compiled, 350M eager, 1.3B compiled, 1.3B eager; at each, stages 3,
2 and 1 at world size 1, then hybrid sharding (stage 3 over 2 replicas of one shard) at world size 2 where two
devices are visible (else recorded "not run"). Each point is scalelab's run then the plain loop's, each a fresh
process with one step traced (left out of the timing), alternated over up to ``rounds`` rounds as the deadline
allows; each side's figure is the median of its rounds. The plain peer of stage 3 and hybrid reshards after
forward, that of stage 2 keeps the parameters; stage 1 (DDP with ZeRO-1's optimizer: FSDP2 has no ZeRO-1) is
held against the nearest, the loop that keeps them (measured once for both). One more point, at 350M compiled
stage 3: the plain loop with autocast around its forward as scalelab runs it (scalelab's sharded stages keep
autocast over the MixedPrecisionPolicy, torchtitan runs the policy alone; on a GPU autocast runs LayerNorm in
fp32, with its casts), so that a gap is split into autocast's share and the rest.

Printed per point: tokens/s of each side, the ratio scalelab / plain (the target: >= 0.98), and each side's
traced step: the device's busy share of it (busy time over first-to-last) and its kernel count. A dry run
(``--dry-run``) takes the tiny shape, eager, hybrid on two CPU ranks: CPU figures, the top-level CPU operators
standing in for kernels; they say nothing about a GPU.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

STAGES = ((3, 1), (2, 1), (1, 1), (3, 2))
"""(ZeRO stage, replicas) of each point: world size 1, then hybrid over 2 replicas (world size 2)."""
PLAIN_RESHARD = {1: "keep", 2: "keep", 3: "reshard"}
"""The plain FSDP2 loop's reshard_after_forward for each stage's peer (stage 1: the nearest, ZeRO-2's)."""
RATIO_TARGET = 0.98


def stage_keys(dry_run: bool) -> list:
    """The stages part's keys, in order of value (the module's doc)."""
    from scalelab.harness.gpu_measure import Key

    modes = [("tiny", False)] if dry_run else [("350M", True), ("350M", False), ("1.3B", True), ("1.3B", False)]
    keys = [Key(shape, "bf16", compiled=compiled, stage=stage, replicas=replicas, variant="traced")
            for shape, compiled in modes for stage, replicas in STAGES]
    first = keys[0]  # stage 3 at the first shape and mode
    return keys + [dataclasses.replace(first, variant="traced+autocast")]


def plain_key(key):
    """The key of the plain loop a stage is held against: stage 1's is stage 2's (the same loop)."""
    return dataclasses.replace(key, stage=2) if key.stage == 1 else key


def plain_fsdp_args(key) -> list[str]:
    """plain_loop's arguments for a key of the stages part: nothing for a key without a stage."""
    if not key.stage:
        return []
    args = ["--fsdp", PLAIN_RESHARD[key.stage]] + (["--replicas", str(key.replicas)] if key.replicas > 1 else [])
    return args + (["--autocast"] if key.variant.endswith("+autocast") else [])


def plain_launcher(key) -> list[str]:
    """How the plain loop starts: one process, or torchrun's ranks for hybrid sharding (world size = replicas)."""
    if key.replicas == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(key.replicas)]


def _devices(check) -> int:
    """The devices a point may use: the CPU's ranks in a dry run, else the GPUs visible."""
    if check.dry_run:
        return 2
    import torch

    return torch.cuda.device_count()


def _side(measurements: list[dict]) -> dict:
    """One side of a point: the median tokens/s of its rounds, and its (last) traced step's figures."""
    from scalelab.harness.gpu_measure import trace_summary

    ok = [m for m in measurements if m["status"] == "ok"]
    traced = [m["trace"] for m in ok if m.get("trace") and Path(m["trace"]).exists()]
    summary = trace_summary(traced[-1]) if traced else None
    return {"tokens_per_s": statistics.median(m["tokens_per_s"] for m in ok) if ok else None, "rounds": len(ok),
            "kernels": summary["kernels"] if summary else None,
            "busy_share": summary["busy_ms"] / summary["span_ms"] if summary and summary["span_ms"] else None}


def stage_row(check, key) -> dict:
    """A point's row: each side, the ratio, the target met (None: no figure, or CPU figures)."""
    from scalelab.harness.gpu_measure import _status

    ours = check.scalelab.get(dataclasses.replace(key, variant="traced"), [])  # the autocast point: stage 3's run
    theirs = check.plain.get(plain_key(key), [])
    s, p = _side(ours), _side(theirs)
    ratio = s["tokens_per_s"] / p["tokens_per_s"] if s["tokens_per_s"] and p["tokens_per_s"] else None
    autocast = key.variant.endswith("+autocast")
    return {"label": dataclasses.replace(key, variant="").label + (" (plain + autocast)" if autocast else ""),
            "plain": "plain FSDP2 loop" + (" + autocast" if autocast else ""),
            "scalelab": s, "plain_loop": p, "ratio": ratio, "status": _status(ours + theirs),
            "target": f"ratio >= {RATIO_TARGET}", "met": None if ratio is None or check.dry_run else ratio >= RATIO_TARGET}


def _measure_point(check, key, round_: int) -> None:
    """Round ``round_`` of a point: scalelab's run, then the plain loop's, each unless this round has it already
    (stage 1's plain side is stage 2's; the autocast point's scalelab side is the stage-3 point's)."""
    done = lambda runs: sum(not m["status"].startswith("not run") for m in runs) > round_  # noqa: E731
    ours = dataclasses.replace(key, variant="traced")
    if not done(check.scalelab.get(ours, [])):
        check.measure_scalelab(ours)
    if not done(check.plain.get(plain_key(key), [])):
        check.measure_plain(plain_key(key))


def stages(check) -> dict:
    """The part: every point once, then further rounds while time is left; the table, and the rows as record."""
    from scalelab.harness.gpu_measure import MIN_LEFT_S

    keys = [k for k in stage_keys(check.dry_run) if k.replicas <= _devices(check)]
    skipped = [k for k in stage_keys(check.dry_run) if k.replicas > _devices(check)]
    for round_ in range(check.rounds):
        for key in keys:
            if round_ and check.left() < 2 * MIN_LEFT_S[(check.kind, key.compiled)]:  # a further round: both sides
                break
            _measure_point(check, key, round_)
    rows = [stage_row(check, k) for k in keys]
    rows += [{"label": dataclasses.replace(k, variant="").label, "status": f"not run: hybrid needs {k.replicas} devices, {_devices(check)} visible"}
             for k in skipped]
    print(stage_table(rows, check.dry_run), flush=True)
    if rows and all(r["status"].startswith("not run") for r in rows):
        return {"status": "not run: deadline", "figures": f"{max(check.left(), 0):.0f} s left", "rows": rows}
    from scalelab.harness.gpu_measure import _fmt, _status

    return {"status": _status([{"status": r["status"]} for r in rows if "hybrid needs" not in r["status"]]),
            "rows": rows, "failed": any("failed" in r["status"] for r in rows),
            "figures": "; ".join(f"{r['label']}: {_fmt(r.get('ratio'), '.3f')} of plain" for r in rows if r.get("ratio"))}


def stage_table(rows: list[dict], dry_run: bool) -> str:
    """scalelab's sharded stages against the plain FSDP2 loop, one row a point."""
    from scalelab.harness.gpu_measure import _fmt

    lines = ["== sharded stages against the plain FSDP2 loop (ratio = scalelab / plain; busy and kernels: scalelab's / "
             "plain's traced step, busy as a share of it)" + ("   (CPU figures: they say nothing about a GPU)" if dry_run else ""),
             f"{'point':<42} {'scalelab tok/s':>15} {'plain tok/s':>12} {'ratio':>6} {'busy':>11} {'kernels':>13}  status"]
    for r in rows:
        s, p = r.get("scalelab") or {}, r.get("plain_loop") or {}
        busy = f"{_fmt(s.get('busy_share'), '.0%')}/{_fmt(p.get('busy_share'), '.0%')}"
        kernels = f"{_fmt(s.get('kernels'), 'd')}/{_fmt(p.get('kernels'), 'd')}"
        lines.append(f"{r['label']:<42} {_fmt(s.get('tokens_per_s'), ',.0f'):>15} {_fmt(p.get('tokens_per_s'), ',.0f'):>12} "
                     f"{_fmt(r.get('ratio'), '.3f'):>6} {busy:>11} {kernels:>13}  {r['status']}")
    return "\n".join(lines)
