"""The one validation path of a config (the Snakefile, ``scalelab check-config`` and
load_config): keys of earlier layouts named, numbers checked (finite; no float for an integer
key; ``3e-4`` read as the number YAML 1.2 reads), the schema applied (``config.schema.yaml``:
types, enums, unknown keys; defaults filled in), then the cross-field rules the schema cannot
express (batch divisibility, corpus paths, head count, results_dir, the sweep's points and launch
plans, the GPU layout). Every problem is found before any is reported, and raised together as one
ConfigProblems, one line each, naming the file and line that set the key, the key and the value
(``my.yaml:7: model.n_layer: unknown key; did you mean n_layers?``), before any job runs."""
from __future__ import annotations

import difflib
import importlib.util
import math
import re
import stat
from importlib import resources
from pathlib import Path

from jsonschema import validators
from jsonschema.exceptions import ValidationError
from snakemake.exceptions import WorkflowError
from snakemake.utils import update_config, validate

from scalelab.config import SCHEMA, SCHEMA_FILE, ConfigError, ConfigProblems, dataset_config, model_config, section, train_config
from scalelab.config.reading import locate, read_yaml, shown
from scalelab.planning.placement import check_gpu_layout
from scalelab.planning.run_plan import run_plan
from scalelab.planning.sweep import sweep_points

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


SNAKEMAKE_PATH_MARKUP = re.compile(r"[{}<>]")
"""What Snakemake reads in a rule's input or output path: {name} a wildcard, <name> a path variable."""


def snakemake_path_problem(key: tuple, value: str) -> ConfigError | None:
    """A path that becomes a rule's input or output must hold none of Snakemake's markup: it would stop the
    workflow after the check, with Snakemake's own exception."""
    found = SNAKEMAKE_PATH_MARKUP.search(str(value))
    if not found:
        return None
    return ConfigError(f"{'.'.join(key)}={value!r} holds {found.group()!r}, which Snakemake reads in a path as a "
                       "wildcard ({name}) or a path variable (<name>); name a path without {, }, < and >", key=key)


def check_results_dir(config: dict, base_dir: str | Path = ".") -> None:
    """results_dir must be a folder or not exist yet, under a path made of folders, and a path Snakemake can take."""
    value = config.get("results_dir", SCHEMA["properties"]["results_dir"]["default"])
    if problem := snakemake_path_problem(("results_dir",), value):
        raise problem
    results = Path(base_dir, value)
    for existing in (results, *results.parents):
        if existing.exists():
            if not existing.is_dir():
                what = f"results_dir={value!r}" + ("" if existing == results else f": {existing}")
                raise ConfigError(f"{what} is {file_kind(existing)}, not a folder; "
                                  "name a folder (it is created if missing)", key=("results_dir",))
            return


def _check_dataset(config: dict, base_dir: str | Path) -> None:
    dataset = dataset_config(config)
    if problem := snakemake_path_problem(("dataset", "path"), dataset.path or ""):  # the name's pattern keeps it plain
        raise problem
    if dataset.name.startswith("."):
        raise ConfigError(
            f"dataset.name={dataset.name!r} starts with a dot: '.' and '..' would write the data into "
            "<results_dir>/data or <results_dir> itself, other dot names are hidden folders; "
            "start it with a letter, digit, '_' or '-'", key=("dataset", "name"))
    if dataset.source in ("text", "tokenized"):
        if not dataset.path:
            raise ConfigError(f"dataset.path is required when dataset.source={dataset.source!r}",
                              key=("dataset", "source"))
        corpus = Path(base_dir, dataset.path)
        if not corpus.exists():
            raise ConfigError(f"dataset.path={dataset.path!r} does not exist", key=("dataset", "path"))
        if not (corpus.is_file() or corpus.is_dir()):
            raise ConfigError(f"dataset.path={dataset.path!r} is {file_kind(corpus)}, a special file: "
                              "not a regular file or folder to read a corpus from", key=("dataset", "path"))
        ids = {"uint16": 1 << 16, "uint32": 1 << 32}[dataset.tokenized_dtype]
        if dataset.source == "tokenized" and dataset.vocab_size is not None and dataset.vocab_size > ids:
            raise ConfigError(
                f"dataset.vocab_size={dataset.vocab_size} does not fit dataset.tokenized_dtype="
                f"{dataset.tokenized_dtype!r}, whose ids stop at {ids - 1:,}: a wrong dtype or a wrong vocab_size",
                key=("dataset", "vocab_size"))
    elif dataset.path:
        raise ConfigError(
            f"dataset.path={dataset.path!r} is set but dataset.source='synthetic' ignores it; "
            "set dataset.source to 'text' or 'tokenized', or remove the path", key=("dataset", "path"))


