"""Launch one training run (one sweep point) and always leave a result behind.

Starts the run's ranks (one process each on this host, or ``srun`` x ``torchrun`` over
several nodes) with a wall-clock limit, then writes the run's
``summary.json`` and ``steps.parquet`` atomically whatever happened: status ``ok``,
``oom``, ``timeout``, ``failed`` or ``skipped``, with the reason. The process exits 0 in
every one of those cases, because Snakemake deletes the outputs of failed jobs and a sweep
must keep its failures as results. Only a kill of the launcher itself leaves no summary
(so ``snakemake --rerun-incomplete`` redoes the run).

Nothing here imports torch for a CPU run (about 1.5 s of every run's start-up on 2 cores): the
device comes from the workflow's plan, and what needs torch to check (whether the device runs
the precision) is checked by the worker (scalelab.run.worker.preflight).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import subprocess
import time
from pathlib import Path

from scalelab.config import config_hash
from scalelab.io import read_json, remove_stale_temporaries, write_json
from scalelab.planning import placement
from scalelab.planning.placement import LaunchPlan
from scalelab.planning.result_tables import steps_table, write_parquet
from scalelab.planning.run_plan import PLAN_FILE, RunPlan
from scalelab.planning.sweep import LAUNCHER_FILE, POINT_FILE, RunPoint
from scalelab.registries.families import family
from scalelab.run import prefork
from scalelab.run.calibration import read_calibration
from scalelab.run.data import read_meta, verify_tokens
from scalelab.run.processes import holder_record
from scalelab.run.ranks import (
    LOCAL_LAUNCH,
    PORT_TAKEN,
    RENDEZVOUS_ATTEMPTS,
    local_rank_processes,
    run_ranks,
    torchrun_command,
)

GIT_COMMIT_ENV = "SCALELAB_GIT_COMMIT"
"""The commit of a tree without .git (a copy, a container, a cluster stage-in): set it where
the tree is copied, e.g. SCALELAB_GIT_COMMIT=$(git rev-parse HEAD); SCALELAB_GIT_DIRTY=0|1 optional."""


def git_provenance(cwd: Path) -> dict:
    """git_commit, git_dirty and where they came from: git itself, else the environment
    (GIT_COMMIT_ENV), else nothing, and the source says why."""
    def git(*args):
        try:
            out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
            return out.stdout.strip() if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    # Only a git checkout of this project counts: a copied tree inside some other repository
    # would otherwise record that repository's commit.
    top = git("rev-parse", "--show-toplevel")
    commit = git("rev-parse", "HEAD") if top and (Path(top) / "src" / "scalelab").is_dir() else None
    if commit:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return {"git_commit": commit, "git_dirty": bool(dirty), "git_commit_source": "git"}
    given = os.environ.get(GIT_COMMIT_ENV, "").strip()
    if given:
        if not re.fullmatch(r"[0-9a-fA-F]{7,40}", given):  # recorded as unknown, never as a wrong commit
            return {"git_commit": None, "git_dirty": None,
                    "git_commit_source": f"unknown: {GIT_COMMIT_ENV}={given[:60]!r} is not a commit hash (7-40 hex digits)"}
        dirty = os.environ.get("SCALELAB_GIT_DIRTY", "").strip().lower()
        return {"git_commit": given.lower(), "git_dirty": {"1": True, "true": True, "0": False, "false": False}.get(dirty),
                "git_commit_source": f"environment {GIT_COMMIT_ENV}"}
    return {"git_commit": None, "git_dirty": None,
            "git_commit_source": f"unknown: no git checkout at {Path(cwd).resolve()} and {GIT_COMMIT_ENV} unset"}


def resolve_device(requested: str, planned: str | None = None) -> tuple[str, str | None]:
    """('cpu'|'cuda', reason to skip or None). planned: the device the workflow planned the
    sweep for (scalelab.planning.placement.plan_device); a run planned for a GPU never trains elsewhere.
    A run planned for the CPU imports no torch here."""
    if planned == "cpu" or (planned is None and requested == "cpu"):
        return "cpu", None
    import torch

    if planned is None:  # launched outside the workflow: decide here
        planned = "cuda" if requested == "cuda" or torch.cuda.is_available() else "cpu"
    if planned == "cuda" and not torch.cuda.is_available():
        build = f"torch {torch.__version__}, CUDA {torch.version.cuda}" if torch.version.cuda else \
            f"torch {torch.__version__} is a CPU-only build"
        return "cuda", f"this run was planned for a GPU (train.device={requested}) but no CUDA device is visible ({build})"
    return planned, None


def skip_reason(device: str, point: RunPoint, plan: LaunchPlan, launchers_per_node: int,
                fp8_emulate: bool = False) -> str | None:
    """Why this run is not launched here, as far as the launcher can tell. A GPU run's checks
    need torch (GPU count, compute capability); a CPU run's precision is checked by its
    worker instead (scalelab.run.worker.preflight: the run ends `skipped` all the same),
    so that a CPU job's launcher never imports torch."""
    if point.cpu_offload and device != "cuda":
        return (f"cpu_offload moves model state from GPU memory to host memory; this run is on {device}, "
                "where the model state is in host memory already")
    if device != "cuda":
        return None
    import torch

    from scalelab.run.precision import unsupported_reason

    shortfall = placement.gpu_shortfall(plan, point.world_size, launchers_per_node, torch.cuda.device_count())
    if shortfall:
        return shortfall
    return unsupported_reason(point.precision, torch.device(device), fp8_emulate)


