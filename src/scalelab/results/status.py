"""Where a sweep stands, from its run folders alone, and how to rerun the runs that did not end ok.

``scalelab status RESULTS`` reads every run folder under RESULTS/runs (``runs/<run id>/``):
a folder with a ``summary.json`` has that run's status (ok, failed, timeout, oom,
predicted_oom, diverged, skipped; ``corrupt`` when the file cannot be read); a folder
without one is a run that started and has not finished: ``running`` when something in it
(or its log) was written in the last few minutes, else ``killed`` (its launcher was killed,
or it hangs). With the workflow's config, sweep points without a folder are ``not started``.

``scalelab retry RESULTS --status timeout,failed`` removes exactly those runs' Snakemake
outputs (summary.json, steps.parquet), the collected tables (metrics.parquet, steps.parquet:
collection rebuilds them from the run folders) and report/report.html, so that the command that
started the sweep (scalelab.results.invocation.rerun_command) reruns those runs and nothing else, then collection and the report. (Snakemake
does not rerun a job whose output is missing while the files downstream of it are present:
with the tables and the report left in place it plans nothing.) A run whose summary says ok
is never touched, nor is a running one. Checkpoints stay (a timed-out run with train.checkpoint_every
resumes) unless --fresh.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from scalelab.planning.forecast_record import is_pruned
from scalelab.planning.run_plan import RunPlan
from scalelab.planning.sweep import LAUNCHER_FILE, RUN_DIR_GLOB
from scalelab.results.lock import holder
from scalelab.results.migrate import check_layout
from scalelab.run.processes import stale_reason

ACTIVE_WITHIN_S = 300.0
"""A run folder without a summary counts as running if anything of it was written this recently."""
ORDER = ("ok", "running", "starting", "killed", "failed", "timeout", "oom", "predicted_oom", "diverged", "skipped", "corrupt", "not started")
RETRY_DEFAULT = ("failed", "timeout", "oom", "diverged", "corrupt", "killed")
"""What `scalelab retry` reruns when no --status is given: the runs that went wrong. skipped and
predicted_oom are decisions (no device, or a prediction) that a rerun would repeat; name them
to rerun them anyway (say after setting planning.launch_predicted_oom)."""
NEVER_RETRIED = ("ok", "running", "starting", "not started")
OUTPUTS = ("summary.json", "steps.parquet")  # the train rule's outputs: removing them reruns the run
DOWNSTREAM = ("metrics.parquet", "steps.parquet", "report/report.html")  # collect's and report's outputs, rebuilt by the workflow


@dataclass
class RunState:
    run_path: str  # relative to <results>/runs: the run id, which names the folder
    run_id: str
    status: str
    reason: str | None = None
    last_write_s_ago: float | None = None


def summary_status(run_dir: Path) -> tuple[str, str | None, str | None] | None:
    """(status, reason, run id) from a run folder's summary.json; None without one."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as err:
        return "corrupt", f"summary.json is corrupt: {err}", None
    if not isinstance(summary, dict) or not isinstance(summary.get("status"), str):
        return "corrupt", "summary.json has no status", None
    damaged = steps_damage(run_dir / "steps.parquet")
    if damaged:  # the run's step rows are gone: its result is not whole, whatever its summary says
        return "corrupt", f"{damaged} (its summary says {summary['status']})", summary.get("run_id")
    return summary["status"], summary.get("reason"), summary.get("run_id")


def steps_damage(path: Path) -> str | None:
    """Why a run's steps.parquet cannot be read (truncated, overwritten, not Parquet), from its footer alone;
    None when it reads, or when it is absent (a run still training has none yet)."""
    import pyarrow.parquet as pq

    try:
        pq.read_metadata(path)
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        return f"steps.parquet is corrupt: {type(err).__name__}: {' '.join(str(err).split())[:200]}"
    return None


