"""The figures of the report, declared once: name, drawing function, caption, file formats,
and whether each is a main figure or a lever figure (drawn only when its lever varies).

Everything else loops over FIGURES: `draw_figures` (called by build_report) writes them into
<report>/figures/, rules/report.smk declares that folder and hands Snakemake's report the
captions, and the tests derive the expected files from it. Captions are written here and
nowhere else; a figure may add a short note of its own (e.g. that no GPU run was found),
shown after the caption. Figures draw from the result tables; the pipeline timeline alone reads a
file of one run folder (<results>/runs/<run>/pipeline_timeline.json), and says so where there is none.

This module is imported when the Snakefile is parsed (by every job), so it imports the
drawing modules (matplotlib) only when a figure is drawn.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

if TYPE_CHECKING:  # pandas only when a figure is drawn: every Snakemake start parses this module (~0.3 s)
    import pandas as pd

FIGURES_DIR = "figures"  # inside the report folder: results/report/figures/
FORMATS = ("png", "svg")


@dataclass(frozen=True)
class Tables:
    """What a figure is drawn from: the runs and steps (baseline rows only, for a main figure),
    lever_table(runs), and the results folder where the report is built from one (the pipeline
    timeline reads one run folder's file there; None: no run folder is read)."""
    runs: pd.DataFrame
    steps: pd.DataFrame
    levers: pd.DataFrame
    results_dir: Path | None = None


@dataclass(frozen=True)
class Figure:
    name: str
    draw: Callable[[Tables], Any]  # a matplotlib figure, or (figure, note)
    caption: str
    formats: tuple[str, ...] = ("png",)  # the first is the one embedded in the HTML report
    kind: Literal["main", "lever"] = "main"
    varies: str | None = None  # a lever figure is drawn when this column of the runs takes more than one value
    needs: Callable[[pd.DataFrame], bool] | None = None  # drawn only where the runs have something to show

    def __post_init__(self):
        if not self.formats or self.formats[0] != "png" or not set(self.formats) <= set(FORMATS):
            raise ValueError(f"{self.name}: formats {self.formats} must start with png and be among {FORMATS}")
        if (self.kind == "lever") != (self.varies is not None):
            raise ValueError(f"{self.name}: a lever figure, and only a lever figure, names the column it varies")

    @property
    def files(self) -> list[str]:
        return [f"{self.name}.{fmt}" for fmt in self.formats]

    def applies(self, runs: pd.DataFrame) -> bool:
        return (self.varies is None or runs[self.varies].nunique() > 1) and (self.needs is None or self.needs(runs))


def _pipeline_ok(runs: pd.DataFrame) -> bool:
    """Whether a pipeline run (pipeline_parallel above 1) ended ok."""
    from scalelab.report.tables import pipeline_rows

    return bool((pipeline_rows(runs) & (runs["status"] == "ok")).any())


def _stages_only(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of the ZeRO stages alone (the Ψ figure draws their lines; hybrid sharding has its own lever figure)."""
    import pandas as pd

    return runs[pd.to_numeric(runs["replicas"], errors="coerce").fillna(1) <= 1] if "replicas" in runs else runs


def _plots():
    from scalelab.report import plots
    return plots


def _pipeline_plots():
    from scalelab.report import pipeline_plots
    return pipeline_plots


def _psi():
    from scalelab.report import psi
    return psi


def _levers():
    from scalelab.report import levers
    return levers


def _prediction():
    from scalelab.report import prediction_plot
    return prediction_plot


FIGURES: tuple[Figure, ...] = (
    Figure(
        "memory_model_state", lambda t: _plots().model_state_memory(t.runs), formats=("png", "svg"),
        caption="Model-state memory per rank (largest rank) vs world size (log2), one panel per ZeRO stage (and per hybrid "
                "sharding, beside its ZeRO-3 twin): measured points "
                "per precision (side by side around their world size, so that equal values stay visible) over the "
                "predicted lines, each named in the legend (PyTorch AMP with fp32 master weights, solid; the ZeRO paper's "
                "convention, dashed, per precision where it differs). Where many runs share a point (replicas), it is "
                "their median, with a bar for their range, as the note says."),
    Figure(
        "memory_peak", lambda t: _plots().peak_device_memory(t.runs),
        caption="Peak memory per rank vs world size (log2), one panel per ZeRO stage (and hybrid sharding), precisions side by side. GPU runs: "
                "max allocated device memory, measured points over the predicted in-step peak (model state + in-step "
                "parameters + activations, dashed). Results without GPU runs show the process peak RSS per rank instead "
                "(CPU; includes the framework, not device memory), on an axis from 0. Where many runs share a point "
                "(replicas), it is their median, with a bar for their range, as the note says."),
    Figure(
        "memory_vs_psi", lambda t: _psi().memory_vs_psi(_stages_only(t.runs)),
        caption="Model state per rank vs parameter count Ψ (one point per model shape, stage and precision; full "
                "training), one panel per world size N (four to a row), over the ZeRO lines: PyTorch's 16Ψ, 8Ψ+8Ψ/N, 16Ψ/N (solid) and the "
                "paper's 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N (dashed). With a device budget (planning.device_memory_gib "
                "or the GPU's memory): the budget (black) and the Ψ where each stage's model state stops fitting "
                "(dotted: predicted; crosses: measured bytes per parameter on GPU, extrapolated)."),
    Figure(
        "throughput", lambda t: _plots().throughput(t.runs),
        caption="Throughput vs world size (log2), one row per precision, a line per ZeRO stage (and hybrid sharding): tokens/s of all ranks, "
                "tokens/s per device, and scaling efficiency (tokens/s at N over N x tokens/s at 1; 1 is linear). A point "
                "that ran more than once (repeats:) is the median of its runs, with a bar from the lowest to the highest: "
                "the run-to-run spread; world size 1's median is what efficiency divides by."),
    Figure(
        "mfu_heatmap", lambda t: _plots().mfu_heatmap(t.runs),
        caption="MFU (fraction of the dense peak recorded in each row; the median of a point's repeats, ± half their "
                "range) per precision and ZeRO stage or hybrid sharding (rows: z3, hsdp2 for 2 replicas) and world size "
                "(columns). Cells of runs that did not finish "
                "ok show their status; an MFU above 1 (a peak too low for the path, e.g. emulated fp16 on a CPU) is "
                "hatched, marked ‡ and left out of the colour scale."),
    Figure(
        "loss_curves", lambda t: _plots().loss_curves(t.runs, t.steps),
        caption="Left: fp32 loss per step (mean over stages and world sizes, with range), the reference. Middle: per "
                "precision, the largest |loss - loss of the fp32 twin| per step (the fp32 run with the same stage, world "
                "size and levers), log scale. Right: per precision and stage, the largest |loss - loss of stage 0| over "
                "steps and world sizes, log scale."),
    Figure(
        "loss_scale", lambda t: _plots().loss_scale(t.runs, t.steps),
        # without an fp16 run that trained, there is no loss scale: no placeholder, no caption
        needs=lambda runs: bool(((runs["precision"] == "fp16") & (runs["status"] == "ok")).any()),
        caption="fp16 dynamic loss scale over steps (median over fp16 runs, with range) and skipped steps (count per "
                "step over runs)."),
    Figure(
        "communication", lambda t: _plots().communication(t.runs), formats=("png", "svg"),
        caption="Bytes handed to collectives per optimizer step (ZeRO paper's unit), a bar per precision: measured "
                "(bars) vs predicted (black ticks: PyTorch strategy; grey: the paper's elements at fp32's 4 bytes), per "
                "stage and world size. fp16 and bf16 gather parameters in 16 bits at stages 2 and 3 (FSDP2's "
                "MixedPrecisionPolicy; gradients reduced in fp32 unless grad_reduce is compute), so their bars sit "
                "below fp32's there; at stages 0 and 1 they move fp32's bytes (fp16: + its loss scaler's 8-byte flag)."),
    Figure(
        "predicted_vs_measured", lambda t: _prediction().predicted_vs_measured_plot(t.runs),
        caption="Step time predicted by the step-time model (scalelab.results.prediction) against measured (mean over the "
                "measured steps), per run, log-log; the dashed line is perfect prediction, a bar the prediction's band "
                "(99%). Colour: precision; marker: ZeRO stage; hollow: in-sample (the run is its own compute reference, "
                "the sweep's smallest world size), filled: predicted from another world size or micro-batch with the "
                "communication timed on links fitted to the sweep's bench comm table (calibration/comm.parquet in "
                "the results folder). "
                "On a CPU, ranks sharing a machine's cores measure contention, which the model does not predict."),
    Figure(
        "lever_activation_checkpointing", kind="lever", varies="activation_checkpointing",
        draw=lambda t: _levers().activation_checkpointing_plot(_levers().lever_pairs(t.levers, "activation_checkpointing")),
        caption="Activation checkpointing. Left: activations kept for backward by one micro-batch, off vs on "
                "(measured: bytes saved by autograd on rank 0; black: Korthikanti et al.'s terms for this model, "
                "grey: as published, with attention scores and dropout masks). Right: step time with / without "
                "checkpointing, measured vs the predicted recompute cost (one more forward of every block)."),
    # micro_batch alone differs between world sizes (it is the resolved per-rank size); a
    # micro-batch lever shows as more than one accumulation count.
    Figure(
        "lever_micro_batch", kind="lever", varies="accumulation_steps",
        draw=lambda t: _levers().micro_batch_plot(t.runs, t.steps),
        caption="Gradient accumulation at a fixed global batch. Left: fp32 loss per step for each micro-batch size "
                "(the trajectories should coincide). Middle: throughput. Right: activations kept per micro-batch "
                "(measured) and peak memory per rank (GPU: max allocated; CPU: process RSS)."),
    Figure(
        "lever_cpu_offload", kind="lever", varies="cpu_offload",
        draw=lambda t: _levers().offload_plot(_levers().lever_pairs(t.levers, "cpu_offload")),
        caption="CPU offload (stage 3): peak device memory per rank and median step time, with offload vs without "
                "(GPU runs; on CPU the points are skipped: there is no device memory to save)."),
    Figure(
        "lever_bucket_mb", kind="lever", varies="bucket_mb",
        draw=lambda t: _levers().bucket_plot(t.runs),
        caption="DDP gradient bucket size (stages 0 and 1). Left: all-reduce calls per step, measured (points) and "
                "predicted (line: gradients filled in reverse order into buckets of the cap). Right: median step time."),
    Figure(
        "lever_compile", kind="lever", varies="compile",
        draw=lambda t: _levers().compile_plot(_levers().lever_pairs(t.levers, "compile")),
        caption="torch.compile (every transformer block and the loss). Left: median step time, eager twin vs "
                "compiled run (compilation excluded). Right: compilation time, spent in a warm-up forward and backward "
                "before the first step."),
    Figure(
        "lever_tensor_parallel", kind="lever", varies="tensor_parallel",
        draw=lambda t: _levers().tensor_parallel_plot(_levers().lever_pairs(t.levers, "tensor_parallel")),
        caption="Tensor parallelism at a fixed world size, each split run beside its twin without it (the same stage "
                "over all ranks). Left: per rank, model state and one micro-batch's activations (stacked; measured "
                "bars, predicted ticks): a rank holds its share of the blocks' linears and of what they compute. "
                "Right: bytes per optimizer step on rank 0, the strategy's collectives (over the data-parallel ranks "
                "under tensor parallelism) and the tensor-parallel all-reduces stacked (four per block and "
                "micro-batch, five with checkpointing; not counted in compiled runs), measured bars, predicted ticks."),
    Figure(
        "lever_sequence_parallel", kind="lever", varies="sequence_parallel",
        draw=lambda t: _levers().sequence_parallel_plot(_levers().lever_pairs(t.levers, "sequence_parallel")),
        caption="Sequence parallelism, each run beside its twin with tensor parallelism alone (the same degree, "
                "stage and world size). Left: one micro-batch's activations per rank (measured bars; predicted "
                "ticks, grey: Korthikanti et al.'s eq. 4, where all of a layer's activations split): the norms and "
                "the residual stream keep each rank's share of the tokens, while the split linears keep their "
                "all-gathered inputs whole. Right: tensor parallelism's bytes per optimizer step: the all-reduces "
                "become all-gathers and reduce-scatters of the same volume, plus the head's input gathered, the "
                "embeddings' gradient gathered and the norms' partial gradients summed."),
    Figure(
        "lever_pipeline_bubble", kind="lever", varies="pipeline_parallel", needs=_pipeline_ok,
        draw=lambda t: _pipeline_plots().pipeline_bubble(t.runs),
        caption="Pipeline bubble against micro-batches per step m: the share of a step a stage computed nothing (one "
                "minus its forwards' and backwards' time over the schedule's; the mean over rank 0's pipeline's stages, "
                "the median over the measured steps), a point per ok pipeline run, coloured by schedule, shaped by its "
                "degree P; the lines are the formula (P − 1)/(V m + P − 1) (V = 2 chunks per rank for interleaved 1F1B, "
                "else 1; GPipe and 1F1B share it), which takes equal stages and sends that cost no time. The note "
                "gives the measured bubble over the formula's. On a CPU the measured bubble also holds the waits for "
                "gloo's point-to-point sends, the stages' unequal work (the last stage also computes the head and the "
                "loss) and ranks sharing the machine's cores, which the formula leaves out: it typically sits well "
                "above the lines there, and the points say how far, not whether the formula holds."),
    Figure(
        "lever_pipeline_timeline", kind="lever", varies="pipeline_parallel", needs=_pipeline_ok,
        draw=lambda t: _pipeline_plots().pipeline_timeline(t.runs, t.results_dir),
        caption="One traced step of one pipeline run (the ok pipeline run with the most micro-batches per step, then "
                "the first by run id, whose folder holds pipeline_timeline.json: the last timed step of rank 0's "
                "pipeline), a row per stage: each forward (F) and backward (B) of a micro-batch as a bar, numbered by "
                "micro-batch (from 0, as torch's schedules count), the grey between them idle time (the bubble, and "
                "the waits for sends). The rows share one clock: times count from the earliest stage's start of the "
                "step, on the machine's clock (across nodes, as well as their clocks agree). Beside each "
                "stage, its measured bubble (one minus its busy share, the median over the measured steps). Where no "
                "run folder holds the file (results copied without their run folders), a line says so instead."),
)
if len({f.name for f in FIGURES}) != len(FIGURES):
    raise ValueError("figure names must be unique")


def rst_captions() -> dict[str, str]:
    """Captions by figure name, escaped for reStructuredText (Snakemake's report renders them as
    RST: `|x|` would be a substitution, `*x*` emphasis)."""
    def escape(text: str) -> str:
        for char in "\\*`|_":
            text = text.replace(char, "\\" + char)
        return text
    return {f.name: escape(f.caption) for f in FIGURES}


@dataclass(frozen=True)
class Drawn:
    figure: Figure
    files: list[str]  # inside the figures folder
    note: str | None


# Set in the parent just before the drawing processes fork (they inherit it, nothing is pickled).
_JOB: tuple | None = None


def _draw_one(name: str) -> tuple[str, list[str], str | None]:
    from scalelab.report.plot_style import save

    main, every, out_dir = _JOB
    figure = next(f for f in FIGURES if f.name == name)
    out = figure.draw(main if figure.kind == "main" else every)
    fig, note = out if isinstance(out, tuple) else (out, None)
    return name, save(fig, out_dir, figure.name, figure.formats), note


def drawing_workers(requested: int | None = None) -> int:
    """How many processes draw the figures: SCALELAB_REPORT_WORKERS, else `requested`, else the
    cores this process may use (at most 4); 1 (in this process) where fork is not the safe
    default (anything but Linux)."""
    import os
    import sys

    env = os.environ.get("SCALELAB_REPORT_WORKERS")
    if env:
        requested = int(env)
    if requested is None:
        requested = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    return max(1, requested) if sys.platform.startswith("linux") else 1


class FigureJob:
    """Figures being drawn: by forked processes (the parent goes on with the tables meanwhile), or
    already drawn in this process. ``wait()`` returns them in registry order. Used as a context
    manager: leaving it reaps the drawing processes, or stops them where the figures were never
    waited for (the caller failed; the half-built folder goes away)."""

    def __init__(self, figures: list[Figure], results, pool=None):
        self._figures, self._results, self._pool = figures, results, pool
        self._waited = False

    def __enter__(self) -> FigureJob:
        return self

    def __exit__(self, *exc) -> None:
        global _JOB
        if self._pool is not None:
            if self._waited:
                self._pool.join()  # they exit once told to: by now, while the caller wrote the report
            else:
                self._pool.terminate()
                self._pool.join()
            _JOB = None

    def wait(self) -> list[Drawn]:
        results = self._results.get() if self._pool is not None else self._results
        if self._pool is not None:
            self._pool.close()  # no more figures: the drawing processes exit on their own
        self._waited = True
        by_name = {name: (files, note) for name, files, note in results}
        return [Drawn(f, *by_name[f.name]) for f in self._figures]


# Slowest first, so that two processes finish together.
_DRAW_ORDER = ("memory_vs_psi", "throughput", "memory_model_state", "loss_curves", "lever_activation_checkpointing", "lever_micro_batch")


def start_figures(runs: pd.DataFrame, steps: pd.DataFrame, levers: pd.DataFrame, out_dir: Path,
                  workers: int | None = None, results_dir: Path | None = None) -> FigureJob:
    """Start drawing every main figure from the baseline rows (every lever at its default) and
    every lever figure whose lever varies, into out_dir; results_dir: the results folder whose run
    folders a figure may read (the pipeline timeline). Files of registered figures not drawn this
    time (a lever an earlier build varied) are removed. With more than one worker the figures are
    drawn by forked processes (Agg only, no display) while the caller goes on."""
    global _JOB
    from scalelab.report.levers import baseline
    from scalelab.report.plot_style import use_theme

    out_dir.mkdir(parents=True, exist_ok=True)
    for figure in FIGURES:
        for file in figure.files:
            (out_dir / file).unlink(missing_ok=True)
    base = baseline(runs, strategies=True)
    main = Tables(base, steps[steps["run_id"].isin(base["run_id"])], levers, results_dir)
    every = Tables(runs, steps, levers, results_dir)
    use_theme()
    figures = [f for f in FIGURES if f.applies(runs)]
    names = sorted((f.name for f in figures), key=lambda n: _DRAW_ORDER.index(n) if n in _DRAW_ORDER else len(_DRAW_ORDER))
    workers = min(drawing_workers(workers), len(figures))
    _JOB = (main, every, out_dir)
    if workers <= 1:
        try:
            return FigureJob(figures, [_draw_one(name) for name in names])
        finally:
            _JOB = None
    import gc
    import multiprocessing

    # Drawing is CPU-bound Python: the children skip the cyclic collector (they draw a dozen figures
    # and exit, which frees their garbage), and the parent's objects are frozen out of collection
    # first, so that no collection in a child touches, and so copies, the pages they share.
    gc.freeze()
    try:
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=gc.disable)
    finally:
        gc.unfreeze()
    return FigureJob(figures, pool.map_async(_draw_one, names, chunksize=1), pool)


def draw_figures(runs: pd.DataFrame, steps: pd.DataFrame, levers: pd.DataFrame, out_dir: Path,
                 workers: int | None = None, results_dir: Path | None = None) -> list[Drawn]:
    """Draw the figures (start_figures) and wait for them; return them in registry order."""
    with start_figures(runs, steps, levers, out_dir, workers, results_dir) as job:
        return job.wait()
