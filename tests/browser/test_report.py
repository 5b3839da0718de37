"""Collection, plots and the report, from Parquet fixtures alone (no training)."""
from pathlib import Path

import pandas as pd
import pytest

from scalelab.harness.screenshot import chromium, screenshot
from scalelab.report.report import build_report
from support.report import _laid_out


def _open_in_chromium(html: Path, shot: Path) -> str:
    return screenshot(html, shot, height=3000)  # Chromium's log: its console lines


def _console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "CONSOLE" in line and ("rror" in line or "Uncaught" in line)]






@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (apt-get install chromium; `make browser`)")
def test_report_opens_in_headless_chromium_without_console_errors(fixture_results, tmp_path):
    html = build_report(fixture_results)
    # Control: a page that does log an error must be caught, or the check below proves nothing.
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('deliberate error'); undefinedFunction();</script></body></html>")
    assert _console_errors(_open_in_chromium(bad, tmp_path / "bad.png")), "the console check cannot see errors"
    log = _open_in_chromium(html, tmp_path / "report.png")
    assert not _console_errors(log), _console_errors(log)
    # As laid out: the best configuration first, in the first screenful, before warnings and figures;
    # the run table scrolls inside its box (the page itself does not overflow sideways).
    shown = _laid_out(html, tmp_path)
    assert shown["first_h2"] == "Best configuration per world size"
    assert 0 < shown["best"] < shown["best_table"] < 600 and shown["best_table"] < shown["warnings"] < shown["figures"], shown
    runs = pd.read_parquet(fixture_results / "metrics.parquet")
    ok = runs[runs["status"] == "ok"]
    fastest = ok.loc[ok.groupby("world_size")["tokens_per_s"].idxmax()].set_index("world_size")
    assert [(int(r[0]), r[1]) for r in shown["best_rows"]] == [(int(ws), fastest.loc[ws, "run_id"]) for ws in sorted(runs["world_size"].unique())]
    scroll_width, width, scroll_height, height = shown["run_table"]
    assert scroll_width > width and scroll_height > height, "the run table scrolls within its box"
    assert shown["page"][0] <= shown["page"][1], f"the page overflows sideways: {shown['page']}"
    # At 1400 px, the run table shows every column a reader looks up first without scrolling sideways:
    # the run, its status, the axes that vary, throughput, memory, loss (it showed 13 of 23 columns).
    wide = _laid_out(html, tmp_path, width=1400)
    visible = [name for name, seen in wide["run_columns"] if seen]
    from scalelab.planning.sweep import SWEEP_AXES
    from scalelab.report.report import KEY_COLUMNS, _fmt_table

    table = _fmt_table(runs)
    assert [name for name, _ in wide["run_columns"]] == list(table.columns)
    varying = [c for c in SWEEP_AXES if table[c].nunique(dropna=False) > 1]
    assert set(["run_id", "status", *varying, *KEY_COLUMNS]) <= set(visible), (len(visible), len(table.columns), visible)
    # The header says what was trained, right under the title, before the best configuration.
    assert wide["trained"] and wide["trained"][0] < shown["best"] and "parameters" in wide["trained"][1], wide["trained"]
