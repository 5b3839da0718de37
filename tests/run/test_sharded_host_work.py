"""scalelab's sharded stages against the plain FSDP2 loop (scalelab.harness.plain_loop, torchtitan's recipe),
on real gloo ranks through the worker's own setup and train_step (tests/ranks/host_work.py):

- from the same weights and batches, the plain loop's fp32 losses are scalelab's stage-3 losses;
- the host-side work of a step, what decides a GPU's step when the host cannot launch kernels fast enough
  (a stage-3 step on an H200 ran 2,729 kernels, the device idle half of it): scalelab's step may issue at
  most HOST_WORK_MARGIN more ATen operators, copies and fills than the plain loop's, at stages 2 and 3 and
  hybrid, bf16, eager, and no more optimizer work. Stage 1 is DDP's: FSDP2 has no peer of it.

What a GPU runs that a CPU does not (CUDA autocast's fp32 LayerNorm, compiled kernels) is for tests/gpu/test_stages.py
and the GPU check's stages part (scalelab.harness.stage_check) to measure.
"""
from __future__ import annotations

import pytest

from scalelab.harness.testing import tiny_config
from support.host_work import excess, host_work

CASES = ("fp32:3", "bf16:2", "bf16:3", "bf16:hybrid")
STEPS = 2


@pytest.fixture(scope="module")
def records(tmp_path_factory, tiny_data) -> dict:
    """Every case on two ranks (hybrid: 2 replicas of one shard), two steps warm, two counted, three timed."""
    return host_work(tmp_path_factory.mktemp("host-work"), tiny_data, tiny_config(), 2, CASES, steps=STEPS)


def test_the_plain_fsdp2_loop_gives_scalelabs_stage_3_losses(records):
    sides = records["fp32:3"]
    assert len(sides["scalelab"]["losses"]) == 2 + 2 * STEPS + 1
    assert sides["plain"]["losses"] == sides["scalelab"]["losses"]  # bit for bit: the same ops in the same order
    assert sides["plain"]["losses"][0] != sides["plain"]["losses"][-1]  # it trained: the loss moved


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("bf16")])
def test_a_sharded_step_issues_no_more_host_work_than_the_plain_fsdp2_loop(records, case):
    ours, plain = records[case]["scalelab"], records[case]["plain"]
    assert excess(ours, plain) == [], case
    assert ours["optimizer_params"] == plain["optimizer_params"] and ours["fused"] == plain["fused"]
