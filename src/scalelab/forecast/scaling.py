"""`scalelab estimate scaling` and `links`: a model's predicted step, tokens/s, MFU and exposed communication
per GPU count on the links named (or measured), and the link products those take."""
from __future__ import annotations

import argparse
import math

# The precisions whose records say they have a memory convention of their own (fp8 holds bf16's
from scalelab.forecast.estimate import DEFAULT_MFU, measured_mfu
from scalelab.forecast.inputs import (
    Cluster,
    EstimateError,
    Layout,
    ModelChoice,
    cluster_from_args,
    layout_from_args,
    whole_count,
)
from scalelab.forecast.inputs import positive as _positive
from scalelab.forecast.model_input import model_from_flags
from scalelab.forecast.pipeline_step import pipeline_problem
from scalelab.forecast.predict import predict_point
from scalelab.forecast.runnable import not_run, stage_not_priced
from scalelab.forecast.step import (  # the step-time model, shared by plan, pruning and the published validation
    Machine,
    Point,
    check_tensor_parallel,
    fp8_machine,
)
from scalelab.formulas import flops, links
from scalelab.registries import hardware
from scalelab.registries.strategies import HYBRID_KEY, TRAINERS, ZERO_STAGES, strategy

SCALING_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)
SCALING_STAGES = (*(str(s) for s in ZERO_STAGES), HYBRID_KEY)
LINK_RULE = ("a collective within a node runs at the intra-node link; one whose group spans nodes at the "
             "inter-node link times the group's ranks per node, a NIC each (NCCL's ring channels, one per rail), "
             "up to the intra-node link; on a link measured with nccl-tests (busbw:), each call pays NCCL's latency "
             "(a ring's grows with its ranks, a tree's with log2 of its nodes) and an all-reduce takes the faster of "
             "the ring and NCCL's tree, which, measured at several node counts, reaches what one group reached over "
             "its nodes, up to its NICs")
OUT_OF_SCOPE = ("NVLink SHARP and in-network reduction, the network's topology beyond one NIC per GPU (shared NICs, "
                "oversubscribed spines), NCCL's protocols for small messages (LL, LL128), algorithm switching on a "
                "link given as a product or a number, power or clock limits")


PIPELINE_READING = ("the slowest stage's compute and tensor-parallel time over (1 - bubble), bubble = (P - 1) / "
                    "(V m + P - 1) (V chunks per rank, m micro-batches per step); the sends between consecutive stages "
                    "exposed, on their link; the strategy's collectives over each stage's data-parallel ranks on its "
                    "parameters; memory per stage with its in-flight micro-batches (scalelab.forecast.step)")


def gpu_counts(text: str) -> tuple[int, ...]:
    """--gpus: whole counts separated by commas (1K as count() reads), sorted. ``...`` continues the
    two counts before it up to the one after it: multiplying where the second is a multiple of the
    first (8,16,...,1024 doubles), else in equal steps (8,16,24,...,64)."""
    def bad(why: str) -> argparse.ArgumentTypeError:
        return argparse.ArgumentTypeError(f"{text!r}: {why}, e.g. 8,16,32 or 8,16,...,1024")

    parts = [p.strip() for p in text.split(",")]
    counts: list[int] = []
    for i, part in enumerate(parts):
        if part == "...":
            if len(counts) < 2 or i + 1 >= len(parts) or parts[i + 1] == "...":
                raise bad("'...' needs two counts before it and one after it")
            continue
        try:
            value = whole_count(part)
        except argparse.ArgumentTypeError:
            value = 0
        if value < 1:
            raise bad("every GPU count must be a whole number >= 1")
        if i and parts[i - 1] == "...":
            a, b = counts[-2], counts[-1]
            if b <= a:
                raise bad("the two counts before '...' must grow")
            ratio = b // a if b % a == 0 else None  # a multiple: keep multiplying; else equal steps
            while counts[-1] < value:
                counts.append(counts[-1] * ratio if ratio else counts[-1] + b - a)
            if counts[-1] != value:
                raise bad(f"'...' from {a},{b} does not reach {value}")
            continue
        counts.append(value)
    return tuple(sorted(set(counts)))


