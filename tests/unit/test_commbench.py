"""scalelab bench comm (issue #29, point 1): real gloo ranks time every collective; the table's
columns follow nccl-tests (algorithm and bus bandwidth); bad options are named."""

import pandas as pd
import pytest

from scalelab.cli import main
from scalelab.registries import comm_table
from scalelab.run import commbench


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


def test_the_hypervisors_share_of_the_ranks_cores_is_kept_per_world_size_and_warned_above_2_percent(tmp_path, monkeypatch, capsys):
    """Each world size's ranks report the most the hypervisor took of their cores while timed (None: under a second of
    ticks): the table keeps it through Parquet, the command warns above 2%, and validation reads the fitted rows'."""
    from scalelab.formulas import link_fit

    steal = {1: 0.3, 2: 0.05}  # world size 1 is no row the step-time model fits

    def timed(n, **_):
        rows = [{"collective": "all_reduce", "bytes": 4096, "batch": 1, "time_s": 1e-4, "time_s_mean": 1e-4,
                 "time_s_min": 1e-4, "time_s_max": 1e-4, "reps": 2}]
        return {"rows": rows, "rank_cores": "r0:0", "backend": "gloo", "device_name": "cpu", "torch_version": "x",
                "host_steal_share": steal[n]}

    monkeypatch.setattr(commbench, "run_world_size", timed)
    out = tmp_path / "comm.parquet"
    assert main(["bench", "comm", "--out", str(out), "--device", "cpu", "--world-sizes", "1,2"]) == 0
    assert ("warning: the hypervisor took 30.0% of the ranks' cores' time while they were timed (other guests of the "
            "physical host were busy): these times run high (measure again on a quiet host)") in capsys.readouterr().err
    table = comm_table.read_table(out)
    assert table.set_index("world_size")["host_steal_share"].to_dict() == {1: 0.3, 2: 0.05}
    assert link_fit.bench_steal(table) == 0.05  # the fitted rows' (two ranks or more)
    steal.update({1: None, 2: None})  # too short a window to say, at every world size
    assert main(["bench", "comm", "--out", str(out), "--device", "cpu", "--world-sizes", "1,2"]) == 0
    assert "hypervisor" not in capsys.readouterr().err
    assert link_fit.bench_steal(comm_table.read_table(out)) is None
    assert link_fit.bench_steal(table.assign(device_type="cuda")) is None  # NCCL's times hardly depend on the host's cores


def test_the_ranks_own_cores_busy_as_they_start_are_warned_about_not_the_machines_load(tmp_path, monkeypatch, capsys):
    """bench comm records, per world size, the share of its ranks' cores other processes kept busy in the half second
    before the ranks started, and warns above 10%. The machine's 1-minute load is kept as context only: on a 16-core
    GPU machine, its 2 pinned cores idle, a load of 3.35 (work on its other cores, or ended) warned 'other work shared
    the host' before."""
    busy = {1: 0.0, 2: 0.0}
    seen_cores = []

    def sample(cores):
        seen_cores.append(cores)
        return busy[len(seen_cores) % 2 or 2]  # world size 1, then 2

    def timed(n, **_):
        rows = [{"collective": "all_reduce", "bytes": 4096, "batch": 1, "time_s": 1e-4, "time_s_mean": 1e-4,
                 "time_s_min": 1e-4, "time_s_max": 1e-4, "reps": 2}]
        return {"rows": rows, "rank_cores": "r0:0", "backend": "gloo", "device_name": "cpu", "torch_version": "x",
                "host_steal_share": 0.0}

    monkeypatch.setattr(commbench, "run_world_size", timed)
    monkeypatch.setattr(commbench, "busy_share", sample)
    monkeypatch.setattr(commbench, "planned_cores", lambda n, threads: list(range(n * threads)))
    monkeypatch.setattr(commbench.os, "getloadavg", lambda: (3.35, 3.0, 2.0))
    out = tmp_path / "comm.parquet"
    assert main(["bench", "comm", "--out", str(out), "--device", "cpu", "--world-sizes", "1,2"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert seen_cores == [[0], [0, 1]]  # planned_cores asked per world size (tests/unit/test_noise.py tests it)
    table = comm_table.read_table(out)
    assert table.set_index("world_size")["busy_share_before"].to_dict() == {1: 0.0, 2: 0.0}
    assert table["load_1min_before"].eq(3.35).all()
    assert comm_table.busy_before(table) == 0.0

    busy.update({1: 0.0, 2: 0.34})
    seen_cores.clear()
    assert main(["bench", "comm", "--out", str(out), "--device", "cpu", "--world-sizes", "1,2"]) == 0
    assert ("warning: other processes kept 34.0% of the ranks' cores busy as the ranks started (if they went on, they "
            "shared the cores: these times may include their work; measure again on an idle machine)") in capsys.readouterr().err
    table = comm_table.read_table(out)
    assert comm_table.busy_before(table) == 0.34
    assert comm_table.busy_before(table.assign(device_type="cuda")) is None  # NCCL's times hardly depend on the host's cores
    assert comm_table.busy_before(table.drop(columns="busy_share_before")) is None  # a table from before the column


@pytest.mark.parametrize("device, forkable", [("cpu", True), ("cuda", False)])
def test_only_a_cpu_benchmarks_ranks_are_offered_to_the_prefork_server(tmp_path, monkeypatch, capsys, device, forkable):
    """A GPU's ranks are always new processes (CUDA and fork); a CPU's are offered to the server, and a refusal is
    said on stderr (the bench_comm job's log in a sweep). start_and_wait stands in: it starts nothing here (the
    real one, both ways, is tests/run/test_commbench.py's)."""
    from scalelab.run.ranks import Waited

    asked = []

    def stand_in(processes, log, timeout_s, forkable=False):
        asked.append((len(processes), forkable))
        return Waited([0] * len(processes), False, False, "prefork server x refused: another Python" if forkable else None)

    monkeypatch.setattr(commbench, "start_and_wait", stand_in)
    assert commbench._start_ranks(2, tmp_path / "run_plan.json", tmp_path / "ranks.log", 10, device) == ([0, 0], False)
    assert asked == [(2, forkable)]
    said = "scalelab: the benchmark's ranks run as new processes: prefork server x refused: another Python"
    assert (said in capsys.readouterr().err) == forkable
