"""The GPU check's stages part (scalelab.harness.stage_check), its schedule and its rows, without a GPU: which
plain FSDP2 loop each sharded stage is held against, what is measured once for two points, and hybrid left
out where one device is visible."""
import pytest
import torch

from scalelab.harness import stage_check
from scalelab.harness.gpu_measure import Key


class _FakeCheck:
    """A check whose measurements return set figures: scalelab at `share` of the plain loop's tokens/s."""

    dry_run, rounds, kind = False, 1, "gpu"

    def __init__(self, share: dict):
        self.share, self.scalelab, self.plain, self.calls = share, {}, {}, []

    def left(self) -> float:
        return 1000.0

    def measure_scalelab(self, key):
        self.calls.append(("scalelab", key.label))
        self.scalelab.setdefault(key, []).append({"status": "ok", "tokens_per_s": 100.0 * self.share[key.stage]})

    def measure_plain(self, key):
        self.calls.append(("plain", key.label))
        tps = 90.0 if key.variant.endswith("+autocast") else 100.0
        self.plain.setdefault(key, []).append({"status": "ok", "tokens_per_s": tps})


def test_each_stage_is_held_against_its_plain_fsdp2_peer():
    keys = stage_check.stage_keys(dry_run=False)
    assert [k.label for k in keys[:4]] == ["350M bf16 compiled stage 3 [traced]", "350M bf16 compiled stage 2 [traced]",
                                            "350M bf16 compiled stage 1 [traced]", "350M bf16 compiled hybrid x2 [traced]"]
    assert {(k.shape, k.compiled) for k in keys} == {("350M", True), ("350M", False), ("1.3B", True), ("1.3B", False)}
    assert keys[-1].variant == "traced+autocast" and keys[-1].stage == 3
    args = {k.label: stage_check.plain_fsdp_args(stage_check.plain_key(k)) for k in keys[:4] + keys[-1:]}
    assert list(args.values()) == [["--fsdp", "reshard"], ["--fsdp", "keep"], ["--fsdp", "keep"],
                                   ["--fsdp", "reshard", "--replicas", "2"], ["--fsdp", "reshard", "--autocast"]]
    assert stage_check.plain_fsdp_args(Key("350M", "bf16")) == []  # the bench's plain loop is unchanged
    assert "torch.distributed.run" in stage_check.plain_launcher(keys[3]) and len(stage_check.plain_launcher(keys[0])) == 1


def test_the_part_measures_shared_sides_once_and_leaves_hybrid_out_on_one_device(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    first = stage_check.stage_keys(dry_run=False)
    monkeypatch.setattr(stage_check, "stage_keys", lambda dry_run: first[:4] + first[-1:])  # 350M compiled alone
    check = _FakeCheck({3: 0.99, 2: 0.5, 1: 0.9})
    part = stage_check.stages(check)
    assert check.calls == [("scalelab", "350M bf16 compiled stage 3 [traced]"), ("plain", "350M bf16 compiled stage 3 [traced]"),
                           ("scalelab", "350M bf16 compiled stage 2 [traced]"), ("plain", "350M bf16 compiled stage 2 [traced]"),
                           ("scalelab", "350M bf16 compiled stage 1 [traced]"),  # its plain peer is stage 2's, measured
                           ("plain", "350M bf16 compiled stage 3 [traced+autocast]")]  # its scalelab side is stage 3's
    rows = {r["label"]: r for r in part["rows"]}
    assert rows["350M bf16 compiled stage 3"]["ratio"] == pytest.approx(0.99) and rows["350M bf16 compiled stage 3"]["met"]
    assert rows["350M bf16 compiled stage 2"]["met"] is False and rows["350M bf16 compiled stage 1"]["ratio"] == pytest.approx(0.9)
    assert rows["350M bf16 compiled stage 3 (plain + autocast)"]["ratio"] == pytest.approx(0.99 / 0.9)
    assert rows["350M bf16 compiled hybrid x2"]["status"] == "not run: hybrid needs 2 devices, 1 visible"
    assert part["status"] == "ok" and "hybrid x2" in capsys.readouterr().out
