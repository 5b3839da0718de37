"""The memory formulas against every GPU run on record (results/reference/<gpu>-<date>/gpu-check*.json,
written by `python -m scalelab.harness.gpu_check` on a lent GPU): each run's max allocated, as the GPU
measured it, against what the formulas predict for it today."""
import json

import pytest

from scalelab.config import ModelConfig
from scalelab.formulas import flops, peak_memory
from scalelab.formulas.rank_step import RankStep
from support import REPO

CHECKS = sorted((REPO / "results" / "reference").glob("*/gpu-check*.json"))


def _gpu_runs():
    """(file, label, model, micro-batch, precision, stage, compiled, measured bytes) of every scalelab run
    on record whose device memory was measured."""
    for path in CHECKS:
        check = json.loads(path.read_text())
        for label, measurements in check["measurements"]["scalelab"].items():
            words = label.split()  # "350M bf16+tf32 compiled stage 3 [traced]" (gpu_measure.Key.label)
            shape = check["shapes"][words[0]]
            cfg = ModelConfig(shape["n_layers"], shape["d_model"], shape["n_heads"], shape["seq_len"], True, shape["vocab_size"])
            stage = int(words[words.index("stage") + 1]) if "stage" in words else 0
            for m in measurements:
                if m["status"] == "ok" and m.get("peak_bytes_measured_is") == "device":
                    yield (path.parent.name, label, cfg, shape["batch"], words[1].split("+")[0], stage, "compiled" in words,
                           m["peak_bytes_measured"])


RUNS = list(_gpu_runs())


def test_gpu_runs_are_on_record():
    assert {path.parent.name for path in CHECKS} >= {"nvidia-h100-80gb-hbm3-2026-11-26", "nvidia-h200-2026-11-26"}
    assert len(RUNS) >= 15


@pytest.mark.parametrize("gpu, label, cfg, batch, precision, stage, compiled, measured", RUNS,
                         ids=[f"{r[0][:11]}:{r[1]}" for r in RUNS])
def test_a_gpu_runs_peak_is_the_prediction(gpu, label, cfg, batch, precision, stage, compiled, measured):
    """Within 0.5% where the prediction models the step (eager and compiled, bf16, fp16 and fp32 with
    TF32, stages 0, 2 and 3); fp8's prediction is an upper bound (activation_bound), and holds as one.
    Before issue #40's H200 findings eager bf16 at stage 3 read 1.068 and compiled stage 2 1.040 (the
    LayerNorms' fp32 copies under CUDA's autocast, FSDP2's gathered groups at world size 1)."""
    peak = peak_memory.peak_memory(cfg, flops.param_count(cfg),
                                  RankStep(precision, stage, 1, batch, device_type="cuda", compiled=compiled))
    if peak.upper_bound:
        assert measured <= peak.total, (measured / 2**30, peak.total / 2**30)
    else:
        assert measured / peak.total == pytest.approx(1.0, abs=0.005), (measured / 2**30, peak.total / 2**30)


def test_the_memory_case_with_a_byte_vocabulary():
    """The GPU test's memory case (12 x 768, seq 1024, batch 8, 256 byte tokens) as the H200 measured it,
    eager bf16 at stages 3 and 0: within 5%. What is left (+3.5%, +4.4%) is the last block's backward
    while its activations are still held, ~28 s b h bytes, not modelled: with a real vocabulary the loss's
    8 B T V bytes at the start of backward are the peak instead (the runs above)."""
    check = json.loads((REPO / "results/reference/nvidia-h200-2026-11-26/gpu-check-2-memory-traces.json").read_text())
    cfg = ModelConfig(12, 768, 12, 1024, True, 256)
    for case in check["parts"]["memory"]["cases"]:
        stage = int(case["label"].split()[-1])
        peak = peak_memory.peak_memory(cfg, flops.param_count(cfg), RankStep("bf16", stage, 1, 8, device_type="cuda"))
        assert 1.0 < case["measured_bytes"] / peak.total < 1.05, (case["label"], case["measured_bytes"] / peak.total)
