"""Synthetic result sets (metrics.parquet + steps.parquet) for report tests and benchmarks.

Shaped like real results (the same schemas, formulas for predictions) but generated: no
training. A few runs are given non-ok statuses so the report's handling of them is exercised.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa

from scalelab import accounting
from scalelab.analysis.metrics import STEP_SCHEMA, run_row, runs_table, write_parquet
from scalelab.sweep import RunPoint

FAILURES = {3: ("oom", "rank 0: OutOfMemoryError: CUDA out of memory (injected)"),
            5: ("failed", "rank 1: RuntimeError: injected crash"),
            7: ("skipped", "world_size=8 needs 8 GPUs, this node has 1"),
            11: ("timeout", "run exceeded train.run_timeout_s=900 s and was stopped")}


# Lever variants, cycled over the later runs: (micro_batch, activation_checkpointing, cpu_offload, bucket_mb).
LEVERS = [(None, False, False, 25.0), (None, True, False, 25.0), (1, False, False, 25.0), (None, False, False, 0.1)]


def synthetic_results(out_dir: str | Path, n_runs: int = 24, n_steps: int = 60, seed: int = 0) -> dict:
    """n_runs runs. Runs 24-95 repeat the first 24 grid points with one lever each away from
    its default (a baseline twin for each), so the report's lever section is exercised; from
    run 96 on, the whole precision x stage x world size grid, replicated."""
    out_dir = Path(out_dir)
    rng = np.random.default_rng(seed)
    points = list(itertools.product(["fp32", "fp16", "bf16"], [0, 1, 2, 3], [1, 2, 4, 8, 16, 32, 64, 128]))
    rows, step_cols = [], {f.name: [] for f in STEP_SCHEMA}
    n_params = 100_000
    for i in range(n_runs):
        lever_block = i // 24
        if lever_block < len(LEVERS):
            (precision, stage, ws), (micro, ac, offload, bucket), replica = points[i % 24], LEVERS[lever_block], 0
        else:
            (precision, stage, ws), (micro, ac, offload, bucket), replica = points[i % len(points)], LEVERS[0], i // len(points)
        if stage >= 2 and bucket != 25.0:  # FSDP2 has no buckets: vary the micro-batch there instead
            micro, bucket = 2, 25.0
        point = RunPoint(precision, stage, ws, micro, ac, offload, bucket)
        identity = point.identity(micro_batch=micro or 4)
        identity["run_id"] = point.run_id + (f"-r{replica}" if replica else "")
        status, reason = FAILURES.get(i, ("ok", None))
        pred = accounting.model_state_bytes(n_params, stage, ws, precision, "pytorch")
        comm = 4 * accounting.comm_elements_per_step(n_params, stage, ws)
        tps = 50_000 * ws * (0.9 ** np.log2(ws)) * (2 if precision != "fp32" else 1) * rng.uniform(0.95, 1.05)
        acts = (2 if ac else 34) * 64 * (micro or 4) * 256 * 2 * 4
        # DDP stages: 40 parameter tensors of 10k bytes each (the model's 400 kB), bucketed
        buckets = accounting.ddp_bucket_count([10_000] * 40, bucket) if bucket is not None and stage < 2 else None
        summary = {
            **identity, "accumulation_steps": 4 // (micro or 4), "step_time_s_median": 512 / tps,
            "activation_bytes_measured": acts, "activation_bytes_predicted": acts,
            "activation_bytes_predicted_paper": (2 if ac else 34 + 5 * 4 * 256 / 64) * 64 * (micro or 4) * 256 * 2 * 4,
            "flops_per_token": 7e5, "recompute_flops_per_token": 2.3e5 if ac else 0.0,
            "status": status, "reason": reason, "n_params": n_params, "steps": n_steps,
            "tokens_per_s": tps if status == "ok" else None, "mfu": tps * 7e5 / (ws * 1e11) if status == "ok" else None,
            "peak_flops_source": "synthetic", "model_state_bytes_measured": int(pred.total * rng.uniform(1.0, 1.02)),
            "model_state_bytes_predicted": pred.total, "model_state_bytes_predicted_paper":
                accounting.model_state_bytes(n_params, stage, ws, precision, "paper").total,
            "comm_bytes_per_step_measured": comm, "comm_bytes_per_step_predicted": comm,
            "comm_bytes_per_step_predicted_paper": 4 * accounting.comm_elements_per_step(n_params, stage, ws, convention="paper"),
            "peak_rss_bytes": int(3e8 * rng.uniform(0.98, 1.02)),
            "ddp_buckets_predicted": buckets, "comm_calls_per_step": {"all_reduce": float(buckets)} if buckets else {},
            "device_type": "cpu", "device_name": "synthetic", "wall_time_s": 10.0,
        }
        rows.append(run_row(summary, point.path))
        if status in ("ok", "failed"):
            n = n_steps if status == "ok" else n_steps // 3
            steps = np.arange(n)
            loss = 5.5 * np.exp(-steps / (n_steps / 4)) + 2.5 + rng.normal(0, 0.02, n)
            scale = np.full(n, 65536.0) if precision == "fp16" else np.full(n, np.nan)
            skipped = np.zeros(n, dtype=bool)
            if precision == "fp16":
                skipped[rng.integers(0, n, 2)] = True
                scale = 65536.0 / 2 ** np.cumsum(skipped)
            for name, values in (*((k, [v] * n) for k, v in identity.items()), ("step", steps), ("loss", loss), ("grad_norm", rng.uniform(0.5, 2, n)),
                                 ("lr", np.full(n, 1e-3)), ("loss_scale", scale), ("skipped", skipped),
                                 ("step_time_s", np.full(n, 0.01)), ("tokens", np.full(n, 512)), ("tokens_per_s", np.full(n, 51200.0))):
                step_cols[name].append(np.asarray(values))
    steps_tbl = pa.Table.from_pydict({k: np.concatenate(v) if v else [] for k, v in step_cols.items()}, schema=STEP_SCHEMA)
    write_parquet(runs_table(rows), out_dir / "metrics.parquet")
    write_parquet(steps_tbl, out_dir / "steps.parquet")
    return {"runs": len(rows), "steps": steps_tbl.num_rows}
