"""The report: best configuration, warnings, plots, run table, formulas, provenance, from the Parquet alone.

``build_report(results_dir)`` reads ``metrics.parquet`` and ``steps.parquet`` (and one pipeline
run's traced step, ``runs/<run>/pipeline_timeline.json``, where its folder is there; no training)
and writes ``report/report.html`` (one self-contained
file, images embedded, rendered from the Jinja2 templates in
scalelab/report/templates/), ``report/summary.md`` and the figures in ``report/figures/``
(the registry in scalelab.report.figures names them and holds their captions). Numbers
are formatted per column (``column_format``); column titles come from the data dictionary.
"""
from __future__ import annotations

import base64
import datetime
import functools
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
from markupsafe import Markup

from scalelab import __version__
from scalelab.io import building_dir, check_replaceable
from scalelab.planning.result_tables import read_runs, read_steps, schema_version
from scalelab.planning.sweep import SWEEP_AXES
from scalelab.registries.families import DEFAULT_FAMILY
from scalelab.report import checks, dictionary
from scalelab.report.figures import FIGURES_DIR, Drawn, start_figures
from scalelab.report.formula_section import formulas_html
from scalelab.report.levers import baseline, fp8_table, lever_table
from scalelab.report.table_format import BEST_COLUMNS, markdown_table, markdown_text, table_model
from scalelab.report.tables import (
    answer,
    best_configurations,
    forecast_ranking,
    loss_deviation_vs_stage0,
    mfu_flagged,
    noise_of,
    pruned_rows,
    standing,
)
from scalelab.results.like import OVER_STAGE, OVER_WORLD_SIZE, like_key, model_labels, scaling_efficiency, several_models

__all__ = ["build_report", "find_warnings", "load_tables", "render"]
MEMORY_TOLERANCE = 0.10
COMM_TOLERANCE = 0.10
FP32_PARITY_RTOL = 1e-4

# Every sweep axis (scalelab.planning.sweep.AXES) shows: a LoRA run and its full twin, or a compiled run and
# its eager one, differ in an axis column, not by id alone.
TABLE_COLUMNS = [
    "run_id", *SWEEP_AXES, "accumulation_steps", "status", "tokens_per_s", "scaling_efficiency", "mfu",
    "step_ms_measured", "step_ms_predicted", "model_state_mib_measured", "model_state_mib_predicted", "comm_mib_per_step_measured",
    "comm_mib_per_step_predicted", "peak_mib_predicted", "peak_mib_measured_gpu", "final_loss", "skipped_steps", "wall_time_s", "reason",
]
# The order shown: what a reader looks up first (the run, its outcome, the axes that vary in this sweep,
# throughput, memory, loss) before the predictions, the axes every run shares and the reason; with
# headers that wrap at their underscores, the key columns fit a 1400 px window without scrolling sideways.
KEY_COLUMNS = ["tokens_per_s", "scaling_efficiency", "mfu", "peak_mib_measured_gpu", "model_state_mib_measured", "final_loss",
               "skipped_steps"]
LATER_COLUMNS = ["step_ms_measured", "step_ms_predicted", "model_state_mib_predicted", "peak_mib_predicted",
                 "comm_mib_per_step_measured", "comm_mib_per_step_predicted", "accumulation_steps", "wall_time_s"]


