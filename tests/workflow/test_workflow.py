"""The workflow itself: lint, a real data step, an end-to-end sweep and regeneration (kills: test_faults)."""
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from scalelab.harness.testing import snakemake_cmd, snakemake_env
from scalelab.planning.sweep import RUN_DIR_GLOB, RunPoint
from scalelab.report.figures import FIGURES
from support import REPO, SNAKEMAKE, planned_jobs, snakemake, tiny_config, write_workdir


def test_lint_passes():
    proc = subprocess.run([SNAKEMAKE, "--lint"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_data_step_on_a_text_corpus(tmp_path):
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    cfg = tiny_config(dataset={"name": "fox", "source": "text", "path": "corpus.txt"})
    workdir = write_workdir(tmp_path, cfg)
    snakemake(workdir, "--cores", "1", "results/data/fox/meta.json")
    meta = json.loads((tmp_path / "results/data/fox/meta.json").read_text())
    assert meta["n_train_tokens"] + meta["n_val_tokens"] == 44 * 200
    assert (tmp_path / "results/logs/data/fox.log").exists()


def _planned(workdir, checkout: Path | None = None, *targets: str) -> dict:
    """{rule: count} of what `snakemake -n` would run for targets (default: all), with the workflow of another
    checkout if given."""
    if checkout is None:
        out = snakemake(workdir, "-n", "--cores", "2", *targets).stdout
    else:
        proc = subprocess.run([SNAKEMAKE, "-s", str(checkout / "Snakefile"), "-d", str(workdir), "-n", "--cores", "2"],
                              capture_output=True, text=True, timeout=300,
                              env=snakemake_env(PYTHONPATH=str(checkout / "src")))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        out = proc.stdout
    return {} if "Job stats:" not in out else {
        k: int(v) for k, v in re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1], flags=re.M) if k != "total"}


def _checkout_with_a_new_train_key(dest: Path, key: str, default: float) -> Path:
    """A copy of this checkout as a later version would be: one more train key, with a default, in
    the schema and the typed config."""
    dest.mkdir(parents=True)
    for part in ("Snakefile", "rules", "workflow", "profiles", "src"):
        if (REPO / part).is_dir():
            shutil.copytree(REPO / part, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(REPO / part, dest / part)
    [schema] = list((dest / "src").rglob("config.schema.yaml"))
    lines = schema.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("  train:"))
    at = next(i for i in range(at, len(lines)) if lines[i].strip() == "properties:")
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())] + "  "
    lines.insert(at + 1, f"{indent}{key}: {{type: number, default: {default}}}\n")
    schema.write_text("".join(lines))
    typed = next(p for p in (dest / "src").rglob("*.py") if "class TrainConfig:" in p.read_text())
    typed.write_text(typed.read_text().replace("class TrainConfig:\n", f"class TrainConfig:\n    {key}: float = _default('train', '{key}')\n"))
    return dest


def test_corpus_folder_edited_in_place_reprepares_and_reruns(tmp_path):
    """Every file of a corpus folder is an input of the data step (not the folder, whose mtime
    an in-place edit leaves alone): an edit re-prepares the data and reruns the runs."""
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 100)
    (corpus / "sub" / "b.txt").write_text("pack my box with five dozen liquor jugs\n" * 100)
    cfg = tiny_config(dataset={"name": "fox", "source": "text", "path": "corpus"})
    workdir = write_workdir(tmp_path, cfg)
    snakemake(workdir, "--cores", "2", "collect")  # the tables: the report is not this test's (nor the next one's)
    data, run = tmp_path / "results/data/fox", tmp_path / "results/runs" / RunPoint("fp32", 0, 1).path
    before = json.loads((data / "meta.json").read_text())
    (corpus / ".b.txt.swp").write_text("an editor's file: hidden, not read")
    assert _planned(workdir, None, "collect") == {}, "a hidden file is not part of the corpus"

    folder_mtime = (corpus / "sub").stat().st_mtime_ns
    with open(corpus / "sub" / "b.txt", "r+") as handle:  # in place: same file, same size
        handle.write("PACK")
    assert (corpus / "sub").stat().st_mtime_ns == folder_mtime
    assert _planned(workdir, None, "collect") == {"prepare_data": 1, "train": 1, "collect": 1}
    snakemake(workdir, "--cores", "2", "collect")
    after = json.loads((data / "meta.json").read_text())
    assert after["sha256"]["train.bin"] != before["sha256"]["train.bin"]
    assert b"PACK my box" in np.fromfile(data / "train.bin", dtype=after["dtype"]).astype(np.uint8).tobytes()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["dataset_sha256_train"] == after["sha256"]["train.bin"]
    assert _planned(workdir, None, "collect") == {}
    (corpus / "a.txt").unlink()  # a file gone is a changed corpus too
    assert _planned(workdir, None, "collect").get("prepare_data") == 1


