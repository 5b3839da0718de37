"""Warnings a reader would miss (loss spikes, grad-norm jumps, peaks out of line) and the CPU notice:
scalelab.report.checks on step and run tables made here, on the default sweep's recorded steps, and
on one real run that spikes."""
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scalelab.report import checks
from scalelab.report.tables import mfu_flagged

DATA = Path(__file__).parents[1] / "data"


def _steps(run_ids, n=60, seed=0, noise=0.03) -> pd.DataFrame:
    """Step records shaped like the default sweep's: the loss falls from 5.5 through warm-up to ~2.8 and
    wanders by ±noise; the grad norm starts at ~4.5 and settles to ~0.5 with a log-uniform 0.5–2× wobble."""
    rng = np.random.default_rng(seed)
    rows = []
    for run_id in run_ids:
        t = np.arange(n)
        loss = (2.8 + 2.7 * np.exp(-t / 8)) * (1 + rng.uniform(-noise, noise, n))
        grad = (0.5 + 4 * np.exp(-t / 6)) * np.exp(rng.uniform(np.log(0.5), np.log(2), n))
        rows.append(pd.DataFrame({"run_id": run_id, "step": t, "loss": loss, "grad_norm": grad}))
    return pd.concat(rows, ignore_index=True)


def _spike(steps, run_id, step, loss=None, grad=None):
    at = (steps["run_id"] == run_id) & (steps["step"] == step)
    if loss is not None:
        steps.loc[at, "loss"] = loss
    if grad is not None:
        steps.loc[at, "grad_norm"] = grad


RUNS8 = [f"{p}-z{z}-w{w}" for p in ("fp32", "bf16") for z in (0, 1) for w in (1, 2)]


def test_a_loss_spike_is_named_with_its_run_step_value_and_recent_range():
    steps = _steps(["fp32-z0-w1", "fp32-z1-w1"])
    _spike(steps, "fp32-z0-w1", 24, loss=9.55, grad=84.2)
    recent = steps[(steps["run_id"] == "fp32-z0-w1") & steps["step"].between(14, 23)]["loss"]
    (line,) = checks.spike_warnings(steps)
    assert line.startswith("fp32-z0-w1: loss spike at step 24: loss 9.55 against "
                           f"{recent.min():.3g}–{recent.max():.3g} over the previous 10 steps"), line
    assert "grad norm 84.2 against a median of" in line and line.endswith("back at step 25")
    # the spike as the last record: nothing to come back at
    (line,) = checks.spike_warnings(steps[steps["step"] <= 24])
    assert line.endswith("the last recorded step"), line


def test_a_spike_every_run_shares_is_one_line_naming_the_step_and_the_runs():
    """The issue's case: all 8 runs jump from ~2.84 to 6.8–7.2 at step 15 (grad norm 0.8 -> 600–735)
    and are back at step 16; and one run's own grad-norm jump elsewhere keeps a line of its own."""
    steps = _steps(RUNS8)
    for i, run_id in enumerate(RUNS8):
        _spike(steps, run_id, 15, loss=6.8 + 0.4 * i / 7, grad=600 + 135 * i / 7)
    _spike(steps, "bf16-z1-w2", 40, grad=30.0)
    lines = checks.spike_warnings(steps)
    assert len(lines) == 2, lines
    assert lines[0].startswith("loss spike at step 15 in all 8 runs (" + ", ".join(sorted(RUNS8)) + "): loss 6.8–7.2 against")
    assert "grad norm 600–735 against a median of" in lines[0] and lines[0].endswith("back at step 16 in every run")
    assert lines[1].startswith("bf16-z1-w2: grad-norm jump at step 40: grad norm 30 against a median of")
    # some of the runs only: how many of how many
    part = _steps(RUNS8)
    for run_id in RUNS8[:3]:
        _spike(part, run_id, 30, loss=8.0)
    (line,) = checks.spike_warnings(part)
    assert line.startswith(f"loss spike at step 30 in 3 of 8 runs ({', '.join(sorted(RUNS8[:3]))})"), line


def test_silent_on_warm_up_and_on_normal_noise():
    steps = _steps(RUNS8, noise=0.05)
    assert checks.spike_warnings(steps) == []
    # A jump inside warm-up (here warmup_steps 20, longer than the window) is warm-up, not a spike...
    _spike(steps, "fp32-z0-w1", 15, loss=12.0, grad=500.0)
    runs = pd.DataFrame({"run_id": RUNS8, "warmup_steps": 20})
    assert checks.spike_warnings(steps, runs) == []
    # ...and is one after it (without the runs table the window alone starts the checks).
    assert len(checks.spike_warnings(steps)) == 1


