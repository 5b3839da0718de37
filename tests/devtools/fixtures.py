"""Synthetic result sets (metrics.parquet + steps.parquet) for report tests and benchmarks.

Shaped like real results (the same schemas, formulas for predictions) but generated: no
training. A few runs are given non-ok statuses so the report's handling of them is exercised.
"""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa

from scalelab.config import ModelConfig, TrainConfig
from scalelab.formulas import communication, lora_training, model_state
from scalelab.formulas.rank_step import RankStep
from scalelab.planning.columns import STEP_SCHEMA
from scalelab.planning.result_tables import run_row, runs_table, write_parquet
from scalelab.planning.sweep import AXIS, LEVER_AXES, RunPoint
from scalelab.registries.strategies import ZERO_STAGES, strategy

FAILURES = {3: ("oom", "rank 0: OutOfMemoryError: CUDA out of memory (injected)"),
            5: ("failed", "rank 1: RuntimeError: injected crash"),
            7: ("skipped", "world_size=2 needs 2 GPUs, this node has 1"),
            11: ("timeout", "run exceeded train.run_timeout_s=900 s and was stopped")}


GRID = list(itertools.product(["fp32", "fp16", "bf16"], ZERO_STAGES, [1, 2, 4, 8, 16, 32, 64, 128]))
"""The whole precision x stage x world size grid (the default sweep's precisions): runs 96 on."""
BASELINES = [RunPoint(*p) for p in itertools.product(["fp32"], ZERO_STAGES, [1, 2, 4, 8, 16, 32])]
"""Runs 0-23: every lever at its default; the twins of the lever runs."""
PER_RANK_BATCH = 4
"""Sequences per rank per step of every synthetic run (micro_batch None resolves to it)."""
_LORA_SHAPE = ModelConfig(n_layers=1, d_model=16, n_heads=1, seq_len=16, vocab_size=64)
"""A shape whose LoRA adapters are small beside the synthetic model's 100k parameters."""

# The value away from its default that the lever runs take, per lever of scalelab.planning.sweep.LEVER_AXES:
# a flag is switched on; any other lever needs a value here (a lever added to the registry
# without one stops this module at import, naming it).
_LEVER_VALUES = {"micro_batch": 1, "bucket_mb": 0.1, "lora_rank": 4, "grad_reduce": "compute", "replicas": 2, "tensor_parallel": 2,
                 "pipeline_parallel": 2, "pipeline_schedule": "gpipe"}
_missing = [a for a in LEVER_AXES if AXIS[a].type is not bool and a not in _LEVER_VALUES]
if _missing:
    raise ValueError(f"devtools.fixtures: no synthetic value for the lever(s) {', '.join(_missing)}")
LEVER_VALUES = {a: (not AXIS[a].default) if AXIS[a].type is bool else _LEVER_VALUES[a] for a in LEVER_AXES}
_LEVER_TWIN = {"grad_reduce": {"precision": "fp16"},
               **{a: {AXIS[a].beside: LEVER_VALUES[AXIS[a].beside]} for a in LEVER_AXES if AXIS[a].beside},
               # beside a pipeline, which runs beside a micro-batch (Axis.beside): both
               "pipeline_schedule": {"pipeline_parallel": LEVER_VALUES["pipeline_parallel"], "micro_batch": 1}}
"""Levers that apply only beside another axis's value (grad_reduce to no fp32 run; a lever with Axis.beside, as
sequence parallelism with tensor parallelism, only with that lever's synthetic value): their runs come in pairs
with that value, the twin (every lever but the one it runs beside at its default) and the run with the lever
away from it."""


def _applies(point, lever: str) -> bool:
    """Whether the sweep would run this point (the lever's own rule: offload on stage 3 only, no
    buckets under FSDP2), at the synthetic per-rank batch."""
    train = dataclasses.replace(TrainConfig(), global_batch=PER_RANK_BATCH * point.world_size)
    rules = (lever, *_LEVER_TWIN.get(lever, {}))  # and the rule of the axis it runs beside
    return getattr(point, lever) == LEVER_VALUES[lever] and all(AXIS[a].left_out(point, train) is None for a in rules
                                                                 if AXIS[a].left_out is not None)


