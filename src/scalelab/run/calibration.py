"""A CPU sweep's peak FLOP/s, measured once (with the machine's load: busy above its core count), each CPU
rank's cores, and the hypervisor's share of them (steal: the time a virtual machine's host gave to other guests).

MFU divides by a peak. A GPU has a datasheet figure (scalelab.registries.hardware); a CPU has none here, so
its peak is the best matmul rate measured on it. Measured inside each run, it measured whatever
ran beside the run: one bf16 run got 4.68e10 FLOP/s against 7.8-8.4e10 for the others, and its
MFU read as perfect scaling while its throughput halved. So a CPU sweep measures it once per
invocation: the workflow's onstart (rules/hooks.smk) forgets the last invocation's record, and the first training
job measures it before its run starts (scalelab.run.sweep_calibration), when no other run trains (one at
a time: profiles/default's train_slot); every run reads that record and names it in
``peak_flops_source``. Not a job of its own: a calibration job made anew in every invocation
would be an input newer than every cached run, and Snakemake reruns a job whose input another
job updates (``ancient`` does not stop that), so retrying one run would retrain them all.
A run started outside the workflow (tests, scripts), on another host than the record's (a cluster
node), or whose ranks have another thread count, measures its own at start, and says so.

Torch is imported by the measuring process only (``python -m scalelab.run.calibration``, forked by the
invocation's prefork server when it has one: scalelab.run.sweep_calibration): the workflow's planning process
and the run's launcher import this module.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import socket
import time
from pathlib import Path

from scalelab.io import write_json
from scalelab.registries.hardware import cpu_name
from scalelab.registries.precisions import PRECISIONS
from scalelab.registries.precisions import precision as precision_record

CALIBRATION_SECONDS = 0.1
"""Matmul time per size and dtype, for the sweep's calibration and a run measuring its own alike:
the best of a few short bursts (``BURSTS``) within it. Measured here (one thread, idle): the best of
5 bursts of 0.02 s reads the same peak as a 0.5 s average to 1% (fp32 and bf16 at 128, bf16 at 512),
or up to 8% higher (fp32 at 512: the average carries the slower stretches), in a fifth of the time.
A sweep's calibration takes about 1 s instead of 4 (every Snakemake invocation measures one)."""
BURSTS = 5
CALIBRATED = tuple(sorted({p.matmul_precision for p in PRECISIONS.values()}))
"""The precisions whose matmuls CPU runs time (fp8's are bf16 there): every one is measured."""
MATMUL_SIZES = (128, 512)
"""Square matmul sizes: on a CPU the fastest size differs by dtype (emulated fp16 is fastest on
small matrices, bf16 on large ones), so the peak is the best of several."""


def measure_matmul_peak(device, dtype_name: str, seconds: float = CALIBRATION_SECONDS) -> float:
    """Best FLOP/s of square matmuls in a dtype (``float32``, ``bfloat16``, ``float16``) on a
    device, with the calling thread's intra-op threads: the device's practical peak. Per size, the
    best of up to ``BURSTS`` bursts of ``seconds / BURSTS`` (at least one matmul each; at least two
    bursts, so a size whose single matmul outlasts ``seconds``, emulated fp16 at 512, takes two)."""
    import torch

    from scalelab.run.devices import synchronize

    dtype = getattr(torch, dtype_name)
    best = 0.0
    for n in MATMUL_SIZES:
        a = torch.randn(n, n, device=device, dtype=dtype)
        a @ a  # warm-up
        size_started = time.perf_counter()
        for burst in range(BURSTS):
            reps, start = 0, time.perf_counter()
            while True:
                a @ a
                reps += 1
                synchronize(device)
                elapsed = time.perf_counter() - start
                if elapsed >= seconds / BURSTS:
                    break
            best = max(best, 2 * n ** 3 * reps / elapsed)
            if burst >= 1 and time.perf_counter() - size_started >= seconds:
                break
    return best


def matmul_precision(precision: str) -> str:
    """The precision whose matmuls a precision's run times on a CPU (fp8 runs compute in bf16 there)."""
    return precision_record(precision).matmul_precision


def calibrate_cpu(threads: int, seconds: float = CALIBRATION_SECONDS) -> dict:
    """Measure the matmul peak of every precision of CALIBRATED, with ``threads`` intra-op threads
    (one rank's), and return the record a run reads (``peak_for``)."""
    import torch

    torch.set_num_threads(threads)
    device = torch.device("cpu")
    load = machine_load()  # before measuring: the measurement's own threads add to it
    started = time.time()
    peaks = {name: measure_matmul_peak(device, precision_record(name).compute, seconds) for name in CALIBRATED}
    return {
        "device_type": "cpu", "device_name": cpu_name(), "hostname": socket.gethostname(),
        "threads": threads, "peaks_flops": peaks, "seconds_per_size": seconds, **load,
        "measured_utc": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
    }


