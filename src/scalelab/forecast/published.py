"""The step-time model against published multi-node runs (issue #44): each series' compute efficiency
is calibrated at its smallest GPU count, and the model predicts the larger counts' tokens/s per GPU
(estimate.predict_point: every collective on the link its group uses, a group spanning nodes on the NICs
its ranks hold there, the strategy's overlap at the default efficiency). ``python -m scalelab.forecast.published`` prints the table docs/prediction.md
holds, and tests/unit/test_published.py holds the two to each other and to the error targets.

The rows are FSDP (FULL_SHARD) runs on H100s, from two sources:
* llm-foundry's MPT training benchmarks (scripts/train/benchmarking/README.md, "H100 80GB BF16": MPT
  with learned positions, vocab 50,368, sequence 2,048; the micro-batch and accumulation each row
  states; MosaicML's cluster, taken as one 400 Gb/s InfiniBand NIC per GPU);
* torchtitan's docs/performance.md (Llama 3.1 8B, sequence 8,192, local batch 2, selective activation
  checkpointing; H100 HBM2e at 500 W, 400 Gb/s RDMA per GPU), 8 and 128 GPUs.
Pure data parallelism is not among them: no published multi-node DDP series of a transformer with
its batch and links stated was found; the model's DDP overlap stays unvalidated on GPUs.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from scalelab.config import ModelConfig
from scalelab.formulas import accounting, links
from scalelab.spec import hardware
from scalelab.spec.presets import PRESETS


@dataclass(frozen=True)
class Published:
    series: str
    source: str
    cfg: ModelConfig
    gpus: int
    micro_batch: int
    accumulation: int
    activation_checkpointing: bool
    tokens_per_s_per_gpu: float


MPT = "llm-foundry MPT benchmarks (H100 80GB BF16)"
TITAN = "torchtitan docs/performance.md (Tables 1 and 3)"


def _mpt(n_layers: int, d_model: int, n_heads: int) -> ModelConfig:
    return ModelConfig(n_layers=n_layers, d_model=d_model, n_heads=n_heads, seq_len=2048, tie_embeddings=True,
                       vocab_size=50368)


_LLAMA8B = ModelConfig(**{**PRESETS["llama3-8b"].shape, "seq_len": 8192})
ROWS = (
    *[Published("MPT-13B, micro-batch 2", MPT, _mpt(40, 5120, 40), n, 2, 1, False, t)
      for n, t in ((8, 4792), (16, 4767), (32, 4811), (64, 4800))],
    *[Published("MPT-1B, micro-batch 20", MPT, _mpt(24, 2048, 16), n, 20, 1, False, t)
      for n, t in ((16, 46037), (32, 45130), (64, 44402))],
    *[Published("MPT-3B, micro-batch 6 x 3", MPT, _mpt(32, 2560, 32), n, 6, 3, False, t) for n, t in ((32, 23021), (64, 22525))],
    *[Published(f"Llama 3.1 8B, FSDP{label}", TITAN, _LLAMA8B, n, 2, 1, True, t)
      for label, rows in (("", ((8, 5762), (128, 5605))), (" + compile", ((8, 6667), (128, 6514))))
      for n, t in rows],
)
"""(series, source, shape, GPUs, micro-batch, accumulation, activation checkpointing, published tokens/s per GPU)."""
INTER_NODE = "ib-ndr"
"""Both sources' links between nodes: 400 Gb/s per GPU (MosaicML's 3,200 Gb/s per 8-GPU node; torchtitan's RDMA)."""
GPU = "H100"


def _predicted(row: Published, mfu: float) -> float:
    from scalelab.forecast.estimate import Machine, Point, predict_point

    product = hardware.gpu_by_name(GPU)
    machine = Machine(product=product, peak_flops=accounting.gpu_peak_flops(GPU, "bf16"), mfu=mfu, per_node=8,
                      intra=links.parse_link(links.DEFAULT_INTRA_NODE[product.name], None),
                      inter=links.parse_link(INTER_NODE, None), overlap_efficiency=1.0)
    point = Point(cfg=row.cfg, n_params=accounting.param_count(row.cfg), key=3, precision="bf16",
                  micro_batch=row.micro_batch, global_batch=row.micro_batch * row.accumulation * row.gpus,
                  activation_checkpointing=row.activation_checkpointing)
    return predict_point(point, machine, row.gpus)["tokens_per_s_per_gpu"]


def calibrated_mfu(row: Published) -> float:
    """The compute efficiency at which the model gives the row's published tokens/s (bisection: tokens/s
    grows with it)."""
    low, high = 1e-3, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _predicted(row, mid) < row.tokens_per_s_per_gpu else (low, mid)
    return (low + high) / 2


def validation() -> list[dict]:
    """Per published row beyond its series' smallest count: published and predicted tokens/s per GPU,
    and the error (predicted / published - 1), the series' efficiency calibrated at its smallest count."""
    out = []
    for series in dict.fromkeys(r.series for r in ROWS):
        mine = sorted((r for r in ROWS if r.series == series), key=lambda r: r.gpus)
        mfu = calibrated_mfu(mine[0])
        for row in mine[1:]:
            predicted = _predicted(row, mfu)
            out.append({"series": series, "source": row.source, "calibrated_at": mine[0].gpus, "mfu": mfu,
                        "gpus": row.gpus, "published": row.tokens_per_s_per_gpu, "predicted": predicted,
                        "error": predicted / row.tokens_per_s_per_gpu - 1})
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["| series | source | calibrated at | GPUs | published tok/s/GPU | predicted | error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['series']} | {r['source']} | {r['calibrated_at']} GPUs (MFU {r['mfu']:.1%}) | {r['gpus']} | "
                     f"{r['published']:,.0f} | {r['predicted']:,.0f} | {r['error']:+.1%} |")
    errors = [abs(r["error"]) for r in rows]
    lines.append("")
    lines.append(f"Mean absolute error {sum(errors) / len(errors):.1%}, worst {max(errors):.1%} ({len(rows)} points).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    print(markdown(validation()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
