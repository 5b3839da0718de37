# Stage 4: plots, report.html and summary.md from the two Parquet tables alone. Deleting
# results/report/ and rerunning rebuilds only this (no training): its inputs are the tables.
# The figures, their captions and formats are declared once, in scalelab.report.figures:
# every file lands in results/report/figures/, and Snakemake's report shows each PNG there
# with its caption (workflow/report/figure.rst reads it from params.captions).
from scalelab.report.figures import FIGURES_DIR, rst_captions


rule report:
    input:
        runs=RESULTS / "metrics.parquet",
        steps=RESULTS / "steps.parquet",
    output:
        html=report(RESULTS / "report" / "report.html", caption="../workflow/report/report.rst", category="Report"),
        summary=RESULTS / "report" / "summary.md",
        figures=report(
            directory(RESULTS / "report" / FIGURES_DIR),
            patterns=["{name}.png"],
            caption="../workflow/report/figure.rst",
            category="Figures",
        ),
    params:
        captions=rst_captions(),
    log:
        LOGS / "report.log",
    # the figures are drawn by this many processes (capped at --cores)
    threads: 2
    conda:
        "../workflow/envs/scalelab.yaml"
    script:
        "../workflow/scripts/report.py"
