"""Placement of GPU runs, proven without a GPU: the sweep's device plan, what a job asks the
scheduler for, which GPU each rank takes, the multi-node skip rule, failures read from
recorded NCCL/gloo logs, and provenance in a tree without .git."""
import os
import shutil
import subprocess

import pytest
import torch

from scalelab.config import ConfigError
from scalelab.harness.testing import tiny_config
from scalelab.planning import placement
from scalelab.planning.placement import LaunchPlan, check_gpu_layout, launch_plan
from scalelab.planning.sweep import RunPoint
from scalelab.run import ranks
from scalelab.run.launch import git_provenance, resolve_device, skip_reason
from scalelab.run.ranks import classify_failure, torchrun_command
from support import fake_nvidia_smi

CLUSTER = {"ranks_per_node": 8, "launchers_per_node": 1, "cpus_per_rank": 4, "mem_mb_per_rank": 16000,
           "gpus_per_node": 8, "exclusive": True}




# ----------------------------------------------------------------------------- the sweep's device

def test_visible_gpus_reads_a_fake_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path, ['NVIDIA H100 80GB HBM3'] * 2)}{os.pathsep}{os.environ['PATH']}")
    assert placement.visible_gpus() == ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CUDA sees none, whatever nvidia-smi lists
    assert placement.visible_gpus() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert placement.visible_gpus() == ["NVIDIA H100 80GB HBM3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000000,7,0")  # a UUID prefix; stops at the first unknown entry
    assert placement.visible_gpus() == ["NVIDIA H100 80GB HBM3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert placement.visible_gpus() == []


@pytest.mark.parametrize("requested, gpus_per_node, probed, device", [
    ("cuda", None, [], "cuda"),          # asked for: planned, and skipped with the reason where there is none
    ("cpu", 8, ["NVIDIA H200"], "cpu"),
    ("auto", 8, [], "cuda"),             # SLURM login node without GPUs: the config says the nodes have 8
    ("auto", 0, ["NVIDIA H200"], "cpu"),
    ("auto", None, ["NVIDIA H200"], "cuda"),  # workstation with a GPU
    ("auto", None, [], "cpu"),
])
def test_plan_device(requested, gpus_per_node, probed, device):
    plan = placement.plan_device(requested, gpus_per_node, probe=lambda: probed)
    assert plan.device == device
    assert f"train.device={requested}" in plan.why
    if requested == "auto" and gpus_per_node is None and not probed:
        assert "set cluster.gpus_per_node or train.device: cuda" in plan.why, "a CPU plan says how to get a GPU one"


def test_jobs_inherit_the_planners_device():
    """A SLURM job re-parses the workflow on a node that sees other GPUs: it takes the
    planner's decision from the environment (sbatch --export=ALL) instead of probing."""
    env = {}
    cfg = tiny_config(train={"device": "auto"})
    plan, inherited = placement.sweep_device_plan(cfg, env, probe=lambda: [])
    assert (plan.device, inherited) == ("cpu", False) and env[placement.SWEEP_DEVICE_ENV].startswith("cpu|")
    on_node, inherited = placement.sweep_device_plan(cfg, dict(env), probe=lambda: ["NVIDIA H100 80GB HBM3"] * 8)
    assert on_node == plan and inherited
    # a leftover decision that contradicts an explicit train.device is not this sweep's
    explicit, inherited = placement.sweep_device_plan(tiny_config(train={"device": "cuda"}), dict(env), probe=lambda: [])
    assert (explicit.device, inherited) == ("cuda", False)


def test_gpu_layout_checked_against_the_config():
    check_gpu_layout(tiny_config(train={"device": "auto"}, cluster=CLUSTER))
    with pytest.raises(ConfigError, match="places 16 ranks on a node with cluster.gpus_per_node=8"):
        check_gpu_layout(tiny_config(train={"device": "auto"}, cluster={**CLUSTER, "launchers_per_node": 2}))
    with pytest.raises(ConfigError, match="gpus_per_node=0"):
        check_gpu_layout(tiny_config(train={"device": "cuda"}, cluster={**CLUSTER, "gpus_per_node": 0}))
    check_gpu_layout(tiny_config(train={"device": "cpu"}, cluster={**CLUSTER, "launchers_per_node": 2}))


# ----------------------------------------------------------------------------- what a job asks for

def test_one_node_job_resources():
    res = placement.train_job_resources(LaunchPlan(1, 4, 1), "cuda", CLUSTER, local=False)
    assert res == {"nodes": 1, "cpus_per_task": 16, "mem_mb": 64000, "gpu": 4, "gres": "", "slurm_extra": "--exclusive",
                   "train_slot": 0}
    assert placement.train_job_resources(LaunchPlan(1, 4, 1), "cuda", CLUSTER, local=True)["train_slot"] == 1
    # a CPU run on a workstation takes the one training slot too: runs never train side by side
    cpu = placement.train_job_resources(LaunchPlan(1, 4, 1), "cpu", {**CLUSTER, "exclusive": False}, local=True)
    assert (cpu["gpu"], cpu["gres"], cpu["slurm_extra"], cpu["train_slot"]) == (0, "", "", 1)
    # runs packed into one SLURM submission (cluster.runs_per_job) take a slot scoped to their group job: one at a time
    assert placement.train_job_resources(LaunchPlan(1, 4, 1), "cuda", CLUSTER, local=False, grouped=True)["train_slot"] == 1


def test_multi_node_job_asks_gpus_per_node_not_in_total():
    cfg = tiny_config(cluster=CLUSTER, train={"global_batch": 16})
    res = placement.train_job_resources(launch_plan(cfg, 16), "cuda", CLUSTER, local=False)
    assert res == {"nodes": 2, "tasks": 2, "cpus_per_task": 32, "mem_mb": 128000, "gpu": 0, "gres": "gpu:8",
                   "slurm_extra": "--exclusive", "train_slot": 0}
    # a run spanning nodes is never grouped: no slot on a cluster
    assert placement.train_job_resources(launch_plan(cfg, 16), "cuda", CLUSTER, local=False, grouped=True)["train_slot"] == 0
    packed = {**CLUSTER, "ranks_per_node": 2, "launchers_per_node": 2}
    res = placement.train_job_resources(launch_plan(tiny_config(cluster=packed), 8), "cuda", packed, local=False)
    assert (res["nodes"], res["tasks"], res["gres"], res["mem_mb"]) == (2, 4, "gpu:4", 64000)


# ----------------------------------------------------------------------------- which GPU a rank takes

def test_gpu_index_one_launcher_per_node():
    assert [placement.gpu_index(r, 8, 0, 8) for r in range(8)] == list(range(8))


def test_packed_launchers_take_distinct_gpus():
    """Two launchers of 2 ranks on a 4-GPU node: before, both took cuda:0 and cuda:1."""
    taken = [placement.gpu_index(r, 2, slot, 4) for slot in (0, 1) for r in range(2)]
    assert taken == [0, 1, 2, 3]


def test_launcher_bound_to_its_own_gpus_counts_from_zero():
    assert [placement.gpu_index(r, 2, 1, 2) for r in range(2)] == [0, 1]


def test_gpu_index_beyond_the_visible_gpus_is_an_error():
    with pytest.raises(RuntimeError, match="needs GPU 5, but only 4 are visible"):
        placement.gpu_index(1, 2, 2, 4)


def test_srun_wrapper_hands_the_launcher_slot_to_the_ranks(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setattr("scalelab.run.ranks.allocation_first_host", lambda: "node1")
    plan = LaunchPlan(2, 8, 2)
    cmd = torchrun_command(plan, 16, tmp_path / "run_plan.json", placement.srun_step_options(plan, "cuda", CLUSTER))
    assert cmd[0] == "srun" and f'{placement.LAUNCHER_SLOT_ENV}="$SLURM_LOCALID"' in " ".join(cmd)
    # the step asks for its own cores and GPUs: the plugin's job step strips SLURM_*/SRUN_* from the environment
    assert cmd[1:6] == ["--ntasks=2", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=32", "--gres=gpu:8"]
    packed = LaunchPlan(4, 2, 2)
    assert placement.srun_step_options(packed, "cpu", {**CLUSTER, "launchers_per_node": 2, "cpus_per_rank": 1}) == [
        "--ntasks=4", "--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=2"]
    # and the exported variables reach the worker through a real shell
    wrapper = cmd[cmd.index("-c") + 1]
    out = subprocess.run(["bash", "-c", wrapper, "bash", "sh", "-c", f"echo $PET_NODE_RANK ${placement.LAUNCHER_SLOT_ENV}"],
                         env={**os.environ, "SLURM_PROCID": "3", "SLURM_LOCALID": "1"}, capture_output=True, text=True)
    assert out.stdout.split() == ["3", "1"]


# ----------------------------------------------------------------------------- the skip rule, with a fake device count

@pytest.fixture
def gpus(monkeypatch):
    """Pretend torch sees n GPUs (set .n)."""
    class Fake:
        n = 8
    monkeypatch.setattr(torch.cuda, "is_available", lambda: Fake.n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: Fake.n)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    return Fake


def test_multinode_run_checks_its_share_of_gpus_on_this_node(gpus, monkeypatch):
    """World size 16 on 8-GPU nodes used to be skipped, always: 16 > 8 on the first node."""
    plan = launch_plan(tiny_config(cluster=CLUSTER, train={"global_batch": 16}), 16)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert placement.gpu_shortfall(plan, 16, 1, 8) is None
    gpus.n = 4
    reason = skip_reason("cuda", RunPoint("bf16", 3, 16), plan, 1)
    assert "places 8 rank(s) on this node, which has 4 visible GPU(s)" in reason
    packed = launch_plan(tiny_config(cluster={**CLUSTER, "ranks_per_node": 2, "launchers_per_node": 2}), 8)
    assert placement.gpu_shortfall(packed, 8, 2, 4) is None
    assert "places 4 rank(s)" in placement.gpu_shortfall(packed, 8, 2, 3)


def test_workstation_run_needs_all_its_gpus_here(gpus, monkeypatch):
    """Without SLURM every rank starts here (torchrun --standalone), whatever the cluster section says."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    cfg = tiny_config(cluster=CLUSTER, train={"global_batch": 16})
    assert "needs 16 GPUs on this machine, it has 8" in skip_reason("cuda", RunPoint("bf16", 3, 16), launch_plan(cfg, 16), 1)
    assert placement.gpu_shortfall(launch_plan(cfg, 8), 8, 1, 8) is None


def test_a_run_planned_for_a_gpu_never_trains_elsewhere(gpus):
    gpus.n = 0
    device, reason = resolve_device("auto", planned="cuda")
    assert device == "cuda" and "planned for a GPU" in reason and "no CUDA device is visible" in reason
    assert resolve_device("auto", planned="cpu") == ("cpu", None)
    gpus.n = 2
    assert resolve_device("auto", planned="cpu") == ("cpu", None), "a CPU plan stays on the CPU even where GPUs are"
    assert resolve_device("auto") == ("cuda", None)


# ----------------------------------------------------------------------------- failures read from recorded logs
# Excerpts of real logs (public issue threads of projects training with torchrun), torch 2.1-2.6.

NCCL_TIMEOUT_2_5 = """\
[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.
[rank1]:[E626 06:24:44.906457629 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, last completed NCCL work: 807.
"""
NCCL_TIMEOUT_2_1 = """\
  what():  [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLGATHER, Timeout(ms)=1800000) ran for 1808212 milliseconds before timing out.
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 0 (pid: 4033008) of binary: /usr/bin/python3
  traceback : Signal 6 (SIGABRT) received by PID 3431
"""
NCCL_TIMEOUT_2_4 = """\
[rank0]:[E1206 18:44:16.994932383 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 0] Timeout at NCCL work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752.
[rank0]:[E1206 18:44:16.994957078 ProcessGroupNCCL.cpp:621] [Rank 0] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
"""
NCCL_WATCHDOG_HANG = """\
[rank2]:[E704 13:48:58.260494728 ProcessGroupNCCL.cpp:1746] [PG ID 0 PG GUID 0(default_pg) Rank 2] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives.
"""
GLOO_TIMEOUT = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete\n"
NCCL_REMOTE_ERROR = """\
[rank5]:[E207 19:37:09.983540349 ProcessGroupNCCL.cpp:681] [Rank 5] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
[rank5]:[E207 19:37:09.983600771 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) Rank 5] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5
ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
"""
DUPLICATE_GPU = """\
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.20.5
ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
Last error:
Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10
"""
TORCHRUN_TAIL = "E0325 20:57:27.620000 2606 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 1 (pid: 2630) of binary: /usr/bin/python3\n"


@pytest.mark.parametrize("log, expected", [
    (NCCL_TIMEOUT_2_5, "Watchdog caught collective operation timeout"),
    (NCCL_TIMEOUT_2_1, "Watchdog caught collective operation timeout"),
    (NCCL_TIMEOUT_2_4, "Timeout at NCCL work: 7753"),
    (NCCL_WATCHDOG_HANG, "watchdog got stuck for 480 seconds"),
    (GLOO_TIMEOUT, "Timed out waiting 1800000ms for recv"),
])
def test_collective_timeouts_in_the_log_are_timeouts(log, expected):
    """No rank error file (the watchdog aborted the process): the log decides."""
    status, reason = classify_failure([], "step 3 ok\n" + log + TORCHRUN_TAIL)
    assert status == "timeout" and expected in reason


@pytest.mark.parametrize("log, expected", [(NCCL_REMOTE_ERROR, "NCCL error"), (DUPLICATE_GPU, "NCCL error in:")])
def test_nccl_errors_are_failures_not_timeouts(log, expected):
    status, reason = classify_failure([], log + TORCHRUN_TAIL)
    assert status == "failed" and expected in reason


def test_the_watchdog_line_is_found_far_from_the_end_of_the_log():
    """After an abort every rank prints C++ frames and torchrun its summary: many KiB."""
    frames = "".join(f"frame #{i}: 0x7f00deadbeef in /usr/lib/libtorch_cuda.so (c10d::ProcessGroupNCCL::watchdog)\n"
                     for i in range(400))
    status, reason = classify_failure([], "step 3 ok\n" + NCCL_TIMEOUT_2_5 + frames * 4 + TORCHRUN_TAIL)
    assert status == "timeout" and "Watchdog caught collective operation timeout" in reason


def test_the_watchdog_timeout_wins_over_a_secondary_rank_error():
    """Rank 0 timed out in the watchdog (no error file); rank 1 then reported its communicator aborted."""
    echo = [{"rank": 1, "type": "DistBackendError", "message": "NCCL communicator was aborted on rank 1", "time": 5.0}]
    status, reason = classify_failure(echo, NCCL_TIMEOUT_2_5 + TORCHRUN_TAIL)
    assert status == "timeout" and "Watchdog caught" in reason and "rank 1: DistBackendError" in reason
    crash = [{"rank": 1, "type": "RuntimeError", "message": "injected crash at step 3", "time": 5.0}]
    assert classify_failure(crash, "step 3 ok\n" + TORCHRUN_TAIL)[0] == "failed"


def test_a_log_without_evidence_stays_a_plain_failure():
    status, reason = classify_failure([], "step 3 ok\n" + TORCHRUN_TAIL)
    assert status == "failed" and reason.startswith("a rank exited abnormally")


def test_a_rendezvous_port_found_taken_is_the_status_the_launcher_retries():
    """TCPStore's message when another process took rank 0's port (seen on an H100 with 8 test workers)."""
    log = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
           "port: 34965, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use\n")
    status, reason = classify_failure([], "$ RANK=0 ...\n" + log)
    assert status == ranks.PORT_TAKEN and "EADDRINUSE" in reason
    # the launcher's last attempt: what the attempt is otherwise
    assert classify_failure([], "$ RANK=0 ...\n" + log, retry=False)[0] == "failed"
    # a rank that reported an error got past the rendezvous: its error is the cause, whatever the log holds
    oom = [{"rank": 0, "type": "OutOfMemoryError", "message": "CUDA out of memory", "time": 5.0}]
    assert classify_failure(oom, log)[0] == "oom"
    # "address already in use" from anything but the store's listen is no rendezvous race
    assert classify_failure([], "OSError: [Errno 98] Address already in use\n")[0] == "failed"


# ----------------------------------------------------------------------------- provenance without .git

def test_provenance_from_git_and_from_the_environment_in_a_copied_tree(tmp_path, monkeypatch):
    def git(where, *args):
        return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=where, check=True,
                              capture_output=True, text=True).stdout.strip()

    def checkout(where):
        (where / "src" / "scalelab").mkdir(parents=True)
        (where / "src" / "scalelab" / "__init__.py").write_text("")
        git(where, "init", "-q")
        git(where, "add", ".")
        git(where, "commit", "-qm", "x")
        return git(where, "rev-parse", "HEAD")

    repo = tmp_path / "repo"
    head = checkout(repo)
    monkeypatch.delenv("SCALELAB_GIT_COMMIT", raising=False)
    assert git_provenance(repo) == {"git_commit": head, "git_dirty": False, "git_commit_source": "git"}

    # the tree as a GPU machine or a cluster stage-in gets it: no .git, and (worse) inside
    # some other repository, whose commit must not be taken for this project's
    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q")
    copy = outer / "copy"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    lost = git_provenance(copy)
    assert lost["git_commit"] is None and "SCALELAB_GIT_COMMIT unset" in lost["git_commit_source"]
    monkeypatch.setenv("SCALELAB_GIT_COMMIT", head)
    monkeypatch.setenv("SCALELAB_GIT_DIRTY", "0")
    assert git_provenance(copy) == {"git_commit": head, "git_dirty": False,
                                    "git_commit_source": "environment SCALELAB_GIT_COMMIT"}
    monkeypatch.setenv("SCALELAB_GIT_COMMIT", "not a hash; rm -rf /")
    wrong = git_provenance(copy)
    assert wrong["git_commit"] is None and "is not a commit hash" in wrong["git_commit_source"]


def test_overcommit_of_host_memory_is_named():
    assert placement.overcommit_reason(2, 2, 100 * 2**20, 64 * 2**30) is None
    reason = placement.overcommit_reason(2, 2, 22.8 * 2**30, 20 * 2**30)
    assert "predicted to need 46.2 GiB of host memory" in reason and "20.0 GiB are available" in reason
    assert placement.host_memory_available() > 0


def test_the_core_check_of_a_run_over_nodes_counts_this_nodes_share(monkeypatch):
    # a job pinned to one core (cluster.exclusive: false, a cluster that binds cores): the node's
    # share of a world-size-2 run over two nodes is one rank, which fits; the whole run would not
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda pid: {0})
    assert placement.overcommit_reason(2, 2, 100 * 2**20, 64 * 2**30, ranks_here=1) is None
    assert "world_size=2 CPU ranks need a core each; this job has 1" in placement.overcommit_reason(2, 2, 100 * 2**20, 64 * 2**30)
    reason = placement.overcommit_reason(4, 4, 100 * 2**20, 64 * 2**30, ranks_here=2)
    assert reason.startswith("2 CPU ranks (this node's share of world_size=4) need a core each; this job has 1"), reason
    plan = LaunchPlan(launchers=2, ranks_per_launcher=1, nodes=2)
    assert placement.ranks_per_node(plan, 1) == 1


def test_slurm_conf_of_the_planner_reaches_the_launchers_srun_and_the_plugins(tmp_path):
    conf = tmp_path / "site" / "slurm.conf"
    planner = {"SLURM_CONF": str(conf), "PATH": "/usr/bin"}
    assert placement.carry_slurm_conf(planner) == str(conf)
    assert planner[placement.SLURM_CONF_ENV] == str(conf) and planner["PATH"] == f"{placement.SLURM_BIN}:/usr/bin"
    # the plugin's job step removes SLURM_*: what the launcher's srun then gets
    job = {k: v for k, v in planner.items() if not k.startswith("SLURM_")}
    assert placement.srun_environment(job)["SLURM_CONF"] == str(conf)
    assert placement.carry_slurm_conf(job) == str(conf) and job["PATH"].count(str(placement.SLURM_BIN)) == 1  # once
    # a node's own SLURM_CONF (slurmd sets it for the job) is kept
    assert placement.srun_environment({**job, "SLURM_CONF": "/node/slurm.conf"})["SLURM_CONF"] == "/node/slurm.conf"
    # config at the default path: nothing is recorded, PATH untouched
    plain = {"PATH": "/usr/bin"}
    assert placement.carry_slurm_conf(plain) is None and plain == {"PATH": "/usr/bin"}
    # scalelab's srun puts SLURM_CONF back, then runs the real one (here a stand-in on PATH)
    real = tmp_path / "bin"
    real.mkdir()
    (real / "srun").write_text('#!/bin/sh\necho "SLURM_CONF=$SLURM_CONF args=$*"\n')
    (real / "srun").chmod(0o755)
    out = subprocess.run(["sh", "-c", "srun -n1 hostname"], capture_output=True, text=True, timeout=10,
                         env={"PATH": f"{placement.SLURM_BIN}:{real}:/usr/bin:/bin", placement.SLURM_CONF_ENV: str(conf)})
    assert out.stdout.strip() == f"SLURM_CONF={conf} args=-n1 hostname", out


def test_a_slurm_job_log_error_is_found_for_the_failure_report(tmp_path):
    logs = tmp_path / "rule_train" / "fp32-z0-w1"
    logs.mkdir(parents=True)
    (logs / "12.log").write_text("host: n1\nsrun: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
                                 "srun: error: fetch_config: DNS SRV lookup failed\n"
                                 "srun: fatal: Could not establish a configuration source\n")
    (logs / "13.log").write_text("Finished job 0.\n")
    found = placement.slurm_log_errors(tmp_path)
    assert len(found) == 1 and found[0].startswith(f"{logs / '12.log'}: srun: fatal: Could not establish a configuration source")
    assert placement.slurm_log_errors(tmp_path, since=(logs / "12.log").stat().st_mtime + 10) == []


def test_a_rank_killed_on_another_node_is_named_from_torchrun_and_srun():
    log = ("E1124 12:45:53.516000 5320 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
           "local_rank: 0 (pid: 5424) of binary: /venv/bin/python3\n"
           "srun: error: n2: task 1: Exited with exit code 1\nsrun: error: n1: task 0: Exited with exit code 1\n")
    status, reason = classify_failure([], log)
    assert status == "failed"
    assert reason == ("a rank exited abnormally: local rank 0 of a launcher on node n2 (SLURM task 1; srun: Exited with exit code 1) was killed by "
                      "SIGKILL (torchrun: exitcode -9); the other ranks were stopped")
