"""Checks that need a real NVIDIA GPU (`pytest -m gpu`); skipped, with the reason, elsewhere."""
import pytest
import torch

from scalelab import hardware, placement

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_nvidia_smi_and_torch_agree_on_the_gpus():
    names = placement.visible_gpus()
    assert len(names) == torch.cuda.device_count()
    assert names[0] == torch.cuda.get_device_name(0)


def test_this_gpu_has_a_datasheet_peak():
    name = torch.cuda.get_device_name(0)
    product = hardware.gpu_product(name)
    assert product is not None, f"{name!r} is not in scalelab.hardware: add it with its datasheet figures"
    peak, source = hardware.peak_flops_for(name, "bf16", tf32=False)
    assert peak > 1e14 and product.name in source


def test_the_sweep_is_planned_for_this_gpu():
    plan = placement.plan_device("auto", None)
    assert plan.device == "cuda" and torch.cuda.get_device_name(0) in plan.why
