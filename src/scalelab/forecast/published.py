"""The step-time model against published multi-node runs: each series' compute efficiency
is calibrated at its smallest GPU count, and the model predicts the larger counts' tokens/s per GPU
(predict.predict_point: every collective on the link its group uses, a group spanning nodes on the NICs
its ranks hold there, the strategy's overlap at the GPU's default efficiency). ``python -m scalelab.forecast.published``
prints the tables docs/prediction.md holds, and tests/unit/test_published.py holds the two to each other and to
the error targets.

FSDP (FULL_SHARD) on H100s, from two sources:
* llm-foundry's MPT training benchmarks (scripts/train/benchmarking/README.md, "H100 80GB BF16": MPT
  with learned positions, vocab 50,368, sequence 2,048; the micro-batch and accumulation each row
  states; MosaicML's cluster, taken as one 400 Gb/s InfiniBand NIC per GPU);
* torchtitan's docs/performance.md (Llama 3.1 8B, sequence 8,192, local batch 2, selective activation
  checkpointing; H100 HBM2e at 500 W, 400 Gb/s RDMA per GPU), 8 and 128 GPUs.

Pure data parallelism (DDP), from two sources:
* the Ultra-Scale Playbook (Hugging Face, nanotron): the runs behind its data-parallel scaling figure
  (assets/data/benchmarks/benchmarks_interactive.html; the figure, dp_scaling.html, plots the best micro-batch
  at each count), the series at micro-batch 1: a 1B Llama (16 layers, width 2,048, 32 heads, SwiGLU 8,192,
  vocab 131,072, tied embeddings: 1.34B parameters), sequence 4,096, 256 sequences per step at every count,
  nodes of 8 H100s over EFA; bf16 with gradients accumulated and all-reduced in fp32 (DDP's 25 MB buckets), as
  the base config of nanotron's scripts/scaling_benchmarks.py says (examples/config_tiny_llama_bench.yaml:
  dtype bfloat16, accumulate_grad_in_fp32 true, tie_word_embeddings true). A bf16 all-reduce would halve the
  bytes, and no overlap efficiency would then fit these rows. The links are the source's own NCCL all-reduce
  bus bandwidth at each node count (pp_comm_bandwidth.html, 256 MB): 436 GB/s on one node down to 32.9 GB/s on
  64. They are given as a user calibrates (docs/prediction.md): the all-GPU busbw divided by the 8 NICs of a
  node, at efficiency 1;
* NVIDIA DeepLearningExamples' BERT-Large pre-training (PyTorch/LanguageModeling/BERT/README.md, "Pre-training
  NVIDIA DGX A100 (8x A100 80GB) Multi-node Scaling", mixed precision, sequence 128): 65,536 sequences per step
  at every count, micro-batch 256, fp16 all-reduce after accumulation. Its links are not stated: taken as the
  DGX A100's 8 x 200 Gb/s HDR, one NIC per GPU. Its step is compute-bound at every count (the all-reduce is
  about 2% of it), so the rows check that the model adds nothing there; they do not weigh the overlap.

Tensor parallelism and ZeRO-1: the Ultra-Scale Playbook's benchmark sweep (SWEEP_ROWS; the data and its source in
scalelab.forecast.playbook_sweep), priced as nanotron runs them and validated, fit set and held-out rows apart, by
the Playbook benchmark sweep's section below, whose tables follow these.

A second source of tensor-parallel series, held out: NVIDIA's DGX Cloud Benchmarking recipes (NeMo 24.11: Nemotron-4
15B at TP 4, GPT-3 175B and Nemotron-4 340B with pipelines, 16-2,048 H100s; scalelab.forecast.published_dgxc names the
tables), its errors apart.

GPU memory against another trainer's runs: llm-foundry's MPT on A100 40GB cards (scalelab.forecast.published_memory),
by scalelab's own convention and by llm-foundry's recipe (scalelab.formulas.foundry_style); the source states no
memory, so the check is whether each row, which ran, is predicted to fit.
"""
from __future__ import annotations

import argparse

from scalelab.forecast.published_dgxc import dgxc_document
from scalelab.forecast.published_memory import memory_document
from scalelab.forecast.published_pipeline import pipeline_document
from scalelab.forecast.published_runs import markdown, overlap_sensitivity, sensitivity_markdown, validation
from scalelab.forecast.published_sweep import sweep_document


def document(sensitivity: bool = True) -> str:
    """What docs/prediction.md holds between its published-validation markers: the table at the default overlap
    efficiency, then (``sensitivity``) the errors at each efficiency of overlap_grid()."""
    parts = [markdown(validation())]
    if sensitivity:
        parts.append("Recalibrated and predicted at each overlap efficiency:\n\n" + sensitivity_markdown(overlap_sensitivity()))
    parts += [sweep_document(), pipeline_document(), dgxc_document(), memory_document()]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sensitivity", action="store_true",
                        help="also the mean absolute errors with every series recalibrated at each overlap efficiency")
    print(document(parser.parse_args(argv).sensitivity))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
