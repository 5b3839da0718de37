"""The levers as sweep axes, with real torchrun/gloo runs: activation checkpointing, gradient
accumulation, DDP bucket size; CPU offload and fp8 end as skipped rows on a CPU."""
import numpy as np
import pytest
import torch

from scalelab.planning.sweep import RunPoint
from support import run_point
from support.levers import _compile_config


@pytest.mark.parametrize("precision, rtol", [("fp32", 1e-4), ("bf16", 2e-2)])
@pytest.mark.parametrize("stage", [0, 3])
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compile_lever_on_a_gpu(tmp_path, tiny_data, precision, rtol, stage):
    """On a GPU (inductor's Triton kernels): the compiled run trains like its eager twin,
    compiles nothing during the steps, and records its compilation apart."""
    cfg = _compile_config(device="cuda")
    eager, eager_steps, _ = run_point(tmp_path, tiny_data, RunPoint(precision, stage, 1), cfg=cfg)
    compiled, compiled_steps, _ = run_point(tmp_path, tiny_data, RunPoint(precision, stage, 1, compile=True), cfg=cfg)
    assert eager["status"] == compiled["status"] == "ok", (eager["reason"], compiled["reason"])
    assert compiled["device_type"] == "cuda" and compiled["compile_time_s"] > 0 and compiled["compile_graphs_in_loop"] == 0
    np.testing.assert_allclose(compiled_steps["loss"], eager_steps["loss"], rtol=rtol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mfu_against_the_bf16_datasheet_peak_on_a_gpu(tmp_path, tiny_data):
    """bf16 runs: one peak, the datasheet's dense bf16; fp8 runs (FP8 GPUs with torchao):
    their own peak is fp8's, and mfu_bf16_peak = mfu x fp8 peak / bf16 peak (2 on Hopper)."""
    from scalelab.run.precision import fp8_unsupported_reason

    cfg = _compile_config(device="cuda")
    bf16 = run_point(tmp_path, tiny_data, RunPoint("bf16", 0, 1), cfg=cfg)[0]
    assert bf16["status"] == "ok", bf16["reason"]
    if bf16["peak_flops_source"].startswith("datasheet"):
        assert bf16["peak_flops_bf16"] == bf16["peak_flops_per_device"] and bf16["mfu_bf16_peak"] == bf16["mfu"]
        assert bf16["peak_flops_bf16_source"].startswith("datasheet dense bf16")
    if fp8_unsupported_reason(torch.device("cuda")) is None:
        fp8 = run_point(tmp_path, tiny_data, RunPoint("fp8", 0, 1), cfg=cfg)[0]
        assert fp8["status"] == "ok", fp8["reason"]
        assert fp8["peak_flops_bf16"] == bf16["peak_flops_bf16"]
        assert fp8["mfu_bf16_peak"] == pytest.approx(fp8["mfu"] * fp8["peak_flops_per_device"] / fp8["peak_flops_bf16"])
