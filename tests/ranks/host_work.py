"""One rank of a multi-rank test (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in its environment): the host-side
work of one training step, counted without a GPU, for scalelab's sharded step (the worker's own ``setup`` and
``train_step`` from a run's plan, run_plan.json) and for the plain FSDP2 loop (scalelab.harness.plain_loop's
torchtitan recipe) from the same weights and the same batches.

For each case (``precision:stage`` or ``precision:hybrid``: stage 3 over replicas x shards; ``:compiled``
appended: each block and the loss compiled on both sides), both sides take ``--warm-up`` steps, then
``--steps`` steps under torch.profiler (CPU activity). Per step, each side records:

- ``ops``: the ATen operators the profiler saw (nested ones included: each is a dispatch the host makes);
  ``copies`` (``aten::copy_``) and ``fills`` (``aten::fill_``), what a GPU runs as copy and fill kernels;
- ``optimizer_ops``: those of the ops inside the optimizer's step, over DTensor shards under FSDP2, and
  ``optimizer_params``, how many tensors it steps; ``fused`` / ``foreach``: its kernels;
- ``hook_s``: the Python time in the modules' forward hooks (FSDP2's all-gather and reshard run there);
- ``by_op``: the count of each operator, to find what one side issues that the other does not;
- ``step_s``: the median wall time of ``--steps`` + 1 further steps, outside the profiler (on a CPU, a tiny
  model's step is mostly the host's own work);
- ``losses``: the global batch's loss of every step (the mean over the ranks).

On a GPU (a plan whose device is cuda) both sides run there, gloo between the ranks: the host work then
includes what CUDA's autocast adds (``--plain-autocast`` runs the plain loop under it too). Rank 0 writes
{case: {"scalelab": ..., "plain": ...}} as JSON to --out. Used by tests/run/test_sharded_host_work.py and
tests/gpu/test_stages.py (through tests/support/host_work.py).
"""
import argparse
import collections
import dataclasses
import json
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from scalelab.formulas.communication import comm_dtypes
from scalelab.harness import plain_loop
from scalelab.planning.run_plan import RunPlan
from scalelab.planning.sweep import micro_batch_plan
from scalelab.run import worker
from scalelab.run.data import BatchSampler
from scalelab.run.model import build_model
from scalelab.run.rank_setup import rank_device, setup


def timed_hooks(model: torch.nn.Module) -> list[float]:
    """Wrap every forward (pre-)hook of the model's modules with a clock; the list's one item sums their time."""
    spent = [0.0]

    def wrapped(hook):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
        return timed

    for module in model.modules():
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for key in list(hooks):
                hooks[key] = wrapped(hooks[key])
    return spent


