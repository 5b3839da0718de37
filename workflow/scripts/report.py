"""Snakemake adapter: build the report from the Parquet tables (scalelab.analysis.report.build_report)."""
import logging
from pathlib import Path

from scalelab.analysis.report import build_report

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
path = build_report(Path(snakemake.input.runs).parent, Path(snakemake.output.html).parent)
logging.info("report written to %s", path)