def _unfinished(run_dir: Path, log: Path, now: float, active_within_s: float) -> tuple[str, str, float | None]:
    """(running | killed, what the folder shows, seconds since its last write) for a run without a
    summary. Its launcher's record (launcher.json) decides where it can: a launcher on this host is
    checked by pid (killed the moment it is gone, running while it lives, however quiet); one on
    another host (a SLURM node) cannot be, and a folder quiet for active_within_s counts as killed."""
    paths = [p for p in run_dir.rglob("*") if p.is_file()] + ([log] if log.exists() else [])
    newest = max((p.stat().st_mtime for p in paths), default=None)
    ago = None if newest is None else max(0.0, now - newest)
    progress = run_dir / "progress.jsonl"
    steps = sum(1 for line in progress.read_text().splitlines() if line.strip()) if progress.exists() else 0
    checkpoints = sorted((p for p in (run_dir / "checkpoint").glob("step_*") if p.is_dir()),
                         key=lambda p: int(p.name.split("_")[-1]) if p.name.split("_")[-1].isdigit() else -1)
    parts = [f"{steps} step(s) recorded" if steps else "no step recorded"]
    if checkpoints:
        parts.append(f"checkpoint {checkpoints[-1].name} (a rerun resumes from it)")
    launcher = _launcher(run_dir)
    if launcher is not None:
        gone = stale_reason(launcher)
        if gone is not None:
            return "killed", f"no summary.json and its launcher is gone ({gone}); " + "; ".join(parts) + _disk_note(run_dir), ago
        if launcher.get("host") == socket.gethostname():
            return "running", f"no summary.json yet, launcher pid {launcher['pid']} alive; " + "; ".join(parts), ago
    elif not steps and not checkpoints:  # its job made the folder; its launcher has not recorded itself yet (or never will)
        created_ago = max(0.0, now - run_dir.stat().st_mtime)
        if holder(run_dir.parents[1]) is None:  # no workflow drives this folder: nothing will start it
            return "killed", ("no summary.json, and its launcher never started: the sweep was stopped first (no "
                              "workflow holds the results folder)" + _disk_note(run_dir)), ago
        if created_ago <= active_within_s:
            return "starting", f"its job began {created_ago:.0f} s ago; its launcher has not recorded itself yet", ago
    if ago is None:
        return "killed", "empty run folder, no summary.json" + _disk_note(run_dir), None
    span = f"{ago:.0f} s" if ago < 120 else f"{ago / 60:.0f} min" if ago < 7200 else f"{ago / 3600:.0f} h"
    if ago <= active_within_s:
        return "running", f"no summary.json yet, last write {span} ago; " + "; ".join(parts), ago
    return ("killed", f"no summary.json, nothing written for {span} (launcher killed, or hung); " + "; ".join(parts)
            + _disk_note(run_dir), ago)


LOW_DISK_BYTES = 64 * 2**20
"""Below this much free space where a run writes, a run that stopped without a word likely met a full disk."""


def _disk_note(run_dir: Path) -> str:
    """What a killed run's folder says of its disk: a full one is the likely cause, and the fix is not a retry."""
    import shutil

    try:
        free = shutil.disk_usage(run_dir).free
    except OSError:
        return ""
    if free >= LOW_DISK_BYTES:
        return ""
    return (f"; the disk holding it has {free / 2**20:.0f} MiB free: no space left on device, likely what stopped it "
            "(free some space, then scalelab resume)")


def _launcher(run_dir: Path) -> dict | None:
    try:
        record = json.loads((run_dir / LAUNCHER_FILE).read_text())
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def run_states(results_dir: str | Path, config_path: str | Path | None = None,
               active_within_s: float = ACTIVE_WITHIN_S, now: float | None = None) -> list[RunState]:
    """One RunState per run folder under results_dir/runs (and per sweep point of config_path
    without a folder: not started), sorted by run id. Raises OldLayout for a results folder
    holding run folders of an earlier layout (``scalelab migrate`` moves them)."""
    results_dir = Path(results_dir)
    runs_root = results_dir / "runs"
    check_layout(results_dir)
    now = time.time() if now is None else now
    states = []
    for run_dir in sorted(p for p in runs_root.glob(RUN_DIR_GLOB) if p.is_dir()):
        run_path = run_dir.name
        found = summary_status(run_dir)
        if found is not None:
            status, reason, _ = found
            states.append(RunState(run_path, run_path, status, reason))
        else:
            log = results_dir / "logs" / "runs" / f"{run_path}.log"
            status, reason, ago = _unfinished(run_dir, log, now, active_within_s)
            states.append(RunState(run_path, run_path, status, reason, ago))
    config = _sweep_config(results_dir, config_path)
    if config is not None:
        from scalelab.planning.sweep import sweep_plan

        present = {s.run_path for s in states}
        points, _ = sweep_plan(config)
        states += [RunState(p.path, p.run_id, "not started", "no run folder yet") for p in points if p.path not in present]
    return sorted(states, key=lambda s: s.run_path)


