"""The typed experiment configuration: one frozen dataclass per section of config.yaml, built
from a validated config dict, with the defaults the schema writes.

The other jobs around a config live beside this module, each in one place:
``config.schema.yaml`` (types, enums, defaults; package data, read with importlib.resources),
:mod:`scalelab.config.reading` (YAML files, located errors),
:mod:`scalelab.planning.validation` (the one validation path) and, next to the placement they
decide, the launch plans (:mod:`scalelab.planning.placement`). This module imports none of them, so
any module may import it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from importlib import resources

import yaml

from scalelab.registries.families import DEFAULT_FAMILY, FAMILIES, OWN_KEYS

SCHEMA_FILE = resources.files(__name__) / "config.schema.yaml"
"""The config schema, shipped inside the package (an installed wheel validates without a checkout)."""
# libyaml's parser where PyYAML has it: every Snakemake start (and SLURM job) reads the schema
SCHEMA: dict = yaml.load(SCHEMA_FILE.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


class ConfigError(ValueError):
    """A configuration value is unusable; the message names the key and the value. ``key``, where
    given, is the key path the problem is about (``("train", "lr")``, ``("sweep", "precision", 1)``):
    validation uses it to name the file and line that set the key."""

    def __init__(self, message: str = "", key: tuple = ()):
        super().__init__(message)
        self.key = tuple(key)


class ConfigProblems(ConfigError):
    """Every problem of a config at once: ``problems`` holds one line each, located
    (``my.yaml:7: model.n_layer: unknown key; did you mean n_layers?``) where a file sets the key;
    str() is the lines, one per line."""

    errors: list[ConfigError] = []
    """The problems as keyed errors, where a check raised several at once (each then located by its key)."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))

    @classmethod
    def of(cls, errors: list[ConfigError]) -> ConfigProblems:
        found = cls([str(e) for e in errors])
        found.errors = list(errors)
        return found

    def __reduce__(self):  # pickled across processes: rebuilt from its lines
        return (type(self), (self.problems,))


def _schema_defaults() -> dict[str, dict]:
    return {name: {key: spec.get("default") for key, spec in sec.get("properties", {}).items()}
            for name, sec in SCHEMA["properties"].items() if sec.get("type") == "object"}


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
    family: str = DEFAULT_FAMILY
    """gpt2 (LayerNorm, GELU MLP of 4d, learned positions, full attention) | llama (RMSNorm, SwiGLU,
    RoPE, grouped-query attention, untied head): scalelab.registries.families.FAMILIES."""
    n_kv_heads: int | None = None
    """Key/value heads of grouped-query attention (llama; divides n_heads); None = n_heads."""
    ffn_dim: int | None = None
    """SwiGLU hidden size (llama); None = 8/3 d rounded up to a multiple of 256 (Meta's rule)."""
    rope_base: float = 10000.0
    """Base (theta) of the rotary position embedding's frequencies (llama)."""
    module: str | None = None
    """``pkg.mod:build``: the user's own model (scalelab.run.model.build_model), instead of a family."""

    @property
    def kind(self) -> str:
        """What a run's row calls the model (``model_family``): its family, or ``custom`` for the user's module."""
        return "custom" if self.module else self.family


HALF_BATCH_SHARE = 0.5
"""Half-batch steps take this share of train.measure_s (scalelab.run.worker.measure_token_share): a run's
measurement window past its steps lasts up to (1 + HALF_BATCH_SHARE) x measure_s."""


