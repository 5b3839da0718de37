"""LoRA as a lever and the model-size axis: the adapter itself (in process), the formulas, the
sweep axes, and real torchrun/gloo runs at every stage (model state and communication against
the LoRA formulas, first-step loss equal to the full-training twin's)."""
import re

import pytest

from support import tiny_config


@pytest.mark.workflow(cost_s=65)  # measured 129 s under load; the order `make test` hands out work
def test_lora_and_model_sizes_end_to_end(tmp_path):
    """A Snakemake sweep over two model shapes x full/LoRA: every run ok, the LoRA rows within 5%
    of their model-state formula, the report pairs each LoRA run with its twin and draws memory vs Psi."""
    import pyarrow.parquet as pq

    from support import snakemake, write_workdir

    cfg = tiny_config(train={"steps": 4, "warmup_steps": 1}, planning={"device_memory_gib": 1},
                      models={"small": {"n_layers": 1, "d_model": 16, "n_heads": 2}},
                      sweep={"zero_stage": [0, 3], "world_size": [2], "model": ["base", "small"], "lora_rank": [None, 8]})
    workdir = write_workdir(tmp_path, cfg)
    snakemake(workdir, "--cores", "2")
    runs = pq.read_table(tmp_path / "results/metrics.parquet").to_pandas().set_index("run_id")
    assert len(runs) == 8 and (runs["status"] == "ok").all(), runs[["status", "reason"]]
    assert set(runs["model"]) == {"base", "small"} and runs["n_params"].nunique() == 4
    lora = runs[runs["lora_rank"].notna()]
    assert sorted(lora.index) == ["fp32-z0-w2-lora8", "fp32-z0-w2-small-lora8", "fp32-z3-w2-lora8", "fp32-z3-w2-small-lora8"]
    rel = (lora["model_state_bytes_measured"] / lora["model_state_bytes_predicted"] - 1).abs()
    assert (rel < 0.05).all(), rel
    steps = pq.read_table(tmp_path / "results/steps.parquet").to_pandas()
    first = steps[steps["step"] == 0].set_index("run_id")["loss"]
    for run_id in lora.index:  # LoRA starts from its twin's weights
        assert first[run_id] == first[run_id.removesuffix("-lora8")]
    html = (tmp_path / "results/report/report.html").read_text()
    assert "id='levers'" in html and "lora_rank" in html and "model_state_mib_predicted" in html
    for run_id in lora.index:
        for cell in (run_id, run_id.removesuffix("-lora8")):  # a table cell holding the run id (cells carry a class)
            assert re.search(rf"<td[^>]*>{re.escape(cell)}</td>", html), cell
    assert "<figure id='memory_vs_psi'>" in html
    assert (tmp_path / "results/report/figures/memory_vs_psi.png").stat().st_size > 1000