def _sweep_config(results_dir: Path, config_path: str | Path | None) -> dict | None:
    """The sweep's config, to count its points that never started: the file given, else the files the sweep
    was started with (its invocation record: the working directory's config.yaml, then each --configfile; a
    --config on its command line is not replayed); None when neither is there or they no longer validate."""
    from scalelab.planning.validation import load_config, load_configs

    if config_path is not None:
        return load_config(config_path, try_modules=False)  # the points alone: the launcher tries the modules
    from scalelab.config import ConfigError
    from scalelab.results.invocation import recorded

    data = recorded(results_dir)
    if not data or not data.get("cwd"):
        return None
    files = [Path(data["cwd"]) / "config.yaml", *map(Path, data.get("configfiles") or [])]
    try:
        return load_configs(files, base_dir=data["cwd"], try_modules=False)
    except (ConfigError, OSError):
        return None


def counts(states: list[RunState]) -> dict[str, int]:
    found = {}
    for s in states:
        found[s.status] = found.get(s.status, 0) + 1
    return {k: found[k] for k in [*ORDER, *sorted(set(found) - set(ORDER))] if k in found}


def format_status(results_dir: str | Path, states: list[RunState]) -> str:
    """What `scalelab status` prints: counts by status, the runs still running, then each run that
    ended not ok, with its whole reason on its line (never cut: its end is often the fix)."""
    lines = [f"{results_dir}: {len(states)} run(s)"]
    for status, n in counts(states).items():
        lines.append(f"  {status:<14}{n:>5}")

    def listed(title: str, chosen: list[RunState]) -> list[str]:
        if not chosen:
            return []
        id_width = max(len(s.run_id) for s in chosen)
        order = sorted(chosen, key=lambda s: (ORDER.index(s.status) if s.status in ORDER else len(ORDER), s.run_id))
        return ["", title, *(f"  {s.run_id:<{id_width}}  {s.status:<13} {' '.join((s.reason or '').split())}" for s in order)]

    lines += listed("running:", [s for s in states if s.status in ("running", "starting")])
    lines += listed("not ok:", [s for s in states if s.status not in ("ok", "running", "starting")
                                and not is_pruned(s.status, s.reason)])
    pruned = [s for s in states if is_pruned(s.status, s.reason)]
    if pruned:  # a decision, not a failure: each reason names its rank
        lines += ["", f"pruned by the forecast (planning.top_k; raise it to run them): {len(pruned)}, "
                      f"{', '.join(s.run_id for s in sorted(pruned, key=lambda s: s.run_id))}"]
    # scalelab resume runs the command that started this sweep (its config files, --config,
    # profile: a bare `snakemake --cores all` would run the default config into results/), and
    # reruns a killed run by itself (Snakemake marked it incomplete, its checkpoint kept): retry is for the others.
    retryable = sorted({s.status for s in states if s.status in RETRY_DEFAULT and s.status != "killed"})
    if retryable or any(s.status in ("killed", "not started") for s in states):
        from scalelab.results.invocation import rerun_command

        lines += [""]
        if retryable:
            lines += [f"rerun them: scalelab retry {results_dir} --status {','.join(retryable)}"]
        lines += [f"{'      then' if retryable else 'go on with the sweep'}: scalelab resume {results_dir}",
                  f"            (finished runs are kept; it runs the sweep's command: {rerun_command(results_dir, ' --rerun-incomplete')})"]
    return "\n".join(lines)