def test_tokenized_source_replaced_by_an_older_copy_reprepares_and_reruns(tmp_path):
    """A tokenized corpus replaced by another version carrying an older mtime (rsync -a, cp -p):
    Snakemake's time comparison misses it; the planning compares each source with meta.json's
    record (size and mtime, sha256 when they differ), so the data is prepared again and the runs
    rerun. The same bytes under another time (a touch, a copy) rerun nothing."""
    src = tmp_path / "nanogpt"
    src.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 4000), ("val", 600)):
        rng.integers(0, 256, n).astype(np.uint16).tofile(src / f"{split}.bin")
    workdir = write_workdir(tmp_path, tiny_config(dataset={"name": "tok", "source": "tokenized", "path": "nanogpt"}))
    snakemake(workdir, "--cores", "2", "collect")
    meta_path = tmp_path / "results/data/tok/meta.json"
    train = src / "train.bin"
    original, mtime = train.read_bytes(), train.stat().st_mtime_ns
    assert json.loads(meta_path.read_text())["source"]["files"]["nanogpt/train.bin"]["sha256"] == hashlib.sha256(original).hexdigest()

    def replace(content: bytes, mtime_ns: int):  # what rsync -a does: another file renamed into place, the sender's time
        tmp = src / ".train.bin.new"
        tmp.write_bytes(content)
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
        tmp.replace(train)

    os.utime(train)  # touched: newer, same bytes
    assert _planned(workdir, None, "collect") == {}
    replace(original, mtime - 3600 * 10**9)  # a copy of the same bytes, older
    assert _planned(workdir, None, "collect") == {}
    newer_version = rng.integers(0, 256, 4000).astype(np.uint16).tobytes()  # same size, other tokens
    replace(newer_version, mtime - 7200 * 10**9)
    assert _planned(workdir, None, "collect") == {"prepare_data": 1, "train": 1, "collect": 1}
    snakemake(workdir, "--cores", "1", "results/data/tok/meta.json")  # the data step alone
    after = json.loads(meta_path.read_text())
    assert after["sha256"]["train.bin"] == hashlib.sha256(newer_version).hexdigest(), "a folder's train.bin is used as it is"
    assert _planned(workdir, None, "collect") == {"train": 1, "collect": 1}, "the runs, on the new tokens"


