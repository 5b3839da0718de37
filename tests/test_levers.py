"""The levers as sweep axes, with real torchrun/gloo runs: activation checkpointing, gradient
accumulation, DDP bucket size; CPU offload and fp8 end as skipped rows on a CPU."""
import numpy as np
import pytest
import torch

from conftest import PARITY_STEPS, run_point, tiny_config
from scalelab.plan.sweep import RunPoint


@pytest.fixture(scope="module")
def plain(tmp_path_factory, tiny_data):
    """The levers' twins: fp32 at world size 2, every lever at its default, one run per stage that
    the checkpointing, accumulation and bucket tests share (fp32-z0-w2 was run three times)."""
    runs = {}

    def run(stage):
        if stage not in runs:
            runs[stage] = run_point(tmp_path_factory.mktemp(f"plain-z{stage}"), tiny_data, RunPoint("fp32", stage, 2))
        return runs[stage]
    return run


@pytest.mark.run
@pytest.mark.parametrize("stage", [0, 3])
def test_activation_checkpointing_same_losses_fewer_saved_activations(tmp_path, tiny_data, plain, stage):
    off, off_steps, _ = plain(stage)
    on, on_steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", stage, 2, activation_checkpointing=True))
    assert off["status"] == on["status"] == "ok", (off["reason"], on["reason"])
    # Recomputation repeats the same CPU kernels in the same order: the same numbers.
    assert on_steps["loss"].tolist() == off_steps["loss"].tolist()
    # Measured (autograd's saved tensors) against Korthikanti et al.'s terms for this model: 16 sbh
    # values per layer without checkpointing, the block input (sbh values) with it.
    for summary in (off, on):
        measured, predicted = summary["activation_bytes_measured"], summary["activation_bytes_predicted"]
        assert abs(measured - predicted) / predicted < 0.03, (summary["run_id"], measured, predicted)
        # the paper's formula counts the attention scores and dropout masks this model never stores
        assert summary["activation_bytes_predicted_paper"] >= predicted
        # outside the blocks (the loss path, ids; no logits held): exactly as predicted
        assert summary["activation_bytes_outside_blocks_measured"] == summary["activation_bytes_outside_blocks_predicted"]
    assert on["activation_bytes_measured"] < off["activation_bytes_measured"] / 10
    # FSDP2's hooks sit outside the checkpoint: recomputing adds no all-gather.
    assert on["comm_calls_per_step"] == off["comm_calls_per_step"]
    assert on["recompute_flops_per_token"] > 0 and on["hfu"] > on["mfu"]
    assert off["recompute_flops_per_token"] == 0 and off["hfu"] == off["mfu"]


