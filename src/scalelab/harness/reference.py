"""A bare single-process training loop: the parity reference and the overhead baseline.

Same model, initialisation, parameter groups, AdamW, LR schedule, clipping and batches as
scalelab.run.worker, with none of the measurement (no per-step loss sync, no records, no
collective counting, no distributed wrapper).
"""
from __future__ import annotations

import time

import torch

from scalelab.config import ModelConfig, TrainConfig
from scalelab.run.data import BatchSampler
from scalelab.run.model import build_model
from scalelab.run.parallel import param_groups
from scalelab.run.precision import autocast
from scalelab.run.worker import lr_at


def bare_loop(model_cfg: ModelConfig, train_cfg: TrainConfig, train_bin: str, token_dtype: str,
              precision: str = "fp32", record_losses: bool = True, ddp: bool = False):
    """Train on the global batch in one process. Returns (losses, step_times_s, final state dict).

    ``ddp=True`` wraps the model in DistributedDataParallel over a one-process gloo group
    (the strategy of stage 0 at world size 1), for measuring instrumentation alone.
    """
    device = torch.device("cpu")
    torch.manual_seed(train_cfg.seed)
    model = build_model(model_cfg)
    opt = torch.optim.AdamW(param_groups(model, train_cfg.weight_decay), lr=train_cfg.lr,
                            betas=(0.9, 0.95), eps=1e-8)
    if ddp:
        import tempfile

        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        with tempfile.NamedTemporaryFile() as store:
            dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
        model = DistributedDataParallel(model, gradient_as_bucket_view=True)
    sampler = BatchSampler(train_bin, token_dtype, model_cfg.seq_len, train_cfg.seed)
    max_norm = train_cfg.grad_clip if train_cfg.grad_clip > 0 else float("inf")
    losses, times = [], []
    for step in range(train_cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, train_cfg)
        start = time.perf_counter()
        tokens = torch.from_numpy(sampler.batch(step, 0, train_cfg.global_batch, 1))
        with autocast(precision, device):
            loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        if record_losses:
            losses.append(loss.item())
    if ddp:
        torch.distributed.destroy_process_group()
        model = model.module
    return losses, times, {k: v.detach().clone() for k, v in model.state_dict().items()}
