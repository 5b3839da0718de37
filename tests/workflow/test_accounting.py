"""Accounting: hand-computed cases, published figures, the estimate CLI, planning in a sweep."""

import pyarrow.parquet as pq
import pytest

from scalelab.config import ModelConfig
from scalelab.formulas import flops, peak_memory
from scalelab.formulas.rank_step import RankStep
from scalelab.planning.sweep import RunPoint
from support import snakemake, tiny_config, write_workdir


def test_point_that_cannot_fit_is_recorded_without_launch(tmp_path):
    cfg = tiny_config(sweep={"precision": ["fp32"], "zero_stage": [0, 3], "world_size": [2]})
    model = ModelConfig(2, 32, 2, 32, True, 256)
    n = flops.param_count(model)
    big = peak_memory.peak_memory(model, n, RankStep("fp32", 0, 2, 4)).total
    small = peak_memory.peak_memory(model, n, RankStep("fp32", 3, 2, 4)).total
    assert small < big
    cfg["planning"] = {"device_memory_gib": (small + big) / 2 / 2 ** 30, "launch_predicted_oom": False}
    workdir = write_workdir(tmp_path, cfg)
    snakemake(workdir, "--cores", "2")
    runs = pq.read_table(tmp_path / "results/metrics.parquet").to_pandas().set_index("run_id")
    assert runs.loc["fp32-z0-w2", "status"] == "predicted_oom"
    assert "exceeds the device memory" in runs.loc["fp32-z0-w2", "reason"]
    assert runs.loc["fp32-z0-w2", "predicted_peak_bytes"] == pytest.approx(big)
    assert runs.loc["fp32-z3-w2", "status"] == "ok"
    log = tmp_path / "results/logs/runs" / f"{RunPoint('fp32', 0, 2).path}.log"
    assert not log.exists() or "torch.distributed.run" not in log.read_text(), "the point was launched"
    assert "predicted_oom" in (tmp_path / "results/report/report.html").read_text()
