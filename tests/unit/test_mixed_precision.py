"""Mixed precision's collective dtypes and bytes from the formulas and the sweep's axes, without a run
(the real runs, measured bytes equal to the formulas: tests/run/test_mixed_precision.py)."""
from __future__ import annotations

import pytest

from scalelab.formulas import communication, flops, lora_training, peak_memory
from scalelab.formulas.rank_step import RankStep
from scalelab.planning.result_tables import run_row
from scalelab.planning.run_plan import result_params, run_plan
from scalelab.planning.sweep import RunPoint, sweep_plan
from support import tiny_config
from support.mixed_precision import STAGES

"""|loss - loss of the fp32 twin| / loss of the fp32 twin, per step: what fp16/bf16 autocast kept
before the policy on this model (measured: below 1e-3), with room for the 16-bit gathers."""


# ----------------------------------------------------------------------------- formulas (no process)

@pytest.mark.parametrize("stage", STAGES)
def test_fp32_bytes_are_four_per_element_of_the_paper_unit(stage):
    for world_size in (1, 2, 8):
        for k in (1, 4):
            step = RankStep("fp32", stage, world_size, 1, k)  # its micro-batch: no collective's bytes read it
            assert communication.comm_bytes_per_step(1000, step) == \
                4 * communication.comm_elements_per_step(1000, stage, world_size, k)
            # LoRA: 700 frozen + 300 trainable
            assert communication.comm_bytes_per_step(1000, step, n_trainable=300) == \
                4 * lora_training.lora_comm_elements_per_step(700, 300, stage, world_size, k)


def test_sixteen_bit_gathers_halve_the_all_gather_bytes_and_nothing_else():
    psi, n, k = 1000, 2, 2
    for precision in ("fp16", "bf16"):
        scaler = communication.LOSS_SCALER_COMM_BYTES if precision == "fp16" else 0
        # each RankStep(precision, stage, ranks, micro-batch, accumulation): no collective's bytes read the micro-batch
        # stage 2: k gathers at 2 bytes + one fp32 reduce-scatter; stage 3: 2k gathers
        assert communication.comm_bytes_per_step(psi, RankStep(precision, 2, n, 1, k)) == k * psi * 2 + psi * 4 + scaler
        assert communication.comm_bytes_per_step(psi, RankStep(precision, 3, n, 1, k)) == 2 * k * psi * 2 + psi * 4 + scaler
        assert communication.comm_bytes_per_step(psi, RankStep(precision, 3, n, 1, k, grad_reduce="compute")) == 2 * k * psi * 2 + psi * 2 + scaler
        # DDP: fp32 all-reduce unless the lever compresses it; ZeRO-1's broadcast stays fp32
        assert communication.comm_bytes_per_step(psi, RankStep(precision, 0, n, 1)) == 2 * psi * 4 + scaler
        assert communication.comm_bytes_per_step(psi, RankStep(precision, 0, n, 1, grad_reduce="compute")) == 2 * psi * 2 + scaler
        assert communication.comm_bytes_per_step(psi, RankStep(precision, 1, n, 1, grad_reduce="compute")) == 2 * psi * 2 + psi * 4 + scaler
        assert communication.comm_bytes_per_step(psi, RankStep(precision, 2, 1, 1)) == scaler  # FSDP2 alone: no collective
    # fp8 keeps its fp32 collectives, and the lever does not lower fp32's
    assert communication.comm_dtypes("fp8", 3) == communication.CommDtypes("float32", "float32")
    assert communication.comm_dtypes("fp32", 0, "compute") == communication.CommDtypes(None, "float32")
    assert communication.comm_dtypes("bf16", 2) == communication.CommDtypes("bfloat16", "float32")
    with pytest.raises(ValueError, match="grad_reduce must be one of"):
        communication.comm_dtypes("bf16", 2, "bf16")


def test_in_step_gathered_parameters_follow_the_gather_dtype():
    cfg = tiny_config()
    from scalelab.config import model_config

    model = model_config(cfg, 256)
    n = flops.param_count(model)
    for stage in (2, 3):
        fp32 = peak_memory.peak_memory(model, n, RankStep("fp32", stage, 2, 4))
        for precision in ("fp16", "bf16"):
            mixed = peak_memory.peak_memory(model, n, RankStep(precision, stage, 2, 4))
            assert mixed.transient_params == fp32.transient_params / 2
            assert mixed.model_state == fp32.model_state  # fp32 shards, grads and AdamW at rest
    assert peak_memory.peak_memory(model, n, RankStep("bf16", 0, 2, 4)).transient_params == 0


def test_the_lever_is_one_axis_whose_default_changes_no_run_id():
    cfg = tiny_config(sweep={"precision": ["fp32", "fp16", "bf16", "fp8"], "zero_stage": [0, 2], "world_size": [2],
                             "grad_reduce": ["fp32", "compute"]})
    points, left_out = sweep_plan(cfg)
    ids = {p.run_id for p in points}
    assert {"bf16-z0-w2", "bf16-z0-w2-reduce16", "fp16-z2-w2-reduce16", "fp32-z2-w2"} <= ids
    assert not any(p.grad_reduce == "compute" and p.precision in ("fp32", "fp8") for p in points)
    assert {(p.precision, p.zero_stage) for p, _ in left_out} == {("fp32", 0), ("fp32", 2), ("fp8", 0), ("fp8", 2)}
    assert all("applies to fp16 and bf16" in reason for _, reason in left_out)
    assert RunPoint("bf16", 3, 2).run_id == "bf16-z3-w2"


def test_result_params_change_for_sixteen_bit_sharded_runs_only():
    """The bf16/fp16 stage 2 and 3 runs measured with fp32 gathers rerun; no other run does."""
    cfg = tiny_config()
    for precision in ("fp32", "fp16", "bf16", "fp8"):
        for stage in STAGES:
            params = result_params(cfg, run_plan(cfg, RunPoint(precision, stage, 2), device="cpu"))
            if precision in ("fp16", "bf16") and stage >= 2:
                gathered = {"fp16": "float16", "bf16": "bfloat16"}[precision]
                assert params["comm_dtypes"] == {"param_gather_dtype": gathered}
            else:
                assert "comm_dtypes" not in params
    lever = result_params(cfg, run_plan(cfg, RunPoint("bf16", 0, 2, grad_reduce="compute"), device="cpu"))
    assert lever["comm_dtypes"] == {"grad_reduce_dtype": "bfloat16"}


def test_an_old_summary_reads_as_the_fp32_recipe_it_ran():
    old = {"run_id": "bf16-z3-w2", "precision": "bf16", "zero_stage": 3, "world_size": 2, "status": "ok"}
    row = run_row(old, "bf16-z3-w2")
    assert (row["param_gather_dtype"], row["grad_reduce_dtype"]) == ("float32", "float32")
    row = run_row({**old, "zero_stage": 0, "run_id": "bf16-z0-w2"}, "bf16-z0-w2")
    assert (row["param_gather_dtype"], row["grad_reduce_dtype"]) == (None, "float32")
    new = run_row({**old, "param_gather_dtype": "bfloat16", "grad_reduce_dtype": "float32"}, "bf16-z3-w2")
    assert new["param_gather_dtype"] == "bfloat16"
    failed = run_row({**old, "status": "failed"}, "bf16-z3-w2")
    assert failed["param_gather_dtype"] is None  # no measurement, no recipe
