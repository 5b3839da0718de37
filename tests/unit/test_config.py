"""Config validation: every bad value stops the workflow before any job, naming key and value."""
import json

import pytest

from scalelab.config import SCHEMA, ConfigError, train_config
from scalelab.config.reading import check_yaml_syntax
from scalelab.planning.sweep import RunPoint, micro_batch_plan, sweep_plan
from scalelab.planning.validation import check_config, check_moved_keys, load_config, validate_config
from support import REPO, tiny_config, write_workdir


def test_micro_batch_plan():
    train = train_config(tiny_config(train={"global_batch": 16}))
    assert micro_batch_plan(train, 1, 2) == (2, 8)
    assert micro_batch_plan(train, 4, 2) == (2, 2)
    assert micro_batch_plan(train, 4) == (4, 1)
    with pytest.raises(ConfigError, match="sweep.micro_batch=2"):
        micro_batch_plan(train_config(tiny_config(train={"global_batch": 6})), 2, 2)


def test_lever_axes_leave_out_combinations_they_do_not_apply_to():
    cfg = tiny_config(train={"global_batch": 8}, sweep={
        "precision": ["fp32"], "zero_stage": [0, 3], "world_size": [1, 2],
        "micro_batch": [None, 8], "cpu_offload": [False, True], "bucket_mb": [25, 1]})
    points, left_out = sweep_plan(cfg)
    ids = {p.run_id for p in points}
    # micro-batch 8 fits world size 1 (8 per rank), not 2 (4 per rank); offload only at stage 3;
    # FSDP2 (stage 3) has no buckets, so its bucket_mb is None and the 1 MiB copy is not a second run.
    assert "fp32-z0-w1-mb8" in ids and "fp32-z0-w2-mb8" not in ids
    assert "fp32-z3-w2-offload" in ids and not any(p.cpu_offload and p.zero_stage == 0 for p in points)
    assert "fp32-z0-w1-bucket1" in ids and all(p.bucket_mb is None for p in points if p.zero_stage == 3)
    assert len(ids) == len(points)  # run ids are unique
    reasons = {r for _, r in left_out}
    assert any("sweep.micro_batch=8" in r and "world_size=2" in r for r in reasons)
    assert any("cpu_offload applies to ZeRO stage 3" in r for r in reasons)
    # A run's folder is its id; its point.json reads back as the point; default levers keep the short id.
    for p in points:
        assert p.path == p.run_id and RunPoint.from_json(json.loads(json.dumps(p.to_json()))) == p
    assert RunPoint("fp32", 0, 1).run_id == "fp32-z0-w1"
    assert RunPoint("fp32", 3, 1, 2, True, True, 1.0).run_id == "fp32-z3-w1-mb2-ac-offload"


def test_the_compile_lever_is_off_by_default_and_doubles_a_sweep_when_listed():
    points, left_out = sweep_plan(load_config(REPO / "config.yaml"))
    # 24 points, and the baseline (fp32-z0) at both world sizes four times more (repeats.baseline: 5)
    assert len(points) == 24 + 2 * 4 and not left_out and not any(p.compile for p in points)
    base = tiny_config(sweep={"precision": ["fp32", "bf16"], "zero_stage": [0, 3], "world_size": [1, 2]})
    both = tiny_config(sweep={**base["sweep"], "compile": [False, True]})
    assert len(sweep_plan(both)[0]) == 2 * len(sweep_plan(base)[0]) == 16
    point = RunPoint("fp32", 3, 2, activation_checkpointing=True, compile=True)
    assert point.run_id == point.path == "fp32-z3-w2-ac-compiled"
    assert RunPoint.from_json(json.loads(json.dumps(point.to_json()))) == point
    with pytest.raises(ConfigError, match=r"sweep.compile\[0\]: 'yes' is not true or false"):
        validate_config(tiny_config(sweep={"compile": ["yes"]}))


def test_train_micro_batch_names_its_new_home():
    with pytest.raises(ConfigError, match="train.micro_batch has moved to sweep.micro_batch"):
        check_moved_keys(tiny_config(train={"micro_batch": 2}))


def test_synthetic_source_rejects_a_path():
    with pytest.raises(ConfigError, match="dataset.path"):
        check_config(tiny_config(dataset={"path": "corpus.txt"}))


