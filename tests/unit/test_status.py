"""`scalelab status` and `scalelab retry` on a results folder of run files (no training; the
Snakemake side, a real dry run after a real timeout, is in tests/workflow/test_workflow.py)."""
import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from scalelab.cli import main
from scalelab.io import write_json
from scalelab.planning.result_tables import steps_table, write_parquet
from scalelab.planning.sweep import RunPoint
from scalelab.results.status import RetryError, format_status, retry, run_states

REASONS = {
    "failed": "rank 1: RuntimeError: injected crash at step 2 on rank 1 (torchrun exit code 1)",
    "timeout": "run exceeded train.run_timeout_s=15 s and was stopped",
    "oom": "rank 0: OutOfMemoryError: CUDA out of memory",
    "skipped": "world_size=8 needs 8 GPUs, this node has 1",
    "diverged": "rank 0: Diverged: non-finite loss at step 4",
    "predicted_oom": "predicted peak 90 GiB per rank exceeds the device memory 80 GiB; not launched",
}


def _run(root: Path, point: RunPoint, status: str | None, progress_steps: int = 0, age_s: float = 0.0) -> Path:
    run_dir = root / "runs" / point.path
    identity = point.identity(micro_batch=4)
    if status is not None:
        records = [{"step": s, "loss": 5.0 - s, "grad_norm": 1.0, "lr": 1e-3, "loss_scale": None, "skipped": False,
                    "step_time_s": 0.01, "tokens": 512} for s in range(3 if status == "ok" else 1)]
        write_parquet(steps_table(identity, records), run_dir / "steps.parquet")
        write_json(run_dir / "summary.json", {**identity, "status": status, "reason": REASONS.get(status)})
    else:  # started, no summary: the launcher is still at it, or was killed
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run_plan.json").write_text("{}")
        (run_dir / "progress.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(progress_steps)))
        (run_dir / "checkpoint" / "step_2").mkdir(parents=True)
        (run_dir / "checkpoint" / "step_2" / "state.bin").write_bytes(b"x")
        old = time.time() - age_s
        for p in [*run_dir.rglob("*"), run_dir]:
            os.utime(p, (old, old))
    return run_dir


@pytest.fixture
def sweep(tmp_path):
    """A results folder in every state a run can be in."""
    points = {
        "ok": [RunPoint("fp32", 0, 1), RunPoint("bf16", 0, 1), RunPoint("fp32", 3, 2)],
        "failed": [RunPoint("fp32", 0, 2)], "timeout": [RunPoint("bf16", 0, 2), RunPoint("bf16", 3, 2)],
        "oom": [RunPoint("fp32", 1, 2)], "skipped": [RunPoint("fp32", 0, 8)], "diverged": [RunPoint("fp16", 0, 2)],
        "predicted_oom": [RunPoint("fp32", 0, 4)],
    }
    for status, ps in points.items():
        for p in ps:
            _run(tmp_path, p, status)
    for name in ("metrics.parquet", "steps.parquet", "report/report.html", "report/summary.md"):  # collected, reported earlier
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"collected earlier")
    corrupt = _run(tmp_path, RunPoint("fp16", 1, 2), "ok")
    (corrupt / "summary.json").write_text('{"run_id": "fp16-z1-w2", "sta')
    _run(tmp_path, RunPoint("fp16", 3, 2), None, progress_steps=7, age_s=3600)  # killed an hour ago
    _run(tmp_path, RunPoint("bf16", 1, 2), None, progress_steps=3, age_s=5)  # running
    return tmp_path


