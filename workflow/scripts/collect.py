"""Snakemake adapter: collect run files into the Parquet tables (scalelab.results.collect.collect)."""
import logging
from pathlib import Path

from scalelab.results.collect import collect

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
results = Path(snakemake.output.runs).parent
run_paths = [Path(p).parent.relative_to(results / "runs").as_posix() for p in snakemake.input.summaries]
result = collect(results, run_paths)
for problem in result["problems"]:
    logging.warning(problem)
logging.info("collected %d runs, %d steps", result["runs"], result["steps"])
