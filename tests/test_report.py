"""Collection, plots and the report, from Parquet fixtures alone (no training)."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from scalelab.analysis.metrics import SCHEMA_VERSION, collect, schema_version, steps_table, write_parquet
from scalelab.analysis.report import build_report
from scalelab.harness.fixtures import FAILURES, synthetic_results
from scalelab.io import write_json
from scalelab.sweep import RunPoint

PLOTS = ["memory_model_state", "memory_peak", "throughput", "mfu_heatmap", "loss_curves", "loss_scale", "communication"]
LEVER_PLOTS = ["lever_activation_checkpointing", "lever_micro_batch", "lever_bucket_mb"]


@pytest.fixture
def fixture_results(tmp_path):
    synthetic_results(tmp_path, n_runs=30, n_steps=40)
    return tmp_path


def test_report_from_parquet_alone(tmp_path):
    fixture_results = tmp_path
    synthetic_results(fixture_results, n_runs=96, n_steps=40)  # 24 baseline runs + 3 x 24 lever variants
    html_path = build_report(fixture_results)
    html = html_path.read_text()
    runs = pd.read_parquet(fixture_results / "metrics.parquet")
    for name in PLOTS + LEVER_PLOTS:
        assert (fixture_results / "report" / f"{name}.png").stat().st_size > 1000, name
    for run_id in runs["run_id"]:
        assert re.search(rf">{re.escape(run_id)}<", html), f"{run_id} not in the run table"
    assert html.count("data:image/png;base64,") == len(PLOTS + LEVER_PLOTS), "every figure embedded"
    # Main figures compare the baseline runs; each lever run is set against its baseline twin.
    assert "These figures show the 24 runs with every lever at its default" in html
    assert re.search(r">fp32-z0-w2-ac<.*?>fp32-z0-w2<", html, re.S), "AC run paired with its baseline"
    assert "step_time_ratio_predicted" in html and "all_reduce_calls_predicted" in html
    assert "src='report/" not in html and "src=\"" not in html, "no external images"
    for status, reason in FAILURES.values():
        assert status in html and reason.split(":")[0] in html
    summary = (fixture_results / "report" / "summary.md").read_text()
    assert "| run_id |" in summary and "## Warnings" in summary


def test_report_warns_on_mfu_memory_and_parity(fixture_results):
    runs = pd.read_parquet(fixture_results / "metrics.parquet")
    ok = runs.index[runs["status"] == "ok"]
    runs.loc[ok[0], "mfu"] = 1.7
    runs.loc[ok[1], "model_state_bytes_measured"] = int(runs.loc[ok[1], "model_state_bytes_predicted"] * 1.5)
    runs.loc[ok[2], ["mfu", "peak_flops_source"]] = [float("nan"), "unknown GPU 'NVIDIA Foo 9000': set train.peak_tflops"]
    runs.loc[ok[3], ["device_type", "device_name"]] = ["cuda", "NVIDIA H100 80GB HBM3"]
    runs.loc[ok[4], "teardown_warning"] = "a rank exited abnormally after the results were written (torchrun exit code 1)"
    runs.to_parquet(fixture_results / "metrics.parquet")
    steps = pd.read_parquet(fixture_results / "steps.parquet")
    fp32 = steps.index[(steps["precision"] == "fp32") & (steps["step"] == 5)]
    steps.loc[fp32[0], "loss"] += 0.5
    steps.to_parquet(fixture_results / "steps.parquet")
    html = build_report(fixture_results).read_text()
    assert f"{runs.loc[ok[0], 'run_id']}: MFU 1.70 is above 100%" in html
    assert f"{runs.loc[ok[1], 'run_id']}: measured model state" in html
    assert "fp32 parity broken" in html
    assert f"{runs.loc[ok[2], 'run_id']}: MFU unknown: unknown GPU &#x27;NVIDIA Foo 9000&#x27;: set train.peak_tflops" in html
    assert f"{runs.loc[ok[4], 'run_id']}: a rank exited abnormally after the results were written" in html
    assert "this sweep mixes devices" in html and f"cuda: NVIDIA H100 80GB HBM3 (1 run(s), e.g. {runs.loc[ok[3], 'run_id']})" in html


def _fake_run(runs_root: Path, precision: str, stage: int, ws: int, status="ok"):
    point = RunPoint(precision, stage, ws)
    run_dir = runs_root / point.path
    identity = point.identity(micro_batch=4)
    records = [{"step": s, "loss": 5.0 - s, "grad_norm": 1.0, "lr": 1e-3, "loss_scale": None, "skipped": False,
                "step_time_s": 0.01, "tokens": 512} for s in range(3)]
    write_parquet(steps_table(identity, records), run_dir / "steps.parquet")
    write_json(run_dir / "summary.json", {**identity, "status": status, "reason": None, "tokens_per_s": 1.0})
    return run_dir


def test_collect_reports_bad_files_by_name_and_keeps_the_rest(tmp_path):
    runs_root = tmp_path / "runs"
    _fake_run(runs_root, "fp32", 0, 1)
    _fake_run(runs_root, "bf16", 0, 1, status="oom")
    corrupt = _fake_run(runs_root, "fp16", 0, 1)
    (corrupt / "summary.json").write_text('{"run_id": "fp16-z0-w1", "sta')  # torn write from another tool
    no_steps = _fake_run(runs_root, "fp32", 1, 2)
    (no_steps / "steps.parquet").unlink()
    bad_parquet = _fake_run(runs_root, "fp32", 3, 2)
    (bad_parquet / "steps.parquet").write_bytes(b"PAR1 not really")
    result = collect(tmp_path)
    joined = "\n".join(result["problems"])
    assert str(corrupt / "summary.json") in joined and "corrupt" in joined
    assert str(no_steps / "steps.parquet") + ": missing" in joined
    assert str(bad_parquet / "steps.parquet") in joined
    runs = pd.read_parquet(tmp_path / "metrics.parquet").set_index("run_id")
    assert runs.loc["fp16-z0-w1", "status"] == "corrupt"
    assert runs.loc["bf16-z0-w1", "status"] == "oom"
    assert len(runs) == 5
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert sorted(steps["run_id"].unique()) == ["bf16-z0-w1", "fp32-z0-w1"]
    assert schema_version(tmp_path / "metrics.parquet") == SCHEMA_VERSION == schema_version(tmp_path / "steps.parquet")
    assert pq.read_schema(tmp_path / "steps.parquet").field("zero_stage").type == "int8"


def test_cli_report_on_another_results_folder(fixture_results, tmp_path):
    copy = tmp_path / "copied_from_cluster"
    shutil.copytree(fixture_results, copy)
    scalelab = Path(sys.executable).parent / "scalelab"
    proc = subprocess.run([str(scalelab), "report", str(copy)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (copy / "report" / "report.html").exists()
    missing = subprocess.run([str(scalelab), "report", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def _open_in_chromium(html: Path, shot: Path) -> str:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
           f"--user-data-dir={shot.parent / 'chrome-profile'}", "--enable-logging=stderr", "--v=0",
           "--window-size=1280,3000", f"--screenshot={shot}", html.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    return proc.stderr


def _console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "CONSOLE" in line and ("rror" in line or "Uncaught" in line)]


@pytest.mark.skipif(_chromium() is None, reason="Chromium is not installed (apt-get install chromium; `make browser`)")
def test_report_opens_in_headless_chromium_without_console_errors(fixture_results, tmp_path):
    html = build_report(fixture_results)
    # Control: a page that does log an error must be caught, or the check below proves nothing.
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('deliberate error'); undefinedFunction();</script></body></html>")
    assert _console_errors(_open_in_chromium(bad, tmp_path / "bad.png")), "the console check cannot see errors"
    log = _open_in_chromium(html, tmp_path / "report.png")
    assert not _console_errors(log), _console_errors(log)
