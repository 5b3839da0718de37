"""Repeats and their spread (issue #31, point 2): the sweep's repeats, the noise they measure, and the
comparisons that read it (best configuration, throughput figure's table, compare, warnings)."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from scalelab.config import ConfigError
from scalelab.harness.testing import tiny_config
from scalelab.planning.sweep import RunPoint, sweep_plan
from scalelab.report.checks import noise_warnings
from scalelab.report.compare import compare_runs, noise_limit, summary_lines
from scalelab.report.tables import best_configurations, best_configurations_text, throughput_table
from scalelab.results.noise import config_ids, medians, relative_change, repeat_spreads, sweep_noise, t_quantile
from scalelab.run.calibration import describe_rank_cores, peak_for, rank_cores


def _runs(*rows) -> pd.DataFrame:
    """Rows (run_id, tokens/s[, status]); the point's axes read from the run id."""
    out = []
    for run_id, tps, *status in rows:
        parts = run_id.split("-")
        repeat = int(parts[-1][1:]) if parts[-1].startswith("r") else 1
        out.append({"run_id": run_id, "precision": parts[0], "zero_stage": int(parts[1][1:]), "world_size": int(parts[2][1:]),
                    "repeat": repeat, "tokens_per_s": tps, "status": status[0] if status else "ok", "mfu": tps / 1e4,
                    "model_state_bytes_measured": 1e6, "peak_rss_bytes": 3e8, "step_time_s_median": 512 / tps, "final_loss": 3.0})
    return pd.DataFrame(out)


# ----------------------------------------------------------------------------- the sweep's repeats

def test_repeats_run_the_baseline_more_often_with_run_ids_of_their_own():
    cfg = tiny_config(sweep={"precision": ["fp32", "bf16"], "zero_stage": [0, 3], "world_size": [1, 2]}, repeats={"baseline": 3})
    points, _ = sweep_plan(cfg)
    ids = [p.run_id for p in points]
    assert len(ids) == len(set(ids)) == 8 + 2 * 2
    # the baseline is the first precision and stage listed, at every world size; its repeats follow it
    assert ids[:3] == ["fp32-z0-w1", "fp32-z0-w1-r2", "fp32-z0-w1-r3"]
    assert {p.run_id for p in points if p.repeat > 1} == {"fp32-z0-w1-r2", "fp32-z0-w1-r3", "fp32-z0-w2-r2", "fp32-z0-w2-r3"}
    # a repeat differs from its first run in the repeat only, and reads back from point.json
    r2 = next(p for p in points if p.run_id == "fp32-z0-w2-r2")
    assert r2.values() == {**RunPoint("fp32", 0, 2).values(), "repeat": 2}
    assert RunPoint.from_json(json.loads(json.dumps(r2.to_json()))) == r2
    assert RunPoint.from_json({"precision": "fp32", "zero_stage": 0, "world_size": 2}).repeat == 1  # a point.json of before
    every = sweep_plan(tiny_config(sweep={"precision": ["fp32", "bf16"], "world_size": [1]}, repeats={"points": 2, "baseline": 1}))[0]
    assert [p.run_id for p in every] == ["fp32-z0-w1", "fp32-z0-w1-r2", "bf16-z0-w1", "bf16-z0-w1-r2"]


def test_a_model_named_like_a_repeat_is_refused():
    cfg = tiny_config(models={"r2": {"n_layers": 1, "d_model": 32, "n_heads": 2}}, sweep={"model": ["r2"]})
    with pytest.raises(ConfigError, match="models.r2: a model name must not read as a run-id part of repeat"):
        sweep_plan(cfg)


# ----------------------------------------------------------------------------- the noise

def _sigma(*groups) -> float:
    """Pooled standard deviation of log tokens/s, each group around its own mean (what Noise.sigma is)."""
    ss = sum(float(((np.log(g) - np.log(g).mean()) ** 2).sum()) for g in map(np.asarray, groups))
    return math.sqrt(ss / sum(len(g) - 1 for g in groups))


