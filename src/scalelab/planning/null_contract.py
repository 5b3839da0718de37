"""The null contract of the result columns: when a column holds a value (``Filled``: the rows that must hold one,
and the only rows that may), and the conditions the column table (scalelab.planning.columns) names, by status, device,
precision, lever and model family. Its text is the ``filled`` of each column in the data dictionary."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scalelab.registries.families import FAMILIES
from scalelab.registries.precisions import PRECISIONS
from scalelab.registries.strategies import strategy

Row = Callable[[dict], bool]


@dataclass(frozen=True)
class Filled:
    """When a column holds a value. ``rows``: the rows that must hold one (None: no row can be
    named in advance, e.g. a teardown warning); ``at_most``: the only rows that may (None: any)."""
    text: str
    rows: Row | None
    at_most: Row | None = None

    def __and__(self, other: Filled) -> Filled:
        """Both conditions: "status ok" & "precision fp16" -> filled exactly for fp16 runs that ended ok."""
        def both(a: Row | None, b: Row | None) -> Row | None:
            return None if a is None or b is None else (lambda row: a(row) and b(row))
        return Filled(f"{self.text}, {other.text}", both(self.rows, other.rows), both(self.at_most, other.at_most))


def exactly(text: str, rows: Row) -> Filled:
    """Filled in these rows and null in every other."""
    return Filled(text, rows, rows)


def is_ok(row: dict) -> bool:
    return row["status"] == "ok"


def has_value(name: str) -> Row:
    return lambda row: row.get(name) is not None


ALWAYS = Filled("always", lambda row: True)
OK = exactly("status ok", is_ok)
NOT_OK = exactly("status other than ok", lambda row: not is_ok(row))
# The launcher counts the records whenever it started the ranks: that count marks a launch (a
# skipped, a predicted_oom or a run stopped before launch, e.g. on a changed tokens file, has none).
LAUNCHED = exactly("the ranks were started (every status but skipped and predicted_oom, unless stopped before launch)",
                    lambda row: is_ok(row) or row.get("completed_steps") is not None)
GPU = exactly("a GPU run", lambda row: row.get("device_type") == "cuda")
GPU_STATE = Filled("GPU runs where nvidia-smi answered (null in rows older than schema 8)", None,
                   lambda row: row.get("device_type") == "cuda")
CPU = exactly("a CPU run", lambda row: row.get("device_type") == "cpu")
_SCALED = tuple(p.name for p in PRECISIONS.values() if p.loss_scaling)
_CONVERTED = tuple(p.name for p in PRECISIONS.values() if p.linears)
LOSS_SCALER = exactly(f"a loss scaler (precision {' or '.join(_SCALED)})", lambda row: row.get("precision") in _SCALED)
LINEARS_CONVERTED = exactly(f"converted linears (precision {' or '.join(_CONVERTED)})",
                             lambda row: row.get("precision") in _CONVERTED)
COMPILED = exactly("compile lever on", lambda row: bool(row.get("compile")))
LORA = exactly("lora_rank set", has_value("lora_rank"))
NO_PIPELINE = exactly("no pipeline parallelism", lambda row: (row.get("pipeline_parallel") or 1) == 1)
PIPELINE_OK = exactly("status ok, pipeline_parallel > 1", lambda row: is_ok(row) and (row.get("pipeline_parallel") or 1) > 1)


def model_parallel_ranks(row: dict) -> int:
    """Ranks of one data-parallel rank's model: its tensor-parallel degree x its pipeline stages."""
    return (row.get("tensor_parallel") or 1) * (row.get("pipeline_parallel") or 1)


BUCKETS = exactly("a strategy with DDP buckets (ZeRO stages 0 and 1), no tensor parallelism, no pipeline but ZeRO-1's",
                  lambda row: strategy(row["zero_stage"]).ddp_buckets_apply(row.get("tensor_parallel") or 1,
                                                                            row.get("pipeline_parallel") or 1))
DDP_WRAPS = exactly("DDP wraps the model (stage 1; stage 0 on more than one data-parallel rank; no tensor parallelism; "
                    "no pipeline but ZeRO-1's)",
                    lambda row: strategy(row["zero_stage"]).ddp_wraps(row["world_size"] // model_parallel_ranks(row),
                                                                      row.get("tensor_parallel") or 1,
                                                                      row.get("pipeline_parallel") or 1))


def is_custom(row: dict) -> bool:
    return row.get("model_family") == "custom"


def family_has(key: str):
    """Set exactly where the row's family takes ``key`` (scalelab.registries.families: its own keys)."""
    owners = [f.name for f in FAMILIES.values() if key in f.own_keys]
    return exactly(f"model_family {' or '.join(owners)}", lambda row: row.get("model_family") in owners)


FORMULA = exactly("a built-in model family (null for a custom module: no activation formula)",
                   lambda row: not is_custom(row))



def sometimes(text: str, at_most: Filled | None = None) -> Filled:
    """Filled in rows no status or lever names in advance (text says which); null outside at_most."""
    return Filled(f"{at_most.text}, {text}" if at_most else text, None, at_most.at_most if at_most else None)


FORECAST_TIMED = sometimes("planning.top_k set: the points the forecast timed (not a user's module, LoRA or offload)")
