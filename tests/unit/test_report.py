"""Collection, plots and the report, from Parquet fixtures alone (no training)."""
import html as html_lib
import json
import re
from pathlib import Path

import jinja2
import markupsafe
import pandas as pd
import pyarrow.parquet as pq
import pytest
from docutils.core import publish_parts

from devtools.fixtures import FAILURES, synthetic_results
from scalelab.io import write_json
from scalelab.planning.columns import SCHEMA_VERSION
from scalelab.planning.result_tables import schema_version, steps_table, write_parquet
from scalelab.planning.sweep import RunPoint
from scalelab.report.figures import FIGURES, FIGURES_DIR, rst_captions
from scalelab.report.report import build_report
from scalelab.results.collect import collect
from support import REPO

MAIN = [f for f in FIGURES if f.kind == "main"]


def _escaped(text: str) -> str:
    """Text as the report's Jinja2 templates write it (autoescape)."""
    return str(markupsafe.escape(text))


LEVER = [f for f in FIGURES if f.kind == "lever"]


def _lever_varies(runs: pd.DataFrame, figure) -> bool:
    return runs[figure.varies].nunique() > 1


def _check_figures(results: Path, html: str, runs: pd.DataFrame) -> list[str]:
    """Every main figure, and each lever figure exactly when its lever varies: files written and
    non-trivial, PNG embedded, caption shown once; the others absent. Returns the names drawn."""
    fig_dir = results / "report" / FIGURES_DIR
    drawn = []
    for figure in FIGURES:
        expected = figure.applies(runs)  # a lever figure while its lever varies; loss_scale with an fp16 run
        for file in figure.files:
            assert (fig_dir / file).exists() == expected, (file, expected)
            if expected:
                assert (fig_dir / file).stat().st_size > 1000, file
        assert html.count(_escaped(figure.caption)) == int(expected), figure.name
        assert (f"<figure id='{figure.name}'>" in html) == expected, figure.name
        drawn += [figure.name] if expected else []
    assert html.count("data:image/png;base64,") == len(drawn), "every figure embedded, once"
    assert sorted(p.name for p in fig_dir.iterdir()) == sorted(
        file for figure in FIGURES if figure.name in drawn for file in figure.files), "nothing else in the folder"
    return drawn


def test_report_from_parquet_alone(tmp_path):
    fixture_results = tmp_path
    synthetic_results(fixture_results, n_runs=96, n_steps=40)  # 24 baseline runs + 72 lever variants, every lever
    html_path = build_report(fixture_results)
    html = html_path.read_text()
    runs = pd.read_parquet(fixture_results / "metrics.parquet")
    drawn = _check_figures(fixture_results, html, runs)
    # The fixture varies every lever: each lever figure is drawn (test_lever_figures_only_while_their_lever_varies
    # checks the other case).
    assert {f.name for f in LEVER} <= set(drawn)
    assert any(len(f.files) > 1 for f in FIGURES if f.name in drawn), "an SVG among them"
    for run_id in runs["run_id"]:
        assert re.search(rf">{re.escape(run_id)}<", html), f"{run_id} not in the run table"
    # Main figures compare the baseline runs; each lever run is set against its baseline twin.
    # 24 fp32 baselines, and the fp16 twins of the grad_reduce runs (a lever no fp32 run takes)
    twins = runs["run_id"].str.fullmatch(r"fp16-z\d-w\d+").sum()
    hybrid = int((runs["replicas"] > 1).sum())  # drawn as a strategy of their own beside ZeRO-3
    assert twins and hybrid and (f"These figures show the {24 + twins + hybrid} runs with every lever at its default but "
                                 f"hybrid sharding's replicas ({hybrid} hybrid run(s)") in html
    assert re.search(r">fp32-z0-w2-ac<.*?>fp32-z0-w2<", html, re.S), "AC run paired with its baseline"
    assert "step_time_ratio_predicted" in html and "all_reduce_calls_predicted" in html
    assert "src='report/" not in html and "src=\"" not in html, "no external images"
    for status, reason in FAILURES.values():
        assert status in html and reason.split(":")[0] in html
    summary = (fixture_results / "report" / "summary.md").read_text()
    assert "| run_id |" in summary and "## Warnings" in summary