def plan_memory(config: dict, plan: RunPlan) -> dict:
    """Predicted in-step peak per rank against the device memory, before launch."""
    from scalelab.formulas import flops, peak_memory, predicted_columns

    model, point, device = plan.model, plan.point, plan.device

    own = None
    if model.module:  # the user's module: counted on the meta device (imports torch), no activation formula
        from scalelab.run.model import counted

        own = counted(model)
    n_params = own["n_params"] if own else flops.param_count(model)
    peak = predicted_columns.peak(model, n_params, plan.formula_row(),
                                  block_params=own["block_params"] if own else None,
                                  n_trainable=counted(model, point.lora_rank)["lora_trainable"] if own and point.lora_rank else None)
    limit = placement.device_memory_limit(config, None)
    if limit is None and device == "cuda":
        import torch

        if torch.cuda.is_available():  # a cuda run on a machine without one is skipped anyway
            limit = torch.cuda.get_device_properties(0).total_memory
    oom = None
    if peak_memory.predicts_oom(peak, limit):  # never on an upper bound alone: such a run is launched and measured
        parts = (f"the optimizer step: model state at rest {peak.at_rest / 2**20:.1f}"
                 if peak.at_optimizer_step else
                 f"model state {peak.model_state / 2**20:.1f} + in-step parameters {peak.transient_params / 2**20:.1f} + "
                 f"activations {peak.activations / 2**20:.1f}")
        oom = (f"predicted peak {peak.total / 2**20:.1f} MiB per rank ({parts}"
               + ("" if peak.exact else f"; {peak.bound}") + f") exceeds the device memory {limit / 2**20:.1f} MiB; "
               "not launched (set planning.launch_predicted_oom: true to launch it anyway)")
    return {**predicted_columns.peak_columns(peak, custom=bool(own)), "device_memory_bytes": limit, "predicted_oom_reason": oom}


