"""Tokenizers, the memmap writer, the sampler, and bad corpora."""
import json
import shutil
import subprocess
import sys

from scalelab.harness.testing import local_plan
from scalelab.run.data import (
    synthetic_text_chunks,
)
from support import tiny_config
from support.data import _rewrite_in_place


def test_run_refuses_tokens_rewritten_in_place(tmp_path, tiny_data):
    """train.bin rewritten after meta.json (same size, other bytes, newer mtime): the run ends
    `failed`, naming the file and what differs, and never starts training."""
    from scalelab.planning.column_checks import summary_problems
    from scalelab.planning.sweep import RunPoint
    from scalelab.run.launch import launch_run

    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    size = (data / "train.bin").stat().st_size
    _rewrite_in_place(data / "train.bin", lambda b: bytes((x + 1) % 256 for x in b[:4096]) + b[4096:])
    assert (data / "train.bin").stat().st_size == size
    run_dir = tmp_path / "run"
    summary = launch_run(tiny_config(), local_plan(tiny_config(), RunPoint("fp32", 0, 1)), data, run_dir, tmp_path / "run.log")
    assert summary["status"] == "failed"
    assert str(data / "train.bin") in summary["reason"] and "sha256" in summary["reason"]
    assert "completed_steps" not in summary and not (run_dir / "run_plan.json").exists(), "no worker was launched"
    assert summary_problems(summary) == [], "the column table's contract for a run stopped before launch"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


MEMORY_PROBE = r"""
import resource, sys
import numpy as np
from scalelab.config import DatasetConfig
from scalelab.run.data import prepare_dataset
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cfg = DatasetConfig(name="m", source="text", path=sys.argv[1], tokenizer="byte", bpe_vocab_size=300,
                    decode_errors="strict", tokenized_dtype="uint16", vocab_size=None, val_fraction=0.1,
                    synthetic_bytes=1000, seed=0)
prepare_dataset(cfg, sys.argv[2], seq_len=64, chunk_bytes=1 << 20)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


def test_writer_memory_is_bounded_by_chunk_not_corpus(tmp_path):
    corpus = tmp_path / "big.txt"
    with open(corpus, "wb") as f:  # 48 MiB of text, 48x the 1 MiB chunk
        for chunk in synthetic_text_chunks(48 << 20, seed=1, chunk_bytes=1 << 20):
            f.write(chunk)
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(corpus), str(tmp_path / "o")],
                         capture_output=True, text=True, check=True)
    growth = int(out.stdout.strip().splitlines()[-1])
    # A whole-corpus approach would need > 48 MiB (text) + 96 MiB (uint16 tokens).
    assert growth < 32 << 20, f"peak RSS grew by {growth / 2**20:.1f} MiB"