def test_lever_figures_only_while_their_lever_varies(tmp_path):
    synthetic_results(tmp_path, n_runs=96, n_steps=20)
    build_report(tmp_path)
    runs = pd.read_parquet(tmp_path / "metrics.parquet")
    assert any(_lever_varies(runs, f) for f in LEVER)
    # The same folder rebuilt from the baseline runs alone: no lever varies, no lever figure
    # (not even the files of the earlier build), no Levers section.
    base = runs[runs["run_id"].str.fullmatch(r"(fp32|fp16|bf16)-z\d-w\d+")]
    assert 0 < len(base) < len(runs) and not any(_lever_varies(base, f) for f in LEVER)
    base.to_parquet(tmp_path / "metrics.parquet")
    html = build_report(tmp_path).read_text()
    assert _check_figures(tmp_path, html, base) == [f.name for f in MAIN]
    assert "id='levers'" not in html


@pytest.fixture(scope="module")
def fixture_report(tmp_path_factory) -> str:
    """The HTML of conftest's fixture_results (30 runs of 40 steps), built once for the tests that only read it."""
    from devtools.fixtures import synthetic_results

    results = tmp_path_factory.mktemp("fixture_report")
    synthetic_results(results, n_runs=30, n_steps=40)
    return build_report(results).read_text()


def test_memory_peak_note_follows_its_caption(fixture_report):
    html = fixture_report  # CPU fixture: no GPU runs
    caption = _escaped(next(f.caption for f in FIGURES if f.name == "memory_peak"))
    assert re.search(re.escape(caption) + r" <em>No GPU runs in these results: process peak RSS", html)


def test_snakemake_caption_template_renders_every_caption():
    """workflow/report/figure.rst as Snakemake's report renders it (Jinja2, then docutils), for
    each figure: the registry's caption comes out whole, with no reStructuredText complaint."""
    template = jinja2.Environment().from_string((REPO / "workflow/report/figure.rst").read_text())
    captions = rst_captions()
    for figure in FIGURES:
        class Snakemake:
            params = {"captions": captions}
            wildcards = {"name": figure.name}
        rst = template.render(snakemake=Snakemake)
        out = publish_parts(rst, writer="html", settings_overrides={"report_level": 1})["body"]
        assert "system-message" not in out, out
        assert html_lib.escape(figure.caption, quote=False) in out.replace("&quot;", '"'), (figure.name, out)


def test_readme_figure_table_lists_the_registry():
    rows = re.findall(r"^\| `(\w+)` \| (main|lever) \|", (REPO / "docs" / "guide.md").read_text(), flags=re.M)
    assert rows == [(f.name, f.kind) for f in FIGURES]


def test_report_warns_on_mfu_memory_and_parity(fixture_results):
    runs = pd.read_parquet(fixture_results / "metrics.parquet")
    ok = runs.index[runs["status"] == "ok"]
    runs.loc[ok[0], "mfu"] = 1.7
    runs.loc[ok[1], "model_state_bytes_measured"] = int(runs.loc[ok[1], "model_state_bytes_predicted"] * 1.5)
    runs.loc[ok[2], ["mfu", "peak_flops_source"]] = [float("nan"), "unknown GPU 'NVIDIA Foo 9000': set train.peak_tflops"]
    runs.loc[ok[3], ["device_type", "device_name"]] = ["cuda", "NVIDIA H100 80GB HBM3"]
    runs.loc[ok[4], "teardown_warning"] = "a rank exited abnormally after the results were written (torchrun exit code 1)"
    runs.to_parquet(fixture_results / "metrics.parquet")
    steps = pd.read_parquet(fixture_results / "steps.parquet")
    fp32 = steps.index[(steps["precision"] == "fp32") & (steps["step"] == 5)]
    steps.loc[fp32[0], "loss"] += 0.5
    steps.to_parquet(fixture_results / "steps.parquet")
    html = build_report(fixture_results).read_text()
    assert f"{runs.loc[ok[0], 'run_id']}: MFU 1.70 is above 100%" in html
    assert f"{runs.loc[ok[1], 'run_id']}: measured model state" in html
    assert "fp32 parity broken" in html
    assert f"{runs.loc[ok[2], 'run_id']}: MFU unknown: unknown GPU &#39;NVIDIA Foo 9000&#39;: set train.peak_tflops" in html
    assert f"{runs.loc[ok[4], 'run_id']}: a rank exited abnormally after the results were written" in html
    assert "this sweep mixes devices" in html and f"cuda: NVIDIA H100 80GB HBM3 (1 run(s), e.g. {runs.loc[ok[3], 'run_id']})" in html