def test_spread_sigma_and_medians_of_repeats():
    runs = _runs(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1100), ("fp32-z0-w1-r3", 1050), ("bf16-z0-w1", 900),
                 ("fp32-z0-w2", 1500), ("fp32-z0-w2-r2", 1800, "failed"))
    assert list(config_ids(runs)) == ["fp32-z0-w1"] * 3 + ["bf16-z0-w1", "fp32-z0-w2", "fp32-z0-w2"]
    spreads = repeat_spreads(runs)
    assert spreads.loc["fp32-z0-w1", "spread"] == pytest.approx(100 / 1050)
    assert spreads.loc["fp32-z0-w2", "n"] == 1 and pd.isna(spreads.loc["fp32-z0-w2", "spread"])  # a failed repeat is no sample
    noise = sweep_noise(runs)
    assert (noise.spread, noise.worst, noise.points, noise.runs, noise.dof) == (pytest.approx(100 / 1050), "fp32-z0-w1", 1, 3, 2)
    assert noise.sigma == pytest.approx(_sigma([1000, 1100, 1050]))
    # two single runs: within noise up to exp(t(99%, 2 dof) * sigma * sqrt(2)) - 1; a median of 3 runs is surer
    single = math.expm1(t_quantile(2) * noise.sigma * math.sqrt(2))
    assert t_quantile(2) == 9.925 and noise.margin(1, 1) == pytest.approx(single)
    assert noise.within(1000, 1000 * (1 + single) * 0.999) and not noise.within(1000, 1000 * (1 + single) * 1.001)
    assert noise.margin(3, 1) < noise.margin(2, 1) < noise.margin(1, 1) < noise.margin(1, 1, 1)
    m = medians(runs).set_index("run_id")
    assert m.loc["fp32-z0-w1", ["tokens_per_s", "repeats", "tokens_per_s_min", "tokens_per_s_max"]].tolist() == [1050, 3, 1000, 1100]
    assert m.loc["fp32-z0-w1", "step_time_s_median"] == pytest.approx(512 / 1050, rel=0.05)
    assert len(m) == 3
    assert sweep_noise(_runs(("fp32-z0-w1", 1000))).spread is None
    assert sweep_noise(_runs(("fp32-z0-w1", 1000))).margin(1, 1) is None
    assert "no point ran twice" in sweep_noise(_runs(("fp32-z0-w1", 1000))).text()
    assert "sigma 4.8% per run, 2 degree(s) of freedom" in noise.text()


def test_t_quantiles_are_conservative_between_table_rows():
    assert [t_quantile(d) for d in (1, 4, 11, 200)] == [63.657, 4.604, 3.169, 2.576]
    assert all(t_quantile(d) >= t_quantile(d + 1) for d in range(1, 130))
    with pytest.raises(ValueError):
        t_quantile(0)


def test_identical_points_are_called_different_about_one_time_in_a_hundred():
    """The rule's false-alarm rate, by simulation: sweeps whose every run has the same true speed and a
    lognormal noise of 8%, the default repeats (two points of three runs), then two single-run points
    compared. The range rule this replaced (a difference beyond the largest spread of repeats is
    real) called about a quarter of such pairs different."""
    rng = np.random.default_rng(0)
    trials, false_alarms, range_rule = 600, 0, 0
    for _ in range(trials):
        tps = 1000 * np.exp(rng.normal(0, 0.08, size=8))
        runs = _runs(*zip(["fp32-z0-w1", "fp32-z0-w1-r2", "fp32-z0-w1-r3", "fp32-z0-w2", "fp32-z0-w2-r2", "fp32-z0-w2-r3",
                           "bf16-z0-w1", "fp16-z0-w1"], tps))
        noise = sweep_noise(runs)
        false_alarms += not noise.within(tps[6], tps[7])
        range_rule += relative_change(tps[6], tps[7]) > noise.spread
    assert false_alarms / trials <= 0.025, false_alarms
    assert range_rule / trials > 0.15, range_rule


