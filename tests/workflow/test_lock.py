"""One writer per results folder (scalelab.results.lock): unit tests with real holder processes, and
two Snakemake workflows from two checkouts sharing one absolute results_dir."""
import json
import socket
import subprocess

import pyarrow.parquet as pq

from scalelab.harness.testing import run_snakemake, snakemake_cmd, snakemake_env
from scalelab.planning.sweep import RUN_DIR_GLOB
from scalelab.results.lock import LOCK_NAME, holder
from support import tiny_config, write_workdir
from support.lock import _first_line, _holder, _stop


def test_two_checkouts_one_results_dir(tmp_path):
    """Two Snakemake workflows from two working directories whose configs name one absolute
    results_dir, started together: one runs, the other is refused naming the lock and its
    holder; no failed row, no corrupt or temporary file; afterwards a rerun works."""
    results = tmp_path / "shared_results"
    cfg = tiny_config(results_dir=str(results), train={"steps": 150})
    works = [write_workdir(tmp_path / name, cfg) for name in ("checkout_a", "checkout_b")]
    # the tables alone (collect): what the lock guards is written there; the report adds seconds and nothing to check
    procs = [subprocess.Popen(snakemake_cmd(w, "--cores", "1", "collect"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True, env=snakemake_env()) for w in works]
    try:
        outputs = [p.communicate(timeout=420)[0] for p in procs]
    finally:
        _stop(*procs)
    codes = [p.returncode for p in procs]
    assert sorted(codes)[0] == 0 and sorted(codes)[1] != 0, (codes, outputs)
    winner, refused = (0, 1) if codes[0] == 0 else (1, 0)
    message = " ".join(outputs[refused].split())
    for part in ("is in use by another scalelab workflow", str(results / LOCK_NAME), f"pid {procs[winner].pid}",
                 f"host {socket.gethostname()}", f"working directory {works[winner]}"):
        assert part in message, (part, outputs[refused][-3000:])
    assert holder(results) is None, "released when the workflow ended"

    def audit():
        summaries = sorted(results.glob(f"runs/{RUN_DIR_GLOB}/summary.json"))
        assert len(summaries) == 1
        assert all(json.loads(p.read_text())["status"] == "ok" for p in summaries)
        runs = pq.read_table(results / "metrics.parquet").to_pandas()
        assert list(runs["status"]) == ["ok"]
        assert pq.read_table(results / "steps.parquet").num_rows == 150
        json.loads((results / "data/tiny/meta.json").read_text())
        assert not [p for p in results.rglob("*") if p.name.endswith(".tmp") or ".stale." in p.name]

    audit()
    # the refused checkout, once the first is done: it takes the lock and writes
    rerun = run_snakemake(works[refused], "--cores", "1", "--forcerun", "collect", "collect", timeout=300)
    assert "is in use" not in rerun.stderr and "collect" in rerun.stderr
    assert holder(results) is None
    audit()


def test_dry_run_not_refused_by_a_running_workflow(tmp_path):
    """Only a workflow about to run jobs takes the lock: -n plans past a live holder."""
    cfg = tiny_config(results_dir=str(tmp_path / "results"))
    work = write_workdir(tmp_path / "checkout", cfg)
    (tmp_path / "go").touch()
    holder = _holder(tmp_path, tmp_path / "results", "hold")
    try:
        assert _first_line(holder).startswith("won")
        dry = run_snakemake(work, "-n", "--cores", "1", timeout=120)
        assert "prepare_data" in dry.stdout and "in use" not in dry.stdout + dry.stderr
        refused = run_snakemake(work, "--cores", "1", check=False, timeout=120)
        assert refused.returncode != 0 and f"pid {holder.pid}" in refused.stderr
        assert not (tmp_path / "results" / "data").exists(), "the refused workflow wrote nothing"
    finally:
        _stop(holder)
