"""Answers before any run: `scalelab estimate` (memory, time, scaling, advice), `scalelab plan`,
the check against published multi-node figures,
and the forecast that ranks a sweep's points before it runs (planning.top_k)."""
