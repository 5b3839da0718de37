"""The model a forecast is about, from the command line: a preset (--model), a parameter count (--params,
where the command needs no shape), the shape flags, or a scalelab config file (--config) read as the
workflow reads its model: ``model:``, the ``models:`` table (families and their own keys, presets, a user's
module) and ``sweep.model``. Every answer names the model it is about (``described``).

A config file's model:
- ``--config FILE --model NAME`` takes ``models.NAME`` (or ``base``: ``model:`` itself);
- family keys written in ``model:`` itself (family, n_kv_heads, ffn_dim, rope_base, preset) make that the
  model, as a one-model file is naturally written;
- else ``sweep.model`` where it names one model; where it names several, or leaves a non-empty ``models:``
  table out, the file does not say which: an error lists the names (never the default, silently).
``tie_embeddings`` written in ``model:`` holds for a Llama too (Llama 3.2 1B and 3B tie their heads); unwritten,
a preset's own, else the family's default (GPT-2 tied, Llama untied).
"""
from __future__ import annotations

from pathlib import Path

from scalelab.config import MODEL_FAMILY_KEYS, ConfigError, ModelConfig, model_config
from scalelab.forecast.inputs import EstimateError, ModelChoice, count, positive, positive_whole
from scalelab.formulas import flops
from scalelab.registries.families import DEFAULT_FAMILY, FAMILIES
from scalelab.registries.presets import PRESETS

IN_MODEL_SECTION = (*MODEL_FAMILY_KEYS, "preset")
"""Keys a forecast reads from ``model:`` although the workflow's ``model:`` takes them in a ``models:`` entry."""
_OWN = "model"
"""The name ``model:``'s own family keys are checked under (its messages then read ``model.KEY``)."""


def model_flags(p, params: bool = True) -> None:
    """The model flags every command that takes a model shares (estimate's, scalelab plan's): read by
    model_from_args. ``params``: whether a bare parameter count answers the command."""
    g = p.add_argument_group("model (either --model, or --params, or the shape, or --config)" if params else
                             "model (either --model, or the shape, or --config)")
    g.add_argument("--model", metavar="NAME", help="a preset shape by name (scalelab estimate models lists them: "
                   "gpt2 ... llama3-70b, llama3.2-1b, mistral-7b); --seq, --vocab and --untied override its context, "
                   "vocabulary and head; with --config, the name of its models: entry (or base)")
    if params:
        g.add_argument("--params", type=count, help="parameter count: 1.3B, 350M, 7.5e9 (K, M, B, T as printed)")
    g.add_argument("--layers", type=positive_whole, help="transformer blocks")
    g.add_argument("--d-model", type=positive_whole, help="residual width")
    g.add_argument("--heads", type=positive_whole, help="attention heads (default d_model / 64)")
    g.add_argument("--vocab", type=positive_whole, help="vocabulary size")
    g.add_argument("--seq", type=positive_whole, help="sequence length")
    g.add_argument("--untied", action="store_true", help="output head not tied to the embedding")
    g.add_argument("--family", choices=list(FAMILIES), default=None,
                   help="with the shape flags: the model family (default gpt2; llama: RMSNorm, SwiGLU, RoPE, grouped-query "
                        "attention, the head tied unless --untied)")
    g.add_argument("--kv-heads", type=positive_whole, default=None, help="with --family llama: key/value heads (default: "
                   "--heads)")
    g.add_argument("--ffn-dim", type=positive_whole, default=None, help="with --family llama: the SwiGLU width (default: "
                   "8/3 d_model rounded up to 256)")
    g.add_argument("--config", metavar="FILE", help="read the model from a scalelab config file as the workflow does "
                   "(model:, models: with family keys, presets or a module, sweep.model; --model NAME picks an entry); "
                   "vocab from --vocab, a preset's, else 256")


