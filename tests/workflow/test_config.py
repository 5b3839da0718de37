"""Config validation: every bad value stops the workflow before any job, naming key and value."""


from support import snakemake, tiny_config, write_workdir

# Bad configs: one suite, the YAML files in tests/bad_configs, each rejected by a real
# Snakemake run in the fault drill `bad_configs` (tests/*/test_faults.py).


def test_good_config_dry_run_plans_data_and_runs(tmp_path):
    workdir = write_workdir(tmp_path, tiny_config(sweep={"world_size": [1, 2]}))
    proc = snakemake(workdir, "-n", "--cores", "1")
    assert "prepare_data" in proc.stdout and "train" in proc.stdout
