"""The `scalelab estimate` command as installed (its entry point, each subcommand's help); what each subcommand
answers is checked in process, tests/unit/test_estimate.py."""
import subprocess
import sys
from pathlib import Path

SCALELAB = str(Path(sys.executable).parent / "scalelab")


def _cli(*args):
    return subprocess.run([SCALELAB, "estimate", *args], capture_output=True, text=True, timeout=60)


def test_estimate_help_documents_every_flag():
    for kind, flags in {"memory": ["--params", "--layers", "--d-model", "--heads", "--vocab", "--seq", "--untied", "--config",
                                   "--world-size", "--micro-batch", "--unit", "--json"],
                        "time": ["--tokens", "--gpus", "--gpu", "--precision", "--mfu", "--json"],
                        "fit": ["--gpu-memory", "--gpu-memory-gib", "--unit", "--world-size", "--json"],
                        "advise": ["--gpu-memory", "--unit", "--gpus", "--micro-batch", "--activation-checkpointing", "--json"],
                        "claim": ["--tokens-per-s", "--tokens", "--days", "--gpus", "--gpu", "--precision", "--json"]}.items():
        out = _cli(kind, "--help").stdout
        for flag in flags:
            assert flag in out, (kind, flag)
