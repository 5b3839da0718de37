"""Answers before any run: `scalelab estimate` (memory, time, advice: estimate; scaling and links: scaling;
its text and options: estimate_text, estimate_command), `scalelab plan`, the check against published
multi-node figures, and the forecast that ranks a sweep's points before it runs (planning.top_k)."""
