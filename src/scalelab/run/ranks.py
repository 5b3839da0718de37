"""Starting a run's ranks and waiting for them (scalelab.run.launch decides which run and writes
its results): on this host one process per rank, started as torchrun's agent would start them
(:func:`local_rank_processes` names the contract), or forked by the prefork server; across nodes
``srun`` x ``torchrun`` (:func:`torchrun_command`). Whatever happens, no rank outlives its attempt
(:func:`run_ranks`), and a failed attempt says which rank failed, where and how (:func:`classify_failure`).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from scalelab.io import read_json
from scalelab.planning import placement
from scalelab.planning.placement import LaunchPlan
from scalelab.run import prefork

PORT_TAKEN = "port_taken"
"""The status of an attempt whose rank 0 found its rendezvous port taken: the launcher starts the
ranks again on a new port (:data:`RENDEZVOUS_ATTEMPTS`); never a run's status."""

RENDEZVOUS_ATTEMPTS = 3
"""How many times ranks start at most when each attempt finds its rendezvous port taken.
:func:`free_port` picks a port nobody listens on, but it is only bound later, by rank 0's
TCPStore: another process may take it in between. Runs starting at once make that likely (8 GPU
test workers did, on an H100: EADDRINUSE). torch's own tests retry the same way
(common_utils.retry_on_connect_failures)."""

_STORE_PORT_TAKEN = re.compile(r"server socket has failed to listen on any local network address\..*EADDRINUSE")
"""TCPStore's DistNetworkError when its port is taken (torch 2.11-2.13, seen on an H100)."""


def rendezvous_port_taken(log: str) -> bool:
    """Whether this attempt's log holds TCPStore's failure to listen on a port already in use: the
    race :data:`RENDEZVOUS_ATTEMPTS` retries."""
    return _STORE_PORT_TAKEN.search(log) is not None


def classify_failure(errors: list[dict], log: str, retry: bool = True) -> tuple[str, str]:
    """(status, reason) from the ranks' error reports and this attempt's whole log.

    The earliest error is the root cause: once one rank fails, the others fail with
    secondary errors (a peer closed the connection, a collective timed out). NCCL's watchdog
    aborts a hung rank without a Python exception, so its timeout is only in the log: it
    wins over a plain failure that other ranks reported afterwards. A rendezvous port found
    taken is :data:`PORT_TAKEN`, for the launcher to retry (retry=False: what the attempt is
    otherwise), and only where no rank reported an error: a rank reports errors once
    init_process_group has passed, so any report means the rendezvous worked."""
    if retry and not errors and rendezvous_port_taken(log):
        return PORT_TAKEN, "rank 0 could not listen on its rendezvous port (EADDRINUSE: another process took it first)"
    from_log = placement.failure_from_log(log)
    if errors:
        first = min(errors, key=lambda e: e.get("time", 0))
        where = f"rank {first['rank']}: {first['type']}: {first['message'][:1000]}"
        text = f"{first['type']} {first['message']}".lower()
        if first["type"] == "Unsupported":  # the worker's preflight: this device cannot run the point
            return "skipped", first["message"]
        if first["type"] == "OutOfMemoryError" or "out of memory" in text:
            return "oom", where
        if first["type"] == "Diverged":
            return "diverged", where
        if "timeout" in text or "timed out" in text:
            return "timeout", "collective timed out: " + where
        if from_log and from_log[0] == "timeout":
            return "timeout", f"collective timed out: log: {from_log[1]} (then {where})"
        return "failed", where
    if from_log:
        status, line = from_log
        return status, ("collective timed out: " if status == "timeout" else "") + "log: " + line
    if died := launcher_failure(log):
        return "failed", "a rank exited abnormally: " + died
    return "failed", "a rank exited abnormally; log tail: " + log[-1000:]


_TORCHRUN_CHILD = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: \d+\)")
_SRUN_TASK = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): ([^\n]+)")


