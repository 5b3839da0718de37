"""Config errors as a new user meets them (#32): one line per problem, every problem of every
config file at once, each naming the file and line that set the key, the key path and the value;
"did you mean" for an unknown key; 3e-4 read as the number YAML 1.2 reads."""
import pytest
from snakemake.common.configfile import load_configfile
from snakemake.utils import update_config

from devtools.faults import BAD_CONFIGS, bad_config_workdir
from scalelab.cli import main
from scalelab.config import ConfigError, ConfigProblems
from scalelab.planning.validation import validate_config
from snakemake_logger_plugin_scalelab import NOT_YAML
from support import tiny_config, write_workdir


@pytest.mark.parametrize("path", sorted(BAD_CONFIGS.glob("*.yaml")), ids=lambda path: path.stem)
def test_check_config_refuses_every_bad_config_as_the_workflow_does(path, tmp_path, monkeypatch, capsys):
    """The drill `bad_configs` runs each file through Snakemake (workflow tier); the same folder
    through `scalelab check-config`, in process, must name the same things, one line per problem."""
    expected, configfiles = bad_config_workdir(path, tmp_path / "work")
    monkeypatch.chdir(tmp_path / "work")
    assert main(["check-config", "config.yaml", *configfiles]) == 2
    err = capsys.readouterr().err
    for text in expected:
        if text != NOT_YAML:  # Snakemake's own words, before its Snakefile runs
            assert text in err, (text, err)
    assert "Failed validating" not in err and "On instance" not in err  # no jsonschema dump
    lines = err.splitlines()
    problems = lines[1:] if lines[0].endswith("problems:") else lines
    assert lines[0].startswith("invalid config") and len(problems) == len(set(problems)) >= 1


def test_a_typo_in_my_yaml_is_one_line_naming_file_line_and_the_key_it_meant(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_workdir(tmp_path, tiny_config())
    (tmp_path / "my.yaml").write_text("results_dir: results/my-sweep\nmodel:\n  n_layer: 4\n")
    assert main(["check-config", "config.yaml", "my.yaml"]) == 2
    assert capsys.readouterr().err == "invalid config: my.yaml:3: model.n_layer: unknown key; did you mean n_layers?\n"
    (tmp_path / "my.yaml").write_text("resuls_dir: x\nmodel: {zzz: 1}\n")  # nothing close: what the section takes
    assert main(["check-config", "config.yaml", "my.yaml"]) == 2
    assert capsys.readouterr().err.splitlines()[1:] == [
        "my.yaml:1: resuls_dir: unknown key; did you mean results_dir?",
        "my.yaml:2: model.zzz: unknown key; model takes n_layers, d_model, n_heads, seq_len, tie_embeddings"]


def test_every_problem_of_every_file_at_once_located_in_the_file_that_set_it(tmp_path, monkeypatch, capsys):
    """Files merge in order: a key set in both is the last file's, and so is its problem."""
    monkeypatch.chdir(tmp_path)
    write_workdir(tmp_path, tiny_config())
    (tmp_path / "a.yaml").write_text("train:\n  lr: -1\n  stepz: 3\n")
    (tmp_path / "b.yaml").write_text("model: {n_head: 2}\ntrain:\n  lr: -2\n")
    (tmp_path / "c.yaml").write_text("sweep: {world_size: [1,\n")  # not YAML: reported with the others
    assert main(["check-config", "config.yaml", "a.yaml", "b.yaml", "c.yaml"]) == 2
    assert "c.yaml: not valid YAML at line 2" in capsys.readouterr().err
    assert main(["check-config", "config.yaml", "a.yaml", "b.yaml"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "invalid config, 3 problems:",
        "a.yaml:3: train.stepz: unknown key; did you mean steps?",
        "b.yaml:1: model.n_head: unknown key; did you mean n_heads?",
        "b.yaml:3: train.lr: -2 is less than or equal to the minimum of 0"]


def test_cross_field_problems_come_together_too(tmp_path):
    config = tiny_config(model={"n_heads": 3}, train={"tf32": True, "warmup_steps": 12})
    (tmp_path / "config.yaml").write_text("model:\n  n_heads: 3\ntrain:\n  tf32: true\n  warmup_steps: 12\n")
    with pytest.raises(ConfigProblems) as raised:
        validate_config(config, base_dir=tmp_path, files=[tmp_path / "config.yaml"])
    where = [line.split(": ", 1)[0].rsplit(":", 1)[1] for line in raised.value.problems]
    assert where == ["2", "4", "5"], raised.value.problems  # n_heads, tf32, warmup_steps: file order
    assert "model.n_heads=3 does not divide model.d_model=32" in raised.value.problems[0]


def test_numbers_in_exponent_form_are_numbers_as_in_yaml_1_2(tmp_path):
    """Snakemake reads config files as YAML 1.1 (PyYAML), where 3e-4 is text; scalelab reads a
    value of a number key as YAML 1.2 does (docs/guide.md, the config section)."""
    my = tmp_path / "my.yaml"
    my.write_text("train:\n  lr: 3e-4\n  weight_decay: 1E-2\n  steps: 1e3\n")
    given = load_configfile(str(my))
    assert given["train"]["lr"] == "3e-4"  # why: text to Snakemake's loader
    config = tiny_config()
    update_config(config, given)
    with pytest.raises(ConfigProblems) as raised:
        validate_config(config, files=[my])
    assert raised.value.problems == [
        f"{my}:4: train.steps=1000.0 must be an integer, written without a decimal point or exponent (write 1000)"]
    config = tiny_config()
    update_config(config, {"train": {"lr": "3e-4", "weight_decay": "1E-2"}})
    validated = validate_config(config)
    assert validated["train"]["lr"] == 3e-4 and validated["train"]["weight_decay"] == 0.01
    assert validate_config(tiny_config(dataset={"name": "1e3"}))["dataset"]["name"] == "1e3"  # text keys stay text
    with pytest.raises(ConfigError, match=r"train.lr: '0.5' is not a number \(it is quoted"):
        validate_config(tiny_config(train={"lr": "0.5"}))
