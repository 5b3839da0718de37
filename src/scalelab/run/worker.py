"""The training worker: one process per rank (``python -m scalelab.run.worker``), started by the launcher.

It reads the run's plan (scalelab.planning.run_plan, run_plan.json) written by :mod:`scalelab.run.launch`, trains for ``train.steps`` steps,
and has rank 0 write ``worker_result.json`` (run-level measurements) and
``progress.jsonl`` (one line per step) into the run folder. The launcher turns those into
the run's ``summary.json`` and ``steps.parquet``, and decides the status when a rank fails.
A rank that raises writes ``rank<R>.error.json`` first, so the launcher can tell OOM from
a timeout from a crash.

:func:`train` is :func:`scalelab.run.rank_setup.setup` (everything before the first step), with the
``compile`` lever :func:`compile_warm_up` (compilation, timed apart), a loop of :func:`train_step` (one
optimizer step) and the timing steps after it, then :func:`scalelab.run.worker_result.gather` (every rank)
and :func:`scalelab.run.worker_result.results` (rank 0's ``worker_result.json``). :func:`rank_main` is
one rank from its plan to its torn-down process group. Tests and fault drills inject faults from
``SCALELAB_FAULT`` through one hook, :meth:`scalelab.run.fault_injection.Fault.inject`.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib
import json
import math
import os
import sys
import time
import traceback
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh  # imported by torch itself: free

from scalelab.config import HALF_BATCH_SHARE, TrainConfig
from scalelab.io import write_json
from scalelab.planning.placement import LAUNCHER_SLOT_ENV
from scalelab.planning.run_plan import RunPlan
from scalelab.registries.precisions import precision as precision_record
from scalelab.registries.strategies import strategy
from scalelab.run.activations import LiveSavedBytes, SavedActivationMeter
from scalelab.run.calibration import pin_this_rank, steal_share
from scalelab.run.comm import FunctionalCollectiveCounter
from scalelab.run.devices import gpu_state, synchronize
from scalelab.run.fault_injection import Fault
from scalelab.run.parallel import (
    clip_grad_norm,
    compiled_graphs,
    reduce_partial_grads,
)
from scalelab.run.precision import autocast, unsupported_reason
from scalelab.run.progress import Progress
from scalelab.run.rank_setup import Run, setup
from scalelab.run.trace import StepTracer
from scalelab.run.worker_result import Tally, gather, results


def lr_at(step: int, train: TrainConfig) -> float:
    """Linear warm-up over warmup_steps, then cosine decay to 10% of the peak."""
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    progress = (step - train.warmup_steps) / max(1, train.steps - train.warmup_steps)
    return train.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass
class StepOutcome:
    """What train_step hands the loop to record."""
    loss: torch.Tensor  # the global batch's mean loss over every rank
    grad_norm: torch.Tensor  # before clipping
    loss_scale: float | None  # the fp16 loss scale this step used; None without a scaler
    skipped: bool  # the scaler skipped the optimizer step (a non-finite gradient on some rank)
    time_s: float
    activations: dict | None  # bytes saved for backward by the first micro-batch, when asked to measure


def train_step(run: Run, step: int, measure_activations: bool) -> StepOutcome:
    """One optimizer step on this rank's share of the global batch: the micro-batches with
    gradient accumulation, loss scaling, clipping; then the global loss, outside the
    communication count. Fault points: before the step and after backward."""
    par, scaler, device = run.par, run.scaler, run.device
    run.fault.inject("before_step", step, run.rank)
    start = time.perf_counter()

    tokens = torch.from_numpy(run.sampler.batch(step, run.data_rank, run.micro * run.accum, run.data_ranks)).to(device, non_blocking=True)
    loss_sum = torch.zeros((), device=device)
    activations = None
    if run.pipe is not None:  # the schedule runs every micro-batch's forward and backward over the stages
        loss_sum = pipeline_step(run, tokens, measure_activations)
    for m in range(run.accum if run.pipe is None else 0):
        chunk = tokens[m * run.micro:(m + 1) * run.micro]
        measure = measure_activations and m == 0
        with par.no_sync(m == run.accum - 1):
            meter = SavedActivationMeter(par.model, run.blocks) if measure else contextlib.nullcontext()
            with meter, autocast(run.point.precision, device):
                loss = par.model(chunk[:, :-1], chunk[:, 1:])
            if measure:
                activations = {"inside": meter.inside_blocks, "outside": meter.outside_blocks}
            scaler.scale(loss / run.accum).backward()
        loss_sum += loss.detach()
    reduce_partial_grads(par)  # sequence parallelism's partial gradients, where no FSDP2 reduction summed them
    run.fault.inject("after_backward", step, run.rank, model=par.model)
    # The scale the step used, kept on the device until the step ends: get_scale() (.item()) here
    # would make the host wait for the backward mid-step, a synchronisation a plain loop has not.
    scale_before = scaler._get_scale_async().clone() if scaler.is_enabled() else None
    scaler.unscale_(par.optimizer)
    max_norm = run.train_cfg.grad_clip if run.train_cfg.grad_clip > 0 else float("inf")
    grad_norm = clip_grad_norm(par, max_norm, device)
    scaler.step(par.optimizer)
    scaler.update()
    synchronize(device)
    step_time = time.perf_counter() - start
    scale_before = float(scale_before) if scale_before is not None else 1.0

    # Measurement: the global batch's loss (mean over ranks) and the skip flag.
    with run.counter.paused():
        loss_global = loss_sum / run.accum
        dist.all_reduce(loss_global, op=dist.ReduceOp.SUM)  # gloo has no AVG
        loss_global /= run.world_size // run.pipeline_parallel  # the last stage's ranks hold the losses
    scale_after = scaler.get_scale() if scaler.is_enabled() else 1.0
    return StepOutcome(loss=loss_global, grad_norm=grad_norm,
                       loss_scale=scale_before if scaler.is_enabled() else None,
                       skipped=bool(scaler.is_enabled() and scale_after < scale_before),
                       time_s=step_time, activations=activations)


def pipeline_step(run: Run, tokens: torch.Tensor, measure_held: bool) -> torch.Tensor:
    """One step's schedule on this rank's stages (scalelab.run.pipeline), counted while the step is, its busy share
    and timeline kept for a timed step; ``measure_held``: the block activations it holds at most, measured."""
    from scalelab.run import pipeline

    pipe = run.pipe
    pipe.counting = run.counter.enabled
    meter = LiveSavedBytes(run.blocks) if measure_held else contextlib.nullcontext()
    with meter:
        loss_sum = pipeline.step(pipe, tokens)
    if measure_held:
        run.pipe_held = meter.peak
    if run.counter.enabled:
        run.pipe_busy.append(pipe.busy_share())
        run.pipe_timeline, run.pipe_timeline_start = list(pipe.timeline), pipe.step_start_unix
    return loss_sum


def compile_warm_up(run: Run) -> tuple[float, int]:
    """Compile before the first step, so that no step time holds compilation: one forward and
    backward of the first step's first micro-batch (the shapes every step uses), under the
    run's autocast, gradients dropped. Returns (seconds, graphs compiled).

    It leaves what the loop computes unchanged: no optimizer step, no loss scaler, the
    gradients set to None (as between steps), the RNG state restored, DDP's all-reduce
    skipped (Parallelized.throwaway_backward), communication uncounted. The seconds are
    compilation plus one micro-batch's compiled forward and backward (milliseconds); a warm
    inductor cache (TORCHINDUCTOR_CACHE_DIR) makes a repeated run compile faster. Under pipeline parallelism one
    whole step of the schedule (every stage's chunks compile on their own micro-batches), its seconds that step's."""
    par, device = run.par, run.device
    graphs_before = compiled_graphs()
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    tokens = torch.from_numpy(run.sampler.batch(run.start_step, run.data_rank, run.micro * run.accum, run.data_ranks)).to(device)
    chunk = tokens[:run.micro]
    start = time.perf_counter()
    with run.counter.paused(), par.throwaway_backward():
        if run.pipe is not None:  # a whole step of the schedule: every stage compiles, and infers what it sends
            from scalelab.run import pipeline

            run.pipe.counting = False
            pipeline.step(run.pipe, tokens)
        else:
            with autocast(run.point.precision, device):
                loss = par.model(chunk[:, :-1], chunk[:, 1:])
            loss.backward()
    synchronize(device)
    seconds = time.perf_counter() - start
    for p in par.model.parameters():
        p.grad = None
    torch.set_rng_state(rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state(cuda_rng, device)
    return seconds, compiled_graphs() - graphs_before


class Diverged(RuntimeError):
    """The loss is no longer finite: every further step would measure nothing."""


class Unsupported(RuntimeError):
    """The error type of a rank whose device cannot run the point (written by :func:`preflight`):
    the launcher records the run `skipped` with the message as the reason
    (scalelab.run.ranks.classify_failure)."""


def train(plan: RunPlan, rank_cores: str | None = None) -> None:
    """Set up, run the steps this attempt has left, and have rank 0 write the results."""
    run = setup(plan, rank_cores)
    cfg = run.train_cfg
    tally = Tally()
    if run.point.compile and plan.compile_warm_up:
        tally.compile_time_s, tally.compile_graphs = compile_warm_up(run)
    graphs_before_loop = compiled_graphs()
    if run.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(run.device)
    tally.start_loop()
    log = Progress(cfg.steps, run.tokens_per_step, run.device, run.start_step, measure_s=cfg.measure_s,
                   warmup_steps=cfg.warmup_steps, half_batch_share=HALF_BATCH_SHARE if run.micro >= 2 else 0.0)
    tracer = StepTracer(cfg.profile, cfg.profile_stacks, cfg.memory_snapshot, run.device, run.run_dir, run.rank)
    tally.gpu_start = gpu_state(run.device) if run.rank == 0 else {}
    first_measured = first_measured_step(run)  # the attempt's first timed and counted step
    try:
        _steps(run, tally, tracer, log, first_measured)
    except torch.OutOfMemoryError:
        tracer.dump_memory(oom=True)  # what the allocator held when it ran out (train.memory_snapshot)
        raise
    if tracer.memory and cfg.profile is None:
        tracer.dump_memory()  # no traced steps to dump after: the whole run's history
    if plan.save_final_params:
        save_final_params(run)  # the trained model: before any timing step moves it
    run.counter.enabled = True  # timing steps are measured, whatever the attempt's last step was
    if first_measured >= cfg.steps:  # no training step was measured: the loop's time starts here
        tally.start_loop()
    tally.timing_steps = extend_measurement(run, tally)
    tally.half_batch_step_times = measure_token_share(run, tally)
    run.counter.enabled = False
    tally.end_loop()
    tally.gpu_end = gpu_state(run.device) if run.rank == 0 else {}
    if run.point.compile:
        tally.compile_graphs_in_loop = compiled_graphs() - graphs_before_loop

    gathered = gather(run, steal_share(tally.ticks_start, tally.ticks_end))
    if run.rank == 0:
        result = results(run, tally, gathered)
        run.progress.close()
        write_json(run.run_dir / "worker_result.json", result)


@contextlib.contextmanager
def tensor_parallel_count(run: Run, step: int):
    """Counts tensor parallelism's collectives (DTensor's functional ones, which CommCounter's wrappers do
    not see) over the warm-up steps of an eager run, with a dispatch mode the timed steps do without
    (it sees every operator); a compiled block runs them inside its graph, out of the mode's sight."""
    if (run.tensor_parallel == 1 or step >= run.train_cfg.warmup_steps or run.point.compile
            or infers_shapes(run, step)):
        yield
        return
    counter = FunctionalCollectiveCounter()
    with counter:
        yield
    run.tp_bytes += sum(counter.group_bytes.values())
    run.tp_steps += 1
    for key, nbytes in counter.group_bytes.items():
        run.tp_by_group[key] = run.tp_by_group.get(key, 0) + nbytes


