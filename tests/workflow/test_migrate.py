"""scalelab migrate: results trees written by the real code of earlier commits (tests/data/old_layouts,
made by its make.sh) moved to runs/<run id>/ without losing or changing a metric."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from scalelab.results.migrate import migrate
from support.migrate import OLD, TREES, _copy


def test_the_workflow_refuses_an_old_tree_and_after_migrate_trains_nothing(tmp_path):
    """The tree of the newest old layout, with Snakemake's records of its jobs, under the config that
    wrote it: before the migration the workflow stops before any job, naming the command; after it,
    it collects and reports again and plans neither data preparation nor training of a migrated run
    (params recorded by the old code, a partial dataset section among them, read as unchanged); only
    the baseline's repeats, which that code did not have, are new runs."""
    from scalelab.harness.testing import run_snakemake, snakemake_env

    name = next(n for n in TREES if n.endswith("-10-levels"))
    results = _copy(name, tmp_path / "results")
    # Snakemake's records of the old jobs (their params among them), where Snakemake keeps them
    shutil.move(results / "snakemake-metadata", tmp_path / ".snakemake" / "metadata")
    # a copy's times are the copy's: the data first, then the runs' outputs, as when they were written
    # (long ago: older than this checkout's workflow scripts, as after an upgrade)
    for i, path in enumerate([*sorted((results / "data").rglob("*")), *sorted((results / "runs").rglob("*"))]):
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    assert min(p.stat().st_mtime for p in (Path(__file__).parents[2] / "workflow" / "scripts").glob("*.py")) > 1_700_000_100
    shutil.copy(OLD / "sweep-10.yaml", tmp_path / "config.yaml")  # the config that wrote the tree
    refused = run_snakemake(tmp_path, "-n", "--cores", "2", check=False, env=snakemake_env())
    assert refused.returncode != 0 and "run `scalelab migrate results`" in refused.stdout + refused.stderr, refused.stdout[-2000:]

    migrate(results)
    dry = run_snakemake(tmp_path, "-n", "--cores", "2").stdout
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.split("Job stats:")[1], flags=re.M))
    # no migrated run trains again; the baseline's repeats (repeats.baseline: 3, new since) are new runs
    # the collective benchmark (prediction.bench_comm, new since) measures once; it trains nothing
    assert jobs == {"bench_comm": "1", "train": "2", "collect": "1", "report": "1", "all": "1", "total": "6"}, dry
    assert sorted(re.findall(r"wildcards: run_id=(\S+)", dry)) == ["fp32-z0-w1-r2", "fp32-z0-w1-r3"], dry
