"""The levers as sweep axes, with real torchrun/gloo runs: activation checkpointing, gradient
accumulation, DDP bucket size; CPU offload and fp8 end as skipped rows on a CPU."""
import numpy as np
import pytest
import torch


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("micro_batch", [1, 4])
def test_what_the_step_holds_outside_the_blocks_is_predicted(precision, micro_batch):
    """Issue #14: the forward returns the loss alone, so nothing holds the logits through
    backward. Outside the blocks the saved-tensor meter (saved for backward + returned)
    measures exactly the prediction; the step's activation peak, measured by torch's
    MemTracker (live tensors on CPU), is the prediction (blocks + outside + the loss path's
    8 B T V of fp32 gradients at log_softmax's backward) within the blocks' small terms."""
    from scalelab.config import ModelConfig
    from scalelab.formulas import activation_memory, peak_memory
    from scalelab.formulas.rank_step import RankStep
    from scalelab.run.activations import SavedActivationMeter
    from scalelab.run.model import GPT
    from scalelab.run.precision import autocast

    cfg, cpu = ModelConfig(2, 64, 4, 64, True, 256), torch.device("cpu")
    tokens = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len + 1), generator=torch.Generator().manual_seed(0))
    chunk = tokens[:micro_batch]  # as in train_step: a micro-batch of the rank's token batch
    torch.manual_seed(0)
    model = GPT(cfg)
    with SavedActivationMeter(model, model.blocks) as meter, autocast(precision, cpu):
        loss = model(chunk[:, :-1], chunk[:, 1:])
    assert loss.dim() == 0
    assert meter.outside_blocks == activation_memory.outside_block_activation_bytes(cfg, micro_batch, precision, 4 // micro_batch)
    del loss
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    tracker = mem_tracker.MemTracker()
    tracker.track_external(model)
    with tracker:
        with autocast(precision, cpu):
            loss = model(chunk[:, :-1], chunk[:, 1:])
        loss.backward()
        del loss
    peak = tracker.get_tracker_snapshot("peak")[cpu]
    kinds = mem_tracker._MemRefType
    measured = peak["Total"] - peak[kinds.PARAM] - peak[kinds.GRAD] - peak[kinds.OPT]
    predicted = peak_memory.peak_memory(cfg, 1, RankStep(precision, 0, 1, micro_batch, 4 // micro_batch,
                                                                device_type="cpu")).activations
    assert abs(predicted - measured) / measured < 0.01, (measured, predicted)
    # the former prediction counted 2 x 4 B T V for everything outside the blocks
    former = activation_memory.block_activation_bytes(cfg, micro_batch, precision, False) + 8 * micro_batch * cfg.seq_len * cfg.vocab_size
    assert (measured - former) / measured > 0.1


# ----------------------------------------------------------------------------- the levers in the report
# (read from synthetic results: no training)

def test_every_lever_shows_its_own_evidence_and_no_other(tmp_path):
    """The fixtures vary every lever of the registry; each lever's pairs carry the columns its
    EVIDENCE entry declares (and no other lever's), computed from the pair."""
    import pandas as pd

    from devtools.fixtures import synthetic_results
    from scalelab.planning.sweep import LEVER_AXES
    from scalelab.report.levers import EVIDENCE, PAIR_COLUMNS, lever_table

    synthetic_results(tmp_path, n_runs=96, n_steps=5)
    runs = pd.read_parquet(tmp_path / "metrics.parquet")
    table = lever_table(runs)
    assert sorted(table["lever"].unique()) == sorted(LEVER_AXES)
    ok = table[(table["status"] == "ok") & table["reason"].isna()]  # both runs of the pair ended ok
    for lever in LEVER_AXES:
        rows = ok[ok["lever"] == lever]
        own = [*PAIR_COLUMNS, *EVIDENCE.get(lever, {})]
        others = {c for name, cols in EVIDENCE.items() if name != lever for c in cols} - set(own)
        # a pipeline's activations are its stages' (its own evidence), not one micro-batch's on rank 0
        measured_once = {"activation_mib_measured", "baseline_activation_mib_measured"} if lever.startswith("pipeline") else set()
        assert len(rows) and rows[[c for c in own if c not in measured_once]].notna().all().all(), lever
        assert rows[sorted(others)].isna().all().all(), lever
    ac = ok[ok["lever"] == "activation_checkpointing"]
    np.testing.assert_allclose(ac["step_time_ratio_predicted"], 1 + 2.3e5 / 7e5)  # the fixture's recompute FLOPs
    lora = ok[ok["lever"] == "lora_rank"].merge(runs, on="run_id")
    np.testing.assert_allclose(lora["trainable_fraction"], lora["n_trainable_params"] / lora["n_params"])
    assert (lora["model_state_mib"] < lora["baseline_model_state_mib"]).all()


def test_twin_table_follows_the_precision_records(tmp_path):
    """fp8 runs beside their bf16 twins because fp8's record names bf16 as its twin."""
    import pandas as pd

    from devtools.fixtures import synthetic_results
    from scalelab.registries.precisions import PRECISIONS
    from scalelab.report.levers import fp8_table

    synthetic_results(tmp_path, n_runs=192, n_steps=5)
    runs = pd.read_parquet(tmp_path / "metrics.parquet")
    assert fp8_table(runs).empty, "no fp8 run, no table"
    twin = PRECISIONS["fp8"].twin
    bf16 = runs[(runs["precision"] == twin) & (runs["status"] == "ok")]
    fp8 = bf16.assign(precision="fp8", run_id=bf16["run_id"].str.replace(twin, "fp8"), tokens_per_s=bf16["tokens_per_s"] * 1.5)
    table = fp8_table(pd.concat([runs, fp8], ignore_index=True))
    assert len(table) == len(fp8) and list(table[f"run_id_{twin}"]) == list(bf16["run_id"])
    np.testing.assert_allclose(table[f"speedup_over_{twin}"], 1.5)


def test_psi_figure_draws_every_strategy_record():
    from scalelab.registries.strategies import STRATEGIES
    from scalelab.report import psi

    assert psi.STAGES == tuple(STRATEGIES)
