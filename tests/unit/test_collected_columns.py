"""What collection adds to metrics.parquet (#32): tokens/s per device and scaling efficiency as
the report computes them, and integer columns that pandas reads as integers with a skipped row."""

import pandas as pd
import pytest

from scalelab.io import write_json
from scalelab.planning.columns import RUN_COLUMNS
from scalelab.planning.result_tables import steps_table, write_parquet
from scalelab.planning.sweep import RunPoint
from scalelab.report.tables import scaling_efficiency
from scalelab.results.collect import collect

# (precision, stage, world size, repeat, status, tokens/s): world size 1 of fp32-z0 has two
# repeats (the baseline is their median, 110); fp32-z3 has no ok run at world size 1.
RUNS = [("fp32", 0, 1, 1, "ok", 100.0), ("fp32", 0, 1, 2, "ok", 120.0), ("fp32", 0, 2, 1, "ok", 150.0),
        ("fp32", 3, 2, 1, "ok", 80.0), ("fp32", 3, 1, 1, "skipped", None), ("fp32", 1, 2, 1, "failed", None)]


def _run(runs_root, precision, stage, world_size, repeat, status, tokens_per_s):
    point = RunPoint(precision, stage, world_size, repeat=repeat)
    run_dir = runs_root / point.path
    identity = point.identity()
    write_parquet(steps_table(identity, [{"step": 0, "loss": 5.0, "grad_norm": 1.0, "lr": 1e-3, "loss_scale": None,
                                          "skipped": False, "step_time_s": 0.01, "tokens": 512}]),
                  run_dir / "steps.parquet")
    measured = {"tokens_per_s": tokens_per_s, "n_params": 123_456} if status == "ok" else {}
    write_json(run_dir / "summary.json", {**identity, "status": status, "reason": None, **measured})
    write_json(run_dir / "point.json", point.to_json())
    return point.run_id


def test_collection_fills_per_device_throughput_and_scaling_efficiency_as_the_report_does(tmp_path):
    ids = [_run(tmp_path / "runs", *run) for run in RUNS]
    assert collect(tmp_path)["problems"] == []
    runs = pd.read_parquet(tmp_path / "metrics.parquet").set_index("run_id").loc[ids]
    for name in ("tokens_per_s_per_device", "scaling_efficiency"):
        assert RUN_COLUMNS[name].writer == "collect"
    ok = runs["status"] == "ok"
    assert runs["tokens_per_s_per_device"][ok].tolist() == [100.0, 120.0, 75.0, 40.0]
    assert runs["scaling_efficiency"].iloc[2] == pytest.approx(150 / (2 * 110))  # the world-size-1 median
    # the report's own function over the same table gives the same numbers (one formula)
    report = scaling_efficiency(runs.reset_index())
    pd.testing.assert_series_equal(runs["scaling_efficiency"][ok].reset_index(drop=True),
                                   report[ok.to_numpy()].reset_index(drop=True), check_names=False)
    assert runs["scaling_efficiency"].isna().tolist() == [False, False, False, True, True, True]  # no baseline; not ok
    assert runs["tokens_per_s_per_device"][~ok].isna().all()


def test_integer_columns_stay_integer_in_pandas_with_a_skipped_row(tmp_path):
    """A skipped run has no n_params: pandas made the whole column float."""
    for run in RUNS:
        _run(tmp_path / "runs", *run)
    collect(tmp_path)
    runs = pd.read_parquet(tmp_path / "metrics.parquet")
    assert str(runs["n_params"].dtype) == "Int64" and runs["n_params"].isna().sum() == 2
    assert runs.loc[runs["status"] == "ok", "n_params"].tolist() == [123_456] * 4
    assert runs["world_size"].dtype.kind == "i"  # axes read as before (numpy integers; null-free)
