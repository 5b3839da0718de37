"""Shared fixtures; the helpers themselves live in scalelab.harness.testing (the fault drills use them too)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from scalelab.harness import REPO_ROOT as REPO  # noqa: F401
from scalelab.harness.testing import BIN, SNAKEMAKE, tiny_config, write_workdir  # noqa: F401
from scalelab.harness.testing import run_snakemake as snakemake  # noqa: F401
from scalelab.plan.columns import IDENTITY as COLUMNS_IDENTITY
from scalelab.plan.columns import steps_problems, summary_problems
from scalelab.run.launch import launch_run

PARITY_STEPS = 10


_PREFORK_SERVER = []


def pytest_collection_finish(session):
    """One prefork server per pytest worker (scalelab.run.prefork), named in the environment, so
    that the CPU runs this worker's tests launch, directly or through Snakemake, fork their ranks
    from it as a sweep's do from its own; not started when only unit tests run (nor by the xdist
    controller, which runs none). Started here, outside any test: the unit tier's guard would stop it."""
    from scalelab.run.prefork import start_server

    if not session.config.getoption("collectonly") and any(not item.get_closest_marker("unit") for item in session.items):
        _PREFORK_SERVER.append(start_server())


def pytest_sessionfinish(session):
    from scalelab.run.prefork import stop_server

    while _PREFORK_SERVER:
        stop_server(_PREFORK_SERVER.pop())


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A prepared synthetic dataset (byte tokens) shared by the training tests."""
    from scalelab.config import dataset_config
    from scalelab.run.data import prepare_dataset

    out = tmp_path_factory.mktemp("data") / "tiny"
    prepare_dataset(dataset_config(tiny_config()), out, seq_len=32)
    return out


def suite_calibration(tiny_data: Path) -> Path:
    """This worker's CPU peak record for one-thread ranks (scalelab.run.calibration), measured once, in
    process, beside the shared data. A run a test launches outside the workflow otherwise times
    its own matmuls at start (its dtype's and bf16's, ~0.3-1 s of every run), which no test reads.
    A rank of another thread count (world size 1: two threads here) still measures its own, so that
    path stays exercised. In process, not scalelab.run.calibration.ensure_calibration's subprocess: unit
    tests reach this through run_point (points that are skipped, never launched) and start no process."""
    path = tiny_data.parent / "cpu-calibration.json"
    if not path.exists():
        import torch

        from scalelab.run.calibration import write_calibration

        threads = torch.get_num_threads()
        try:
            write_calibration(path, threads=1)
        finally:
            torch.set_num_threads(threads)  # this process's own tests keep theirs
    return path


def run_point(tmp_path, tiny_data, point, cfg=None, fault=None, **kwargs):
    """Launch one sweep point for real (torchrun, gloo); return (summary, steps table, run folder).
    fault: a SCALELAB_FAULT spec for this run only."""
    # Parity runs up to world size 4 on 2 cores: correctness, not measurement, so over-commit is allowed.
    cfg = cfg or tiny_config(train={"steps": PARITY_STEPS, "warmup_steps": 2}, planning={"launch_overcommitted": True})
    kwargs.setdefault("calibration", suite_calibration(tiny_data))
    run_dir = tmp_path / point.path
    old = os.environ.pop("SCALELAB_FAULT", None)
    if fault:
        os.environ["SCALELAB_FAULT"] = fault
    try:
        summary = launch_run(cfg, point, tiny_data, run_dir, tmp_path / f"{point.run_id}.log", threads=2, **kwargs)
    finally:
        os.environ.pop("SCALELAB_FAULT", None)
        if old is not None:
            os.environ["SCALELAB_FAULT"] = old
    assert json.loads((run_dir / "summary.json").read_text()) == json.loads(json.dumps(summary, default=str))
    # no deprecation warning of the project's making between the progress lines and the status
    log = (tmp_path / f"{point.run_id}.log").read_text()
    assert "deprecated" not in log, [line for line in log.splitlines() if "deprecated" in line]
    steps = pq.read_table(run_dir / "steps.parquet")
    # Every real run of the suite against the column table (scalelab.plan.columns). A compiled run
    # without its warm-up (tests only) has no compile time, which the table says it has.
    if kwargs.get("compile_warm_up", True):
        assert summary_problems(summary) == [], (point.run_id, summary_problems(summary))
        identity = {c.name: summary[c.name] for c in COLUMNS_IDENTITY}
        assert steps_problems(steps, identity) == [], (point.run_id, steps_problems(steps, identity))
    return summary, steps.to_pandas(), run_dir


def strategy_steps(out: Path, world_size: int, *args: str, timeout_s: float = 180, script: str = "strategy_steps.py"):
    """Run tests/ranks/<script> (strategy_steps.py unless said) on world_size real ranks (gloo) with
    these arguments; what rank 0 wrote to out, or an assertion with the ranks' output tails."""
    import subprocess
    import sys

    from scalelab.run.ranks import free_port

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world_size),
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, str(REPO / "tests" / "ranks" / script), "--out", str(out), *args],
                              env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(world_size)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout_s)[0])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    return json.loads(out.read_text())


