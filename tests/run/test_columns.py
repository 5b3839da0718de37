"""The column table (scalelab.planning.columns) against real runs of every status and lever: each column
written by its writer, no summary key that no column holds, null only where its contract says."""
import copy
import json
import os
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from scalelab.planning.column_checks import null_problems, steps_problems, summary_problems
from scalelab.planning.columns import IDENTITY, LAUNCHER_STATUSES, RUN_COLUMNS, STEP_COLUMNS
from scalelab.planning.sweep import AXIS, LEVER_AXES, RunPoint
from scalelab.results.collect import collect
from scalelab.run.prefork import FORKED_LAUNCH, PREFORK_ENV
from scalelab.run.ranks import LOCAL_LAUNCH
from support import run_point, tiny_config

# Columns no run of the fixture below fills on a CPU, and the runs that fill them (each is
# checked there: conftest.run_point holds every real run of the suite against the table).
FILLED_ELSEWHERE = {
    "teardown_warning": "tests/*/test_training.py, the teardown fault",
    "resumed_from_step": "tests/*/test_training.py, the checkpoint and resume tests",
    "compile_time_s": "tests/*/test_levers.py, the compile lever (tens of seconds of compiling on a CPU)",
    "compile_graphs": "tests/*/test_levers.py, the compile lever",
    "compile_graphs_in_loop": "tests/*/test_levers.py, the compile lever",
    "peak_mem_allocated_bytes": "GPU runs (tests/gpu/test_gpu.py)",
    "peak_mem_reserved_bytes": "GPU runs (tests/gpu/test_gpu.py)",
    "cuda_version": "GPU runs (tests/gpu/test_gpu.py)",
    "nccl_version": "GPU runs (tests/gpu/test_gpu.py)",
    # these runs are one per status, with no ok world-size-1 twin of an ok run's precision and stage
    "scaling_efficiency": "tests/*/test_collected_columns.py, collection of world sizes 1 and 2",
    # the model families' own columns (these runs train the default GPT-2 model)
    "n_kv_heads": "tests/*/test_families.py, the llama runs",
    "ffn_dim": "tests/*/test_families.py, the llama runs",
    "rope_base": "tests/*/test_families.py, the llama runs",
    "model_module": "tests/*/test_families.py, the model the test suite defines",
    "nodes_share_machine": "tests/*/test_slurm.py, runs across the virtual cluster's nodes",
    # under a second of one core's ticks says nothing (these runs time a few steps); a second or more does
    "host_steal_share": "tests/*/test_training.py, the measurement window's run",
    # 20 measured steps or more (these runs time fewer)
    "step_time_drift": "tests/*/test_training.py, the measurement window's run",
    # a traced run (train.profile) and the GPU's own state
    **{name: "tests/*/test_trace.py, traced runs" for name in ("profiled_steps", "trace_files", "exposed_comm_s_measured")},
    **{name: "GPU runs (tests/gpu/test_gpu.py; nvidia-smi simulated in tests/unit/test_devices.py)" for name in (
        "memory_snapshot_files", "gpu_power_limit_w", "gpu_driver_version", "gpu_sm_clock_mhz_start", "gpu_sm_clock_mhz_end",
        "gpu_mem_clock_mhz_start", "gpu_mem_clock_mhz_end", "gpu_temperature_c_start", "gpu_temperature_c_end")},
    # planning.top_k's forecast: written only by a sweep that sets it
    **{name: "tests/*/test_pruning.py, a sweep with planning.top_k, and tests/*/test_pruned_record.py" for name in (
        "forecast_step_time_s", "forecast_tokens_per_s", "forecast_rank", "forecast_decision", "forecast_note")},
    # the step-time model predicts from an ok run at the smallest world size (none here) and a bench comm table
    **{name: "tests/*/test_commbench.py, a sweep collected with its bench comm table" for name in (
        "predicted_step_time_s", "predicted_step_time_s_low", "predicted_step_time_s_high", "predicted_tokens_per_s",
        "predicted_exposed_comm_s")},
}


def test_the_column_table_sits_below_training_and_analysis():
    """scalelab.planning.columns imports neither training nor analysis (nor torch), and the launcher and the
    worker import no analysis module: the dependency points down."""
    code = ("import sys, importlib; importlib.import_module(sys.argv[1]); "
            "print(' '.join(m for m in sys.modules if m.startswith(('scalelab.report', 'scalelab.run', 'torch'))))")
    loaded = {name: subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True, check=True,
                                   timeout=300).stdout.split()
              for name in ("scalelab.planning.columns", "scalelab.run.launch", "scalelab.run.worker")}
    assert loaded["scalelab.planning.columns"] == []
    assert "scalelab.run.launch" in loaded["scalelab.run.launch"]
    for name in ("scalelab.run.launch", "scalelab.run.worker"):
        assert [m for m in loaded[name] if m.startswith("scalelab.report")] == [], name