def _fake_run(runs_root: Path, precision: str, stage: int, ws: int, status="ok"):
    point = RunPoint(precision, stage, ws)
    run_dir = runs_root / point.path
    identity = point.identity(micro_batch=4)
    records = [{"step": s, "loss": 5.0 - s, "grad_norm": 1.0, "lr": 1e-3, "loss_scale": None, "skipped": False,
                "step_time_s": 0.01, "tokens": 512} for s in range(3)]
    write_parquet(steps_table(identity, records), run_dir / "steps.parquet")
    write_json(run_dir / "summary.json", {**identity, "status": status, "reason": None, "tokens_per_s": 1.0})
    write_json(run_dir / "point.json", point.to_json())  # as the launcher writes it, first
    return run_dir


def test_collect_reports_bad_files_by_name_and_keeps_the_rest(tmp_path):
    runs_root = tmp_path / "runs"
    _fake_run(runs_root, "fp32", 0, 1)
    _fake_run(runs_root, "bf16", 0, 1, status="oom")
    corrupt = _fake_run(runs_root, "fp16", 0, 1)
    (corrupt / "summary.json").write_text('{"run_id": "fp16-z0-w1", "sta')  # torn write from another tool
    no_steps = _fake_run(runs_root, "fp32", 1, 2)
    (no_steps / "steps.parquet").unlink()
    bad_parquet = _fake_run(runs_root, "fp32", 3, 2)
    (bad_parquet / "steps.parquet").write_bytes(b"PAR1 not really")
    mistyped = _fake_run(runs_root, "bf16", 3, 2)
    summary = json.loads((mistyped / "summary.json").read_text())
    (mistyped / "summary.json").write_text(json.dumps({**summary, "mfu": "n/a"}))  # another tool's idea of a number
    result = collect(tmp_path)
    joined = "\n".join(result["problems"])
    assert str(corrupt / "summary.json") in joined and "corrupt" in joined
    assert str(no_steps / "steps.parquet") + ": missing" in joined
    assert str(bad_parquet / "steps.parquet") in joined
    assert str(mistyped / "summary.json") + ": corrupt (mfu='n/a' (expected double))" in joined
    runs = pd.read_parquet(tmp_path / "metrics.parquet").set_index("run_id")
    assert runs.loc["fp16-z0-w1", "status"] == "corrupt"
    assert runs.loc["bf16-z3-w2", "status"] == "corrupt" and "mfu='n/a'" in runs.loc["bf16-z3-w2", "reason"]
    assert runs.loc["bf16-z0-w1", "status"] == "oom"
    assert runs.loc["fp32-z1-w2", "steps_problem"] == "steps.parquet is missing"
    assert runs.loc["fp32-z3-w2", "steps_problem"].startswith("steps.parquet is corrupt")
    assert len(runs) == 6
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert sorted(steps["run_id"].unique()) == ["bf16-z0-w1", "bf16-z3-w2", "fp32-z0-w1"]
    html = build_report(tmp_path).read_text()
    assert "fp32-z1-w2: steps.parquet is missing: its steps are in no figure or table" in html
    assert schema_version(tmp_path / "metrics.parquet") == SCHEMA_VERSION == schema_version(tmp_path / "steps.parquet")
    assert pq.read_schema(tmp_path / "steps.parquet").field("zero_stage").type == "int8"


