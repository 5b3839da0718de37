"""The SLURM profile without a cluster: a dry run plans the default sweep with each job's resources
(the workflow through a real 2-node cluster: tests/cluster/test_slurm.py)."""
import os
import subprocess

import pytest

from scalelab.harness.testing import SLURM_PLUGIN_DIR
from support import BIN, REPO, SNAKEMAKE
from support.slurm import cluster_unavailable

pytestmark = [pytest.mark.skipif(cluster_unavailable() is not None, reason=f"no virtual SLURM cluster: {cluster_unavailable()}")]


def test_slurm_profile_dry_run_plans_the_default_sweep_with_resources(tmp_path):
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    proc = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
                           "--profile", str(REPO / "workflow/profiles/slurm"), "-n"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                                                          "PYTHONPATH": str(SLURM_PLUGIN_DIR)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # 24 points and the baseline's four repeats at each world size (repeats.baseline: 5)
    assert out.count("rule train:") == 24 + 2 * 4 and "slurm_partition=gpu" in out and "runtime=" in out
