"""Ranks forked from a process that has imported torch already: a run's start-up without the imports.

A rank started as a new process spends most of its start-up importing torch and the
distributed stack (2.5-3 s of a CPU run's ~3 s on 2 cores, more when another run starts
beside it). A prefork server imports all of it once, then forks one child per rank on
request, each of which runs :func:`scalelab.run.worker.main` exactly as a new process
would (or the CPU calibration, or a collective benchmark's rank: ``FORKABLE``): its own environment,
working directory, process group and log. One server serves a whole Snakemake invocation
(started by the workflow's ``onstart``, rules/hooks.smk) or a pytest worker (``tests/conftest.py``); the
launcher finds it through ``SCALELAB_PREFORK``.

Only CPU work on this host goes through it (a run's ranks, the calibration, the collective
benchmark's ranks): a GPU run's ranks are new processes (CUDA and fork are not proven together
here), and so are the launchers of a multi-node run (``srun``).

The launcher's guarantees hold as with new processes (``scalelab.run.ranks.start_and_wait``):
- the ranks of a run form one process group (led by rank 0) which the launcher kills whole;
- a rank dies with the launcher: the launcher holds a connection to the server for the run's
  lifetime, and the server SIGKILLs the run's group when that connection closes early;
- a rank dies with the server (PR_SET_PDEATHSIG), and the server with the process that
  started it;
- each child shows the command line a new process would have (``ps``: ``python -m
  scalelab.run.worker --plan ...``), so orphan checks find it by its run folder.

The server refuses a request (the caller then starts new processes and says why: in the run's
log, or the benchmark's) when what it imported could differ from what a new process would import: another Python,
another copy or edit of scalelab's source, or a different value of a variable that torch or
the interpreter reads while loading (``IMPORT_TIME_PREFIXES``); and it serves only its own
user (SO_PEERCRED). A child takes the launcher's working directory, environment, CPU affinity,
umask and resource limits. What it cannot take: the hash seed (every forked rank has the
server's, where new processes would each draw one) and warnings printed once at import (in the
server's output, not each run's log).

Not multiprocessing's forkserver, which also forks from a process that preloaded modules: its children run a
function of the process that asked, as that process's ``Process`` objects, and take neither its working directory,
environment, affinity and limits nor a command line that ``ps`` and the orphan checks find, nor a process group the
launcher can kill whole; a rank must look and end as a process started for it.

The server imports torch on its first request, not at start: a sweep that trains nothing on the
CPU (a report from cached runs, a GPU sweep) never pays for it. The import never overlaps a
measurement: a request waits for it to end before its children are forked (the collective
benchmark's ranks, when the sweep measures its links first; else the calibration, which the first
training job asks for before its ranks).

    python -m scalelab.run.prefork --name NAME [--for PATH]   (started by start_server)
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

FORKABLE = ("scalelab.run.worker", "scalelab.run.calibration", "scalelab.run.commbench")
"""The modules (``python -m MODULE``, each with ``main(argv) -> int``) the server forks a child to run: a rank,
a CPU sweep's calibration, which the first training job asks for before its ranks, and the ranks of the
collective benchmark (the bench_comm step): the import each would otherwise pay, 2-3 s on 2 cores, is the
server's once."""
PREFORK_ENV = "SCALELAB_PREFORK"
"""The abstract socket name of the server that forks this process tree's ranks."""

FORKED_LAUNCH = "one process per rank, forked from a pre-imported server (no torchrun agent)"
"""The ``launch`` of a run whose ranks the server forked."""

IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "OMP_", "KMP_", "GOMP_", "MKL", "OPENBLAS", "CUDA", "NCCL",
                        "LD_", "PYTHON", "CUBLAS", "MALLOC", "GLIBC", "LC_", "LANG")
"""Variables read while the interpreter and torch's libraries load: a child forked from a server
started with other values would not be the process the launcher asked for."""

SET_PER_RUN = frozenset({"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONUNBUFFERED",
                         "TORCH_NCCL_ASYNC_ERROR_HANDLING"})
