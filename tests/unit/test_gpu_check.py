"""The GPU machine's one command (`make gpu-check`): its CPU dry path, its deadline, the plain
PyTorch loop it holds scalelab against, and the wheels `make gpu-bundle` carries there."""
import ast
import json
import math
import re

import pytest
import torch

from scalelab.harness import gpu_bundle, gpu_check, gpu_points, gpu_session, gpu_tools, plain_loop
from scalelab.harness.gpu_memory import snapshot_peak
from support import REPO


def test_a_part_without_the_time_it_needs_is_recorded_not_run(tmp_path, capsys):
    """--deadline-s 0: nothing starts (the unit tier would fail a started process); every part and
    point is recorded "not run: deadline", in the JSON and in the summary, which comes last."""
    assert gpu_check.main(["--dry-run", "--deadline-s", "0", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    summary = out[out.rindex("== summary"):]
    assert "not run: deadline" in summary and "== " not in summary[len("== summary"):]
    check = json.loads((tmp_path / "gpu-check.json").read_text())
    assert {p["status"] for p in check["parts"].values()} == {"not run: deadline"}, check["parts"]
    assert {r["label"] for r in check["comparisons"]} == {"tiny bf16 eager", "tiny bf16 compiled", "small bf16 eager",
                                                          "tiny fp32 eager"}
    assert all(r["status"] == "not run: deadline" and r["ratio"] is None for r in check["comparisons"])
    assert {r["shape"]: r["status"] for r in check["fp8"]} == {"tiny": "not run: deadline", "small": "not run: deadline"}
    assert all(r["fp8_over_bf16"] is None for r in check["fp8"])


def test_the_bundle_carries_every_runtime_dependency_the_gpu_machine_lacks():
    """pyproject.toml's runtime dependencies are each on the GPU machine or in `make gpu-bundle`'s
    requirements (setproctitle was once left out), and torchao is the version the tests pin."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    name = lambda req: re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", req.strip()).group(0)).lower()  # noqa: E731
    bundle = gpu_bundle.bundle_requirements()
    bundled = {name(r) for r in bundle}
    missing = [r for r in project["dependencies"] if name(r) not in gpu_bundle.GPU_MACHINE_HAS | bundled]
    assert not missing, f"runtime dependencies neither on the GPU machine nor in the bundle: {missing}"
    assert "setproctitle" in bundled and not bundled & gpu_bundle.GPU_MACHINE_HAS
    torchao = [r for r in project["optional-dependencies"]["test"] if name(r) == "torchao"]
    assert torchao and torchao[0] in bundle


def test_the_plain_loop_is_scalelab_gpt_written_plainly():
    """The plain loop imports nothing of scalelab, yet its model is scalelab's GPT: the same
    parameters (names, shapes, the tied head) and, given the same weights, the same loss."""
    tree = ast.parse(open(plain_loop.__file__).read())
    imported = [n.module if isinstance(n, ast.ImportFrom) else a.name for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in (n.names if isinstance(n, ast.Import) else [n])]
    assert not [m for m in imported if m and m.startswith("scalelab")], imported

    from scalelab.config import ModelConfig
    from scalelab.run.model import GPT

    shape = {"n_layers": 2, "d_model": 32, "n_heads": 2, "seq_len": 16}
    torch.manual_seed(0)
    ours = GPT(ModelConfig(**shape, vocab_size=64, tie_embeddings=True))
    plain = plain_loop.GPT(**shape, vocab_size=64)
    assert {k: v.shape for k, v in plain.state_dict().items()} == {k: v.shape for k, v in ours.state_dict().items()}
    assert plain.head.weight is plain.wte.weight and sum(p.numel() for p in plain.parameters()) == ours.num_parameters()
    plain.load_state_dict(ours.state_dict())
    idx = torch.randint(0, 64, (3, 17))
    torch.testing.assert_close(plain(idx[:, :-1], idx[:, 1:]), ours(idx[:, :-1], idx[:, 1:]), rtol=0, atol=0)


def test_the_plain_loop_trains_and_times_its_steps():
    r = plain_loop.train(n_layers=1, d_model=32, n_heads=2, seq_len=16, vocab_size=64, batch_size=2, steps=4,
                         warmup_steps=2, precision="fp32", device="cpu")
    assert r["tokens_per_step"] == 32 and len(r["step_times_s"]) == 4
    assert r["tokens_per_s"] == pytest.approx(32 / r["step_time_s_median"]) and r["step_time_s_median"] > 0
    assert r["peak_mem_allocated_bytes"] is None and math.isfinite(r["final_loss"])
    with pytest.raises(ValueError, match="no step to measure"):
        plain_loop.train(1, 32, 2, 16, 64, 2, steps=2, warmup_steps=2, device="cpu")


class _FakeGPU:
    """The GPU path without a GPU: a clock that the fake runs advance, scalelab runs and plain
    loops that return set figures, `pytest -m gpu` and Snakemake that only take their time."""

    SECONDS = {"pytest": 60, "snakemake": 100, False: 30, True: 80}  # a run: eager / compiled
    TOKENS_PER_S = {("350M", "bf16"): 100_000, ("350M", "fp8"): 84_000, ("1.3B", "bf16"): 30_000,
                    ("1.3B", "fp8"): 34_800, ("350M", "fp16"): 99_000, ("350M", "fp32"): 40_000, ("memory", "bf16"): 1}

    STAGE_COST = {0: 1.0, 2: 0.55, 3: 0.6}  # FSDP2 over one GPU (the fsdp part), about as an H200 measured it

    def __init__(self, monkeypatch):
        import types

        self.now, self.calls = 0.0, []
        monkeypatch.setattr(gpu_session, "time", types.SimpleNamespace(monotonic=lambda: self.now))
        for module in (gpu_session, gpu_tools):  # the plain loop's processes; pytest and Snakemake
            monkeypatch.setattr(module, "run_bounded", self.run_bounded)
        monkeypatch.setattr(gpu_session.Check, "_data", lambda check: check.work)
        monkeypatch.setattr(gpu_session.Check, "memory_data", lambda check, cfg: check.work)
        monkeypatch.setattr("scalelab.run.launch.launch_run", self.launch_run)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")

    def shape(self, d_model: int) -> str:
        return {1024: "350M", 2048: "1.3B", 768: "memory"}[d_model]

    def launch_run(self, cfg, plan, data_dir, run_dir, log_path, threads=1, calibration=None):
        assert calibration is None, "a GPU run's peak is the datasheet's: no CPU calibration"
        assert plan.device == "cuda", "the check's runs are planned for the GPU"
        point = plan.point
        shape, compiled = self.shape(cfg["model"]["d_model"]), point.compile
        self.calls.append(("scalelab", shape, point.precision, compiled, cfg["train"]["run_timeout_s"]))
        self.now += self.SECONDS[compiled]
        tps = self.TOKENS_PER_S[(shape, point.precision)] * (1.2 if compiled else 1.0) * self.STAGE_COST[point.zero_stage]
        per_step = cfg["train"]["global_batch"] * cfg["model"]["seq_len"]
        return {"status": "ok", "tokens_per_step": per_step, "step_time_s_median": per_step / tps, "tokens_per_s": tps,
                "mfu": tps / 200_000, "mfu_bf16_peak": tps / 200_000, "peak_mem_allocated_bytes": 2**34,
                "predicted_peak_bytes": 2**34, "compile_time_s": 40.0 if compiled else None}

    def run_bounded(self, cmd, timeout_s, **kwargs):
        if "pytest" in cmd:
            self.calls.append(("suite", timeout_s))
            self.now += min(self.SECONDS["pytest"], timeout_s)
            return (0, "40 passed in 60.00s") if self.SECONDS["pytest"] <= timeout_s else (None, "")
        if "scalelab.harness.plain_loop" in cmd:
            arg = lambda name: cmd[cmd.index(name) + 1]  # noqa: E731
            shape, compiled = self.shape(int(arg("--d-model"))), "--compile" in cmd
            self.calls.append(("plain", shape, arg("--precision"), compiled, timeout_s))
            self.now += self.SECONDS[compiled]
            tps = self.TOKENS_PER_S[(shape, arg("--precision"))] * (1.25 if compiled else 1.0)  # compiled: plain 4% ahead
            tps *= 0.9 if "blocks" in cmd else 0.99 if "--ddp" in cmd else 1.0  # the variants' costs (diagnose)
            per_step = int(arg("--batch-size")) * int(arg("--seq-len"))
            result = {"tokens_per_s": tps, "tokens_per_s_mean": tps, "step_time_s_median": per_step / tps,
                      "peak_mem_allocated_bytes": 2**34, "first_step_s": 40.0, "n_params": 1, "device_name": "fake",
                      "final_loss": 10.0}
            with open(arg("--json"), "w") as f:
                json.dump(result, f)
            return 0, "plain loop: ..."
        self.calls.append(("sweep", timeout_s))
        self.now += min(self.SECONDS["snakemake"], timeout_s)
        return (0, "") if self.SECONDS["snakemake"] <= timeout_s else (None, "")


def test_on_a_gpu_the_parts_run_in_order_of_value_within_the_deadline(tmp_path, monkeypatch, capsys):
    """The GPU schedule (faked): the suite, then scalelab and the plain loop alternately at 350M
    bf16 and at 1.3B, then fp8 against bf16 at 350M and 1.3B (the bench's and the large part's bf16 runs count); what the deadline
    leaves no time for is "not run: deadline", each process's timeout is the time left, the
    targets are judged, and the summary comes last."""
    fake = _FakeGPU(monkeypatch)
    assert gpu_check.main(["--deadline-s", "600", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    ran = [c[:4] if c[0] in ("scalelab", "plain") else c[:1] for c in fake.calls]
    assert ran == [("suite",), ("scalelab", "350M", "bf16", False), ("plain", "350M", "bf16", False),
                   ("scalelab", "350M", "bf16", True), ("plain", "350M", "bf16", True),
                   ("scalelab", "1.3B", "bf16", True), ("plain", "1.3B", "bf16", True),  # the large part
                   ("scalelab", "350M", "fp8", True),  # the large part's 1.3B bf16 run counts: 95 s left, no 1.3B fp8,
                   ("scalelab", "memory", "bf16", False), ("scalelab", "memory", "bf16", False)], ran  # no sweep, no
    # diagnose, fsdp or profile (compiled: 100 s each); the memory part's two eager runs leave no time for the rest
    assert fake.calls[0][1] == pytest.approx(600 - gpu_points.RESERVE_S)  # the suite gets all the time there is
    # and each later process what is left, a plain-loop measurement at most MAX_MEASURE_S (a hung one ends there)
    assert fake.calls[2][4] == pytest.approx(min(600 - gpu_points.RESERVE_S - 60 - 30, gpu_points.MAX_MEASURE_S["gpu"]))
    check = json.loads((tmp_path / "gpu-check.json").read_text())
    assert check["parts"]["suite"]["status"] == "ok" and check["parts"]["sweep"]["status"] == "not run: deadline"
    assert check["parts"]["fp8"]["status"] == "partial: not run: deadline"
    rows = {r["label"]: r for r in check["comparisons"]}
    assert rows["350M bf16 eager"]["ratio"] == pytest.approx(1.0)
    assert rows["350M bf16 compiled"]["ratio"] == pytest.approx(1.2 / 1.25)
    assert rows["350M bf16 compiled"]["targets"] == [{"target": "ratio >= 0.98", "met": False},
                                                     {"target": "MFU >= 0.45", "met": True}]
    assert [label for label, r in rows.items() if r["status"] == "ok"] == ["350M bf16 eager", "350M bf16 compiled",
                                                                           "1.3B bf16 compiled"]
    assert rows["1.3B bf16 compiled"]["targets"][1] == {"target": "MFU >= 0.55", "met": False}
    assert check["parts"]["rest"]["status"] == "not run: deadline"
    memory = check["parts"]["memory"]
    assert memory["status"] == "ok" and [c["measured_over_predicted"] for c in memory["cases"]] == [1.0, 1.0]
    assert check["parts"]["diagnose"]["status"] == "not run: deadline"
    fp8 = {r["shape"]: r for r in check["fp8"]}
    assert fp8["350M"]["fp8_over_bf16"] == pytest.approx(0.84) and fp8["350M"]["status"] == "ok"
    assert fp8["1.3B"]["status"] == "partial: not run: deadline" and fp8["1.3B"]["fp8_over_bf16"] is None
    summary = out[out.rindex("== summary"):]
    assert "== " not in summary[len("== summary"):] and "MISSED" in summary and "DRY RUN" not in out


def test_time_left_after_every_part_repeats_the_comparisons(tmp_path, monkeypatch):
    """With time to spare, a second round of each comparison runs after every part ran once
    (scalelab then plain, bf16 then fp8), and each side's figure is the median of its rounds."""
    fake = _FakeGPU(monkeypatch)
    assert gpu_check.main(["--deadline-s", "5000", "--out", str(tmp_path), "--only", "bench", "--only", "fp8"]) == 0
    ran = [c[:4] for c in fake.calls]
    first = [("scalelab", "350M", "bf16", False), ("plain", "350M", "bf16", False),
             ("scalelab", "350M", "bf16", True), ("plain", "350M", "bf16", True),
             ("scalelab", "350M", "fp8", True), ("scalelab", "1.3B", "bf16", True), ("scalelab", "1.3B", "fp8", True)]
    assert ran == first + [("scalelab", "350M", "bf16", False), ("plain", "350M", "bf16", False),
                           ("scalelab", "350M", "bf16", True), ("plain", "350M", "bf16", True),
                           ("scalelab", "350M", "fp8", True),  # the bench's bf16 runs count for the pair
                           ("scalelab", "1.3B", "bf16", True), ("scalelab", "1.3B", "fp8", True)], ran
    check = json.loads((tmp_path / "gpu-check.json").read_text())
    assert set(check["parts"]) == {"bench", "fp8"} and all(p["status"] == "ok" for p in check["parts"].values())
    assert [r["rounds"] for r in check["comparisons"]] == [[2, 2], [2, 2]]
    assert {r["shape"]: r["fp8_over_bf16"] for r in check["fp8"]} == pytest.approx({"350M": 0.84, "1.3B": 1.16})


def test_diagnose_holds_each_of_scalelabs_differences_against_the_plain_loop(tmp_path, monkeypatch):
    """The plain loop compiled per block (scalelab's compile scope) and in DDP at world size 1, each
    against the plain loop as a user writes it: the ratio is what that difference costs."""
    fake = _FakeGPU(monkeypatch)
    assert gpu_check.main(["--deadline-s", "5000", "--out", str(tmp_path), "--only", "diagnose"]) == 0
    assert [c[:4] for c in fake.calls] == [("plain", "350M", "bf16", True)] * 3  # the loop as written, then each variant
    check = json.loads((tmp_path / "gpu-check.json").read_text())
    figures = check["parts"]["diagnose"]["figures"]
    assert check["parts"]["diagnose"]["status"] == "ok"
    assert "350M bf16 compiled [blocks]: 0.900 of plain" in figures and "350M bf16 compiled [ddp]: 0.990 of plain" in figures


def test_fsdp_holds_each_fsdp2_stage_against_scalelabs_stage_0(tmp_path, monkeypatch):
    """FSDP2 over one GPU: stage 3, then stage 2, each one traced run, against scalelab's stage-0 run
    of the same shape (measured first where the bench did not): the ratio is what FSDP2 costs."""
    fake = _FakeGPU(monkeypatch)
    assert gpu_check.main(["--deadline-s", "5000", "--out", str(tmp_path), "--only", "fsdp"]) == 0
    assert [c[:4] for c in fake.calls] == [("scalelab", "350M", "bf16", True)] * 3
    part = json.loads((tmp_path / "gpu-check.json").read_text())["parts"]["fsdp"]
    assert part["status"] == "ok" and [v["label"] for v in part["variants"]] == [
        "350M bf16 compiled stage 3 [traced]", "350M bf16 compiled stage 2 [traced]"]
    assert [v["ratio_to_stage_0"] for v in part["variants"]] == pytest.approx([0.6, 0.55])


def test_a_trace_kernel_is_classed_by_what_it_does():
    """Inductor's fused kernels are named after their ops ("..._to_copy_add_native_layer_norm"): they are
    compiled work, not copies (an H200 trace read 10 ms of "copies" that were LayerNorm kernels)."""
    from scalelab.harness.gpu_measure import kernel_class as cls
    assert cls("triton_per_fused__to_copy_add_native_layer_norm_native_layer_norm_backward_view_10") == "compiled (triton)"
    assert cls("Memcpy DtoD (Device -> Device)") == cls("Memset (Device)") == "copy, fill"
    assert cls("ncclDevKernel_AllGather_RING_LL") == "communication"
    assert cls("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert cls("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3") == "attention"
    assert cls("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>") == "elementwise"


def test_the_peak_of_an_allocator_history_and_what_was_live_then(tmp_path):
    """snapshot_peak replays a CUDA allocator snapshot's history (torch.cuda.memory._dump_snapshot's
    format): the peak of the bytes allocated within it, what was allocated before it began (from the
    segments at the dump), and the live allocations at the peak by site, largest first."""
    import pickle

    frame = lambda name, filename="??", line=0: {"name": name, "filename": filename, "line": line}  # noqa: E731
    alloc = lambda addr, size, *frames: {"action": "alloc", "addr": addr, "size": size, "frames": list(frames)}  # noqa: E731
    free = lambda addr, size: {"action": "free_completed", "addr": addr, "size": size}  # noqa: E731
    history = [alloc(1, 100, frame("c10::cuda::CUDACachingAllocator::malloc"), frame("forward", "/x/scalelab/run/model.py", 64)),
               alloc(2, 50, frame("torch::unwind::unwind()"), frame("at::empty_strided"), frame("MmBackward0::apply")),
               free(2, 50),
               alloc(3, 70, frame("linear", "/t/torch/nn/modules/linear.py", 134), frame("step", "/x/scalelab/run/worker.py", 3)),
               alloc(4, 30, frame("MmBackward0::apply")),
               free(1, 100), free(4, 30)]
    blocks = [{"size": 70, "state": "active_allocated"}, {"size": 1000, "state": "active_allocated"}, {"size": 8, "state": "inactive"}]
    path = tmp_path / "rank0.pickle"
    path.write_bytes(pickle.dumps({"segments": [{"blocks": blocks}], "device_traces": [[], history]}))
    peak = snapshot_peak(path)
    assert (peak["before_history_bytes"], peak["peak_in_history_bytes"], peak["peak_bytes"]) == (1000, 200, 1200)
    assert peak["at_peak"] == "MmBackward0::apply"
    assert [(g["site"], g["bytes"]) for g in peak["live_at_peak"]] == [
        ("model.py:64 forward", 100), ("linear.py:134 linear <- worker.py:3 step", 70), ("MmBackward0::apply", 30)]
