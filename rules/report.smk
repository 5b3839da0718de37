# Stage 4: plots, report.html and summary.md from the two Parquet tables alone. Deleting
# results/report/ and rerunning rebuilds only this (no training): its inputs are the tables.

PLOTS = ["memory_model_state", "memory_peak", "throughput", "mfu_heatmap", "loss_curves", "loss_scale", "communication"]


rule report:
    input:
        runs=RESULTS / "metrics.parquet",
        steps=RESULTS / "steps.parquet",
    output:
        html=report(RESULTS / "report" / "report.html", caption="../workflow/report/report.rst", category="Report"),
        summary=RESULTS / "report" / "summary.md",
        plots=[
            report(RESULTS / "report" / f"{name}.png", caption=f"../workflow/report/{name}.rst", category="Figures")
            for name in PLOTS
        ],
    log:
        LOGS / "report.log",
    conda:
        "../workflow/envs/scalelab.yaml"
    script:
        "../workflow/scripts/report.py"
