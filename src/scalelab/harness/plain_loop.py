"""A plain PyTorch training loop: what a user would write, to hold scalelab's runs against.

    python -m scalelab.harness.plain_loop --n-layers 24 --d-model 1024 --n-heads 16 --seq-len 1024 \\
        --vocab-size 50304 --batch-size 16 --precision bf16 --compile --json out.json

nanoGPT's shape, standalone on purpose (nothing of scalelab's model or training code is
imported: the point is to compare against code that owes scalelab nothing). The model has the
layers of scalelab's GPT family (scalelab.run.model.GPT): learned token and position
embeddings, pre-LayerNorm blocks (LayerNorm with bias), causal self-attention through
scaled_dot_product_attention with a fused qkv projection (biases), a GELU MLP of 4 d (biases),
a final LayerNorm and an output head without bias tied to the token embedding; the loss is the
cross-entropy of the logits cast to fp32. The loop: fused AdamW (betas 0.9, 0.95, weight decay
on the parameters of two or more dimensions), gradient clipping at 1.0, autocast for bf16 and
fp16 (fp16 with torch.amp.GradScaler), optionally ``torch.compile(model)`` of the whole model.
The data are random token ids (speed does not depend on the text), a fresh batch each step,
moved to the device the way nanoGPT does it (pinned memory, non-blocking copy).

Timing, as a user would: the wall time of each step (the batch, forward, backward, clipping,
the optimizer step, zeroing the gradients), with ``torch.cuda.synchronize()`` before the clock
stops on a GPU; tokens/s from the median step time after the warm-up steps (a compiled model
compiles in its first step). Peak memory: ``torch.cuda.max_memory_allocated()`` on a GPU, None
on a CPU. Run it as its own process (``--json``), so that each measurement starts fresh, as a
scalelab run does.

Two variants, to find what a difference from scalelab's runs comes from (gpu_check's diagnose
part), each one change from the loop above: ``--compile-scope blocks`` compiles each block and the
loss apart, as scalelab's compile lever does, instead of the whole model; ``--ddp`` wraps the model
in DistributedDataParallel over a one-rank process group, as scalelab's stage 0 did at world size 1.
``--trace PATH`` writes a torch.profiler trace of the last step (left out of the timing), for
gpu_check's profile part to set beside a scalelab run's.

The plain FSDP2 loop (``--fsdp reshard`` or ``--fsdp keep``), the peer of scalelab's sharded stages, is
written as torchtitan writes it (its parallelize's apply_compile and apply_fsdp, and its training step):
each block compiled (``--compile``: per block and the loss, torchtitan's scope), then ``fully_shard`` per
block and at the root (the embeddings, the final norm and the tied head: a tied weight lives in one group)
over a device mesh, one dimension or, with ``--replicas R``, torchtitan's (dp_replicate, dp_shard) mesh;
``reshard_after_forward`` True (reshard: ZeRO-3) or False (keep: ZeRO-2); a ``MixedPrecisionPolicy`` in
place of autocast (bf16: parameters gathered in bf16, gradients reduced in fp32; fp32: none); the same
fused AdamW, stepping the DTensor shards; clipping by torch's clip_grad_norm_. Over one rank unless
torchrun's environment (WORLD_SIZE) says otherwise (a GPU a rank). torchtitan trains no fp16: neither does this
loop. ``--autocast`` adds autocast around the forward, as scalelab's sharded stages run it over the policy (on a
GPU autocast runs LayerNorm in fp32, with its casts): what that costs, apart from the rest.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        k = k.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        v = v.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, n_layers: int, d_model: int, n_heads: int, seq_len: int, vocab_size: int):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return self.loss_fn(logits, targets)

    @staticmethod
    def loss_fn(logits, targets):
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def _profiler(on_gpu: bool):
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else []))


AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
FSDP_PARAM_DTYPE = {"fp32": None, "bf16": torch.bfloat16}
"""The plain FSDP2 loop's MixedPrecisionPolicy param_dtype per precision (it runs no autocast)."""
FSDP_RESHARD = {"reshard": True, "keep": False}


def _compiled_or_wrapped(model: GPT, compile: bool, compile_scope: str, ddp: bool, on_gpu: bool) -> nn.Module:
    """The model as the variant runs it: compiled whole or per block and loss; in DDP over one rank."""
    if compile and compile_scope == "blocks":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block)
        model.loss_fn = torch.compile(GPT.loss_fn)
    elif compile:
        model = torch.compile(model)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel

        _join_group(on_gpu)
        model = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if on_gpu else None,
                                        gradient_as_bucket_view=True, bucket_cap_mb=25)
    return model