def infers_shapes(run: Run, step: int) -> bool:
    """Whether torch's pipeline schedule infers the shapes its stages send in this step: the attempt's first, with a
    forward and a backward of its own (at ZeRO-3 two more gathers of the stage), unless a compile warm-up ran a whole
    step of the schedule before the loop."""
    return (run.pipe is not None and step == run.start_step
            and not (run.point.compile and run.plan.compile_warm_up))


def metered_step(run: Run) -> int:
    """The attempt's step its saved activations are metered in (saved-tensor hooks): its first, or under pipelining
    its second (the first infers the shapes its stages send, and the second holds what the stages hold at once)."""
    return run.start_step + 1 if run.pipe is not None else run.start_step


def first_measured_step(run: Run) -> int:
    """The attempt's first timed and counted step: the first after warm-up. An attempt resumed past warm-up also
    leaves out its cold steps, which the uninterrupted run's warm-up hides: its first (where a pipeline infers its
    shapes: a forward and a backward of its own, two more gathers at ZeRO-3) up to the one its activations are
    metered in; where no timing steps (train.measure_s) follow, the last training step is measured whatever it is."""
    cfg = run.train_cfg
    if run.start_step == 0:
        return cfg.warmup_steps
    cold_until = metered_step(run) + 1
    if not cfg.measure_s:
        cold_until = min(cold_until, cfg.steps - 1)
    return max(cfg.warmup_steps, cold_until)


