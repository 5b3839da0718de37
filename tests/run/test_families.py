"""Model families (issue #30): the Llama family beside GPT-2, presets of published shapes, the
user's own module. In process: parameter counts (exact, and each preset's published figure),
FLOPs per token against torch.utils.flop_counter, activations against autograd's saved tensors,
LoRA on the SwiGLU projections, config errors, the estimate CLI. Real torchrun/gloo runs: fp32
loss parity across stages and world sizes with the single-process reference, model state and
activations against the formulas, the levers, and a model the test suite defines."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from scalelab.config import model_config, train_config
from scalelab.formulas import flops, lora_training
from scalelab.harness.reference import bare_loop
from scalelab.planning.sweep import RunPoint
from scalelab.run.model import counted
from support import PARITY_STEPS, run_point, tiny_config
from support.families import LLAMA, _llama

TESTS = Path(__file__).parents[1]
"""The llama shape the runs train: grouped-query attention 4:2, SwiGLU 96 (seq_len 32 from tiny_config)."""
"""Measured on an NVIDIA H100 (torch 2.11, CUDA 13) by SavedActivationMeter around one forward of
scalelab's Llama (the same code as here): the GPU's kernels save less than the CPU's (a fused
RMSNorm) and, for fp32 grouped-query attention, more (SDPA's math path keeps the probabilities)."""


# ----------------------------------------------------------------------------- real runs
PARITY_POINTS = [(0, 1), (0, 2), (1, 2), (2, 2), (3, 2)]
"""Every stage, both world sizes, in five runs (each held to the one single-process reference)."""


def _llama_config(**train):
    return tiny_config(train={"steps": PARITY_STEPS, "warmup_steps": 2, **train}, planning={"launch_overcommitted": True},
                       models={"llama": LLAMA}, sweep={"model": ["llama"]})


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory, tiny_data):
    tmp = tmp_path_factory.mktemp("llama")
    return {(z, w): run_point(tmp, tiny_data, RunPoint("fp32", z, w, model="llama"), cfg=_llama_config(),
                              save_final_params=True) for z, w in PARITY_POINTS}


@pytest.fixture(scope="module")
def llama_reference(tiny_data):
    meta = json.loads((tiny_data / "meta.json").read_text())
    config = _llama_config()
    losses, _, state = bare_loop(model_config(config, meta["vocab_size"], name="llama"), train_config(config),
                                 str(tiny_data / "train.bin"), meta["dtype"])
    return losses, state


@pytest.mark.parametrize("stage, world_size", PARITY_POINTS)
def test_llama_fp32_parity_and_formulas(llama_runs, llama_reference, stage, world_size):
    summary, steps, run_dir = llama_runs[(stage, world_size)]
    assert summary["status"] == "ok", summary["reason"]
    assert (summary["model_family"], summary["n_kv_heads"], summary["ffn_dim"], summary["tie_embeddings"]) == ("llama", 2, 96, False)
    ref_losses, ref_state = llama_reference
    np.testing.assert_allclose(steps["loss"].to_numpy(), ref_losses, rtol=1e-5, atol=0)
    final = torch.load(run_dir / "final_params.pt")
    assert final.keys() == ref_state.keys()
    for name, ref in ref_state.items():
        torch.testing.assert_close(final[name], ref, atol=1e-4, rtol=0, msg=name)
    cfg = _llama(vocab_size=summary["vocab_size"])
    assert summary["n_params"] == flops.param_count(cfg)
    assert summary["flops_per_token"] == flops.flops_per_token(cfg) and summary["flops_per_token_method"] == "formula"
    measured, predicted = summary["model_state_bytes_measured"], summary["model_state_bytes_predicted"]
    granularity = 8 * summary["vocab_size"] * summary["d_model"] if stage == 1 else 0  # ZeRO-1 shards whole tensors
    assert abs(measured - predicted) <= max(0.01 * predicted, granularity), (measured, predicted)
    measured, predicted = summary["activation_bytes_measured"], summary["activation_bytes_predicted"]
    assert abs(measured - predicted) <= 0.05 * predicted, (measured, predicted)
    assert summary["activation_bytes_outside_blocks_measured"] == summary["activation_bytes_outside_blocks_predicted"]


