"""Results taken where people work: ``scalelab export tensorboard`` writes a sweep's runs as
TensorBoard event files, ``scalelab export config`` prints a run's configuration as a trainer's own.

TensorBoard (``scalelab export tensorboard RESULTS OUT``): one folder per run under OUT (its run id),
through torch's ``SummaryWriter`` (the ``tensorboard`` package: ``pip install 'scalelab[tensorboard]'``):
per step the loss, gradient norm, tokens/s, step time, learning rate and fp16's loss scale
(STEP_SCALARS); and in the HParams table each run's axes (the sweep's, scalelab.planning.sweep.AXES) against
its final figures (RUN_METRICS). ``tensorboard --logdir OUT`` shows them.

Trainer configurations (``scalelab export config RESULTS --to torchtitan|hf|lightning [--run RUN_ID]``):
the report's best point at the largest world size of the sweep's first model (the fastest by the
median of its repeats, with how far it leads against the run-to-run noise) or the named run, as that
trainer spells its precision and sharding (TRAINERS: each mapping's source). Only what scalelab
measured is carried: the strategy, mixed precision, activation checkpointing, gradient accumulation,
the batch, compile and clipping. The model and the
data are the trainer's own, and a mapping a trainer lacks is said in a comment, never guessed. The same command
takes a plan's JSON (``scalelab plan ... --json > plan.json``; scalelab.report.export_plan) for RESULTS: its pick,
with the trainer whose implementation the plan priced. Every export names that trainer (a measured run's is
scalelab's own) and says where the target trainer runs the configuration otherwise.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

from scalelab.report.export_plan import is_plan, measured_or_priced, plan_row, priced_with, read_plan, runs_otherwise

STEP_SCALARS = {"loss": "train/loss", "grad_norm": "train/grad_norm", "tokens_per_s": "speed/tokens_per_s",
                "step_time_s": "speed/step_time_s", "lr": "train/lr", "loss_scale": "train/loss_scale"}
"""steps.parquet column -> TensorBoard tag, per step (a null value, e.g. loss_scale outside fp16, is not written)."""
RUN_METRICS = {"tokens_per_s": "final/tokens_per_s", "tokens_per_s_per_device": "final/tokens_per_s_per_device",
               "mfu": "final/mfu", "final_loss": "final/loss", "peak_rss_bytes": "final/peak_rss_bytes",
               "peak_mem_allocated_bytes": "final/peak_mem_allocated_bytes",
               "model_state_bytes_measured": "final/model_state_bytes", "scaling_efficiency": "final/scaling_efficiency"}
"""metrics.parquet column -> the HParams table's metric (and a scalar at the last step)."""


def _plain(value):
    """A value TensorBoard's HParams accept (bool, int, float, str); None for a null."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    if hasattr(value, "item"):
        value = value.item()
    return value if isinstance(value, bool | int | float | str) else str(value)


def export_tensorboard(results: Path, out: Path) -> list[str]:
    """Write every run of RESULTS (its Parquet tables) under OUT/<run_id>; the run ids written."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:  # torch raises ImportError without the tensorboard package
        raise RuntimeError(f"scalelab export tensorboard needs the tensorboard package ({err}): "
                           "pip install 'scalelab[tensorboard]'") from None
    from scalelab.planning.sweep import SWEEP_AXES, run_id_problem
    from scalelab.report.report import load_tables
    from scalelab.report.tables import scaling_efficiency

    runs, steps = load_tables(results)
    runs = runs.assign(scaling_efficiency=scaling_efficiency(runs),
                       tokens_per_s_per_device=runs["tokens_per_s"] / runs["world_size"])
    steps = steps.assign(run_id=steps["run_id"].astype(str))
    by_run = dict(tuple(steps.groupby("run_id", sort=False)))
    written = []
    for row in runs.to_dict("records"):
        run_id = row["run_id"]
        problem = run_id_problem(run_id)
        if problem:  # a path is built from it: a hand-edited table must not write outside OUT
            raise ValueError(f"{results}/metrics.parquet: {problem}; nothing written for it")
        with SummaryWriter(log_dir=str(Path(out) / run_id)) as writer:
            mine = by_run.get(run_id, pd.DataFrame())
            for record in mine.to_dict("records"):
                for column, tag in STEP_SCALARS.items():
                    value = _plain(record.get(column))
                    if value is not None:
                        writer.add_scalar(tag, float(value), int(record["step"]))
            metrics = {tag: float(v) for column, tag in RUN_METRICS.items() if (v := _plain(row.get(column))) is not None}
            hparams = {axis: _plain(row.get(axis)) for axis in ("run_id", *SWEEP_AXES, "status", "device_type", "model_family")}
            writer.add_hparams({k: ("none" if v is None else v) for k, v in hparams.items()}, metrics, run_name=".")
        written.append(run_id)
    return written


