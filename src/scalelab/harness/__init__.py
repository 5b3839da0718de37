"""The harness around the library: fault drills, benchmarks, synthetic result fixtures, the
reference loop and test helpers. Nothing in the library imports it."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The checkout the harness works in (its config.yaml, Snakefile and tests): the harness runs
from a checkout; the library itself never reads one (its config schema is package data)."""