def launch_run(config: dict, plan: RunPlan, data_dir: str | Path, run_dir: str | Path,
               log_path: str | Path, threads: int = 1, repo_dir: str | Path = ".",
               save_final_params: bool = False, compile_warm_up: bool = True, calibration: str | Path | None = None,
               forecast: dict | None = None, pruned: str | None = None) -> dict:
    """Run one sweep point on its plan (scalelab.planning.run_plan, made once by the workflow's rules: the device it
    was planned for included); write point.json, then summary.json and steps.parquet into run_dir; return the
    summary. The launcher adds only what the job knows (the data's vocabulary, the run folder, its threads) and
    checks that the planned device is here; the plan is what the ranks read.
    calibration: the sweep's CPU peak record (scalelab.run.calibration); None: a CPU run measures its own.
    compile_warm_up=False (tests only) leaves a compiled run's compilation to its first step.
    forecast: the sweep's forecast of this point (scalelab.forecast.pruning: its forecast_* columns), recorded;
    pruned: why the forecast pruned it (status skipped, nothing started)."""
    point = plan.point
    started = time.time()
    run_dir, log_path = Path(run_dir), Path(log_path)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / POINT_FILE, point.to_json())  # first: a folder says which point it holds, whatever happens next
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _launch(config, plan, Path(data_dir), run_dir, log_path, started, threads=threads, repo_dir=repo_dir,
                       save_final_params=save_final_params, compile_warm_up=compile_warm_up,
                       calibration=calibration, forecast=forecast, pruned=pruned)
    except Exception as err:  # noqa: BLE001 - any failure of this run's launcher is this run's result, never the sweep's end
        return _launcher_failed(point, run_dir, log_path, started, err)


def _launcher_failed(point: RunPoint, run_dir: Path, log_path: Path, started: float, err: Exception) -> dict:
    """A `failed` summary for a run whose launcher raised before its ranks ended (a user's model module
    that does not import or build, an unreadable data folder, a full disk): the sweep goes on with the other
    points, and `scalelab status` names the cause. The traceback goes to the run's log. A kill (SIGTERM,
    Ctrl-C) is no Exception: it leaves no summary, and the run is rerun."""
    import errno
    import traceback

    cause = "no space left on device" if getattr(err, "errno", None) == errno.ENOSPC else type(err).__name__
    reason = f"the launcher failed before the run ended ({cause}): {' '.join(str(err).split())[:500]}"
    try:
        with open(log_path, "a") as log:
            log.write("".join(traceback.format_exception(err)))
    except OSError:
        pass  # a full disk: the summary below may still fit (it is small), else the run reads killed
    summary = {**point.identity(), "status": "failed", "reason": reason,
               "wall_time_s": time.time() - started}
    _write_results(run_dir, log_path, point.run_id, point.identity(), [], summary)
    return summary


def _overcommit_reason(config: dict, plan: RunPlan, threads: int, memory_plan: dict) -> str | None:
    """Why a CPU run is not launched on this host (more threads or memory than it has), or None."""
    launchers_per_node = int((config.get("cluster") or {}).get("launchers_per_node", 1))
    ranks_here = placement.ranks_per_node(plan.launch, launchers_per_node) if placement.spans_nodes(plan.launch) else None
    reason = placement.overcommit_reason(plan.point.world_size, threads, memory_plan["predicted_peak_bytes"],
                                         placement.host_memory_available(), ranks_here)
    if reason:
        reason += "; not launched (set planning.launch_overcommitted: true to launch it anyway)"
    return reason


def _run_description(config: dict, plan: RunPlan, meta: dict, identity: dict, *, device: str, threads: int,
                     started: float, repo_dir: str | Path) -> dict:
    """What a run's summary says of it before it runs: its point, data, model, training, device and code."""
    model, train = plan.model, plan.train
    return {
        **identity,
        "dataset": meta["dataset"], "dataset_sha256_train": meta["sha256"]["train.bin"],
        "model_family": model.kind, "model_module": model.module,
        **({} if model.module else family(model.family).own_columns(model)),  # the family's own keys, resolved
        "n_layers": model.n_layers, "d_model": model.d_model, "n_heads": model.n_heads,
        "seq_len": model.seq_len, "vocab_size": model.vocab_size, "tie_embeddings": model.tie_embeddings,
        "steps": train.steps, "warmup_steps": train.warmup_steps, "global_batch": train.global_batch,
        "accumulation_steps": plan.accumulation_steps, "seed": train.seed,
        "config_hash": config_hash(config), "requested_device": train.device, "device_type": device,
        "planned_device_reason": plan.device_reason,
        "threads": threads, "started_utc": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
        **git_provenance(Path(repo_dir)),
    }


