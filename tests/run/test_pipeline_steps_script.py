"""The one-GPU pipeline test's rank script (tests/ranks/pipeline_steps.py, run by tests/gpu/test_pipeline.py on a GPU)
on the CPU, so that it cannot rot between the rare sessions lent a GPU: two stages over gloo train as one process."""
import numpy as np


def test_the_one_gpu_pipeline_script_trains_two_stages_as_one_process_on_the_cpu(tmp_path):
    from support import strategy_steps

    (case,) = strategy_steps(tmp_path / "pipeline.json", 2, "--device", "cpu", "--precisions", "fp32",
                             "--schedules", "1f1b", "--steps", "3", script="pipeline_steps.py", timeout_s=200)
    assert "error" not in case, f"{case['error']}\n{case.get('traceback')}"
    assert len(case["pipelined"]) == 3
    np.testing.assert_allclose(case["pipelined"], case["one_process"], rtol=1e-5)