def test_spikes_peaks_and_the_cpu_notice_in_report_and_summary(fixture_results):
    """A loss spike every run shares, one run's grad-norm jump and one run's peak out of line appear in
    the warnings of report.html and summary.md; a CPU sweep opens with the CPU notice and carries the
    note beside best configuration, a GPU sweep has neither."""
    steps = pd.read_parquet(fixture_results / "steps.parquet")
    runs = pd.read_parquet(fixture_results / "metrics.parquet")
    at20 = steps["step"] == 20
    steps.loc[at20, ["loss", "grad_norm"]] *= [3.0, 400.0]
    jumper = steps.loc[at20, "run_id"].iloc[0]
    steps.loc[(steps["run_id"] == jumper) & (steps["step"] == 30), "grad_norm"] = 50.0
    steps.to_parquet(fixture_results / "steps.parquet")
    ok = runs.index[(runs["status"] == "ok") & (runs["precision"] == "fp32")]
    runs.loc[ok, "peak_flops_per_device"] = 1e11
    runs.loc[ok[2], ["peak_flops_per_device", "mfu"]] = [5e10, 2 * runs.loc[ok[2], "mfu"]]
    runs.to_parquet(fixture_results / "metrics.parquet")
    with_steps = steps.loc[at20, "run_id"].nunique()
    spike = f"loss spike at step 20 in all {with_steps} runs ("
    jump = f"{jumper}: grad-norm jump at step 30: grad norm 50 against a median of"
    peak = f"{runs.loc[ok[2], 'run_id']}: peak 5e+10 FLOP/s (synthetic) is 50% below the median 1e+11 of the"

    html = build_report(fixture_results).read_text()
    summary = (fixture_results / "report" / "summary.md").read_text()
    warnings, md_warnings = html[html.index('id="warnings"'):html.index('id="figures"')], summary[summary.index("## Warnings"):]
    for line in (spike, jump, peak):
        assert _escaped(line) in warnings and f"- {line}" in md_warnings, line
    assert warnings.count("loss spike at step 20") == 1, "one line for the spike all runs share"
    notice = "CPU results: 29 of the 30 runs trained on a CPU (synthetic, "  # run 7 was skipped
    assert html.index('id="cpu-notice"') < html.index(notice) < html.index("Best configuration per world size") < html.index("Fastest on this CPU (synthetic")
    assert summary.index("> " + notice) < summary.index("## Best configuration") < summary.index("Fastest on this CPU") < summary.index("## Runs")

    runs.assign(device_type="cuda", device_name="NVIDIA H100 80GB HBM3", backend="nccl").to_parquet(fixture_results / "metrics.parquet")
    html = build_report(fixture_results).read_text()
    summary = (fixture_results / "report" / "summary.md").read_text()
    for text in (html, summary):
        assert "CPU results" not in text and "Fastest on this CPU" not in text and "id=\"cpu-notice\"" not in text
    assert _escaped(spike) in html, "the warnings stay"


def test_best_configuration_first_in_report_and_summary(fixture_results):
    runs = pd.read_parquet(fixture_results / "metrics.parquet")
    runs.loc[runs["run_id"] == "fp32-z0-w4", ["status", "reason", "tokens_per_s"]] = [
        "predicted_oom", "predicted peak 90 GiB per rank exceeds the device memory 80 GiB; not launched", None]
    runs.to_parquet(fixture_results / "metrics.parquet")
    html = build_report(fixture_results).read_text()
    assert html.index("Best configuration per world size") < html.index("Warnings") < html.index("<figure")
    section = html[html.index("id='best-table'") if "id='best-table'" in html else html.index('id="best-table"'):html.index("Warnings")]
    ok = runs[runs["status"] == "ok"]
    for ws, here in ok.groupby("world_size"):
        best = here.loc[here["tokens_per_s"].idxmax()]
        row = re.search(rf"<tr><td class=\"num\">{ws}</td>(.*?)</tr>", section, re.S)
        assert row and f">{best['run_id']}<" in row.group(1), (ws, best["run_id"])
        assert f">{best['tokens_per_s']:,.0f}<" in row.group(1) and f">{best['tokens_per_s'] / ws:,.0f}<" in row.group(1)
    not_fit = re.search(r"<tr><td class=\"num\">4</td>(.*?)</tr>", section, re.S).group(1)
    assert "fp32-z0-w4 (predicted_oom)" in not_fit
    assert "fp32-z0-w8 (oom)" in section  # the fixture's injected OOM
    summary = (fixture_results / "report" / "summary.md").read_text()
    assert summary.index("## Best configuration per world size") < summary.index("## Runs") < summary.index("## Warnings")
    assert "| 4 | " in summary and "fp32-z0-w4 (predicted_oom)" in summary


