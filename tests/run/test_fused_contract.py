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

from scalelab.harness.testing import local_plan, tiny_config
from scalelab.planning.sweep import RunPoint
from support import strategy_steps, suite_calibration


@pytest.fixture(scope="module")
def contract(tmp_path_factory) -> list[list[dict]]:
    out = tmp_path_factory.mktemp("fused") / "contract.json"
    return strategy_steps(out, 2, "--inject-inf", "--steps", "3")


def test_every_stage_and_precision_steps_a_fused_optimizer_as_on_a_gpu(contract):
    for rank_cases in contract:
        assert len(rank_cases) == 12
        for c in rank_cases:
            assert c["fused"], f"stage {c['stage']} {c['precision']}: the optimizer is not fused ({c['optimizer']})"


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


def test_a_step_reads_no_device_value_before_its_end(tmp_path, tiny_data, monkeypatch):
    """No host read of a tensor's value (item, float, bool...) between a step's start and its
    end-of-step synchronize, at every stage, in fp16 (the loss scaler's path) and bf16, on one rank
    and two, through the worker's own setup and train_step (tests/ranks/host_reads.py). On a GPU
    each such read is a mid-step synchronisation: the host waits, the kernels after it start late
    (issue #40: fp16 runs read the loss scale after backward, 0.977 of a plain loop on an H100)."""
    from scalelab.run import launch

    plan_path = tmp_path / "run_plan.json"  # the plan the launcher hands its workers, caught before any starts

    def caught(plan, *args):
        plan.write(plan_path)
        return "failed", "caught", [], {}

    monkeypatch.setattr(launch, "_run_workers", caught)
    # with the worker's CPU calibration, as a sweep's runs have theirs: without one, each case's set-up timed its own
    # matmul peak (emulated fp16 and bf16 here), 20 of the ~45 s of CPU this test took
    launch.launch_run(tiny_config(), local_plan(tiny_config(), RunPoint("fp32", 0, 1)), tiny_data, tmp_path / "run", tmp_path / "run.log",
                      calibration=suite_calibration(tiny_data))
    cases = [f"{precision}:{stage}" for precision in ("fp16", "bf16") for stage in (0, 1, 2, 3)]
    for world_size in (1, 2):
        reads = strategy_steps(tmp_path / f"reads-w{world_size}.json", world_size, "--plan", str(plan_path),
                               *[arg for case in cases for arg in ("--case", case)], script="host_reads.py")
        # ZeroRedundancyOptimizer has no fused step that takes found_inf: torch's GradScaler reads it
        # on the host to decide whether to step (GradScaler._maybe_opt_step), on a GPU too. Known, kept.
        zero1_fp16 = reads.pop("fp16:1")
        assert len(zero1_fp16) == 3 and all(r.startswith("item in <genexpr> from worker.py") for r in zero1_fp16), zero1_fp16
        assert reads == {case: [] for case in cases if case != "fp16:1"}, f"world size {world_size}: {reads}"