@pytest.mark.unit
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("micro_batch", [1, 4])
def test_what_the_step_holds_outside_the_blocks_is_predicted(precision, micro_batch):
    """Issue #14: the forward returns the loss alone, so nothing holds the logits through
    backward. Outside the blocks the saved-tensor meter (saved for backward + returned)
    measures exactly the prediction; the step's activation peak, measured by torch's
    MemTracker (live tensors on CPU), is the prediction (blocks + outside + the loss path's
    8 B T V of fp32 gradients at log_softmax's backward) within the blocks' small terms."""
    from scalelab.config import ModelConfig
    from scalelab.formulas import accounting
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
    assert meter.outside_blocks == accounting.outside_block_activation_bytes(cfg, micro_batch, precision, 4 // micro_batch)
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
    predicted = accounting.peak_memory(cfg, 1, 0, 1, precision, micro_batch, accumulation_steps=4 // micro_batch).activations
    assert abs(predicted - measured) / measured < 0.01, (measured, predicted)
    # the former prediction counted 2 x 4 B T V for everything outside the blocks
    former = accounting.block_activation_bytes(cfg, micro_batch, precision, False) + 8 * micro_batch * cfg.seq_len * cfg.vocab_size
    assert (measured - former) / measured > 0.1


@pytest.mark.run
@pytest.mark.parametrize("stage", [0, 2])
def test_gradient_accumulation_keeps_the_fp32_trajectory(tmp_path, tiny_data, plain, stage):
    """Global batch 8 on 2 ranks: one micro-batch of 4 per rank, or four of 1."""
    whole, whole_steps, _ = plain(stage)
    accum, accum_steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", stage, 2, micro_batch=1))
    assert whole["status"] == accum["status"] == "ok", (whole["reason"], accum["reason"])
    assert (whole["micro_batch"], whole["accumulation_steps"]) == (4, 1)
    assert (accum["micro_batch"], accum["accumulation_steps"]) == (1, 4)
    assert accum["run_id"] == f"fp32-z{stage}-w2-mb1"
    np.testing.assert_allclose(accum_steps["loss"], whole_steps["loss"], rtol=1e-6, atol=0)
    # A quarter of the micro-batch keeps a quarter of the activations.
    ratio = whole["activation_bytes_measured"] / accum["activation_bytes_measured"]
    assert 3.6 < ratio < 4.4, ratio
    for summary in (whole, accum):
        assert summary["activation_bytes_outside_blocks_measured"] == summary["activation_bytes_outside_blocks_predicted"]
    # FSDP2 (stage 2) gathers parameters for every micro-batch: more communication; DDP syncs once.
    assert abs(accum["comm_bytes_per_step_measured"] - accum["comm_bytes_per_step_predicted"]) <= 0.01 * accum["comm_bytes_per_step_predicted"]
    if stage == 0:
        assert accum["comm_bytes_per_step_measured"] == whole["comm_bytes_per_step_measured"]
    else:
        assert accum["comm_bytes_per_step_measured"] > whole["comm_bytes_per_step_measured"]


@pytest.mark.run
def test_bucket_size_sets_the_number_of_all_reduces(tmp_path, tiny_data, plain):
    default, default_steps, _ = plain(0)
    small, small_steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", 0, 2, bucket_mb=0.002))
    assert default["status"] == small["status"] == "ok", (default["reason"], small["reason"])
    assert small["run_id"] == "fp32-z0-w2-bucket0.002" and small["bucket_mb"] == 0.002
    for summary in (default, small):
        assert summary["comm_calls_per_step"]["all_reduce"] == summary["ddp_buckets_predicted"]
        # an fp32 run's MFU against the bf16 peak too (on a CPU: the measured bf16 matmul rate)
        assert "measured bf16 matmul" in summary["peak_flops_bf16_source"] and summary["peak_flops_bf16"] > 0
        assert summary["mfu_bf16_peak"] == pytest.approx(summary["mfu"] * summary["peak_flops_per_device"] / summary["peak_flops_bf16"])
    assert default["ddp_buckets_predicted"] == 1 and small["ddp_buckets_predicted"] > 5
    # Same bytes, cut into more calls; the same sums, so the same losses.
    assert small["comm_bytes_per_step_measured"] == default["comm_bytes_per_step_measured"]
    np.testing.assert_allclose(small_steps["loss"], default_steps["loss"], rtol=1e-6, atol=0)


@pytest.mark.run
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU these points run")
@pytest.mark.parametrize("point, expected", [
    (RunPoint("fp32", 3, 2, cpu_offload=True), "cpu_offload moves model state from GPU memory"),
    (RunPoint("fp8", 0, 2), "fp8 needs a GPU with FP8 tensor cores"),
    (RunPoint("fp8", 3, 1, activation_checkpointing=True), "fp8 needs a GPU with FP8 tensor cores"),
])
def test_gpu_only_levers_are_skipped_rows_on_cpu(tmp_path, tiny_data, point, expected):
    summary, steps, run_dir = run_point(tmp_path, tiny_data, point)
    assert summary["status"] == "skipped" and expected in summary["reason"]
    assert summary["run_id"] == point.run_id and summary["cpu_offload"] == point.cpu_offload
    assert len(steps) == 0 and (run_dir / "summary.json").exists()


@pytest.mark.run
def test_fp8_recipe_trains_with_emulated_float8(tmp_path, tiny_data, stage=3):
    """Without an FP8 GPU, torchao's emulated casts check the recipe end to end: the blocks'
    linears become Float8Linear before FSDP2 shards them (the harder case than DDP's
    replicas), and the run trains like bf16."""
    pytest.importorskip("torchao.float8")
    cfg = tiny_config(train={"steps": PARITY_STEPS, "warmup_steps": 2, "fp8_emulate": True})
    fp8, fp8_steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp8", stage, 2), cfg=cfg)
    bf16, bf16_steps, _ = run_point(tmp_path, tiny_data, RunPoint("bf16", stage, 2), cfg=cfg)
    assert fp8["status"] == bf16["status"] == "ok", (fp8["reason"], bf16["reason"])
    assert fp8["fp8_linears"] == 4 * cfg["model"]["n_layers"] and fp8["fp8_emulated"] is True
    assert np.isfinite(fp8_steps["loss"]).all() and fp8_steps["loss"].iloc[-1] < fp8_steps["loss"].iloc[0] - 0.5
    # float8 rounding moves the trajectory a little, not far
    np.testing.assert_allclose(fp8_steps["loss"], bf16_steps["loss"], rtol=0.02)
    # MFU against the bf16 peak beside the precision's own: on a CPU fp8 computes in bf16, one peak
    for summary in (fp8, bf16):
        assert summary["peak_flops_bf16"] == summary["peak_flops_per_device"] > 0
        assert summary["mfu_bf16_peak"] == summary["mfu"] > 0
        assert "measured bf16 matmul" in summary["peak_flops_bf16_source"]  # at run start, or the suite's record


@pytest.mark.run
def test_offload_clipping_path_matches_torch(tmp_path):
    """The offload path's gradient clipping (local squares, one all-reduce, in-place scale)
    gives torch's clip_grad_norm_ result, on 2 real ranks with FSDP2 shards."""
    import subprocess
    import sys

    script = tmp_path / "clip.py"
    script.write_text(CLIP_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("clip ok") == 2, proc.stdout


CLIP_SCRIPT = '''
import datetime, torch, torch.distributed as dist
from scalelab.config import ModelConfig
from scalelab.run.model import GPT
from scalelab.run.parallel import clip_grad_norm, parallelize

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
results = []
for on_host in (False, True):
    torch.manual_seed(0)
    model = GPT(ModelConfig(2, 32, 2, 16, True, 64))
    par = parallelize(model, 3, torch.device("cpu"), 1e-3, 0.1)
    par.state_on_host = on_host  # the offload path, exercised on CPU shards
    idx = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(dist.get_rank()))
    loss = par.model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    norm = clip_grad_norm(par, 0.05, torch.device("cpu"))
    grads = [p.grad.full_tensor() for p in par.model.parameters()]
    results.append((float(norm), grads))
(n0, g0), (n1, g1) = results
assert abs(n0 - n1) <= 1e-6 * n0 and n0 > 0.05, (n0, n1)
for a, b in zip(g0, g1):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
print("clip ok", n0, n1)
dist.barrier()
dist.destroy_process_group()
'''


def _compile_config(**train):
    # Compiling takes tens of seconds per rank on 2 shared cores (less with a warm inductor cache).
    return tiny_config(train={"steps": PARITY_STEPS, "warmup_steps": 2, "run_timeout_s": 900, **train},
                       planning={"launch_overcommitted": True})


@pytest.mark.run
def test_compile_lever_same_fp32_losses_compilation_out_of_the_steps(tmp_path, tiny_data):
    """Every block and the loss compiled before DDP wraps them; compilation runs in a warm-up
    forward and backward before the first step, timed apart, and the steps compile nothing.
    fp32 losses agree with eager to about 1e-7 (measured: at most 2.5e-7 relative over 40 steps;
    inductor's fused kernels round differently). The warm-up changes nothing the loop computes:
    without it the losses are the same bit for bit, and the first step compiles."""
    cfg = _compile_config()
    point = RunPoint("fp32", 0, 2, compile=True)
    eager, eager_steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", 0, 2), cfg=cfg)
    compiled, compiled_steps, _ = run_point(tmp_path, tiny_data, point, cfg=cfg)
    unwarmed, unwarmed_steps, _ = run_point(tmp_path / "unwarmed", tiny_data, point, cfg=cfg, compile_warm_up=False)
    assert eager["status"] == compiled["status"] == unwarmed["status"] == "ok", (compiled["reason"], unwarmed["reason"])
    assert compiled["run_id"] == "fp32-z0-w2-compiled" and compiled["compile"] is True and eager["compile"] is False
    assert eager["compile_time_s"] is None and eager["compile_graphs"] is None
    # one graph serves both blocks, one is the loss's; none is compiled during the steps
    assert compiled["compile_time_s"] > 0.5 and compiled["compile_graphs"] == 2 and compiled["compile_graphs_in_loop"] == 0
    np.testing.assert_allclose(compiled_steps["loss"], eager_steps["loss"], rtol=1e-6, atol=0)
    assert np.array_equal(unwarmed_steps["loss"].to_numpy(), compiled_steps["loss"].to_numpy())
    assert unwarmed["compile_time_s"] is None and unwarmed["compile_graphs_in_loop"] == 2
    assert unwarmed_steps["step_time_s"].iloc[0] > 10 * compiled["step_time_s_median"]
    # the measurements around it still hold: the same all-reduces, activations measured
    assert compiled["comm_bytes_per_step_measured"] == eager["comm_bytes_per_step_measured"]
    assert compiled["activation_bytes_measured"] > 0 and compiled["activation_bytes_outside_blocks_measured"] > 0
    # what the compiled graphs save for backward (the partitioner's choice, seen by the saved-tensor
    # hooks) is what the compiled model predicts (scalelab.formulas.accounting, compiled=True; issue #40)
    assert compiled["activation_bytes_measured"] == compiled["activation_bytes_predicted"]
    assert compiled["activation_bytes_outside_blocks_measured"] == compiled["activation_bytes_outside_blocks_predicted"]
    assert compiled["predicted_peak_bound"] == "model" and compiled["predicted_peak_bytes"] < eager["predicted_peak_bytes"]


@pytest.mark.run
def test_compile_lever_with_checkpointing_fsdp2_and_fp8(tmp_path, tiny_data):
    """Checkpointing is traced into the compiled blocks (backward recomputes the compiled
    forward), FSDP2 shards the compiled blocks (stage 3), and torchao's Float8Linear layers
    compile too (emulated float8 on a CPU: a check of the recipe, not of speed)."""
    cfg = _compile_config()
    eager, eager_steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", 3, 2, activation_checkpointing=True), cfg=cfg)
    compiled, compiled_steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp32", 3, 2, activation_checkpointing=True,
                                                                          compile=True), cfg=cfg)
    assert eager["status"] == compiled["status"] == "ok", compiled["reason"]
    assert compiled["run_id"] == "fp32-z3-w2-ac-compiled" and compiled["compile_graphs_in_loop"] == 0
    np.testing.assert_allclose(compiled_steps["loss"], eager_steps["loss"], rtol=1e-6, atol=0)
    # the compiled checkpointed blocks still keep about their inputs alone (1 sbh each; measured 1.3x)
    assert compiled["activation_bytes_measured"] < 2 * compiled["activation_bytes_predicted"]
    assert compiled["comm_calls_per_step"] == eager["comm_calls_per_step"]

    pytest.importorskip("torchao.float8")
    cfg = _compile_config(fp8_emulate=True)
    fp8, fp8_steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp8", 3, 2), cfg=cfg)
    fp8c, fp8c_steps, _ = run_point(tmp_path, tiny_data, RunPoint("fp8", 3, 2, compile=True), cfg=cfg)
    assert fp8["status"] == fp8c["status"] == "ok", fp8c["reason"]
    assert fp8c["fp8_linears"] == 4 * cfg["model"]["n_layers"] and fp8c["compile_graphs_in_loop"] == 0
    np.testing.assert_allclose(fp8c_steps["loss"], fp8_steps["loss"], rtol=0.01)


@pytest.mark.parametrize("precision, rtol", [("fp32", 1e-4), ("bf16", 2e-2)])
@pytest.mark.parametrize("stage", [0, 3])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compile_lever_on_a_gpu(tmp_path, tiny_data, precision, rtol, stage):
    """On a GPU (inductor's Triton kernels): the compiled run trains like its eager twin,
    compiles nothing during the steps, and records its compilation apart."""
    cfg = _compile_config(device="cuda")
    eager, eager_steps, _ = run_point(tmp_path, tiny_data, RunPoint(precision, stage, 1), cfg=cfg)
    compiled, compiled_steps, _ = run_point(tmp_path, tiny_data, RunPoint(precision, stage, 1, compile=True), cfg=cfg)
    assert eager["status"] == compiled["status"] == "ok", (eager["reason"], compiled["reason"])
    assert compiled["device_type"] == "cuda" and compiled["compile_time_s"] > 0 and compiled["compile_graphs_in_loop"] == 0
    np.testing.assert_allclose(compiled_steps["loss"], eager_steps["loss"], rtol=rtol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mfu_against_the_bf16_datasheet_peak_on_a_gpu(tmp_path, tiny_data):
    """bf16 runs: one peak, the datasheet's dense bf16; fp8 runs (FP8 GPUs with torchao):
    their own peak is fp8's, and mfu_bf16_peak = mfu x fp8 peak / bf16 peak (2 on Hopper)."""
    from scalelab.run.precision import fp8_unsupported_reason

    cfg = _compile_config(device="cuda")
    bf16 = run_point(tmp_path, tiny_data, RunPoint("bf16", 0, 1), cfg=cfg)[0]
    assert bf16["status"] == "ok", bf16["reason"]
    if bf16["peak_flops_source"].startswith("datasheet"):
        assert bf16["peak_flops_bf16"] == bf16["peak_flops_per_device"] and bf16["mfu_bf16_peak"] == bf16["mfu"]
        assert bf16["peak_flops_bf16_source"].startswith("datasheet dense bf16")
    if fp8_unsupported_reason(torch.device("cuda")) is None:
        fp8 = run_point(tmp_path, tiny_data, RunPoint("fp8", 0, 1), cfg=cfg)[0]
        assert fp8["status"] == "ok", fp8["reason"]
        assert fp8["peak_flops_bf16"] == bf16["peak_flops_bf16"]
        assert fp8["mfu_bf16_peak"] == pytest.approx(fp8["mfu"] * fp8["peak_flops_per_device"] / fp8["peak_flops_bf16"])


# ----------------------------------------------------------------------------- the levers in the report
# (read from synthetic results: no training)

@pytest.mark.unit
def test_every_lever_shows_its_own_evidence_and_no_other(tmp_path):
    """The fixtures vary every lever of the registry; each lever's pairs carry the columns its
    EVIDENCE entry declares (and no other lever's), computed from the pair."""
    import pandas as pd

    from scalelab.harness.fixtures import synthetic_results
    from scalelab.plan.sweep import LEVER_AXES
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
        assert len(rows) and rows[own].notna().all().all(), lever
        assert rows[sorted(others)].isna().all().all(), lever
    ac = ok[ok["lever"] == "activation_checkpointing"]
    np.testing.assert_allclose(ac["step_time_ratio_predicted"], 1 + 2.3e5 / 7e5)  # the fixture's recompute FLOPs
    lora = ok[ok["lever"] == "lora_rank"].merge(runs, on="run_id")
    np.testing.assert_allclose(lora["trainable_fraction"], lora["n_trainable_params"] / lora["n_params"])
    assert (lora["model_state_mib"] < lora["baseline_model_state_mib"]).all()


@pytest.mark.unit
def test_twin_table_follows_the_precision_records(tmp_path):
    """fp8 runs beside their bf16 twins because fp8's record names bf16 as its twin."""
    import pandas as pd

    from scalelab.harness.fixtures import synthetic_results
    from scalelab.report.levers import fp8_table
    from scalelab.spec.precisions import PRECISIONS

    synthetic_results(tmp_path, n_runs=192, n_steps=5)
    runs = pd.read_parquet(tmp_path / "metrics.parquet")
    assert fp8_table(runs).empty, "no fp8 run, no table"
    twin = PRECISIONS["fp8"].twin
    bf16 = runs[(runs["precision"] == twin) & (runs["status"] == "ok")]
    fp8 = bf16.assign(precision="fp8", run_id=bf16["run_id"].str.replace(twin, "fp8"), tokens_per_s=bf16["tokens_per_s"] * 1.5)
    table = fp8_table(pd.concat([runs, fp8], ignore_index=True))
    assert len(table) == len(fp8) and list(table[f"run_id_{twin}"]) == list(bf16["run_id"])
    np.testing.assert_allclose(table[f"speedup_over_{twin}"], 1.5)


@pytest.mark.unit
def test_psi_figure_draws_every_strategy_record():
    from scalelab.report import psi
    from scalelab.spec.strategies import STRATEGIES

    assert psi.STAGES == tuple(STRATEGIES)
