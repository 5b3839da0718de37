"""Atomic writes leave no temporaries behind a killed writer: the next write of the same file removes them, and a run
folder's end (the launcher's) removes those of files that are not written again (a rank killed mid-write)."""
import os

from scalelab.io import remove_stale_temporaries, write_json


def test_temporaries_of_dead_writers_go_and_a_live_writers_stay(tmp_path):
    dead, alive = 2 ** 22 + 12345, os.getppid()  # a pid above the kernel's default limit: no process has it
    stray = tmp_path / f".rank0.error.json.{dead}.abcd1234.tmp"
    busy = tmp_path / f".rank1.error.json.{alive}.efgh5678.tmp"
    old_summary = tmp_path / f".summary.json.{dead}.ijkl9012.tmp"
    data = tmp_path / f".val.bin.{dead}.tmp"  # the data step's own form: no random part
    for path in (stray, busy, old_summary, data):
        path.write_text("half written")
    write_json(tmp_path / "summary.json", {"status": "ok"})  # the same target written again: its own temporaries go
    assert not old_summary.exists() and stray.exists() and data.exists()
    write_json(tmp_path / "val.bin", {})  # (any writer of val.bin removes the data step's form too)
    assert not data.exists()
    (tmp_path / "val.bin").unlink()
    data.write_text("half written")
    remove_stale_temporaries(tmp_path)  # the folder's end: every dead writer's
    assert sorted(p.name for p in tmp_path.iterdir()) == [busy.name, "summary.json"]
