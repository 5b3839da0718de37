"""GPU products and their dense datasheet peaks, by exact product.

Conventions

* **Dense only.** Every figure is the peak without 2:4 structured sparsity. NVIDIA's
  Hopper and Blackwell datasheets (and the L4's) print only the sparse figure for the
  tensor-core precisions, marked with an asterisk ("* With sparsity"); those are halved
  here. Where a datasheet prints both ("156 TF | 312 TF*"), the dense one is taken as
  printed.
* **Keys** (``scalelab.registries.precisions.PEAK_KEYS``; each precision record names its column).
  ``fp32``: plain fp32 on the CUDA cores (no tensor cores). ``tf32``: fp32
  inputs on tensor cores, the key a run uses when precision is fp32 and TF32 is on.
  ``fp16`` / ``bf16``: tensor-core matmuls with fp32 accumulation. ``fp8``: the
  datasheet's "FP8 Tensor Core" figure (E4M3/E5M2 inputs), present only on products
  with fp8 tensor cores (Ada, Hopper, Blackwell). A product lacks a key when its
  datasheet gives no figure for it (V100 has neither tf32 nor bf16; Ampere has no fp8):
  such a run gets MFU = NaN with the reason, never a borrowed figure.
* **Which product.** CUDA device names (``torch.cuda.get_device_name()``, the same
  string as ``nvidia-smi --query-gpu=name``) are matched exactly after normalising case
  and whitespace and dropping a leading "NVIDIA " or "Tesla " (older drivers report
  "A100-SXM4-40GB" without the brand, and the "Tesla" brand was dropped for Ampere).
  Never by substring: "NVIDIA H100 NVL" contains "H100", "NVIDIA GB200" contains
  "B200", "NVIDIA L40S" contains "L4", and each of those is a different part. A name
  not in the table (a MIG slice such as "NVIDIA A100-SXM4-40GB MIG 1g.5gb", a bare
  "NVIDIA H100", an H800) resolves to nothing: MFU is NaN unless the config gives the
  peak (``train.peak_tflops``).
* **Memory** is the datasheet's nominal capacity. NVIDIA writes "GB" but counts
  2^30-byte units of installed memory (an A100 80GB reports 81920 MiB); CUDA reports a
  few percent less as the total (an H100 80GB HBM3 81559 MiB, an L40S 46068 MiB).

Sources (figures in TFLOP/s as printed, * = with sparsity):

* A100 40GB/80GB, PCIe and SXM: NVIDIA A100 Tensor Core GPU datasheet
  (nvidia-a100-datasheet-us-nvidia-1758950-r4-web): FP32 19.5, TF32 156 | 312*,
  BF16 and FP16 312 | 624*. The same figures for all four boards.
* H100 SXM / PCIe / NVL: NVIDIA H100 Tensor Core GPU datasheet: FP32 67 / 51 / 60,
  TF32 989* / 756* / 835*, BF16 and FP16 1,979* / 1,513* / 1,671*, FP8 3,958* /
  3,026* / 3,341*; memory 80 / 80 / 94 GB.
* H200 SXM / NVL: NVIDIA H200 Tensor Core GPU datasheet: FP32 67 / 60, TF32 989* / 835*,
  BF16 and FP16 1,979* / 1,671*, FP8 3,958* / 3,341*; memory 141 GB.
* GH200: NVIDIA GH200 Grace Hopper Superchip datasheet: the Hopper GPU at the H100 SXM
  figures (FP32 67, TF32 989*, BF16 and FP16 1,979*, FP8 3,958*); 96 GB HBM3 or 144 GB
  HBM3e.
* L40S: NVIDIA L40S datasheet: FP32 91.6, TF32 183 | 366*, BF16 and FP16 362.05 | 733*,
  FP8 733 | 1,466*; 48 GB.
* L4: NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3, TF32 120*, BF16 and FP16 242*,
  FP8 485*; 24 GB.
* A10: NVIDIA A10 Tensor Core GPU datasheet: FP32 31.2, TF32 62.5 | 125*, BF16 and FP16
  125 | 250*; 24 GB.
* V100 SXM2 / PCIe: NVIDIA V100 Tensor Core GPU datasheet: single precision 15.7 / 14,
  "Tensor Performance" 125 / 112 (FP16 inputs, FP32 accumulate; Volta has no TF32, BF16
  or FP8 tensor cores); 16 or 32 GB.
* B200: NVIDIA HGX B200 specifications, per GPU: FP32 75, TF32 2.2 PF*, BF16 and FP16
  4.5 PF*, FP8 9 PF*; 180 GB.
"""
from __future__ import annotations

