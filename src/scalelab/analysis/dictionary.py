"""The data dictionary: unit and meaning of every column of metrics.parquet and steps.parquet.

Kept here and nowhere else. scalelab.analysis.metrics writes each entry into its column's
Parquet field metadata (keys ``unit`` and ``description``), and docs/data-dictionary.md is
generated from it (``python -m scalelab.analysis.dictionary > docs/data-dictionary.md``;
tests/test_report.py checks that the file, the schemas and this module agree).

Units: ``B`` bytes, ``s`` seconds, ``FLOP`` floating-point operations, ``-`` a dimensionless
number or a label. This module imports nothing heavy: the Snakefile's modules import it.
"""
from __future__ import annotations

from scalelab.sweep import AXES

# ------------------------------------------------------------------ identity (both tables)

_AXIS_UNITS = {"world_size": "ranks", "micro_batch": "sequences", "bucket_mb": "MiB"}

IDENTITY: dict[str, tuple[str, str]] = {
    "run_id": ("-", "short unique id of the sweep point, e.g. fp32-z0-w2, plus a part per lever away from its default (-mb2, -ac, -offload, -bucket1)"),
    **{axis.name: (_AXIS_UNITS.get(axis.name, "-"), f"sweep axis: {axis.doc}") for axis in AXES},
}
IDENTITY["micro_batch"] = ("sequences", "sweep axis: sequences per rank per forward, as resolved at launch (the whole per-rank batch "
                                        "when the sweep says auto); null only for a missing or corrupt run whose path said auto")

# ------------------------------------------------------------------ steps.parquet: one row per optimizer step

STEP: dict[str, tuple[str, str]] = {
    "step": ("-", "optimizer step, from 0 (warm-up steps included)"),
    "loss": ("nats/token", "training loss of the step, mean over all ranks and micro-batches (cross-entropy)"),
    "grad_norm": ("-", "global L2 norm of the gradients before clipping"),
    "lr": ("-", "learning rate used by the step (warm-up then cosine)"),
    "loss_scale": ("-", "fp16 dynamic loss scale the step used; null without a scaler (fp32, bf16, fp8)"),
    "skipped": ("-", "true when the fp16 loss scaler skipped the optimizer step (inf/NaN gradients)"),
    "step_time_s": ("s", "wall time of the step on rank 0 (forward, backward, communication, optimizer)"),
    "tokens": ("tokens", "tokens processed by the step, all ranks together"),
    "tokens_per_s": ("tokens/s", "tokens / step_time_s: the step's throughput, all ranks together"),
}

# ------------------------------------------------------------------ metrics.parquet: one row per run

_COLLECTIVES = ("all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single")