"""Import-time variables set per run (by the launcher, or by Snakemake per job) whose effect the
child sets itself: the worker calls torch.set_num_threads from the thread that runs the step
(OpenMP's and MKL's thread counts for the regions it starts; numpy's OpenBLAS pool computes
nothing in a rank); the server's streams are unbuffered; an NCCL run is never forked."""

READY_TIMEOUT_S = 120.0
"""How long a launcher waits for the server's answer (its first request waits for the imports)
before starting new processes."""

RLIMITS = ("RLIMIT_CORE", "RLIMIT_NOFILE", "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_RSS")
"""The launcher's resource limits a child takes over (a benchmark raises RLIMIT_CORE to keep core dumps)."""

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child: get SIGTERM when its parent dies (the launcher's ranks and torchrun, the server's
    children, the server itself), so that nothing outlives the process that started it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def import_rank_modules() -> None:
    """Import every module a CPU rank may import before its process group (whatever its stage, precision
    and checkpointing), and FSDP2, which stages 2 and 3 import when they wrap the model: what the server
    imports before it forks a rank, and what a rank started as a new process imports before it forks
    its own (run_forked)."""
    import importlib

    from scalelab.registries.precisions import PRECISIONS
    from scalelab.registries.strategies import STRATEGIES
    from scalelab.run import worker

    early = {module for stage in STRATEGIES for precision in PRECISIONS for every in (0, 1)
             for module in worker.modules_this_run_imports(stage, precision, bool(every))}
    for module in sorted(early) + ["torch.distributed.fsdp"]:
        importlib.import_module(module)
    # The imports' ~300,000 objects live as long as the process: frozen, no collection in a rank
    # forked after this walks them (gc.freeze). The one a rank runs at its teardown
    # (worker.shutdown) took ~0.26 s of CPU walking them, in every rank of every run.
    gc.freeze()


def end_as_a_process(main: Callable[[], int]) -> NoReturn:
    """In a forked child: run main, then end as a new Python process running it would (its exit status; a
    SystemExit's message; an uncaught exception's traceback and 1; a KeyboardInterrupt's traceback and death
    by SIGINT), without the interpreter's finalization, as the worker's __main__ ends."""
    code = 1
    try:
        code = main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)  # as Python prints it
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_forked(main: Callable[[], int]) -> int:
    """Run a CPU rank started as a new process (by torchrun, or by a launcher without a server) in a
    child forked after the server's imports, so that every CPU rank reports its peak RSS the same way,
    forked by the server or not. A forked child's resident set holds its parent's anonymous memory
    but none of the library pages the imports touched until it touches them itself (after torch's
    import: 293 MiB resident in the importer, 220 MiB in its child, the difference all file-backed),
    so a rank that ran in its own importing process read ~45 MiB higher. This process waits, passes
    SIGINT, SIGTERM and SIGHUP on to the rank, and ends as it ended (its exit status, or its signal)."""
    import_rank_modules()
    pid = os.fork()
    if pid == 0:
        def the_rank() -> int:
            die_with_parent()
            return main()

        end_as_a_process(the_rank)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: os.kill(pid, signum))
    _, status = os.waitpid(pid, 0)  # retried by Python when a passed-on signal interrupts it
    if os.WIFSIGNALED(status):
        # End by the same signal: the launcher reads it from the exit status (SIGKILL: out of memory).
        # No second core file beside the rank's own; SIGKILL takes no handler and needs none reset.
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status)


def code_stamp() -> str:
    """The scalelab source this interpreter would import now: where it is and when each file changed."""
    import scalelab

    root = Path(scalelab.__file__).parent
    files = sorted(root.rglob("*.py"))
    return f"{interpreter(sys.executable)}|{root}|" + ",".join(f"{p.relative_to(root)}:{p.stat().st_mtime_ns}" for p in files)


def interpreter(executable: str) -> str:
    """An interpreter as its environment (the folder of a venv's bin) and the binary it runs:
    a venv's `python` and `python3` are the same interpreter."""
    return f"{os.path.dirname(os.path.abspath(executable))}:{os.path.realpath(executable)}"


def import_time_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) and k not in SET_PER_RUN}


def _address(name: str) -> str:
    return "\0" + name  # the abstract namespace: no file to leave behind, and not reachable from another network namespace (node)


