"""scalelab migrate: results trees written by the real code of earlier commits (tests/data/old_layouts,
made by its make.sh) moved to runs/<run id>/ without losing or changing a metric."""
from __future__ import annotations

import json
import numbers
import subprocess
import sys

import pandas as pd
import pytest

from scalelab.formulas.predicted_columns import refreshed_at_collection
from scalelab.planning.sweep import read_point
from scalelab.results.collect import collect
from scalelab.results.migrate import OldLayout, old_layout_runs
from support.migrate import OLD, TREES, _copy, _files

CLI = [sys.executable, "-m", "scalelab.cli"]


def _same(a, b) -> bool:
    """Equal values: integer columns now read as pandas' nullable integers (120576.0 and NaN before,
    120576 and <NA> now, the same numbers); lists (per-rank bytes) compared as text."""
    if pd.api.types.is_scalar(a) and pd.api.types.is_scalar(b):
        if pd.isna(a) and pd.isna(b):
            return True
        if isinstance(a, numbers.Number) and isinstance(b, numbers.Number) and not (pd.isna(a) or pd.isna(b)):
            return float(a) == float(b)
    return str(a) == str(b)


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


def test_status_names_the_migration_instead_of_seeing_no_runs(tmp_path):
    results = _copy(TREES[0], tmp_path / "results")
    proc = subprocess.run([*CLI, "status", str(results)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "written by an older layout" in proc.stderr and f"scalelab migrate {results}" in proc.stderr


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


@pytest.mark.parametrize("command", ["status", "collect", "report", "retry"])
def test_every_command_reading_runs_names_the_migration(tmp_path, command):
    results = _copy(TREES[-1], tmp_path / "results")
    proc = subprocess.run([*CLI, command, str(results)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "written by an older layout" in proc.stderr and "scalelab migrate" in proc.stderr, proc.stderr


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
