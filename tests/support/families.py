"""What tests/*/test_families.py share: the helpers tests of more than one tier use."""


from scalelab.config import ModelConfig

LLAMA = {"family": "llama", "n_layers": 2, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 96}


def _llama(**overrides) -> ModelConfig:
    return ModelConfig(**{"seq_len": 32, "tie_embeddings": False, "vocab_size": 256, **LLAMA, **overrides})
