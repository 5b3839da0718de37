"""The workflow through a real 2-node SLURM cluster on this machine (scalelab.harness.vcluster:
network namespaces n1 and n2, Debian's Slurm 22.05 and munge), end to end.

World size 1 takes the single-node path (the launcher starts the ranks inside the plugin's
job step); world size 2, with cluster.ranks_per_node=1, takes the multi-node path: srun
starts one torchrun launcher on each node, static rendezvous on n1. Both ways a site
configures Slurm are run: slurm.conf at the default path, and named only by SLURM_CONF (which
the executor plugin's job step removes: scalelab.plan.placement.carry_slurm_conf).
"""
import os
import subprocess

from scalelab.harness.testing import SLURM_PLUGIN_DIR
from support import BIN, REPO, SNAKEMAKE


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
