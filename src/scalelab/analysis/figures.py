"""The figures of the report, declared once: name, drawing function, caption, file formats,
and whether each is a main figure or a lever figure (drawn only when its lever varies).

Everything else loops over FIGURES: `draw_figures` (called by build_report) writes them into
<report>/figures/, rules/report.smk declares that folder and hands Snakemake's report the
captions, and the tests derive the expected files from it. Captions are written here and
nowhere else; a figure may add a short note of its own (e.g. that no GPU run was found),
shown after the caption.

This module is imported when the Snakefile is parsed (by every job), so it imports the
drawing modules (matplotlib, seaborn) only when a figure is drawn.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import pandas as pd

FIGURES_DIR = "figures"  # inside the report folder: results/report/figures/
FORMATS = ("png", "svg")


@dataclass(frozen=True)
class Tables:
    """What a figure is drawn from: the runs and steps (baseline rows only, for a main figure)
    and lever_table(runs)."""
    runs: pd.DataFrame
    steps: pd.DataFrame
    levers: pd.DataFrame


@dataclass(frozen=True)
class Figure:
    name: str
    draw: Callable[[Tables], Any]  # a matplotlib figure, or (figure, note)
    caption: str
    formats: tuple[str, ...] = ("png",)  # the first is the one embedded in the HTML report
    kind: Literal["main", "lever"] = "main"
    varies: str | None = None  # a lever figure is drawn when this column of the runs takes more than one value

    def __post_init__(self):
        if not self.formats or self.formats[0] != "png" or not set(self.formats) <= set(FORMATS):
            raise ValueError(f"{self.name}: formats {self.formats} must start with png and be among {FORMATS}")
        if (self.kind == "lever") != (self.varies is not None):
            raise ValueError(f"{self.name}: a lever figure, and only a lever figure, names the column it varies")

    @property
    def files(self) -> list[str]:
        return [f"{self.name}.{fmt}" for fmt in self.formats]

    def applies(self, runs: pd.DataFrame) -> bool:
        return self.varies is None or runs[self.varies].nunique() > 1


def _plots():
    from scalelab.analysis import plots
    return plots


def _levers():
    from scalelab.analysis import levers
    return levers


FIGURES: tuple[Figure, ...] = (
    Figure(
        "memory_model_state", lambda t: _plots().model_state_memory(t.runs), formats=("png", "svg"),
        caption="Model-state memory per rank (largest rank) vs world size, per ZeRO stage: measured points over the "
                "predicted curves (PyTorch's fp32-master split, solid; the ZeRO paper's 2+2+12, dashed)."),
    Figure(
        "memory_peak", lambda t: _plots().peak_device_memory(t.runs),
        caption="Peak memory per rank vs world size, per ZeRO stage. GPU runs: max allocated device memory, measured "
                "points over the predicted in-step peak (model state + in-step parameters + activations, dashed). "
                "Results without GPU runs show the process peak RSS per rank instead (CPU; includes the framework, "
                "not device memory)."),
    Figure(
        "throughput", lambda t: _plots().throughput(t.runs),
        caption="Throughput (tokens/s, all ranks) and scaling efficiency (tokens/s at N over N x tokens/s at 1) vs "
                "world size, per stage."),
    Figure(
        "mfu_heatmap", lambda t: _plots().mfu_heatmap(t.runs),
        caption="MFU (fraction of the dense peak recorded in each row), precision x ZeRO stage, one panel per world "
                "size; cells of runs that did not finish ok show their status."),
    Figure(
        "loss_curves", lambda t: _plots().loss_curves(t.runs, t.steps),
        caption="Left: loss per step, mean over stages and world sizes, per precision (fp32 is the reference). "
                "Right: each stage's largest |loss - loss of stage 0| over steps, same precision and world size."),
    Figure(
        "loss_scale", lambda t: _plots().loss_scale(t.runs, t.steps),
        caption="fp16 dynamic loss scale over steps (median over fp16 runs, with range) and skipped steps (count per "
                "step over runs)."),
    Figure(
        "communication", lambda t: _plots().communication(t.runs), formats=("png", "svg"),
        caption="Bytes handed to collectives per optimizer step (ZeRO paper's unit): measured (bars) vs predicted "
                "(black ticks: PyTorch strategy; grey: the paper), per stage and world size."),
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


def draw_figures(runs: pd.DataFrame, steps: pd.DataFrame, levers: pd.DataFrame, out_dir: Path) -> list[Drawn]:
    """Draw every main figure from the baseline rows (every lever at its default) and every lever
    figure whose lever varies, into out_dir; return them in registry order. Files of registered
    figures not drawn this time (a lever an earlier build varied) are removed."""
    from scalelab.analysis.levers import baseline
    from scalelab.analysis.plots import save, use_theme

    out_dir.mkdir(parents=True, exist_ok=True)
    for figure in FIGURES:
        for file in figure.files:
            (out_dir / file).unlink(missing_ok=True)
    base = baseline(runs)
    main = Tables(base, steps[steps["run_id"].isin(base["run_id"])], levers)
    every = Tables(runs, steps, levers)
    use_theme()
    drawn = []
    for figure in FIGURES:
        if not figure.applies(runs):
            continue
        out = figure.draw(main if figure.kind == "main" else every)
        fig, note = out if isinstance(out, tuple) else (out, None)
        drawn.append(Drawn(figure, save(fig, out_dir, figure.name, figure.formats), note))
    return drawn