def load_tables(results_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, steps). The steps' run_id, precision and model are read as categoricals: the figures group
    and filter half a million step rows by them."""
    results_dir = Path(results_dir)
    runs_path, steps_path = results_dir / "metrics.parquet", results_dir / "steps.parquet"
    for path in (runs_path, steps_path):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run `scalelab collect {results_dir}` (or the workflow) first")
    # tables an earlier version wrote read with today's columns (cached results report without recollecting)
    return read_runs(runs_path), read_steps(steps_path, read_dictionary=["run_id", "precision", "model"])


def find_warnings(runs: pd.DataFrame, steps: pd.DataFrame, best: pd.DataFrame | None = None) -> list[str]:
    """best: best_configurations(runs), when the caller has it already (the report does)."""
    warnings = []
    # Rows are picked from the few columns a message needs: picking from all ~100 costs a
    # 1,000-run report a tenth of a second.
    ok = runs[runs["status"] == "ok"]
    # a pruned point is a decision (planning.top_k), shown in its own section
    for r in runs.loc[(runs["status"] != "ok") & ~pruned_rows(runs), ["run_id", "status", "reason"]].itertuples():
        warnings.append(f"{r.run_id}: status {r.status}: {r.reason}")
    warnings += checks.mfu_over_peak_warnings(runs[mfu_flagged(runs)])
    for r in runs.loc[runs["steps_problem"].notna(), ["run_id", "steps_problem"]].itertuples():
        warnings.append(f"{r.run_id}: {r.steps_problem}: its steps are in no figure or table")
    for r in ok.loc[ok["teardown_warning"].notna(), ["run_id", "teardown_warning"]].itertuples():
        warnings.append(f"{r.run_id}: {r.teardown_warning}; its measurements are complete and kept")
    for r in ok.loc[ok["mfu"].isna(), ["run_id", "peak_flops_source"]].itertuples():
        warnings.append(f"{r.run_id}: MFU unknown: {r.peak_flops_source}")
    devices = ok.groupby(ok["device_type"].fillna("?") + ": " + ok["device_name"].fillna("?"))["run_id"].agg(list)
    if len(devices) > 1:  # e.g. device: auto on a mixed cluster, or results copied together
        warnings.append("this sweep mixes devices, so its runs do not compare: " + "; ".join(
            f"{device} ({len(ids)} run(s), e.g. {ids[0]})" for device, ids in devices.items()))
    # A one-rank stage-0 run trains without DDP; one measured before that held DDP's all-reduce.
    ddp_one_rank = ok[(ok["zero_stage"] == 0) & (ok["world_size"] == 1) & (ok["comm_bytes_per_step_measured"] > 64)]
    for run_id in ddp_one_rank["run_id"]:
        warnings.append(f"{run_id}: measured in DDP over one rank (scalelab before 26 Nov 2026, 3% slower on an H100 "
                        "and 4 bytes per parameter more memory), not as the plain one-GPU baseline its scaling is "
                        "held against: delete its run folder and run the workflow again")
    # Masks first, messages for the few rows they select (a loop over every row costs 1,000-run reports a tenth of a second).
    mem_pred = ok["model_state_bytes_predicted"].where(ok["model_state_bytes_predicted"] != 0)
    mem_off = (ok["model_state_bytes_measured"] / mem_pred - 1).abs() > MEMORY_TOLERANCE
    pred, meas = ok["comm_bytes_per_step_predicted"], ok["comm_bytes_per_step_measured"]
    # A prediction of 0 (FSDP2 at world size 1) tolerates the loss scaler's few-byte inf check.
    comm_off = pred.notna() & ((meas - pred).abs() > np.maximum(COMM_TOLERANCE * pred, 64))
    comm_off &= ~ok.index.isin(ddp_one_rank.index)  # said once, above: measured in DDP over one rank
    for r in ok.loc[mem_off | comm_off, ["run_id", "model_state_bytes_measured", "model_state_bytes_predicted",
                                         "comm_bytes_per_step_measured", "comm_bytes_per_step_predicted"]].itertuples():
        if mem_off[r.Index]:
            warnings.append(f"{r.run_id}: measured model state {r.model_state_bytes_measured / 2**20:.3f} MiB is more than "
                            f"{MEMORY_TOLERANCE:.0%} off the prediction {r.model_state_bytes_predicted / 2**20:.3f} MiB")
        if comm_off[r.Index]:
            warnings.append(f"{r.run_id}: measured communication {r.comm_bytes_per_step_measured:.0f} B/step is more than "
                            f"{COMM_TOLERANCE:.0%} off the prediction {r.comm_bytes_per_step_predicted:.0f} B/step")
    warnings += fp32_parity_warnings(ok, steps)
    # What a reader would miss in the figures: loss spikes, grad-norm jumps, MFU peaks out of line (scalelab.report.checks).
    best = best if best is not None else best_configurations(runs)
    return (warnings + checks.spike_warnings(steps, runs) + checks.peak_warnings(runs) + checks.noise_warnings(runs, best)
            + checks.outlier_warnings(runs) + checks.superlinear_warnings(runs) + checks.busy_calibration_warnings(runs)
            + checks.steal_warnings(runs) + checks.drift_warnings(runs) + checks.prediction_warnings(runs) + checks.fp8_warnings(runs))


def fp32_parity_warnings(ok: pd.DataFrame, steps: pd.DataFrame) -> list[str]:
    """Every fp32 run of one like across stages and world sizes (scalelab.results.like: the same model
    and levers; a LoRA run or another model learns otherwise) should follow the same loss trajectory:
    one warning per model whose runs differ by more than FP32_PARITY_RTOL at a step."""
    fp32_runs = ok[ok["precision"] == "fp32"].drop_duplicates("run_id")
    if fp32_runs.empty:
        return []
    fp32 = steps[(steps["precision"] == "fp32") & steps["run_id"].isin(fp32_runs["run_id"])]
    if fp32.empty:
        return []
    ids = fp32_runs["run_id"].astype(str).to_numpy()
    like_code, _ = pd.factorize(like_key(fp32_runs, OVER_STAGE + OVER_WORLD_SIZE))
    label = model_labels(fp32_runs).to_numpy()
    label_of_like = pd.Series(label).groupby(like_code).first()
    # per run, not per step row: a categorical run_id factorizes on its codes (no string work on the steps)
    codes, uniques = pd.factorize(fp32["run_id"])
    group = pd.Series(like_code, index=ids).reindex(np.asarray(uniques, dtype=object).astype(str)).to_numpy()[codes]
    step = fp32["step"].to_numpy(dtype=np.int64)
    n_steps = int(step.max()) + 1
    ref = pd.Series(fp32["loss"].to_numpy(dtype=float)).groupby(group * n_steps + step).agg(["min", "max"])
    spread = ((ref["max"] - ref["min"]) / ref["min"].abs()).groupby(ref.index // n_steps).max()
    worst = spread.groupby(label_of_like.reindex(spread.index).to_numpy()).max()
    several = len(set(label)) > 1
    return [f"fp32 parity broken{f' in model {model}' if several else ''}: losses of fp32 runs differ by up to {value:.2e} "
            f"(relative) at one step; expected < {FP32_PARITY_RTOL:g} across stages and world sizes (runs of the same "
            "model and levers)" for model, value in worst.items() if value > FP32_PARITY_RTOL]


MODEL_KEYS = ["model", "model_family", "n_params", "n_layers", "d_model", "n_heads", "seq_len", "vocab_size"]


def _count(n) -> str:
    """A parameter count as people say it: 1.2M, 350M, 1.3B."""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{int(n)}"


def _values(series: pd.Series, fmt=str) -> str:
    values = sorted(series.dropna().unique().tolist())
    return " / ".join(fmt(v) for v in values) if values else "?"


def trained_lines(runs: pd.DataFrame, steps: pd.DataFrame) -> list[str]:
    """What the sweep trained, from the tables alone: one line per distinct model (parameters, shape,
    sequence length), with its global batch and tokens per step, peak learning rate (the largest lr
    of its runs' steps), steps and dataset; values that differ between its runs joined by /."""
    keys = [k for k in MODEL_KEYS if k in runs]
    known = runs.dropna(subset=["n_params"]) if "n_params" in runs else runs.iloc[:0]
    if known.empty:
        return []
    peak_lr = steps.groupby(steps["run_id"].astype(str), observed=True)["lr"].max() if "lr" in steps else pd.Series(dtype=float)
    lines = []
    # A LoRA run has the parameters of its adapters on top: the same model, its count shown beside.
    by = [k for k in keys if k != "n_params" and known[k].notna().all()]
    for _, group in (known.groupby(by, sort=True) if by else [(None, known)]):
        r = group.iloc[0]
        shape = ", ".join(f"{label} {_values(group[col], lambda v: str(int(v)))}" for col, label in
                          (("n_layers", "layers"), ("d_model", "d_model"), ("n_heads", "heads")) if col in group)
        lr = group["run_id"].astype(str).map(peak_lr)
        lines.append(
            (f"model {r['model']}: " if "model" in group and pd.notna(r["model"]) else "")
            + (f"{r['model_family']} family, " if "model_family" in group and pd.notna(r["model_family"]) else "")
            + f"{_values(group['n_params'], _count)} parameters ({shape}), sequence length {_values(group['seq_len'], lambda v: str(int(v)))}; "
            + f"global batch {_values(group['global_batch'], lambda v: str(int(v)))} sequences, "
            + f"{_values(group['tokens_per_step'], lambda v: f'{int(v):,}')} tokens per step; "
            + f"learning rate {_values(lr, lambda v: f'{v:.3g}')} (peak); "
            + f"{_values(group['steps'], lambda v: str(int(v)))} steps"
            + (f" ({_values(group['warmup_steps'], lambda v: str(int(v)))} warm-up)" if "warmup_steps" in group else "")
            + f"; dataset {_values(group['dataset'])}"
            + (f" (train sha256 {_values(group['dataset_sha256_train'], lambda v: str(v)[:12])})"
               if "dataset_sha256_train" in group and group["dataset_sha256_train"].notna().any() else "")
            + f"; {len(group)} run{'s' if len(group) != 1 else ''}")
    return lines


def _provenance(runs: pd.DataFrame) -> pd.DataFrame:
    prov = runs[[c for c in PROVENANCE_COLUMNS if c in runs]].astype("string").fillna("-").value_counts().reset_index(name="runs")
    return prov


PROVENANCE_COLUMNS = ["requested_device", "device_type", "device_name", "backend", "torch_version", "cuda_version", "nccl_version",
                      "python_version", "hostname", "git_commit", "git_dirty", "git_commit_source", "config_hash"]


def _fmt_table(runs: pd.DataFrame) -> pd.DataFrame:
    t = runs.copy()
    t["scaling_efficiency"] = scaling_efficiency(t)
    t["step_ms_measured"] = t["step_time_s_mean"] * 1e3
    t["step_ms_predicted"] = t["predicted_step_time_s"] * 1e3
    t["model_state_mib_measured"] = t["model_state_bytes_measured"] / 2 ** 20
    t["model_state_mib_predicted"] = t["model_state_bytes_predicted"] / 2 ** 20
    t["comm_mib_per_step_measured"] = t["comm_bytes_per_step_measured"] / 2 ** 20
    t["comm_mib_per_step_predicted"] = t["comm_bytes_per_step_predicted"] / 2 ** 20
    t["peak_mib_predicted"] = t["predicted_peak_bytes"] / 2 ** 20
    t["peak_mib_measured_gpu"] = t["peak_mem_allocated_bytes"] / 2 ** 20
    # a traced run (train.profile) shows its exposed communication beside the model's and where its files lie
    traced = [c for c in TRACE_COLUMNS if c in t and t[c].notna().any()]
    if "profiled_steps" in traced:
        t["exposed_comm_ms_measured"] = t["exposed_comm_s_measured"] * 1e3
        t["exposed_comm_ms_predicted"] = t["predicted_exposed_comm_s"] * 1e3
        traced = ["exposed_comm_ms_measured", "exposed_comm_ms_predicted", *[c for c in traced if c != "exposed_comm_s_measured"]]
    t = t[TABLE_COLUMNS + traced].sort_values([*SWEEP_AXES, "run_id"])
    varies = [a for a in SWEEP_AXES if t[a].nunique(dropna=False) > 1]
    shared = [a for a in SWEEP_AXES if a not in varies]
    return t[["run_id", "status", *varies, *KEY_COLUMNS, *LATER_COLUMNS, *traced, *shared, "reason"]]


TRACE_COLUMNS = ["exposed_comm_s_measured", "profiled_steps", "trace_files", "memory_snapshot_files"]
"""What the run table adds where a run was traced (train.profile) or its memory recorded (train.memory_snapshot)."""


SUMMARY_COLUMNS = ["run_id", "model", "status", "tokens_per_s", "scaling_efficiency", "mfu", "model_state_mib_measured",
                   "model_state_mib_predicted", "final_loss"]



def _with_model(table: pd.DataFrame, runs: pd.DataFrame, several: bool) -> pd.DataFrame:
    """A table of runs (by run_id) with each row's model after its run id, in a sweep of several models."""
    if not several or table.empty or "run_id" not in table or "model" in table:
        return table
    first = runs.drop_duplicates("run_id")
    labels = pd.Series(model_labels(first).to_numpy(), index=first["run_id"].astype(str).to_numpy())
    out = table.copy()
    out.insert(int(out.columns.get_loc("run_id")) + 1, "model", out["run_id"].astype(str).map(labels))
    return out


def _deviation_table(dev: pd.DataFrame, several: bool) -> pd.DataFrame:
    """loss_deviation_vs_stage0 as shown: the model column in a sweep of several models, the levers
    column where a row has a lever away from its default."""
    drop = [c for c, shown in (("model", several), ("levers", bool((dev["levers"] != "").any()) if not dev.empty else False))
            if not shown]
    return dev.drop(columns=drop)


def _best_table(best: pd.DataFrame) -> pd.DataFrame:
    """best_configurations' table as shown: a row per world size, per model where the sweep holds several."""
    raw, best = best, best.copy()
    best["did_not_fit"] = best["did_not_fit"].replace("", "-")
    best["run_id"] = [answer(r) for r in raw.itertuples()]  # the one answer, worded as the console words it
    best["standing"] = [standing(r, noise_of(raw, r.model)).removeprefix("; ") or "-" for r in raw.itertuples()]
    shown = [c for c in BEST_COLUMNS if c != "model" or best["model"].nunique() > 1]
    return best[shown].rename(columns=BEST_COLUMNS)


def _best_note(best: pd.DataFrame) -> str:
    kinds = set(best["peak_memory"].dropna())
    return (best.attrs["noise"].sentence() + " Peak memory: "
            + (" or ".join(sorted(kinds)) if kinds else "-") + " (GPU runs: max allocated device memory; CPU: process peak RSS).")


# --------------------------------------------------------------------------- rendering

@functools.lru_cache(maxsize=1)
def environment():
    """The Jinja2 environment of the templates shipped in scalelab/report/templates/ (package data)."""
    import jinja2

    # HTML pages autoescaped; summary.md escapes the results' names itself (markdown_text: Markdown's own rules)
    escape = jinja2.select_autoescape(enabled_extensions=("html.j2",), disabled_extensions=("md.j2",), default=True)
    env = jinja2.Environment(loader=jinja2.PackageLoader("scalelab.report", "templates"), autoescape=escape,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["markdown_text"] = markdown_text
    return env


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)


def _png_width(data: bytes) -> int | None:
    """CSS width of a PNG drawn at plot_style.DPI, shown at 96 px per inch (crisp on dense screens)."""
    from scalelab.report.plot_style import DPI

    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return round(int.from_bytes(data[16:20], "big") * 96 / DPI)


def _figure(fig_dir: Path, drawn: Drawn, family: str | None = None) -> dict:
    """The PNG embedded, the registry's caption, then the figure's own note if it has one. family:
    the model family whose folder under figures/ holds it (a sweep that mixes families)."""
    png = drawn.files[0]
    data = (fig_dir / png).read_bytes()
    alt = f"{FIGURES_DIR}/{family}/{png}" if family else f"{FIGURES_DIR}/{png}"
    return {"name": drawn.figure.name, "alt": alt, "data": base64.b64encode(data).decode(),
            "width": _png_width(data), "caption": drawn.figure.caption, "note": drawn.note}


def _dictionary_table() -> pd.DataFrame:
    rows = []
    runs, steps = dictionary.run_columns(), dictionary.step_columns()
    for name, (unit, meaning) in {**runs, **steps}.items():
        tables = "both" if name in runs and name in steps else "metrics" if name in runs else "steps"
        rows.append({"column": name, "table": tables, "unit": unit,
                     "meaning": meaning if tables != "both" or name in dictionary.IDENTITY else
                     f"metrics: {runs[name][1]}; steps: {steps[name][1]}"})
    return pd.DataFrame(rows)


def model_families(runs: pd.DataFrame) -> list[str]:
    """The model families of a sweep's runs, sorted (a run recorded before families is gpt2)."""
    if "model_family" not in runs:
        return [DEFAULT_FAMILY]
    return sorted(runs["model_family"].fillna(DEFAULT_FAMILY).astype(str).unique()) or [DEFAULT_FAMILY]


def _of_family(runs: pd.DataFrame, steps: pd.DataFrame, family: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    mine = runs[runs["model_family"].fillna(DEFAULT_FAMILY).astype(str) == family]
    return mine, steps[steps["run_id"].isin(mine["run_id"])]


def _family_figures(family: str, fig_dir: Path, drawn: list) -> dict:
    return {"family": family,
            "figures": [_figure(fig_dir, d, family) for d in drawn if d.figure.kind == "main"],
            "lever_figures": [_figure(fig_dir, d, family) for d in drawn if d.figure.kind == "lever"]}


MiB = 2 ** 20


def inter_node_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Traffic per link of the runs that spanned nodes, by strategy and world size:
    rank 0's bytes per step on the inter-node link (collectives whose group spans nodes) and within
    a node, measured beside the formulas, with the run's speed. Empty where no run spanned nodes:
    on one host every byte is intra-node, and a table of zeros would say nothing (the formulas
    for other placements: ``scalelab estimate scaling``)."""
    from scalelab.registries.strategies import strategy

    needed = {"nodes_used", "comm_inter_node_bytes_per_step_measured"}
    if runs.empty or not needed <= set(runs.columns):
        return pd.DataFrame()
    spanning = runs[(runs["status"] == "ok") & (runs["nodes_used"].fillna(1) > 1)
                    & runs["comm_inter_node_bytes_per_step_measured"].notna()]
    if spanning.empty:
        return pd.DataFrame()
    replicas = spanning["replicas"] if "replicas" in spanning else pd.Series(1, index=spanning.index)
    shared = spanning.get("nodes_share_machine", pd.Series(None, index=spanning.index))
    table = pd.DataFrame({
        "run_id": spanning["run_id"],
        "strategy": [strategy(int(z), int(r)).name for z, r in zip(spanning["zero_stage"], replicas.fillna(1), strict=True)],
        "precision": spanning["precision"], "world_size": spanning["world_size"], "replicas": replicas.fillna(1).astype(int),
        "nodes_used": spanning["nodes_used"],
        "inter_node_mib_per_step": spanning["comm_inter_node_bytes_per_step_measured"] / MiB,
        "inter_node_mib_per_step_predicted": spanning["comm_inter_node_bytes_per_step_predicted"] / MiB,
        "intra_node_mib_per_step": spanning["comm_intra_node_bytes_per_step_measured"] / MiB,
        "intra_node_mib_per_step_predicted": spanning["comm_intra_node_bytes_per_step_predicted"] / MiB,
        "tokens_per_s": spanning["tokens_per_s"],
        # beside the timings: nodes of one machine share its cores, so compute is over-committed
        "timings": ["nodes share one machine's cores: over-committed" if v is True else "" for v in shared],
    })
    return table.sort_values(["precision", "world_size", "strategy"]).reset_index(drop=True)


def family_table(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per model of a sweep that mixes families: its family, parameters, FLOPs per token
    (and whether formula or counted), its runs, the largest deviations of model state and block
    activations from their formulas, the spread of its fp32 losses across stages and world sizes,
    and its best point per world size, by the one rule every best point is named by (_fastest_text)."""
    rows = []
    runs = runs.assign(model_family=runs["model_family"].fillna(DEFAULT_FAMILY))
    for (family, model), group in runs.groupby(["model_family", "model"], sort=True):
        ok = group[group["status"] == "ok"]
        state = (ok["model_state_bytes_measured"] / ok["model_state_bytes_predicted"] - 1).abs()
        acts = (ok["activation_bytes_measured"] / ok["activation_bytes_predicted"] - 1).abs()
        fp32 = steps[steps["run_id"].isin(ok.loc[ok["precision"] == "fp32", "run_id"])]
        spread = fp32.groupby("step")["loss"].agg(["min", "max"]) if not fp32.empty else None
        rows.append({"model_family": family, "model": model,
                     "n_params": ", ".join(f"{int(n):,}" for n in sorted(ok["n_params"].dropna().unique())) or "-",
                     "flops_per_token": ok["flops_per_token"].max() if not ok.empty else np.nan,
                     "flops_per_token_method": ", ".join(sorted(ok["flops_per_token_method"].dropna().unique()))
                     if "flops_per_token_method" in ok else "formula",
                     "runs": len(group), "ok_runs": len(ok),
                     "model_state_max_deviation": state.max() if not state.empty else np.nan,
                     "activation_max_deviation": acts.max() if acts.notna().any() else np.nan,
                     "fp32_loss_spread": f"{((spread['max'] - spread['min']) / spread['min'].abs()).max():.1e}"
                     if spread is not None else "-",
                     "fastest_per_world_size": _fastest_text(group)})
    return pd.DataFrame(rows)


def _fastest_text(group: pd.DataFrame) -> str:
    """A model's best point per world size by the rule "Best configuration" and the console use
    (best_configurations: the median of a point's repeats, ties within run-to-run noise named as ties)."""
    best = best_configurations(group)
    best = best[best["run_id"].notna()]
    return ", ".join(f"w{int(r.world_size)}: {answer(r)} ({r.tokens_per_s:,.0f} tokens/s"
                     + (f", median of {int(r.repeats)} runs)" if r.repeats > 1 else ", 1 run)") for r in best.itertuples()) or "-"


def build_report(results_dir: str | Path, out_dir: str | Path | None = None, workers: int | None = None) -> Path:
    """Write <out_dir>/report.html, summary.md and the figures (in <out_dir>/figures/); return
    the HTML path. Built in a sibling folder and moved into place, so a failed build never
    leaves a partial report (an earlier complete one stays). workers: processes drawing the
    figures (scalelab.report.figures.drawing_workers)."""
    results_dir = Path(results_dir)
    out_dir = Path(out_dir) if out_dir else results_dir / "report"
    check_replaceable(out_dir, ("report.html", "summary.md", FIGURES_DIR))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = building_dir(out_dir)
    try:
        _build(results_dir, building, workers)
        replaced = out_dir.with_name(f".{out_dir.name}.old")
        if out_dir.exists():
            shutil.rmtree(replaced, ignore_errors=True)
            out_dir.rename(replaced)
        building.rename(out_dir)
        shutil.rmtree(replaced, ignore_errors=True)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return out_dir / "report.html"


def _no_runs_report(results_dir: Path, out_dir: Path) -> None:
    """A results folder without a single run: say so, in both files, with what to do."""
    from scalelab.results.invocation import rerun_command

    message = (f"No runs in {results_dir}: metrics.parquet has no rows. Run the workflow "
               f"({rerun_command(results_dir)}) or point scalelab report at a folder whose runs/ holds results.")
    (out_dir / FIGURES_DIR).mkdir(parents=True, exist_ok=True)
    (out_dir / "report.html").write_text(render("report.html.j2", no_runs=message), encoding="utf-8")
    (out_dir / "summary.md").write_text(f"# scalelab summary\n\n{message}\n")


def _forecast_tables(ranking: pd.DataFrame) -> dict:
    """The forecast's ranking (planning.top_k) as the report shows it: the points that ran, their measured
    rank beside the forecast's, and apart, the pruned points (forecast only, never trained)."""
    if ranking.empty:
        return {"forecast_ran": None, "forecast_pruned": None}
    ran, pruned = ranking[~ranking["pruned"]], ranking[ranking["pruned"]]
    return {"forecast_ran": table_model(ran.drop(columns=["pruned", "reason"])),
            "forecast_pruned": table_model(pruned[["model", "world_size", "point", "forecast_rank", "forecast_tokens_per_s",
                                                   "predicted_peak_mib", "reason"]]) if not pruned.empty else None}


def _summary_markdown(context: dict, best: pd.DataFrame, inter_node: pd.DataFrame, runs_table: pd.DataFrame) -> str:
    """summary.md (templates/summary.md.j2) from the report's context and its tables as Markdown."""
    def table(df: pd.DataFrame) -> str:
        return markdown_table(df).rstrip("\n")  # the template's lines end it

    return render("summary.md.j2", **context, best_markdown=table(best),
                  inter_node_markdown=table(inter_node) if not inter_node.empty else None, runs_markdown=table(runs_table))


def _build(results_dir: Path, out_dir: Path, workers: int | None = None) -> None:
    runs, steps = load_tables(results_dir)
    if runs.empty:
        return _no_runs_report(results_dir, out_dir)
    # The main figures compare precision x stage x world size with every lever at its default.
    base = baseline(runs)
    in_figures = baseline(runs, strategies=True)  # what the main figures draw: hybrid sharding beside ZeRO-3 too
    levers, fp8 = lever_table(runs), fp8_table(runs)
    fig_dir = out_dir / FIGURES_DIR
    # A sweep that mixes model families draws each family's figures apart (figures/<family>/): a
    # GPT-2 and a Llama run at one precision, stage and world size are not repeats of one point.
    families = model_families(runs)
    first = _of_family(runs, steps, families[0]) if len(families) > 1 else (runs, steps)
    first_dir = fig_dir / families[0] if len(families) > 1 else fig_dir
    # Drawn by other processes while the tables are made; they are reaped on leaving the block,
    # once the report is written (or stopped, if making it failed).
    with start_figures(*first, lever_table(first[0]) if len(families) > 1 else levers, first_dir, workers, results_dir) as job:
        best_raw = best_configurations(runs)
        warnings = find_warnings(runs, steps, best_raw)
        table = _fmt_table(runs)
        best, best_note = _best_table(best_raw), _best_note(best_raw)
        several = several_models(runs)
        dev = _deviation_table(loss_deviation_vs_stage0(steps[steps["run_id"].isin(base.loc[base["status"] == "ok", "run_id"])], runs),
                               several)
        # A sweep of several models names each row's model (scalelab.results.like): a row compares within it.
        inter_node = _with_model(inter_node_table(runs), runs, several)
        levers, fp8 = _with_model(levers, runs, several), _with_model(fp8, runs, several)
        tables = _report_tables(runs, best, levers, inter_node, fp8, table, dev)
        drawn = job.wait()
        by_family = []
        if len(families) > 1:  # each family's figures in its own section, none in the main one
            by_family, drawn = _figures_by_family(runs, steps, families, drawn, fig_dir, workers, results_dir), []

        context = {
            "no_runs": None, "n_runs": len(runs), "n_ok": int((runs["status"] == "ok").sum()), "n_steps": len(steps),
            "n_pruned": int(pruned_rows(runs).sum()),
            "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "version": __version__,
            "results_dir": str(results_dir), "schema": schema_version(results_dir / "metrics.parquet"),
            "warnings": warnings, "n_base": len(in_figures), "n_hybrid": len(in_figures) - len(base), **tables,
            "best_note": best_note, "best_per_model": several,
            # beside every comparison the figures and lever tables draw: what identical runs differed by
            "noise": best_raw.attrs["noise"].sentence(),
            "cpu_notice": checks.cpu_notice(runs), "cpu_best_note": checks.cpu_best_note(runs),
            "figures": [_figure(fig_dir, d) for d in drawn if d.figure.kind == "main"],
            "lever_figures": [_figure(fig_dir, d) for d in drawn if d.figure.kind == "lever"],
            "levers_section": any(d.figure.kind == "lever" for d in drawn) or not levers.empty or not fp8.empty,
            "formulas": Markup(formulas_html(runs)), "trained": trained_lines(runs, steps),
            "family_figures": by_family,
            "families": table_model(family_table(runs, steps)) if len(families) > 1 else None,
        }
        context["levers_section"] |= any(g["lever_figures"] for g in by_family)
        (out_dir / "report.html").write_text(render("report.html.j2", **context), encoding="utf-8")
        (out_dir / "summary.md").write_text(_summary_markdown(context, best, inter_node,
                                                              table[[c for c in SUMMARY_COLUMNS if c != "model" or several]]))


def _report_tables(runs: pd.DataFrame, best: pd.DataFrame, levers: pd.DataFrame, inter_node: pd.DataFrame,
                   fp8: pd.DataFrame, table: pd.DataFrame, dev: pd.DataFrame) -> dict:
    """The report's tables as the templates render them (table_model); None for an empty optional one."""
    def optional(df: pd.DataFrame) -> dict | None:
        return table_model(df) if not df.empty else None

    return {"best": table_model(best), "levers": optional(levers), "inter_node": optional(inter_node), "fp8": optional(fp8),
            "runs_table": table_model(table, wrap_headers=True), "deviation": optional(dev),
            "provenance": table_model(_provenance(runs)), "dictionary": table_model(_dictionary_table()),
            **_forecast_tables(forecast_ranking(runs))}


def _figures_by_family(runs: pd.DataFrame, steps: pd.DataFrame, families: list[str], first_drawn: list, fig_dir: Path,
                       workers: int | None, results_dir: Path) -> list[dict]:
    """A sweep of several model families: the first family's figures (drawn beside the tables), then each other
    family's, drawn in turn into figures/<family>/."""
    by_family = [_family_figures(families[0], fig_dir / families[0], first_drawn)]
    for family in families[1:]:
        f_runs, f_steps = _of_family(runs, steps, family)
        with start_figures(f_runs, f_steps, lever_table(f_runs), fig_dir / family, workers, results_dir) as job:
            by_family.append(_family_figures(family, fig_dir / family, job.wait()))
    return by_family
