"""The report: plots, run table, formulas, provenance and warnings, from the Parquet alone.

``build_report(results_dir)`` reads ``metrics.parquet`` and ``steps.parquet`` (nothing
else: no run folders, no training) and writes ``report/report.html`` (one self-contained
file, images embedded), ``report/summary.md`` and the figures in ``report/figures/`` (the
registry in scalelab.analysis.figures names them and holds their captions).
"""
from __future__ import annotations

import base64
import datetime
import html
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from scalelab import __version__
from scalelab.analysis.figures import FIGURES_DIR, Drawn, draw_figures
from scalelab.analysis.levers import baseline, fp8_table, lever_table
from scalelab.analysis.metrics import schema_version
from scalelab.analysis.plots import loss_deviation_vs_stage0, scaling_efficiency

MFU_LIMIT = 1.0
MEMORY_TOLERANCE = 0.10
COMM_TOLERANCE = 0.10
FP32_PARITY_RTOL = 1e-4

FORMULAS = """
<ul>
<li><b>Parameters</b> Ψ = V·d + T·d + L·(12d² + 13d) + 2d (+ V·d if the head is untied).</li>
<li><b>FLOPs per token</b> = 6·(12·L·d² + V·d) + 12·L·d·T (matmul weights forward and backward, plus attention
scores and values; causal masking not halved, PaLM's convention). <b>MFU</b> = tokens/s × FLOPs per token /
(peak × world size), against the dense peak of the precision named in each row (datasheet on known GPUs; on CPU
the best matmul rate measured at run start).</li>
<li><b>Model state per rank, at rest</b> (after the optimizer step). PyTorch AMP keeps fp32 parameters, fp32 gradients
and fp32 AdamW moments in every precision: stage 0: 16Ψ; stage 1: 8Ψ + 8Ψ/N; stages 2 and 3 (FSDP2): 16Ψ/N.
The ZeRO paper (mixed precision, K = 12): stage 0: 16Ψ; 1: 4Ψ + 12Ψ/N; 2: 2Ψ + 14Ψ/N; 3: 16Ψ/N.
FSDP2's stage 2 reshards parameters after backward, so at rest it holds what stage 3 holds; the stages differ
within a step (stage 2 keeps unsharded parameters from forward to backward).</li>
<li><b>Communication per step</b>, in the ZeRO paper's unit (all-reduce of Ψ = 2Ψ; all-gather, reduce-scatter,
broadcast of Ψ = Ψ): stage 0: 2Ψ; stage 1: 3Ψ with PyTorch's ZeroRedundancyOptimizer (all-reduce + broadcast of
updated shards; the paper's 2Ψ); stage 2: 2Ψ; stage 3: 3Ψ; with k accumulation micro-batches FSDP2 stages 2/3
move (k+1)Ψ and (2k+1)Ψ. At world size 1 FSDP2 issues no collectives (0 bytes) while DDP and ZeRO-1 still do.
Bytes = elements × 4 (gradients and parameters travel in fp32). On a ring each rank sends (N−1)/N of this.</li>
<li><b>Scaling efficiency</b> = tokens/s at N / (N × tokens/s at world size 1), same precision and stage.</li>
<li><b>Activations</b> kept for backward per layer and micro-batch. Korthikanti et al. 2022 (2-byte values, no tensor
parallelism): s·b·h·(34 + 5·a·s/h), and 2·s·b·h with full recomputation ("paper" columns, scaled by width / 2). For this
model: scaled_dot_product_attention never stores the a·s² scores and there is no dropout, which leaves 16·s·b·h values
per layer; under autocast (fp16, bf16, fp8) the residual stream and LayerNorm inputs stay fp32 and the 16-bit copies
of the 12·d² block weights are kept; with per-block checkpointing only the block input remains (s·b·h values at the
residual's width). Measured: the bytes autograd saves during one micro-batch's forward on rank 0 (saved-tensor hooks,
distinct storages, parameters excluded, block inputs included).</li>
<li><b>Recompute cost</b> of checkpointing = one more forward of every block: 24·L·d² + 4·L·d·T FLOPs per token,
predicted step-time ratio 1 + that / FLOPs per token. MFU counts model FLOPs only; HFU adds the recompute.</li>
<li><b>DDP buckets</b>: gradients fill buckets of bucket_mb MiB in reverse registration order (about the order they
become ready); one all-reduce per bucket per step.</li>
</ul>
"""

CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#eee}.warn{background:#fff4e5;border-left:4px solid #f0a030;padding:.5em 1em}
.ok{color:#2a7}.bad{color:#c22;font-weight:bold}figure{margin:1em 0}figcaption{font-size:13px;color:#444}
img{max-width:100%}
"""

TABLE_COLUMNS = [
    "run_id", "precision", "zero_stage", "world_size", "micro_batch", "accumulation_steps", "activation_checkpointing",
    "cpu_offload", "bucket_mb", "status", "tokens_per_s", "scaling_efficiency", "mfu",
    "model_state_mib_measured", "model_state_mib_predicted", "comm_mib_per_step_measured",
    "comm_mib_per_step_predicted", "peak_mib_predicted", "peak_mib_measured_gpu", "final_loss", "skipped_steps", "wall_time_s", "reason",
]


def load_tables(results_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    runs_path, steps_path = results_dir / "metrics.parquet", results_dir / "steps.parquet"
    for path in (runs_path, steps_path):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run `scalelab collect {results_dir}` (or the workflow) first")
    return pd.read_parquet(runs_path), pd.read_parquet(steps_path)


def find_warnings(runs: pd.DataFrame, steps: pd.DataFrame) -> list[str]:
    warnings = []
    ok = runs[runs["status"] == "ok"]
    for r in runs[runs["status"] != "ok"].itertuples():
        warnings.append(f"{r.run_id}: status {r.status}: {r.reason}")
    for r in ok[ok["mfu"] > MFU_LIMIT].itertuples():
        warnings.append(f"{r.run_id}: MFU {r.mfu:.2f} is above 100% of the peak used ({r.peak_flops_source}); "
                        "the peak is too low for this path (e.g. emulated fp16 on a CPU)")
    for r in runs[runs["steps_problem"].notna()].itertuples():
        warnings.append(f"{r.run_id}: {r.steps_problem}: its steps are in no figure or table")
    for r in ok[ok["teardown_warning"].notna()].itertuples():
        warnings.append(f"{r.run_id}: {r.teardown_warning}; its measurements are complete and kept")
    for r in ok[ok["mfu"].isna()].itertuples():
        warnings.append(f"{r.run_id}: MFU unknown: {r.peak_flops_source}")
    devices = ok.groupby(ok["device_type"].fillna("?") + ": " + ok["device_name"].fillna("?"))["run_id"].agg(list)
    if len(devices) > 1:  # e.g. device: auto on a mixed cluster, or results copied together
        warnings.append("this sweep mixes devices, so its runs do not compare: " + "; ".join(
            f"{device} ({len(ids)} run(s), e.g. {ids[0]})" for device, ids in devices.items()))
    for r in ok.itertuples():
        if r.model_state_bytes_predicted and abs(r.model_state_bytes_measured / r.model_state_bytes_predicted - 1) > MEMORY_TOLERANCE:
            warnings.append(f"{r.run_id}: measured model state {r.model_state_bytes_measured / 2**20:.3f} MiB is more than "
                            f"{MEMORY_TOLERANCE:.0%} off the prediction {r.model_state_bytes_predicted / 2**20:.3f} MiB")
        pred, meas = r.comm_bytes_per_step_predicted, r.comm_bytes_per_step_measured
        # A prediction of 0 (FSDP2 at world size 1) tolerates the loss scaler's few-byte inf check.
        if pd.notna(pred) and abs(meas - pred) > max(COMM_TOLERANCE * pred, 64):
            warnings.append(f"{r.run_id}: measured communication {r.comm_bytes_per_step_measured:.0f} B/step is more than "
                            f"{COMM_TOLERANCE:.0%} off the prediction {r.comm_bytes_per_step_predicted:.0f} B/step")
    fp32 = steps[(steps["precision"] == "fp32") & steps["run_id"].isin(ok["run_id"])]
    if not fp32.empty:
        # Every fp32 run of one configuration should follow the same loss trajectory.
        ref = fp32.groupby("step")["loss"].agg(["min", "max"])
        spread = ((ref["max"] - ref["min"]) / ref["min"].abs()).max()
        if spread > FP32_PARITY_RTOL:
            warnings.append(f"fp32 parity broken: losses of fp32 runs differ by up to {spread:.2e} (relative) at one step; "
                            f"expected < {FP32_PARITY_RTOL:g} across stages and world sizes")
    return warnings


def _provenance(runs: pd.DataFrame) -> pd.DataFrame:
    cols = ["requested_device", "device_type", "device_name", "backend", "torch_version", "cuda_version", "nccl_version",
            "python_version", "hostname", "git_commit", "git_dirty", "git_commit_source", "config_hash"]
    present = [c for c in cols if c in runs]
    prov = runs[present].astype("string").fillna("-").value_counts().reset_index(name="runs")
    return prov


def _fmt_table(runs: pd.DataFrame) -> pd.DataFrame:
    t = runs.copy()
    t["scaling_efficiency"] = scaling_efficiency(t)
    t["model_state_mib_measured"] = t["model_state_bytes_measured"] / 2 ** 20
    t["model_state_mib_predicted"] = t["model_state_bytes_predicted"] / 2 ** 20
    t["comm_mib_per_step_measured"] = t["comm_bytes_per_step_measured"] / 2 ** 20
    t["comm_mib_per_step_predicted"] = t["comm_bytes_per_step_predicted"] / 2 ** 20
    t["peak_mib_predicted"] = t["predicted_peak_bytes"] / 2 ** 20
    t["peak_mib_measured_gpu"] = t["peak_mem_allocated_bytes"] / 2 ** 20
    t = t[TABLE_COLUMNS].sort_values(["precision", "zero_stage", "world_size", "activation_checkpointing", "cpu_offload"])
    return t


def _markdown(table: pd.DataFrame) -> str:
    cols = ["run_id", "status", "tokens_per_s", "mfu", "model_state_mib_measured", "model_state_mib_predicted", "final_loss"]

    def cell(v):
        if isinstance(v, float):
            return "" if pd.isna(v) else f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table[cols].itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _figure(fig_dir: Path, drawn: Drawn) -> str:
    """The PNG embedded, the registry's caption, then the figure's own note if it has one."""
    png = drawn.files[0]
    data = base64.b64encode((fig_dir / png).read_bytes()).decode()
    note = f" <em>{html.escape(drawn.note)}</em>" if drawn.note else ""
    return (f"<figure id='{drawn.figure.name}'><img alt='{html.escape(f'{FIGURES_DIR}/{png}')}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{html.escape(drawn.figure.caption)}{note}</figcaption></figure>")


def build_report(results_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write <out_dir>/report.html, summary.md and the figures (in <out_dir>/figures/); return
    the HTML path. Built in a sibling folder and moved into place, so a failed build never
    leaves a partial report (an earlier complete one stays)."""
    results_dir = Path(results_dir)
    out_dir = Path(out_dir) if out_dir else results_dir / "report"
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        _build(results_dir, building)
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
    message = (f"No runs in {results_dir}: metrics.parquet has no rows. Run the workflow "
               "(snakemake --cores all) or point scalelab report at a folder whose runs/ holds results.")
    (out_dir / FIGURES_DIR).mkdir(parents=True, exist_ok=True)
    (out_dir / "report.html").write_text(
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>scalelab report</title>"
        f"<style>{CSS}</style></head><body><h1>scalelab report</h1><div class='warn'><p>{html.escape(message)}</p>"
        "</div></body></html>", encoding="utf-8")
    (out_dir / "summary.md").write_text(f"# scalelab summary\n\n{message}\n")


def _build(results_dir: Path, out_dir: Path) -> None:
    runs, steps = load_tables(results_dir)
    if runs.empty:
        return _no_runs_report(results_dir, out_dir)
    # The main figures compare precision x stage x world size with every lever at its default.
    base = baseline(runs)
    levers, fp8 = lever_table(runs), fp8_table(runs)
    fig_dir = out_dir / FIGURES_DIR
    drawn = draw_figures(runs, steps, levers, fig_dir)
    figures = [d for d in drawn if d.figure.kind == "main"]
    lever_figures = [d for d in drawn if d.figure.kind == "lever"]
    warnings = find_warnings(runs, steps)
    table = _fmt_table(runs)

    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>scalelab report</title>"
             f"<style>{CSS}</style></head><body>",
             "<h1>scalelab report</h1>",
             f"<p>{len(runs)} runs ({(runs['status'] == 'ok').sum()} ok), {len(steps)} steps; built "
             f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} by scalelab {__version__} from "
             f"<code>{html.escape(str(results_dir))}</code> (metrics schema v{schema_version(results_dir / 'metrics.parquet')}).</p>"]
    parts.append("<h2>Warnings</h2>")
    if warnings:
        parts.append("<div class='warn'><ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in warnings) + "</ul></div>")
    else:
        parts.append("<p class='ok'>None: every run ok, MFU ≤ 100%, memory and communication within 10% of the formulas, fp32 parity holds.</p>")
    parts.append("<h2>Figures</h2>")
    if len(base) < len(runs):
        parts.append(f"<p>These figures show the {len(base)} runs with every lever at its default; "
                     "the other runs are in <a href='#levers'>Levers</a>.</p>")
    parts += [_figure(fig_dir, d) for d in figures]
    if lever_figures or not levers.empty or not fp8.empty:
        parts.append("<h2 id='levers'>Levers</h2>")
        parts += [_figure(fig_dir, d) for d in lever_figures]
        if not levers.empty:
            parts.append("<h3>Each lever against its baseline twin (same precision, stage, world size)</h3>")
            parts.append(levers.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="", border=0))
        if not fp8.empty:
            parts.append("<h3>fp8 against bf16</h3>")
            parts.append(fp8.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="", border=0))
    dev = loss_deviation_vs_stage0(steps[steps["run_id"].isin(base.loc[base["status"] == "ok", "run_id"])])
    parts.append("<h2>Runs</h2>")
    parts.append(table.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="", classes="runs", border=0))
    if not dev.empty:
        parts.append("<h3>Largest |Δloss| against stage 0</h3>")
        parts.append(dev.to_html(index=False, float_format=lambda v: f"{v:.3g}", border=0))
    parts.append("<h2>Formulas</h2>" + FORMULAS)
    parts.append("<h2>Provenance</h2>")
    parts.append(_provenance(runs).to_html(index=False, border=0))
    parts.append("</body></html>")

    (out_dir / "report.html").write_text("\n".join(parts), encoding="utf-8")
    (out_dir / "summary.md").write_text("# scalelab summary\n\n" + _markdown(table) +
                                        ("\n## Warnings\n\n" + "\n".join(f"- {w}" for w in warnings) + "\n" if warnings else ""))
