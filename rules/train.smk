# Stage 2: one training run per sweep point (precision x ZeRO stage x world size).
# The run's folder is the point's Paramspace pattern, e.g.
# results/runs/precision~fp32/zero_stage~0/world_size~2/{summary.json,steps.parquet}.


rule train:
    input:
        meta=DATA_DIR / "meta.json",
        train=DATA_DIR / "train.bin",
    output:
        summary=RESULTS / "runs" / SWEEP.wildcard_pattern / "summary.json",
        steps=RESULTS / "runs" / SWEEP.wildcard_pattern / "steps.parquet",
    params:
        point=lambda wildcards: point_from_wildcards(wildcards),
        model=config["model"],
        train=config["train"],
    log:
        LOGS / "runs" / f"{SWEEP.wildcard_pattern}.log",
    # A run occupies one core per rank on CPU (capped at --cores by Snakemake); each rank
    # gets threads // world_size of them, so --cores all never over-commits the machine.
    threads: lambda wildcards: int(wildcards.world_size)
    resources:
        runtime=lambda wildcards: max(1, int(config["train"]["run_timeout_s"] // 60) + 2),
    conda:
        "../workflow/envs/scalelab.yaml"
    script:
        "../workflow/scripts/train_run.py"