# ----------------------------------------------------------------------------- trainer configurations

TRAINERS = {
    "torchtitan": "torchtitan's JobConfig (torchtitan/config/job_config.py: [parallelism], [training], [model], "
                  "[activation_checkpoint]), as its TOML files write it",
    "hf": "Hugging Face transformers TrainingArguments (bf16/fp16, fsdp, fsdp_config, gradient_accumulation_steps, "
          "gradient_checkpointing, torch_compile, max_grad_norm) and accelerate's FSDP plugin keys",
    "lightning": "Lightning's Trainer (precision strings '32-true', '16-mixed', 'bf16-mixed') with DDPStrategy or "
                 "FSDPStrategy (sharding_strategy: NO_SHARD, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD)",
}


def pick_run(runs: pd.DataFrame, run_id: str | None) -> dict:
    """The named run, or the best point of the report (scalelab.report.tables.best_configurations: the
    fastest by the median of its repeats) at the largest world size that has one, of the sweep's first
    model; ``_standing`` says how far ahead it is against the run-to-run noise."""
    from scalelab.report.tables import best_configurations, noise_of, standing

    if run_id is not None:
        match = runs[runs["run_id"].astype(str) == run_id]
        if match.empty:
            raise ValueError(f"no run {run_id!r} in these results ({len(runs)} runs; a killed run has no row: "
                             "scalelab status names it)")
        row = match.iloc[0].to_dict()
        if row.get("status") != "ok":
            raise ValueError(f"run {run_id!r} ended {row.get('status')}"
                             + (f" ({' '.join(str(row['reason']).split())[:200]})" if _plain(row.get("reason")) else "")
                             + ": it measured no configuration worth exporting; name a run that ended ok")
        return {**row, "_standing": "named with --run"}
    best = best_configurations(runs)
    best = best[best["run_id"].notna()]
    if best.empty:
        raise ValueError("no run ended ok: nothing to export (name one with --run)")
    model = best["model"].iloc[0]
    row = best[best["model"] == model].sort_values("world_size").iloc[-1]
    first = runs[runs["run_id"].astype(str) == row["run_id"]].iloc[0].to_dict()
    note = standing(row, noise_of(best, model)).lstrip("; ")
    return {**first, "tokens_per_s": row["tokens_per_s"], "_standing": f"the best at world size {int(row['world_size'])}"
            + (f" ({note})" if note else "")}


def _clip(row: dict) -> float | None:
    """The run's gradient clipping norm; None where train.grad_clip was 0 (no clipping)."""
    value = row.get("grad_clip", 1.0)
    return float(value) if value else None


def not_carried(row: dict) -> list[str]:
    """What the run did that the exported configuration does not carry (levers away from their defaults)."""
    out = []
    if _plain(row.get("lora_rank")) is not None:
        out.append(f"LoRA rank {int(row['lora_rank'])} (only the adapters trained): the trainer's own PEFT setup")
    if row.get("cpu_offload"):
        out.append("CPU offload of parameters, gradients and optimizer state (FSDP's offload policy)")
    if str(row.get("grad_reduce") or "fp32") not in ("fp32", "None"):
        out.append(f"gradients reduced in the compute dtype (grad_reduce {row['grad_reduce']})")
    if _tensor_parallel(row) > 1:
        out.append(f"tensor parallelism over {_tensor_parallel(row)} ranks (torchtitan: tensor_parallel_degree, written "
                   "above; Hugging Face's Trainer and Lightning's FSDP strategy here: not carried)")
    if _pipeline(row) > 1:
        out.append(f"pipeline parallelism over {_pipeline(row)} stages, {row.get('pipeline_schedule')} (torchtitan: "
                   "pipeline_parallel_degree and its schedule, written above; Hugging Face's Trainer and Lightning's "
                   "FSDP strategy here: not carried)")
    return out


