"""Atomic writes leave no temporaries behind a killed writer: the next write of the same file removes them, and a run
folder's end (the launcher's) removes those of files that are not written again (a rank killed mid-write)."""
import os

from scalelab.io import remove_stale_temporaries, write_json


def test_temporaries_of_dead_writers_go_and_a_live_writers_stay(tmp_path):
    dead, alive = 2 ** 22 + 12345, os.getppid()  # a pid above the kernel's default limit: no process has it
    stray = tmp_path / f".rank0.error.json.{dead}.abcd1234.tmp"
    busy = tmp_path / f".rank1.error.json.{alive}.efgh5678.tmp"
    old_summary = tmp_path / f".summary.json.{dead}.ijkl9012.tmp"
    for path in (stray, busy, old_summary):
        path.write_text("half written")
    write_json(tmp_path / "summary.json", {"status": "ok"})  # the same target written again: its own temporaries go
    assert not old_summary.exists() and stray.exists()
    remove_stale_temporaries(tmp_path)  # the folder's end: every dead writer's
    assert sorted(p.name for p in tmp_path.iterdir()) == [busy.name, "summary.json"]
