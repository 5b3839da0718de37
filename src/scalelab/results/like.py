"""Like with like: which runs a comparison may set against each other, defined once.

Every comparison the analysis draws holds everything fixed but the axes it is about. A scaling
efficiency runs over world sizes; the |Δloss| table over ZeRO stages; the fp32 twin over
precisions; the best configuration over everything a user chooses (precision, stage, levers) at one
world size; a noise pool over the points of one sweep. What it holds fixed is *the like*:

* the **model**: what a token costs and what it learns. The row's identity columns (``MODEL``):
  the model axis's name, its family and module, its shape, sequence length and vocabulary. Two
  rows of one model name with another shape (results copied together) are two models;
* the **main axes** it is not about (precision, ZeRO stage, world size);
* every **lever** (scalelab.planning.sweep.LEVER_AXES: micro-batch, activation checkpointing, offload,
  buckets, compile, LoRA, gradient reductions, replicas): each changes what a step costs.
  Levers at their default compare as one value (a DDP bucket of 25 MiB and FSDP2's none);
  ``micro_batch`` by the value the sweep asked for (the run id's ``-mbN``; none for the whole
  per-rank batch), not the size it resolved to at a world size;
* never the repeat: repeats of a point are the same point.

Some levers exist only at some values of a main axis (``BOUND``): hybrid sharding's replicas at
world sizes they divide and at stage 3, offload at stage 3, gradient reductions in the compute dtype
in 16-bit runs. A comparison over that axis goes over the lever too: its reference is the run
without it (an HSDP run's single-rank baseline is stage 3's world-size-1 run; a 16-bit reduction's
fp32 twin reduces in fp32).

``like_key(runs, over)`` gives each row one string naming its like; rows with equal keys compare.
``OVER_*`` name the comparisons' axes, so that each is written here and nowhere else.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd

from scalelab.config import MODEL_SHAPE_KEYS
from scalelab.planning.sweep import AXIS, BASE_MODEL, LEVER_AXES
from scalelab.registries.families import OWN_KEYS

MODEL = ("model", "model_family", "model_module", *MODEL_SHAPE_KEYS, *OWN_KEYS, "seq_len", "vocab_size", "tie_embeddings")
"""The model's identity as the rows give it: name (the model axis), family, module, shape, sequence
length, vocabulary. A run's tokens cost what these say."""
MAIN = ("precision", "zero_stage", "world_size")
"""The sweep's main axes (the model is held through MODEL)."""
BOUND = {"zero_stage": ("replicas", "cpu_offload"), "world_size": ("replicas",), "precision": ("grad_reduce",)}
"""Levers that exist at some values of a main axis only: a comparison over the axis goes over them."""
HELD = (*MAIN, *LEVER_AXES)
"""What a like holds besides the model, unless a comparison goes over it."""

OVER_WORLD_SIZE = ("world_size",)
"""Scaling efficiency: tokens/s at N over N x the world-size-1 median of the same model, precision, stage and levers."""
OVER_STAGE = ("zero_stage",)
"""|Δloss| against stage 0, fp32 parity (with OVER_WORLD_SIZE), stage ratios."""
OVER_PRECISION = ("precision",)
"""The fp32 twin (loss), precision speed ratios."""
OVER_CONFIGURATION = ("precision", "zero_stage", *LEVER_AXES)
"""The best configuration: every choice ranked against the others at one world size, within one model."""
OVER_POINTS = HELD
"""A noise pool, compare's noise: every point of one model (the model alone is held)."""

READS = ("run_id", "status", *MAIN, *LEVER_AXES, "accumulation_steps", *MODEL)
"""The columns like_key reads where a frame has them (collection selects them from its table)."""
_SEP = "\x1f"
_MB_PART = r"(?:^|-)mb(\d+)(?=-|$)"


def _one(v) -> str:
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v)).lower()
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def _text(values: pd.Series) -> pd.Series:
    """Values as text, one spelling per value (2, 2.0 and an Int32 2 read '2'); null reads ''.
    Each distinct value is spelled once (a 1,000-run table holds a few)."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    spelled = np.array([_one(u) for u in uniques] + [""], dtype=object)
    return pd.Series(spelled[codes], index=values.index, dtype=object)


def _lever_values(runs: pd.DataFrame, lever: str) -> pd.Series:
    """A lever's value per row as the like holds it: '' at its default (each axis's own rule)."""
    if lever == "micro_batch":
        # the value the sweep asked for, from the run id's part (scalelab.planning.sweep: a model name never reads as one)
        if "run_id" in runs:
            asked = runs["run_id"].astype(str).str.extract(_MB_PART, expand=False)
            return asked.fillna("").astype(object)
        if "accumulation_steps" not in runs or lever not in runs:
            return pd.Series("", index=runs.index, dtype=object)
    elif lever not in runs:
        return pd.Series("", index=runs.index, dtype=object)
    try:
        default = AXIS[lever].is_default(runs).fillna(True).astype(bool)
    except KeyError:  # a column its rule reads is missing: no row is known to be away from its default
        return pd.Series("", index=runs.index, dtype=object)
    return _text(runs[lever]).where(~default.to_numpy(), "")


def _model_values(runs: pd.DataFrame) -> pd.DataFrame:
    """MODEL as text per row. The model axis defaults to base (tables before it); a row without a
    shape (a missing or corrupt run: its identity only) takes its model name's shape, where one."""
    out = pd.DataFrame({c: _text(runs[c]) if c in runs else pd.Series("", index=runs.index, dtype=object) for c in MODEL},
                       index=runs.index)
    out["model"] = out["model"].replace("", BASE_MODEL)
    shape = list(MODEL[1:])
    blank = (out[shape] == "").all(axis=1)
    if blank.any() and not blank.all():
        known = out[~blank].drop_duplicates()
        known = known[~known["model"].duplicated(keep=False)].set_index("model")[shape]  # one shape per name only
        fill = known.reindex(out.loc[blank, "model"])
        fill.index = out.index[blank]
        out.loc[blank, shape] = fill.fillna("").to_numpy()
    # a row with a shape but no family was written before families: gpt2 (as scalelab.planning.result_tables.run_row reads it)
    shaped = (out[shape] != "").any(axis=1)
    out.loc[shaped & (out["model_family"] == ""), "model_family"] = "gpt2"
    return out


