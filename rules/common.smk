# Helpers shared by the rules: paths, the sweep table, the device plan. No rules here.
import re
import sys
from pathlib import Path

from scalelab.config import ConfigError, dataset_config
from scalelab.forecast.pruning import decide as decide_forecast, top_k
from scalelab.forecast.pruning import summary_line as forecast_summary
from scalelab.planning.forecast_record import read as read_forecast, stamp as forecast_stamp
from scalelab.run.data import DataError, source_files
from scalelab.planning.placement import carry_slurm_conf, sweep_device_plan, train_job_resources
from scalelab.planning.run_plan import result_params, run_plan
from scalelab.results.migrate import OldLayout, check_layout
from scalelab.run.calibration import calibration_path, read_calibration
from scalelab.run.sweep_calibration import ensure_calibration
from scalelab.results.status import check_trained_with, measured_ok
from scalelab.planning.sweep import RunPoint, data_result_params, sweep_plan

RESULTS = Path(config["results_dir"])
DATASET = config["dataset"]["name"]
DATA_DIR = RESULTS / "data" / DATASET
LOGS = RESULTS / "logs"


def dataset_inputs(wildcards):
    """Every file the data step reads (scalelab.run.data.source_files: a folder's non-hidden files,
    sorted), not the folder: editing, adding or removing one re-prepares the data and reruns
    what depends on it. An unusable corpus is left to the data step, which names the problem."""
    try:
        files = source_files(dataset_config(config))
    except DataError:
        return [config["dataset"]["path"]]
    _mark_data_stale_if_sources_changed(files)
    return [str(f) for f in files]


_SOURCES_CHECKED = []


def _mark_data_stale_if_sources_changed(files):
    """A source whose bytes differ from what the data was prepared from marks the data stale,
    whatever its time says (a copy of another version with an older mtime: rsync -a, cp -p),
    so Snakemake re-prepares it as it does after an edit. Once per planning: Snakemake may call
    an input function more than once, and a changed file is hashed (scalelab.run.data.changed_sources)."""
    from scalelab.run.data import changed_sources, mark_stale

    if _SOURCES_CHECKED:
        return
    _SOURCES_CHECKED.append(True)
    if changes := changed_sources(files, DATA_DIR):
        print(f"scalelab: the corpus changed since {DATA_DIR} was prepared; it will be prepared again:\n  "
              + "\n  ".join(changes), file=sys.stderr)
        try:
            mark_stale(DATA_DIR)
        except OSError as err:  # a read-only results folder: never train on the old tokens silently
            raise WorkflowError(f"scalelab: cannot mark {DATA_DIR} stale ({err}); prepare it again with "
                                "snakemake --forcerun prepare_data") from None


# The sweep, defined once: every run folder, run id and job derives from this table. A run's
# folder is <results>/runs/<run id>/ (scalelab.planning.sweep): the train rules are keyed by the run id
# and look its point up here.
_POINTS, _LEFT_OUT = sweep_plan(config)
POINTS = {p.run_id: p for p in _POINTS}
RUN_DIRS = [RESULTS / "runs" / run_id for run_id in POINTS]
# Lever combinations that do not apply are not run; say so once, with the reason.
for _reason in sorted({reason for _, reason in _LEFT_OUT}):
    _ids = [p.run_id for p, r in _LEFT_OUT if r == _reason]
    print(f"scalelab: {len(_ids)} sweep point(s) left out ({', '.join(_ids[:4])}{', ...' if len(_ids) > 4 else ''}): {_reason}", file=sys.stderr)

# Run folders of an earlier layout (one level per axis) would be invisible here, and the sweep
# would train every run again beside them: stop before any job, saying how to move them.
try:
    check_layout(RESULTS)
except OldLayout as err:
    raise WorkflowError(f"scalelab: {err}") from None


def point_of(wildcards) -> RunPoint:
    return POINTS[wildcards.run_id]