@dataclass(frozen=True)
class TrainConfig:
    steps: int = _default("train", "steps")
    """Optimizer steps."""
    warmup_steps: int = _default("train", "warmup_steps")
    """Steps excluded from throughput/MFU; also the LR warm-up length."""
    measure_s: float = _default("train", "measure_s")
    """Seconds of measured steps (after warm-up) a run's speed is taken over at least: timing steps
    past ``steps`` where these are shorter (scalelab.run.worker.extend_measurement); 0 = the steps alone."""
    profile: list[int] | None = _default("train", "profile")
    """[first, last]: the steps (inclusive) traced by torch.profiler into each rank's run folder
    (scalelab.run.trace), left out of the timings; None = no trace."""
    profile_stacks: bool = _default("train", "profile_stacks")
    """Record Python stacks in the trace (the slow part of a dump)."""
    memory_snapshot: bool = _default("train", "memory_snapshot")
    """GPU runs: record the CUDA allocator's history from the first step, dumped after the traced steps
    and whenever the run ends out of memory."""
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
    """auto | cpu | cuda. auto is decided once, where the sweep is planned (scalelab.planning.placement)."""
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
    key scalelab.registries.hardware has no datasheet figure for; None = the table's figures only."""


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
"""The shape keys every family has; seq_len stays in ``model:`` for every shape."""
MODEL_FAMILY_KEYS = ("family", *OWN_KEYS)
"""What else a ``models:`` entry may set: its family and the families' own keys (scalelab.registries.families)."""
MODEL_ENTRY_KEYS = (*MODEL_SHAPE_KEYS, *MODEL_FAMILY_KEYS, "tie_embeddings", "preset", "module")
"""Every key of a ``models:`` entry: ``preset`` names a shape of scalelab.registries.presets (the entry's own
keys override it), ``module`` the user's own model (``pkg.mod:build``)."""


def model_entry(name: str, entry: dict | None) -> dict:
    """A ``models:`` entry as ModelConfig keys: its preset's shape (scalelab.registries.presets) under its own
    keys; a family whose head is untied by default (llama) is untied unless the entry or its preset ties it.
    Raises ConfigError naming the key."""
    entry = dict(entry or {})
    unknown = set(entry) - set(MODEL_ENTRY_KEYS)
    if unknown:
        raise ConfigError(f"models.{name}: unknown key(s) {sorted(unknown)}; a models: entry sets "
                          f"{', '.join(MODEL_ENTRY_KEYS)} (seq_len stays in model:)",
                          key=("models", name, sorted(unknown)[0]))
    shape, preset_tie = {}, None
    if "preset" in entry:
        from scalelab.registries.presets import PRESETS

        preset = entry.pop("preset")
        if preset not in PRESETS:
            raise ConfigError(f"models.{name}.preset={preset!r} is not a preset: {', '.join(PRESETS)}",
                              key=("models", name, "preset"))
        preset_tie = PRESETS[preset].shape.get("tie_embeddings")
        shape = {k: v for k, v in PRESETS[preset].shape.items() if k not in ("vocab_size", "seq_len", "tie_embeddings")}
    shape.update(entry)
    record = FAMILIES.get(shape.get("family", DEFAULT_FAMILY))  # an unknown name is the schema check's to report
    if record is not None and record.untied_head and "tie_embeddings" not in entry:
        # untied unless the entry or its preset ties it (Llama 3.2 1B, 3B): never model:'s GPT-2 default
        shape["tie_embeddings"] = bool(preset_tie)
    return shape


def model_config(config: dict, vocab_size: int = 256, name: str = "base") -> ModelConfig:
    """The model of a sweep point: ``model:`` itself for the model axis's default name 'base', or
    ``model:`` with the keys of ``models.<name>`` (model_entry) over it."""
    shape = {}
    if name != "base":
        models = section(config, "models")
        if name not in models:
            raise ConfigError(f"sweep.model={name!r} is not 'base' (the model: section) or a name of the "
                              f"models: table ({', '.join(sorted(models)) or 'empty'})")
        shape = model_entry(name, models[name])
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
    runs_per_job: int = _default("cluster", "runs_per_job")
    """SLURM: one-node training runs of one world size packed this many to a submission (Snakemake job groups)."""


def cluster_config(config: dict) -> ClusterConfig:
    return _build(ClusterConfig, section(config, "cluster"), "cluster")


def config_hash(config: dict) -> str:
    """Stable short hash of a (validated) config, recorded in every run's provenance."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
