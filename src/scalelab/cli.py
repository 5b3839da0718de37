"""The `scalelab` command line."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scalelab.io import OutputTaken
from scalelab.results.migrate import OldLayout, check_layout


def _collect(args) -> int:
    from scalelab.results.collect import collect

    if not (Path(args.results_dir) / "runs").is_dir():  # never a new folder of empty tables for a mistyped path
        print(f"error: {args.results_dir} has no runs/ folder to collect", file=sys.stderr)
        return 2
    result = collect(args.results_dir)
    for problem in result["problems"]:
        print(f"warning: {problem}", file=sys.stderr)
    print(f"collected {result['runs']} runs, {result['steps']} steps into {args.results_dir}/metrics.parquet and steps.parquet")
    return 0


def _report(args) -> int:
    from scalelab.report.report import build_report
    from scalelab.results.collect import collect

    results = Path(args.results_dir)
    if not results.is_dir():
        print(f"error: results folder {results} does not exist", file=sys.stderr)
        return 2
    check_layout(results)  # tables collected from old run folders would name folders that moved
    if args.collect or not (results / "metrics.parquet").exists():
        if not (results / "runs").is_dir():
            print(f"error: {results} has neither metrics.parquet nor a runs/ folder to collect", file=sys.stderr)
            return 2
        result = collect(results)
        for problem in result["problems"]:
            print(f"warning: {problem}", file=sys.stderr)
    path = build_report(results, args.out)
    print(f"report: {path}")
    return 0


def _check_config(args) -> int:
    """Validate config files the way the Snakefile does, merged in order like Snakemake's
    `configfile:` + `--configfile`: every problem of every file at once, one line each, naming
    the file and line (a file that is not YAML, with its column), the key and the value."""
    from scalelab.config import ConfigError
    from scalelab.planning.sweep import sweep_plan
    from scalelab.planning.validation import load_configs, validation_message

    try:
        config = load_configs(args.files, base_dir=Path.cwd())
        points, left_out = sweep_plan(config)
    except ConfigError as err:
        print(validation_message(err), file=sys.stderr)
        return 2
    print(f"config ok: {' + '.join(args.files)}, {len(points)} run(s), {len(left_out)} combination(s) left out")
    return 0


def _tables_of(results: Path) -> str | None:
    """Collect results/runs into the tables if they are absent; an error message if it cannot."""
    from scalelab.results.collect import collect

    if not results.is_dir():
        return f"results folder {results} does not exist"
    check_layout(results)
    if not (results / "metrics.parquet").exists():
        if not (results / "runs").is_dir():
            return f"{results} has neither metrics.parquet nor a runs/ folder to collect"
        for problem in collect(results)["problems"]:
            print(f"warning: {problem}", file=sys.stderr)
    return None


def _compare(args) -> int:
    from scalelab.report.compare import build_compare

    for results in (Path(args.a), Path(args.b)):
        error = _tables_of(results)
        if error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    path = build_compare(args.a, args.b, args.out)
    print(f"compare: {path}\n         {path.with_suffix('.md')}")
    return 0


def _status(args) -> int:
    from scalelab.results.status import format_status, run_states, status_json

    results = Path(args.results_dir)
    if not (results / "runs").is_dir():
        print(f"error: {results} has no runs/ folder", file=sys.stderr)
        return 2
    states = run_states(results, args.config, active_within_s=args.active_within)
    print(status_json(states) if args.json else format_status(results, states))
    return 0


def _retry(args) -> int:
    from scalelab.results.status import RETRY_DEFAULT, RetryError, retry

    results = Path(args.results_dir)
    if not (results / "runs").is_dir():
        print(f"error: {results} has no runs/ folder", file=sys.stderr)
        return 2
    statuses = tuple(s.strip() for s in args.status.split(",") if s.strip()) if args.status else RETRY_DEFAULT
    try:
        done = retry(results, statuses, dry_run=args.dry_run, fresh=args.fresh, active_within_s=args.active_within)
    except RetryError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    verb = "would remove" if args.dry_run else "removed"
    for state, files in done:
        print(f"{state.run_id} ({state.status}): {verb} {', '.join(files) or 'nothing (no outputs left)'}")
    if not done:
        print(f"no run with status {', '.join(statuses)} under {results}/runs")
    elif not args.dry_run:
        print(f"removed the collected tables {results}/metrics.parquet, steps.parquet and {results}/report/report.html "
              "(the workflow rebuilds them; without that, Snakemake would see nothing to do)")
        from scalelab.results.invocation import rerun_command

        # The sweep's own command line (config files, --config, profile): a bare snakemake would run another sweep.
        print(f"{len(done)} run(s) to rerun; now: scalelab resume {results}\n"
              f"  (it reruns exactly these, then collection and the report, with the sweep's command: {rerun_command(results)})")
    return 0


def _resume(args) -> int:
    from scalelab.results.status import resume

    return resume(args.results_dir, dry_run=args.dry_run)


def _predict(args) -> int:
    """Fit the step-time model on the runs --fit selects, predict the others (scalelab.results.prediction_validation.validate)."""
    import json

    import pandas as pd

    from scalelab.planning.result_tables import read_runs
    from scalelab.registries.comm_table import BENCH_FILE, read_table
    from scalelab.results.prediction_validation import format_validation, validate

    folders = [Path(f) for f in args.validate]
    tables = []
    for folder in folders:
        error = _tables_of(folder)
        if error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        table = read_runs(folder / "metrics.parquet")
        if tables:  # a run id another folder has too is named with its folder
            seen = set(pd.concat(tables)["run_id"])
            table["run_id"] = [r if r not in seen else f"{r}@{folder.name}" for r in table["run_id"]]
        tables.append(table)
    runs = pd.concat(tables, ignore_index=True)
    results = folders[0]
    bench = Path(args.bench) if args.bench else results / BENCH_FILE
    table = None
    try:
        if bench.exists() or args.bench:
            table = read_table(bench)
        else:
            print(f"warning: no bench comm table at {bench}: runs that communicate get no prediction "
                  "(measure one: snakemake bench_comm, or scalelab bench comm --out ...)", file=sys.stderr)
        result = validate(runs, args.fit, table, str(bench) if table is not None else None)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1, default=float) if args.json else format_validation(result))
    return 0


def _add_result_commands(sub) -> None:
    """collect, report, check-config and compare: the commands that read a results folder or a config."""
    c = sub.add_parser("collect", help="gather run files under RESULTS/runs into RESULTS/{metrics,steps}.parquet")
    c.add_argument("results_dir", help="a results folder (holding runs/)")
    c.set_defaults(func=_collect)
    r = sub.add_parser("report", help="build RESULTS/report/report.html from the Parquet tables alone (no training)")
    r.add_argument("results_dir", help="a results folder holding metrics.parquet and steps.parquet (or runs/ to collect)")
    r.add_argument("--out", default=None, help="output folder (default: RESULTS/report)")
    r.add_argument("--collect", action="store_true", help="re-collect runs/ into the Parquet tables first")
    r.set_defaults(func=_report)
    k = sub.add_parser("check-config", help="validate config files as the Snakefile does (as with snakemake --configfile), "
                       "naming key and value, or file, line and column")
    k.add_argument("files", nargs="*", default=["config.yaml"],
                   help="config files, merged in order (default: config.yaml); e.g. config.yaml my.yaml")
    k.set_defaults(func=_check_config)
    k = sub.add_parser("compare", help="what changed between two result folders (torch, machine, commit): HTML + Markdown")
    k.add_argument("a", help="the reference results folder (A)")
    k.add_argument("b", help="the results folder compared with it (B); ratios are B / A")
    k.add_argument("--out", default=None, help="output folder (default: B/compare)")
    k.set_defaults(func=_compare)


def _add_sweep_commands(sub) -> None:
    """status, retry and resume: the commands that look after a sweep's runs."""
    s = sub.add_parser("status", help="how many runs of RESULTS are done, running, failed, timed out, OOM, skipped, ... with reasons")
    s.add_argument("results_dir", nargs="?", default="results", help="a results folder (holding runs/; default: results)")
    s.add_argument("--config", default=None, help="the workflow's config file: also count sweep points not started")
    s.add_argument("--json", action="store_true", help="counts and every run as JSON")
    s.add_argument("--active-within", type=float, default=300.0, metavar="SECONDS",
                   help="a run without summary.json counts as running if it wrote something this recently, else killed (default 300)")
    s.set_defaults(func=_status)
    t = sub.add_parser("retry", help="remove the outputs of the runs that did not end ok, so that snakemake reruns exactly them")
    t.add_argument("results_dir", help="a results folder (holding runs/)")
    t.add_argument("--status", default=None,
                   help="comma-separated statuses to rerun (default: failed,timeout,oom,diverged,corrupt,killed); never ok or running")
    t.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    t.add_argument("--fresh", action="store_true", help="also remove progress.jsonl and checkpoints (no resume)")
    t.add_argument("--active-within", type=float, default=300.0, metavar="SECONDS", help="as for status")
    t.set_defaults(func=_retry)
    u = sub.add_parser("resume", help="go on with an interrupted sweep (Ctrl-C, a kill): keep every finished run, "
                       "rerun what did not finish, with the command that started it")
    u.add_argument("results_dir", help="the sweep's results folder")
    u.add_argument("--dry-run", action="store_true", help="say what would be cleared and run, do nothing")
    u.set_defaults(func=_resume)


