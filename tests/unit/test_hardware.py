"""GPU products by exact CUDA device name, dense datasheet peaks, the NaN-with-reason paths."""
import math

import pytest

from scalelab.formulas import flops
from scalelab.registries import hardware

# Dense TFLOP/s from the datasheets, typed in here (not read from the table under test).
# Where a datasheet prints only the sparse figure (marked *), the value is half of it.
A100 = {"fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312, "fp8": None}
HOPPER_SXM = {"fp32": 67, "tf32": 989 / 2, "fp16": 1979 / 2, "bf16": 1979 / 2, "fp8": 3958 / 2}
HOPPER_NVL = {"fp32": 60, "tf32": 835 / 2, "fp16": 1671 / 2, "bf16": 1671 / 2, "fp8": 3341 / 2}
H100_PCIE = {"fp32": 51, "tf32": 756 / 2, "fp16": 1513 / 2, "bf16": 1513 / 2, "fp8": 3026 / 2}
L40S = {"fp32": 91.6, "tf32": 183, "fp16": 362.05, "bf16": 362.05, "fp8": 733}
L4 = {"fp32": 30.3, "tf32": 120 / 2, "fp16": 242 / 2, "bf16": 242 / 2, "fp8": 485 / 2}
A10 = {"fp32": 31.2, "tf32": 62.5, "fp16": 125, "bf16": 125, "fp8": None}
V100_SXM2 = {"fp32": 15.7, "tf32": None, "fp16": 125, "bf16": None, "fp8": None}
V100_PCIE = {"fp32": 14, "tf32": None, "fp16": 112, "bf16": None, "fp8": None}
B200 = {"fp32": 75, "tf32": 2200 / 2, "fp16": 4500 / 2, "bf16": 4500 / 2, "fp8": 9000 / 2}

# (CUDA device name, product, memory GB on the datasheet, dense peaks)
DEVICES = [
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB", 40, A100),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 80, A100),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB", 40, A100),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 80, A100),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 80, HOPPER_SXM),
    ("NVIDIA H100 PCIe", "H100 PCIe", 80, H100_PCIE),
    ("NVIDIA H100 NVL", "H100 NVL", 94, HOPPER_NVL),
    ("NVIDIA H200", "H200 SXM", 141, HOPPER_SXM),
    ("NVIDIA H200 NVL", "H200 NVL", 141, HOPPER_NVL),
    ("NVIDIA GH200 480GB", "GH200 96GB", 96, HOPPER_SXM),
    ("NVIDIA GH200 120GB", "GH200 96GB", 96, HOPPER_SXM),
    ("NVIDIA GH200 144G HBM3e", "GH200 144GB", 144, HOPPER_SXM),
    ("NVIDIA L40S", "L40S", 48, L40S),
    ("NVIDIA L4", "L4", 24, L4),
    ("NVIDIA A10", "A10", 24, A10),
    ("Tesla V100-SXM2-16GB", "V100 SXM2 16GB", 16, V100_SXM2),
    ("Tesla V100-SXM2-32GB", "V100 SXM2 32GB", 32, V100_SXM2),
    ("Tesla V100-PCIE-16GB", "V100 PCIe 16GB", 16, V100_PCIE),
    ("Tesla V100-PCIE-32GB", "V100 PCIe 32GB", 32, V100_PCIE),
    ("NVIDIA B200", "B200", 180, B200),
]


def _peak(device_name, key):
    """peak_flops_for with the run settings that select a precision key."""
    return hardware.peak_flops_for(device_name, "fp32" if key == "tf32" else key, tf32=key == "tf32")


def test_every_device_name_in_the_table_is_tested():
    assert {n for p in hardware.PRODUCTS for n in p.device_names} == {d[0] for d in DEVICES}


