# scalelab: reproducible scaling experiments (precision x ZeRO stage x world size).
# Table of contents only: helpers live in rules/common.smk, one stage per rules/*.smk.
from pathlib import Path

from snakemake.logging import logger
from snakemake.utils import min_version

from scalelab.config import ConfigError, ConfigProblems
from scalelab.config.reading import check_yaml_syntax
from scalelab.plan.validation import validate_config, validation_message

min_version("9.14.8")

# A malformed config file, or one giving a key twice, is named with its line and column
# (Snakemake's parser names neither and keeps the last value). Snakemake reads --configfile
# files itself before this file runs: one that is not YAML at all stops there, with
# Snakemake's message ("Config file is not valid JSON or YAML"), located by the scalelab logger
# plugin (profiles/default); one that parses reaches this loop, and a duplicated key in it is named here.
# Every file is read before any is reported: all their problems at once.
CONFIG_FILES = ["config.yaml", *workflow.overwrite_configfiles]  # merged in this order: the last that sets a key wins
_syntax_errors = []
for _config_file in CONFIG_FILES:
    try:
        check_yaml_syntax(_config_file)
    except ConfigError as err:
        _syntax_errors.append(err)
if _syntax_errors:
    raise WorkflowError(validation_message(ConfigProblems([str(err) for err in _syntax_errors]))) from None


configfile: "config.yaml"


# The one validation path (scalelab.plan.validation.validate_config): schema with defaults, then the
# cross-field rules. Bad values stop the workflow here, before any job: every problem at once, one
# line each, naming the file and line that set the key (Snakemake merged the files into `config`, so
# they are read again to find them), the key and the value.
try:
    validate_config(config, base_dir=Path.cwd(), files=CONFIG_FILES)  # paths are relative to the working directory
except ConfigError as err:
    raise WorkflowError(validation_message(err)) from None


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/bench.smk"
include: "rules/collect.smk"
include: "rules/report.smk"


# The chain ends at the report; with run files present, rebuilding it trains nothing.
rule all:
    input:
        RESULTS / "report" / "report.html",


# One writer per results folder (scalelab.results.lock, <results_dir>/.scalelab.lock): taken by the
# process that runs the jobs, once it has jobs to run (onstart: never -n, --lint, --report or
# --unlock), released when it ends; jobs spawned elsewhere (SLURM) have no hooks and never take it.
import os
import sys
import time

from scalelab.results.lock import LockHeld, results_lock

_INVOKED = time.time()  # SLURM job logs older than this belong to an earlier invocation
_PREFORK = {}  # the prefork server this invocation started, if any: stopped when it ends


onstart:
    if not (workflow.remote_exec or workflow.subprocess_exec):
        try:
            _note = results_lock(RESULTS).acquire()
        except LockHeld as err:
            raise WorkflowError(f"scalelab: {err}") from None
        if _note:  # through Snakemake's logger: a print here races its logging thread (see onerror)
            logger.warning(_note)
        # The command line that selects this sweep (config files, --config, profile, cores), for
        # every hint that says how to rerun it (scalelab.results.invocation): a bare `snakemake` would run
        # the default config into another folder.
        from scalelab.results.invocation import record

        if not workflow.touch:  # scalelab resume's --touch of finished runs (--cores 1) is not the sweep's command
            record(RESULTS, sys.argv[1:], workflow.overwrite_configfiles, cwd=Path.cwd(), snakefile=workflow.main_snakefile)
        # planning.top_k's decision (rules/common.smk), for the jobs to read: written here, under the lock, by the
        # process that runs them (never by a dry run, nor by a second invocation the lock turns away)
        from scalelab.plan import forecast_record

        if DECISIONS:
            forecast_record.write(RESULTS, DECISIONS)
        else:  # no top_k this time: collection must not give new runs an earlier invocation's forecast
            forecast_record.forget(RESULTS)
        # A CPU sweep's peak FLOP/s is measured once per results folder, by its first training job,
        # on the idle machine (scalelab.run.calibration): a resumed or extended sweep keeps it, so every
        # run's MFU is on one scale. Delete <results>/calibration/cpu.json to measure again.
        # The CPU runs' ranks are forked from one process that imports torch once, on the first
        # run's request (scalelab.run.prefork): ~2 s less start-up per run. One inherited from
        # the caller (a test session) serves as well; a cluster's jobs run on other hosts, which
        # have no server, and start their ranks as new processes.
        from scalelab.run.prefork import PREFORK_ENV, start_server

        if not workflow.local_exec:
            os.environ.pop(PREFORK_ENV, None)
        elif not os.environ.get(PREFORK_ENV):
            _PREFORK["server"] = start_server(owner_dir=RESULTS)


# One handler per event (Snakemake keeps the last one defined): the sweep's end, then the lock.
onsuccess:
    from scalelab.report.tables import sweep_end_text

    if (_text := sweep_end_text(RESULTS)) is not None:  # best configuration per world size, the report's path
        logger.info(_text)  # after Snakemake's closing progress line, never inside it (see onerror)
    from scalelab.run.prefork import stop_server

    stop_server(_PREFORK.get("server"))
    results_lock(RESULTS).release()


onerror:
    from scalelab.run.prefork import stop_server

    stop_server(_PREFORK.get("server"))
    results_lock(RESULTS).release()
    from scalelab.plan.placement import slurm_log_errors

    # A SLURM job that failed before scalelab ran has no run log; SLURM's error is in its job log.
    _slurm_logs = getattr(workflow.executor_settings, "logdir", None) or ".snakemake/slurm_logs"
    # Through Snakemake's logger, not print: its lines are written by a logging thread, and a print
    # here landed inside its last line ("Look above for error messagesscalelab: ...").
    for _line in slurm_log_errors(_slurm_logs, since=_INVOKED):
        logger.error(f"scalelab: SLURM job log {_line}")

    # After Snakemake's own error lines (the failing rule, its log): what went wrong per run and how to rerun
    # it, or, when no run failed (Ctrl-C), how to go on.
    from scalelab.results.status import stopped_lines

    logger.error("\n".join(stopped_lines(RESULTS)))
