"""Config validation: every bad value stops the workflow before any job, naming key and value."""
import pytest

from conftest import snakemake, tiny_config, write_workdir
from scalelab.config import ConfigError, check_config, micro_batch_plan, train_config

BAD_CONFIGS = {
    # case: (overrides, strings the error must contain)
    "wrong type": ({"train": {"steps": "ten"}}, ["'ten'", "steps"]),
    "unknown key": ({"train": {"stepz": 10}}, ["stepz"]),
    "unknown top-level key": ({"resuls_dir": "x"}, ["resuls_dir"]),
    "unknown precision": ({"sweep": {"precision": ["fp32", "fp64"]}}, ["'fp64'", "precision"]),
    "world size below 1": ({"sweep": {"world_size": [0]}}, ["world_size", "0 is less than the minimum of 1"]),
    "global batch not divisible": ({"sweep": {"world_size": [1, 3]}}, ["train.global_batch=8", "world_size=3"]),
    "missing corpus path": ({"dataset": {"source": "text", "path": "no/such/corpus.txt"}}, ["dataset.path", "no/such/corpus.txt"]),
    "heads do not divide width": ({"model": {"n_heads": 3}}, ["model.n_heads=3", "model.d_model=32"]),
}


@pytest.mark.workflow
@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_stops_workflow_before_any_job(tmp_path, case):
    overrides, expected = BAD_CONFIGS[case]
    cfg = tiny_config()
    for section, value in overrides.items():
        if isinstance(value, dict) and section in cfg:
            cfg[section].update(value)
        else:
            cfg[section] = value
    workdir = write_workdir(tmp_path, cfg)
    proc = snakemake(workdir, "--cores", "1", check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    for text in expected:
        assert text in output, f"{case}: {text!r} not in error output:\n{output[-3000:]}"
    assert not (tmp_path / "results").exists(), "a job ran despite the invalid config"


@pytest.mark.workflow
def test_good_config_dry_run_plans_data_and_runs(tmp_path):
    workdir = write_workdir(tmp_path, tiny_config(sweep={"world_size": [1, 2]}))
    proc = snakemake(workdir, "-n", "--cores", "1")
    assert "prepare_data" in proc.stdout and "train" in proc.stdout


def test_micro_batch_plan():
    train = train_config(tiny_config(train={"global_batch": 16, "micro_batch": 2}))
    assert micro_batch_plan(train, 1) == (2, 8)
    assert micro_batch_plan(train, 4) == (2, 2)
    with pytest.raises(ConfigError, match="train.micro_batch=2"):
        micro_batch_plan(train_config(tiny_config(train={"global_batch": 6, "micro_batch": 2})), 2)


def test_synthetic_source_rejects_a_path():
    with pytest.raises(ConfigError, match="dataset.path"):
        check_config(tiny_config(dataset={"path": "corpus.txt"}))
