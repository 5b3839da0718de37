# The workflow's start and end hooks (included by the Snakefile after the rules: they read RESULTS and the
# forecast's DECISIONS from rules/common.smk). One handler per event: Snakemake keeps the last one defined.
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
        from scalelab.planning import forecast_record

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
    from scalelab.planning.placement import slurm_log_errors

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
