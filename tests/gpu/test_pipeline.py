"""Pipeline parallelism's CUDA path: two stages against one process, fp32 and bf16.

On one GPU (the machines lent to this project have one), as tensor parallelism's GPU test runs its ranks: two
processes over gloo (tests/ranks/pipeline_steps.py), the stages scalelab's own (chunk_modules, build, step), their
chunks computing on the GPU under CUDA autocast. gloo's send and recv hand the tensor's data pointer to its TCP
transport with no staging of CUDA tensors (its collectives have one, its point-to-point has none) and NCCL refuses
two ranks on one device, so the boundary tensors cross in host memory there; the CPU suite runs the same script
(tests/run/test_pipeline_steps_script.py) so that it cannot rot between GPU sessions.

On two GPUs, the worker's whole path: the stages' CUDA sends over NCCL, the timeline's synchronised intervals, FSDP2's
gradient sync driven by torch's schedules. The CPU suite (tests/run/test_pipeline.py) runs the same schedules over
gloo."""
import numpy as np
import pytest
import torch

RTOL = {"fp32": 1e-5, "bf16": 5e-3}
TWO_GPUS = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs two CUDA GPUs (pipeline stages send CUDA tensors over NCCL)")


@pytest.fixture(scope="module")
def two_stages_on_one_gpu(tmp_path_factory):
    from support import strategy_steps

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = tmp_path_factory.mktemp("pp-one-gpu") / "pipeline.json"
    return strategy_steps(out, 2, "--device", "cuda:0", script="pipeline_steps.py", timeout_s=400)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_two_stages_on_one_gpu_over_gloo_train_as_one_process(two_stages_on_one_gpu, precision, schedule):
    (case,) = [c for c in two_stages_on_one_gpu if (c["precision"], c["schedule"]) == (precision, schedule)]
    assert "error" not in case, f"{case['error']}\n{case.get('traceback')}"
    np.testing.assert_allclose(case["pipelined"], case["one_process"], rtol=RTOL[precision])


@pytest.fixture(scope="module")
def pipeline_gpu_data(tmp_path_factory):
    from scalelab.config import dataset_config
    from scalelab.harness.testing import tiny_config
    from scalelab.run.data import prepare_dataset

    out = tmp_path_factory.mktemp("ppdata") / "data"
    prepare_dataset(dataset_config(tiny_config(dataset={"synthetic_bytes": 2_000_000})), out, seq_len=1024)
    return out


@TWO_GPUS
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
