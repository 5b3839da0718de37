"""Where a run's ranks go: the launch plan of a run (launchers x ranks over nodes), the device
a sweep is planned for, what each training job asks a scheduler for, and which GPU each rank
takes.

The device is decided once, by the Snakemake process that plans the sweep, and handed to
every run, so a run never trains on a device it was not planned for. Jobs that Snakemake
re-parses elsewhere (a SLURM job on a compute node) inherit the decision through the
environment (sbatch --export=ALL) instead of deciding again on a machine that sees
different GPUs.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from scalelab.config import ConfigError, cluster_config, train_config

LAUNCHER_SLOT_ENV = "SCALELAB_LAUNCHER_SLOT"
"""Set by the srun wrapper (from SLURM_LOCALID): which of a node's packed launchers this is."""
SWEEP_DEVICE_ENV = "SCALELAB_SWEEP_DEVICE"
"""'<device>|<why>', set by the planning Snakemake process for the jobs it starts."""
SLURM_CONF_ENV = "SCALELAB_SLURM_CONF"
"""The SLURM_CONF the sweep was planned with, carried to its jobs under a name the SLURM
executor plugin's job step keeps (it removes SLURM_*): :func:`carry_slurm_conf`."""
SLURM_BIN = Path(__file__).parent / "slurm_bin"
"""scalelab's ``srun`` (a shell script): puts SLURM_CONF back, then runs the real srun."""


@dataclass(frozen=True)
class DevicePlan:
    device: str
    """cuda | cpu: what every run of the sweep trains on."""
    why: str
    """How it was decided (recorded on every row as planned_device_reason)."""


@dataclass(frozen=True)
class LaunchPlan:
    """How one run maps onto machines: torchrun launchers x ranks each, over nodes."""

    launchers: int
    """torchrun launchers (one SLURM task each); 1 = a single-node run."""
    ranks_per_launcher: int
    """Ranks (GPUs / processes) each launcher starts."""
    nodes: int
    """Nodes the run asks SLURM for."""

    @property
    def multi_launcher(self) -> bool:
        return self.launchers > 1


