"""What the SLURM tests share (tests/cluster and tests/workflow): why a virtual cluster cannot run here,
and the PYTHONPATH their Snakemake runs the SLURM executor plugin with."""
import os
from pathlib import Path

from devtools.vcluster import unavailable
from scalelab.harness.testing import SLURM_PLUGIN_DIR

POLL_CAP_DIR = Path(__file__).parent / "slurm_poll"
"""Its sitecustomize.py caps the plugin's wait between status checks (tests/workflow/test_slurm.py holds it)."""
PLUGIN_PYTHONPATH = os.pathsep.join(map(str, (POLL_CAP_DIR, SLURM_PLUGIN_DIR)))


def cluster_unavailable() -> str | None:
    """Why the virtual SLURM cluster cannot run here (no root, no Slurm, no plugin), or None."""
    if reason := unavailable():
        return reason
    if not (SLURM_PLUGIN_DIR / "snakemake_executor_plugin_slurm").is_dir():
        return f"the SLURM executor plugin is not in {SLURM_PLUGIN_DIR} (`make setup` puts it there)"
    return None