def lever_points() -> list:
    """Runs 24-95: each baseline with one lever away from its default, where that lever applies,
    taken in turn from every lever of LEVER_AXES (so that 30 runs already vary each lever once)."""
    per_lever = [[p for p in (dataclasses.replace(b, **{lever: LEVER_VALUES[lever]}) for b in BASELINES)
                  if _applies(p, lever)] if lever not in _LEVER_TWIN else
                 [p for b in BASELINES for twin in [dataclasses.replace(b, **_LEVER_TWIN[lever])]
                  for p in (twin, dataclasses.replace(twin, **{lever: LEVER_VALUES[lever]}))
                  if _applies(dataclasses.replace(twin, **{lever: LEVER_VALUES[lever]}), lever)]
                 for lever in LEVER_AXES]
    turns = itertools.zip_longest(*per_lever)
    # once each: a twin one lever needs may be another lever's run already (tensor parallelism's, for sequence parallelism)
    return list(dict.fromkeys(p for turn in turns for p in turn if p is not None))[:96 - len(BASELINES)]


def _tensor_parallel_columns(point) -> dict:
    """Tensor parallelism's all-reduces: four per block (the synthetic model's 2) of B T d values (T 256, d 64), fp32."""
    nbytes = 0.0 if point.tensor_parallel == 1 else 2.0 * 4 * 2 * PER_RANK_BATCH * 256 * 64 * 4
    return {"comm_tensor_parallel_bytes_per_step_measured": nbytes, "comm_tensor_parallel_bytes_per_step_predicted": nbytes,
            "comm_tensor_parallel_link": "intra_node" if point.tensor_parallel > 1 else None}


def _pipeline_columns(point, accumulation: int) -> dict:
    """A pipeline's columns: two stages' point-to-point bytes (B T d values each way per micro-batch, fp32), the
    schedule's bubble measured 30% above the formula, and the activations each stage holds (GPipe: every
    micro-batch's, 1F1B: P - i)."""
    from scalelab.formulas import pipeline

    pp = point.pipeline_parallel
    if pp == 1:
        return dict.fromkeys(pipeline.MEASURED_COLUMNS + pipeline.PREDICTED_COLUMNS)
    p2p = [2.0 * accumulation * 256 * 64 * 4] * pp
    bubble = pipeline.bubble_fraction(pp, accumulation, point.pipeline_schedule)
    held = [pipeline.held_block_activations(34 * 64 * 256 * 4, 2, k, pp, accumulation, point.pipeline_schedule)
            for k in range(pp)]
    return {"pipeline_microbatches": accumulation, "comm_pipeline_bytes_per_step_measured": p2p[0],
            "comm_pipeline_bytes_per_step_predicted": p2p[0], "comm_pipeline_bytes_per_step_measured_per_stage": p2p,
            "comm_pipeline_bytes_per_step_predicted_per_stage": p2p, "comm_pipeline_tied_bytes_per_step_measured": 0.0,
            "comm_pipeline_tied_bytes_per_step_predicted": 0.0, "bubble_fraction_predicted": bubble,
            "bubble_fraction_measured": 1.3 * bubble, "bubble_fraction_measured_per_stage": [1.3 * bubble] * pp,
            "bubble_fraction_stage_times": 1.1 * bubble,
            "pipeline_activation_bytes_measured_per_stage": [int(h) for h in held],
            "pipeline_activation_bytes_predicted_per_stage": held}