import math
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from scalelab.registries.precisions import PEAK_KEYS, peak_key

TERA = 1e12


@dataclass(frozen=True)
class GpuProduct:
    """One GPU product: how CUDA names it, its memory, its dense peaks (FLOP/s), its source."""

    name: str
    """Display name, e.g. "H100 SXM" (accepted by gpu_by_name, case-insensitively)."""
    device_names: tuple[str, ...]
    """CUDA device names of this product, exact (compared after normalise())."""
    memory_gib: float
    source: str
    """The datasheet the figures come from."""
    figures: tuple[tuple[str, float], ...] = ()
    """(peak key, dense FLOP/s) for each key of scalelab.registries.precisions.PEAK_KEYS the datasheet gives."""
    aliases: tuple[str, ...] = ()
    """Short names gpu_by_name accepts besides the display name."""

    def __post_init__(self):
        unknown = [k for k, _ in self.figures if k not in PEAK_KEYS]
        if unknown:
            raise ValueError(f"{self.name}: unknown precision key {unknown[0]!r}; known: {', '.join(PEAK_KEYS)}")

    def peak(self, key: str) -> float | None:
        """Dense peak FLOP/s for a precision key, or None when the datasheet gives none."""
        if key not in PEAK_KEYS:
            raise ValueError(f"unknown precision key {key!r}; known: {', '.join(PEAK_KEYS)}")
        return self.peaks.get(key)

    @property
    def peaks(self) -> dict[str, float]:
        """The precision keys this product has a figure for, with the figure (in PEAK_KEYS order)."""
        given = dict(self.figures)
        return {k: given[k] for k in PEAK_KEYS if k in given}


def _gpu(name: str, device_names: tuple[str, ...], memory_gib: float, source: str, aliases: tuple[str, ...] = (),
         **peaks: float) -> GpuProduct:
    """A product with its peaks given by key (fp32=..., bf16=...), as the datasheets list them."""
    return GpuProduct(name, device_names, memory_gib, source, tuple(peaks.items()), aliases)


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (dense figures as printed)"
_A100_PEAKS = dict(fp32=19.5 * TERA, tf32=156 * TERA, fp16=312 * TERA, bf16=312 * TERA)
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (starred sparse figures halved)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (starred sparse figures halved)"
_GH200 = "NVIDIA GH200 Grace Hopper Superchip datasheet (starred sparse figures halved)"
_V100 = "NVIDIA V100 Tensor Core GPU datasheet (Tensor Performance = FP16 tensor cores)"
# Hopper at SXM clocks (H100 SXM, H200 SXM, GH200): 67, 989*/2, 1,979*/2, 3,958*/2.
_HOPPER_SXM = dict(fp32=67 * TERA, tf32=494.5 * TERA, fp16=989.5 * TERA, bf16=989.5 * TERA, fp8=1979 * TERA)
# Hopper NVL boards (H100 NVL, H200 NVL): 60, 835*/2, 1,671*/2, 3,341*/2.
_HOPPER_NVL = dict(fp32=60 * TERA, tf32=417.5 * TERA, fp16=835.5 * TERA, bf16=835.5 * TERA, fp8=1670.5 * TERA)