def _tensor_parallel(row: dict) -> int:
    return int(_plain(row.get("tensor_parallel")) or 1)


def _pipeline(row: dict) -> int:
    return int(_plain(row.get("pipeline_parallel")) or 1)


TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}
"""scalelab's pipeline schedules by torchtitan's names (its pipeline_parallel_schedule: torch.distributed.pipelining's
class names without 'Schedule')."""


def _data_parallel(row: dict) -> int:
    """The run's data-parallel ranks: its world over its tensor-parallel degree and pipeline stages."""
    return int(row["world_size"]) // (_tensor_parallel(row) * _pipeline(row))


def _micro(row: dict) -> int:
    if _plain(row.get("micro_batch")) is not None:
        return int(row["micro_batch"])
    return int(row["global_batch"]) // _data_parallel(row)


def _replicas(row: dict) -> int:
    return int(_plain(row.get("replicas")) or 1)


def _headline(row: dict, ranks: int | None = None) -> str:
    """Where the configuration comes from: a measured run (its tokens/s, on how many ranks, its standing) or a plan's
    pick (export_plan.plan_row writes its own)."""
    if row.get("_headline"):
        return row["_headline"]
    where = f" on {ranks} rank(s) ({row.get('device_name', '')})" if ranks is not None else ""
    return f"scalelab run {row['run_id']}: {row['tokens_per_s']:.0f} tokens/s{where}; {row.get('_standing', '')}"


def _pricing_lines(row: dict, target: str) -> list[str]:
    """The trainer the figures are priced (or measured) as, then each way the target runs the configuration otherwise."""
    return [priced_with(row), *(f"runs otherwise: {why}" for why in runs_otherwise(row, target))]


def torchtitan_toml(row: dict) -> str:
    stage, replicas, tp, pp = int(row["zero_stage"]), _replicas(row), _tensor_parallel(row), _pipeline(row)
    n = _data_parallel(row)  # the data-parallel ranks (the world without tensor or pipeline parallelism)
    precision = str(row["precision"])
    lines = [f"# {_headline(row, n)}", *(f"# {line}" for line in _pricing_lines(row, "torchtitan")),
             "# torchtitan shards with FSDP2 over data_parallel_shard_degree and replicates over data_parallel_replicate_degree.",
             "[parallelism]"]
    if stage == 0:
        lines += ["# ZeRO stage 0 (DDP): every rank holds everything; torchtitan's DDP is replicate degree N, shard 1",
                  f"data_parallel_replicate_degree = {n}", "data_parallel_shard_degree = 1"]
    else:
        if stage in (1, 2):
            lines.append(f"# ZeRO stage {stage} was {measured_or_priced(row)}; torchtitan's FSDP2 shards parameters too: 'never' resharding "
                         "after forward keeps them gathered, as stage 2 does")
        lines += [f"data_parallel_replicate_degree = {replicas}", f"data_parallel_shard_degree = {n // replicas}",
                  f'fsdp_reshard_after_forward = "{"always" if stage == 3 else "never"}"']
    if tp > 1:
        lines.append(f"tensor_parallel_degree = {tp}  # within a node; the degrees above are the data-parallel ranks")
    if pp > 1:
        lines += [f"pipeline_parallel_degree = {pp}",
                  f'pipeline_parallel_schedule = "{TORCHTITAN_SCHEDULES[str(row["pipeline_schedule"])]}"',
                  f"pipeline_parallel_microbatch_size = {_micro(row)}"]
    micro = _micro(row)
    accumulation = int(_plain(row.get("accumulation_steps")) or 1)
    # a pipeline's micro-batches are one step's: torchtitan splits local_batch_size into them (its schedule's
    # n_microbatches = local / microbatch size), where otherwise it accumulates one local batch after another
    local = micro * accumulation if pp > 1 else micro
    lines += ["", "[training]", f"local_batch_size = {local}", f"global_batch_size = {micro * accumulation * n}",
              *([f"seq_len = {int(_plain(row.get('seq_len')))}"] if _plain(row.get("seq_len")) is not None else []),
              *([f"max_norm = {_clip(row)}"] if _clip(row) else
                ["# scalelab ran without clipping (train.grad_clip 0): torchtitan clips at max_norm; set it very large"]),
              f'mixed_precision_param = "{"bfloat16" if precision in ("bf16", "fp8") else "float32"}"',
              'mixed_precision_reduce = "float32"', f"compile = {'true' if row.get('compile') else 'false'}"]
    if precision == "fp16":
        lines.append(f"# fp16 with dynamic loss scaling was {measured_or_priced(row)}: torchtitan trains in bfloat16 or float32 "
                     "(float32 above)")
    if precision == "fp8":
        lines += ["", "[model]", 'converters = ["float8"]']
    lines += ["", "[activation_checkpoint]", f'mode = "{"full" if row.get("activation_checkpointing") else "none"}"']
    lines += [f"# not carried: {what}" for what in not_carried(row)]
    return "\n".join(lines) + "\n"


