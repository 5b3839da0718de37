"""Move a results tree written by an earlier layout into today's: ``scalelab migrate RESULTS``.

Until run folders were named by run id, a run's folder had one level per sweep axis
(``runs/precision~fp32/zero_stage~2/world_size~1/...``), 3, 7, 8, 9 or 10 levels deep as axes were
added. Each such folder is moved to ``runs/<run id>/`` with a ``point.json``: the axes its path names,
and the default of every axis added since. Its log moves from ``logs/runs/<old path>.log`` to
``logs/runs/<run id>.log``.

Safe by construction:
- ``--dry-run`` prints the plan and changes nothing;
- files are renamed, never copied or rewritten; nothing is deleted except folders left empty;
- a file already at the destination is never overwritten: the old folder keeps it, and it is reported;
- two old folders of one run (an old tree beside a newer one): the one whose summary is newest moves to
  ``runs/<run id>/``; the others move whole to ``superseded/runs/<old path>/``, outside what is read;
- interrupted, it is rerun: folders already moved are found no more, half-moved ones are finished;
- the collected tables written from the old folders (``metrics.parquet``, ``steps.parquet``, whose
  run_path names old folders) and ``report/report.html`` move to ``superseded/`` too, so that the
  workflow collects the moved runs again and rebuilds the report (no run is retrained).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.io import write_json
from scalelab.sweep import AXIS, POINT_FILE, RunPoint

SUPERSEDED = "superseded"
"""Under the results folder: what a migration moved out of the way (never read by scalelab)."""
TABLES = ("metrics.parquet", "steps.parquet", "report/report.html")
"""Derived from the run folders (the collected tables, the report built from them): moved aside so
that the workflow collects and reports again. Snakemake does not rebuild a missing table while the
report downstream of it is present."""
RUN_OUTPUT_LAST = "summary.json"
"""Moved last into a run folder: its presence says the run is complete."""


def _axis_part(name: str) -> tuple[str, str] | None:
    """('precision', 'fp32') for a folder named 'precision~fp32' (an axis level of an old run path,
    this scalelab's axis or not), else None."""
    axis, sep, value = name.partition("~")
    return (axis, value) if sep else None


def old_layout_runs(results_dir: str | Path) -> list[str]:
    """Run folders of an earlier layout under results_dir/runs, as paths relative to it
    (``precision~fp32/zero_stage~0/world_size~1``): folders of ``axis~value`` levels that hold a run's
    files (the deepest level, or a shallower one whose run a later layout nested deeper runs in)."""
    runs = Path(results_dir) / "runs"
    if not runs.is_dir():
        return []
    found = []
    for top in sorted(runs.iterdir()):
        if not top.is_dir() or not top.name.startswith("precision~"):  # every old layout began with it
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            axis_dirs = sorted(d for d in dirnames if _axis_part(d))
            # a run folder: the deepest level, or one holding a run's files beside deeper levels (a
            # shallower layout's run whose folder a later layout went on to nest in)
            if not axis_dirs or filenames or len(axis_dirs) < len(dirnames):
                found.append(Path(dirpath).relative_to(runs).as_posix())
            dirnames[:] = axis_dirs  # descend through axis levels only (a run's checkpoint/ is its own)
    return found


def old_layout_message(results_dir: str | Path, old: list[str]) -> str:
    return (f"{results_dir}/runs holds {len(old)} run folder(s) written by an older layout (one folder level per "
            f"sweep axis, e.g. {old[0]}): run `scalelab migrate {results_dir}` to move them to "
            f"{results_dir}/runs/<run id>/ (`--dry-run` shows what it will do); nothing was run or changed")


class OldLayout(ValueError):
    """A results folder holds run folders of an earlier layout: `scalelab migrate` moves them."""


def check_layout(results_dir: str | Path) -> None:
    """Raise OldLayout, saying what to run, if results_dir holds run folders of an earlier layout:
    read as today's, they would look like no runs at all."""
    old = old_layout_runs(results_dir)
    if old:
        raise OldLayout(old_layout_message(results_dir, old))


def point_of_old_path(old_path: str) -> RunPoint:
    """The point an old run folder holds: the axes its path names; axes added since at their default."""
    values = {}
    for part in old_path.split("/"):
        axis, text = _axis_part(part) or (None, None)
        if axis not in AXIS:
            raise ValueError(f"{part!r} is not 'axis~value' for an axis of this scalelab ({', '.join(AXIS)})")
        try:
            values[axis] = AXIS[axis].from_path(text)
        except ValueError as err:
            raise ValueError(f"{part!r}: {err}") from None
    return RunPoint.from_json(values)


@dataclass
class Move:
    old_path: str
    """Relative to <results>/runs."""
    run_id: str | None
    point: RunPoint | None = None
    to: str = ""
    """Destination relative to the results folder: runs/<run id> or superseded/runs/<old path>."""
    problem: str | None = None
    """Why the folder cannot be moved (an unreadable name): it stays where it is."""
    kept: list[str] = field(default_factory=list)
    """Files left in the old folder because the destination already has one of that name."""


def _newest_summary(run_dir: Path) -> float:
    summary = run_dir / RUN_OUTPUT_LAST
    return summary.stat().st_mtime if summary.exists() else -1.0


def plan(results_dir: str | Path) -> list[Move]:
    """What a migration of results_dir does, one Move per old run folder; changes nothing."""
    results_dir = Path(results_dir)
    runs = results_dir / "runs"
    moves = []
    for old in old_layout_runs(results_dir):
        try:
            point = point_of_old_path(old)
        except ValueError as err:
            moves.append(Move(old, None, problem=str(err)))
            continue
        moves.append(Move(old, point.run_id, point))
    by_run: dict[str, list[Move]] = {}
    for move in moves:
        if move.run_id is not None:
            by_run.setdefault(move.run_id, []).append(move)
    for run_id, group in by_run.items():
        # a run folder already in place (a half-finished migration, or a run since) counts as newest
        group.sort(key=lambda m: _newest_summary(runs / m.old_path), reverse=True)
        taken = (runs / run_id / RUN_OUTPUT_LAST).exists() and any((runs / m.old_path / RUN_OUTPUT_LAST).exists()
                                                                   for m in group)
        for i, move in enumerate(group):
            if i == 0 and not taken:
                move.to = f"runs/{run_id}"
            else:
                move.to = f"{SUPERSEDED}/runs/{move.old_path}"
    return moves


def _move_into(src_dir: Path, dest_dir: Path) -> list[str]:
    """Rename every entry of src_dir into dest_dir, summary.json last; an entry whose name is taken
    in dest_dir stays. Returns the names kept back."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    kept = []
    entries = sorted((p for p in src_dir.iterdir() if not _axis_part(p.name)), key=lambda p: p.name == RUN_OUTPUT_LAST)
    for entry in entries:
        target = dest_dir / entry.name
        if target.exists() or target.is_symlink():
            kept.append(entry.name)
            continue
        os.rename(entry, target)
    return kept


def _remove_empty_parents(path: Path, stop: Path) -> None:
    """rmdir path and its parents up to (not including) stop, while they are empty."""
    while path != stop and path.is_dir():
        try:
            path.rmdir()
        except OSError:  # not empty: something of another run, or a file kept back
            return
        path = path.parent


def _log_moves(results_dir: Path, moves: list[Move]) -> list[tuple[Path, Path]]:
    """(old log, new log) for every log of an old run folder, its folder moved or not yet (an
    interrupted migration moves the rest of the logs when rerun)."""
    logs = results_dir / "logs" / "runs"
    aside = {m.old_path for m in moves if m.to.startswith(SUPERSEDED)}
    found = []
    for log in sorted(logs.rglob("*.log")) if logs.is_dir() else []:
        old_path = log.relative_to(logs).as_posix()[:-len(".log")]
        if "/" not in old_path and not _axis_part(old_path):
            continue  # a run id's log: today's layout
        try:
            run_id = point_of_old_path(old_path).run_id
        except ValueError:
            continue  # not a log of a run folder this scalelab can name; left alone
        dest = results_dir / SUPERSEDED / "logs" / "runs" / f"{old_path}.log" if old_path in aside else logs / f"{run_id}.log"
        found.append((log, dest))
    return found


def _collected_from_old_layout(results_dir: Path) -> bool:
    """Whether results_dir's collected tables name run folders of an older layout (run_path
    'precision~fp32/...'): Snakemake would keep them, their inputs being older."""
    import pyarrow.parquet as pq

    path = results_dir / TABLES[0]
    if not path.exists():
        return False
    try:
        run_paths = pq.read_table(path, columns=["run_path"]).column("run_path").to_pylist()
    except Exception:  # no run_path column or unreadable: not ours to judge, left alone
        return False
    return any(p and "~" in p for p in run_paths)


def _free(path: Path) -> Path:
    """path, or path.1, path.2, ... : the first name not taken (a migration never overwrites)."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def migrate(results_dir: str | Path, dry_run: bool = False) -> dict:
    """Carry out (or, dry_run, only plan) the migration of results_dir. Returns {'moves', 'tables', 'logs'}."""
    results_dir = Path(results_dir)
    runs = results_dir / "runs"
    moves = plan(results_dir)
    log_moves = _log_moves(results_dir, moves)
    for move in moves:
        if move.problem:
            continue
        dest = results_dir / move.to
        if dry_run:
            move.kept = sorted(p.name for p in (runs / move.old_path).iterdir()
                               if not _axis_part(p.name) and (dest / p.name).exists())
            continue
        if move.to.startswith("runs/") and not (dest / POINT_FILE).exists():
            dest.mkdir(parents=True, exist_ok=True)
            write_json(dest / POINT_FILE, move.point.to_json())  # first: the folder says what it holds
        move.kept = _move_into(runs / move.old_path, dest)
        _remove_empty_parents(runs / move.old_path, runs)
    # collected from old folders; or the tables moved and the report not yet (an interrupted migration)
    stale = _collected_from_old_layout(results_dir) or (
        not (results_dir / TABLES[0]).exists() and (results_dir / SUPERSEDED / TABLES[0]).exists())
    table_moves = [(results_dir / name, _free(results_dir / SUPERSEDED / name)) for name in TABLES
                   if stale and (results_dir / name).exists()]
    if not dry_run:
        for src, dest in [*log_moves, *table_moves]:
            if dest.exists():
                continue  # never overwrite (a log already at the run id's name): left where it is
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(src, dest)
            if src.suffix == ".log":
                _remove_empty_parents(src.parent, results_dir / "logs")
    return {"moves": moves, "logs": log_moves, "tables": table_moves}


