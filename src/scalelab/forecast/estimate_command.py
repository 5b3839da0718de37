"""`scalelab estimate`'s command line: its subcommands' options and the run that computes and prints one."""
from __future__ import annotations

import argparse
import json
import sys

# The precisions whose records say they have a memory convention of their own (fp8 holds bf16's
from scalelab.forecast.estimate import (
    DEFAULT_MFU,
    MEMORY_PRECISIONS,
    PEAK_CHOICES,
    advise,
    claim_check,
    fit_table,
    gpu_memory_bytes,
    memory_table,
    models_table,
    table_points,
    time_estimate,
)
from scalelab.forecast.estimate_text import render
from scalelab.forecast.inputs import (
    UNITS,
    EstimateError,
    finite_number,
    non_negative,
    positive_count,
    positive_number,
    positive_whole,
)
from scalelab.forecast.model_input import model_flags
from scalelab.forecast.model_input import model_from_flags as _model
from scalelab.forecast.scaling import SCALING_GPUS, SCALING_STAGES, gpu_counts, links_table, scaling_table
from scalelab.formulas import communication, links
from scalelab.formulas.pipeline import DEFAULT_SCHEDULE, SCHEDULES
from scalelab.registries import hardware
from scalelab.registries.precisions import PRECISION_NAMES
from scalelab.registries.strategies import TRAINERS, ZERO_STAGES


def cluster_flags(p) -> None:
    """The GPUs, links and assumed efficiencies (estimate scaling's and scalelab plan's; read by machine_of)."""
    p.add_argument("--gpu", required=True, help=f"GPU product (case-insensitive): {', '.join(hardware.known_names())}")
    p.add_argument("--gpus-per-node", type=positive_whole, default=8, help="GPUs per node (default 8)")
    p.add_argument("--intra-node", metavar="LINK",
                   help=f"link within a node: a product ({', '.join(links.known_names())}), a bandwidth in GB/s "
                        "per GPU, unidirectional, each with an optional @EFFICIENCY for this link alone (46@1: a measured "
                        "bus bandwidth), busbw:GBPS/RANKS (nccl-tests' all-reduce busbw within a node, e.g. busbw:436/8), "
                        "or a `scalelab bench comm` Parquet table (default: the GPU's NVLink or PCIe generation)")
    p.add_argument("--inter-node", metavar="LINK",
                   help="link between nodes, one GPU's NIC: as --intra-node, or what nccl-tests measured: busbw:GBPS/RANKS "
                        "(the all-reduce busbw over RANKS ranks, every GPU of their nodes, e.g. busbw:64.9/256; scalelab "
                        "divides by the NICs per node); a group spanning nodes runs on as many NICs as it has ranks on a "
                        "node, up to the intra-node link (a bench table: as measured); needed once GPUs span nodes")
    p.add_argument("--link-efficiency", type=finite_number, default=None,
                   help=f"achievable over nominal bus bandwidth of products and numbers (default {links.DEFAULT_EFFICIENCY}; "
                        "a measured table is taken as measured)")
    p.add_argument("--overlap-efficiency", type=finite_number, default=None,
                   help="share of the overlappable communication that really hides behind compute, in [0, 1] "
                        "(default: fitted to published multi-node runs, docs/prediction.md; the output prints it)")
    p.add_argument("--mfu", type=finite_number, default=None,
                   help=f"compute efficiency without communication, MFU in (0, 1] (default {DEFAULT_MFU})")
    p.add_argument("--mfu-from", metavar="RESULTS", default=None,
                   help="use the MFU a sweep measured without communication: the median of RESULTS/metrics.parquet's "
                        "ok world-size-1 runs of --precision (run one node's sweep of your model on the GPU first)")


def trainer_flag(p) -> None:
    """--trainer: whose implementation of the strategies a forecast prices (estimate scaling's and plan's)."""
    p.add_argument("--trainer", default="scalelab", choices=list(TRAINERS),
                   help="; ".join(f"{k}: {v.description}" for k, v in TRAINERS.items()) + " (default scalelab)")


