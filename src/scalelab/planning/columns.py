"""The column table: every column of metrics.parquet and steps.parquet, declared once.

Per column: its name, Arrow type, unit, meaning, the part that writes it and when it holds a
value (``Filled``, scalelab.planning.null_contract: which statuses and levers leave it null is part of the contract). The
Parquet schemas (``RUN_SCHEMA``, ``STEP_SCHEMA``), their field metadata, the data dictionary
the report shows (scalelab.report.dictionary) and docs/data-dictionary.md
(``python -m scalelab.planning.columns > docs/data-dictionary.md``) are derived from it, and
tests/*/test_columns.py holds real runs of every status and lever against it (scalelab.planning.column_checks). The tables
are built and written from it by scalelab.planning.result_tables.

Writers:

- ``identity``: the sweep point, from scalelab.planning.sweep.AXES (the registry of axes), and its run id;
- ``launch``: the launcher (scalelab.run.launch): plan, outcome, provenance;
- ``worker``: rank 0's worker (scalelab.run.worker_result): the measurements, read back only from
  a run whose ranks all finished (status ok);
- ``collect``: collection of the run folders into the tables (scalelab.results.collect).

A new metric is a ``Column`` here and the line of its writer that fills it. This module sits
below ``training`` and ``analysis`` (both import it) and imports neither, nor torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from scalelab.planning.null_contract import (
    ALWAYS,
    BUCKETS,
    COMPILED,
    CPU,
    DDP_WRAPS,
    FORECAST_TIMED,
    FORMULA,
    GPU,
    GPU_STATE,
    LAUNCHED,
    LINEARS_CONVERTED,
    LORA,
    LOSS_SCALER,
    NO_PIPELINE,
    NOT_OK,
    OK,
    PIPELINE_OK,
    Filled,
    exactly,
    family_has,
    has_value,
    is_custom,
    is_ok,
    sometimes,
)
from scalelab.planning.sweep import AXES, run_id_grammar
from scalelab.registries.families import DEFAULT_FAMILY, FAMILIES
from scalelab.registries.hardware import DRIFT_MIN_STEPS, DRIFT_WARN
from scalelab.registries.strategies import strategy

SCHEMA_VERSION = "13"  # 2: lever identity columns; 3: device plan, launch and provenance sources;
# 4: the compile lever (identity column, compile time), MFU against the bf16 peak, activations outside the blocks predicted;
# 5: run_path is the run id (run folders named by run id), field metadata names each column's writer and when it is filled;
# 6: model families (model_family, model_module, n_kv_heads, ffn_dim, rope_base, flops_per_token_method), where ranks ran
# (rank_hostnames, node_list, nodes_used); 7: hybrid sharding (replicas), bytes per step intra- and inter-node measured and
# predicted, nodes_share_machine, the step-time model's prediction (predicted_step_time_s, its band, tokens/s, exposed comm, note);
# 8: predicted_peak_bound, compiled runs' memory predicted with the compiled graphs' model, timing_steps (train.measure_s),
# half_batch_steps, step_time_s_median_half_batch, token_share_measured, token_share_measured_sem; the trace columns
# (profiled_steps, trace_files, memory_snapshot_files, exposed_comm_s_measured), the GPU's state (gpu_power_limit_w,
# gpu_driver_version, gpu_{sm,mem}_clock_mhz_{start,end}, gpu_temperature_c_{start,end}); 9: tensor and sequence parallelism
# (tensor_parallel, sequence_parallel, comm_tensor_parallel_*), the forecast that ranks a sweep (forecast_*: planning.top_k);
# 10: host_steal_share (the hypervisor's share of the ranks' cores during the timed steps)
# 11: step_time_drift (the change of the median step time between the halves of the timed steps)
# 12: last_block_params_kept (FSDP2 keeps the last block gathered from its forward to its backward)
# 13: pipeline parallelism (pipeline_parallel, pipeline_schedule, pipeline_microbatches, comm_pipeline_*, bubble_fraction_*,
# pipeline_activation_bytes_*_per_stage)
_META = {b"scalelab.schema_version": SCHEMA_VERSION.encode()}

WRITERS = ("identity", "launch", "worker", "collect")
COLLECTIVES = ("all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single")
"""The collectives counted per type (scalelab.run.comm), one column pair each; a summary
counting another is reported by ``result_tables.unknown_summary_keys`` (collection names it)."""
FLATTENED = {"comm_bytes_per_step_by_type": "comm_{}_bytes_per_step", "comm_calls_per_step": "comm_{}_calls_per_step"}
"""Summary keys holding a dict by collective, spread by ``result_tables.run_row`` over one column per collective."""
LAUNCHER_STATUSES = ("ok", "oom", "predicted_oom", "timeout", "failed", "diverged", "skipped")
"""Statuses the launcher writes into a run's summary.json."""
COLLECTED_STATUSES = ("missing", "corrupt")
"""Statuses collection gives a run folder without a readable summary: such a row holds its
identity, status, reason and run_path only (the null contract, scalelab.planning.null_contract, is for the launcher's rows)."""


# ----------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    unit: str
    """``B`` bytes, ``s`` seconds, ``FLOP`` floating-point operations, ``-`` a dimensionless number or a label."""
    meaning: str
    writer: str
    filled: Filled = ALWAYS
    nullable: bool = True
    """The Arrow field's flag: False only for the keys (run_id, the main axes, step)."""

    def __post_init__(self):
        if self.writer not in WRITERS:
            raise ValueError(f"column {self.name}: writer {self.writer!r} is not one of {', '.join(WRITERS)}")

    def field(self) -> pa.Field:
        # The unit, meaning, writer and null contract travel in the file's field metadata.
        meta = {b"unit": self.unit, b"description": self.meaning, b"writer": self.writer, b"filled": self.filled.text}
        return pa.field(self.name, self.type, nullable=self.nullable, metadata={k: v.encode() for k, v in meta.items()})