BUSY_LOAD_PER_CORE = 1.0
"""A 1-minute load average above this many runnable processes per core the host has makes the calibration's
machine busy: more work wanted its cores than they could run, so the measured peak reads low (and every CPU
run's MFU high). A sweep's own launch can leave the load above the core count for a minute after it."""


def machine_load() -> dict:
    """The host's 1-minute load average and core count when a calibration starts (no load on a platform
    without getloadavg)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return {"load_1min": load, "host_cores": os.cpu_count()}


def load_text(record: dict) -> str:
    """How busy the machine was as its calibration measured: 'idle machine (load 0.4 on 2 cores)', 'busy
    machine (load 5.6 on 2 cores, above BUSY_LOAD_PER_CORE per core: the peak reads low)', or that a record
    of before this field did not measure it."""
    load, cores = record.get("load_1min"), record.get("host_cores")
    if load is None or not cores:
        return "machine load not recorded"
    if load > BUSY_LOAD_PER_CORE * cores:
        return f"busy machine (load {load:.1f} on {cores} cores, above the core count: the peak reads low)"
    return f"idle machine (load {load:.1f} on {cores} cores)"


CALIBRATION_FILE = Path("calibration") / "cpu.json"
"""Below the results folder."""


def calibration_path(results_dir: str | Path) -> Path:
    return Path(results_dir) / CALIBRATION_FILE


def write_calibration(path: str | Path, threads: int) -> dict:
    record = calibrate_cpu(threads)
    write_json(Path(path), record)
    return record


def read_calibration(path: str | Path | None) -> dict | None:
    """The calibration record at ``path``, or None (no path: a run outside the workflow)."""
    if not path:
        return None
    return json.loads(Path(path).read_text())


def applies(calibration: dict | None, threads: int) -> bool:
    """Whether a record measured what a rank of this host with ``threads`` intra-op threads runs on."""
    return bool(calibration) and calibration.get("threads") == threads and calibration.get("hostname") == socket.gethostname()


def peak_for(calibration: dict | None, precision: str, threads: int) -> tuple[float, str] | None:
    """(peak FLOP/s, its source) of a precision from the sweep's calibration, or None when there
    is none that applies: no record, another host, another thread count per rank."""
    if not applies(calibration, threads):
        return None
    dtype = matmul_precision(precision)
    peak = calibration["peaks_flops"].get(dtype)
    if peak is None:
        return None
    return float(peak), (f"sweep calibration: measured {dtype} matmul, {threads} thread(s), {load_text(calibration)}, "
                         f"{calibration['measured_utc']}")


# ----------------------------------------------------------------------------- a CPU rank's cores

def rank_cores(allowed: list[int], local_rank: int, local_ranks: int, threads_per_rank: int,
               launcher_slot: int = 0) -> list[int] | None:
    """The cores a CPU rank is pinned to: its own ``threads_per_rank`` of the launcher's allowed
    cores (a SLURM task's, or the machine's). Launchers packed on one host (launchers_per_node > 1,
    scalelab.planning.placement.gpu_index's rule for GPUs) see the same cores, so slot s takes the s-th block.
    None when the ranks do not fit (an overcommitted run, launched on purpose): they share the cores,
    and the run's row says so."""
    allowed = sorted(allowed)
    per_launcher = local_ranks * threads_per_rank
    first = 0 if len(allowed) == per_launcher else launcher_slot * per_launcher
    first += local_rank * threads_per_rank
    if first + threads_per_rank > len(allowed) or per_launcher > len(allowed):
        return None
    return allowed[first:first + threads_per_rank]


def describe_rank_cores(allowed: list[int], local_ranks: int, threads_per_rank: int, launcher_slot: int = 0) -> str:
    """What the run's row says about its cores (column ``rank_cores``): ``r0:0 r1:1`` or why shared."""
    plans = [rank_cores(allowed, r, local_ranks, threads_per_rank, launcher_slot) for r in range(local_ranks)]
    if any(cores is None for cores in plans):
        return (f"shared: {local_ranks} rank(s) x {threads_per_rank} thread(s) on {len(allowed)} core(s) "
                "(overcommitted on purpose; not a measurement)")
    return " ".join(f"r{r}:{','.join(map(str, cores))}" for r, cores in enumerate(plans))


def pin_this_rank(local_rank: int, local_ranks: int, threads_per_rank: int, launcher_slot: int = 0) -> str | None:
    """Pin this CPU rank to its own cores, before its intra-op threads start (they inherit it), so
    ranks neither share a core nor migrate; return the launcher's core plan (``describe_rank_cores``),
    or None where the OS has no affinity call."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    cores = rank_cores(allowed, local_rank, local_ranks, threads_per_rank, launcher_slot)
    if cores is not None:
        os.sched_setaffinity(0, cores)
    return describe_rank_cores(allowed, local_ranks, threads_per_rank, launcher_slot)


# ----------------------------------------------------------------------------- the hypervisor's share of them

STAT = Path("/proc/stat")


def _core_fields(cores: list[int] | None, stat: Path) -> tuple[int, ...] | None:
    """The sums over these cores (all where None) of /proc/stat's first eight fields of a ``cpuN`` line (user, nice,
    system, idle, iowait, irq, softirq, steal; guest time is in user); None where the kernel keeps no such table
    (not Linux), reports no steal field (kernels before 2.6.11), or lists not every one of these cores (a container
    whose /proc/stat is rewritten and renumbered, LXCFS: its lines are not these cores)."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    sums = [0] * 8
    seen = set()
    for line in lines:
        fields = line.split()
        core = re.fullmatch(r"cpu(\d+)", fields[0]) if fields else None  # a core's line, not the machine's sum
        if core is None or len(fields) < 9 or (cores is not None and int(core.group(1)) not in cores):
            continue
        sums = [total + int(v) for total, v in zip(sums, fields[1:9])]
        seen.add(int(core.group(1)))
    return tuple(sums) if seen and (cores is None or seen == set(cores)) else None