def plan_of(wildcards):
    """The run's plan (scalelab.planning.run_plan): its micro-batch, launch plan, device and comm dtypes."""
    return PLANS[wildcards.run_id]


def run_params(wildcards) -> dict:
    """What a run's results depend on beyond its point (scalelab.planning.run_plan.result_params): the values
    that differ from the defaults, so a new config key at its default reruns nothing. With --touch
    (scalelab resume recording a finished run's provenance) only if the run trained with these."""
    params = result_params(config, plan_of(wildcards))
    if wildcards.run_id in PRUNED:  # recorded skipped by the forecast: selected later, it trains
        # a new k or rank records the point anew (a local job, no training)
        params["pruned_by_forecast"] = {"top_k": top_k(config), "rank": DECISIONS[wildcards.run_id].rank}
    if workflow.touch:
        try:
            check_trained_with(RESULTS / "runs" / wildcards.run_id, params)
        except ValueError as err:
            raise WorkflowError(f"scalelab: {err}") from None
    return params


# Cluster facts come from config (section `cluster`), never from code.
CLUSTER = config["cluster"]
# The device every run trains on, decided once by the planning process (jobs on other
# machines inherit it): a run never trains on a device it was not planned for.
DEVICE_PLAN, _INHERITED = sweep_device_plan(config)
if not _INHERITED:
    print(f"scalelab: runs train on {DEVICE_PLAN.device} ({DEVICE_PLAN.why})", file=sys.stderr)
# Each run's plan, made once here (scalelab.planning.run_plan): what the rules size its job with, what its
# results depend on, and what the job runs (the train rule's params.plan). The job's launcher adds only what
# it knows (the data's vocabulary, the run folder, its threads) and checks that the planned device is there
# (scalelab.run.launch).
PLANS = {run_id: run_plan(config, point, device=DEVICE_PLAN.device, device_reason=DEVICE_PLAN.why)
         for run_id, point in POINTS.items()}
# An upgrade in place must not retrain finished runs silently: values a run depends on that changed since it
# trained, and that the user's own config does not set (a new release's defaults), stop the workflow here,
# naming the runs and how to keep them (scalelab.results.retrain_guard). Planning processes only.
if not (workflow.remote_exec or workflow.subprocess_exec or workflow.touch) and not config["planning"]["retrain_changed_defaults"]:
    from scalelab.config.reading import read_yaml
    from scalelab.results import retrain_guard

    _own = [dict(workflow.config_settings.overwrite_config)]
    if Path("config.yaml").resolve() != (Path(workflow.basedir) / "config.yaml").resolve():
        _own.append(read_yaml("config.yaml") or {})  # the working directory's own config.yaml, not the shipped one
    _changed = retrain_guard.changed_defaults(
        RESULTS, {run_id: result_params(config, plan) for run_id, plan in PLANS.items()}, retrain_guard.user_keys(_own))
    if _changed:
        raise WorkflowError(retrain_guard.refusal(_changed))
# planning.top_k: the forecast ranks every point before any job starts (scalelab.forecast.pruning). The
# planning process decides; the process that runs the jobs records the decision in onstart, under the
# results folder's lock (<results>/plan/forecast.json, removed there without top_k); the jobs, which parse
# this file again, and collection (runs measured before top_k: scalelab.planning.forecast_record) read it.
if top_k(config) is None:
    DECISIONS = {}
elif workflow.remote_exec or workflow.subprocess_exec:
    DECISIONS = read_forecast(RESULTS)
else:
    _calibration = None
    if DEVICE_PLAN.device == "cpu":  # the CPU's peak: the results folder's one calibration, measured now where it has none
        import subprocess

        try:
            _calibration = read_calibration(ensure_calibration(calibration_path(RESULTS), int(CLUSTER["cpus_per_rank"])))
        except subprocess.TimeoutExpired:
            _calibration = None  # decide() says the forecast needs it
    try:
        DECISIONS = decide_forecast(config, PLANS, _calibration, measured_ok(RESULTS, PLANS))
    except ConfigError as err:
        raise WorkflowError(f"scalelab: {err}") from None
    print(forecast_summary(DECISIONS, top_k(config)), file=sys.stderr)
