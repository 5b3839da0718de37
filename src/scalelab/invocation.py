"""How a sweep was started, so that every hint the tool prints reruns that sweep and not another.

A sweep started with ``snakemake --cores all --configfile my.yaml`` writes its results where
my.yaml says; a hint saying ``snakemake --cores all`` would run the default config into
``results/`` instead. So the Snakefile's ``onstart`` records the command line that selects the
sweep in ``<results>/.scalelab/invocation.json``: the working directory and, from the command
line Snakemake parsed, only the options that choose what runs and where (Snakefile, directory,
config files, --config, profiles, cores, jobs, executor), never -n, --forcerun and the like,
which were about that one invocation. ``rerun_command(results)`` reads it back for `scalelab
status`, `scalelab retry`, the end-of-sweep text and the report; without a record (a sweep
started before this existed) it says which options to add.
"""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

RECORD = Path(".scalelab") / "invocation.json"  # inside the results folder
# Snakemake's argparse destinations that select the sweep, with the option that sets them, in the
# order the command is written. Everything else on the command line is left out on purpose.
SELECTING = (("cores", "--cores"), ("jobs", "--jobs"), ("executor", "--executor"), ("snakefile", "--snakefile"),
             ("directory", "--directory"), ("profile", "--profile"), ("workflow_profile", "--workflow-profile"),
             ("configfile", "--configfile"), ("config", "--config"))
FALLBACK = "snakemake --cores all"
UNRECORDED = ("(add the --configfile / --config options this sweep was started with: "
              "it recorded no command line, being older than .scalelab/invocation.json)")


def selecting_args(argv: list[str]) -> list[str] | None:
    """The options of a Snakemake command line (argv without the program) that select the sweep,
    as Snakemake's own parser reads them; None if it cannot parse them."""
    from snakemake.cli import get_argument_parser

    parser = get_argument_parser()

    def refuse(message):
        raise ValueError(message)

    parser.error = refuse  # argparse would print its usage and exit
    try:
        args, _ = parser.parse_known_args(argv)
    except (ValueError, SystemExit):
        return None
    given = set()  # options typed, not argparse's defaults (a default profile is found again by itself)
    for token in argv:
        if token.startswith("--"):
            given.add(token.split("=", 1)[0])
        elif token.startswith("-"):
            given.add(token[:2])  # -c2 is -c 2
    raw = _raw_counts(argv)  # "all" as typed: Snakemake's parser turns it into this machine's count
    out: list[str] = []
    for dest, option in SELECTING:
        value = raw.get(dest) or getattr(args, dest, None)
        if value in (None, [], ()) or not any(_sets(parser, dest, flag) for flag in given):
            continue
        values = value if isinstance(value, list | tuple) else [value]
        out += [option, *(str(v) for v in values)]
    return out


def _raw_counts(argv: list[str]) -> dict:
    import argparse

    counts = argparse.ArgumentParser(add_help=False, allow_abbrev=True)
    counts.add_argument("-c", "--cores", dest="cores")
    counts.add_argument("-j", "--jobs", dest="jobs")
    try:
        found, _ = counts.parse_known_args(argv)
    except SystemExit:
        return {}
    return {k: v for k, v in vars(found).items() if v is not None}


def _sets(parser, dest: str, flag: str) -> bool:
    """Whether the command-line flag (as typed, maybe abbreviated) sets this destination."""
    for action in parser._actions:
        if action.dest == dest and any(s == flag or (flag.startswith("--") and s.startswith(flag) and len(flag) > 3)
                                       for s in action.option_strings):
            return True
    return False


def command_of(argv: list[str], absolute: dict[str, list[str]] | None = None) -> str | None:
    """absolute: option -> absolute values that replace the typed ones (after --directory the typed
    relative paths are relative to a directory no longer known)."""
    args = selecting_args(argv)
    if args is None:
        return None
    if absolute:
        kept, i = [], 0
        while i < len(args):
            option = args[i]
            j = i + 1
            while j < len(args) and not args[j].startswith("--"):
                j += 1
            kept += [option, *absolute[option]] if option in absolute else args[i:j]
            i = j
        args = kept
    if "--cores" not in args and "--jobs" not in args:  # Snakemake requires one for a local run
        args = ["--cores", "all", *args]
    return shlex.join(["snakemake", *args])


