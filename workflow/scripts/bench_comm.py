"""Snakemake adapter: the collective benchmark (`scalelab bench comm`) into the workflow's table.
A script, as every other rule's adapter: Snakemake runs it with its own interpreter, where a shell
command's `python` is whichever comes first on PATH (a system one without scalelab, after
`make run`, which starts .venv/bin/snakemake without activating the environment)."""
import contextlib
import sys

from scalelab.cli import main

params = snakemake.params
with open(snakemake.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    code = main(["bench", "comm", "--out", snakemake.output[0], "--world-sizes", params.world_sizes,
                 "--device", params.device, "--threads-per-rank", str(params.threads_per_rank),
                 "--timeout", str(params.timeout_s)])
sys.exit(code)