# Device names, and where each was seen (T = the NVIDIA driver's product table, README.md of
# NVIDIA/open-gpu-kernel-modules 560.31.02, the names nvidia-smi and CUDA report, with PCI ids):
#   NVIDIA A100-SXM4-40GB   T (20B0); Ultralytics log "CUDA:0 (NVIDIA A100-SXM4-40GB MIG 1g.10gb, ...)"
#   NVIDIA A100-SXM4-80GB   T (20B2); vLLM fused_moe config file names (device_name=NVIDIA_A100-SXM4-80GB)
#   NVIDIA A100-PCIE-40GB   T (20F1); `nvidia-smi -L` outputs in public READMEs (vLLM files spell it
#                           "A100-PCIe-40GB": matching ignores case)
#   NVIDIA A100 80GB PCIe   T (20B5); vLLM config file names
#   NVIDIA H100 80GB HBM3   T (2330, the SXM5 part); vLLM config file names
#   NVIDIA H100 PCIe        T (2331); nvidia-smi table in NordicHPC/sonar#247
#   NVIDIA H100 NVL         T (2321); `nvidia-smi --query-gpu=name` in akash-network/provider-configs#91,
#                           fastfetch-cli/fastfetch#1658
#   NVIDIA H200             T (2335); `nvidia-smi -q` Product Name in NVIDIA/mig-parted#120
#   NVIDIA H200 NVL         not in T (newer part); GPU column of public run logs (a vLLM start-up
#                           table, a Vast.ai host table) in the code index
#   NVIDIA GH200 480GB      T (2342 10DE 1809); torch collect_env in vllm-project/vllm#9630
#   NVIDIA GH200 120GB      T (2342 10DE 16EB / 1805: the same GPU device 2342, 96 GB HBM3)
#   NVIDIA GH200 144G HBM3e torch collect_env in vllm-project/vllm#18390; NVIDIA/mig-parted#139 (PCI 2348)
#   NVIDIA L40S             T (26B9)
#   NVIDIA L4               T (27B8)
#   NVIDIA A10              T (2236; the AWS part "NVIDIA A10G", 2237, is another product)
#   Tesla V100-SXM2-16GB    torch "_CudaDeviceProperties(name='Tesla V100-SXM2-16GB', ...)" in a public log
#   Tesla V100-SXM2-32GB    TensorFlow device log in biocore/mmvec#79
#   Tesla V100-PCIE-16GB    `nvidia-smi` device tables in public docs
#   Tesla V100-PCIE-32GB    torch collect_env output ("GPU 0: Tesla V100-PCIE-32GB") in a public file
#   NVIDIA B200             nvidia-smi in NVIDIA/TensorRT-LLM#10278; CUDA device query in pytorch/ao#4002
# Seen but left out (no sourced figures, or not one product): "NVIDIA H100" (T: 2339), "NVIDIA H800",
# "NVIDIA H20", "NVIDIA GB200", "NVIDIA B300 SXM6 AC", "NVIDIA A100-SXM-64GB", MIG slices.
PRODUCTS: tuple[GpuProduct, ...] = (
    _gpu("A100 SXM 40GB", ("NVIDIA A100-SXM4-40GB",), 40, _A100, **_A100_PEAKS,
         aliases=("A100 SXM4 40GB",)),
    _gpu("A100 SXM 80GB", ("NVIDIA A100-SXM4-80GB",), 80, _A100, **_A100_PEAKS,
         aliases=("A100", "A100 SXM", "A100 SXM4 80GB")),
    _gpu("A100 PCIe 40GB", ("NVIDIA A100-PCIE-40GB",), 40, _A100, **_A100_PEAKS),
    _gpu("A100 PCIe 80GB", ("NVIDIA A100 80GB PCIe",), 80, _A100, **_A100_PEAKS,
         aliases=("A100 PCIe",)),
    _gpu("H100 SXM", ("NVIDIA H100 80GB HBM3",), 80, _H100, **_HOPPER_SXM,
         aliases=("H100", "H100 SXM5")),
    _gpu("H100 PCIe", ("NVIDIA H100 PCIe",), 80, _H100,
         fp32=51 * TERA, tf32=378 * TERA, fp16=756.5 * TERA, bf16=756.5 * TERA, fp8=1513 * TERA),
    _gpu("H100 NVL", ("NVIDIA H100 NVL",), 94, _H100, **_HOPPER_NVL),
    _gpu("H200 SXM", ("NVIDIA H200",), 141, _H200, **_HOPPER_SXM, aliases=("H200",)),
    _gpu("H200 NVL", ("NVIDIA H200 NVL",), 141, _H200, **_HOPPER_NVL),
    _gpu("GH200 96GB", ("NVIDIA GH200 480GB", "NVIDIA GH200 120GB"), 96, _GH200, **_HOPPER_SXM,
         aliases=("GH200",)),
    _gpu("GH200 144GB", ("NVIDIA GH200 144G HBM3e",), 144, _GH200, **_HOPPER_SXM),
    _gpu("L40S", ("NVIDIA L40S",), 48, "NVIDIA L40S datasheet (dense figures as printed)",
         fp32=91.6 * TERA, tf32=183 * TERA, fp16=362.05 * TERA, bf16=362.05 * TERA, fp8=733 * TERA),
    _gpu("L4", ("NVIDIA L4",), 24, "NVIDIA L4 Tensor Core GPU datasheet (starred sparse figures halved)",
         fp32=30.3 * TERA, tf32=60 * TERA, fp16=121 * TERA, bf16=121 * TERA, fp8=242.5 * TERA),
    _gpu("A10", ("NVIDIA A10",), 24, "NVIDIA A10 Tensor Core GPU datasheet (dense figures as printed)",
         fp32=31.2 * TERA, tf32=62.5 * TERA, fp16=125 * TERA, bf16=125 * TERA),
    _gpu("V100 SXM2 16GB", ("Tesla V100-SXM2-16GB",), 16, _V100, fp32=15.7 * TERA, fp16=125 * TERA),
    _gpu("V100 SXM2 32GB", ("Tesla V100-SXM2-32GB",), 32, _V100, fp32=15.7 * TERA, fp16=125 * TERA,
         aliases=("V100", "V100 SXM2")),
    _gpu("V100 PCIe 16GB", ("Tesla V100-PCIE-16GB",), 16, _V100, fp32=14 * TERA, fp16=112 * TERA),
    _gpu("V100 PCIe 32GB", ("Tesla V100-PCIE-32GB",), 32, _V100, fp32=14 * TERA, fp16=112 * TERA,
         aliases=("V100 PCIe",)),
    _gpu("B200", ("NVIDIA B200",), 180, "NVIDIA HGX B200 specifications, per GPU (starred sparse figures halved)",
         fp32=75 * TERA, tf32=1100 * TERA, fp16=2250 * TERA, bf16=2250 * TERA, fp8=4500 * TERA),
)

