import os

# Calibration: the collective benchmark (scalelab bench comm) on the sweep's device and backend, at
# its world sizes that fit one node, into <results>/calibration/comm.parquet: the step-time model
# (scalelab.formulas.link_fit) fits its links there, and collection predicts every run with them.
#
# A target of its own (`snakemake bench_comm`), measured once per results folder. Never an input of a
# training run: Snakemake reruns a job whose input another job updates (scalelab.run.calibration's
# docstring), so a table an input of training would retrain every cached run. Collection takes it as
# an input once it exists (rules/collect.smk): a new table re-collects and redraws the report, and
# trains nothing.
BENCH_TABLE = RESULTS / "calibration" / "comm.parquet"
# Single-node world sizes above 1 (a one-rank group moves nothing); 2 where the sweep has none. On this machine's CPU,
# only those whose ranks get their own cores: a run that planning.launch_overcommitted lets share them is timed as
# contention, and so would its bench be (scalelab bench comm refuses it; the step-time model then has no table row
# for that size, and says so).
_BENCH_CORES = (len(os.sched_getaffinity(0)) // CLUSTER["cpus_per_rank"]
                if DEVICE_PLAN.device == "cpu" and hasattr(os, "sched_getaffinity") else None)
_BENCH_SIZES = sorted({plan.point.world_size for plan in PLANS.values()
                       if plan.point.world_size > 1 and not plan.launch.multi_launcher
                       and (_BENCH_CORES is None or plan.point.world_size <= _BENCH_CORES)}) or [2]


rule bench_comm:
    output:
        BENCH_TABLE,
    log:
        LOGS / "bench_comm.log",
    params:
        world_sizes=",".join(map(str, _BENCH_SIZES)),
        device=DEVICE_PLAN.device,
        threads_per_rank=CLUSTER["cpus_per_rank"],
        timeout_s=config["train"]["run_timeout_s"],
    threads: max(_BENCH_SIZES) * CLUSTER["cpus_per_rank"]
    # As a training run of its largest world size: alone on a workstation (train_slot: no run trains
    # beside it), its GPUs and cores on a cluster.
    resources:
        nodes=1,
        cpus_per_task=max(_BENCH_SIZES) * CLUSTER["cpus_per_rank"],
        mem_mb=max(_BENCH_SIZES) * CLUSTER["mem_mb_per_rank"],
        gpu=max(_BENCH_SIZES) if DEVICE_PLAN.device == "cuda" else 0,
        tasks_per_gpu=0,
        slurm_extra="--exclusive" if CLUSTER["exclusive"] else "",
        train_slot=lambda wildcards: int(workflow.local_exec),
    conda:
        "../workflow/envs/scalelab.yaml"
    script:
        "../workflow/scripts/bench_comm.py"
