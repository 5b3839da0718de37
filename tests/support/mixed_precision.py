"""What tests/*/test_mixed_precision.py share: the helpers tests of more than one tier use."""
from __future__ import annotations

STAGES = (0, 1, 2, 3)