def _snapshot(folder: Path) -> dict:
    """Every file's bytes (hash), modification time and inode."""
    return {p.relative_to(folder).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns, p.stat().st_ino)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_status_counts_every_state_with_reasons(sweep, capsys):
    states = {s.run_id: s for s in run_states(sweep)}
    assert {k: v.status for k, v in states.items()} == {
        "fp32-z0-w1": "ok", "bf16-z0-w1": "ok", "fp32-z3-w2": "ok", "fp32-z0-w2": "failed", "bf16-z0-w2": "timeout",
        "bf16-z3-w2": "timeout", "fp32-z1-w2": "oom", "fp32-z0-w8": "skipped", "fp16-z0-w2": "diverged",
        "fp32-z0-w4": "predicted_oom", "fp16-z1-w2": "corrupt", "fp16-z3-w2": "killed", "bf16-z1-w2": "running"}
    assert "7 step(s) recorded" in states["fp16-z3-w2"].reason and "checkpoint step_2" in states["fp16-z3-w2"].reason
    assert states["bf16-z1-w2"].reason.startswith("no summary.json yet")
    assert main(["status", str(sweep)]) == 0
    out = capsys.readouterr().out
    for line in ("  ok                3", "  running           1", "  killed            1", "  failed            1", "  timeout           2",
                 "  oom               1", "  predicted_oom     1", "  diverged          1", "  skipped           1", "  corrupt           1"):
        assert line in out, out
    for reason in REASONS.values():
        assert reason in out
    assert f"scalelab retry {sweep} --status corrupt,diverged,failed,oom,timeout" in out  # a killed run: resume reruns it
    assert out.index("running") < out.index("killed") < out.index("failed"), "the usual order"
    # JSON for scripts; with the config, sweep points without a folder are 'not started'
    assert main(["status", str(sweep), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["timeout"] == 2


def test_status_counts_points_not_started(sweep, tmp_path):
    import yaml

    from scalelab.harness.testing import tiny_config

    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [0], "world_size": [1, 2]}, planning={"launch_overcommitted": True})
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.yaml").write_text(yaml.safe_dump(cfg))
    states = run_states(sweep, tmp_path / "cfg" / "config.yaml")
    assert [s.status for s in states if s.status == "not started"] == []  # both points have a folder here
    (tmp_path / "other").mkdir()
    assert [(s.run_id, s.status) for s in run_states(tmp_path / "other", tmp_path / "cfg" / "config.yaml")] == [
        ("fp32-z0-w1", "not started"), ("fp32-z0-w2", "not started")]


def test_retry_removes_exactly_the_chosen_runs_outputs_and_never_touches_ok_runs(sweep, capsys):
    before = _snapshot(sweep)
    ok_dirs = [sweep / "runs" / RunPoint(*p).path for p in (("fp32", 0, 1), ("bf16", 0, 1), ("fp32", 3, 2))]
    assert main(["retry", str(sweep), "--status", "timeout,failed,killed", "--dry-run"]) == 0
    assert "would remove" in capsys.readouterr().out and _snapshot(sweep) == before, "a dry run removes nothing"
    assert main(["retry", str(sweep), "--status", "timeout,failed,killed"]) == 0
    out = capsys.readouterr().out
    assert f"4 run(s) to rerun; now: scalelab resume {sweep}" in out
    after = _snapshot(sweep)
    chosen = {RunPoint(*p).path for p in (("fp32", 0, 2), ("bf16", 0, 2), ("bf16", 3, 2))}
    removed = set(before) - set(after)
    assert removed == {f"runs/{path}/{name}" for path in chosen for name in ("summary.json", "steps.parquet")} | {
        "metrics.parquet", "steps.parquet", "report/report.html"}, "the runs' outputs, the collected tables and the report"
    assert set(after) <= set(before) and all(after[f] == before[f] for f in after), "everything else byte-identical, untouched"
    killed = sweep / "runs" / RunPoint("fp16", 3, 2).path
    assert (killed / "checkpoint" / "step_2" / "state.bin").exists(), "a killed run keeps its checkpoint (the rerun resumes)"
    for ok in ok_dirs:
        assert json.loads((ok / "summary.json").read_text())["status"] == "ok"
    # now they count as unfinished (the rerun is due); ok runs still ok
    states = {s.run_id: s.status for s in run_states(sweep)}
    assert states["fp32-z0-w1"] == "ok" and states["bf16-z0-w2"] in ("killed", "running")