def _check_models(config: dict, base_dir: str | Path) -> None:
    model = model_config(config)
    if model.d_model % model.n_heads:
        raise ConfigError(f"model.n_heads={model.n_heads} does not divide model.d_model={model.d_model}",
                          key=("model", "n_heads"))
    if "base" in section(config, "models"):
        raise ConfigError("models.base: 'base' names the model: section itself (the model axis's default); "
                          "give the shape another name", key=("models", "base"))
    found = []  # every model's problem at once: a sweep of several user modules names each that fails
    for name in section(config, "sweep").get("model", ["base"]):
        shape = model_config(config, name=name)
        try:
            if shape.d_model % shape.n_heads:
                raise ConfigError(f"models.{name}: n_heads={shape.n_heads} does not divide d_model={shape.d_model}",
                                  key=("models", name))
            if name != "base":
                _check_model_entry(name, section(config, "models")[name] or {}, shape)
        except ConfigError as err:
            found.append(err)
    if len(found) == 1:
        raise found[0]
    if found:
        raise ConfigProblems.of(found)


def module_problems(config: dict, flawed: set[str]) -> list[ConfigError]:
    """The sweep's user modules tried as the launcher will use them (imported, built, counted: probe_modules), all
    in one throwaway process; a model whose entry the static checks already refused (``flawed``) is not tried."""
    modules = {}
    for name in section(config, "sweep").get("model", ["base"]):
        if name not in flawed and (shape := model_config(config, name=name)).module:
            modules[name] = shape
    if not modules:
        return []
    return [ConfigError(f"models.{name}.module={shape.module!r} cannot be trained: {problem}", key=("models", name, "module"))
            for (name, shape), problem in zip(modules.items(), probe_modules(list(modules.values()))) if problem]


MODULE_PROBE_TIMEOUT_S = 120.0
"""How long the users' modules may take to import, build and count on the meta device, in the config check."""
_PROBED: dict[str, str | None] = {}  # one probe per module and shape in a process (Snakemake validates more than once)


def probe_modules(shapes: list) -> list[str | None]:
    """Why each user's module of these shapes cannot be built and counted (scalelab.run.module_probe, all in
    one throwaway process: an import that raises, exits or hangs stops nothing here); None where it can."""
    import dataclasses
    import json
    import os
    import subprocess
    import sys

    given = [json.dumps(dataclasses.asdict(shape), sort_keys=True) for shape in shapes]
    todo = list(dict.fromkeys(g for g in given if g not in _PROBED))
    if todo:
        # the modules were found on this process's path: the probe gets the same path
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            done = subprocess.run([sys.executable, "-m", "scalelab.run.module_probe"], input=f"[{', '.join(todo)}]",
                                  env=env, capture_output=True, text=True, timeout=MODULE_PROBE_TIMEOUT_S)
            answers, ended = [json.loads(line)["problem"] for line in done.stdout.splitlines() if line.startswith('{"problem"')], done
        except subprocess.TimeoutExpired:
            answers, ended = [], None
        for i, shape in enumerate(todo):
            if i < len(answers):
                _PROBED[shape] = answers[i]
            elif ended is None:
                _PROBED[shape] = f"importing, building and counting it took over {MODULE_PROBE_TIMEOUT_S:.0f} s"
            else:  # this module ended the probe itself (os._exit, a crash): its last words
                tail = " ".join((ended.stderr.strip().splitlines() or ["no output"])[-1].split())[:300]
                _PROBED[shape] = f"the process trying it ended with exit status {ended.returncode}: {tail}"
                break  # the modules after it were not tried: the next check tries them
    return [_PROBED.get(g, "not tried: a module before it ended the check's process") for g in given]


