"""What the host-work tests of scalelab's sharded stages share (tests/run/test_sharded_host_work.py on CPU
ranks, tests/gpu/test_stages.py on a GPU): the plan a run's workers would get, its rank script's runs, and
what scalelab's step may issue beyond the plain FSDP2 loop's."""
from __future__ import annotations

from pathlib import Path

from scalelab.harness.testing import local_plan
from scalelab.planning.sweep import RunPoint
from support import strategy_steps, suite_calibration

HOST_WORK_MARGIN = {"ops": 40, "copies": 5, "fills": 5, "optimizer_ops": 0}
"""What scalelab's step may issue beyond the plain loop's, per step. Its own measurement (the batch's copy to
the device, the loss summed over micro-batches, the global loss's all-reduce) is 26 ATen operators and 3
copies at every sharded stage whatever the model's depth, and its attention takes q, k, v by chunk where the
plain model splits (one more dispatch a block, no kernel): 28 operators at the tests' 2 layers. A per-group,
per-block or per-parameter excess (a copy, a gather) of more than a few does not fit."""

def host_work(tmp: Path, data: Path, cfg: dict, world_size: int, cases: list[str], *args: str, steps: int = 2) -> dict:
    """tests/ranks/host_work.py's records for these cases on world_size real ranks (gloo), from the plan the
    launcher would hand a run's workers (caught before any starts)."""
    from scalelab.run import launch

    plan_path = tmp / "run_plan.json"

    def caught(plan, *args):
        plan.write(plan_path)
        return "failed", "caught", [], {}

    original = launch._run_workers
    launch._run_workers = caught
    try:
        calibration = suite_calibration(data) if cfg["train"]["device"] == "cpu" else None
        launch.launch_run(cfg, local_plan(cfg, RunPoint("fp32", 0, 1)), data, tmp / "run", tmp / "run.log", calibration=calibration)
    finally:
        launch._run_workers = original
    return strategy_steps(tmp / "host-work.json", world_size, "--plan", str(plan_path), "--steps", str(steps), *args,
                          *[arg for case in cases for arg in ("--case", case)], script="host_work.py", timeout_s=240)


def excess(ours: dict, plain: dict) -> list[str]:
    """What scalelab's step issues beyond HOST_WORK_MARGIN, each with the operators it adds (empty: none)."""
    extra = {op: round(n - plain["by_op"].get(op, 0), 1) for op, n in ours["by_op"].items() if n > plain["by_op"].get(op, 0)}
    added = dict(sorted(extra.items(), key=lambda kv: -kv[1])[:12])
    return [f"scalelab's step issues {ours[what]:g} {what}, the plain FSDP2 loop's {plain[what]:g}; the operators "
            f"scalelab adds: {added}" for what, margin in HOST_WORK_MARGIN.items() if ours[what] > plain[what] + margin]