def _add_scaling_parser(kinds):
    """`scalelab estimate scaling`'s options."""
    sc = kinds.add_parser("scaling", help="predicted step time, tokens/s per GPU, MFU and scaling efficiency per GPU count",
                          description="Predict, per GPU count, a step's time from an assumed compute efficiency (--mfu) "
                                      "and each collective's time on the link its group uses (scalelab.formulas.links): "
                                      "docs/prediction.md has the method and where it fails.")
    model_flags(sc)
    sc.add_argument("--zero-stage", required=True, choices=list(SCALING_STAGES),
                    help="strategy: 0 (DDP), 1 (+ ZeroRedundancyOptimizer), 2, 3 (FSDP2), hybrid (HSDP)")
    sc.add_argument("--precision", default="bf16", choices=list(PRECISION_NAMES), help="training precision (default bf16)")
    sc.add_argument("--grad-reduce", default=None, choices=list(communication.GRAD_REDUCE),
                    help="dtype gradients are reduced in: fp32 or the compute dtype (fp16, bf16); default the trainer's: "
                         "fp32 for scalelab, the compute dtype for megatron, nemo and llm-foundry")
    trainer_flag(sc)
    sc.add_argument("--micro-batch", type=int, default=1, help="sequences per GPU per forward (default 1): fixed as GPUs "
                    "grow, or with --global-batch the largest micro-batch each GPU's share is accumulated in")
    sc.add_argument("--global-batch", type=positive_whole, default=None, metavar="SEQUENCES",
                    help="a fixed global batch in sequences (as studies that scale out keep it): each GPU's share is "
                         "global / GPUs, accumulated; time and memory follow (default: a fixed per-GPU batch)")
    sc.add_argument("--activation-checkpointing", action="store_true",
                    help="recompute every block's forward in backward: its FLOPs in the time, checkpointed activations "
                         "in the memory")
    sc.add_argument("--tensor-parallel", type=positive_whole, default=1, metavar="T",
                    help="GPUs that split every block (Megatron's tensor parallelism, within a node where T fits one); "
                         "the strategy runs over GPUs / T data-parallel ranks (default 1: none)")
    sc.add_argument("--sequence-parallel", action="store_true",
                    help="with --tensor-parallel: the norms and the residual stream split over the tokens (each all-reduce "
                         "a reduce-scatter and an all-gather)")
    sc.add_argument("--pipeline-parallel", type=positive_whole, default=1, metavar="P",
                    help="pipeline stages of consecutive blocks (the outermost mesh axis: world = DP x TP x P; "
                         "consecutive stages on different nodes once DP x TP fills one); the step gains the schedule's "
                         "bubble and the sends between stages, memory is per stage (default 1: none)")
    sc.add_argument("--schedule", default=DEFAULT_SCHEDULE, choices=list(SCHEDULES),
                    help="with --pipeline-parallel: the pipeline schedule (" + "; ".join(
                        f"{k}: {v.doc}" for k, v in SCHEDULES.items()) + f"; default {DEFAULT_SCHEDULE})")
    sc.add_argument("--chunks-per-rank", type=positive_whole, default=None, metavar="V",
                    help="with --schedule interleaved_1f1b: the chunks of blocks each pipeline rank runs, as the trainer "
                         "priced runs it (Megatron's and NeMo's virtual_pipeline_model_parallel_size; default 2, "
                         "scalelab's own)")
    sc.add_argument("--gpus", type=gpu_counts, default=SCALING_GPUS, metavar="N,N,...",
                    help=f"GPU counts (default {','.join(map(str, SCALING_GPUS))}; 8,16,...,1024 doubles up to 1024); "
                         "efficiency is against the smallest")
    cluster_flags(sc)
    return sc


def _gpu_memory_flags(p) -> None:
    p.add_argument("--gpu-memory", type=finite_number, help="memory per GPU in --unit (e.g. 80)")
    p.add_argument("--gpu-memory-gib", type=finite_number, help="memory per GPU in GiB (same as --gpu-memory N --unit GiB)")
    p.add_argument("--unit", choices=list(UNITS), default="GiB", help="GiB (2^30 bytes, default) or GB (10^9)")


def _table_filters(p) -> None:
    p.add_argument("--precision", nargs="+", choices=list(MEMORY_PRECISIONS), metavar="PRECISION",
                   help=f"only these precisions' rows ({', '.join(MEMORY_PRECISIONS)}; default all)")
    p.add_argument("--zero-stage", nargs="+", type=int, choices=list(ZERO_STAGES), metavar="STAGE",
                   help=f"only these ZeRO stages' rows ({', '.join(map(str, ZERO_STAGES))}; default all)")


def _gpu_flags(p) -> None:
    p.add_argument("--gpu", required=True,
                   help=f"GPU product (case-insensitive): {', '.join(hardware.known_names())}; "
                        "bare A100, H100 and H200 mean the SXM parts")
    p.add_argument("--precision", default="bf16", choices=list(PEAK_CHOICES),
                   help="compute precision (default bf16; fp8 only on GPUs with fp8 tensor cores)")


