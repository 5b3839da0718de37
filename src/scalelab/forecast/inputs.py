"""What a forecast command's flags take, read once for ``scalelab estimate`` and ``scalelab plan``: counts as
the output prints them (1.3B, 350M), numbers that must be positive or finite (argparse's types: a bad value
is one line naming the flag, exit status 2, before anything is computed), and the model, from a preset, its
shape or a config file (scalelab.forecast.model_input); and the typed inputs of `estimate scaling` and `plan`
(ModelChoice, Cluster, Layout, PlanAsk), each built once from the command line at the command's edge (``*_from_args``)
so that the computations take values, not the argparse namespace, and a caller that is not a command line (the
published validation's plan check) passes them directly.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from scalelab.config import ModelConfig
from scalelab.registries.strategies import TRAINERS

UNITS = {"GiB": 2 ** 30, "GB": 1e9}
"""Memory units the forecasts print and take: GiB (2^30 bytes) and GB (10^9)."""


class EstimateError(ValueError):
    """A forecast's input it cannot answer for: one line naming the flag or key."""


RESERVE = {"fixed_gib": 2.0, "share": 0.05,
           "source": "scalelab's default, not yet measured on a GPU: the CUDA context and the libraries' workspaces "
                     "(about 1 GiB), NCCL's buffers (NCCL_BUFFSIZE 4 MiB per channel and peer: up to about 1 GiB at "
                     "scale), and 5% of the device for the caching allocator's fragmentation; --reserve-gib sets it"}
"""Device memory the predicted peak does not count: reserve = fixed_gib + share x the GPU's memory."""


def memory_reserve_bytes(memory_bytes: float, reserve_gib: float | None) -> float:
    """Device memory a prediction does not count (the CUDA context, NCCL's buffers, fragmentation):
    --reserve-gib, else RESERVE's default (the one advise and scalelab plan share)."""
    if reserve_gib is not None:
        if reserve_gib * UNITS["GiB"] >= memory_bytes:
            raise EstimateError(f"--reserve-gib {reserve_gib:g} leaves nothing of the GPU's {memory_bytes / UNITS['GiB']:g} GiB")
        return reserve_gib * UNITS["GiB"]
    return RESERVE["fixed_gib"] * UNITS["GiB"] + RESERVE["share"] * memory_bytes


COUNT_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
"""What the output writes counts with (_human): 1.3B parameters, 2M tokens/s; counts are read so too."""


def count(text: str) -> float:
    """A count as the output prints it (1B, 20B, 350M, 1.3B, 2K, 1T; any case) or as a number
    (7.5e9): argparse's type for parameters, tokens and throughputs."""
    text = text.strip()
    scale = COUNT_SUFFIXES.get(text[-1:].upper())
    try:
        return float(text[:-1]) * scale if scale else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count: write e.g. 1.3B, 350M, 20K, 1T or 7.5e9") from None


