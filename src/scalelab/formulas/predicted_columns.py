"""Every formula column of a run, computed from its row: the run's identity (precision, stage, world
size, levers) and what it counted (parameters, micro-batch and accumulation, device, the hosts its
ranks ran on). Torch-free.

Predictions are made at two times. Before the run, the launcher's in-step peak (:func:`peak`) decides whether
it would run out of memory (``predicted_oom_reason``, kept as decided). At collection
(scalelab.results.collect.collect, :func:`refreshed`), every formula column is computed from the row, so that
a formula fixed after a run reaches its cached row without retraining (the code is no rerun trigger). The
worker writes measurements, and one formula whose input only it sees: ``ddp_buckets_predicted``, DDP's bucket
assignment over the size of every parameter in registration order (a user's module's too), which no row holds.

* :func:`peak` - the predicted in-step peak per rank (``predicted_peak_bytes`` and its parts), from the
  launcher's facts; refreshed at collection for the built-in families (a user's module's block
  parameters are counted on torch's meta device at launch: its row keeps them).
* :func:`trained_run_columns` - model state (PyTorch's and the paper's convention), activations, and
  communication in all and per link (at torchrun's placement: as many ranks per node as on rank 0's host),
  for a run that trained (it counted its parameters and the hosts its ranks ran on).
"""
from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping

from scalelab.config import ModelConfig
from scalelab.formulas import (
    activation_memory,
    communication,
    flops,
    lora_training,
    model_state,
    peak_memory,
    pipeline,
    tensor_parallelism,
)
from scalelab.formulas.rank_step import RankStep
from scalelab.registries.families import DEFAULT_FAMILY, OWN_KEYS
from scalelab.registries.topology import link_of

PEAK_COLUMNS = ("predicted_peak_bytes", "predicted_activation_bytes", "predicted_transient_param_bytes", "predicted_peak_bound")
"""The launcher's formula columns (beside them, predicted_oom_reason: the launch decision, kept)."""
TRAINED_RUN_COLUMNS = (
    "activation_bytes_predicted", "activation_bytes_predicted_paper", "activation_bytes_outside_blocks_predicted",
    "model_state_bytes_predicted", "model_state_params_bytes_predicted", "model_state_grads_bytes_predicted",
    "model_state_optimizer_bytes_predicted", "model_state_bytes_predicted_paper", "comm_bytes_per_step_predicted",
    "comm_bytes_per_step_predicted_paper", "comm_tensor_parallel_bytes_per_step_predicted", *pipeline.PREDICTED_COLUMNS)
"""The formula columns of a run that trained (:func:`trained_run_columns`), beside one per link
(comm_<link>_bytes_per_step_predicted); collection writes them."""


def refreshed_at_collection(name: str) -> bool:
    """Whether collection computes the column anew by today's formulas (:func:`refreshed`)."""
    return (name in PEAK_COLUMNS or name in TRAINED_RUN_COLUMNS
            or (name.startswith("comm_") and name.endswith("_bytes_per_step_predicted")))


def missing(value) -> bool:
    """None, NaN or pandas' NA (a nullable column's null). A value is pandas' NA only where pandas is loaded, so a row
    read from JSON (the launcher's, collection's) does not import it."""
    pd = sys.modules.get("pandas")
    return value is None or (pd is not None and value is pd.NA) or (isinstance(value, float) and math.isnan(value))


def _value(row: Mapping, name: str, default=None):
    v = row.get(name, default)
    return default if missing(v) else v


def last_block_kept(row: Mapping) -> float:
    """The parameters a run's FSDP2 kept gathered from its last block's forward to its backward
    (``last_block_params_kept``); 0 where it kept none, or where the column is null: a run measured before, which
    gathered that block twice, is predicted as it ran."""
    try:
        kept = float(row.get("last_block_params_kept"))
    except TypeError:  # None, or pandas' NA in a table's row
        return 0.0
    return 0.0 if math.isnan(kept) else kept


