"""Tensor parallelism and ZeRO-1 as the trainers that scale run them (Megatron-LM, nanotron; DeepSpeed's ZeRO-1 for
its data parallelism), for forecasts (scalelab.forecast.step, ``--trainer megatron``); scalelab's own runs are
priced by the formulas of scalelab.formulas (communication, peak_memory), which its measurements hold.

What differs from scalelab's own tensor parallelism (each as those trainers document it):
* the parameters are the compute dtype (bf16), with fp32 master weights and Adam moments in the optimizer and
  gradients accumulated in an fp32 buffer (Megatron's ``main_grad``, nanotron's ``accumulate_grad_in_fp32``);
* the embedding, the head and the loss are split over the vocabulary (``VocabParallelEmbedding``, a column-parallel
  head, the vocabulary-parallel cross-entropy): each rank holds V/T of each and of the logits;
* every tensor-parallel collective carries the compute dtype: per block and micro-batch two all-reduces in forward
  (after attention's and the MLP's row-parallel linears) and two in backward (the column-parallel linears' input
  gradients), each of b s h values; the embedding's output (forward) and the head's input gradient (backward) add
  one each per micro-batch; full activation checkpointing repeats the forward two per block. Sequence parallelism
  splits each all-reduce into a reduce-scatter and an all-gather of the same buffer: the same bus time in a ring.

Sizes are nccl-tests' (the buffer an all-reduce reduces, an all-gather's output, a reduce-scatter's input); a ring
moves bus_factor x size per GPU (2 (T-1)/T for an all-reduce, (T-1)/T for the others).

Memory (the activation recipe assumed, stated): bf16 parameters (2 B each), the fp32 gradient buffer (4), fp32 master
weights and Adam's two moments (12, divided over the data-parallel ranks at ZeRO-1); one micro-batch's activations
of the family's blocks with 16-bit parameters on a GPU and fused (flash) attention (scalelab.registries.families, the
record's formula with ``sixteen_bit_params``), split over the tensor-parallel ranks (with sequence parallelism, the
norms' and residual's share too); the final norm and the head's input; and the vocabulary-parallel loss's logits in
bf16 beside their fp32 softmax (6 B per local logit).
"""
from __future__ import annotations

from scalelab.config import ModelConfig
from scalelab.formulas import activation_memory
from scalelab.formulas.rank_step import RankStep
from scalelab.registries.families import ActivationCase, family, tensor_parallel_split_params

STATE_BYTES = {"params": 2, "grads": 4, "optimizer": 12}
"""Bytes per parameter the trainers hold: bf16 parameters, an fp32 gradient buffer, fp32 master weights + Adam."""
LOGIT_BYTES = 6
"""Bytes per local logit at the loss: the bf16 logits and the fp32 softmax the vocabulary-parallel loss keeps."""


def local_params(cfg: ModelConfig, n_params: float, degree: int) -> float:
    """Parameters one rank holds: 1/T of the blocks' split linears, of the embedding and of an untied head; the norms
    whole."""
    if degree == 1:
        return float(n_params)
    vocab = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)
    split = cfg.n_layers * tensor_parallel_split_params(cfg) + vocab
    return n_params - split + split / degree


def tensor_parallel_comm(cfg: ModelConfig, step: RankStep) -> dict[str, tuple[float, int]]:
    """{collective: (nccl-tests size in bytes summed over the step's calls, calls)} of one rank's tensor-parallel group
    per optimizer step (the module doc's count)."""
    if step.tensor_parallel == 1:
        return {}
    per_micro = cfg.n_layers * (4 + (2 if step.activation_checkpointing else 0)) + 2
    calls = per_micro * step.accumulation_steps
    size = step.micro_batch * cfg.seq_len * cfg.d_model * activation_memory.DTYPE_BYTES[step.precision]
    if step.sequence_parallel:  # each all-reduce a reduce-scatter and an all-gather of the same buffer
        return {"reduce_scatter": (calls * size, calls), "all_gather": (calls * size, calls)}
    return {"all_reduce": (calls * size, calls)}


