"""What a forecast command's flags take, read once for ``scalelab estimate`` and ``scalelab plan``: counts as
the output prints them (1.3B, 350M), numbers that must be positive or finite (argparse's types: a bad value
is one line naming the flag, exit status 2, before anything is computed), and the model, from a preset, its
shape or a config file (scalelab.forecast.model_input).
"""
from __future__ import annotations

import argparse
import math

UNITS = {"GiB": 2 ** 30, "GB": 1e9}
"""Memory units the forecasts print and take: GiB (2^30 bytes) and GB (10^9)."""


class EstimateError(ValueError):
    """A forecast's input it cannot answer for: one line naming the flag or key."""


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
