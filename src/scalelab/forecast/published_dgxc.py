"""A second public source of tensor-parallel series: NVIDIA's DGX Cloud Benchmarking performance recipes, NeMo 24.11
on H100s, the same model and parallel layout at 5-8 GPU counts, each series calibrated at its smallest count and
predicted at the larger ones (held out: nothing is fitted on them).

Source: https://github.com/NVIDIA/dgxc-benchmarking, release v24.11.1 (commit 35a9aec, the first public one), each
recipe's README, "Expected Slurm Performance" (the training step time per GPU count, whose throughput column is
sequence x GBS / step time), with the model and its parallel settings in the recipe's NeMo yaml:

* ``nemotron/README_15b.md``, tables "Nemotron4 15b 24.11 BF16" and "... FP8" (TP=4, PP=1, MBS=4, GA=4; 16-2048 GPUs,
  GBS = 4 x GPUs); ``nemotron/nemotron4-15b-synth.yaml``: 32 layers, hidden 6,144, FFN 24,576 (squared ReLU, no gate),
  48 heads, 8 query groups, sequence 4,096, RoPE, no biases, untied embeddings, sequence parallelism on, the
  distributed optimizer (``distributed_fused_adam``, ``grad_sync_dtype: bf16``, its gradient and parameter syncs
  overlapped), tensor-parallel communication overlapped (``ub_tp_comm_overlap``); the vocabulary, 256,000, in the
  README's notes.
* ``nemo_megatron/README_175b.md``, "NeMo Megatron 24.11 BF16" and "... FP8" (GPT-3 175B, TP=4, PP=8, VP=12, MBS=1,
  sequence 2,048; 128-2,048 GPUs, GBS = 2 x GPUs); ``nemo_megatron/gpt3_175b_hydra.yaml`` for its shape.

How scalelab prices them: as the nemo trainer (``--trainer nemo``: the megatron trainer's distributed optimizer, its
reduce-scatter and all-gather in bf16 and exposed, and tensor parallelism with sequence parallelism and a
vocabulary-parallel head, whose blocks' all-gathers and reduce-scatters userbuffers overlap with their GEMMs: every
recipe runs ``ub_tp_comm_overlap=True``, the 175B yaml itself and both Nemotrons through ``nemotron/configure.sh``'s
override of the 340B yaml's False), on nodes of 8 H100s whose links the recipes do not state: taken as NVIDIA's
reference architecture for them, a DGX H100 with one 400 Gb/s NDR NIC per GPU (``ib-ndr``). Nemotron's squared-ReLU
MLP of 24,576 (two matrices) is priced as the llama family's gated MLP of the same parameters (three matrices of
16,384): the same FLOPs and bytes. The pipelined rows are priced by the pipelined model
(scalelab.forecast.pipeline_step) with the interleaved schedule over the 12 chunks per rank the recipes run
(``virtual_pipeline_model_parallel_size: 12`` in gpt3_175b_hydra.yaml; ``VP=12`` for the 340B in nemotron/configure.sh):
96 blocks over 8 stages x 12 chunks, one block a chunk.

What the nemo trainer leaves out of what the recipes state, each priced exposed (so the calibrated MFU is, if
anything, high): the distributed optimizer's overlap (``overlap_grad_sync``, ``overlap_param_sync``), the point-to-point
overlap of the interleaved schedule's steady state (``overlap_p2p_comm``, 175B yaml and the 340B's override), and the
340B yaml's ``activations_checkpoint_granularity: selective`` (the attention core recomputed: not priced).
"""
from __future__ import annotations

from dataclasses import replace

from scalelab.config import ModelConfig
from scalelab.forecast.published_runs import Published, calibrated_mfu, predicted_tokens_per_gpu

SOURCE = "NVIDIA dgxc-benchmarking v24.11.1 (NeMo 24.11, H100)"
TRAINER = "nemo"
"""Every recipe runs ub_tp_comm_overlap=True (gpt3_175b_hydra.yaml; nemotron/configure.sh overrides the 340B yaml's
False for both Nemotrons) with sequence parallelism: the nemo trainer's tensor-parallel overlap."""
NEMOTRON_15B = ModelConfig(family="llama", n_layers=32, d_model=6144, n_heads=48, n_kv_heads=8, ffn_dim=2 * 24576 // 3,
                           seq_len=4096, vocab_size=256000, tie_embeddings=False)
"""nemotron4-15b-synth.yaml's shape; the FFN as the llama family's gated MLP of the same parameters."""
NEMOTRON_15B_STEP_S = {
    "bf16": {16: 2.83, 32: 2.86, 64: 2.86, 128: 2.89, 256: 2.88, 512: 2.92, 1024: 2.92, 2048: 2.96},
    "fp8": {16: 2.08, 32: 2.07, 64: 2.09, 128: 2.08, 256: 2.1, 512: 2.12, 1024: 2.12, 2048: 2.18},
}
"""Training step time (seconds per step) per GPU count, README_15b.md's two tables."""
NEMOTRON_15B_LAYOUT = {"tensor_parallel": 4, "micro_batch": 4, "accumulation": 4, "gbs_per_gpu": 4}