_AXIS_UNITS = {"world_size": "ranks", "micro_batch": "sequences", "bucket_mb": "MiB"}
_AXIS_MEANINGS = {
    "micro_batch": "sweep axis: sequences per rank per forward, as resolved at launch (the whole per-rank batch when the "
                   "sweep says auto); null only for a missing or corrupt run whose folder said auto",
}
_AXIS_FILLED = {  # when the axes that may be null hold a value (a new nullable axis needs its entry)
    "micro_batch": ALWAYS,  # resolved by the launcher; collection's missing/corrupt rows may lack it
    "bucket_mb": BUCKETS,
    "lora_rank": sometimes("LoRA runs (null: full training)"),
}


def _axis_column(axis) -> Column:
    return Column(axis.name, pa.type_for_alias(axis.arrow), _AXIS_UNITS.get(axis.name, "-"),
                  _AXIS_MEANINGS.get(axis.name, f"sweep axis: {axis.doc}"), "identity",
                  _AXIS_FILLED[axis.name] if axis.nullable else ALWAYS, nullable=axis.nullable)


# Repeated on every row of both tables: the run id, then one column per sweep axis (scalelab.planning.sweep.AXES).
IDENTITY = [
    Column("run_id", pa.string(), "-", "short unique id of the sweep point: " + run_id_grammar(), "identity", nullable=False),
    *(_axis_column(axis) for axis in AXES),
]

