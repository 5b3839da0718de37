"""The pipeline figures: the bubble against micro-batches beside its formula, and one traced step's timeline per
stage, read from a pipeline run's folder (TIMELINE_FILE); a line in its place where no run folder holds one."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from scalelab.formulas.pipeline import TIMELINE_FILE  # noqa: E402  (a pipeline run's traced step, in its folder)
from scalelab.report.plot_style import (  # noqa: E402
    PALETTE,
    STAGE_MARKERS,
    dodge,
    empty_figure,
    marks,
    not_ok_note,
)
from scalelab.report.tables import (  # noqa: E402
    pipeline_bubbles,
    pipeline_rows,
    timeline_candidates,
)

PIPELINE_LINESTYLES = ["-", "--", ":", "-."]
KIND_COLORS = {"F": PALETTE[0], "B": PALETTE[1]}
KIND_NAMES = {"F": "forward (F)", "B": "backward (B)"}


def pipeline_bubble(runs: pd.DataFrame):
    """The measured bubble of each ok pipeline run against its micro-batches per step (a colour per schedule, a marker
    per degree P), with the formula's curve per P and chunks per rank V from P micro-batches up; (figure, note): the
    measured bubble's ratio to the formula, and on a CPU what the formula leaves out."""
    from scalelab.formulas.pipeline import SCHEDULES, bubble_fraction

    table = pipeline_bubbles(runs)
    if table.empty:
        return empty_figure("no ok pipeline run measured its bubble")
    schedules = sorted(table["schedule"].unique(), key=lambda s: (list(SCHEDULES).index(s) if s in SCHEDULES else len(SCHEDULES), s))
    degrees = sorted(table["pp"].unique())
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    series = list(table.groupby(["schedule", "pp"], sort=False))
    for i, ((schedule, pp), g) in enumerate(series):  # side by side around their m, so that equal values stay visible
        marks(ax, g["m"] * dodge(len(series), i), g["measured"], size=30, color=PALETTE[schedules.index(schedule) % len(PALETTE)],
              marker=STAGE_MARKERS[degrees.index(pp) % len(STAGE_MARKERS)], edgecolor="white", edgewidth=0.4, zorder=3,
              label=f"measured: {schedule}, P {pp}")
    timed = table[table["stage_times"].notna()]
    if len(timed):  # what the stages' own compute leaves idle with free sends: the imbalance, without the sends
        ax.scatter(timed["m"], timed["stage_times"], s=30, facecolors="none", edgecolors="black", linewidths=0.8, zorder=3,
                   label="from the stages' own times (free sends)")
    top = max(int(table["m"].max()), 2 * int(max(degrees)))
    curves = []
    for (pp, v), g in table.groupby(["pp", "chunks_per_rank"]):
        m = np.arange(int(pp), top + 1)  # from the fewest micro-batches that fill the pipeline
        y = np.array([bubble_fraction(int(pp), int(k), g["schedule"].iloc[0]) for k in m])
        named = ", ".join(s for s in schedules if s in set(g["schedule"]))
        ax.plot(m, y, color="black" if v == 1 else "grey", lw=1.0, ls=PIPELINE_LINESTYLES[degrees.index(pp) % len(PIPELINE_LINESTYLES)],
                zorder=2, label=f"formula: P {pp}, V {v} ({named})")
        curves += list(y)
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(k) for k in table["m"]) | {top})
    ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(int(min(degrees)), int(table["m"].min())) / 2 ** 0.5, top * 2 ** 0.5)
    ax.set_ylim(0, min(1.0, max(float(table["measured"].max()), max(curves)) * 1.15))
    ax.set(xlabel="micro-batches per step m (log2)", ylabel="bubble (share of the step idle)",
           title="pipeline bubble: measured (points) and (P − 1)/(V m + P − 1) (lines)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    not_ok_note(fig, runs[pipeline_rows(runs)])
    return fig, _bubble_note(table)


def _bubble_note(table: pd.DataFrame) -> str:
    """The measured bubble against the formula's, as the runs say it (median and range of the ratio), and on a CPU
    what the measurement holds that the formula leaves out."""
    ratio = (table["measured"] / table["formula"]).replace([np.inf, -np.inf], np.nan).dropna()
    n = len(table)
    note = (f"Measured over the formula: {ratio.median():.2f}× (median of {len(ratio)} run{'s' if len(ratio) != 1 else ''}"
            + (f", {ratio.min():.2f}× to {ratio.max():.2f}×)." if len(ratio) > 1 else ").")) if len(ratio) else ""
    timed = table[table["stage_times"].notna()]
    if len(timed):
        gap = timed["measured"] - timed["formula"]
        share = ((timed["stage_times"] - timed["formula"]) / gap).where(gap > 0).dropna()
        note += (f" The stages' own times (hollow points: their compute, sends free) leave {timed['stage_times'].median():.0%} "
                 f"idle at the median against the formula's {timed['formula'].median():.0%}"
                 + (f": their unequal work explains {share.median():.0%} of the gap at the median, the sends and the "
                    "schedule's own work the rest." if len(share) else "."))
    cpu = table[table["device_type"] == "cpu"]
    if len(cpu):
        share = "These runs" if len(cpu) == n else f"{len(cpu)} of these {n} runs"
        note += (f" {share} trained on a CPU: their measured bubble also holds the waits for gloo's point-to-point "
                 "sends, the stages' unequal work (the last stage also computes the head and the loss) and ranks sharing "
                 "the machine's cores, which the formula leaves out; it is not a test of the formula there.")
    return note.strip()


def read_timeline(path: Path) -> dict | None:
    """A run's traced step (TIMELINE_FILE): {"schedule", "microbatches", "stages": [{"pp_rank", "intervals": [{"kind",
    "chunk", "microbatch", "start_s", "end_s"}]}]}; None where the file is missing or does not read as one."""
    import json

    try:
        record = json.loads(Path(path).read_text())
        stages = record["stages"]
        for stage in stages:
            int(stage["pp_rank"])
            for i in stage["intervals"]:
                int(i["chunk"]), int(i["microbatch"])
                if i["kind"] not in KIND_COLORS or not float(i["end_s"]) >= float(i["start_s"]):
                    raise ValueError(f"interval {i}")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if stages else None


def pipeline_timeline(runs: pd.DataFrame, results_dir: Path | None):
    """One traced step of one pipeline run (timeline_candidates' first whose folder holds TIMELINE_FILE): a row per
    stage, its forwards and backwards as bars numbered by micro-batch, idle time as gaps; (figure, note)."""
    candidates = timeline_candidates(runs)
    if candidates.empty:
        return empty_figure("no ok pipeline run")
    if results_dir is None:
        return empty_figure("no results folder given: the run folders holding the pipeline timelines were not read"), None
    skipped = []
    for row in candidates.itertuples():
        record = read_timeline(Path(results_dir) / "runs" / row.folder / TIMELINE_FILE)
        if record is not None:
            break
        skipped.append(row.run_id)
    else:
        return (empty_figure(f"no pipeline timeline to draw: no run folder holds a readable {TIMELINE_FILE} (results copied "
                       "without their run folders, or runs from before the timeline was written)"),
                f"Looked in runs/<run>/{TIMELINE_FILE} of {len(candidates)} ok pipeline run(s).")
    fig = _timeline_figure(row, record)
    note = f"The traced step of {row.run_id} (runs/{row.folder}/{TIMELINE_FILE})."
    if skipped:
        note += f" Before it, no readable timeline in the folder of {', '.join(map(str, skipped[:6]))}" + (
            f" (+{len(skipped) - 6})" if len(skipped) > 6 else "") + "."
    return fig, note


def _timeline_figure(row, record: dict):
    """The bars of one traced step: a row per stage (stage 0 on top), a container per kind and chunk of the rank."""
    stages = sorted(record["stages"], key=lambda s: int(s["pp_rank"]))
    pp = len(stages)
    intervals = [(k, i) for k, s in enumerate(stages) for i in s["intervals"]]
    t0 = min((float(i["start_s"]) for _, i in intervals), default=0.0)
    end = max((float(i["end_s"]) for _, i in intervals), default=0.0)
    per_rank = max((int(i["chunk"]) // pp for _, i in intervals), default=0) + 1  # V: the chunks each rank runs
    fig, ax = plt.subplots(figsize=(9.5, 0.9 + 0.5 * pp))
    ax.barh(range(pp), [(end - t0) * 1e3] * pp, left=0, height=0.8, color="#f1f1f1", lw=0, zorder=1, label="idle (no forward or backward)")
    busiest = max((len(s["intervals"]) for s in stages), default=1)
    size = 6.5 if busiest <= 24 else 5.5 if busiest <= 48 else 4.5
    for kind in ("F", "B"):
        for k in range(per_rank):
            mine = [(row_, i) for row_, i in intervals if i["kind"] == kind and int(i["chunk"]) // pp == k]
            if not mine:
                continue
            label = KIND_NAMES[kind] + (f", the rank's chunk {k + 1} of {per_rank}" if per_rank > 1 else "")
            bars = ax.barh([r for r, _ in mine], [(float(i["end_s"]) - float(i["start_s"])) * 1e3 for _, i in mine],
                           left=[(float(i["start_s"]) - t0) * 1e3 for _, i in mine], height=0.6, color=KIND_COLORS[kind],
                           alpha=1.0 if k == 0 else 0.6, hatch=None if k == 0 else "///", edgecolor="white", lw=0.4,
                           zorder=2, label=label)
            for bar, (_, i) in zip(bars, mine):
                ax.text(bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height() / 2, str(i["microbatch"]),
                        ha="center", va="center", fontsize=size, color="white", zorder=3, clip_on=True)
    measured = getattr(row, "bubble_fraction_measured_per_stage", None)
    measured = list(measured) if measured is not None and not isinstance(measured, float) else []
    labels = [f"stage {int(s['pp_rank'])}" + (f"\nbubble {measured[k]:.2f}" if k < len(measured) and measured[k] is not None
                                               and pd.notna(measured[k]) else "") for k, s in enumerate(stages)]
    ax.set_yticks(range(pp), labels)
    ax.set_ylim(pp - 0.5, -0.5)  # stage 0 on top
    ax.set_xlim(0, (end - t0) * 1e3 * 1.01 or 1)
    ax.grid(axis="y", visible=False)
    ax.set(xlabel="time in the step (ms, from the earliest stage's start of it)",
           title=f"{row.run_id}: {record.get('schedule', '?')}, P {pp}, {record.get('microbatches', '?')} micro-batches "
                 "(numbered on the bars), one traced step")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
