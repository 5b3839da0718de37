"""Before a workflow retrains finished runs because a shipped default changed (a new release's config.yaml or
schema default), it stops and says so.

Snakemake reruns a run whose params (its results_depend_on: scalelab.planning.run_plan.result_params) changed. A
change the user made in their own config is what they asked for; a value that changed under them (upgrading in
place: the shipped ``train.measure_s`` went from 0 to 2) would retrain every finished run and overwrite its
measurements without a word. Each finished run recorded the values it trained with (its ``results_depend_on.json``,
scalelab.results.status.TRAINED_WITH): those are compared with what the workflow plans now.
"""
from __future__ import annotations

import json
from pathlib import Path

from scalelab.results.status import TRAINED_WITH

OPT_IN = ("planning", "retrain_changed_defaults")
"""The config key that lets a workflow retrain runs whose shipped defaults changed."""
COMPARED = ("model", "train", "layout", "comm_dtypes")
"""The parts of a run's params that come from the config (a pruned run's forecast stamp is the workflow's)."""


def _leaves(params: dict, prefix: str = "") -> dict[str, object]:
    """{'train.measure_s': 2, ...}: every value of the compared parts, by its dotted key."""
    out = {}
    for key, value in params.items():
        if not prefix and key not in COMPARED:
            continue
        dotted = f"{prefix}{key}"
        out.update(_leaves(value, f"{dotted}.") if isinstance(value, dict) and dotted != "train.peak_tflops" else {dotted: value})
    return out


def user_keys(configs: list[dict]) -> set[str]:
    """The dotted keys the user's own config files and --config set (every key, at every depth)."""
    keys: set[str] = set()

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            keys.add(f"{prefix}{key}")
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")

    for config in configs:
        walk(config or {}, "")
    return keys


def _set_by_user(key: str, mine: set[str]) -> bool:
    """A run param's key set by the user: train.* and layout keys by their config path; a model's shape by its
    section (model:, or its entry in models:)."""
    section, _, name = key.partition(".")
    if section == "model":
        return f"model.{name}" in mine or any(k.startswith("models.") and k.endswith(f".{name}") for k in mine)
    if section == "layout":
        return f"cluster.{name}" in mine
    return key in mine or section == "comm_dtypes"  # what a run gathers and reduces in follows its point


def changed_defaults(results_dir: str | Path, planned: dict[str, dict], mine: set[str]) -> dict[str, list[tuple[str, str, str]]]:
    """{run id: [(key, value then, value now), ...], each value as the config writes it} for every finished run that
    would be retrained only because values the user did not set changed since it trained."""
    found = {}
    for run_id, params in planned.items():
        run_dir = Path(results_dir) / "runs" / run_id
        try:
            if not (run_dir / "summary.json").is_file():
                continue
            trained = json.loads((run_dir / TRAINED_WITH).read_text())
        except (OSError, ValueError):
            continue  # not finished, or trained before runs recorded their values: nothing to compare
        then, now = _leaves(trained), _leaves(json.loads(json.dumps(params, default=str)))
        diff = sorted(k for k in {*then, *now} if then.get(k) != now.get(k) and not _set_by_user(k, mine))
        if diff:
            found[run_id] = [(k, _shown(k, then.get(k)), _shown(k, now.get(k))) for k in diff]
    return found


def _shown(key: str, value) -> str:
    """A value as the config writes it; a run's params leave out values at the schema's default: that default."""
    if value is None:
        from scalelab.config import SCHEMA

        section, _, name = key.partition(".")
        value = SCHEMA["properties"].get(section, {}).get("properties", {}).get(name, {}).get("default")
    return json.dumps(value)


def refusal(found: dict[str, list[tuple[str, str, str]]]) -> str:
    """What the workflow says before it would retrain them: the runs, the values, and the two ways on."""
    changes = sorted({change for cs in found.values() for change in cs})
    runs = sorted(found)
    keep = "; ".join(sorted({f"{key}: {then}" for key, then, _ in changes}))
    return (f"scalelab: {len(runs)} finished run(s) would be retrained because values they depend on changed since "
            f"they ran, not in your config (an upgrade's new defaults): "
            f"{'; '.join(f'{key}: {then} then, {now} now' for key, then, now in changes)}. Runs: "
            f"{', '.join(runs[:8])}{' ...' if len(runs) > 8 else ''}. To keep them, set in your config what they "
            f"trained with ({keep}); to retrain them, set {'.'.join(OPT_IN)}: true. Nothing was run.")
