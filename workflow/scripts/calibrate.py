"""Snakemake adapter: a CPU sweep's peak FLOP/s, measured once on the idle machine
(scalelab.calibration). Every run of the sweep reads it and names it in peak_flops_source."""
import json
import sys

from scalelab.calibration import write_calibration

with open(snakemake.log[0], "w") as log:
    record = write_calibration(snakemake.output[0], snakemake.params.precisions, snakemake.params.threads)
    print(json.dumps(record, indent=1), file=log)
    peaks = ", ".join(f"{name} {flops / 1e9:.1f} GFLOP/s" for name, flops in record["peaks_flops"].items())
    print(f"scalelab: CPU peak per rank ({record['threads']} thread(s)), measured on the idle machine: {peaks}",
          file=sys.stderr)
