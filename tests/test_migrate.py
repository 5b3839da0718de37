"""scalelab migrate: results trees written by the real code of earlier commits (tests/data/old_layouts,
made by its make.sh) moved to runs/<run id>/ without losing or changing a metric."""
from __future__ import annotations

import hashlib
import json
import numbers
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from scalelab.formulas.predicted_columns import refreshed_at_collection
from scalelab.plan.sweep import read_point
from scalelab.results import migrate as migrate_module
from scalelab.results.collect import collect
from scalelab.results.lock import LOCK_NAME
from scalelab.results.migrate import OldLayout, check_layout, migrate, old_layout_runs

OLD = Path(__file__).parent / "data" / "old_layouts"
TREES = sorted(p.name for p in OLD.iterdir() if p.is_dir())
CLI = [sys.executable, "-m", "scalelab.cli"]


def _copy(name: str, dest: Path) -> Path:
    shutil.copytree(OLD / name, dest)
    return dest


def _files(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under root, but the results lock's (scalelab.results.lock: the file
    stays, emptied, once migrate has held and released the lock)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != LOCK_NAME}


def _same(a, b) -> bool:
    """Equal values: integer columns now read as pandas' nullable integers (120576.0 and NaN before,
    120576 and <NA> now, the same numbers); lists (per-rank bytes) compared as text."""
    if pd.api.types.is_scalar(a) and pd.api.types.is_scalar(b):
        if pd.isna(a) and pd.isna(b):
            return True
        if isinstance(a, numbers.Number) and isinstance(b, numbers.Number) and not (pd.isna(a) or pd.isna(b)):
            return float(a) == float(b)
    return str(a) == str(b)


@pytest.mark.unit
def test_the_fixture_trees_cover_every_layout_depth_this_project_wrote():
    depths = {max(len(p.split("/")) for p in old_layout_runs(OLD / name)) for name in TREES}
    assert depths == {3, 7, 9, 10}