def launcher_failure(log: str) -> str | None:
    """Which rank died, where and how, from the lines torchrun and srun print when a rank of a
    multi-node run ends without an error report (killed by a signal, a hard exit): torchrun's
    "failed (exitcode: -9) local_rank: 0" and srun's first "n2: task 1: Exited ..." line."""
    child = _TORCHRUN_CHILD.search(log)
    if child is None:
        return None
    code, local_rank = int(child.group(1)), child.group(2)
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exited with code {code}"
    task = _SRUN_TASK.search(log)
    where = f" on node {task.group(1)} (SLURM task {task.group(2)}; srun: {task.group(3).strip()})" if task else ""
    return f"local rank {local_rank} of a launcher{where} {how} (torchrun: exitcode {code}); the other ranks were stopped"


def allocation_first_host() -> str:
    """The first host of the SLURM allocation: where rank 0's launcher runs."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if nodelist:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30,
                             env=placement.srun_environment(os.environ))
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()[0]
    import socket

    return socket.gethostname()


def free_port() -> int:
    """A TCP port nobody listens on now (rendezvous, test daemons)."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


LOCAL_LAUNCH = "one process per rank (no torchrun agent)"
"""The ``launch`` of a run whose ranks all run on this host."""

WORKER = ["-m", "scalelab.run.worker", "--plan"]