def model_of_row(row: Mapping) -> ModelConfig:
    """The ModelConfig of a run's row (its shape columns, and every family's own keys the registry names: a new
    family's key is read back as soon as it is registered, never dropped)."""
    own = {}
    for key in OWN_KEYS:  # typed as ModelConfig types them: a float default (rope_base) reads a float, the rest ints
        if (value := _value(row, key)) is not None:
            own[key] = float(value) if isinstance(ModelConfig.__dataclass_fields__[key].default, float) else int(value)
    return ModelConfig(n_layers=int(row["n_layers"]), d_model=int(row["d_model"]), n_heads=int(row["n_heads"]),
                       seq_len=int(row["seq_len"]), tie_embeddings=bool(_value(row, "tie_embeddings", True)),
                       vocab_size=int(row["vocab_size"]), family=_value(row, "model_family", DEFAULT_FAMILY),
                       module=_value(row, "model_module"), **own)


def split_of(cfg: ModelConfig, n_params: float, row: Mapping) -> tuple[float, int, int]:
    """(parameters rank 0 holds, data-parallel ranks, tensor-parallel degree) of a row: under tensor and pipeline
    parallelism the strategy's formulas apply to each rank's share over the data-parallel ranks (rank 0: the first
    pipeline stage's)."""
    degree, pp = int(_value(row, "tensor_parallel", 1)), int(_value(row, "pipeline_parallel", 1))
    dp = tensor_parallelism.data_parallel_size(int(row["world_size"]), degree * pp)
    if pp > 1:
        return pipeline.rank_params(cfg, tensor_parallelism.last_block_params(cfg, degree), 0, pp, _schedule(row)), dp, degree
    return tensor_parallelism.tensor_parallel_params(cfg, n_params, degree), dp, degree


def _schedule(row: Mapping) -> str:
    return _value(row, "pipeline_schedule", pipeline.DEFAULT_SCHEDULE)


def largest_rank_params(cfg: ModelConfig, n_params: float, row: Mapping) -> float:
    """The parameters of the rank holding the most (every rank's share alike without a pipeline)."""
    degree, pp = int(_value(row, "tensor_parallel", 1)), int(_value(row, "pipeline_parallel", 1))
    if pp == 1:
        return tensor_parallelism.tensor_parallel_params(cfg, n_params, degree)
    return max(pipeline.rank_params(cfg, tensor_parallelism.last_block_params(cfg, degree), k, pp, _schedule(row)) for k in range(pp))


def pipeline_columns(cfg: ModelConfig, row: Mapping) -> dict:
    """The pipeline's predicted columns of a row (scalelab.formulas.pipeline.predicted_columns)."""
    pp, degree = int(_value(row, "pipeline_parallel", 1)), int(_value(row, "tensor_parallel", 1))
    if pp == 1 or cfg.module is not None:
        return dict.fromkeys(pipeline.PREDICTED_COLUMNS)
    data_parallel = tensor_parallelism.data_parallel_size(int(row["world_size"]), degree * pp)
    return pipeline.predicted_columns(cfg, rank_step(row, data_parallel, degree), pp, _schedule(row))


def rank_step(row: Mapping, data_parallel: int, tensor_parallel: int) -> RankStep:
    """What one rank of the run in ``row`` runs in a step (its identity, ``accumulation_steps``, ``device_type``, the
    ``grad_reduce`` lever: fp32 where null), over ``data_parallel`` ranks split ``tensor_parallel`` ways (split_of's
    figures)."""
    return RankStep(
        precision=row["precision"], zero_stage=int(row["zero_stage"]), data_parallel=data_parallel,
        micro_batch=int(row["micro_batch"]), accumulation_steps=int(_value(row, "accumulation_steps", 1)),
        activation_checkpointing=bool(_value(row, "activation_checkpointing", False)),
        cpu_offload=bool(_value(row, "cpu_offload", False)), replicas=int(_value(row, "replicas", 1)),
        compiled=bool(_value(row, "compile", False)), tensor_parallel=tensor_parallel,
        sequence_parallel=bool(_value(row, "sequence_parallel", False)), device_type=row["device_type"],
        grad_reduce=_value(row, "grad_reduce", "fp32"))


