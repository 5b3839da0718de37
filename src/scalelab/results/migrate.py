"""Move a results tree written by an earlier layout into today's: ``scalelab migrate RESULTS``.

Until run folders were named by run id, a run's folder had one level per sweep axis
(``runs/precision~fp32/zero_stage~2/world_size~1/...``), 3, 7, 8, 9 or 10 levels deep as axes were
added. Each such folder is moved to ``runs/<run id>/`` with a ``point.json``: the axes its path names,
and the default of every axis added since. Its log moves from ``logs/runs/<old path>.log`` to
``logs/runs/<run id>.log``, right after the folder.

Safe by construction:
- ``--dry-run`` prints the plan and changes nothing; a real migration takes the results folder's lock;
- files are renamed, never copied or rewritten; nothing is deleted except old-layout folders left empty;
- a file already at its destination is never overwritten: the old folder keeps it, and it is named;
- two old folders of one run (an old tree beside a newer one): the one whose summary is newest moves to
  ``runs/<run id>/``, unless that folder already holds a finished run; the others move whole to
  ``runs/.superseded/<old path>/`` (their logs to ``logs/runs/.superseded/``), beside the folders they come
  from (one filesystem: a rename) and hidden from everything that reads runs;
- interrupted, it is rerun: folders already moved are found no more, half-moved ones are finished, and
  a log left behind follows its folder;
- the collected tables written from the old folders (``metrics.parquet``, ``steps.parquet``, whose
  run_path names old folders) and ``report/report.html`` move to ``superseded/``, so that the workflow
  collects the moved runs again and rebuilds the report (no run is retrained).
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.io import write_json
from scalelab.planning.sweep import AXIS, POINT_FILE, RunPoint

ASIDE = ".superseded"
"""Under runs/ and logs/runs/: older copies of a run a migration moved out of the way (hidden: never read)."""
SUPERSEDED_TABLES = "superseded"
"""Under the results folder: the collected tables and report of the old layout."""
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


def _visible(names) -> list[str]:
    return [n for n in names if not n.startswith(".")]


def old_layout_runs(results_dir: str | Path) -> list[str]:
    """Run folders of an earlier layout under results_dir/runs, as paths relative to it
    (``precision~fp32/zero_stage~0/world_size~1``): folders of ``axis~value`` levels that hold a run's
    files (the deepest level, or a shallower one whose run a later layout nested deeper runs in).
    Hidden files (an editor's, a desktop's) make no run; an empty level is none either."""
    runs = Path(results_dir) / "runs"
    if not runs.is_dir():
        return []
    found = []
    for top in sorted(runs.iterdir()):
        if not top.is_dir() or not top.name.startswith("precision~"):  # every old layout began with it
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            axis_dirs = sorted(d for d in dirnames if _axis_part(d))
            if _visible(filenames) or len(axis_dirs) < len(_visible(dirnames)):
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
    """The point an old run folder holds: the axes its path names, each value as the config schema
    allows it; axes added since at their default. ValueError naming the part it cannot read."""
    import jsonschema

    values = {}
    for part in old_path.split("/"):
        axis, text = _axis_part(part) or (None, None)
        if axis not in AXIS:
            raise ValueError(f"{part!r} is not 'axis~value' for an axis of this scalelab ({', '.join(AXIS)})")
        try:
            value = AXIS[axis].from_path(text)
            if value is not None:  # None: not applicable (no buckets under FSDP2, no accumulation, no LoRA)
                error = jsonschema.exceptions.best_match(_axis_validator(axis).iter_errors([value]))
                if error is not None:
                    raise error
        except (ValueError, jsonschema.ValidationError) as err:
            raise ValueError(f"{part!r}: {getattr(err, 'message', err)}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{part!r}: not a finite number")
        values[axis] = value
    return RunPoint.from_json(values)


@functools.cache
def _axis_validator(axis: str):
    """The config schema's validator of one sweep axis, built once: jsonschema.validate checks the schema
    itself against its metaschema at every call, ~6 ms each, and a migration reads every part of every
    old run path (a tree of a few hundred runs took seconds of it)."""
    from jsonschema import validators

    from scalelab.config import SCHEMA

    schema = SCHEMA["properties"]["sweep"]["properties"][axis]
    cls = validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@dataclass
class Move:
    old_path: str
    """Relative to <results>/runs."""
    run_id: str | None
    point: RunPoint | None = None
    to: str = ""
    """Destination relative to the results folder: runs/<run id> or runs/.superseded/<old path>."""
    problem: str | None = None
    """Why the folder cannot be moved (a name not understood): it stays where it is."""
    kept: list[str] = field(default_factory=list)
    """Files left in the old folder because the destination already has one of that name."""

    @property
    def aside(self) -> bool:
        return self.to.startswith(f"runs/{ASIDE}/")


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
            moves.append(Move(old, None, problem=f"{err}; scalelab cannot name its run: move it out of runs/"))
            continue
        moves.append(Move(old, point.run_id, point))
    by_run: dict[str, list[Move]] = {}
    for move in moves:
        if move.run_id is not None:
            by_run.setdefault(move.run_id, []).append(move)
    for run_id, group in by_run.items():
        group.sort(key=lambda m: _newest_summary(runs / m.old_path), reverse=True)
        for other in group[1:]:
            if other.point != group[0].point:  # one id, two different runs: never merged, never hidden
                other.problem = (f"its run id {run_id} is also that of runs/{group[0].old_path}, another run; "
                                 "move one of them out of runs/")
        group = [m for m in group if not m.problem]
        finished = (runs / run_id / RUN_OUTPUT_LAST).exists()  # a run since, or a copy moved before an interruption
        for i, move in enumerate(group):
            move.to = f"runs/{run_id}" if i == 0 and not finished else f"runs/{ASIDE}/{move.old_path}"
    return moves


def _move_into(src_dir: Path, dest_dir: Path) -> list[str]:
    """Rename every entry of src_dir but its axis levels into dest_dir, summary.json last; an entry
    whose name is taken in dest_dir stays. Returns the names kept back."""
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


def _newest_mtime(folder: Path) -> float | None:
    times = [p.stat().st_mtime for p in folder.rglob("*") if p.is_file()]
    return max(times, default=None)


def _prune_empty_levels(root: Path) -> None:
    """Remove the empty ``axis~value`` folders of old paths under root, deepest first (what moving
    their runs out left; an interrupted migration may leave some)."""
    if not root.is_dir():
        return
    for top in [p for p in root.iterdir() if p.is_dir() and p.name.startswith("precision~")]:
        for dirpath, _, _ in sorted(os.walk(top), key=lambda w: w[0].count(os.sep), reverse=True):
            if _axis_part(Path(dirpath).name):
                try:
                    Path(dirpath).rmdir()
                except OSError:  # not empty: a run's files, or a file kept back
                    pass


def _old_logs(logs: Path) -> list[str]:
    """Old paths (relative to logs/runs, without .log) of the logs of old run folders."""
    if not logs.is_dir():
        return []
    return sorted(p.relative_to(logs).as_posix()[:-len(".log")] for top in logs.iterdir()
                  if top.is_dir() and top.name.startswith("precision~") for p in top.rglob("*.log"))


def _log_destination(results_dir: Path, old_path: str) -> Path | None:
    """Where the log of an old run folder goes: with its run, or aside with its superseded copy;
    None when no run can be named from its path (left where it is)."""
    logs = results_dir / "logs" / "runs"
    if (results_dir / "runs" / ASIDE / old_path).exists():
        return logs / ASIDE / f"{old_path}.log"
    try:
        run_id = point_of_old_path(old_path).run_id
    except ValueError:
        return None
    own = logs / f"{run_id}.log"
    return own if not own.exists() else _free(logs / ASIDE / f"{old_path}.log")


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


def _rename(src: Path, dest: Path) -> bool:
    """Rename src to dest unless dest exists (never overwrite); whether it moved."""
    if dest.exists():
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(src, dest)
    return True


def migrate(results_dir: str | Path, dry_run: bool = False) -> dict:
    """Carry out (or, dry_run, only plan) the migration of results_dir.
    Returns {'moves', 'logs': [(old, new, moved)], 'tables': [(old, new)]}."""
    results_dir = Path(results_dir)
    runs, logs = results_dir / "runs", results_dir / "logs" / "runs"
    if not dry_run:
        _prune_empty_levels(runs)
    moves = plan(results_dir)
    log_moves = []
    for move in moves:
        if move.problem:
            continue
        dest = results_dir / move.to
        old_dir, old_log = runs / move.old_path, logs / f"{move.old_path}.log"
        new_log = logs / f"{move.run_id}.log" if not move.aside else logs / ASIDE / f"{move.old_path}.log"
        if dry_run:
            move.kept = sorted(p.name for p in old_dir.iterdir() if not _axis_part(p.name) and (dest / p.name).exists())
            if old_log.exists():
                log_moves.append((old_log, new_log, not new_log.exists()))
            continue
        if not move.aside and not (dest / POINT_FILE).exists():
            dest.mkdir(parents=True, exist_ok=True)
            write_json(dest / POINT_FILE, move.point.to_json())  # first: the folder says what it holds
            newest = _newest_mtime(old_dir)
            if newest is not None:  # dated as the run, not now: `status` reads a folder's last write
                os.utime(dest / POINT_FILE, (newest, newest))
        move.kept = _move_into(old_dir, dest)
        if old_log.exists():
            log_moves.append((old_log, new_log, _rename(old_log, new_log)))
    # logs whose folder moved before an interruption: each follows its folder
    planned = {src for src, _, _ in log_moves}
    for old_path in _old_logs(logs):
        src = logs / f"{old_path}.log"
        new = _log_destination(results_dir, old_path)
        if src in planned or new is None:
            continue
        log_moves.append((src, new, not new.exists() if dry_run else _rename(src, new)))
    if not dry_run:
        _prune_empty_levels(runs)
        _prune_empty_levels(logs)
    # collected from old folders; or the tables moved and the report not yet (an interrupted migration)
    stale = _collected_from_old_layout(results_dir) or (
        not (results_dir / TABLES[0]).exists() and (results_dir / SUPERSEDED_TABLES / TABLES[0]).exists())
    table_moves = [(results_dir / name, _free(results_dir / SUPERSEDED_TABLES / name)) for name in TABLES
                   if stale and (results_dir / name).exists()]
    if not dry_run:
        for src, dest in table_moves:
            _rename(src, dest)
    return {"moves": moves, "logs": log_moves, "tables": table_moves}


def format_result(results_dir: str | Path, result: dict, dry_run: bool) -> str:
    moves, logs, tables = result["moves"], result["logs"], result["tables"]
    if not moves and not logs and not tables:
        return f"{results_dir}: no run folder of an older layout; nothing to do"
    verb = "would move" if dry_run else "moved"
    lines = []
    for m in moves:
        if m.problem:
            lines.append(f"  left  runs/{m.old_path}: {m.problem}")
            continue
        lines.append(f"  {verb} runs/{m.old_path} -> {m.to}" + ("  (an older copy of a run, kept aside)" if m.aside else ""))
        if m.kept:
            lines.append(f"    kept in the old folder, the destination already has: {', '.join(m.kept)}")
    for src, dest, moved in logs:
        rel_src, rel_dest = src.relative_to(results_dir), dest.relative_to(results_dir)
        lines.append(f"  {verb} {rel_src} -> {rel_dest}" if moved else f"  left  {rel_src}: {rel_dest} already exists")
    for src, dest in tables:
        lines.append(f"  {verb} {src.relative_to(results_dir)} -> {dest.relative_to(results_dir)}"
                     "  (rebuilt by the workflow, or `scalelab report RESULTS --collect`)")
    n_run = sum(1 for m in moves if m.to and not m.aside and not m.problem)
    n_aside = sum(1 for m in moves if m.aside and not m.problem)
    n_bad = sum(1 for m in moves if m.problem)
    if moves:
        head = f"{results_dir}: {len(moves)} run folder(s) of an older layout: {n_run} to runs/<run id>/"
        head += f", {n_aside} older cop(ies) to runs/{ASIDE}/" if n_aside else ""
        head += f", {n_bad} left in place" if n_bad else ""
    else:
        head = f"{results_dir}: finishing an earlier migration (no run folder of an older layout left)"
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
    from scalelab.results.lock import LockHeld, results_lock

    results = Path(args.results_dir)
    if not results.is_dir():
        print(f"error: results folder {results} does not exist", file=sys.stderr)
        return 2
    lock = None
    if not args.dry_run:  # a workflow (or its cluster jobs) writing there meanwhile would lose files
        lock = results_lock(results)
        try:
            note = lock.acquire()
        except LockHeld as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if note:
            print(note, file=sys.stderr)
    try:
        result = migrate(results, dry_run=args.dry_run)
    except OSError as err:
        print(f"error: {err.strerror or err}: {err.filename or ''}{f' -> {err.filename2}' if err.filename2 else ''}; "
              "nothing was lost: fix that and run the same command again, it goes on where it stopped", file=sys.stderr)
        return 2
    finally:
        if lock is not None:
            lock.release()
    print(format_result(results, result, args.dry_run))
    incomplete = any(m.problem or m.kept for m in result["moves"]) or any(not moved for _, _, moved in result["logs"])
    return 1 if incomplete and not args.dry_run else 0