def test_retry_refuses_ok_and_running_runs_and_defaults_to_what_went_wrong(sweep, capsys):
    before = _snapshot(sweep)
    for statuses in (["ok"], ["running"], ["timeout", "ok"]):
        with pytest.raises(RetryError, match="never retried"):
            retry(sweep, statuses)
    assert main(["retry", str(sweep), "--status", "ok"]) == 2 and "never retried: ok" in capsys.readouterr().err
    assert main(["retry", str(sweep), "--status", "nonsense"]) == 2
    assert _snapshot(sweep) == before
    done = {s.run_id: s.status for s, _ in retry(sweep, dry_run=True)}  # the default
    assert sorted(set(done.values())) == ["corrupt", "diverged", "failed", "killed", "oom", "timeout"]
    assert "fp32-z0-w8" not in done and "fp32-z0-w4" not in done, "skipped and predicted_oom only when named"


def test_retry_leaves_a_run_that_finished_ok_meanwhile(sweep, monkeypatch):
    """Each summary is read again right before its folder is touched."""
    from scalelab.results import status as status_module

    late = sweep / "runs" / RunPoint("bf16", 0, 2).path
    real = status_module.run_states

    def states_then_the_run_finishes(*args, **kwargs):
        states = real(*args, **kwargs)
        summary = json.loads((late / "summary.json").read_text())
        write_json(late / "summary.json", {**summary, "status": "ok", "reason": None})  # a rerun just ended ok
        return states

    monkeypatch.setattr(status_module, "run_states", states_then_the_run_finishes)
    done = [s.run_id for s, _ in retry(sweep, ["timeout"])]
    assert done == ["bf16-z3-w2"] and (late / "summary.json").exists() and (late / "steps.parquet").exists()


def test_format_status_of_a_clean_sweep(tmp_path):
    _run(tmp_path, RunPoint("fp32", 0, 1), "ok")
    text = format_status(tmp_path, run_states(tmp_path))
    assert "1 run(s)" in text and "not ok" not in text and "retry" not in text


def test_status_lists_running_runs_apart_and_reasons_whole(sweep, capsys, monkeypatch):
    long_reason = ("planning: predicted peak 9.1 GiB per rank exceeds the 8.0 GiB device budget; to measure the "
                   "OOM anyway set planning.launch_predicted_oom: true, or lower train.global_batch")
    run_dir = _run(sweep, RunPoint("bf16", 2, 2), "predicted_oom")
    summary = json.loads((run_dir / "summary.json").read_text())
    write_json(run_dir / "summary.json", {**summary, "reason": long_reason})
    assert main(["status", str(sweep)]) == 0
    out = capsys.readouterr().out
    running, not_ok = out.split("\nrunning:\n")[1].split("\nnot ok:\n")
    assert "bf16-z1-w2" in running and "fp32-z0-w2" not in running
    assert "bf16-z1-w2" not in not_ok, "a running run is not a run that went wrong"
    assert "…" not in out and not_ok.count(long_reason) == 1, "the whole reason, fix included"
    monkeypatch.chdir(sweep.parent)
    (sweep.parent / "results").symlink_to(sweep)
    assert main(["status"]) == 0 and "results: " in capsys.readouterr().out, "without an argument: results"


def test_hints_rerun_the_sweep_as_it_was_started(sweep, tmp_path, capsys, monkeypatch):
    """A sweep started with --configfile my.yaml --config ... is rerun by that command line, not by
    a bare `snakemake --cores all` (which would run the default config into results/): status,
    retry and the end-of-sweep text print what the Snakefile's onstart recorded; -n and --forcerun
    were about that one invocation and are left out."""
    from scalelab.results.invocation import record

    monkeypatch.delenv("PYTHONPATH", raising=False)  # recorded with the command (the next test): none here
    argv = ["--cores", "all", "--configfile", "my.yaml", "--config", "results_dir=mine", "-n", "--forcerun", "train",
            "--printshellcmds"]
    record(sweep, argv, [tmp_path / "my.yaml"], cwd=tmp_path)
    expected = "snakemake --cores all --configfile my.yaml --config results_dir=mine"
    monkeypatch.chdir(tmp_path)
    text = format_status(sweep, run_states(sweep))
    assert f"      then: scalelab resume {sweep}\n" in text, text
    assert text.endswith(f"it runs the sweep's command: {expected} --rerun-incomplete)"), text
    assert main(["retry", str(sweep), "--status", "timeout"]) == 0
    out = capsys.readouterr().out
    assert f"now: scalelab resume {sweep}\n" in out and f"with the sweep's command: {expected})" in out, out
    monkeypatch.chdir(sweep / "runs")  # from elsewhere: the command goes back to the folder it was started in
    assert f"command: cd {tmp_path} && {expected}" in format_status(sweep, run_states(sweep))


