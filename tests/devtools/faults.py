"""Fault drills: kill, hang, crash, bad input, determinism, concurrency — real processes.

    PYTHONPATH=tests python -m devtools.faults            run every drill, print the figures
    PYTHONPATH=tests python -m devtools.faults kill_mid_step hang   run some

Each drill works in a temporary folder, drives Snakemake (and through it torchrun/gloo)
for real, and returns counted facts (faults injected and recovered, rows lost or
duplicated, corrupt files, orphan processes, ...). tests/*/test_faults.py asserts on the
same drills; this module prints them. Faults are injected with SCALELAB_FAULT (see
scalelab.run.fault_injection.Fault and scalelab.io.fault_point).
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from devtools.drill_audit import Drill, audit, count_orphans
from devtools.drill_record import DOC, RECORD, drill_row, write_record
from scalelab.config.reading import UniqueKeyLoader
from scalelab.harness import REPO_ROOT
from scalelab.harness.testing import run_snakemake, snakemake_cmd, snakemake_env, tiny_config, write_workdir
from scalelab.planning.sweep import RUN_DIR_GLOB, sweep_points
from scalelab.run.prefork import FORKED_LAUNCH, PREFORK_ENV

BAD_CONFIGS = REPO_ROOT / "tests" / "bad_configs"


TABLES = "collect"
"""The target of most drills' sweeps: the tables their audit reads, without the report drawn from
them (~5 s of each sweep on 2 cores); no drill injects a fault while it is drawn. The report of
crashed, hung and failed runs is tested from fixture tables (devtools.fixtures); the
drills that still draw one: the diverged sweep (non-finite losses), and the interrupt drills,
which resume the whole workflow with `scalelab resume`."""


def _sweep_cfg(**train) -> dict:
    """Two runs: one single-process, one two-rank (stage 3, the most collectives)."""
    return tiny_config(sweep={"precision": ["fp32"], "zero_stage": [3], "world_size": [1, 2]},
                       train={"steps": 12, "warmup_steps": 2, **train})


# ----------------------------------------------------------------------------- drills


def kill_mid_step(tmp: Path) -> Drill:
    """SIGKILL Snakemake and the runs mid-step, after a checkpoint; --unlock +
    --rerun-incomplete completes the sweep, the killed run resuming from its checkpoint."""
    d = Drill("kill mid-step")
    # long enough to be killed between its first checkpoint (step 20) and its end, whatever the load
    cfg = _sweep_cfg(steps=120, checkpoint_every=20)
    work = write_workdir(tmp, cfg)
    run_snakemake(work, "--cores", "1", f"{cfg['results_dir']}/data/tiny/meta.json")
    # Snakemake starts its own prefork server here (none inherited), which the kill must take down too
    env = {k: v for k, v in snakemake_env().items() if k != PREFORK_ENV}
    proc = subprocess.Popen(snakemake_cmd(work, "--cores", "2"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=env)
    deadline = time.time() + 120
    killed_run = None
    while time.time() < deadline and killed_run is None:
        for ckpt in work.glob(f"results/runs/{RUN_DIR_GLOB}/checkpoint/step_*"):
            if ckpt.name.split("_", 1)[1].isdigit():
                killed_run = ckpt.parent.parent
        time.sleep(0.05)
    d.check(killed_run is not None, "a run wrote a checkpoint")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    d.faults_injected += 1
    count_orphans(str(work), d)
    d.check(not (killed_run / "summary.json").exists(), "no summary for the killed run")
    run_snakemake(work, "--unlock")
    run_snakemake(work, "--cores", "2", "--rerun-incomplete", TABLES)
    summary = json.loads((killed_run / "summary.json").read_text())
    d.check(summary.get("resumed_from_step") is not None, "the killed run resumed from its checkpoint")
    d.notes.append(f"{summary['run_id']} resumed from step {summary.get('resumed_from_step')}")
    d.check(summary.get("launch") == FORKED_LAUNCH, f"the resumed run's ranks were forked (launch: {summary.get('launch')})")
    audit(work, cfg, d)
    d.faults_recovered += not d.checks_failed and d.rows_lost == 0
    return d


def _kill_at(tmp: Path, fault: str, name: str) -> Drill:
    d = Drill(name)
    cfg = _sweep_cfg()
    work = write_workdir(tmp, cfg)
    first = run_snakemake(work, "--cores", "2", TABLES, check=False, env=snakemake_env(SCALELAB_FAULT=fault))
    d.faults_injected += 1
    d.check(first.returncode != 0, f"the {fault} kill failed the first attempt")
    count_orphans(str(work), d)
    run_snakemake(work, "--unlock")
    run_snakemake(work, "--cores", "2", "--rerun-incomplete", TABLES)
    audit(work, cfg, d)
    d.faults_recovered += not d.checks_failed and d.rows_lost == 0 and d.corrupt_files == 0
    return d


def kill_during_data_write(tmp: Path) -> Drill:
    """SIGKILL the data step right before train.bin is renamed into place."""
    return _kill_at(tmp, "before_replace:train.bin", "kill during data write")


def kill_during_result_write(tmp: Path) -> Drill:
    """SIGKILL a run's launcher right before its summary.json is renamed into place."""
    return _kill_at(tmp, "before_replace:summary.json", "kill during result write")