def activation_bytes(cfg: ModelConfig, step: RankStep) -> float:
    """One micro-batch's activations on one rank (the module doc's recipe): the blocks, the final norm and the head's
    input, and the vocabulary-parallel loss's logits."""
    degree = step.tensor_parallel
    case = ActivationCase(micro_batch=step.micro_batch, width=activation_memory.DTYPE_BYTES[step.precision], amp=False,
                          sixteen_bit_params=True, checkpointing=step.activation_checkpointing, gpu=True, compiled=False,
                          tensor_parallel=degree, sequence_parallel=step.sequence_parallel and degree > 1)
    record = family(cfg.family)
    logits = LOGIT_BYTES * step.micro_batch * cfg.seq_len * cfg.vocab_size / degree
    return record.block_activation_bytes(cfg, case) + record.outside_block_bytes(cfg, case) + logits


def peak_memory(cfg: ModelConfig, n_local: float, step: RankStep) -> dict[str, float]:
    """Bytes per GPU at the step's peak (the module doc's recipe): model state, ZeRO-1's optimizer shard, one
    micro-batch's activations. Stages 2 and 3 are FSDP's (scalelab.formulas.peak_memory), not priced here."""
    if step.zero_stage not in (0, 1):
        raise ValueError(f"the megatron-style memory covers ZeRO stages 0 and 1, got {step.zero_stage}")
    optimizer = STATE_BYTES["optimizer"] * n_local / (step.data_parallel if step.zero_stage == 1 else 1)
    state = (STATE_BYTES["params"] + STATE_BYTES["grads"]) * n_local + optimizer
    activations = activation_bytes(cfg, step)
    return {"model_state": state, "activations": activations, "total": state + activations}


USERBUFFERS_PIPELINE_SPLITS = 4
"""Chunks of each pipelined reduce-scatter under TransformerEngine's userbuffers: its ``num_splits`` default for the
``pipeline`` method (transformer_engine/pytorch/module/base.py, initialize_ub), which proj_fprop and fc2_fprop use by
default and in NVIDIA's GPT-3 175B recipe (dgxc-benchmarking v24.11.1, nemo_megatron/gpt3_175b_hydra.yaml,
ub_tp_comm_overlap_cfg: num_splits 4)."""


def overlapped_tensor_parallel_seconds(seconds: float, n_layers: int, sequence_parallel: bool,
                                       activation_checkpointing: bool, blocks_compute_s: float) -> float:
    """What stays on the step of ``seconds`` of tensor-parallel collectives (tensor_parallel_comm's, timed) where
    TransformerEngine's userbuffers overlap them with the blocks' GEMMs (NeMo's ``ub_tp_comm_overlap``; NeMo's
    docs/source/features/optimizations/communication_overlap.rst: with sequence parallelism, the all-gathers and
    reduce-scatters without a direct dependency overlap in bulk, the others pipelined in chunks by P2P ring exchanges,
    a pipelined reduce-scatter exposing one chunk). Per block, of its 2 (4 + 2 c) collectives (c: the checkpointed
    forward's repeat), the forward's two row-parallel reduce-scatters (proj and fc2, the ``pipeline`` method) leave one
    chunk of USERBUFFERS_PIPELINE_SPLITS exposed; the rest hides behind the blocks' compute, at most all of it
    (``blocks_compute_s``); the embedding's and the head's collectives (not TransformerEngine modules) stay exposed.
    Without sequence parallelism userbuffers do not run: all of it is exposed."""
    if not sequence_parallel or seconds == 0:
        return seconds
    per_block = 4 + (2 if activation_checkpointing else 0)
    blocks_s = seconds * n_layers * per_block / (n_layers * per_block + 2)
    chunk_s = blocks_s * 2 * (1 + activation_checkpointing) / (2 * per_block) / USERBUFFERS_PIPELINE_SPLITS
    hidden = min(blocks_s - chunk_s, blocks_compute_s)
    return seconds - hidden