def counted(step, optimizer, model, warm_up: int, steps: int) -> dict:
    """Take warm_up steps, then count the work of ``steps`` more (step(i) takes step i, returns its global loss)."""
    losses = [step(i) for i in range(warm_up)]
    spent = timed_hooks(model)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        losses += [step(i) for i in range(warm_up, warm_up + steps)]
    ops = [e for e in prof.events() if e.name.startswith("aten::")]

    def in_optimizer(event) -> bool:
        while event is not None:
            if event.name.startswith("Optimizer.step#"):
                return True
            event = event.cpu_parent
        return False

    times = []
    for i in range(warm_up + steps, warm_up + 2 * steps + 1):  # the wall time of a step, outside the profiler
        start = time.perf_counter()
        losses.append(step(i))
        times.append(time.perf_counter() - start)
    by_op = collections.Counter(e.name for e in ops)
    in_step = collections.Counter(e.name for e in ops if in_optimizer(e))
    group = optimizer.param_groups[0]
    return {"ops": len(ops) / steps, "copies": by_op["aten::copy_"] / steps, "fills": by_op["aten::fill_"] / steps,
            "optimizer_ops": sum(in_step.values()) / steps,
            "optimizer_by_op": {k: v / steps for k, v in in_step.most_common()},
            "optimizer_params": sum(len(g["params"]) for g in optimizer.param_groups),
            "fused": bool(group.get("fused")), "foreach": bool(group.get("foreach")),
            "hook_s": spent[0] / steps, "step_s": sorted(times)[len(times) // 2], "by_op": {k: v / steps for k, v in by_op.most_common()}, "losses": losses}


def scalelab_side(plan: RunPlan, warm_up: int, steps: int) -> dict:
    run = setup(plan)
    lr = lambda i: worker.lr_at(i, run.train_cfg)  # noqa: E731

    def step(i: int) -> float:
        for group in run.par.optimizer.param_groups:
            group["lr"] = lr(i)
        out = worker.train_step(run, i, measure_activations=False)
        run.par.optimizer.zero_grad(set_to_none=True)  # as the worker's loop does between steps
        return out.loss.item()

    return counted(step, run.par.local_optimizer(), run.par.model, warm_up, steps)


def plain_side(plan: RunPlan, replicas: int, warm_up: int, steps: int, device: torch.device, autocast: bool) -> dict:
    """The plain FSDP2 loop from the weights scalelab's worker starts from, on the batches it reads; autocast:
    around its forward too, as scalelab runs it over the policy."""
    cfg, train = plan.model, plan.train
    torch.manual_seed(train.seed)  # as the worker builds its model
    weights = build_model(cfg).state_dict()
    model = plain_loop.GPT(cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.seq_len, cfg.vocab_size)
    model.load_state_dict(weights)
    model.to(device)
    reshard = plan.point.zero_stage == 3
    model = plain_loop.fully_shard_model(model, reshard, plan.point.precision, plan.point.compile, replicas)
    optimizer = plain_loop.adamw(model, train.lr, train.weight_decay)
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    dtype = plain_loop.AUTOCAST[plan.point.precision]
    ctx = torch.autocast(device.type, dtype=dtype) if autocast and dtype else nullcontext()
    sampler = BatchSampler(plan.train_bin, plan.token_dtype, cfg.seq_len, train.seed)
    world, rank = dist.get_world_size(), dist.get_rank()

    def step(i: int) -> float:
        for group in optimizer.param_groups:
            group["lr"] = worker.lr_at(i, train)
        tokens = torch.from_numpy(sampler.batch(i, rank, plan.micro_batch, world)).to(device)
        loss = plain_loop.train_step(model, optimizer, scaler, ctx, tokens[:, :-1], tokens[:, 1:])
        loss = loss.detach().clone()
        dist.all_reduce(loss)
        return loss.item() / world

    return counted(step, optimizer, model, warm_up, steps)


def case_plan(base: RunPlan, case: str) -> tuple[RunPlan, int]:
    precision, stage, *compiled = case.split(":")
    replicas = 2 if stage == "hybrid" else 1
    point = dataclasses.replace(base.point, precision=precision, zero_stage=3 if stage == "hybrid" else int(stage),
                                world_size=dist.get_world_size(), replicas=replicas, compile=compiled == ["compiled"])
    micro, accumulation = micro_batch_plan(base.train, point.world_size, point.micro_batch)
    assert accumulation == 1, "one micro-batch a step: the plain loop takes no accumulation"
    plan = dataclasses.replace(base, point=point, micro_batch=micro, accumulation_steps=accumulation,
                               comm=comm_dtypes(precision, point.zero_stage, point.grad_reduce),
                               run_dir=f"{base.run_dir}-{case.replace(':', '-')}")
    Path(plan.run_dir).mkdir(parents=True, exist_ok=True)
    return plan, replicas


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True, help="a run's run_plan.json (scalelab.run.launch)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--case", action="append", required=True, help="precision:stage[:compiled], e.g. bf16:3, bf16:hybrid or bf16:2:compiled")
    parser.add_argument("--warm-up", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--plain-autocast", action="store_true", help="the plain loop under autocast too (scalelab's recipe)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    base = RunPlan.read(args.plan)
    torch.set_num_threads(1)
    records = {}
    for case in args.case:
        plan, replicas = case_plan(base, case)
        records[case] = {"scalelab": scalelab_side(plan, args.warm_up, args.steps)}
        if plan.point.zero_stage != 1:  # ZeRO-1 is DDP's: FSDP2 has no peer of it
            device = rank_device(plan.device)  # the worker's: a GPU rank's own GPU
            records[case]["plain"] = plain_side(plan, replicas, args.warm_up, args.steps, device, args.plain_autocast)
        dist.barrier()
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(records, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