def test_a_snakefile_parse_imports_no_table_library():
    """Every Snakemake start parses the Snakefile and its rules (a SLURM job's too): the scalelab modules
    they import at top level pull in neither pyarrow nor pandas (~0.1 s of each start; the column table and
    the analysis import them where they are used)."""
    from scalelab.harness.testing import snakefile_imports

    modules = snakefile_imports()
    assert "scalelab.forecast.pruning" in modules and "scalelab.results.status" in modules, modules
    code = ("import sys, importlib; [importlib.import_module(m) for m in sys.argv[1:]]; "
            "print(' '.join(m for m in ('pyarrow', 'pandas', 'torch') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, check=True, timeout=300)
    assert loaded.stdout.split() == [], (loaded.stdout, modules)



def test_a_training_jobs_launcher_imports_no_pandas(tmp_path, tiny_data):
    """A sweep's training job (the launcher, a process per run) writes steps.parquet without pandas: pyarrow
    imports it on its first conversion of Python objects, ~0.4 s of CPU in every job (scalelab.planning.columns.
    steps_table reads the rows with Arrow's JSON reader instead). A real run, its ranks forked."""
    import json

    cfg = tiny_config(train={"steps": 3, "warmup_steps": 1})
    code = ("import json, sys; from pathlib import Path; from scalelab.run.launch import launch_run; "
            "from scalelab.planning.sweep import RunPoint; from scalelab.harness.testing import local_plan; a = json.loads(sys.argv[1]); "
            "s = launch_run(a['cfg'], local_plan(a['cfg'], RunPoint('fp32', 0, 1)), Path(a['data']), Path(a['run']), Path(a['log'])); "
            "print(s['status'], 'pandas' in sys.modules)")
    args = {"cfg": cfg, "data": str(tiny_data), "run": str(tmp_path / "run"), "log": str(tmp_path / "run.log")}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ok", "False"], (proc.stdout, (tmp_path / "run.log").read_text()[-3000:])
    assert pq.read_table(tmp_path / "run" / "steps.parquet").num_rows == 3

# ----------------------------------------------------------------------------- real runs


def _runs_cfg(**train):
    return tiny_config(train={"steps": 6, "warmup_steps": 2, **train}, planning={"launch_overcommitted": True})


# Every status the launcher writes, and every lever away from its default (cpu_offload: a
# skipped row on a CPU; compile: FILLED_ELSEWHERE). Two ranks where collectives matter.
RUNS = {
    "ok": (RunPoint("fp16", 1, 2, micro_batch=1, activation_checkpointing=True, bucket_mb=0.002, lora_rank=2, grad_reduce="compute"),
           {}, None),
    "ok fp8": (RunPoint("fp8", 3, 2), {"fp8_emulate": True}, None),
    # 2 replicas of 1 shard; a measurement window (timing and half-batch steps: their columns)
    "ok hybrid": (RunPoint("bf16", 3, 2, replicas=2), {"measure_s": 0.3}, None),
    # its columns: comm_tensor_parallel_*; sequence parallelism a lever of its own
    "ok tensor parallel": (RunPoint("fp32", 3, 2, tensor_parallel=2, sequence_parallel=True), {}, None),
    # its columns: pipeline_*, comm_pipeline_*, bubble_fraction_*; the schedule a lever of its own
    "ok pipeline": (RunPoint("bf16", 2, 2, micro_batch=1, pipeline_parallel=2, pipeline_schedule="gpipe"), {}, None),
    "skipped": (RunPoint("fp32", 3, 1, cpu_offload=True), {}, None),
    "predicted_oom": (RunPoint("bf16", 0, 1), {}, None),
    "failed": (RunPoint("fp32", 0, 1), {}, "crash@step=1,rank=0"),
    "oom": (RunPoint("fp32", 1, 1), {}, "oom@step=1,rank=0"),
    "timeout": (RunPoint("bf16", 2, 1), {"run_timeout_s": 8}, "hang@step=0,rank=0"),  # timed out while starting or hung
    "diverged": (RunPoint("fp32", 2, 1), {"lr": 1e30}, None),
}


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory, tiny_data):
    """{name: (summary.json, run folder)}, the folders under <results>/runs/ as the workflow lays them out."""
    pytest.importorskip("torchao.float8")
    results = tmp_path_factory.mktemp("columns")
    runs = {}
    for name, (point, train, fault) in RUNS.items():
        cfg = _runs_cfg(**train)
        if name == "predicted_oom":
            cfg["planning"].update(device_memory_gib=1e-6)
        _, _, run_dir = run_point(results / "runs", tiny_data, point, cfg=cfg, fault=fault)
        runs[name] = (json.loads((run_dir / "summary.json").read_text()), run_dir)  # as the launcher wrote it
    return results, runs


