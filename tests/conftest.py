"""Shared fixtures; the helpers themselves live in scalelab.testing (the fault drills use them too)."""
from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.config import REPO_ROOT as REPO
from scalelab.testing import BIN, SNAKEMAKE, tiny_config, write_workdir  # noqa: F401
from scalelab.testing import run_snakemake as snakemake  # noqa: F401


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A prepared synthetic dataset (byte tokens) shared by the training tests."""
    from scalelab.config import dataset_config
    from scalelab.data import prepare_dataset

    out = tmp_path_factory.mktemp("data") / "tiny"
    prepare_dataset(dataset_config(tiny_config()), out, seq_len=32)
    return out
