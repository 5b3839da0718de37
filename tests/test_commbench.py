"""scalelab bench comm (issue #29, point 1): real gloo ranks time every collective; the table's
columns follow nccl-tests (algorithm and bus bandwidth); bad options are named."""
import os

import pandas as pd
import pytest

from scalelab.cli import main
from scalelab.formulas import links
from scalelab.plan import comm_table
from scalelab.results import prediction
from scalelab.run import commbench

SIZES = [4096, 131072, 4194304]  # up to 4 MiB: times that grow beyond gloo's millisecond stalls on a busy host


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """World sizes 1 and 2, every collective, one call at a time and batches of 2 (few repetitions: a
    check of the bench, not a measurement)."""
    path = tmp_path_factory.mktemp("bench") / "comm.parquet"
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two ranks need two cores")
    assert main(["bench", "comm", "--out", str(path), "--world-sizes", "1,2", "--device", "cpu", "--min-bytes", "4096",
                 "--max-bytes", "4194304", "--factor", "32", "--reps", "2", "--warmup", "1", "--min-seconds", "0",
                 "--batches", "1,2", "--batch-max-bytes", "4194304", "--batched-collectives", ",".join(links.COLLECTIVES),
                 "--timeout", "120"]) == 0
    return comm_table.read_table(path)


@pytest.mark.run
def test_every_collective_world_size_size_and_batch_is_timed(table):
    expected = {(c, n, s, b) for c in links.COLLECTIVES for n in (1, 2) for s in SIZES for b in (1, 2)}
    assert set(zip(table["collective"], table["world_size"], table["bytes"], table["batch"])) == expected
    assert (table["time_s"] > 0).all() and (table["time_s_min"] <= table["time_s"]).all()
    assert (table["time_s"] <= table["time_s_max"]).all() and (table["reps"] == 2).all()
    assert set(table["backend"]) == {"gloo"} and set(table["device_type"]) == {"cpu"}
    # each rank pinned to its own core, as training ranks are
    two_ranks = table.loc[table["world_size"] == 2, "rank_cores"]
    assert all(c.startswith("r0:") and " r1:" in c for c in two_ranks)


@pytest.mark.run
def test_bandwidths_follow_nccl_tests(table):
    assert table["algbw_Bps"].tolist() == pytest.approx((table["bytes"] / table["time_s"]).tolist())
    factors = {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5, "broadcast": 1.0}  # n = 2
    two = table[table["world_size"] == 2]
    assert two["busbw_Bps"].tolist() == pytest.approx((two["algbw_Bps"] * two["collective"].map(factors)).tolist())
    one = table[(table["world_size"] == 1) & (table["collective"] != "broadcast")]
    assert (one["busbw_Bps"] == 0).all()  # a one-rank group moves nothing over a link


@pytest.mark.run
def test_the_table_fits_a_link(table):
    fitted = prediction.fit_link(table)
    assert fitted.bandwidth_Bps > 0 and fitted.latency_s >= 0 and "gloo" in fitted.source


@pytest.mark.unit
def test_message_sizes_and_bad_options(tmp_path, capsys):
    assert commbench.message_sizes(4096, 65536, 4) == [4096, 16384, 65536]
    assert commbench.message_sizes(4096, 100000, 4) == [4096, 16384, 65536, 100000]
    with pytest.raises(ValueError, match="min_bytes"):
        commbench.message_sizes(8192, 4096)
    out = str(tmp_path / "t.parquet")
    assert main(["bench", "comm", "--out", out, "--device", "cpu", "--world-sizes", "100000"]) == 2
    assert "needs more cores than" in capsys.readouterr().err
    assert main(["bench", "comm", "--out", out, "--device", "cpu", "--world-sizes", "two"]) == 2
    assert "--world-sizes must be comma-separated integers" in capsys.readouterr().err
    assert main(["bench", "comm", "--out", out, "--device", "cpu", "--world-sizes", "1", "--collectives", "all_to_all"]) == 2
    assert "unknown collective(s) all_to_all" in capsys.readouterr().err
    assert not (tmp_path / "t.parquet").exists()
    pd.DataFrame({"collective": ["all_reduce"]}).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="bad.parquet: not a bench comm table"):
        comm_table.read_table(tmp_path / "bad.parquet")


@pytest.mark.workflow
def test_the_default_sweep_benches_its_links_alone_and_predicts_every_run(tmp_path):
    """With prediction.bench_comm (the default), a sweep measures <results>/calibration/comm.parquet as
    a job of its own (the training slot held: no run trains beside it) that only collection takes as
    an input (an input of training would retrain every cached run once a new table is written); every
    ok run of the collected table then carries its predicted step time, and the report draws them.
    With bench_comm false, the table is measured only on request (`snakemake bench_comm`)."""
    import re

    import pandas as pd

    from conftest import path_without
    from scalelab.harness.testing import run_snakemake, tiny_config, write_workdir

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
