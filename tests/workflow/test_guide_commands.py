"""The guide's commands that read a results folder run as written: every fenced `scalelab status|report|migrate|
export|retry|compare|check-config` line and `snakemake -n` of docs/guide.md, in a working directory whose
`results/` is a real sweep's (tests/data/cached_trees, written by an earlier commit's own code) and whose
config.yaml wrote it. A line naming a path that is a placeholder (my.yaml, results/my-sweep, path/to/...) is
run with that path made real (a copy of the tree, the config), so that no documented command goes untried.

The docs' training commands (`snakemake --cores ...`, in the README and every guide) would train for minutes: each
runs as written with `-n` added, in a working directory as a fresh checkout's (its config.yaml, my.yaml a copy of it,
workflow/configs, no results), so that the config file it names exists, merges over config.yaml and validates, and
the workflow plans its jobs; other workflow tests run whole sweeps."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from support import REPO
from support.doc_commands import fenced_commands

GUIDE = REPO / "docs" / "guide.md"
TREE = REPO / "tests" / "data" / "cached_trees" / "f6ec2f4"
READERS = r"(scalelab (status|report|migrate|export config|retry|compare|check-config)\b|snakemake -n\b)"
COMMANDS = [(line, command) for doc, line, command in fenced_commands(READERS) if doc == GUIDE.name]
TRAINING = [(doc, line, command) for doc, line, command in fenced_commands(r"snakemake --cores\b")]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A working directory as a user's after a sweep: results/ (and the placeholders' paths) hold the tree."""
    work = tmp_path_factory.mktemp("guide")
    config = (TREE.parent / "sweep-f6ec2f4.yaml").read_text()
    (work / "config.yaml").write_text(config)
    (work / "my.yaml").write_text(config)
    for where in ("results", "results/my-sweep", "path/to/results", "results_a", "results_b"):
        dest = work / where
        shutil.copytree(TREE, dest, ignore=shutil.ignore_patterns("snakemake-metadata"), dirs_exist_ok=True)
    return work


def test_the_guide_shows_such_commands():
    assert len(COMMANDS) >= 10, COMMANDS  # the walk below reads them: an empty list would hold nothing
    assert len(TRAINING) >= 4, TRAINING


@pytest.mark.parametrize("line, command", COMMANDS, ids=[f"guide.md:{n}" for n, _ in COMMANDS])
def test_a_guide_command_on_a_results_folder_runs_as_written(workdir, line, command):
    from scalelab.harness.testing import snakemake_cmd, snakemake_env

    argv = shlex.split(command)
    if argv[0] == "scalelab":
        argv, env = [sys.executable, "-m", "scalelab.cli", *argv[1:]], {**os.environ, "PYTHONPATH": str(REPO / "src")}
    else:  # the checkout's Snakefile on this working directory, as `snakemake` from a checkout runs it
        argv, env = snakemake_cmd(workdir, *argv[1:]), snakemake_env()
    proc = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"guide.md:{line}: `{command}` exits {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A working directory as a fresh checkout's, before any sweep: config.yaml, my.yaml (a copy), workflow/configs."""
    work = tmp_path_factory.mktemp("checkout")
    for name in ("config.yaml", "my.yaml"):
        shutil.copy(REPO / "config.yaml", work / name)
    shutil.copytree(REPO / "workflow" / "configs", work / "workflow" / "configs")
    return work


@pytest.mark.parametrize("doc, line, command", TRAINING, ids=[f"{d}:{n}" for d, n, _ in TRAINING])
def test_a_documented_training_command_plans_its_jobs(checkout, doc, line, command):
    from scalelab.harness.testing import snakemake_cmd, snakemake_env

    argv = snakemake_cmd(checkout, *shlex.split(command)[1:], "-n")
    proc = subprocess.run(argv, cwd=checkout, capture_output=True, text=True, timeout=300, env=snakemake_env())
    assert proc.returncode == 0, f"{doc}:{line}: `{command} -n` exits {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}"
    assert "This was a dry-run" in proc.stdout + proc.stderr