def _steps(run: Run, tally: Tally, tracer: StepTracer, log: Progress, first_measured: int) -> None:
    """The training steps this attempt has left (traced ones, train.profile, left out of the timings)."""
    cfg = run.train_cfg
    for step in range(run.start_step, cfg.steps):
        lr = lr_at(step, cfg)
        for group in run.par.optimizer.param_groups:
            group["lr"] = lr
        run.counter.enabled = step >= first_measured
        if step == first_measured:
            tally.start_loop()  # whole-loop time, measurement included
        if tally.first_step_at is None:
            tally.first_step_at = time.time()
        measure = step == metered_step(run) if run.pipe is not None else tally.activations is None
        with tracer.step(step), tensor_parallel_count(run, step):
            out = train_step(run, step, measure_activations=measure)
        if out.activations is not None:
            tally.activations = out.activations
        tally.skipped_steps += out.skipped
        if step >= first_measured and not tracer.traced(step):  # a traced step pays the profiler's bookkeeping
            tally.step_times.append(out.time_s)
        if run.progress is not None:
            record = {
                "step": step, "loss": out.loss.item(), "grad_norm": float(out.grad_norm),
                "lr": lr, "loss_scale": out.loss_scale,
                "skipped": out.skipped, "step_time_s": out.time_s, "tokens": run.tokens_per_step,
            }
            run.progress.write(json.dumps(record) + "\n")
            run.progress.flush()
            if log.due(step):  # rank 0's stdout is the run's log
                print(log.line(step, record["loss"], out.time_s), flush=True)
        loss = out.loss.item()  # the global batch's loss, the same on every rank: all stop together
        if not math.isfinite(loss):
            raise Diverged(f"the loss became {loss} at step {step}: training diverged (lr={lr:g})")
        if step < cfg.steps - 1:
            run.par.optimizer.zero_grad(set_to_none=True)
            if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                from scalelab.run import checkpoint  # imported by resume() already

                with run.counter.paused():
                    checkpoint.save(run.ckpt_root, step, run.par, run.scaler)


