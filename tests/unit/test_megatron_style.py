"""Tensor parallelism and ZeRO-1 as Megatron-LM and nanotron run them (scalelab.formulas.megatron_style, --trainer megatron):
the parameters a rank holds with the vocabulary split, the bytes and time of the tensor-parallel collectives in the
convention the output states (nccl-tests' size; a ring moves the bus factor of it per GPU), checked by hand on the issue's
example, and the memory recipe's parts."""
import json

import pytest

from scalelab.cli import main
from scalelab.config import ModelConfig
from scalelab.formulas import flops, links, megatron_style, tensor_parallelism
from scalelab.formulas.rank_step import RankStep
from scalelab.registries.presets import PRESETS

LLAMA3_8B = ModelConfig(**PRESETS["llama3-8b"].shape)


def _scaling(capsys, *args) -> dict:
    code = main(["estimate", "scaling", "--model", "llama3-8b", "--gpu", "H100", "--inter-node", "ib-ndr", "--json", *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_a_rank_holds_its_share_of_the_blocks_and_of_the_vocabulary():
    n = flops.param_count(LLAMA3_8B)
    vocab = 2 * LLAMA3_8B.vocab_size * LLAMA3_8B.d_model  # embedding and untied head
    blocks = LLAMA3_8B.n_layers * 2 * LLAMA3_8B.d_model  # the norms stay whole
    rest = n - vocab - blocks - LLAMA3_8B.d_model
    assert megatron_style.local_params(LLAMA3_8B, n, 4) == pytest.approx((rest + vocab) / 4 + blocks + LLAMA3_8B.d_model)
    assert megatron_style.local_params(LLAMA3_8B, n, 1) == n
    # scalelab's own keeps the embedding and head whole
    assert tensor_parallelism.tensor_parallel_params(LLAMA3_8B, n, 4) - megatron_style.local_params(LLAMA3_8B, n, 4) == pytest.approx(vocab * 3 / 4)


def test_tensor_parallel_bytes_by_hand_for_llama3_8b_at_tp4(capsys):
    """The issue's example: llama3-8b, TP 4, 64 GPUs, micro-batch 1 of 8192 tokens. By hand: per block 4 bf16
    all-reduces of b s h values (2 forward, 2 backward), plus the vocabulary-parallel embedding's and head's one each:
    size = (4 L + 2) x b s h x 2 bytes; a ring moves 2 (T-1)/T of it per GPU."""
    bsh = 1 * 8192 * 4096
    size = (4 * 32 + 2) * bsh * 2
    result = _scaling(capsys, "--zero-stage", "1", "--tensor-parallel", "4", "--gpus", "64", "--trainer", "megatron")
    tp = result["rows"][0]["tensor_parallel_comm"]
    assert tp["size_bytes"] == size and tp["calls"] == 4 * 32 + 2
    assert tp["ring_bytes_per_gpu"] == pytest.approx(size * 1.5)
    link = links.parse_link("nvlink-h100", None)
    assert tp["seconds"] == pytest.approx(tp["calls"] * link.latency_s + 1.5 * size / link.achievable_Bps)
    # scalelab's own (at ZeRO-0: it runs no ZeRO-1 with tensor parallelism): backward's all-reduces carry fp32 (its
    # norms' outputs under autocast on CUDA)
    ours = _scaling(capsys, "--zero-stage", "0", "--tensor-parallel", "4", "--gpus", "64")["rows"][0]["tensor_parallel_comm"]
    assert ours["size_bytes"] == 32 * bsh * (2 * 2 + 2 * 4) and ours["calls"] == 4 * 32


def test_sequence_parallelism_splits_each_all_reduce_into_two_halves_of_the_same_time():
    plain = megatron_style.tensor_parallel_comm(LLAMA3_8B, RankStep("bf16", 1, 1, 2, 4, tensor_parallel=8))
    split = megatron_style.tensor_parallel_comm(LLAMA3_8B, RankStep("bf16", 1, 1, 2, 4, tensor_parallel=8, sequence_parallel=True))
    assert set(split) == {"reduce_scatter", "all_gather"} and split["reduce_scatter"] == plain["all_reduce"]
    link = links.parse_link("nvlink-h100", None)
    seconds = lambda comm: sum(n * links.collective_seconds(c, s / n, 8, link) for c, (s, n) in comm.items())  # noqa: E731
    # the same bus time: a second latency per call apart
    assert seconds(split) - seconds(plain) == pytest.approx(plain["all_reduce"][1] * link.latency_s)
    recompute = megatron_style.tensor_parallel_comm(LLAMA3_8B, RankStep("bf16", 1, 1, 2, 4, True, tensor_parallel=8))
    assert recompute["all_reduce"][1] == 4 * (6 * 32 + 2)


def test_the_memory_recipe_splits_activations_and_logits_and_shards_the_optimizer_at_zero1():
    n = flops.param_count(LLAMA3_8B)
    local = megatron_style.local_params(LLAMA3_8B, n, 8)
    zero0 = megatron_style.peak_memory(LLAMA3_8B, local, RankStep("bf16", 0, 16, 1, tensor_parallel=8))
    zero1 = megatron_style.peak_memory(LLAMA3_8B, local, RankStep("bf16", 1, 16, 1, tensor_parallel=8))
    assert zero0["model_state"] == 18 * local and zero1["model_state"] == pytest.approx(6 * local + 12 * local / 16)
    sp = megatron_style.peak_memory(LLAMA3_8B, local, RankStep("bf16", 1, 16, 1, tensor_parallel=8, sequence_parallel=True))
    whole = megatron_style.peak_memory(LLAMA3_8B, n, RankStep("bf16", 1, 16, 1))
    assert sp["activations"] < zero1["activations"] < whole["activations"]
    logits = megatron_style.LOGIT_BYTES * 8192 * LLAMA3_8B.vocab_size
    assert megatron_style.activation_bytes(LLAMA3_8B, RankStep("bf16", 1, 1, 1, tensor_parallel=8)) > logits / 8
    with pytest.raises(ValueError, match="stages 0 and 1"):
        megatron_style.peak_memory(LLAMA3_8B, local, RankStep("bf16", 3, 16, 1, tensor_parallel=8))


def test_userbuffers_leave_a_pipelined_reduce_scatters_last_chunk_and_the_embedding_and_head_collectives_exposed():
    """NeMo's ub_tp_comm_overlap (--trainer nemo): of a block's 8 sequence-parallel collectives, the forward's two
    row-parallel reduce-scatters are pipelined in 4 chunks, one exposed (1/16 of the blocks' time); the rest hides behind
    the blocks' compute, at most all of it; the 2 per micro-batch outside the blocks stay exposed. Without sequence
    parallelism userbuffers do not run."""
    layers, seconds = 32, 1.0
    blocks = seconds * 4 * layers / (4 * layers + 2)
    outside = seconds - blocks
    assert megatron_style.overlapped_tensor_parallel_seconds(seconds, layers, True, False, 10.0) == pytest.approx(
        outside + blocks / 16)
    assert megatron_style.overlapped_tensor_parallel_seconds(seconds, layers, True, False, 0.5) == pytest.approx(seconds - 0.5)
    assert megatron_style.overlapped_tensor_parallel_seconds(seconds, layers, False, False, 10.0) == seconds
    ckpt = seconds * 6 * layers / (6 * layers + 2)  # the recomputed forward's two reduce-scatters pipelined too
    assert megatron_style.overlapped_tensor_parallel_seconds(seconds, layers, True, True, 10.0) == pytest.approx(
        seconds - ckpt + ckpt * 4 / 12 / 4)


def test_the_nemo_trainer_is_the_megatron_trainer_with_its_tensor_parallel_collectives_behind_the_gemms(capsys):
    megatron = _scaling(capsys, "--trainer", "megatron", "--tensor-parallel", "4", "--sequence-parallel", "--gpus", "64",
                        "--zero-stage", "1")
    nemo = _scaling(capsys, "--trainer", "nemo", "--tensor-parallel", "4", "--sequence-parallel", "--gpus", "64",
                    "--zero-stage", "1")
    m, n = megatron["rows"][0], nemo["rows"][0]
    assert m["tensor_parallel_comm"]["seconds"] == pytest.approx(n["tensor_parallel_comm"]["seconds"])
    assert m["comm_s"] == n["comm_s"] and m["peak_memory_gib"] == n["peak_memory_gib"]
    assert n["tensor_parallel_comm"]["exposed_s"] < m["tensor_parallel_comm"]["exposed_s"] == m["tensor_parallel_comm"]["seconds"]
    assert m["step_time_s"] - n["step_time_s"] == pytest.approx(
        m["tensor_parallel_comm"]["seconds"] - n["tensor_parallel_comm"]["exposed_s"])
