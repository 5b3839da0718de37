"""Two identical sweeps back to back: does every comparison the report draws survive a second run?

    PYTHONPATH=tests python -m devtools.bench repeatability [--config FILE] [--cores all] [--keep DIR]

Runs the workflow twice on one config (default: the repository's config.yaml) into two fresh
working folders, one after the other, with the host's speed (a fixed Python loop) timed before
each, then prints:
- per run: tokens/s of sweep B over sweep A (identical sweeps moved 0.72-1.77x when runs shared
  the machine), with the median and range;
- every comparison the report draws, from each sweep's own tables: the best point per world size,
  scaling efficiency, precision ratios (against fp32 at the same stage and world size) and stage
  ratios (against stage 0 at the same precision and world size), each with what noise alone could
  move it by between the sweeps (scalelab.results.noise: the variances of its points added, 99%)
  and its verdict: ``agree`` (the same answer within that), ``within noise in both`` (each sweep
  finds the ratio within its own noise of 1: no difference claimed either time), or ``DISAGREE``.
Before the sweeps it times the host's own floor (``host_floor``): a fixed matmul on one pinned core
in windows as long as a run's measured window. A sweep's sigma is not expected below it.
Figures, not assertions: the machine is shared and noisy.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pandas as pd

from scalelab.registries.hardware import DRIFT_WARN, unsteady
from scalelab.report.tables import best_configurations
from scalelab.results.noise import Noise, margin_between, medians, relative_change, sweep_noise


def _ratio_rows(points: pd.DataFrame) -> dict[str, tuple[float, tuple[int, int]]]:
    """The ratios the report draws between points (medians of repeats), by name, each with the run
    counts of its two points (what its noise adds up from)."""
    ok = points[points["status"] == "ok"].set_index(["precision", "zero_stage", "world_size"])
    tps, n = ok["tokens_per_s"], ok["repeats"]
    out = {}
    for (precision, stage, ws) in tps.index:
        key = (precision, stage, ws)
        if precision != "fp32" and ("fp32", stage, ws) in tps.index:
            out[f"{precision}/fp32 z{stage} w{ws}"] = (tps[key] / tps[("fp32", stage, ws)], (n[key], n[("fp32", stage, ws)]))
        if stage != 0 and (precision, 0, ws) in tps.index:
            out[f"z{stage}/z0 {precision} w{ws}"] = (tps[key] / tps[(precision, 0, ws)], (n[key], n[(precision, 0, ws)]))
        if ws > 1 and (precision, stage, 1) in tps.index:  # scaling efficiency: over world size 1's median
            out[f"efficiency {precision}-z{stage}-w{ws}"] = (tps[key] / (ws * tps[(precision, stage, 1)]),
                                                            (n[key], n[(precision, stage, 1)]))
    return out


def comparisons(runs: pd.DataFrame) -> tuple[dict[str, tuple[float, tuple[int, int]]], dict[str, str], Noise]:
    """(ratios by name with their points' run counts, best point per world size with the points
    within noise of it, the noise)."""
    ratios = _ratio_rows(medians(runs))
    best = best_configurations(runs)
    bests = {f"best at w{r.world_size}": "|".join([r.run_id, *filter(None, str(r.within_noise or "").split(", "))])
             for r in best.itertuples() if isinstance(r.run_id, str)}
    return ratios, bests, best.attrs["noise"]


def verdicts(runs_a: pd.DataFrame, runs_b: pd.DataFrame) -> pd.DataFrame:
    """One row per comparison drawn from both sweeps: A's value, B's, what noise alone could move it by
    between them, and the verdict: ``agree`` (the change is within that), ``within noise in both``
    (each sweep's ratio is within its own noise of 1: neither claimed a difference), else ``DISAGREE``."""
    ratios_a, best_a, noise_a = comparisons(runs_a)
    ratios_b, best_b, noise_b = comparisons(runs_b)
    rows = []
    for name in sorted(set(ratios_a) & set(ratios_b)):
        (a, runs_in_a), (b, runs_in_b) = ratios_a[name], ratios_b[name]
        limit = margin_between(noise_a, runs_in_a, noise_b, runs_in_b)
        if limit is None:
            verdict = "unknown (no repeats)"
        elif relative_change(a, b) <= limit:
            verdict = "agree"
        elif (not name.startswith("efficiency") and noise_a.known and noise_b.known
              and relative_change(a, 1.0) <= noise_a.margin(*runs_in_a) and relative_change(b, 1.0) <= noise_b.margin(*runs_in_b)):
            verdict = "within noise in both"
        else:
            verdict = "DISAGREE"
        rows.append({"comparison": name, "A": f"{a:.3f}", "B": f"{b:.3f}",
                     "noise": "-" if limit is None else f"{limit:.0%}", "verdict": verdict})
    for name in sorted(set(best_a) & set(best_b)):
        tied_a, tied_b = best_a[name].split("|"), best_b[name].split("|")
        if tied_a[0] == tied_b[0]:
            verdict = "agree"
        elif tied_b[0] in tied_a and tied_a[0] in tied_b:
            verdict = "within noise in both"
        else:
            verdict = "DISAGREE"
        rows.append({"comparison": name, "A": " ~ ".join(tied_a), "B": " ~ ".join(tied_b), "noise": "-", "verdict": verdict})
    return pd.DataFrame(rows, columns=["comparison", "A", "B", "noise", "verdict"])


GOALS = {"sigma": 0.03, "margin": 0.15, "beyond_share": 0.5, "wall_s": 180.0}
"""What a sweep must resolve, on an idle 2-core machine: run-to-run sigma per run, the
99% margin between two single runs, the share of the other points at each world size that its
fastest point is beyond noise of, and the sweep's wall time."""


def ranking(runs: pd.DataFrame) -> list[dict]:
    """Per world size: the fastest point, how many of the others it is beyond noise of, of how many."""
    best = best_configurations(runs)
    out = []
    for r in best.itertuples():
        if not isinstance(r.run_id, str):
            continue
        same = runs[(runs["status"] == "ok") & (runs["world_size"] == r.world_size)]
        others = same.drop_duplicates([c for c in ("precision", "zero_stage", "model") if c in same]).shape[0] - 1
        tied = len([t for t in str(r.within_noise or "").split(", ") if t])
        out.append({"world_size": int(r.world_size), "best": r.run_id, "others": int(others),
                    "beyond_noise_of": int(others - tied)})
    return out


def _steals(runs: pd.DataFrame) -> pd.Series:
    """The runs' host_steal_share where measured (tables before schema 10 have none)."""
    return runs["host_steal_share"].dropna() if "host_steal_share" in runs else pd.Series(dtype=float)


def _steal(runs: pd.DataFrame, how: str) -> float | None:
    steal = _steals(runs)
    return None if steal.empty else float(getattr(steal, how)())


def drifted(runs: pd.DataFrame) -> int | None:
    """How many ok runs changed speed beyond DRIFT_WARN between the halves of their timed steps (step_time_drift);
    None where no run measured it (tables before schema 11, runs under DRIFT_MIN_STEPS steps)."""
    if "step_time_drift" not in runs:
        return None
    drift = runs.loc[runs["status"] == "ok", "step_time_drift"]
    return int(unsteady(drift).sum()) if drift.notna().any() else None


def goals(result: dict) -> dict:
    """The sweep's figures against GOALS: sigma, margin, ranking per world size, wall time (each sweep)."""
    out = {}
    for side in ("A", "B"):
        noise, runs = result[f"noise_{side.lower()}"], result[f"runs_{side.lower()}"]
        ranks = ranking(runs)
        out[side] = {"runs": len(runs), "sigma": noise.sigma, "dof": noise.dof, "margin_two_single_runs": noise.margin(1, 1),
                     "ranking": ranks, "wall_s": result["wall_s"]["AB".index(side)],
                     "host_steal_share_median": _steal(runs, "median"), "host_steal_share_max": _steal(runs, "max"),
                     "runs_drifted": drifted(runs),
                     "met": {"sigma": noise.sigma is not None and noise.sigma <= GOALS["sigma"],
                             "margin": noise.margin(1, 1) is not None and noise.margin(1, 1) <= GOALS["margin"],
                             "ranking": bool(ranks) and all(r["beyond_noise_of"] >= GOALS["beyond_share"] * r["others"]
                                                            for r in ranks),
                             "wall_s": result["wall_s"]["AB".index(side)] <= GOALS["wall_s"]}}
    return out


HOST_FLOOR_S = 60.0
"""Seconds the host-floor probe runs before the sweeps. The host's speed drifts over seconds to
minutes (slow noise: on an idle 2-core VM the probe's sigma was 3.3% in 1-s windows, 3.1% in 2-s,
2.6% in 4-s, 2.4% in 6-s), so a probe of a few windows would see too little of it."""


def host_floor(window_s: float, duration_s: float = HOST_FLOOR_S, size: int = 256) -> dict:
    """The steadiest a run can be on this host now: one fixed fp32 matmul on one pinned core (one
    thread), timed in back-to-back windows as long as a run's measured window, and the standard
    deviation of its log rate across them. Nothing of scalelab runs in it: a sweep whose sigma sits
    at this floor is about as steady as the host allows, and a goal below the floor is not expected to
    be met on it (a sigma of few degrees of freedom, measured at another moment, may still land below)."""
    import numpy as np
    import torch

    from scalelab.run.calibration import steal_share, this_rank_ticks

    threads = torch.get_num_threads()
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    torch.set_num_threads(1)
    if affinity:
        os.sched_setaffinity(0, {max(affinity)})
    try:
        a = torch.randn(size, size)
        a @ a  # warm-up
        ticks = this_rank_ticks()  # the pinned core's
        rates: list[float] = []
        end = time.perf_counter() + duration_s
        while time.perf_counter() < end or len(rates) < 3:
            start, n = time.perf_counter(), 0
            while (elapsed := time.perf_counter() - start) < window_s:
                a @ a
                n += 1
            rates.append(n / elapsed)
        steal = steal_share(ticks, this_rank_ticks())
    finally:
        torch.set_num_threads(threads)
        if affinity:
            os.sched_setaffinity(0, affinity)
    logs = np.log(rates)
    return {"window_s": window_s, "windows": len(rates), "sigma": float(np.std(logs, ddof=1)),
            "slowest_over_fastest": float(min(rates) / max(rates)), "steal_share": steal}


FLOOR_WINDOW_S = 2.0
"""The probe's window where the config measures no set time (train.measure_s 0): about a default run's."""


def floor_text(floor: dict) -> str:
    return (f"a fixed one-thread matmul on one pinned core, timed in {floor['windows']} windows of {floor['window_s']:g} s: "
            f"sigma {floor['sigma']:.1%} per window, the slowest {1 - floor['slowest_over_fastest']:.0%} below the fastest "
            "(the steadiest a run can be on this host now)"
            + ("" if floor.get("steal_share") is None else f"; the hypervisor took {floor['steal_share']:.1%} of the core's time"))


def steal_text(runs: pd.DataFrame) -> str:
    """The hypervisor's share of the runs' cores (host_steal_share): median and largest over the sweep's runs."""
    steal = _steals(runs)
    if steal.empty:
        return "unknown"
    return f"median {steal.median():.1%}, largest {steal.max():.1%} ({runs.loc[steal.idxmax(), 'run_id']})"


def run_ratios(runs_a: pd.DataFrame, runs_b: pd.DataFrame) -> pd.Series:
    """tokens/s of B over A, per run ok in both."""
    a = runs_a[runs_a["status"] == "ok"].set_index("run_id")["tokens_per_s"]
    b = runs_b[runs_b["status"] == "ok"].set_index("run_id")["tokens_per_s"]
    return (b / a).dropna().sort_index()


def bench_repeatability(config: Path, cores: str, keep: Path | None, timeout_s: float, host_loop_s,
                        floor_s: float = HOST_FLOOR_S) -> dict:
    """host_loop_s: the host-speed probe (devtools.bench's fixed Python loop), timed before each sweep;
    floor_s: seconds of ``host_floor`` before sweep A, in windows of the config's train.measure_s (0: none)."""
    import shutil
    import tempfile

    import yaml

    from scalelab.harness.testing import run_snakemake, write_workdir

    cfg = yaml.safe_load(Path(config).read_text())
    floor = None
    if floor_s > 0:
        window_s = float((cfg.get("train") or {}).get("measure_s") or 0) or FLOOR_WINDOW_S
        floor = host_floor(window_s, floor_s)
        print(f"host floor: {floor_text(floor)}", flush=True)
    root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="scalelab-repeat-"))
    sides = {}
    try:
        for side in ("A", "B"):
            workdir = write_workdir(root / side, {**cfg, "results_dir": "results"})
            loop = host_loop_s()
            start = time.perf_counter()
            proc = run_snakemake(workdir, "--cores", cores, timeout=timeout_s)
            wall = time.perf_counter() - start
            runs = pd.read_parquet(workdir / "results" / "metrics.parquet")
            sides[side] = {"runs": runs, "wall_s": wall, "host_loop_s": loop}
            console = proc.stdout + proc.stderr  # what the user saw
            print(f"sweep {side}: {len(runs)} runs, {int((runs['status'] == 'ok').sum())} ok, {wall:.0f} s; "
                  f"host loop before it {loop:.3f} s; console {len(console.splitlines())} lines, "
                  f"{len(console.encode())} bytes", flush=True)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    a, b = sides["A"]["runs"], sides["B"]["runs"]
    ratios = run_ratios(a, b)
    table = verdicts(a, b)
    return {"ratios": ratios, "verdicts": table, "noise_a": sweep_noise(a), "noise_b": sweep_noise(b), "runs_a": a, "runs_b": b,
            "wall_s": (sides["A"]["wall_s"], sides["B"]["wall_s"]), "host_loop_s": (sides["A"]["host_loop_s"], sides["B"]["host_loop_s"]),
            "host_floor": floor}