MAX_TIMING_STEPS = 10_000
"""At most this many timing steps past train.steps (extend_measurement): a bound, whatever measure_s says."""


def extend_measurement(run: Run, tally: Tally) -> int:
    """Timing steps: past train.steps, more optimizer steps until the measured steps (after warm-up)
    add up to train.measure_s seconds, so that a run's speed is measured over what it must resolve,
    not over a step count (a fast configuration's 50 steps last half a second, which a few seconds of
    anything else on the host swing). They train on (at the last step's learning rate) but
    are not training steps: no step record, no loss, not in final_params.pt or the loss curve; the
    summary counts them (timing_steps). Every rank stops at the same step: the decision is all-reduced
    (the smallest vote), outside the communication count."""
    cfg = run.train_cfg
    if not cfg.measure_s:
        return 0
    for group in run.par.optimizer.param_groups:
        group["lr"] = lr_at(cfg.steps - 1, cfg)
    return _until(run, tally.step_times, cfg.measure_s, cfg.steps)


def _until(run: Run, times: list[float], seconds: float, step_from: int, at_least: int = 0) -> int:
    """Take optimizer steps (numbered from step_from), appending each one's time to ``times``,
    until they add up to ``seconds`` and number at least ``at_least`` on every rank (each rank stops at
    the same step: the decision is all-reduced, any rank short of it takes one more, outside the
    communication count; rank 0's times are the run's, so a smallest vote left them short);
    at most MAX_TIMING_STEPS. Returns how many it took."""
    n = 0
    while n < MAX_TIMING_STEPS:
        more = torch.tensor(int(sum(times) < seconds or len(times) < at_least), device=run.device)
        with run.counter.paused():
            dist.all_reduce(more, op=dist.ReduceOp.MAX)
        if not more.item():
            break
        run.par.optimizer.zero_grad(set_to_none=True)
        times.append(train_step(run, step_from + n, measure_activations=False).time_s)
        n += 1
    return n