def whole_count(text: str) -> int:
    """A count of whole things (GPUs, ranks, tokens of a vocabulary), written as count() reads."""
    value = count(text)
    if not (math.isfinite(value) and value.is_integer()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def positive_count(text: str) -> float:
    """A count that must be finite and above zero (tokens to train, a throughput)."""
    value = count(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite count above 0, e.g. 300B or 1T")
    return value


def positive_whole(text: str) -> int:
    """A whole count of at least 1 (GPUs, sequences, layers, a tensor-parallel degree)."""
    value = whole_count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return value


def finite_number(text: str) -> float:
    """A number that is finite (inf and nan are refused where they would print 'inf days')."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return value


def positive_number(text: str) -> float:
    """A finite number above 0 (days, a memory size)."""
    value = finite_number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return value


def non_negative(text: str) -> float:
    """A finite number of at least 0 (a memory reserve in GiB)."""
    value = finite_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def positive(name: str, value, allow_zero: bool = False):
    """``value`` where it is a finite positive number (or zero where allowed), else an EstimateError naming --name."""
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise EstimateError(f"--{name} must be a positive number, got {value:g}")
    return value


@dataclass(frozen=True)
class ModelChoice:
    """The model a command answers about: its parameter count, its shape where given, and how the answer names it."""
    n_params: int
    cfg: ModelConfig | None
    named: dict
    """model_input.described's keys: the preset's or config's name and family, where one was given."""


@dataclass(frozen=True)
class Cluster:
    """The GPUs, their links, the assumed efficiencies and the trainer priced (cluster_flags, trainer_flag)."""
    gpu: str
    gpus_per_node: int = 8
    intra_node: str | None = None
    inter_node: str | None = None
    link_efficiency: float | None = None
    overlap_efficiency: float | None = None
    mfu: float | None = None
    mfu_from: str | None = None
    trainer: str = "scalelab"
    grad_reduce: str | None = None
    """--grad-reduce as given; None: the trainer's default (reduce_dtype)."""

    @property
    def reduce_dtype(self) -> str:
        """The dtype gradients are reduced in: as given, else the trainer's (a distributed optimizer's compute dtype,
        fp32 for scalelab's own strategies)."""
        return self.grad_reduce or TRAINERS[self.trainer].grad_reduce


@dataclass(frozen=True)
class Layout:
    """One training configuration `estimate scaling` prices at every count (its strategy and levers)."""
    key: int | str
    """The strategy record's key: a ZeRO stage, or "hybrid"."""
    precision: str = "bf16"
    micro_batch: int = 1
    global_batch: int | None = None
    activation_checkpointing: bool = False
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    pipeline_parallel: int = 1
    schedule: str = "1f1b"
    chunks_per_rank: int | None = None
    """An interleaved schedule's chunks per rank as the trainer runs them; None: the schedule's own (2)."""


@dataclass(frozen=True)
class PlanAsk:
    """What `scalelab plan` searches: the count, the batch and tokens, and the restrictions given (None: the defaults)."""
    gpus: int
    global_batch: int
    tokens: float
    precisions: list[str] | None = None
    reserve_gib: float | None = None
    tensor_parallel: list[int] | None = None
    pipeline_parallel: list[int] | None = None
    schedules: list[str] | None = None


def cluster_from_args(args) -> Cluster:
    return Cluster(gpu=args.gpu, gpus_per_node=args.gpus_per_node, intra_node=args.intra_node,
                   inter_node=args.inter_node, link_efficiency=args.link_efficiency,
                   overlap_efficiency=args.overlap_efficiency, mfu=args.mfu, mfu_from=args.mfu_from,
                   trainer=getattr(args, "trainer", "scalelab"), grad_reduce=getattr(args, "grad_reduce", None))


def layout_from_args(args) -> Layout:
    """estimate scaling's strategy and lever flags as a Layout (the counts checked where they are used)."""
    from scalelab.formulas.pipeline import DEFAULT_SCHEDULE
    from scalelab.registries.strategies import HYBRID_KEY

    return Layout(key=HYBRID_KEY if args.zero_stage == HYBRID_KEY else int(args.zero_stage), precision=args.precision,
                  micro_batch=args.micro_batch, global_batch=getattr(args, "global_batch", None),
                  activation_checkpointing=bool(getattr(args, "activation_checkpointing", False)),
                  tensor_parallel=getattr(args, "tensor_parallel", 1),
                  sequence_parallel=bool(getattr(args, "sequence_parallel", False)),
                  pipeline_parallel=getattr(args, "pipeline_parallel", 1),
                  schedule=getattr(args, "schedule", DEFAULT_SCHEDULE),
                  chunks_per_rank=getattr(args, "chunks_per_rank", None))


def plan_ask_from_args(args) -> PlanAsk:
    return PlanAsk(gpus=int(args.gpus), global_batch=args.global_batch, tokens=float(args.tokens),
                   precisions=args.precision, reserve_gib=args.reserve_gib,
                   tensor_parallel=getattr(args, "tensor_parallel", None),
                   pipeline_parallel=getattr(args, "pipeline_parallel", None), schedules=getattr(args, "schedule", None))
