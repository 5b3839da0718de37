"""LoRA as a lever and the model-size axis: the adapter itself (in process), the formulas, the
sweep axes, and real torchrun/gloo runs at every stage (model state and communication against
the LoRA formulas, first-step loss equal to the full-training twin's)."""

import pytest
import torch
import yaml

from scalelab.config import ConfigError, ModelConfig, model_config
from scalelab.formulas import communication, flops, lora_training
from scalelab.harness import REPO_ROOT
from scalelab.planning.sweep import sweep_points
from scalelab.planning.validation import check_config
from scalelab.run.lora import LoRALinear, apply_lora, trainable_parameters
from scalelab.run.model import GPT
from scalelab.run.parallel import param_groups


def _twins(cfg: ModelConfig, rank: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    full = GPT(cfg)
    torch.manual_seed(seed)
    lora = GPT(cfg)
    added = apply_lora(lora, rank, alpha=16)
    return full, lora, added


def test_lora_starts_from_the_full_models_weights_and_loss():
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=16, vocab_size=64)
    full, lora, added = _twins(cfg)
    idx = torch.randint(0, 64, (3, 17), generator=torch.Generator().manual_seed(1))
    assert full(idx[:, :-1], idx[:, 1:]).item() == lora(idx[:, :-1], idx[:, 1:]).item()  # the forward returns the loss
    assert added == trainable_parameters(lora) == lora_training.lora_trainable_params(cfg, 4)
    assert lora.num_parameters() == flops.param_count(cfg) + added
    adapted = [m for m in lora.modules() if isinstance(m, LoRALinear)]
    assert len(adapted) == 4 * cfg.n_layers
    for m in adapted:
        assert not m.base.weight.requires_grad and m.lora_a.requires_grad and m.lora_b.requires_grad
        assert torch.count_nonzero(m.lora_b) == 0 and torch.count_nonzero(m.lora_a) > 0
        assert m.scale == 16 / 4
    # The optimizers see only A and B, weight decay on both (matrices).
    groups = param_groups(lora, 0.1)
    assert sum(p.numel() for p in groups[0]["params"]) == added and groups[1]["params"] == []
    # After one update of B the adapted model differs from the twin through B A only.
    loss = lora(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert all(p.grad is None for p in lora.parameters() if not p.requires_grad)


def test_lora_formulas():
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=4, seq_len=64)
    psi, t = flops.param_count(cfg), lora_training.lora_trainable_params(cfg, 8)
    s0 = lora_training.lora_model_state_bytes(psi, t, 0, 2, "fp32")
    assert s0.total == 4 * psi + 16 * t
    s3 = lora_training.lora_model_state_bytes(psi, t, 3, 2, "fp32")
    assert s3.total == (4 * psi + 16 * t) / 2
    comm = {s: lora_training.lora_comm_elements_per_step(psi, t, s, 2) for s in range(4)}
    assert comm == {0: 2 * t, 1: 3 * t, 2: (psi + t) + t, 3: 2 * (psi + t) + t}
    assert lora_training.lora_comm_elements_per_step(psi, t, 3, 1) == 0
    # Without frozen weights the LoRA formulas are the full-training ones.
    for stage in range(4):
        for convention in ("pytorch", "paper"):
            assert lora_training.lora_comm_elements_per_step(0, psi, stage, 2, 2, convention) == \
                communication.comm_elements_per_step(psi, stage, 2, 2, convention)


def test_model_axis_and_lora_axis_in_the_sweep():
    config = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    # the default sweep: model base, full training, its baseline repeated (fp32-z0 at 2 world sizes, four times more)
    assert len(sweep_points(config)) == 24 + 2 * 4
    config["models"] = {"tiny": {"n_layers": 1, "d_model": 32, "n_heads": 2}}
    config["sweep"].update(model=["base", "tiny"], lora_rank=[None, 8])
    points = sweep_points(config)
    # each model's baseline (full training) repeated: each model measures its own noise
    assert len(points) == 24 * 4 + 2 * 2 * 4
    ids = {p.run_id for p in points}
    assert {"fp32-z0-w1-r3", "fp32-z0-w1-tiny-r3"} <= ids and "fp32-z0-w1-lora8-r2" not in ids
    assert {"fp32-z0-w1", "fp32-z0-w1-tiny", "fp32-z0-w1-lora8", "fp32-z0-w1-tiny-lora8"} <= ids
    tiny = model_config(config, name="tiny")
    assert (tiny.n_layers, tiny.d_model, tiny.n_heads, tiny.seq_len) == (1, 32, 2, config["model"]["seq_len"])
    assert model_config(config, name="base") == model_config(config)
    config["sweep"]["model"] = ["huge"]
    with pytest.raises(ConfigError, match="sweep.model='huge'"):
        check_config(config, REPO_ROOT)
    config["sweep"]["model"] = ["base"]
    config["models"] = {"base": {"n_layers": 1}}
    with pytest.raises(ConfigError, match="models.base"):
        check_config(config, REPO_ROOT)
