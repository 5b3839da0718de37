"""The workflow through a real 2-node SLURM cluster on this machine (devtools.vcluster:
network namespaces n1 and n2, Debian's Slurm 22.05 and munge), end to end.

World size 1 takes the single-node path (the launcher starts the ranks inside the plugin's
job step); world size 2, with cluster.ranks_per_node=1, takes the multi-node path: srun
starts one torchrun launcher on each node, static rendezvous on n1. Both ways a site
configures Slurm are run: slurm.conf at the default path, and named only by SLURM_CONF (which
the executor plugin's job step removes: scalelab.planning.placement.carry_slurm_conf).
"""
import json
import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pandas as pd
import pytest

from devtools.vcluster import VirtualCluster
from scalelab.config import model_config, train_config
from scalelab.harness.reference import bare_loop
from scalelab.planning.placement import slurm_log_errors
from scalelab.planning.sweep import RunPoint
from support import BIN, REPO, SNAKEMAKE, tiny_config, write_workdir
from support.slurm import PLUGIN_PYTHONPATH, cluster_unavailable

pytestmark = [pytest.mark.skipif(cluster_unavailable() is not None, reason=f"no virtual SLURM cluster: {cluster_unavailable()}")]

SWEEP_TIMEOUT_S = 300  # a limit against a hang, not the budget: the 2-node sweep takes 70-90 s here


@pytest.fixture
def clusters():
    """Makes virtual clusters for a test; after it, every one is down and leaves nothing: no
    namespace, process, mount or folder of its own (counted per cluster, so a cluster of
    another test running beside this one is not counted) and no configless cache link."""
    made: list[VirtualCluster] = []
    link_before = os.path.realpath("/run/slurm/conf") if os.path.lexists("/run/slurm/conf") else None

    def make(root, **options) -> VirtualCluster:
        made.append(VirtualCluster(root, **options))
        return made[-1]

    yield make
    for cluster in made:
        cluster.down()
    for cluster in made:
        left = cluster.leftovers()
        assert not any(left.values()), f"left behind by cluster {cluster.name}: {left}"
    link_after = os.path.realpath("/run/slurm/conf") if os.path.lexists("/run/slurm/conf") else None
    assert link_after == link_before, f"/run/slurm/conf changed: {link_before} -> {link_after}"


def _cfg(**sweep):
    return tiny_config(sweep={"precision": ["fp32"], **sweep},
                       train={"steps": 6, "warmup_steps": 1, "run_timeout_s": 90, "collective_timeout_s": 30},
                       cluster={"ranks_per_node": 1, "launchers_per_node": 1, "cpus_per_rank": 1, "mem_mb_per_rank": 1000,
                                "exclusive": False})


def _snakemake_on(cluster: VirtualCluster, workdir, timeout=SWEEP_TIMEOUT_S, snakefile=REPO / "Snakefile",
                  **env) -> subprocess.CompletedProcess:
    cmd = [SNAKEMAKE, "-s", str(snakefile), "-d", str(workdir), "--profile", str(REPO / "workflow/profiles/slurm"),
           "--slurm-no-account", "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
           "--slurm-keep-successful-logs", "--default-resources", "slurm_partition=vc", "runtime=10", "mem_mb=1000",
           "--latency-wait", "5", "--retries", "0"]
    environment = {**cluster.env, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                   "PYTHONPATH": PLUGIN_PYTHONPATH, **env}
    return subprocess.run(cluster.command(cmd), env=environment, capture_output=True, text=True, timeout=timeout)


def _runs(workdir) -> pd.DataFrame:
    return pd.read_parquet(workdir / "results/metrics.parquet").set_index("run_id").sort_index()


