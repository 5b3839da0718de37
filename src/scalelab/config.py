"""Typed experiment configuration and the checks a JSON schema cannot express.

The Snakefile validates ``config.yaml`` against ``workflow/schemas/config.schema.yaml``
(types, enums, unknown keys, defaults) and then calls :func:`check_config` for the
cross-field rules (batch divisibility, corpus paths, head count). Both stop the workflow
before any job runs, with a message naming the key and the bad value.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
ZERO_STAGES = (0, 1, 2, 3)
# The sweep axes, in the order they appear in run paths: the three the project is about,
# then the levers (optional axes whose default is a single value).
SWEEP_AXES = ("precision", "zero_stage", "world_size",
              "micro_batch", "activation_checkpointing", "cpu_offload", "bucket_mb")
LEVER_AXES = SWEEP_AXES[3:]
RUN_DIR_GLOB = "/".join("*" * len(SWEEP_AXES))
"""Matches every run folder under <results_dir>/runs: one folder level per sweep axis."""
DDP_BUCKET_MB = 25.0
"""PyTorch DDP's default bucket size (MiB), the default of the bucket_mb axis."""
# Keys of earlier config layouts, with where they went.
MOVED_KEYS = {("train", "micro_batch"): "sweep.micro_batch (a list, e.g. [null] or [1, 2, 4])"}

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A configuration value is unusable; the message names the key and the value."""


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    """Folder under <results_dir>/data/."""
    source: str
    """synthetic | text | tokenized."""
    path: str | None
    """Corpus file/folder (text) or .bin file/folder (tokenized)."""
    tokenizer: str
    """byte | bpe."""
    bpe_vocab_size: int
    """Vocab size of the trained BPE."""
    decode_errors: str
    """strict | replace: what to do with bytes that are not UTF-8 (BPE only)."""
    tokenized_dtype: str
    """uint16 | uint32, element type of a tokenized source."""
    vocab_size: int | None
    """Vocab size of a tokenized source; None = max token id + 1."""
    val_fraction: float
    """Share of each chunk of tokens written to val.bin."""
    synthetic_bytes: int
    """Size of the synthetic corpus in bytes of text."""
    seed: int
    """Seed of the synthetic corpus."""


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int
    """Transformer blocks."""
    d_model: int
    """Residual stream width."""
    n_heads: int
    """Attention heads (divides d_model)."""
    seq_len: int
    """Context length in tokens."""
    tie_embeddings: bool
    """Share token embedding and output head weights."""
    vocab_size: int = 256
    """Filled from the prepared dataset's meta.json."""


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    """Optimizer steps."""
    warmup_steps: int
    """Steps excluded from throughput/MFU; also the LR warm-up length."""
    global_batch: int
    """Sequences per optimizer step at every world size."""
    lr: float
    """Peak AdamW learning rate."""
    weight_decay: float
    """AdamW weight decay."""
    grad_clip: float
    """Max global grad norm; 0 = no clipping."""
    seed: int
    """Seed of init and sampling."""
    device: str
    """auto | cpu | cuda. auto is decided once, where the sweep is planned (scalelab.placement)."""
    tf32: bool
    """Allow TF32 matmuls for fp32 on GPU."""
    fp16_init_scale: float
    """Initial dynamic loss scale (fp16)."""
    fp8_emulate: bool
    """Run fp8 points anywhere with torchao's emulated float8 casts (checks the recipe, not speed)."""
    checkpoint_every: int
    """Save a resumable checkpoint every N optimizer steps; 0 = never."""
    collective_timeout_s: float
    """Timeout of every collective, seconds."""
    run_timeout_s: float
    """Wall-clock limit of one run, seconds."""
    peak_tflops: dict[str, float] | None = None
    """Dense peak TFLOP/s per GPU by precision key (fp32, tf32, fp16, bf16, fp8), for a GPU or a
    key scalelab.hardware has no datasheet figure for; None = the table's figures only."""


