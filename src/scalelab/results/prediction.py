"""The step-time model's prediction of each run (scalelab.results.step_model fits it): the predicted
step, its exposed communication and its band, the prediction block collection adds to every row.


The band (99%): the step moved by 2.576 sigma of its parts' noise: the run-to-run sigma of a step
(scalelab.results.noise, pooled over the fit set's repeated points) on the run and on its compute
reference's median, the link fit's relative residual on each collective's time, a measured token
share's own error carried to the run's token count and, for a run beyond its reference's world size,
the model's own error there (``sigma_model``: fitted from the fit set's runs beyond their reference,
else DEFAULT_MODEL_SIGMA; unknown on a GPU, which the row's note says); widened, where the token share was defaulted,
to the compute it would take at a share of 1. Where no bench table
exists, or a configuration has no compute reference in the fit set, the prediction is null and
``prediction_note`` says why.

On a CPU, ranks on one host share its memory bandwidth, caches and the cores the OS and the
launcher also need: with every core busy a rank computes slower than alone, which no input of the
model measures (contention, not scaling).
"""
from __future__ import annotations

import math

import numpy as np

from scalelab.formulas.overlap import DEFAULT_OVERLAP_EFFICIENCY, step_time
from scalelab.formulas.predicted_columns import missing
from scalelab.results.step_model import MEASURED, Model, compute_key, fit, noise_terms, parts_of

PREDICTED_COLUMNS = ("predicted_step_time_s", "predicted_step_time_s_low", "predicted_step_time_s_high",
                     "predicted_tokens_per_s", "predicted_exposed_comm_s", "prediction_note")
"""What predict() adds per run: the metrics table's prediction block (scalelab.planning.columns). The compute
part is the step less its exposed communication."""


BAND_GOAL = 0.25
"""A band wider than this either side of its prediction names what widens it, in its note."""
BAND_Z = 2.576
"""The band's half-width in sigmas: 99% of a normal error (the report's confidence, scalelab.results.noise),
not Student's t of the few repeats a sweep has (t = 9.9 at 2 degrees of freedom would make every band
wider than the step)."""

def predict_row(model: Model, row: dict) -> dict:
    """The prediction block of one run's row (PREDICTED_COLUMNS): null figures and the reason
    where the model has none."""
    out = dict.fromkeys(PREDICTED_COLUMNS)
    out["predicted_compute_s"] = None
    parts = parts_of(model, row)
    if isinstance(parts, str):
        out["prediction_note"] = parts
        return out
    ref, compute, n = parts.ref, parts.compute_s, int(row["world_size"])
    eta = model.overlap_efficiency.get(row.get("device_type"), DEFAULT_OVERLAP_EFFICIENCY.get(row.get("device_type"), 0.0))
    st = step_time(row["zero_stage"], compute, parts.comm_s, calls=parts.calls, overlap_efficiency=eta)
    model_sigma = model.model_sigma.get(row.get("device_type")) if parts.across else 0.0
    terms = {**noise_terms(model, parts, st.step_s),
             "the model's error across world sizes": ((model_sigma or 0.0) * st.step_s) ** 2}
    ratio, sigma = parts.tokens / ref["tokens_per_rank"], model.sigma or 0.0
    half = BAND_Z * math.sqrt(sum(terms.values()))
    # a defaulted token share is an assumption between its estimate and 1 (all compute grows with tokens)
    other = ref["compute_s"] * ratio if str(ref["token_share_source"]).startswith("defaulted") else compute
    low, high = min(compute, other) - compute, max(compute, other) - compute
    width = {**{k: BAND_Z * math.sqrt(v) for k, v in terms.items()},
             "the assumed token share (measure it: train.measure_s)": high - low}
    wide = ""
    if (high - low + 2 * half) / 2 > BAND_GOAL * st.step_s:
        wide = (f"; band +-{(high - low + 2 * half) / 2 / st.step_s:.0%}, wider than +-{BAND_GOAL:.0%}: mostly "
                f"{max(width, key=width.get)}" + ("" if sigma else " (run-to-run noise unknown: no repeats)"))
    if parts.across and model_sigma is None:
        wide += (f"; the model's error across world sizes on {row.get('device_type') or 'this device'} is unknown (no run of the fit set "
                 "beyond its reference, no measured default): the band holds noise and the link fit only")
    tokens_per_step = row.get("tokens_per_step")
    if missing(tokens_per_step):
        tokens_per_step = float(row["global_batch"]) * float(row["seq_len"])
    in_sample = ref["world_size"] == n and ref["tokens_per_rank"] == parts.tokens
    out.update({
        "predicted_step_time_s": st.step_s, "predicted_step_time_s_low": max(st.step_s + low - half, 0.0),
        "predicted_step_time_s_high": st.step_s + high + half, "predicted_tokens_per_s": float(tokens_per_step) / st.step_s,
        "predicted_compute_s": compute, "predicted_exposed_comm_s": st.exposed_comm_s,
        "prediction_note": ("in-sample: compute measured on this configuration at this world size and micro-batch"
                            if in_sample else f"compute from world size {int(ref['world_size'])}, "
                            f"{ref['tokens_per_rank']:g} tokens per rank (token share {float(ref['token_share']):.2f}, "
                            f"{str(ref['token_share_source']).split(':')[0]})") + wide,
    })
    return out

