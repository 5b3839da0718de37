# Stage 3: every run's summary.json + steps.parquet -> results/metrics.parquet + results/steps.parquet.
# Collection and the report (rules/report.smk) read files and draw figures in seconds: under SLURM they run
# where Snakemake runs (the login node, on the shared filesystem) rather than wait in the queue for a node.
localrules:
    collect,
    report,


rule collect:
    input:
        summaries=[run_dir / "summary.json" for run_dir in RUN_DIRS],
        steps=[run_dir / "steps.parquet" for run_dir in RUN_DIRS],
        # the step-time model's links (rules/bench.smk): measured before collection where the config's
        # prediction.bench_comm asks (the default), else taken once measured on request; a new table re-collects
        bench=lambda wildcards: [BENCH_TABLE] if config["prediction"]["bench_comm"] or BENCH_TABLE.exists() else [],
    params:
        # planning.top_k's forecast (rules/common.smk): collection gives it to runs measured before it; setting,
        # changing or unsetting top_k collects again, and so makes the invocation that writes or removes its file
        # (onstart runs only when there are jobs)
        forecast=FORECAST_STAMP,
    output:
        runs=RESULTS / "metrics.parquet",
        steps=RESULTS / "steps.parquet",
    log:
        LOGS / "collect.log",
    conda:
        "../workflow/envs/scalelab.yaml"
    script:
        "../workflow/scripts/collect.py"