def test_virtual_clusters_start_in_seconds_run_side_by_side_and_leave_nothing(tmp_path, clusters):
    host_conf = os.path.exists("/etc/slurm/slurm.conf")
    started = time.monotonic()
    a = clusters(tmp_path / "a", nodes=2, link_mbit=200)
    b = clusters(tmp_path / "b", nodes=3, config_at="env")
    try:
        a.up()
        b.up()
        up_s = time.monotonic() - started
        assert up_s < 20, f"two clusters took {up_s:.1f} s to come up"
        # one node per namespace, each with its own hostname and address
        assert sorted(a.run(["srun", "-N2", "hostname"]).stdout.split()) == ["n1", "n2"]
        assert sorted(b.run(["srun", "-N3", "hostname"]).stdout.split()) == ["n1", "n2", "n3"]
        assert a.run(["srun", "-N2", "-l", "hostname", "-i"]).stdout.split().count("10.77.0.12") == 1
        # no way out: no default route anywhere, and the host namespace has none of the cluster's addresses
        assert "default" not in a.run(["ip", "route"]).stdout
        assert "10.77.0." not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=10).stdout
        # the link limit is on each node's link, both ways
        assert "tbf" in a.run(["tc", "qdisc", "show", "dev", "v1"]).stdout and "rate 200Mbit" in a.run(["tc", "qdisc", "show", "dev", "v1"]).stdout
        node_side = subprocess.run(["tc", "-n", a.node_ns(1), "qdisc", "show", "dev", "eth0"], capture_output=True, text=True, timeout=10)
        assert "tbf" in node_side.stdout and "rate 200Mbit" in node_side.stdout, node_side
        # the config where each was asked for: the default path in a's namespaces, only SLURM_CONF for b
        assert a.run(["test", "-f", "/etc/slurm/slurm.conf"], check=False).returncode == 0
        assert b.run(["test", "-f", "/etc/slurm/slurm.conf"], check=False).returncode != 0
        assert os.path.exists("/etc/slurm/slurm.conf") == host_conf, "the host's /etc/slurm was touched"
        status = a.status()
        assert set(status["daemons"].values()) == {"running"} and len(status["nodes"]) == 2
    finally:
        down_started = time.monotonic()
        a.down()
        b.down()
        down_s = time.monotonic() - down_started
    assert down_s < 20, f"two clusters took {down_s:.1f} s to come down"
    for c in (a, b):
        left = c.leftovers()
        assert not any(left.values()), f"left behind by cluster {c.name}: {left}"


