"""The inventory of device-type branches in the run code (scalelab.training.devices, issue #40):
each comparison with "cuda" or "cpu", and each torch.cuda.is_available(), is listed there with its
reason; a new one, or a listed one that is gone, fails here."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from conftest import REPO
from scalelab.training.devices import BRANCHES, RUN_CODE

PACKAGE = REPO / "src" / "scalelab"
DEVICE_WORDS = {"cuda", "cpu"}


def _is_device_branch(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return any(isinstance(s, ast.Constant) and s.value in DEVICE_WORDS for s in sides)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "is_available"
            and ast.unparse(node.func.value) == "torch.cuda")


def device_branches(source: str, module: str) -> list[tuple[str, str]]:
    """(module, innermost enclosing function, methods as Class.method) of every device-type branch."""
    found = []

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{node.name}.{child.name}" if isinstance(node, ast.ClassDef) else child.name)
                continue
            if _is_device_branch(child):
                found.append((module, scope))
            visit(child, scope)

    visit(ast.parse(source), "<module>")
    return found


def run_code_files() -> list[Path]:
    files = []
    for entry in RUN_CODE:
        target = PACKAGE / entry
        files.extend(sorted(target.rglob("*.py")) if target.is_dir() else [target])
    return files


@pytest.mark.unit
def test_every_device_branch_of_the_run_code_is_in_the_inventory_with_a_reason():
    found = Counter(branch for path in run_code_files()
                    for branch in device_branches(path.read_text(), path.relative_to(PACKAGE).as_posix()))
    listed = Counter((b.module, b.function) for b in BRANCHES)
    missing, stale = found - listed, listed - found
    assert not missing, f"device-type branches not in scalelab.training.devices.BRANCHES (add each with its reason): {sorted(missing.elements())}"
    assert not stale, f"inventory entries whose branch is gone (remove them): {sorted(stale.elements())}"
    assert all(len(b.reason) > 20 for b in BRANCHES)


@pytest.mark.unit
def test_the_scan_sees_the_forms_a_branch_takes():
    """The detector itself: a comparison either way round, the availability check, inside a
    method; not a comparison with another device string."""
    source = ("import torch\n"
              "def f(device, spec):\n"
              "    a = device.type == 'cuda'\n"
              "    b = 'cpu' != spec['device']\n"
              "    return torch.cuda.is_available() or a or b or device.type == 'meta'\n"
              "class P:\n"
              "    def line(self):\n"
              "        return self.device.type == 'cuda'\n")
    assert device_branches(source, "probe.py") == [("probe.py", "f")] * 3 + [("probe.py", "P.line")]
