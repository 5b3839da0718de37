"""The levers as sweep axes, with real torchrun/gloo runs: activation checkpointing, gradient
accumulation, DDP bucket size; CPU offload and fp8 end as skipped rows on a CPU."""
import numpy as np
import pytest
import torch

from scalelab.planning.sweep import RunPoint
from support import PARITY_STEPS, run_point, tiny_config
from support.levers import _compile_config


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
    # hooks) is what the compiled model predicts (scalelab.formulas.activation_memory, compiled=True; issue #40)
    assert compiled["activation_bytes_measured"] == compiled["activation_bytes_predicted"]
    assert compiled["activation_bytes_outside_blocks_measured"] == compiled["activation_bytes_outside_blocks_predicted"]
    assert compiled["predicted_peak_bound"] == "model" and compiled["predicted_peak_bytes"] < eager["predicted_peak_bytes"]


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
