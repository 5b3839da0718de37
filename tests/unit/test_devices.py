"""The inventory of device-type branches in the run code (scalelab.run.devices, issue #40):
each comparison with "cuda" or "cpu", and each torch.cuda.is_available(), is listed there with its
reason; a new one, or a listed one that is gone, fails here."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from scalelab.run.devices import BRANCHES, RUN_CODE
from support import REPO

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


def test_every_device_branch_of_the_run_code_is_in_the_inventory_with_a_reason():
    found = Counter(branch for path in run_code_files()
                    for branch in device_branches(path.read_text(), path.relative_to(PACKAGE).as_posix()))
    listed = Counter((b.module, b.function) for b in BRANCHES)
    missing, stale = found - listed, listed - found
    assert not missing, f"device-type branches not in scalelab.run.devices.BRANCHES (add each with its reason): {sorted(missing.elements())}"
    assert not stale, f"inventory entries whose branch is gone (remove them): {sorted(stale.elements())}"
    assert all(len(b.reason) > 20 for b in BRANCHES)


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


def test_the_gpu_state_beside_a_run_comes_from_nvidia_smi(tmp_path, monkeypatch):
    """A simulated nvidia-smi (no GPU here): its --query-gpu answer for the rank's GPU, by UUID, becomes the
    run's gpu_* columns; a field it cannot report is null; without it, or where it fails, nothing (a CPU run: {})."""
    import os
    from types import SimpleNamespace

    import torch

    from scalelab.run.devices import gpu_state
    from scalelab.run.worker_result import gpu_state_columns

    calls = tmp_path / "calls"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                   'case "$*" in *--query-gpu=power.limit,clocks.sm,clocks.mem,temperature.gpu,driver_version*'
                   '"-i GPU-1234"*) echo "700.00, 1980, 2619, [N/A], 550.54.15"; exit 0;; esac\nexit 6\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(uuid="1234"))
    state = gpu_state(torch.device("cuda", 0))
    assert state == {"gpu_power_limit_w": 700.0, "gpu_sm_clock_mhz": 1980.0, "gpu_mem_clock_mhz": 2619.0,
                     "gpu_temperature_c": None, "gpu_driver_version": "550.54.15"}
    assert "-i GPU-1234" in calls.read_text()
    columns = gpu_state_columns(state, {**state, "gpu_sm_clock_mhz": 1755.0})
    assert columns["gpu_sm_clock_mhz_start"] == 1980.0 and columns["gpu_sm_clock_mhz_end"] == 1755.0
    assert columns["gpu_power_limit_w"] == 700.0 and columns["gpu_driver_version"] == "550.54.15"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(uuid="GPU-9999"))
    assert gpu_state(torch.device("cuda", 0)) == {}  # nvidia-smi refused: the columns stay null
    assert gpu_state(torch.device("cpu")) == {}
    assert set(gpu_state_columns({}, {}).values()) == {None}