def test_best_configuration_names_points_within_noise_and_a_real_lead():
    runs = _runs(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1100), ("fp32-z0-w1-r3", 1050), ("bf16-z0-w1", 1080),
                 ("fp16-z0-w1", 500), ("fp32-z0-w2", 1500), ("fp32-z0-w2-r2", 1550), ("bf16-z0-w2", 900))
    best = best_configurations(runs).set_index("world_size")
    noise = best.attrs["noise"]
    assert noise.dof == 3 and noise.sigma == pytest.approx(_sigma([1000, 1100, 1050], [1500, 1550]))
    # world size 1: bf16 (one run, 1080) is ahead of fp32's median of 3 (1050) by 2.9%: within noise; fp16 is not
    assert best.loc[1, "run_id"] == "bf16-z0-w1" and best.loc[1, "within_noise"] == "fp32-z0-w1"
    assert best.loc[2, "run_id"] == "fp32-z0-w2" and best.loc[2, "within_noise"] == "" and best.loc[2, "repeats"] == 2
    assert best.loc[2, "tokens_per_s"] == 1525 and best.loc[2, "lead"] == pytest.approx(1525 / 900 - 1)
    assert best.loc[2, "noise_margin"] == pytest.approx(noise.margin(2, 1)) and 0.2 < noise.margin(2, 1) < 1525 / 900 - 1
    text = best_configurations_text(runs)
    assert "world size 1: tied within run-to-run noise: bf16-z0-w1, fp32-z0-w1; first by median: bf16-z0-w1" in text
    assert "no single fastest point: bf16-z0-w1 leads fp32-z0-w1 by less than run-to-run noise" in text
    assert f"ahead of bf16-z0-w2 by 69%, beyond the {noise.margin(2, 1):.0%} noise alone reaches (99%)" in text
    assert text.splitlines()[-1].startswith("run-to-run spread of tokens/s: up to 9.5% between identical runs (fp32-z0-w1")
    # single runs: the lead is stated, and that the spread is unknown
    single = best_configurations_text(_runs(("fp32-z0-w1", 1000), ("bf16-z0-w1", 1200)))
    assert "ahead of fp32-z0-w1 by 20% (single runs: spread unknown)" in single


def _one_model(runs: pd.DataFrame) -> pd.DataFrame:
    """_runs' rows with the columns the families table reads."""
    return runs.assign(model="base", model_family="gpt2", n_params=1e5, flops_per_token=6e5, model_state_bytes_predicted=1e6,
                       activation_bytes_measured=np.nan, activation_bytes_predicted=np.nan)


def test_every_surface_names_one_best_point_by_the_median_rule_and_ties_within_noise():
    """The families table picked the fastest single run (a baseline's lucky repeat), while "Best
    configuration" ranked points by the median of their repeats; and a single run ahead of a
    five-run median by less than noise was named the winner. Now one rule, and a tie is a tie."""
    from scalelab.report.report import _best_table, family_table
    from scalelab.report.tables import answer

    runs = _one_model(_runs(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1060), ("fp32-z0-w1-r3", 980), ("fp32-z0-w1-r4", 1010),
                            ("fp32-z0-w1-r5", 990), ("bf16-z0-w1", 1040), ("fp32-z0-w2", 1900), ("fp32-z0-w2-r2", 1880),
                            ("bf16-z0-w2", 1000)))
    best = best_configurations(runs).set_index("world_size", drop=False)
    tie, lead = best.loc[1], best.loc[2]
    assert answer(tie) == "tied within run-to-run noise: bf16-z0-w1, fp32-z0-w1" and answer(lead) == "fp32-z0-w2"
    steps = pd.DataFrame({"run_id": pd.Series([], dtype=str), "step": pd.Series([], dtype=int), "loss": pd.Series([], dtype=float)})
    # the families table: points by their median, never the fastest single run (fp32-z0-w1-r2, 1,060)
    assert family_table(runs, steps)["fastest_per_world_size"].tolist() == [
        "w1: tied within run-to-run noise: bf16-z0-w1, fp32-z0-w1 (1,040 tokens/s, 1 run), "
        "w2: fp32-z0-w2 (1,890 tokens/s, median of 2 runs)"]
    # the report's table and the console say the same
    shown = _best_table(best_configurations(runs))
    assert shown.iloc[:, 1].tolist() == [answer(tie), "fp32-z0-w2"]
    assert shown.iloc[0, 5] == ("no single fastest point: bf16-z0-w1 leads fp32-z0-w1 by less than run-to-run noise alone "
                                "can move them (a tie)")
    text = best_configurations_text(runs).splitlines()
    assert text[0].startswith("world size 1: tied within run-to-run noise: bf16-z0-w1, fp32-z0-w1; first by median")
    assert text[1].startswith("world size 2: fp32-z0-w2  1,890 tokens/s (median of 2 runs")


