"""The published multi-node runs the step-time model is checked against (scalelab.forecast.published's docstring names
the sources), and the check itself: each series' compute efficiency calibrated at its smallest GPU count
(calibrated_mfu), the larger counts predicted (predicted_row: scalelab.forecast.predict.predict_point), the errors, and
their sensitivity to the overlap efficiency."""
from __future__ import annotations

from dataclasses import dataclass

from scalelab.config import ModelConfig
from scalelab.forecast import playbook_sweep
from scalelab.forecast.pipeline_step import pipeline_problem
from scalelab.formulas import flops, links
from scalelab.registries import hardware
from scalelab.registries.presets import PRESETS


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
    gpu: str = "H100"
    key: int = 3
    """The strategy: a ZeRO stage (3: FSDP FULL_SHARD, 0: DDP)."""
    precision: str = "bf16"
    grad_reduce: str = "fp32"
    inter_node: str = "ib-ndr"
    """The link between nodes as a user gives it (--inter-node)."""
    intra_node: str | None = None
    """The link within a node as a user gives it (--intra-node); None: the GPU's own (links.DEFAULT_INTRA_NODE)."""
    n_params: int | None = None
    """The parameters where the shape's family counts others; None: the shape's."""
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    trainer: str = "scalelab"
    """Whose implementation is priced (scalelab.registries.strategies.TRAINERS): nanotron's runs are the megatron form."""
    memory_gb: float | None = None
    """The peak GPU memory the source states, GB, where it does."""
    pipeline_parallel: int = 1
    pipeline_schedule: str = "1f1b"
    chunks_per_rank: int | None = None
    """An interleaved schedule's chunks per rank as the trainer ran it (Megatron's virtual pipeline size); None: 2."""

    @property
    def strategy(self) -> str:
        """The row's kind in the tables: stages 0, 1 and 3, with tensor and pipeline parallelism where used (a row of
        another stage is a KeyError, not a mislabelled row)."""
        return ({0: "DDP", 1: "ZeRO-1", 3: "FSDP"}[self.key] + (" x TP" if self.tensor_parallel > 1 else "")
                + (" x PP" if self.pipeline_parallel > 1 else ""))


MPT = "llm-foundry MPT benchmarks (H100 80GB BF16)"
TITAN = "torchtitan docs/performance.md (Tables 1 and 3)"
PLAYBOOK = "Ultra-Scale Playbook, data-parallel scaling (H100, EFA)"
BERT = "NVIDIA DeepLearningExamples BERT (DGX A100 80GB)"


def _mpt(n_layers: int, d_model: int, n_heads: int) -> ModelConfig:
    return ModelConfig(n_layers=n_layers, d_model=d_model, n_heads=n_heads, seq_len=2048, tie_embeddings=True,
                       vocab_size=50368)


_LLAMA8B = ModelConfig(**{**PRESETS["llama3-8b"].shape, "seq_len": 8192})
PLAYBOOK_BUSBW_GB = playbook_sweep.BUSBW_GB
_BERT_LARGE = ModelConfig(n_layers=24, d_model=1024, n_heads=16, seq_len=128, tie_embeddings=True, vocab_size=30522)


def _playbook(gpus: int, micro: int, accumulation: int, tokens: float) -> Published:
    """The playbook's data-parallel scaling series as scalelab's DDP prices it (fp32 buckets all-reduced)."""
    nodes = gpus // 8
    return Published("1B Llama, DDP, micro-batch 1", PLAYBOOK, playbook_sweep.MODELS["1B"], gpus, micro, accumulation, False,
                     tokens, key=0, inter_node=f"{PLAYBOOK_BUSBW_GB[nodes] / 8:g}@1", intra_node=f"{PLAYBOOK_BUSBW_GB[1]:g}@1")


SWEEP = "Ultra-Scale Playbook benchmark sweep (nanotron, H100, EFA)"