_BRANDS = ("nvidia ", "tesla ")


def normalise(device_name: str) -> str:
    """Lower case, single spaces, no leading "NVIDIA " / "Tesla " brand: the key of a device name."""
    key = " ".join(device_name.split()).casefold()
    for brand in _BRANDS:
        if key.startswith(brand):
            return key[len(brand):]
    return key


def _cli_key(name: str) -> str:
    return " ".join(name.replace("-", " ").replace("_", " ").split()).casefold()


def _index(keys_of) -> dict[str, GpuProduct]:
    index: dict[str, GpuProduct] = {}
    for product in PRODUCTS:
        for key in keys_of(product):
            if index.setdefault(key, product) is not product:
                raise AssertionError(f"{key!r} names both {index[key].name} and {product.name}")
    return index


_BY_DEVICE = _index(lambda p: {normalise(n) for n in p.device_names})
_BY_NAME = _index(lambda p: {_cli_key(n) for n in (p.name, *p.aliases)})


def gpu_product(device_name: str) -> GpuProduct | None:
    """The exact product a CUDA device name denotes, or None when the table does not know it."""
    return _BY_DEVICE.get(normalise(device_name))


def known_names() -> list[str]:
    """Display names of every product, in table order."""
    return [p.name for p in PRODUCTS]


def gpu_by_name(name: str) -> GpuProduct:
    """Product for a CLI name (``scalelab estimate time --gpu ...``).

    Accepts display names ("H100 NVL"), short aliases and CUDA device names, ignoring case,
    hyphens and underscores. Bare "A100", "H100" and "H200" keep meaning the SXM parts (the
    A100 SXM 80GB; the 40GB board has the same peaks), as they did before the table knew
    the PCIe and NVL boards; "GH200" is the 96 GB HBM3 part and "V100" the SXM2 32GB.
    """
    product = _BY_NAME.get(_cli_key(name)) or gpu_product(name) or _as_written(name)
    if product is None:
        raise ValueError(f"unknown GPU type {name!r}; known: {', '.join(known_names())}")
    return product


_NOISE = {"nvidia", "tesla", "hbm2", "hbm2e", "hbm3", "hbm3e", "gpu"}
"""Words people write around a product's name that tell no two products apart."""


def _words(key: str) -> set[str]:
    return {re.sub(r"^sxm\d$", "sxm", w) for w in key.split()} - _NOISE