def synthetic_results(out_dir: str | Path, n_runs: int = 24, n_steps: int = 60, seed: int = 0) -> dict:
    """n_runs runs. Runs 0-23: baselines (fp32, every stage, world sizes 1-32); runs 24-95: the
    baselines again with one lever of scalelab.planning.sweep.LEVER_AXES each away from its default (the
    levers in turn, each where it applies), so the report's lever section pairs every lever with
    its baseline twins; from run 96 on, the whole precision x stage x world size grid, replicated."""
    out_dir = Path(out_dir)
    rng = np.random.default_rng(seed)
    rows, step_cols = [], {f.name: [] for f in STEP_SCHEMA}
    n_base = 100_000
    varied = BASELINES + lever_points()
    for i in range(n_runs):
        if i < len(varied):
            point, replica = varied[i], 0
        else:
            # the grid's passes are repeats 2, 3 ... (run ids -r2, -r3): they share a point with the runs before
            point, replica = RunPoint(*GRID[(i - len(varied)) % len(GRID)]), 1 + (i - len(varied)) // len(GRID)
            point = dataclasses.replace(point, repeat=replica + 1)
        precision, stage, ws, micro, ac, bucket = (point.precision, point.zero_stage, point.world_size, point.micro_batch,
                                                   point.activation_checkpointing, point.bucket_mb)
        identity = point.identity(micro_batch=micro or PER_RANK_BATCH)
        status, reason = FAILURES.get(i, ("ok", None))
        n_trainable = lora_training.lora_trainable_params(_LORA_SHAPE, point.lora_rank) if point.lora_rank else n_base
        n_params = n_base + (n_trainable if point.lora_rank else 0)
        if point.lora_rank:  # frozen base weights: no gradients or optimizer state for them
            pred = lora_training.lora_model_state_bytes(n_base, n_trainable, stage, ws, precision, "pytorch")
            paper = lora_training.lora_model_state_bytes(n_base, n_trainable, stage, ws, precision, "paper")
            comm = 4 * lora_training.lora_comm_elements_per_step(n_base, n_trainable, stage, ws)
            comm_paper = 4 * lora_training.lora_comm_elements_per_step(n_base, n_trainable, stage, ws, convention="paper")
        else:
            pred = model_state.model_state_bytes(n_params, stage, ws, precision, "pytorch", point.replicas)
            paper = model_state.model_state_bytes(n_params, stage, ws, precision, "paper", point.replicas)
            # in bytes as runs predict them: fp16/bf16 gather 16-bit parameters at stages 2 and 3
            step = RankStep(precision, stage, ws, micro or PER_RANK_BATCH, replicas=point.replicas,
                            grad_reduce=point.grad_reduce)
            comm = communication.comm_bytes_per_step(n_params, step)
            comm_paper = 4 * communication.comm_elements_per_step(n_params, stage, ws, convention="paper",
                                                               replicas=point.replicas)
        tps = 50_000 * ws * (0.9 ** np.log2(ws)) * (2 if precision != "fp32" else 1) * rng.uniform(0.95, 1.05)
        tps *= (1.25 if point.compile else 1) / (1.7 if point.cpu_offload else 1)  # compiled steps faster, offloaded slower
        acts = (2 if ac else 34) * 64 * (micro or PER_RANK_BATCH) * 256 * 2 * 4
        n = n_steps if status == "ok" else n_steps // 3
        loss = 5.5 * np.exp(-np.arange(n) / (n_steps / 4)) + 2.5 + rng.normal(0, 0.02, n)
        # DDP stages: 40 parameter tensors of 10k bytes each (the model's 400 kB), bucketed
        buckets = (communication.ddp_bucket_count([10_000] * 40, bucket)
                   if bucket is not None and strategy(stage).ddp_wraps(ws, 1, point.pipeline_parallel) else None)
        summary = {
            **identity, "accumulation_steps": PER_RANK_BATCH // (micro or PER_RANK_BATCH), "step_time_s_median": 512 / tps,
            "activation_bytes_measured": acts if point.pipeline_parallel == 1 else None, "activation_bytes_predicted": acts,
            **_tensor_parallel_columns(point), **_pipeline_columns(point, PER_RANK_BATCH // (micro or PER_RANK_BATCH)),
            "activation_bytes_predicted_paper": (2 if ac else 34 + 5 * 4 * 256 / 64) * 64 * (micro or PER_RANK_BATCH) * 256 * 2 * 4,
            "flops_per_token": 7e5, "recompute_flops_per_token": 2.3e5 if ac else 0.0,
            "status": status, "reason": reason, "n_params": n_params, "n_trainable_params": n_trainable, "steps": n_steps,
            "final_loss": float(loss[-1]) if status == "ok" else None,
            "compile_time_s": 12.0 if point.compile else None, "compile_graphs_in_loop": 0 if point.compile else None,
            "tokens_per_s": tps if status == "ok" else None, "mfu": tps * 7e5 / (ws * 1e11) if status == "ok" else None,
            "peak_flops_source": "synthetic", "model_state_bytes_measured": int(pred.total * rng.uniform(1.0, 1.02)),
            "model_state_bytes_predicted": pred.total, "model_state_bytes_predicted_paper": paper.total,
            "comm_bytes_per_step_measured": comm, "comm_bytes_per_step_predicted": comm,
            "comm_bytes_per_step_predicted_paper": comm_paper,
            **dict(zip(("param_gather_dtype", "grad_reduce_dtype"),
                       dataclasses.astuple(communication.comm_dtypes(precision, stage, point.grad_reduce)))),
            "peak_rss_bytes": int(3e8 * rng.uniform(0.98, 1.02)),
            "ddp_buckets_predicted": buckets, "comm_calls_per_step": {"all_reduce": float(buckets)} if buckets else {},
            "device_type": "cpu", "device_name": "synthetic", "wall_time_s": 10.0,
        }
        rows.append(run_row(summary, point.path))
        if status in ("ok", "failed"):
            steps = np.arange(n)
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