def stopped_lines(results_dir: str | Path) -> list[str]:
    """What the workflow says when it stops before its end: the runs that went wrong and how to rerun them, or,
    when none did (Ctrl-C, another job failed), how to go on. Never advice that cannot help."""
    where = Path(results_dir).resolve()
    try:
        states = run_states(where) if (where / "runs").is_dir() else []
    except Exception:  # noqa: BLE001 - the closing lines never hide Snakemake's own error
        states = []
    wrong = sorted({s.status for s in states if s.status in RETRY_DEFAULT and s.status != "killed"})
    if wrong:
        return [f"scalelab: runs that ended {', '.join(wrong)}, and why: scalelab status {where}",
                f"scalelab: to rerun them: scalelab retry {where} --status {','.join(wrong)}, then: scalelab resume {where}"]
    return [f"scalelab: no run failed; the sweep stopped before its end (interrupted, or a job failed: the lines above "
            f"say which); where it stands: scalelab status {where}",
            f"scalelab: to go on (finished runs are kept): scalelab resume {where}"]


def status_json(states: list[RunState]) -> str:
    return json.dumps({"counts": counts(states), "runs": [asdict(s) for s in states]}, indent=1)


class RetryError(ValueError):
    pass


def retry(results_dir: str | Path, statuses: tuple[str, ...] | list[str] = RETRY_DEFAULT, dry_run: bool = False,
          fresh: bool = False, active_within_s: float = ACTIVE_WITHIN_S) -> list[tuple[RunState, list[str]]]:
    """Remove the Snakemake outputs (summary.json, steps.parquet) of the runs with these statuses, and
    the collected tables and report.html, so that the workflow reruns exactly those runs, then
    collection and the report; with fresh, their progress and checkpoints too. Returns
    [(run, files removed or that would be)]. A run whose summary says ok, or that is running, is
    never touched: each folder's summary is read again right before anything in it is removed."""
    wrong = sorted(set(statuses) & set(NEVER_RETRIED))
    if wrong:
        raise RetryError(f"never retried: {', '.join(wrong)} (retry reruns runs that ended and not ok)")
    unknown = sorted(set(statuses) - set(ORDER))
    if unknown:
        raise RetryError(f"unknown status {', '.join(unknown)}; one of {', '.join(s for s in ORDER if s not in NEVER_RETRIED)}")
    runs_root = Path(results_dir) / "runs"
    done = []
    for state in run_states(results_dir, active_within_s=active_within_s):
        if state.status not in statuses:
            continue
        run_dir = runs_root / state.run_path
        again = summary_status(run_dir)
        if (again[0] if again else state.status) != state.status:  # changed meanwhile (a rerun finished): leave it
            continue
        targets = [run_dir / name for name in OUTPUTS]
        if fresh:
            targets += [run_dir / "progress.jsonl", run_dir / "checkpoint"]
        targets = [p for p in targets if p.exists()]
        if not dry_run:
            import shutil

            for path in targets:  # summary.json first: without it the run counts as unfinished
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        done.append((state, [p.relative_to(run_dir).as_posix() for p in targets]))
    if done and not dry_run:
        for name in DOWNSTREAM:  # collection and the report are due again (see the module's docstring)
            (Path(results_dir) / name).unlink(missing_ok=True)
    return done


# ----------------------------------------------------------------------------- resume after an interrupt
# Snakemake marks a job's outputs incomplete when it starts the job and clears the mark when it
# sees the job end. Interrupted (Ctrl-C, SIGINT to its pid or group, a kill), it may never see the
# end of a run that finished anyway: its complete summary.json stays marked, and the next
# invocation stops with IncompleteFilesException, or with --rerun-incomplete retrains it.
# `scalelab resume RESULTS` clears the marks of exactly the runs whose summary is complete and has
# Snakemake record their provenance (--touch of their outputs alone, which checks that they trained
# with the values the config holds now: else they are rerun), then runs the recorded command with
# --rerun-incomplete, which reruns what really did not finish.

INCOMPLETE_DIR = Path(".snakemake") / "incomplete"  # under Snakemake's working directory
TRAINED_WITH = "results_depend_on.json"
"""In a run folder: the values its results depend on (the train rule's results_depend_on param), as
the run started: what `scalelab resume` checks before it records a finished run's provenance."""


