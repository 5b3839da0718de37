"""Snakemake adapter: one training run (scalelab.training.launch.launch_run). Exits 0 whatever the
run's status; the status and reason are in summary.json."""
from pathlib import Path

from scalelab.placement import job_device_plan
from scalelab.training.launch import launch_run

launch_run(
    snakemake.config,
    snakemake.params.point,
    data_dir=Path(snakemake.input.meta).parent,
    run_dir=Path(snakemake.output.summary).parent,
    log_path=snakemake.log[0],
    threads=snakemake.threads,
    repo_dir=snakemake.scriptdir,
    device_plan=job_device_plan(snakemake.params.device, snakemake.config),
    calibration=snakemake.input.get("calibration"),  # a CPU sweep's peak FLOP/s (rule calibrate)
)
