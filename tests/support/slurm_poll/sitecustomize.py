"""Loaded by the cluster tests' Snakemake (its folder leads PYTHONPATH there, tests/cluster/test_slurm.py):
caps the SLURM executor plugin's wait between two status checks at POLL_CAP_S.

The plugin waits 10 s longer after every check that finds no job finished (its own
init_seconds_before_status_checks only sets where it starts again), so a job of a few seconds
was seen done ~11 s late, and the cluster tests spent most of their time waiting. Every
submission, status query and failure report is still the plugin's; only the wait between its
queries is shorter. Nothing else is touched: a process that never imports the plugin (a job's
own Snakemake on a node) only gains an import hook that never fires."""
import importlib.abc
import importlib.util
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