def test_hints_without_a_recorded_command_say_what_to_add(sweep):
    text = format_status(sweep, run_states(sweep))
    assert "command: snakemake --cores all --rerun-incomplete (add the --configfile / --config options this sweep was started with" in text


def test_a_user_modules_import_path_is_recorded_with_the_sweep(sweep, tmp_path, monkeypatch):
    """A sweep of the user's own module (model.module) imports it through the PYTHONPATH it was
    started with: every rerun hint carries it, absolute (issue #41)."""
    from scalelab.results.invocation import record, rerun_command

    monkeypatch.setenv("PYTHONPATH", "mine" + os.pathsep + "/opt/lib")
    record(sweep, ["--cores", "2"], [], cwd=tmp_path)
    monkeypatch.chdir(tmp_path)
    assert rerun_command(sweep) == f"PYTHONPATH={tmp_path / 'mine'}{os.pathsep}/opt/lib snakemake --cores 2"


def test_a_run_whose_launcher_is_gone_is_killed_at_once_and_a_live_one_runs_however_quiet(tmp_path):
    """The launcher's record in its run folder (launcher.json), not a quiet folder, says whether a run
    still trains on this host (issue #41: a dead run read `running` for up to 300 s)."""
    from scalelab.run.processes import holder_record

    results = tmp_path / "results"
    gone = next(pid for pid in range(4_194_000, 4_194_300) if not Path(f"/proc/{pid}").exists())  # no such process
    for run_id, record in (("fp32-z0-w1", {**holder_record(), "pid": gone, "pid_start": None}),
                           ("bf16-z0-w1", holder_record())):
        (results / "runs" / run_id).mkdir(parents=True)
        write_json(results / "runs" / run_id / "launcher.json", record)
        old = time.time() - 3600
        os.utime(results / "runs" / run_id / "launcher.json", (old, old))  # quiet for an hour
    states = {s.run_id: s for s in run_states(results)}
    assert states["fp32-z0-w1"].status == "killed" and "launcher is gone" in states["fp32-z0-w1"].reason
    assert states["bf16-z0-w1"].status == "running" and f"launcher pid {os.getpid()} alive" in states["bf16-z0-w1"].reason


