"""Shared helpers: the repository, tiny configs, a prepared tiny dataset."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")


def tiny_config(**overrides) -> dict:
    """The default config.yaml, shrunk for tests, with section overrides merged in."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["dataset"].update(name="tiny", synthetic_bytes=200_000)
    cfg["model"].update(n_layers=2, d_model=32, n_heads=2, seq_len=32)
    cfg["train"].update(steps=12, warmup_steps=2, global_batch=8, run_timeout_s=240, collective_timeout_s=60)
    cfg["sweep"].update(precision=["fp32"], zero_stage=[0], world_size=[1])
    for section, values in overrides.items():
        if isinstance(values, dict):
            cfg[section].update(values)
        else:
            cfg[section] = values
    return cfg


def write_workdir(tmp: Path, cfg: dict) -> Path:
    """A working directory holding config.yaml, for `snakemake -s REPO/Snakefile -d tmp`."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return tmp


def snakemake(workdir: Path, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A prepared synthetic dataset (byte tokens) shared by the training tests."""
    from scalelab.config import dataset_config
    from scalelab.data import prepare_dataset

    out = tmp_path_factory.mktemp("data") / "tiny"
    prepare_dataset(dataset_config(tiny_config()), out, seq_len=32)
    return out


@pytest.fixture
def deep_copy():
    return copy.deepcopy