def test_throughput_table_draws_the_median_with_the_range_of_repeats():
    runs = _runs(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1200), ("fp32-z0-w1-r3", 1100), ("fp32-z0-w2", 1650))
    t = throughput_table(runs).set_index("world_size")
    assert t.loc[1, ["tokens_per_s", "tokens_per_s_lo", "tokens_per_s_hi", "runs"]].tolist() == [1100, 1000, 1200, 3]
    # efficiency divides by world size 1's median, not by one of its runs
    assert t.loc[2, "scaling_efficiency"] == pytest.approx(1650 / (2 * 1100))
    assert t.loc[2, "scaling_efficiency_lo"] == t.loc[2, "scaling_efficiency_hi"] == t.loc[2, "scaling_efficiency"]


def test_compare_marks_which_changes_exceed_the_noise_of_either_sweep():
    a = _runs(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1050), ("fp32-z0-w1-r3", 1020), ("bf16-z0-w1", 800))
    b = _runs(("fp32-z0-w1", 1020), ("fp32-z0-w1-r2", 1030), ("fp32-z0-w1-r3", 1010), ("bf16-z0-w1", 1300))
    steps = pd.DataFrame({"run_id": pd.Series([], dtype=str), "step": pd.Series([], dtype=int), "loss": pd.Series([], dtype=float)})
    # one run in A against one in B: both sweeps' variances added, t at their 4 degrees of freedom together
    limit = math.expm1(t_quantile(4) * math.hypot(_sigma([1000, 1050, 1020]), _sigma([1020, 1030, 1010])))
    assert noise_limit(a, b) == pytest.approx(limit) and 0.05 < limit < 0.3
    table = compare_runs(a, b, steps, steps).set_index("run_id")
    assert table["throughput_change"].to_dict() == {"bf16-z0-w1": "beyond noise", "fp32-z0-w1": "within noise",
                                                     "fp32-z0-w1-r2": "within noise", "fp32-z0-w1-r3": "within noise"}
    lines = summary_lines(table.reset_index(), pd.DataFrame(columns=["side"]), pd.DataFrame({"column": [], "same": []}),
                          noise_limit(a, b))
    assert any(line.startswith(f"throughput changes beyond the run-to-run noise ({limit:.1%}") and "1 of 4 runs (bf16-z0-w1)" in line
               for line in lines), lines
    assert not any("hypervisor" in line for line in lines)  # no steal recorded (tables before schema 10)
    # the hypervisor took 6% of bf16-z0-w1's cores in A: its change is named as possibly the host's
    stolen = compare_runs(a.assign(host_steal_share=[0.0, 0.0, 0.0, 0.06]), b.assign(host_steal_share=0.01), steps, steps)
    assert stolen.set_index("run_id")["host_steal_share_max"].to_dict() == {"bf16-z0-w1": 0.06, "fp32-z0-w1": 0.01,
                                                                          "fp32-z0-w1-r2": 0.01, "fp32-z0-w1-r3": 0.01}
    assert ("of those, 1 lost more than 2% of their cores' time to the hypervisor on a side (bf16-z0-w1 6.0%): their change "
            "may be the host's, not the sweep's (column host_steal_share_max)") in summary_lines(
                stolen, pd.DataFrame(columns=["side"]), pd.DataFrame({"column": [], "same": []}))
    older = compare_runs(a, b.assign(host_steal_share=[0.0, 0.0, 0.0, 0.06]), steps, steps)  # A before schema 10
    assert older.set_index("run_id")["host_steal_share_max"].to_dict()["bf16-z0-w1"] == 0.06
    single = compare_runs(_runs(("fp32-z0-w1", 1000)), _runs(("fp32-z0-w1", 1300)), steps, steps)
    assert single["throughput_change"].tolist() == ["unknown (no repeats)"]
    # a sweep without repeats borrows the other's noise
    assert noise_limit(_runs(("fp32-z0-w1", 1000)), b) == pytest.approx(math.expm1(t_quantile(2) * _sigma([1020, 1030, 1010]) * math.sqrt(2)))


