"""What the workflow plans for GPUs, asserted job by job from Snakemake dry runs on a machine
without a GPU: a fake `nvidia-smi` stands in for a workstation's GPUs, and the SLURM
profile's plans are fed to the executor plugin's own sbatch builder."""
import os
import re
import subprocess
from types import SimpleNamespace

import pytest

from scalelab.harness.testing import SLURM_PLUGIN_DIR
from support import BIN, REPO, SNAKEMAKE, fake_nvidia_smi, path_without, planned_jobs, tiny_config, write_workdir

GPU_CLUSTER = {"ranks_per_node": 8, "launchers_per_node": 1, "cpus_per_rank": 4, "mem_mb_per_rank": 16000,
               "gpus_per_node": None, "exclusive": True}
needs_plugin = pytest.mark.skipif(not (SLURM_PLUGIN_DIR / "snakemake_executor_plugin_slurm").is_dir(),
                                  reason=f"the SLURM executor plugin is not in {SLURM_PLUGIN_DIR} (`make setup` puts it there)")


def dry_run(workdir, *args, path=None, slurm=False):
    env = {**os.environ, "PATH": path or path_without("nvidia-smi", BIN)}
    env.pop("SCALELAB_SWEEP_DEVICE", None)
    if slurm:
        env["PYTHONPATH"] = str(SLURM_PLUGIN_DIR)
        args = ("--profile", str(REPO / "workflow/profiles/slurm"), *args)
    proc = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "-n", *args],
                          capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # keyed by world size (the run id's w<N> part): the tests look at one run per world size
    return out, {int(re.search(r"-w(\d+)", j["wildcards"]["run_id"]).group(1)): j
                 for j in planned_jobs(out) if j["rule"].startswith("train")}