# metrics.parquet: one row per run, after the identity columns.
RUN = [
    Column("status", pa.string(), "-", f"{' | '.join(LAUNCHER_STATUSES)}, and from collection "
           f"{' | '.join(COLLECTED_STATUSES)}", "launch"),
    Column("reason", pa.string(), "-", "why the run did not end ok (the root error, the limit hit, why it was skipped); "
           "null when ok", "launch", NOT_OK),
    Column("teardown_warning", pa.string(), "-", "a rank exited abnormally after the results were written; the "
           "measurements are complete", "launch", sometimes("when a rank exited abnormally after the results", OK)),
    Column("steps_problem", pa.string(), "-", "set by collection when the run's steps.parquet is missing or corrupt (its "
           "steps are in no figure)", "collect", sometimes("when steps.parquet is missing or corrupt")),
    Column("dataset", pa.string(), "-", "dataset name (config dataset.name)", "launch"),
    Column("n_params", pa.int64(), "parameters", "model parameters Ψ (tied embeddings counted once)", "worker", OK),
    Column("n_trainable_params", pa.int64(), "parameters", "parameters with gradients and optimizer state: Ψ in full "
           "training, LoRA's A and B with lora_rank", "worker", OK),
    Column("last_block_params_kept", pa.int64(), "parameters", "the last block's parameters on rank 0 (summed over its "
           "chunks under a pipeline: each chunk's last block) that FSDP2 keeps gathered from its forward to its "
           "backward (torchtitan's recipe, at the stages that reshard after forward: one gather of them fewer per "
           "micro-batch; 0 at the others); null for runs that gathered it twice (before it was "
           "kept): their communication is predicted as they ran", "worker", sometimes("at every stage since it was kept", OK)),
    Column("lora_alpha", pa.float64(), "-", "LoRA scaling numerator (train.lora_alpha): the update is scaled by alpha / "
           "rank; null without LoRA", "worker", OK & LORA),
    Column("model_family", pa.string(), "-", "the model's kind: "
           + " | ".join(f"{f.name} ({f.description})" for f in FAMILIES.values())
           + " | custom (the user's own module, models.<name>.module); every run before families were recorded is "
           + DEFAULT_FAMILY, "launch"),
    Column("model_module", pa.string(), "-", "the user's model callable (pkg.mod:build) of a custom model; null for "
           "the built-in families", "launch", exactly("model_family custom", is_custom)),
    Column("n_kv_heads", pa.int32(), "-", "key/value heads of grouped-query attention (llama; n_heads = full "
           "multi-head attention)", "launch", family_has("n_kv_heads")),
    Column("ffn_dim", pa.int32(), "-", "SwiGLU hidden size f (llama: models.<name>.ffn_dim, or 8/3·d rounded up to a "
           "multiple of 256)", "launch", family_has("ffn_dim")),
    Column("rope_base", pa.float64(), "-", "base (theta) of the rotary position embedding (llama)", "launch",
           family_has("rope_base")),
    Column("n_layers", pa.int32(), "-", "transformer blocks L", "launch"),
    Column("d_model", pa.int32(), "-", "model width d", "launch"),
    Column("n_heads", pa.int32(), "-", "attention heads a", "launch"),
    Column("seq_len", pa.int32(), "tokens", "sequence length T", "launch"),
    Column("vocab_size", pa.int64(), "tokens", "vocabulary size V", "launch"),
    Column("tie_embeddings", pa.bool_(), "-", "whether the output head shares the embedding matrix", "launch"),
    Column("steps", pa.int32(), "-", "optimizer steps the run was configured for (train.steps)", "launch"),
    Column("completed_steps", pa.int32(), "-", "optimizer steps whose records were written (fewer than steps when a run "
           "stopped early)", "launch", LAUNCHED),
    Column("warmup_steps", pa.int32(), "-", "steps before measurement starts (train.warmup_steps); not in the run-level "
           "timings", "launch"),
    Column("global_batch", pa.int32(), "sequences", "sequences per optimizer step, all ranks together", "launch"),
    Column("accumulation_steps", pa.int32(), "-", "micro-batches per rank per optimizer step (gradient accumulation); "
           "planned by the launcher, as the worker ran it", "launch"),
    Column("tokens_per_step", pa.int64(), "tokens", "tokens per optimizer step, all ranks together (global_batch × "
           "seq_len)", "worker", OK),
    Column("measured_steps", pa.int32(), "-", "steps after warm-up that the run-level timings are taken over (timing "
           "steps included)", "worker", OK),
    Column("half_batch_steps", pa.int32(), "-", "steps at half the micro-batch after the measured ones (train.measure_s "
           "set, micro-batch >= 2): what token_share_measured is measured from", "worker",
           Filled("status ok, train.measure_s set and a micro-batch of 2 or more (null in rows older than schema 8)", None, is_ok)),
    Column("step_time_s_median_half_batch", pa.float64(), "s", "median step time of the half-batch steps", "worker",
           Filled("with half_batch_steps", None, has_value("half_batch_steps"))),
    Column("token_share_measured", pa.float64(), "fraction", "the share of the step that grows with the tokens a rank "
           "processes: (1 - t_half / t) / (1 - (m // 2) / m), t the median step at micro-batch m, t_half at m // 2 "
           "(clipped to [0, 1]); what the step-time model carries a step to another micro-batch or world size with",
           "worker", Filled("with half_batch_steps", None, has_value("half_batch_steps"))),
    Column("token_share_measured_sem", pa.float64(), "fraction", "standard error of token_share_measured from the "
           "scatter of its two windows' steps (1.2533 x 1.4826 MAD / sqrt(n) per median): its error within the run",
           "worker", Filled("with half_batch_steps", None, has_value("half_batch_steps"))),
    Column("timing_steps", pa.int32(), "-", "steps past train.steps that only lengthened the measurement to "
           "train.measure_s seconds (no step record, no loss); 0 when the training steps sufficed",
           "worker", Filled("status ok (null in rows older than schema 8)", None, is_ok)),
    Column("tokens_per_s", pa.float64(), "tokens/s", "throughput over the measured steps, all ranks together (per device: "
           "tokens_per_s_per_device)", "worker", OK),
    Column("tokens_per_s_per_device", pa.float64(), "tokens/s", "tokens_per_s / world_size: throughput of one device",
           "collect", OK),
    Column("scaling_efficiency", pa.float64(), "fraction", "tokens_per_s / (world_size × the median tokens_per_s of the ok "
           "world-size-1 runs of the same model (name, family, shape, sequence length, vocabulary), precision, ZeRO stage "
           "and levers; hybrid sharding's replicas aside: its baseline is its stage's), as the report computes it "
           "(scalelab.results.like; 1 = linear scaling)",
           "collect", sometimes("when ok runs at world size 1 of its model, precision, stage and levers exist", OK)),
    # The step-time model's prediction of the run (scalelab.results.prediction), made at collection: compute from the runs of
    # the same configuration at the sweep's smallest world size, communication from <results>/calibration/comm.parquet.
    Column("predicted_step_time_s", pa.float64(), "s", "predicted mean step time (scalelab.results.prediction): compute measured on "
           "the same configuration at its smallest world size in the sweep, carried to this run's tokens per rank, plus "
           "the communication its strategy leaves exposed, timed on links fitted to the sweep's bench comm table; "
           "in-sample where the run is its own reference (prediction_note says which); null where prediction_note "
           "says why (no bench table, no reference)", "collect", sometimes("when prediction_note gives no reason against", OK)),
    Column("predicted_step_time_s_low", pa.float64(), "s", "lower end of the prediction's band (99%: run-to-run noise, "
           "the link fit's error, an assumed token share's range)", "collect",
           sometimes("with predicted_step_time_s", OK)),
    Column("predicted_step_time_s_high", pa.float64(), "s", "upper end of the prediction's band; the report warns on a "
           "measured step_time_s_mean outside it", "collect", sometimes("with predicted_step_time_s", OK)),
    Column("predicted_tokens_per_s", pa.float64(), "tokens/s", "tokens_per_step / predicted_step_time_s", "collect",
           sometimes("with predicted_step_time_s", OK)),
    Column("predicted_exposed_comm_s", pa.float64(), "s", "communication in predicted_step_time_s: the strategy's "
           "collectives less what its overlap hides", "collect", sometimes("with predicted_step_time_s", OK)),
    # The GPU beside the run (nvidia-smi on rank 0's GPU; scalelab.run.devices.gpu_state): what explains an MFU gap
    # between two machines of one product
    Column("gpu_power_limit_w", pa.float64(), "W", "the power limit of rank 0's GPU (nvidia-smi power.limit) at the run's "
           "start", "worker", GPU_STATE),
    Column("gpu_driver_version", pa.string(), "-", "the NVIDIA driver (nvidia-smi driver_version)", "worker", GPU_STATE),
    *[Column(f"{stem}_{when}", pa.float64(), unit, f"{what} of rank 0's GPU {'before' if when == 'start' else 'after'} the "
             f"steps (nvidia-smi {query})", "worker", GPU_STATE)
      for stem, unit, what, query in (("gpu_sm_clock_mhz", "MHz", "the SM clock", "clocks.sm"),
                                      ("gpu_mem_clock_mhz", "MHz", "the memory clock", "clocks.mem"),
                                      ("gpu_temperature_c", "°C", "the temperature", "temperature.gpu"))
      for when in ("start", "end")],
    # What a trace shows (train.profile, train.memory_snapshot; scalelab.run.trace)
    Column("profiled_steps", pa.string(), "-", "the steps train.profile traced, 'first-last' (inclusive); left out of "
           "the run's timings", "worker", Filled("status ok with train.profile", None, has_value("profiled_steps"))),
    Column("trace_files", pa.string(), "-", "each rank's torch.profiler trace (Chrome trace JSON: Perfetto), relative to "
           "the run folder, and how many", "worker", Filled("with profiled_steps", None, has_value("profiled_steps"))),
    Column("memory_snapshot_files", pa.string(), "-", "each rank's CUDA allocator snapshot with its history "
           "(pytorch.org/memory_viz), relative to the run folder: after the traced steps, else at the run's end; an out-of-"
           "memory run writes rank<R>.oom.pickle instead", "worker",
           Filled("GPU runs with train.memory_snapshot", None, lambda row: row.get("device_type") == "cuda")),
    Column("exposed_comm_s_measured", pa.float64(), "s", "communication that nothing computed beside, per traced step "
           "(the median over them), read from rank 0's trace: NCCL kernels not overlapped by other kernels on a GPU; on a "
           "CPU gloo's work not overlapped by the main thread's operators. Beside predicted_exposed_comm_s; traced runs "
           "calibrate the overlap efficiency", "worker", Filled("with profiled_steps", None, has_value("profiled_steps"))),
    Column("prediction_note", pa.string(), "-", "how predicted_step_time_s was made (the reference's world size and "
           "tokens, the token share and whether it was fitted), or why there is none", "collect", OK),
    Column("step_time_s_mean", pa.float64(), "s", "mean step time over the measured steps", "worker", OK),
    Column("step_time_s_median", pa.float64(), "s", "median step time over the measured steps", "worker", OK),
    Column("step_time_drift", pa.float64(), "fraction", "the median step time of the second half of the measured steps "
           "over the first half's, less 1 (rank 0's steps): near 0 where the run's speed was steady; the report warns "
           f"beyond {DRIFT_WARN:.0%} either way (the speed changed while the run was timed, and its figures mix two speeds: "
           f"on a cloud VM, the host's; on a GPU, heat or power lowering its clocks); null under {DRIFT_MIN_STEPS} measured "
           "steps", "worker",
           Filled(f"status ok, {DRIFT_MIN_STEPS} measured steps or more (runs measured since schema 11)",
                  lambda row: is_ok(row) and (row.get("measured_steps") or 0) >= DRIFT_MIN_STEPS, OK.at_most)),
    Column("loop_time_s_per_step", pa.float64(), "s", "wall time of the whole training loop (records, loss sync "
           "included) per measured step", "worker", OK),
    Column("compile_time_s", pa.float64(), "s", "compile lever: wall time of the warm-up forward and backward that "
           "compiles the graphs before the first step (kept out of every step time); null when not compiled", "worker",
           OK & COMPILED),
    Column("compile_graphs", pa.int32(), "-", "graphs torch.compile compiled in that warm-up (the block's and the loss's)",
           "worker", OK & COMPILED),
    Column("compile_graphs_in_loop", pa.int32(), "-", "graphs compiled during the measured steps: 0 means no step time "
           "holds compilation", "worker", OK & COMPILED),
    Column("flops_per_token", pa.float64(), "FLOP/token", "model FLOPs per token, forward and backward: 6·N + 12·L·d·T, "
           "N the matmul weights (GPT-2: 12·L·d² + V·d; llama: L·(2d² + 2d·kv + 3d·f) + V·d), the attention term counted "
           "in full although causal (PaLM's convention); a custom module's counted by torch.utils.flop_counter "
           "(flops_per_token_method)", "worker", OK),
    Column("flops_per_token_method", pa.string(), "-", "how flops_per_token was obtained: formula (the built-in "
           "families, scalelab.formulas.flops.flops_per_token) | counted (torch.utils.flop_counter, a custom module: one "
           "sequence's forward and backward on the meta device)", "worker", OK),
    Column("peak_flops_per_device", pa.float64(), "FLOP/s", "dense peak used for MFU, per device, for this precision "
           "(NaN when unknown)", "worker", OK),
    Column("peak_flops_source", pa.string(), "-", "where that peak comes from (datasheet, measured CPU matmul rate, "
           "config) or why it is unknown", "worker", OK),
    Column("mfu", pa.float64(), "fraction", "model FLOPs utilisation: tokens_per_s × flops_per_token / "
           "(peak_flops_per_device × world_size); above 1 means the peak is too low for this path (e.g. emulated fp16 "
           "on a CPU)", "worker", OK),
    Column("peak_flops_bf16", pa.float64(), "FLOP/s", "dense bf16 peak per device (datasheet on a GPU; measured bf16 "
           "matmul rate on a CPU): the common MFU convention for every precision", "worker", OK),
    Column("peak_flops_bf16_source", pa.string(), "-", "where peak_flops_bf16 came from", "worker", OK),
    Column("mfu_bf16_peak", pa.float64(), "-", "MFU against the bf16 dense peak (torchtitan's convention; fp8 runs show "
           "their speed-up here), beside mfu against the run's own precision's peak", "worker", OK),
    Column("final_loss", pa.float64(), "nats/token", "loss of the last recorded step", "launch",
           Filled("a step was recorded (completed_steps > 0)", lambda row: bool(row.get("completed_steps")),
                  LAUNCHED.at_most)),
    Column("skipped_steps", pa.int32(), "-", "optimizer steps skipped by the fp16 loss scaler", "worker", OK),
    Column("resumed_from_step", pa.int32(), "-", "the checkpoint step a resumed run started after; null when not resumed",
           "worker", sometimes("when the run resumed from a checkpoint", OK)),
    Column("final_loss_scale", pa.float64(), "-", "fp16 loss scale at the end of the run; null without a scaler", "worker",
           OK & LOSS_SCALER),
    Column("model_state_bytes_measured", pa.int64(), "B", "model state at rest (parameters + gradients + optimizer "
           "state) on the largest rank, after the last step", "worker", OK),
    Column("model_state_params_bytes_measured", pa.int64(), "B", "parameters held by the largest rank", "worker", OK),
    Column("model_state_grads_bytes_measured", pa.int64(), "B", "gradients held by the largest rank", "worker", OK),
    Column("model_state_optimizer_bytes_measured", pa.int64(), "B", "AdamW state held by the largest rank", "worker", OK),
    Column("model_state_bytes_measured_per_rank", pa.list_(pa.int64()), "B", "model state at rest of each rank, rank 0 "
           "first", "worker", OK),
    Column("model_state_bytes_predicted", pa.float64(), "B", "predicted model state per rank, PyTorch AMP convention "
           "(fp32 master: 16Ψ, 8Ψ + 8Ψ/N, 16Ψ/N)", "collect", OK),
    Column("model_state_params_bytes_predicted", pa.float64(), "B", "predicted parameter bytes per rank (PyTorch "
           "convention)", "collect", OK),
    Column("model_state_grads_bytes_predicted", pa.float64(), "B", "predicted gradient bytes per rank (PyTorch "
           "convention)", "collect", OK),
    Column("model_state_optimizer_bytes_predicted", pa.float64(), "B", "predicted optimizer-state bytes per rank (PyTorch "
           "convention)", "collect", OK),
    Column("model_state_bytes_predicted_paper", pa.float64(), "B", "predicted model state per rank, ZeRO paper convention "
           "(mixed precision 2 + 2 + 12 bytes per parameter)", "collect", OK),
    Column("comm_bytes_per_step_measured", pa.float64(), "B/step", "bytes handed to collectives per optimizer step on "
           "rank 0 (ZeRO paper's unit)", "worker", OK),
    Column("comm_bytes_per_step_predicted", pa.float64(), "B/step", "predicted collective bytes per step, PyTorch "
           "strategy", "collect", OK),
    Column("comm_bytes_per_step_predicted_paper", pa.float64(), "B/step", "predicted collective bytes per step, ZeRO paper",
           "collect", OK),
    # Traffic per link: rank 0's bytes split by where the collective's group ran. The rule
    # (scalelab.planning.placement.link_of): every byte handed to a collective whose group's ranks ran on more
    # than one host counts inter-node, every other byte intra-node; the two add up to the total.
    *(Column(f"comm_{link}_bytes_per_step_{kind}", pa.float64(), "B/step",
             f"{'predicted ' if kind == 'predicted' else ''}bytes rank 0 hands per optimizer step to collectives whose "
             f"group's ranks ran {'on one host' if link == 'intra_node' else 'on more than one host'} (ZeRO paper's "
             "unit; a collective whose group spans nodes counts wholly inter-node; "
             + ("counted per process group, each group classified by the hosts its ranks recorded)" if kind == "measured"
                else "scalelab.formulas.communication.comm_bytes_by_link at torchrun's placement: consecutive ranks per node, as "
                     "many per node as ran on rank 0's host)"),
             "worker" if kind == "measured" else "collect",
             sometimes("runs measured since traffic per link was counted; predicted: as "
                                 "comm_bytes_per_step_predicted", OK))
      for link in ("intra_node", "inter_node") for kind in ("measured", "predicted")),
    # Tensor parallelism's collectives, apart from the strategy's above: DTensor's all-reduces over rank 0's
    # tensor-parallel group (scalelab.run.comm.FunctionalCollectiveCounter), 0 without tensor parallelism.
    Column("comm_tensor_parallel_bytes_per_step_measured", pa.float64(), "B/step", "bytes rank 0 hands per optimizer step "
           "to tensor parallelism's collectives (the ZeRO paper's unit: an all-reduce of S bytes counts 2S), counted over "
           "the warm-up steps by a dispatch mode the timed steps do without; 0 without tensor parallelism; null for a "
           "compiled tensor-parallel run (its graphs run them out of the mode's sight)", "worker",
           sometimes("runs measured since tensor parallelism; null for compiled tensor-parallel runs", OK)),
    Column("comm_tensor_parallel_bytes_per_step_predicted", pa.float64(), "B/step", "predicted tensor-parallel bytes per "
           "step: four all-reduces of B T d values per block and micro-batch, five with activation checkpointing; "
           "with sequence parallelism all-gathers and reduce-scatters of the same volume plus the head's and the "
           "embeddings' gathers and the norms' gradients (scalelab.formulas.tensor_parallelism.tensor_parallel_comm); 0 without "
           "tensor parallelism", "collect",
           sometimes("runs measured since tensor parallelism", OK)),
    Column("comm_tensor_parallel_link", pa.string(), "-", "the link rank 0's tensor-parallel group ran on (intra_node: one "
           "host; inter_node: several), from its ranks' hosts; null without tensor parallelism", "worker",
           exactly("status ok, tensor_parallel > 1",
                    lambda row: is_ok(row) and (row.get("tensor_parallel") or 1) > 1)),
    # Pipeline parallelism (scalelab.run.pipeline, its formulas scalelab.formulas.pipeline): rank 0's pipeline, one
    # rank per stage; null without a pipeline.
    Column("pipeline_microbatches", pa.int32(), "-", "micro-batches each step passes through the pipeline (the "
           "data-parallel rank's share of the global batch over micro_batch)", "worker", PIPELINE_OK),
    *(Column(f"comm_pipeline_bytes_per_step_{kind}", pa.float64(), "B/step",
             ("predicted " if kind == "predicted" else "") + "bytes rank 0 sends and receives point-to-point per step: "
             "each micro-batch's activations forward and their gradient backward at every boundary of its chunks, B x "
             "seq_len x d_model values at the residual stream's width" + (
                 " (scalelab.formulas.pipeline.p2p_bytes)" if kind == "predicted" else
                 " (counted on the ops torch's stages hand to batch_isend_irecv)"),
             "worker" if kind == "measured" else "collect", PIPELINE_OK)
      for kind in ("measured", "predicted")),
    *(Column(f"comm_pipeline_bytes_per_step_{kind}_per_stage", pa.list_(pa.float64()), "B/step",
             f"the same, {kind}, for each stage of rank 0's pipeline (first stage first)",
             "worker" if kind == "measured" else "collect", PIPELINE_OK)
      for kind in ("measured", "predicted")),
    *(Column(f"comm_pipeline_tied_bytes_per_step_{kind}", pa.float64(), "B/step",
             ("predicted " if kind == "predicted" else "") + "bytes of rank 0's all-reduce that sums a tied embedding's "
             "gradient with the last stage's head copy (fp32, an all-reduce of S bytes counts 2 S); 0 for an untied "
             "head", "worker" if kind == "measured" else "collect", PIPELINE_OK) for kind in ("measured", "predicted")),
    Column("bubble_fraction_measured", pa.float64(), "-", "the share of the schedule's time a rank computed nothing, "
           "1 - (its forwards' and backwards' time) / (the schedule's time), the median over the timed steps, averaged "
           "over the stages of rank 0's pipeline; it holds the point-to-point waits and the stages' imbalance the "
           "formula leaves out", "worker", PIPELINE_OK),
    Column("bubble_fraction_measured_per_stage", pa.list_(pa.float64()), "-", "the same for each stage (first first)",
           "worker", PIPELINE_OK),
    Column("bubble_fraction_stage_times", pa.float64(), "-", "the bubble the stages would leave with free sends, from "
           "their own compute in the timeline's step: each rank's time per chunk-micro-batch t, the schedule lasting "
           "(V m - 1) max t + sum t, averaged over the stages (scalelab.run.pipeline.stage_time_bubble). Above the "
           "formula: the stages' imbalance (the last computes the head and the loss); below the measured bubble: the "
           "sends and the schedule's own work", "worker", PIPELINE_OK),
    Column("bubble_fraction_predicted", pa.float64(), "-", "the schedule's bubble, (P - 1) / (V m + P - 1) with V "
           "chunks per rank (scalelab.formulas.pipeline.bubble_fraction)", "collect", PIPELINE_OK),
    Column("pipeline_activation_bytes_measured_per_stage", pa.list_(pa.int64()), "B", "the most bytes of block "
           "activations each stage held at once in one step (saved-tensor hooks, released as autograd frees them)",
           "worker", PIPELINE_OK),
    Column("pipeline_activation_bytes_predicted_per_stage", pa.list_(pa.float64()), "B", "predicted: the schedule's "
           "in-flight micro-batches on the stage x its blocks x one block's activations (scalelab.formulas.pipeline."
           "held_block_activations); null under activation checkpointing", "collect",
           sometimes("status ok, pipeline_parallel > 1, no activation checkpointing", PIPELINE_OK)),
    # The recipe of the run's collectives (scalelab.formulas.communication.comm_dtypes); a summary written before
    # they were recorded is read as what that code did (LEGACY_SUMMARY), never as today's recipe.
    Column("param_gather_dtype", pa.string(), "-", "dtype FSDP2 all-gathers parameters in (float32, or the compute "
           "dtype of fp16/bf16 at stages 2 and 3: MixedPrecisionPolicy param_dtype); null for strategies that gather "
           "none (stages 0, 1). Runs measured before it was recorded gathered float32", "worker",
           exactly("status ok, a strategy that shards parameters (ZeRO stages 2 and 3)",
                    lambda row: is_ok(row) and strategy(row["zero_stage"]).shards[0])),
    Column("grad_reduce_dtype", pa.string(), "-", "dtype gradients are reduced in (all-reduce, reduce-scatter): float32, "
           "or the compute dtype with the grad_reduce lever at compute. Runs measured before it was recorded reduced "
           "float32", "worker", OK),
    # The summary holds these as one dict per kind (FLATTENED); run_row spreads them.
    *(Column(f"comm_{c}_bytes_per_step", pa.float64(), "B/step", f"bytes handed to {c} per optimizer step on rank 0",
             "worker", sometimes("when the strategy called it in the measured steps", OK)) for c in COLLECTIVES),
    *(Column(f"comm_{c}_calls_per_step", pa.float64(), "calls/step", f"{c} calls per optimizer step on rank 0", "worker",
             sometimes("when the strategy called it in the measured steps", OK)) for c in COLLECTIVES),
    Column("activation_bytes_measured", pa.int64(), "B", "activations saved for backward by one micro-batch's forward on "
           "rank 0, inside the blocks; null under pipeline parallelism (pipeline_activation_bytes_measured_per_stage)",
           "worker", OK & NO_PIPELINE),
    Column("activation_bytes_outside_blocks_measured", pa.int64(), "B", "activations saved outside the transformer blocks "
           "(embedding, head, loss); null under pipeline parallelism", "worker", OK & NO_PIPELINE),
    Column("activation_bytes_predicted", pa.float64(), "B", "predicted activations per micro-batch: Korthikanti et al.'s "
           "terms for this model", "collect", OK & FORMULA),
    Column("activation_bytes_predicted_paper", pa.float64(), "B", "predicted activations per micro-batch: Korthikanti et "
           "al. 2022 as published", "collect", OK & FORMULA),
    Column("activation_bytes_outside_blocks_predicted", pa.float64(), "B", "predicted bytes saved for backward outside the "
           "blocks (embeddings, final norm, head, the loss path) by one micro-batch", "collect", OK & FORMULA),
    Column("activation_measure", pa.string(), "-", "how activation_bytes_measured was measured", "worker", OK),
    Column("recompute_flops_per_token", pa.float64(), "FLOP/token", "extra FLOPs per token of activation checkpointing "
           "(one more forward of every block); 0 without", "worker", OK),
    Column("hfu", pa.float64(), "fraction", "hardware FLOPs utilisation: like mfu, with the recompute FLOPs added", "worker",
           OK),
    Column("fp8_linears", pa.int32(), "-", "linear layers converted to float8 (fp8 runs)", "worker", OK & LINEARS_CONVERTED),
    Column("fp8_emulated", pa.bool_(), "-", "whether fp8 ran through torchao's emulated casts (no FP8 tensor cores)",
           "worker", OK & LINEARS_CONVERTED),
    Column("ddp_buckets_predicted", pa.int32(), "-", "predicted DDP gradient buckets, i.e. all-reduce calls per step "
           "(stage 1; stage 0 on more than one rank: one rank trains without DDP)", "worker", OK & DDP_WRAPS),
    Column("predicted_peak_bytes", pa.float64(), "B", "predicted in-step peak per rank: model state (gradients only where they exist at "
           "the peak: DDP's buckets, or accumulation) + in-step parameters + activations", "launch"),
    Column("predicted_activation_bytes", pa.float64(), "B", "the activation part of predicted_peak_bytes (every "
           "micro-batch in flight); null for a custom module (no activation formula: its predicted peak is model "
           "state and in-step parameters)", "launch", FORMULA),
    Column("predicted_transient_param_bytes", pa.float64(), "B", "the in-step (unsharded) parameter part of "
           "predicted_peak_bytes", "launch"),
    Column("predicted_peak_bound", pa.string(), "-", "what predicted_peak_bytes is: 'model' (it models the step), 'upper "
           "bound: why' (fp8, predicted as bf16: the step keeps less; never a reason to skip the run) or 'lower bound: "
           "why' (a custom module: activations not predicted)", "launch",
           Filled("every run planned since schema 8 (null in older rows)", None, has_value("predicted_peak_bytes"))),
    Column("device_memory_bytes", pa.float64(), "B", "memory of one device the prediction is held against "
           "(planning.device_memory_gib, else the GPU's); null when unknown (CPU)", "launch",
           Filled("planning.device_memory_gib set, or a GPU run that ended ok", lambda row: is_ok(row) and GPU.rows(row))),
    Column("predicted_oom_reason", pa.string(), "-", "why the run was predicted not to fit; null when it fits", "launch",
           Filled("status predicted_oom (and a run launched anyway with planning.launch_predicted_oom)",
                  lambda row: row["status"] == "predicted_oom")),
    Column("forecast_step_time_s", pa.float64(), "s", "the sweep's forecast of the step time before any run (planning.top_k: "
           "scalelab plan's model, assumptions in forecast_note); what ranked the point, not the step-time model's "
           "prediction (predicted_step_time_s)", "launch", FORECAST_TIMED),
    Column("forecast_tokens_per_s", pa.float64(), "tokens/s", "the run's tokens/s as the forecast ranked it "
           "(global batch tokens / forecast_step_time_s)", "launch", FORECAST_TIMED),
    Column("forecast_rank", pa.int32(), "-", "the point's rank by forecast_tokens_per_s among its model's points at its world "
           "size predicted to fit (1 = fastest); planning.top_k runs ranks 1..k and the baselines", "launch",
           sometimes("planning.top_k set: the points the forecast ranked (timed and predicted to fit)")),
    Column("forecast_decision", pa.string(), "-", "what planning.top_k decided for the point and why: 'run: rank 2 of 6 ... "
           "<= top_k 3', 'run: a baseline', 'run: ended ok before', 'run: not ranked: why' (not forecast, or predicted not "
           "to fit) or 'pruned: rank 5 of 6 ... > top_k 3'", "launch", sometimes("planning.top_k set")),
    Column("forecast_note", pa.string(), "-", "the forecast's assumptions (peak, MFU, links, overlap, what it does not "
           "model)", "launch", FORECAST_TIMED),
    Column("peak_mem_allocated_bytes", pa.int64(), "B", "max memory allocated by PyTorch on a GPU, largest rank; null on "
           "CPU", "worker", OK & GPU),
    Column("peak_mem_reserved_bytes", pa.int64(), "B", "max memory reserved by PyTorch's caching allocator on a GPU, "
           "largest rank; null on CPU", "worker", OK & GPU),
    Column("peak_rss_bytes", pa.int64(), "B", "peak resident set size of a rank's process, largest rank (includes the "
           "framework)", "worker", OK),
    Column("wall_time_s", pa.float64(), "s", "wall time of the whole run, launch to results written", "launch"),
    Column("startup_s", pa.float64(), "s", "launch to the first training step (process start, imports, process group, "
           "model build): the worker's first-step time, less the launch time", "launch", OK),
    Column("requested_device", pa.string(), "-", "train.device as configured: auto | cpu | cuda", "launch"),
    Column("planned_device_reason", pa.string(), "-", "why the workflow planned the sweep on this device", "launch"),
    Column("device_type", pa.string(), "-", "device the run trained on: cpu | cuda (planned by the launcher, as the "
           "worker found it)", "launch"),
    Column("device_name", pa.string(), "-", "device model: the GPU's name, or the CPU's model name with its family, model "
           "and widest matmul instructions (e.g. 'AMD EPYC [family 25 model 1, AVX2]': a hypervisor may give generations "
           "one name; rows before 2026-11-27 hold the name alone)", "worker", OK),
    Column("backend", pa.string(), "-", "torch.distributed backend: gloo | nccl", "worker", OK),
    Column("launch", pa.string(), "-", "how the ranks were started (one process per rank on one host, started by the launcher or, "
           "for a CPU run, forked from the prefork server that imported torch once; or srun x torchrun over nodes)", "launch",
           LAUNCHED),
    Column("launchers", pa.int32(), "-", "launchers of the run: 1 on one host, else torchrun launchers (SLURM tasks)", "launch", LAUNCHED),
    Column("threads", pa.int32(), "-", "CPU threads given to the whole run", "launch"),
    Column("threads_per_rank", pa.int32(), "-", "intra-op threads per rank", "worker", OK),
    Column("rank_cores", pa.string(), "-", "CPU cores each rank of rank 0's launcher was pinned to (r0:0 r1:1), or why they "
           "shared (an overcommitted run); null on GPU", "worker", OK & CPU),
    Column("host_steal_share", pa.float64(), "fraction", "the share of the time its cores wanted to run that the "
           "hypervisor gave to other guests during the timed steps (steal over busy and stolen ticks in /proc/stat, of the "
           "cores each rank may run on: a CPU rank's own, a GPU rank's host cores; the largest over ranks). A CPU run's "
           "speed reads low by about this share, and the report warns above 2%; 0 on bare metal; null where the kernel "
           "keeps no such count or the timed steps were under one second of one core's time", "worker",
           sometimes("Linux hosts, runs measured since schema 10", OK)),
    Column("torch_version", pa.string(), "-", "torch.__version__", "worker", OK),
    Column("cuda_version", pa.string(), "-", "torch.version.cuda; null for a CPU build", "worker",
           Filled("status ok, a CUDA build of torch (every GPU run)", lambda row: is_ok(row) and GPU.rows(row), OK.at_most)),
    Column("nccl_version", pa.string(), "-", "NCCL version on GPU runs", "worker", OK & GPU),
    Column("python_version", pa.string(), "-", "Python version of the ranks", "worker", OK),
    Column("hostname", pa.string(), "-", "host of rank 0", "worker", OK),
    Column("rank_hostnames", pa.string(), "-", "host of each rank, in rank order, comma-separated (socket.gethostname() "
           "on the rank)", "worker", OK),
    Column("node_list", pa.string(), "-", "the hosts the run's ranks ran on, each once, in rank order, comma-separated",
           "worker", OK),
    Column("nodes_used", pa.int32(), "-", "how many hosts the run's ranks ran on (1 on one host; a run whose launchers "
           "span SLURM nodes: its nodes)", "worker", OK),
    Column("nodes_share_machine", pa.bool_(), "-", "the run's nodes are one machine (every rank read the same kernel boot "
           "id: a virtual cluster's network namespaces), so their ranks shared its cores and memory and its timings "
           "over-commit compute; null on one host", "worker",
           sometimes("runs over more than one host, measured since traffic per link was counted", OK)),
    Column("git_commit", pa.string(), "-", "commit of the code that ran", "launch",
           exactly("unless git_commit_source says unknown", lambda row: not (row.get("git_commit_source") or "unknown").startswith("unknown"))),
    Column("git_dirty", pa.bool_(), "-", "whether the checkout had uncommitted changes", "launch",
           Filled("git_commit_source git (from the environment: when SCALELAB_GIT_DIRTY is set)",
                  lambda row: row.get("git_commit_source") == "git")),
    Column("git_commit_source", pa.string(), "-", "where git_commit comes from (git, an environment variable) or why it "
           "is unknown", "launch"),
    Column("dataset_sha256_train", pa.string(), "-", "SHA-256 of the tokenized training split", "launch"),
    Column("seed", pa.int64(), "-", "random seed (train.seed)", "launch"),
    Column("config_hash", pa.string(), "-", "hash of the configuration the results depend on", "launch"),
    Column("started_utc", pa.string(), "-", "when the run started, ISO 8601, UTC", "launch"),
    Column("run_path", pa.string(), "-", "the run's folder under `<results>/runs/`: its run id", "collect"),
]

