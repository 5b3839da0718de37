"""Snakemake adapter: one training run (scalelab.run.launch.launch_run) on the plan the rules made for it
(rules/common.smk). Exits 0 whatever the run's status; the status and reason are in summary.json."""
import signal
import sys
from pathlib import Path

from scalelab.forecast.pruning import top_k
from scalelab.planning.forecast_record import PRUNED_REASON
from scalelab.planning.forecast_record import read as read_forecast
from scalelab.results.status import record_trained_with
from scalelab.run.calibration import calibration_path
from scalelab.run.launch import launch_run
from scalelab.run.prefork import die_with_parent
from scalelab.run.sweep_calibration import ensure_calibration

# A killed Snakemake takes its training job with it (SIGTERM when the parent dies), and SIGTERM
# unwinds the launcher, whose clean-up stops the ranks: nothing trains on into a folder that the
# next invocation (scalelab resume) reruns. Ctrl-C (SIGINT to the terminal's process group) unwinds it the
# same way, without a KeyboardInterrupt traceback per job on the user's screen.
die_with_parent()
for _signal in (signal.SIGTERM, signal.SIGINT):
    signal.signal(_signal, lambda signum, frame: sys.exit(128 + signum))

results_dir = Path(snakemake.output.summary).parents[2]  # <results>/runs/<run id>/summary.json
record_trained_with(Path(snakemake.output.summary).parent, snakemake.params.results_depend_on)
plan = snakemake.params.plan
# planning.top_k: the planning process's forecast of this point (a record left by an earlier sweep with top_k is
# not this one's), and whether it pruned it (its params say)
decision = read_forecast(results_dir).get(plan.point.run_id) if top_k(snakemake.config) is not None else None
pruned = None
if snakemake.params.results_depend_on.get("pruned_by_forecast"):
    pruned = decision.reason if decision and decision.reason else f"{PRUNED_REASON} (planning.top_k)"
calibration = None
if plan.device == "cpu" and pruned is None:  # a CPU sweep's peak FLOP/s: measured by the invocation's first run, before it starts
    calibration = ensure_calibration(calibration_path(results_dir), snakemake.config["cluster"]["cpus_per_rank"])

launch_run(
    snakemake.config,
    plan,
    data_dir=Path(snakemake.input.meta).parent,
    run_dir=Path(snakemake.output.summary).parent,
    log_path=snakemake.log[0],
    threads=snakemake.threads,
    repo_dir=snakemake.scriptdir,
    calibration=calibration,
    forecast=decision.forecast if decision else None,
    pruned=pruned,
)
