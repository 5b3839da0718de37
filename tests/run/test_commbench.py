"""scalelab bench comm (issue #29, point 1): real gloo ranks time every collective; the table's
columns follow nccl-tests (algorithm and bus bandwidth); bad options are named."""

import os

import pytest

from scalelab.cli import main
from scalelab.formulas import link_fit, links
from scalelab.registries import comm_table

SIZES = [4096, 262144, 16777216]  # up to 16 MiB: times that grow beyond gloo's stalls on a busy host (4 MiB was
# not always enough: a CI run beside another test's ranks timed 4 KiB as slow as 4 MiB, leaving no bandwidth to fit)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """World sizes 1 and 2, every collective, one call at a time and batches of 2 (few repetitions: a
    check of the bench, not a measurement)."""
    path = tmp_path_factory.mktemp("bench") / "comm.parquet"
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two ranks need two cores")
    assert main(["bench", "comm", "--out", str(path), "--world-sizes", "1,2", "--device", "cpu", "--min-bytes", "4096",
                 "--max-bytes", "16777216", "--factor", "64", "--reps", "2", "--warmup", "1", "--min-seconds", "0",
                 "--batches", "1,2", "--batch-max-bytes", "16777216", "--batched-collectives", ",".join(links.COLLECTIVES),
                 "--timeout", "120"]) == 0
    return comm_table.read_table(path)


def test_every_collective_world_size_size_and_batch_is_timed(table):
    expected = {(c, n, s, b) for c in links.COLLECTIVES for n in (1, 2) for s in SIZES for b in (1, 2)}
    assert set(zip(table["collective"], table["world_size"], table["bytes"], table["batch"])) == expected
    assert (table["time_s"] > 0).all() and (table["time_s_min"] <= table["time_s"]).all()
    assert (table["time_s"] <= table["time_s_max"]).all() and (table["reps"] == 2).all()
    assert set(table["backend"]) == {"gloo"} and set(table["device_type"]) == {"cpu"}
    # each rank pinned to its own core, as training ranks are
    two_ranks = table.loc[table["world_size"] == 2, "rank_cores"]
    assert all(c.startswith("r0:") and " r1:" in c for c in two_ranks)
    # the hypervisor's share of the ranks' cores while timed, one per world size: a share, or unknown where its ranks
    # ran under a second of one core's ticks
    steal = table["host_steal_share"].astype(float)
    assert (steal.isna() | ((steal >= 0) & (steal < 1))).all(), steal.tolist()
    assert (steal.groupby(table["world_size"]).nunique(dropna=False) == 1).all(), steal.tolist()
    # the share of those cores other processes kept busy in the half second before the ranks started: read on Linux
    busy = table["busy_share_before"].astype(float)
    assert ((busy >= 0) & (busy <= 1)).all(), busy.tolist()


def test_bandwidths_follow_nccl_tests(table):
    assert table["algbw_Bps"].tolist() == pytest.approx((table["bytes"] / table["time_s"]).tolist())
    factors = {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5, "broadcast": 1.0}  # n = 2
    two = table[table["world_size"] == 2]
    assert two["busbw_Bps"].tolist() == pytest.approx((two["algbw_Bps"] * two["collective"].map(factors)).tolist())
    one = table[(table["world_size"] == 1) & (table["collective"] != "broadcast")]
    assert (one["busbw_Bps"] == 0).all()  # a one-rank group moves nothing over a link


def test_the_table_fits_a_link(table):
    fitted = link_fit.fit_link(table)
    assert fitted.bandwidth_Bps > 0 and fitted.latency_s >= 0 and "gloo" in fitted.source


def test_a_rendezvous_port_taken_is_retried_on_a_new_one(monkeypatch):
    """As a run's launcher does (scalelab.run.ranks.RENDEZVOUS_ATTEMPTS): the benchmark's rank 0 finds
    its port taken by another process, and the ranks start again on a new port."""
    import socket

    from scalelab.run import commbench
    from support import taken_port_first

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        first_the_taken_port, handed = taken_port_first(taken.getsockname()[1], commbench.free_port)
        monkeypatch.setattr(commbench, "free_port", first_the_taken_port)
        record = commbench.run_world_size(2, sizes=[1024], collectives=["all_reduce"], reps=2, warmup=1, min_seconds=0,
                                          batches=[1], batched_collectives=[], timeout_s=120)
    assert len(handed) == 2  # the taken port, then a new one for the second attempt
    assert {r["collective"] for r in record["rows"]} == {"all_reduce"}


@pytest.mark.parametrize("server", [True, False], ids=["forked", "new-processes"])
def test_a_cpu_benchmarks_ranks_start_as_a_cpu_runs_do(monkeypatch, server):
    """Forked by the prefork server when there is one (this pytest worker's), as a CPU run's ranks are, else new
    processes: either way both ranks end 0 and rank 0's rows come back (scalelab.run.ranks.start_and_wait, watched
    as it runs for real)."""
    from scalelab.run import commbench
    from scalelab.run.prefork import PREFORK_ENV

    if not server:
        monkeypatch.delenv(PREFORK_ENV, raising=False)
    assert bool(os.environ.get(PREFORK_ENV)) == server, "the suite's pytest worker has a prefork server (tests/conftest.py)"
    waits = []

    def watched(*args, **kwargs):
        waits.append(real(*args, **kwargs))
        return waits[-1]

    real = commbench.start_and_wait
    monkeypatch.setattr(commbench, "start_and_wait", watched)
    record = commbench.run_world_size(2, sizes=[4096], collectives=("all_reduce",), reps=1, warmup=0, min_seconds=0,
                                      batches=[1], batched_collectives=(), timeout_s=120)
    assert waits == [([0, 0], False, server, None)]
    assert [(r["collective"], r["bytes"], r["batch"]) for r in record["rows"]] == [("all_reduce", 4096, 1)]
