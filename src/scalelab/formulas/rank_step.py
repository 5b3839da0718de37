"""What one rank runs in a training step (RankStep): the value the memory and communication formulas take instead of
loose arguments. A module of its own because both kinds read it and peak_memory reads communication's dtypes: held
here, neither imports the other for it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankStep:
    """What one rank runs in a training step, as the memory and communication formulas read it: its precision, its
    sharding, the degrees it is split by, its micro-batch and the levers. One value, made where a run or a forecast is
    known (predicted_columns.rank_step from a run's row; a forecast's point), so that each memory recipe (peak_memory,
    megatron_style, foundry_style) and each byte count of a step's collectives (communication, tensor_parallelism,
    pipeline's FSDP2) takes the same thing instead of a dozen loose arguments."""

    precision: str
    zero_stage: int
    data_parallel: int
    """The ranks the model state is sharded or replicated over (the world size over the tensor- and
    pipeline-parallel degrees)."""
    micro_batch: int
    accumulation_steps: int = 1
    """Micro-batches per optimizer step on this rank (a pipeline's micro-batches too)."""
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    replicas: int = 1
    """Hybrid sharding's replicas: shards and gathers are over a shard group of data_parallel / replicas ranks."""
    compiled: bool = False
    """The compile lever: blocks and loss under torch.compile."""
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    device_type: str = "cuda"
    """Where the step runs (a GPU by default: planning is for one; the llama family's kernels save differently on a
    CPU)."""
    grad_reduce: str = "fp32"
    """The dtype gradients are reduced in, a lever of the step (communication.GRAD_REDUCE: fp32, or the compute
    dtype); what communication.comm_dtypes reads beside the precision and the stage."""

    @property
    def activation_levers(self) -> dict:
        """What of the step activation_memory's block and outside-block formulas read, as their keyword arguments."""
        return {"zero_stage": self.zero_stage, "device_type": self.device_type, "compiled": self.compiled,
                "tensor_parallel": self.tensor_parallel, "sequence_parallel": self.sequence_parallel}
