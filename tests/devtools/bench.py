"""Benchmarks that print figures (not tests: these machines are noisy).

    PYTHONPATH=tests python -m devtools.bench data      tokenize-and-write MB/s + peak RSS; sampler tokens/s
    PYTHONPATH=tests python -m devtools.bench overhead  instrumented training loop vs a bare loop, side by side
    PYTHONPATH=tests python -m devtools.bench report    report rebuilt from a synthetic 1,000-run / 500,000-step set (--runs,
                                               --steps per run): time and peak RSS, beside a fixed Python loop timed
                                               before each build (the host's speed at the time)
                                               (--against CHECKOUT: alternately with another checkout's code)
    PYTHONPATH=tests python -m devtools.bench compile   the compile lever: eager vs compiled step time and losses, side by side
    PYTHONPATH=tests python -m devtools.bench teardown  world-size-2 CPU runs that end abnormally after their last step
    PYTHONPATH=tests python -m devtools.bench repeatability  two identical sweeps back to back: per-run tokens/s ratios, the
                                               host's speed, and whether each comparison the report draws agrees
    PYTHONPATH=tests python -m devtools.bench startup   the default sweep, timed: median startup_s of its world-size-1 and -2
                                               runs and its wall time, beside the host loop (--against CHECKOUT:
                                               alternately with another checkout's code; --repeats sweeps each)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scalelab.harness import REPO_ROOT
from scalelab.harness.testing import local_plan
from scalelab.run.prefork import PREFORK_ENV

_T0 = time.perf_counter()

_PREPARE_CHILD = r"""
import json, resource, sys, time
from scalelab.config import DatasetConfig
from scalelab.run.data import prepare_dataset
cfg = DatasetConfig(name="bench", source="text", path=sys.argv[1], tokenizer="byte", bpe_vocab_size=1024,
                    decode_errors="strict", tokenized_dtype="uint16", vocab_size=None, val_fraction=0.1,
                    synthetic_bytes=1000, seed=0)