RUN: dict[str, tuple[str, str]] = {
    "status": ("-", "ok | oom | predicted_oom | timeout | failed | diverged | skipped, and from collection missing | corrupt"),
    "reason": ("-", "why the run did not end ok (the root error, the limit hit, why it was skipped); null when ok"),
    "teardown_warning": ("-", "a rank exited abnormally after the results were written; the measurements are complete"),
    "steps_problem": ("-", "set by collection when the run's steps.parquet is missing or corrupt (its steps are in no figure)"),
    "dataset": ("-", "dataset name (config dataset.name)"),
    "n_params": ("parameters", "model parameters Ψ (tied embeddings counted once)"),
    "n_trainable_params": ("parameters", "parameters with gradients and optimizer state: Ψ in full training, LoRA's A and B with lora_rank"),
    "lora_alpha": ("-", "LoRA scaling numerator (train.lora_alpha): the update is scaled by alpha / rank; null without LoRA"),
    "n_layers": ("-", "transformer blocks L"),
    "d_model": ("-", "model width d"),
    "n_heads": ("-", "attention heads a"),
    "seq_len": ("tokens", "sequence length T"),
    "vocab_size": ("tokens", "vocabulary size V"),
    "tie_embeddings": ("-", "whether the output head shares the embedding matrix"),
    "steps": ("-", "optimizer steps the run was configured for (train.steps)"),
    "completed_steps": ("-", "optimizer steps whose records were written (fewer than steps when a run stopped early)"),
    "warmup_steps": ("-", "steps before measurement starts (train.warmup_steps); not in the run-level timings"),
    "global_batch": ("sequences", "sequences per optimizer step, all ranks together"),
    "accumulation_steps": ("-", "micro-batches per rank per optimizer step (gradient accumulation)"),
    "tokens_per_step": ("tokens", "tokens per optimizer step, all ranks together (global_batch × seq_len)"),
    "measured_steps": ("-", "steps after warm-up that the run-level timings average over"),
    "tokens_per_s": ("tokens/s", "throughput over the measured steps, all ranks together (per device: divide by world_size)"),
    "step_time_s_mean": ("s", "mean step time over the measured steps"),
    "step_time_s_median": ("s", "median step time over the measured steps"),
    "loop_time_s_per_step": ("s", "wall time of the whole training loop (records, loss sync included) per measured step"),
    "compile_time_s": ("s", "compile lever: wall time of the warm-up forward and backward that compiles the graphs before "
                            "the first step (kept out of every step time); null when not compiled"),
    "compile_graphs": ("-", "graphs torch.compile compiled in that warm-up (the block's and the loss's)"),
    "compile_graphs_in_loop": ("-", "graphs compiled during the measured steps: 0 means no step time holds compilation"),
    "flops_per_token": ("FLOP/token", "model FLOPs per token, forward and backward: 6·(12·L·d² + V·d) + 12·L·d·T"),
    "peak_flops_per_device": ("FLOP/s", "dense peak used for MFU, per device, for this precision"),
    "peak_flops_source": ("-", "where that peak comes from (datasheet, measured CPU matmul rate, config) or why it is unknown"),
    "mfu": ("fraction", "model FLOPs utilisation: tokens_per_s × flops_per_token / (peak_flops_per_device × world_size); "
                        "above 1 means the peak is too low for this path (e.g. emulated fp16 on a CPU)"),
    "peak_flops_bf16": ("FLOP/s", "dense bf16 peak per device (datasheet on a GPU; measured bf16 matmul rate on a CPU): "
                                  "the common MFU convention for every precision"),
    "peak_flops_bf16_source": ("-", "where peak_flops_bf16 came from"),
    "mfu_bf16_peak": ("-", "MFU against the bf16 dense peak (torchtitan's convention; fp8 runs show their speed-up here), "
                           "beside mfu against the run's own precision's peak"),
    "final_loss": ("nats/token", "loss of the last recorded step"),
    "skipped_steps": ("-", "optimizer steps skipped by the fp16 loss scaler"),
    "resumed_from_step": ("-", "the checkpoint step a resumed run started after; null when not resumed"),
    "final_loss_scale": ("-", "fp16 loss scale at the end of the run; null without a scaler"),
    "model_state_bytes_measured": ("B", "model state at rest (parameters + gradients + optimizer state) on the largest rank, after the last step"),
    "model_state_params_bytes_measured": ("B", "parameters held by the largest rank"),
    "model_state_grads_bytes_measured": ("B", "gradients held by the largest rank"),
    "model_state_optimizer_bytes_measured": ("B", "AdamW state held by the largest rank"),
    "model_state_bytes_measured_per_rank": ("B", "model state at rest of each rank, rank 0 first"),
    "model_state_bytes_predicted": ("B", "predicted model state per rank, PyTorch AMP convention (fp32 master: 16Ψ, 8Ψ + 8Ψ/N, 16Ψ/N)"),
    "model_state_params_bytes_predicted": ("B", "predicted parameter bytes per rank (PyTorch convention)"),
    "model_state_grads_bytes_predicted": ("B", "predicted gradient bytes per rank (PyTorch convention)"),
    "model_state_optimizer_bytes_predicted": ("B", "predicted optimizer-state bytes per rank (PyTorch convention)"),
    "model_state_bytes_predicted_paper": ("B", "predicted model state per rank, ZeRO paper convention (mixed precision 2 + 2 + 12 bytes per parameter)"),
    "comm_bytes_per_step_measured": ("B/step", "bytes handed to collectives per optimizer step on rank 0 (ZeRO paper's unit)"),
    "comm_bytes_per_step_predicted": ("B/step", "predicted collective bytes per step, PyTorch strategy"),
    "comm_bytes_per_step_predicted_paper": ("B/step", "predicted collective bytes per step, ZeRO paper"),
    **{f"comm_{c}_bytes_per_step": ("B/step", f"bytes handed to {c} per optimizer step on rank 0") for c in _COLLECTIVES},
    **{f"comm_{c}_calls_per_step": ("calls/step", f"{c} calls per optimizer step on rank 0") for c in _COLLECTIVES},
    "activation_bytes_measured": ("B", "activations saved for backward by one micro-batch's forward on rank 0, inside the blocks"),
    "activation_bytes_outside_blocks_measured": ("B", "activations saved outside the transformer blocks (embedding, head, loss)"),
    "activation_bytes_predicted": ("B", "predicted activations per micro-batch: Korthikanti et al.'s terms for this model"),
    "activation_bytes_predicted_paper": ("B", "predicted activations per micro-batch: Korthikanti et al. 2022 as published"),
    "activation_bytes_outside_blocks_predicted": ("B", "predicted bytes saved for backward outside the blocks (embeddings, "
                                                      "final norm, head, the loss path) by one micro-batch"),
    "activation_measure": ("-", "how activation_bytes_measured was measured"),
    "recompute_flops_per_token": ("FLOP/token", "extra FLOPs per token of activation checkpointing (one more forward of every block); 0 without"),
    "hfu": ("fraction", "hardware FLOPs utilisation: like mfu, with the recompute FLOPs added"),
    "fp8_linears": ("-", "linear layers converted to float8 (fp8 runs)"),
    "fp8_emulated": ("-", "whether fp8 ran through torchao's emulated casts (no FP8 tensor cores)"),
    "ddp_buckets_predicted": ("-", "predicted DDP gradient buckets, i.e. all-reduce calls per step (stages 0 and 1)"),
    "predicted_peak_bytes": ("B", "predicted in-step peak per rank: model state + in-step parameters + activations"),
    "predicted_activation_bytes": ("B", "the activation part of predicted_peak_bytes (every micro-batch in flight)"),
    "predicted_transient_param_bytes": ("B", "the in-step (unsharded) parameter part of predicted_peak_bytes"),
    "device_memory_bytes": ("B", "memory of one device the prediction is held against; null when unknown (CPU)"),
    "predicted_oom_reason": ("-", "why the run was predicted not to fit; null when it fits"),
    "peak_mem_allocated_bytes": ("B", "max memory allocated by PyTorch on a GPU, largest rank; null on CPU"),
    "peak_mem_reserved_bytes": ("B", "max memory reserved by PyTorch's caching allocator on a GPU, largest rank; null on CPU"),
    "peak_rss_bytes": ("B", "peak resident set size of a rank's process, largest rank (includes the framework)"),
    "wall_time_s": ("s", "wall time of the whole run, launch to results written"),
    "startup_s": ("s", "launch to the first training step (process start, imports, process group, model build)"),
    "requested_device": ("-", "train.device as configured: auto | cpu | cuda"),
    "planned_device_reason": ("-", "why the workflow planned the sweep on this device"),
    "device_type": ("-", "device the run trained on: cpu | cuda"),
    "device_name": ("-", "device model (GPU name, or the CPU model)"),
    "backend": ("-", "torch.distributed backend: gloo | nccl"),
    "launch": ("-", "how the ranks were started (torchrun --standalone, or srun x torchrun)"),
    "launchers": ("-", "torchrun launchers (SLURM tasks) of the run"),
    "threads": ("-", "CPU threads given to the whole run"),
    "threads_per_rank": ("-", "intra-op threads per rank"),
    "torch_version": ("-", "torch.__version__"),
    "cuda_version": ("-", "torch.version.cuda; null for a CPU build"),
    "nccl_version": ("-", "NCCL version on GPU runs"),
    "python_version": ("-", "Python version of the ranks"),
    "hostname": ("-", "host of rank 0"),
    "git_commit": ("-", "commit of the code that ran"),
    "git_dirty": ("-", "whether the checkout had uncommitted changes"),
    "git_commit_source": ("-", "where git_commit comes from (git, an environment variable) or why it is unknown"),
    "dataset_sha256_train": ("-", "SHA-256 of the tokenized training split"),
    "seed": ("-", "random seed (train.seed)"),
    "config_hash": ("-", "hash of the configuration the results depend on"),
    "started_utc": ("-", "when the run started, ISO 8601, UTC"),
    "run_path": ("-", "the run folder, relative to <results>/runs (one level per sweep axis)"),
}