def _prepared(model: GPT, precision: str, compile: bool, compile_scope: str, ddp: bool, fsdp: str | None,
              replicas: int, fsdp_autocast: bool, on_gpu: bool, lr: float, weight_decay: float):
    """(model, optimizer, autocast context, loss scaler) as the variant trains them: the FSDP2 loop shards
    before its optimizer is built (it steps the DTensor shards) and runs no autocast (its policy casts)
    unless asked (fsdp_autocast: scalelab's sharded stages run autocast around the policy too)."""
    dtype = AUTOCAST[precision]
    ctx = torch.autocast(device_type="cuda" if on_gpu else "cpu", dtype=dtype) if dtype else nullcontext()
    if fsdp is not None:
        _join_group(on_gpu)
        model = fully_shard_model(model, FSDP_RESHARD[fsdp], precision, compile, replicas)
        scaler = torch.amp.GradScaler("cuda" if on_gpu else "cpu", enabled=False)
        return model, adamw(model, lr, weight_decay), ctx if fsdp_autocast else nullcontext(), scaler
    optimizer = adamw(model, lr, weight_decay)
    scaler = torch.amp.GradScaler("cuda" if on_gpu else "cpu", enabled=precision == "fp16")
    return _compiled_or_wrapped(model, compile, compile_scope, ddp, on_gpu), optimizer, ctx, scaler