def _nemotron_15b_rows() -> list[Published]:
    rows = []
    layout = NEMOTRON_15B_LAYOUT
    for precision, steps in NEMOTRON_15B_STEP_S.items():
        for gpus, step_s in steps.items():
            tokens_per_gpu = NEMOTRON_15B.seq_len * layout["gbs_per_gpu"] * gpus / step_s / gpus
            rows.append(Published(f"Nemotron-4 15B {precision}, TP 4", SOURCE, NEMOTRON_15B, gpus, layout["micro_batch"],
                                  layout["accumulation"], False, tokens_per_gpu, key=1, precision=precision,
                                  grad_reduce="compute", tensor_parallel=layout["tensor_parallel"],
                                  sequence_parallel=True, trainer=TRAINER))
    return rows


GPT3_175B = ModelConfig(n_layers=96, d_model=12288, n_heads=96, seq_len=2048, vocab_size=51200, tie_embeddings=True)
"""gpt3_175b_hydra.yaml's shape (its FFN 49,152 is the gpt2 family's 4 x hidden; embeddings shared, NeMo's default); the
vocabulary in the README's notes."""
GPT3_175B_STEP_S = {
    "bf16": {128: 8.91, 256: 8.95, 512: 9.09, 1024: 9.01, 2048: 9.02},
    "fp8": {128: 5.92, 256: 5.96, 512: 6.44, 1024: 6.72, 2048: 6.24},
}
"""Training step time (seconds per step) per GPU count, README_175b.md's two tables."""
GPT3_175B_LAYOUT = {"tensor_parallel": 4, "pipeline_parallel": 8, "virtual_pipeline": 12, "micro_batch": 1, "gbs_per_gpu": 2}