def test_silent_on_the_default_sweeps_recorded_steps():
    """The 24 runs of a default sweep (commit ee3f0b0, 60 steps each, this machine), as recorded: its
    loss stays within 3% of the recent median after warm-up and its grad norm within 0.25–1.6× of it."""
    steps = pd.read_csv(DATA / "default-sweep-steps.csv.gz")
    assert steps["run_id"].nunique() == 24 and len(steps) == 24 * 60
    assert checks.spike_warnings(steps) == []
    assert checks.step_outliers(steps).empty
    # The same records with one step of one run made a spike are caught: the check can fire on them.
    _spike(steps, "bf16-z2-w2", 33, loss=7.0)
    (line,) = checks.spike_warnings(steps)
    assert line.startswith("bf16-z2-w2: loss spike at step 33: loss 7 against"), line


def test_skipped_fp16_steps_non_finite_grad_norms_are_not_jumps():
    steps = _steps(["fp16-z0-w1"])
    steps.loc[steps["step"].isin([20, 21, 22, 35]), "grad_norm"] = np.inf  # the loss scaler's skipped steps
    steps.loc[steps["step"] == 41, "grad_norm"] = np.nan
    assert checks.spike_warnings(steps) == []


def _runs(n=8, peak=8e10, precision="bf16", device=("cpu", "AMD EPYC")) -> pd.DataFrame:
    return pd.DataFrame({
        "run_id": [f"{precision}-z{i % 4}-w{1 + i // 4}" for i in range(n)], "status": "ok", "precision": precision,
        "world_size": [1 + i // 4 for i in range(n)], "zero_stage": [i % 4 for i in range(n)],
        "tokens_per_s": 14_000.0, "peak_flops_per_device": peak, "mfu": 0.11, "threads_per_rank": 1,
        "peak_flops_source": f"measured {precision} matmul, 1 threads", "device_type": device[0], "device_name": device[1]})


def test_a_peak_out_of_line_with_its_precision_is_flagged_with_what_it_does_to_mfu():
    """The issue's case: one bf16 run's peak measured at 4.68e10 against ~8e10 for the others, so its MFU
    (0.203) read as perfect scaling while its throughput per device halved."""
    runs = _runs()
    assert checks.peak_warnings(runs) == [], "equal peaks (one calibration, or a datasheet): nothing"
    runs["peak_flops_per_device"] = [7.8e10, 8.0e10, 8.4e10, 8.1e10, 4.68e10, 7.9e10, 8.2e10, 8.3e10]
    runs.loc[4, ["mfu", "tokens_per_s"]] = [0.203, 14_000.0]
    (line,) = checks.peak_warnings(runs)
    median = runs["peak_flops_per_device"].median()
    assert line.startswith(f"bf16-z0-w2: peak 4.68e+10 FLOP/s (measured bf16 matmul, 1 threads) is "
                           f"{1 - 4.68e10 / median:.0%} below the median {median:.3g} of the 8 ok bf16 runs on AMD EPYC"), line
    assert f"its MFU 0.203 would be {0.203 * 4.68e10 / median:.3f} against the median peak" in line
    # Other precisions, devices and thread counts are not held against it.
    others = pd.concat([runs, _runs(precision="fp32", peak=2e10), _runs(4, peak=4e10, device=("cpu", "Intel Xeon"))])
    assert checks.peak_warnings(others) == [line]
    # More than three off in one group: one line for the group.
    runs["peak_flops_per_device"] = [2.1e10, 4.9e10, 2.9e10, 6.0e10, 2.5e10, 7.2e10, 2.4e10, 3.9e10]
    (line,) = checks.peak_warnings(runs)
    assert line.startswith("peaks out of line: the 8 ok bf16 runs on AMD EPYC used peaks from 2.1e+10 to 7.2e+10"), line


def test_cpu_notice_names_the_device_threads_and_what_the_figures_do_not_show():
    runs = pd.concat([_runs(precision="fp32", peak=9e10).assign(tokens_per_s=40_000.0), _runs()])
    notice = checks.cpu_notice(runs)
    assert notice.startswith("CPU results: all 16 runs trained on a CPU (AMD EPYC, 1 thread per rank, 1–2 ranks per run).")
    assert "bf16 at 0.35× fp32's tokens/s here" in notice and "without tensor cores" in notice
    assert "up to 2" in notice and "gloo" in notice and "NVLink or InfiniBand" in notice
    assert "measured on this machine (e.g. measured fp32 matmul, 1 threads)" in notice
    note = checks.cpu_best_note(runs)
    assert note.startswith("Fastest on this CPU (AMD EPYC, 1 thread per rank, 1–2 ranks per run): bf16 ran without "
                           "tensor cores and its ranks shared the machine's cores over gloo"), note
    # fp32 at world size 1 only: nothing about low precision or links, the MFU part stays
    alone = runs[(runs["precision"] == "fp32") & (runs["world_size"] == 1)]
    assert "tensor cores" not in checks.cpu_notice(alone) and "gloo" not in checks.cpu_notice(alone)
    assert "MFU is against a CPU matmul rate" in checks.cpu_notice(alone)
    # A GPU sweep: no notice, no note.
    gpu = runs.assign(device_type="cuda", device_name="NVIDIA H100 80GB HBM3")
    assert checks.cpu_notice(gpu) is None and checks.cpu_best_note(gpu) is None
    # issue #41: a run that never started trained on nothing; runs across nodes talk across them
    skipped = runs.head(1).assign(status="skipped")
    assert checks.cpu_notice(skipped) is None
    assert checks.cpu_notice(runs.head(1)).startswith("CPU results: the one run trained on a CPU")
    two_nodes = runs[runs["world_size"] == 2].assign(nodes_used=2, nodes_share_machine=True)
    notice = checks.cpu_notice(two_nodes)
    assert "across nodes (network namespaces of one machine" in notice and "host memory" not in notice


def test_sweep_end_text_opens_with_the_cpu_notice_and_only_on_cpu(tmp_path):
    from devtools.fixtures import synthetic_results
    from scalelab.report.tables import sweep_end_text

    synthetic_results(tmp_path, n_runs=24, n_steps=12)
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.html").write_text("built after the tables")
    text = sweep_end_text(tmp_path)
    # the synthetic set's run 7 was skipped: it trained on nothing
    assert text.startswith("scalelab: CPU results: 23 of the 24 runs trained on a CPU (synthetic, "), text
    best = text.index("Best configuration per world size:")
    assert re.search(r"\n  Fastest on this CPU \(synthetic, .*not a recommendation for a GPU\.\n", text[best:]), text
    runs = pd.read_parquet(tmp_path / "metrics.parquet")
    runs.assign(device_type="cuda", device_name="NVIDIA H100 80GB HBM3", backend="nccl").to_parquet(tmp_path / "metrics.parquet")
    (tmp_path / "report" / "report.html").write_text("rebuilt")
    text = sweep_end_text(tmp_path)
    assert text.startswith("scalelab: 24 runs") and "CPU" not in text, text


def test_mfu_above_the_peak_is_one_line_per_precision_and_peak_where_more_than_three_share_it():
    """An AVX2 CPU's sweep: every 16-bit run reads above 100% against the calibration's emulated matmuls."""
    cal = "sweep calibration: measured bf16 matmul, 1 thread(s), idle machine, 2026-11-27T19:32:52+00:00"
    runs = pd.DataFrame({"run_id": [f"bf16-z{z}-w1" for z in range(4)] + ["bf16-z0-w2", "fp16-z0-w1", "fp16-z1-w1", "fp32-z0-w1", "bf16-z1-w2"],
                         "status": ["ok"] * 8 + ["failed"], "precision": ["bf16"] * 5 + ["fp16", "fp16", "fp32", "bf16"],
                         "mfu": [1.69, 1.57, 1.73, 1.76, 1.41, 1.19, 1.15, 0.4, 3.0], "device_type": "cpu",
                         "peak_flops_source": [cal] * 5 + ["sweep calibration: measured fp16 matmul"] * 2 + [cal, cal]})
    lines = checks.mfu_over_peak_warnings(runs[mfu_flagged(runs)])
    assert lines == [
        f"5 bf16 runs have an MFU above 100% of the peak used (1.41 to 1.76: bf16-z0-w1, bf16-z0-w2, bf16-z1-w1, bf16-z2-w1, "
        f"bf16-z3-w1; {cal}): the peak is too low for this path (e.g. bf16 matmuls a CPU emulates, where the calibration's "
        "square matmuls run slower than the model's); compare their tokens/s, not their MFU",
        "fp16-z0-w1: MFU 1.19 is above 100% of the peak used (sweep calibration: measured fp16 matmul); the peak is too "
        "low for this path (e.g. emulated fp16 on a CPU)",
        "fp16-z1-w1: MFU 1.15 is above 100% of the peak used (sweep calibration: measured fp16 matmul); the peak is too "
        "low for this path (e.g. emulated fp16 on a CPU)"], lines  # fp32 at 0.4 and a failed run: nothing
    # three runs sharing one are still named one by one; four GPU runs on a datasheet peak are not told about emulation
    assert len(checks.mfu_over_peak_warnings(runs[mfu_flagged(runs)].drop(index=[3, 4]))) == 3 + 2
    gpu = runs.head(4).assign(device_type="cuda", peak_flops_source="NVIDIA H100 datasheet", mfu=1.2)
    (line,) = checks.mfu_over_peak_warnings(gpu[mfu_flagged(gpu)])
    assert line.startswith("4 bf16 runs have an MFU above 100% of the peak used (1.20 to 1.20") and "emulates" not in line
    assert "(e.g. a datasheet figure of another variant of the device, or train.peak_tflops set low)" in line


def test_runs_whose_cores_the_hypervisor_took_are_named_in_one_line_the_worst_first():
    runs = pd.DataFrame({"run_id": [f"fp32-z0-w{i}" for i in range(1, 9)],
                         "status": ["ok"] * 7 + ["failed"],
                         "host_steal_share": [0.02, 0.13, 0.024, 0.05, 0.06, 0.07, 0.08, 0.5]})
    (line,) = checks.steal_warnings(runs)
    assert line.startswith("6 run(s) lost more than 2% of their cores' time to the hypervisor")
    assert "fp32-z0-w2 13.0%, fp32-z0-w7 8.0%, fp32-z0-w6 7.0%, fp32-z0-w5 6.0%, fp32-z0-w4 5.0% and 1 more." in line
    assert "fp32-z0-w8" not in line and "fp32-z0-w1 " not in line  # a failed run times nothing; 2% is not above the line
    assert "fp32-z0-w3 2.4%" in checks.steal_warnings(runs[runs["run_id"] != "fp32-z0-w2"])[0]  # not rounded to "2%"
    assert checks.steal_warnings(runs.assign(host_steal_share=[0.0] * 7 + [None])) == []  # bare metal: silent
    assert checks.steal_warnings(runs.drop(columns="host_steal_share")) == []  # tables before schema 10


def test_runs_whose_host_changed_speed_while_they_ran_are_named_in_one_line_the_largest_change_first():
    """step_time_drift beyond 10% either way: the halves of a run's timed steps ran at two speeds (the H200 machine's
    idle CPU slice: 9.3 -> 12.4 ms, +33%; 11.9 -> 8.5 ms, -29%)."""
    runs = pd.DataFrame({"run_id": [f"fp32-z0-w{i}" for i in range(1, 10)],
                         "status": ["ok"] * 8 + ["failed"],
                         "step_time_drift": [0.1, 0.33, -0.29, 0.02, -0.105, 0.5, -0.8, None, 0.9]})
    (line,) = checks.drift_warnings(runs)
    assert line.startswith("5 run(s) changed speed by more than 10% between the first and the second half of their timed "
                           "steps (median step time, second half against first): fp32-z0-w7 -80.0%, fp32-z0-w6 +50.0%, "
                           "fp32-z0-w2 +33.0%, fp32-z0-w3 -29.0%, fp32-z0-w5 -10.5%. Their speed was not steady"), line
    assert "fp32-z0-w1 " not in line and "fp32-z0-w9" not in line  # 10% is not beyond the line; a failed run: nothing
    assert "(column step_time_drift; repeat those points: repeats.points)" in line
    assert checks.drift_warnings(runs.assign(step_time_drift=[0.01, -0.03] + [None] * 7)) == []  # a steady host: silent
    assert checks.drift_warnings(runs.drop(columns="step_time_drift")) == []  # tables before schema 11


def test_step_time_drift_compares_the_halves_medians():
    from scalelab.registries.hardware import DRIFT_MIN_STEPS
    from scalelab.run.worker_result import step_time_drift

    assert step_time_drift([0.008] * 10 + [0.012] * 10) == pytest.approx(0.5)
    assert step_time_drift([0.012] * 11 + [0.008] * 11) == pytest.approx(-1 / 3)
    assert step_time_drift([0.01, 0.5] * 10) == pytest.approx(0.0)  # a stall now and then moves no median
    assert step_time_drift([0.01] * (DRIFT_MIN_STEPS - 1)) is None


def test_fp8_runs_are_told_whether_fp8_pays_at_their_width_and_that_eager_costs():
    runs = pd.DataFrame({"run_id": ["fp8-z0-w1", "fp8-z0-w1-compile", "bf16-z0-w1", "fp8-z0-w2"],
                         "precision": ["fp8", "fp8", "bf16", "fp8"], "status": ["ok", "ok", "ok", "failed"],
                         "d_model": [2048, 2048, 2048, 2048], "compile": [False, True, False, False],
                         "device_type": ["cuda"] * 4})
    warnings = checks.fp8_warnings(runs)
    assert len(warnings) == 2, warnings  # one per width and compile setting; failed and bf16 runs say nothing
    eager, compiled = sorted(warnings, key=lambda w: "-compile" in w)
    assert eager.startswith("fp8 (fp8-z0-w1)") and "without compile" in eager
    assert "fp8-z0-w1-compile" in compiled and "pays at d_model 2048" in compiled and "CPU" not in compiled
    assert checks.fp8_warnings(runs.assign(precision="bf16")) == []


def _tps(*rows) -> pd.DataFrame:
    """Runs (run_id, tokens/s): the point's axes read from the run id, repeats from its -rN."""
    out = []
    for run_id, tps in rows:
        parts = run_id.split("-")
        out.append({"run_id": run_id, "precision": parts[0], "zero_stage": int(parts[1][1:]), "world_size": int(parts[2][1:]),
                    "repeat": int(parts[3][1:]) if len(parts) > 3 else 1, "tokens_per_s": float(tps), "status": "ok"})
    return pd.DataFrame(out)


def test_a_run_far_outside_its_twins_spread_is_named_and_quiet_twins_are_not():
    """A baseline repeat 10x slower than its four twins went unflagged."""
    runs = _tps(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1020), ("fp32-z0-w1-r3", 100), ("fp32-z0-w1-r4", 990),
                ("fp32-z0-w1-r5", 1010), ("fp32-z0-w2", 1800), ("fp32-z0-w2-r2", 180), ("bf16-z0-w1", 700))
    warnings = checks.outlier_warnings(runs)
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("fp32-z0-w1-r3: an outlier, 10.1x slower than the median of its 4 twins (the same "
                                  "configuration: 100 against 1,005 tokens/s; they differ among themselves by 3%)")
    # a pair cannot say which run was disturbed: said once, naming both
    assert warnings[1].startswith("fp32-z0-w2-r2 and its twin fp32-z0-w2 (the same configuration) differ 10.0x in tokens/s")
    # twins within their usual spread, and different configurations, are no outliers
    quiet = _tps(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1300), ("fp32-z0-w1-r3", 1100), ("bf16-z0-w1", 300))
    assert checks.outlier_warnings(quiet) == []


