"""Checkpoint and resume with torch.distributed.checkpoint (DCP).

Layout: ``<run_dir>/checkpoint/step_<N>/`` holds the state after optimizer step N. Every
rank writes into ``step_<N>.tmp/``; after a barrier rank 0 renames it to ``step_<N>/`` (an
atomic rename), so a half-written checkpoint is never loaded, and then removes older ones.

What is saved: model and optimizer (DCP's distributed state dicts, so DDP replicas and
FSDP2 shards alike), the loss scaler, and each rank's RNG state. ZeroRedundancyOptimizer
is not supported by DCP's state-dict helpers: at stage 1 each rank's optimizer shard goes
to its own file in the same folder (``zero1_optim_rank<R>.pt``). Nor are a pipeline stage's optimizer
groups, which differ between stages (DCP keeps one rank's and the others load without their
hyperparameters): under pipeline parallelism each rank's model part and optimizer go to its own file
(``pipeline_rank<R>.pt``), read back by the same layout (a resumed run is the same point).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.optim import ZeroRedundancyOptimizer

from scalelab.run.parallel import Parallelized


def _is_zero1(par: Parallelized) -> bool:
    return isinstance(par.optimizer, ZeroRedundancyOptimizer)


def _per_rank(par: Parallelized) -> bool:
    """Whether this rank's model part and optimizer are saved to its own file (a pipeline stage's)."""
    return par.pipeline_group is not None


def _state(par: Parallelized, scaler, rank: int) -> dict:
    state = {"scaler": scaler.state_dict(), f"rng_rank{rank}": torch.get_rng_state()}
    if not _per_rank(par):
        state["model"] = get_model_state_dict(par.model)
    if not _is_zero1(par) and not _per_rank(par):
        state["optim"] = get_optimizer_state_dict(par.model, par.optimizer)
    return state


def latest(root: Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest complete checkpoint, or None."""
    done = [(int(p.name.split("_", 1)[1]), p) for p in Path(root).glob("step_*")
            if p.is_dir() and p.name.split("_", 1)[1].isdigit()]
    return max(done) if done else None


def save(root: Path, step: int, par: Parallelized, scaler) -> None:
    rank = dist.get_rank()
    tmp, final = root / f"step_{step}.tmp", root / f"step_{step}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a killed earlier attempt's leftovers
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_state(par, scaler, rank), checkpoint_id=str(tmp))
    if _is_zero1(par):
        torch.save(par.optimizer.optim.state_dict(), tmp / f"zero1_optim_rank{rank}.pt")
    if _per_rank(par):
        # this rank's optimizer state (ZeRO-1's: its shard, the local optimizer's)
        torch.save({"model": par.model.state_dict(), "optim": par.local_optimizer().state_dict()}, tmp / f"pipeline_rank{rank}.pt")
    dist.barrier()  # every rank has written
    if rank == 0:
        os.replace(tmp, final)
        for old in root.glob("step_*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load(path: Path, par: Parallelized, scaler) -> None:
    rank = dist.get_rank()
    state = _state(par, scaler, rank)  # the template DCP fills in place
    dcp.load(state, checkpoint_id=str(path))
    if _per_rank(par):
        mine = torch.load(path / f"pipeline_rank{rank}.pt", weights_only=False)  # written by this run's own ranks
        par.model.load_state_dict(mine["model"])
        par.local_optimizer().load_state_dict(mine["optim"])
    else:
        set_model_state_dict(par.model, state["model"])
        if _is_zero1(par):
            par.optimizer.optim.load_state_dict(torch.load(path / f"zero1_optim_rank{rank}.pt"))
        else:
            set_optimizer_state_dict(par.model, par.optimizer, state["optim"])
    if state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state[f"rng_rank{rank}"])