def _add_memory_parsers(kinds) -> list:
    """`estimate memory`, `time` and `fit`'s options."""
    m = kinds.add_parser("memory", help="model-state memory per rank, every stage x precision")
    model_flags(m)
    m.add_argument("--world-size", type=positive_whole, default=1, help="ranks (GPUs) sharing the model (default 1)")
    _table_filters(m)
    m.add_argument("--unit", choices=list(UNITS), default="GiB", help="GiB (2^30 bytes, default) or GB (10^9, the ZeRO paper's)")
    m.add_argument("--micro-batch", type=positive_whole, help="sequences per rank per step: adds activations and the in-step peak (needs the shape)")
    m.add_argument("--tensor-parallel", type=positive_whole, default=1, metavar="T",
                   help="ranks that split every block's linears (needs the shape; default 1: none)")
    t = kinds.add_parser("time", help="days to train")
    model_flags(t)
    t.add_argument("--tokens", type=positive_count, required=True, help="training tokens, e.g. 1T or 1e12")
    t.add_argument("--gpus", type=positive_whole, required=True, help="number of GPUs")
    _gpu_flags(t)
    t.add_argument("--mfu", type=finite_number, default=None, help="model FLOPs utilisation in (0, 1] (default 0.4)")
    t.add_argument("--mfu-from", metavar="RESULTS", default=None,
                   help="use the MFU a sweep measured: the median of RESULTS/metrics.parquet's ok runs of --precision "
                        "(names the runs; CPU runs' MFU says nothing about a GPU)")
    f = kinds.add_parser("fit", help="largest model whose model state fits the GPUs")
    _gpu_memory_flags(f)
    f.add_argument("--world-size", type=positive_whole, default=1, help="number of GPUs sharing the model (default 1)")
    _table_filters(f)
    return [m, t, f]


def _add_advice_parsers(kinds) -> list:
    """`estimate advise` and `claim`'s options."""
    a = kinds.add_parser("advise", help="the memory ladder: the first of DDP, ZeRO 1, 2, 3 that fits, else LoRA's rank budget")
    model_flags(a)
    _gpu_memory_flags(a)
    a.add_argument("--gpus", type=positive_whole, required=True, help="GPUs the model is trained on")
    a.add_argument("--micro-batch", type=positive_whole, help="sequences per GPU per step: adds activations (needs the shape)")
    a.add_argument("--activation-checkpointing", action="store_true", help="activations with every block recomputed in backward")
    a.add_argument("--precision", default="bf16", choices=list(MEMORY_PRECISIONS), help="training precision (default bf16)")
    a.add_argument("--reserve-gib", type=non_negative, default=None, help="device memory the formulas do not count (CUDA context, "
                   "NCCL buffers, fragmentation; default 2 GiB + 5%% of the GPU's memory, as scalelab plan keeps)")
    c = kinds.add_parser("claim", help="the MFU a stated throughput implies, and whether the hardware can reach it")
    model_flags(c)
    c.add_argument("--tokens-per-s", type=positive_count, help="the claimed training throughput, tokens per second (all GPUs), e.g. 2M")
    c.add_argument("--tokens", type=positive_count, help="or: the claimed training tokens (e.g. 1T) ...")
    c.add_argument("--days", type=positive_number, help="... in this many days")
    c.add_argument("--gpus", type=positive_whole, required=True, help="number of GPUs")
    _gpu_flags(c)
    return [a, c]


def add_parser(sub) -> None:
    est = sub.add_parser("estimate", help="memory per rank, days to train, largest model that fits",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = est.add_subparsers(dest="kind", required=True)
    parsers = _add_memory_parsers(kinds) + _add_advice_parsers(kinds)
    ms = kinds.add_parser("models", help="the preset shapes --model takes, with their parameter counts and sources")
    sc = _add_scaling_parser(kinds)
    lk = kinds.add_parser("links", help="the link products estimate scaling takes, per GPU, with their sources")
    for p in (*parsers, ms, sc, lk):
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.set_defaults(usage_parser=p)  # an unknown option is this subcommand's error, with its usage (scalelab.cli.main)
    est.set_defaults(func=run)


def _memory(args) -> dict:
    return memory_table(_model(args), args.world_size, args.unit, table_points(args.precision, args.zero_stage),
                        args.tensor_parallel, args.micro_batch)


def _time(args) -> dict:
    return time_estimate(_model(args), args.tokens, args.gpus, args.gpu, args.precision, args.mfu, args.mfu_from)


def _fit(args) -> dict:
    return fit_table(gpu_memory_bytes(args.gpu_memory, args.gpu_memory_gib, args.unit), args.world_size, args.unit,
                     table_points(args.precision, args.zero_stage))


def _advise(args) -> dict:
    return advise(_model(args), gpu_memory_bytes(args.gpu_memory, args.gpu_memory_gib, args.unit), args.gpus,
                  args.precision, args.unit, args.micro_batch, args.activation_checkpointing, args.reserve_gib)


def _claim(args) -> dict:
    return claim_check(_model(args), args.gpus, args.gpu, args.precision, args.tokens_per_s, args.tokens, args.days)


COMPUTE = {"memory": _memory, "time": _time, "fit": _fit, "advise": _advise, "claim": _claim,
           "models": lambda args: models_table(), "scaling": scaling_table, "links": lambda args: links_table()}
"""Each subcommand's edge: its flags read into the typed values its computation takes."""


def run(args) -> int:
    try:
        result = COMPUTE[args.kind](args)
    except EstimateError as err:
        print(f"scalelab estimate {args.kind}: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else render(args.kind, result))
    return 0