@dataclass(frozen=True)
class RunPoint:
    """One point of the sweep: what varies between training runs."""

    precision: str
    zero_stage: int
    world_size: int
    micro_batch: int | None = None
    """Sequences per rank per forward; None = the whole per-rank batch (no accumulation)."""
    activation_checkpointing: bool = False
    """Recompute every transformer block's activations in backward."""
    cpu_offload: bool = False
    """Stage 3 only: sharded parameters, gradients and optimizer state live in host memory."""
    bucket_mb: float | None = DDP_BUCKET_MB
    """DDP gradient bucket size (stages 0 and 1); None for FSDP2 stages, which have none."""

    def __post_init__(self):
        if self.zero_stage >= 2:  # FSDP2: no DDP buckets, whatever was asked
            object.__setattr__(self, "bucket_mb", None)
        elif self.bucket_mb is not None:
            object.__setattr__(self, "bucket_mb", float(self.bucket_mb))

    def path_values(self) -> dict[str, str]:
        """The point's value per axis as written in paths (``auto``, ``true``, ``none``)."""
        return {
            "precision": self.precision, "zero_stage": str(self.zero_stage), "world_size": str(self.world_size),
            "micro_batch": "auto" if self.micro_batch is None else str(self.micro_batch),
            "activation_checkpointing": str(self.activation_checkpointing).lower(),
            "cpu_offload": str(self.cpu_offload).lower(),
            "bucket_mb": "none" if self.bucket_mb is None else f"{self.bucket_mb:g}",
        }

    @classmethod
    def from_path_values(cls, values) -> "RunPoint":
        """Inverse of path_values (from Snakemake wildcards or a parsed path); ValueError if bad."""
        def flag(text: str) -> bool:
            if text not in ("true", "false"):
                raise ValueError(f"expected true or false, got {text!r}")
            return text == "true"

        return cls(
            precision=values["precision"], zero_stage=int(values["zero_stage"]), world_size=int(values["world_size"]),
            micro_batch=None if values["micro_batch"] == "auto" else int(values["micro_batch"]),
            activation_checkpointing=flag(values["activation_checkpointing"]),
            cpu_offload=flag(values["cpu_offload"]),
            bucket_mb=None if values["bucket_mb"] == "none" else float(values["bucket_mb"]),
        )

    @property
    def path(self) -> str:
        """Relative results path, e.g. ``precision~fp32/zero_stage~0/world_size~1/micro_batch~auto/...``."""
        return "/".join(f"{axis}~{value}" for axis, value in self.path_values().items())

    @property
    def run_id(self) -> str:
        """Short unique id: ``fp32-z0-w1``, plus a suffix per lever away from its default
        (``-mb2``, ``-ac``, ``-offload``, ``-bucket1``)."""
        parts = [f"{self.precision}-z{self.zero_stage}-w{self.world_size}"]
        if self.micro_batch is not None:
            parts.append(f"mb{self.micro_batch}")
        if self.activation_checkpointing:
            parts.append("ac")
        if self.cpu_offload:
            parts.append("offload")
        if self.bucket_mb is not None and self.bucket_mb != DDP_BUCKET_MB:
            parts.append(f"bucket{self.bucket_mb:g}")
        return "-".join(parts)

    def identity(self, micro_batch: int | None = None) -> dict:
        """The identity columns of this run's rows; micro_batch is the resolved size when known."""
        return {"run_id": self.run_id, "precision": self.precision, "zero_stage": self.zero_stage,
                "world_size": self.world_size, "micro_batch": micro_batch if micro_batch is not None else self.micro_batch,
                "activation_checkpointing": self.activation_checkpointing, "cpu_offload": self.cpu_offload,
                "bucket_mb": self.bucket_mb}


def _section(config: dict, key: str) -> dict:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"config key '{key}' must be a mapping, got {value!r}")
    return value


