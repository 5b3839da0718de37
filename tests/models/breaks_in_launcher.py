"""A user's model that passes the config check and fails in the launcher: it imports where the check tries it
(a throwaway process), and raises where a run's launcher builds it. It stands for a module that changed, or
reads something that differs, between the check and the run."""
import sys

from models.mixer import build as mixer_build


def build(cfg):
    if "scalelab.run.launch" in sys.modules:  # imported by a run's launcher, never by the config check's probe
        raise RuntimeError("this model breaks in the launcher (a test's model)")
    return mixer_build(cfg)
