"""A collective benchmark in nccl-tests' convention (``scalelab bench comm``).

Per collective (all_reduce, reduce_scatter, all_gather, broadcast), world size, message size and
batch (calls issued together): the median time per call of the repetitions after ``warmup`` (each
starts at a barrier and ends when the slowest rank returns: what a training step waits for), their
mean, min and max, the algorithm bandwidth (bytes / median time) and the bus bandwidth (algorithm
bandwidth x nccl-tests' factor, scalelab.formulas.links.bus_factor: 2(n-1)/n for all-reduce, (n-1)/n for
reduce-scatter and all-gather, 1 for broadcast), comparable across world sizes and with a link's
datasheet figure. Bytes are nccl-tests' ``size``: the all-reduce's and the broadcast's buffer, the
all-gather's output, the reduce-scatter's input (float32 elements). The step-time model fits the
mean (scalelab.results.prediction): on a CPU a call's time is heavy-tailed, and a step pays the mean.

Ranks are real processes on this host, started as the launcher starts a run's ranks (one process
per rank, env:// rendezvous on a free port; CPU ranks forked by the prefork server where one answers,
scalelab.run.prefork), on the sweep's backend (gloo on CPU, NCCL on GPU);
a CPU rank is pinned to its own cores as a training rank is (scalelab.run.calibration.pin_this_rank),
so the table measures the links a CPU run's ranks use. Every rank has an explicit collective
timeout and the ranks of a world size an overall time limit.

The table is a Parquet file (default ``<results>/calibration/comm.parquet``, the workflow's
``bench_comm`` target; its format: scalelab.registries.comm_table); scalelab.formulas.link_fit fits a latency-bandwidth
link to it.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from scalelab.formulas.links import COLLECTIVES, bus_factor
from scalelab.registries.comm_table import BUSY_COLUMN, busy_before, busy_text, busy_warns, format_table, write_table
from scalelab.registries.hardware import STEAL_WARN, largest_steal
from scalelab.registries.strategies import STRATEGIES
from scalelab.run.calibration import busy_share, planned_cores
from scalelab.run.ranks import RENDEZVOUS_ATTEMPTS, free_port, rendezvous_port_taken, start_and_wait

# all_gather and reduce_scatter run as all_gather_into_tensor and reduce_scatter_tensor: one flat
# buffer, as FSDP2 calls them.

CPU_MAX_BYTES = 16 * 2 ** 20
"""The largest message on CPU/gloo by default: a 16 MiB all-reduce takes ~15 ms on 2 cores, well past
gloo's millisecond stalls, so the bandwidth term is fitted; 64 MiB cost the default sweep ~5 s more
for a model whose whole gradient is 0.5 MiB. GPUs go to GPU_MAX_BYTES as nccl-tests' usual sweeps do."""
GPU_MAX_BYTES = 512 * 2 ** 20
MIN_BYTES = 4 * 2 ** 10
REPS = 20
"""Timed repetitions per row, at least. On a CPU a collective's time is heavy-tailed (seen on a 2-core
VM with gloo: medians of 0.1-0.3 ms, a third of the calls near 4 ms, a scheduler tick), so its mean
needs many: a row repeats until it has run MIN_SECONDS (at most MAX_REPS)."""
MIN_SECONDS = 0.3
MAX_REPS = 200
WARMUP = 3
BATCHES = (1, 16)
"""Calls per repetition: one at a time, and a batch issued together (async, then waited), the way
ZeroRedundancyOptimizer broadcasts its parameters (scalelab.registries.strategies: Strategy.batched): on gloo
a batch costs per call several times what one call alone does."""
BATCH_MAX_BYTES = 2 ** 20
"""The largest message timed in batches (a batch holds that many buffers of it)."""
BATCHED_COLLECTIVES = tuple(sorted({c for s in STRATEGIES.values() for c in s.batched}))
"""The collectives timed in batches by default: those a strategy issues as a batch (Strategy.batched;
ZeRO-1's broadcasts), the only batched rows the step-time model reads. Timing every collective in
batches took ~8 s more of the default sweep's ~25 s bench on 2 cores."""


def message_sizes(min_bytes: int = MIN_BYTES, max_bytes: int = CPU_MAX_BYTES, factor: int = 4) -> list[int]:
    """Sizes from min_bytes to max_bytes (both kept), each ``factor`` times the last."""
    if min_bytes < 4 or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"need 4 <= min_bytes <= max_bytes and factor >= 2, got {min_bytes}, {max_bytes}, {factor}")
    sizes, size = [], min_bytes
    while size < max_bytes:
        sizes.append(size)
        size *= factor
    return sizes + [max_bytes]


