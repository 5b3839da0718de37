"""What the GPU check measures and how long it may take: its GPT shapes, the points of its comparisons
with the plain loop and of its fp8 pairs, its targets, and the time a part or a measurement needs."""
from __future__ import annotations

from scalelab.harness.gpu_measure import Key

# GPT shapes of the check: the model (GPT-2's layout, tied embeddings), vocabulary and batch. One
# prepared dataset serves every shape of a run of the check: they share seq_len and vocabulary.
GPU_SHAPES = {
    "350M": {"n_layers": 24, "d_model": 1024, "n_heads": 16, "seq_len": 1024, "vocab_size": 50304, "batch": 16},
    "1.3B": {"n_layers": 24, "d_model": 2048, "n_heads": 16, "seq_len": 1024, "vocab_size": 50304, "batch": 16},
}
DRY_SHAPES = {
    "tiny": {"n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 64, "vocab_size": 256, "batch": 4},
    "small": {"n_layers": 2, "d_model": 128, "n_heads": 4, "seq_len": 64, "vocab_size": 256, "batch": 4},
}
STEPS = {"gpu": (30, 10), "dry": (6, 2)}  # (steps, warm-up steps) of every measured run
TARGETS = {"ratio": 0.98, ("350M", "bf16", True): 0.45, ("1.3B", "bf16", True): 0.55}
TARGETS_TEXT = ("GPU targets: scalelab/plain tokens/s >= 0.98, eager and compiled; "
                "350M bf16 compiled MFU >= 0.45; 1.3B (24 x 2048) bf16 compiled MFU >= 0.55")


COMPARISON_PARTS = ("bench", "large", "rest")
"""The parts that hold scalelab against the plain loop, point by point."""


def comparison_points(dry_run: bool) -> dict[str, list[Key]]:
    """The scalelab-against-plain points of the parts bench, large and rest."""
    shape = "tiny" if dry_run else "350M"
    bench = [Key(shape, "bf16", compiled=c) for c in (False, True)]
    # large: the 1.3B MFU target's point, so a miss can be told apart from what torch reaches there
    large = [Key("small", "bf16")] if dry_run else [Key("1.3B", "bf16", compiled=True)]
    if dry_run:  # fp16 and TF32 mean nothing on a CPU; bf16 took the compiled path of both sides already
        rest = [Key(shape, "fp32")]
    else:  # compiled first: the scalelab/plain gap the first GPU found was a compiled one
        rest = [Key(shape, p, tf32=p == "fp32", compiled=c) for c in (True, False) for p in ("fp16", "fp32")]
    return {"bench": bench, "large": large, "rest": rest}


def fp8_points(dry_run: bool) -> list[tuple[Key, Key]]:
    """(bf16, fp8) pairs at two sizes: compiled on a GPU; eager in a dry run, where fp8 is emulated
    (torchao's float8 casts in bf16) and a compilation per point would cost half a minute of CPU
    for figures that mean nothing (tests/*/test_levers.py compiles emulated fp8)."""
    shapes = DRY_SHAPES if dry_run else GPU_SHAPES
    return [(Key(s, "bf16", compiled=not dry_run), Key(s, "fp8", compiled=not dry_run)) for s in shapes]


# The least time a measurement may start with (seconds): what one needs, start-up and compilation
# included, on each kind of machine; with less left it is recorded as "not run: deadline".
MIN_LEFT_SUITE_S = {"gpu": 30, "dry": 10}
MIN_LEFT_SWEEP_S = {"gpu": 150, "dry": 20}
MAX_MEASURE_S = {"gpu": 300, "dry": 120}
"""The longest one plain-loop measurement may take (a 1.3B compiled run takes ~70 s on a GPU): one that
hangs is stopped there, not at the whole check's deadline, and the parts after it still run."""
RESERVE_S = 5.0  # kept back for the summary and the JSON
LAUNCH_TEARDOWN_S = 15.0  # what a scalelab run may take past its run_timeout_s (stopping its ranks, its results)
