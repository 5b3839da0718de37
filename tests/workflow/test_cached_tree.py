"""An upgrade keeps cached results valid: a results tree written by the real code of an earlier commit in today's
layout (tests/data/cached_trees, made by its make.sh), under the config that wrote it, plans no training job."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

TREES = Path(__file__).parents[1] / "data" / "cached_trees"


def test_a_results_tree_from_an_earlier_commit_plans_no_training_job(tmp_path):
    from scalelab.harness.testing import run_snakemake, snakemake_env

    commit = "f6ec2f4"
    results = tmp_path / "results"
    shutil.copytree(TREES / commit, results)
    # Snakemake's records of the old jobs (their params among them), where Snakemake keeps them
    shutil.move(results / "snakemake-metadata", tmp_path / ".snakemake" / "metadata")
    # a copy's times are the copy's: the data and calibrations first, then the runs' outputs, as when they were
    # written (long ago: older than this checkout's workflow scripts, as after an upgrade)
    order = [*sorted((results / "data").rglob("*")), *sorted((results / "calibration").rglob("*")),
             *sorted((results / "runs").rglob("*"))]
    for i, path in enumerate(order):
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    shutil.copy(TREES / f"sweep-{commit}.yaml", tmp_path / "config.yaml")  # the config that wrote the tree
    dry = run_snakemake(tmp_path, "-n", "--cores", "2", env=snakemake_env()).stdout
    assert "Job stats:" in dry or "Nothing to be done" in dry, dry[-3000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.split("Job stats:")[1], flags=re.M)) if "Job stats:" in dry else {}
    # collection and the report may run again (new columns, new figures); no run trains, no data is prepared
    # again and the collective benchmark is not measured again
    assert not {"train", "train_multinode", "prepare_data", "bench_comm", "record_pruned"} & set(jobs), dry[-3000:]
    assert not re.findall(r"wildcards: run_id=(\S+)", dry), dry[-3000:]
    # the same tree under a changed training setting retrains every run: the check above can see a training job
    (tmp_path / "config.yaml").write_text((TREES / f"sweep-{commit}.yaml").read_text().replace("steps: 4", "steps: 5"))
    changed = run_snakemake(tmp_path, "-n", "--cores", "2", env=snakemake_env()).stdout
    assert sorted(re.findall(r"wildcards: run_id=(\S+)", changed)) == sorted(p.name for p in (results / "runs").iterdir())
