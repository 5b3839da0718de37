"""What the GPU check prints: a measurement's line, the comparison and fp8 tables, the traced steps side by
side (the summary, which comes last, is the check's main module's)."""
from __future__ import annotations

from scalelab.harness.gpu_measure import _fmt


def measure_line(m: dict) -> str:
    head = f"  {m['side']:<8} {m['key']:<34}"
    if m["status"] != "ok":
        return f"{head} {m['status']}: {m.get('reason')}"
    gib = lambda v: "-" if not v else f"{v / 2**30:.2f} GiB"  # noqa: E731
    line = f"{head} {m['tokens_per_s']:>12,.0f} tok/s (median step {m['step_time_s_median'] * 1e3:.1f} ms)"
    if m["side"] == "scalelab":
        ratio = m["peak_bytes_measured"] / m["peak_bytes_predicted"] if m["peak_bytes_measured"] and m["peak_bytes_predicted"] else None
        line += (f"  MFU {_fmt(m['mfu'], '.3f')} (bf16 peak {_fmt(m['mfu_bf16_peak'], '.3f')})  peak {gib(m['peak_bytes_measured'])} "
                 f"{m['peak_bytes_measured_is']} / {gib(m['peak_bytes_predicted'])} predicted ({_fmt(ratio, '.2f')})"
                 f"  compile {_fmt(m['compile_time_s'], '.1f')} s")
    else:
        line += f"  peak {gib(m['peak_bytes_measured'])}  first step {m['first_step_s']:.1f} s"
    return line + f"  [{m['wall_s']:.0f} s]"


def targets_text(targets: list[dict]) -> str:
    return "; ".join(f"{t['target']}: {'n/a' if t['met'] is None else 'met' if t['met'] else 'MISSED'}" for t in targets)


def comparison_table(rows: list[dict], dry_run: bool) -> str:
    head = (f"{'label':<26} {'scalelab tok/s':>15} {'plain tok/s':>13} {'ratio':>7} {'scalelab MFU':>13}  targets"
            + ("   (CPU figures: they say nothing about a GPU)" if dry_run else ""))
    lines = [head]
    for r in rows:
        lines.append(f"{r['label']:<26} {_fmt(r['scalelab_tokens_per_s'], ',.0f'):>15} {_fmt(r['plain_tokens_per_s'], ',.0f'):>13} "
                     f"{_fmt(r['ratio'], '.3f'):>7} {_fmt(r['scalelab_mfu'], '.3f'):>13}  {targets_text(r['targets'])}"
                     + ("" if r["status"] == "ok" else f"  [{r['status']}]"))
    return "\n".join(lines)


def fp8_table(rows: list[dict], dry_run: bool) -> str:
    lines = [f"{'size':<6} {'model':<22} {'bf16 tok/s':>12} {'fp8 tok/s':>12} {'fp8/bf16':>9} {'bf16 MFU':>9} "
             f"{'fp8 MFU*':>9}  targets (* against the bf16 peak)"
             + ("   (fp8 EMULATED on the CPU: CPU figures, they say nothing about a GPU)" if dry_run else "")]
    for r in rows:
        m = r["model"]
        model = f"{m['n_layers']}x{m['d_model']}, seq {m['seq_len']}, b{m['batch']}"
        lines.append(f"{r['shape']:<6} {model:<22} {_fmt(r['bf16_tokens_per_s'], ',.0f'):>12} {_fmt(r['fp8_tokens_per_s'], ',.0f'):>12} "
                     f"{_fmt(r['fp8_over_bf16'], '.3f'):>9} {_fmt(r['bf16_mfu'], '.3f'):>9} {_fmt(r['fp8_mfu_bf16_peak'], '.3f'):>9}  "
                     f"{targets_text(r['targets'])}"
                     + ("" if r["status"] == "ok" else f"  [{r['status']}]"))
    return "\n".join(lines)



def profile_table(summaries: dict[str, dict]) -> str:
    """The traced steps side by side: totals, then milliseconds per kernel class."""
    sides = list(summaries)
    lines = [f"{'one traced step':<22}" + "".join(f"{side:>22}" for side in sides)]
    for field_, label in (("kernels", "kernels"), ("kernel_ms", "kernel time (ms)"), ("busy_ms", "device busy (ms)"),
                          ("span_ms", "first to last (ms)")):
        lines.append(f"{label:<22}" + "".join(f"{_fmt(summaries[s][field_], ',.1f'):>22}" for s in sides))
    classes = sorted({c for s in sides for c in summaries[s]["by_class"]},
                     key=lambda c: -max(summaries[s]["by_class"].get(c, {"ms": 0})["ms"] for s in sides))
    for c in classes:
        cells = [summaries[s]["by_class"].get(c) for s in sides]
        texts = [f"{x['ms']:,.1f} ms / {x['count']}" if x else "-" for x in cells]
        lines.append(f"{c:<22}" + "".join(f"{t:>22}" for t in texts))
    return "\n".join(lines)
