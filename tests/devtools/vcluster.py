"""A virtual multi-node SLURM cluster on one machine: one network namespace per node.

    PYTHONPATH=tests python -m devtools.vcluster up --nodes 2 [--link-mbit 1000] [--config-at default|env]
    PYTHONPATH=tests python -m devtools.vcluster exec -- snakemake --profile workflow/profiles/slurm ...
    PYTHONPATH=tests python -m devtools.vcluster status
    PYTHONPATH=tests python -m devtools.vcluster down

The shape (Debian 12's Slurm 22.05 and munge, as root)::

    host namespace: untouched (no address, route, port or file of the cluster)
    netns <name>-ctl  hostname ctl  10.77.0.1/24 on a bridge inside it   slurmctld, the clients
      veth -- netns <name>-n1  hostname n1  10.77.0.11/24                 slurmd
      veth -- netns <name>-n2  hostname n2  10.77.0.12/24                 slurmd

No namespace has a default route: a packet to any other address fails in the kernel. The
bridge lives inside the cluster's own ctl namespace, so two clusters (other names) run at once
with the same addresses. Every daemon runs in the foreground (``-D``/``-F``) and its PID is
kept (with its start time, so a reused PID is never killed). A namespace is entered with
``nsenter --net`` plus ``unshare --uts --mount`` (not ``ip netns exec``, which mounts a fresh
/sys and hides /sys/fs/cgroup, where slurmd 22.05 dies), then sets its hostname and
bind-mounts private files over /etc/hosts and /etc/resolv.conf (127.0.0.1: a failed lookup
never reaches the host's resolver), a tmpfs over /run/slurm (no configless cache link of
another cluster is seen, and none outlives this one) and, with ``config_at="default"``, the
cluster's config folder over /etc/slurm. With ``config_at="env"`` no slurm.conf is at the
default path: clients find it only through ``SLURM_CONF`` (:attr:`VirtualCluster.env`), as at
a site with a module-loaded Slurm. One private munged serves every namespace (its socket is
found by path; Slurm is pointed at it with ``AuthInfo=socket=``). ``--link-mbit`` limits each
node's link both ways with ``tc`` tbf (netem is not in every kernel).

:meth:`VirtualCluster.down` ends every process in the cluster's namespaces (slurmstepd and the
jobs' processes included), the daemons, deletes the namespaces and the cluster's folder:
nothing is left (:func:`leftovers` counts it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.run.processes import process_start

DEFAULT_ROOT = Path(os.environ.get("SCALELAB_VCLUSTER_ROOT", "/tmp/scalelab-vcluster"))
"""Where the CLI keeps each cluster's folder (<root>/<name>): config, state, logs, PIDs."""
SUBNET = "10.77.0"
CTL_ADDR = f"{SUBNET}.1"
PARTITION = "vc"
STATE_FILE = "cluster.json"
TOOLS = ("ip", "tc", "nsenter", "unshare", "munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scancel")
CMD_TIMEOUT_S = 30


class ClusterError(RuntimeError):
    pass


def unavailable() -> str | None:
    """None if a virtual cluster can be started here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "a virtual cluster (network namespaces, slurmctld, slurmd) needs root"
    missing = [t for t in TOOLS if shutil.which(t) is None and not any(Path(d, t).exists() for d in ("/usr/sbin", "/sbin"))]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge iproute2 util-linux; `make slurm`)"
    try:  # root in a container may still be refused namespaces
        probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"cannot create namespaces here (unshare --net --uts --mount: {err})"
    if probe.returncode != 0:
        return f"cannot create namespaces here (unshare --net --uts --mount: {probe.stderr.strip()})"
    return None


def _run(argv: list[str], timeout: float = CMD_TIMEOUT_S, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (scalelab.run.processes), None if gone."""
    start = process_start(pid)
    return None if start is None else int(start)


def _alive(pid: int, started: int | None) -> bool:
    now = _start_time(pid)
    return now is not None and (started is None or now == started)


