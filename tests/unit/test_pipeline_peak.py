"""The launcher's predicted peak of a pipelined run (scalelab.formulas.predicted_columns.peak): the whole model's
activations with the blocks' replaced by what the fullest stage holds, both in the run's own figures (its device,
its compile lever)."""
import pytest

from scalelab.config import ModelConfig
from scalelab.formulas import activation_memory, flops, pipeline, predicted_columns
from scalelab.formulas.peak_memory import peak_memory
from scalelab.formulas.rank_step import RankStep

LLAMA = ModelConfig(family="llama", n_layers=4, d_model=256, n_heads=4, n_kv_heads=2, ffn_dim=512, seq_len=128,
                    vocab_size=1000, tie_embeddings=False)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipelined_peak_holds_the_fullest_stages_blocks_in_the_runs_own_figures(compiled, schedule):
    row = {"precision": "bf16", "zero_stage": 0, "world_size": 2, "micro_batch": 4, "accumulation_steps": 8,
           "device_type": "cuda", "compile": compiled, "pipeline_parallel": 2, "pipeline_schedule": schedule}
    n_params = flops.param_count(LLAMA)
    got = predicted_columns.peak(LLAMA, n_params, row)
    step = RankStep("bf16", 0, 1, 4, 8, device_type="cuda", compiled=compiled)
    whole = peak_memory(LLAMA, predicted_columns.largest_rank_params(LLAMA, n_params, row), step)
    blocks = activation_memory.block_activation_bytes(LLAMA, 4, "bf16", False, **step.activation_levers)
    per_block, once = pipeline.per_block_and_once(LLAMA, 4, "bf16", activation_checkpointing=False,
                                                  **step.activation_levers)
    held = max(pipeline.held_block_activations(per_block, 4, k, 2, 8, schedule, once) for k in range(2))
    assert got.activations == pytest.approx(whole.activations - blocks + held, rel=1e-12)
    if schedule == "gpipe":  # every micro-batch of the stage's two blocks at once: more than the whole model's one
        assert got.activations > whole.activations