# ----------------------------------------------------------------------------- owner side


START_TIMEOUT_S = 30.0
"""How long start_server waits for the server to listen (an interpreter start, ~0.15 s idle)."""


def start_server(owner_dir: str | Path | None = None) -> subprocess.Popen | None:
    """Start a server owned by this process (it dies with it) and name it in os.environ for the
    launchers this process starts. owner_dir goes on the server's command line, so that a check
    for processes left behind in that folder sees the server too."""
    name = f"scalelab-prefork-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "scalelab.run.prefork", "--name", name, "--owner", str(os.getpid())]
    if owner_dir is not None:
        cmd += ["--for", str(Path(owner_dir).resolve())]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(PREFORK_ENV, None)
    server = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              start_new_session=True,  # a terminal's Ctrl-C reaches the launchers, which stop their runs
                              preexec_fn=die_with_parent)
    # Named only once it listens: a launcher asking earlier would start new processes.
    listening = select.select([server.stdout], [], [], START_TIMEOUT_S)[0] and server.stdout.readline() == b"listening\n"
    server.stdout.close()
    if not listening:
        server.kill()
        server.wait()
        print(f"scalelab: the prefork server did not start within {START_TIMEOUT_S:g} s; runs start their ranks as "
              "new processes", file=sys.stderr)
        return None
    os.environ[PREFORK_ENV] = server.prefork_name = name
    return server


def stop_server(server: subprocess.Popen | None) -> None:
    """Stop a server started by start_server (its running ranks are killed) and forget its name."""
    if server is None:
        return
    if os.environ.get(PREFORK_ENV) == server.prefork_name:
        os.environ.pop(PREFORK_ENV)
    server.terminate()
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


# ----------------------------------------------------------------------------- launcher side


class _Channel:
    """The launcher's connection to the server for one run: the ranks' exit codes arrive on it."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""
        self.codes: dict[int, int] = {}
        self.pids: list[int] = []
        self.server_lost = False

    def send(self, message: dict, fds: list[int] = ()) -> None:
        data = json.dumps(message).encode() + b"\n"
        sent = socket.send_fds(self.sock, [data], list(fds))
        self.sock.sendall(data[sent:])

    def receive(self, timeout: float | None) -> dict | None:
        """The next message; None if none came within timeout. EOFError when the server is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.sock], [], [], left)[0]:
                return None
            try:
                chunk = self.sock.recv(65536)
            except OSError as err:
                raise EOFError(f"the prefork server's connection failed: {err}") from err
            if not chunk:
                raise EOFError("the prefork server closed the connection")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def pump(self, timeout: float) -> None:
        try:
            while (message := self.receive(timeout)) is not None:
                self.codes[message["pid"]] = message["code"]
                timeout = 0
        except EOFError:  # the server died: its children were sent SIGTERM (PR_SET_PDEATHSIG)
            self.server_lost = True
            for pid in self.pids:
                self.codes.setdefault(pid, -signal.SIGTERM)

    def close(self) -> None:
        self.sock.close()


