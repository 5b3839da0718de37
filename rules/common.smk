# Helpers shared by the rules: checked config, paths, the sweep table. No rules here.
import sys
from pathlib import Path

from scalelab.config import ConfigError, check_config

# Schema checks ran in the Snakefile; these are the cross-field rules. A bad value stops
# the workflow here, before any job is scheduled, with the key and value named.
try:
    check_config(config, base_dir=workflow.basedir)
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