def record_trained_with(run_dir: Path, params: dict) -> None:
    from scalelab.io import write_json

    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / TRAINED_WITH, json.loads(json.dumps(params, default=str)))


def check_trained_with(run_dir: Path, params: dict) -> None:
    """Raise ValueError naming the values that differ, unless the run in run_dir started with params."""
    try:
        trained = json.loads((run_dir / TRAINED_WITH).read_text())
    except (FileNotFoundError, ValueError) as err:
        raise ValueError(f"{run_dir.name}: no record of the values it trained with ({TRAINED_WITH}: {err})") from None
    now = json.loads(json.dumps(params, default=str))
    changed = sorted(k for k in {*trained, *now} if trained.get(k) != now.get(k))
    if changed:
        raise ValueError(f"{run_dir.name} trained with other values than the config holds now: "
                         + ", ".join(f"{k}: {trained.get(k)!r} then, {now.get(k)!r} now" for k in changed))


def _marked_incomplete(workdir: Path) -> list[str]:
    """The paths Snakemake marks incomplete in this working directory. Each mark is a file named by
    the urlsafe base64 of the output's path, split into folders of at most NAME_MAX characters
    with '@' before every part but the last (snakemake.persistence; read, never written here)."""
    import base64

    root = workdir / INCOMPLETE_DIR
    marked = []
    for mark in root.rglob("*") if root.is_dir() else []:
        if not mark.is_file():
            continue
        parts = mark.relative_to(root).parts
        encoded = "".join(part.removeprefix("@") for part in parts)
        try:
            marked.append(base64.urlsafe_b64decode(encoded.encode()).decode())
        except ValueError:  # a mark of another shape (a migration's): not one of ours to judge
            continue
    return marked


def finished_but_marked(results_dir: str | Path, workdir: str | Path) -> list[str]:
    """The train outputs (as Snakemake names them) marked incomplete although their run finished:
    its summary.json holds a status, and steps.parquet (written before it) is there."""
    results, workdir = Path(results_dir).resolve(), Path(workdir).resolve()
    found = []
    for name in _marked_incomplete(workdir):
        path = (workdir / name).resolve()
        if path.name not in OUTPUTS or path.parent.parent != results / "runs":
            continue
        done = summary_status(path.parent)
        if done is not None and done[0] != "corrupt" and all((path.parent / o).exists() for o in OUTPUTS):
            found.append(name)
    return sorted(found)


