"""Answers before any run: `scalelab estimate` (memory, time, scaling, advice), `scalelab plan`,
and the check against published multi-node figures."""
