"""Well-known model shapes by name, for ``scalelab estimate --model NAME`` and ``models: {x: {preset: NAME}}``.

Each preset is the shape of a published checkpoint (its Hugging Face ``config.json``: layers,
width, heads, key/value heads, SwiGLU width, vocabulary, context, RoPE base) and the parameter
count its model card or safetensors index states, embedding, untied head and norms included
(GPT-2 ties its head: counted once). tests/unit/test_families.py holds scalelab.formulas.flops.param_count
of each shape to that figure. ``llama-tiny`` is scalelab's own: a Llama-family shape that trains
on a CPU in seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    name: str
    shape: dict = field(repr=False)
    """scalelab.config.ModelConfig keys: the family, the shape, vocab_size and seq_len (the context
    length): ``ModelConfig(**preset.shape)``. (This module imports no other: scalelab.config reads
    it for a models: entry's ``preset``.)"""
    source: str
    """Where the shape and the count were read."""
    published_params: int | None
    """The parameter count the source states; None for scalelab's own shapes."""


def _gpt2(layers: int, d: int, heads: int) -> dict:
    return {"family": "gpt2", "n_layers": layers, "d_model": d, "n_heads": heads, "vocab_size": 50257,
            "seq_len": 1024, "tie_embeddings": True}


def _llama(layers: int, d: int, heads: int, kv: int, ffn: int, vocab: int, seq: int, base: float, tied: bool = False) -> dict:
    return {"family": "llama", "n_layers": layers, "d_model": d, "n_heads": heads, "n_kv_heads": kv, "ffn_dim": ffn,
            "vocab_size": vocab, "seq_len": seq, "rope_base": base, "tie_embeddings": tied}


_HF = "https://huggingface.co/{}/blob/main/config.json"
PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("gpt2", _gpt2(12, 768, 12), _HF.format("openai-community/gpt2"), 124_439_808),
    Preset("gpt2-medium", _gpt2(24, 1024, 16), _HF.format("openai-community/gpt2-medium"), 354_823_168),
    Preset("gpt2-large", _gpt2(36, 1280, 20), _HF.format("openai-community/gpt2-large"), 774_030_080),
    Preset("gpt2-xl", _gpt2(48, 1600, 25), _HF.format("openai-community/gpt2-xl"), 1_557_611_200),
    Preset("llama2-7b", _llama(32, 4096, 32, 32, 11008, 32000, 4096, 10000.0),
           _HF.format("meta-llama/Llama-2-7b-hf"), 6_738_415_616),
    Preset("llama2-13b", _llama(40, 5120, 40, 40, 13824, 32000, 4096, 10000.0),
           _HF.format("meta-llama/Llama-2-13b-hf"), 13_015_864_320),
    Preset("llama2-70b", _llama(80, 8192, 64, 8, 28672, 32000, 4096, 10000.0),
           _HF.format("meta-llama/Llama-2-70b-hf"), 68_976_648_192),
    # Llama 3.2's small models tie their heads (tie_word_embeddings: true); pretrained at 8192 tokens
    # (rope_scaling's original_max_position_embeddings) before their context was extended to 131072
    Preset("llama3.2-1b", _llama(16, 2048, 32, 8, 8192, 128256, 8192, 500000.0, tied=True),
           _HF.format("meta-llama/Llama-3.2-1B") + " (Hub safetensors parameters, BF16)", 1_235_814_400),
    Preset("llama3.2-3b", _llama(28, 3072, 24, 8, 8192, 128256, 8192, 500000.0, tied=True),
           _HF.format("meta-llama/Llama-3.2-3B") + " (Hub safetensors parameters, BF16)", 3_212_749_824),
    Preset("llama3-8b", _llama(32, 4096, 32, 8, 14336, 128256, 8192, 500000.0),
           _HF.format("meta-llama/Meta-Llama-3-8B"), 8_030_261_248),
    Preset("llama3-70b", _llama(80, 8192, 64, 8, 28672, 128256, 8192, 500000.0),
           _HF.format("meta-llama/Meta-Llama-3-70B"), 70_553_706_496),
    Preset("mistral-7b", _llama(32, 4096, 32, 8, 14336, 32000, 8192, 10000.0),
           _HF.format("mistralai/Mistral-7B-v0.1") + " (trained at 8192 tokens, sliding window 4096: "
           "scalelab's attention is full causal)", 7_241_732_096),
    Preset("llama-tiny", _llama(2, 64, 4, 2, 176, 256, 64, 10000.0),
           "scalelab: a Llama-family shape for CPU runs (grouped-query 4:2, SwiGLU 176 = 8/3 d rounded to 16)", None),
)}