def like_frame(runs: pd.DataFrame, over: Iterable[str] = ()) -> pd.DataFrame:
    """One text column per key a comparison over ``over`` holds (MODEL, then the main axes and
    levers it is not about); index: the rows'. Columns a frame lacks hold one value."""
    over = set(over)
    unknown = over - set(HELD) - {"repeat"}
    if unknown:
        raise ValueError(f"not an axis a comparison runs over: {', '.join(sorted(unknown))} (axes: {', '.join(HELD)})")
    dropped = over | {lever for axis in over for lever in BOUND.get(axis, ())}
    frame = _model_values(runs)
    for name in HELD:
        if name in dropped:
            continue
        frame[name] = _lever_values(runs, name) if name in LEVER_AXES else (
            _text(runs[name]) if name in runs else pd.Series("", index=runs.index, dtype=object))
    return frame


def like_key(runs: pd.DataFrame, over: Iterable[str] = ()) -> pd.Series:
    """Per row, one string naming its like for a comparison over ``over``: equal keys compare."""
    frame = like_frame(runs, over)
    columns = iter(frame.columns)
    key = frame[next(columns)].astype(str)
    for column in columns:
        key = key + _SEP + frame[column].astype(str)
    return key


def model_key(runs: pd.DataFrame) -> pd.Series:
    """Per row, its model's key (what a noise pool or compare's pairing holds)."""
    return like_key(runs, OVER_POINTS)


def model_labels(runs: pd.DataFrame) -> pd.Series:
    """Per row, its model as a reader names it: the model axis's name; where one name holds several
    models (results of another shape copied together), the name with what sets them apart."""
    values = _model_values(runs)
    labels = values["model"].astype(object).copy()
    for name, group in values.groupby("model", sort=False):
        distinct = group.drop_duplicates()
        if len(distinct) < 2:
            continue
        differ = [c for c in MODEL[1:] if distinct[c].nunique() > 1]
        text = [", ".join(f"{c} {v or '-'}" for c, v in zip(differ, row, strict=True)) for row in group[differ].itertuples(index=False)]
        labels.loc[group.index] = [f"{name} ({t})" for t in text]
    return labels


def _ordered(labels: pd.Series) -> list[str]:
    return sorted(labels.unique().tolist(), key=lambda label: (not str(label).startswith(BASE_MODEL), str(label)))


def models(runs: pd.DataFrame) -> list[str]:
    """The models' labels, base first, then by name."""
    return _ordered(model_labels(runs))


def several_models(runs: pd.DataFrame) -> bool:
    return len(runs) > 0 and model_labels(runs).nunique() > 1


def by_model(runs: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    """(label, its rows) per model, in ``models`` order."""
    labels = model_labels(runs)
    for label in _ordered(labels):
        yield label, runs[(labels == label).to_numpy()]


def lever_text(runs: pd.DataFrame) -> pd.Series:
    """Per row, its levers away from their defaults ('activation_checkpointing true, lora_rank 4';
    '' when every lever is at its default): what a table shows beside the model."""
    text = np.full(len(runs), "", dtype=object)
    for lever in LEVER_AXES:
        value = _lever_values(runs, lever).to_numpy(dtype=object)
        away = value != ""
        part = np.where(away, lever + " " + value.astype(str), "")
        text = np.where(away & (text != ""), text + ", " + part, np.where(away, part, text))
    return pd.Series(text, index=runs.index, dtype=object)

def scaling_efficiency(runs: pd.DataFrame) -> pd.Series:
    """tokens/s at N over N x tokens/s at world size 1 of its like (scalelab.results.like: the same
    model, precision, stage and levers; never another model's, whose tokens cost otherwise); the
    world-size-1 figure is the median of its ok runs (repeats: scalelab.results.noise), so one noisy
    baseline run does not move every efficiency of its row. NaN without such a run."""
    key = like_key(runs, OVER_WORLD_SIZE)
    tokens_per_s = pd.to_numeric(runs["tokens_per_s"], errors="coerce").astype(float)
    single = ((runs["status"] == "ok") & tokens_per_s.notna() & (runs["world_size"] == 1)).to_numpy()
    base = tokens_per_s[single].groupby(key[single].to_numpy()).median()
    ref = key.map(base).to_numpy(dtype=float)
    return pd.Series(tokens_per_s.to_numpy() / (runs["world_size"].to_numpy(dtype=float) * ref), index=runs.index)