def kill_during_collection(tmp: Path) -> Drill:
    """SIGKILL collection right before metrics.parquet is renamed into place."""
    return _kill_at(tmp, "before_replace:metrics.parquet", "kill during collection")


def _faulty_sweep(tmp: Path, d: Drill, cfg: dict, fault: str):
    """Run the sweep with a fault in every two-rank run; return (runs table, faulted rows)."""
    import pandas as pd

    work = write_workdir(tmp, cfg)
    run_snakemake(work, "--cores", "2", TABLES, env=snakemake_env(SCALELAB_FAULT=fault))
    count_orphans(str(work), d)
    audit(work, cfg, d)
    runs = pd.read_parquet(work / "results/metrics.parquet").set_index("run_id")
    d.check((runs[runs["world_size"] == 1]["status"] == "ok").all(), "the other runs completed")
    return runs, runs[runs["world_size"] == 2]


def hang(tmp: Path) -> Drill:
    """Rank 1 stalls before a collective: the run ends `timeout` within its limit + 60 s,
    leaves no process behind, and the rest of the sweep completes."""
    d = Drill("hang")
    cfg = _sweep_cfg(collective_timeout_s=5, run_timeout_s=60)
    _, hung = _faulty_sweep(tmp, d, cfg, "hang@step=3,rank=1")
    d.faults_injected += len(hung)
    d.timeouts_tried += len(hung)
    limit = cfg["train"]["collective_timeout_s"] + 60
    d.timeouts_honoured += int(((hung["status"] == "timeout") & (hung["wall_time_s"] <= limit)).sum())
    d.faults_recovered += d.timeouts_honoured
    return d


def crash(tmp: Path) -> Drill:
    """Rank 1 raises: the run ends `failed` with rank 1's error; the sweep goes on."""
    d = Drill("crash")
    _, crashed = _faulty_sweep(tmp, d, _sweep_cfg(), "crash@step=3,rank=1")
    d.faults_injected += len(crashed)
    good = (crashed["status"] == "failed") & crashed["reason"].str.contains("rank 1: RuntimeError: injected crash at step 3")
    d.faults_recovered += int(good.sum())
    d.check(bool(good.all()), "crashed runs are `failed` with rank 1's error")
    return d


def teardown_crash(tmp: Path) -> Drill:
    """Rank 0 aborts in process-group teardown after writing the results (the false failure
    seen about once in 50 CPU runs): the run stays `ok`, its rows are kept, with a warning."""
    d = Drill("teardown crash")
    runs, aborted = _faulty_sweep(tmp, d, _sweep_cfg(), "teardown@rank=0")
    d.faults_injected += len(aborted)
    kept = (aborted["status"] == "ok") & aborted["teardown_warning"].str.contains("after the results were written")
    d.faults_recovered += int(kept.sum())
    d.check(bool(kept.all()), "teardown crashes keep the run ok with a warning")
    return d


