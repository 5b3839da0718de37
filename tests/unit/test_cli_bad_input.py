"""Every scalelab command answers bad input in one line, with exit status 2, before it does anything: missing or
wrong paths, impossible numbers, unknown names. No traceback reaches a user, nothing is created, and no file of the
user's is replaced. (plan and estimate have their own walk, beside their tests.)"""
import pytest

from devtools.fixtures import synthetic_results
from scalelab.cli import main

BAD = [  # (arguments, with {f} a plain file, {e} an empty folder, {r} a results folder, {m} a folder of the user's)
    "collect nowhere", "collect {f}", "collect {e}",
    "report nowhere", "report {f}", "report {e}", "report {r} --out {f}", "report {r} --out {m}",
    "check-config missing.yaml", "check-config {e}", "check-config {f}",
    "compare nowhere {r}", "compare {r} {f}", "compare {r} {r} --out {m}",
    "status nowhere", "status {f}",
    "retry nowhere", "retry {r} --status bogus", "retry {r} --status ok", "retry {r} --status running",
    "resume nowhere", "resume {f}", "resume {e}",
    "predict --validate nowhere --fit world_size==1", "predict --validate {r} --fit ((", "predict --validate {r} --fit nosuch==1",
    "predict --validate {r} --fit world_size==999", "status {r} --active-within -5", "status {r} --config missing.yaml",
    "migrate nowhere", "migrate {f}",
    "export tensorboard nowhere {e}/tb", "export config nowhere --to hf", "export config {r} --to nope",
    "export config {r} --to hf --run nope",
    "bench comm --out {e}/x.parquet --world-sizes 0", "bench comm --out {e}/x.parquet --world-sizes -2",
    "bench comm --out {e}/x.parquet --world-sizes two", "bench comm --out {e}/x.parquet --min-bytes -1",
    "bench comm --out {e}/x.parquet --factor 1", "bench comm --out {e}/x.parquet --reps 0",
    "bench comm --out {e}/x.parquet --collectives bogus", "bench comm --out {e}/x.parquet --min-seconds -1",
    "bench comm --out {e}/x.parquet --min-seconds nan", "bench comm --out {e}/x.parquet --threads-per-rank 0",
    "bench comm --out {e}/x.parquet --collective-timeout 0", "bench comm --out {e}/x.parquet --timeout inf",
    "bench comm --out {e}/x.parquet --batches 0", "bench comm --out {e}/x.parquet --max-bytes -5",
]


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    root = tmp_path_factory.mktemp("places")
    (root / "afile").write_text("mine\n")
    (root / "empty").mkdir()
    (root / "mine").mkdir()
    (root / "mine" / "thesis.txt").write_text("mine\n")
    synthetic_results(root / "results", n_runs=6, n_steps=3)
    return root


def _snapshot(root):
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("command", BAD)
def test_bad_input_is_one_line_and_exit_2(command, places, capsys, monkeypatch):
    monkeypatch.chdir(places)
    argv = command.format(f=places / "afile", e=places / "empty", r=places / "results", m=places / "mine").split()
    before = _snapshot(places)
    try:
        code = main(argv)
    except SystemExit as err:  # argparse's own refusal of an unknown choice or a non-number
        code = err.code
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " ", "warning:"))]
    assert code == 2, (command, code, out, err)
    assert "Traceback" not in err + out and len(lines) == 1, (command, err)
    assert _snapshot(places) == before, f"{command} changed files it was refused for"