start = time.perf_counter()
meta = prepare_dataset(cfg, sys.argv[2], seq_len=1024)
print(json.dumps({"seconds": time.perf_counter() - start, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "tokens": meta["n_train_tokens"] + meta["n_val_tokens"], "dtype": meta["dtype"]}))
"""


def bench_data(corpus_mb: int, batch: int, seq_len: int, seconds: float) -> dict:
    from scalelab.run.data import BatchSampler, synthetic_text_chunks

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        block = b"".join(synthetic_text_chunks(16 << 20, seed=0))  # 16 MiB, repeated to size
        with open(corpus, "wb") as f:
            for _ in range(-(-corpus_mb // 16)):
                f.write(block)
        size = corpus.stat().st_size
        out = subprocess.run([sys.executable, "-c", _PREPARE_CHILD, str(corpus), str(Path(tmp) / "out")],
                             capture_output=True, text=True, check=True)
        prep = json.loads(out.stdout.strip().splitlines()[-1])

        sampler = BatchSampler(Path(tmp) / "out" / "train.bin", prep["dtype"], seq_len, seed=0)
        sampler.batch(0, 0, batch)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            sampler.batch(n, 0, batch)
            n += 1
        sampler_s = time.perf_counter() - start
    return {
        "corpus_mb": size / 2 ** 20,
        "prepare_s": prep["seconds"],
        "prepare_mb_per_s": size / 2 ** 20 / prep["seconds"],
        "prepare_peak_rss_mb": prep["peak_rss_bytes"] / 2 ** 20,
        "sampler_batch": f"{batch} x {seq_len + 1}",
        "sampler_tokens_per_s": n * batch * (seq_len + 1) / sampler_s,
        "sampler_batches": n,
    }


def bench_overhead(steps: int, repeats: int, threads: int) -> dict:
    """Steady-state time per step of scalelab.run.worker's whole loop (world size 1, stage 0,
    every measurement on: loss sync, records, comm counting) against bare loops on the same
    model and batches: a plain single-process loop (the instrumentation's cost alone: one rank at
    stage 0 trains the model without DDP) and the same loop in DDP over one rank (what the DDP
    wrapper cost a one-rank run before it was dropped). Alternated, medians of means."""
    import torch

    from scalelab.config import dataset_config, model_config, train_config
    from scalelab.harness import REPO_ROOT
    from scalelab.harness.reference import bare_loop
    from scalelab.planning.sweep import RunPoint
    from scalelab.planning.validation import load_config
    from scalelab.run.data import prepare_dataset
    from scalelab.run.launch import launch_run

    torch.set_num_threads(threads)
    config = load_config(REPO_ROOT / "config.yaml")
    config["train"].update(steps=steps, warmup_steps=min(20, steps // 4))
    warm = config["train"]["warmup_steps"]
    plain, bare, instrumented, startup = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        meta = prepare_dataset(dataset_config(config), Path(tmp) / "data", config["model"]["seq_len"])
        model_cfg, train_cfg = model_config(config, meta["vocab_size"]), train_config(config)
        for i in range(repeats):
            train_bin = str(Path(tmp) / "data" / "train.bin")
            _, times, _ = bare_loop(model_cfg, train_cfg, train_bin, meta["dtype"], record_losses=False)
            plain.append(statistics.fmean(times[warm:]))
            _, times, _ = bare_loop(model_cfg, train_cfg, train_bin, meta["dtype"], record_losses=False, ddp=True)
            bare.append(statistics.fmean(times[warm:]))
            summary = launch_run(config, local_plan(config, RunPoint("fp32", 0, 1)), Path(tmp) / "data", Path(tmp) / f"run{i}",
                                 Path(tmp) / f"run{i}.log", threads=threads)
            if summary["status"] != "ok":
                raise RuntimeError(f"instrumented run failed: {summary['reason']}")
            instrumented.append(summary["loop_time_s_per_step"])
            startup.append(summary["startup_s"])
    p, b, s = statistics.median(plain), statistics.median(bare), statistics.median(instrumented)
    return {
        "steps": steps, "repeats": repeats, "threads": threads,
        "plain_loop_step_ms": p * 1e3, "bare_ddp_loop_step_ms": b * 1e3,
        "instrumented_loop_step_ms": s * 1e3,
        "ratio_vs_bare_ddp_loop": b / s,
        "ratio_vs_plain_loop": p / s,
        "startup_s_median": statistics.median(startup),
    }


def bench_compile(precision: str, steps: int, warmup: int, threads: int, model: dict) -> dict:
    """The compile lever, eager and compiled side by side in one process: two copies of the
    same model (same seed, AdamW, LR schedule, clipping, batches: scalelab.harness.reference's
    loop, world size 1), the compiled one through scalelab.run.parallel.apply_compile.
    Each is compiled/warmed apart first (compile time = the compiled copy's first forward
    and backward); then the steps alternate between the two (which goes first alternates
    too), so that a load that changes over time (a shared machine) hits both alike. Step
    times: medians over the steps after warm-up, and the median of the per-step ratios.
    Losses: the largest relative difference per step between the two trajectories."""
    import numpy as np
    import torch

    from scalelab.config import dataset_config, model_config, train_config
    from scalelab.harness import REPO_ROOT
    from scalelab.planning.validation import load_config
    from scalelab.run.data import BatchSampler, prepare_dataset
    from scalelab.run.model import GPT
    from scalelab.run.parallel import apply_compile, compiled_graphs, param_groups
    from scalelab.run.precision import autocast
    from scalelab.run.worker import lr_at

    torch.set_num_threads(threads)
    config = load_config(REPO_ROOT / "config.yaml")
    config["train"].update(steps=steps, warmup_steps=warmup)
    config["model"].update({k: v for k, v in model.items() if v is not None})
    device = torch.device("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        meta = prepare_dataset(dataset_config(config), Path(tmp) / "data", config["model"]["seq_len"])
        model_cfg, train_cfg = model_config(config, meta["vocab_size"]), train_config(config)
        sampler = BatchSampler(Path(tmp) / "data" / "train.bin", meta["dtype"], model_cfg.seq_len, train_cfg.seed)
        batches = [torch.from_numpy(sampler.batch(step, 0, train_cfg.global_batch, 1)) for step in range(steps)]
    runs = {}
    for compiled in (False, True):
        torch.manual_seed(train_cfg.seed)
        net = GPT(model_cfg)
        if compiled:
            apply_compile(net)
        opt = torch.optim.AdamW(param_groups(net, train_cfg.weight_decay), lr=train_cfg.lr, betas=(0.9, 0.95), eps=1e-8)
        start = time.perf_counter()
        with autocast(precision, device):  # the warm-up: compiles the compiled copy, gradients dropped
            loss = net(batches[0][:, :-1], batches[0][:, 1:])
        loss.backward()
        net.zero_grad(set_to_none=True)
        runs[compiled] = {"model": net, "opt": opt, "losses": [], "times": [], "warm_up_s": time.perf_counter() - start}
    graphs = compiled_graphs()
    max_norm = train_cfg.grad_clip if train_cfg.grad_clip > 0 else float("inf")
    for step, tokens in enumerate(batches):
        for compiled in ((False, True) if step % 2 == 0 else (True, False)):
            run = runs[compiled]
            for group in run["opt"].param_groups:
                group["lr"] = lr_at(step, train_cfg)
            start = time.perf_counter()
            with autocast(precision, device):
                loss = run["model"](tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(run["model"].parameters(), max_norm)
            run["opt"].step()
            run["opt"].zero_grad(set_to_none=True)
            run["times"].append(time.perf_counter() - start)
            run["losses"].append(loss.item())
    eager, comp = runs[False], runs[True]
    e, c = np.array(eager["times"][warmup:]), np.array(comp["times"][warmup:])
    diff = np.abs(np.array(comp["losses"]) - np.array(eager["losses"])) / np.abs(np.array(eager["losses"]))
    return {
        "precision": precision, "model": " ".join(f"{k}={getattr(model_cfg, k)}" for k in ("n_layers", "d_model", "n_heads", "seq_len", "vocab_size")),
        "batch": train_cfg.global_batch, "steps": f"{steps} ({steps - warmup} timed, alternated)", "threads": threads,
        "eager_step_ms": float(np.median(e)) * 1e3, "compiled_step_ms": float(np.median(c)) * 1e3,
        "compiled_over_eager": float(np.median(c) / np.median(e)), "compiled_over_eager_per_step_median": float(np.median(c / e)),
        "eager_step_ms_p10_p90": f"{np.percentile(e, 10) * 1e3:.2f} {np.percentile(e, 90) * 1e3:.2f}",
        "compiled_step_ms_p10_p90": f"{np.percentile(c, 10) * 1e3:.2f} {np.percentile(c, 90) * 1e3:.2f}",
        "compile_time_s": comp["warm_up_s"], "eager_first_step_s": eager["warm_up_s"],
        "graphs_compiled_during_steps": compiled_graphs() - graphs,
        "loss_max_rel_diff": float(diff.max()), "loss_rel_diff_step0": float(diff[0]),
        "final_loss_eager": eager["losses"][-1], "final_loss_compiled": comp["losses"][-1],
    }


def bench_teardown(runs: int, steps: int, stages: list[int], precisions: list[str], keep: str | None,
                   cores: bool = False) -> dict:
    """Launch `runs` world-size-2 runs of the tiny test config, one at a time, cycling through
    every (zero stage, precision) pair, and count those that did not end cleanly: a status
    other than ok, or ok with a teardown_warning (a rank exited abnormally after rank 0 wrote
    the results), and the runs whose log holds "terminate called" (std::terminate in a rank).
    keep: a folder to copy the logs of abnormal runs to; with cores, also the core dumps of
    the ranks that crashed (core size limit raised, each run in a folder of its own, because
    the kernel writes ./core in the crashing process's working directory)."""
    import itertools
    import os
    import resource
    import shutil

    from scalelab.config import dataset_config
    from scalelab.harness.testing import tiny_config
    from scalelab.planning.sweep import RunPoint
    from scalelab.run.data import prepare_dataset
    from scalelab.run.launch import launch_run

    cfg = tiny_config(train={"steps": steps, "warmup_steps": min(2, steps - 1)})
    combos = list(itertools.product(stages, precisions))
    abnormal, terminated, failed, by_combo = 0, 0, 0, {}
    seconds = []
    if cores:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    home = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        prepare_dataset(dataset_config(cfg), data, seq_len=32)
        for i in range(runs):
            stage, precision = combos[i % len(combos)]
            point = RunPoint(precision, stage, 2)
            run_dir, log = Path(tmp) / f"run{i}", Path(tmp) / f"run{i}.log"
            cwd = Path(tmp) / f"cwd{i}"
            cwd.mkdir()
            os.chdir(cwd)  # the ranks' working directory: where a core dump lands
            start = time.perf_counter()
            try:
                summary = launch_run(cfg, local_plan(cfg, point), data, run_dir, log, threads=2, repo_dir=home)
            finally:
                os.chdir(home)
            seconds.append(time.perf_counter() - start)
            text = log.read_text(errors="replace")
            bad = summary["status"] != "ok" or bool(summary.get("teardown_warning"))
            term = "terminate called" in text
            failed += summary["status"] != "ok"
            abnormal += bad
            terminated += term
            key = f"z{stage}-{precision}"
            by_combo.setdefault(key, [0, 0])
            by_combo[key][0] += 1
            by_combo[key][1] += bad
            if bad or term:
                print(f"run {i} {key}: status {summary['status']}, teardown_warning {summary.get('teardown_warning')!r}, "
                      f"terminate called: {term}", file=sys.stderr, flush=True)
                if keep:
                    Path(keep).mkdir(parents=True, exist_ok=True)
                    shutil.copy(log, Path(keep) / f"run{i}-{key}.log")
                    for core in cwd.glob("core*"):
                        shutil.move(core, Path(keep) / f"run{i}-{key}.{core.name}")
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(cwd, ignore_errors=True)
            log.unlink(missing_ok=True)
            if (i + 1) % 25 == 0:
                print(f"{i + 1}/{runs} runs, {abnormal} abnormal", file=sys.stderr, flush=True)
    return {
        "runs": runs, "steps_per_run": steps,
        "abnormal_exits": abnormal, "abnormal_rate": abnormal / runs,
        "not_ok": failed, "terminate_called_runs": terminated,
        "abnormal_by_combo": " ".join(f"{k}:{v[1]}/{v[0]}" for k, v in by_combo.items()),
        "run_s_median": statistics.median(seconds),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    d = sub.add_parser("data", help="data preparation and sampler throughput")
    d.add_argument("--corpus-mb", type=int, default=208, help="size of the text corpus (MiB)")
    d.add_argument("--batch", type=int, default=64)
    d.add_argument("--seq-len", type=int, default=1024)
    d.add_argument("--seconds", type=float, default=3.0, help="how long to time the sampler")
    o = sub.add_parser("overhead", help="instrumented training loop vs bare loop")
    o.add_argument("--steps", type=int, default=300)
    o.add_argument("--repeats", type=int, default=3)
    o.add_argument("--threads", type=int, default=1)
    r = sub.add_parser("report", help="rebuild the report from a synthetic result set")
    r.add_argument("--runs", type=int, default=1000)
    r.add_argument("--steps", type=int, default=500, help="steps per ok run")
    r.add_argument("--repeats", type=int, default=5, help="builds of the same report")
    r.add_argument("--against", metavar="CHECKOUT", help="another checkout of scalelab (its src/ is imported): builds by this "
                   "code and by that one, alternately, from one result set; --repeats pairs")
    c = sub.add_parser("compile", help="the compile lever: eager vs compiled step time and losses")
    c.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    c.add_argument("--steps", type=int, default=100)
    c.add_argument("--warmup", type=int, default=10, help="first steps left out of the step times")
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--layers", type=int, help="model.n_layers (default: config.yaml's)")
    c.add_argument("--d-model", type=int, help="model.d_model")
    c.add_argument("--heads", type=int, help="model.n_heads")
    c.add_argument("--seq-len", type=int, help="model.seq_len")
    t = sub.add_parser("teardown", help="world-size-2 runs that end abnormally after their last step")
    t.add_argument("--runs", type=int, default=200)
    t.add_argument("--steps", type=int, default=10, help="steps per run")
    t.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    t.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    t.add_argument("--keep", help="copy the logs of abnormal runs to this folder")
    t.add_argument("--cores", action="store_true", help="keep the core dumps of crashed ranks too (in --keep)")
    s = sub.add_parser("startup", help="run start-up and the default sweep's wall time")
    s.add_argument("--repeats", type=int, default=2, help="sweeps per checkout")
    s.add_argument("--against", metavar="CHECKOUT", help="another checkout of scalelab (its Snakefile, config.yaml "
                   "and src/ with this venv): its sweeps alternate with this code's (A B, B A, ...)")
    s.add_argument("--tiny", action="store_true", help="a two-run sweep of 4 steps (checks the benchmark itself)")
    rp = sub.add_parser("repeatability", help="two identical sweeps back to back: per-run ratios and every comparison's verdict")
    rp.add_argument("--config", default=str(REPO_ROOT / "config.yaml"), help="the sweep (default: the repository's config.yaml)")
    rp.add_argument("--cores", default="all")
    rp.add_argument("--keep", help="keep both sweeps' folders here (default: a temporary folder, removed)")
    rp.add_argument("--timeout", type=float, default=1800, help="seconds per sweep")
    rp.add_argument("--floor-s", type=float, default=60.0, help="seconds of the host-floor probe before the sweeps "
                    "(a fixed matmul on one pinned core, in windows of train.measure_s); 0 = none")
    rp.add_argument("--json", metavar="PATH", help="also write the figures here (docs/measured.json: the one source of "
                    "the timings and counts the README and guide state, tests/unit/test_docs.py)")
    args = parser.parse_args(argv)
    if args.what == "repeatability":
        from devtools.repeatability import bench_repeatability, print_repeatability

        result = bench_repeatability(Path(args.config), args.cores, Path(args.keep) if args.keep else None, args.timeout,
                                     host_loop_s, args.floor_s)
        print_repeatability(result)
        if args.json:
            from devtools.repeatability import record

            Path(args.json).write_text(json.dumps(record(result, Path(args.config)), indent=1) + "\n")
        return 0
    if args.what == "startup":
        result = bench_startup(args.repeats, args.against, args.tiny)
    elif args.what == "compile":
        result = bench_compile(args.precision, args.steps, args.warmup, args.threads,
                               {"n_layers": args.layers, "d_model": args.d_model, "n_heads": args.heads, "seq_len": args.seq_len})
    elif args.what == "teardown":
        result = bench_teardown(args.runs, args.steps, args.stages, args.precisions, args.keep, args.cores)
    elif args.what == "report":
        result = bench_report(args.runs, args.steps, args.repeats, args.against)
    elif args.what == "data":
        result = bench_data(args.corpus_mb, args.batch, args.seq_len, args.seconds)
    else:
        result = bench_overhead(args.steps, args.repeats, args.threads)
    if args.what in ("report", "startup"):  # whole command: the synthetic set, interpreter and imports included
        result["command_wall_s"] = time.perf_counter() - _T0
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value:.4g}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    return 0


def host_loop_s(n: int = 2_000_000) -> float:
    """CPU seconds of a fixed pure-Python loop, timed before each build: how fast this host runs
    Python at that moment. A shared host's speed drifts within minutes (measured on a 2-core
    host: builds from 3.1 to 4.5 CPU seconds, tracking this loop with a correlation of 0.73 over 12 builds), so
    report figures taken at different moments compare only beside it."""
    start = time.process_time()
    total = 0
    for i in range(n):
        total += i & 7
    return time.process_time() - start


# A build server: builds the report from argv[1] into argv[2] for each line read, prints wall and CPU
# seconds (children included) and the peak RSS so far of the server and of its largest drawing
# process (KiB). Only build_report, so any checkout serves: scalelab.report.report, or
# scalelab.analysis.report in a checkout from before the layers by workflow stage. The first build
# (imports, fonts, templates) is timed apart: a user's `scalelab report` pays it, the comparison not.
_REPORT_SERVER = r"""
import resource, sys, time
t = time.perf_counter()
try:
    from scalelab.report.report import build_report
except ImportError:
    from scalelab.analysis.report import build_report
def cpu():
    return sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))
build_report(sys.argv[1], sys.argv[2])
print(time.perf_counter() - t, flush=True)
for _ in sys.stdin:
    c, t = cpu(), time.perf_counter()
    build_report(sys.argv[1], sys.argv[2])
    print(time.perf_counter() - t, cpu() - c, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)
"""


def bench_report(n_runs: int, n_steps: int, repeats: int, against: str | None = None, timeout_s: float = 600.0) -> dict:
    """Rebuild the report from a synthetic result set (Parquet alone) `repeats` times, in a long-lived
    process of its own (its peak RSS is the build's, not the synthetic set's), with the host loop
    timed before each build. With `against`, a second process runs that checkout's code (its src/
    on PYTHONPATH) on the same set, the two taking turns, which goes first swapped every pair: a
    host whose speed drifts within minutes then weighs on both alike, and the per-pair ratio says
    what a change bought."""
    import os
    import selectors

    from devtools.fixtures import synthetic_results

    checkouts = {"this": Path(__file__).resolve().parents[2]}
    if against:
        checkouts["other"] = Path(against).resolve() / "src"
        if not any((checkouts["other"] / "scalelab" / layer / "report.py").is_file() for layer in ("report", "analysis")):
            raise SystemExit(f"--against {against}: not a scalelab checkout (no src/scalelab/report/report.py)")
    builds: dict[str, list[tuple[float, ...]]] = {name: [] for name in checkouts}
    first, loops = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        sizes = synthetic_results(tmp, n_runs, n_steps)
        servers = {}
        try:
            for name, src in checkouts.items():
                env = dict(os.environ, PYTHONPATH=str(src))
                servers[name] = subprocess.Popen([sys.executable, "-c", _REPORT_SERVER, tmp, f"{tmp}/report-{name}"],
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

            def reply(name: str) -> list[float]:
                with selectors.DefaultSelector() as sel:
                    sel.register(servers[name].stdout, selectors.EVENT_READ)
                    if not sel.select(timeout_s):
                        raise TimeoutError(f"the {name} checkout's report build took over {timeout_s:.0f} s")
                line = servers[name].stdout.readline()
                if not line:
                    raise RuntimeError(f"the {name} checkout's build server ended (exit status {servers[name].wait()})")
                return [float(x) for x in line.split()]

            for name in servers:  # one at a time: the first builds are timed too
                first[name] = reply(name)[0]
            for i in range(repeats):
                loops.append(host_loop_s())
                for name in list(servers) if i % 2 == 0 else list(servers)[::-1]:
                    servers[name].stdin.write("build\n")
                    servers[name].stdin.flush()
                    builds[name].append(tuple(reply(name)))
        finally:
            for proc in servers.values():
                proc.stdin.close()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    result = {"runs": sizes["runs"], "steps": sizes["steps"], "builds": repeats}
    if against:
        result["other"] = str(Path(against).resolve())
    for name, rows in builds.items():
        walls, cpus = [r[0] for r in rows], [r[1] for r in rows]
        prefix = "" if name == "this" and not against else f"{name}_"
        result.update({
            f"{prefix}report_s_median": statistics.median(walls), f"{prefix}report_s_min": min(walls),
            f"{prefix}report_s_max": max(walls), f"{prefix}first_build_s": first[name],  # imports included
            f"{prefix}cpu_s_median": statistics.median(cpus),  # the build process and its drawing processes
            # ru_maxrss in KiB: the build process, and the largest of its drawing processes (forked: pages shared)
            f"{prefix}peak_rss_mib": max(r[2] for r in rows) / 1024, f"{prefix}drawing_peak_rss_mib": max(r[3] for r in rows) / 1024,
        })
    if against:
        ratios = [a[0] / b[0] for a, b in zip(builds["this"], builds["other"])]
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        result.update({"ratio_median": statistics.median(ratios), "ratio_q1": quartiles[0], "ratio_q3": quartiles[2],
                       # CPU seconds: less swayed than wall time by other work on the host, blind to parallelism
                       "cpu_ratio_median": statistics.median(a[1] / b[1] for a, b in zip(builds["this"], builds["other"]))})
    result.update({"host_loop_s_median": statistics.median(loops), "host_loop_s_max": max(loops)})
    return result


def _checkout(path: str | Path) -> Path:
    root = Path(path).resolve()
    launchers = [root / "src" / "scalelab" / layer / "launch.py" for layer in ("run", "training")]  # "training": before the layers
    if not (root / "Snakefile").is_file() or not any(path.is_file() for path in launchers):
        raise SystemExit(f"{path}: not a scalelab checkout (no Snakefile, src/scalelab/run/launch.py)")
    return root


def time_sweep(checkout: Path, workdir: Path, tiny: bool = False, timeout_s: float = 1800) -> dict:
    """One default sweep of a checkout in a fresh working folder: its config.yaml as it stands
    (tiny: two 4-step fp32 stage-0 runs), the data prepared first and timed apart, then
    ``snakemake --cores all`` (training, collection, report) timed; its code imported from its
    src/ (PYTHONPATH, ahead of this venv's own install). Returns the wall times and each ok
    run's (world_size, startup_s)."""
    import os

    import yaml

    cfg = yaml.safe_load((checkout / "config.yaml").read_text())
    if tiny:
        cfg["sweep"].update(precision=["fp32"], zero_stage=[0], world_size=[1, 2])
        cfg["train"].update(steps=4, warmup_steps=1)
    workdir.mkdir(parents=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    bin_dir = Path(sys.executable).parent
    snakemake = str(bin_dir / "snakemake")
    env = {**os.environ, "PYTHONPATH": str(checkout / "src"), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop(PREFORK_ENV, None)  # each sweep starts its own (this code's) prefork server, as a user's would
    base = [snakemake, "-s", str(checkout / "Snakefile"), "-d", str(workdir), "--cores", "all"]
    results = workdir / cfg["results_dir"]
    walls = {}
    # targets are relative to the working folder (-d): Snakemake matches them as written
    for name, target in (("data", [f"{cfg['results_dir']}/data/{cfg['dataset']['name']}/meta.json"]), ("sweep", [])):
        start = time.perf_counter()
        out = subprocess.run(base + target, capture_output=True, text=True, env=env, timeout=timeout_s)
        walls[name] = time.perf_counter() - start
        if out.returncode != 0:
            raise RuntimeError(f"snakemake ({name}) in {workdir} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    startups = []
    for summary in results.glob("runs/*/summary.json"):
        row = json.loads(summary.read_text())
        if row.get("status") == "ok":
            startups.append((row["world_size"], row["startup_s"]))
    return {"data_s": walls["data"], "sweep_s": walls["sweep"], "startups": startups}


def bench_startup(repeats: int, against: str | None = None, tiny: bool = False) -> dict:
    """Run start-up (a run's ``startup_s``: from its launcher's start to its first step) and the
    default sweep's wall time, measured by running the default sweep ``repeats`` times, each in
    a fresh folder; with ``against``, the other checkout's sweeps alternate with this code's
    (which goes first swapped every round), the host loop timed before each round, so a shared
    host's drift weighs on both alike. Figures only: nothing is asserted."""
    checkouts = {"this": _checkout(Path(__file__).resolve().parents[3])}
    if against:
        checkouts["other"] = _checkout(against)
    sweeps: dict[str, list[dict]] = {name: [] for name in checkouts}
    loops = []
    with tempfile.TemporaryDirectory(prefix="scalelab-bench-startup-") as tmp:
        for i in range(repeats):
            loops.append(host_loop_s())
            for name in list(checkouts) if i % 2 == 0 else list(checkouts)[::-1]:
                sweeps[name].append(time_sweep(checkouts[name], Path(tmp) / f"{name}-{i}", tiny))
    result: dict = {"sweeps_each": repeats, "sweep_config": "tiny (fp32, stage 0, world sizes 1 and 2, 4 steps)" if tiny
                    else "config.yaml's default", "sweep_timed": "snakemake --cores all after the data step (timed apart)"}
    if against:
        result["other"] = str(checkouts["other"])
    for name, runs in sweeps.items():
        prefix = "" if not against else f"{name}_"
        for ws in (1, 2):
            values = [s for run in runs for w, s in run["startups"] if w == ws]
            result[f"{prefix}startup_s_median_ws{ws}"] = statistics.median(values) if values else float("nan")
            result[f"{prefix}ok_runs_ws{ws}"] = len(values)
        every = [s for run in runs for _, s in run["startups"]]
        result[f"{prefix}startup_s_median"] = statistics.median(every) if every else float("nan")
        result[f"{prefix}sweep_s_median"] = statistics.median(r["sweep_s"] for r in runs)
        result[f"{prefix}sweep_s"] = " ".join(f"{r['sweep_s']:.1f}" for r in runs)
        result[f"{prefix}data_s_median"] = statistics.median(r["data_s"] for r in runs)
    result.update({"host_loop_s_median": statistics.median(loops), "host_loop_s_max": max(loops)})
    return result


if __name__ == "__main__":
    sys.exit(main())