def peak(cfg: ModelConfig, n_params: int, row: Mapping, block_params: int | None = None,
         n_trainable: int | None = None) -> peak_memory.PeakMemory:
    """The predicted in-step peak per rank of a run (row: its identity, ``accumulation_steps`` and
    ``device_type``); LoRA (``lora_rank``): the frozen weights hold no gradient or optimizer state
    (n_trainable: counted for a user's module, else the formula's). Under pipeline parallelism: the model state of
    the rank holding the most parameters, and the activations of the stage holding the most micro-batches' (the
    embeddings' and the head's terms counted whole: an upper figure for a stage that holds only one of them)."""
    n_params, world_size, degree = split_of(cfg, n_params, row)  # world_size: the data-parallel ranks
    step = rank_step(row, world_size, degree)
    stage, precision, accum = step.zero_stage, step.precision, step.accumulation_steps
    pp = int(_value(row, "pipeline_parallel", 1))
    held_params = largest_rank_params(cfg, n_params, row) if pp > 1 else n_params  # the rank holding the most
    result = peak_memory.peak_memory(cfg, held_params, step, block_params=block_params)
    if pp > 1:  # the blocks' activations of the stage holding the most micro-batches'
        case = {"activation_checkpointing": step.activation_checkpointing, **step.activation_levers}
        blocks = activation_memory.block_activation_bytes(cfg, step.micro_batch, precision, **case)
        per_block, once = pipeline.per_block_and_once(cfg, step.micro_batch, precision, **case)
        held = max(pipeline.held_block_activations(per_block, cfg.n_layers, k, pp, accum, _schedule(row), once)
                   for k in range(pp))
        result = dataclasses.replace(result, activations=result.activations - blocks + held)
    lora_rank = _value(row, "lora_rank")
    if lora_rank and not step.cpu_offload:  # frozen weights: no gradient or optimizer state for them
        trainable = n_trainable if n_trainable is not None else lora_training.lora_trainable_params(cfg, int(lora_rank))
        state = lora_training.lora_model_state_bytes(n_params, trainable, stage, world_size, precision, "pytorch",
                                                     step.replicas)
        at_peak = peak_memory.grads_at_peak(stage, world_size, accum, step.replicas, degree)
        held = state.total if at_peak else state.total - state.grads
        result = dataclasses.replace(result, model_state=held, at_rest=state.total)
    return result


def peak_columns(result: peak_memory.PeakMemory, custom: bool) -> dict:
    return {"predicted_peak_bytes": result.total, "predicted_activation_bytes": None if custom else result.activations,
            "predicted_transient_param_bytes": result.transient_params, "predicted_peak_bound": result.bound}


def trained_run_columns(cfg: ModelConfig, row: Mapping, rank_hosts: list[str]) -> dict:
    """The formulas beside what a run that trained measured, from the row's identity and counted facts:
    ``n_params``, ``n_trainable_params`` (its n_params without LoRA), ``accumulation_steps``, the resolved
    ``micro_batch``, ``device_type``; rank_hosts: each rank's host (rank order)."""
    # under tensor parallelism the strategy's formulas take each rank's share over the data-parallel ranks
    n_params, world_size, degree = split_of(cfg, int(row["n_params"]), row)
    step = rank_step(row, world_size, degree)
    stage, precision, replicas = step.zero_stage, step.precision, step.replicas
    accum, micro, ac = step.accumulation_steps, step.micro_batch, step.activation_checkpointing
    state_params = largest_rank_params(cfg, int(row["n_params"]), row)  # the measured state is the largest rank's
    lora = _value(row, "lora_rank") is not None
    n_trainable = int(row["n_trainable_params"]) if lora else None
    if lora:
        n_frozen = n_params - n_trainable
        states = [lora_training.lora_model_state_bytes(n_frozen, n_trainable, stage, world_size, precision, c, replicas)
                  for c in ("pytorch", "paper")]
        paper_elements = lora_training.lora_comm_elements_per_step(n_frozen, n_trainable, stage, world_size, accum, "paper", replicas)
    else:
        states = [model_state.model_state_bytes(state_params, stage, world_size, precision, c, replicas)
                  for c in ("pytorch", "paper")]
        paper_elements = communication.comm_elements_per_step(n_params, stage, world_size, accum, "paper", replicas)
    custom = cfg.module is not None
    sp = step.sequence_parallel
    pp = int(_value(row, "pipeline_parallel", 1))
    blocks = cfg if pp == 1 else dataclasses.replace(  # rank 0's blocks carry its tensor-parallel collectives
        cfg, n_layers=len(pipeline.chunks(cfg.n_layers, pp, _schedule(row))[0]) * len(pipeline.rank_chunks(0, pp, _schedule(row))))
    tp_bytes = tensor_parallelism.tensor_parallel_bytes(blocks, step)
    kept = last_block_kept(row)
    if pp > 1 and stage in (2, 3) and world_size > 1:  # FSDP2 under torch's schedules gathers and reduces otherwise
        comm_total, links = _pipeline_sharded_comm(row, n_params, kept, step, rank_hosts)
    else:
        links = communication.comm_bytes_by_link(n_params, step, rank_hosts.count(rank_hosts[0]), n_trainable,
                                                 last_block_params=kept)
        comm_total = communication.comm_bytes_per_step(n_params, step, n_trainable, kept)
    return {
        "activation_bytes_predicted": None if custom else activation_memory.block_activation_bytes(
            cfg, micro, precision, ac, **step.activation_levers),
        "activation_bytes_predicted_paper": None if custom else activation_memory.block_activation_bytes(
            cfg, micro, precision, ac, "paper", tensor_parallel=degree, sequence_parallel=sp),
        "activation_bytes_outside_blocks_predicted": None if custom else activation_memory.outside_block_activation_bytes(
            cfg, micro, precision, accum, **step.activation_levers),
        "model_state_bytes_predicted": states[0].total,
        "model_state_params_bytes_predicted": states[0].params,
        "model_state_grads_bytes_predicted": states[0].grads,
        "model_state_optimizer_bytes_predicted": states[0].optimizer,
        "model_state_bytes_predicted_paper": states[1].total,
        "comm_bytes_per_step_predicted": comm_total,
        "comm_tensor_parallel_bytes_per_step_predicted": tp_bytes,
        **{f"comm_{link}_bytes_per_step_predicted": None if None in by_type.values() else float(sum(by_type.values()))
           for link, by_type in links.items()},
        "comm_bytes_per_step_predicted_paper": 4 * paper_elements,  # the paper's elements, counted at fp32's width
        **pipeline_columns(cfg, row),
    }