# ----------------------------------------------------------------------------- one rank

def _rank_main(spec: dict) -> None:
    """One rank: time every (collective, size) and write rank 0's rows to spec['out']."""
    import torch
    import torch.distributed as dist

    from scalelab.run.calibration import pin_this_rank, steal_share, this_rank_ticks
    from scalelab.run.devices import device_name, synchronize

    local_rank, world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    cores = None
    if spec["device"] == "cpu":
        cores = pin_this_rank(local_rank, world_size, spec["threads_per_rank"])  # before the threads start
    torch.set_num_threads(spec["threads_per_rank"])
    backend = "nccl" if spec["device"] == "cuda" else "gloo"
    device = torch.device(f"cuda:{local_rank}") if spec["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=spec["collective_timeout_s"]),
                            device_id=device if device.type == "cuda" else None)
    rank = dist.get_rank()
    n = dist.get_world_size()

    def sync():
        synchronize(device)

    ticks = this_rank_ticks()  # the rank's own cores once pinned: what the hypervisor takes of them while timed
    rows = []
    for collective in spec["collectives"]:
        for batch in spec["batches"]:
            for size in spec["sizes"]:
                if batch > 1 and (size > spec["batch_max_bytes"] or collective not in spec["batched_collectives"]):
                    continue
                rows.append(_time_collective(dist, torch, collective, size, batch, n, device, sync, spec))
    steals = [None] * n
    dist.all_gather_object(steals, steal_share(ticks, this_rank_ticks()))
    if rank == 0:
        Path(spec["out"]).write_text(json.dumps({"rows": rows, "rank_cores": cores, "backend": backend,
                                                 "device_name": device_name(device), "torch_version": torch.__version__,
                                                 "host_steal_share": largest_steal(steals)}))
    dist.barrier()  # before tear-down: gloo's destroy_process_group() hung without it (torch 2.13 CPU)
    dist.destroy_process_group()