def planned_jobs(dry_run_output: str) -> list[dict]:
    """The jobs of a `snakemake -n` printout: rule, wildcards and resources of each."""
    jobs = []
    for block in re.split(r"^(?:localrule|rule) ", dry_run_output, flags=re.M)[1:]:
        job = {"rule": block.split(":", 1)[0], "wildcards": {}, "resources": {}}
        threads = re.search(r"^\s+threads: (\d+)$", block, flags=re.M)
        job["threads"] = int(threads.group(1)) if threads else 1
        for key in ("wildcards", "resources"):
            line = re.search(rf"^\s+{key}: (.*)$", block, flags=re.M)
            if line:
                job[key] = dict(item.split("=", 1) for item in line.group(1).split(", "))
        jobs.append(job)
    return jobs


def path_without(tool: str, *first: Path) -> str:
    """PATH with `first` in front and no folder holding `tool` (simulates a machine without it)."""
    folders = [str(f) for f in first] + [d for d in os.environ["PATH"].split(os.pathsep)
                                          if d and not (Path(d) / tool).exists()]
    return os.pathsep.join(folders)


# ---- Test tiers by cost (pyproject.toml registers them; `make test-fast` runs `-m unit`) ----
TIERS = ("unit", "run", "workflow", "cluster", "browser", "gpu")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """Every test carries exactly one tier marker, so a new test cannot slip out of `make test-fast`'s
    accounting (untiered) nor be counted twice. A file with a test that has none, or two, fails to
    collect, naming them: with `-m unit` too (a test must be tiered even when not selected), and
    under xdist (where an error raised at collection would only crash the workers)."""
    report = yield
    if report.passed:
        wrong = []
        for item in report.result:
            if isinstance(item, pytest.Item):
                tiers = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
                if len(tiers) != 1:
                    wrong.append(f"  {item.nodeid}: {', '.join(tiers) or 'no tier'}")
        if wrong:
            report.outcome, report.result = "failed", []
            report.longrepr = (f"every test needs exactly one tier marker of {', '.join(TIERS)} (a module's "
                               f"`pytestmark` or a test's `@pytest.mark.<tier>`; see pyproject.toml):\n" + "\n".join(wrong))
        # On an xdist worker, `dist` reads "no" (xdist resets it there); `loadgroup` says what the
        # controller was asked for.
        elif collector.config.getoption("loadgroup", False) or collector.config.getoption("dist", None) == "loadgroup":
            for item in report.result:
                if isinstance(item, pytest.Item) and item.get_closest_marker("xdist_group") is None:
                    item.add_marker(pytest.mark.xdist_group(_work_unit(item)))
    return report


# `make test` hands its two workers units of work (pytest-xdist's --dist loadgroup):
# - a file, by default: its unit tests (cheap), and its tests that read a module fixture (the
#   parity runs, the mixed-precision runs), so that the fixture is built once, on one worker;
# - any other test of a costlier tier alone: it starts its runs or Snakemake in a folder of its
#   own and shares nothing. Whole files were too coarse: test_workflow.py took 13 minutes and
#   test_training.py 7.5 (measured under load), each longer than half of the suite.
# The costliest units go first (--no-loadscope-reorder keeps this order; xdist's default orders
# by number of tests), so that no long unit starts last while the other worker idles.
TIER_COST_S = {"unit": 0.1, "run": 8, "workflow": 30, "cluster": 60, "browser": 5, "gpu": 0}
"""What a test of each tier costs, roughly, in seconds on 2 cores; a test's own estimate, where it
is far from its tier's, goes in its tier marker: `@pytest.mark.workflow(cost_s=200)`. Only the
order of the work depends on these numbers."""