def _add_predict_command(sub) -> None:
    """predict: the step-time model held to measured runs."""
    p = sub.add_parser("predict", help="validate the step-time model (scalelab.results.prediction): fit on part of a sweep, "
                       "predict the rest, print errors and bands")
    p.add_argument("--validate", required=True, nargs="+", metavar="RESULTS",
                   help="results folders (metrics.parquet, or runs/ to collect), their runs taken together: a sweep, "
                        "and a calibration sweep beside it (e.g. one rank at the micro-batch the larger world sizes use)")
    p.add_argument("--fit", required=True, metavar="QUERY",
                   help="pandas query selecting the runs to fit on, e.g. 'world_size==1'; the other ok runs are predicted")
    p.add_argument("--bench", default=None, metavar="TABLE", help="the bench comm table (default: the first RESULTS' calibration/comm.parquet)")
    p.add_argument("--json", action="store_true", help="one JSON object: points, summary (mean_abs_error, max_abs_error, "
                   "inside_band_share), parameters")
    p.set_defaults(func=_predict)


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its flags (estimate, export, plan, migrate and bench add their own)."""
    parser = argparse.ArgumentParser(prog="scalelab", description="Reproducible scaling experiments: tables, reports, estimates.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_result_commands(sub)
    _add_sweep_commands(sub)
    _add_predict_command(sub)
    from scalelab.forecast.estimate_command import add_parser as add_estimate
    from scalelab.forecast.plan import add_parser as add_plan
    from scalelab.report.export import add_parser as add_export
    from scalelab.results.migrate import add_parser as add_migrate
    from scalelab.run.commbench import add_parser as add_bench

    add_migrate(sub)
    add_estimate(sub)
    add_export(sub)
    add_plan(sub)
    add_bench(sub)
    for command in sub.choices.values():  # estimate's subcommands set their own, which win
        command.set_defaults(usage_parser=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's own error and usage: parse_args would print the top-level usage
        getattr(args, "usage_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.func(args)
    except (OldLayout, OutputTaken) as err:  # old run folders (say what to run), an --out that is not ours to replace
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a missing or unreadable file the user named: which one, and why, in one line
        if err.filename is None:
            return _internal_error(args, err)
        print(f"error: {err.filename}: {err.strerror or err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"scalelab {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - no traceback reaches a user: one line, the traceback kept in a file
        return _internal_error(args, err)


def _internal_error(args, err: BaseException) -> int:
    """A failure no check foresaw: one line naming it and the file that keeps its traceback (for a bug report)."""
    import tempfile
    import traceback

    with tempfile.NamedTemporaryFile("w", prefix="scalelab-error-", suffix=".txt", delete=False) as kept:
        kept.write(f"scalelab {' '.join(sys.argv[1:])}\n" + "".join(traceback.format_exception(err)))
    print(f"error: scalelab {args.command} failed: {type(err).__name__}: {' '.join(str(err).split())[:300]} "
          f"(a bug: its traceback is in {kept.name})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
