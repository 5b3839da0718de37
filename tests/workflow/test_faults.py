"""The fault drills (devtools.faults) as tests: real processes, counted outcomes.

Run them alone with `pytest -m faults`; `PYTHONPATH=tests python -m devtools.faults` prints their figures.
"""
import pytest

from devtools.faults import DRILLS

# The two drills that take twice a workflow test's usual time (measured: 124 s and 110 s under
# load, the others 33-60 s); only the order `make test` hands out work reads it (tests/conftest.py).
COST_S = {"silent_wrong_results": 60, "kill_mid_step": 55, "sigint_to_snakemake": 60, "sigint_to_group": 55, "sigkill_snakemake": 45}

pytestmark = pytest.mark.faults  # not a tier: `pytest -m faults` runs the drills


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.workflow(cost_s=COST_S[name])) if name in COST_S
                                  else name for name in DRILLS])
def test_drill(tmp_path, name):
    drill = DRILLS[name](tmp_path)
    assert drill.checks_failed == [], drill.checks_failed
    assert (drill.rows_lost, drill.rows_duplicated, drill.corrupt_files, drill.orphan_processes) == (0, 0, 0, 0), drill.notes
    assert drill.faults_recovered == drill.faults_injected
    assert drill.bad_configs_rejected == drill.bad_configs_tried
    assert drill.timeouts_honoured == drill.timeouts_tried
    if name == "bad_configs":
        assert drill.bad_configs_tried >= 31
    if name == "hang":
        assert drill.timeouts_tried >= 1


def test_a_preimported_snakemake_is_the_command_line_in_a_process_of_its_own(tmp_path, monkeypatch):
    """run_snakemake's Snakemake (harness.testing.PreimportedSnakemake, what the tests and drills start) answers as
    the snakemake script does: its output, its exit code, its refusal of a bad config before any job, the
    caller's working directory (the drills that inject faults through the environment show that it reaches the jobs)."""
    import importlib.util
    import subprocess

    from scalelab.harness.testing import SWEEP_IMPORTS, run_snakemake, snakemake_cmd, snakemake_env, write_workdir

    # the server skips a preload it cannot import: a module renamed would only cost time, silently
    assert [m for m in SWEEP_IMPORTS if importlib.util.find_spec(m) is None] == []

    version = run_snakemake(tmp_path, "--version")
    script = subprocess.run(snakemake_cmd(tmp_path, "--version"), capture_output=True, text=True, timeout=120, env=snakemake_env())
    assert version.returncode == 0 and version.stdout.strip() == script.stdout.strip()
    work = write_workdir(tmp_path / "bad", {"results_dir": "results", "no_such_key": 1})
    bad = run_snakemake(work, "--cores", "1", check=False)
    assert bad.returncode == 1 and "no_such_key" in bad.stdout + bad.stderr and not (work / "results").exists()
    # a relative configfile is found from the caller's working directory
    (tmp_path / "other.yaml").write_text("results_dir: results\nno_such_key_either: 1\n")
    monkeypatch.chdir(tmp_path)
    relative = run_snakemake(work, "--cores", "1", "--configfile", "other.yaml", check=False)
    assert relative.returncode == 1 and "no_such_key_either" in relative.stdout + relative.stderr
