"""The GPU machine's one command (`make gpu-check`): its CPU dry path, its deadline, the plain
PyTorch loop it holds scalelab against, and the wheels `make gpu-bundle` carries there."""
import json
import re
import subprocess
import sys

import pytest

from scalelab.harness import gpu_check
from scalelab.harness.gpu_points import TARGETS_TEXT
from support import REPO


def test_gpu_check_dry_path_runs_every_step_on_the_cpu(tmp_path):
    """`make gpu-check`'s steps on the CPU: the gpu suite collected (and skipped here), scalelab
    against the plain loop (bf16 eager and compiled, fp32 eager), emulated fp8 against bf16 at two
    sizes, the reference sweep through the workflow, FSDP2 over one device against stage 0, the memory
    case; the summary last, everything in gpu-check.json."""

    proc = subprocess.run([sys.executable, "-m", "scalelab.harness.gpu_check", "--dry-run", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "DRY RUN on the CPU: these figures are CPU figures" in out and TARGETS_TEXT in out
    # the summary comes last, every part in it
    assert [line for line in out.splitlines() if line.startswith("== ")][-1].startswith("== summary")
    summary = out[out.rindex("== summary"):]
    assert "CPU figures, they say nothing about a GPU" in summary.splitlines()[0]
    assert all(re.search(rf"^{part}\s", summary, re.M) for part in gpu_check.PARTS), summary

    check = json.loads((tmp_path / "gpu-check.json").read_text())
    assert check["dry_run"] and check["figures"].startswith("CPU figures")
    assert {name: part["status"] for name, part in check["parts"].items()} == dict.fromkeys(gpu_check.PARTS, "ok"), check["parts"]
    rows = {r["label"]: r for r in check["comparisons"]}
    assert set(rows) == {"tiny bf16 eager", "tiny bf16 compiled", "small bf16 eager", "tiny fp32 eager"}
    for r in rows.values():
        assert r["status"] == "ok" and r["scalelab_tokens_per_s"] > 0 and r["plain_tokens_per_s"] > 0, r
        assert r["ratio"] == pytest.approx(r["scalelab_tokens_per_s"] / r["plain_tokens_per_s"])
        assert [t["met"] for t in r["targets"]] == [None]  # CPU figures are held against no GPU target
    fp8 = {r["shape"]: r for r in check["fp8"]}
    assert set(fp8) == {"tiny", "small"} and fp8["small"]["model"]["d_model"] > fp8["tiny"]["model"]["d_model"]
    assert all(r["status"] == "ok" and r["fp8_emulated"] and r["fp8_over_bf16"] > 0 for r in fp8.values()), fp8
    # one CPU calibration for the dry run's scalelab runs, as a sweep has one: their MFU on one scale
    ours = [m for ms in check["measurements"]["scalelab"].values() for m in ms if m["status"] == "ok"]
    assert len(ours) >= 8 and all(m["peak_flops_source"].startswith("sweep calibration") for m in ours), ours
    plain = check["measurements"]["plain"]["tiny bf16 compiled"][0]
    assert plain["status"] == "ok" and plain["peak_bytes_measured"] is None  # no device memory on a CPU
    fsdp = check["parts"]["fsdp"]["variants"]  # FSDP2 over one device against stage 0, one step traced each
    assert [v["label"] for v in fsdp] == ["tiny bf16 eager stage 3 [traced]", "tiny bf16 eager stage 2 [traced]"]
    assert all(v["ratio_to_stage_0"] > 0 and v["trace"]["kernels"] > 0 for v in fsdp), fsdp
    memory = check["parts"]["memory"]["cases"]  # the CPU path: predictions, and no allocator history to read
    assert [c["label"] for c in memory] == ["bf16 stage 3", "bf16 stage 0"]
    assert all(c["status"] == "ok" and c["predicted_bytes"] > 0 and "snapshot" not in c for c in memory), memory
    reports = list(tmp_path.glob("reference-cpu-dry-run-*/report/report.html"))
    assert len(reports) == 1 and "fp32-z3-w1" in reports[0].read_text()