NEMOTRON_340B = ModelConfig(family="llama", n_layers=96, d_model=18432, n_heads=96, n_kv_heads=8,
                            ffn_dim=2 * 73728 // 3, seq_len=4096, vocab_size=256000, tie_embeddings=False)
"""nemotron4-340b-synth.yaml's shape; the FFN as the llama family's gated MLP of the same parameters."""
NEMOTRON_340B_STEP_S = {
    "bf16": {128: 4.61, 256: 4.67, 512: 4.7, 1024: 4.73, 2048: 4.84},
    "fp8": {128: 3.16, 256: 3.21, 512: 3.26, 1024: 3.34, 2048: 3.49},
}
"""Training step time (seconds per step) per GPU count, README_340b.md's two tables."""
NEMOTRON_340B_LAYOUT = {"tensor_parallel": 8, "pipeline_parallel": 8, "virtual_pipeline": 12, "micro_batch": 1,
                         "gbs_per_gpu": 0.25}


def _pipelined_rows(name: str, cfg: ModelConfig, steps_by_precision: dict, layout: dict) -> list[Published]:
    """A pipelined series per precision (1F1B interleaved, the distributed optimizer over the data-parallel ranks): each
    count's accumulation is its global batch over its data-parallel ranks' micro-batches."""
    rows = []
    tp, pp = layout["tensor_parallel"], layout["pipeline_parallel"]
    for precision, steps in steps_by_precision.items():
        for gpus, step_s in steps.items():
            global_batch = round(layout["gbs_per_gpu"] * gpus)
            accumulation = global_batch // (gpus // (tp * pp)) // layout["micro_batch"]
            tokens_per_gpu = cfg.seq_len * global_batch / step_s / gpus
            rows.append(Published(f"{name} {precision}, TP {tp} x PP {pp}", SOURCE, cfg, gpus, layout["micro_batch"],
                                  accumulation, False, tokens_per_gpu, key=1, precision=precision, grad_reduce="compute",
                                  tensor_parallel=tp, sequence_parallel=True, trainer=TRAINER, pipeline_parallel=pp,
                                  pipeline_schedule="interleaved_1f1b", chunks_per_rank=layout["virtual_pipeline"]))
    return rows


ROWS = (*_nemotron_15b_rows(), *_pipelined_rows("GPT-3 175B", GPT3_175B, GPT3_175B_STEP_S, GPT3_175B_LAYOUT),
        *_pipelined_rows("Nemotron-4 340B", NEMOTRON_340B, NEMOTRON_340B_STEP_S, NEMOTRON_340B_LAYOUT))


def validation(rows: tuple[Published, ...] = ROWS) -> list[dict]:
    """Per row beyond its series' smallest count: published and predicted tokens/s per GPU and the error, the series'
    MFU calibrated at its smallest count."""
    out = []
    for series in dict.fromkeys(r.series for r in rows):
        mine = sorted((r for r in rows if r.series == series), key=lambda r: r.gpus)
        mfu = calibrated_mfu(mine[0])
        for row in mine[1:]:
            predicted = predicted_tokens_per_gpu(row, mfu)
            out.append({"series": series, "calibrated_at": mine[0].gpus, "mfu": mfu, "gpus": row.gpus,
                        "tensor_parallel": row.tensor_parallel, "pipeline_parallel": row.pipeline_parallel,
                        "published": row.tokens_per_s_per_gpu, "predicted": predicted,
                        "error": predicted / row.tokens_per_s_per_gpu - 1})
    return out


def _mean_abs(rows: list[dict]) -> float:
    return sum(abs(r["error"]) for r in rows) / len(rows)


def _summary(label: str, rows: list[dict]) -> str:
    if not rows:
        return f"{label}: no rows"
    within = sum(abs(r["error"]) <= 0.2 for r in rows) / len(rows)
    return (f"{label}: {len(rows)} rows, mean absolute error {_mean_abs(rows):.1%}, worst "
            f"{max(abs(r['error']) for r in rows):.1%}, {within:.0%} within 20%")


def as_megatron(rows: tuple[Published, ...] = ROWS) -> tuple[Published, ...]:
    """The rows as the megatron trainer prices them (no tensor-parallel overlap, the interleaved schedule over
    scalelab's 2 chunks per rank): what the nemo trainer's two facts change."""
    return tuple(replace(r, trainer="megatron", chunks_per_rank=None) for r in rows)


def _mfus_text(mfus: dict[str, float]) -> str:
    return ", ".join(f"{m:.1%} ({series.split(',')[0]})" for series, m in mfus.items())


def dgxc_document() -> str:
    """The section docs/prediction.md holds for this source: each series' calibration and its errors per count, then the
    tensor-parallel-only and the pipelined rows' errors apart."""
    rows, before = validation(), validation(as_megatron())
    counts = sorted({r["gpus"] for r in rows})
    series = list(dict.fromkeys(r["series"] for r in rows))
    flat = [r for r in rows if r["pipeline_parallel"] == 1]
    piped = [r for r in rows if r["pipeline_parallel"] > 1]
    mfus = {r["series"]: r["mfu"] for r in rows}
    lines = [f"A second source of tensor-parallel series, held out (nothing is fitted on it): {SOURCE}, "
             "scalelab.forecast.published_dgxc (the recipes' step times at 16-2,048 H100s, global batch growing with the "
             "GPUs), priced as `--trainer nemo` prices them (the megatron trainer's collectives and overlap efficiency, "
             "with the blocks' tensor-parallel collectives overlapped with their GEMMs by userbuffers, as every recipe "
             "sets ub_tp_comm_overlap) and the pipelined rows over the 12 chunks per rank the recipes interleave, each "
             "series calibrated at its smallest count:", "",
             "| series | calibrated at (MFU) | " + " | ".join(str(c) for c in counts) + " |",
             "|---|---|" + "---:|" * len(counts)]
    for name in series:
        mine = {r["gpus"]: r for r in rows if r["series"] == name}
        first = next(iter(mine.values()))
        lines.append(f"| {name} | {first['calibrated_at']} ({first['mfu']:.1%}) | "
                     + " | ".join(f"{mine[c]['error']:+.1%}" if c in mine else "" for c in counts) + " |")
    at_target = [r for r in flat if 64 <= r["gpus"] <= 256]
    lines += ["", "; ".join([_summary("Tensor parallelism alone (Nemotron-4 15B, TP 4)", flat),
                             _summary("of them at 64-256 GPUs", at_target),
                             _summary("pipelined (TP x PP 8, interleaved over 12 chunks per rank)", piped)])
              + f". {sum(m <= 0.65 for m in mfus.values())} of {len(mfus)} series calibrate at an MFU (of the "
              "precision's dense peak) <= 0.65. Priced as `--trainer megatron` prices them (every tensor-parallel "
              "collective on the step, the interleaved bubble over 2 chunks per rank), the same series calibrate at "
              f"{_mfus_text({r['series']: r['mfu'] for r in before})}, with the same errors at every count (the largest "
              f"change {max(abs(r['error'] - b['error']) for r, b in zip(rows, before)):.2%}): both terms are the same "
              "share of the step at every count, so the calibration takes them in whole and they cannot be told apart by "
              "these rows, only by the MFU they leave. Still priced exposed though the recipes overlap them: the distributed optimizer's "
              "syncs and the interleaved schedule's sends (the calibrated MFUs would fall further). Every count runs the "
              "same batch per data-parallel rank (weak scaling): these rows test the data-parallel collectives under "
              "tensor and pipeline parallelism (the distributed optimizer over 4 to 512 ranks), not tensor parallelism at "
              "a shrinking batch per GPU."]
    return "\n".join(lines)
