"""Typed experiment configuration and the checks a JSON schema cannot express.

The Snakefile reads every config file with :class:`UniqueKeyLoader` (file, line and column of
a YAML error or a key given twice), then :func:`validate_config`: :func:`check_numbers`
(finite; no float for an integer key), ``workflow/schemas/config.schema.yaml`` (types, enums,
unknown keys, defaults) and :func:`check_config` for the cross-field rules (batch
divisibility, corpus paths, head count, results_dir). All stop the workflow before any job
runs, with a message naming the key and the bad value.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml

# Keys of earlier config layouts, with where they went.
MOVED_KEYS = {("train", "micro_batch"): "sweep.micro_batch (a list, e.g. [null] or [1, 2, 4])"}

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A configuration value is unusable; the message names the key and the value."""


_SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())


def _schema_defaults() -> dict[str, dict]:
    return {name: {key: spec.get("default") for key, spec in sec.get("properties", {}).items()}
            for name, sec in _SCHEMA["properties"].items() if sec.get("type") == "object"}


_SCHEMA_DEFAULTS = _schema_defaults()


def _default(section_name: str, key: str):
    """A dataclass field whose default is the schema's: the schema is where defaults are written."""
    return dataclasses.field(default=_SCHEMA_DEFAULTS[section_name][key])


@dataclass(frozen=True)
class DatasetConfig:
    name: str = _default("dataset", "name")
    """Folder under <results_dir>/data/."""
    source: str = _default("dataset", "source")
    """synthetic | text | tokenized."""
    path: str | None = _default("dataset", "path")
    """Corpus file/folder (text) or .bin file/folder (tokenized)."""
    tokenizer: str = _default("dataset", "tokenizer")
    """byte | bpe."""
    bpe_vocab_size: int = _default("dataset", "bpe_vocab_size")
    """Vocab size of the trained BPE."""
    decode_errors: str = _default("dataset", "decode_errors")
    """strict | replace: what to do with bytes that are not UTF-8 (BPE only)."""
    tokenized_dtype: str = _default("dataset", "tokenized_dtype")
    """uint16 | uint32, element type of a tokenized source."""
    vocab_size: int | None = _default("dataset", "vocab_size")
    """Vocab size of a tokenized source; None = max token id + 1."""
    val_fraction: float = _default("dataset", "val_fraction")
    """Share of each chunk of tokens written to val.bin."""
    synthetic_bytes: int = _default("dataset", "synthetic_bytes")
    """Size of the synthetic corpus in bytes of text."""
    seed: int = _default("dataset", "seed")
    """Seed of the synthetic corpus."""


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int = _default("model", "n_layers")
    """Transformer blocks."""
    d_model: int = _default("model", "d_model")
    """Residual stream width."""
    n_heads: int = _default("model", "n_heads")
    """Attention heads (divides d_model)."""
    seq_len: int = _default("model", "seq_len")
    """Context length in tokens."""
    tie_embeddings: bool = _default("model", "tie_embeddings")
    """Share token embedding and output head weights."""
    vocab_size: int = 256
    """Filled from the prepared dataset's meta.json."""


@dataclass(frozen=True)
class TrainConfig:
    steps: int = _default("train", "steps")
    """Optimizer steps."""
    warmup_steps: int = _default("train", "warmup_steps")
    """Steps excluded from throughput/MFU; also the LR warm-up length."""
    global_batch: int = _default("train", "global_batch")
    """Sequences per optimizer step at every world size."""
    lr: float = _default("train", "lr")
    """Peak AdamW learning rate."""
    weight_decay: float = _default("train", "weight_decay")
    """AdamW weight decay."""
    grad_clip: float = _default("train", "grad_clip")
    """Max global grad norm; 0 = no clipping."""
    seed: int = _default("train", "seed")
    """Seed of init and sampling."""
    device: str = _default("train", "device")
    """auto | cpu | cuda. auto is decided once, where the sweep is planned (scalelab.placement)."""
    tf32: bool = _default("train", "tf32")
    """Allow TF32 matmuls for fp32 on GPU."""
    fp16_init_scale: float = _default("train", "fp16_init_scale")
    """Initial dynamic loss scale (fp16)."""
    fp8_emulate: bool = _default("train", "fp8_emulate")
    """Run fp8 points anywhere with torchao's emulated float8 casts (checks the recipe, not speed)."""
    checkpoint_every: int = _default("train", "checkpoint_every")
    """Save a resumable checkpoint every N optimizer steps; 0 = never."""
    collective_timeout_s: float = _default("train", "collective_timeout_s")
    """Timeout of every collective, seconds."""
    run_timeout_s: float = _default("train", "run_timeout_s")
    """Wall-clock limit of one run, seconds."""
    lora_alpha: float = _default("train", "lora_alpha")
    """LoRA scaling numerator: the update B A is scaled by lora_alpha / lora_rank (sweep.lora_rank)."""
    peak_tflops: dict[str, float] | None = _default("train", "peak_tflops")
    """Dense peak TFLOP/s per GPU by precision key (fp32, tf32, fp16, bf16, fp8), for a GPU or a
    key scalelab.hardware has no datasheet figure for; None = the table's figures only."""