def run_columns() -> dict[str, tuple[str, str]]:
    """metrics.parquet's columns in schema order: identity, then the run fields."""
    return {**IDENTITY, **RUN}


def step_columns() -> dict[str, tuple[str, str]]:
    return {**IDENTITY, **STEP}


def field_metadata(column: tuple[str, str]) -> dict[bytes, bytes]:
    unit, meaning = column
    return {b"unit": unit.encode(), b"description": meaning.encode()}


def markdown(run_names: list[str], step_names: list[str]) -> str:
    """docs/data-dictionary.md: both tables, in schema order."""
    def table(columns: dict[str, tuple[str, str]], names: list[str]) -> list[str]:
        rows = ["| column | unit | meaning |", "|---|---|---|"]
        rows += [f"| `{n}` | {columns[n][0]} | {columns[n][1].replace('|', chr(92) + '|')} |" for n in names]
        return rows

    lines = [
        "# Data dictionary",
        "",
        "<!-- Generated from src/scalelab/analysis/dictionary.py by "
        "`python -m scalelab.analysis.dictionary > docs/data-dictionary.md`; tests/test_report.py checks it. -->",
        "",
        "Every column of the two result tables, with its unit and meaning. The same text is in each",
        "Parquet file's field metadata (keys `unit` and `description`), e.g.",
        "`pyarrow.parquet.read_schema('results/metrics.parquet').field('mfu').metadata`.",
        "The identity columns (`run_id` and one per sweep axis) are on every row of both tables.",
        "",
        f"## results/metrics.parquet: one row per run ({len(run_names)} columns)",
        "",
        *table(run_columns(), run_names),
        "",
        f"## results/steps.parquet: one row per optimizer step ({len(step_names)} columns)",
        "",
        *table(step_columns(), step_names),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    from scalelab.analysis.metrics import RUN_SCHEMA, STEP_SCHEMA

    print(markdown(RUN_SCHEMA.names, STEP_SCHEMA.names), end="")