def model_from_args(args) -> tuple[int, ModelConfig | None]:
    """(parameter count, model config where given by shape, preset or config file)."""
    params = getattr(args, "params", None)
    if args.config:
        if params is not None or any(v is not None for v in (args.layers, args.d_model, args.heads)):
            raise EstimateError("give the model either as --config FILE (--model NAME picks its entry), or as a preset, "
                                "--params or the shape, not several")
        cfg, _ = config_model(args.config, args.model, args.vocab, args.seq)
        return flops.param_count(cfg), cfg
    if args.model:
        if params is not None or any(v is not None for v in (args.layers, args.d_model, args.heads, getattr(args, "family", None))):
            raise EstimateError("give the model either as --model NAME, or as --params, or as the shape, not several")
        if args.model not in PRESETS:
            raise EstimateError(f"--model {args.model!r} is not a preset: {', '.join(PRESETS)} (scalelab estimate models)")
        # --seq and --vocab override the preset's context and vocabulary (a preset names both: the flag wins)
        overrides = {k: v for k, v in (("seq_len", args.seq), ("vocab_size", args.vocab)) if v is not None}
        if getattr(args, "untied", False):
            overrides["tie_embeddings"] = False
        cfg = ModelConfig(**{**PRESETS[args.model].shape, **overrides})
        return flops.param_count(cfg), cfg
    shape = [args.layers, args.d_model, args.vocab, args.seq]
    if params is not None:
        if any(v is not None for v in shape):
            raise EstimateError("give the model either as --params or as --layers/--d-model/--vocab/--seq, not both")
        n_params = positive("params", params)
        if n_params < 1000:  # --params 1.3 meaning billions: int() made it 1 parameter, and claim's MFU 0.0%
            raise EstimateError(f"--params {n_params:g} is {n_params:g} parameters, a count: write {n_params:g}B for "
                                f"{n_params:g} billion (or {n_params:g}e9)")
        return int(n_params), None
    if any(v is None for v in shape):
        raise EstimateError("give the model as --model NAME, --params N, --config FILE, or all of --layers, --d-model, "
                            "--vocab and --seq" if hasattr(args, "params") else
                            "give the model's shape: --model NAME, --config FILE, or all of --layers, --d-model, --vocab "
                            "and --seq")
    return _shape_model(args)


def _shape_model(args) -> tuple[int, ModelConfig]:
    """The model of the shape flags, its family's keys included; EstimateError naming the flag its family refuses."""
    heads = args.heads or max(1, args.d_model // 64)
    if args.d_model % heads:
        raise EstimateError(f"--heads {heads} does not divide --d-model {args.d_model}")
    name = getattr(args, "family", None) or DEFAULT_FAMILY
    own = {k: v for k, v in (("n_kv_heads", getattr(args, "kv_heads", None)), ("ffn_dim", getattr(args, "ffn_dim", None)))
           if v is not None}
    if own and name != "llama":
        raise EstimateError(f"--{next(iter(own)).replace('n_', '').replace('_', '-')} needs --family llama")
    cfg = ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=heads, seq_len=args.seq,
                      tie_embeddings=not args.untied, vocab_size=args.vocab, family=name, **own)
    problem = FAMILIES[name].shape_problem(cfg)
    if problem:
        raise EstimateError(problem[1].replace("n_kv_heads=", "--kv-heads ").replace("n_heads=", "--heads "))
    return flops.param_count(cfg), cfg


def described(args) -> dict:
    """What a result says about the model it is about: the preset or the config entry, with its family."""
    if getattr(args, "config", None):
        cfg, name = config_model(args.config, args.model, args.vocab, args.seq)
        return {"model": f"{name} of {args.config}", "family": cfg.family, "shape_text": shape_text(cfg)}
    if not args.model:
        return {}
    return {"model": args.model, "family": PRESETS[args.model].shape["family"]}


def _read(path: str) -> dict:
    from scalelab.config.reading import read_yaml

    if not Path(path).is_file():
        raise EstimateError(f"--config {path}: no such file")
    try:
        content = read_yaml(path)
    except (ConfigError, OSError, UnicodeDecodeError) as err:
        raise EstimateError(f"--config {path}: {err}") from None
    if not isinstance(content, dict | None):
        raise EstimateError(f"--config {path}: a config file holds keys at top level, got {type(content).__name__}")
    return content or {}


def _chosen(config: dict, path: str, name: str | None) -> str:
    """The model of the file a forecast is about (the module doc's rule)."""
    models = config.get("models") or {}
    if name is not None:
        if name != "base" and name not in models:
            raise EstimateError(f"--model {name!r}: {path} has no models: entry of that name (it has: "
                                f"{', '.join(['base', *models])})")
        return name
    sweep = config.get("sweep") or {}
    names = sweep.get("model") if isinstance(sweep, dict) else None
    if isinstance(names, list) and len(names) == 1:
        return str(names[0])
    if isinstance(names, list) and names:
        raise EstimateError(f"--config {path}: sweep.model names {len(names)} models ({', '.join(map(str, names))}); "
                            "pick one with --model NAME")
    if models:
        raise EstimateError(f"--config {path}: its models: table has {', '.join(models)} and sweep.model does not say "
                            "which to forecast; pick one with --model NAME (base: the model: section)")
    return "base"