@pytest.mark.parametrize("device_name, product_name, memory, peaks", DEVICES, ids=[d[0] for d in DEVICES])
def test_device_name_gives_its_product_and_datasheet_peaks(device_name, product_name, memory, peaks):
    product = hardware.gpu_product(device_name)
    assert product is not None and product.name == product_name
    assert product.memory_gib == memory
    for key, tflops in peaks.items():
        peak, source = _peak(device_name, key)
        if tflops is None:
            assert math.isnan(peak), key
            assert f"no dense {key} figure" in source and "train.peak_tflops" in source and product_name in source
        else:
            assert peak == pytest.approx(tflops * 1e12, rel=1e-12), key
            assert source == f"datasheet dense {key}: {product_name} ({product.source})"
    assert product.source.startswith("NVIDIA ")


@pytest.mark.parametrize("device_name, product_name", [
    ("nvidia h100 nvl", "H100 NVL"),  # case
    ("  NVIDIA   H100  NVL ", "H100 NVL"),  # whitespace
    ("A100-SXM4-40GB", "A100 SXM 40GB"),  # older drivers: no brand
    ("NVIDIA A100-PCIe-40GB", "A100 PCIe 40GB"),  # the spelling in vLLM's config file names
    ("NVIDIA Tesla V100-SXM2-32GB", None),  # not a name any driver reports: brand dropped once only
])
def test_normalised_names(device_name, product_name):
    product = hardware.gpu_product(device_name)
    assert (product and product.name) == product_name


@pytest.mark.parametrize("device_name", [
    "NVIDIA H100",  # driver table lists it (PCI 2339), but which board is not sourced
    "NVIDIA H100 80GB", "NVIDIA H100 SXM", "NVIDIA H800", "NVIDIA H800 PCIe", "NVIDIA H20",
    "NVIDIA GB200",  # contains "B200"
    "NVIDIA B300 SXM6 AC",
    "NVIDIA L40",  # prefix of "L40S", and "L4" is a prefix of it
    "NVIDIA A10G", "NVIDIA A100-SXM-64GB", "NVIDIA A100",
    "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a MIG slice does not get the whole GPU's peak
    "NVIDIA Foo 9000", "", "cpu",
])
def test_near_misses_and_unknown_names_resolve_to_nothing(device_name):
    assert hardware.gpu_product(device_name) is None
    peak, reason = hardware.peak_flops_for(device_name, "bf16", tf32=False)
    assert math.isnan(peak)
    assert repr(device_name) in reason and "set train.peak_tflops" in reason


def test_nvl_parts_are_not_the_sxm_parts():
    assert hardware.gpu_product("NVIDIA H100 NVL").name == "H100 NVL"
    assert _peak("NVIDIA H100 NVL", "bf16")[0] == pytest.approx(835.5e12)
    assert _peak("NVIDIA H100 80GB HBM3", "bf16")[0] == pytest.approx(989.5e12)
    assert hardware.gpu_product("NVIDIA H200 NVL").name == "H200 NVL"
    assert _peak("NVIDIA H200 NVL", "fp8")[0] == pytest.approx(1670.5e12)
    assert _peak("NVIDIA H200", "fp8")[0] == pytest.approx(1979e12)
    assert hardware.gpu_product("NVIDIA B200").name == "B200" and hardware.gpu_product("NVIDIA GB200") is None


def test_tf32_flag_picks_the_key():
    assert hardware.peak_flops_for("NVIDIA A100-SXM4-80GB", "fp32", tf32=True)[0] == pytest.approx(156e12)
    assert hardware.peak_flops_for("NVIDIA A100-SXM4-80GB", "fp32", tf32=False)[0] == pytest.approx(19.5e12)
    peak, source = hardware.peak_flops_for("NVIDIA A100-SXM4-80GB", "bf16", tf32=True)  # tf32 only concerns fp32
    assert peak == pytest.approx(312e12) and "dense bf16" in source
    with pytest.raises(ValueError, match="unknown precision"):
        hardware.peak_flops_for("NVIDIA A100-SXM4-80GB", "int8", tf32=False)