def local_rank_processes(world_size: int, plan_path: Path, env: dict) -> list[tuple[list[str], dict]]:
    """(command, environment) of each rank of a run on this host, started by the launcher itself.

    torchrun's elastic agent would be one more Python process importing torch (about 1.5 s of
    every run's start-up on 2 cores) for what a single host does not need: rendezvous, restarts
    (scalelab never restarts a rank; a run resumes from its checkpoint). The ranks get the
    variables torchrun --standalone gives its workers (torch's LocalElasticAgent._start_workers)
    that a worker without the agent's store reads: init_process_group's env:// rendezvous
    (MASTER_ADDR, MASTER_PORT: rank 0 hosts the TCPStore on a free port, RANK, WORLD_SIZE),
    LOCAL_RANK and LOCAL_WORLD_SIZE (GPU and core placement), and the group and role ranks of
    one group; TORCHELASTIC_* stay unset, since no agent is there to serve a store."""
    port = str(free_port())
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(world_size),
              "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
              "ROLE_NAME": "default", "ROLE_WORLD_SIZE": str(world_size),
              "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")}
    return [([sys.executable, *WORKER, str(plan_path)],
             {**env, **common, "RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank)})
            for rank in range(world_size)]


def torchrun_command(plan: LaunchPlan, world_size: int, plan_path: Path, srun_options: list[str]) -> list[str]:
    """The command that starts every rank of a run whose launchers span nodes (inside a SLURM
    allocation; on one host the launcher starts the ranks itself, :func:`local_rank_processes`).

    ``srun`` starts one torchrun per task, joined by static rendezvous on the allocation's first
    host, each task's node rank taken from SLURM_PROCID (torchrun reads PET_NODE_RANK) and its
    slot on its node from SLURM_LOCALID (packed launchers take distinct GPUs,
    scalelab.planning.placement.gpu_index). Static, not c10d: the sizes are fixed, node ranks stay
    reproducible, and several launchers may share one host.
    """
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={plan.launchers}",
                f"--nproc-per-node={plan.ranks_per_launcher}", f"--master-addr={allocation_first_host()}",
                f"--master-port={free_port()}", *WORKER, str(plan_path)]
    return ["srun", *srun_options, "--kill-on-bad-exit=1",
            "bash", "-c", f'export PET_NODE_RANK="$SLURM_PROCID" {placement.LAUNCHER_SLOT_ENV}="$SLURM_LOCALID"; exec "$@"',
            "bash", *torchrun]


POLL_S = 0.05
"""How often the launcher looks at its processes: how late at most it notices that a rank
ended (torchrun's agent looks every 0.1 s)."""


def run_ranks(processes: list[tuple[list[str], dict]], log_path: Path, timeout_s: float,
               run_dir: Path, forkable: bool = False) -> tuple[str, str | None, str | None, bool]:
    """(status, reason, teardown warning, whether the ranks were forked) of one attempt: the ranks
    (or srun x torchrun, one process) started and waited for by start_and_wait, their commands and
    output appended to the log, and what they left in run_dir read back."""
    attempt_start = log_path.stat().st_size if log_path.exists() else 0  # the log is appended across attempts
    with open(log_path, "ab") as log:
        for cmd, env in processes:
            shown = " ".join(f"{k}={env[k]}" for k in ("RANK", "WORLD_SIZE", "MASTER_PORT") if k in env and len(processes) > 1)
            if cmd[0] == "srun" and env.get("SLURM_CONF"):
                shown = f"SLURM_CONF={env['SLURM_CONF']}"
            log.write(f"$ {shown + ' ' if shown else ''}{' '.join(cmd)}\n".encode())
        log.flush()
        codes, timed_out, forked, _ = start_and_wait(processes, log, timeout_s, forkable)
    if timed_out:
        return "timeout", f"run exceeded train.run_timeout_s={timeout_s:g} s and was stopped", None, forked
    ended_badly = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
    if ended_badly:
        index, code = ended_badly[0]
        # srun x torchrun is one process for every rank; on one host each process is rank `index`
        exit_code = f"srun x torchrun exit code {code}" if processes[index][0][0] == "srun" else f"rank {index} exit code {code}"
    else:
        exit_code = None
    if (run_dir / "worker_result.json").exists():
        # Rank 0 writes it after the last step and the final all-gathers, which every rank
        # joined: the measurements are complete. A crash after that (process-group teardown)
        # is worth a warning, not the run.
        warning = None if exit_code is None else f"a rank exited abnormally after the results were written ({exit_code})"
        return "ok", None, warning, forked
    errors = [read_json(p) for p in sorted(run_dir.glob("rank*.error.json"))]
    with open(log_path, "rb") as log:
        log.seek(attempt_start)
        status, reason = classify_failure(errors, log.read().decode(errors="replace"))
    if status == "skipped":
        return status, reason, None, forked
    return status, f"{reason} ({exit_code or 'every rank exited 0 without results'})", None, forked


class Waited(NamedTuple):
    """What start_and_wait saw: each process's exit code when the wait ended (None: still running then, and
    stopped), whether timeout_s ran out, whether the prefork server forked them, and why it did not (None: it
    did, or was not asked, or there is no server)."""
    codes: list[int | None]
    timed_out: bool
    forked: bool
    why_not_forked: str | None


def start_and_wait(processes: list[tuple[list[str], dict]], log, timeout_s: float, forkable: bool = False) -> Waited:
    """Start processes (a run's ranks, srun x torchrun, a benchmark's ranks) in one process group of
    their own, their output on the open file log, and wait for them.
    forkable: ask the prefork server to fork them (scalelab.run.prefork, which keeps every guarantee
    below); without one, or where it refuses (said in the log), they are new processes.

    As torchrun did: the first process to exit abnormally ends the wait, and the others are stopped
    (a rank whose peer died would otherwise wait in a collective until its timeout); timeout_s stops
    them all; the whole group is killed, whatever happened, so no process outlives the wait (and each
    dies with its starter: PR_SET_PDEATHSIG)."""
    procs: list = []  # subprocess.Popen or prefork.ForkedRank
    forked, why_not = prefork.fork_ranks(processes, log.fileno()) if forkable else (None, None)
    if why_not:
        log.write(f"scalelab: ranks started as new processes: {why_not}\n".encode())
        log.flush()
    try:
        if forked is not None:
            procs.extend(forked)
        else:
            for cmd, env in processes:
                # one group for all: rank 0 leads a new one, the others join it (killpg reaches every rank)
                group = {"start_new_session": True} if len(processes) == 1 else {"process_group": procs[0].pid if procs else 0}
                procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              preexec_fn=prefork.die_with_parent, **group))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
                return Waited(codes, False, bool(forked), why_not)
            if time.monotonic() >= deadline:
                return Waited(codes, True, bool(forked), why_not)
            time.sleep(POLL_S)
    finally:
        _kill_group(procs)  # no orphan ranks, whatever happened
        if forked:
            forked[0].channel.close()
            if forked[0].channel.server_lost:
                log.write(b"scalelab: the prefork server ended (or stopped answering) while the ranks ran; they were stopped\n")


def _kill_group(procs: list[subprocess.Popen]) -> None:
    """SIGTERM the run's process group (led by the first process), then SIGKILL what is left
    after a grace period; every process is reaped."""
    if not procs:
        return
    group = procs[0].pid
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.time() + 10
    while time.time() < deadline:
        for proc in procs:  # reap them, so a group with no live member reads as gone
            proc.poll()
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for proc in procs:
        proc.wait()
