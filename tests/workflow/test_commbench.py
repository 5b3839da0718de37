"""scalelab bench comm (issue #29, point 1): real gloo ranks time every collective; the table's
columns follow nccl-tests (algorithm and bus bandwidth); bad options are named."""
import os

import pandas as pd

from scalelab.formulas import links
from scalelab.registries import comm_table
from scalelab.run import commbench


def test_the_default_sweep_benches_its_links_alone_and_predicts_every_run(tmp_path):
    """With prediction.bench_comm (the default), a sweep measures <results>/calibration/comm.parquet as
    a job of its own (the training slot held: no run trains beside it) that only collection takes as
    an input (an input of training would retrain every cached run once a new table is written); every
    ok run of the collected table then carries its predicted step time, and the report draws them.
    With bench_comm false, the table is measured only on request (`snakemake bench_comm`)."""
    import re

    from scalelab.harness.testing import run_snakemake, tiny_config, write_workdir
    from support import path_without

    write_workdir(tmp_path / "off", tiny_config(sweep={"world_size": [1, 2]}))
    assert "bench_comm" not in run_snakemake(tmp_path / "off", "-n", "--cores", "2").stdout
    assert "rule bench_comm:" in run_snakemake(tmp_path / "off", "-n", "--cores", "2", "bench_comm").stdout

    workdir = write_workdir(tmp_path / "on", tiny_config(sweep={"world_size": [1, 2]}, prediction={"bench_comm": True}))
    dry = run_snakemake(workdir, "-n", "--cores", "2").stdout
    jobs = {block.split("\n", 1)[0].strip(): block for block in re.split(r"^rule ", dry, flags=re.M)[1:]}
    assert "train_slot=1" in jobs["bench_comm:"]
    assert "comm.parquet" in jobs["collect:"]
    assert "comm.parquet" not in "".join(block for name, block in jobs.items() if name.startswith("train"))
    # as `make run` starts it: the environment's snakemake, its python nowhere on PATH (no `python`
    # at all here), so a job that asked PATH for one would fail
    run_snakemake(workdir, "--cores", "2", timeout=600, env={**os.environ, "PATH": path_without("python")})
    results = workdir / "results"
    table = comm_table.read_table(results / comm_table.BENCH_FILE)
    assert set(table["world_size"]) == {2} and set(table["collective"]) == set(links.COLLECTIVES)
    # batches only for what a strategy issues as a batch (ZeRO-1's broadcasts), up to the CPU's default size
    assert set(table.loc[table["batch"] > 1, "collective"]) == set(commbench.BATCHED_COLLECTIVES) == {"broadcast"}
    assert table["bytes"].max() == commbench.CPU_MAX_BYTES
    assert "bench comm:" in (results / "logs" / "bench_comm.log").read_text()
    runs = pd.read_parquet(results / "metrics.parquet")
    assert (runs["status"] == "ok").all() and len(runs) == 2
    assert runs["predicted_step_time_s"].notna().all(), runs[["run_id", "prediction_note"]].to_string()
    w2 = runs.set_index("world_size").loc[2]
    assert w2["predicted_step_time_s_low"] < w2["predicted_step_time_s"] < w2["predicted_step_time_s_high"]
    assert "compute from world size 1" in w2["prediction_note"]
    assert "predicted_vs_measured" in (results / "report" / "report.html").read_text()
    dry = run_snakemake(workdir, "-n", "--cores", "2")
    assert "Nothing to be done" in dry.stdout + dry.stderr, "measured once per results folder"
