"""The GPU machine's one command (`make gpu-check`), its CPU dry path: every step that needs no CUDA."""
import json
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.workflow
def test_gpu_check_dry_path_runs_every_step_on_the_cpu(tmp_path):
    """`make gpu-check`'s steps that need no CUDA: the gpu suite collected (and skipped here),
    the benchmark on a tiny model, the reference sweep through the workflow."""

    proc = subprocess.run([sys.executable, "-m", "scalelab.harness.gpu_check", "--dry-run", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "DRY RUN on the CPU: these figures are CPU figures" in proc.stdout
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["dry_run"] and {r["label"] for r in bench["rows"]} == {"fp32", "fp8"}
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in bench["rows"]), bench["rows"]
    reports = list(tmp_path.glob("reference-cpu-dry-run-*/report/report.html"))
    assert len(reports) == 1 and "fp32-z3-w1" in reports[0].read_text()