HF_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "gradient_checkpointing",
             "torch_compile", "max_grad_norm", "fsdp", "fsdp_config")
"""The TrainingArguments fields the file sets (transformers' training_args.py): nothing else, so that
HfArgumentParser(TrainingArguments).parse_json_file and TrainingArguments(**json) take the file as written."""


def hf_arguments(row: dict) -> tuple[dict, list[str]]:
    """(TrainingArguments keys, notes): the notes say what the keys cannot (printed apart, never in the file)."""
    stage, replicas = int(row["zero_stage"]), _replicas(row)
    precision = str(row["precision"])
    notes = [_headline(row), *_pricing_lines(row, "hf")]
    args = {"per_device_train_batch_size": _micro(row), "gradient_accumulation_steps": int(_plain(row.get("accumulation_steps")) or 1),
            "bf16": precision == "bf16", "fp16": precision == "fp16", "gradient_checkpointing": bool(row.get("activation_checkpointing")),
            "torch_compile": bool(row.get("compile")), "max_grad_norm": _clip(row) or 0.0}  # 0: no clipping in transformers
    if stage == 0:
        notes.append("ZeRO stage 0 is plain DDP: torchrun/accelerate launch with no fsdp setting")
    else:
        strategy = {1: "shard_grad_op", 2: "shard_grad_op", 3: "hybrid_shard" if replicas > 1 else "full_shard"}[stage]
        args["fsdp"] = f"{strategy} auto_wrap"
        args["fsdp_config"] = {"fsdp_version": 2, "reshard_after_forward": stage == 3}
        if stage == 1:
            notes.append("ZeRO stage 1 (optimizer state sharded) has no FSDP mode: SHARD_GRAD_OP (stage 2) is the nearest")
    if precision == "fp8":
        notes.append("fp8: accelerate's mixed_precision='fp8' (TransformerEngine or torchao backend); TrainingArguments has no flag")
    notes += [f"not carried: {what}" for what in not_carried(row)]
    return args, notes


def lightning_code(row: dict) -> str:
    stage, n, replicas = int(row["zero_stage"]), int(row["world_size"]), _replicas(row)
    nodes = int(_plain(row.get("nodes_used")) or 1)
    precision = {"fp32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed", "fp8": "transformer-engine"}.get(str(row["precision"]), "32-true")
    if stage == 0:
        strategy = "DDPStrategy()"
    else:
        sharding = {1: "SHARD_GRAD_OP", 2: "SHARD_GRAD_OP", 3: "HYBRID_SHARD" if replicas > 1 else "FULL_SHARD"}[stage]
        ac = ", activation_checkpointing_policy={Block}" if row.get("activation_checkpointing") else ""
        strategy = f'FSDPStrategy(sharding_strategy="{sharding}"{ac})'
    lines = [f"# {_headline(row, n)}", *(f"# {line}" for line in _pricing_lines(row, "lightning")),
             "from lightning.pytorch import Trainer",
             f"from lightning.pytorch.strategies import {'DDPStrategy' if stage == 0 else 'FSDPStrategy'}",
             "",
             f"trainer = Trainer(devices={n // nodes}, num_nodes={nodes}, strategy={strategy}, precision=\"{precision}\",",
             f"                  accumulate_grad_batches={int(_plain(row.get('accumulation_steps')) or 1)}, "
             f"gradient_clip_val={_clip(row)})",
             f"# per-device batch size: {_micro(row)} sequences of {_plain(row.get('seq_len')) or '?'} tokens"]
    if stage == 1:
        lines.append("# ZeRO stage 1 (optimizer state sharded) has no FSDP mode: SHARD_GRAD_OP (stage 2) is the nearest")
    if row.get("compile"):
        lines.append("# compile: model = torch.compile(model) before trainer.fit (scalelab compiled each block and the loss)")
    if row.get("activation_checkpointing"):
        lines.append("# {Block}: your model's transformer block class")
    lines += [f"# not carried: {what}" for what in not_carried(row)]
    return "\n".join(lines) + "\n"