@pytest.mark.workflow(cost_s=85)  # the order `make test` hands out work (tests/conftest.py)
def test_sweep_end_to_end_then_nothing_to_do(tmp_path):
    # the baseline (fp32-z0) runs twice at each world size: the sweep measures its own noise
    cfg = tiny_config(sweep={"precision": ["fp32", "bf16"], "zero_stage": [0, 3], "world_size": [1, 2]}, repeats={"baseline": 2})
    workdir = write_workdir(tmp_path, cfg)
    out = snakemake(workdir, "--cores", "2")
    summaries = sorted((tmp_path / "results/runs").glob(f"{RUN_DIR_GLOB}/summary.json"))
    assert len(summaries) == 8 + 2
    calibration = re.search(r"scalelab: CPU peak per rank \(1 thread\(s\)\), measured on the (?:idle|busy) machine "
                            r"\(load [\d.]+ on \d+ cores[^)]*\): (.*)", out.stderr)
    assert calibration and out.stderr.count("scalelab: CPU peak per rank") == 1, out.stderr[-3000:]  # once per results folder
    started = []
    for path in summaries:
        summary = json.loads(path.read_text())
        assert summary["status"] == "ok", (path, summary["reason"])
        steps = pq.read_table(path.parent / "steps.parquet")
        assert steps.num_rows == cfg["train"]["steps"]
        # one folder level, named by the run id; point.json holds every axis value
        assert path.parent.relative_to(tmp_path / "results/runs").as_posix() == summary["run_id"]
        point = json.loads((path.parent / "point.json").read_text())
        assert point == {**RunPoint(summary["precision"], summary["zero_stage"], summary["world_size"],
                                    repeat=2 if summary["run_id"].endswith("-r2") else 1).to_json()}
        assert (tmp_path / "results/logs/runs" / f"{summary['run_id']}.log").exists()
        # the peak every run divides by is the sweep's calibration, printed once; each rank had a core of its own
        assert summary["peak_flops_source"].startswith("sweep calibration: measured"), summary["peak_flops_source"]
        assert f"{summary['peak_flops_per_device'] / 1e9:.1f} GFLOP/s" in calibration.group(1)
        assert summary["rank_cores"] == ("r0:0" if summary["world_size"] == 1 else "r0:0 r1:1"), summary["rank_cores"]
        started.append((summary["started_utc"], summary["wall_time_s"], summary["run_id"]))
    assert {p.parent.name for p in summaries} >= {"fp32-z0-w1-r2", "fp32-z0-w2-r2"}
    # one run at a time (profiles/default's train_slot): no run started before the one before it ended
    started.sort()
    for (t0, wall, run), (t1, _, nxt) in zip(started, started[1:]):
        assert datetime.datetime.fromisoformat(t1).timestamp() >= datetime.datetime.fromisoformat(t0).timestamp() + wall - 1.5, (run, nxt)
    # measured by the first run, kept for this invocation's runs; the next invocation forgets it (onstart)
    assert json.loads((tmp_path / "results/calibration/cpu.json").read_text())["threads"] == 1
    dry = snakemake(workdir, "-n", "--cores", "2")
    assert "Nothing to be done" in dry.stdout + dry.stderr, "the calibration is no input: it reruns nothing"
    # A run's params are the values that differ from the defaults: a time limit reruns nothing, a
    # learning rate every run, a new key at its default (a later version's config) nothing
    write_workdir(tmp_path, tiny_config(sweep=cfg["sweep"], repeats=cfg["repeats"], train={"run_timeout_s": 300}))
    assert _planned(workdir) == {}
    write_workdir(tmp_path, tiny_config(sweep=cfg["sweep"], repeats=cfg["repeats"], train={"lr": 0.001}))
    assert _planned(workdir) == {"train": 10, "collect": 1, "report": 1, "all": 1}
    write_workdir(tmp_path, cfg)
    upgraded = _checkout_with_a_new_train_key(tmp_path / "upgraded", "new_knob", 0.5)
    cfg_with_key = tiny_config(sweep=cfg["sweep"], repeats=cfg["repeats"])
    cfg_with_key["train"]["new_knob"] = 0.5
    write_workdir(tmp_path, cfg_with_key)
    assert _planned(workdir, upgraded) == {}, "a new key at its default reruns nothing"
    cfg_with_key["train"]["new_knob"] = 0.25
    write_workdir(tmp_path, cfg_with_key)
    assert _planned(workdir, upgraded) == {"train": 10, "collect": 1, "report": 1, "all": 1}, \
        "set away from its default, it reruns"
    write_workdir(tmp_path, cfg)
    runs = pq.read_table(tmp_path / "results/metrics.parquet").to_pandas()
    assert sorted(runs["run_id"]) == sorted(json.loads(p.read_text())["run_id"] for p in summaries)
    html = (tmp_path / "results/report/report.html").read_text()
    assert all(run_id in html for run_id in runs["run_id"])
    assert "id='levers'" not in html, "no lever varies in this sweep: no Levers section"
    assert re.search(r"Run-to-run spread of tokens/s: up to [\d.]+% between identical runs \(fp32-z0-w[12]; 2 point\(s\) repeated, 4 runs\)", html)

    # Regenerating the report from cached results schedules no training (nor collection).
    shutil.rmtree(tmp_path / "results/report")
    dry = snakemake(workdir, "-n", "--cores", "2").stdout
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.split("Job stats:")[1], flags=re.M))
    assert jobs.get("report") == "1" and "train" not in jobs and "collect" not in jobs, dry
    snakemake(workdir, "--cores", "2")
    assert (tmp_path / "results/report/report.html").exists()
    snakemake(workdir, "--report", str(tmp_path / "snakemake_report.zip"))
    assert (tmp_path / "snakemake_report.zip").stat().st_size > 10_000
    # Every main figure's PNG is in Snakemake's report, its record captioned with the registry's
    # caption, whole (the RST escaping keeps e.g. loss_curves' |...|).
    with zipfile.ZipFile(tmp_path / "snakemake_report.zip") as archive:
        names = archive.namelist()
        index = archive.read(next(n for n in names if n.count("/") == 1 and n.endswith("/report.html"))).decode()
    for figure in (f for f in FIGURES if f.kind == "main" and f.applies(runs)):  # no loss-scale figure without fp16
        assert any(n.endswith(f"/{figure.name}.png") for n in names), (figure.name, names)
        record = re.search(rf'"results/report/figures/{figure.name}\.png": {{[^{{}}]*?"caption": ("(?:[^"\\]|\\.)*")', index)
        assert record and json.loads(record.group(1)).strip() == f"<p>{figure.caption}</p>", (figure.name, record)