# steps.parquet: one row per optimizer step, after the identity columns. The worker writes a
# record per step (progress.jsonl); the launcher turns the records into the run's table.
STEP = [
    Column("step", pa.int32(), "-", "optimizer step, from 0 (warm-up steps included)", "worker", nullable=False),
    Column("loss", pa.float64(), "nats/token", "training loss of the step, mean over all ranks and micro-batches "
           "(cross-entropy)", "worker"),
    Column("grad_norm", pa.float64(), "-", "global L2 norm of the gradients before clipping", "worker"),
    Column("lr", pa.float64(), "-", "learning rate used by the step (warm-up then cosine)", "worker"),
    Column("loss_scale", pa.float64(), "-", "fp16 dynamic loss scale the step used; null without a scaler (fp32, bf16, "
           "fp8)", "worker", LOSS_SCALER),
    Column("skipped", pa.bool_(), "-", "true when the fp16 loss scaler skipped the optimizer step (inf/NaN gradients)",
           "worker"),
    Column("step_time_s", pa.float64(), "s", "wall time of the step on rank 0 (forward, backward, communication, "
           "optimizer)", "worker"),
    Column("tokens", pa.int64(), "tokens", "tokens processed by the step, all ranks together", "worker"),
    Column("tokens_per_s", pa.float64(), "tokens/s", "tokens / step_time_s: the step's throughput, all ranks together",
           "launch"),
]

