"""One run, decided once: the typed plan the rules size a job with, the launcher starts and every
rank reads (as ``run_plan.json`` in the run's folder).

A :class:`RunPlan` holds the point, the model and train configs, the micro-batch and accumulation,
the launch plan (launchers x ranks over nodes), the device and why, the strategy, the precision
and the dtypes its collectives carry. :func:`run_plan` is the one place they are derived from a
config; the rules (rules/common.smk), the config's checks, the result params, the launcher and
the worker take it instead of deriving each part again. The launcher adds what only the job knows
(:meth:`RunPlan.at`: the data's vocabulary and token file, the run folder, the CPU peak record).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.config import ConfigError, ModelConfig, TrainConfig, cluster_config, model_config, train_config
from scalelab.formulas.communication import CommDtypes, comm_dtypes
from scalelab.io import write_json
from scalelab.planning.placement import LaunchPlan, launch_plan
from scalelab.planning.sweep import RunPoint, data_parallel_ranks, micro_batch_plan
from scalelab.registries.precisions import Precision
from scalelab.registries.precisions import precision as precision_record
from scalelab.registries.strategies import Strategy, strategy

PLAN_FILE = "run_plan.json"
"""The plan as the ranks read it, in the run's folder while it trains (removed after)."""


@dataclass(frozen=True)
class RunPlan:
    point: RunPoint
    model: ModelConfig
    train: TrainConfig
    micro_batch: int
    """Sequences per rank per forward (the point's micro_batch, or the whole per-rank share)."""
    accumulation_steps: int
    """Micro-batches per optimizer step."""
    launch: LaunchPlan
    device: str
    """cpu | cuda: where the ranks train."""
    device_reason: str
    """How the device was decided (the row's planned_device_reason)."""
    comm: CommDtypes
    """The dtypes its collectives carry (scalelab.formulas.communication.comm_dtypes)."""
    threads_per_rank: int = 1
    # What only the job knows (RunPlan.at): where the data and the run folder are.
    run_dir: str | None = None
    train_bin: str | None = None
    token_dtype: str | None = None
    calibration: dict | None = None
    """The sweep's CPU peaks (scalelab.run.calibration); None outside the workflow."""
    save_final_params: bool = False
    compile_warm_up: bool = True
    """False (tests only) leaves a compiled run's compilation to its first step."""

    @property
    def strategy(self) -> Strategy:
        return strategy(self.point.zero_stage, self.point.replicas)

    @property
    def precision(self) -> Precision:
        return precision_record(self.point.precision)

    def formula_row(self) -> dict:
        """What the formulas read of a run (scalelab.formulas.predicted_columns): its point, its micro-batch
        and accumulation, its device; the same record collection hands them from a result row."""
        return {**self.point.values(), "micro_batch": self.micro_batch, "accumulation_steps": self.accumulation_steps,
                "device_type": self.device}

    def at(self, *, vocab_size: int, train_bin: str | Path, token_dtype: str, run_dir: str | Path, threads: int,
           calibration: dict | None = None, save_final_params: bool = False, compile_warm_up: bool = True) -> RunPlan:
        """This plan where the job runs it: the prepared data's vocabulary and tokens, the run folder, the
        job's threads shared among its ranks."""
        return dataclasses.replace(
            self, model=dataclasses.replace(self.model, vocab_size=vocab_size), train_bin=str(Path(train_bin).resolve()),
            token_dtype=token_dtype, run_dir=str(Path(run_dir).resolve()),
            threads_per_rank=max(1, threads // self.point.world_size), calibration=calibration,
            save_final_params=save_final_params, compile_warm_up=compile_warm_up)

    def to_json(self) -> dict:
        return {field.name: _plain(getattr(self, field.name)) for field in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, values: dict) -> RunPlan:
        typed = {"point": RunPoint.from_json, "model": lambda v: ModelConfig(**v), "train": lambda v: TrainConfig(**v),
                 "launch": lambda v: LaunchPlan(**v), "comm": lambda v: CommDtypes(**v)}
        return cls(**{key: typed[key](value) if key in typed else value for key, value in values.items()})

    def write(self, path: str | Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> RunPlan:
        return cls.from_json(json.loads(Path(path).read_text()))


def _plain(value):
    if isinstance(value, RunPoint):
        return value.to_json()
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return value


def tensor_parallel_problem(model, degree: int, sequence_parallel: bool = False, name: str | None = None) -> None:
    """ConfigError where a model cannot be split ``degree`` ways: no plan in its family's record (a user's
    module), or heads, key/value heads or the MLP's width that the degree does not divide; with
    ``sequence_parallel`` a sequence length it does not divide."""
    from scalelab.registries.families import family

    if model.module or not family(model.family).tensor_parallel:
        raise ConfigError(f"sweep.tensor_parallel={degree}: model {model.module or model.family} has no tensor-parallel "
                          "plan (a family's record gives one; a user's module is not split)")
    counts = {"n_heads": model.n_heads, "n_kv_heads": model.n_kv_heads or model.n_heads,
              "the MLP's width": family(model.family).mlp_width(model)}
    if sequence_parallel:
        counts["seq_len"] = model.seq_len
    bad = [f"{name} {n}" for name, n in counts.items() if n % degree]
    if bad:
        raise ConfigError(f"sweep.tensor_parallel={degree} does not divide the model's {', '.join(bad)}{_named(name)}")


def _named(name: str | None) -> str:
    """Which of the sweep's models a refusal is about, where it names one (sweep.model)."""
    return f" (model {name})" if name else ""


def pipeline_problem(model, degree: int, schedule_name: str, name: str | None = None) -> None:
    """ConfigError where a model's blocks cannot be split into ``degree`` pipeline stages: a user's module (its
    forward runs whole: scalelab cannot hand one stage's output to the next), or blocks that do not split evenly."""
    from scalelab.formulas.pipeline import chunks

    if model.module:
        raise ConfigError(f"sweep.pipeline_parallel={degree}: model {model.module} is a user's module, whose forward "
                          "runs whole; pipeline stages split the families' models (gpt2, llama)")
    try:
        chunks(model.n_layers, degree, schedule_name)
    except ValueError as err:
        raise ConfigError(f"sweep.pipeline_parallel={degree}: {err}{_named(name)}") from None


def run_plan(config: dict, point: RunPoint, *, device: str = "cpu", device_reason: str = "",
             vocab_size: int = 256) -> RunPlan:
    """The plan of one point of a validated config (ConfigError where the point cannot be laid out:
    a global batch the world size does not split, ranks that do not fill nodes evenly). The model's
    vocabulary is the data's: the launcher sets it (RunPlan.at); planning reads none of it."""
    train = train_config(config)
    micro, accumulation = micro_batch_plan(train, data_parallel_ranks(point), point.micro_batch)
    model = model_config(config, vocab_size=vocab_size, name=point.model)
    if point.tensor_parallel > 1:
        tensor_parallel_problem(model, point.tensor_parallel, point.sequence_parallel, point.model)
    if point.pipeline_parallel > 1:
        pipeline_problem(model, point.pipeline_parallel, point.pipeline_schedule, point.model)
    return RunPlan(point=point, model=model, train=train,
                   micro_batch=micro, accumulation_steps=accumulation, launch=launch_plan(config, point.world_size),
                   device=device, device_reason=device_reason,
                   comm=comm_dtypes(point.precision, point.zero_stage, point.grad_reduce))


# ----------------------------------------------------------------------------- what a run's results depend on
NOT_RESULT_KEYS = ("run_timeout_s", "collective_timeout_s", "checkpoint_every", "device")
"""Train keys that do not change what a run measures: a new time limit must not retrain a finished
sweep; the device a run trains on is its job's own param (the planned device, not the setting)."""


def _precision(point):
    return precision_record(point.precision)


TRAIN_KEY_APPLIES: dict[str, Callable[[Any], bool]] = {
    "lora_alpha": lambda point: point.lora_rank is not None,
    "fp16_init_scale": lambda point: _precision(point).loss_scaling,
    "fp8_emulate": lambda point: _precision(point).linears is not None,
    "tf32": lambda point: _precision(point).tf32_peak_key is not None,
}
"""Train keys that only some runs read: a change reruns those runs, not the others (no LoRA, no
loss scaling, no float8 linears, no fp32 matmuls). Every other key applies to every run."""


def _peak_keys(point, train: TrainConfig) -> set[str]:
    """The ``train.peak_tflops`` keys a run's MFU columns divide by: its precision's datasheet
    column (TF32's with train.tf32), and bf16's (every run records MFU against the bf16 peak too)."""
    record = _precision(point)
    return {record.peak_key, "bf16", *([record.tf32_peak_key] if train.tf32 and record.tf32_peak_key else [])}


def _changed(config_obj, exclude=()) -> dict:
    """The fields of a config dataclass whose value differs from its default (the schema's)."""
    return {f.name: getattr(config_obj, f.name) for f in dataclasses.fields(config_obj)
            if f.name not in exclude and f.default is not dataclasses.MISSING and getattr(config_obj, f.name) != f.default}


def result_params(config: dict, plan: RunPlan) -> dict:
    """What a run's results depend on beyond its point (Snakemake params of its job: a change reruns
    it): its model's shape, the train settings it reads and how its ranks are laid out, each as the
    values that differ from the schema's defaults, so that a config key added later at its default
    reruns nothing, and a changed value reruns exactly the runs it affects (a ``models:`` entry the
    runs of that model, ``fp16_init_scale`` the fp16 runs, a peak the runs measured against it).
    The plan's device is the one the run is planned on (a CPU rank's threads are its compute; a GPU
    run's are not)."""
    point, device, train = plan.point, plan.device, plan.train
    changed = _changed(train, exclude=NOT_RESULT_KEYS)
    changed = {key: value for key, value in changed.items() if TRAIN_KEY_APPLIES.get(key, lambda p: True)(point)}
    if device != "cuda":
        changed.pop("memory_snapshot", None)  # the CUDA allocator's history: nothing to record elsewhere
    if changed.get("peak_tflops"):
        peaks = {key: value for key, value in sorted(changed["peak_tflops"].items()) if key in _peak_keys(point, train)}
        changed = {k: v for k, v in changed.items() if k != "peak_tflops"} | ({"peak_tflops": peaks} if peaks else {})
    params = {"model": _changed(plan.model, exclude=("vocab_size",)),  # vocab: the data's
              "train": changed}
    layout = {k: v for k, v in _changed(cluster_config(config)).items() if k == "cpus_per_rank" and device == "cpu"}
    launch = plan.launch
    if launch.multi_launcher:  # which ranks share a node, and so which links a collective crosses
        layout.update(launchers=launch.launchers, ranks_per_launcher=launch.ranks_per_launcher, nodes=launch.nodes)
    if layout:
        params["layout"] = layout
    # What its collectives carry where it is not fp32: fp16 and bf16 runs at stages 2 and 3 gather in
    # their compute dtype since FSDP2's MixedPrecisionPolicy (their results measured before in fp32
    # are rerun, no other run), and the grad_reduce lever's reduce dtype.
    comm = {key: value for key, value in (("param_gather_dtype", plan.comm.param_gather),
                                          ("grad_reduce_dtype", plan.comm.grad_reduce)) if value not in (None, "float32")}
    if comm:
        params["comm_dtypes"] = comm
    return params
