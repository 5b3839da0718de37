"""Pipeline parallelism's CUDA path (the stages' CUDA sends over NCCL, autocast around each chunk's forward, the
timeline's synchronised intervals, FSDP2's gradient sync driven by torch's schedules), one GPU per stage: the losses
of two stages equal one GPU's, fp32 and bf16.

On one GPU the stages cannot run as tensor parallelism's GPU test runs its ranks (two processes over gloo): by
ProcessGroupGloo's source, its send and recv hand the tensor's data pointer to gloo's transport, with no staging of
CUDA tensors through host memory (its collectives have one; its point-to-point has none), and NCCL refuses two ranks
on one device. (Read, not tried: no GPU was lent when this was written.) The CPU suite
(tests/run/test_pipeline.py) runs the same schedules over gloo."""
import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs two CUDA GPUs (pipeline stages send CUDA tensors over NCCL)")]

RTOL = {"fp32": 1e-5, "bf16": 5e-3}


@pytest.fixture(scope="module")
def pipeline_gpu_data(tmp_path_factory):
    from scalelab.config import dataset_config
    from scalelab.harness.testing import tiny_config
    from scalelab.run.data import prepare_dataset

    out = tmp_path_factory.mktemp("ppdata") / "data"
    prepare_dataset(dataset_config(tiny_config(dataset={"synthetic_bytes": 2_000_000})), out, seq_len=1024)
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("stage", [0, 3])
def test_two_stages_on_two_gpus_train_as_one(tmp_path, pipeline_gpu_data, precision, stage):
    from scalelab.harness.testing import tiny_config
    from scalelab.planning.sweep import RunPoint
    from support import run_point

    cfg = tiny_config(train={"device": "cuda", "steps": 8, "warmup_steps": 3, "measure_s": 0})
    cfg["model"].update(n_layers=4, d_model=256, n_heads=4, seq_len=128)
    one = run_point(tmp_path, pipeline_gpu_data, RunPoint(precision, stage, 1, micro_batch=2), cfg=cfg)
    two = run_point(tmp_path, pipeline_gpu_data, RunPoint(precision, stage, 2, micro_batch=2, pipeline_parallel=2), cfg=cfg)
    for summary in (one[0], two[0]):
        assert summary["status"] == "ok", summary["reason"]
    np.testing.assert_allclose(two[1]["loss"].to_numpy(), one[1]["loss"].to_numpy(), rtol=RTOL[precision])
    assert two[0]["comm_pipeline_bytes_per_step_measured"] == two[0]["comm_pipeline_bytes_per_step_predicted"]
    assert two[0]["pipeline_activation_bytes_measured_per_stage"] == two[0]["pipeline_activation_bytes_predicted_per_stage"]
    assert 0 < two[0]["bubble_fraction_measured"] < 1
