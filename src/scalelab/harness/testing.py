"""Helpers the GPU check, the tests and the team's tools share: tiny configs, work folders, running Snakemake, a
point's plan outside the workflow."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from scalelab.harness import REPO_ROOT

BIN = Path(sys.executable).parent
# The venv's snakemake; else the one on PATH (wheels installed with --target on a GPU machine).
SNAKEMAKE = str(BIN / "snakemake") if (BIN / "snakemake").exists() else (shutil.which("snakemake") or str(BIN / "snakemake"))
# Where `make setup` puts the SLURM executor plugin (kept off the default path, see Makefile).
SLURM_PLUGIN_DIR = BIN.parent / "slurm-plugin"


def local_plan(config: dict, point):
    """A point's run plan outside the workflow (tests, benchmarks, the GPU check), on the device the workflow
    would plan for this config (scalelab.planning.placement.plan_device), without recording it for any job."""
    from scalelab.planning.placement import plan_device
    from scalelab.planning.run_plan import run_plan

    device = plan_device(config["train"]["device"], config["cluster"].get("gpus_per_node"))
    return run_plan(config, point, device=device.device, device_reason=f"{device.why} (outside the workflow)")


def tiny_config(**overrides) -> dict:
    """The default config.yaml, shrunk for tests, with section overrides merged in."""
    cfg = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    cfg["dataset"].update(name="tiny", synthetic_bytes=200_000)
    cfg["model"].update(n_layers=2, d_model=32, n_heads=2, seq_len=32)
    # device cpu: these configs test CPU semantics (gloo, several ranks on one machine), also
    # on a GPU machine; GPU tests and plans that need `auto` say so.
    # measure_s 0: the steps alone (a test of the measurement window asks for one; 2 s of timing per run would
    # double the suite)
    cfg["train"].update(steps=12, warmup_steps=2, global_batch=8, run_timeout_s=240, collective_timeout_s=60, device="cpu",
                        measure_s=0)
    cfg["sweep"].update(precision=["fp32"], zero_stage=[0], world_size=[1])
    cfg["repeats"].update(baseline=1)  # one run per point: a test that measures noise asks for repeats
    cfg["prediction"].update(bench_comm=False)  # ~13 s of collective timing: a test of the model asks for it
    for section, values in overrides.items():
        if isinstance(values, dict) and isinstance(cfg.get(section), dict):
            cfg[section].update(values)
        else:
            cfg[section] = values
    return cfg


def write_workdir(tmp: Path, cfg: dict) -> Path:
    """A working directory holding config.yaml, for `snakemake -s REPO/Snakefile -d tmp`."""
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return tmp


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    return [SNAKEMAKE, "-s", str(REPO_ROOT / "Snakefile"), "-d", str(workdir), *args]


def snakemake_env(**extra: str) -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def snakefile_imports() -> list[str]:
    """The scalelab modules the Snakefile and its rules import at top level: what every Snakemake start (a SLURM
    job's too) imports when it parses them."""
    import re

    sources = [REPO_ROOT / "Snakefile", *sorted((REPO_ROOT / "rules").glob("*.smk"))]
    return sorted({m for path in sources for m in re.findall(r"^(?:from|import) (scalelab[\w.]*)", path.read_text(), re.M)})


SWEEP_IMPORTS = ("pandas", "pyarrow.dataset", "smart_open", "nbformat", "snakemake.report", "snakemake.report.html_reporter",
                 "scalelab.report.checks", "scalelab.report.tables", "scalelab.results.invocation")
"""What a sweep's Snakemake imports after it starts (seen with ``python -X importtime``), ~1.2 s of each: pandas
(Snakemake asks whether each job's params are DataFrames), its report module (the report rule's outputs), the
scalelab modules its start and end hooks import. A module one version of these lacks is skipped."""


class PreimportedSnakemake:
    """Snakemake's own command line (``snakemake.cli.main``, what the ``snakemake`` script runs), each invocation a
    fresh process forked from a server that imported it once (multiprocessing's forkserver, preloading it): the
    tests and drills start Snakemake ~130 times, and its imports (SQLAlchemy and pydantic among them) took ~1.3 s
    of CPU of each start. Each child takes run_snakemake's environment, working directory and arguments, writes its
    own stdout and stderr, and exits as the script would (its exit handlers run); a child past ``timeout`` is
    killed, as subprocess.run kills one. The server is multiprocessing's: it exits with the process that started
    it. What a test must see as the real script (a signal to Snakemake's pid or group, its command line in ``ps``)
    starts ``snakemake_cmd`` itself."""

    def __init__(self):
        import multiprocessing

        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(["snakemake.cli", *SWEEP_IMPORTS, *snakefile_imports()])

    def run(self, workdir: Path, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
        import tempfile

        cmd = snakemake_cmd(workdir, *args)
        with tempfile.TemporaryDirectory(prefix="scalelab-snakemake-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            child = self._context.Process(target=_snakemake_main,
                                          args=(cmd[1:], env or snakemake_env(), os.getcwd(), str(out), str(err)))
            child.start()
            child.join(timeout)
            if child.is_alive():
                child.kill()
                child.join()
                raise subprocess.TimeoutExpired(cmd, timeout)
            return subprocess.CompletedProcess(cmd, child.exitcode, out.read_text(), err.read_text())


def _snakemake_main(argv: list[str], env: dict, cwd: str, stdout: str, stderr: str) -> None:
    """A PreimportedSnakemake child: the command line with this environment and working directory, its streams to
    these files."""
    import atexit
    import gc

    gc.freeze()  # the preloaded modules' objects: no collection of this Snakemake walks them (~0.1-0.3 s a sweep)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, stdout), (2, stderr)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = [SNAKEMAKE, *argv]
    from snakemake.cli import main

    code = 1
    try:
        main(argv)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        atexit._run_exitfuncs()  # what the interpreter's exit would run (logging's last flush among them)
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


@functools.cache
def _preimported_snakemake() -> PreimportedSnakemake:
    return PreimportedSnakemake()


def run_snakemake(workdir: Path, *args: str, timeout: float = 600, check: bool = True,
                  env: dict | None = None) -> subprocess.CompletedProcess:
    """Snakemake's command line on a work folder, in a process forked from this process's PreimportedSnakemake."""
    proc = _preimported_snakemake().run(workdir, *args, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def processes_mentioning(marker: str) -> list[str]:
    """Live processes whose command line contains marker (orphan checks); -ww: the whole line, whatever
    COLUMNS says (pytest sets it to its terminal width, and ps cuts the lines there)."""
    ps = ["ps", "-ww", "-eo", "pid=,args="]
    out = subprocess.run(ps, capture_output=True, text=True).stdout
    me = str(os.getpid())
    return [line.strip() for line in out.splitlines()
            if marker in line and " ".join(ps) not in line and line.split()[0] != me]