@pytest.mark.cluster(cost_s=150)
def test_a_sweep_spans_two_nodes_with_the_config_at_the_default_path(tmp_path, clusters):
    cfg = _cfg(zero_stage=[0, 3], world_size=[1, 2])
    cfg["cluster"]["runs_per_job"] = 2  # the two one-node runs in one submission (issue #45); a spanning run is its own
    on_slurm = write_workdir(tmp_path / "slurm_run", cfg)
    with clusters(tmp_path / "cluster", nodes=2) as cluster:
        started = time.monotonic()
        proc = _snakemake_on(cluster, on_slurm)
        sweep_s = time.monotonic() - started
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:] + cluster.logs()
        submitted = cluster.jobs_submitted()
    print(f"2-node sweep through SLURM: {sweep_s:.1f} s")
    # every rule runs a script: "Shell command: None" once per job said nothing (issue #41)
    assert "Shell command: None" not in proc.stdout + proc.stderr
    # --slurm-no-account: the plugin's guess of an account (sacct, no accounting storage here) is not printed
    assert "sacct" not in proc.stdout + proc.stderr and "trying to guess" not in proc.stdout + proc.stderr

    # Every job but collection and the report (local rules: seconds of reading and drawing, never queued) went
    # through sbatch: data, the two world-size-1 runs as one group job (cluster.runs_per_job), the two runs
    # spanning nodes one job each.
    log_root = on_slurm / ".snakemake/slurm_logs"
    assert {p.relative_to(log_root).parts[0] for p in log_root.rglob("*.log")} == {
        "rule_prepare_data", "group_train-w1_train", "rule_train_multinode"}
    assert len(list((log_root / "group_train-w1_train").rglob("*.log"))) == 1
    assert submitted == 4, submitted
    assert (on_slurm / "results/report/report.html").exists()

    runs = _runs(on_slurm)
    assert (runs["status"] == "ok").all(), runs[["status", "reason"]]
    spanning = runs[runs["world_size"] == 2]
    # each world-size-2 run: one launcher per node, each rank on its own node
    assert (spanning["launchers"] == 2).all() and (spanning["rank_hostnames"] == "n1,n2").all()
    assert (spanning["node_list"] == "n1,n2").all() and (spanning["nodes_used"] == 2).all()
    assert (runs[runs["world_size"] == 1]["nodes_used"] == 1).all()
    # the grouped runs trained one after another in their one-node allocation, not side by side
    first, second = runs[runs["world_size"] == 1].sort_values("started_utc").to_dict("records")
    started = [pd.Timestamp(r["started_utc"]).timestamp() for r in (first, second)]
    assert first["hostname"] == second["hostname"] and started[1] >= started[0] + first["wall_time_s"] - 1.0
    log2 = (on_slurm / "results/logs/runs" / f"{RunPoint('fp32', 3, 2).path}.log").read_text()
    assert " srun --ntasks=2 --nodes=2 --ntasks-per-node=1" in log2 and "--nnodes=2" in log2 and "--master-addr=n1" in log2
    # communication: what the ranks sent equals the formulas (scalelab.formulas.communication), all of it between
    # the nodes (one rank on each: DDP's all-reduce and ZeRO-3's collectives cross the link)
    np.testing.assert_allclose(spanning["comm_bytes_per_step_measured"], spanning["comm_bytes_per_step_predicted"], rtol=0)
    for link in ("intra_node", "inter_node"):
        np.testing.assert_array_equal(spanning[f"comm_{link}_bytes_per_step_measured"],
                                      spanning[f"comm_{link}_bytes_per_step_predicted"], err_msg=link)
    assert (spanning["comm_intra_node_bytes_per_step_measured"] == 0).all()
    assert (spanning["comm_inter_node_bytes_per_step_measured"] == spanning["comm_bytes_per_step_measured"]).all()

    # Every run, across two nodes or on one, trains as one process on the global batch does (fp32,
    # to 1e-5: the bar tests/*/test_training.py holds every stage and world size on one node to).
    data = on_slurm / "results/data/tiny"
    meta = json.loads((data / "meta.json").read_text())
    reference, _, _ = bare_loop(model_config(cfg, meta["vocab_size"]), train_config(cfg), str(data / "train.bin"), meta["dtype"])
    steps = pd.read_parquet(on_slurm / "results/steps.parquet")
    for run_id, run in steps.groupby("run_id"):
        assert list(run["step"]) == list(range(6)), run_id
        np.testing.assert_allclose(run["loss"].to_numpy(), reference, rtol=1e-5, err_msg=run_id)
    assert set(steps["run_id"]) == set(runs.index)