def silent_wrong_results(tmp: Path) -> Drill:
    """Inputs that used to end as results that look fine: a diverging learning rate ends
    `diverged` at a step, not `ok` with a NaN loss; a nanoGPT-style train.bin rewritten in
    place re-prepares the data and reruns the runs instead of 'Nothing to be done'."""
    import numpy as np
    import pandas as pd

    d = Drill("silent wrong results")
    work = write_workdir(tmp / "diverge", _sweep_cfg(lr=1e30))
    run_snakemake(work, "--cores", "2")  # the report too: drawn from runs whose last loss is not finite
    runs = pd.read_parquet(work / "results/metrics.parquet")
    d.faults_injected += len(runs)
    diverged = (runs["status"] == "diverged") & runs["reason"].str.contains("at step")
    d.faults_recovered += int(diverged.sum())
    d.check(bool(diverged.all()), "every run with lr=1e30 is `diverged` with its step")

    corpus = tmp / "tokenized"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    for name, n in (("train.bin", 60_000), ("val.bin", 6_000)):
        rng.integers(0, 200, n, dtype=np.uint16).tofile(corpus / name)
    cfg = _sweep_cfg()
    cfg["dataset"].update(name="nanogpt", source="tokenized", path=str(corpus), vocab_size=256)
    work = write_workdir(tmp / "stale", cfg)
    run_snakemake(work, "--cores", "2", TABLES)
    before = json.loads((work / "results/data/nanogpt/meta.json").read_text())["sha256"]["train.bin"]
    rng.integers(0, 200, 60_000, dtype=np.uint16).tofile(corpus / "train.bin")  # prepare.py writes it again
    d.faults_injected += 1
    planned = _planned_jobs(work)
    run_snakemake(work, "--cores", "2", TABLES)
    after = pd.read_parquet(work / "results/metrics.parquet")
    fresh = (planned.get("prepare_data") == 1 and planned.get("train") == 2 and (after["status"] == "ok").all()
             and (after["dataset_sha256_train"] != before).all())
    d.faults_recovered += fresh
    d.check(fresh, "an in-place rewrite of train.bin re-prepares the data and reruns both runs on the new tokens")
    audit(work, cfg, d)
    return d


def bad_config_workdir(path: Path, work: Path) -> tuple[list[str], list[str]]:
    """A working folder for one file of tests/bad_configs: its ``# expect:`` lines, and the names
    of the files to pass with --configfile over work/config.yaml (the drill's Snakemake run and
    tests/unit/test_config_errors.py's in-process check read the same folder).

    A file is a fragment merged into the tiny config; one that is not valid YAML (or gives a
    key twice) is the whole config.yaml; one with a ``# given: --configfile`` line is passed
    as ``--configfile given.yaml`` over the tiny config.yaml."""
    text = path.read_text()
    expected = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("# expect:")]
    try:
        fragment = yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError:
        fragment = None
    if any(line.startswith("# given: --configfile") for line in text.splitlines()):
        write_workdir(work, tiny_config())
        (work / "given.yaml").write_text(text)
        return expected, ["given.yaml"]
    if fragment is None:  # malformed: the file itself is the config
        work.mkdir(parents=True)
        (work / "config.yaml").write_text(text)
        return expected, []
    cfg = tiny_config()
    for section, value in fragment.items():
        if isinstance(value, dict) and isinstance(cfg.get(section), dict):
            cfg[section].update(value)
        else:
            cfg[section] = value
    write_workdir(work, cfg)
    return expected, []


def bad_configs(tmp: Path) -> Drill:
    """Every config in tests/bad_configs is rejected before any job, naming the culprit;
    a free-text path holding shell syntax is used as a path, and the canary never appears.

    A file is a fragment merged into the tiny config; one that is not valid YAML (or gives a
    key twice) is the whole config.yaml; one with a ``# given: --configfile`` line is passed
    as ``--configfile given.yaml`` over the tiny config.yaml."""
    d = Drill("bad input")
    for path in sorted(BAD_CONFIGS.glob("*.yaml")):
        work = tmp / path.stem
        expected, configfiles = bad_config_workdir(path, work)
        extra_args = [arg for name in configfiles for arg in ("--configfile", str(work / name))]
        proc = run_snakemake(work, "--cores", "1", *extra_args, timeout=120, check=False)
        out = proc.stdout + proc.stderr
        d.bad_configs_tried += 1
        rejected = proc.returncode != 0 and all(e in out for e in expected) and not (work / "results").exists()
        d.bad_configs_rejected += rejected
        d.check(rejected, f"{path.name} rejected naming {expected}")
        d.check(not (work / "INJECTED").exists() and not Path("INJECTED").exists(), f"{path.name}: canary absent")
    # Free text that is legitimately free: a corpus path with shell syntax in it.
    work = tmp / "free_text_path"
    work.mkdir()
    corpus = work / "corpus; touch INJECTED $(touch INJECTED2).txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 100)
    write_workdir(work, tiny_config(dataset={"source": "text", "path": corpus.name}))
    proc = run_snakemake(work, "--cores", "1", "results/data/tiny/meta.json", check=False)
    d.check(proc.returncode == 0, "a corpus path with shell syntax is prepared as a path")
    d.check(not any((work / c).exists() for c in ("INJECTED", "INJECTED2")), "free-text canary absent")
    return d