def test_a_truncated_step_table_makes_its_run_corrupt_and_retry_reruns_it(tmp_path, capsys):
    """An ok run whose steps.parquet was cut short (a full disk, a copy interrupted) has lost its step rows: status
    and collection call it corrupt, never ok, and `retry --status corrupt` removes its outputs so the workflow reruns it."""
    from scalelab.results.collect import collect

    whole = _run(tmp_path, RunPoint("fp32", 0, 1), "ok")
    cut = _run(tmp_path, RunPoint("bf16", 0, 1), "ok")
    data = (cut / "steps.parquet").read_bytes()
    (cut / "steps.parquet").write_bytes(data[: len(data) // 2])
    states = {s.run_id: s for s in run_states(tmp_path)}
    assert states["fp32-z0-w1"].status == "ok"
    assert states["bf16-z0-w1"].status == "corrupt", states["bf16-z0-w1"]
    assert states["bf16-z0-w1"].reason.startswith("steps.parquet is corrupt") and "its summary says ok" in states["bf16-z0-w1"].reason
    collect(tmp_path)
    import pandas as pd

    runs = pd.read_parquet(tmp_path / "metrics.parquet").set_index("run_id")
    assert runs.loc["bf16-z0-w1", "status"] == "corrupt" and runs.loc["fp32-z0-w1", "status"] == "ok"
    assert main(["retry", str(tmp_path), "--status", "corrupt"]) == 0
    assert not (cut / "summary.json").exists() and not (cut / "steps.parquet").exists()
    assert (whole / "summary.json").exists() and (whole / "steps.parquet").exists()


def test_a_run_whose_launcher_has_not_started_is_starting_while_a_workflow_holds_the_folder(tmp_path, monkeypatch):
    """Snakemake makes a run's folder before its launcher records itself: while a workflow holds the results
    folder that is a run starting, never `killed`; once nothing holds it (Ctrl-C before the launcher), nothing
    will start it, and it is never `running`. A full disk is named as the likely cause."""
    from scalelab.results import status as status_module
    from scalelab.results.lock import results_lock

    run_dir = tmp_path / "runs" / "fp32-z0-w2"
    run_dir.mkdir(parents=True)
    lock = results_lock(tmp_path)
    lock.acquire()
    try:
        state = run_states(tmp_path)[0]
        assert state.status == "starting" and "launcher has not recorded itself yet" in state.reason, state
        assert main(["retry", str(tmp_path), "--status", "starting"]) == 2  # never retried
    finally:
        lock.release()
    state = run_states(tmp_path)[0]
    assert state.status == "killed" and "its launcher never started" in state.reason, state
    assert "no space left" not in state.reason
    monkeypatch.setattr(status_module, "LOW_DISK_BYTES", 1 << 62)  # every disk is full, as far as the check can tell
    assert "no space left on device" in run_states(tmp_path)[0].reason


def test_resume_refuses_a_copied_results_folder_naming_both(tmp_path, capsys):
    """The record names the folder the sweep wrote: resuming a copy would rerun the original's command (and
    report "Nothing to be done" while the copy stays incomplete)."""
    import shutil

    from scalelab.results.invocation import record
    from scalelab.results.status import resume

    original = tmp_path / "results"
    _run(original, RunPoint("fp32", 0, 1), "ok")
    record(original, ["--cores", "2"], [], cwd=tmp_path)
    copy = tmp_path / "copied"
    shutil.copytree(original, copy)
    assert resume(copy, dry_run=True) == 2
    err = capsys.readouterr().err
    assert f"{copy.resolve()} was copied or moved from {original.resolve()}" in err and "results_dir=" in err, err
    assert resume(original, dry_run=True) == 0  # the original still resumes


def test_the_closing_lines_advise_only_what_can_help(tmp_path):
    """Stopped with no run gone wrong (Ctrl-C): go on with resume, never 'retry the failed runs'; with runs gone
    wrong: name their statuses and the retry that reruns exactly them."""
    from scalelab.results.status import stopped_lines

    _run(tmp_path, RunPoint("fp32", 0, 1), "ok")
    _run(tmp_path, RunPoint("fp32", 0, 2), None, progress_steps=2, age_s=3600)  # killed by the interrupt
    lines = stopped_lines(tmp_path)
    assert "no run failed" in lines[0] and lines[1].endswith(f"scalelab resume {tmp_path.resolve()}")
    assert not any("retry" in line for line in lines)
    # status says the same: resume reruns the killed run (retry would also drop the collected tables)
    from scalelab.results.status import format_status, run_states

    text = format_status(tmp_path, run_states(tmp_path))
    assert "retry" not in text and f"go on with the sweep: scalelab resume {tmp_path}" in text, text
    _run(tmp_path, RunPoint("bf16", 0, 2), "timeout")
    lines = stopped_lines(tmp_path)
    assert "runs that ended timeout" in lines[0]
    assert f"scalelab retry {tmp_path.resolve()} --status timeout, then: scalelab resume" in lines[1]


def test_status_counts_the_points_that_never_started_from_the_sweeps_own_config(tmp_path):
    """Without --config, the config files the sweep was started with (its invocation record) give its points."""
    import yaml

    from scalelab.harness.testing import tiny_config
    from scalelab.results.invocation import record

    work = tmp_path / "work"
    work.mkdir()
    (work / "config.yaml").write_text(yaml.safe_dump(tiny_config(sweep={"precision": ["fp32", "bf16"], "zero_stage": [0],
                                                                         "world_size": [1]})))
    results = work / "results"
    _run(results, RunPoint("fp32", 0, 1), "ok")
    record(results, ["--cores", "2"], [], cwd=work)
    states = {s.run_id: s.status for s in run_states(results)}
    assert states == {"fp32-z0-w1": "ok", "bf16-z0-w1": "not started"}, states
