"""A small decoder that is neither built-in family: each block mixes tokens causally with a
learned lower-triangular matrix (no attention) and channels with a ReLU MLP, after a bias-free
LayerNorm. Built by ``build(cfg)`` as a ``models:`` entry's ``module: "models.mixer:build"``."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MixerBlock(nn.Module):
    def __init__(self, seq_len: int, d: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d, bias=False)
        self.tokens = nn.Parameter(torch.randn(seq_len, seq_len) * 0.02)
        self.norm2 = nn.LayerNorm(d, bias=False)
        self.fc = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.size(1)
        mix = torch.tril(self.tokens[:T, :T])
        x = x + mix @ self.norm1(x)
        return x + self.proj(F.relu(self.fc(self.norm2(x))))


class Mixer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.Sequential(*(MixerBlock(cfg.seq_len, cfg.d_model) for _ in range(cfg.n_layers)))
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.layers(self.embed(idx)))


def param_count(cfg) -> int:
    """By hand, to hold the counted parameters to: embedding, per block two norms (d each), the
    token-mixing matrix (T^2) and the MLP (2 d^2 + 2d, 2 d^2 + d), the head."""
    d, T, V = cfg.d_model, cfg.seq_len, cfg.vocab_size
    return V * d + cfg.n_layers * (2 * d + T * T + 4 * d * d + 3 * d) + V * d


def build(cfg):
    return Mixer(cfg), MixerBlock