def _end(pids: list[tuple[int, int | None]], grace_s: float = 5) -> None:
    """SIGTERM these processes (each still the one recorded), SIGKILL what is left after grace_s."""
    live = [(p, s) for p, s in pids if _alive(p, s)]
    for pid, _ in live:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        for pid, _ in live:  # reap our own children, so a dead one reads as gone
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        live = [(p, s) for p, s in live if _alive(p, s) and not _zombie(p)]
        time.sleep(0.05)
    for pid, _ in live:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while live and time.monotonic() < deadline:  # SIGKILL is not instant: wait until each is gone
        for pid, _ in live:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        live = [(p, s) for p, s in live if _alive(p, s) and not _zombie(p)]
        time.sleep(0.02)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@dataclass
class VirtualCluster:
    """N SLURM nodes as network namespaces. ``with VirtualCluster(root, nodes=2) as c:``."""

    root: Path
    nodes: int = 2
    name: str = ""
    link_mbit: float | None = None
    config_at: str = "default"
    """'default': slurm.conf at /etc/slurm/slurm.conf inside the cluster's namespaces;
    'env': only SLURM_CONF names it (no file at the default path)."""
    cpus: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    """CPUs each node declares (the nodes share this machine's cores)."""
    memory_mb: int = 8000
    """RealMemory each node declares."""
    pids: dict = field(default_factory=dict)
    """daemon name -> [pid, start time]."""
    netns_inodes: list = field(default_factory=list)
    """The inodes of the cluster's network namespaces: what a process inside one of them shows in
    /proc/PID/ns/net (found even after the namespace's name is gone)."""
    munge_dir: str = ""
    """munged's socket folder: under the system's temporary folder, since munged wants every
    folder above its socket open to all (a test's tmp_path is not); removed by down()."""

    def __post_init__(self):
        self.root = Path(self.root).resolve()
        self.name = self.name or f"vc{secrets.token_hex(3)}"
        if self.config_at not in ("default", "env"):
            raise ValueError(f"config_at={self.config_at!r}: 'default' (/etc/slurm/slurm.conf) or 'env' (SLURM_CONF)")
        if not 1 <= self.nodes <= 200:
            raise ValueError(f"nodes={self.nodes}: 1 to 200")

    # ------------------------------------------------------------------ names and paths
    @property
    def ctl_ns(self) -> str:
        return f"{self.name}-ctl"

    def node_ns(self, i: int) -> str:
        return f"{self.name}-n{i}"

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def node_addr(self, i: int) -> str:
        return f"{SUBNET}.{10 + i}"

    @property
    def namespaces(self) -> list[str]:
        return [self.ctl_ns, *(self.node_ns(i) for i in range(1, self.nodes + 1))]

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return Path(self.munge_dir) / "munge.socket"

    @property
    def env(self) -> dict:
        """The environment for clients (sbatch, srun, Snakemake) run through :meth:`command`:
        SLURM_CONF is set only where the config is not at the default path."""
        env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
        if self.config_at == "env":
            env["SLURM_CONF"] = str(self.conf)
        return env

    # ------------------------------------------------------------------ entering a namespace
    def _setup(self, hostname: str) -> str:
        """Shell lines that make a fresh mount+UTS namespace this host: hostname, private
        hosts and resolv.conf, a private /run/slurm, the config at the default path if asked."""
        q = shlex.quote
        lines = [f"hostname {q(hostname)}",
                 f"mount --bind {q(str(self.etc / 'hosts'))} /etc/hosts",
                 f"mount --bind {q(str(self.etc / 'resolv.conf'))} /etc/resolv.conf",
                 "if [ -d /run/slurm ]; then mount -t tmpfs -o size=1m,mode=0755 vcluster /run/slurm; fi"]
        if self.config_at == "default":
            lines += ["{ [ -d /etc/slurm ] || { echo 'vcluster: no /etc/slurm to hold the config (install slurm-wlm)' >&2; false; }; }",
                      f"mount --bind {q(str(self.etc))} /etc/slurm"]
        return " && ".join(lines)

    def _enter(self, ns: str, hostname: str, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", self._setup(hostname) + ' && exec "$@"', "vcluster-" + hostname, *argv]

    def command(self, argv: list[str]) -> list[str]:
        """argv run as a client of this cluster: in its ctl namespace, with its files (use with :attr:`env`)."""
        return self._enter(self.ctl_ns, "ctl", argv)

    def run(self, argv: list[str], timeout: float = CMD_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
        return _run(self.command(argv), timeout=timeout, check=check, env=self.env)

    # ------------------------------------------------------------------ up
    def up(self, timeout_s: float = 30) -> "VirtualCluster":
        if reason := unavailable():
            raise ClusterError(reason)
        taken = set(_run(["ip", "netns", "list"]).stdout.split())
        if any(ns in taken for ns in self.namespaces):
            raise ClusterError(f"namespaces of a cluster named {self.name} exist already (`ip netns list`); "
                               f"bring it down first (PYTHONPATH=tests python -m devtools.vcluster down --name {self.name})")
        if self.root.exists() and any(self.root.iterdir()):
            raise ClusterError(f"{self.root} is not empty: another cluster's folder? (down removes it)")
        try:
            self._write_files()
            self._network()
            self._start("munged", ["munged", "-F", "--key-file", str(self.root / "munge-key" / "munge.key"),
                                   "--socket", str(self.munge_socket), "--pid-file", str(self.root / "run" / "munged.pid"),
                                   "--seed-file", str(self.root / "munge-key" / "munged.seed"),
                                   "--log-file", str(self.root / "log" / "munged.log")])
            self._wait(lambda: self.munge_socket.exists(), 10, "munged did not create its socket")
            conf = [] if self.config_at == "default" else ["-f", str(self.conf)]
            self._start("slurmctld", self._enter(self.ctl_ns, "ctl", ["slurmctld", "-D", "-i", *conf]))
            for i, node in enumerate(self.node_names, 1):
                self._start(f"slurmd-{node}", self._enter(self.node_ns(i), node, ["slurmd", "-D", "-N", node, *conf]))
            self._save()
            self._wait(self._all_idle, timeout_s, "the nodes did not become idle")
        except ClusterError as err:
            logs = self.logs()
            self.down()
            raise ClusterError(f"{err}\n{logs}") from None
        except BaseException:
            self.down()
            raise
        return self

    def _write_files(self) -> None:
        for sub in ("etc", "state", "log", "run", "munge-key", *(f"spool/{n}" for n in self.node_names)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # munged's rules: the socket's folder (and every one above it) open to all, the key's folder its own
        self.munge_dir = tempfile.mkdtemp(prefix=f"scalelab-{self.name}-munge-")
        os.chmod(self.munge_dir, 0o755)
        (self.root / "munge-key").chmod(0o700)
        key = self.root / "munge-key" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        hosts = ["127.0.0.1 localhost", "::1 localhost", f"{CTL_ADDR} ctl", f"::ffff:{CTL_ADDR} ctl"]
        for i, node in enumerate(self.node_names, 1):
            hosts += [f"{self.node_addr(i)} {node}", f"::ffff:{self.node_addr(i)} {node}"]
        (self.etc / "hosts").write_text("\n".join(hosts) + "\n")
        (self.etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        (self.etc / "plugstack.conf").write_text("")
        nodes = "\n".join(f"NodeName={n} NodeAddr={self.node_addr(i)} CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN"
                          for i, n in enumerate(self.node_names, 1))
        r = self.root
        self.conf.write_text(f"""\
# A virtual cluster (devtools.vcluster): {self.nodes} node(s), network namespaces {self.name}-*
ClusterName={self.name}
SlurmctldHost=ctl({CTL_ADDR})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
PlugStackConfig={self.etc / 'plugstack.conf'}
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
{nodes}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")

    def _network(self) -> None:
        for ns in self.namespaces:
            _run(["ip", "netns", "add", ns])
            self.netns_inodes.append(os.stat(f"/run/netns/{ns}").st_ino)
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        ctl = self.ctl_ns
        _run(["ip", "-n", ctl, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", ctl, "addr", "add", f"{CTL_ADDR}/24", "dev", "br0"])
        _run(["ip", "-n", ctl, "link", "set", "br0", "up"])
        for i in range(1, self.nodes + 1):
            ns, veth = self.node_ns(i), f"v{i}"
            _run(["ip", "-n", ctl, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "-n", ctl, "link", "set", veth, "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.node_addr(i)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            if self.link_mbit:
                # each direction of the node's link: out of the node (eth0), into it (the bridge port)
                for where, dev in ((ns, "eth0"), (ctl, veth)):
                    _run(["tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{self.link_mbit:g}mbit",
                          "burst", "32kbit", "latency", "400ms"])

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        try:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"})
        finally:
            log.close()
        self.pids[name] = [proc.pid, _start_time(proc.pid)]
        self._save()

    def _save(self) -> None:
        state = {"name": self.name, "root": str(self.root), "nodes": self.nodes, "link_mbit": self.link_mbit,
                 "config_at": self.config_at, "cpus": self.cpus, "memory_mb": self.memory_mb, "pids": self.pids,
                 "munge_dir": self.munge_dir, "netns_inodes": self.netns_inodes}
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.root / STATE_FILE)

    @classmethod
    def load(cls, root: Path) -> "VirtualCluster":
        state = json.loads((Path(root) / STATE_FILE).read_text())
        root = state.pop("root")
        return cls(root=Path(root), **state)

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [n for n, (pid, started) in self.pids.items() if not _alive(pid, started) or _zombie(pid)]
            if dead:
                raise ClusterError(f"{what}: {', '.join(dead)} exited (logs in {self.root / 'log'})")
            if ready():
                return
            time.sleep(0.1)
        raise ClusterError(f"{what} within {timeout_s:g} s")

    def _all_idle(self) -> bool:
        proc = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=10)
        states = dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)
        return proc.returncode == 0 and all(states.get(n) == "idle" for n in self.node_names)

    # ------------------------------------------------------------------ inspection
    def logs(self, tail: int = 3000) -> str:
        out = []
        for path in sorted((self.root / "log").glob("*")) if (self.root / "log").is_dir() else []:
            text = path.read_text(errors="replace")
            if text.strip():
                out.append(f"--- {path.name}\n{text[-tail:]}")
        return "\n".join(out)

    def status(self) -> dict:
        daemons = {n: ("running" if _alive(pid, s) and not _zombie(pid) else "gone") for n, (pid, s) in self.pids.items()}
        sinfo = self.run(["sinfo", "-h", "-N", "-o", "%N %T %c %m"], check=False, timeout=10) \
            if daemons.get("slurmctld") == "running" else None
        return {"name": self.name, "root": str(self.root), "config_at": self.config_at, "link_mbit": self.link_mbit,
                "daemons": daemons, "nodes": sinfo.stdout.strip().splitlines() if sinfo and sinfo.returncode == 0 else []}

    def jobs_submitted(self) -> int:
        """Batch jobs slurmctld has accepted (its log: with no accounting, it is the record)."""
        log = self.root / "log" / "slurmctld.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return len(set(re.findall(r"_slurm_rpc_submit_batch_job: JobId=(\d+)", text)))

    # ------------------------------------------------------------------ down
    def down(self) -> None:
        """End every process of the cluster, delete its namespaces and its folder."""
        existing = set(_run(["ip", "netns", "list"], check=False).stdout.split())
        ours = [ns for ns in self.namespaces if ns in existing]
        if self.pids.get("slurmctld") and _alive(*self.pids["slurmctld"]):
            self.run(["scancel", "--full", "--partition", PARTITION], check=False, timeout=10)
        # Every process inside a node namespace (slurmd, slurmstepd, job steps, ranks), then the
        # controller's namespace; the daemons by their kept PIDs too (one may not have entered yet).
        # Every process inside a node namespace (slurmd, slurmstepd, job steps, ranks), then the
        # controller's namespace, then munged; the daemons by their kept PIDs too (one may not
        # have entered its namespace yet). Rounds until a namespace is empty: a slurmstepd may
        # start a process while the last round ends.
        node_ns = [ns for ns in ours if ns != self.ctl_ns]
        kept = lambda which: [tuple(v) for n, v in self.pids.items() if which(n)]  # noqa: E731
        for namespaces, daemons in ((node_ns, kept(lambda n: n.startswith("slurmd-"))),
                                    ([ns for ns in ours if ns == self.ctl_ns], kept(lambda n: n == "slurmctld")),
                                    ([], kept(lambda n: True))):
            _end(daemons + [(p, _start_time(p)) for ns in namespaces for p in self._ns_pids(ns)])
            for _ in range(20):
                inside = [(p, _start_time(p)) for ns in namespaces for p in self._ns_pids(ns)]
                if not inside:
                    break
                _end(inside, grace_s=1)
        for ns in ours:
            if left := self._ns_pids(ns):  # never delete a namespace's name under live processes silently
                raise ClusterError(f"processes {left} in namespace {ns} would not end; it is kept (ip netns pids {ns})")
            _run(["ip", "netns", "delete", ns], check=False)
        if self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)
        if self.munge_dir:
            shutil.rmtree(self.munge_dir, ignore_errors=True)

    @staticmethod
    def _ns_pids(ns: str) -> list[int]:
        out = _run(["ip", "netns", "pids", ns], check=False)
        return [int(p) for p in out.stdout.split() if p.isdigit() and int(p) != os.getpid()]

    def leftovers(self) -> dict[str, list[str]]:
        """What of this cluster is still on the machine (all empty after :meth:`down`), whatever
        other clusters run beside it: its namespaces and their /run/netns mounts, processes in
        its network namespaces or with its kept PIDs, its folders."""
        existing = set(_run(["ip", "netns", "list"], check=False).stdout.split())
        inodes = {f"net:[{i}]" for i in self.netns_inodes}
        kept = {pid for pid, started in self.pids.values() if _alive(pid, started) and not _zombie(pid)}
        processes = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and not _zombie(int(proc.name)):
                try:
                    inside = os.readlink(proc / "ns" / "net") in inodes
                except OSError:
                    continue
                if inside or int(proc.name) in kept:
                    processes.append(f"{proc.name} {(proc / 'comm').read_text().strip() if (proc / 'comm').exists() else '?'}")
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                  if line.split()[1].startswith(f"/run/netns/{self.name}-")]
        folders = [str(p) for p in (self.root, Path(self.munge_dir) if self.munge_dir else None) if p and p.exists()]
        return {"namespaces": [ns for ns in self.namespaces if ns in existing], "processes": processes,
                "mounts": mounts, "folders": folders}

    def __enter__(self) -> "VirtualCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def leftovers(name: str | None = None) -> dict[str, list[str]]:
    """What a virtual cluster could leave behind, counted on the machine: its namespaces, daemons
    (slurmctld, slurmd, slurmstepd, munged), mounts (/run/netns/*) and the configless cache
    link /run/slurm/conf, munged's socket folders. With name, only that cluster's namespaces,
    mounts and folders."""
    prefix = f"{name}-" if name else "vc"
    netns = [ns for ns in _run(["ip", "netns", "list"], check=False).stdout.split() if ns.startswith(prefix)]
    daemons = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                comm = (proc / "comm").read_text().strip()
            except OSError:
                continue
            # a zombie has ended (init reaps it when it gets to it: slurmstepd's double fork)
            if comm in ("slurmctld", "slurmd", "slurmstepd", "munged") and not _zombie(int(proc.name)):
                daemons.append(f"{proc.name} {comm}")
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.split()[1].startswith(f"/run/netns/{prefix}")]
    link = ["/run/slurm/conf"] if os.path.lexists("/run/slurm/conf") else []
    folders = sorted(str(p) for p in Path(tempfile.gettempdir()).glob(f"scalelab-{name or ''}*-munge-*"))
    return {"namespaces": netns, "daemons": daemons, "mounts": mounts, "conf_links": link, "munge_folders": folders}


# ---------------------------------------------------------------------- CLI
def _cluster_root(args) -> Path:
    return Path(args.root) if args.root else DEFAULT_ROOT / args.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.vcluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    for action in ("up", "down", "status", "exec"):
        p = sub.add_parser(action)
        p.add_argument("--name", default="vc1", help="the cluster's name: namespaces <name>-ctl, <name>-n1, ... (default vc1)")
        p.add_argument("--root", help=f"the cluster's folder (default {DEFAULT_ROOT}/<name>)")
        if action == "up":
            p.add_argument("--nodes", type=int, default=2)
            p.add_argument("--link-mbit", type=float, help="limit each node's link to this many Mbit/s each way (tc tbf)")
            p.add_argument("--config-at", choices=("default", "env"), default="default",
                           help="slurm.conf at /etc/slurm/slurm.conf in the cluster's namespaces, or named only by SLURM_CONF")
            p.add_argument("--timeout", type=float, default=30)
        if action == "exec":
            p.add_argument("argv", nargs=argparse.REMAINDER, help="-- command to run as a client of the cluster")
    args = parser.parse_args(argv)
    root = _cluster_root(args)
    if args.action == "up":
        started = time.monotonic()
        cluster = VirtualCluster(root, nodes=args.nodes, name=args.name, link_mbit=args.link_mbit, config_at=args.config_at)
        try:
            cluster.up(args.timeout)
        except ClusterError as err:
            print(f"vcluster: {err}", file=sys.stderr)
            return 1
        print(f"vcluster {args.name}: {args.nodes} node(s) idle in {time.monotonic() - started:.1f} s; folder {root}")
        print(f"run clients with: PYTHONPATH=tests python -m devtools.vcluster exec --name {args.name} -- sinfo")
        if cluster.config_at == "env":
            print(f"(the config is named only by SLURM_CONF={cluster.conf}; exec sets it)")
        return 0
    if not (root / STATE_FILE).exists():
        if args.action == "down":
            left = leftovers(args.name)
            for ns in left["namespaces"]:  # a cluster whose folder is gone: end what runs in its namespaces
                _end([(p, _start_time(p)) for p in VirtualCluster._ns_pids(ns)])
                _run(["ip", "netns", "delete", ns], check=False)
            print(f"vcluster {args.name}: no cluster folder at {root}" + (f"; deleted {left['namespaces']}" if left["namespaces"] else ""))
            return 0
        print(f"vcluster {args.name}: no cluster at {root} (PYTHONPATH=tests python -m devtools.vcluster up --name {args.name})", file=sys.stderr)
        return 1
    cluster = VirtualCluster.load(root)
    if args.action == "down":
        started = time.monotonic()
        cluster.down()
        if not args.root:
            try:
                DEFAULT_ROOT.rmdir()  # the last CLI cluster's folder's parent, when empty
            except OSError:
                pass
        print(f"vcluster {args.name}: down in {time.monotonic() - started:.1f} s; left behind: {leftovers(args.name)}")
        return 0
    if args.action == "status":
        print(json.dumps(cluster.status(), indent=1))
        return 0
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        parser.error("exec needs a command after --")
    return subprocess.run(cluster.command(command), env=cluster.env).returncode


if __name__ == "__main__":
    sys.exit(main())
