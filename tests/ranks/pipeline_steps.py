"""One rank of the one-device pipeline test (started by the test with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in
its environment): two pipeline stages of scalelab's model over gloo, every rank on the same device, against one
process training the whole model on it.

The stages are the worker's: scalelab.run.pipeline's chunk_modules splits the model, build makes torch's
PipelineStages and schedule with its instruments, step runs one step, and the loss is the model's under the run's
autocast. One thing differs from the worker's path: gloo's send and recv hand the tensor's data pointer to their TCP
transport and stage no CUDA tensor through host memory (its collectives do, its point-to-point does not), and NCCL
refuses two ranks on one GPU. So each chunk computes on the device and its boundary tensors cross in host memory
(HostHop: its inputs to the device, its output back), the stages' buffers on the CPU.

Recorded by rank 0 as JSON to --out, per step: the pipeline's loss (the mean of its micro-batches', from the last
stage) and the one process's. A failure is recorded with its traceback, so the test says what broke.
"""
import argparse
import datetime

import torch
import torch.distributed as dist
import torch.nn as nn
from rank_records import recorded, write_and_close

from scalelab.config import ModelConfig
from scalelab.run import pipeline
from scalelab.run.model import build_model
from scalelab.run.precision import autocast

SHAPE = ModelConfig(n_layers=4, d_model=64, n_heads=4, seq_len=32, vocab_size=128, tie_embeddings=False)
MICRO_BATCHES, MICRO_BATCH = 4, 2  # a step's micro-batches (enough for two stages) and sequences in each
LR = 1e-3


class HostHop(nn.Module):
    """A chunk computing on ``device`` whose inputs and output cross in host memory."""

    def __init__(self, chunk: nn.Module, device: torch.device):
        super().__init__()
        self.chunk, self.device = chunk, device

    def forward(self, *args):
        out = self.chunk(*(a.to(self.device) for a in args))
        return out.to("cpu")


def tokens_of(step: int) -> torch.Tensor:
    return torch.randint(0, SHAPE.vocab_size, (MICRO_BATCHES * MICRO_BATCH, SHAPE.seq_len + 1),
                         generator=torch.Generator().manual_seed(step))


def pipelined_losses(device: torch.device, precision: str, schedule: str, steps: int) -> list[float]:
    """Each step's mean micro-batch loss, two stages over the ranks (the last stage's, broadcast to every rank)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("pp",))
    torch.manual_seed(0)
    model = build_model(SHAPE).to(device)
    chunks = pipeline.chunk_modules(model, dist.get_rank(), dist.get_world_size(), schedule)
    last = chunks[-1][1]

    def loss_fn(logits, targets):  # the model's loss on the device, under the run's autocast
        with autocast(precision, device):
            return last.loss_fn(logits.to(device), targets.to(device))

    pipe = pipeline.build([(c, HostHop(chunk, device)) for c, chunk in chunks], mesh["pp"], torch.device("cpu"),
                          schedule, MICRO_BATCHES, loss_fn, lambda: autocast(precision, device))
    params = [p for _, chunk in chunks for p in chunk.parameters()]
    optimizer = torch.optim.AdamW(params, lr=LR)
    losses = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        total = pipeline.step(pipe, tokens_of(step)).detach().float().cpu()
        optimizer.step()
        dist.broadcast(total, src=dist.get_world_size() - 1)  # the last stage holds the loss
        losses.append(float(total) / MICRO_BATCHES)
    return losses


def one_process_losses(device: torch.device, precision: str, steps: int) -> list[float]:
    """The same model, data and optimizer in one process: the micro-batches' gradients averaged, as the schedule's."""
    torch.manual_seed(0)
    model = build_model(SHAPE).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for micro in tokens_of(step).to(device).split(MICRO_BATCH):
            with autocast(precision, device):
                loss = model(micro[:, :-1], micro[:, 1:])
            (loss / MICRO_BATCHES).backward()
            total += float(loss.detach().float())
        optimizer.step()
        losses.append(total / MICRO_BATCHES)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--schedules", default="gpipe,1f1b")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    records = []
    for precision in args.precisions.split(","):
        for schedule in args.schedules.split(","):
            def case(precision=precision, schedule=schedule) -> dict:
                losses = {"pipelined": pipelined_losses(device, precision, schedule, args.steps)}
                if dist.get_rank() == 0:
                    losses["one_process"] = one_process_losses(device, precision, args.steps)
                return losses

            records.append(recorded({"precision": precision, "schedule": schedule}, case))
            dist.barrier()
    write_and_close(args.out, records)


if __name__ == "__main__":
    main()
