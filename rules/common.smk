# Helpers shared by the rules: checked config, paths, the sweep table. No rules here.
import sys
from pathlib import Path

import pandas as pd
from snakemake.utils import Paramspace

from scalelab.config import SWEEP_AXES, ConfigError, RunPoint, check_config, sweep_points

# Schema checks ran in the Snakefile; these are the cross-field rules. A bad value stops
# the workflow here, before any job is scheduled, with the key and value named.
try:
    check_config(config, base_dir=Path.cwd())  # paths in config are relative to the working directory
except ConfigError as err:
    raise WorkflowError(f"invalid config: {err}") from None

RESULTS = Path(config["results_dir"])
DATASET = config["dataset"]["name"]
DATA_DIR = RESULTS / "data" / DATASET
LOGS = RESULTS / "logs"


def dataset_inputs(wildcards):
    """The user's corpus is an input, so editing it re-prepares the data."""
    path = config["dataset"]["path"]
    return [path] if path else []


# The sweep, defined once: every run path and run id derives from this table.
SWEEP = Paramspace(
    pd.DataFrame([[getattr(p, axis) for axis in SWEEP_AXES] for p in sweep_points(config)], columns=SWEEP_AXES),
    filename_params=[],
)
RUN_DIRS = [RESULTS / "runs" / instance for instance in SWEEP.instance_patterns]


def point_from_wildcards(wildcards) -> RunPoint:
    return RunPoint(wildcards.precision, int(wildcards.zero_stage), int(wildcards.world_size))