def _link(option: str, spec: str, efficiency: float | None, notes: list[str], per_node: int = 8) -> links.Link:
    """--intra-node / --inter-node: a product, a number in GB/s, or a `bench comm` Parquet table
    (fitted by scalelab.formulas.link_fit.fit_link: measured, so no efficiency applies). What a table
    cannot say about a GPU cluster (measured on CPU, or within one host for --inter-node) goes
    to ``notes``."""
    from pathlib import Path

    if spec.endswith(".parquet") or Path(spec).is_file():
        import pandas as pd

        from scalelab.formulas import link_fit

        path = Path(spec)
        if not path.is_file():
            raise EstimateError(f"{option} {spec}: no such file (a `scalelab bench comm` table, a link product "
                                f"or a bandwidth in GB/s)")
        try:
            table = pd.read_parquet(path)
            link = link_fit.fit_link(table)
        except (ValueError, KeyError, OSError) as err:
            raise EstimateError(f"{option} {spec}: {err}") from None
        if "device_type" in table and (table["device_type"] == "cpu").any():
            notes.append(f"{option} {path.name} was measured on CPU (gloo): a CPU's link, not a GPU cluster's")
        if option == "--inter-node" and "hostname" in table and table["hostname"].nunique() < 2:
            notes.append(f"{option} {path.name} was measured within one host: its ranks shared no inter-node link")
        return link
    try:
        return links.side_link(spec, per_node, option == "--inter-node", efficiency)
    except ValueError as err:
        raise EstimateError(f"{option}: {err}") from None


def links_table() -> dict:
    """The link products --intra-node and --inter-node take (scalelab.formulas.links), with their sources."""
    rows = [{"link": p.name, "bandwidth_gb_per_s": p.bandwidth_Bps / links.GB, "latency_us": p.latency_s * 1e6,
             "aliases": list(p.aliases), "source": p.source, "note": p.note} for p in links.PRODUCTS]
    return {"rows": rows, "default_efficiency": links.DEFAULT_EFFICIENCY,
            "note": "bus bandwidth per GPU, unidirectional, nominal (collectives run at it x the link efficiency, "
                    f"default {links.DEFAULT_EFFICIENCY}; a group spanning nodes at it x its ranks per node, one NIC "
                    "each, up to the intra-node link); latency per collective call, assumed; a number given "
                    "instead of a name is GB/s per GPU, unidirectional"}


def _overlap_text(stage) -> str:
    """The strategy's overlap facts (Strategy.overlap, scalelab.formulas.overlap's windows) in words."""
    from scalelab.formulas import overlap

    windows = {"backward": f"backward ({overlap.OVERLAP_WINDOWS['backward']:.0%} of compute)",
               "step": "forward and backward (all of compute)"}
    hidden = [f"{c} behind {windows.get(w, w)}" for c, w in strategy(stage).overlap]
    if not hidden:
        return "none stated in the strategy record (Strategy.overlap): every collective counted exposed"
    return "; ".join(hidden) + ", all calls but the last; the rest is exposed"


def machine_of(cluster: Cluster, precision: str, gpus: list[int]) -> tuple[Machine, dict | None, list[str]]:
    """The GPUs, links and assumed efficiencies of a cluster (estimate scaling's and plan's flags):
    (machine, the measured MFU's source or None, notes); ``gpus``, the counts asked about, need the
    inter-node link where they span nodes."""
    if cluster.mfu is not None and cluster.mfu_from is not None:
        raise EstimateError("give --mfu or --mfu-from, not both")
    source = measured_mfu(cluster.mfu_from, precision, world_size=1) if cluster.mfu_from is not None else None
    mfu = source["median_mfu"] if source else (DEFAULT_MFU if cluster.mfu is None else cluster.mfu)
    if not (math.isfinite(mfu) and 0 < mfu <= 1):
        raise EstimateError(f"--mfu must be in (0, 1], got {mfu:g}")
    efficiency = cluster.link_efficiency
    if efficiency is not None and not (math.isfinite(efficiency) and 0 < efficiency <= 1):
        raise EstimateError(f"--link-efficiency must be in (0, 1], got {efficiency:g}")
    per_node = int(_positive("gpus-per-node", cluster.gpus_per_node))
    try:
        product = hardware.gpu_by_name(cluster.gpu)
        peak = flops.gpu_peak_flops(cluster.gpu, precision)
    except ValueError as err:
        raise EstimateError(f"--gpu {cluster.gpu}: {err}") from None
    notes: list[str] = [source["warning"]] if source and "warning" in source else []
    intra, inter = _links_of(cluster, product, efficiency, notes, per_node, gpus)
    return Machine(product=product, peak_flops=peak, mfu=mfu, per_node=per_node, intra=intra, inter=inter,
                   overlap_efficiency=_overlap_efficiency(cluster)), source, notes


