"""What the SLURM tests share (tests/cluster and tests/workflow): why a virtual cluster cannot run here."""
from scalelab.harness.testing import SLURM_PLUGIN_DIR
from scalelab.harness.vcluster import unavailable


def cluster_unavailable() -> str | None:
    """Why the virtual SLURM cluster cannot run here (no root, no Slurm, no plugin), or None."""
    if reason := unavailable():
        return reason
    if not (SLURM_PLUGIN_DIR / "snakemake_executor_plugin_slurm").is_dir():
        return f"the SLURM executor plugin is not in {SLURM_PLUGIN_DIR} (`make setup` puts it there)"
    return None