def _time_collective(dist, torch, collective: str, size: int, batch: int, n: int, device, sync, spec: dict) -> dict:
    """One row: ``batch`` calls of a collective of ``size`` bytes, issued together (async, then
    waited, as ZeroRedundancyOptimizer issues its broadcasts; 1 = one call at a time), timed from a
    barrier to the slowest rank's return; the time per call."""
    elements = max(n, size // 4 // n * n)  # float32, divisible by n (all-gather, reduce-scatter)
    fulls = [torch.ones(elements, dtype=torch.float32, device=device) for _ in range(batch)]
    parts = [torch.ones(elements // n, dtype=torch.float32, device=device) for _ in range(batch)]

    def issue(j: int):
        full, part = fulls[j], parts[j]
        if collective == "all_reduce":
            return dist.all_reduce(full, async_op=batch > 1)
        if collective == "reduce_scatter":
            return dist.reduce_scatter_tensor(part, full, async_op=batch > 1)
        if collective == "all_gather":
            return dist.all_gather_into_tensor(full, part, async_op=batch > 1)
        return dist.broadcast(full, src=j % n, async_op=batch > 1)  # a batch's sources take turns (each rank's shard)

    times, i, began = [], 0, time.perf_counter()
    # at least reps timed repetitions, more while the row is younger than min_seconds (at most max_reps):
    # a heavy-tailed time needs many for its mean. Rank 0 decides, so every rank runs the same count.
    go = torch.ones(1, device=device)
    while True:
        dist.barrier()
        sync()
        start = time.perf_counter()
        handles = [issue(j) for j in range(batch)]
        for handle in handles:
            if handle is not None:
                handle.wait()
        sync()
        if i >= spec["warmup"]:
            times.append((time.perf_counter() - start) / batch)
        i += 1
        if len(times) >= spec["reps"]:
            go.fill_(float(len(times) < spec["max_reps"] and time.perf_counter() - began < spec["min_seconds"]))
            dist.broadcast(go, src=0)
            if not go.item():
                break
    # the slowest rank's time of each repetition: a step waits for the last rank
    mine = torch.tensor(times, dtype=torch.float64, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(n)]
    dist.all_gather(gathered, mine)
    slowest = torch.stack([g.cpu() for g in gathered]).max(dim=0).values
    return {"collective": collective, "bytes": elements * 4, "batch": batch, "time_s": float(slowest.median()),
            "time_s_mean": float(slowest.mean()), "time_s_min": float(slowest.min()),
            "time_s_max": float(slowest.max()), "reps": len(times)}


# ----------------------------------------------------------------------------- the launcher

class BenchError(RuntimeError):
    """The benchmark's ranks failed or ran out of time (the message holds their output's tail)."""


def run_world_size(world_size: int, *, device: str = "cpu", sizes: list[int], collectives=COLLECTIVES,
                   reps: int = REPS, warmup: int = WARMUP, min_seconds: float = MIN_SECONDS,
                   max_reps: int = MAX_REPS, batches=BATCHES, batch_max_bytes: int = BATCH_MAX_BYTES,
                   batched_collectives=BATCHED_COLLECTIVES, threads_per_rank: int = 1, collective_timeout_s: float = 60.0, timeout_s: float = 300.0) -> dict:
    """Start ``world_size`` ranks on this host, wait for them (at most timeout_s), return rank 0's record."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    unknown = [c for c in (*collectives, *batched_collectives) if c not in COLLECTIVES]
    if unknown:
        raise ValueError(f"unknown collective(s) {', '.join(unknown)}; known: {', '.join(COLLECTIVES)}")
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps must be >= 1 and warmup >= 0, got {reps}, {warmup}")
    if not batches or min(batches) < 1:
        raise ValueError(f"batches must be whole numbers >= 1, got {batches!r}")
    with tempfile.TemporaryDirectory(prefix="scalelab-bench-") as tmp:
        spec = {"device": device, "sizes": list(sizes), "collectives": list(collectives), "reps": reps, "warmup": warmup,
                "min_seconds": min_seconds, "max_reps": max(max_reps, reps), "batches": sorted(set(batches)),
                "batch_max_bytes": batch_max_bytes, "batched_collectives": list(batched_collectives), "threads_per_rank": threads_per_rank,
                "collective_timeout_s": collective_timeout_s, "out": str(Path(tmp) / "rank0.json")}
        spec_path = Path(tmp) / "run_plan.json"
        spec_path.write_text(json.dumps(spec))
        for attempt in range(1, RENDEZVOUS_ATTEMPTS + 1):  # a new port when rank 0 found its own taken
            log_path = Path(tmp) / f"ranks-{attempt}.log"
            codes, timed_out = _start_ranks(world_size, spec_path, log_path, timeout_s, device)
            tail = log_path.read_text(errors="replace")[-3000:]
            if not (any(codes) and rendezvous_port_taken(tail)):
                break
        if timed_out or any(codes) or not Path(spec["out"]).exists():
            why = f"timed out after {timeout_s:g} s" if timed_out else f"exit codes {codes}"
            raise BenchError(f"bench comm at world size {world_size} failed ({why}):\n{tail}")
        return json.loads(Path(spec["out"]).read_text())


def _start_ranks(world_size: int, spec_path: Path, log_path: Path, timeout_s: float, device: str) -> tuple[list[int | None], bool]:
    """Start the ranks on a new rendezvous port and wait for them, as the launcher starts and waits for a run's
    (scalelab.run.ranks.start_and_wait: one process group, the first failure ends the wait; a CPU benchmark's
    ranks forked by the prefork server when there is one, a GPU's always new processes): (exit codes, None for a
    rank stopped when another failed or the time ran out; whether it ran out)."""
    port = str(free_port())
    processes = [([sys.executable, "-m", "scalelab.run.commbench", "--rank-spec", str(spec_path)],
                  {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(world_size),
                   "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size)})
                 for rank in range(world_size)]
    with open(log_path, "ab") as log:
        waited = start_and_wait(processes, log, timeout_s, forkable=device == "cpu")
    if waited.why_not_forked:  # a server that refused: said where the benchmark's output goes (its log in a sweep)
        print(f"scalelab: the benchmark's ranks run as new processes: {waited.why_not_forked}", file=sys.stderr)
    return waited.codes, waited.timed_out


def bench_comm(world_sizes: list[int], *, device: str = "cpu", sizes: list[int] | None = None, collectives=COLLECTIVES,
               reps: int = REPS, warmup: int = WARMUP, min_seconds: float = MIN_SECONDS,
               max_reps: int = MAX_REPS, batches=BATCHES, batch_max_bytes: int = BATCH_MAX_BYTES,
               batched_collectives=BATCHED_COLLECTIVES, threads_per_rank: int = 1, collective_timeout_s: float = 60.0, timeout_s: float = 300.0):
    """The benchmark table (a pandas DataFrame, one row per collective, world size and size)."""
    import pandas as pd

    if sizes is None:
        sizes = message_sizes(max_bytes=CPU_MAX_BYTES if device == "cpu" else GPU_MAX_BYTES)
    frames = []
    for n in world_sizes:
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        load_before = os.getloadavg()[0]  # the whole machine's, over the past minute: context (BUSY_COLUMN says whether
        busy = busy_share(planned_cores(n, threads_per_rank)) if device == "cpu" else None  # the ranks' own cores were busy)
        record = run_world_size(n, device=device, sizes=sizes, collectives=collectives, reps=reps, warmup=warmup,
                                min_seconds=min_seconds, max_reps=max_reps, batches=batches,
                                batch_max_bytes=batch_max_bytes, batched_collectives=batched_collectives,
                                threads_per_rank=threads_per_rank, collective_timeout_s=collective_timeout_s,
                                timeout_s=timeout_s)
        frame = pd.DataFrame(record["rows"])
        frame.insert(1, "world_size", n)
        frame["backend"], frame["device_type"], frame["device_name"] = record["backend"], device, record["device_name"]
        frame["threads_per_rank"], frame["rank_cores"] = threads_per_rank, record["rank_cores"]
        frame["hostname"], frame["torch_version"], frame["measured_utc"] = socket.gethostname(), record["torch_version"], started
        frame["load_1min_before"], frame[BUSY_COLUMN] = load_before, busy
        frame["host_steal_share"] = record.get("host_steal_share")  # the largest over its ranks (worker's column alike)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    table["algbw_Bps"] = table["bytes"] / table["time_s"]
    table["busbw_Bps"] = table["algbw_Bps"] * [bus_factor(c, n) for c, n in zip(table["collective"], table["world_size"], strict=True)]
    table["load_1min_after"] = os.getloadavg()[0]  # the benchmark's own ranks included
    return table


# ----------------------------------------------------------------------------- the command

def add_parser(sub) -> None:
    """``scalelab bench comm``."""
    bench = sub.add_parser("bench", help="benchmarks that calibrate the step-time model (scalelab predict)")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    c = kinds.add_parser("comm", help="time all_reduce, reduce_scatter, all_gather and broadcast over message sizes "
                         "(nccl-tests' algorithm and bus bandwidth), one Parquet table")
    c.add_argument("--out", required=True, help="the Parquet table to write (the workflow's: RESULTS/calibration/comm.parquet)")
    c.add_argument("--world-sizes", default="2", help="comma-separated world sizes (default 2)")
    c.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="cpu (gloo) or cuda (NCCL, one GPU per rank); default: cuda if a GPU is visible")
    c.add_argument("--min-bytes", type=int, default=MIN_BYTES, help=f"smallest message (default {MIN_BYTES})")
    c.add_argument("--max-bytes", type=int, default=None,
                   help=f"largest message (default {CPU_MAX_BYTES >> 20} MiB on CPU, {GPU_MAX_BYTES >> 20} MiB on GPU)")
    c.add_argument("--factor", type=int, default=4, help="each size this many times the last (default 4)")
    c.add_argument("--collectives", default=",".join(COLLECTIVES), help=f"comma-separated, of {', '.join(COLLECTIVES)}")
    c.add_argument("--reps", type=int, default=REPS, help=f"timed repetitions per size (default {REPS}; median and mean kept)")
    c.add_argument("--warmup", type=int, default=WARMUP, help=f"untimed repetitions first (default {WARMUP})")
    c.add_argument("--min-seconds", type=float, default=MIN_SECONDS,
                   help=f"repeat a row until it has run this long (default {MIN_SECONDS}; 0: exactly --reps)")
    c.add_argument("--max-reps", type=int, default=MAX_REPS, help=f"at most this many repetitions per row (default {MAX_REPS})")
    c.add_argument("--batches", default=",".join(map(str, BATCHES)),
                   help="comma-separated calls per repetition, issued together (default 1,16: one at a time, and "
                        "16 async calls then waited, as ZeroRedundancyOptimizer broadcasts)")
    c.add_argument("--batch-max-bytes", type=int, default=BATCH_MAX_BYTES,
                   help=f"largest message timed in batches (default {BATCH_MAX_BYTES})")
    c.add_argument("--batched-collectives", default=",".join(BATCHED_COLLECTIVES),
                   help=f"comma-separated collectives timed in batches (default {','.join(BATCHED_COLLECTIVES)}: those "
                        "a strategy issues as a batch; the step-time model reads no other batched rows)")
    c.add_argument("--threads-per-rank", type=int, default=1, help="intra-op threads (and pinned cores) per CPU rank (default 1)")
    c.add_argument("--collective-timeout", type=float, default=60.0, help="seconds a collective may wait (default 60)")
    c.add_argument("--timeout", type=float, default=300.0, help="seconds for each world size's ranks (default 300)")
    c.set_defaults(func=_bench_comm)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{what} must be integers >= 1, got {text!r}")
    return values


def _check_numbers(args) -> None:
    """Every count and duration in range, before any rank starts (ValueError naming the flag)."""
    import math

    for flag, value, low, strict in (("--threads-per-rank", args.threads_per_rank, 1, False), ("--reps", args.reps, 1, False),
                                     ("--warmup", args.warmup, 0, False), ("--max-reps", args.max_reps, 1, False),
                                     ("--min-seconds", args.min_seconds, 0, False),
                                     ("--collective-timeout", args.collective_timeout, 0, True),
                                     ("--timeout", args.timeout, 0, True), ("--batch-max-bytes", args.batch_max_bytes, 1, False)):
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise ValueError(f"{flag} must be {'>' if strict else '>='} {low} and finite, got {value}")


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated option's names (checked against COLLECTIVES by run_world_size)."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _bench_comm(args) -> int:
    device = args.device
    if device is None:
        from scalelab.planning.placement import visible_gpus

        device = "cuda" if visible_gpus() else "cpu"
    try:
        _check_numbers(args)
        world_sizes = _ints(args.world_sizes, "--world-sizes")
        max_bytes = args.max_bytes or (CPU_MAX_BYTES if device == "cpu" else GPU_MAX_BYTES)
        sizes = message_sizes(args.min_bytes, max_bytes, args.factor)
        collectives = _names(args.collectives)
        if device == "cpu" and hasattr(os, "sched_getaffinity"):
            cores = len(os.sched_getaffinity(0))
            if max(world_sizes) * args.threads_per_rank > cores:
                raise ValueError(f"--world-sizes {max(world_sizes)} x --threads-per-rank {args.threads_per_rank} needs "
                                 f"more cores than the {cores} this process may use: ranks sharing cores measure contention")
        table = bench_comm(world_sizes, device=device, sizes=sizes, collectives=collectives, reps=args.reps,
                           warmup=args.warmup, min_seconds=args.min_seconds, max_reps=args.max_reps,
                           batches=_ints(args.batches, "--batches"), batch_max_bytes=args.batch_max_bytes,
                           batched_collectives=_names(args.batched_collectives),
                           threads_per_rank=args.threads_per_rank,
                           collective_timeout_s=args.collective_timeout, timeout_s=args.timeout)
    except (ValueError, BenchError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    path = write_table(table, args.out)
    print(format_table(table))
    if device == "cpu":  # a GPU's collectives hardly depend on the host's cores
        for warning in busy_host_warnings(table):
            print(f"warning: {warning}", file=sys.stderr)
    print(f"bench comm: {len(table)} rows ({device}, {table['backend'].iloc[0]}, load {os.getloadavg()[0]:.2f}) -> {path}")
    return 0


def busy_host_warnings(table) -> list[str]:
    """What says a CPU table's times include other work than its ranks': other processes on the ranks' cores as they
    started, and the hypervisor's share of them while they were timed."""
    warnings = []
    busy = busy_before(table)
    if busy_warns(busy):
        warnings.append(busy_text(busy, "the ranks'"))
    stolen = largest_steal(table["host_steal_share"])
    if stolen is not None and stolen > STEAL_WARN:
        warnings.append(f"the hypervisor took {stolen:.1%} of the ranks' cores' time while they were timed (other guests "
                        "of the physical host were busy): these times run high (measure again on a quiet host)")
    return warnings


def main(argv: list[str]) -> int:
    """A rank: ``python -m scalelab.run.commbench --rank-spec SPEC``, or that command forked by the prefork server."""
    if len(argv) != 2 or argv[0] != "--rank-spec":
        raise SystemExit("usage: scalelab bench comm (this module's entry point is for its ranks)")
    _rank_main(json.loads(Path(argv[1]).read_text()))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))  # skip the interpreter's finalization (gloo threads; see scalelab.run.worker)
