"""The workflow itself: lint, a real data step, an end-to-end sweep and regeneration (kills: test_faults)."""
import json
import re
import shutil
import subprocess

import pyarrow.parquet as pq
import pytest

from conftest import REPO, SNAKEMAKE, snakemake, tiny_config, write_workdir

pytestmark = pytest.mark.workflow


def test_lint_passes():
    proc = subprocess.run([SNAKEMAKE, "--lint"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_data_step_on_a_text_corpus(tmp_path):
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    cfg = tiny_config(dataset={"name": "fox", "source": "text", "path": "corpus.txt"})
    workdir = write_workdir(tmp_path, cfg)
    snakemake(workdir, "--cores", "1", "results/data/fox/meta.json")
    meta = json.loads((tmp_path / "results/data/fox/meta.json").read_text())
    assert meta["n_train_tokens"] + meta["n_val_tokens"] == 44 * 200
    assert (tmp_path / "results/logs/data/fox.log").exists()


def test_sweep_end_to_end_then_nothing_to_do(tmp_path):
    cfg = tiny_config(sweep={"precision": ["fp32", "bf16"], "zero_stage": [0, 3], "world_size": [1, 2]})
    workdir = write_workdir(tmp_path, cfg)
    snakemake(workdir, "--cores", "2")
    summaries = sorted((tmp_path / "results/runs").glob("*/*/*/summary.json"))
    assert len(summaries) == 8
    for path in summaries:
        summary = json.loads(path.read_text())
        assert summary["status"] == "ok", (path, summary["reason"])
        steps = pq.read_table(path.parent / "steps.parquet")
        assert steps.num_rows == cfg["train"]["steps"]
        assert path.parent.relative_to(tmp_path / "results/runs").as_posix() == (
            f"precision~{summary['precision']}/zero_stage~{summary['zero_stage']}/world_size~{summary['world_size']}")
    dry = snakemake(workdir, "-n", "--cores", "2")
    assert "Nothing to be done" in dry.stdout + dry.stderr
    runs = pq.read_table(tmp_path / "results/metrics.parquet").to_pandas()
    assert sorted(runs["run_id"]) == sorted(json.loads(p.read_text())["run_id"] for p in summaries)
    html = (tmp_path / "results/report/report.html").read_text()
    assert all(run_id in html for run_id in runs["run_id"])

    # Regenerating the report from cached results schedules no training (nor collection).
    shutil.rmtree(tmp_path / "results/report")
    dry = snakemake(workdir, "-n", "--cores", "2").stdout
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.split("Job stats:")[1], flags=re.M))
    assert jobs.get("report") == "1" and "train" not in jobs and "collect" not in jobs, dry
    snakemake(workdir, "--cores", "2")
    assert (tmp_path / "results/report/report.html").exists()
    snakemake(workdir, "--report", str(tmp_path / "snakemake_report.zip"))
    assert (tmp_path / "snakemake_report.zip").stat().st_size > 10_000
