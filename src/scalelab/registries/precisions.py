"""The training precisions, one record each: what a precision computes in, how many bytes its
values take, whether it scales the loss, which datasheet peak it is measured against, and
how the report and ``scalelab estimate`` show it. The autocast policy
(scalelab.run.precision), the formulas (scalelab.formulas), the peak table
(scalelab.registries.hardware), the estimates and the report's order and colours read these records;
nothing else lists the precisions.

Keyed by the sweep's ``precision``. Adding one (say ``mxfp8``): a record here, its name in
the config schema's ``sweep.precision`` enum (tests/*/test_accounting.py checks the two agree),
and the code that implements it in scalelab.run.precision (a converter named by
``linears``, as torchao's float8 recipe is). A new datasheet column (``peak_key``) also
needs its figures in scalelab.registries.hardware and its key under the schema's ``train.peak_tflops``.

No torch here: the report and the estimates import this module without it; dtypes are named
as ``torch`` attributes (``bfloat16``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str
    """Key in the sweep (``precision``), in run ids and in the result tables."""
    doc: str
    """What it runs, in a few words (config docs, the axis registry)."""
    autocast: str | None
    """torch dtype autocast runs the forward and backward in; None: no autocast (plain fp32)."""
    compute: str
    """torch dtype of the matmuls and activations; the dtype of the matmul timed as a CPU's peak."""
    activation_bytes: int
    """Bytes per activation value at the compute width (Korthikanti et al.'s terms scale with it)."""
    loss_scaling: bool
    """Dynamic loss scaling (ShardedGradScaler): fp16's narrow exponent underflows gradients."""
    paper_state_bytes: tuple[int, int, int]
    """Bytes per parameter of (parameters, gradients, optimizer state) in the ZeRO paper's
    convention: 4 + 4 + 8 in fp32, 2 + 2 + 12 in mixed precision. PyTorch's AMP holds
    4 + 4 + 8 in every precision (scalelab.formulas.model_state)."""
    peak_key: str
    """Column of scalelab.registries.hardware's datasheet table (and key of ``train.peak_tflops``) a run's MFU divides by."""
    tf32_peak_key: str | None = None
    """The column instead when ``train.tf32`` is on (fp32 matmuls on tensor cores)."""
    matmul: str | None = None
    """The precision whose matmuls really run where this one is emulated (on a CPU, or with
    ``train.fp8_emulate``): fp8's float8 casts are emulated and its matmuls run in bf16. None: itself."""
    linears: str | None = None
    """Function in scalelab.run.precision that converts the blocks' linear layers
    (returns how many); None: the model stays as built."""
    twin: str | None = None
    """The precision the report sets its runs beside (speed-up, MFU on both peaks): fp8 against bf16."""
    estimate_memory: bool = True
    """``scalelab estimate memory/fit/advise`` list it: it has a memory convention of its own
    (fp8 holds bf16's fp32 model state, and the ZeRO paper has no fp8 convention)."""

    @property
    def matmul_precision(self) -> str:
        """The precision a CPU's matmuls run for this one (``matmul``, else itself)."""
        return self.matmul or self.name


# In the report's order: figures, legends and tables list precisions so, and each keeps its
# colour (the palette entry at its position) in every figure.
PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", "plain fp32", autocast=None, compute="float32", activation_bytes=4, loss_scaling=False,
              paper_state_bytes=(4, 4, 8), peak_key="fp32", tf32_peak_key="tf32"),
    Precision("fp16", "autocast + dynamic loss scaling", autocast="float16", compute="float16", activation_bytes=2,
              loss_scaling=True, paper_state_bytes=(2, 2, 12), peak_key="fp16"),
    Precision("bf16", "autocast", autocast="bfloat16", compute="bfloat16", activation_bytes=2, loss_scaling=False,
              paper_state_bytes=(2, 2, 12), peak_key="bf16"),
    # torchao's float8 recipe: the blocks' linears become Float8Linear, the rest runs under bf16 autocast.
    Precision("fp8", "torchao float8 linears", autocast="bfloat16", compute="bfloat16", activation_bytes=2,
              loss_scaling=False, paper_state_bytes=(2, 2, 12), peak_key="fp8", matmul="bf16",
              linears="convert_to_fp8", twin="bf16", estimate_memory=False),
)}
PRECISION_NAMES = tuple(PRECISIONS)
"""Every precision, in the report's order (fp32 first)."""
PEAK_KEYS = tuple(dict.fromkeys(k for p in PRECISIONS.values() for k in (p.peak_key, p.tf32_peak_key) if k))
"""Columns of the datasheet peak table: fp32, tf32, fp16, bf16, fp8."""
AUTOCAST = tuple(p.name for p in PRECISIONS.values() if p.autocast)
"""Precisions that run under autocast (fp32 residual stream, 16-bit copies of weights)."""
ESTIMATE_MEMORY = tuple(p.name for p in PRECISIONS.values() if p.estimate_memory)
"""What ``scalelab estimate memory/fit/advise`` list."""


def precision(name: str) -> Precision:
    """The record of a precision; ValueError naming the known ones."""
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISION_NAMES)}, got {name!r}")
    return PRECISIONS[name]


def peak_key(name: str, tf32: bool = False) -> str:
    """The datasheet column a precision (or a column named directly, such as tf32) is measured
    against; ValueError for anything else."""
    if name in PRECISIONS:
        record = PRECISIONS[name]
        return record.tf32_peak_key if tf32 and record.tf32_peak_key else record.peak_key
    if name in PEAK_KEYS:
        return name
    raise ValueError(f"unknown precision {name!r}; known: {', '.join(dict.fromkeys((*PRECISION_NAMES, *PEAK_KEYS)))}")