def record(results_dir: str | Path, argv: list[str], configfiles: list[str | Path], cwd: str | Path | None = None,
           snakefile: str | Path | None = None) -> Path:
    """Write <results>/.scalelab/invocation.json from the Snakemake process's argv (without the
    program). configfiles: the files Snakemake merged (workflow.overwrite_configfiles), kept beside
    the command, which names them as typed."""
    cwd = Path(cwd or os.getcwd()).resolve()
    path = Path(results_dir) / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    files = [str(Path(p).resolve()) for p in configfiles]
    typed = selecting_args(argv) or []
    if "--directory" in typed:
        # Snakemake has moved into --directory (cwd here): the directory the command was typed in is
        # unknown, so the command names the working directory, config files and Snakefile absolutely.
        absolute = {"--directory": [str(cwd)], "--configfile": files}
        if snakefile:
            absolute["--snakefile"] = [str(Path(snakefile).resolve())]
        data = {"command": command_of(argv, absolute), "cwd": None, "configfiles": files}
    else:
        data = {"command": command_of(argv), "cwd": str(cwd), "configfiles": files}
    # A user's module (model.module: "pkg.mod:build") imports through the PYTHONPATH the sweep was
    # started with: every rerun needs it too, absolute (relative entries were relative to cwd).
    if os.environ.get("PYTHONPATH"):
        data["pythonpath"] = os.pathsep.join(str((cwd / entry).resolve()) if entry else entry
                                             for entry in os.environ["PYTHONPATH"].split(os.pathsep))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return path


def recorded(results_dir: str | Path) -> dict | None:
    try:
        data = json.loads((Path(results_dir) / RECORD).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("command") else None


def rerun_command(results_dir: str | Path, extra: str = "") -> str:
    """The command that reruns this sweep: as it was started (from its working directory, with a
    `cd` when that is not the current one), or the default with what to add when nothing was recorded."""
    data = recorded(results_dir)
    if data is None:
        return f"{FALLBACK}{extra} {UNRECORDED}"
    command = data["command"] + extra
    if data.get("pythonpath"):
        command = f"PYTHONPATH={shlex.quote(data['pythonpath'])} {command}"
    cwd = data.get("cwd")
    if cwd and Path(cwd) != Path.cwd().resolve():
        command = f"cd {shlex.quote(cwd)} && {command}"
    return command


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
    from scalelab.status import OUTPUTS, summary_status

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

    from scalelab.lock import LOCK_NAME, describe, read_lock, stale_reason

    holder, _ = read_lock(Path(results_dir) / LOCK_NAME, settle_s=0.5)
    if holder is not None and (not holder or stale_reason(holder) is None):
        print(f"scalelab resume: the sweep in {results_dir} is still running ({describe(holder)}): wait for it, "
              "or stop it first (Ctrl-C)", file=sys.stderr)
        return 2
    data = recorded(results_dir)
    if data is None:
        print(f"scalelab resume: {results_dir} recorded no command line (.scalelab/invocation.json); rerun it with the "
              f"command that started it, with --rerun-incomplete", file=sys.stderr)
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
    print(f"scalelab resume: {'would run' if dry_run else 'running'} (in {workdir}): "
          + (f"PYTHONPATH={shlex.quote(data['pythonpath'])} " if data.get("pythonpath") else "") + shlex.join(rerun),
          file=sys.stderr, flush=True)
    if dry_run:
        return 0
    return subprocess.run(rerun, cwd=workdir, env=env, timeout=timeout_s).returncode


def _keep_finished(results_dir, workdir: Path, stale: list[str], snakemake) -> int:
    """Clear Snakemake's incomplete marks of finished runs' outputs, then record their provenance
    (snakemake --touch --force of those outputs, train rules only: nothing else is touched) so that
    a later change of a value they depend on reruns them. A run that trained with other values than
    the config holds now is rerun instead: its outputs are removed. 0, or 2 when a mark stays."""
    import sys

    from scalelab.status import OUTPUTS

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