@pytest.mark.workflow(cost_s=60)  # the order `make test` hands out work (tests/conftest.py)
def test_lever_axes_end_to_end(tmp_path):
    """Levers swept like the other axes: in paths, identity columns and the report; points a
    lever does not apply to are left out with a note; GPU-only points are skipped rows."""
    cfg = tiny_config(sweep={"precision": ["fp32", "fp8"], "zero_stage": [0, 3], "world_size": [1],
                             "activation_checkpointing": [False, True], "cpu_offload": [False, True]})
    workdir = write_workdir(tmp_path, cfg)
    proc = snakemake(workdir, "--cores", "2")
    assert "sweep point(s) left out" in proc.stderr and "cpu_offload applies to ZeRO stage 3" in proc.stderr
    runs = pq.read_table(tmp_path / "results/metrics.parquet").to_pandas().set_index("run_id")
    # 2 precisions x (stage 0: ac off/on; stage 3: ac off/on x offload off/on)
    assert len(runs) == 12
    assert (tmp_path / "results/runs" / RunPoint("fp32", 3, 1, None, True, False).path / "summary.json").exists()
    ok = runs[runs["status"] == "ok"]
    assert sorted(ok.index) == ["fp32-z0-w1", "fp32-z0-w1-ac", "fp32-z3-w1", "fp32-z3-w1-ac"]
    assert ok.loc["fp32-z3-w1-ac", "activation_checkpointing"] and not ok.loc["fp32-z3-w1", "activation_checkpointing"]
    assert ok.loc["fp32-z3-w1-ac", "activation_bytes_measured"] < ok.loc["fp32-z3-w1", "activation_bytes_measured"]
    skipped = runs[runs["status"] == "skipped"]
    assert len(skipped) == 8 and skipped["reason"].str.len().gt(20).all()
    assert "cpu_offload moves model state" in skipped.loc["fp32-z3-w1-offload", "reason"]
    assert "fp8 needs a GPU" in skipped.loc["fp8-z0-w1-ac", "reason"]
    html = (tmp_path / "results/report/report.html").read_text()
    assert "id='levers'" in html and "<figure id='lever_activation_checkpointing'>" in html and "<figure id='lever_cpu_offload'>" in html
    assert (tmp_path / "results/report/figures/lever_cpu_offload.png").stat().st_size > 1000
    assert "fp8 against bf16" in html
    dry = snakemake(workdir, "-n", "--cores", "2")
    assert "Nothing to be done" in dry.stdout + dry.stderr


def _files(folder: Path) -> dict:
    """Every file's bytes (hash), modification time and inode: any rewrite shows."""
    return {p.relative_to(folder).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns, p.stat().st_ino)
            for p in sorted(folder.rglob("*")) if p.is_file()}


# Each of the two hung runs waits this long: long enough for a 12-step one-rank run to end ok on a
# loaded 2-core machine (0.5 s of wall time idle, its ranks forked), short enough not to idle the suite (it was 15 s).
RETRY_TIMEOUT_S = 8


