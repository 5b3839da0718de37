"""`scalelab compare A B`: what changed between two result folders, from their tables alone."""
import re
import shutil

import pandas as pd
import pytest

from devtools.fixtures import synthetic_results
from scalelab.cli import main
from scalelab.report.compare import build_compare, compare_runs
from scalelab.report.report import load_tables


@pytest.fixture
def two_sweeps(tmp_path):
    """B: A again on another torch and host, one run 1.5x faster, one with twice the peak memory, one
    whose loss moved by 1e-3 (relative) at one step, one now failed, one run dropped and one added."""
    a, b = tmp_path / "a", tmp_path / "b"
    synthetic_results(a, n_runs=30, n_steps=20)
    shutil.copytree(a, b)
    runs = pd.read_parquet(b / "metrics.parquet")
    runs["torch_version"], runs["hostname"] = "2.99.0", "elsewhere"
    at = runs.set_index("run_id").index.get_loc
    runs.loc[at("fp32-z0-w2"), "tokens_per_s"] *= 1.5
    runs.loc[at("fp32-z0-w4"), "peak_rss_bytes"] *= 2
    runs.loc[at("fp32-z1-w1"), ["status", "reason", "tokens_per_s"]] = ["failed", "rank 0: RuntimeError: boom", None]
    dropped = runs[runs["run_id"] == "fp32-z2-w1"].index
    added = runs.loc[[at("fp32-z2-w2")]].assign(run_id="fp32-z2-w2-mb1", micro_batch=1)
    runs = pd.concat([runs.drop(dropped), added], ignore_index=True)
    runs.to_parquet(b / "metrics.parquet")
    steps = pd.read_parquet(b / "steps.parquet")
    moved = steps.index[(steps["run_id"] == "fp32-z0-w1-ac") & (steps["step"] == 7)]
    steps.loc[moved, "loss"] *= 1 + 1e-3
    steps.to_parquet(b / "steps.parquet")
    return a, b


def test_compare_ratios_loss_agreement_provenance_and_one_sided_runs(two_sweeps, capsys):
    a, b = two_sweeps
    assert main(["compare", str(a), str(b)]) == 0
    assert f"compare: {b / 'compare' / 'compare.html'}" in capsys.readouterr().out
    runs_a, steps_a = load_tables(a)
    runs_b, steps_b = load_tables(b)
    table = compare_runs(runs_a, runs_b, steps_a, steps_b).set_index("run_id")
    assert table.loc["fp32-z0-w2", "tokens_per_s_ratio"] == pytest.approx(1.5)
    assert table.loc["fp32-z0-w4", "peak_mib_ratio"] == pytest.approx(2.0)
    assert table.loc["fp32-z0-w1-ac", "loss_max_rel_diff"] == pytest.approx(1e-3, rel=1e-6)
    others = table.drop(index="fp32-z0-w1-ac")
    assert (others["loss_max_rel_diff"].dropna() == 0).all() and table.loc["fp32-z0-w1-ac", "common_steps"] == 20
    assert "fp32-z2-w1" not in table.index and "fp32-z2-w2-mb1" not in table.index
    md = (b / "compare" / "compare.md").read_text()
    assert "- provenance differs in: torch_version, hostname" in md
    assert re.search(r"throughput \(B / A\): median 1\.000, from 1\.000 \(\S+\) to 1\.500 \(fp32-z0-w2\)", md), md
    assert "loss agreement: largest relative difference 0.001 (fp32-z0-w1-ac)" in md
    assert "status changed: fp32-z1-w1 (ok → failed)" in md
    assert "| A only | fp32-z2-w1 | ok |" in md and "| B only | fp32-z2-w2-mb1 | ok |" in md
    assert md.index("| ran on | torch_version | - | 2.99.0 | no |") < md.index(
        "| ran on | device_type | cpu | cpu | yes |"), "differing columns first"
    html = (b / "compare" / "compare.html").read_text()
    assert "Runs in one side only" in html and ">1.500<" in html and ">1.00e-03<" in html


def test_compare_of_a_sweep_with_itself(tmp_path):
    synthetic_results(tmp_path / "a", n_runs=12, n_steps=5)
    html = build_compare(tmp_path / "a", tmp_path / "a", tmp_path / "out").read_text()
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "provenance differs in: nothing" in md and "None." in md and "both sides have the same runs" in html
    # nothing changed: said so, never as a range "from 1.000 (x) to 1.000 (y)"
    assert "- throughput (B / A): 1.000 in all 8 run(s): unchanged" in md
    assert "- peak memory per rank (B / A): 1.000 in all 8 run(s): unchanged" in md
    assert not re.search(r"from (\S+) \(\S+\) to \1 ", md), md