def test_snakemake_at_the_repository_root_loads_the_workstation_profile():
    proc = subprocess.run([SNAKEMAKE, "-n"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": path_without("nvidia-smi", BIN)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Using workflow specific profile profiles/default for setting default command line arguments" in proc.stderr


def test_workstation_with_gpus_plans_one_gpu_run_at_a_time(tmp_path):
    cfg = tiny_config(train={"device": "auto"}, sweep={"precision": ["bf16"], "zero_stage": [0, 3], "world_size": [1, 2]})
    workdir = write_workdir(tmp_path / "w", cfg)
    smi = fake_nvidia_smi(tmp_path / "bin", ["NVIDIA H100 80GB HBM3"] * 2)
    out, jobs = dry_run(workdir, path=path_without("nvidia-smi", smi, BIN))
    assert "Using workflow specific profile" in out and "profiles/default" in out
    assert "runs train on cuda (train.device=auto, nvidia-smi lists 2 GPU(s) on the planning machine (NVIDIA H100 80GB HBM3))" in out
    for ws, job in jobs.items():
        # train_slot=1 per job against the profile's train_slot=1: runs one at a time
        assert (job["resources"]["gpu"], job["resources"]["train_slot"], job["resources"]["nodes"]) == (str(ws), "1", "1")
    out, jobs = dry_run(workdir)  # the same machine without its GPUs
    assert "runs train on cpu (train.device=auto; nvidia-smi lists no GPU" in out
    # CPU runs take the one training slot too: they never train side by side
    assert all((j["resources"]["gpu"], j["resources"]["train_slot"]) == ("0", "1") for j in jobs.values())


def _sbatch(job: dict) -> str:
    """The sbatch command the SLURM executor plugin would build for this planned job."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class Resources(SimpleNamespace):
        def get(self, key, default=None):
            return getattr(self, key, default)

    res = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in job["resources"].items()}
    fake = SimpleNamespace(resources=Resources(**res), threads=job["threads"], name=job["rule"])
    params = dict(run_uuid="u", slurm_logfile="log", comment_str="c", account="", partition="-p gpu", workdir="/w")
    return get_submit_command(fake, params) + set_gres_string(fake)


@needs_plugin
@pytest.mark.parametrize("device, gpus_per_node", [("cuda", None), ("auto", 8)])
def test_slurm_plans_gpus_per_node_for_a_gpu_sweep_from_a_login_node_without_gpus(tmp_path, device, gpus_per_node, monkeypatch):
    cfg = tiny_config(train={"device": device, "global_batch": 16}, cluster={**GPU_CLUSTER, "gpus_per_node": gpus_per_node},
                      sweep={"precision": ["bf16"], "zero_stage": [3], "world_size": [1, 8, 16]})
    out, jobs = dry_run(write_workdir(tmp_path, cfg), slurm=True)
    assert "runs train on cuda" in out
    one, eight, sixteen = jobs[1]["resources"], jobs[8]["resources"], jobs[16]["resources"]
    assert (one["nodes"], one["gpu"], eight["nodes"], eight["gpu"]) == ("1", "1", "1", "8")
    assert jobs[16]["rule"] == "train_multinode"
    assert (sixteen["nodes"], sixteen["tasks"], sixteen["gres"], sixteen.get("gpu")) == ("2", "2", "gpu:8", None)
    assert {one["slurm_extra"], sixteen["slurm_extra"]} == {"--exclusive"}

    monkeypatch.syspath_prepend(str(SLURM_PLUGIN_DIR))
    sbatch16 = _sbatch(jobs[16])  # two nodes, 8 GPUs each (before: --gpus=16 for the whole job)
    assert all(flag in sbatch16.split() for flag in ("--nodes=2", "--ntasks=2", "--gres=gpu:8", "--exclusive"))
    assert "--gpus" not in sbatch16 and "--ntasks-per-gpu" not in sbatch16
    sbatch8 = _sbatch(jobs[8])
    assert all(flag in sbatch8.split() for flag in ("--nodes=1", "--gpus=8", "--exclusive", "--cpus-per-task=32"))


@needs_plugin
def test_slurm_auto_without_gpu_facts_says_plainly_the_sweep_runs_on_cpu(tmp_path):
    cfg = tiny_config(train={"device": "auto", "global_batch": 16}, cluster={**GPU_CLUSTER, "exclusive": False},
                      sweep={"precision": ["bf16"], "zero_stage": [3], "world_size": [1, 16]})
    out, jobs = dry_run(write_workdir(tmp_path, cfg), slurm=True)
    assert ("scalelab: runs train on cpu (train.device=auto; nvidia-smi lists no GPU on the planning machine and "
            "cluster.gpus_per_node is not set. For GPU nodes elsewhere (SLURM), set cluster.gpus_per_node or train.device: cuda)") in out
    assert jobs[1]["resources"]["gpu"] == "0" and jobs[16]["resources"]["gres"] == ""
    assert {j["resources"]["slurm_extra"] for j in jobs.values()} == {""}


def test_a_top_k_sweep_on_a_workstations_gpus_forecasts_with_the_gpu_nvidia_smi_lists(tmp_path):
    """planning.top_k with no planning.forecast.gpu: the forecast reads the product nvidia-smi names; the pruned
    points are local record_pruned jobs (no GPU, no training slot), the rest train on the GPUs."""
    cfg = tiny_config(train={"device": "auto"}, repeats={"points": 1, "baseline": 1}, planning={"top_k": 1},
                      sweep={"precision": ["fp32", "bf16"], "zero_stage": [0, 3], "world_size": [2]})
    smi = fake_nvidia_smi(tmp_path / "bin", ["NVIDIA H100 80GB HBM3"] * 2)
    out, _ = dry_run(write_workdir(tmp_path / "w", cfg), path=path_without("nvidia-smi", smi, BIN))
    assert not (tmp_path / "w/results/plan/forecast.json").exists()  # recorded by a sweep that runs jobs, under its lock
    # the same decision, in process, with the product nvidia-smi named (the planner's printout says how many it pruned)
    from scalelab.forecast import pruning
    from scalelab.planning.run_plan import run_plan
    from scalelab.planning.sweep import sweep_plan

    os.environ["PATH"], saved = path_without("nvidia-smi", smi, BIN), os.environ["PATH"]
    try:
        decisions = pruning.decide(cfg, {p.run_id: run_plan(cfg, p, device="cuda") for p in sweep_plan(cfg)[0]})
    finally:
        os.environ["PATH"] = saved
    assert "datasheet dense bf16: H100 SXM" in decisions["bf16-z0-w2"].forecast["forecast_note"]
    pruned = sorted(r for r, d in decisions.items() if d.pruned)
    assert pruned and "fp32-z0-w2" not in pruned and f"{len(pruned)} pruned" in out
    jobs = {j["wildcards"]["run_id"]: j for j in planned_jobs(out) if "run_id" in j["wildcards"]}
    assert sorted(r for r, j in jobs.items() if j["rule"] == "record_pruned") == pruned
    assert all(j["rule"] == "train" and j["resources"]["gpu"] == "2" for r, j in jobs.items() if r not in pruned)
    assert all(j["resources"].get("gpu") is None for r, j in jobs.items() if r in pruned)