HALF_BATCH_MIN_STEPS = 5


def measure_token_share(run: Run, tally: Tally) -> list[float]:
    """Steps at half the micro-batch, after the measured steps: with the measured window's median
    step time they give the **token share** of this configuration's step, the part that grows with
    the tokens a rank processes (scalelab.results.prediction: it carries a measured step to another
    micro-batch or world size; a share assumed instead spans a band from its estimate to 1).
    Taken when train.measure_s is set, for HALF_BATCH_SHARE of it (at least
    HALF_BATCH_MIN_STEPS steps); none where the micro-batch is a single sequence. Like timing steps,
    they train on but are no training steps, and count in no run-level timing but this one."""
    cfg = run.train_cfg
    if not cfg.measure_s or run.micro < 2 or run.pipe is not None:  # a pipeline's stages send the shapes they inferred
        return []
    full, run.micro = run.micro, run.micro // 2
    times: list[float] = []
    try:
        with run.counter.paused():  # the run's bytes per step are its full batch's
            _until(run, times, HALF_BATCH_SHARE * cfg.measure_s, cfg.steps + tally.timing_steps, HALF_BATCH_MIN_STEPS)
    finally:
        run.micro = full
    return times


def save_final_params(run: Run) -> None:
    """The whole final parameters to final_params.pt (rank 0; every rank gathers its shards)."""
    from scalelab.run.tensor_parallel import full_state

    if run.pipe is not None:  # every stage's part, on rank 0
        from scalelab.run.pipeline import whole_state

        full = whole_state(run.pipe, run.tensor_parallel, sends=run.data_rank == 0 and run.rank % run.tensor_parallel == 0)
    else:
        full = full_state(run.par.model, run.tensor_parallel)  # DTensors gathered, a fused q, k, v in the model's order
    if run.rank == 0:
        torch.save({k.removeprefix("module.").replace("_orig_mod.", ""): v for k, v in full.items()},
                   run.run_dir / "final_params.pt")


def pin_cpu_rank(plan: RunPlan) -> str | None:
    """A CPU rank takes its own cores (its launcher's allowed cores split by local rank) before
    torch's intra-op threads start, which inherit the affinity: ranks neither share a core nor
    migrate. Returns the launcher's core plan the row states (``rank_cores``); None on a GPU."""
    if plan.device != "cpu":
        return None
    return pin_this_rank(int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                         plan.threads_per_rank, int(os.environ.get(LAUNCHER_SLOT_ENV) or 0))


def preflight(plan: RunPlan) -> bool:
    """Whether this device cannot run this point's precision; if so, this rank says why in its
    error file (type Unsupported: the launcher records the run `skipped` with the reason) before
    any process group exists. The launcher checks what it can without importing torch
    (scalelab.run.launch.skip_reason); this check needs torch, so a CPU run's is made here."""
    reason = unsupported_reason(plan.point.precision, torch.device(plan.device), plan.train.fp8_emulate)
    if reason is None:
        return False
    rank = int(os.environ.get("RANK", 0))
    write_json(Path(plan.run_dir) / f"rank{rank}.error.json", {
        "rank": rank, "type": Unsupported.__name__, "message": reason, "time": time.time(), "traceback": ""})
    if rank == 0:
        print(f"scalelab worker: not run: {reason}", flush=True)
    return True


def modules_this_run_imports(zero_stage: int, precision: str, checkpointing: bool) -> list[str]:
    """The heavy modules this run's code imports on its way to the first step, to import before
    the process group exists. Imported for the first time deeper down (TorchDynamo from DDP's
    constructor or FSDP2, torch 2.13; ZeroRedundancyOptimizer's package once DDP is built; DCP in
    resume(), the fp16 loss scaler), they left the process group referenced after destroy_process_group() (shutdown()'s
    warning in the run's log, measured on stages 0, 1 and 3); imported here they cost no more."""
    modules = ["torch._dynamo"]
    if strategy(zero_stage).wrapper == "parallelize_zero1":
        modules.append("torch.distributed.optim")
    if precision_record(precision).loss_scaling:
        modules.append("torch.distributed.fsdp.sharded_grad_scaler")  # scalelab.run.precision.grad_scaler
    if checkpointing:
        modules.append("scalelab.run.checkpoint")
    return modules