def test_a_superlinear_efficiency_beyond_noise_says_its_baseline_was_likely_slowed():
    """World-size-1 slowdowns read as scaling efficiencies of 2.8-3.2 with no warning."""
    runs = _tps(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1020), ("fp32-z0-w1-r3", 990), ("fp32-z0-w2", 1900),
                ("fp32-z0-w2-r2", 1880), ("fp32-z0-w2-r3", 1910), ("bf16-z1-w1", 400), ("bf16-z1-w2", 2400),
                ("fp16-z0-w1", 1000), ("fp16-z0-w2", 2040))
    warnings = checks.superlinear_warnings(runs)
    assert len(warnings) == 1, warnings
    # bf16 z1: 2,400 / (2 x 400) = 3.0; fp16's 1.02 is within the noise of three-run points
    assert warnings[0].startswith("1 point(s) scaled superlinearly, scaling efficiency above 1 by more than run-to-run "
                                  "noise alone reaches: bf16-z1-w2 3.00 (baseline bf16-z1-w1)")
    assert "baseline was likely slowed (a busy machine" in warnings[0]
    # a disturbed baseline repeat does not widen the noise past every test: still flagged
    disturbed = pd.concat([runs, _tps(("fp32-z0-w1-r4", 100))], ignore_index=True)
    assert len(checks.superlinear_warnings(disturbed)) == 1
    assert checks.superlinear_warnings(runs[runs["run_id"] != "bf16-z1-w2"]) == []


def test_a_calibration_on_a_busy_machine_is_said_in_the_warnings():
    busy = ("sweep calibration: measured fp32 matmul, 1 thread(s), busy machine (load 5.6 on 2 cores, above the core "
            "count: the peak reads low), 2026-12-06T10:00:00+00:00")
    runs = pd.DataFrame({"run_id": ["fp32-z0-w1", "fp32-z0-w2"], "peak_flops_source": [busy, busy]})
    (line,) = checks.busy_calibration_warnings(runs)
    assert line.startswith(f"2 run(s) divide their MFU by a CPU peak measured on a busy machine ({busy})")
    idle = runs.assign(peak_flops_source=busy.replace("busy machine (load 5.6", "idle machine (load 0.4"))
    assert checks.busy_calibration_warnings(idle) == []
