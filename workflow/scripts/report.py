"""Snakemake adapter: build the report from the Parquet tables (scalelab.analysis.report.build_report)."""
import logging
from pathlib import Path

from scalelab.analysis.figures import FIGURES_DIR
from scalelab.analysis.report import build_report

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
out_dir = Path(snakemake.output.html).parent
assert Path(snakemake.output.figures) == out_dir / FIGURES_DIR, "the rule declares the folder build_report writes"
path = build_report(Path(snakemake.input.runs).parent, out_dir)
logging.info("report written to %s", path)