def determinism(tmp: Path) -> Drill:
    """Same seed: bitwise-equal fp32 losses on CPU; another seed: different; full provenance."""
    import pandas as pd

    d = Drill("determinism and provenance")
    losses = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [2], "world_size": [2]}, train={"seed": seed})
        work = write_workdir(tmp / name, cfg)
        run_snakemake(work, "--cores", "2", TABLES)
        losses[name] = pd.read_parquet(work / "results/steps.parquet")["loss"].tolist()
        runs = pd.read_parquet(work / "results/metrics.parquet")
        for column in ("seed", "config_hash", "git_commit", "torch_version", "device_name", "hostname",
                       "python_version", "backend", "dataset"):
            d.check(runs[column].notna().all(), f"provenance column {column} filled")
        d.check((runs["seed"] == seed).all(), "seed recorded")
    d.check(losses["a"] == losses["b"], "same seed gives bitwise-equal losses")
    d.check(losses["a"] != losses["c"], "another seed gives other losses")
    return d


def _planned_jobs(work: Path, *targets: str) -> dict[str, int]:
    out = run_snakemake(work, "-n", "--cores", "2", *targets).stdout
    if "Job stats:" not in out:
        return {}
    import re

    return {k: int(v) for k, v in re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1], flags=re.M) if k != "total"}


def concurrency_and_reruns(tmp: Path) -> Drill:
    """A second Snakemake on the same folder is refused; complete sweeps rerun nothing;
    unrelated changes rerun nothing; a training change reruns exactly the affected runs."""
    d = Drill("concurrency and reruns")
    cfg = _sweep_cfg(steps=150, collective_timeout_s=10)
    work = write_workdir(tmp, cfg)
    # The first Snakemake must still run when the second asks for the folder (~1-3 s later): its
    # two-rank run hangs until its collective timeout (10 s; it ends `timeout`, a complete result). Its
    # 150 steps alone end in about a second now that ranks start forked.
    first = subprocess.Popen(snakemake_cmd(work, "--cores", "2", TABLES), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True, env=snakemake_env(SCALELAB_FAULT="hang@step=1,rank=1"))
    deadline = time.time() + 60
    while time.time() < deadline and not list(work.glob(f"results/runs/{RUN_DIR_GLOB}/progress.jsonl")):
        time.sleep(0.2)
    second = run_snakemake(work, "--cores", "2", TABLES, check=False, timeout=120)
    d.check(second.returncode != 0 and "cannot be locked" in (second.stdout + second.stderr), "second snakemake refused")
    d.check(first.wait(timeout=600) == 0, "the first snakemake completed")
    d.check(_planned_jobs(work, TABLES) == {}, "a complete sweep reruns nothing")
    (work / "notes.txt").write_text("unrelated")
    os.utime(work / "config.yaml")
    d.check(_planned_jobs(work, TABLES) == {}, "touching unrelated files reruns nothing")
    write_workdir(work, {**cfg, "train": {**cfg["train"], "run_timeout_s": 999}, "cluster": {**cfg["cluster"], "mem_mb_per_rank": 8000}})
    d.check(_planned_jobs(work, TABLES) == {}, "changing limits and memory requests reruns nothing")
    write_workdir(work, {**cfg, "cluster": {**cfg["cluster"], "cpus_per_rank": 2}})  # a CPU rank's threads: its compute
    planned = _planned_jobs(work, TABLES)
    d.check(planned.get("train", 0) + planned.get("train_multinode", 0) == len(sweep_points(cfg)),
            f"cpus_per_rank reruns every CPU run: {planned}")
    write_workdir(work, {**cfg, "train": {**cfg["train"], "lr": cfg["train"]["lr"] / 2}})
    planned = _planned_jobs(work, TABLES)
    n_runs = len(sweep_points(cfg))
    d.check(planned.get("train", 0) + planned.get("train_multinode", 0) == n_runs, f"lr change reruns all {n_runs} runs: {planned}")
    write_workdir(work, {**cfg, "sweep": {**cfg["sweep"], "precision": ["fp32", "bf16"]}})
    planned = _planned_jobs(work, TABLES)
    d.check(planned.get("train", 0) + planned.get("train_multinode", 0) == n_runs and "prepare_data" not in planned,
            f"adding bf16 runs exactly the {n_runs} new points: {planned}")
    return d