def test_run_table_numbers_formatted_per_column(fixture_report):
    html = fixture_report
    table = html[html.index('id="run-table"'):]
    table = table[:table.index("</table>")]
    header = re.findall(r"<th[^>]*>(.+?)</th>", table.replace("<wbr>", ""))
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]]
    assert not re.search(r"\de[+-]\d", table), "no scientific notation in the run table"
    column = {name: [row[i] for row in rows if row[i]] for i, name in enumerate(header)}
    assert all(re.fullmatch(r"\d{1,3}(,\d{3})*", v) for v in column["tokens_per_s"]), column["tokens_per_s"][:5]
    assert all(re.fullmatch(r"\d\.\d{3}", v) for v in column["mfu"] + column["scaling_efficiency"])
    assert all(re.fullmatch(r"\d+\.\d{2}", v) for v in column["model_state_mib_measured"])
    assert re.search(r'<th class="num" title="throughput[^"]*\[tokens/s\]">tokens_<wbr>per_<wbr>s</th>', table), "unit in the header's title"


def test_run_table_shows_every_sweep_axis(fixture_results):
    """The run table's axis columns are the registry's: a LoRA run and its full twin, or a compiled
    run and its eager one, differ in a column, not by id alone."""
    from scalelab.planning.sweep import SWEEP_AXES
    from scalelab.report.report import _fmt_table

    table = _fmt_table(pd.read_parquet(fixture_results / "metrics.parquet")).set_index("run_id")
    assert set(SWEEP_AXES) <= set(table.columns), "every axis, those that vary first, those every run shares later"
    for variant, axis, value in (("fp32-z0-w1-lora4", "lora_rank", 4), ("fp32-z0-w1-compiled", "compile", True)):
        assert table.loc[variant, axis] == value and table.loc["fp32-z0-w1", axis] != value, axis
        assert table.loc[variant, "model"] == table.loc["fp32-z0-w1", "model"] == "base"


def test_an_empty_sweep_gives_a_clear_no_runs_report(tmp_path):
    (tmp_path / "runs").mkdir()
    assert collect(tmp_path)["runs"] == 0
    html = build_report(tmp_path).read_text()
    assert "No runs in" in html and "metrics.parquet has no rows" in html
    assert "No runs in" in (tmp_path / "report" / "summary.md").read_text()


def test_a_failed_report_build_leaves_the_last_complete_report(tmp_path, monkeypatch):
    synthetic_results(tmp_path, n_runs=8, n_steps=5)
    build_report(tmp_path)
    before = (tmp_path / "report" / "report.html").read_text()

    def broken(*args, **kwargs):
        raise RuntimeError("a figure failed")

    # One figure fails while the others are drawn (by forked processes where there are cores for them).
    monkeypatch.setattr("scalelab.report.plots.throughput", broken)
    for workers in (1, 2):
        with pytest.raises(RuntimeError, match="a figure failed"):
            build_report(tmp_path, workers=workers)
    assert (tmp_path / "report" / "report.html").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".report")) == [], "no partial folder left"


def test_data_dictionary_in_the_parquet_metadata_and_the_docs(fixture_results, tmp_path):
    """One column table (scalelab.planning.columns): every column of both tables has a unit, a meaning, a
    writer and a null contract, written into the files' field metadata; the report's dictionary and
    docs/data-dictionary.md (tests/*/test_columns.py) are generated from it."""
    from scalelab.planning.columns import RUN_SCHEMA, STEP_SCHEMA
    from scalelab.report import dictionary

    assert list(dictionary.run_columns()) == RUN_SCHEMA.names and list(dictionary.step_columns()) == STEP_SCHEMA.names
    for name, schema in (("metrics.parquet", RUN_SCHEMA), ("steps.parquet", STEP_SCHEMA)):
        written = pq.read_schema(fixture_results / name)
        for field in schema:
            meta = written.field(field.name).metadata
            assert meta and meta[b"unit"] and len(meta[b"description"]) > 10 and meta[b"writer"] and meta[b"filled"], \
                (name, field.name)
            assert meta == field.metadata
    # collect() writes the same metadata
    _fake_run(tmp_path / "runs", "fp32", 0, 1)
    collect(tmp_path)
    assert pq.read_schema(tmp_path / "metrics.parquet").field("mfu").metadata[b"unit"] == b"fraction"
    assert pq.read_schema(tmp_path / "steps.parquet").field("step_time_s").metadata[b"unit"] == b"s"
