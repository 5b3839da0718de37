"""The one validation path of a config (the Snakefile, ``scalelab check-config`` and
load_config): keys of earlier layouts named, numbers checked (finite; no float for an integer
key), the schema applied (``config.schema.yaml``: types, enums, unknown keys; defaults filled
in), then the cross-field rules the schema cannot express (batch divisibility, corpus paths,
head count, results_dir, the sweep's points and launch plans, the GPU layout). Every check
raises ConfigError naming the key and the bad value, before any job runs."""
from __future__ import annotations

import math
import stat
from importlib import resources
from pathlib import Path

from jsonschema.exceptions import ValidationError
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from scalelab.config import SCHEMA, SCHEMA_FILE, ConfigError, dataset_config, model_config, section, train_config
from scalelab.config.reading import read_yaml
from scalelab.placement import check_gpu_layout, launch_plan
from scalelab.sweep import sweep_points

# Keys of earlier config layouts, with where they went.
MOVED_KEYS = {("train", "micro_batch"): "sweep.micro_batch (a list, e.g. [null] or [1, 2, 4])"}


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
    value = config.get("results_dir", SCHEMA["properties"]["results_dir"]["default"])
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
    for point in sweep_points(config):
        launch_plan(config, point.world_size)
    check_gpu_layout(config)


def check_moved_keys(config: dict) -> None:
    """Name a key of an earlier layout and where it went (the schema would only say 'unknown')."""
    for (name, key), new_home in MOVED_KEYS.items():
        if key in (config.get(name) or {}):
            raise ConfigError(f"{name}.{key} has moved to {new_home}")


def check_numbers(config, schema: dict | None = None, key: str = "") -> None:
    """Every number finite (YAML reads .inf and .nan; the schema's minimum checks let NaN
    through), and a key the schema types integer given an int: 20.0 is refused, not coerced,
    so the config reads as what runs. Raises ConfigError naming key and value."""
    schema = SCHEMA if schema is None else schema
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


def validate_config(config: dict, base_dir: str | Path = ".") -> dict:
    """The one validation path (the Snakefile and load_config): keys of earlier layouts named,
    numbers checked (finite; no float for an integer key), the schema applied (types, enums,
    unknown keys; defaults filled in place), then the cross-field checks. Raises ConfigError
    naming key and value; returns the config."""
    check_moved_keys(config)
    check_numbers(config)
    try:
        # Snakemake's validate (defaults filled in, its error text) wants a file path: the
        # package's own file where the package is on disk, a temporary copy where it is zipped.
        with resources.as_file(SCHEMA_FILE) as schema_path:
            validate(config, str(schema_path), set_default=True)
    except (ValidationError, WorkflowError) as err:
        raise ConfigError(str(err)) from None
    check_config(config, base_dir=base_dir)
    return config


def load_config(path: str | Path) -> dict:
    """Read a config YAML and validate it (validate_config); paths in it are relative to its folder."""
    path = Path(path)
    return validate_config(read_yaml(path) or {}, base_dir=path.parent)
