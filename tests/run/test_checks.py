"""Warnings a reader would miss (loss spikes, grad-norm jumps, peaks out of line) and the CPU notice:
scalelab.report.checks on step and run tables made here, on the default sweep's recorded steps, and
on one real run that spikes."""
import re

import pytest
import yaml

from support import REPO, run_point


def test_a_real_loss_spike_from_a_config_is_in_the_reports_warnings(tmp_path):
    """One world-size-1 fp32 run of the default config.yaml with a 4-layer model (seed 1) spikes at step
    24: loss 2.9 -> 9.55, grad norm 0.7 -> 84, back at step 25. (The issue's sweep saw the same at step
    15 with seed 0; at this commit seed 0 trains through without one, seed 1 reproduces the effect.)"""
    from scalelab.config import dataset_config
    from scalelab.planning.sweep import RunPoint
    from scalelab.report.report import build_report
    from scalelab.results.collect import collect
    from scalelab.run.data import prepare_dataset

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["model"]["n_layers"] = 4
    cfg["train"].update(seed=1, device="cpu", measure_s=0)  # the steps alone: timing steps past them record no loss
    data = tmp_path / "data"
    prepare_dataset(dataset_config(cfg), data, seq_len=cfg["model"]["seq_len"])
    _, steps, _ = run_point(tmp_path / "runs", data, RunPoint("fp32", 0, 1), cfg=cfg)
    jump = steps["loss"].to_numpy()[1:] / steps["loss"].to_numpy()[:-1]
    assert jump.max() > 2, f"no spike in this run (largest step-to-step ratio {jump.max():.2f}): the reproduction is gone"
    collect(tmp_path)
    build_report(tmp_path)
    html = (tmp_path / "report" / "report.html").read_text()
    summary = (tmp_path / "report" / "summary.md").read_text()
    warnings = html[html.index('id="warnings"'):html.index('id="figures"')]
    found = re.search(r"<li>(fp32-z0-w1: loss spike at step (\d+): loss ([\d.]+) against [^<]*back at step (\d+))</li>", warnings)
    assert found, warnings
    step = int(found.group(2))
    assert float(found.group(3)) == pytest.approx(steps.loc[steps["step"] == step, "loss"].iloc[0], rel=1e-2)
    assert int(found.group(4)) == step + 1
    assert f"- {html_unescape(found.group(1))}" in summary[summary.index("## Warnings"):]


def html_unescape(text: str) -> str:
    import html

    return html.unescape(text)
