"""What tests/*/test_levers.py share: the helpers tests of more than one tier use."""

from support import PARITY_STEPS, tiny_config


def _compile_config(**train):
    # Compiling takes tens of seconds per rank on 2 shared cores (less with a warm inductor cache).
    return tiny_config(train={"steps": PARITY_STEPS, "warmup_steps": 2, "run_timeout_s": 900, **train},
                       planning={"launch_overcommitted": True})