def section(config: dict, key: str) -> dict:
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
    return _build(DatasetConfig, section(config, "dataset"), "dataset")


MODEL_SHAPE_KEYS = ("n_layers", "d_model", "n_heads")
"""What a ``models:`` entry may set; seq_len and tie_embeddings stay in ``model:`` for every shape."""


def model_config(config: dict, vocab_size: int = 256, name: str = "base") -> ModelConfig:
    """The model of a sweep point: ``model:`` itself for the model axis's default name 'base', or
    ``model:`` with the shape keys of ``models.<name>`` (n_layers, d_model, n_heads) over it."""
    shape = {}
    if name != "base":
        models = section(config, "models")
        if name not in models:
            raise ConfigError(f"sweep.model={name!r} is not 'base' (the model: section) or a name of the "
                              f"models: table ({', '.join(sorted(models)) or 'empty'})")
        shape = models[name] or {}
        unknown = set(shape) - set(MODEL_SHAPE_KEYS)
        if unknown:
            raise ConfigError(f"models.{name}: unknown key(s) {sorted(unknown)}; a model shape sets "
                              f"{', '.join(MODEL_SHAPE_KEYS)} (seq_len and tie_embeddings stay in model:)")
    return _build(ModelConfig, {**section(config, "model"), **shape, "vocab_size": vocab_size}, "model")


def train_config(config: dict) -> TrainConfig:
    return _build(TrainConfig, section(config, "train"), "train")


@dataclass(frozen=True)
class ClusterConfig:
    ranks_per_node: int = _default("cluster", "ranks_per_node")
    """Ranks (GPUs) one node holds; a run with more spans world_size / ranks_per_node launchers."""
    launchers_per_node: int = _default("cluster", "launchers_per_node")
    """torchrun launchers per node (2 packs two 'nodes' on one host)."""
    cpus_per_rank: int = _default("cluster", "cpus_per_rank")
    """CPU cores per rank: SLURM cpus, and intra-op threads of CPU runs."""
    mem_mb_per_rank: int = _default("cluster", "mem_mb_per_rank")
    """Host memory per rank, MB."""
    gpus_per_node: int | None = _default("cluster", "gpus_per_node")
    """GPUs on each node; None = not stated (train.device auto then looks at the planning machine)."""
    exclusive: bool = _default("cluster", "exclusive")
    """SLURM: training jobs take whole nodes."""