def _check_model_entry(name: str, entry: dict, shape) -> None:
    """A models: entry's family keys: a family's own keys only with that family, a shape the family
    can build (its record's shape_problem: for llama a grouped-query split that divides and RoPE's even
    head width), a module callable that exists."""
    from scalelab.config import MODEL_FAMILY_KEYS
    from scalelab.registries.families import FAMILIES, OWN_KEYS, family

    if shape.module:
        given = sorted(k for k in MODEL_FAMILY_KEYS if k in entry) + (["preset"] if "preset" in entry else [])
        if given:
            raise ConfigError(f"models.{name}: {given[0]} does not apply to module={shape.module!r} (the user's module "
                              "is its own model; it reads n_layers, d_model, n_heads as it likes)",
                              key=("models", name, given[0]))
        module_name = shape.module.partition(":")[0]
        try:
            found = importlib.util.find_spec(module_name)
        except (ImportError, ValueError) as err:
            found, why = None, f": {err}"
        else:
            why = ""
        if found is None:
            raise ConfigError(f"models.{name}.module={shape.module!r}: no module {module_name!r} on the Python path{why}",
                              key=("models", name, "module"))
        return
    record = family(shape.family)
    given = [k for k in OWN_KEYS if k in entry and k not in record.own_keys]
    if given:
        owners = [f.name for f in FAMILIES.values() if given[0] in f.own_keys]
        raise ConfigError(f"models.{name}.{given[0]}={entry[given[0]]!r} applies to family {' or '.join(owners)}; this "
                          f"entry's family is {shape.family} (set family: {owners[0]})", key=("models", name, given[0]))
    problem = record.shape_problem(shape)
    if problem:
        key, message = problem  # "key=value ..." reads as models.<name>.key=value
        where = f"models.{name}." if message.startswith(f"{key}=") else f"models.{name}: "
        raise ConfigError(where + message, key=("models", name, key))


def _check_tf32(config: dict, base_dir: str | Path) -> None:
    train = train_config(config)
    if train.tf32 and train.device == "cpu":
        raise ConfigError("train.tf32=true asks for TF32 GPU matmuls, but train.device='cpu'; "
                          "set train.tf32: false or train.device: cuda/auto", key=("train", "tf32"))


def _check_warmup(config: dict, base_dir: str | Path) -> None:
    train = train_config(config)
    if train.warmup_steps >= train.steps:
        raise ConfigError(f"train.warmup_steps={train.warmup_steps} leaves no measured step "
                          f"(train.steps={train.steps})", key=("train", "warmup_steps"))


def _check_profile(config: dict, base_dir: str | Path) -> None:
    train = train_config(config)
    if train.profile is not None:
        first, last = train.profile
        if not first <= last < train.steps:
            raise ConfigError(f"train.profile={list(train.profile)} must be [first, last] steps with first <= last < "
                              f"train.steps={train.steps} (the steps traced, inclusive)", key=("train", "profile"))
        traced = len(set(range(first, last + 1)) & set(range(train.warmup_steps, train.steps)))
        if not train.measure_s and traced >= train.steps - train.warmup_steps:
            raise ConfigError(f"train.profile={list(train.profile)} traces every measured step (after train.warmup_steps="
                              f"{train.warmup_steps}), which the timings leave out: trace fewer, or set train.measure_s",
                              key=("train", "profile"))


def _check_plans(config: dict, base_dir: str | Path) -> None:
    for point in sweep_points(config):
        run_plan(config, point)  # ConfigError where a point cannot be laid out
    check_gpu_layout(config)


# The cross-field checks, each independent of the others' outcome: every one runs, and the first
# problem of each is reported (within one, a later rule may assume the earlier held).
def _check_durations(config: dict, base_dir: str | Path) -> None:
    """A measurement window that cannot end inside the run's time limit: every run would end `timeout`."""
    from scalelab.config import HALF_BATCH_SHARE

    train = train_config(config)
    window = (1 + HALF_BATCH_SHARE) * train.measure_s
    if window >= train.run_timeout_s:
        raise ConfigError(f"train.measure_s={train.measure_s:g} makes a run time steps for up to {window:g} s past "
                          f"train.steps ({train.measure_s:g} s at its batch, {HALF_BATCH_SHARE * train.measure_s:g} s at "
                          "half of it), not less than "
                          f"train.run_timeout_s={train.run_timeout_s:g}: every run would time out; lower measure_s "
                          "or raise run_timeout_s", key=("train", "measure_s"))


CROSS_FIELD_CHECKS = (check_results_dir, _check_durations, _check_dataset, _check_models, _check_tf32, _check_warmup, _check_profile,
                      _check_plans)


def _problems_of(checks, config: dict, base_dir: str | Path) -> list[ConfigError]:
    found = []
    for check in checks:
        try:
            check(config, base_dir)
        except ConfigProblems as err:
            found.extend(err.errors or [ConfigError(line) for line in err.problems])
        except ConfigError as err:
            found.append(err)
    return found


def check_config(config: dict, base_dir: str | Path = ".") -> None:
    """Cross-field checks after schema validation. Raises ConfigProblems (a ConfigError), one line
    per problem, each naming key and value."""
    _raise(_problems_of(CROSS_FIELD_CHECKS, config, base_dir))


def _moved_key_problems(config: dict) -> list[ConfigError]:
    return [ConfigError(f"{name}.{key} has moved to {new_home}", key=(name, key))
            for (name, key), new_home in MOVED_KEYS.items() if isinstance(config.get(name), dict) and key in config[name]]