def _join_group(on_gpu: bool) -> None:
    """The process group: torchrun's (its environment) where there is one, else one rank over a file store
    (no port to find free or lose to another process), each with a time limit."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    timeout = datetime.timedelta(seconds=120)
    if "WORLD_SIZE" in os.environ:
        if on_gpu:  # one device a rank
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if on_gpu else "gloo", timeout=timeout)
        return
    store = tempfile.NamedTemporaryFile(prefix="plain-loop-store-", delete=False)
    store.close()
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"file://{store.name}", rank=0, world_size=1,
                            timeout=timeout)


def fully_shard_model(model: GPT, reshard_after_forward: bool, precision: str, compile: bool = False,
                      replicas: int = 1) -> GPT:
    """torchtitan's recipe (the module's doc): compile each block and the loss, then fully_shard each block
    and the root under one MixedPrecisionPolicy. The process group must exist (_join_group)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if precision not in FSDP_PARAM_DTYPE:
        raise ValueError(f"the plain FSDP2 loop trains {' or '.join(FSDP_PARAM_DTYPE)}, as torchtitan does, not {precision}")
    device_type = model.wte.weight.device.type
    world = dist.get_world_size()
    mesh = (init_device_mesh(device_type, (world,)) if replicas == 1 else
            init_device_mesh(device_type, (replicas, world // replicas), mesh_dim_names=("dp_replicate", "dp_shard")))
    if compile:
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block, fullgraph=True)
        model.loss_fn = torch.compile(GPT.loss_fn, fullgraph=True)
    mp = MixedPrecisionPolicy(param_dtype=FSDP_PARAM_DTYPE[precision], reduce_dtype=torch.float32)
    # torchtitan's apply_fsdp without pipeline parallelism: every block but the last resharded after forward (the
    # last is gathered straight back by backward), and the root as the blocks are
    for i, block in enumerate(model.blocks):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and i < len(model.blocks) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return model


def adamw(model: nn.Module, lr: float = 6e-4, weight_decay: float = 0.1) -> torch.optim.Optimizer:
    """Fused AdamW, weight decay on the parameters of two or more dimensions (DTensors under FSDP2)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler, ctx, x, y) -> torch.Tensor:
    """One step as the loop takes it: forward, backward, clipping at 1.0, the optimizer step, zeroed gradients."""
    with ctx:
        loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss


def _leave_group() -> None:
    """Tear the one-rank group down as scalelab.run.worker.shutdown does: what referenced it collected, a
    barrier first. Without them gloo's destroy_process_group() hung intermittently on torch 2.13 CPU (a dry
    run's DDP variant, under load, waited out its 120 s limit without a line of output)."""
    gc.collect()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _loop(model, optimizer, scaler, ctx, steps: int, batch_size: int, seq_len: int, vocab_size: int, device: str,
          trace: str | None) -> tuple[list[float], list[float]]:
    """The timed steps on a fresh random batch each: (each step's wall time, its loss)."""
    on_gpu = device.startswith("cuda")

    def get_batch():
        data = torch.randint(0, vocab_size, (batch_size, seq_len + 1))
        if on_gpu:
            data = data.pin_memory().to(device, non_blocking=True)
        return data[:, :-1], data[:, 1:]

    step_times, losses = [], []
    for i in range(steps):
        # --trace: torch.profiler around the last step (CPU and CUDA activity), left out of the timing
        profiler = _profiler(on_gpu) if trace and i == steps - 1 else nullcontext()
        profiler.__enter__()
        t0 = time.perf_counter()
        x, y = get_batch()
        loss = train_step(model, optimizer, scaler, ctx, x, y)
        if on_gpu:
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t0)
        profiler.__exit__(None, None, None)
        losses.append(loss.item())
    if trace and os.environ.get("RANK", "0") == "0":  # every rank traced its step alike; the first one's is kept
        profiler.export_chrome_trace(trace)
    return step_times, losses


def train(n_layers: int, d_model: int, n_heads: int, seq_len: int, vocab_size: int, batch_size: int,
          steps: int = 30, warmup_steps: int = 10, precision: str = "bf16", compile: bool = False,
          tf32: bool = False, device: str | None = None, lr: float = 6e-4, weight_decay: float = 0.1,
          seed: int = 0, compile_scope: str = "model", ddp: bool = False, trace: str | None = None,
          fsdp: str | None = None, replicas: int = 1, fsdp_autocast: bool = False) -> dict:
    """Train for ``steps`` steps and return what was measured (see the module's docstring)."""
    if warmup_steps >= steps - (1 if trace else 0):
        raise ValueError(f"warmup_steps={warmup_steps} leaves no step to measure out of steps={steps}")
    if compile_scope not in ("model", "blocks"):
        raise ValueError(f"compile_scope must be 'model' or 'blocks', not {compile_scope!r}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.startswith("cuda")
    torch.manual_seed(seed)
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32

    if fsdp is not None:
        _join_group(on_gpu)  # before the model is moved: torchrun's rank picks its device
    model = GPT(n_layers, d_model, n_heads, seq_len, vocab_size).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    ranks = torch.distributed.get_world_size() if fsdp is not None else 1
    model, optimizer, ctx, scaler = _prepared(model, precision, compile, compile_scope, ddp, fsdp, replicas,
                                              fsdp_autocast, on_gpu, lr, weight_decay)

    step_times, losses = _loop(model, optimizer, scaler, ctx, steps, batch_size, seq_len, vocab_size, device, trace)
    if ddp or fsdp:
        del model, optimizer  # DDP's and FSDP2's references to the group go before it (_leave_group)
        _leave_group()
    measured = step_times[warmup_steps:len(step_times) - (1 if trace else 0)]
    tokens_per_step = batch_size * seq_len * ranks  # the global batch's: batch_size a rank
    return {
        "n_params": n_params, "device": device,
        "device_name": torch.cuda.get_device_name() if on_gpu else "cpu",
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "shape": {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "seq_len": seq_len,
                  "vocab_size": vocab_size},
        "batch_size": batch_size, "precision": precision, "tf32": tf32, "compile": compile,
        "compile_scope": "blocks" if compile and fsdp else compile_scope if compile else None, "ddp": ddp,
        "fsdp": fsdp, "replicas": replicas, "fsdp_autocast": fsdp_autocast,
        "steps": steps, "warmup_steps": warmup_steps, **_timings(tokens_per_step, step_times, measured),
        "peak_mem_allocated_bytes": torch.cuda.max_memory_allocated() if on_gpu else None,
        "final_loss": losses[-1],
    }


def _timings(tokens_per_step: int, step_times: list[float], measured: list[float]) -> dict:
    median = statistics.median(measured)
    return {"tokens_per_step": tokens_per_step, "tokens_per_s": tokens_per_step / median,
            "tokens_per_s_mean": tokens_per_step * len(measured) / sum(measured),
            "step_time_s_median": median, "step_time_s_mean": sum(measured) / len(measured),
            "first_step_s": step_times[0], "step_times_s": step_times}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalelab.harness.plain_loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-layers", type=int, required=True)
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--n-heads", type=int, required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--precision", choices=list(AUTOCAST), default="bf16")
    parser.add_argument("--compile", action="store_true", help="torch.compile(model): the whole model")
    parser.add_argument("--compile-scope", choices=["model", "blocks"], default="model",
                        help="blocks: compile each block and the loss apart (scalelab's compile lever)")
    parser.add_argument("--ddp", action="store_true", help="wrap the model in DDP over a one-rank process group")
    parser.add_argument("--fsdp", choices=list(FSDP_RESHARD), default=None,
                        help="the plain FSDP2 loop (torchtitan's recipe): reshard (ZeRO-3) or keep (ZeRO-2) after forward")
    parser.add_argument("--replicas", type=int, default=1, help="with --fsdp: hybrid sharding over R replicas")
    parser.add_argument("--autocast", action="store_true",
                        help="with --fsdp: autocast around the forward too, as scalelab's sharded stages run it")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 matmuls (GPU)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--json", default=None, help="write the measurements here")
    parser.add_argument("--trace", default=None, help="write a torch.profiler trace (Chrome format) of the last step here; "
                        "that step is left out of the timing")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = train(args.n_layers, args.d_model, args.n_heads, args.seq_len, args.vocab_size, args.batch_size,
                   args.steps, args.warmup_steps, args.precision, args.compile, args.tf32, args.device,
                   compile_scope=args.compile_scope, ddp=args.ddp, trace=args.trace, fsdp=args.fsdp,
                   replicas=args.replicas, fsdp_autocast=args.autocast)
    if args.json and os.environ.get("RANK", "0") == "0":  # torchrun's ranks: the first one writes
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    peak = result["peak_mem_allocated_bytes"]
    print(f"plain loop: {result['tokens_per_s']:,.0f} tok/s (median step {result['step_time_s_median'] * 1e3:.1f} ms), "
          f"{result['n_params'] / 1e6:.1f}M params, peak {'-' if peak is None else f'{peak / 2**30:.2f} GiB'}, "
          f"final loss {result['final_loss']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
