"""The harness around the library that users run: the GPU check (gpu_check and its parts), the reference loop
it holds scalelab against, the report's screenshot, and the helpers they share with the tests (testing). Nothing in
the library imports it. The team's own tools (benchmarks, fault drills, synthetic result sets, the virtual cluster)
live outside the installed package, in tests/devtools."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The checkout the harness works in (its config.yaml, Snakefile and tests): the harness runs
from a checkout; the library itself never reads one (its config schema is package data)."""