def _one_ended_while_next_trains(results: Path, timeout_s: float = 180) -> list[Path]:
    """The summaries of the runs that had ended once another run trains (its progress written, no summary yet);
    empty if that moment did not come within timeout_s."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        done = list(results.glob(f"runs/{RUN_DIR_GLOB}/summary.json"))
        running = [p for p in results.glob(f"runs/{RUN_DIR_GLOB}/progress.jsonl") if not (p.parent / "summary.json").exists()]
        if done and running:
            return done
        time.sleep(0.05)
    return []


def _interrupt_and_resume(tmp: Path, name: str, signum: int, whole_group: bool) -> Drill:
    """Interrupt Snakemake while its second run trains, as a user would, then go on with the
    command `scalelab status` prints (scalelab resume): the sweep completes, every run that had
    ended keeps its files untouched (never retrained), no process outlives the interrupt, and
    status calls an interrupted run killed within seconds (its launcher's pid, not a quiet folder)."""
    from scalelab.results.status import format_status, run_states

    d = Drill(name)
    cfg = tiny_config(sweep={"precision": ["fp32", "bf16"], "zero_stage": [0], "world_size": [1]},
                      train={"steps": 250, "warmup_steps": 2})  # seconds each: time to interrupt the second
    work = write_workdir(tmp, cfg)
    results = work / cfg["results_dir"]
    env = {k: v for k, v in snakemake_env().items() if k != PREFORK_ENV}  # its own prefork server, interrupted too
    proc = subprocess.Popen(snakemake_cmd(work, "--cores", "2"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=env)
    if not d.check(bool(_one_ended_while_next_trains(results)), "one run had ended while the next one trained"):
        proc.kill()
        proc.wait()
        return d
    (os.killpg if whole_group else os.kill)(proc.pid, signum)
    d.faults_injected += 1
    try:
        proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        d.check(False, "Snakemake ended after the interrupt")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    count_orphans(str(work), d, grace_s=10)
    # every run that ended, before the interrupt or while Snakemake wound down: kept as it is
    finished = {p: p.read_bytes() for p in results.glob(f"runs/{RUN_DIR_GLOB}/summary.json")}
    started = time.time()
    states = run_states(results)
    d.check(not any(s.status == "running" for s in states), f"no run is called running once Snakemake is gone: {states}")
    d.check(time.time() - started < 5, "status answered within seconds")
    hint = format_status(results, states)
    d.check(f"scalelab resume {results}" in hint or all(s.status == "ok" for s in states), f"status says how to go on: {hint}")
    calibration = results / "calibration" / "cpu.json"
    measured = calibration.read_bytes() if calibration.exists() else None
    resumed = subprocess.run([sys.executable, "-m", "scalelab.cli", "resume", str(results)], capture_output=True, text=True,
                             timeout=600, env=env)
    d.check(measured is not None and calibration.read_bytes() == measured,
            "the resumed sweep kept the folder's CPU calibration (its MFU on one scale)")
    d.check(resumed.returncode == 0, f"scalelab resume completed the sweep: {resumed.stderr[-3000:]}")
    d.notes += [line for line in resumed.stderr.splitlines() if line.startswith("scalelab resume:")]
    reran = [line for line in resumed.stderr.splitlines() if line.startswith("scalelab resume: running:")]
    d.check(bool(reran) and " --cores 2 " in reran[0], f"resume reran the sweep's own command (--cores 2): {reran}")
    for path, content in finished.items():
        d.check(path.read_bytes() == content, f"{path.parent.name} had ended and was not retrained")
    d.notes.append(f"{len(finished)} run(s) had ended by the interrupt, kept: {', '.join(p.parent.name for p in finished)}")
    d.check(all(s.status == "ok" for s in run_states(results)), "every run ok after resume")
    audit(work, cfg, d)
    count_orphans(str(work), d)
    d.faults_recovered += not d.checks_failed and d.rows_lost == 0
    return d


def sigint_to_snakemake(tmp: Path) -> Drill:
    """SIGINT to Snakemake's pid alone (kill -INT): it lets the running run end."""
    return _interrupt_and_resume(tmp, "SIGINT to snakemake", signal.SIGINT, whole_group=False)


def sigint_to_group(tmp: Path) -> Drill:
    """SIGINT to Snakemake's process group: Ctrl-C in its terminal reaches every process."""
    return _interrupt_and_resume(tmp, "SIGINT to its group", signal.SIGINT, whole_group=True)


def sigkill_snakemake(tmp: Path) -> Drill:
    """SIGKILL to Snakemake's pid alone: its jobs must not train on (scalelab's adapter dies with it)."""
    return _interrupt_and_resume(tmp, "SIGKILL to snakemake", signal.SIGKILL, whole_group=False)


def broken_user_module(tmp: Path) -> Drill:
    """A user's model module that imports in the config check and fails in its run's launcher: its runs end
    `failed` naming the cause (the traceback in their logs), every other point of the sweep trains, and
    `scalelab status` calls them failed, not killed."""
    from scalelab.results.status import format_status, run_states

    d = Drill("broken user module")
    cfg = tiny_config(models={"late": {"module": "models.breaks_in_launcher:build"}},
                      sweep={"model": ["base", "late"], "precision": ["fp32"], "zero_stage": [0, 3], "world_size": [1]},
                      train={"steps": 6, "warmup_steps": 1})
    work = write_workdir(tmp, cfg)
    env = snakemake_env(PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    # a Snakemake of its own, started with that path as a user starts it (a preimported one keeps its own sys.path)
    done = subprocess.run(snakemake_cmd(work, "--cores", "2", TABLES), env=env, capture_output=True, text=True, timeout=600)
    d.check(done.returncode == 0, f"the sweep ended 0 (a failed run is a result): {done.stderr[-2000:]}")
    count_orphans(str(work), d)
    states = {s.run_id: s for s in run_states(work / cfg["results_dir"])}
    broken = [s for s in states.values() if s.run_id.endswith("-late")]
    d.faults_injected += len(broken)
    named = [s for s in broken if s.status == "failed" and "RuntimeError" in (s.reason or "")
             and "breaks in the launcher" in s.reason]
    d.check(len(named) == len(broken) == 2, f"the broken model's runs are failed with the cause: {broken}")
    d.check(all(s.status == "ok" for s in states.values() if not s.run_id.endswith("-late")), "the other points trained")
    d.check("killed" not in format_status(work / cfg["results_dir"], list(states.values())), "status says failed, not killed")
    audit(work, cfg, d)
    d.faults_recovered += len(named) if not d.checks_failed else 0
    return d


def damaged_and_moved_results(tmp: Path) -> Drill:
    """A results folder damaged or moved after the sweep: a truncated steps.parquet makes its run `corrupt`
    (never ok without its rows) and `retry --status corrupt` + `resume` retrain it; `resume` on a copy of the
    folder refuses, naming both, instead of rerunning the original; a run id that is no folder name, read back
    from a table, makes `export tensorboard` refuse before it writes outside its folder."""
    import pyarrow.parquet as pq

    from scalelab.results.status import run_states

    d = Drill("damaged and moved results")
    cfg = _sweep_cfg()
    work = write_workdir(tmp, cfg)
    results = work / cfg["results_dir"]
    run_snakemake(work, "--cores", "2", TABLES)
    scalelab = [sys.executable, "-m", "scalelab.cli"]
    cut = results / "runs" / "fp32-z3-w1" / "steps.parquet"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    d.faults_injected += 1
    d.check({s.run_id: s.status for s in run_states(results)}.get("fp32-z3-w1") == "corrupt", "a cut step table reads corrupt")
    retried = subprocess.run([*scalelab, "retry", str(results), "--status", "corrupt"], capture_output=True, text=True, timeout=60)
    resumed = subprocess.run([*scalelab, "resume", str(results)], capture_output=True, text=True, timeout=600)
    d.check(retried.returncode == resumed.returncode == 0, f"retry and resume: {retried.stderr[-500:]} {resumed.stderr[-1500:]}")
    d.faults_recovered += int(d.check(len(pq.read_table(cut)) == cfg["train"]["steps"], "the corrupt run was retrained whole"))
    copied = work / "copied"
    import shutil

    shutil.copytree(results, copied)
    d.faults_injected += 1
    refused = subprocess.run([*scalelab, "resume", str(copied)], capture_output=True, text=True, timeout=120)
    d.faults_recovered += int(d.check(refused.returncode == 2 and "was copied or moved from" in refused.stderr,
                                      f"resume on a copy refuses naming both: {refused.stderr[-500:]}"))
    table = pq.read_table(copied / "metrics.parquet")
    ids = ["../../escaped", *table.column("run_id").to_pylist()[1:]]
    pq.write_table(table.set_column(table.schema.get_field_index("run_id"), "run_id", [ids]), copied / "metrics.parquet")
    d.faults_injected += 1
    exported = subprocess.run([*scalelab, "export", "tensorboard", str(copied), str(work / "tb" / "out")],
                              capture_output=True, text=True, timeout=120)
    outside = [p for p in (work / "escaped", work / "tb" / "escaped", tmp / "escaped") if p.exists()]
    d.faults_recovered += int(d.check(exported.returncode == 2 and not outside and "is not one" in exported.stderr,
                                      f"export refuses a run id that is no folder name: {exported.stderr[-500:]} {outside}"))
    audit(work, cfg, d)
    return d


DRILLS = {f.__name__: f for f in (kill_mid_step, kill_during_data_write, kill_during_result_write,
                                  kill_during_collection, hang, crash, teardown_crash, silent_wrong_results,
                                  bad_configs, determinism, concurrency_and_reruns, sigint_to_snakemake,
                                  sigint_to_group, sigkill_snakemake, broken_user_module, damaged_and_moved_results)}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.faults",
                                     description="The fault drills: inject faults into real sweeps and count what was "
                                                 "recovered, lost, duplicated or left running (docs/reliability.md).")
    parser.add_argument("drills", nargs="*", metavar="DRILL", help=f"drills to run (default all): {', '.join(DRILLS)}")
    parser.add_argument("--record", action="store_true", help="write the figures to docs/drills.json and the table in "
                        "docs/reliability.md (every drill must run)")
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    names = args.drills or list(DRILLS)
    if args.record and names != list(DRILLS):
        print("--record runs every drill: name none", file=sys.stderr)
        return 2
    unknown = [n for n in names if n not in DRILLS]
    if unknown:
        print(f"unknown drill(s) {unknown}; known: {', '.join(DRILLS)}", file=sys.stderr)
        return 2
    drills, rows = [], []
    for name in names:
        start = time.time()
        with tempfile.TemporaryDirectory(prefix=f"scalelab-{name}-") as tmp:
            try:
                drill = DRILLS[name](Path(tmp))
            except Exception as err:  # noqa: BLE001 - one drill that raises is a failed drill; the others still run
                drill = Drill(name, checks_failed=[f"raised {type(err).__name__}: {' '.join(str(err).split())[:500]}"])
        drills.append(drill)
        rows.append(drill_row(name, DRILLS[name].__doc__, drill, time.time() - start))
        status = "ok" if not drill.checks_failed else "FAILED: " + "; ".join(drill.checks_failed)
        figures = (f"injected {drill.faults_injected} recovered {drill.faults_recovered} lost {drill.rows_lost} "
                   f"dup {drill.rows_duplicated} corrupt {drill.corrupt_files} orphans {drill.orphan_processes}")
        print(f"{drill.name:<28} {time.time() - start:6.1f} s  {figures}  {status}", flush=True)
        for note in drill.notes:
            print(f"    {note}", flush=True)
    totals = {f.name: sum(getattr(d, f.name) for d in drills) for f in dataclasses.fields(Drill)
              if f.type in ("int", int)}
    print()
    print(f"faults injected / recovered : {totals['faults_injected']} / {totals['faults_recovered']}")
    print(f"rows lost                   : {totals['rows_lost']}")
    print(f"rows duplicated             : {totals['rows_duplicated']}")
    print(f"corrupt files               : {totals['corrupt_files']}")
    print(f"bad configs rejected / tried: {totals['bad_configs_rejected']} / {totals['bad_configs_tried']}")
    print(f"timeouts honoured / tried   : {totals['timeouts_honoured']} / {totals['timeouts_tried']}")
    print(f"orphan processes            : {totals['orphan_processes']}")
    failed = [d for d in drills if d.checks_failed]
    print(f"checks failed               : {sum(len(d.checks_failed) for d in failed)}")
    if args.record:
        write_record(rows)
        print(f"recorded: {RECORD.relative_to(REPO_ROOT)} and the table in {DOC.relative_to(REPO_ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