def test_the_schema_and_config_yaml_list_the_registered_axes_and_strategies():
    """One place per concept: the sweep keys, their defaults and the stages come from the registries."""
    import yaml

    from scalelab.planning.sweep import AXES, LEVER_AXES, SWEEP_AXES
    from scalelab.registries.strategies import STRATEGIES, ZERO_STAGES
    from scalelab.run import parallel

    schema = SCHEMA["properties"]["sweep"]["properties"]
    swept = [axis.name for axis in AXES if axis.swept]  # repeat's values come from the repeats: section
    assert swept == [a for a in SWEEP_AXES if a != "repeat"]
    assert list(schema) == swept
    assert list(yaml.safe_load((REPO / "config.yaml").read_text())["sweep"]) == swept
    for axis in AXES:
        if axis.name in LEVER_AXES:
            assert schema[axis.name]["default"] == [axis.default], axis.name
    assert schema["zero_stage"]["items"]["enum"] == list(ZERO_STAGES)
    for record in STRATEGIES.values():
        assert callable(getattr(parallel, record.wrapper)), record.wrapper


def test_config_defaults_are_the_schemas():
    """Defaults are written once, in the schema: the dataclasses take theirs from it."""
    from scalelab.config import ClusterConfig, DatasetConfig, ModelConfig, TrainConfig

    filled = validate_config({"sweep": {"precision": ["fp32"]}})
    for cls, name in ((DatasetConfig, "dataset"), (ModelConfig, "model"), (TrainConfig, "train"), (ClusterConfig, "cluster")):
        built = cls()
        for key, value in filled[name].items():
            assert getattr(built, key) == value, (name, key)


