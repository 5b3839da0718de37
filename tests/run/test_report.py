"""Collection, plots and the report, from Parquet fixtures alone (no training)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO


def test_cli_report_on_another_results_folder(fixture_results, tmp_path):
    copy = tmp_path / "copied_from_cluster"
    shutil.copytree(fixture_results, copy)
    scalelab = Path(sys.executable).parent / "scalelab"
    proc = subprocess.run([str(scalelab), "report", str(copy)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (copy / "report" / "report.html").exists()
    missing = subprocess.run([str(scalelab), "report", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_templates_are_package_data_of_a_non_editable_install(tmp_path):
    """The report renders from an installed wheel: its Jinja2 templates are shipped as package data."""
    source = tmp_path / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
                           str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("scalelab-*.whl")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(tmp_path / "site"),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    templates = sorted(p.name for p in (tmp_path / "site/scalelab/report/templates").iterdir())
    assert templates == sorted(p.name for p in (REPO / "src/scalelab/report/templates").glob("*.j2"))
    check = ("import scalelab.report.report as r, sys; assert r.__file__.startswith(sys.argv[1]), r.__file__; "
             "print(r.render('report.html.j2', no_runs='nothing here'))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", check, str(tmp_path / "site")], capture_output=True, text=True, timeout=120,
                          env={**env, "PYTHONPATH": str(tmp_path / "site")}, cwd=tmp_path)
    assert proc.returncode == 0 and "nothing here" in proc.stdout, proc.stderr[-3000:]


def test_report_benchmark_builds_two_checkouts_alternately(tmp_path):
    """`bench report --against`: two build servers, one per checkout (here this one twice), taking turns."""
    from devtools.bench import bench_report

    result = bench_report(n_runs=6, n_steps=5, repeats=2, against=str(REPO))
    assert result["runs"] == 6 and result["builds"] == 2 and result["other"] == str(REPO.resolve())
    for name in ("this", "other"):
        assert 0 < result[f"{name}_report_s_min"] <= result[f"{name}_report_s_median"] <= result[f"{name}_report_s_max"]
        assert result[f"{name}_cpu_s_median"] > 0 and result[f"{name}_first_build_s"] > 0
    assert result["ratio_q1"] <= result["ratio_median"] <= result["ratio_q3"] and result["cpu_ratio_median"] > 0
    with pytest.raises(SystemExit, match="not a scalelab checkout"):
        bench_report(n_runs=6, n_steps=5, repeats=1, against=str(tmp_path))


def test_report_benchmark_prints_time_memory_and_host_speed():
    """`bench report`: builds of a synthetic set in a process of their own, with their peak RSS (the
    interpreter, pandas and matplotlib alone are over 50 MiB) and a fixed Python loop timed before
    each (a shared host's speed drifts; figures from different moments compare only beside it)."""
    from devtools.bench import bench_report

    result = bench_report(n_runs=6, n_steps=5, repeats=2)
    assert result["runs"] == 6 and result["builds"] == 2
    assert 0 < result["report_s_min"] <= result["report_s_median"] <= result["report_s_max"]
    assert 50 < result["peak_rss_mib"] < 4096 and result["drawing_peak_rss_mib"] >= 0
    assert 0 < result["host_loop_s_median"] <= result["host_loop_s_max"]