def format_result(results_dir: str | Path, result: dict, dry_run: bool) -> str:
    moves = result["moves"]
    if not moves and not result["logs"]:
        return f"{results_dir}: no run folder of an older layout; nothing to do"
    verb = "would move" if dry_run else "moved"
    lines = []
    for m in moves:
        if m.problem:
            lines.append(f"  left  runs/{m.old_path}: {m.problem}")
            continue
        lines.append(f"  {verb} runs/{m.old_path} -> {m.to}"
                     + ("  (older copy of a run kept aside)" if m.to.startswith(SUPERSEDED) else ""))
        if m.kept:
            lines.append(f"    kept in the old folder, the destination already has: {', '.join(m.kept)}")
    for src, dest in result["logs"]:
        lines.append(f"  {verb} {src.relative_to(results_dir)} -> {dest.relative_to(results_dir)}")
    for src, dest in result["tables"]:
        lines.append(f"  {verb} {src.relative_to(results_dir)} -> {dest.relative_to(results_dir)}"
                     "  (rebuilt by the workflow, or `scalelab report RESULTS --collect`)")
    n_run = sum(1 for m in moves if m.to.startswith("runs/"))
    n_aside = sum(1 for m in moves if m.to.startswith(SUPERSEDED))
    n_bad = sum(1 for m in moves if m.problem)
    head = f"{results_dir}: {len(moves)} run folder(s) of an older layout: {n_run} to runs/<run id>/"
    head += f", {n_aside} older duplicate(s) to {SUPERSEDED}/" if n_aside else ""
    head += f", {n_bad} left in place (names not understood)" if n_bad else ""
    tail = ["", "dry run: nothing changed; run again without --dry-run to move them" if dry_run else
            "done; rerunning this command finishes an interrupted migration and is harmless otherwise"]
    return "\n".join([head, *lines, *tail])


def add_parser(sub) -> None:
    m = sub.add_parser("migrate", help="move run folders written by an older results layout to RESULTS/runs/<run id>/",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("results_dir", nargs="?", default="results", help="a results folder (default: results)")
    m.add_argument("--dry-run", action="store_true", help="print what would be moved; change nothing")
    m.set_defaults(func=_main)


def _main(args) -> int:
    results = Path(args.results_dir)
    if not results.is_dir():
        print(f"error: results folder {results} does not exist", file=sys.stderr)
        return 2
    result = migrate(results, dry_run=args.dry_run)
    print(format_result(results, result, args.dry_run))
    return 1 if any(m.problem or m.kept for m in result["moves"]) else 0

