# Stage 2: one training run per sweep point (precision x ZeRO stage x world size x levers).
# The run's folder is named by its run id, e.g. results/runs/fp32-z0-w2/{point.json,summary.json,
# steps.parquet}; its log is results/logs/runs/fp32-z0-w2.log. The rules are keyed by the run id
# ({run_id}); the point it names comes from the sweep table (rules/common.smk).
#
# Two rules, split by world size: `train` for runs that fit one node (the launcher starts one
# process per rank), `train_multinode` for runs spanning several launchers. On SLURM the latter
# declares an `mpi` resource, so the executor plugin runs the rule's command directly in the
# allocation (not inside its own `srun -n1` step) and the launcher calls `srun` itself to
# start one torchrun per task.


rule train:
    input:
        meta=DATA_DIR / "meta.json",
        train=DATA_DIR / "train.bin",
    output:
        summary=RESULTS / "runs" / "{run_id}" / "summary.json",
        steps=RESULTS / "runs" / "{run_id}" / "steps.parquet",
    params:
        # the run's plan, made once in rules/common.smk and handed to the job as it is (Snakemake records
        # only builtin params: the run id, its output path, names it, and results_depend_on decides reruns)
        plan=plan_of,
        # What a run's results depend on, as the values that differ from the defaults: changing
        # one reruns it; a new key at its default, a time limit or checkpoint frequency does not.
        results_depend_on=run_params,
        device=DEVICE_PLAN.device,  # recorded with the results: a run planned for another device reruns
    log:
        LOGS / "runs" / "{run_id}.log",
    wildcard_constraints:
        run_id=SINGLE_LAUNCHER_RUN_IDS,
    # SLURM: cluster.runs_per_job runs of one world size to a submission (rules/common.smk)
    group: train_group if RUNS_PER_JOB > 1 else None
    # Each rank gets threads // world_size intra-op threads, so --cores all never over-commits the machine.
    threads: run_threads
    # What the scheduler sees (scalelab.planning.placement.train_job_resources): a one-node job asks
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
        # At most one training run at a time on a workstation (profiles/default): a scaling
        # measurement must not share the machine's cores, GPUs or links with another run.
        train_slot=lambda wildcards: train_resources(wildcards)["train_slot"],
    conda:
        "../workflow/envs/scalelab.yaml"
    script:
        "../workflow/scripts/train_run.py"


use rule train as train_multinode with:
    wildcard_constraints:
        run_id=MULTI_LAUNCHER_RUN_IDS,
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
        train_slot=lambda wildcards: train_resources(wildcards)["train_slot"],


# Points the forecast pruned (planning.top_k, scalelab.forecast.pruning): recorded `skipped` with their
# forecast and the reason, by a job on the planning machine (no cluster submission, no rank started).
localrules:
    record_pruned,


rule record_pruned:
    input:
        meta=DATA_DIR / "meta.json",
        train=DATA_DIR / "train.bin",
    output:
        summary=RESULTS / "runs" / "{run_id}" / "summary.json",
        steps=RESULTS / "runs" / "{run_id}" / "steps.parquet",
    params:
        plan=plan_of,
        results_depend_on=run_params,
        device=DEVICE_PLAN.device,
    log:
        LOGS / "runs" / "{run_id}.log",
    wildcard_constraints:
        run_id=PRUNED_RUN_IDS,
    # recorded before any training starts, never beside a timed run
    priority: 100
    conda:
        "../workflow/envs/scalelab.yaml"
    script:
        "../workflow/scripts/train_run.py"
