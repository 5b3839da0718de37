"""Every `python -m scalelab...` command the README, the Makefile and the docs name, and every team tool they name
(`PYTHONPATH=tests python -m devtools...`), starts and prints its usage: a module renamed or moved without its docs
fails here, not in a user's shell."""
import os
import re
import subprocess
import sys

import pytest

from scalelab.harness import REPO_ROOT

DOCUMENTS = [REPO_ROOT / "README.md", REPO_ROOT / "Makefile", *sorted((REPO_ROOT / "docs").glob("*.md")),
             *sorted((REPO_ROOT / "workflow" / "configs").glob("*.yaml"))]

pytestmark = pytest.mark.run(cost_s=6)  # the tier's own mark (its folder's), with this file's cost per test


def documented_modules() -> list[str]:
    found = set()
    for doc in DOCUMENTS:
        found |= set(re.findall(r"python3? -m ((?:scalelab|devtools)(?:\.\w+)*)", doc.read_text()))
    return sorted(found - {"devtools"})  # `python -m devtools.<tool>`: the placeholder the docs write for any tool


def test_the_docs_name_commands():
    assert {"devtools.bench", "devtools.vcluster", "scalelab.harness.gpu_check"} <= set(documented_modules())


@pytest.mark.parametrize("module", documented_modules())
def test_every_documented_command_prints_its_usage(module):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "tests")}  # the team's tools, as the docs run them
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT, env=env)
    assert proc.returncode == 0, f"python -m {module} --help: {proc.stderr[-2000:]}"
    assert "usage:" in proc.stdout.lower(), proc.stdout[:500]
