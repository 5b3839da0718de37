"""scalelab's sharded stages against the plain FSDP2 loop (scalelab.harness.plain_loop, torchtitan's recipe),
on real gloo ranks through the worker's own setup and train_step (tests/ranks/host_work.py):

- from the same weights and batches, the plain loop's fp32 losses are scalelab's stage-3 losses;
- the host-side work of a step, what decides a GPU's step when the host cannot launch kernels fast enough
  (a stage-3 step on an H200 ran 2,729 kernels, the device idle half of it): scalelab's step may issue at
  most HOST_WORK_MARGIN more ATen operators, copies and fills than the plain loop's, at stages 2 and 3 and
  hybrid, bf16, eager, and no more optimizer work. Stage 1 is DDP's: FSDP2 has no peer of it.

What a GPU runs that a CPU does not (CUDA autocast's fp32 LayerNorm, compiled kernels) is the GPU check's
to measure (scalelab.harness.gpu_check's stages part).
"""
from __future__ import annotations

import pytest

from scalelab.harness.testing import tiny_config
from scalelab.plan.sweep import RunPoint
from support import strategy_steps, suite_calibration

HOST_WORK_MARGIN = {"ops": 40, "copies": 5, "fills": 5, "optimizer_ops": 0}
"""What scalelab's step may issue beyond the plain loop's, per step. Its own measurement (the batch's copy to
the device, the loss summed over micro-batches, the global loss's all-reduce) is 26 ATen operators and 3
copies at every sharded stage whatever the model's depth, and its attention takes q, k, v by chunk where the
plain model splits (one more dispatch a block, no kernel): 28 operators at the test's 2 layers. A per-group,
per-block or per-parameter excess (a copy, a gather) of more than a few does not fit."""
CASES = ("fp32:3", "bf16:2", "bf16:3", "bf16:hybrid")
STEPS = 2


@pytest.fixture(scope="module")
def host_work(tmp_path_factory, tiny_data) -> dict:
    """Every case on two ranks (hybrid: 2 replicas of one shard), two steps warm, two counted."""
    from scalelab.run import launch

    tmp = tmp_path_factory.mktemp("host-work")
    spec_path = tmp / "spec.json"  # the plan the launcher hands its workers, caught before any starts

    def caught(plan, *args):
        plan.write(spec_path)
        return "failed", "caught", [], {}

    original = launch._run_workers
    launch._run_workers = caught
    try:
        launch.launch_run(tiny_config(), RunPoint("fp32", 0, 1), tiny_data, tmp / "run", tmp / "run.log",
                          calibration=suite_calibration(tiny_data))
    finally:
        launch._run_workers = original
    return strategy_steps(tmp / "host-work.json", 2, "--spec", str(spec_path), "--steps", str(STEPS),
                          *[arg for case in CASES for arg in ("--case", case)], script="host_work.py", timeout_s=240)


def test_the_plain_fsdp2_loop_gives_scalelabs_stage_3_losses(host_work):
    sides = host_work["fp32:3"]
    assert len(sides["scalelab"]["losses"]) == 2 + 2 * STEPS + 1
    assert sides["plain"]["losses"] == pytest.approx(sides["scalelab"]["losses"], rel=1e-6, abs=0)
    assert sides["plain"]["losses"][0] != sides["plain"]["losses"][-1]  # it trained: the loss moved


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("bf16")])
def test_a_sharded_step_issues_no_more_host_work_than_the_plain_fsdp2_loop(host_work, case):
    ours, plain = host_work[case]["scalelab"], host_work[case]["plain"]
    extra = {op: round(n - plain["by_op"].get(op, 0), 1) for op, n in ours["by_op"].items()
             if n > plain["by_op"].get(op, 0)}
    for what, margin in HOST_WORK_MARGIN.items():
        assert ours[what] <= plain[what] + margin, (
            f"{case}: scalelab's step issues {ours[what]:g} {what}, the plain FSDP2 loop's {plain[what]:g}; "
            f"the operators scalelab adds: {dict(sorted(extra.items(), key=lambda kv: -kv[1])[:12])}")
    assert ours["optimizer_params"] == plain["optimizer_params"] and ours["fused"] == plain["fused"]