RUN_COLUMNS = {c.name: c for c in IDENTITY + RUN}
STEP_COLUMNS = {c.name: c for c in IDENTITY + STEP}
IDENTITY_FIELDS = [c.field() for c in IDENTITY]
RUN_SCHEMA = pa.schema([c.field() for c in RUN_COLUMNS.values()], metadata=_META)
STEP_SCHEMA = pa.schema([c.field() for c in STEP_COLUMNS.values()], metadata=_META)


# ----------------------------------------------------------------------------- docs/data-dictionary.md

def markdown() -> str:
    """docs/data-dictionary.md: both tables, in schema order."""
    def table(columns: dict[str, Column]) -> list[str]:
        rows = ["| column | type | unit | written by | filled | meaning |", "|---|---|---|---|---|---|"]
        for c in columns.values():
            cells = [f"`{c.name}`", f"`{c.type}`", c.unit, c.writer, c.filled.text, c.meaning]
            rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        return rows

    lines = [
        "# Data dictionary",
        "",
        "<!-- Generated from src/scalelab/planning/columns.py by `python -m scalelab.planning.columns > docs/data-dictionary.md`; "
        "tests/*/test_columns.py checks it. -->",
        "",
        "Every column of the two result tables: its Arrow type, unit, meaning, the part that writes it and",
        "when it holds a value. The same text is in each Parquet file's field metadata (keys `unit`,",
        "`description`, `writer` and `filled`), e.g.",
        "`pyarrow.parquet.read_schema('results/metrics.parquet').field('mfu').metadata`.",
        "The identity columns (`run_id` and one per sweep axis) are on every row of both tables.",
        "",
        "Written by: `identity` the sweep point; `launch` the launcher; `worker` rank 0's worker, read back",
        "only from a run whose ranks all finished (status ok); `collect` the collection into the tables.",
        "Filled: the rows that hold a value; the others hold null. A row collection makes for a run folder",
        f"without a readable summary (status {' or '.join(COLLECTED_STATUSES)}) holds its identity, status, reason and",
        "run_path only.",
        "",
        f"## results/metrics.parquet: one row per run ({len(RUN_COLUMNS)} columns)",
        "",
        *table(RUN_COLUMNS),
        "",
        f"## results/steps.parquet: one row per optimizer step ({len(STEP_COLUMNS)} columns)",
        "",
        *table(STEP_COLUMNS),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(prog="python -m scalelab.planning.columns",
                            description="Print the data dictionary (docs/data-dictionary.md) as Markdown: "
                                        "python -m scalelab.planning.columns > docs/data-dictionary.md").parse_args()
    print(markdown(), end="")