def _links_of(cluster: Cluster, product, efficiency: float | None, notes: list[str], per_node: int,
              gpus: list[int]) -> tuple[links.Link, links.Link | None]:
    """The links within and between nodes: as given, the GPU's own within a node by default; the one between nodes
    needed where a count spans nodes."""
    intra_spec = cluster.intra_node or links.DEFAULT_INTRA_NODE.get(product.name)
    if intra_spec is None:
        raise EstimateError(f"--intra-node: no default link for {product.name}; give a product "
                            f"({', '.join(links.known_names())}) or a bandwidth in GB/s")
    intra = _link("--intra-node", intra_spec, efficiency, notes, per_node)
    spanning = [n for n in gpus if n > per_node]
    if spanning and cluster.inter_node is None:
        raise EstimateError(f"--inter-node: {spanning[0]} GPUs span nodes of {per_node} (--gpus-per-node); give the "
                            f"link between nodes: a product ({', '.join(links.known_names())}), a bandwidth in GB/s "
                            "or a `scalelab bench comm` table")
    inter = _link("--inter-node", cluster.inter_node, efficiency, notes, per_node) if cluster.inter_node else None
    return intra, inter


def _overlap_efficiency(cluster: Cluster) -> float:
    """--overlap-efficiency as given, else the trainer's where fitted to its published runs, else the GPU's."""
    from scalelab.formulas import overlap

    eta = cluster.overlap_efficiency
    if eta is None:
        eta = TRAINERS[cluster.trainer].overlap_efficiency
        eta = overlap.DEFAULT_OVERLAP_EFFICIENCY["cuda"] if eta is None else eta
    if not (math.isfinite(eta) and 0 <= eta <= 1):
        raise EstimateError(f"--overlap-efficiency must be in [0, 1], got {eta:g}")
    return eta


def scaling_table(args) -> dict:
    """`scalelab estimate scaling`'s answer for its flags (the command's edge: predict_scaling computes it)."""
    return predict_scaling(model_from_flags(args), cluster_from_args(args), layout_from_args(args), list(args.gpus))


def predict_scaling(model: ModelChoice, cluster: Cluster, layout: Layout, gpus: list[int]) -> dict:
    """Predicted step time, tokens/s per GPU, MFU, exposed communication and scaling efficiency per
    GPU count: at a fixed micro-batch per GPU (weak scaling: the global batch grows with the GPUs), or
    with a global batch at a fixed global batch (each GPU's share shrinks as GPUs grow, accumulated in
    micro-batches of at most the micro-batch); activation checkpointing adds the recompute to the time
    and takes the checkpointed activations in the memory."""
    cfg = model.cfg
    if cfg is None:
        raise EstimateError("estimate scaling needs the model's shape: --model NAME, or --layers/--d-model/--vocab/--seq "
                            "(FSDP's collectives per step follow its blocks)")
    machine, source, notes = machine_of(cluster, layout.precision, gpus)
    if layout.precision == "fp8" and machine.product.peak("bf16"):
        machine, fp8_note = fp8_machine(machine, cfg.d_model)  # its datasheet peak, the measured ratio apart
        notes.append(fp8_note)
    point = _scaling_point(model, cluster, layout, gpus)
    rows = [predict_point(point, machine, n) for n in gpus]
    for row in rows:
        row["scaling_efficiency"] = row["tokens_per_s_per_gpu"] / rows[0]["tokens_per_s_per_gpu"]
    return {"prediction": True, **model.named, "n_params": model.n_params, "zero_stage": layout.key,
            "shape": {"family": cfg.family, "n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_heads": cfg.n_heads},
            "strategy": strategy(point.priced).name, "trainer": cluster.trainer,
            "trainer_priced": TRAINERS[cluster.trainer].description, "precision": layout.precision,
            "grad_reduce": point.grad_reduce, "seq_len": cfg.seq_len, "micro_batch": point.micro_batch,
            "global_batch": layout.global_batch, "activation_checkpointing": layout.activation_checkpointing,
            "tensor_parallel": point.tensor_parallel, "pipeline_parallel": point.pipeline_parallel,
            **({"pipeline_schedule": layout.schedule, "pipeline_reading": PIPELINE_READING}
               if point.pipeline_parallel > 1 else {}),
            "tokens_per_gpu_per_step": rows[0]["tokens_per_gpu_per_step"], "flops_per_token": rows[0]["flops_per_token"],
            "recompute_flops_per_token": rows[0]["recompute_flops_per_token"],
            "gpu": machine.product.name, "peak_flops_per_gpu": machine.peak_flops, "gpus_per_node": machine.per_node,
            "assumptions": _scaling_assumptions(cluster, machine, source, point.priced),
            "rows": rows, **({"fp8": hardware.fp8_outlook(cfg.d_model)} if layout.precision == "fp8" else {}),
            **({"note": "; ".join(notes)} if notes else {})}