def read_plan(argv: list[str] | None = None) -> RunPlan:
    parser = argparse.ArgumentParser(description="scalelab training worker (one rank; started by scalelab.run.launch)")
    parser.add_argument("--plan", required=True, help="the run's plan (run_plan.json) written by scalelab.run.launch")
    return RunPlan.read(parser.parse_args(argv).plan)


def main(argv: list[str] | None = None) -> int:
    return rank_main(read_plan(argv))


def rank_main(plan: RunPlan) -> int:
    """One rank of the plan: pinned, checked, in its process group, trained, torn down."""
    rank_cores = pin_cpu_rank(plan)  # what the run's row states; set before the threads start
    torch.set_num_threads(plan.threads_per_rank)
    if preflight(plan):
        return 3
    for module in modules_this_run_imports(plan.point.zero_stage, plan.point.precision, bool(plan.train.checkpoint_every)):
        importlib.import_module(module)
    backend = "nccl" if plan.device == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=float(plan.train.collective_timeout_s))
    dist.init_process_group(backend, timeout=timeout)
    rank = dist.get_rank()
    try:
        train(plan, rank_cores)
    except BaseException as err:
        write_json(Path(plan.run_dir) / f"rank{rank}.error.json", {
            "rank": rank, "type": type(err).__name__, "message": str(err)[:4000], "time": time.time(),
            "traceback": traceback.format_exc()[-8000:],
        })
        raise
    Fault.from_env().inject("teardown", 0, rank)  # a teardown fault names no step: step 0
    shutdown()
    return 0


def shutdown() -> None:
    """Tear the process group down while the interpreter is whole.

    gloo's worker threads free a finished collective (its tensors, and through a barrier's
    weak references the collectives before it) after the caller has moved on, and freeing a
    tensor that Python created takes the GIL. A thread that asks for the GIL once the
    interpreter is finalizing is ended by Python with pthread_exit inside a C++ destructor:
    std::terminate, "terminate called without an active exception", SIGABRT. The process
    group's destructor joins those threads with the GIL released, so it must run here, inside
    destroy_process_group(), which drops only torch's own references. Others remain: DDP
    (stages 0, 1) keeps the group in its comm-hook list, in reference cycles that only the
    finalizing interpreter's collection frees; FSDP2's DeviceMesh (stages 2, 3) keeps it in its
    group registry, and DTensor's global caches keep the mesh, so that group is never destroyed.
    """
    world = weakref.ref(dist.group.WORLD)
    # A barrier right before tear-down: without it gloo's destroy_process_group() hung
    # intermittently on torch 2.13 CPU.
    dist.barrier()
    gc.collect()  # the strategy's wrappers, left in reference cycles by train()
    for obj in gc.get_objects():
        # the class, not isinstance: DeviceMesh's metaclass inspects the instance, and one object
        # here is torch.distributed's deprecated reduce_op, which warns when touched (a
        # FutureWarning per rank in every run's log)
        if issubclass(type(obj), DeviceMesh):
            getattr(obj, "_pg_registry", {}).clear()
    dist.destroy_process_group()  # drops the last reference: the group joins its threads
    if world() is not None:
        print("scalelab worker: the process group is still referenced after destroy_process_group(); "
              "its gloo threads outlive the interpreter and may abort the process at exit", file=sys.stderr, flush=True)


if __name__ == "__main__":
    from scalelab.run.prefork import run_forked

    # A CPU rank runs in a child forked after the imports, as the prefork server's ranks do: the same
    # peak RSS either way (run_forked). A GPU rank never forks (CUDA and fork do not mix).
    plan = read_plan()
    # an exception propagates: its traceback and exit status
    code = run_forked(lambda: rank_main(plan)) if plan.device == "cpu" else rank_main(plan)
    # Results written, process group torn down: skip the interpreter's finalization, which takes
    # about a second with torch and TorchDynamo loaded (measured: main returned 1.2 s before the
    # launcher saw the rank exit), i.e. ~25 s of a default sweep, and is where gloo threads used to
    # abort a finished run (shutdown's docstring). The launcher kills the run's process group once
    # its ranks exit, so nothing a library started (inductor's compile workers) outlives the run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