def check_moved_keys(config: dict) -> None:
    """Name a key of an earlier layout and where it went (the schema would only say 'unknown')."""
    _raise(_moved_key_problems(config))


def _dotted(key: tuple) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in key).lstrip(".")


def _types(schema: dict) -> list[str]:
    types = schema.get("type", [])
    return [types] if isinstance(types, str) else list(types)


# A number in exponent form without a decimal point or without an exponent sign (3e-4, 1e5, 1.5e3):
# YAML 1.2 reads it as a number, PyYAML (YAML 1.1, and so Snakemake) as text. The guide's config
# section states the rule: where the schema takes a number, scalelab reads it as YAML 1.2 does.
_EXPONENT_NUMBER = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+")


def read_exponent_numbers(config, schema: dict | None = None) -> None:
    """In place: a text value of a key the schema takes a number for (number or integer) that
    YAML 1.2 reads as a number (``3e-4``) becomes that float. An integer key then refuses it like
    any float (``steps: 1e3``: write 1000)."""
    schema = SCHEMA if schema is None else schema
    if isinstance(config, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for name, value in config.items():
            inner = properties.get(name, extra if isinstance(extra, dict) else {})
            if isinstance(value, str) and {"number", "integer"} & set(_types(inner)) \
                    and _EXPONENT_NUMBER.fullmatch(value.strip()):
                config[name] = float(value)
            else:
                read_exponent_numbers(value, inner)
    elif isinstance(config, list):
        items = schema.get("items", {})
        for i, value in enumerate(config):
            if isinstance(value, str) and {"number", "integer"} & set(_types(items)) \
                    and _EXPONENT_NUMBER.fullmatch(value.strip()):
                config[i] = float(value)
            else:
                read_exponent_numbers(value, items)


def _number_problems(config, schema: dict, key: tuple) -> list[ConfigError]:
    if isinstance(config, float):
        name = _dotted(key)
        if not math.isfinite(config):
            return [ConfigError(f"{name}={config!r} is not a finite number", key=key)]
        types = _types(schema)
        if "integer" in types and "number" not in types:
            hint = f" (write {int(config)})" if config.is_integer() else ""
            return [ConfigError(f"{name}={config!r} must be an integer, written without a decimal point "
                                f"or exponent{hint}", key=key)]
    elif isinstance(config, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return [problem for name, value in config.items()
                for problem in _number_problems(value, properties.get(name, extra if isinstance(extra, dict) else {}),
                                                (*key, name))]
    elif isinstance(config, list):
        return [problem for i, value in enumerate(config)
                for problem in _number_problems(value, schema.get("items", {}), (*key, i))]
    return []


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "text", "boolean": "true or false",
               "array": "a list", "object": "a mapping of keys", "null": "null"}


def _close(word, choices) -> str:
    """'; did you mean X?' for the closest of choices (difflib), or ''."""
    if not isinstance(word, str):
        return ""
    match = difflib.get_close_matches(word, [str(c) for c in choices], n=1)
    return f"; did you mean {match[0]}?" if match else ""


def _schema_problems(config: dict) -> list[ConfigError]:
    """Every schema violation, one ConfigError each: an unknown key with the closest known one,
    a wrong type in words, jsonschema's own text otherwise."""
    validator = validators.validator_for(SCHEMA)(SCHEMA)
    found = []
    for err in validator.iter_errors(config):
        at = tuple(err.absolute_path)
        name = _dotted(at) or "config"
        if err.validator == "additionalProperties" and err.validator_value is False and isinstance(err.instance, dict):
            known = list(err.schema.get("properties", {}))
            for extra in (k for k in err.instance if k not in known):
                hint = _close(extra, known) or f"; {name if at else 'a config'} takes {', '.join(known)}"
                found.append(ConfigError(f"{_dotted((*at, extra))}: unknown key{hint}", key=(*at, extra)))
        elif err.validator == "type":
            hint = ""
            if isinstance(err.instance, str):
                try:
                    float(err.instance)
                    hint = " (it is quoted, so YAML reads text: write it without quotes)"
                except ValueError:
                    pass
            wanted = " or ".join(_TYPE_WORDS.get(t, t) for t in _types(err.schema))
            found.append(ConfigError(f"{name}: {err.instance!r} is not {wanted}{hint}", key=at))
        elif err.validator == "enum":
            found.append(ConfigError(f"{name}: {err.message}{_close(err.instance, err.validator_value)}", key=at))
        else:
            found.append(ConfigError(f"{name}: {err.message}", key=at))
    return found


# A message that starts with a key path ("sweep.world_size=12 spans ...", "models.ac: ..."), from a
# check that gives no key: the path locates it all the same.
_LEADING_KEY = re.compile(r"([A-Za-z_]\w*(?:\.\w+)+)(?:\[(\d+)\])?(?=[=:\s])")


def _key_of(err: ConfigError) -> tuple:
    if getattr(err, "key", ()):
        return err.key
    match = _LEADING_KEY.match(str(err))
    if not match:
        return ()
    key = tuple(match.group(1).split("."))
    return (*key, int(match.group(2))) if match.group(2) else key


def _raise(problems: list[ConfigError], files: list | None = None) -> None:
    """Raise ConfigProblems of these problems, one line each, located in the files where a file sets
    the key (sorted by file and line; one line per key), or return when there are none."""
    if not problems:
        return
    names = [shown(f) for f in files or ()]
    located, seen = [], set()
    for problem in problems:
        text, key = str(problem), _key_of(problem)
        if text in seen:
            continue
        seen.add(text)
        where = locate(key, files) if files and key else None
        if where:
            file, line = where.rsplit(":", 1)
            order = (0, names.index(file) if file in names else len(names), int(line))
        else:
            order = (1, 0, 0)
        located.append((order, f"{where}: {text}" if where else text))
    raise ConfigProblems([line for _, line in sorted(located, key=lambda item: item[0])])


def validate_config(config: dict, base_dir: str | Path = ".", files: list | None = None, try_modules: bool = True) -> dict:
    """The one validation path (the Snakefile and load_config): keys of earlier layouts named,
    exponent numbers read (3e-4), numbers checked (finite; no float for an integer key), the schema
    applied (types, enums, unknown keys; defaults filled in place), then the cross-field checks.
    ``files``: the config files merged into ``config``, in order (the last one that sets a key
    wins), to name the file and line of each problem. Raises ConfigProblems (a ConfigError) holding
    every problem found, one line each; returns the config. ``try_modules``: the users' model modules are also
    tried in a throwaway process (module_problems, ~2 s), as a process that plans the runs needs; one that only reads
    the sweep (a SLURM job parsing the workflow again, `scalelab status`) leaves them to the launcher."""
    read_exponent_numbers(config)
    problems = _moved_key_problems(config) + _number_problems(config, SCHEMA, ())
    # One line per key: a moved key is also unknown to the schema, 2.5 at an integer key also not
    # of its type.
    named = {problem.key for problem in problems}
    problems += [p for p in _schema_problems(config) if p.key not in named]
    _raise(problems, files)
    try:
        # Snakemake's validate fills the defaults in; it wants a file path: the package's own file
        # where the package is on disk, a temporary copy where it is zipped.
        with resources.as_file(SCHEMA_FILE) as schema_path:
            validate(config, str(schema_path), set_default=True)
    except (ValidationError, WorkflowError) as err:  # the schema passed above: only a broken schema file
        raise ConfigError(str(err)) from None
    problems = _problems_of(CROSS_FIELD_CHECKS, config, base_dir)
    if try_modules:
        problems += module_problems(config, {p.key[1] for p in problems if len(p.key) > 1 and p.key[0] == "models"})
    _raise(problems, files)
    return config


def validation_message(err: ConfigError) -> str:
    """What the Snakefile and the CLI print: 'invalid config: <the problem>' for one, a count and one
    line per problem for several."""
    lines = getattr(err, "problems", None) or [str(err)]
    if len(lines) == 1:
        return f"invalid config: {lines[0]}"
    return f"invalid config, {len(lines)} problems:\n" + "\n".join(lines)


def load_configs(files: list, base_dir: str | Path, try_modules: bool = True) -> dict:
    """Config files read and merged in order, as Snakemake merges ``configfile:`` and each ``--configfile`` (the last
    that sets a key wins), then validated (validate_config). Raises ConfigProblems naming every file that is not YAML
    or holds no keys at top level, all at once, before any validation."""
    config: dict = {}
    unreadable = []
    for path in files:
        try:
            content = read_yaml(path)
        except ConfigError as err:
            unreadable.append(str(err))
            continue
        if not isinstance(content, dict | None):
            unreadable.append(f"{path}: a config file holds keys at top level, got {type(content).__name__}")
            continue
        update_config(config, content or {})
    if unreadable:
        raise ConfigProblems(unreadable)
    return validate_config(config, base_dir=base_dir, files=files, try_modules=try_modules)


def load_config(path: str | Path, try_modules: bool = True) -> dict:
    """Read a config YAML and validate it (load_configs); paths in it are relative to its folder."""
    return load_configs([Path(path)], base_dir=Path(path).parent, try_modules=try_modules)
