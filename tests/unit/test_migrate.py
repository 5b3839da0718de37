"""scalelab migrate: results trees written by the real code of earlier commits (tests/data/old_layouts,
made by its make.sh) moved to runs/<run id>/ without losing or changing a metric."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from scalelab.planning.sweep import read_point
from scalelab.results import migrate as migrate_module
from scalelab.results.migrate import OldLayout, check_layout, migrate, old_layout_runs
from support.migrate import OLD, TREES, _copy, _files


def test_the_fixture_trees_cover_every_layout_depth_this_project_wrote():
    depths = {max(len(p.split("/")) for p in old_layout_runs(OLD / name)) for name in TREES}
    assert depths == {3, 7, 9, 10}


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


def test_an_old_folder_naming_an_unknown_axis_is_left_in_place(tmp_path):
    results = tmp_path / "results"
    odd = results / "runs" / "precision~fp32" / "zero_stage~0" / "world_size~1" / "hsdp~2"
    odd.mkdir(parents=True)
    (odd / "summary.json").write_text('{"status": "ok"}')
    result = migrate(results)
    [move] = result["moves"]
    assert move.problem.startswith("'hsdp~2' is not 'axis~value' for an axis of this scalelab (precision, zero_stage")
    assert (odd / "summary.json").exists()


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
