"""GPU products by exact CUDA device name, dense datasheet peaks, the NaN-with-reason paths."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCALELAB = str(Path(sys.executable).parent / "scalelab")


def test_estimate_cli_knows_the_products():
    run = lambda *a: subprocess.run([SCALELAB, "estimate", "time", *a], capture_output=True, text=True, timeout=60)
    assert "H100 NVL" in run("--help").stdout
    out = run("--params", "7e9", "--tokens", "1e12", "--gpus", "8", "--gpu", "h100 nvl", "--json")
    result = json.loads(out.stdout)
    assert result["gpu"] == "H100 NVL" and result["peak_flops_per_gpu"] == pytest.approx(835.5e12)
    proc = run("--params", "7e9", "--tokens", "1e12", "--gpus", "8", "--gpu", "A100", "--precision", "fp8")
    assert proc.returncode == 2 and "no dense 'fp8'" in proc.stderr
