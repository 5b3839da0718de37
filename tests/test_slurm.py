"""The workflow through a real one-node SLURM cluster (Debian's Slurm 22.05), end to end.

World size 1 takes the single-node path (torchrun --standalone inside the plugin's step);
world size 2, with cluster.ranks_per_node=1 and launchers_per_node=2, takes the multi-node
path (srun starting two torchrun launchers, static rendezvous) as two tasks on this node.
"""
import os
import subprocess
import time

import numpy as np
import pandas as pd
import pytest

from conftest import BIN, REPO, SNAKEMAKE, snakemake, tiny_config, write_workdir
from scalelab.harness.testing import SLURM_PLUGIN_DIR
from scalelab.sweep import RunPoint
from slurm_cluster import SlurmCluster, slurm_available

pytestmark = [pytest.mark.skipif(slurm_available() is not None, reason=f"no SLURM test cluster: {slurm_available()}")]

SLURM_DAEMONS = ("slurmctld", "slurmd", "slurmstepd")


def _pids(names) -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid=,comm="], capture_output=True, text=True).stdout.split("\n")
    return {int(line.split()[0]) for line in out if line.strip() and line.split()[1] in names}


@pytest.fixture
def cluster(tmp_path):
    before = _pids(SLURM_DAEMONS)
    c = SlurmCluster(tmp_path / "slurm").start()
    yield c
    c.stop()
    time.sleep(1)
    leftover = _pids(SLURM_DAEMONS) - before
    assert not leftover, f"SLURM processes left behind: {leftover}"


@pytest.mark.cluster
def test_workflow_through_slurm_matches_a_local_run(tmp_path, cluster):
    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [0, 3], "world_size": [1, 2]},
                      cluster={"ranks_per_node": 1, "launchers_per_node": 2, "cpus_per_rank": 1, "mem_mb_per_rank": 1000})
    on_slurm = write_workdir(tmp_path / "slurm_run", cfg)
    env = {**cluster.env, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(SLURM_PLUGIN_DIR)}
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(on_slurm), "--profile", str(REPO / "workflow/profiles/slurm"),
           "--slurm-no-account", "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2", "--slurm-keep-successful-logs",
           "--default-resources", "slurm_partition=test", "runtime=10", "mem_mb=1000", "--latency-wait", "10"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:] + cluster.logs()

    # Every job went through sbatch: data, 4 runs, collect, report.
    log_root = on_slurm / ".snakemake/slurm_logs"
    slurm_logs = sorted(log_root.rglob("*.log"))
    assert {p.relative_to(log_root).parts[0] for p in slurm_logs} == {"rule_prepare_data", "rule_train", "rule_train_multinode",
                                                   "rule_collect", "rule_report"}
    assert cluster.jobs_submitted() >= 7

    runs = pd.read_parquet(on_slurm / "results/metrics.parquet").set_index("run_id").sort_index()
    assert (runs["status"] == "ok").all(), runs[["status", "reason"]]
    multi = pd.Series({r: runs.loc[r, "world_size"] == 2 for r in runs.index})
    log2 = (on_slurm / "results/logs/runs" / f"{RunPoint('fp32', 3, 2).path}.log").read_text()
    assert "$ srun --ntasks=2" in log2 and "--nnodes=2" in log2, "world size 2 must take the multi-node path"
    assert multi.sum() == 2

    # The same sweep run locally gives the same identity rows and the same fp32 losses.
    local = write_workdir(tmp_path / "local_run", cfg)
    snakemake(local, "--cores", "2")
    local_runs = pd.read_parquet(local / "results/metrics.parquet").set_index("run_id").sort_index()
    identity = ["precision", "zero_stage", "world_size", "status", "n_params", "steps"]
    pd.testing.assert_frame_equal(runs[identity], local_runs[identity])
    slurm_steps = pd.read_parquet(on_slurm / "results/steps.parquet").sort_values(["run_id", "step"])
    local_steps = pd.read_parquet(local / "results/steps.parquet").sort_values(["run_id", "step"])
    np.testing.assert_allclose(slurm_steps["loss"].to_numpy(), local_steps["loss"].to_numpy(), rtol=1e-5)


@pytest.mark.workflow
def test_slurm_profile_dry_run_plans_the_default_sweep_with_resources(tmp_path):
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    proc = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
                           "--profile", str(REPO / "workflow/profiles/slurm"), "-n"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                                                          "PYTHONPATH": str(SLURM_PLUGIN_DIR)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # 24 points and the baseline's two repeats at each world size (repeats.baseline: 3)
    assert out.count("rule train:") == 24 + 2 * 2 and "slurm_partition=gpu" in out and "runtime=" in out
