"""`scalelab predict`: the step-time model fitted on part of a sweep and checked on the runs it held out,
and the check as text.
"""
from __future__ import annotations

import numpy as np

from scalelab.formulas.link_fit import bench_load, bench_steal
from scalelab.formulas.predicted_columns import missing
from scalelab.registries.comm_table import BUSY_COLUMN, busy_before, busy_text
from scalelab.registries.hardware import STEAL_WARN
from scalelab.results.prediction import predict
from scalelab.results.step_model import MEASURED, fit, ok_runs


def validate(runs, fit_query: str, table=None, table_path: str | None = None) -> dict:
    """Fit on the rows of ``runs`` that ``fit_query`` (a pandas query) selects, predict the other
    ok runs: per held-out run measured, predicted, error (predicted / measured - 1), inside its band;
    then the mean and max absolute error and the share inside their bands."""
    try:
        chosen = runs.query(fit_query)
    except Exception as err:  # pandas raises many types for a bad expression
        raise ValueError(f"--fit {fit_query!r} is not a pandas query over the metrics columns: {err}") from None
    held = ok_runs(runs.drop(index=chosen.index))
    if held.empty:
        raise ValueError(f"--fit {fit_query!r} leaves no ok run to predict ({len(chosen)} of {len(runs)} rows fit)")
    model = fit(chosen, table, table_path)
    predicted = predict(model, held)
    points = []
    for r in predicted.to_dict("records"):
        p, m = r["predicted_step_time_s"], float(r[MEASURED])
        known = p is not None and not missing(p)
        points.append({"run_id": r["run_id"], "precision": r["precision"], "zero_stage": int(r["zero_stage"]),
                       "world_size": int(r["world_size"]), "measured_step_time_s": m,
                       "predicted_step_time_s": p if known else None,
                       "band_low_s": r["predicted_step_time_s_low"] if known else None,
                       "band_high_s": r["predicted_step_time_s_high"] if known else None,
                       "error": p / m - 1 if known else None,
                       "inside_band": bool(r["predicted_step_time_s_low"] <= m <= r["predicted_step_time_s_high"]) if known else None,
                       "note": r["prediction_note"]})
    errors = [abs(p["error"]) for p in points if p["error"] is not None]
    inside = [p["inside_band"] for p in points if p["inside_band"] is not None]
    half_widths = [(p["band_high_s"] - p["band_low_s"]) / 2 / p["predicted_step_time_s"] for p in points
                   if p["predicted_step_time_s"]]
    summary = {"fit": fit_query, "fit_runs": model.fit_runs, "held_out": len(points), "predicted": len(errors),
               "mean_abs_error": float(np.mean(errors)) if errors else None,
               "max_abs_error": float(np.max(errors)) if errors else None,
               "inside_band_share": float(np.mean(inside)) if inside else None,
               "median_band_half_width": float(np.median(half_widths)) if half_widths else None,
               "measured": MEASURED, "bench_table": table_path, "bench_host_load": bench_load(table), "bench_busy_share": busy_before(table),
               "bench_busy_recorded": table is not None and BUSY_COLUMN in table.columns,
               "bench_steal_share": bench_steal(table)}
    return {"points": points, "summary": summary, "parameters": model.parameters()}

def format_validation(result: dict) -> str:
    """The validation as text: the fitted parameters, one line per held-out run, the summary."""
    lines = ["PREDICTION against measurement (step time: " + result["summary"]["measured"] + ")",
             "parameters (fitted or defaulted, each with its source):"]
    for p in result["parameters"]:
        value = "unknown" if p["value"] is None else f"{p['value']:.4g}"
        lines.append(f"  {p['name']:<40} {value:>11} {p['unit']:<22} {p['source']}")
    lines.append(f"{'run':<24}{'measured ms':>12}{'predicted ms':>13}{'band ms':>17}{'error':>8}  inside")
    for p in result["points"]:
        if p["predicted_step_time_s"] is None:
            lines.append(f"{p['run_id']:<24}{p['measured_step_time_s'] * 1e3:>12.2f}{'-':>13}{'-':>17}{'-':>8}  -   {p['note']}")
            continue
        band = f"{p['band_low_s'] * 1e3:.1f}-{p['band_high_s'] * 1e3:.1f}"
        lines.append(f"{p['run_id']:<24}{p['measured_step_time_s'] * 1e3:>12.2f}{p['predicted_step_time_s'] * 1e3:>13.2f}"
                     f"{band:>17}{p['error']:>+8.1%}  {'yes' if p['inside_band'] else 'NO'}")
    s = result["summary"]
    if s["mean_abs_error"] is None:
        lines.append(f"no held-out run could be predicted ({s['held_out']} held out): see the notes above")
    else:
        lines.append(f"fit on {s['fit']!r} ({s['fit_runs']} runs); predicted {s['predicted']} of {s['held_out']} held-out runs: "
                     f"mean absolute error {s['mean_abs_error']:.1%}, max {s['max_abs_error']:.1%}, "
                     f"inside their bands {s['inside_band_share']:.0%}, median band half-width "
                     f"{s['median_band_half_width']:.0%} of the prediction (a band says something only when both are good: "
                     f"most inside, narrow)")
    busy, load = s.get("bench_busy_share"), s.get("bench_host_load")
    if busy is not None:
        lines.append(busy_text(busy, "the bench ranks'"))
    elif load is not None:  # a CPU table without a busy share: written before the column, or /proc/stat unreadable
        lines.append(f"the bench table was measured with a 1-minute load of {load:.2f} on the whole machine before its ranks "
                     "started (whether their own cores were busy, this table cannot say"
                     + (": /proc/stat could not be read)" if s.get("bench_busy_recorded") else
                        ": `scalelab bench comm` now records it)"))
    steal = s.get("bench_steal_share")
    if steal is not None:
        lines.append(f"the hypervisor took {steal:.1%} of the bench ranks' cores' time while they were timed"
                     + (" (other guests of the physical host were busy): its times (and this model's communication) run "
                        "high; `scalelab bench comm` on a quiet host measures them again" if steal > STEAL_WARN else ""))
    return "\n".join(lines)