@pytest.mark.parametrize("overrides, message", [
    ({"train": {"lr": float("inf")}}, "train.lr=inf is not a finite number"),
    ({"train": {"weight_decay": float("nan")}}, "train.weight_decay=nan is not a finite number"),
    ({"train": {"fp16_init_scale": float("inf")}}, "train.fp16_init_scale=inf"),
    ({"train": {"collective_timeout_s": float("inf")}}, "train.collective_timeout_s=inf"),
    ({"sweep": {"bucket_mb": [float("inf")]}}, r"sweep.bucket_mb\[0\]=inf"),
    ({"sweep": {"bucket_mb": [25, float("nan")]}}, r"sweep.bucket_mb\[1\]=nan"),
    # Whole-number floats are refused, not coerced: the config reads as what runs.
    ({"train": {"steps": 20.0}}, r"train.steps=20.0 must be an integer.*\(write 20\)"),
    ({"dataset": {"synthetic_bytes": 200000.0}}, "dataset.synthetic_bytes=200000.0 must be an integer"),
    ({"sweep": {"micro_batch": [2.0]}}, r"sweep.micro_batch\[0\]=2.0 must be an integer"),
    ({"cluster": {"gpus_per_node": 8.5}}, "cluster.gpus_per_node=8.5 must be an integer"),
])
def test_numbers_are_finite_and_integer_keys_take_integers(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(tiny_config(**overrides))


def test_run_ids_name_one_run_each():
    """A bucket size that is not the default never reads as it (25.0000001 is not 25: no part at
    all), nor as another size; a model name that reads as another axis's run-id part is refused."""
    from scalelab.planning.sweep import sweep_points

    ids = [p.run_id for p in sweep_points(validate_config(tiny_config(sweep={"bucket_mb": [25, 25.0000001, 2, 2.0000001, 2.5]})))]
    assert ids == ["fp32-z0-w1", "fp32-z0-w1-bucket25.0000001", "fp32-z0-w1-bucket2", "fp32-z0-w1-bucket2.0000001",
                   "fp32-z0-w1-bucket2.5"]
    for name, axis in (("ac", "activation_checkpointing"), ("z2", "zero_stage"), ("bf16", "precision"), ("lora8", "lora_rank"),
                       ("bucket1", "bucket_mb"), ("compiled", "compile")):
        with pytest.raises(ConfigError, match=rf"models.{name}: a model name must not read as a run-id part of {axis}"):
            validate_config(tiny_config(models={name: {"n_layers": 1}}))
    validate_config(tiny_config(models={"small": {"n_layers": 1}, "gpt2_xl": {"n_layers": 1}}, sweep={"model": ["base", "small"]}))


def test_a_key_given_twice_is_named_with_file_and_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("train:\n  steps: 10\n  lr: 0.1\n  steps: 20\n")
    for check in (check_yaml_syntax, load_config):
        with pytest.raises(ConfigError, match=r"dup.yaml: not valid YAML at line 4, column 3: duplicate key train.steps "
                                              r"\(first given on line 2"):
            check(path)
    path.write_text("sweep:\n  - {a: 1, a: 2}\n")
    with pytest.raises(ConfigError, match=r"duplicate key sweep\[0\].a"):
        check_yaml_syntax(path)
    path.write_text("base: &b {steps: 10}\ntrain:\n  <<: *b\n  steps: 20\n")  # a merge key overridden: not a duplicate
    check_yaml_syntax(path)


def test_results_dir_dataset_name_and_corpus_kind(tmp_path):
    (tmp_path / "afile").write_text("x")
    for results_dir, where in (("afile", "results_dir='afile' is a regular file"),
                               ("afile/runs", f"results_dir='afile/runs': {tmp_path / 'afile'} is a regular file")):
        with pytest.raises(ConfigError, match=f"{where}, not a folder"):
            validate_config(tiny_config(results_dir=results_dir), base_dir=tmp_path)
    for name in (".", "..", ".hidden"):
        with pytest.raises(ConfigError, match=f"dataset.name='{name}' starts with a dot"):
            validate_config(tiny_config(dataset={"name": name}), base_dir=tmp_path)
    with pytest.raises(ConfigError, match="dataset.path='/dev/null' is a character device, a special file: not a regular file or folder"):
        validate_config(tiny_config(dataset={"source": "text", "path": "/dev/null"}), base_dir=tmp_path)
    with pytest.raises(ConfigError, match="dataset.vocab_size=70000 does not fit dataset.tokenized_dtype='uint16'"):
        validate_config(tiny_config(dataset={"source": "tokenized", "path": "afile", "vocab_size": 70_000}), base_dir=tmp_path)


def test_check_config_command_locates_a_broken_configfile(tmp_path, monkeypatch, capsys):
    """Snakemake reads --configfile files before the Snakefile and names no line; this command does."""
    from scalelab.cli import main

    monkeypatch.chdir(tmp_path)
    write_workdir(tmp_path, tiny_config())
    (tmp_path / "my.yaml").write_text("train: {steps: 10\nsweep: [\n")
    assert main(["check-config", "config.yaml", "my.yaml"]) == 2
    assert "invalid config: my.yaml: not valid YAML at line 2, column 6" in capsys.readouterr().err
    (tmp_path / "my.yaml").write_text("train: {steps: 20}\n")
    assert main(["check-config", "config.yaml", "my.yaml"]) == 0
    assert "config ok" in capsys.readouterr().out


def test_the_logger_plugin_reads_the_configfiles_of_any_command_line_form(tmp_path, capsys):
    """profiles/default enables it; the drill `bad_configs` sees it locate a broken --configfile
    in a real Snakemake run. Here: the forms of the command line it must read, and that it names
    only the files Snakemake's own loader refuses."""
    from snakemake_logger_plugin_scalelab import command_line_configfiles, locate

    assert command_line_configfiles(["--cores", "1", "--configfile", "a.yaml", "b.yaml", "-n"]) == ["a.yaml", "b.yaml"]
    assert command_line_configfiles(["--configfiles=a.yaml", "--cores", "all"]) == ["a.yaml"]
    assert command_line_configfiles(["--cores", "1"]) == []
    assert command_line_configfiles(["--no-such-option-at-all", "--configfile"]) == []  # refused: no hint, no exit
    assert capsys.readouterr().err == ""  # nor argparse's usage text
    files = {"good.yaml": "train: {steps: 20}\n", "bad.yaml": "train: {steps: 10\nsweep: [\n",
             "tabs.json": '{\n\t"train": {"steps": 20}\n}\n',  # JSON Snakemake reads, YAML would not
             "twice.yaml": "train:\n  lr: 0.1\n  lr: 0.2\n"}  # Snakemake reads it; the Snakefile names the key later
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "latin1.yaml").write_bytes(b"a: caf\xe9\nb: [\n")  # not UTF-8: Snakemake's message stands alone
    names = [str(tmp_path / n) for n in (*files, "latin1.yaml", "missing.yaml")]
    assert locate(names) == [f"{tmp_path / 'bad.yaml'}: not valid YAML at line 2, column 6: expected ',' or '}}', but got ':'"]


