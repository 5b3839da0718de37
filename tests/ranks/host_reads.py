"""One rank of a multi-rank test (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in its environment)
that takes steps through scalelab's own worker (``setup``, ``train_step``) from a run's plan (run_plan.json),
for each precision x stage asked for, and records every host read of a tensor's value (``item``,
``float``, ``int``, ``bool``, ``tolist``) made between a step's start and its end-of-step
``synchronize``, with the line that made it.

On a GPU such a read makes the host wait for the queued work mid-step, so the kernels queued after it
start late: a synchronisation a plain training loop does not have (issue #40's fp16 runs read the loss
scale after backward). On the CPU nothing waits, but the reads are the same code: this is the contract
a GPU step needs, checked without one. Rank 0 writes {case: [reads]} as JSON to --out.

Used by tests/run/test_fused_contract.py.
"""
import argparse
import dataclasses
import json
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from scalelab.formulas.communication import comm_dtypes
from scalelab.planning.run_plan import RunPlan
from scalelab.planning.sweep import micro_batch_plan
from scalelab.run import worker
from scalelab.run.rank_setup import setup

READS = ("item", "__float__", "__int__", "__bool__", "tolist")


def reads_during_steps(plan: RunPlan, steps: int) -> list[str]:
    run = setup(plan)
    reads, window = [], {"open": False}
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def recorded(name):
        def read(self, *args, **kwargs):
            if window["open"]:  # "item in <the function that read> from <scalelab's line that led there>"
                stack = traceback.extract_stack()[:-1]
                ours = next((f for f in reversed(stack) if "/torch/" not in f.filename), stack[-1])
                reads.append(f"{name} in {stack[-1].name} from {Path(ours.filename).name}:{ours.lineno}")
            return originals[name](self, *args, **kwargs)
        return read

    sync = worker.synchronize

    def synchronize(device):
        window["open"] = False
        sync(device)

    for name in READS:
        setattr(torch.Tensor, name, recorded(name))
    worker.synchronize = synchronize
    try:
        for step in range(steps):
            window["open"] = True
            worker.train_step(run, step, measure_activations=False)
            window["open"] = False
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
        worker.synchronize = sync
    return reads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True, help="a run's run_plan.json (scalelab.run.launch)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--case", action="append", required=True, help="precision:stage, e.g. fp16:0")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    base = RunPlan.read(args.plan)
    torch.set_num_threads(base.threads_per_rank)  # as a rank of the worker sets them (its calibration's thread count)
    records = {}
    for case in args.case:
        precision, stage = case.split(":")
        point = dataclasses.replace(base.point, precision=precision, zero_stage=int(stage), world_size=dist.get_world_size())
        micro, accumulation = micro_batch_plan(base.train, point.world_size, point.micro_batch)
        plan = dataclasses.replace(base, point=point, micro_batch=micro, accumulation_steps=accumulation,
                                   comm=comm_dtypes(precision, int(stage), point.grad_reduce),
                                   run_dir=f"{base.run_dir}-{precision}-z{stage}")
        Path(plan.run_dir).mkdir(parents=True, exist_ok=True)
        records[case] = reads_during_steps(plan, args.steps)
        dist.barrier()
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(records, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
