"""What the GPU machine lacks: the wheels `make gpu-bundle` carries there (``python -m
scalelab.harness.gpu_check --bundle-requirements`` prints their requirements)."""
from __future__ import annotations

import re
from pathlib import Path

from scalelab.harness import REPO_ROOT

GPU_MACHINE_HAS = frozenset({
    "numpy", "pandas", "pyarrow", "matplotlib", "seaborn", "pyyaml", "tokenizers", "jinja2", "psutil",
    "pytest", "pytest-xdist", "pytest-timeout", "torch",
})
"""The distributions the GPU machine has installed (Python 3.12, torch with CUDA, no network).
Every runtime dependency of pyproject.toml not named here goes into `make gpu-bundle`'s wheels."""
BUNDLE_EXTRAS = ("torchao",)
"""Beyond the runtime dependencies, what the check needs there: torchao for fp8, at the version
the tests pin (pyproject.toml's ``test`` extra)."""


def _dist_name(requirement: str) -> str:
    """The normalised distribution name of a requirement string ("Jinja2>=3" -> "jinja2")."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)
    return re.sub(r"[-_.]+", "-", name).lower()


def _pyproject(root: Path = REPO_ROOT) -> dict:
    import tomllib

    return tomllib.loads((root / "pyproject.toml").read_text())


def bundle_requirements(root: Path = REPO_ROOT) -> list[str]:
    """The requirements `make gpu-bundle` downloads wheels for: pyproject.toml's runtime
    dependencies that the GPU machine lacks (GPU_MACHINE_HAS), then BUNDLE_EXTRAS as the
    ``test`` extra pins them."""
    project = _pyproject(root)["project"]
    wanted = [r.strip() for r in project["dependencies"] if _dist_name(r) not in GPU_MACHINE_HAS]
    pinned = {_dist_name(r): r.strip() for r in project.get("optional-dependencies", {}).get("test", [])}
    return wanted + [pinned.get(name, name) for name in BUNDLE_EXTRAS if name not in {_dist_name(r) for r in wanted}]