def export_config(results: Path, trainer: str, run_id: str | None, rank: int | None = None) -> tuple[str, list[str]]:
    """(the trainer's configuration as its own file holds it, notes for the reader that the file format cannot
    carry: JSON has no comments; the TOML and the code carry theirs as comments). RESULTS is a results folder (its best
    run, or run_id) or a plan's JSON (its best configuration, or the rank-th that fits)."""
    from scalelab.report.report import load_tables

    if is_plan(results):
        if run_id is not None:
            raise ValueError(f"--run names a measured run; {results} is a plan: --rank K picks its K-th configuration")
        row = plan_row(read_plan(results), rank)
    else:
        if rank is not None:
            raise ValueError(f"--rank picks a plan's configuration; {results} is a results folder: --run RUN_ID names a run")
        runs, _ = load_tables(results)
        row = pick_run(runs, run_id)
    if "grad_clip" not in row:
        row["grad_clip"] = _grad_clip_of(results)
    if trainer == "torchtitan":
        return torchtitan_toml(row), []
    if trainer == "hf":
        args, notes = hf_arguments(row)
        return json.dumps(args, indent=2) + "\n", notes
    return lightning_code(row), []


def _grad_clip_of(results: Path) -> float:  # 0: no clipping
    """The sweep's train.grad_clip, from the invocation record where there is one (the metrics carry none)."""
    record = Path(results) / ".scalelab" / "invocation.json"
    try:
        return float(json.loads(record.read_text())["config"]["train"]["grad_clip"])
    except (OSError, KeyError, TypeError, ValueError):
        return 1.0


# ----------------------------------------------------------------------------- the command

def _tensorboard(args) -> int:
    results, out = Path(args.results_dir), Path(args.out)
    try:
        written = export_tensorboard(results, out)
    except (FileNotFoundError, RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"tensorboard: {len(written)} run(s) under {out} (tensorboard --logdir {out})")
    return 0


def _config(args) -> int:
    try:
        text, notes = export_config(Path(args.results_dir), args.to, args.run, args.rank)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text, end="")
    for note in notes:  # on stderr: `scalelab export config R --to hf > args.json` writes the keys alone
        print(f"note: {note}", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    from scalelab.forecast.inputs import positive_whole

    e = sub.add_parser("export", help="take results where people work: TensorBoard event files, a trainer's configuration")
    kinds = e.add_subparsers(dest="export", required=True)
    t = kinds.add_parser("tensorboard", help="every run's per-step scalars and its axes and final figures (HParams) "
                         "as TensorBoard event files, one folder per run")
    t.add_argument("results_dir", help="a results folder holding metrics.parquet and steps.parquet")
    t.add_argument("out", help="the folder to write (tensorboard --logdir OUT)")
    t.set_defaults(func=_tensorboard)
    c = kinds.add_parser("config", help="the best configuration (or --run) as a trainer's own: torchtitan TOML, "
                         "Hugging Face TrainingArguments (JSON), Lightning Trainer code")
    c.add_argument("results_dir", metavar="RESULTS_OR_PLAN", help="a results folder holding metrics.parquet, or the JSON "
                   "of scalelab plan --json (its pick, priced as its --trainer)")
    c.add_argument("--to", required=True, choices=sorted(TRAINERS), help="the trainer: " + "; ".join(
        f"{k}: {v}" for k, v in TRAINERS.items()))
    c.add_argument("--run", default=None, metavar="RUN_ID", help="this run instead of the best")
    c.add_argument("--rank", type=positive_whole, default=None, metavar="K", help="a plan's K-th fastest configuration that fits "
                   "instead of its best")
    c.set_defaults(func=_config)
