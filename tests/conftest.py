"""The suite's fixtures and hooks: a test's tier is its folder (tests/<tier>/), the costliest work first,
a unit test starts no program. The helpers tests share are in tests/support (``from support import``)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

# OpenMP threads that finish their share of a parallel region sleep at once instead of spinning.
# The suite over-commits its 2 cores on purpose (two pytest workers, each starting runs of 2-4
# ranks or threads), and libgomp's default spin then burns the cores the other processes wait
# for: on 2 cores, tests/run/test_{training,mixed_precision,checks}.py under two workers took
# 59-60 s with it against 70-79 s without (user CPU 85-88 s against 110-125 s). Set here, before
# anything loads torch's libgomp (which reads it once), so the workers, the prefork servers, the
# ranks and every Snakemake the tests start inherit it. A measurement never runs over-committed
# (a sweep's runs take their own cores), so scalelab itself leaves the default alone.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from support import tiny_config

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


@pytest.fixture
def fixture_results(tmp_path):
    """A synthetic results folder (devtools.fixtures): 30 runs of 40 steps, Parquet alone."""
    from devtools.fixtures import synthetic_results

    synthetic_results(tmp_path, n_runs=30, n_steps=40)
    return tmp_path


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A prepared synthetic dataset (byte tokens) shared by the training tests."""
    from scalelab.config import dataset_config
    from scalelab.run.data import prepare_dataset

    out = tmp_path_factory.mktemp("data") / "tiny"
    prepare_dataset(dataset_config(tiny_config()), out, seq_len=32)
    return out


# ---- Test tiers by cost (pyproject.toml registers them; `make test-fast` runs `-m unit`) ----
TIERS = ("unit", "run", "workflow", "cluster", "browser", "gpu")
TESTS = Path(__file__).resolve().parent


def folder_tier(path: Path) -> str | None:
    """The tier a test file's folder names (tests/<tier>/test_*.py), or None outside one."""
    return path.parent.name if path.parent.parent == TESTS and path.parent.name in TIERS else None


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A test's tier is its folder, tests/<tier>/: its mark is applied here, as the file is collected, so
    `-m unit` selects exactly tests/unit/ and a new test cannot slip out of `make test-fast`'s
    accounting. A test outside a tier folder, or marked with another tier than its folder's (a tier
    marker may stay on a test to give its cost: `@pytest.mark.workflow(cost_s=200)`), fails to collect,
    naming it: with `-m unit` too, and under xdist (where an error raised at collection would only crash
    the workers)."""
    report = yield
    if report.passed:
        wrong = []
        for item in report.result:
            if isinstance(item, pytest.Item):
                tier = folder_tier(item.path)
                marked = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
                if tier is None:
                    wrong.append(f"  {item.nodeid}: not in a tier folder (tests/{{{','.join(TIERS)}}}/)")
                elif marked and marked != [tier]:
                    wrong.append(f"  {item.nodeid}: marked {', '.join(marked)} in tests/{tier}/")
                elif not marked:
                    item.add_marker(getattr(pytest.mark, tier))
        if wrong:
            report.outcome, report.result = "failed", []
            report.longrepr = ("a test's tier is its folder, tests/<tier>/ (see pyproject.toml's markers):\n"
                               + "\n".join(wrong))
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
        return f"{item.path.parent.name}/{item.path.name}"
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
