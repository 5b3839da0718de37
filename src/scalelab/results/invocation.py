"""How a sweep was started, so that every hint the tool prints reruns that sweep and not another.

A sweep started with ``snakemake --cores all --configfile my.yaml`` writes its results where
my.yaml says; a hint saying ``snakemake --cores all`` would run the default config into
``results/`` instead. So the workflow's ``onstart`` (rules/hooks.smk) records the command line that selects the
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
    # where the sweep wrote: `scalelab resume` on a copy or a moved folder must not rerun the original's command
    data["results_dir"] = str(Path(results_dir).resolve())
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