def test_noise_warnings_name_noisy_points_and_unrankable_bests():
    runs = _runs(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1300), ("fp32-z0-w1-r3", 1050), ("bf16-z0-w1", 1080))
    warnings = noise_warnings(runs, best_configurations(runs))
    assert warnings[0].startswith("fp32-z0-w1: its 3 identical runs differ by 29% in tokens/s (1,000 to 1,300)")
    assert warnings[0].endswith("(was the machine busy?)")  # no steal measured (tables before schema 10)
    stolen = noise_warnings(runs.assign(host_steal_share=[0.01, 0.07, 0.0, 0.3]), best_configurations(runs))[0]
    assert stolen.endswith("(the hypervisor took up to 7.0% of their cores' time: other guests of the physical host were "
                           "busy)")  # the point's own runs
    moved = noise_warnings(runs.assign(step_time_drift=[0.33, -0.12, 0.05, 0.5]), best_configurations(runs))[0]
    assert moved.endswith("(2 of them changed speed while timed: step_time_drift)")  # step_time_drift beyond 10%
    assert warnings[1] == ("world size 1: no single fastest point: bf16-z0-w1 and fp32-z0-w1 are within run-to-run noise "
                           "of each other (tied): the sweep cannot rank them (more repeats narrow the noise: repeats.points)")
    quiet = _runs(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1030), ("fp32-z0-w1-r3", 1010),
                  ("fp32-z0-w2", 1900), ("fp32-z0-w2-r2", 1950), ("fp32-z0-w2-r3", 1920), ("bf16-z0-w1", 1300))
    assert noise_warnings(quiet, best_configurations(quiet)) == []


# ----------------------------------------------------------------------------- isolation: cores and the calibration

def test_each_cpu_rank_gets_cores_of_its_own_or_the_row_says_they_share():
    assert rank_cores([0, 1, 2, 3], 1, 2, 2) == [2, 3]
    assert describe_rank_cores([0, 1], 2, 1) == "r0:0 r1:1"
    assert describe_rank_cores([4, 5, 6, 7], 2, 1, launcher_slot=1) == "r0:6 r1:7"  # two launchers packed on one host
    assert describe_rank_cores([2, 3], 2, 1, launcher_slot=1) == "r0:2 r1:3"  # a SLURM task sees its own cores only
    assert describe_rank_cores([0, 1], 4, 1).startswith("shared: 4 rank(s) x 1 thread(s) on 2 core(s)")
    assert rank_cores([0, 1], 3, 4, 1) is None


def test_the_hypervisors_share_of_a_ranks_cores_is_read_from_proc_stat(tmp_path):
    """core_ticks sums /proc/stat's steal and the ticks the named cores wanted (all but idle and iowait; guest time is
    inside user), steal_share divides the steal between two readings by the wanted ticks, from one second of them."""
    from scalelab.run.calibration import STEAL_MIN_TICKS, core_ticks, steal_share

    stat = tmp_path / "stat"
    stat.write_text("cpu  300 0 30 600 6 0 4 60 5 0\n"
                    "cpu0 100 0 10 200 2 0 1 20 5 0\n"
                    "cpu1 200 3 20 400 4 0 3 40 0 0\n"
                    "intr 12345 0 0\nctxt 999\n")
    assert core_ticks([1], stat) == (40, 266)  # 200 + 3 + 20 + 0 + 3 + 40: idle and iowait left out
    assert core_ticks([0, 1], stat) == core_ticks(None, stat) == (60, 397)  # None: every core, not the summary line
    assert core_ticks([1, 7], stat) is None  # a core the table does not list (a renumbered container's): not another's
    assert core_ticks([0], tmp_path / "absent") is None  # no /proc (not Linux)
    (tmp_path / "old").write_text("cpu0 100 0 10 200 2 0 1\n")  # a kernel without the steal field
    assert core_ticks([0], tmp_path / "old") is None
    assert steal_share((40, 266), (90, 1266)) == 0.05
    assert steal_share(None, (90, 1266)) is None
    assert steal_share((40, 266), (41, 266 + STEAL_MIN_TICKS - 1)) is None  # under a second of one core: one tick reads 1%+
    assert steal_share((40, 266), (41, 266 + STEAL_MIN_TICKS)) == 1 / STEAL_MIN_TICKS


