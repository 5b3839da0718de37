"""A one-node SLURM cluster on this machine, for tests: munged + slurmctld + slurmd.

Debian 12's Slurm 22.05 as root, in the configuration seen to work on these machines:
proctrack/linuxproc, task/none, no accounting, no cgroup.conf, NodeName from `slurmd -C`.
Everything (config, state, logs, pid files) lives in a temporary folder; stop() cancels
jobs and kills every daemon it started, so nothing outlives the test.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from scalelab.training.launch import free_port

SBIN = ("/usr/sbin", "/usr/bin")


def slurm_available() -> str | None:
    """None if a test cluster can be started here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "starting slurmctld/slurmd needs root"
    from scalelab.harness.testing import SLURM_PLUGIN_DIR

    if not (SLURM_PLUGIN_DIR / "snakemake_executor_plugin_slurm").is_dir():
        return f"the SLURM executor plugin is not in {SLURM_PLUGIN_DIR} (`make setup` puts it there)"
    for tool in ("slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue"):
        if not any(Path(d, tool).exists() for d in SBIN):
            return f"{tool} not installed (apt-get install slurm-wlm munge; `make slurm`)"
    return None


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._procs: list[int] = []

    def _node_line(self) -> str:
        line = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
        return line + " State=UNKNOWN"

    def start(self, timeout: float = 60) -> "SlurmCluster":
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        host = socket.gethostname()
        self.ctld_port = free_port()
        self.conf.write_text(f"""\
ClusterName=scalelabtest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
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
SlurmctldParameters=enable_configless
SlurmctldPort={self.ctld_port}
SlurmdPort={free_port()}
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd.pid
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
{self._node_line()}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")
        self._start_munge()
        subprocess.run(["slurmctld", "-f", str(self.conf)], env=self.env, check=True)
        # Configless slurmd: it fetches the config from slurmctld and points the job steps'
        # SLURM_CONF at its cached copy, so `srun` inside a job finds the cluster without a
        # file in /etc/slurm (SLURM does not pass the submitter's SLURM_CONF into jobs).
        subprocess.run(["slurmd", "--conf-server", f"{host}:{self.ctld_port}"], env={k: v for k, v in self.env.items() if k != "SLURM_CONF"}, check=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip() in ("idle", "mixed", "allocated"):
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"SLURM node did not become idle: {out.stdout} {out.stderr}\n{self.logs()}")

    def _start_munge(self) -> None:
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
            return  # already running (a previous test, or the machine's own)
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
        self._started_munge = True

    def logs(self) -> str:
        text = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.root / "log" / name
            if path.exists():
                text.append(f"--- {name}\n" + path.read_text()[-3000:])
        return "\n".join(text)

    def jobs_submitted(self) -> int:
        """Jobs slurmctld has allocated (from its log: with no accounting, this is the record)."""
        log = (self.root / "log" / "slurmctld.log").read_text()
        return log.count("sched: Allocate JobId=") + log.count("_slurm_rpc_submit_batch_job: JobId=") // 2

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, capture_output=True)
        for pidfile in ("slurmd.pid", "slurmctld.pid"):
            path = self.root / pidfile
            if path.exists():
                try:
                    pid = int(path.read_text().strip())
                    os.kill(pid, signal.SIGTERM)
                    for _ in range(50):
                        os.kill(pid, 0)
                        time.sleep(0.1)
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        # slurmstepd processes of any job still alive
        subprocess.run(["pkill", "-f", f"slurmstepd.*{self.root}"], capture_output=True)
        if getattr(self, "_started_munge", False):
            subprocess.run(["pkill", "-x", "munged"], capture_output=True)
