"""Loaded by the cluster tests' Snakemake (its folder leads PYTHONPATH there, tests/cluster/test_slurm.py):
caps the SLURM executor plugin's wait between two status checks at POLL_CAP_S.

The plugin waits 10 s longer after every check that finds no job finished (its own
init_seconds_before_status_checks only sets where it starts again), so a job of a few seconds
was seen done ~11 s late, and the cluster tests spent most of their time waiting. Every
submission, status query and failure report is still the plugin's; only the wait between its
queries is shorter. A process that never imports the plugin (a job's own Snakemake on a node)
only gains an import hook that never fires; a sitecustomize further down sys.path (a distribution's,
a coverage set-up's), which this one shadows, is run after it."""
import importlib.abc
import importlib.util
import os
import sys

POLL_CAP_S = 2
PLUGIN = "snakemake_executor_plugin_slurm"


def _cap(executor_class) -> None:
    inherited = executor_class.next_seconds_between_status_checks  # the remote executor's property
    executor_class.next_seconds_between_status_checks = property(
        inherited.fget, lambda self, seconds: inherited.fset(self, min(seconds, POLL_CAP_S)))


class _CapOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != PLUGIN:
            return None
        sys.meta_path.remove(self)  # find the real module with the finders after this one
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_cap(module):
            exec_module(module)
            _cap(module.Executor)

        spec.loader.exec_module = exec_and_cap
        return spec


sys.meta_path.insert(0, _CapOnImport())


def _run_the_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(os.path.abspath(entry or "."), "sitecustomize.py")
        if os.path.dirname(candidate) != here and os.path.isfile(candidate):
            with open(candidate) as source:
                exec(compile(source.read(), candidate, "exec"), {"__name__": "sitecustomize", "__file__": candidate})
            return


_run_the_shadowed_sitecustomize()
