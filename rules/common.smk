# Helpers shared by the rules: paths, the sweep table, the device plan. No rules here.
import sys
from pathlib import Path

import pandas as pd
from snakemake.utils import Paramspace

from scalelab.config import dataset_config, launch_plan
from scalelab.data import DataError, source_files
from scalelab.placement import sweep_device_plan, train_job_resources
from scalelab.sweep import SWEEP_AXES, RunPoint, sweep_plan

RESULTS = Path(config["results_dir"])
DATASET = config["dataset"]["name"]
DATA_DIR = RESULTS / "data" / DATASET
LOGS = RESULTS / "logs"


def dataset_inputs(wildcards):
    """Every file the data step reads (scalelab.data.source_files: a folder's non-hidden files,
    sorted), not the folder: editing, adding or removing one re-prepares the data and reruns
    what depends on it. An unusable corpus is left to the data step, which names the problem."""
    try:
        return [str(f) for f in source_files(dataset_config(config))]
    except DataError:
        return [config["dataset"]["path"]]


# The sweep, defined once: every run path and run id derives from this table. Values are
# the strings paths use (micro_batch~auto, activation_checkpointing~false, bucket_mb~25).
_POINTS, _LEFT_OUT = sweep_plan(config)
SWEEP = Paramspace(pd.DataFrame([p.path_values() for p in _POINTS], columns=SWEEP_AXES), filename_params=[])
RUN_DIRS = [RESULTS / "runs" / instance for instance in SWEEP.instance_patterns]
# Lever combinations that do not apply are not run; say so once, with the reason.
for _reason in sorted({reason for _, reason in _LEFT_OUT}):
    _ids = [p.run_id for p, r in _LEFT_OUT if r == _reason]
    print(f"scalelab: {len(_ids)} sweep point(s) left out ({', '.join(_ids[:4])}{', ...' if len(_ids) > 4 else ''}): {_reason}", file=sys.stderr)


def point_from_wildcards(wildcards) -> RunPoint:
    return RunPoint.from_path_values(dict(wildcards.items()))


# Training settings a run's results depend on (its params: changing one reruns the run).
# Time limits and checkpoint frequency are left out: they must not retrain a finished sweep.
TRAIN_RESULT_KEYS = {
    k: v for k, v in config["train"].items() if k not in ("run_timeout_s", "collective_timeout_s", "checkpoint_every")
}

# Cluster facts come from config (section `cluster`), never from code.
CLUSTER = config["cluster"]
# The device every run trains on, decided once by the planning process (jobs on other
# machines inherit it): a run never trains on a device it was not planned for.
DEVICE_PLAN, _INHERITED = sweep_device_plan(config)
if not _INHERITED:
    print(f"scalelab: runs train on {DEVICE_PLAN.device} ({DEVICE_PLAN.why})", file=sys.stderr)


def train_resources(wildcards) -> dict:
    """The scheduler's view of one run: nodes, GPUs per node, memory, exclusivity."""
    # Evaluated per job, once Snakemake knows its executor: only a local (workstation)
    # execution limits GPU runs to one at a time (profiles/default's gpu_run=1).
    return train_job_resources(plan_for(wildcards), DEVICE_PLAN.device, CLUSTER, local=workflow.local_exec)


def _world_size_regex(sizes) -> str:
    """A wildcard constraint matching exactly these world sizes (or nothing)."""
    return "|".join(str(w) for w in sorted(sizes)) or "(?!)"


_WORLD_SIZES = sorted({p.world_size for p in _POINTS})
SINGLE_LAUNCHER_WORLD_SIZES = _world_size_regex(w for w in _WORLD_SIZES if not launch_plan(config, w).multi_launcher)
MULTI_LAUNCHER_WORLD_SIZES = _world_size_regex(w for w in _WORLD_SIZES if launch_plan(config, w).multi_launcher)


def plan_for(wildcards):
    return launch_plan(config, int(wildcards.world_size))


def run_minutes(wildcards, attempt):
    """SLURM time limit: the run's own limit plus start-up margin, growing with each retry."""
    return attempt * (int(config["train"]["run_timeout_s"] // 60) + 5)
