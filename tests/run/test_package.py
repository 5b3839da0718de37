"""The package as users install it: a wheel built from the repository, installed in a fresh
virtual environment, imports scalelab.config and validates config.yaml with the schema it
ships (package data), not with files of the checkout."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from scalelab.config import ConfigError
from scalelab.planning.validation import load_config, validate_config
from support import REPO

# Run by the fresh environment's Python, from a folder outside the repository.
CHECK = textwrap.dedent('''
    import json
    import sys
    from pathlib import Path

    import scalelab
    import scalelab.config
    from scalelab.config import ConfigError
    from scalelab.planning.validation import load_config, validate_config

    fresh, repo = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    for module in (scalelab, scalelab.config):
        where = Path(module.__file__).resolve()
        assert where.is_relative_to(fresh) and not where.is_relative_to(repo), where
    schema = Path(str(scalelab.config.SCHEMA_FILE)).resolve()
    assert schema.is_relative_to(fresh), schema

    try:
        validate_config({"train": {"steps": "many"}})
    except ConfigError as err:
        refused = str(err)
    print(json.dumps({"config.yaml": load_config(repo / "config.yaml"),
                      "defaults": validate_config({"sweep": {"precision": ["fp32"]}}), "refused": refused}))
''')


def _site_packages(python) -> str:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_a_wheel_in_a_fresh_environment_validates_config_yaml(tmp_path):
    # Build from a copy, so that the build's own folders (build/, *.egg-info) stay out of the checkout.
    source = tmp_path / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                           "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("scalelab-*.whl")

    # A fresh environment with only the wheel installed in it; its dependencies (Snakemake,
    # jsonschema, PyYAML, ...) are this test environment's, appended to its path by a .pth file
    # (a plain path line: the .pth files there, such as the editable install's, are not run).
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=120)
    python = fresh / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fresh_site = _site_packages(python)
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(fresh_site) / "test-dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")

    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run([str(python), "-c", CHECK, str(fresh), str(REPO)], cwd=run_dir, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    installed = json.loads(proc.stdout.splitlines()[-1])

    # The same results as the checkout's code: the config, the defaults filled in, the error text.
    with pytest.raises(ConfigError) as refused:
        validate_config({"train": {"steps": "many"}})
    assert installed["refused"] == str(refused.value) and "train.steps: 'many' is not an integer" in installed["refused"]
    assert installed["config.yaml"] == load_config(REPO / "config.yaml")
    defaults = validate_config({"sweep": {"precision": ["fp32"]}})
    assert installed["defaults"] == defaults and defaults["train"]["steps"] > 0 and defaults["results_dir"] == "results"