def test_known_product_without_the_precision_is_nan_with_reason():
    peak, reason = hardware.peak_flops_for("NVIDIA A100-SXM4-80GB", "fp8", tf32=False)
    assert math.isnan(peak) and "A100 SXM 80GB" in reason and "fp8" in reason and "train.peak_tflops" in reason
    peak, reason = hardware.peak_flops_for("Tesla V100-SXM2-32GB", "fp32", tf32=True)
    assert math.isnan(peak) and "tf32" in reason
    assert math.isnan(hardware.peak_flops_for("Tesla V100-PCIE-16GB", "bf16", tf32=False)[0])


def test_configured_peak_fills_only_what_the_table_lacks_and_is_recorded():
    configured = {"bf16": 400, "fp8": 600, "fp32": 50}
    peak, source = hardware.peak_flops_for("NVIDIA Foo 9000", "bf16", tf32=False, configured_tflops=configured)
    assert peak == 400e12 and source.startswith("config train.peak_tflops.bf16") and "NVIDIA Foo 9000" in source
    assert hardware.peak_flops_for("NVIDIA Foo 9000", "fp32", tf32=False, configured_tflops=configured)[0] == 50e12
    peak, reason = hardware.peak_flops_for("NVIDIA Foo 9000", "fp16", tf32=False, configured_tflops=configured)
    assert math.isnan(peak) and "train.peak_tflops.fp16" in reason, "one precision's figure is never used for another"
    peak, source = hardware.peak_flops_for("NVIDIA H100 80GB HBM3", "bf16", tf32=False, configured_tflops=configured)
    assert peak == pytest.approx(989.5e12) and source.startswith("datasheet"), "the datasheet figure comes first"
    peak, source = hardware.peak_flops_for("NVIDIA A100-SXM4-80GB", "fp8", tf32=False, configured_tflops=configured)
    assert peak == 600e12 and "config" in source
    for bad in (0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="train.peak_tflops.bf16"):
            hardware.peak_flops_for("NVIDIA Foo 9000", "bf16", tf32=False, configured_tflops={"bf16": bad})


@pytest.mark.parametrize("name, product_name", [
    ("H100", "H100 SXM"), ("h100", "H100 SXM"), ("A100", "A100 SXM 80GB"), ("H200", "H200 SXM"),
    ("H100 NVL", "H100 NVL"), ("h100-nvl", "H100 NVL"), ("H100_PCIe", "H100 PCIe"), ("h200 nvl", "H200 NVL"),
    ("a100 pcie 40gb", "A100 PCIe 40GB"), ("A100-SXM4-40GB", "A100 SXM 40GB"), ("l40s", "L40S"), ("L4", "L4"),
    ("GH200", "GH200 96GB"), ("V100", "V100 SXM2 32GB"), ("b200", "B200"),
    ("NVIDIA H100 NVL", "H100 NVL"), ("Tesla V100-PCIE-16GB", "V100 PCIe 16GB"),  # device names work too
])
def test_gpu_by_name(name, product_name):
    assert hardware.gpu_by_name(name).name == product_name


@pytest.mark.parametrize("name", ["Foo9000", "GB200", "H800", "A10G", ""])
def test_gpu_by_name_unknown_lists_the_known_names(name):
    with pytest.raises(ValueError, match=f"unknown GPU type {name!r}") as err:
        hardware.gpu_by_name(name)
    assert "H100 NVL" in str(err.value) and "A100 PCIe 80GB" in str(err.value)


def test_accounting_uses_the_table():
    assert flops.gpu_peak_flops("H100 NVL", "bf16") == pytest.approx(835.5e12)
    assert flops.gpu_peak_flops("h100", "bf16") == pytest.approx(989.5e12)
    with pytest.raises(ValueError, match="no dense 'fp8'"):
        flops.gpu_peak_flops("A100", "fp8")