def _launch(config: dict, plan: RunPlan, data_dir: Path, run_dir: Path, log_path: Path, started: float, *,
            threads: int, repo_dir: str | Path, save_final_params: bool, compile_warm_up: bool,
            calibration: str | Path | None, forecast: dict | None, pruned: str | None) -> dict:
    point = plan.point
    _remove_leftovers(run_dir, resuming=bool(config["train"].get("checkpoint_every")) and (run_dir / "checkpoint").is_dir())
    # Who runs this folder, until summary.json is written: `scalelab status` sees at once that a
    # killed launcher is gone (scalelab.results.status), instead of waiting for the folder to go quiet.
    write_json(run_dir / LAUNCHER_FILE, {**holder_record(), "started": started})

    meta = read_meta(data_dir)
    tokens_problem = verify_tokens(data_dir, meta)  # never train on tokens other than meta.json's
    train = plan.train
    if pruned is not None:  # a decision made before any job: written where it was planned (a SLURM login node has no GPU)
        device, reason = plan.device, pruned
    else:  # the planned device, or why it is not here: a run never trains on a device it was not planned for
        device, reason = resolve_device(train.device, plan.device)
    plan = plan.at(vocab_size=meta["vocab_size"], train_bin=Path(data_dir) / "train.bin", token_dtype=meta["dtype"],
                   run_dir=run_dir, threads=threads, save_final_params=save_final_params, compile_warm_up=compile_warm_up)
    identity = point.identity(micro_batch=plan.micro_batch)
    if reason is None:
        reason = skip_reason(device, point, plan.launch, int((config.get("cluster") or {}).get("launchers_per_node", 1)),
                             train.fp8_emulate)
    memory_plan = plan_memory(config, plan)
    if reason is None and device == "cpu" and not config.get("planning", {}).get("launch_overcommitted", False):
        reason = _overcommit_reason(config, plan, threads, memory_plan)
    summary = _run_description(config, plan, meta, identity, device=device, threads=threads, started=started,
                               repo_dir=repo_dir)
    summary.update(memory_plan)
    summary.update(forecast or {})
    records: list[dict] = []
    if tokens_problem is not None:
        status, reason = "failed", tokens_problem
    elif reason is not None:
        status = "skipped"
    elif memory_plan["predicted_oom_reason"] and not config.get("planning", {}).get("launch_predicted_oom", False):
        status, reason = "predicted_oom", memory_plan["predicted_oom_reason"]
    else:
        plan = dataclasses.replace(plan, calibration=read_calibration(calibration))  # read only for a run that starts
        status, reason, records, launched = _run_workers(plan, config["cluster"], log_path, started)
        summary.update(launched)

    summary.update(status=status, reason=reason, wall_time_s=time.time() - started)
    _write_results(run_dir, log_path, point.run_id, identity, records, summary)
    return summary


def _remove_leftovers(run_dir: Path, resuming: bool) -> None:
    """Delete what a killed attempt left in run_dir; a resumed run keeps the step records up
    to its checkpoint."""
    stale = [*run_dir.glob("rank*.error.json"), run_dir / "worker_result.json"]
    if not resuming:
        stale.append(run_dir / "progress.jsonl")
    for path in stale:
        path.unlink(missing_ok=True)


