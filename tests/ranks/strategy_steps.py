"""One rank of a multi-rank test (started by the test with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in its environment): for each stage x precision asked for, scalelab's own strategy
wrapper, optimizer and loss scaler (scalelab.run.parallel, scalelab.run.precision) take
steps as the worker takes them (scale, backward, unscale, clip, step, update) on one global batch
split over the ranks, over gloo, on the CPU or on a GPU (every rank on the same one).
``--tensor-parallel T``: the model split over T ranks first (the worker's 2-D mesh, data-parallel
outer), the batch split over the data-parallel ranks only.

Recorded per case: the global loss of each step, whether the optimizer is fused, what the scaler
hands the optimizer's kernel (found_inf, grad_scale: shape and value), the loss scale around each
step and whether the parameters changed. ``--inject-inf``: step 1 gets a non-finite gradient on
rank 1 only, step 2 on every rank (as an fp16 overflow in backward reaches every rank through the
gradient reduction). Rank 0 writes the records as JSON to --out; a case that raises is recorded
with its error, so one collective gloo lacks does not hide the others.

Used by tests/run/test_fused_contract.py (CPU) and tests/gpu/test_gpu.py (CUDA tensors over gloo).
"""
import argparse
import datetime
import os

import torch
import torch.distributed as dist
from rank_records import recorded, write_and_close

from scalelab.config import ModelConfig
from scalelab.formulas import communication
from scalelab.run.model import build_model
from scalelab.run.parallel import clip_grad_norm, parallelize, reduce_partial_grads
from scalelab.run.precision import autocast, grad_scaler

SHAPE = ModelConfig(n_layers=2, d_model=32, n_heads=2, seq_len=16, vocab_size=64)
GLOBAL_BATCH = 4  # sequences per step, split over the ranks


def record_hand_over(optimizer, seen: list) -> None:
    """Wrap optimizer.step: what GradScaler.step set on the optimizer for its kernel at the moment of the call."""
    original = optimizer.step

    def step(*args, **kwargs):
        handed = {name: getattr(optimizer, name) for name in ("found_inf", "grad_scale") if getattr(optimizer, name, None) is not None}
        seen.append({name: {"shape": list(t.shape), "value": float(t.reshape(-1)[0])} for name, t in handed.items()})
        return original(*args, **kwargs)

    optimizer.step = step


def case(stage: int, precision: str, device: torch.device, steps: int, inject_inf: bool, tensor_parallel: int = 1,
         sequence_parallel: bool = False) -> dict:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build_model(SHAPE).to(device)
    dp_mesh = None
    if tensor_parallel > 1:  # as the worker builds it
        from torch.distributed.device_mesh import init_device_mesh

        from scalelab.run.tensor_parallel import apply_tensor_parallel

        mesh = init_device_mesh(device.type, (world_size // tensor_parallel, tensor_parallel), mesh_dim_names=("dp", "tp"))
        apply_tensor_parallel(model, mesh["tp"], sequence_parallel)
        dp_mesh = mesh["dp"]
    dtypes = communication.comm_dtypes(precision, stage)
    par = parallelize(model, stage, device, 1e-3, 0.1,
                      param_dtype=None if dtypes.param_gather in (None, "float32") else getattr(torch, dtypes.param_gather),
                      reduce_dtype=getattr(torch, dtypes.grad_reduce), dp_mesh=dp_mesh, tensor_parallel=tensor_parallel)
    scaler = grad_scaler(precision, device, 2.0 ** 8)
    local = par.local_optimizer()
    seen: list = []
    record_hand_over(par.optimizer, seen)
    if local is not par.optimizer:  # ZeRO-1: its wrapped local optimizer steps too
        record_hand_over(local, seen)
    records = []
    data_ranks, data_rank = world_size // tensor_parallel, rank // tensor_parallel  # a tensor-parallel group shares its tokens
    per_rank = GLOBAL_BATCH // data_ranks
    for step in range(steps):
        batch = torch.randint(0, SHAPE.vocab_size, (GLOBAL_BATCH, SHAPE.seq_len + 1), generator=torch.Generator().manual_seed(step))
        tokens = batch[data_rank * per_rank:(data_rank + 1) * per_rank].to(device)
        with autocast(precision, device):
            loss = par.model(tokens[:, :-1], tokens[:, 1:])
        scaler.scale(loss).backward()
        if inject_inf and ((step == 1 and rank == 1) or step == 2):
            grad = next(p.grad for p in par.model.parameters() if p.grad is not None)
            (grad.to_local() if hasattr(grad, "to_local") else grad).view(-1)[0] = float("inf")
        reduce_partial_grads(par)
        before = [p.detach().clone() for p in par.model.parameters()]
        scale_before = scaler.get_scale() if scaler.is_enabled() else None
        scaler.unscale_(par.optimizer)
        clip_grad_norm(par, 1.0, device)
        scaler.step(par.optimizer)
        scaler.update()
        global_loss = loss.detach().float().clone()
        dist.all_reduce(global_loss)  # a tensor-parallel group's ranks hold the same loss: the mean is unchanged
        records.append({"loss": float(global_loss) / world_size, "scale_before": scale_before,
                        "scale_after": scaler.get_scale() if scaler.is_enabled() else None,
                        "params_unchanged": all(torch.equal(a, b) for a, b in zip(before, par.model.parameters()))})
        par.optimizer.zero_grad(set_to_none=True)
    return {"fused": bool(local.defaults.get("fused")), "optimizer": type(par.optimizer).__name__,
            "scaler": type(scaler).__name__, "handed": seen, "steps": records}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--stages", default="0,1,2,3")
    parser.add_argument("--precisions", default="fp32,bf16,fp16")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--inject-inf", action="store_true")
    parser.add_argument("--tensor-parallel", type=int, default=1)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--backend", default="gloo", help="gloo (every rank on --device), or nccl (rank r on cuda:r)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if args.backend == "nccl" else torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=60))
    results = []
    for stage in map(int, args.stages.split(",")):
        for precision in args.precisions.split(","):
            results.append(recorded({"stage": stage, "precision": precision}, lambda stage=stage, precision=precision: case(
                stage, precision, device, args.steps, args.inject_inf, args.tensor_parallel, args.sequence_parallel)))
            dist.barrier()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    write_and_close(args.out, gathered)


if __name__ == "__main__":
    main()