def predict(model: Model, runs):
    """``runs`` with the prediction block (PREDICTED_COLUMNS) set, one prediction per row (replacing
    the block a collected table already holds: the sweep's own fit)."""
    import pandas as pd

    runs = runs.drop(columns=[c for c in PREDICTED_COLUMNS if c in runs.columns]).reset_index(drop=True)
    rows = [predict_row(model, r) for r in runs.to_dict("records")]
    return pd.concat([runs, pd.DataFrame(rows, columns=list(PREDICTED_COLUMNS))], axis=1)

def reference_rows(runs):
    """Each configuration's runs at the smallest world size it ran (COMPUTE_KEY): what collection
    fits on, so that every larger world size is predicted, none fitted (eta keeps its default)."""
    keys = [compute_key(r) for r in runs.to_dict("records")]
    smallest: dict[tuple, int] = {}
    for key, n, status in zip(keys, runs["world_size"], runs["status"], strict=True):
        if status == "ok":
            smallest[key] = min(smallest.get(key, n), n)
    mask = np.array([smallest.get(key) == n for key, n in zip(keys, runs["world_size"], strict=True)], dtype=bool)
    return runs.loc[mask]


def sweep_predictions(runs, results_dir=None):
    """The prediction block (PREDICTED_COLUMNS) of every row of a sweep's metrics table, fitted on
    the sweep's reference runs (reference_rows: each configuration at the smallest world size it
    ran) and its bench comm table (``<results_dir>/calibration/comm.parquet``) where there is one.
    A table that cannot be read, or a fit that fails, leaves every row null with the reason."""
    from pathlib import Path

    import pandas as pd

    from scalelab.registries.comm_table import BENCH_FILE, read_table

    frame = pd.DataFrame(index=range(len(runs)), columns=list(PREDICTED_COLUMNS), dtype=object)
    table, path = None, Path(results_dir) / BENCH_FILE if results_dir is not None else None
    try:
        if path is not None and path.exists():
            table = read_table(path)
        model = fit(reference_rows(runs), table, str(path) if table is not None else None)
    except (ValueError, OSError) as err:
        frame["prediction_note"] = f"no prediction: {err}"
        return frame
    rows = [predict_row(model, r) for r in runs.reset_index(drop=True).to_dict("records")]
    return pd.DataFrame(rows, columns=list(PREDICTED_COLUMNS))

def outside_band(runs):
    """The ok rows whose measured step time lies outside their predicted band."""
    ok = runs[(runs["status"] == "ok") & runs["predicted_step_time_s"].notna() & runs[MEASURED].notna()]
    return ok[(ok[MEASURED] < ok["predicted_step_time_s_low"]) | (ok[MEASURED] > ok["predicted_step_time_s_high"])]