class ForkedRank:
    """A rank forked by the server, with the part of subprocess.Popen's interface the launcher uses."""

    def __init__(self, channel: _Channel, pid: int):
        self.channel, self.pid = channel, pid

    @property
    def returncode(self) -> int | None:
        return self.channel.codes.get(self.pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.channel.pump(0)
        return self.returncode

    def wait(self, timeout: float = 60.0) -> int:
        """The exit code; a server that reports nothing within timeout (after the group was
        SIGKILLed: never, short of a stalled server) counts as lost."""
        deadline = time.monotonic() + timeout
        while self.returncode is None:
            if time.monotonic() >= deadline:
                self.channel.server_lost = True
                self.channel.codes[self.pid] = -signal.SIGKILL
                break
            self.channel.pump(1.0)
        return self.returncode


def fork_ranks(processes: list[tuple[list[str], dict]], log_fd: int) -> tuple[list[ForkedRank] | None, str | None]:
    """Ask the server named in the environment to fork these ranks (commands ``python -m
    scalelab.run.worker ...``, or another module of ``FORKABLE``, with their environments), their
    output on log_fd: (ranks in the order given, None), or (None, why not) when there is no server
    or it refused; the caller then starts new processes. The ranks' group is led by the first."""
    name = os.environ.get(PREFORK_ENV)
    if not name:
        return None, None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(_address(name))
    except OSError as err:
        sock.close()
        return None, f"prefork server {name} not reachable ({err.strerror or err})"
    channel = _Channel(sock)
    limits = {name_: resource.getrlimit(getattr(resource, name_)) for name_ in RLIMITS if hasattr(resource, name_)}
    umask = os.umask(0)
    os.umask(umask)
    try:
        channel.send({"ranks": [{"argv": cmd, "env": env} for cmd, env in processes], "cwd": os.getcwd(),
                      "code": code_stamp(), "affinity": sorted(os.sched_getaffinity(0)), "umask": umask,
                      "rlimits": limits}, [log_fd])
        reply = channel.receive(READY_TIMEOUT_S)
    except (OSError, EOFError) as err:
        channel.close()
        return None, f"prefork server {name} failed: {err}"
    if reply is None or "refused" in reply:
        channel.close()
        return None, f"prefork server {name} refused: {reply['refused']}" if reply else \
            f"prefork server {name} did not answer within {READY_TIMEOUT_S:g} s"
    channel.pids = reply["pids"]
    return [ForkedRank(channel, pid) for pid in reply["pids"]], None


# ----------------------------------------------------------------------------- server side


class _Server:
    def __init__(self, name: str, owner: int):
        self.owner = owner
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(_address(name))
        self.listener.listen(64)
        print("listening", flush=True)  # start_server waits for this line
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        self.runs: dict[socket.socket, dict] = {}  # connection -> {"pids": [], "group": pgid, "buffer", "fds"}
        self.env = import_time_env(os.environ)
        self.env_after_import: dict | None = None  # set by the first request's imports
        self.code = code_stamp()  # before the imports: an edit while they run is an edit after this
        import setproctitle

        # Claims the command line's memory now, with the environment intact; a child that first
        # calls it after replacing its environment could find too little room and keep this title.
        setproctitle.setproctitle(setproctitle.getproctitle())

    def import_once(self) -> None:
        if self.env_after_import is not None:
            return
        import_rank_modules()
        # what torch's imports set for themselves (TorchDynamo: TORCHINDUCTOR_CACHE_DIR): a launcher
        # that has imported torch passes them on, with the values the child has already
        self.env_after_import = import_time_env(os.environ)

    def refusal(self, request: dict, conn: socket.socket) -> str | None:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
        if uid != os.getuid():
            return f"the server serves user {os.getuid()} only, not {uid}"
        if request.get("code") != self.code:
            return "the launcher's Python or scalelab source differs from what the server imported " \
                   "(edited since the server started?)"
        for rank in request["ranks"]:
            argv = rank["argv"]
            if interpreter(argv[0]) != interpreter(sys.executable) or argv[1] != "-m" or argv[2] not in FORKABLE:
                return f"not a scalelab worker: {' '.join(argv[:3])}"
            asked = import_time_env(rank["env"])
            keys = sorted(k for k in asked.keys() | self.env.keys()
                          if asked.get(k) not in (self.env.get(k), self.env_after_import.get(k)))
            if keys:
                return f"import-time environment differs from the server's: {', '.join(keys)}"
        return None

    def serve(self) -> None:
        while os.getppid() == self.owner:
            ready = select.select([self.listener, *self.runs], [], [], 0.05)[0]
            for sock in ready:
                if sock is self.listener:
                    conn, _ = self.listener.accept()
                    self.runs[conn] = {"pids": [], "group": None, "buffer": b"", "fds": []}
                elif sock in self.runs:
                    self.read(sock)
            self.reap()

    def drop(self, conn: socket.socket) -> None:
        """The launcher is done, or died: nothing of its run may outlive it."""
        run = self.runs.pop(conn)
        self.kill(run)
        for fd in run["fds"]:
            os.close(fd)
        conn.close()

    def read(self, conn: socket.socket) -> None:
        run = self.runs[conn]
        try:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
        except OSError:
            data, fds = b"", []
        run["fds"] += fds
        if not data:
            self.drop(conn)
            return
        run["buffer"] += data
        if b"\n" not in run["buffer"] or run["group"] is not None:
            return
        try:
            self.import_once()
            request = json.loads(run["buffer"].split(b"\n", 1)[0])
            reason = self.refusal(request, conn) if run["fds"] else "no log file descriptor came with the request"
        except Exception as err:  # a malformed request costs its own run only
            reason = f"bad request: {type(err).__name__}: {err}"
        if reason is None and self.gone(conn):  # it gave up waiting (and starts new processes)
            self.drop(conn)
            return
        if reason:
            self._send(conn, {"refused": reason})
            return
        # No SIGTERM between a fork and its bookkeeping: kill_all must see every child.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            for rank in request["ranks"]:
                pid = self.fork(rank, request, run["fds"][0], run["group"] or 0)
                run["group"] = run["group"] or pid
                run["pids"].append(pid)
        except OSError as err:  # fork failed: the ranks forked so far go, and the run learns why
            self.kill(run)
            self._send(conn, {"refused": f"fork failed: {err}"})
            return
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        self._send(conn, {"pids": list(run["pids"])})

    @staticmethod
    def gone(conn: socket.socket) -> bool:
        try:
            return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _send(self, conn: socket.socket, message: dict) -> None:
        try:
            conn.settimeout(5.0)  # a launcher that stopped reading cannot stall the other runs
            conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:  # the launcher is gone; its connection's EOF kills the run
            pass

    def fork(self, rank: dict, request: dict, log_fd: int, group: int) -> int:
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            self.child(rank, request, log_fd, group, server)  # never returns
        try:
            os.setpgid(pid, group or pid)  # also here: the launcher may signal the group before the child ran
        except OSError:
            pass
        return pid

    def child(self, rank: dict, request: dict, log_fd: int, group: int, server: int) -> NoReturn:
        def become_the_rank() -> int:
            os.setpgid(0, group)
            for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            die_with_parent()
            if os.getppid() != server:  # the server died before the line above
                os._exit(1)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            # what a new process would not have: the server's sockets and the other runs' logs
            for sock in [self.listener, *self.runs]:
                sock.close()
            for fd in {devnull, *(fd for run in self.runs.values() for fd in run["fds"])}:
                os.close(fd)
            os.chdir(request["cwd"])
            sys.path[0] = request["cwd"]  # `python -m` puts the working directory first
            os.environ.clear()
            os.environ.update(rank["env"])
            os.sched_setaffinity(0, request["affinity"])
            os.umask(request["umask"])
            for name, (soft, hard) in request["rlimits"].items():
                resource.setrlimit(getattr(resource, name), (soft, hard))
            import setproctitle

            setproctitle.setproctitle(" ".join(rank["argv"]))
            sys.argv = [rank["argv"][2], *rank["argv"][3:]]
            import importlib

            return importlib.import_module(rank["argv"][2]).main(rank["argv"][3:])

        end_as_a_process(become_the_rank)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for conn, run in self.runs.items():
                if pid in run["pids"]:
                    run["pids"].remove(pid)
                    self._send(conn, {"pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def kill(self, run: dict) -> None:
        if run["group"] is None or not run["pids"]:  # all reaped: the group id may be another's by now
            return
        try:
            os.killpg(run["group"], signal.SIGKILL)
        except ProcessLookupError:
            pass

    def kill_all(self) -> None:
        for run in self.runs.values():
            self.kill(run)


def _stop(*_) -> None:
    """SIGTERM: exit once. A second TERM (Snakemake's, after the owner's) would otherwise raise inside the exit's own
    clean-up (torch's finalizers) and print a traceback after a Ctrl-C."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="scalelab prefork server (started by scalelab.run.prefork.start_server)")
    parser.add_argument("--name", required=True, help="abstract socket name")
    parser.add_argument("--owner", type=int, required=True, help="the process that owns the server; it exits with it")
    parser.add_argument("--for", dest="owner_dir", help="the folder of the runs it serves (shown to process listings)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)
    server = None
    try:
        server = _Server(args.name, args.owner)
        server.serve()
    finally:
        if server is not None:
            server.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