@pytest.mark.parametrize("name", ["levers.yaml", "gpu-node.yaml"])
def test_the_shipped_experiment_configs_are_valid(name):
    """The ready-made experiments merge over config.yaml as Snakemake merges them, and validate."""
    import yaml

    from scalelab.planning.sweep import sweep_points

    merged = yaml.safe_load((REPO / "config.yaml").read_text())
    for section, value in yaml.safe_load((REPO / "workflow" / "configs" / name).read_text()).items():
        if isinstance(value, dict):
            merged[section].update(value)
        else:
            merged[section] = value
    cfg = validate_config(merged, base_dir=REPO)
    assert sweep_points(cfg)


def test_a_changed_setting_reruns_exactly_the_runs_it_affects():
    """A run's params (scalelab.planning.sweep.result_params) change with a setting only for the runs that
    read it: Snakemake reruns those, and nothing else."""
    from scalelab.planning.run_plan import result_params, run_plan
    from scalelab.planning.sweep import sweep_points

    sweep = {"precision": ["fp32", "fp16", "bf16"], "zero_stage": [0], "world_size": [1, 16], "lora_rank": [None, 4]}
    base = {"global_batch": 32, "device": "auto"}

    def rerun(train=None, device="cpu", **sections):
        a = validate_config(tiny_config(sweep=sweep, train=base))
        b = validate_config(tiny_config(sweep=sweep, train={**base, **(train or {})}, **sections))
        def params(config, point):
            return repr(result_params(config, run_plan(config, point, device=device)))

        return sorted(p.run_id for p in sweep_points(a) if params(a, p) != params(b, p))

    everything = sorted(p.run_id for p in sweep_points(validate_config(tiny_config(sweep=sweep, train=base))))
    assert rerun({"lr": 0.001}) == everything
    assert rerun({"run_timeout_s": 100, "checkpoint_every": 5, "collective_timeout_s": 30, "device": "cpu"}) == []
    assert rerun({"lora_alpha": 8}) == [r for r in everything if r.endswith("lora4")]
    assert rerun({"fp16_init_scale": 1024.0}) == [r for r in everything if r.startswith("fp16")]
    assert rerun({"tf32": True}) == [r for r in everything if r.startswith("fp32")]
    assert rerun({"peak_tflops": {"fp16": 100}}) == [r for r in everything if r.startswith("fp16")]
    assert rerun({"peak_tflops": {"bf16": 100}}) == everything  # every run records MFU against the bf16 peak
    assert rerun(cluster={"ranks_per_node": 4}) == [r for r in everything if "-w16" in r]  # 4 launchers instead of 2
    assert rerun(cluster={"cpus_per_rank": 2}) == everything  # a CPU rank's threads
    assert rerun(cluster={"cpus_per_rank": 2}, device="cuda") == []  # not a GPU run's compute
    assert rerun(cluster={"mem_mb_per_rank": 8000, "exclusive": False}) == []
    assert rerun(models={"small": {"n_layers": 1}}) == []  # a new shape no run of the sweep uses


def test_the_logger_drops_the_slurm_plugins_account_guess_only_where_no_account_was_asked_for():
    """The SLURM plugin (2.8) ignores --slurm-no-account and guesses an account with sacct; the
    console of a sweep that asked for none does not print that guess's three warnings (issue #41).
    A guessed account that was found is still printed: it contradicts the flag."""
    from snakemake_logger_plugin_scalelab import account_guess_dropped

    guess = ["No SLURM account given, trying to guess.",
             "No account was given, not able to get a SLURM account via sacct: sacct: error: Problem talking to the database",
             "Unable to guess SLURM account. Trying to proceed without."]
    argv = ["--profile", "workflow/profiles/slurm", "--slurm-no-account"]
    assert all(account_guess_dropped(m, argv) for m in guess)
    assert not any(account_guess_dropped(m, argv[:-1]) for m in guess)
    assert not account_guess_dropped("Guessed SLURM account: lab", argv)