def test_the_busy_share_of_the_cores_a_measurement_will_use_is_read_from_proc_stat(tmp_path, monkeypatch):
    """busy_share watches the named cores' /proc/stat lines over a short sleep: processes' ticks (user, nice, system,
    irq, softirq) over all of them; planned_cores names the cores CPU ranks will pin to (all allowed if they share)."""
    from scalelab.run import calibration

    stat = tmp_path / "stat"
    stat.write_text("cpu0 100 0 10 200 2 0 1 20\ncpu1 200 3 20 400 4 0 3 40\ncpu2 0 0 0 0 0 0 0 0\n")
    later = "cpu0 120 0 20 260 2 0 1 20\ncpu1 230 3 20 470 4 0 3 40\ncpu2 0 0 0 0 0 0 0 0\n"
    monkeypatch.setattr(calibration.time, "sleep", lambda s: stat.write_text(later))
    assert calibration.busy_share([0], stat=stat) == pytest.approx(30 / 90)  # 20 user + 10 system of 90 ticks
    stat.write_text("cpu0 100 0 10 200 2 0 1 20\ncpu1 200 3 20 400 4 0 3 40\ncpu2 0 0 0 0 0 0 0 0\n")
    assert calibration.busy_share([0, 1], stat=stat) == pytest.approx(60 / 190)
    assert calibration.busy_share([2], stat=stat) is None  # no tick counted: nothing to say
    assert calibration.busy_share([0, 9], stat=stat) is None  # a core the table does not list
    assert calibration.busy_share([0], stat=tmp_path / "absent") is None  # not Linux
    monkeypatch.setattr(calibration.os, "sched_getaffinity", lambda pid: {4, 5, 6, 7}, raising=False)
    assert calibration.planned_cores(2, 1) == [4, 5]  # as the ranks pin themselves:
    assert calibration.describe_rank_cores([4, 5, 6, 7], 2, 1) == "r0:4 r1:5"
    assert calibration.planned_cores(2, 2) == [4, 5, 6, 7]
    assert calibration.planned_cores(3, 2) == [4, 5, 6, 7]  # they would share: every core they may use


def test_repeatability_states_the_hypervisors_share_of_the_sweeps_and_the_floors_cores():
    from devtools.repeatability import floor_text, steal_text

    runs = pd.DataFrame({"run_id": ["a", "b", "c"], "host_steal_share": [0.01, None, 0.05]})
    assert steal_text(runs) == "median 3.0%, largest 5.0% (c)"
    assert steal_text(runs.drop(columns="host_steal_share")) == "unknown"  # tables before schema 10
    floor = {"windows": 30, "window_s": 2.0, "sigma": 0.076, "slowest_over_fastest": 0.79}
    assert floor_text({**floor, "steal_share": 0.031}).endswith("; the hypervisor took 3.1% of the core's time")
    assert "hypervisor" not in floor_text({**floor, "steal_share": None})

    from devtools.repeatability import drifted

    runs = pd.DataFrame({"status": ["ok", "ok", "ok", "failed"], "step_time_drift": [0.33, -0.12, 0.05, 0.9]})
    assert drifted(runs) == 2 and drifted(runs.drop(columns="step_time_drift")) is None  # tables before schema 11
    assert drifted(runs.assign(step_time_drift=None)) is None  # no run timed enough steps to say: unknown, not 0


def test_repeatability_names_the_cpu_and_the_cores_its_sweeps_could_use(monkeypatch):
    """--json's machine: the machine's CPU count and the cores the sweeps ran on (a taskset slice: fewer)."""
    from devtools import repeatability

    monkeypatch.setattr(repeatability.os, "sched_getaffinity", lambda pid: {1, 2}, raising=False)
    monkeypatch.setattr(repeatability.os, "cpu_count", lambda: 16)
    figures = repeatability.machine()
    assert figures["cpus"] == 16 and figures["cores_used"] == 2 and figures["cpu"] and figures["python"].count(".") == 2