@pytest.mark.run
@pytest.mark.parametrize("name", TREES)
def test_migrated_tree_collects_every_run_with_identical_metrics(tmp_path, name):
    results = _copy(name, tmp_path / "results")
    before = _files(results)
    (results / "report").mkdir()
    (results / "report" / "report.html").write_text("<html>report of the old tables</html>")

    with pytest.raises(OldLayout, match=r"scalelab migrate"):
        collect(results)
    dry = subprocess.run([*CLI, "migrate", str(results), "--dry-run"], capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "would move runs/precision~" in dry.stdout and "nothing changed" in dry.stdout
    assert {k: v for k, v in _files(results).items() if not k.startswith("report/")} == before  # dry run: untouched

    done = subprocess.run([*CLI, "migrate", str(results)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert old_layout_runs(results) == []
    after = _files(results)
    # nothing lost or rewritten: every file is still there, byte for byte, under its new name
    assert sorted(before.values()) == sorted(v for k, v in after.items()
                                             if not k.endswith("point.json") and not k.endswith("report.html"))
    run_dirs = sorted(p for p in (results / "runs").iterdir())
    assert len(run_dirs) == len(old_layout_runs(OLD / name)) and all((d / "point.json").exists() for d in run_dirs)
    for run_dir in run_dirs:
        assert read_point(run_dir).run_id == run_dir.name
        assert json.loads((run_dir / "summary.json").read_text())["run_id"] == run_dir.name
        assert (results / "logs" / "runs" / f"{run_dir.name}.log").exists()  # the log went with its run
    assert not list((results / "logs" / "runs").glob("precision~*"))
    assert (results / "superseded" / "report" / "report.html").exists() and not (results / "report" / "report.html").exists()

    result = collect(results)
    assert result["problems"] == []
    old = pd.read_parquet(results / "superseded" / "metrics.parquet").set_index("run_id").sort_index()
    new = pd.read_parquet(results / "metrics.parquet").set_index("run_id").sort_index()
    assert list(old.index) == list(new.index)
    # the formula columns are computed anew at collection (scalelab.formulas.predicted_columns): today's formulas
    differences = [f"{run}.{col}: {old.at[run, col]!r} -> {new.at[run, col]!r}"
                   for col in old.columns if col != "run_path" and not refreshed_at_collection(col) for run in old.index
                   if not _same(old.at[run, col], new.at[run, col])]
    assert differences == []
    assert list(new["run_path"]) == list(new.index)  # the folder is the run id
    assert new["status"].isin(["ok", "skipped"]).all()
    old_steps = pd.read_parquet(results / "superseded" / "steps.parquet")
    new_steps = pd.read_parquet(results / "steps.parquet")
    shared = [c for c in old_steps.columns if c in new_steps.columns]
    key = ["run_id", "step"]
    pd.testing.assert_frame_equal(old_steps[shared].sort_values(key).reset_index(drop=True),
                                  new_steps[shared].sort_values(key).reset_index(drop=True))
    # axes added after the tree was written read as their defaults, in both tables
    assert not new_steps["compile"].any() and (new_steps["model"] == "base").all()

    again = subprocess.run([*CLI, "migrate", str(results)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert _files(results) == {**after, "metrics.parquet": _files(results)["metrics.parquet"],
                               "steps.parquet": _files(results)["steps.parquet"]}


@pytest.mark.run
def test_status_names_the_migration_instead_of_seeing_no_runs(tmp_path):
    results = _copy(TREES[0], tmp_path / "results")
    proc = subprocess.run([*CLI, "status", str(results)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "written by an older layout" in proc.stderr and f"scalelab migrate {results}" in proc.stderr


@pytest.mark.unit
def test_an_interrupted_migration_finishes_when_rerun(tmp_path, monkeypatch):
    name = next(n for n in TREES if n.endswith("-10-levels"))
    reference = _copy(name, tmp_path / "reference")
    migrate(reference)
    results = _copy(name, tmp_path / "results")
    real_rename, calls = os.rename, []

    def dying_rename(src, dst):  # the process dies after a few files: part of a run folder moved
        calls.append(src)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real_rename(src, dst)

    monkeypatch.setattr(migrate_module.os, "rename", dying_rename)
    with pytest.raises(KeyboardInterrupt):
        migrate(results)
    monkeypatch.setattr(migrate_module.os, "rename", real_rename)
    assert old_layout_runs(results)  # half done: the workflow still refuses to plan
    with pytest.raises(OldLayout):
        check_layout(results)
    migrate(results)
    assert _files(results) == _files(reference)


@pytest.mark.unit
def test_two_old_copies_of_one_run_newest_wins_the_other_is_kept_aside(tmp_path):
    """A tree upgraded before keeps an orphaned older layout beside the newer one: both hold fp32-z0-w1."""
    results = _copy(next(n for n in TREES if n.endswith("-10-levels")), tmp_path / "results")
    older = OLD / next(n for n in TREES if n.endswith("-3-levels"))
    shutil.copytree(older / "runs" / "precision~fp32" / "zero_stage~0" / "world_size~1",
                    results / "runs" / "precision~fp32" / "zero_stage~0" / "world_size~1", dirs_exist_ok=True)
    old_summary = results / "runs" / "precision~fp32" / "zero_stage~0" / "world_size~1" / "summary.json"
    os.utime(old_summary, (1, 1))  # written long before the deeper tree's
    old_bytes = old_summary.read_bytes()
    result = migrate(results)
    moves = {m.old_path: m.to for m in result["moves"]}
    assert moves["precision~fp32/zero_stage~0/world_size~1"] == "runs/.superseded/precision~fp32/zero_stage~0/world_size~1"
    assert (results / "runs/.superseded/precision~fp32/zero_stage~0/world_size~1/summary.json").read_bytes() == old_bytes
    assert (results / "runs/fp32-z0-w1/summary.json").read_bytes() != old_bytes
    assert old_layout_runs(results) == []


@pytest.mark.run
def test_a_file_already_at_the_destination_is_never_overwritten(tmp_path):
    results = _copy(next(n for n in TREES if n.endswith("-10-levels")), tmp_path / "results")
    (results / "runs" / "fp32-z0-w1").mkdir(parents=True)
    (results / "runs" / "fp32-z0-w1" / "steps.parquet").write_text("someone's own file")
    proc = subprocess.run([*CLI, "migrate", str(results)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout
    assert "kept in the old folder, the destination already has: steps.parquet" in proc.stdout
    assert (results / "runs" / "fp32-z0-w1" / "steps.parquet").read_text() == "someone's own file"
    kept = [p for p in (results / "runs").rglob("steps.parquet") if "~" in str(p.parent)]
    assert len(kept) == 1 and kept[0].stat().st_size > 100  # the run's own steps wait in the old folder


@pytest.mark.unit
def test_an_old_folder_naming_an_unknown_axis_is_left_in_place(tmp_path):
    results = tmp_path / "results"
    odd = results / "runs" / "precision~fp32" / "zero_stage~0" / "world_size~1" / "hsdp~2"
    odd.mkdir(parents=True)
    (odd / "summary.json").write_text('{"status": "ok"}')
    result = migrate(results)
    [move] = result["moves"]
    assert move.problem.startswith("'hsdp~2' is not 'axis~value' for an axis of this scalelab (precision, zero_stage")
    assert (odd / "summary.json").exists()


@pytest.mark.workflow
def test_the_workflow_refuses_an_old_tree_and_after_migrate_trains_nothing(tmp_path):
    """The tree of the newest old layout, with Snakemake's records of its jobs, under the config that
    wrote it: before the migration the workflow stops before any job, naming the command; after it,
    it collects and reports again and plans neither data preparation nor training of a migrated run
    (params recorded by the old code, a partial dataset section among them, read as unchanged); only
    the baseline's repeats, which that code did not have, are new runs."""
    from scalelab.harness.testing import run_snakemake, snakemake_env

    name = next(n for n in TREES if n.endswith("-10-levels"))
    results = _copy(name, tmp_path / "results")
    # Snakemake's records of the old jobs (their params among them), where Snakemake keeps them
    shutil.move(results / "snakemake-metadata", tmp_path / ".snakemake" / "metadata")
    # a copy's times are the copy's: the data first, then the runs' outputs, as when they were written
    # (long ago: older than this checkout's workflow scripts, as after an upgrade)
    for i, path in enumerate([*sorted((results / "data").rglob("*")), *sorted((results / "runs").rglob("*"))]):
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    assert min(p.stat().st_mtime for p in (Path(__file__).parents[1] / "workflow" / "scripts").glob("*.py")) > 1_700_000_100
    shutil.copy(OLD / "sweep-10.yaml", tmp_path / "config.yaml")  # the config that wrote the tree
    refused = run_snakemake(tmp_path, "-n", "--cores", "2", check=False, env=snakemake_env())
    assert refused.returncode != 0 and "run `scalelab migrate results`" in refused.stdout + refused.stderr, refused.stdout[-2000:]

    migrate(results)
    dry = run_snakemake(tmp_path, "-n", "--cores", "2").stdout
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.split("Job stats:")[1], flags=re.M))
    # no migrated run trains again; the baseline's repeats (repeats.baseline: 3, new since) are new runs
    # the collective benchmark (prediction.bench_comm, new since) measures once; it trains nothing
    assert jobs == {"bench_comm": "1", "train": "2", "collect": "1", "report": "1", "all": "1", "total": "6"}, dry
    assert sorted(re.findall(r"wildcards: run_id=(\S+)", dry)) == ["fp32-z0-w1-r2", "fp32-z0-w1-r3"], dry


@pytest.mark.unit
def test_a_point_json_written_before_an_axis_existed_reads_it_as_its_default(tmp_path):
    (tmp_path / "point.json").write_text(json.dumps({"precision": "bf16", "zero_stage": 3, "world_size": 2,
                                                     "activation_checkpointing": True}))
    point = read_point(tmp_path)
    assert point.run_id == "bf16-z3-w2-ac" and point.compile is False and point.lora_rank is None and point.model == "base"
    (tmp_path / "point.json").write_text(json.dumps({"precision": "bf16", "zero_stage": 3, "world_size": 2, "hsdp": 2}))
    with pytest.raises(ValueError, match="not sweep axes: hsdp"):
        read_point(tmp_path)
    (tmp_path / "point.json").write_text(json.dumps({"precision": "bf16", "world_size": 2}))
    with pytest.raises(ValueError, match="no value for zero_stage"):
        read_point(tmp_path)


@pytest.mark.run
@pytest.mark.parametrize("command", ["status", "collect", "report", "retry"])
def test_every_command_reading_runs_names_the_migration(tmp_path, command):
    results = _copy(TREES[-1], tmp_path / "results")
    proc = subprocess.run([*CLI, command, str(results)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "written by an older layout" in proc.stderr and "scalelab migrate" in proc.stderr, proc.stderr


def _combined_tree(dest: Path) -> Path:
    """The newest old layout, an older layout's copy of one of its runs beside it (upgraded before
    without migrating), a killed copy of another (no summary: a checkpoint and progress only), and a
    desktop's hidden file at a middle level."""
    results = _copy(next(n for n in TREES if n.endswith("-10-levels")), dest)
    older = OLD / next(n for n in TREES if n.endswith("-3-levels"))
    level = Path("precision~fp32") / "zero_stage~0" / "world_size~1"
    for part in ("runs", "logs/runs"):
        for src in (older / part).rglob("*"):
            if src.is_file() and str(src.relative_to(older / part)).startswith(str(level)) and src.parent.name == level.name \
                    or src.name == f"{level.name}.log":
                target = results / part / src.relative_to(older / part)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, target)
    os.utime(results / "runs" / level / "summary.json", (1, 1))
    killed = results / "runs" / "precision~fp8" / "zero_stage~0" / "world_size~1"
    (killed / "checkpoint" / "step_2").mkdir(parents=True)
    (killed / "checkpoint" / "step_2" / "shard.distcp").write_bytes(b"x" * 100)
    (killed / "progress.jsonl").write_text('{"step": 1}\n')
    (results / "runs" / "precision~fp32" / ".DS_Store").write_bytes(b"finder")
    return results


@pytest.mark.unit
def test_an_interruption_at_any_moment_converges_to_the_same_tree(tmp_path, monkeypatch):
    """The migration dies before its k-th rename, rmdir or mkdir, for every k; one rerun gives the
    same files, byte for byte, in the same places, as a migration never interrupted."""
    reference = _combined_tree(tmp_path / "reference")
    calls = {"n": 0}
    real = {name: getattr(migrate_module.os, name) for name in ("rename", "rmdir")}
    real_mkdir = Path.mkdir

    def counting(name):
        def call(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == calls.get("die_at"):
                raise KeyboardInterrupt
            return real[name](*args, **kwargs) if name in real else real_mkdir(*args, **kwargs)
        return call

    for name in real:
        monkeypatch.setattr(migrate_module.os, name, counting(name))
    monkeypatch.setattr(Path, "mkdir", counting("mkdir"))
    migrate(reference)
    total = calls["n"]
    expected = _files(reference)
    assert total > 20 and not old_layout_runs(reference)
    assert any(k.startswith("runs/.superseded/precision~fp32/zero_stage~0/world_size~1/") for k in expected)
    for k in range(1, total + 1):
        results = _combined_tree(tmp_path / f"k{k}")
        calls.update(n=0, die_at=k)
        with pytest.raises(KeyboardInterrupt):
            migrate(results)
        calls.update(n=0, die_at=None)
        migrate(results)
        assert _files(results) == expected, f"interrupted at call {k} of {total}"
        shutil.rmtree(results)


@pytest.mark.unit
def test_a_killed_copy_of_a_finished_run_is_kept_aside_and_a_killed_run_stays_killed(tmp_path):
    results = _copy(next(n for n in TREES if n.endswith("-10-levels")), tmp_path / "results")
    migrate(results)
    killed = results / "runs" / "precision~fp32" / "zero_stage~0" / "world_size~1"  # e.g. an older sweep's, killed
    (killed / "checkpoint" / "step_1").mkdir(parents=True)
    (killed / "progress.jsonl").write_text('{"step": 1}\n')
    for path in (killed / "progress.jsonl", killed / "checkpoint" / "step_1"):
        os.utime(path, (1_600_000_000, 1_600_000_000))
    migrate(results)
    assert sorted(p.name for p in (results / "runs" / "fp32-z0-w1").iterdir()) == ["point.json", "steps.parquet", "summary.json"]
    aside = results / "runs" / ".superseded" / "precision~fp32" / "zero_stage~0" / "world_size~1"
    assert (aside / "progress.jsonl").exists() and (aside / "checkpoint" / "step_1").is_dir()

    lone = _copy(next(n for n in TREES if n.endswith("-3-levels")), tmp_path / "lone")
    run = lone / "runs" / "precision~fp32" / "zero_stage~0" / "world_size~2"
    (run / "summary.json").unlink()  # killed: no summary; its files and its log written long ago
    for path in [*run.iterdir(), *(lone / "logs" / "runs").rglob("world_size~2.log")]:
        os.utime(path, (1_600_000_000, 1_600_000_000))
    migrate(lone)
    from scalelab.results.status import run_states

    states = {s.run_id: s.status for s in run_states(lone)}
    assert states == {"fp32-z0-w1": "ok", "fp32-z0-w2": "killed"}


@pytest.mark.run
def test_migrate_waits_for_no_one_and_refuses_while_a_workflow_holds_the_results(tmp_path):
    from scalelab.results.lock import results_lock

    results = _copy(TREES[0], tmp_path / "results")
    lock = results_lock(results)
    lock.acquire()
    try:
        proc = subprocess.run([*CLI, "migrate", str(results)], capture_output=True, text=True, timeout=120)
    finally:
        lock.release()
    assert proc.returncode == 2 and "held by" in proc.stderr, proc.stderr
    assert old_layout_runs(results)  # nothing moved


@pytest.mark.unit
@pytest.mark.parametrize("old_path, run_id", [
    ("precision~bf16/zero_stage~3/world_size~2/micro_batch~auto/activation_checkpointing~false/cpu_offload~false/"
     "bucket_mb~none/compile~false/model~base/lora_rank~none", "bf16-z3-w2"),
    ("precision~fp32/zero_stage~2/world_size~1/micro_batch~2/activation_checkpointing~true/cpu_offload~false/bucket_mb~none",
     "fp32-z2-w1-mb2-ac"),
    ("precision~fp16/zero_stage~1/world_size~2/micro_batch~auto/activation_checkpointing~false/cpu_offload~false/"
     "bucket_mb~1/model~base/lora_rank~4", "fp16-z1-w2-bucket1-lora4"),
    ("precision~fp32/zero_stage~3/world_size~1", "fp32-z3-w1"),
])
def test_old_paths_of_every_stage_and_lever_name_their_run(old_path, run_id):
    """'none' and 'auto' are values too: no buckets under FSDP2, no accumulation, no LoRA."""
    from scalelab.results.migrate import point_of_old_path

    assert point_of_old_path(old_path).run_id == run_id