def _build(cls, section: dict, key: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(section) - names
    if unknown:
        raise ConfigError(f"unknown key(s) in '{key}': {sorted(unknown)}")
    try:
        return cls(**section)
    except TypeError as err:  # a missing key: only when the schema was not applied
        raise ConfigError(f"config section '{key}': {err}") from None


def dataset_config(config: dict) -> DatasetConfig:
    return _build(DatasetConfig, _section(config, "dataset"), "dataset")


def model_config(config: dict, vocab_size: int = 256) -> ModelConfig:
    return _build(ModelConfig, {**_section(config, "model"), "vocab_size": vocab_size}, "model")


def train_config(config: dict) -> TrainConfig:
    return _build(TrainConfig, _section(config, "train"), "train")


def sweep_plan(config: dict) -> tuple[list[RunPoint], list[tuple[RunPoint, str]]]:
    """(points to run, [(point left out, why)]) from the sweep section, in a stable order.

    Combinations a lever does not apply to are left out: cpu_offload=true outside stage 3,
    a micro-batch size that does not divide a world size's per-rank batch. FSDP2 stages have
    no DDP buckets, so their bucket_mb is None (one run, whatever the bucket_mb list).
    Raises ConfigError for values that fit no point at all."""
    sweep = _section(config, "sweep")
    train = train_config(config)
    values = {axis: sweep.get(axis, [RunPoint.__dataclass_fields__[axis].default]) for axis in SWEEP_AXES}
    for world_size in values["world_size"]:
        micro_batch_plan(train, int(world_size))  # raises when the global batch does not split evenly
    points, left_out, seen = [], [], set()
    for combo in itertools.product(*values.values()):
        raw = dict(zip(SWEEP_AXES, combo))
        stage = int(raw["zero_stage"])
        point = RunPoint(
            precision=raw["precision"], zero_stage=stage, world_size=int(raw["world_size"]),
            micro_batch=raw["micro_batch"], activation_checkpointing=bool(raw["activation_checkpointing"]),
            cpu_offload=bool(raw["cpu_offload"]), bucket_mb=raw["bucket_mb"],
        )
        if point in seen:
            continue
        seen.add(point)
        reason = None
        if point.cpu_offload and point.zero_stage != 3:
            reason = "cpu_offload applies to ZeRO stage 3 (FSDP2's offload policy)"
        else:
            try:
                micro_batch_plan(train, point.world_size, point.micro_batch)
            except ConfigError as err:
                reason = str(err)
        if reason:
            left_out.append((point, reason))
        else:
            points.append(point)
    for micro in values["micro_batch"]:
        if micro is not None and not any(p.micro_batch == micro for p in points):
            raise ConfigError(f"sweep.micro_batch={micro} fits no world size: "
                              + next(r for p, r in left_out if p.micro_batch == micro))
    if not points:
        raise ConfigError("the sweep has no runnable point: " + "; ".join(sorted({r for _, r in left_out})))
    return points, left_out


def sweep_points(config: dict) -> list[RunPoint]:
    """Every runnable combination of the sweep axes, in a stable order."""
    return sweep_plan(config)[0]


def micro_batch_plan(train: TrainConfig, world_size: int, micro_batch: int | None = None) -> tuple[int, int]:
    """(micro_batch, accumulation_steps) per rank for a world size; raises ConfigError."""
    if train.global_batch % world_size:
        raise ConfigError(
            f"train.global_batch={train.global_batch} is not divisible by "
            f"sweep.world_size={world_size}: every rank must get the same share"
        )
    per_rank = train.global_batch // world_size
    micro = micro_batch or per_rank
    if micro > per_rank or per_rank % micro:
        raise ConfigError(
            f"sweep.micro_batch={micro_batch} does not divide the per-rank batch "
            f"{per_rank} (train.global_batch={train.global_batch} / world_size={world_size})"
        )
    return micro, per_rank // micro


@dataclass(frozen=True)
class LaunchPlan:
    """How one run maps onto machines: torchrun launchers x ranks each, over nodes."""

    launchers: int
    """torchrun launchers (one SLURM task each); 1 = a single-node run."""
    ranks_per_launcher: int
    """Ranks (GPUs / processes) each launcher starts."""
    nodes: int
    """Nodes the run asks SLURM for."""

    @property
    def multi_launcher(self) -> bool:
        return self.launchers > 1


def launch_plan(config: dict, world_size: int) -> LaunchPlan:
    """One launcher when the run fits a node; else world_size / ranks_per_node launchers,
    packed launchers_per_node to a node. Raises ConfigError when ranks do not split evenly."""
    cluster = config.get("cluster") or {}
    per_node = int(cluster.get("ranks_per_node", 8))
    packing = int(cluster.get("launchers_per_node", 1))
    if world_size <= per_node:
        return LaunchPlan(1, world_size, 1)
    if world_size % per_node:
        raise ConfigError(
            f"sweep.world_size={world_size} spans several nodes but is not a multiple of "
            f"cluster.ranks_per_node={per_node}: every node must run the same number of ranks"
        )
    launchers = world_size // per_node
    return LaunchPlan(launchers, per_node, -(-launchers // packing))


def check_config(config: dict, base_dir: str | Path = ".") -> None:
    """Cross-field checks after schema validation. Raises ConfigError naming key and value."""
    dataset = dataset_config(config)
    model = model_config(config)
    train = train_config(config)
    if dataset.source in ("text", "tokenized"):
        if not dataset.path:
            raise ConfigError(f"dataset.path is required when dataset.source={dataset.source!r}")
        corpus = Path(base_dir, dataset.path)
        if not corpus.exists():
            raise ConfigError(f"dataset.path={dataset.path!r} does not exist")
    elif dataset.path:
        raise ConfigError(
            f"dataset.path={dataset.path!r} is set but dataset.source='synthetic' ignores it; "
            "set dataset.source to 'text' or 'tokenized', or remove the path"
        )
    if model.d_model % model.n_heads:
        raise ConfigError(
            f"model.n_heads={model.n_heads} does not divide model.d_model={model.d_model}"
        )
    if train.tf32 and train.device == "cpu":
        raise ConfigError("train.tf32=true asks for TF32 GPU matmuls, but train.device='cpu'; "
                          "set train.tf32: false or train.device: cuda/auto")
    if train.warmup_steps >= train.steps:
        raise ConfigError(
            f"train.warmup_steps={train.warmup_steps} leaves no measured step "
            f"(train.steps={train.steps})"
        )
    for point in sweep_points(config):
        launch_plan(config, point.world_size)
    check_gpu_layout(config)


def check_gpu_layout(config: dict) -> None:
    """The GPUs the config says a node has must hold the ranks it places there, one GPU each."""
    cluster, device = config.get("cluster") or {}, (config.get("train") or {}).get("device", "auto")
    gpus = cluster.get("gpus_per_node")
    if gpus is None or device == "cpu":
        return
    if gpus == 0:
        if device == "cuda":
            raise ConfigError("train.device='cuda' but cluster.gpus_per_node=0: set the nodes' GPU count, "
                              "or train.device: cpu")
        return
    per_node = int(cluster.get("ranks_per_node", 8)) * int(cluster.get("launchers_per_node", 1))
    if per_node > gpus:
        raise ConfigError(
            f"cluster.ranks_per_node={cluster.get('ranks_per_node', 8)} x cluster.launchers_per_node="
            f"{cluster.get('launchers_per_node', 1)} places {per_node} ranks on a node with cluster.gpus_per_node={gpus}: "
            "every rank needs a GPU of its own")


def check_moved_keys(config: dict) -> None:
    """Name a key of an earlier layout and where it went (the schema would only say 'unknown')."""
    for (section, key), new_home in MOVED_KEYS.items():
        if key in (config.get(section) or {}):
            raise ConfigError(f"{section}.{key} has moved to {new_home}")


def check_yaml_syntax(path: str | Path) -> None:
    """Raise ConfigError naming file, line and column when a config file is not valid YAML
    (Snakemake's own message names neither)."""
    import yaml

    path = Path(path)
    if not path.exists():
        return
    try:
        yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{path}: not valid YAML at {where}: {problem}") from None


def config_hash(config: dict) -> str:
    """Stable short hash of a (validated) config, recorded in every run's provenance."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def load_config(path: str | Path) -> dict:
    """Read a config YAML, apply the schema (defaults included) and the cross-field checks."""
    import yaml
    from snakemake.utils import validate

    path = Path(path)
    with open(path) as handle:
        config = yaml.safe_load(handle) or {}
    check_moved_keys(config)
    validate(config, str(SCHEMA_PATH), set_default=True)
    check_config(config, base_dir=path.parent)
    return config