def launch_plan(config: dict, world_size: int) -> LaunchPlan:
    """One launcher when the run fits a node; else world_size / ranks_per_node launchers,
    packed launchers_per_node to a node. Raises ConfigError when ranks do not split evenly."""
    cluster = cluster_config(config)
    per_node, packing = cluster.ranks_per_node, cluster.launchers_per_node
    if world_size <= per_node:
        return LaunchPlan(1, world_size, 1)
    if world_size % per_node:
        raise ConfigError(
            f"sweep.world_size={world_size} spans several nodes but is not a multiple of "
            f"cluster.ranks_per_node={per_node}: every node must run the same number of ranks"
        )
    launchers = world_size // per_node
    return LaunchPlan(launchers, per_node, -(-launchers // packing))


def check_gpu_layout(config: dict) -> None:
    """The GPUs the config says a node has must hold the ranks it places there, one GPU each."""
    cluster, device = cluster_config(config), train_config(config).device
    gpus = cluster.gpus_per_node
    if gpus is None or device == "cpu":
        return
    if gpus == 0:
        if device == "cuda":
            raise ConfigError("train.device='cuda' but cluster.gpus_per_node=0: set the nodes' GPU count, "
                              "or train.device: cpu")
        return
    per_node = cluster.ranks_per_node * cluster.launchers_per_node
    if per_node > gpus:
        raise ConfigError(
            f"cluster.ranks_per_node={cluster.ranks_per_node} x cluster.launchers_per_node={cluster.launchers_per_node} "
            f"places {per_node} ranks on a node with cluster.gpus_per_node={gpus}: every rank needs a GPU of its own")


def device_memory_limit(config: dict, device_total_bytes: float | None) -> float | None:
    """The memory a point is held against (bytes): planning.device_memory_gib where set, else
    ``device_total_bytes``, the device's own total as the caller knows it (the forecast: the datasheet's;
    the launcher passes None and then asks torch, which the planning layers do not import)."""
    limit_gib = (config.get("planning") or {}).get("device_memory_gib")
    return limit_gib * 2 ** 30 if limit_gib else device_total_bytes


def visible_gpus(timeout_s: float = 10) -> list[str]:
    """Names of the GPUs this process may use: what ``nvidia-smi -L`` lists, narrowed by
    CUDA_VISIBLE_DEVICES as CUDA narrows it (indices or UUIDs, up to the first entry that
    names no GPU); [] without NVIDIA's tools or driver. (No torch import: every Snakemake
    start would pay for it.)"""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    listed = re.findall(r"^GPU (\d+): (.+?)(?: \(UUID: ([^)]*)\))?\s*$", out.stdout, flags=re.M)
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return [name for _, name, _ in listed]
    visible = []
    for entry in (e.strip() for e in mask.split(",")):
        match = [name for index, name, uuid in listed if entry and (entry == index or (uuid and uuid.startswith(entry)))]
        if not match:
            break
        visible.append(match[0])
    return visible


def plan_device(requested: str, gpus_per_node: int | None, probe: Callable[[], list[str]] = visible_gpus) -> DevicePlan:
    """The device of a sweep from ``train.device`` and ``cluster.gpus_per_node``.

    ``auto`` follows cluster.gpus_per_node when the config states it (a cluster's nodes
    cannot be seen from its login node), else the GPUs of the machine that plans the sweep
    (a workstation); a CPU plan says how to get a GPU one."""
    if requested in ("cpu", "cuda"):
        return DevicePlan(requested, f"train.device={requested}")
    if gpus_per_node is not None:
        device = "cuda" if gpus_per_node > 0 else "cpu"
        return DevicePlan(device, f"train.device=auto, cluster.gpus_per_node={gpus_per_node}")
    gpus = probe()
    if gpus:
        return DevicePlan("cuda", f"train.device=auto, nvidia-smi lists {len(gpus)} GPU(s) on the planning machine ({gpus[0]})")
    return DevicePlan("cpu", "train.device=auto; nvidia-smi lists no GPU on the planning machine and "
                             "cluster.gpus_per_node is not set. For GPU nodes elsewhere (SLURM), set "
                             "cluster.gpus_per_node or train.device: cuda")


def sweep_device_plan(config: dict, environ: MutableMapping[str, str] = os.environ,
                      probe: Callable[[], list[str]] = visible_gpus) -> tuple[DevicePlan, bool]:
    """(the sweep's device plan, whether it was inherited from the planning process).
    The planner records its decision in ``environ`` for the jobs it starts; an inherited
    decision that contradicts an explicit train.device is not one of this sweep's."""
    requested = config["train"]["device"]
    device, _, why = environ.get(SWEEP_DEVICE_ENV, "").partition("|")
    if device in ("cpu", "cuda") and requested in ("auto", device):
        return DevicePlan(device, why), True
    plan = plan_device(requested, config["cluster"].get("gpus_per_node"), probe)
    environ[SWEEP_DEVICE_ENV] = f"{plan.device}|{plan.why}"
    return plan, False


def carry_slurm_conf(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Where a site names its slurm.conf only by SLURM_CONF (a module-loaded Slurm, an install
    outside /etc/slurm), make it reach every ``srun`` of the sweep's jobs; returns the path, or
    None where SLURM_CONF is unset (the config at the default path, or configless slurmd).

    The SLURM executor plugin submits with ``--export=ALL``, but its job step removes every
    SLURM_* variable before it runs the rule, with its own ``srun -n1`` or, for an ``mpi``
    rule, directly: without this the job fails before scalelab runs ("srun: error: Unable to
    establish control machine address"). Called by every Snakemake process of the sweep
    (rules/common.smk): the planner records SLURM_CONF as SCALELAB_SLURM_CONF, which the job
    step keeps, and puts scalelab's ``srun`` (:data:`SLURM_BIN`) first on PATH, which puts
    SLURM_CONF back for the plugin's srun; the launcher's own srun gets it explicitly
    (:func:`srun_environment`)."""
    conf = environ.get("SLURM_CONF")
    if conf:
        environ[SLURM_CONF_ENV] = os.path.abspath(conf)
    if not environ.get(SLURM_CONF_ENV):
        return None
    path = environ.get("PATH", "")
    if str(SLURM_BIN) not in path.split(os.pathsep):
        environ["PATH"] = f"{SLURM_BIN}{os.pathsep}{path}" if path else str(SLURM_BIN)
    return environ[SLURM_CONF_ENV]


def srun_environment(env: dict) -> dict:
    """The environment of the launcher's ``srun``: SLURM_CONF as the sweep was planned with
    (:func:`carry_slurm_conf`) where the job step removed it."""
    env = dict(env)
    if not env.get("SLURM_CONF") and env.get(SLURM_CONF_ENV):
        env["SLURM_CONF"] = env[SLURM_CONF_ENV]
    return env


_SLURM_ERROR = re.compile(r"^(?:srun|sbatch|salloc|slurmstepd)\b[^\n]*?\b(?:error|fatal)\b:?[^\n]*$", re.M)


def slurm_log_errors(log_dir: str | Path, since: float = 0.0, per_log: int = 3) -> list[str]:
    """'<SLURM job log>: <its first error lines>' for each job log under log_dir (the SLURM
    executor plugin's ``.snakemake/slurm_logs``) written since ``since`` (a time.time()) that
    holds an error of SLURM's own tools (srun, sbatch, slurmstepd).

    A job that fails before scalelab runs (its step's srun cannot reach the controller, a node
    cannot start it) leaves no run log: the plugin says only "Detailed failure reason
    unavailable" where the cluster keeps no accounting, and the reason is in that file."""
    found = []
    root = Path(log_dir).resolve()
    for log in sorted(root.rglob("*.log")) if root.is_dir() else []:
        try:
            if log.stat().st_mtime < since:
                continue
            text = log.read_text(errors="replace")
        except OSError:
            continue
        errors = list(dict.fromkeys(m.group(0).strip() for m in _SLURM_ERROR.finditer(text)))
        errors.sort(key=lambda line: "fatal" not in line)  # the line that ended it first
        if errors:
            found.append(f"{log}: " + " | ".join(errors[:per_log]))
    return found


def spans_nodes(plan: LaunchPlan) -> bool:
    """Whether the run starts one torchrun per SLURM task (else one torchrun --standalone
    with every rank on this machine, as on a workstation)."""
    return plan.multi_launcher and "SLURM_JOB_ID" in os.environ


def ranks_per_node(plan: LaunchPlan, launchers_per_node: int) -> int:
    """Ranks, and so GPUs, one node of the run holds."""
    return plan.ranks_per_launcher * min(plan.launchers, launchers_per_node)


def train_job_resources(plan: LaunchPlan, device: str, cluster: dict, *, local: bool, grouped: bool = False) -> dict:
    """What one training job asks the scheduler for (Snakemake resources, read by the SLURM
    executor plugin).

    GPUs are asked per node: ``gpu`` (the plugin's job-wide ``--gpus``) only for a one-node
    job, ``gres=gpu:<per node>`` for a job over several nodes. ``slurm_extra=--exclusive``
    keeps other jobs off the run's nodes (cluster.exclusive). ``train_slot`` is what the
    workstation profile limits to one at a time (a timed run never shares the machine with
    another run's training, on CPU as on GPU); it is 0 on a cluster, where the scheduler
    places jobs (and ``exclusive`` keeps them apart), unless runs are ``grouped`` into one
    submission (cluster.runs_per_job): there, scoped local to each group job, it runs the group's
    runs one after another in one run's allocation."""
    gpu = device == "cuda"
    per_node = ranks_per_node(plan, cluster["launchers_per_node"])
    resources = {
        "nodes": plan.nodes,
        # per SLURM task: one task (torchrun) per launcher, its ranks' cores
        "cpus_per_task": plan.ranks_per_launcher * cluster["cpus_per_rank"],
        "mem_mb": per_node * cluster["mem_mb_per_rank"],
        "gpu": per_node if gpu and not plan.multi_launcher else 0,
        "gres": f"gpu:{per_node}" if gpu and plan.multi_launcher else "",
        "slurm_extra": "--exclusive" if cluster["exclusive"] else "",
        "train_slot": int(local or (grouped and not plan.multi_launcher)),
    }
    if plan.multi_launcher:
        resources["tasks"] = plan.launchers
    return resources


def srun_step_options(plan: LaunchPlan, device: str, cluster: dict) -> list[str]:
    """What the launcher's own ``srun`` asks for inside the allocation: the plugin's job step
    strips SLURM_*/SRUN_* from the environment, and srun no longer inherits the job's
    cpus-per-task, so without these each launcher (and all its ranks) would get one core."""
    per_node = ranks_per_node(plan, cluster["launchers_per_node"])
    options = [f"--ntasks={plan.launchers}", f"--nodes={plan.nodes}",
               f"--ntasks-per-node={min(plan.launchers, cluster['launchers_per_node'])}",
               f"--cpus-per-task={plan.ranks_per_launcher * cluster['cpus_per_rank']}"]
    if device == "cuda":
        options.append(f"--gres=gpu:{per_node}")
    return options


def gpu_shortfall(plan: LaunchPlan, world_size: int, launchers_per_node: int, n_visible: int) -> str | None:
    """Why this machine cannot hold its share of a GPU run, or None. Only this machine's
    share counts: a run over several nodes needs its per-node GPUs here, not all of them."""
    if spans_nodes(plan):
        need = ranks_per_node(plan, launchers_per_node)
        if n_visible < need:
            return (f"world_size={world_size} over {plan.launchers} launchers places {need} rank(s) on this node, "
                    f"which has {n_visible} visible GPU(s)")
        return None
    if n_visible < world_size:
        return f"world_size={world_size} needs {world_size} GPUs on this machine, it has {n_visible} visible"
    return None


FRAMEWORK_RSS_BYTES = 300 * 2**20
"""Resident memory of a CPU rank before its model: 330-390 MiB measured here per rank (torch
2.13, gloo, a tiny model); 300 MiB is the floor the host-memory check assumes."""


def host_memory_available() -> int | None:
    """Bytes the kernel says are available for new work (MemAvailable), or None off Linux."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def overcommit_reason(world_size: int, threads: int, predicted_peak_bytes: float,
                      available_bytes: int | None, ranks_here: int | None = None) -> str | None:
    """Why a CPU run would over-commit this machine, or None. Each rank needs a core of its
    own (threads: what Snakemake gave the job, capped by --cores and the machine) and its
    predicted peak plus the framework's resident memory.

    ranks_here: the ranks this node holds, for a run whose launchers span nodes
    (:func:`ranks_per_node`): each node holds its share, checked against this node's cores
    and memory, never the whole world size against one node's."""
    here = world_size if ranks_here is None else ranks_here
    share = "" if here == world_size else f" (this node's share of world_size={world_size})"
    cores = min(threads, len(os.sched_getaffinity(0)))
    if here > cores:
        return (f"{'world_size=' if not share else ''}{here} CPU ranks{share} need a core each; this job has {cores} "
                "(snakemake --cores and this machine's cores)")
    need = here * (predicted_peak_bytes + FRAMEWORK_RSS_BYTES)
    if available_bytes is not None and need > available_bytes:
        return (f"{'world_size=' if not share else ''}{here} CPU ranks{share} are predicted to need {need / 2**30:.1f} GiB "
                f"of host memory (predicted peak {predicted_peak_bytes / 2**20:.0f} MiB + framework "
                f"{FRAMEWORK_RSS_BYTES / 2**20:.0f} MiB per rank); {available_bytes / 2**30:.1f} GiB are available")
    return None


def gpu_index(local_rank: int, local_world_size: int, launcher_slot: int, n_visible: int) -> int:
    """The CUDA device a rank takes.

    A launcher that sees exactly its own GPUs (one launcher per node, or SLURM bound the
    task to its GPUs) gives local rank r GPU r. Launchers packed on one node
    (cluster.launchers_per_node > 1) see the same GPUs, so slot s takes GPUs s*R .. s*R+R-1:
    two ranks on one GPU would measure contention, and NCCL refuses them."""
    if n_visible == local_world_size:
        return local_rank
    index = launcher_slot * local_world_size + local_rank
    if index >= n_visible:
        raise RuntimeError(f"local rank {local_rank} of launcher slot {launcher_slot} ({local_world_size} ranks per "
                           f"launcher) needs GPU {index}, but only {n_visible} are visible")
    return index


# ----------------------------------------------------------------------------- failures read from the log
# NCCL's watchdog aborts a hung rank (SIGABRT) without a Python exception, so no rank error
# file is written: the log is the only evidence. Patterns follow the format strings of
# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (torch 2.1 to 2.6 wordings) and
# gloo/transport/tcp/unbound_buffer.cc. The generic lines ("Some NCCL operations have failed
# or timed out", exit code -6, SIGABRT) follow timeouts and errors alike, so they decide nothing.
COLLECTIVE_TIMEOUT_PATTERNS = [
    r"Watchdog caught collective operation timeout",
    r"WorkNCCL\(SeqNum=\d+.*?\)\s+ran for \d+ milliseconds before timing out",
    r"WorkNCCL\(.*?\) timed out in blocking wait",
    r"\]\s*Timeout at NCCL work: \d+",
    r"Received a timeout signal from this local rank",
    r"ProcessGroupNCCL's watchdog got stuck for \d+\s*seconds",
    r"Heartbeat monitor timed out!",
    r"due to ProcessGroupNCCL watchdog hang",
    r"Timed out waiting \d+\s*ms for (?:recv|send) operation to complete",
    r"Application timeout caused pair closure",
]
COLLECTIVE_ERROR_PATTERNS = [
    r"Duplicate GPU detected[^\n]*",
    r"nccl(?:RemoteError|UnhandledCudaError|InvalidUsage|SystemError|InternalError)[^\n]*",
    r"NCCL error(?: in)?:[^\n]*",
    r"CUDA out of memory[^\n]*",
]
_TIMEOUT_RE = re.compile("|".join(f"(?:{p})" for p in COLLECTIVE_TIMEOUT_PATTERNS), re.IGNORECASE)
_ERROR_RE = re.compile("|".join(f"(?:{p})" for p in COLLECTIVE_ERROR_PATTERNS), re.IGNORECASE)


def failure_from_log(log: str) -> tuple[str, str] | None:
    """(status, the log line that shows it) for a collective timeout or a named NCCL/CUDA
    error found in a run's log, the earliest in the log winning; None if neither is there."""
    found = [(m.start(), kind) for kind, regex in (("timeout", _TIMEOUT_RE), ("error", _ERROR_RE))
             if (m := regex.search(log))]
    if not found:
        return None
    start, kind = min(found)
    line_start = log.rfind("\n", 0, start) + 1
    line_end = log.find("\n", start)
    line = log[line_start:line_end if line_end >= 0 else len(log)].strip()[:1000]
    if kind == "timeout":
        return "timeout", line
    return ("oom" if "out of memory" in line.lower() else "failed"), line
