"""Mixed precision as people run it (issue #31, part 3): fp16 and bf16 runs gather parameters in
their compute dtype at ZeRO stages 2 and 3 (FSDP2's MixedPrecisionPolicy), reduce gradients in
fp32 unless the grad_reduce lever says compute (MixedPrecisionPolicy reduce_dtype, or DDP's
bf16/fp16 compress hook at stages 0 and 1), and measured collective bytes equal the formulas
(scalelab.formulas.communication.comm_bytes_per_step) exactly, for every precision x stage x lever value.

The real runs are few and short (world size 2, 3 steps of the tiny model): byte counts are the
same every step, so two measured steps say as much as ten."""
from __future__ import annotations

import pytest

from scalelab.formulas import communication
from scalelab.planning.sweep import RunPoint
from support import run_point, tiny_config
from support.mixed_precision import STAGES

STEPS = 3
LOSS_RTOL = 0.02
"""|loss - loss of the fp32 twin| / loss of the fp32 twin, per step: what fp16/bf16 autocast kept
before the policy on this model (measured: below 1e-3), with room for the 16-bit gathers."""
# The lever at every stage, each compute dtype through DDP's hook and through FSDP2's reduce-scatter.
LEVER_POINTS = (("bf16", 0), ("fp16", 1), ("fp16", 2), ("bf16", 3))


# ----------------------------------------------------------------------------- real runs (gloo, world size 2)

@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_data):
    """fp32/fp16/bf16 x stages 0-3 at world size 2, and the lever's points: summary and steps of each."""
    tmp = tmp_path_factory.mktemp("mixed")
    cfg = tiny_config(train={"steps": STEPS, "warmup_steps": 1})
    points = [RunPoint(p, z, 2) for p in ("fp32", "fp16", "bf16") for z in STAGES]
    points += [RunPoint(p, z, 2, grad_reduce="compute") for p, z in LEVER_POINTS]
    out = {}
    for point in points:
        summary, steps, _ = run_point(tmp, tiny_data, point, cfg)
        assert summary["status"] == "ok", (point.run_id, summary["reason"])
        out[point.run_id] = (summary, steps)
    return out


@pytest.mark.parametrize("run_id", [f"{p}-z{z}-w2" for p in ("fp32", "fp16", "bf16") for z in STAGES]
                         + [f"{p}-z{z}-w2-reduce16" for p, z in LEVER_POINTS])
def test_measured_collective_bytes_equal_the_prediction_exactly(runs, run_id):
    summary, _ = runs[run_id]
    assert summary["comm_bytes_per_step_measured"] == summary["comm_bytes_per_step_predicted"], \
        (summary["comm_bytes_per_step_by_type"], summary["comm_bytes_per_step_predicted"])
    dtypes = communication.comm_dtypes(summary["precision"], summary["zero_stage"], summary["grad_reduce"])
    assert (summary["param_gather_dtype"], summary["grad_reduce_dtype"]) == (dtypes.param_gather, dtypes.grad_reduce)
    # model state at rest stays fp32 shards, fp32 gradients, fp32 AdamW: 16 bytes per parameter over the shards
    assert summary["model_state_grads_bytes_measured"] == summary["model_state_grads_bytes_predicted"]
    assert summary["model_state_params_bytes_measured"] == summary["model_state_params_bytes_predicted"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("stage", [2, 3])
def test_sixteen_bit_all_gathers_move_half_of_fp32s_bytes(runs, precision, stage):
    mixed, fp32 = runs[f"{precision}-z{stage}-w2"][0], runs[f"fp32-z{stage}-w2"][0]
    gathered = mixed["comm_bytes_per_step_by_type"]["all_gather_single"]
    assert gathered > 0 and gathered * 2 == fp32["comm_bytes_per_step_by_type"]["all_gather_single"]
    # the same number of all-gathers; the reduce-scatter stays fp32 by default
    assert mixed["comm_calls_per_step"]["all_gather_single"] == fp32["comm_calls_per_step"]["all_gather_single"]
    assert mixed["comm_bytes_per_step_by_type"]["reduce_scatter_single"] == \
        fp32["comm_bytes_per_step_by_type"]["reduce_scatter_single"]
    assert mixed["comm_bytes_per_step_measured"] < fp32["comm_bytes_per_step_measured"]


@pytest.mark.parametrize("precision, stage", LEVER_POINTS)
def test_the_lever_halves_the_gradient_reductions(runs, precision, stage):
    lever, default = runs[f"{precision}-z{stage}-w2-reduce16"][0], runs[f"{precision}-z{stage}-w2"][0]
    kind = "all_reduce" if stage < 2 else "reduce_scatter_single"
    scaler = communication.LOSS_SCALER_COMM_BYTES if precision == "fp16" else 0  # its flag is an fp32 all-reduce
    by, base = lever["comm_bytes_per_step_by_type"], default["comm_bytes_per_step_by_type"]
    assert (by[kind] - (scaler if kind == "all_reduce" else 0)) * 2 == base[kind] - (scaler if kind == "all_reduce" else 0)


@pytest.mark.parametrize("run_id", [f"{p}-z{z}-w2" for p in ("fp16", "bf16") for z in STAGES]
                         + [f"{p}-z{z}-w2-reduce16" for p, z in LEVER_POINTS])
def test_losses_stay_with_the_fp32_twin(runs, run_id):
    summary, steps = runs[run_id]
    fp32 = runs[f"fp32-z{summary['zero_stage']}-w2"][1]
    assert list(steps["step"]) == list(fp32["step"]) == list(range(STEPS))
    rel = ((steps["loss"] - fp32["loss"]).abs() / fp32["loss"]).max()
    assert rel < LOSS_RTOL, (run_id, rel)


@pytest.mark.parametrize("run_id", [f"{p}-z{z}-w2" for p in ("fp32", "fp16", "bf16") for z in STAGES])
def test_activations_follow_the_parameters_dtype(runs, run_id):
    """fp16/bf16 at stages 2 and 3 compute with 16-bit parameters (no fp32 residual stream, no weight
    copies by autocast): the prediction follows the recipe, within the 5% the GPT-2 formulas are held to."""
    summary, _ = runs[run_id]
    for measured, predicted in (("activation_bytes_measured", "activation_bytes_predicted"),
                                ("activation_bytes_outside_blocks_measured", "activation_bytes_outside_blocks_predicted")):
        assert summary[measured] == pytest.approx(summary[predicted], rel=0.05), (measured, summary[measured], summary[predicted])