def _dataset_vocab(raw: dict) -> int:
    """The vocabulary a run of the file would have where the file says it: a BPE's size, a tokenized source's
    stated vocab_size; else the byte tokenizer's 256 (a run reads it from the prepared data's meta.json)."""
    dataset = raw.get("dataset") if isinstance(raw.get("dataset"), dict) else {}
    if dataset.get("vocab_size"):
        return int(dataset["vocab_size"])
    if dataset.get("tokenizer") == "bpe" and dataset.get("bpe_vocab_size"):
        return int(dataset["bpe_vocab_size"])
    return 256


def shape_text(cfg: ModelConfig) -> str:
    """A model's shape in one line, as the forecasts print what they are about."""
    kv = f" ({cfg.n_kv_heads} key/value)" if cfg.n_kv_heads and cfg.n_kv_heads != cfg.n_heads else ""
    ffn = f", ffn {cfg.ffn_dim}" if cfg.ffn_dim else ""
    return (f"{cfg.family}, {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads{kv}{ffn}, vocab "
            f"{cfg.vocab_size}, seq {cfg.seq_len}, {'tied' if cfg.tie_embeddings else 'untied'} head")


def config_model(path: str, name: str | None, vocab: int | None, seq: int | None) -> tuple[ModelConfig, str]:
    """(the model of a config file, its name there); EstimateError naming the key where the file cannot give one."""
    from scalelab.planning.validation import validate_config

    raw = _read(path)
    model = raw.get("model") or {}
    if not isinstance(model, dict):
        raise EstimateError(f"--config {path}: model: must be a mapping, got {model!r}")
    own = {k: model[k] for k in IN_MODEL_SECTION if k in model}
    models = raw.get("models") or {}
    chosen = _OWN if own else _chosen(raw, path, name)
    if own:
        models = {**(models if isinstance(models, dict) else {}), _OWN: own}
    entry = (models.get(chosen) or {}) if chosen != "base" and isinstance(models, dict) else {}
    module = entry.get("module") if isinstance(entry, dict) else None
    if module:  # refused before validation, which would import it
        raise EstimateError(f"--config {path}: {chosen} is the user's module {module!r}, whose parameters and "
                            "activations scalelab has no formula for; forecast it by a family's shape (models: with "
                            "family and its keys)")
    part = {"model": {k: v for k, v in model.items() if k not in own}, "models": models, "sweep": {"model": [chosen]}}
    try:
        config = validate_config(part, base_dir=Path(path).parent, files=[path])
        cfg = model_config(config, vocab_size=vocab or 256, name=chosen)
    except ConfigError as err:
        lines = getattr(err, "problems", None) or [str(err)]
        raise EstimateError(f"--config {path}: " + "; ".join(lines).replace(f"models.{_OWN}.", "model.")) from None
    preset = PRESETS.get(entry.get("preset")) if isinstance(entry, dict) else None
    fixed = {}
    if preset is not None:  # the preset's vocabulary and context, where the command line does not give them
        fixed["vocab_size"] = preset.shape["vocab_size"]
        if "seq_len" not in model:
            fixed["seq_len"] = preset.shape["seq_len"]
    if "tie_embeddings" in model and chosen in (_OWN, "base"):  # the model: section's own head, written
        fixed["tie_embeddings"] = bool(model["tie_embeddings"])
    # an entry's head is the workflow's (config.model_entry: its own tie_embeddings, else its preset's for a family
    # untied by default, else model:'s), so that a forecast prices the model a sweep of the same file trains
    if vocab is None and preset is None:
        fixed["vocab_size"] = _dataset_vocab(raw)
    fixed.update({k: v for k, v in (("vocab_size", vocab), ("seq_len", seq)) if v is not None})
    cfg = ModelConfig(**{**cfg.__dict__, **fixed})
    return cfg, ("the model: section" if chosen in (_OWN, "base") else f"models.{chosen}")


def model_from_flags(args) -> ModelChoice:
    """The model flags (model_flags) as a ModelChoice."""
    n_params, cfg = model_from_args(args)
    return ModelChoice(n_params, cfg, described(args))