def test_compare_collects_run_folders_and_names_a_missing_side(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope"), str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("umask, mode", [(0o022, 0o755), (0o002, 0o775), (0o077, 0o700)])
def test_report_and_compare_folders_are_made_with_the_users_umask(tmp_path, umask, mode):
    """On a shared machine colleagues open the report, and a web server serves it: the folders a
    build makes aside and renames into place get the umask's mode, as mkdir would, not mkdtemp's 0700.
    Both builds make theirs with scalelab.io.building_dir: each umask there, and a whole build of each
    under the most common one (a report build takes seconds)."""
    import os

    from scalelab.io import building_dir
    from scalelab.report.report import build_report

    before = os.umask(umask)
    try:
        made = building_dir(tmp_path / "out")
        if umask == 0o022:
            synthetic_results(tmp_path / "a", n_runs=6, n_steps=3)
            build_compare(tmp_path / "a", tmp_path / "a", tmp_path / "cmp")
            build_report(tmp_path / "a", tmp_path / "report", workers=1)
    finally:
        os.umask(before)
    assert made.parent == tmp_path and made.name.startswith(".out.") and made.stat().st_mode & 0o777 == mode
    if umask == 0o022:
        assert (tmp_path / "cmp").stat().st_mode & 0o777 == mode
        assert (tmp_path / "report").stat().st_mode & 0o777 == mode


def test_identical_sweeps_with_skipped_runs_raise_no_provenance_alarm(tmp_path):
    """Runs skipped before their first step record no device, versions or host: two identical sweeps
    whose skipped runs differ in number are the same sweep, and the summary says how many had none."""
    a, b = tmp_path / "a", tmp_path / "b"
    synthetic_results(a, n_runs=12, n_steps=5)
    shutil.copytree(a, b)
    runs = pd.read_parquet(b / "metrics.parquet")
    blank = ["device_type", "device_name", "backend", "torch_version", "python_version", "hostname", "git_commit", "threads_per_rank"]
    skipped = runs.index[runs["status"] == "ok"][:2]
    runs.loc[skipped, "status"], runs.loc[skipped, "reason"] = "skipped", "no device"
    for col in blank:
        runs[col] = runs[col].astype(object)
        runs.loc[skipped, col] = None
    runs.to_parquet(b / "metrics.parquet")
    build_compare(a, b, tmp_path / "out")
    md = (tmp_path / "out" / "compare.md").read_text()
    n_not_ok_a = int((pd.read_parquet(a / "metrics.parquet")["status"] != "ok").sum())
    assert (f"- provenance differs in: nothing (same versions, devices, commit) (over the ok runs; {n_not_ok_a} of 12 runs "
            f"in A and {n_not_ok_a + 2} of 12 in B were not ok and record none)") in md, md
    assert "what was trained differs" not in md


def test_another_model_is_named_and_never_paired(tmp_path):
    """Between two models (sequence length, width), compare names every difference and pairs no run:
    a run id that trained another model on each side is two runs (scalelab.results.like), each listed
    on its side with what differs. The same model with another batch and schedule is paired, and its
    losses are not compared."""
    a, b = tmp_path / "a", tmp_path / "b"
    synthetic_results(a, n_runs=12, n_steps=5)
    runs = pd.read_parquet(a / "metrics.parquet")
    runs["seq_len"], runs["tokens_per_step"], runs["d_model"] = 32, 256, 64
    runs.to_parquet(a / "metrics.parquet")
    shutil.copytree(a, b)
    runs["seq_len"] *= 2
    runs["tokens_per_step"] *= 2
    runs["d_model"] *= 2
    runs.to_parquet(b / "metrics.parquet")
    steps = pd.read_parquet(b / "steps.parquet")
    steps["lr"] *= 3
    steps.to_parquet(b / "steps.parquet")
    runs_a, steps_a = load_tables(a)
    runs_b, steps_b = load_tables(b)
    assert compare_runs(runs_a, runs_b, steps_a, steps_b).empty, "no pair between different models"
    build_compare(a, b, tmp_path / "out")
    md = (tmp_path / "out" / "compare.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("- what was trained differs: "))
    for col in ("d_model", "seq_len", "tokens_per_step", "peak_lr"):
        assert f" {col} " in line or f": {col} " in line, (col, line)
    assert "n_layers" not in line and "dataset" not in line, "only what differs"
    assert "loss agreement" not in md and "throughput (B / A)" not in md
    assert ("- runs on one side only: 12 in A, 12 in B; 12 run id(s) on both sides trained another model on each, so they "
            "are not paired (d_model 64 vs 128; seq_len 32 vs 64)") in md, md
    for side in ("A", "B"):
        assert re.search(rf"\| {side} only \| fp32-z0-w1 \| ok \| [\d,]+ \| the other side's run of this id trained another "
                         r"model: d_model 64 vs 128; seq_len 32 vs 64 \|", md), md

    # the same model, with twice the batch and three times the learning rate: paired, losses not compared
    runs = pd.read_parquet(a / "metrics.parquet").assign(tokens_per_step=512)
    runs.to_parquet(b / "metrics.parquet")
    runs_b, steps_b = load_tables(b)
    table = compare_runs(runs_a, runs_b, steps_a, steps_b)
    assert len(table) == 12 and table["loss_max_rel_diff"].isna().all(), "no loss agreement between different schedules"
    assert table["loss_not_compared"].str.contains("tokens_per_step 256 vs 512").all()
    build_compare(a, b, tmp_path / "out")
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "loss agreement" not in md and "losses not compared for" in md and "they trained different things" in md


def test_compare_pairs_within_each_model_and_judges_each_against_its_own_noise(tmp_path):
    """Two models in each sweep, each with a repeated point: every pair is of one model, and each
    change is judged against its model's noise (pooled over that model's repeats in both sweeps,
    never the other model's)."""
    import math

    from scalelab.report.compare import noise_limits, summary_lines
    from scalelab.results.noise import t_quantile

    def sweep(tps):
        rows = []
        for model, values in tps.items():
            suffix = "" if model == "base" else f"-{model}"
            for (point, repeat), v in values.items():
                rows.append({"run_id": point + suffix + (f"-r{repeat}" if repeat > 1 else ""), "model": model, "repeat": repeat,
                             "precision": "fp32", "zero_stage": 0, "world_size": int(point[-1]), "status": "ok", "tokens_per_s": v,
                             "d_model": 64 if model == "base" else 32, "step_time_s_median": 1.0, "model_state_bytes_measured": 1e6,
                             "mfu": 0.1, "final_loss": 3.0, "peak_rss_bytes": 1e8})
        return pd.DataFrame(rows)

    quiet = {("fp32-z0-w1", 1): 1000, ("fp32-z0-w1", 2): 1001, ("fp32-z0-w1", 3): 999, ("fp32-z0-w2", 1): 1800}
    noisy = {("fp32-z0-w1", 1): 400, ("fp32-z0-w1", 2): 500, ("fp32-z0-w1", 3): 450, ("fp32-z0-w2", 1): 700}
    a = sweep({"base": quiet, "mine": noisy})
    b = sweep({"base": {**quiet, ("fp32-z0-w2", 1): 1900}, "mine": {**noisy, ("fp32-z0-w2", 1): 770}})
    steps = pd.DataFrame({"run_id": pd.Series([], dtype=str), "step": pd.Series([], dtype=int), "loss": pd.Series([], dtype=float)})
    table = compare_runs(a, b, steps, steps).set_index("run_id")
    assert len(table) == 8 and (table["model"] == table.index.map(lambda r: "mine" if "mine" in r else "base")).all()
    limits = noise_limits(a, b)
    sigma = {m: math.sqrt(sum((math.log(v) - sum(map(math.log, g)) / 3) ** 2 for v in g) / 2)
             for m, g in (("base", [1000, 1001, 999]), ("mine", [400, 500, 450]))}
    expected = {m: math.expm1(t_quantile(4) * sigma[m] * math.sqrt(2)) for m in sigma}
    assert sorted(limits.round(12).tolist()) == sorted(round(v, 12) for v in expected.values())
    # +5.6% is beyond base's noise (its repeats agree to 0.1%); +10% is within mine's (its repeats spread 25%)
    assert table.loc["fp32-z0-w2", "throughput_change"] == "beyond noise"
    assert table.loc["fp32-z0-w2-mine", "throughput_change"] == "within noise"
    assert table.loc["fp32-z0-w2", "noise_limit"] == pytest.approx(expected["base"])
    assert table.loc["fp32-z0-w2-mine", "noise_limit"] == pytest.approx(expected["mine"])
    lines = summary_lines(table.reset_index(), pd.DataFrame(columns=["side"]), pd.DataFrame({"column": [], "same": []}))
    line = next(x for x in lines if x.startswith("throughput changes beyond the run-to-run noise"))
    assert f"per model: base {expected['base']:.1%}, mine {expected['mine']:.1%}" in line and "1 of 8 runs (fp32-z0-w2)" in line


def test_config_hash_is_not_called_a_difference(tmp_path):
    """config_hash hashes the whole config, results_dir included: two results folders of one config
    differ in it whatever they ran, so compare shows it but never lists it as a difference."""
    a, b = tmp_path / "a", tmp_path / "b"
    synthetic_results(a, n_runs=12, n_steps=5)
    runs = pd.read_parquet(a / "metrics.parquet").assign(config_hash="aaaa")
    runs.to_parquet(a / "metrics.parquet")
    shutil.copytree(a, b)
    runs.assign(config_hash="bbbb").to_parquet(b / "metrics.parquet")
    build_compare(a, b, tmp_path / "out")
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "- provenance differs in: nothing (same versions, devices, commit)" in md, md
    assert "| config | config_hash | aaaa | bbbb | not compared: it hashes the whole config, results_dir included" in md


def test_names_from_the_results_are_escaped_in_every_format(tmp_path):
    """A model named like markup stays text: compare.md escapes it as compare.html does (a Markdown renderer
    shows raw HTML as HTML)."""
    a, b = tmp_path / "a", tmp_path / "b"
    synthetic_results(a, n_runs=6, n_steps=3)
    runs = pd.read_parquet(a / "metrics.parquet")
    runs["model"] = "<script>alert(1)</script>"
    runs.to_parquet(a / "metrics.parquet")
    shutil.copytree(a, b)
    build_compare(a, b, tmp_path / "out")
    for name in ("compare.md", "compare.html"):
        text = (tmp_path / "out" / name).read_text()
        assert "<script>alert(1)" not in text and "&lt;script&gt;alert(1)" in text, name