def core_ticks(cores: list[int] | None = None, stat: Path = STAT) -> tuple[int, int] | None:
    """(steal, wanted) clock ticks of these cores since boot (all cores where None): steal is the time the hypervisor
    ran something else while this guest's core wanted to run, wanted every tick the cores ran or wanted to (all but
    idle and iowait: an idle core neither runs nor loses time, so a process free to use many cores, mostly idle, is
    not diluted). A virtual machine with busy neighbours loses seconds of it by the minute, and a run's speed reads
    low by about its share (a 2-core VM: a 2-s window's throughput followed steal with correlation -0.91). None
    where _core_fields is."""
    fields = _core_fields(cores, stat)
    if fields is None:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, stolen = fields
    return stolen, user + nice + system + irq + softirq + stolen


BUSY_SAMPLE_S = 0.5
"""How long busy_share watches the cores before a measurement starts: 100 ticks of two cores at the usual 100 per
second, so one tick reads 1%."""


def busy_share(cores: list[int] | None, seconds: float = BUSY_SAMPLE_S, stat: Path = STAT) -> float | None:
    """The share of these cores' time (all cores where None) that processes kept busy over the next ``seconds``, this
    one sleeping: what else the host runs on the cores a measurement is about to use. The 1-minute load average
    cannot say it: it counts the whole machine (a 16-core host's other cores) and the past minute (work already
    ended). None where _core_fields is, or where the cores counted no tick."""
    start = _core_fields(cores, stat)
    if start is None:  # not Linux, or not these cores' table: nothing to wait for
        return None
    time.sleep(seconds)
    end = _core_fields(cores, stat)
    if end is None:
        return None
    delta = [b - a for a, b in zip(start, end)]
    user, nice, system, _idle, _iowait, irq, softirq, _stolen = delta
    total = sum(delta)
    return (user + nice + system + irq + softirq) / total if total > 0 else None


def planned_cores(local_ranks: int, threads_per_rank: int, launcher_slot: int = 0) -> list[int] | None:
    """The cores this process's CPU ranks will pin themselves to (pin_this_rank), all it may use where they would
    share them; None where the OS has no affinity call."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    plans = [rank_cores(allowed, r, local_ranks, threads_per_rank, launcher_slot) for r in range(local_ranks)]
    return allowed if any(cores is None for cores in plans) else sorted(c for cores in plans for c in cores)


def this_rank_ticks() -> tuple[int, int] | None:
    """core_ticks of the cores this process may run on (a pinned CPU rank's own; a GPU rank's host cores)."""
    return core_ticks(sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None)


STEAL_MIN_TICKS = 100
"""Fewer wanted ticks than this between two readings give no share: at the usual 100 ticks per second, one second
of one core's time, so a single stolen tick reads 1% at most, below spec.hardware.STEAL_WARN (a test run's 0.1 s
of steps would read 10% per tick)."""


def steal_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of the ticks the cores wanted between two core_ticks readings that the hypervisor took; None
    without both readings or with fewer than STEAL_MIN_TICKS between them (too short a window to say)."""
    if start is None or end is None or end[1] - start[1] < STEAL_MIN_TICKS:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


def main(argv: list[str]) -> int:
    """``python -m scalelab.run.calibration PATH THREADS``: measure, write the record, print the peaks."""
    record = write_calibration(argv[0], int(argv[1]))
    print(f"scalelab: CPU peak per rank ({record['threads']} thread(s)), measured on the {load_text(record)}: "
          + ", ".join(f"{name} {flops / 1e9:.1f} GFLOP/s" for name, flops in record["peaks_flops"].items()))
    return 0


if __name__ == "__main__":  # scalelab.run.sweep_calibration, where no prefork server forks it
    import sys

    sys.exit(main(sys.argv[1:]))