def test_real_runs_of_every_status_and_lever_keep_the_contract(real_runs, tmp_path):
    results, runs = real_runs
    summaries = {name: summary for name, (summary, _) in runs.items()}
    assert {name: s["status"] for name, s in summaries.items()} == {name: name.split()[0] for name in RUNS}
    assert set(LAUNCHER_STATUSES) == {s["status"] for s in summaries.values()}
    levers_on = {lever for point, _, _ in RUNS.values() for lever in LEVER_AXES if getattr(point, lever) != AXIS[lever].default}
    assert levers_on == set(LEVER_AXES) - {"compile"}, "compile: FILLED_ELSEWHERE"
    for name, (summary, run_dir) in runs.items():
        assert summary_problems(summary) == [], name
        identity = {c.name: summary[c.name] for c in IDENTITY}
        assert steps_problems(pq.read_table(run_dir / "steps.parquet"), identity) == [], name
    # the suite's runs fork their ranks from its worker's prefork server (tests/conftest.py)
    assert summaries["ok"]["launch"] == (FORKED_LAUNCH if os.environ.get(PREFORK_ENV) else LOCAL_LAUNCH)
    assert len(summaries["ok"]["dataset_sha256_train"]) == 64

    # collection: one row per run that keeps the contract, and no column always null where it should not be
    shutil.copytree(results / "runs", tmp_path / "runs", ignore=shutil.ignore_patterns("*.log"))
    (tmp_path / "runs" / RUNS["failed"][0].run_id / "steps.parquet").write_bytes(b"not parquet")  # steps_problem: collection's
    out = collect(tmp_path)
    assert [p for p in out["problems"] if "steps.parquet" not in p] == [], out["problems"]
    rows = pq.read_table(tmp_path / "metrics.parquet").to_pylist()
    assert len(rows) == len(RUNS)
    for row in rows:
        assert null_problems(row, RUN_COLUMNS) == [], row["run_id"]
        assert row["run_path"] == row["run_id"]
    never = {name for name in RUN_COLUMNS if all(row[name] is None for row in rows)}
    assert never <= set(FILLED_ELSEWHERE), f"always null in runs of every status and lever: {sorted(never - set(FILLED_ELSEWHERE))}"
    steps = pq.read_table(tmp_path / "steps.parquet")
    for row in steps.to_pylist():
        assert null_problems(row, STEP_COLUMNS) == []
    assert [n for n in STEP_COLUMNS if steps.column(n).null_count == steps.num_rows] == []


def test_the_contract_check_names_what_a_writer_got_wrong(real_runs):
    """What summary_problems and null_problems catch, on real summaries with one thing wrong."""
    _, runs = real_runs
    ok, fp8, skipped = (copy.deepcopy(runs[name][0]) for name in ("ok", "ok fp8", "skipped"))

    def problems(summary, **changes):
        return summary_problems({**summary, **changes})

    assert problems(ok, tokens_per_sec=1.0) == ["tokens_per_sec: no column holds it"]
    ok_counted = copy.deepcopy(ok)
    ok_counted["comm_calls_per_step"]["all_gather_into_tensor"] = 2.0
    assert summary_problems(ok_counted) == ["comm_calls_per_step.all_gather_into_tensor: no column holds it"]
    without_mfu = {k: v for k, v in ok.items() if k != "mfu"}
    assert summary_problems(without_mfu) == ["mfu: the worker's result lacks it", "mfu: null, but the table says filled: status ok"]
    assert problems(skipped, tokens_per_s=1.0) == ["tokens_per_s: holds 1.0, but the table says filled only: status ok"]
    assert problems(ok, final_loss_scale=None) == [
        f"final_loss_scale: null, but the table says filled: {RUN_COLUMNS['final_loss_scale'].filled.text}"]
    assert problems(fp8, final_loss_scale=2.0)[0].startswith("final_loss_scale: holds 2.0, but the table says filled only:")
    assert problems(ok, run_path="x") == ["run_path: written by the launcher, but a collection column"]
    assert problems(skipped, reason=None) == ["reason: null, but the table says filled: status other than ok"]
    # a step table: an fp16 run's steps without their loss scale
    steps = pq.read_table(runs["ok"][1] / "steps.parquet").to_pylist()
    assert null_problems({**steps[0], "loss_scale": None}, STEP_COLUMNS) == [
        f"loss_scale: null, but the table says filled: {STEP_COLUMNS['loss_scale'].filled.text}"]


def test_collection_rows_of_unreadable_runs_hold_identity_status_and_reason_only(real_runs, tmp_path):
    results, runs = real_runs
    shutil.copytree(results / "runs", tmp_path / "runs", ignore=shutil.ignore_patterns("*.log"))
    (tmp_path / "runs" / RUNS["ok"][0].run_id / "summary.json").write_text('{"status": "ok", "tok')
    (tmp_path / "runs" / RUNS["diverged"][0].run_id / "summary.json").unlink()
    collect(tmp_path)
    rows = {r["run_id"]: r for r in pq.read_table(tmp_path / "metrics.parquet").to_pylist()}
    assert rows[RUNS["ok"][0].run_id]["status"] == "corrupt" and rows[RUNS["diverged"][0].run_id]["status"] == "missing"
    for row in rows.values():
        assert null_problems(row, RUN_COLUMNS) == [], row["run_id"]
    assert null_problems({**rows[RUNS["ok"][0].run_id], "tokens_per_s": 1.0}, RUN_COLUMNS) == [
        "tokens_per_s: holds 1.0 in a corrupt row"]
