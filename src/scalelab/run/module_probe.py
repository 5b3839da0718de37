"""Try a user's model module before any job: import it, call its builder on the config's shape on the
meta device (no memory, no compute), and count it as the launcher does (scalelab.run.model.counted: one
forward and backward on meta tensors). The config check runs this in a throwaway process
(``python -m scalelab.run.module_probe``, the model's shape as JSON on stdin), so that a module whose import
raises, exits or hangs never takes the checking process with it. It reads a JSON list of model shapes on
stdin and prints, after each is tried, one JSON line {"problem": null} or {"problem": "..."} naming what failed."""
from __future__ import annotations

import importlib
import json
import sys


def problem_of(shape: dict) -> str | None:
    """What stops the launcher from building and counting this model, in one line; None when nothing does."""
    from scalelab.config import ModelConfig
    from scalelab.run.model import counted

    cfg = ModelConfig(**shape)
    module_name = cfg.module.partition(":")[0]
    for step, attempt in ((f"importing {module_name}", lambda: importlib.import_module(module_name)),
                          ("building it on the meta device and running one step", lambda: counted(cfg))):
        try:
            attempt()
        except BaseException as err:  # noqa: BLE001 - a user's module may raise anything, SystemExit included
            return f"{type(err).__name__} {step}: {' '.join(str(err).split())[:300]}"
    return None


def main() -> int:
    for shape in json.loads(sys.stdin.read()):
        print(json.dumps({"problem": problem_of(shape)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
