"""The tokenizers a corpus is prepared with (dataset.tokenizer): bytes as tokens, or a byte-level BPE
trained on the corpus."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from scalelab.io import atomic_path

BYTE_VOCAB = 256


class ByteTokenizer:
    """Bytes are tokens: vocab 256, lossless, no dependency, no decoding needed."""

    name = "byte"
    vocab_size = BYTE_VOCAB

    def encode_bytes(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=np.uint8)


class BPETokenizer:
    """Byte-level BPE trained on the corpus with Hugging Face ``tokenizers``."""

    name = "bpe"

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> "BPETokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: str | Path) -> "BPETokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: Path) -> None:
        with atomic_path(path) as tmp:
            self._tok.save(str(tmp))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, dtype=np.int64)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])