def _as_written(name: str) -> GpuProduct | None:
    """A product as people write it ("H100 80GB", "A100 40GB", "NVIDIA H100 SXM5 80GB"): its words (the
    form factor's generation dropped: SXM5 is SXM) within a product's name or aliases, its memory where
    given; of several, the one the bare name means (H100: the SXM part), else the SXM part; None when
    no product, or more than one, fits."""
    key = _cli_key(name)
    memory = re.search(r"\b(\d+)\s*gi?b\b", key)
    words = _words(re.sub(r"\b\d+\s*gi?b\b", " ", key))
    if not words:
        return None
    fits = [p for p in PRODUCTS if words <= set().union(*(_words(_cli_key(n)) for n in (p.name, *p.aliases)))
            and (memory is None or p.memory_gib == int(memory.group(1)))]
    bare = _BY_NAME.get(" ".join(sorted(words)))
    if bare in fits:
        return bare
    sxm = [p for p in fits if "sxm" in _words(_cli_key(p.name))]
    return fits[0] if len(fits) == 1 else (sxm[0] if len(sxm) == 1 else None)


def peak_flops_for(device_name: str, precision: str, tf32: bool,
                   configured_tflops: dict[str, float] | None = None) -> tuple[float, str]:
    """(dense peak FLOP/s per device, where it came from) for a run's precision.

    The key is the precision record's column (scalelab.registries.precisions: fp8 -> fp8, fp32 -> tf32
    when TF32 is on). The table's datasheet figure comes first; ``train.peak_tflops``
    (TFLOP/s per key, e.g. {bf16: 400}) gives the figure for a GPU the table does not know,
    or a key its datasheet lacks.
    Without either: (NaN, the reason).
    """
    return product_peak_flops(gpu_product(device_name), device_name, precision, tf32, configured_tflops)


def product_peak_flops(product: GpuProduct | None, device_name: str, precision: str, tf32: bool,
                       configured_tflops: dict[str, float] | None = None) -> tuple[float, str]:
    """peak_flops_for of a product already found (None: a GPU the table does not know, named device_name)."""
    key = peak_key(precision, tf32)
    peak = product.peak(key) if product else None
    if peak is not None:
        return peak, f"datasheet dense {key}: {product.name} ({product.source})"
    given = (configured_tflops or {}).get(key)
    if given is not None:
        if not (math.isfinite(given) and given > 0):
            raise ValueError(f"train.peak_tflops.{key} must be a positive number, got {given!r}")
        return given * TERA, f"config train.peak_tflops.{key}: {given:g} TFLOP/s ({device_name})"
    if product is None:
        return math.nan, (f"unknown GPU {device_name!r}: no datasheet peak in scalelab.registries.hardware; "
                          f"set train.peak_tflops.{key} to its dense peak to get MFU")
    return math.nan, (f"{product.name} ({device_name!r}) has no dense {key} figure on its datasheet "
                      f"({product.source}); set train.peak_tflops.{key} to get MFU")


CPU_MATMUL_ISA = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2"),
                  ("asimd", "NEON"))
"""(/proc/cpuinfo flag, label), widest first: the matrix or vector instructions torch's CPU matmuls run on, which a
calibrated peak and a step's speed depend on (16-bit ones most: without AVX-512 BF16 a CPU emulates bf16)."""


STEAL_WARN = 0.02
"""A share of a CPU's time its hypervisor gave elsewhere (steal) above which a measurement says so: a run's warning in the
report (host_steal_share), the calibration's line. Its speed reads low by about that share, at the scale of the
differences a sweep ranks (a 2-core VM with busy neighbours lost 0-13% per 2-s window here)."""


DRIFT_WARN = 0.1
"""A change of a run's median step time between the first and the second half of its timed steps (step_time_drift)
beyond which the report says its speed was not steady while it was timed: its figure then mixes two speeds. On a
cloud VM the host's speed is one cause (an idle 2-core slice of a 16-core VM switched between two speeds 1.45x
apart, held for seconds, within runs: 28-42% between halves, where steady runs moved 0-5%); on a GPU, clocks
lowered by heat or power, or graphs compiled inside the loop, are others."""

DRIFT_MIN_STEPS = 20
"""Fewer timed steps than this give no step_time_drift: ten a half, or a median is one step's noise."""


def unsteady(drift):
    """Which step_time_drift values (a pandas Series) are beyond DRIFT_WARN either way; null ones are not."""
    return drift.abs() > DRIFT_WARN


OTHER_WORK_WARN = 0.1
"""A share of the cores a CPU measurement is about to use that other processes kept busy as it started
(scalelab.run.calibration.busy_share) above which the measurement says so: bench comm's table
(busy_share_before). Its times then include that work's (a table measured while the host was still busy gave
the step-time model 14.7% error where an idle host's gave 8.0-9.6%)."""


