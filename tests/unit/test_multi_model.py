"""Every comparison within its like (issue #41): a sweep of several models compares each model with
itself. A real sweep of the default GPT-2-shaped model and a llama-tiny one (fp32 and bf16, ZeRO
stages 0 and 3, world sizes 1 and 2; the base model's baseline repeated) through Snakemake, and the
grouping helper (scalelab.results.like) on synthetic frames."""
import math
import re

import numpy as np
import pandas as pd
import pytest

from scalelab.report.tables import best_configurations, scaling_efficiency
from scalelab.results.like import (
    OVER_CONFIGURATION,
    OVER_POINTS,
    OVER_STAGE,
    OVER_WORLD_SIZE,
    like_key,
    model_labels,
)
from scalelab.results.noise import model_noise, sweep_noise

"""llama-tiny's family (grouped-query attention, SwiGLU, RoPE), one block narrower, beside the base model (GPT-2, 2 x 32)."""


# ----------------------------------------------------------------------------- the helper, on synthetic frames

def _frame(rows) -> pd.DataFrame:
    """(run_id, model, d_model, status, tokens/s) with the axes read from the run id."""
    out = []
    for run_id, model, d_model, tps in rows:
        parts = run_id.split("-")
        out.append({"run_id": run_id, "model": model, "d_model": d_model, "status": "ok", "tokens_per_s": tps,
                    "precision": parts[0], "zero_stage": int(parts[1][1:]), "world_size": int(parts[2][1:]),
                    "repeat": int(parts[-1][1:]) if re.fullmatch(r"r\d+", parts[-1]) else 1,
                    "activation_checkpointing": "ac" in parts, "micro_batch": 2 if "mb2" in parts else 8 // int(parts[2][1:]),
                    "accumulation_steps": (8 // int(parts[2][1:])) // 2 if "mb2" in parts else 1,
                    "bucket_mb": 25.0 if int(parts[1][1:]) < 2 else None, "replicas": 2 if "hsdp2" in parts else 1,
                    "cpu_offload": "offload" in parts, "model_state_bytes_measured": 1e6, "peak_rss_bytes": 3e8})
    return pd.DataFrame(out)


def test_the_like_holds_the_model_and_every_lever_but_the_axes_compared():
    runs = _frame([("fp32-z0-w1", "base", 64, 100.0), ("fp32-z0-w1-r2", "base", 64, 110.0), ("fp32-z0-w2", "base", 64, 180.0),
                   ("fp32-z0-w1-mine", "mine", 32, 400.0), ("fp32-z0-w2-mine", "mine", 32, 700.0),
                   ("fp32-z0-w1-ac", "base", 64, 70.0), ("fp32-z0-w2-ac", "base", 64, 120.0),
                   ("fp32-z0-w1-mb2", "base", 64, 90.0), ("fp32-z0-w2-mb2", "base", 64, 160.0),
                   ("fp32-z3-w1", "base", 64, 95.0), ("fp32-z3-w2-hsdp2", "base", 64, 150.0), ("fp32-z3-w2-offload", "base", 64, 60.0)])
    key = like_key(runs, OVER_WORLD_SIZE).set_axis(runs["run_id"])
    assert key["fp32-z0-w1"] == key["fp32-z0-w1-r2"] == key["fp32-z0-w2"], "repeats and world sizes of one point: one like"
    assert len({key["fp32-z0-w1"], key["fp32-z0-w1-mine"], key["fp32-z0-w1-ac"], key["fp32-z0-w1-mb2"]}) == 4
    # micro_batch by the value asked for (-mb2), not the size resolved per world size (8 at w1, 4 at w2 when not asked)
    assert key["fp32-z0-w1-mb2"] == key["fp32-z0-w2-mb2"]
    # hybrid sharding exists at world sizes its replicas divide: its single-rank baseline is stage 3's
    assert key["fp32-z3-w2-hsdp2"] == key["fp32-z3-w1"] != key["fp32-z3-w2-offload"]
    eff = scaling_efficiency(runs).set_axis(runs["run_id"])
    assert eff["fp32-z0-w2"] == pytest.approx(180 / (2 * 105)) and eff["fp32-z0-w2-mine"] == pytest.approx(700 / 800)
    assert eff["fp32-z0-w2-ac"] == pytest.approx(120 / 140) and eff["fp32-z0-w2-mb2"] == pytest.approx(160 / 180)
    assert eff["fp32-z3-w2-hsdp2"] == pytest.approx(150 / 190) and np.isnan(eff["fp32-z3-w2-offload"])
    assert eff[["fp32-z0-w1-mine", "fp32-z0-w1-ac", "fp32-z3-w1"]].tolist() == [1.0, 1.0, 1.0]
    # across stages, offload and replicas go with the stage: stage 3's runs compare with stage 0's
    stage = like_key(runs, OVER_STAGE).set_axis(runs["run_id"])
    assert stage["fp32-z3-w2-offload"] == stage["fp32-z3-w2-hsdp2"] == stage["fp32-z0-w2"] != stage["fp32-z0-w2-mine"]
    # the best configuration holds the model and world size only; a noise pool the model only
    best = like_key(runs, OVER_CONFIGURATION).set_axis(runs["run_id"])
    assert best["fp32-z0-w2-ac"] == best["fp32-z3-w2-offload"] != best["fp32-z0-w2-mine"] and best["fp32-z0-w1"] != best["fp32-z0-w2"]
    pool = like_key(runs, OVER_POINTS).set_axis(runs["run_id"])
    assert pool.nunique() == 2 and pool["fp32-z0-w1"] == pool["fp32-z3-w2-offload"] != pool["fp32-z0-w1-mine"]
    with pytest.raises(ValueError, match="not an axis a comparison runs over: seq_len"):
        like_key(runs, ("seq_len",))


def test_one_model_name_with_two_shapes_is_two_models():
    """Results copied together from two configs whose base model differs: two models, named apart."""
    runs = _frame([("fp32-z0-w1", "base", 64, 100.0), ("fp32-z0-w2", "base", 64, 180.0),
                   ("fp32-z0-w1", "base", 128, 40.0), ("fp32-z0-w2", "base", 128, 60.0)])
    assert model_labels(runs).tolist() == ["base (d_model 64)"] * 2 + ["base (d_model 128)"] * 2
    assert scaling_efficiency(runs).tolist() == pytest.approx([1, 0.9, 1, 0.75])
    best = best_configurations(runs)
    assert best[["model", "world_size", "tokens_per_s"]].values.tolist() == [
        ["base (d_model 128)", 1, 40.0], ["base (d_model 128)", 2, 60.0], ["base (d_model 64)", 1, 100.0], ["base (d_model 64)", 2, 180.0]]
    # a table written before families (no model_family column) names the same model as one that says gpt2
    assert like_key(runs).tolist() == like_key(runs.assign(model_family="gpt2")).tolist()
    # a row without a shape (a missing run: its identity only) takes its model's, where the name holds one
    lone = _frame([("fp32-z0-w1-mine", "mine", 32, 400.0), ("fp32-z0-w2-mine", "mine", None, 0.0)])
    assert like_key(lone, OVER_WORLD_SIZE).nunique() == 1


def test_noise_of_one_model_never_moves_another_models_verdicts():
    """Base's repeats agree to 1%, mine's spread 25%: each point is ranked against its own model's noise."""
    runs = _frame([("fp32-z0-w1", "base", 64, 1000.0), ("fp32-z0-w1-r2", "base", 64, 1010.0), ("fp32-z0-w1-r3", "base", 64, 1005.0),
                   ("bf16-z0-w1", "base", 64, 1080.0),
                   ("fp32-z0-w1-mine", "mine", 32, 400.0), ("fp32-z0-w1-mine-r2", "mine", 32, 500.0),
                   ("fp32-z0-w1-mine-r3", "mine", 32, 450.0), ("bf16-z0-w1-mine", "mine", 32, 480.0)])
    noise = model_noise(runs)
    sigma = {m: math.sqrt(sum((math.log(v) - np.mean(np.log(g))) ** 2 for v in g) / 2)
             for m, g in (("base", [1000, 1010, 1005]), ("mine", [400, 500, 450]))}
    assert noise.of("base").sigma == pytest.approx(sigma["base"]) and noise.of("mine").sigma == pytest.approx(sigma["mine"])
    best = best_configurations(runs).set_index("model")
    # base: bf16 7% ahead of a median of 3 is beyond base's noise; mine: bf16 7% ahead is within mine's
    assert best.loc["base", "run_id"] == "bf16-z0-w1" and best.loc["base", "within_noise"] == ""
    assert best.loc["mine", "run_id"] == "bf16-z0-w1-mine" and best.loc["mine", "within_noise"] == "fp32-z0-w1-mine"
    # pooled over both models (what this replaced), base's bf16 would have been "within noise" too
    assert sweep_noise(runs).within(1080, 1005, 1, 3)


def test_warnings_compare_runs_of_one_model_and_levers():
    """fp32 parity holds each model, and each lever setting, to itself: two models' losses differ, and a
    LoRA run learns otherwise; a stage that breaks parity in one model is named with it. The CPU notice
    gives each model's bf16/fp32 speed apart."""
    from scalelab.report.checks import cpu_notice
    from scalelab.report.report import fp32_parity_warnings

    runs = _frame([("fp32-z0-w1", "base", 64, 100.0), ("fp32-z3-w2", "base", 64, 150.0), ("bf16-z0-w1", "base", 64, 50.0),
                   ("fp32-z0-w1-mine", "mine", 32, 400.0), ("fp32-z3-w2-mine", "mine", 32, 700.0), ("bf16-z0-w1-mine", "mine", 32, 300.0),
                   ("fp32-z0-w1-lora4", "base", 64, 120.0)])
    runs["lora_rank"] = [None] * 6 + [4]
    runs["device_type"], runs["device_name"], runs["threads_per_rank"] = "cpu", "a CPU", 1
    loss = {"base": 5.0, "mine": 4.0}
    steps = pd.DataFrame([{"run_id": r.run_id, "precision": r.precision, "zero_stage": r.zero_stage, "world_size": r.world_size,
                           "model": r.model, "step": step, "loss": loss[r.model] - 0.1 * step - (0.5 if r.lora_rank == 4 else 0)}
                          for r in runs.itertuples() for step in range(3)])
    assert fp32_parity_warnings(runs, steps) == [], "another model, a LoRA run: not the same trajectory, and no warning"
    broken = steps.assign(loss=np.where(steps["run_id"] == "fp32-z3-w2-mine", steps["loss"] * 1.01, steps["loss"]))
    [warning] = fp32_parity_warnings(runs, broken)
    assert warning.startswith("fp32 parity broken in model mine: losses of fp32 runs differ by up to 1.00e-02"), warning
    notice = cpu_notice(runs)
    assert "(bf16 at 0.50× fp32's tokens/s here in model base, and bf16 at 0.75× in model mine)" in notice, notice