def test_a_run_uses_the_sweep_calibration_only_where_it_applies():
    import socket

    record = {"hostname": socket.gethostname(), "threads": 1, "measured_utc": "2026-11-24T07:00:00+00:00",
              "peaks_flops": {"fp32": 8e10, "bf16": 2e11, "fp16": 5e10}}
    assert peak_for(record, "fp8", 1) == (2e11, "sweep calibration: measured bf16 matmul, 1 thread(s), machine load not "
                                                "recorded, 2026-11-24T07:00:00+00:00")  # fp8 computes in bf16 on a CPU
    # the load the calibration met: busy above the host's core count (it said "idle machine" at a load of 5-6)
    assert peak_for({**record, "load_1min": 5.6, "host_cores": 2}, "fp32", 1)[1] == (
        "sweep calibration: measured fp32 matmul, 1 thread(s), busy machine (load 5.6 on 2 cores, above the core count: "
        "the peak reads low), 2026-11-24T07:00:00+00:00")
    assert "idle machine (load 1.9 on 2 cores)" in peak_for({**record, "load_1min": 1.9, "host_cores": 2}, "fp32", 1)[1]
    assert peak_for(record, "fp32", 2) is None  # another thread count: the run measures its own
    assert peak_for({**record, "hostname": "elsewhere"}, "fp32", 1) is None  # measured on another node
    assert peak_for(None, "fp32", 1) is None


def test_repeatability_verdicts_between_two_sweeps():
    """The benchmark's judgement (PYTHONPATH=tests python -m devtools.bench repeatability) on two hand-made sweeps."""
    from devtools.repeatability import run_ratios, verdicts

    a = _runs(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1040), ("fp32-z0-w1-r3", 1020), ("bf16-z0-w1", 1010),
              ("fp32-z0-w2", 1600), ("fp32-z0-w2-r2", 1620), ("fp32-z0-w2-r3", 1580), ("bf16-z0-w2", 800))
    b = _runs(("fp32-z0-w1", 1030), ("fp32-z0-w1-r2", 1000), ("fp32-z0-w1-r3", 1015), ("bf16-z0-w1", 1000),
              ("fp32-z0-w2", 1590), ("fp32-z0-w2-r2", 1610), ("fp32-z0-w2-r3", 1600), ("bf16-z0-w2", 1700))
    assert run_ratios(a, b)["bf16-z0-w2"] == pytest.approx(1700 / 800)
    table = verdicts(a, b).set_index("comparison")["verdict"].to_dict()
    # noise: sigma about 1.5% per run in each, 4 degrees of freedom. bf16/fp32 at w1: A 0.99, B 0.985: the same answer
    assert table["bf16/fp32 z0 w1"] == "agree"
    assert table["efficiency fp32-z0-w2"] == "agree"  # 1600/2040 against 1600/2030
    # at w2 bf16 went from half fp32's speed to ahead of it: no noise explains that
    assert table["bf16/fp32 z0 w2"] == "DISAGREE" and table["efficiency bf16-z0-w2"] == "DISAGREE"
    assert table["best at w2"] == "DISAGREE"
    # world size 1: bf16 and fp32 are within noise of each other in both sweeps: no ranking was claimed
    assert table["best at w1"] in ("agree", "within noise in both")


def test_the_mfu_heatmap_shows_a_repeated_points_spread():
    from scalelab.report.tables import mfu_grid

    g = mfu_grid(_runs(("fp32-z0-w1", 1000), ("fp32-z0-w1-r2", 1100), ("fp32-z0-w1-r3", 1050), ("bf16-z0-w1", 900)))
    rows = dict(zip(g["rows"], range(len(g["rows"]))))
    assert g["mfu"][rows["fp32 z0"], 0] == pytest.approx(0.105)  # the median of 0.100, 0.110, 0.105
    assert g["spread"][rows["fp32 z0"], 0] == pytest.approx(0.01 / 0.105)
    assert np.isnan(g["spread"][rows["bf16 z0"], 0])  # one run: no spread to show


def test_the_host_floor_probe_times_its_windows_and_gives_the_process_back_as_it_was():
    """bench repeatability's host floor: at least three windows of the asked length, a sigma of their
    rates, and the caller's thread count and cores restored (it pins itself to one core)."""
    import os

    import torch

    from devtools.repeatability import floor_text, host_floor

    threads, cores = torch.get_num_threads(), os.sched_getaffinity(0)
    floor = host_floor(0.02, 0.05)
    assert floor["windows"] >= 3 and floor["window_s"] == 0.02
    assert 0 <= floor["sigma"] < 1 and 0 < floor["slowest_over_fastest"] <= 1
    assert torch.get_num_threads() == threads and os.sched_getaffinity(0) == cores
    assert f"{floor['windows']} windows of 0.02 s" in floor_text(floor)