def test_llama_with_levers_at_stage_3(tmp_path, tiny_data, llama_runs):
    """bf16 with 16-bit parameters (FSDP2's MixedPrecisionPolicy), activation checkpointing and LoRA
    on the attention and SwiGLU projections: ok, model state and activations as predicted, and LoRA
    starts from its full-training twin's loss (bf16 differs from fp32 by rounding only)."""
    summary, steps, _ = run_point(tmp_path, tiny_data, RunPoint("bf16", 3, 2, activation_checkpointing=True,
                                                                model="llama", lora_rank=4), cfg=_llama_config())
    assert summary["status"] == "ok", summary["reason"]
    cfg = _llama(vocab_size=summary["vocab_size"])
    assert summary["n_trainable_params"] == lora_training.lora_trainable_params(cfg, 4)
    for kind in ("", "params_", "grads_", "optimizer_"):
        measured, predicted = summary[f"model_state_{kind}bytes_measured"], summary[f"model_state_{kind}bytes_predicted"]
        assert abs(measured - predicted) <= 0.01 * predicted, (kind, measured, predicted)
    measured, predicted = summary["activation_bytes_measured"], summary["activation_bytes_predicted"]
    assert abs(measured - predicted) <= 0.05 * predicted, (measured, predicted)
    twin = llama_runs[(3, 2)][1]["loss"].iloc[0]
    assert steps["loss"].iloc[0] == pytest.approx(twin, rel=2e-2)


def test_a_model_the_test_suite_defines(tmp_path, tiny_data, monkeypatch):
    """models.<name>.module: parameters counted from the module, FLOPs by torch.utils.flop_counter
    (the row says so), model state predicted from the counted parameters; no activation prediction."""
    from models.mixer import param_count

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    config = tiny_config(train={"steps": 4, "warmup_steps": 1}, planning={"launch_overcommitted": True},
                         models={"mixer": {"module": "models.mixer:build"}}, sweep={"model": ["mixer"]})
    summary, steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", 3, 2, activation_checkpointing=True, model="mixer"),
                                  cfg=config)
    assert summary["status"] == "ok", summary["reason"]
    cfg = model_config(config, summary["vocab_size"], name="mixer")
    assert (summary["model_family"], summary["model_module"]) == ("custom", "models.mixer:build")
    assert summary["n_params"] == param_count(cfg)
    assert summary["flops_per_token_method"].startswith("counted") and summary["flops_per_token"] == counted(cfg)["flops_per_token"]
    assert summary["recompute_flops_per_token"] == counted(cfg)["block_forward_flops_per_token"] > 0
    measured, predicted = summary["model_state_bytes_measured"], summary["model_state_bytes_predicted"]
    assert abs(measured - predicted) <= 0.01 * predicted, (measured, predicted)
    assert summary["activation_bytes_predicted"] is None and summary["predicted_activation_bytes"] is None
    assert summary["activation_bytes_measured"] > 0 and np.isfinite(steps["loss"]).all()


def test_a_tied_llama_trains_as_its_reference_at_stage_3(tmp_path, tiny_data):
    """A llama entry with a tied head (as Llama 3.2 1B and 3B): FSDP2 over two ranks trains the one weight as the
    single-process loop does, and its model state is what the formulas count (the tied weight once)."""
    config = tiny_config(train={"steps": PARITY_STEPS, "warmup_steps": 2}, planning={"launch_overcommitted": True},
                         models={"llama": {**LLAMA, "tie_embeddings": True}}, sweep={"model": ["llama"]})
    summary, steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", 3, 2, model="llama"), cfg=config)
    assert summary["status"] == "ok", summary["reason"]
    assert summary["tie_embeddings"] is True
    meta = json.loads((tiny_data / "meta.json").read_text())
    cfg = model_config(config, meta["vocab_size"], name="llama")
    losses, _, _ = bare_loop(cfg, train_config(config), str(tiny_data / "train.bin"), meta["dtype"])
    np.testing.assert_allclose(steps["loss"].to_numpy(), losses, rtol=1e-5, atol=0)
    assert summary["n_params"] == flops.param_count(cfg) == flops.param_count(_llama(vocab_size=cfg.vocab_size)) - cfg.vocab_size * cfg.d_model
    measured, predicted = summary["model_state_bytes_measured"], summary["model_state_bytes_predicted"]
    assert abs(measured - predicted) <= 0.01 * predicted, (measured, predicted)