def _run_workers(plan: RunPlan, cluster: dict, log_path: Path, started: float) -> tuple[str, str | None, list[dict], dict]:
    """Start the ranks on the plan (written as run_plan.json: what each rank reads), then read back what the
    workers left: (status, reason, step records, summary fields: how the ranks were launched, what they measured)."""
    run_dir = Path(plan.run_dir)
    plan_path = run_dir / PLAN_FILE
    plan.write(plan_path)
    world_size, launch = plan.point.world_size, plan.launch
    env = {**os.environ, "OMP_NUM_THREADS": str(plan.threads_per_rank), "PYTHONUNBUFFERED": "1"}
    spans_nodes = placement.spans_nodes(launch)
    if spans_nodes:
        launched = {"launch": "srun x torchrun (static rendezvous)", "launchers": launch.launchers}
    else:
        launched = {"launch": LOCAL_LAUNCH, "launchers": 1}
    retried_s = 0.0  # the attempts that found their port taken: not the run's start-up
    for attempt in range(1, RENDEZVOUS_ATTEMPTS + 1):
        if spans_nodes:  # each attempt on a new rendezvous port (free_port)
            cmd = torchrun_command(launch, world_size, plan_path, placement.srun_step_options(launch, plan.device, cluster))
            processes = [(cmd, placement.srun_environment(env))]
        else:
            processes = local_rank_processes(world_size, plan_path, env)
        attempt_started = time.time()
        status, reason, launched["teardown_warning"], forked = run_ranks(
            processes, log_path, plan.train.run_timeout_s, run_dir,
            forkable=not spans_nodes and plan.device == "cpu")  # scalelab.run.prefork: CPU ranks only
        if status != PORT_TAKEN:  # the store's port is bound before any step: nothing else ran
            break
        if attempt == RENDEZVOUS_ATTEMPTS:
            status = "failed"
            break
        retried_s += time.time() - attempt_started
        _remove_leftovers(run_dir, resuming=True)  # none expected (no rank got past the rendezvous); a resumed run's steps stay
        with open(log_path, "a") as log:
            log.write(f"scalelab: {reason}; starting the ranks again on a new port (attempt {attempt + 1} of {RENDEZVOUS_ATTEMPTS})\n")
    if forked:
        launched["launch"] = prefork.FORKED_LAUNCH
    if status == "skipped":  # the workers' preflight: nothing ran, as with a skip decided here
        plan_path.unlink(missing_ok=True)
        return status, reason, [], {}
    records = []
    if (run_dir / "progress.jsonl").exists():
        records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines() if line.strip()]
    if status == "ok":
        launched.update(read_json(run_dir / "worker_result.json"))
        launched["startup_s"] = launched.pop("first_step_unix") - started - retried_s
    launched["completed_steps"] = len(records)
    if records:
        launched["final_loss"] = records[-1]["loss"]
    plan_path.unlink(missing_ok=True)
    return status, reason, records, launched


def _write_results(run_dir: Path, log_path: Path, run_id: str, identity: dict, records: list[dict], summary: dict) -> None:
    """Log the outcome, write steps.parquet and then summary.json, and remove the scratch files."""
    status, reason = summary["status"], summary["reason"]
    with open(log_path, "a") as log:
        log.write(f"scalelab: {run_id} finished with status {status}" + (f": {reason}" if reason else "") + "\n")
    write_parquet(steps_table(identity, records), run_dir / "steps.parquet")
    write_json(run_dir / "summary.json", summary)  # last: its presence means the run is complete
    remove_stale_temporaries(run_dir)  # of the ranks' files, where a rank was killed mid-write
    for scratch in [run_dir / "worker_result.json", run_dir / "progress.jsonl", *run_dir.glob("rank*.error.json"),
                    run_dir / LAUNCHER_FILE]:
        if status == "ok" or scratch.name in ("worker_result.json", LAUNCHER_FILE):
            scratch.unlink(missing_ok=True)
    if status == "ok":  # checkpoints exist to resume an unfinished run; this one is finished
        import shutil

        shutil.rmtree(run_dir / "checkpoint", ignore_errors=True)
