"""The `scalelab` command line."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _collect(args) -> int:
    from scalelab.analysis.metrics import collect

    result = collect(args.results_dir)
    for problem in result["problems"]:
        print(f"warning: {problem}", file=sys.stderr)
    print(f"collected {result['runs']} runs, {result['steps']} steps into {args.results_dir}/metrics.parquet and steps.parquet")
    return 0


def _report(args) -> int:
    from scalelab.analysis.metrics import collect
    from scalelab.analysis.report import build_report

    results = Path(args.results_dir)
    if not results.is_dir():
        print(f"error: results folder {results} does not exist", file=sys.stderr)
        return 2
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
    `configfile:` + `--configfile`; a file that is not YAML is named with line and column
    (Snakemake reads --configfile files before the Snakefile and names neither)."""
    from snakemake.utils import update_config

    from scalelab.config import ConfigError, read_yaml, validate_config
    from scalelab.sweep import sweep_plan

    config: dict = {}
    try:
        for path in args.files:
            content = read_yaml(path)
            if not isinstance(content, dict | None):
                raise ConfigError(f"{path}: a config file holds keys at top level, got {type(content).__name__}")
            update_config(config, content or {})
        validate_config(config, base_dir=Path.cwd())
        points, left_out = sweep_plan(config)
    except ConfigError as err:
        print(f"invalid config: {err}", file=sys.stderr)
        return 2
    print(f"config ok: {' + '.join(args.files)}, {len(points)} run(s), {len(left_out)} combination(s) left out")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scalelab", description="Reproducible scaling experiments: tables, reports, estimates.")
    sub = parser.add_subparsers(dest="command", required=True)
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
    from scalelab.analysis.estimate import add_parser as add_estimate

    add_estimate(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