def resume(results_dir: str | Path, dry_run: bool = False, timeout_s: float | None = None) -> int:
    """Go on with an interrupted sweep: refused while its workflow still runs (the results lock's
    holder is alive); else Snakemake's own lock, left by a killed Snakemake, is released
    (--unlock), the marks of finished runs are cleared, and the recorded command runs with
    --rerun-incomplete. Snakemake's exit status (2: refused, or no recorded command)."""
    import subprocess
    import sys

    from scalelab.results.invocation import recorded, rerun_command
    from scalelab.results.lock import describe, holder

    running = holder(results_dir)
    if running is not None:
        print(f"scalelab resume: the sweep in {results_dir} is still running ({describe(running)}): wait for it, "
              "or stop it first (Ctrl-C)", file=sys.stderr)
        return 2
    data = recorded(results_dir)
    if data is None:
        print(f"scalelab resume: {results_dir} recorded no command line (.scalelab/invocation.json); rerun it with the "
              f"command that started it, with --rerun-incomplete", file=sys.stderr)
        return 2
    here, there = Path(results_dir).resolve(), data.get("results_dir")
    if there and Path(there) != here:
        print(f"scalelab resume: {here} was copied or moved from {there}, where its recorded command writes: "
              f"resuming would go on with that folder, not this one. Rerun this one with the sweep's command and "
              f"results_dir set to it (e.g. add --config results_dir={shlex.quote(str(here))}), or resume {there}",
              file=sys.stderr)
        return 2
    workdir = Path(data.get("cwd") or _directory_of(data["command"]) or Path.cwd())
    env = {**os.environ}
    if data.get("pythonpath"):
        env["PYTHONPATH"] = data["pythonpath"]
    command = shlex.split(data["command"])
    beside = Path(sys.executable).parent / "snakemake"  # this environment's, as the sweep's own hints assume
    if command[0] == "snakemake" and beside.exists():
        command[0] = str(beside)

    def snakemake(*extra: str, quiet: bool = False) -> subprocess.CompletedProcess:
        proc = subprocess.run([*command, *extra], cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 and not quiet:
            print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
        return proc

    if any((workdir / ".snakemake" / "locks").glob("*.lock")):  # its holder is dead: the results lock says so
        print("scalelab resume: releasing the lock the interrupted Snakemake left (snakemake --unlock)", file=sys.stderr)
        if not dry_run and (proc := snakemake("--unlock")).returncode != 0:
            return proc.returncode
    stale = finished_but_marked(results_dir, workdir)
    if stale:
        print(f"scalelab resume: {len(stale)} output(s) of finished runs are marked incomplete by the interrupted "
              f"invocation; clearing the marks (snakemake --cleanup-metadata): {', '.join(stale)}", file=sys.stderr)
        if not dry_run and _keep_finished(results_dir, workdir, stale, snakemake) != 0:
            return 2
    rerun = [*command, "--rerun-incomplete"]
    print(f"scalelab resume: {'would run' if dry_run else 'running'}: {rerun_command(results_dir, ' --rerun-incomplete')}",
          file=sys.stderr, flush=True)
    if dry_run:
        return 0
    return _run_in_foreground(rerun, workdir, env, timeout_s)


def _run_in_foreground(command: list[str], workdir: Path, env: dict, timeout_s: float | None) -> int:
    """Run Snakemake and wait for it. A Ctrl-C reaches it too (one process group): it stops its jobs and
    cleans up by itself, while this process waits for it instead of raising (and killing it) half way."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(command, cwd=workdir, env=env)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        code = proc.wait(timeout=60)
    finally:
        signal.signal(signal.SIGINT, previous)
    if code in (130, -signal.SIGINT):
        print("scalelab resume: interrupted; run it again to go on", file=sys.stderr)
    return code


def _keep_finished(results_dir, workdir: Path, stale: list[str], snakemake) -> int:
    """Clear Snakemake's incomplete marks of finished runs' outputs, then record their provenance
    (snakemake --touch --force of those outputs, train rules only: nothing else is touched) so that
    a later change of a value they depend on reruns them. A run that trained with other values than
    the config holds now is rerun instead: its outputs are removed. 0, or 2 when a mark stays."""
    import sys

    # --cleanup-metadata clears the mark, then fails for want of the record the interrupt kept
    # Snakemake from writing ("the metadata was not present"): what counts is that no mark stays.
    snakemake("--cleanup-metadata", *stale, quiet=True)
    if left := finished_but_marked(results_dir, workdir):
        print(f"scalelab resume: could not clear Snakemake's marks of {', '.join(left)}", file=sys.stderr)
        return 2
    for run in sorted({str(Path(name).parent) for name in stale}):
        targets = [f"{run}/{output}" for output in OUTPUTS]
        proc = snakemake("--touch", "--force", "--allowed-rules", "train", "train_multinode", "--cores", "1", *targets,
                         quiet=True)
        if proc.returncode != 0:
            why = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("scalelab: ")]
            print(f"scalelab resume: {Path(run).name} is rerun: " + (why[-1].removeprefix("scalelab: ") if why else
                  f"recording its provenance failed:\n{proc.stderr[-2000:]}"), file=sys.stderr)
            for output in OUTPUTS:
                (workdir / run / output).unlink(missing_ok=True)
    return 0


def _directory_of(command: str) -> str | None:
    """--directory's value in a recorded command (recorded absolute), if it has one."""
    args = shlex.split(command)
    return args[args.index("--directory") + 1] if "--directory" in args[:-1] else None


def measured_ok(results_dir: str | Path, plans: dict[str, RunPlan]) -> frozenset[str]:
    """The first run ids of the points any of whose runs ended ok in this results folder."""
    ok = set()
    for run_id, plan in plans.items():
        state = summary_status(Path(results_dir) / "runs" / run_id)
        if state is not None and state[0] == "ok":
            ok.add(plan.point.first_run_id)
    return frozenset(ok)