def pytest_xdist_node_collection_finished(node, ids):
    """On the controller, under --dist loadgroup: every test's id must carry its group (this file
    gives each test one; xdist appends `@group` on the worker and schedules by it). With pytest 9.2
    that append is a no-op (pytest-dev/pytest-xdist#1386; pyproject.toml pins pytest below it):
    each test is then dealt out alone, module fixtures (the parity runs) are built once per
    worker and the suite takes minutes longer with every test passing. Stop loudly instead."""
    if node.config.getoption("dist", None) == "loadgroup" and ids and not any("@" in i for i in ids):
        pytest.exit(f"pytest-xdist's --dist loadgroup does not group tests under pytest {pytest.__version__} "
                    f"(pytest-dev/pytest-xdist#1386): install pytest<9.2 (`pip install -e '.[test]'`)", returncode=4)


def _tier(item) -> pytest.Mark | None:
    return next((m for m in item.iter_markers() if m.name in TIERS), None)


def _work_unit(item) -> str:
    tier = _tier(item)
    fixtures = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    shares = any(getattr(d, "scope", "function") in ("module", "package", "class")
                 for name in getattr(item, "fixturenames", ()) for d in fixtures.get(name, ()))
    if tier is None or tier.name == "unit" or shares:
        return item.path.name
    return re.sub(r"[^\w.:/-]", "_", item.nodeid)  # xdist splits a group name at '@' and ']'


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope
def pytest_collection_modifyitems(items):
    """The costliest units of work first; each unit's tests keep their order and stay together."""
    cost: dict[str, float] = {}
    for item in items:
        tier = _tier(item)
        hints = [m.kwargs["cost_s"] for m in item.iter_markers() if m.name in TIERS and "cost_s" in m.kwargs]
        estimate = (hints[0] if hints else TIER_COST_S[tier.name]) if tier is not None else 0
        cost[_work_unit(item)] = cost.get(_work_unit(item), 0) + estimate
    items.sort(key=lambda item: (-cost[_work_unit(item)], _work_unit(item)))


class ProcessStarted(RuntimeError):
    """A `unit` test tried to start a program."""


# What a unit test may still start: tools that start in milliseconds (git for provenance, a shell,
# a test's fake nvidia-smi script, `true` for a dead pid). Forks of the test process itself (the
# report's figure pool) are allowed too: they start no interpreter and import nothing. What costs
# seconds is an interpreter (python, the scalelab CLI, torchrun, Snakemake, pip) or a browser.
UNIT_MAY_START = {"git", "sh", "bash", "true", "nvidia-smi"}
_STARTED: list[str] = []  # what the running unit test tried to start (even if its code caught the error)


def _refuse(what, original=None):
    def refused(*args, **kwargs):
        if what == "subprocess":  # Popen._execute_child(self, args, executable, ...)
            argv = args[1]
            program = argv if isinstance(argv, (str, bytes, os.PathLike)) else argv[0]
            if original is not None and os.path.basename(os.fsdecode(program)) in UNIT_MAY_START:
                return original(*args, **kwargs)
            shown = argv
        else:
            shown = args[:2]
        _STARTED.append(f"{what}: {shown!r}"[:300])
        raise ProcessStarted(f"a unit test started a program ({what}: {shown!r}): mark the test `run` "
                             "(or `workflow`, `browser`, `cluster`) instead of `unit`")
    return refused


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A unit test whose code caught the refusal still fails, naming what it started."""
    report = (yield).get_result()
    if _STARTED:
        if report.passed:
            report.outcome = "failed"
            report.longrepr = "a unit test started a program (mark it `run`, `workflow`, ...):\n  " + "\n  ".join(_STARTED)
        _STARTED.clear()  # one failure per attempt, not one per phase


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A `unit` test starts no program: while it runs (its fixtures' set-up and tear-down included)
    every way Python starts one raises, so the tier's promise of speed is checked, not assumed."""
    if item.get_closest_marker("unit") is None:
        yield
        return
    import multiprocessing.util
    import subprocess

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "_execute_child", _refuse("subprocess", subprocess.Popen._execute_child))
        mp.setattr(multiprocessing.util, "spawnv_passfds", _refuse("multiprocessing spawn"))  # spawn/forkserver
        for name in ("posix_spawn", "posix_spawnp", "system", "execv", "execve", "execvp", "execvpe"):
            if hasattr(os, name):
                mp.setattr(os, name, _refuse(f"os.{name}"))
        from scalelab.run.prefork import PREFORK_ENV

        mp.delenv(PREFORK_ENV, raising=False)  # ranks forked by the worker's server would start no program here
        _STARTED.clear()
        try:
            yield
        finally:
            _STARTED.clear()
