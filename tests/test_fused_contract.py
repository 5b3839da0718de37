"""The contract torch's fused optimizer kernels need from the loss scaler (issue #40), checked on
the CPU: on the first GPU, every fp16 run failed in torch's CUDA `_fused_adam` ("output with shape
[] doesn't match the broadcast shape [1]") because ShardedGradScaler hands the fused AdamW a
`found_inf` of shape [1]; the CPU kernel accepts it, so only a check of the shapes catches it here.

Two real ranks (gloo) take two steps of every stage x precision with scalelab's own wrappers,
optimizer and scaler (tests/ranks/strategy_steps.py): the optimizer is fused, as on a GPU; what the
scaler hands the optimizer is 0-dim and a flag (the fused kernels skip a step only where found_inf is
exactly 1); and a non-finite gradient on one rank, or on both, skips the step on both."""
from __future__ import annotations

import pytest

from conftest import strategy_steps


@pytest.fixture(scope="module")
def contract(tmp_path_factory) -> list[list[dict]]:
    out = tmp_path_factory.mktemp("fused") / "contract.json"
    return strategy_steps(out, 2, "--inject-inf", "--steps", "3")


@pytest.mark.run
def test_every_stage_and_precision_steps_a_fused_optimizer_as_on_a_gpu(contract):
    for rank_cases in contract:
        assert len(rank_cases) == 12
        for c in rank_cases:
            assert c["fused"], f"stage {c['stage']} {c['precision']}: the optimizer is not fused ({c['optimizer']})"


@pytest.mark.run
def test_the_scaler_hands_the_fused_kernel_zero_dim_flags(contract):
    for rank_cases in contract:
        for c in rank_cases:
            handed = [item for call in c["handed"] for item in call.items()]
            if c["precision"] == "fp16" and c["optimizer"] != "ZeroRedundancyOptimizer":
                # GradScaler.step's fused path: found_inf every step (grad_scale is None after unscale_)
                assert [name for name, _ in handed] == ["found_inf"] * 3, (c["stage"], c["handed"])
                assert [t["value"] for _, t in handed] == [0.0, 1.0, 1.0], (c["stage"], c["handed"])
            elif c["precision"] != "fp16":
                assert handed == [], (c["stage"], c["precision"], c["handed"])  # no scaler: nothing handed
            for name, t in handed:
                assert t["shape"] == [], f"stage {c['stage']} {c['precision']}: {name} has shape {t['shape']}; fused kernels need 0-dim"


@pytest.mark.run
def test_a_non_finite_gradient_on_one_rank_or_both_skips_the_step_on_every_rank(contract):
    for rank_cases in contract:
        for c in rank_cases:
            first, *inf_steps = c["steps"]
            assert "error" not in c, c
            assert not first["params_unchanged"], (c["stage"], c["precision"])
            if c["precision"] == "fp16":
                assert first["scale_after"] == first["scale_before"]
                for step in inf_steps:
                    assert step["params_unchanged"], f"stage {c['stage']}: a step with an inf gradient was applied"
                    assert step["scale_after"] == step["scale_before"] / 2