def test_mfu_is_nan_for_a_nan_peak():
    peak, _ = hardware.peak_flops_for("NVIDIA Foo 9000", "bf16", tf32=False)
    assert math.isnan(flops.mfu(1000.0, 6e9, peak, 8))
    assert flops.mfu(1000.0, 6e9, 989.5e12, 8) == pytest.approx(1000 * 6e9 / (8 * 989.5e12))
    with pytest.raises(ValueError):
        flops.mfu(1000.0, 6e9, 0.0, 8)


def test_peak_columns_come_from_the_precision_records():
    """A run's precision picks its datasheet column through its record (fp32 + TF32 -> tf32); a
    product naming a column no record has is refused."""
    from scalelab.registries.precisions import PEAK_KEYS, peak_key

    assert PEAK_KEYS == ("fp32", "tf32", "fp16", "bf16", "fp8")
    assert [peak_key(p, tf32=True) for p in ("fp32", "fp16", "bf16", "fp8")] == ["tf32", "fp16", "bf16", "fp8"]
    assert flops.gpu_peak_flops("H100", "tf32") == pytest.approx(494.5e12)
    assert hardware.peak_flops_for("NVIDIA H100 80GB HBM3", "fp8", tf32=True)[0] == pytest.approx(1979e12)
    for product in hardware.PRODUCTS:
        assert set(product.peaks) <= set(PEAK_KEYS) and list(product.peaks) == [k for k in PEAK_KEYS if k in product.peaks]
    with pytest.raises(ValueError, match="unknown precision key 'fp4'"):
        hardware.GpuProduct("X", ("NVIDIA X",), 80, "test", figures=(("fp4", 1e15),))
    with pytest.raises(ValueError, match="unknown precision 'int8'"):
        flops.gpu_peak_flops("H100", "int8")


def test_fp8_outlook_follows_the_gpu_measurements_and_says_its_basis():
    """fp8 against bf16 (issue #40, one H200): 0.84x at d_model 1024, 1.16x at 2048, both compiled;
    in between log-linear, outside held at the nearest measured width and said to be beyond it."""
    at = {d: hardware.fp8_outlook(d) for d in (512, 1024, 1536, 2048, 8192)}
    assert at[1024]["ratio_estimate"] == pytest.approx(0.84) and at[2048]["ratio_estimate"] == pytest.approx(1.16)
    assert at[1024]["verdict"].startswith("costs") and at[2048]["verdict"].startswith("pays")
    assert at[1536]["verdict"].startswith("about even") and 1024 < at[1536]["break_even_d_model"] < 2048
    assert "or less (narrower than measured)" in at[512]["verdict"] and "or more (wider than measured)" in at[8192]["verdict"]
    assert all("H200" in o["basis"] for o in at.values())
    eager = hardware.fp8_outlook(4096, compiled=False)
    assert eager["verdict"].startswith("costs: without compile") and eager["ratio_estimate"] == pytest.approx(0.34)


MILAN = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma

processor\t: 1
model name\t: something else
"""


def test_cpus_a_hypervisor_names_alike_are_told_apart_by_family_model_and_matmul_instructions(monkeypatch):
    """Two VMs both called "AMD EPYC" (Zen 3, AVX2; Zen 4, AVX-512 BF16) ran the same sweep twice apart: rows key
    their compute references and peak checks by device_name, so it must differ."""
    genoa = MILAN.replace("model\t\t: 1", "model\t\t: 17").replace("avx2 fma", "avx2 fma avx512f avx512_bf16")
    assert hardware.cpu_name(MILAN) == "AMD EPYC [family 25 model 1, AVX2]"  # the first processor's block only
    assert hardware.cpu_name(genoa) == "AMD EPYC [family 25 model 17, AVX-512 BF16]"
    bare = "processor\t: 0\nmodel name\t: Some CPU\n"
    assert hardware.cpu_name(bare) == "Some CPU"  # no family, model or flags: the name alone
    monkeypatch.setattr(hardware.platform, "processor", lambda: "x86_64")  # uname -p is a process: not here
    assert hardware.cpu_name("") == "x86_64"
