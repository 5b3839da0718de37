"""What the workflow refuses before any job: a user's model module that fails (its import raises, its builder is
missing, it returns something else), and an upgrade that would retrain finished runs because a shipped default
changed. (A module that fails only once its run launches: the fault drill broken_user_module.)"""
import json
import os
import re
import subprocess
import sys

from support import REPO, snakemake, tiny_config, write_workdir

BROKEN = {
    "raises_on_import": ("boom.py", 'raise RuntimeError("boom at import")\n', "boom:build",
                         "RuntimeError importing boom: boom at import"),
    "no_such_builder": ("okmod.py", "def build_int(cfg):\n    return 42\n", "okmod:nosuchfunc",
                        "has no attribute 'nosuchfunc'"),
    "returns_an_int": ("okmod.py", "def build_int(cfg):\n    return 42\n", "okmod:build_int",
                       "must return (an nn.Module, its block class), got 42"),
}


def test_check_config_and_snakemake_refuse_every_broken_module_before_any_job(tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    for file, text, _, _ in BROKEN.values():
        (mods / file).write_text(text)
    models = {name: {"module": spec} for name, (_, _, spec, _) in BROKEN.items()}
    cfg = tiny_config(models=models, sweep={"model": ["base", *models]})
    workdir = write_workdir(tmp_path, cfg)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(mods), str(REPO / "src")])}
    check = subprocess.run([sys.executable, "-m", "scalelab.cli", "check-config", "config.yaml"], cwd=workdir, env=env,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 2, check.stdout + check.stderr
    lines = check.stderr.strip().splitlines()
    assert lines[0] == "invalid config, 3 problems:" and "Traceback" not in check.stderr, check.stderr
    for name, (_, _, spec, why) in BROKEN.items():  # one line each, located, naming model, module and cause
        line = next(line for line in lines if f"models.{name}.module=" in line)
        assert line.startswith("config.yaml:") and spec in line and why in line, line
    dry = snakemake(workdir, "-n", "--cores", "1", check=False, env=env, timeout=120)
    said = dry.stdout + dry.stderr
    assert dry.returncode != 0 and "3 problems" in said and "Traceback" not in said, said[-2000:]
    assert not (workdir / "results" / "runs").exists()


def test_an_upgrade_that_changes_a_shipped_default_stops_before_retraining(tmp_path):
    """A checkout's own config.yaml is the shipped one: a new release that changes one of its values would rerun every
    finished run that depends on it. The workflow stops first, naming the runs, the value then and now, and what
    keeps them; a user's own --configfile setting the value is what they asked for, and reruns."""
    import shutil

    import yaml

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for part in ("Snakefile", "rules", "workflow", "profiles"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, checkout / part)
    shipped = tiny_config(train={"steps": 4, "warmup_steps": 1})
    (checkout / "config.yaml").write_text(yaml.safe_dump(shipped, sort_keys=False))
    run = ["-s", str(checkout / "Snakefile")]
    snakemake(checkout, *run, "--cores", "2", timeout=300)
    assert json.loads((checkout / "results/runs/fp32-z0-w1/summary.json").read_text())["status"] == "ok"
    shipped["train"]["lr"] = 0.001  # the next release's default
    (checkout / "config.yaml").write_text(yaml.safe_dump(shipped, sort_keys=False))
    refused = snakemake(checkout, *run, "-n", "--cores", "2", check=False, timeout=120)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "1 finished run(s) would be retrained" in said, said[-3000:]
    assert "train.lr: 0.003 then, 0.001 now" in said and "fp32-z0-w1" in said and "Traceback" not in said, said[-3000:]
    (tmp_path / "mine.yaml").write_text("train: {lr: 0.001}\n")  # the user's own choice: rerun, no question
    planned = snakemake(checkout, *run, "-n", "--cores", "2", "--configfile", str(tmp_path / "mine.yaml"), timeout=120)
    said = planned.stdout + planned.stderr
    assert re.search(r"\btrain +1\b", said) and "would be retrained" not in said, said[-3000:]