def _scaling_point(model: ModelChoice, cluster: Cluster, layout: Layout, gpus: list[int]) -> Point:
    """The configuration priced at every count, its counts checked, and refused in one line naming the flag where the
    trainer priced does not run it (scalelab.forecast.runnable: the rule `scalelab plan` leaves it out by)."""
    cfg = model.cfg
    tensor_parallel = int(_positive("tensor-parallel", layout.tensor_parallel))
    check_tensor_parallel(cfg, tensor_parallel)
    if layout.sequence_parallel and tensor_parallel == 1:
        raise EstimateError("--sequence-parallel splits the activations over a tensor-parallel group: give "
                            "--tensor-parallel T > 1")
    why = stage_not_priced(cluster.trainer, layout.key)
    if why:
        raise EstimateError(f"--zero-stage {layout.key}: {why}")
    pipeline_parallel = int(_positive("pipeline-parallel", layout.pipeline_parallel))
    if layout.chunks_per_rank is not None and (pipeline_parallel == 1 or layout.schedule != "interleaved_1f1b"):
        raise EstimateError("--chunks-per-rank is an interleaved schedule's: give --pipeline-parallel P and --schedule "
                            "interleaved_1f1b")
    why = pipeline_problem(cfg, pipeline_parallel, layout.schedule, virtual=layout.chunks_per_rank)
    if why:
        raise EstimateError(why)
    for n in (n for n in gpus if n % (tensor_parallel * pipeline_parallel) == 0):  # others: refused below, by flag
        why = not_run(layout.precision, layout.key, n, cluster.gpus_per_node, tensor_parallel, cluster.trainer,
                      pipeline_parallel, layout.schedule, layout.sequence_parallel)
        if why:
            raise EstimateError(f"--trainer {cluster.trainer}, --gpus {n}: {why}")
    return Point(cfg=cfg, n_params=model.n_params, key=layout.key, precision=layout.precision,
                 grad_reduce=cluster.reduce_dtype, trainer=cluster.trainer,
                 micro_batch=int(_positive("micro-batch", layout.micro_batch)), global_batch=layout.global_batch,
                 activation_checkpointing=layout.activation_checkpointing, tensor_parallel=tensor_parallel,
                 sequence_parallel=layout.sequence_parallel, pipeline_parallel=pipeline_parallel,
                 pipeline_schedule=layout.schedule, chunks_per_rank=layout.chunks_per_rank)


def _described_link(link: links.Link | None) -> dict | None:
    if link is None:
        return None
    return {"name": link.name, "bandwidth_gb_per_s": link.bandwidth_Bps / links.GB, "efficiency": link.efficiency,
            "achievable_gb_per_s": link.achievable_Bps / links.GB, "latency_us": link.latency_s * 1e6,
            "latency_model": "nccl" if link.fabric else "per call", "source": link.source}


def _scaling_assumptions(cluster: Cluster, machine: Machine, source: dict | None, priced) -> dict:
    """Every assumption estimate scaling prints, with whether it is a default."""
    efficiency = cluster.link_efficiency
    return {"mfu_without_communication": machine.mfu, "mfu_default": cluster.mfu is None and source is None,
            **({"mfu_source": source} if source else {}),
            "link_efficiency": efficiency if efficiency is not None else links.DEFAULT_EFFICIENCY,
            "link_efficiency_default": efficiency is None,
            "intra_node": _described_link(machine.intra), "inter_node": _described_link(machine.inter),
            "overlap_efficiency": machine.overlap_efficiency,
            "overlap_efficiency_default": cluster.overlap_efficiency is None,
            "overlap": _overlap_text(priced), "link_rule": LINK_RULE, "out_of_scope": OUT_OF_SCOPE,
            "collective_sizes": "nccl-tests' size: the whole buffer (an all-gather's output, a reduce-scatter's input); "
                                "seconds = calls x latency + bus factor x bytes / achievable bus bandwidth"}
