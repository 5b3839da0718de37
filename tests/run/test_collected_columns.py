"""What collection adds to metrics.parquet (#32): tokens/s per device and scaling efficiency as
the report computes them, and integer columns that pandas reads as integers with a skipped row."""
import dataclasses

import pandas as pd
import pytest

from scalelab.planning.sweep import RunPoint
from scalelab.results.collect import collect


def test_a_formula_fixed_after_a_run_reaches_its_cached_row_at_collection(tmp_path, tiny_data, monkeypatch):
    """Issue #42: every formula column of a run is computed again at collection
    (scalelab.formulas.predicted_columns), so a fix to a formula reaches cached runs without retraining. A real
    two-rank run is collected; then the activation, model-state, communication and peak formulas change
    (monkeypatched) and the folder is collected again: every predicted column follows the new
    formulas, the run folder is untouched (nothing retrained), and the measured columns stay."""
    import json

    from scalelab.formulas import activation_memory, communication, model_state
    from scalelab.formulas.predicted_columns import trained_run_columns
    from scalelab.harness.testing import local_plan, tiny_config
    from support import PARITY_STEPS, run_point

    point = RunPoint("bf16", 3, 2)
    cfg = tiny_config(train={"steps": PARITY_STEPS, "warmup_steps": 2}, planning={"launch_overcommitted": True})
    summary, _, run_dir = run_point(tmp_path / "runs", tiny_data, point, cfg=cfg)
    assert summary["status"] == "ok", summary["reason"]
    before = {p: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    assert collect(tmp_path)["problems"] == []
    old = pd.read_parquet(tmp_path / "metrics.parquet").iloc[0]
    # the collected row's formulas are those of the run's own plan (what the worker computed before collection did):
    # the row carries every fact they read, as the plan had it
    on_disk = json.loads((run_dir / "summary.json").read_text())
    plan = local_plan(cfg, point)
    model = dataclasses.replace(plan.model, vocab_size=json.loads((tiny_data / "meta.json").read_text())["vocab_size"])
    counted = {"n_params": on_disk["n_params"], "n_trainable_params": None,
               "last_block_params_kept": on_disk["last_block_params_kept"]}
    expected = trained_run_columns(model, {**plan.formula_row(), **counted}, on_disk["rank_hostnames"].split(","))
    for name in ("activation_bytes_predicted", "model_state_bytes_predicted", "comm_bytes_per_step_predicted",
                 "comm_intra_node_bytes_per_step_predicted", "model_state_bytes_predicted_paper"):
        assert old[name] == pytest.approx(expected[name]), name
    assert old["predicted_peak_bytes"] == pytest.approx(on_disk["predicted_peak_bytes"])  # the launcher's, refreshed

    homes = {"block_activation_bytes": activation_memory, "model_state_bytes": model_state,
             "comm_bytes_per_step": communication, "comm_bytes_by_link": communication}
    real = {name: getattr(home, name) for name, home in homes.items()}
    changed = {
        "block_activation_bytes": lambda *a, **k: 2 * real["block_activation_bytes"](*a, **k),
        "model_state_bytes": lambda *a, **k: model_state.ModelStateBytes(
            *(3 * v for v in dataclasses.astuple(real["model_state_bytes"](*a, **k)))),
        "comm_bytes_per_step": lambda *a, **k: real["comm_bytes_per_step"](*a, **k) + 1000.0,
        "comm_bytes_by_link": lambda *a, **k: {
            link: {c: b + 7.0 for c, b in by_type.items()} for link, by_type in real["comm_bytes_by_link"](*a, **k).items()},
    }
    for name, home in homes.items():
        monkeypatch.setattr(home, name, changed[name])  # each formula where it lives, where the columns read it
    assert collect(tmp_path)["problems"] == []
    new = pd.read_parquet(tmp_path / "metrics.parquet").iloc[0]
    assert new["activation_bytes_predicted"] == pytest.approx(2 * old["activation_bytes_predicted"])
    assert new["model_state_bytes_predicted"] == pytest.approx(3 * old["model_state_bytes_predicted"])
    assert new["model_state_grads_bytes_predicted"] == pytest.approx(3 * old["model_state_grads_bytes_predicted"])
    assert new["comm_bytes_per_step_predicted"] == pytest.approx(old["comm_bytes_per_step_predicted"] + 1000)
    n_types = sum(1 for v in summary["comm_bytes_per_step_by_type"].values() if v)  # the collectives it ran
    assert new["comm_intra_node_bytes_per_step_predicted"] == pytest.approx(old["comm_intra_node_bytes_per_step_predicted"]
                                                                            + 7 * n_types)
    # the peak follows its parts: three times the model state (less the gradients: none at stage 3's peak), twice the blocks
    assert new["predicted_peak_bytes"] > old["predicted_peak_bytes"]
    for name in ("model_state_bytes_measured", "activation_bytes_measured", "comm_bytes_per_step_measured", "tokens_per_s"):
        assert new[name] == old[name], name
    assert {p: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before  # collection read the folder, wrote nothing
