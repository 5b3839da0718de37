"""A run's communication, timed: the collectives its row's strategy and tensor parallelism issue per step
(scalelab.formulas.links' sizes and calls) and their seconds on the links fitted to a bench table.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from scalelab.formulas import links
from scalelab.formulas.link_fit import LinkFit
from scalelab.formulas.overlap import TENSOR_PARALLEL
from scalelab.formulas.predicted_columns import last_block_kept, missing, model_of_row, rank_step
from scalelab.registries.strategies import strategy


def collectives_of(row: dict, world_size: int | None = None) -> tuple[dict[str, float], dict[str, int]]:
    """(bytes per step as nccl-tests sizes them, calls per step) per collective of a run's row at
    ``world_size`` (its own by default): scalelab.formulas.links' collective_sizes and collective_calls, with
    the row's own bucket size for DDP's all-reduce calls. ValueError saying why a row has none the
    model can use (a custom module, LoRA)."""
    from scalelab.formulas import flops, tensor_parallelism
    from scalelab.formulas.links import collective_calls, collective_sizes

    if row.get("model_family") == "custom":
        raise ValueError("a custom module: its FSDP units and parameter tensors are not known to the model")
    if not missing(row.get("lora_rank")):
        raise ValueError("a LoRA run: its collectives move the trainable parameters only, which the model does not size")
    if not missing(row.get("replicas")) and int(row["replicas"]) > 1:
        raise ValueError("hybrid sharding: its collectives over replica and shard groups are not sized by the model yet")
    n = int(world_size or row["world_size"])
    cfg = model_of_row(row)
    n_params = row.get("n_params")
    n_params = flops.param_count(cfg) if missing(n_params) else int(n_params)
    degree = _tensor_parallel(row)
    if degree > 1:  # the strategy over the data-parallel ranks, on each rank's share
        n, n_params = tensor_parallelism.data_parallel_size(n, degree), int(tensor_parallelism.tensor_parallel_params(cfg, n_params, degree))
    step = rank_step(row, n, degree)
    stage, precision, k = step.zero_stage, step.precision, step.accumulation_steps
    kept = last_block_kept(row)
    sizes = collective_sizes(n_params, step, last_block_params=kept)
    bucket_mb = row.get("bucket_mb")  # the run's own bucket cap (null for strategies without buckets)
    calls = collective_calls(cfg, stage, precision, sizes, accumulation_steps=k,
                             bucket_mb=None if missing(bucket_mb) else float(bucket_mb), tensor_parallel=degree,
                             last_block_kept=kept > 0)
    return sizes, calls


def comm_seconds(sizes: Mapping[str, float], calls: Mapping[str, int], world_size: int,
                 fits: Mapping[str, LinkFit]) -> dict[str, float]:
    """Seconds per step of each collective: its calls, each of its share of the bytes (a tensor-parallel one's
    kind read past its prefix)."""
    return {c: calls[c] * links.collective_seconds(c.removeprefix(TENSOR_PARALLEL), sizes[c] / calls[c], world_size,
                                                   fits[c].link) for c in sizes}


def _tensor_parallel(row) -> int:
    return 1 if missing(row.get("tensor_parallel")) else int(row["tensor_parallel"])


def tensor_parallel_collectives(row: dict) -> tuple[dict[str, float], dict[str, int]]:
    """(bytes per step as nccl-tests sizes them, calls per step) of a run's tensor-parallel collectives over its
    group (tensor_parallelism.tensor_parallel_comm), keyed ``tensor_parallel <collective>``; none without it."""
    from scalelab.formulas import tensor_parallelism

    degree = _tensor_parallel(row)
    if degree == 1:
        return {}, {}
    # the data-parallel ranks, which the tensor-parallel count does not read (run_comm checks the split itself)
    comm = tensor_parallelism.tensor_parallel_comm(model_of_row(row), rank_step(row, int(row["world_size"]) // degree, degree))
    sizes = {TENSOR_PARALLEL + c: nbytes / links.handed_per_size(c) for c, (nbytes, _) in comm.items()}
    return sizes, {TENSOR_PARALLEL + c: calls for c, (_, calls) in comm.items()}


def run_comm(model, row: dict) -> tuple[dict[str, float], dict[str, int], float] | str:
    """A run's communication: (seconds per collective, calls, the link fits' error in seconds), or why there is
    none. ``model``: the fitted step model (scalelab.results.step_model.Model: its link_fits). The strategy's
    collectives over its data-parallel ranks; tensor parallelism's over its group
    (TENSOR_PARALLEL), each on the bench table's links fitted at that group's size."""
    from scalelab.formulas import tensor_parallelism

    degree = _tensor_parallel(row)
    data_ranks = tensor_parallelism.data_parallel_size(int(row["world_size"]), degree)
    try:
        sizes, calls = collectives_of(row)
        tp_sizes, tp_calls = tensor_parallel_collectives(row)
    except (ValueError, TypeError, KeyError) as err:  # TypeError, KeyError: a row without the model's shape
        return f"no communication model: {err}"
    comm, sigma2 = {}, 0.0
    for group, group_sizes, group_calls, batched in ((data_ranks, sizes, calls, strategy(row["zero_stage"]).batched),
                                                     (degree, tp_sizes, tp_calls, ())):
        if group < 2 or not group_sizes:
            continue  # a one-rank group moves nothing
        fits = model.link_fits(group, batched)
        if fits is None:
            return (f"no bench comm table: communication over {group} ranks unknown (measure one: snakemake bench_comm, "
                    "or scalelab bench comm)")
        fitted = {c: fits[c.removeprefix(TENSOR_PARALLEL)] for c in group_sizes}
        seconds = comm_seconds(group_sizes, group_calls, group, fitted)
        comm.update(seconds)
        # the fit's own error on the bench (systematic); a call's scatter about its mean averages out over a run's calls
        sigma2 += sum((seconds[c] * fitted[c].residual) ** 2 for c in seconds)
    return comm, {**calls, **tp_calls}, math.sqrt(sigma2)


def tokens_or_nan(row) -> float:
    try:
        return tokens_per_rank(row)
    except (TypeError, ValueError, KeyError):
        return math.nan


def tokens_per_rank(row) -> float:
    """Tokens one rank processes per optimizer step: micro-batch x accumulation steps x sequence length."""
    return float(row["micro_batch"]) * float(row.get("accumulation_steps") or 1) * float(row["seq_len"])