def largest_steal(shares) -> float | None:
    """The largest of several ranks' (or world sizes') steal shares, those measured; None where none was: the slowest
    rank sets a step, so the most any rank lost is the run's figure."""
    known = [float(s) for s in shares if s is not None and s == s]  # s == s: not NaN
    return max(known) if known else None


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name with its family, model and widest matmul instructions, from /proc/cpuinfo (or the text
    given): a hypervisor may name every generation alike ("AMD EPYC" for Zen 3 with AVX2 and for Zen 4 with AVX-512
    BF16, whose runs differ twofold), and runs on different silicon must not be compared as one device. Else what
    the platform module says."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.split("\n\n", 1)[0].splitlines():  # the first processor's block
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name")
    if not name:
        return platform.processor() or platform.machine()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    detail = [f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields and "model" in fields else "",
              next((label for flag, label in CPU_MATMUL_ISA if flag in flags), "")]
    detail = [d for d in detail if d]
    return f"{name} [{', '.join(detail)}]" if detail else name


# ----------------------------------------------------------------------------- when fp8 pays
FP8_MEASURED = ((1024, 0.84), (2048, 1.16))
"""(d_model, fp8 tokens/s over bf16 tokens/s), both compiled, measured on one H200 (torch 2.11,
torchao 0.18 tensorwise scaling; GPT-2 shapes of 24 layers, seq 1024, micro-batch 16, world size 1).
An H100 80GB HBM3 measured 0.888 and 1.062 at the same widths (26 Nov 2026,
results/reference/): the same verdicts, break-even nearer 1,680. fp8 runs the blocks' matmuls on FP8 tensor cores at twice the bf16 rate, but each
Float8Linear also casts its inputs, weights and output gradients: work that grows with the tensors
(~d per token) while the matmuls grow with d^2, so fp8 pays only from some width on."""
FP8_EAGER_MEASURED = (1024, 0.34)
"""fp8 eager over bf16 eager at d_model 1024 on the same machine: without torch.compile, torchao's
dynamic scaling runs as separate unfused kernels."""
FP8_EVEN_BAND = 0.05
"""An estimated ratio within 5% of 1 is called "about even: measure it"."""


def fp8_outlook(d_model: int, compiled: bool = True) -> dict:
    """Whether fp8 is expected to pay against bf16 for a model of this width: the ratio of
    tokens/s (log-linear in d_model between the measured widths of FP8_MEASURED, held at the
    nearest one outside them), a verdict and its basis. An estimate from one GPU's
    measurements, not a measurement of this model: the report and ``scalelab estimate`` say so."""
    import math

    (d0, r0), (d1, r1) = FP8_MEASURED
    basis = (f"measured on one H200: fp8/bf16 tokens/s {r0:g} at d_model {d0}, {r1:g} at {d1} (both compiled; "
             "torchao tensorwise); an H100 measured 0.888 and 1.062")
    if not compiled:
        return {"d_model": d_model, "compiled": False, "ratio_estimate": FP8_EAGER_MEASURED[1],
                "verdict": "costs: without compile torchao's float8 scaling runs unfused "
                           f"({FP8_EAGER_MEASURED[1]:g}x bf16 eager measured at d_model {FP8_EAGER_MEASURED[0]}); "
                           "turn the compile lever on for fp8",
                "basis": basis}
    position = math.log2(d_model / d0) / math.log2(d1 / d0)  # 0 at d0, 1 at d1
    ratio = r0 * (r1 / r0) ** min(max(position, 0.0), 1.0)
    break_even = d0 * (d1 / d0) ** (math.log(1 / r0) / math.log(r1 / r0))
    beyond = " or less (narrower than measured)" if position < 0 else " or more (wider than measured)" if position > 1 else ""
    if abs(ratio - 1) <= FP8_EVEN_BAND:
        verdict = f"about even at d_model {d_model} (break-even near {break_even:.0f}): measure it"
    elif ratio < 1:
        verdict = (f"costs at d_model {d_model}: about {ratio:.2f}x bf16{beyond} (below d_model ~{break_even:.0f} the "
                   "casts outweigh the faster matmuls)")
    else:
        verdict = f"pays at d_model {d_model}: about {ratio:.2f}x bf16{beyond}"
    return {"d_model": d_model, "compiled": True, "ratio_estimate": ratio, "break_even_d_model": break_even,
            "verdict": verdict, "basis": basis}