def _pipeline_sharded_comm(row: Mapping, n_params: float, kept: float, step: RankStep,
                           rank_hosts: list[str]) -> tuple[float | None, dict]:
    """(bytes per step, by link) of FSDP2 on rank 0's pipeline stage running ``step``
    (scalelab.formulas.pipeline.sharded_comm_bytes), each group on its link: rank 0's shard group and its replicas on
    the (pp, dp_replicate, dp_shard, tp) mesh; both null where the schedule's gathers are not modelled."""
    replicas, degree = step.replicas, step.tensor_parallel
    shard = step.data_parallel // replicas
    by_group = pipeline.sharded_comm_bytes(n_params, kept, step, _schedule(row))
    if by_group is None:
        return None, {"intra_node": {"sharded": None}, "inter_node": {"sharded": None}}
    groups = {"shard": [k * degree for k in range(shard)], "replicate": [k * shard * degree for k in range(replicas)]}
    links: dict[str, dict] = {"intra_node": {}, "inter_node": {}}
    for name, nbytes in by_group.items():
        by_type = links[link_of(groups[name], rank_hosts)]
        by_type[name] = by_type.get(name, 0.0) + nbytes
    return sum(by_group.values()), links


def refreshed(row: dict) -> dict:
    """A collected row with its formula columns computed by today's formulas: the launcher's peak where the model
    is a built-in family, and the trained-run columns where the run trained (it counted its parameters and hosts).
    A run whose worker wrote the trained-run columns itself (before collection computed them) has only those it
    wrote replaced: one it left null (a column newer than the run, whose measured twin is null too) stays null.
    ValueError from a formula that rejects the row (the caller keeps the row as written and reports it)."""
    if row.get("model_family") is None or row.get("n_layers") is None:  # a row without its shape (missing, corrupt)
        return row
    cfg = model_of_row(row)
    new = {}
    if cfg.module is None and row.get("predicted_peak_bytes") is not None and row.get("device_type") is not None:
        new.update({k: v for k, v in peak_columns(peak(cfg, flops.param_count(cfg), row), custom=False).items()
                    if row.get(k) is not None})
    hosts = row.get("rank_hostnames")
    if row.get("status") == "ok" and hosts and row.get("n_params") is not None:
        columns = trained_run_columns(cfg, row, hosts.split(","))
        if row.get("model_state_bytes_predicted") is not None:  # written by the worker that ran it: those it wrote
            columns = {k: v for k, v in columns.items() if row.get(k) is not None}
        new.update(columns)
    return {**row, **new}
