"""The step-time model (scalelab.formulas.overlap, scalelab.results.step_model and prediction, issue #29): overlap per strategy, the link fit of a
bench table, compute references, predictions with their bands and reasons, validation and its command."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from scalelab.cli import main
from scalelab.config import ModelConfig
from scalelab.formulas import comm_time, link_fit, links, overlap
from scalelab.formulas.links import collective_calls, collective_sizes
from scalelab.formulas.rank_step import RankStep
from scalelab.registries.comm_table import BENCH_FILE
from scalelab.registries.strategies import STRATEGIES
from scalelab.results import prediction, prediction_validation, step_model

LINK = links.Link("test", 2e9, 300e-6, "made up")  # 2 GB/s bus bandwidth, 300 us per call
BATCHED = links.Link("test batched", 1e9, 1e-3, "made up")


def bench_table(link=LINK, batched=BATCHED, world_sizes=(2,), noise=0.0) -> pd.DataFrame:
    """A bench comm table whose mean times are exactly a link's (times a relative noise pattern)."""
    rows, wobble = [], [1 + noise, 1 - noise]
    for n in world_sizes:
        for c in links.COLLECTIVES:
            for batch, lk in ((1, link), (16, batched)):
                for i, size in enumerate(4096 * 4 ** k for k in range(6)):
                    t = links.collective_seconds(c, size, n, lk) * wobble[i % 2]
                    rows.append({"collective": c, "world_size": n, "bytes": size, "batch": batch, "time_s": t,
                                 "time_s_mean": t, "time_s_min": t, "time_s_max": t, "algbw_Bps": size / t,
                                 "busbw_Bps": size / t * links.bus_factor(c, n), "backend": "gloo", "device_name": "cpu",
                                 "measured_utc": "2026-01-01T00:00:00+00:00"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("n", [2, 4])
def test_fit_link_recovers_the_link_a_table_was_made_from(n):
    table = bench_table(world_sizes=(n,))
    fitted = link_fit.fit_link_rows(table, n, "all_reduce")
    assert fitted.link.latency_s == pytest.approx(LINK.latency_s, rel=1e-6)
    assert fitted.link.bandwidth_Bps == pytest.approx(LINK.bandwidth_Bps, rel=1e-6)
    assert fitted.residual == pytest.approx(0, abs=1e-9)
    assert link_fit.fit_link(table).bandwidth_Bps == pytest.approx(LINK.bandwidth_Bps, rel=1e-6)  # all collectives
    batched = link_fit.fit_link_rows(table, n, "broadcast", batched=True).link
    assert (batched.latency_s, batched.bandwidth_Bps) == pytest.approx((BATCHED.latency_s, BATCHED.bandwidth_Bps), rel=1e-6)
    noisy = link_fit.fit_link_rows(bench_table(noise=0.1), 2, "all_gather")
    assert 0.05 < noisy.residual < 0.2


def test_fit_link_names_what_a_table_lacks():
    with pytest.raises(ValueError, match="lacks busbw_Bps"):
        link_fit.fit_link(bench_table().drop(columns=["busbw_Bps"]))
    with pytest.raises(ValueError, match="fewer than two message sizes"):
        link_fit.fit_link(bench_table()[lambda t: t["bytes"] == 4096])
    with pytest.raises(ValueError, match="world size 8"):
        link_fit.fit_link(bench_table(), world_size=8)
    # a table from before batches were timed: every call one at a time
    unbatched = bench_table()[lambda t: t["batch"] == 1].drop(columns=["batch"])
    assert link_fit.fit_link(unbatched) == link_fit.fit_link(bench_table())


def test_overlap_follows_the_strategy_records():
    comm = {"all_reduce": 0.004}
    # DDP: the all-reduce of every bucket but the last hides in backward (2/3 of compute), eta scales it
    ddp = overlap.step_time(0, 0.030, comm, calls={"all_reduce": 4}, overlap_efficiency=1.0)
    assert ddp.exposed_comm_s == pytest.approx(0.001) and ddp.step_s == pytest.approx(0.031)
    assert overlap.step_time(0, 0.030, comm, calls={"all_reduce": 4}, overlap_efficiency=0.5).exposed_comm_s \
        == pytest.approx(0.0025)
    assert overlap.step_time(0, 0.030, comm, calls={"all_reduce": 1}).exposed_comm_s == pytest.approx(0.004)
    # the window caps what hides: 2/3 of 3 ms of compute
    assert overlap.step_time(0, 0.003, comm).exposed_comm_s == pytest.approx(0.002)
    # ZeRO-1's broadcast follows the optimizer step: exposed whatever the compute
    z1 = overlap.step_time(1, 0.030, {"all_reduce": 0.004, "broadcast": 0.002}, calls={"all_reduce": 4, "broadcast": 28})
    assert z1.exposed_comm_s == pytest.approx(0.001 + 0.002)
    # FSDP2: gathers hide in the whole step, reduce-scatters in backward
    z3 = overlap.step_time(3, 0.010, {"all_gather": 0.006, "reduce_scatter": 0.009})
    assert z3.exposed_comm_s == pytest.approx(0.015 - 0.010)  # at most the whole step's compute hides
    assert STRATEGIES[1].batched == ("broadcast",) and dict(STRATEGIES[0].overlap) == {"all_reduce": "backward"}


def test_step_time_refuses_what_is_no_time():
    with pytest.raises(ValueError, match="overlap_efficiency"):
        overlap.step_time(0, 0.01, {}, overlap_efficiency=1.5)
    with pytest.raises(ValueError, match="collectives are"):
        overlap.step_time(0, 0.01, {"all_to_all": 0.1})
    with pytest.raises(ValueError, match="compute_s"):
        overlap.step_time(0, -1.0, {})


SHAPE = {"model": "base", "model_family": "gpt2", "n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 64,
         "vocab_size": 256, "tie_embeddings": True, "n_params": 120_576, "global_batch": 8}
PEAK = 1e11


def run_row(precision, stage, n, step_s, repeat=1, **extra) -> dict:
    tokens = 8 * 64
    return {**SHAPE, "run_id": f"{precision}-z{stage}-w{n}" + (f"-r{repeat}" if repeat > 1 else ""), "repeat": repeat,
            "precision": precision, "zero_stage": stage, "world_size": n, "micro_batch": 8 // n, "accumulation_steps": 1,
            "activation_checkpointing": False, "cpu_offload": False, "compile": False, "lora_rank": None,
            "grad_reduce": "fp32", "bucket_mb": 25.0 if stage < 2 else None, "device_type": "cpu", "device_name": "cpu",
            "threads_per_rank": 1, "status": "ok", "step_time_s_mean": step_s, "tokens_per_step": tokens,
            "flops_per_token": 2e6, "peak_flops_per_device": PEAK, **extra}


def test_a_rows_collectives_use_its_own_bucket_cap():
    """DDP's all-reduce calls (each pays the latency) follow the run's bucket_mb, the default where null."""
    sizes, calls = comm_time.collectives_of(run_row("fp32", 0, 2, 0.02, bucket_mb=0.1))
    assert calls["all_reduce"] == math.ceil(sizes["all_reduce"] / (0.1 * 2 ** 20))
    _, default = comm_time.collectives_of(run_row("fp32", 0, 2, 0.02, bucket_mb=None))
    assert default["all_reduce"] == 1  # 120,576 fp32 gradients fit one 25 MiB bucket


def sweep() -> pd.DataFrame:
    rows = [run_row("fp32", 0, 1, 0.020), run_row("fp32", 0, 1, 0.021, repeat=2), run_row("fp32", 0, 1, 0.019, repeat=3),
            run_row("fp32", 1, 1, 0.022), run_row("fp32", 3, 1, 0.030)]
    rows += [run_row("fp32", s, 2, 0.025) for s in (0, 1, 3)]
    rows += [run_row("bf16", 0, 2, 0.020), run_row("fp32", 2, 2, 0.0, status="failed", step_time_s_mean=None)]
    return pd.DataFrame(rows)


def by_hand(stage: int, compute_1: float, table=None) -> float:
    """The model's prediction at world size 2 from a world-size-1 compute time, written out."""
    share = min(2e6 * 512 / PEAK / compute_1, 1.0)  # the FLOPs' share at the peak (defaulted: one token count)
    compute = compute_1 * ((1 - share) + share * 0.5) * step_model.default_rank_factor("cpu", stage, "fp32")  # across world sizes: f
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=4, seq_len=64, vocab_size=256)
    sizes = collective_sizes(120_576, RankStep("fp32", stage, 2, 4))
    calls = collective_calls(cfg, stage, "fp32", sizes)
    fits = link_fit.link_fits(table if table is not None else bench_table(), 2, STRATEGIES[stage].batched)
    comm = sum(calls[c] * links.collective_seconds(c, sizes[c] / calls[c], 2, fits[c].link) for c in sizes)
    return compute + comm  # on CPU nothing overlaps (eta 0)


def test_predictions_from_world_size_1_and_the_bench_table():
    runs, table = sweep(), bench_table()
    model = step_model.fit(prediction.reference_rows(runs), table)  # as collection fits: eta keeps its default
    assert set(prediction.reference_rows(runs)["run_id"]) == {"fp32-z0-w1", "fp32-z0-w1-r2", "fp32-z0-w1-r3",
                                                              "fp32-z1-w1", "fp32-z3-w1", "bf16-z0-w2"}
    assert model.overlap_efficiency == {"cpu": 0.0}
    out = prediction.predict(model, runs).set_index("run_id")
    assert out.loc["fp32-z0-w2", "predicted_step_time_s"] == pytest.approx(by_hand(0, 0.020))  # median of 3 repeats
    assert out.loc["fp32-z1-w2", "predicted_step_time_s"] == pytest.approx(by_hand(1, 0.022))  # batched broadcasts
    assert out.loc["fp32-z3-w2", "predicted_step_time_s"] == pytest.approx(by_hand(3, 0.030))
    row = out.loc["fp32-z0-w2"]
    assert row["predicted_step_time_s_low"] < row["predicted_step_time_s"] < row["predicted_step_time_s_high"]
    assert row["predicted_tokens_per_s"] == pytest.approx(512 / row["predicted_step_time_s"])
    assert "world size 1" in row["prediction_note"] and "defaulted" in row["prediction_note"]
    assert out.loc["fp32-z0-w1", "predicted_step_time_s"] == pytest.approx(0.020)  # its own reference: in-sample
    assert out.loc["fp32-z0-w1", "prediction_note"].startswith("in-sample")
    # bf16 ran at world size 2 only: its reference is itself, less the communication the model gives it
    assert out.loc["bf16-z0-w2", "predicted_step_time_s"] == pytest.approx(0.020)
    assert out.loc["bf16-z0-w2", "prediction_note"].startswith("in-sample")
    # a configuration the fit set never ran has no reference, and the row says so
    without_bf16 = step_model.fit(runs[runs["precision"] != "bf16"], table)
    lone = prediction.predict_row(without_bf16, runs.set_index("run_id").loc["bf16-z0-w2"].to_dict() | {"run_id": "x"})
    assert lone["predicted_step_time_s"] is None and "no compute reference" in lone["prediction_note"]
    names = [p["name"] for p in model.parameters()]
    assert "alpha[broadcast batched, n=2]" in names and "eta[cpu]" in names and "sigma" in names


def test_a_fitted_token_share_where_the_fit_set_has_two_micro_batches():
    # compute = 4 ms per step + 20 us per token: at 512 tokens 14.24 ms, at 256 9.12 ms
    rows = [run_row("fp32", 3, 1, 0.004 + 20e-6 * 512), run_row("fp32", 3, 1, 0.004 + 20e-6 * 256, micro_batch=4)]
    rows[1]["run_id"] = "fp32-z3-w1-mb4"
    model = step_model.fit(pd.DataFrame(rows), bench_table())
    ref = model.references.iloc[0]
    assert ref["token_share_source"].startswith("fitted")
    target = run_row("fp32", 3, 1, 0.0, micro_batch=2)  # 128 tokens per rank, one rank: no communication
    assert prediction.predict_row(model, target)["predicted_step_time_s"] == pytest.approx(0.004 + 20e-6 * 128)


def test_a_token_share_measured_by_the_runs_narrows_the_band_to_what_it_knows():
    """A reference run that measured its own token share (half-batch steps, train.measure_s) carries
    its compute to another token count with it: no assumed share between an estimate and 1, so the
    band is the noise's, and a band wider than +-25% names what widens it (issue #41)."""
    # compute = 4 ms per step + 20 us per token: at 512 tokens 14.24 ms; its true share 10.24 / 14.24
    truth = 20e-6 * 512 / (0.004 + 20e-6 * 512)
    measured = [run_row("fp32", 3, 1, 0.004 + 20e-6 * 512, repeat=r, token_share_measured=truth * f)
                for r, f in ((1, 1.0), (2, 1.02), (3, 0.98))]
    model = step_model.fit(pd.DataFrame(measured), bench_table())
    assert model.references.iloc[0]["token_share_source"].startswith("measured: the half-batch steps of 3 run(s)")
    target = run_row("fp32", 3, 1, 0.0, micro_batch=1)  # 64 tokens per rank, one rank
    got = prediction.predict_row(model, target)
    assert got["predicted_step_time_s"] == pytest.approx(0.004 + 20e-6 * 64)
    half = (got["predicted_step_time_s_high"] - got["predicted_step_time_s_low"]) / 2 / got["predicted_step_time_s"]
    assumed = step_model.fit(pd.DataFrame([{k: v for k, v in r.items() if k != "token_share_measured"} for r in measured]),
                             bench_table())
    wide = prediction.predict_row(assumed, target)
    assumed_half = (wide["predicted_step_time_s_high"] - wide["predicted_step_time_s_low"]) / 2 / wide["predicted_step_time_s"]
    assert half < 0.25 < assumed_half, (half, assumed_half)
    assert "band" not in got["prediction_note"]
    assert "wider than +-25%: mostly the assumed token share (measure it: train.measure_s)" in wide["prediction_note"]
    summary = prediction_validation.validate(pd.concat([pd.DataFrame(measured), pd.DataFrame([{**target, "step_time_s_mean": 0.0053,
                                                                                    "run_id": "fp32-z3-w1-mb1"}])], ignore_index=True),
                                  "micro_batch == 8", bench_table())["summary"]
    assert summary["median_band_half_width"] == pytest.approx(half) and summary["inside_band_share"] == 1.0


def test_without_a_bench_table_communicating_runs_get_null_and_the_reason():
    out = prediction.predict(step_model.fit(sweep(), None), sweep()).set_index("run_id")
    assert math.isnan(out.loc["fp32-z0-w2", "predicted_step_time_s"])
    assert "no bench comm table" in out.loc["fp32-z0-w2", "prediction_note"]
    assert out.loc["fp32-z3-w1", "predicted_step_time_s"] == pytest.approx(0.030)  # one rank: nothing to time


def test_validate_reports_per_point_and_summary():
    runs = sweep()
    result = prediction_validation.validate(runs, "world_size == 1", bench_table())
    assert set(result) == {"points", "summary", "parameters"}
    points = {p["run_id"]: p for p in result["points"]}
    assert set(points) == {"fp32-z0-w2", "fp32-z1-w2", "fp32-z3-w2", "bf16-z0-w2"}  # ok runs not fitted on
    p = points["fp32-z0-w2"]
    assert p["error"] == pytest.approx(p["predicted_step_time_s"] / 0.025 - 1)
    assert p["inside_band"] == (p["band_low_s"] <= 0.025 <= p["band_high_s"])
    errors = [abs(q["error"]) for q in points.values() if q["error"] is not None]
    s = result["summary"]
    assert s["predicted"] == 3 and s["held_out"] == 4
    assert s["mean_abs_error"] == pytest.approx(np.mean(errors)) and s["max_abs_error"] == pytest.approx(max(errors))
    assert 0 <= s["inside_band_share"] <= 1
    with pytest.raises(ValueError, match="not a pandas query"):
        prediction_validation.validate(runs, "world_size ==", bench_table())
    with pytest.raises(ValueError, match="leaves no ok run"):
        prediction_validation.validate(runs, "world_size > 0", bench_table())


def test_validation_says_what_the_hypervisor_took_from_the_bench_ranks():
    """bench comm records the largest share of its ranks' cores the hypervisor took while it timed them; validation
    states it, and says above 2% that the table's times (the model's communication) run high."""
    runs = sweep()
    assert prediction_validation.validate(runs, "world_size == 1", bench_table())["summary"]["bench_steal_share"] is None  # no column
    assert link_fit.bench_steal(bench_table().assign(host_steal_share=None)) is None  # off Linux, or too short to say
    quiet = prediction_validation.validate(runs, "world_size == 1", bench_table().assign(host_steal_share=0.004))
    assert quiet["summary"]["bench_steal_share"] == 0.004
    assert prediction_validation.format_validation(quiet).splitlines()[-1] == ("the hypervisor took 0.4% of the bench ranks' cores' "
                                                                    "time while they were timed")
    busy = prediction_validation.validate(runs, "world_size == 1", bench_table().assign(host_steal_share=[0.0] + [0.094] * (len(bench_table()) - 1)))
    assert prediction_validation.format_validation(busy).splitlines()[-1] == (
        "the hypervisor took 9.4% of the bench ranks' cores' time while they were timed (other guests of the physical "
        "host were busy): its times (and this model's communication) run high; `scalelab bench comm` on a quiet host "
        "measures them again")


def test_validation_says_whether_the_bench_ranks_cores_were_busy_as_they_started():
    """The bench table's busy share of its ranks' cores (bench comm records it) is stated, with its meaning above 10%; a
    table from before it states the machine's 1-minute load as context, without a verdict it cannot give."""
    runs = sweep()
    table = bench_table().assign(device_type="cpu", host_steal_share=0.0, load_1min_before=3.35)
    quiet = prediction_validation.validate(runs, "world_size == 1", table.assign(busy_share_before=0.01))
    assert quiet["summary"]["bench_busy_share"] == 0.01 and quiet["summary"]["bench_host_load"] == 3.35
    assert prediction_validation.format_validation(quiet).splitlines()[-2] == (
        "other processes kept 1.0% of the bench ranks' cores busy as the ranks started")
    busy = prediction_validation.validate(runs, "world_size == 1", table.assign(busy_share_before=0.34))
    assert prediction_validation.format_validation(busy).splitlines()[-2] == (
        "other processes kept 34.0% of the bench ranks' cores busy as the ranks started (if they went on, they shared "
        "the cores: these times may include their work; measure again on an idle machine)")
    old = prediction_validation.validate(runs, "world_size == 1", table)
    assert old["summary"]["bench_busy_share"] is None
    assert prediction_validation.format_validation(old).splitlines()[-2] == (
        "the bench table was measured with a 1-minute load of 3.35 on the whole machine before its ranks started "
        "(whether their own cores were busy, this table cannot say: `scalelab bench comm` now records it)")
    unread = prediction_validation.validate(runs, "world_size == 1", table.assign(busy_share_before=None))
    assert prediction_validation.format_validation(unread).splitlines()[-2].endswith(
        "(whether their own cores were busy, this table cannot say: /proc/stat could not be read)")
    gpu = prediction_validation.validate(runs, "world_size == 1", table.assign(device_type="cuda", busy_share_before=None))
    assert gpu["summary"]["bench_host_load"] is None and gpu["summary"]["bench_busy_share"] is None
    assert "1-minute load" not in prediction_validation.format_validation(gpu)  # NCCL's times hardly depend on the host's cores


def test_predict_command_prints_the_validation_as_json(tmp_path, capsys):
    # a collected table holds the sweep's own predictions: validation replaces them with its fit's
    sweep().assign(predicted_step_time_s=1.0, prediction_note="collected").to_parquet(tmp_path / "metrics.parquet")
    (tmp_path / BENCH_FILE).parent.mkdir()
    bench_table().to_parquet(tmp_path / BENCH_FILE)
    assert main(["predict", "--validate", str(tmp_path), "--fit", "world_size==1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"mean_abs_error", "max_abs_error", "inside_band_share"} <= set(result["summary"])
    assert len(result["points"]) == 4
    direct = prediction_validation.validate(sweep(), "world_size==1", bench_table())
    assert [p["predicted_step_time_s"] for p in result["points"]] == [p["predicted_step_time_s"] for p in direct["points"]]
    assert main(["predict", "--validate", str(tmp_path), "--fit", "world_size==1"]) == 0
    text = capsys.readouterr().out
    assert "mean absolute error" in text and "alpha[all_reduce, n=2]" in text and "fp32-z1-w2" in text
    # a second folder's runs join the first's; a run id both have is named with its folder
    other = tmp_path / "calibration-sweep"
    other.mkdir()
    sweep().query("world_size == 1").to_parquet(other / "metrics.parquet")
    assert main(["predict", "--validate", str(tmp_path), str(other), "--fit", "world_size==1", "--json"]) == 0
    joined = json.loads(capsys.readouterr().out)
    assert joined["summary"]["fit_runs"] == 2 * result["summary"]["fit_runs"] and len(joined["points"]) == 4
    assert main(["predict", "--validate", str(tmp_path), "--fit", "nonsense ==="]) == 2
    assert "--fit 'nonsense ==='" in capsys.readouterr().err
    assert main(["predict", "--validate", str(tmp_path), "--fit", "world_size==1", "--bench", str(tmp_path / "x.parquet")]) == 2
    assert "no collective benchmark table" in capsys.readouterr().err


def test_the_report_warns_on_a_run_outside_its_band():
    from scalelab.report.checks import prediction_warnings

    runs = prediction.predict(step_model.fit(prediction.reference_rows(sweep()), bench_table()), sweep())
    assert prediction_warnings(runs) == [] or all("outside its predicted band" in w for w in prediction_warnings(runs))
    slow = runs["run_id"] == "fp32-z0-w2"
    runs.loc[slow, "step_time_s_mean"] = runs.loc[slow, "predicted_step_time_s_high"] * 2
    warnings = prediction_warnings(runs)
    assert any(w.startswith("fp32-z0-w2: measured step time") for w in warnings)


def _z3_parts(runs, table):
    """fp32-z3-w2's predicted parts from the world-size-1 references, and what its strategy could hide."""
    base = step_model.fit(prediction.reference_rows(runs), table)
    row = runs.set_index("run_id").loc["fp32-z3-w2"].to_dict() | {"run_id": "fp32-z3-w2"}
    parts = step_model.parts_of(base, row)
    full = overlap.step_time(3, parts.base_compute_s, parts.comm_s, calls=parts.calls, overlap_efficiency=1.0)
    return parts, sum(parts.comm_s.values()) - full.exposed_comm_s


def test_overlap_efficiency_is_fitted_where_the_fit_set_communicates_beyond_its_reference():
    runs, table = sweep(), bench_table()
    parts, hidden = _z3_parts(runs, table)
    assert hidden > 0
    runs.loc[runs["run_id"] == "fp32-z3-w2", "step_time_s_mean"] = parts.base_compute_s + sum(parts.comm_s.values()) - 0.5 * hidden
    model = step_model.fit(runs, table)
    assert model.overlap_efficiency["cpu"] == pytest.approx(0.5)
    assert model.overlap_source["cpu"].startswith("fitted: 1 run")
    # an overlap explains the runs: their compute is not also scaled (f 1)
    assert model.rank_factor["cpu", 3] == 1.0 and model.rank_factor_source["cpu", 3].startswith("1: ")


def test_runs_slower_than_no_overlap_fit_the_rank_factor_and_the_models_error():
    """Runs beyond their reference that take longer than their compute and all their communication carry
    f per stage (the median of their compute ratios) and, with degrees of freedom left, the model's error:
    the band then holds them."""
    runs, table = sweep(), bench_table()
    runs = pd.concat([runs, pd.DataFrame([run_row("fp32", 3, 2, 0.025, repeat=r) for r in (2, 3)])], ignore_index=True)
    base = step_model.fit(prediction.reference_rows(runs), table)
    slow = {"fp32-z0-w2": 1.0, "fp32-z1-w2": 1.25, "fp32-z3-w2": 1.2, "fp32-z3-w2-r2": 1.5, "fp32-z3-w2-r3": 1.9}
    for run_id, factor in slow.items():
        parts = step_model.parts_of(base, runs.set_index("run_id").loc[run_id].to_dict() | {"run_id": run_id})
        runs.loc[runs["run_id"] == run_id, "step_time_s_mean"] = parts.base_compute_s * factor + sum(parts.comm_s.values())
    model = step_model.fit(runs, table)
    assert model.overlap_efficiency["cpu"] == 0.0
    assert model.rank_factor["cpu", 3] == pytest.approx(1.5) and model.rank_factor["cpu", 1] == pytest.approx(1.25)
    assert model.rank_factor_source["cpu", 3].startswith("fitted: median of 3")
    assert model.model_sigma["cpu"] > 0 and model.model_sigma_source["cpu"].startswith("fitted: rms")
    out = prediction.predict(model, runs).set_index("run_id")
    assert (out.loc[list(slow), "predicted_step_time_s_low"] <= out.loc[list(slow), "step_time_s_mean"]).all()
    assert (out.loc[list(slow), "step_time_s_mean"] <= out.loc[list(slow), "predicted_step_time_s_high"]).all()
    # in-sample rows carry neither f nor the model's error
    assert out.loc["fp32-z0-w1", "predicted_step_time_s"] == pytest.approx(0.020)
    names = [p["name"] for p in model.parameters()]
    assert "f[cpu, z3]" in names and "sigma_model[cpu]" in names


def test_a_device_without_a_measured_model_error_says_so_in_its_band():
    runs = sweep()
    runs["device_type"] = "cuda"
    model = step_model.fit(prediction.reference_rows(runs), bench_table())
    assert model.rank_factor["cuda", 0] == 1.0 and model.model_sigma["cuda"] is None
    out = prediction.predict(model, runs).set_index("run_id")
    assert "error across world sizes on cuda is unknown" in out.loc["fp32-z0-w2", "prediction_note"]
    assert "unknown" not in out.loc["fp32-z0-w1", "prediction_note"]


def test_traced_runs_give_the_overlap_efficiency_they_measured():
    """exposed_comm_s_measured (a trace, scalelab.run.trace) sets eta where runs beyond their reference
    were traced: all their communication less what they left exposed, over what the strategy could hide."""
    runs, table = sweep(), bench_table()
    parts, hidden = _z3_parts(runs, table)
    runs["exposed_comm_s_measured"] = None
    exposed = sum(parts.comm_s.values()) - 0.25 * hidden
    runs.loc[runs["run_id"] == "fp32-z3-w2", "exposed_comm_s_measured"] = exposed
    runs.loc[runs["run_id"] == "fp32-z3-w2", "step_time_s_mean"] = parts.base_compute_s * 1.3 + exposed
    model = step_model.fit(runs, table)
    assert model.overlap_efficiency["cpu"] == pytest.approx(0.25)
    assert model.overlap_source["cpu"].startswith("measured: the traces of 1 run")
    # f is fitted against the step with that overlap (the compute it hides behind): the run's prediction is its step
    row = prediction.predict(model, runs).set_index("run_id").loc["fp32-z3-w2"]
    assert row["predicted_step_time_s"] == pytest.approx(row["step_time_s_mean"], rel=0.05)


def test_tensor_parallel_runs_are_predicted_with_their_collectives_on_the_critical_path():
    """A TP 2 run's reference is its own configuration at its smallest world size (TP alone: its all-reduces all
    exposed, compute = step less them); at TP 2 x DP 2 the strategy's collectives run over the data-parallel pair on
    each rank's share, and tensor parallelism's over the TP pair, none of them hidden (written out here)."""
    from scalelab.formulas import tensor_parallelism

    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=4, seq_len=64, vocab_size=256)
    table = bench_table()
    tp_alone = run_row("fp32", 3, 2, 0.030, tensor_parallel=2, sequence_parallel=True, micro_batch=8, n_params=120_576)
    wider = run_row("fp32", 3, 4, 0.0, tensor_parallel=2, sequence_parallel=True, micro_batch=4, n_params=120_576,
                    run_id="fp32-z3-w4-tp2-sp")
    model = step_model.fit(pd.DataFrame([tp_alone]), table)
    fits = link_fit.link_fits(table, 2)

    def tp_seconds(micro):
        step = RankStep("fp32", 3, 1, micro, tensor_parallel=2, sequence_parallel=True, device_type="cpu")
        comm = tensor_parallelism.tensor_parallel_comm(cfg, step)
        assert set(comm) == {"all_gather", "reduce_scatter", "all_reduce"}  # sequence parallelism's
        return sum(calls * links.collective_seconds(c, nbytes / links.handed_per_size(c) / calls, 2, fits[c].link)
                   for c, (nbytes, calls) in comm.items())

    compute = 0.030 - tp_seconds(8)  # nothing of it hides: its reference's compute is the step less all of it
    ref = model.references.iloc[0]
    assert ref["compute_s"] == pytest.approx(compute)
    share = float(ref["token_share"])
    local = int(tensor_parallelism.tensor_parallel_params(cfg, 120_576, 2))
    sizes = collective_sizes(local, RankStep("fp32", 3, 2, 4))
    calls = collective_calls(cfg, 3, "fp32", sizes)
    strategy_s = sum(calls[c] * links.collective_seconds(c, sizes[c] / calls[c], 2, fits[c].link) for c in sizes)
    expected = compute * ((1 - share) + share * 0.5) * step_model.default_rank_factor("cpu", 3, "fp32") + strategy_s + tp_seconds(4)
    out = prediction.predict_row(model, wider)
    assert out["predicted_step_time_s"] == pytest.approx(expected)  # eta 0 on a CPU: the strategy's exposed too
    assert out["predicted_exposed_comm_s"] == pytest.approx(strategy_s + tp_seconds(4))
    parts = step_model.parts_of(model, wider)
    assert {c for c in parts.comm_s if c.startswith(overlap.TENSOR_PARALLEL)} == {
        "tensor_parallel all_gather", "tensor_parallel reduce_scatter", "tensor_parallel all_reduce"}
    # on a GPU (eta 1) the strategy's prefetched gathers hide, tensor parallelism's do not
    full = overlap.step_time(3, 1.0, parts.comm_s, calls=parts.calls, overlap_efficiency=1.0)
    tp_part = sum(s for c, s in parts.comm_s.items() if c.startswith(overlap.TENSOR_PARALLEL))
    strategy_only = {c: s for c, s in parts.comm_s.items() if not c.startswith(overlap.TENSOR_PARALLEL)}
    hidden_strategy = overlap.step_time(3, 1.0, strategy_only, calls=parts.calls, overlap_efficiency=1.0)
    assert hidden_strategy.exposed_comm_s < strategy_s  # something of the strategy's hides...
    assert full.exposed_comm_s == pytest.approx(hidden_strategy.exposed_comm_s + tp_part)  # ...and nothing of TP's


def test_stage_0_under_tensor_parallelism_all_reduces_per_unit_not_per_bucket():
    """A split model at stage 0 is replicated by FSDP2's replicate, one all-reduce per block and the root, not DDP's
    25 MiB buckets (a small model's one bucket would leave nothing of it to hide behind backward)."""
    row = run_row("fp32", 0, 4, 0.02, tensor_parallel=2, micro_batch=4, n_params=120_576, bucket_mb=None)
    _, calls = comm_time.collectives_of(row)
    assert calls["all_reduce"] == 2 + 1  # n_layers + the root
    _, ddp = comm_time.collectives_of(run_row("fp32", 0, 2, 0.02, bucket_mb=None))
    assert ddp["all_reduce"] == 1


def test_a_defaulted_rank_factor_is_the_runs_precisions_and_the_parameters_list_each():
    """Where the fit set has no run of a stage beyond its reference, f is DEFAULT_RANK_FACTOR's for the predicted
    run's precision (a precision without its own value: the stage's median), and `scalelab predict` lists every
    value it may use."""
    defaults = step_model.DEFAULT_RANK_FACTOR["cpu"]
    assert step_model.default_rank_factor("cpu", 0, "bf16") == defaults[0]["bf16"] != defaults[0][None]
    assert step_model.default_rank_factor("cpu", 0, "fp8") == step_model.default_rank_factor("cpu", 0) == defaults[0][None]
    assert step_model.default_rank_factor("cuda", 3, "fp32") == 1.0  # a GPU rank owns its device
    runs, table = sweep(), bench_table()
    runs = pd.concat([runs, pd.DataFrame([run_row("bf16", 0, 1, 0.020), run_row("bf16", 3, 1, 0.030),
                                          run_row("bf16", 3, 2, 0.040)])], ignore_index=True)
    model = step_model.fit(prediction.reference_rows(runs), table)
    assert model.rank_factor["cpu", 3] is None  # defaulted: read per precision when a run is predicted
    out = prediction.predict(model, runs).set_index("run_id")
    for run_id, precision in (("fp32-z3-w2", "fp32"), ("bf16-z3-w2", "bf16")):
        parts = step_model.parts_of(model, runs.set_index("run_id").loc[run_id].to_dict() | {"run_id": run_id})
        assert parts.compute_s == pytest.approx(parts.base_compute_s * step_model.default_rank_factor("cpu", 3, precision))
        assert out.loc[run_id, "predicted_step_time_s"] > 0
    assert defaults[3]["fp32"] != defaults[3][None]  # so the two runs above took different f
    params = {p["name"]: p for p in model.parameters()}
    assert params["f[cpu, z3, fp32]"]["value"] == defaults[3]["fp32"]
    assert params["f[cpu, z3]"]["value"] == defaults[3][None] and params["f[cpu, z3]"]["source"].endswith(": any other precision")
    assert params["f[cpu, z1]"]["value"] == defaults[1][None] and "any other precision" not in params["f[cpu, z1]"]["source"]


def test_the_models_error_across_world_sizes_is_measured_at_the_fitted_f_not_the_default(monkeypatch):
    """sigma_model is the runs' error beyond the band's noise terms, those terms taken at the f the runs fitted:
    a default the fit set overrode leaves it unchanged."""
    runs, table = sweep(), bench_table()
    runs = pd.concat([runs, pd.DataFrame([run_row("fp32", 3, 2, 0.025, repeat=r) for r in (2, 3)])], ignore_index=True)
    base = step_model.fit(prediction.reference_rows(runs), table)
    for run_id, factor in {"fp32-z0-w2": 1.0, "fp32-z1-w2": 1.25, "fp32-z3-w2": 1.2, "fp32-z3-w2-r2": 1.5,
                           "fp32-z3-w2-r3": 1.9}.items():
        parts = step_model.parts_of(base, runs.set_index("run_id").loc[run_id].to_dict() | {"run_id": run_id})
        runs.loc[runs["run_id"] == run_id, "step_time_s_mean"] = parts.base_compute_s * factor + sum(parts.comm_s.values())
    fitted = step_model.fit(runs, table).model_sigma["cpu"]
    monkeypatch.setattr(step_model, "DEFAULT_RANK_FACTOR", {"cpu": {s: {None: 50.0} for s in range(4)}})
    assert fitted > 0 and step_model.fit(runs, table).model_sigma["cpu"] == pytest.approx(fitted)


def _quiet_sweep(spread: float) -> pd.DataFrame:
    """World size 1 at five repeats of the baseline (their log times spread by about ``spread``) and one run of
    stages 1 and 3; world size 2 of each stage."""
    rows = [run_row("fp32", 0, 1, 0.020 * (1 + spread * k), repeat=i + 1) for i, k in enumerate((0, 1, -1, 0.5, -0.5))]
    rows += [run_row("fp32", s, 1, t) for s, t in ((1, 0.022), (3, 0.030))]
    rows += [run_row("fp32", s, 2, 0.03) for s in (0, 1, 3)]
    return pd.DataFrame(rows)


def test_a_quiet_sweeps_band_holds_the_shift_of_the_hosts_state_and_widens_with_the_noise_measured():
    """A sweep's world-size-2 runs move together with the host's state, by up to 15% from one sweep to the next,
    which no world-size-1 run sees. The band of a defaulted rank factor held it only where the sweep's own noise
    was large (the model's error was taken less the noise six other sweeps had): an idle default sweep had 81% of
    its runs inside their bands. Now a quiet sweep's band holds that shift, and a noisier one's is wider."""
    table = bench_table()
    quiet, noisy = _quiet_sweep(0.01), _quiet_sweep(0.06)
    widths = {}
    for name, runs in (("quiet", quiet), ("noisy", noisy)):
        model = step_model.fit(runs[runs["world_size"] == 1], table)
        assert model.model_sigma_source["cpu"].startswith("defaulted")
        out = prediction.predict(model, runs[runs["world_size"] == 2]).set_index("run_id")
        for run_id, r in out.iterrows():
            for shift in (0.85, 1.15):  # the host's state, as far as six default sweeps moved it
                assert r["predicted_step_time_s_low"] < r["predicted_step_time_s"] * shift < r["predicted_step_time_s_high"], (
                    name, run_id, shift, r["prediction_note"])
        widths[name] = (out["predicted_step_time_s_high"] - out["predicted_step_time_s_low"]) / out["predicted_step_time_s"]
    assert (widths["noisy"] > widths["quiet"]).all()