def print_repeatability(result: dict) -> None:
    ratios, table = result["ratios"], result["verdicts"]
    print("\nper-run tokens/s, sweep B / sweep A:")
    for run_id, ratio in ratios.items():
        print(f"  {run_id:<28} {ratio:.3f}")
    if len(ratios):
        print(f"  median {statistics.median(ratios):.3f}, from {ratios.min():.3f} ({ratios.idxmin()}) to {ratios.max():.3f} "
              f"({ratios.idxmax()}); host loop {result['host_loop_s'][0]:.3f} s before A, {result['host_loop_s'][1]:.3f} s before B")
    print(f"noise: A {result['noise_a'].text()}\n       B {result['noise_b'].text()}")
    print(f"the hypervisor's share of the runs' cores: A {steal_text(result['runs_a'])}; B {steal_text(result['runs_b'])}")
    moved = {side: drifted(result[f"runs_{side.lower()}"]) for side in "AB"}
    print(f"runs whose speed changed by more than {DRIFT_WARN:.0%} between the halves of their timed steps (their speed "
          "was not steady while timed): " + "; ".join(f"{side} {'unknown' if n is None else n}" for side, n in moved.items()))
    print("\ncomparisons the report draws:")
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.max_colwidth", 80):
        print(table.to_string(index=False))
    counts = table["verdict"].value_counts()
    print("\n" + ", ".join(f"{n} {v}" for v, n in counts.items()) + f" (of {len(table)})")
    print(f"wall time: A {result['wall_s'][0]:.0f} s, B {result['wall_s'][1]:.0f} s")
    print(f"\ngoals (an idle 2-core machine): sigma <= {GOALS['sigma']:.0%} per run, two single runs' 99% "
          f"margin <= {GOALS['margin']:.0%}, the fastest point beyond noise of at least {GOALS['beyond_share']:.0%} of the "
          f"others at each world size, wall time <= {GOALS['wall_s']:.0f} s")
    floor = result.get("host_floor")
    if floor:
        print(f"  host floor: {floor_text(floor)}"
              + ("; the sigma goal is below it: no sweep on this host is expected to meet it" if floor["sigma"] > GOALS["sigma"] else ""))
    for side, g in goals(result).items():
        sigma = "unknown" if g["sigma"] is None else f"{g['sigma']:.1%} ({g['dof']} dof)"
        margin = "unknown" if g["margin_two_single_runs"] is None else f"{g['margin_two_single_runs']:.1%}"
        ranks = "; ".join(f"w{r['world_size']} {r['best']} beyond {r['beyond_noise_of']} of {r['others']}" for r in g["ranking"])
        if floor and g["dof"]:
            margin += f" (at the host floor: {Noise(spread=None, worst=None, points=0, runs=0, sigma=floor['sigma'], dof=g['dof']).margin(1, 1):.1%})"
        print(f"  {side}: sigma {sigma} {'ok' if g['met']['sigma'] else 'MISSED'}; margin {margin} "
              f"{'ok' if g['met']['margin'] else 'MISSED'}; {ranks} {'ok' if g['met']['ranking'] else 'MISSED'}; "
              f"wall {g['wall_s']:.0f} s {'ok' if g['met']['wall_s'] else 'MISSED'}")
    if (table["verdict"] == "DISAGREE").any():
        print("DISAGREE: " + ", ".join(table.loc[table["verdict"] == "DISAGREE", "comparison"]))


def machine() -> dict:
    """What ran the sweeps: the CPU (model, family, matmul instructions), the machine's CPUs and the cores this process
    may use (a sweep under taskset uses fewer than the machine has: 2 of 16 on the H200 machine's slice)."""
    import platform

    from scalelab.registries.hardware import cpu_name

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_name(), "cpus": os.cpu_count(), "cores_used": cores, "python": platform.python_version()}


def record(result: dict, config: Path) -> dict:
    """The figures as JSON: what the docs state about the default sweep comes from here."""
    import datetime

    from scalelab.run.launch import git_provenance

    figures = goals(result)
    return {"what": "PYTHONPATH=tests python -m devtools.bench repeatability: two identical sweeps of the config, back to back",
            "measured_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "config": config.name, "git_commit": git_provenance(Path(config).parent)["git_commit"],
            "machine": machine(),
            "host_loop_s": list(result["host_loop_s"]), "host_floor": result.get("host_floor"), "goals": GOALS, "sweeps": figures}