@pytest.mark.cluster(cost_s=110)
def test_traffic_per_link_across_two_nodes_is_exact_for_zero3_hybrid_and_tensor_parallelism(tmp_path, clusters):
    """World size 4 = 2 nodes x 2 ranks (issue #28): ZeRO-3 sends every byte over the inter-node link;
    hybrid sharding (2 replicas x 2 shards) keeps its gathers and reduce-scatter within a node and sends
    only the all-reduce of each gradient shard between nodes. Tensor parallelism 2 within a node x ZeRO-3
    over 2 data-parallel ranks across (issue #43): its all-reduces within a node, ZeRO-3's collectives
    between nodes. Measured per process group and placed by the ranks' hosts, both links equal the
    formulas exactly, and hybrid's and the split run's fp32 losses equal ZeRO-3's. (DDP across nodes:
    the spanning runs of test_a_sweep_spans_two_nodes_with_the_config_at_the_default_path.) 4 ranks on
    this machine's cores: over-committed on purpose."""
    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [3], "world_size": [4], "replicas": [1, 2],
                             "tensor_parallel": [1, 2]},
                      train={"steps": 4, "warmup_steps": 1, "run_timeout_s": 120, "collective_timeout_s": 60},
                      cluster={"ranks_per_node": 2, "launchers_per_node": 1, "cpus_per_rank": 1, "mem_mb_per_rank": 1000,
                               "exclusive": False},
                      planning={"launch_overcommitted": True})
    work = write_workdir(tmp_path / "work", cfg)
    with clusters(tmp_path / "cluster", nodes=2) as cluster:
        proc = _snakemake_on(cluster, work)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:] + cluster.logs()
    runs = _runs(work)
    assert list(runs.index) == ["fp32-z3-w4", "fp32-z3-w4-hsdp2", "fp32-z3-w4-tp2"], runs
    assert (runs["status"] == "ok").all(), runs[["status", "reason"]]
    assert (runs["rank_hostnames"] == "n1,n1,n2,n2").all() and runs["nodes_share_machine"].all()
    for link in ("intra_node", "inter_node"):
        np.testing.assert_array_equal(runs[f"comm_{link}_bytes_per_step_measured"],
                                      runs[f"comm_{link}_bytes_per_step_predicted"], err_msg=link)
    zero3, hybrid, split = (runs.loc[r] for r in runs.index)
    # tensor parallelism within each node (ranks 0-1 on n1), ZeRO-3 over the data-parallel ranks 0 and 2 across
    assert split["comm_tensor_parallel_link"] == "intra_node"
    assert split["comm_tensor_parallel_bytes_per_step_measured"] == split["comm_tensor_parallel_bytes_per_step_predicted"] > 0
    assert split["comm_intra_node_bytes_per_step_measured"] == 0 < split["comm_inter_node_bytes_per_step_measured"]
    assert zero3["comm_intra_node_bytes_per_step_measured"] == 0
    psi = hybrid["n_params"]
    assert hybrid["comm_inter_node_bytes_per_step_measured"] == 2 * psi * 4 / 2  # 2 Psi/S, S = 2, fp32
    assert hybrid["comm_inter_node_bytes_per_step_measured"] < zero3["comm_inter_node_bytes_per_step_measured"] / 2
    steps = pd.read_parquet(work / "results/steps.parquet").sort_values(["run_id", "step"])
    for run_id in ("fp32-z3-w4-hsdp2", "fp32-z3-w4-tp2"):
        np.testing.assert_allclose(steps[steps["run_id"] == run_id]["loss"].to_numpy(),
                                   steps[steps["run_id"] == "fp32-z3-w4"]["loss"].to_numpy(), rtol=1e-5, err_msg=run_id)


@pytest.mark.cluster(cost_s=150)
def test_a_config_named_only_by_slurm_conf_reaches_every_srun_and_a_killed_rank_fails_the_run(tmp_path, clusters):
    with clusters(tmp_path / "cluster", nodes=2, config_at="env") as cluster:
        assert "SLURM_CONF" in cluster.env

        # Before scalelab: a job step's srun without SLURM_CONF (what the plugin's job step does)
        # cannot reach the controller; the reason is in the job's SLURM log, where it is found.
        logs = tmp_path / "slurm_logs"
        logs.mkdir()
        job = cluster.run(["sbatch", "--parsable", "-N1", "-o", str(logs / "job.log"), "--wrap", "env -u SLURM_CONF srun hostname"])
        _wait_gone(cluster, job.stdout.strip())
        found = slurm_log_errors(logs)
        assert len(found) == 1 and ("Could not establish a configuration source" in found[0]
                                    or "Unable to establish control machine address" in found[0]), found

        # A 2-node sweep, one run on one node and one across both: every job's srun, the plugin's and
        # the launcher's, finds the cluster. Then a rank of the 2-node run is killed on n2 mid-run:
        # the run ends `failed` with the reason, long before its timeout. (One sweep for both: each
        # Snakemake invocation on the cluster costs ~45 s here, most of it the plugin's status polls.)
        killed = write_workdir(tmp_path / "env_run", _cfg(zero_stage=[0], world_size=[1, 2]))
        started = time.monotonic()
        result = {}

        def run_sweep():
            result["proc"] = _snakemake_on(cluster, killed, SCALELAB_FAULT="hang@step=3,rank=1")

        thread = threading.Thread(target=run_sweep)
        thread.start()
        victim = _wait_for_rank(cluster, node=2, run_id=RunPoint("fp32", 0, 2).run_id, timeout_s=120)
        os.kill(victim, 9)
        killed_at = time.time()
        thread.join(SWEEP_TIMEOUT_S)
        assert not thread.is_alive(), "the sweep with a killed rank did not end"
        proc = result["proc"]
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:] + cluster.logs()
    runs = _runs(killed)
    assert runs.loc[RunPoint("fp32", 0, 1).run_id, "status"] == "ok", runs[["status", "reason"]]
    # the 2-node run's launchers were started by an srun that was handed SLURM_CONF, one per node (its
    # rank 1 was found, and killed, on n2; a failed run's row keeps no node list: worker columns)
    log2 = (killed / "results/logs/runs" / f"{RunPoint('fp32', 0, 2).path}.log").read_text()
    assert f"$ SLURM_CONF={cluster.conf} srun --ntasks=2 --nodes=2 --ntasks-per-node=1" in log2, log2[:2000]
    summary = json.loads((killed / "results/runs" / RunPoint("fp32", 0, 2).run_id / "summary.json").read_text())
    assert summary["status"] == "failed", summary
    assert "on node n2" in summary["reason"] and "SIGKILL" in summary["reason"], summary["reason"]
    run_end = pd.Timestamp(summary["started_utc"]).timestamp() + summary["wall_time_s"]
    # the run ends once srun sees the dead rank's launcher, not at the collective or run timeout (30 s, 90 s)
    assert run_end - killed_at < 15, (run_end - killed_at, summary)
    print(f"killed rank: the run ended {run_end - killed_at:.1f} s after the kill ({time.monotonic() - started:.1f} s for the "
          f"sweep): {summary['reason']}")


