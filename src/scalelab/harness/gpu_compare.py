"""The GPU check's comparisons: scalelab against the plain loop, point by point (the parts bench, large and
rest), fp8 against bf16 (the part fp8), and the further rounds of both that the time every part left allows."""
from __future__ import annotations

from scalelab.harness.gpu_measure import _status
from scalelab.harness.gpu_points import comparison_points, fp8_points
from scalelab.harness.gpu_session import Check
from scalelab.harness.gpu_tables import comparison_table, fp8_table


def _compare(check: Check, part: str) -> dict:
    rows = []
    for key in comparison_points(check.dry_run)[part]:
        if key not in check.scalelab or not any(m["status"] == "ok" for m in check.scalelab[key]):
            check.measure_scalelab(key)
        check.measure_plain(key)
        rows.append(check.comparison(key))
    print(comparison_table(rows, check.dry_run), flush=True)
    return {"status": _status([{"status": r["status"]} for r in rows]),
            "points": [r["label"] for r in rows]}


def bench(check: Check) -> dict:
    """scalelab against the plain loop, bf16 eager and compiled."""
    return _compare(check, "bench")


def large(check: Check) -> dict:
    """scalelab against the plain loop at 1.3B, bf16 compiled (the fp8 part reuses scalelab's run)."""
    return _compare(check, "large")


def rest(check: Check) -> dict:
    """The other precisions against the plain loop."""
    return _compare(check, "rest")


def fp8(check: Check) -> dict:
    """fp8 against bf16, compiled, at two sizes (a bf16 run the bench part measured counts)."""
    rows = []
    for bf16, f8 in fp8_points(check.dry_run):
        for key in (bf16, f8):
            if not any(m["status"] == "ok" for m in check.scalelab.get(key, [])):
                check.measure_scalelab(key)
        rows.append(check.fp8_row(bf16, f8))
    print(fp8_table(rows, check.dry_run), flush=True)
    return {"status": _status([{"status": r["status"]} for r in rows]), "points": [r["shape"] for r in rows]}


def repeat_rounds(check: Check, parts: list[str]) -> None:
    """With the time every part left: further rounds of the comparisons (scalelab then plain) and
    of the fp8 pairs (bf16 then fp8), in the parts' order of value, up to check.rounds
    measurements of each side; a round only where its first one's time fits in what is left."""
    points = comparison_points(check.dry_run)
    todo = []  # (what, [(side, key)])
    for part in ("bench", "large", "fp8", "rest"):
        if part in parts and part == "fp8":
            todo += [(f"fp8 against bf16 at {b.shape}", [("scalelab", b), ("scalelab", f)]) for b, f in fp8_points(check.dry_run)]
        elif part in parts:
            todo += [(k.label, [("scalelab", k), ("plain", k)]) for k in points[part]]
    for round_ in range(2, check.rounds + 1):
        for what, sides in todo:
            ok = {(side, key): [m for m in getattr(check, side).get(key, []) if m["status"] == "ok"] for side, key in sides}
            if not all(ok.values()):
                continue  # a side that never ran, or failed, is not repeated
            due = [(side, key) for side, key in sides if len(ok[(side, key)]) < round_]
            if not due:
                continue
            needed = sum(max(m["wall_s"] for m in ok[s]) for s in due) * 1.2
            if check.left() < needed:
                print(f"  no round {round_} of {what}: {max(check.left(), 0):.0f} s left, it took ~{needed / 1.2:.0f} s",
                      flush=True)
                continue
            for side, key in due:
                (check.measure_scalelab if side == "scalelab" else check.measure_plain)(key)