def cluster_config(config: dict) -> ClusterConfig:
    return _build(ClusterConfig, section(config, "cluster"), "cluster")


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
    cluster = cluster_config(config)
    per_node, packing = cluster.ranks_per_node, cluster.launchers_per_node
    if world_size <= per_node:
        return LaunchPlan(1, world_size, 1)
    if world_size % per_node:
        raise ConfigError(
            f"sweep.world_size={world_size} spans several nodes but is not a multiple of "
            f"cluster.ranks_per_node={per_node}: every node must run the same number of ranks"
        )
    launchers = world_size // per_node
    return LaunchPlan(launchers, per_node, -(-launchers // packing))


def file_kind(path: str | Path) -> str:
    """What a path is, in words: 'a folder', 'a regular file', 'a character device', ..."""
    mode = Path(path).stat().st_mode
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "a special file"


def check_results_dir(config: dict, base_dir: str | Path = ".") -> None:
    """results_dir must be a folder or not exist yet, under a path made of folders."""
    value = config.get("results_dir", _SCHEMA["properties"]["results_dir"]["default"])
    results = Path(base_dir, value)
    for existing in (results, *results.parents):
        if existing.exists():
            if not existing.is_dir():
                what = f"results_dir={value!r}" + ("" if existing == results else f": {existing}")
                raise ConfigError(f"{what} is {file_kind(existing)}, not a folder; "
                                  "name a folder (it is created if missing)")
            return


def check_config(config: dict, base_dir: str | Path = ".") -> None:
    """Cross-field checks after schema validation. Raises ConfigError naming key and value."""
    dataset = dataset_config(config)
    model = model_config(config)
    train = train_config(config)
    check_results_dir(config, base_dir)
    if dataset.name.startswith("."):
        raise ConfigError(
            f"dataset.name={dataset.name!r} starts with a dot: '.' and '..' would write the data into "
            "<results_dir>/data or <results_dir> itself, other dot names are hidden folders; "
            "start it with a letter, digit, '_' or '-'")
    if dataset.source in ("text", "tokenized"):
        if not dataset.path:
            raise ConfigError(f"dataset.path is required when dataset.source={dataset.source!r}")
        corpus = Path(base_dir, dataset.path)
        if not corpus.exists():
            raise ConfigError(f"dataset.path={dataset.path!r} does not exist")
        if not (corpus.is_file() or corpus.is_dir()):
            raise ConfigError(f"dataset.path={dataset.path!r} is {file_kind(corpus)}, a special file: "
                              "not a regular file or folder to read a corpus from")
        ids = {"uint16": 1 << 16, "uint32": 1 << 32}[dataset.tokenized_dtype]
        if dataset.source == "tokenized" and dataset.vocab_size is not None and dataset.vocab_size > ids:
            raise ConfigError(
                f"dataset.vocab_size={dataset.vocab_size} does not fit dataset.tokenized_dtype="
                f"{dataset.tokenized_dtype!r}, whose ids stop at {ids - 1:,}: a wrong dtype or a wrong vocab_size")
    elif dataset.path:
        raise ConfigError(
            f"dataset.path={dataset.path!r} is set but dataset.source='synthetic' ignores it; "
            "set dataset.source to 'text' or 'tokenized', or remove the path"
        )
    if model.d_model % model.n_heads:
        raise ConfigError(
            f"model.n_heads={model.n_heads} does not divide model.d_model={model.d_model}"
        )
    if "base" in section(config, "models"):
        raise ConfigError("models.base: 'base' names the model: section itself (the model axis's default); "
                          "give the shape another name")
    for name in section(config, "sweep").get("model", ["base"]):
        shape = model_config(config, name=name)
        if shape.d_model % shape.n_heads:
            raise ConfigError(f"models.{name}: n_heads={shape.n_heads} does not divide d_model={shape.d_model}")
    if train.tf32 and train.device == "cpu":
        raise ConfigError("train.tf32=true asks for TF32 GPU matmuls, but train.device='cpu'; "
                          "set train.tf32: false or train.device: cuda/auto")
    if train.warmup_steps >= train.steps:
        raise ConfigError(
            f"train.warmup_steps={train.warmup_steps} leaves no measured step "
            f"(train.steps={train.steps})"
        )
    from scalelab.sweep import sweep_points  # the sweep builds on this module

    for point in sweep_points(config):
        launch_plan(config, point.world_size)
    check_gpu_layout(config)


def check_gpu_layout(config: dict) -> None:
    """The GPUs the config says a node has must hold the ranks it places there, one GPU each."""
    cluster, device = cluster_config(config), train_config(config).device
    gpus = cluster.gpus_per_node
    if gpus is None or device == "cpu":
        return
    if gpus == 0:
        if device == "cuda":
            raise ConfigError("train.device='cuda' but cluster.gpus_per_node=0: set the nodes' GPU count, "
                              "or train.device: cpu")
        return
    per_node = cluster.ranks_per_node * cluster.launchers_per_node
    if per_node > gpus:
        raise ConfigError(
            f"cluster.ranks_per_node={cluster.ranks_per_node} x cluster.launchers_per_node={cluster.launchers_per_node} "
            f"places {per_node} ranks on a node with cluster.gpus_per_node={gpus}: every rank needs a GPU of its own")


def check_moved_keys(config: dict) -> None:
    """Name a key of an earlier layout and where it went (the schema would only say 'unknown')."""
    for (section, key), new_home in MOVED_KEYS.items():
        if key in (config.get(section) or {}):
            raise ConfigError(f"{section}.{key} has moved to {new_home}")


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last
    value silently), naming the key's dotted path and both lines."""

    def get_single_node(self):
        self._root = super().get_single_node()
        return self._root

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    earlier = first.setdefault(key, key_node)
                except TypeError:  # an unhashable key: SafeLoader's own error follows
                    continue
                if earlier is not key_node:
                    name = ".".join([*self._path_to(node), str(key)]).replace(".[", "[")
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {name} (first given on line {earlier.start_mark.line + 1}; "
                        "YAML would keep the last value silently)", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def _path_to(self, target, node=None, path=()) -> list[str]:
        """Dotted key path from the document's root to a mapping node."""
        node = self._root if node is None else node
        if node is target:
            return list(path)
        children = ()
        if isinstance(node, yaml.MappingNode):
            children = ((str(k.value), v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            children = ((f"[{i}]", v) for i, v in enumerate(node.value))
        for name, child in children:
            found = self._path_to(target, child, (*path, name))
            if found is not None:
                return found
        return None if path else []


def read_yaml(path: str | Path):
    """A config file's content (UniqueKeyLoader); ConfigError naming file, line and column
    when it is not valid YAML or gives a key twice."""
    path = Path(path)
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{path}: not valid YAML at {where}: {problem}") from None


def check_yaml_syntax(path: str | Path) -> None:
    """Raise ConfigError naming file, line and column when a config file is not valid YAML or
    gives a key twice (Snakemake's own parser names neither, and keeps the last value)."""
    if Path(path).exists():
        read_yaml(path)


def check_numbers(config, schema: dict | None = None, key: str = "") -> None:
    """Every number finite (YAML reads .inf and .nan; the schema's minimum checks let NaN
    through), and a key the schema types integer given an int: 20.0 is refused, not coerced,
    so the config reads as what runs. Raises ConfigError naming key and value."""
    schema = _SCHEMA if schema is None else schema
    if isinstance(config, float):
        types = schema.get("type", [])
        types = [types] if isinstance(types, str) else types
        if not math.isfinite(config):
            raise ConfigError(f"{key}={config!r} is not a finite number")
        if "integer" in types and "number" not in types:
            hint = f" (write {int(config)})" if config.is_integer() else ""
            raise ConfigError(f"{key}={config!r} must be an integer, written without a decimal point{hint}")
    elif isinstance(config, dict):
        properties = schema.get("properties", {})
        for name, value in config.items():
            check_numbers(value, properties.get(name, {}), f"{key}.{name}" if key else str(name))
    elif isinstance(config, list):
        for i, value in enumerate(config):
            check_numbers(value, schema.get("items", {}), f"{key}[{i}]")


def config_hash(config: dict) -> str:
    """Stable short hash of a (validated) config, recorded in every run's provenance."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def validate_config(config: dict, base_dir: str | Path = ".") -> dict:
    """The one validation path (the Snakefile and load_config): keys of earlier layouts named,
    numbers checked (finite; no float for an integer key), the schema applied (types, enums, unknown keys; defaults filled in place), then the
    cross-field checks. Raises ConfigError naming key and value; returns the config."""
    from jsonschema.exceptions import ValidationError
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    check_moved_keys(config)
    check_numbers(config)
    try:
        validate(config, str(SCHEMA_PATH), set_default=True)
    except (ValidationError, WorkflowError) as err:
        raise ConfigError(str(err)) from None
    check_config(config, base_dir=base_dir)
    return config


def load_config(path: str | Path) -> dict:
    """Read a config YAML and validate it (validate_config); paths in it are relative to its folder."""
    path = Path(path)
    return validate_config(read_yaml(path) or {}, base_dir=path.parent)
