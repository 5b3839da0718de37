"""Pipeline parallelism in the report: the traced step read from the chosen run's folder when the report is built,
and the formulas section's pipeline line, its words held to scalelab.formulas.pipeline. (The figures themselves
are checked against the tables in test_figures.py.)"""
import json

import pandas as pd
import pytest

from devtools.fixtures import synthetic_results
from scalelab.formulas import pipeline
from scalelab.report.formula_section import formulas_html
from scalelab.report.report import build_report


def test_the_report_draws_the_traced_step_from_the_runs_folder(tmp_path):
    """build_report hands its results folder to the figures: the timeline of the one pipeline run of a small sweep,
    written by the worker's own record (timeline_record) into that run's folder, is drawn and named in its note."""
    from scalelab.formulas.pipeline import TIMELINE_FILE
    from scalelab.run.pipeline import timeline_record

    synthetic_results(tmp_path, n_runs=36, n_steps=5)
    runs = pd.read_parquet(tmp_path / "metrics.parquet")
    (run_id,) = runs.loc[(runs["pipeline_parallel"] > 1) & (runs["status"] == "ok"), "run_id"]
    stages = [{"pp_rank": k, "timeline": [("F", k, 0, 0.001 * k, 0.002 + 0.001 * k), ("B", k, 0, 0.004, 0.006)]} for k in range(2)]
    (tmp_path / "runs" / run_id).mkdir(parents=True, exist_ok=True)
    (tmp_path / "runs" / run_id / TIMELINE_FILE).write_text(json.dumps(timeline_record(stages, "1f1b", 4)))
    html = build_report(tmp_path, workers=1).read_text()
    assert f"The traced step of {run_id} (runs/{run_id}/{TIMELINE_FILE})." in html
    assert "<figure id='lever_pipeline_bubble'>" in html and "<figure id='lever_pipeline_timeline'>" in html
    assert html.count("<b>Pipeline</b>") == 1


def _runs(pp=(1, 2), schedules=("1f1b", "gpipe")):
    return pd.DataFrame({"model_family": "gpt2", "zero_stage": 0, "replicas": 1, "lora_rank": None, "status": "ok",
                         "pipeline_parallel": list(pp), "pipeline_schedule": list(schedules)})


def test_the_formulas_section_has_a_pipeline_line_where_the_sweep_pipelined():
    assert "<b>Pipeline</b>" not in formulas_html(_runs(pp=(1, 1)))
    assert "<b>Pipeline</b>" not in formulas_html(_runs().drop(columns=["pipeline_parallel"]))  # results from before it
    text = formulas_html(_runs(pp=(2, 4), schedules=("interleaved_1f1b", "1f1b")))
    assert "this sweep: 1f1b (V = 1), interleaved_1f1b (V = 2)" in text
    for words in ("(P − 1)/(V m + P − 1)", "min(m, P − i)", "(V − 1)·r + 2·(P − 1 − i) + 1", "at most V·m",
                  "m·b·s·h values sent and as many received; a middle stage twice that"):
        assert words in text, words


@pytest.mark.parametrize("pp, m", [(2, 2), (2, 4), (4, 4), (4, 8), (4, 12)])
def test_the_pipeline_lines_words_are_the_formulas(pp, m):
    """What the line says, evaluated here, is what scalelab.formulas.pipeline computes."""
    values = 3.0  # b·s·h
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)):
        assert pipeline.bubble_fraction(pp, m, schedule) == pytest.approx((pp - 1) / (v * m + pp - 1))
        if v == 1:  # the first stage sends m and receives m; a middle stage twice that
            assert pipeline.p2p_bytes(0, pp, m, values, schedule) == {"sent": m * values, "received": m * values}
            assert pipeline.p2p_bytes(1, pp, m, values, schedule) == ({"sent": 2 * m * values, "received": 2 * m * values}
                                                                      if pp > 2 else {"sent": m * values, "received": m * values})
    r = m // max(1, m // pp)
    for i in range(pp):
        assert pipeline.in_flight(i, pp, m, "gpipe") == m
        assert pipeline.in_flight(i, pp, m, "1f1b") == min(m, pp - i)
        assert pipeline.in_flight(i, pp, m, "interleaved_1f1b") == min((2 - 1) * r + 2 * (pp - 1 - i) + 1, 2 * m)