def _sweep_rows() -> list[Published]:
    """The playbook sweep's series (scalelab.forecast.playbook_sweep) as nanotron runs them: the megatron trainer's
    ZeRO-1 and tensor parallelism with sequence parallelism, gradients reduced in fp32; the link between nodes as a user
    gives the sweep's measurements (playbook_sweep.measured_inter_node: nccl-tests' busbw at every node count)."""
    rows = []
    for model, tp, zero, micro, points in playbook_sweep.SWEEP:
        if (tp, zero) == (1, 0):  # pure DDP: the first table's, as scalelab's DDP prices it
            continue
        for nodes, tokens, memory in points:
            data_parallel = 8 * nodes // tp
            rows.append(Published(f"{model} TP {tp} ZeRO-{zero} mb {micro}", SWEEP, playbook_sweep.MODELS[model], 8 * nodes,
                                  micro, playbook_sweep.GLOBAL_BATCH // (data_parallel * micro), False, tokens, key=zero,
                                  tensor_parallel=tp, sequence_parallel=tp > 1, trainer="megatron",
                                  inter_node=playbook_sweep.measured_inter_node(), intra_node=f"{PLAYBOOK_BUSBW_GB[1]:g}@1",
                                  memory_gb=memory))
    return rows


ROWS = (
    *[Published("MPT-13B, micro-batch 2", MPT, _mpt(40, 5120, 40), n, 2, 1, False, t)
      for n, t in ((8, 4792), (16, 4767), (32, 4811), (64, 4800))],
    *[Published("MPT-1B, micro-batch 20", MPT, _mpt(24, 2048, 16), n, 20, 1, False, t)
      for n, t in ((16, 46037), (32, 45130), (64, 44402))],
    *[Published("MPT-3B, micro-batch 6 x 3", MPT, _mpt(32, 2560, 32), n, 6, 3, False, t) for n, t in ((32, 23021), (64, 22525))],
    *[Published(f"Llama 3.1 8B, FSDP{label}", TITAN, _LLAMA8B, n, 2, 1, True, t)
      for label, rows in (("", ((8, 5762), (128, 5605))), (" + compile", ((8, 6667), (128, 6514))))
      for n, t in rows],
    # micro-batch 1 at every count, accumulated to 256 sequences per step (the hover data's tokens/s per GPU)
    *[_playbook(n, 1, 256 // n, t) for n, t in (
        (8, 39273), (16, 37610), (32, 35368), (64, 31112), (128, 24494), (256, 15700))],
    # sequences/s of the whole run, per GPU; micro-batch 256, accumulation to 65,536 sequences
    *[Published("BERT-Large, DDP, sequence 128", BERT, _BERT_LARGE, n, 256, 65536 // (256 * n), False, s * 128 / n,
                gpu="A100 SXM 80GB", key=0, precision="fp16", grad_reduce="compute", inter_node="ib-hdr")
      for n, s in ((8, 4553), (16, 9191), (32, 18119), (64, 35774), (128, 70555), (256, 138294))],
)
"""(series, source, shape, GPUs, micro-batch, accumulation, activation checkpointing, published tokens/s per GPU,
and where a series differs from the FSDP rows' H100s on NDR: its GPU, strategy, precision and links)."""


TITAN_2D = "torchtitan docs/performance.md (Tables 1, 3 and 4)"
CROSS_MODEL_ROWS = tuple(
    Published("torchtitan Llama 3.1 8B FSDP -> 70B FSDP 32 x TP 8, compile + Float8", TITAN_2D, cfg, n, micro, 1, ac, t,
              key=3, precision="fp8", tensor_parallel=tp, sequence_parallel=tp > 1)
    for cfg, n, micro, ac, t, tp in (
        (_LLAMA8B, 8, 2, False, 8532, 1), (_LLAMA8B, 128, 2, False, 8380, 1),
        (ModelConfig(**{**PRESETS["llama3-70b"].shape, "seq_len": 8192}), 256, 16, True, 829, 8)))
"""A second source's tensor-parallel run, predicted across model sizes: torchtitan's only 2D row (Table 4: Llama 3.1
70B on 256 H100s, FSDP 32 x TP 8 with its sequence parallelism, torch.compile, Float8, full activation checkpointing,
16 sequences per data-parallel rank; 829 tokens/s per GPU without AsyncTP), from the efficiency of its 8B FSDP runs with
the same compile and Float8 (Tables 1 and 3, selective checkpointing priced as none). scalelab's own form prices it
(torchtitan's FSDP2 and tensor-parallel plan are the ones scalelab runs), though torchtitan also splits the embedding,
head and loss over the vocabulary, which that form keeps whole."""

SWEEP_ROWS = tuple(_sweep_rows())
"""The playbook sweep's rows (sweep_validation validates them)."""