@pytest.mark.cluster(cost_s=60)
def test_a_job_that_fails_before_scalelab_runs_is_reported_with_its_slurm_log_error(tmp_path, clusters):
    """The workflow as it was before SLURM_CONF was carried (the one line that carries it taken
    out of a copy): its first job fails in the plugin's own srun, and Snakemake's "Detailed
    failure reason unavailable" is followed by the error from the job's SLURM log."""
    copy = tmp_path / "workflow_copy"
    copy.mkdir()
    for part in ("Snakefile", "rules", "workflow", "profiles", "config.yaml"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, copy / part)
    common = (copy / "rules" / "common.smk").read_text()
    assert common.count("\ncarry_slurm_conf()\n") == 1
    (copy / "rules" / "common.smk").write_text(common.replace("\ncarry_slurm_conf()\n", "\n"))
    work = write_workdir(tmp_path / "work", _cfg(zero_stage=[0], world_size=[1]))
    with clusters(tmp_path / "cluster", nodes=2, config_at="env") as cluster:
        proc = _snakemake_on(cluster, work, snakefile=copy / "Snakefile")
    err = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Detailed failure reason unavailable" in err, err[-3000:]
    reported = [line for line in err.splitlines() if line.startswith("scalelab: SLURM job log ")]
    assert reported and "rule_prepare_data" in reported[0], err[-3000:]
    assert "Could not establish a configuration source" in reported[0] or "Unable to establish control machine address" in reported[0]
    # each on its own line: printed beside Snakemake's logging thread, they once landed inside its last line
    assert "\nscalelab: no run failed; the sweep stopped before its end" in err, err[-3000:]  # the data job failed
    assert f"where it stands: scalelab status {(work / 'results').resolve()}\n" in err, err[-3000:]


def _wait_gone(cluster: VirtualCluster, job_id: str, timeout_s: float = 60) -> None:
    """Polls squeue (sbatch --wait backs off for seconds) until the job has left the queue."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False, timeout=10)
        if out.returncode == 0 and not out.stdout.strip():
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still queued after {timeout_s} s")


def _wait_for_rank(cluster: VirtualCluster, node: int, run_id: str, timeout_s: float) -> int:
    """The PID of a training rank (scalelab.run.worker) of a run running in node n<node>'s namespace."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in cluster._ns_pids(cluster.node_ns(node)):
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if (b"scalelab.run.worker" in cmdline and b"torch.distributed.run" not in cmdline
                    and any(f"/{run_id}/".encode() in arg for arg in cmdline)):
                return pid
        time.sleep(0.1)
    raise AssertionError(f"no training rank appeared on n{node} within {timeout_s} s")