@pytest.mark.workflow(cost_s=70)  # the order `make test` hands out work (tests/conftest.py)
def test_timed_out_runs_are_retried_with_one_command_and_ok_runs_are_untouched(tmp_path):
    """A real timeout (rank 1 hangs, train.run_timeout_s stops the run), `scalelab status`, then
    `scalelab retry --status timeout`: Snakemake's dry run plans exactly those runs (and collection
    and the report); the rerun ends ok, and the ok runs' files are byte-identical and never rewritten."""
    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [0, 3], "world_size": [1, 2]}, train={"run_timeout_s": RETRY_TIMEOUT_S})
    workdir = write_workdir(tmp_path, cfg)
    results = tmp_path / "results"
    # rank 1 sleeps before step 3: the 2-rank runs time out; the 1-rank runs have no rank 1 and end ok
    proc = subprocess.run(snakemake_cmd(workdir, "--cores", "2"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=900, env=snakemake_env(SCALELAB_FAULT="hang@step=3,rank=1"))
    assert proc.returncode == 0, proc.stdout[-5000:]
    # the end of the terminal output: the best configuration per world size and the report's path
    tail = proc.stdout[proc.stdout.rindex("steps (100%) done"):]
    assert "Best configuration per world size:" in tail and f"report: {(results / 'report' / 'report.html').resolve()}" in tail, tail
    assert re.search(r"world size 1: fp32-z\d-w1 +[\d,]+ tokens/s", tail) and "world size 2: no run ended ok" in tail, tail
    assert f"2 run(s) not ok: scalelab status {results.resolve()}" in tail

    scalelab = str(Path(SNAKEMAKE).parent / "scalelab")
    status = subprocess.run([scalelab, "status", str(results)], capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    assert re.search(r"^  ok +2$", status.stdout, re.M) and re.search(r"^  timeout +2$", status.stdout, re.M), status.stdout
    assert status.stdout.count(f"run exceeded train.run_timeout_s={RETRY_TIMEOUT_S} s and was stopped") == 2
    print(status.stdout)  # shown with pytest -s

    ok_dirs = [results / "runs" / RunPoint("fp32", stage, 1).path for stage in (0, 3)]
    timed_out = [RunPoint("fp32", stage, 2) for stage in (0, 3)]
    before = {d: _files(d) for d in ok_dirs}
    retry = subprocess.run([scalelab, "retry", str(results), "--status", "timeout"], capture_output=True, text=True, timeout=120)
    assert retry.returncode == 0 and "2 run(s) to rerun" in retry.stdout, retry.stdout + retry.stderr
    for point in timed_out:
        assert not (results / "runs" / point.path / "summary.json").exists()
        assert not (results / "runs" / point.path / "steps.parquet").exists()

    # Snakemake plans exactly the retried runs, then collection and the report
    dry = snakemake(workdir, "-n", "--cores", "2").stdout
    jobs = planned_jobs(dry)
    trains = sorted(j["wildcards"]["run_id"] for j in jobs if j["rule"] in ("train", "train_multinode"))
    assert trains == ["fp32-z0-w2", "fp32-z3-w2"], dry
    assert sorted(j["rule"] for j in jobs if not j["rule"].startswith("train")) == ["all", "collect", "report"], dry

    snakemake(workdir, "--cores", "2")  # no fault this time
    for point in timed_out:
        assert json.loads((results / "runs" / point.path / "summary.json").read_text())["status"] == "ok"
    assert {d: _files(d) for d in ok_dirs} == before, "ok runs: byte-identical, never rewritten"
    dry = snakemake(workdir, "-n", "--cores", "2")
    assert "Nothing to be done" in dry.stdout + dry.stderr


@pytest.mark.workflow(cost_s=100)  # the order `make test` hands out work (tests/conftest.py)
def test_compile_lever_end_to_end(tmp_path):
    """The compile lever swept on and off: every run ok, each compiled run paired with its
    eager twin in the report's lever table, with its compilation time and the lever figure."""
    # fp32 alone: a 16-bit compiled run is the GPU check's dry run's (bf16) and tests/run/test_levers.py's (fp8's
    # bf16 compute); each compiled run costs ~8 s of compilation on this CPU
    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [0, 3], "world_size": [1], "compile": [False, True]},
                      train={"run_timeout_s": 900})
    workdir = write_workdir(tmp_path, cfg)
    snakemake(workdir, "--cores", "2", timeout=1800)
    runs = pq.read_table(tmp_path / "results/metrics.parquet").to_pandas().set_index("run_id")
    assert len(runs) == 4 and (runs["status"] == "ok").all(), runs[["status", "reason"]]
    compiled = runs[runs["compile"]]
    assert sorted(compiled.index) == ["fp32-z0-w1-compiled", "fp32-z3-w1-compiled"]
    assert (compiled["compile_time_s"] > 0).all() and (compiled["compile_graphs_in_loop"] == 0).all()
    assert runs.loc[~runs["compile"], "compile_time_s"].isna().all()
    assert (tmp_path / "results/runs" / RunPoint("fp32", 3, 1, compile=True).path / "summary.json").exists()
    html = (tmp_path / "results/report/report.html").read_text()
    assert "id='levers'" in html and "<figure id='lever_compile'>" in html and "compile_time_s" in html
    assert (tmp_path / "results/report/figures/lever_compile.png").stat().st_size > 1000
    from scalelab.report.levers import lever_table

    table = lever_table(runs.reset_index())
    pairs = table[table["lever"] == "compile"].set_index("run_id")
    assert sorted(pairs.index) == sorted(compiled.index)
    for run_id, pair in pairs.iterrows():
        assert pair["baseline_run_id"] == run_id.removesuffix("-compiled") and pair["status"] == "ok"
        assert pair["compile_time_s"] > 0 and pair["step_time_ratio"] > 0
        for cell in (run_id, pair["baseline_run_id"]):  # a table cell holding the run id (cells carry a class)
            assert re.search(rf"<td[^>]*>{re.escape(cell)}</td>", html), cell
    # the eager fp32 twins follow the same trajectory as their compiled runs (within rounding)
    assert (pairs.loc[["fp32-z0-w1-compiled", "fp32-z3-w1-compiled"], "final_loss_rel_diff"] < 1e-5).all()