def _pipeline_rows() -> list[Published]:
    """The playbook sweep's pipelined series (scalelab.forecast.playbook_sweep.PIPELINE_SWEEP) as nanotron runs them:
    the megatron trainer's ZeRO-0/1 and tensor parallelism with sequence parallelism, 1F1B, gradients reduced in fp32;
    the links as measured (_sweep_rows')."""
    rows = []
    for model, pp, tp, zero, micro, points in playbook_sweep.PIPELINE_SWEEP:
        for nodes, tokens, memory in points:
            data_parallel = 8 * nodes // (tp * pp)
            # fewer micro-batches than stages (torch's schedules refuse them) or blocks that do not split evenly (the
            # 3B's 28 over 8 stages): scalelab neither runs nor prices them (pipeline_step.pipeline_problem)
            if pipeline_problem(playbook_sweep.MODELS[model], pp, playbook_sweep.PIPELINE_SCHEDULE,
                                playbook_sweep.GLOBAL_BATCH // (data_parallel * micro)):
                continue
            rows.append(Published(f"{model} PP {pp} TP {tp} ZeRO-{zero} mb {micro}", SWEEP, playbook_sweep.MODELS[model],
                                  8 * nodes, micro, playbook_sweep.GLOBAL_BATCH // (data_parallel * micro), False, tokens,
                                  key=zero, tensor_parallel=tp, sequence_parallel=tp > 1, trainer="megatron",
                                  inter_node=playbook_sweep.measured_inter_node(), intra_node=f"{PLAYBOOK_BUSBW_GB[1]:g}@1",
                                  memory_gb=memory, pipeline_parallel=pp,
                                  pipeline_schedule=playbook_sweep.PIPELINE_SCHEDULE))
    return rows


PIPELINE_ROWS = tuple(_pipeline_rows())
"""The playbook sweep's pipelined rows (pipeline_validation validates them)."""


def default_overlap_efficiency(trainer: str = "scalelab") -> float:
    """The overlap efficiency a forecast uses for the trainer: its own where fitted, else the GPU's default."""
    from scalelab.formulas.overlap import DEFAULT_OVERLAP_EFFICIENCY
    from scalelab.registries.strategies import TRAINERS

    own = TRAINERS[trainer].overlap_efficiency
    return DEFAULT_OVERLAP_EFFICIENCY["cuda"] if own is None else own


def predicted_row(row: Published, mfu: float, overlap_efficiency: float | None = None) -> dict:
    """The step-time model's row (scalelab.forecast.predict.predict_point) for a published run at a compute efficiency."""
    from scalelab.forecast.predict import predict_point
    from scalelab.forecast.step import Machine

    product = hardware.gpu_by_name(row.gpu)
    eta = default_overlap_efficiency(row.trainer) if overlap_efficiency is None else overlap_efficiency
    machine = Machine(product=product, peak_flops=flops.gpu_peak_flops(row.gpu, row.precision), mfu=mfu, per_node=8,
                      intra=links.parse_link(row.intra_node or links.DEFAULT_INTRA_NODE[product.name], None),
                      inter=links.parse_link(row.inter_node, None), overlap_efficiency=eta)
    return predict_point(_point(row), machine, row.gpus)


def predicted_tokens_per_gpu(row: Published, mfu: float, overlap_efficiency: float | None = None) -> float:
    return predicted_row(row, mfu, overlap_efficiency)["tokens_per_s_per_gpu"]


def _point(row: Published):
    from scalelab.forecast.step import Point

    return Point(cfg=row.cfg, n_params=row.n_params or flops.param_count(row.cfg), key=row.key,
                 precision=row.precision, grad_reduce=row.grad_reduce, micro_batch=row.micro_batch,
                 global_batch=row.micro_batch * row.accumulation * row.gpus // (row.tensor_parallel * row.pipeline_parallel),
                 activation_checkpointing=row.activation_checkpointing, tensor_parallel=row.tensor_parallel,
                 sequence_parallel=row.sequence_parallel, trainer=row.trainer, pipeline_parallel=row.pipeline_parallel,
                 pipeline_schedule=row.pipeline_schedule, chunks_per_rank=row.chunks_per_rank)


def calibrated_mfu(row: Published, overlap_efficiency: float | None = None) -> float:
    """The compute efficiency at which the model gives the row's published tokens/s (bisection: tokens/s
    grows with it)."""
    low, high = 1e-3, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        fast_enough = predicted_tokens_per_gpu(row, mid, overlap_efficiency) >= row.tokens_per_s_per_gpu
        low, high = (low, mid) if fast_enough else (mid, high)
    if high > 0.999:  # even the whole peak is too slow: the row's links or bytes are wrong, not its efficiency
        raise ValueError(f"{row.series} at {row.gpus} GPUs: no compute efficiency up to 1 reaches its published "
                         f"{row.tokens_per_s_per_gpu:,.0f} tokens/s per GPU")
    return (low + high) / 2


def validation(overlap_efficiency: float | None = None, rows: tuple[Published, ...] = ROWS) -> list[dict]:
    """Per published row beyond its series' smallest count: published and predicted tokens/s per GPU,
    and the error (predicted / published - 1), the series' efficiency calibrated at its smallest count;
    at the trainer's overlap efficiency (scalelab's: the GPU's default), or the one given."""
    out = []
    for series in dict.fromkeys(r.series for r in rows):
        mine = sorted((r for r in rows if r.series == series), key=lambda r: r.gpus)
        mfu = calibrated_mfu(mine[0], overlap_efficiency)
        for row in mine[1:]:
            predicted = predicted_tokens_per_gpu(row, mfu, overlap_efficiency)
            out.append({"series": series, "source": row.source, "strategy": row.strategy, "calibrated_at": mine[0].gpus,
                        "mfu": mfu, "gpus": row.gpus, "published": row.tokens_per_s_per_gpu, "predicted": predicted,
                        "error": predicted / row.tokens_per_s_per_gpu - 1})
    return out


def mean_absolute_error(rows: list[dict], strategy: str | None = None, source: str | None = None) -> float:
    errors = [abs(r["error"]) for r in rows if strategy in (None, r["strategy"]) and source in (None, r["source"])]
    return sum(errors) / len(errors)


def overlap_grid() -> tuple[float, ...]:
    """The overlap efficiencies the sensitivity table recalibrates and predicts every series at: quarters, and the default."""
    return tuple(sorted({0.0, 0.25, 0.5, 0.75, 1.0, default_overlap_efficiency()}))


def overlap_sensitivity(grid=None) -> list[dict]:
    """Per overlap efficiency: the mean absolute error of each source's rows and of all, and the worst."""
    out = []
    for eta in overlap_grid() if grid is None else grid:
        rows = validation(eta)
        out.append({"overlap_efficiency": eta, "all": mean_absolute_error(rows), "worst": max(abs(r["error"]) for r in rows),
                    "sources": {source: mean_absolute_error(rows, source=source) for source in dict.fromkeys(r["source"] for r in rows)}})
    return out


def markdown(rows: list[dict], overlap_efficiency: float | None = None) -> str:
    eta = default_overlap_efficiency() if overlap_efficiency is None else overlap_efficiency
    lines = ["| series | source | calibrated at | GPUs | published tok/s/GPU | predicted | error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['series']} | {r['source']} | {r['calibrated_at']} GPUs (MFU {r['mfu']:.1%}) | {r['gpus']} | "
                     f"{r['published']:,.0f} | {r['predicted']:,.0f} | {r['error']:+.1%} |")
    lines.append("")
    per = ", ".join(f"{s} {mean_absolute_error(rows, s):.1%} ({sum(r['strategy'] == s for r in rows)} points)"
                    for s in dict.fromkeys(r["strategy"] for r in rows))
    lines.append(f"Mean absolute error {mean_absolute_error(rows):.1%}, worst {max(abs(r['error']) for r in rows):.1%} "
                 f"({len(rows)} points; {per}), at overlap efficiency {eta:g}.")
    return "\n".join(lines)


def sensitivity_markdown(table: list[dict]) -> str:
    sources = list(table[0]["sources"])
    lines = ["| overlap efficiency | " + " | ".join(sources) + " | all rows | worst |",
             "|---:|" + "---:|" * (len(sources) + 2)]
    for t in table:
        lines.append(f"| {t['overlap_efficiency']:g} | " + " | ".join(f"{t['sources'][s]:.1%}" for s in sources)
                     + f" | {t['all']:.1%} | {t['worst']:.1%} |")
    return "\n".join(lines)
