"""The sharded stages against the plain FSDP2 loop on a real NVIDIA GPU (`pytest -m gpu`); skipped elsewhere.
The speed comparison itself is the GPU check's stages part (scalelab.harness.stage_check): these check that
its plain side trains on a GPU and that scalelab's step issues no more host work there than the plain loop
under scalelab's own precision recipe (autocast around FSDP2's MixedPrecisionPolicy)."""
import json
import math
import subprocess
import sys

import pytest
import torch

from scalelab.harness.testing import tiny_config
from support.host_work import excess, host_work

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("fsdp", ["reshard", "keep"])
def test_the_plain_fsdp2_loop_trains_on_the_gpu(tmp_path, fsdp):
    out = tmp_path / "plain.json"
    cmd = [sys.executable, "-m", "scalelab.harness.plain_loop", "--n-layers", "2", "--d-model", "256", "--n-heads", "4",
           "--seq-len", "128", "--vocab-size", "512", "--batch-size", "4", "--steps", "6", "--warmup-steps", "2",
           "--precision", "bf16", "--device", "cuda", "--fsdp", fsdp, "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["fsdp"] == fsdp and r["device"] == "cuda" and r["tokens_per_s"] > 0 and math.isfinite(r["final_loss"])
    assert r["peak_mem_allocated_bytes"] > 0


@pytest.mark.parametrize("case", ["bf16:2", "bf16:3"])
def test_a_sharded_step_issues_no_more_host_work_on_the_gpu_than_the_plain_loop(tmp_path, tiny_data, case):
    """One rank on the GPU, eager bf16: CUDA's autocast runs LayerNorm in fp32 (the CPU's does not), so the plain
    loop runs under autocast too here; what autocast itself costs is the stages part's to time."""
    records = host_work(tmp_path, tiny_data, tiny_config(train={"device": "cuda"}), 1, [case], "--plain-autocast")
    assert excess(records[case]["scalelab"], records[case]["plain"]) == []
