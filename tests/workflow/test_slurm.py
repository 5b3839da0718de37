"""The SLURM profile without a cluster: a dry run plans the default sweep with each job's resources
(the workflow through a real 2-node cluster: tests/cluster/test_slurm.py)."""
import os
import subprocess
import sys

import pytest

from scalelab.harness.testing import SLURM_PLUGIN_DIR
from support import BIN, REPO, SNAKEMAKE
from support.slurm import PLUGIN_PYTHONPATH, cluster_unavailable

needs_cluster = pytest.mark.skipif(cluster_unavailable() is not None, reason=f"no virtual SLURM cluster: {cluster_unavailable()}")


@pytest.mark.skipif(not SLURM_PLUGIN_DIR.is_dir(), reason="the SLURM executor plugin is not installed (make setup)")
def test_the_suites_poll_cap_shortens_only_the_plugins_wait_between_status_checks():
    """tests/support/slurm_poll: with its folder on PYTHONPATH, the plugin's Executor caps every wait it
    sets (the plugin adds 10 s after each check that finds no job done) at POLL_CAP_S; a shorter wait
    (its initial one) is kept as set."""
    probe = ("import snakemake_executor_plugin_slurm as p\n"
             "e = p.Executor.__new__(p.Executor)\n"
             "e.next_seconds_between_status_checks = 41\n"
             "capped = e.next_seconds_between_status_checks\n"
             "e.next_seconds_between_status_checks = 1\n"
             "print(capped, e.next_seconds_between_status_checks)")
    env = {**os.environ, "PYTHONPATH": PLUGIN_PYTHONPATH}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["2", "1"], out.stdout


@needs_cluster
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
