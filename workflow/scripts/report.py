"""Snakemake adapter: build the report from the Parquet tables (scalelab.report.report.build_report).
The best configuration and the report's path are printed when the workflow ends (the onsuccess
handler in rules/report.smk)."""
import logging
from pathlib import Path

from scalelab.report.figures import FIGURES_DIR
from scalelab.report.report import build_report

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
out_dir = Path(snakemake.output.html).parent
assert Path(snakemake.output.figures) == out_dir / FIGURES_DIR, "the rule declares the folder build_report writes"
path = build_report(Path(snakemake.input.runs).parent, out_dir, workers=snakemake.threads)
logging.info("report written to %s", path)