PRUNED = {run_id for run_id, decision in DECISIONS.items() if decision.pruned}
FORECAST_STAMP = forecast_stamp(DECISIONS)  # a param of collect (rules/collect.smk)
# A slurm.conf named only by SLURM_CONF reaches every srun of the sweep's jobs, though the SLURM
# plugin's job step removes SLURM_* (scalelab.planning.placement.carry_slurm_conf).
carry_slurm_conf()


def train_resources(wildcards) -> dict:
    """The scheduler's view of one run: nodes, GPUs per node, memory, exclusivity."""
    # Evaluated per job, once Snakemake knows its executor: only a local (workstation)
    # execution runs training one run at a time (profiles/default's train_slot=1).
    return train_job_resources(plan_of(wildcards).launch, DEVICE_PLAN.device, CLUSTER, local=workflow.local_exec,
                               grouped=RUNS_PER_JOB > 1)


# SLURM: one-node runs of one world size (the same resources) packed cluster.runs_per_job to a
# submission with Snakemake's job groups: a group id per world size, whose number of components
# is set when Snakemake first asks a job for its group (the command line's group settings replace
# the workflow's after the Snakefile is read), unless --group-components names it. Locally
# Snakemake ignores groups.
RUNS_PER_JOB = int(CLUSTER.get("runs_per_job", 1))
if RUNS_PER_JOB > 1 and "train_slot" not in workflow.global_resources:
    # the pool a group job's runs share one at a time, in every Snakemake of the chain (the planning one has
    # profiles/default's; the group job's and the one its job step runs parse this file without it)
    workflow.register_resource("train_slot", 1)


def train_group(wildcards):
    point = point_of(wildcards)
    if plan_of(wildcards).launch.multi_launcher:
        return None  # a run over several nodes is a job of its own
    group = f"train-w{point.world_size}"
    settings = workflow.group_settings
    if group not in settings.group_components:
        import immutables

        settings.group_components = immutables.Map({**settings.group_components, group: RUNS_PER_JOB})
    # train_slot (1 per grouped run, profiles/default's pool of 1) scoped to each group job: Snakemake then
    # stacks a group's runs in series in one run's allocation (nodes, CPUs, memory of one; the time limits
    # added), and the cluster-wide scheduler does not count it, so groups still run side by side
    workflow.resource_scopes.update({"train_slot": "local"})
    return group


def _run_id_regex(run_ids) -> str:
    """A wildcard constraint matching exactly these run ids (or nothing)."""
    return "|".join(re.escape(r) for r in sorted(run_ids)) or "(?!)"


# Runs that fit one node (train), runs spanning several launchers (train_multinode), and the points the
# forecast pruned (record_pruned: a local job that records them skipped, never a cluster submission).
_MULTI = {run_id: plan.launch.multi_launcher for run_id, plan in PLANS.items() if run_id not in PRUNED}
PRUNED_RUN_IDS = _run_id_regex(PRUNED)
SINGLE_LAUNCHER_RUN_IDS = _run_id_regex(r for r, multi in _MULTI.items() if not multi)
MULTI_LAUNCHER_RUN_IDS = _run_id_regex(r for r, multi in _MULTI.items() if multi)


def run_threads(wildcards) -> int:
    """One core per rank on CPU (capped at --cores by Snakemake)."""
    return point_of(wildcards).world_size * CLUSTER["cpus_per_rank"]


def run_minutes(wildcards, attempt):
    """SLURM time limit: the run's own limit plus start-up margin, growing with each retry."""
    return attempt * (int(config["train"]["run_timeout_s"] // 60) + 5)
