"""Training runs with real torchrun/gloo processes: parity, memory, fp16 skips, statuses."""


import pytest
import torch

from scalelab.planning.sweep import RunPoint
from support import PARITY_STEPS, tiny_config
from support import run_point as _run


@pytest.mark.unit  # a skipped row is written without starting a process
def test_cuda_requested_without_gpu_is_skipped(tmp_path, tiny_data):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cfg = tiny_config(train={"device": "cuda"})
    summary, steps, _ = _run(tmp_path, tiny_data, RunPoint("bf16", 0, 2), cfg=cfg)
    assert summary["status"] == "skipped" and "no CUDA device" in summary["reason"]
    assert len(steps) == 0


@pytest.mark.unit  # a skipped row is written without starting a process
def test_a_cpu_run_with_more_ranks_than_cores_is_skipped_not_launched(tmp_path, tiny_data):
    cfg = tiny_config(train={"steps": PARITY_STEPS, "warmup_steps": 2, "global_batch": 64})
    summary, steps, _ = _run(tmp_path, tiny_data, RunPoint("fp32", 0, 64), cfg=cfg)
    assert summary["status"] == "skipped" and len(steps) == 0
    assert "world_size=64 CPU ranks need a core each; this job has 2" in summary["reason"]
    assert "planning.launch_overcommitted: true" in summary["reason"]
