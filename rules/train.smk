# Stage 2: one training run per sweep point (precision x ZeRO stage x world size x levers).
# The run's folder is the point's Paramspace pattern, one level per axis, e.g.
# results/runs/precision~fp32/zero_stage~0/world_size~2/micro_batch~auto/
#   activation_checkpointing~false/cpu_offload~false/bucket_mb~25/{summary.json,steps.parquet}.
#
# Two rules, split by world size: `train` for runs that fit one node (one torchrun
# --standalone), `train_multinode` for runs spanning several launchers. On SLURM the latter
# declares an `mpi` resource, so the executor plugin runs the rule's command directly in the
# allocation (not inside its own `srun -n1` step) and the launcher calls `srun` itself to
# start one torchrun per task.


rule train:
    input:
        meta=DATA_DIR / "meta.json",
        train=DATA_DIR / "train.bin",
    output:
        summary=RESULTS / "runs" / SWEEP.wildcard_pattern / "summary.json",
        steps=RESULTS / "runs" / SWEEP.wildcard_pattern / "steps.parquet",
    params:
        point=lambda wildcards: point_from_wildcards(wildcards),
        # What a run's results depend on: changing these reruns it (time limits do not).
        model=config["model"],
        train=TRAIN_RESULT_KEYS,
        device=DEVICE_PLAN.device,  # the reason travels in the environment (scalelab.placement)
    log:
        LOGS / "runs" / f"{SWEEP.wildcard_pattern}.log",
    wildcard_constraints:
        world_size=SINGLE_LAUNCHER_WORLD_SIZES,
    # One core per rank on CPU (capped at --cores by Snakemake); each rank gets
    # threads // world_size intra-op threads, so --cores all never over-commits the machine.
    threads: lambda wildcards: int(wildcards.world_size) * CLUSTER["cpus_per_rank"]
    # What the scheduler sees (scalelab.placement.train_job_resources): a one-node job asks
    # for `gpu` GPUs; a job over several nodes (train_multinode) for gres=gpu:<per node>.
    resources:
        runtime=run_minutes,
        nodes=lambda wildcards: train_resources(wildcards)["nodes"],
        cpus_per_task=lambda wildcards: train_resources(wildcards)["cpus_per_task"],
        mem_mb=lambda wildcards: train_resources(wildcards)["mem_mb"],
        gpu=lambda wildcards: train_resources(wildcards)["gpu"],
        slurm_extra=lambda wildcards: train_resources(wildcards)["slurm_extra"],
        # without this the plugin turns `tasks` of a GPU job into --ntasks-per-gpu
        tasks_per_gpu=0,
        # At most one GPU run at a time on a workstation (profiles/default): a scaling
        # measurement must not share the node's GPUs or links with another run.
        gpu_run=lambda wildcards: train_resources(wildcards)["gpu_run"],
    conda:
        "../workflow/envs/scalelab.yaml"
    script:
        "../workflow/scripts/train_run.py"


use rule train as train_multinode with:
    wildcard_constraints:
        world_size=MULTI_LAUNCHER_WORLD_SIZES,
    resources:
        runtime=run_minutes,
        mpi="srun",
        nodes=lambda wildcards: train_resources(wildcards)["nodes"],
        tasks=lambda wildcards: train_resources(wildcards)["tasks"],
        # per launcher (SLURM task): its ranks' cores
        cpus_per_task=lambda wildcards: train_resources(wildcards)["cpus_per_task"],
        # per node: the ranks of the launchers packed on it
        mem_mb=lambda wildcards: train_resources(wildcards)["mem_mb"],
        gres=lambda wildcards: train_resources(wildcards)["gres"],
        slurm_extra=lambda wildcards: train_resources(wildcards)["slurm_extra"],
        tasks_per_gpu=0,
        gpu_run=lambda wildcards: train_resources(wildcards)["gpu_run"],
