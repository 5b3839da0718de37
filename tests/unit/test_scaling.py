"""Extrapolation to large clusters (#29, point 4): the link table and the alpha-beta collective
time (scalelab.formulas.links), the collective sizes per strategy against communication's bytes, and
`scalelab estimate scaling`'s documented example, its figures' invariants and its errors.
In process (unit tier)."""
import json
import math

import pytest

from scalelab.cli import main
from scalelab.config import ModelConfig
from scalelab.forecast.scaling import gpu_counts
from scalelab.formulas import communication, flops, links, tensor_parallelism
from scalelab.formulas.links import collective_calls, collective_sizes
from scalelab.formulas.rank_step import RankStep
from scalelab.registries import hardware
from scalelab.registries.precisions import PRECISION_NAMES
from scalelab.registries.strategies import ZERO_STAGES

# The guide's documented example (docs/prediction.md): a GPT-3 XL shape (~1.3B), ZeRO-3, bf16,
# H100 SXM, 8 -> 512 GPUs over InfiniBand NDR.
EXAMPLE = ["scaling", "--layers", "24", "--d-model", "2048", "--heads", "16", "--vocab", "50257", "--seq", "2048",
           "--micro-batch", "4", "--zero-stage", "3", "--precision", "bf16", "--gpu", "H100",
           "--inter-node", "ib-ndr", "--gpus", "8,16,32,64,128,256,512"]
EXAMPLE_CFG = ModelConfig(n_layers=24, d_model=2048, n_heads=16, seq_len=2048, vocab_size=50257)


def _estimate(capsys, *args) -> tuple[int, str, str]:
    code = main(["estimate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def example():
    """The documented example's JSON (run once for the module)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["estimate", *EXAMPLE, "--json"])
    assert code == 0
    return json.loads(out.getvalue())


# ----------------------------------------------------------------------------- links
@pytest.mark.parametrize("collective, n, factor", [("all_reduce", 8, 1.75), ("all_reduce", 2, 1.0), ("reduce_scatter", 8, 0.875),
                                                   ("all_gather", 4, 0.75), ("broadcast", 16, 1.0)])
def test_bus_factors_are_nccl_tests(collective, n, factor):
    assert links.bus_factor(collective, n) == pytest.approx(factor)


def test_collective_seconds_is_latency_plus_bus_bytes_over_achievable_bandwidth():
    link = links.Link("test", 100e9, 10e-6, "a test", efficiency=0.5)  # 50 GB/s achieved
    # all-reduce of 1 GB over 8 ranks: 10 us + 2 x 7/8 x 1e9 / 50e9 s
    assert links.collective_seconds("all_reduce", 1e9, 8, link) == pytest.approx(10e-6 + 0.035)
    assert links.collective_seconds("all_gather", 1e9, 8, link) == pytest.approx(10e-6 + 0.0175)
    assert links.collective_seconds("broadcast", 0, 8, link) == pytest.approx(10e-6)
    assert links.collective_seconds("all_reduce", 1e9, 1, link) == 0.0  # one rank moves nothing
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        links.collective_seconds("allreduce", 1e9, 8, link)
    with pytest.raises(ValueError, match="nbytes"):
        links.collective_seconds("all_reduce", -1, 8, link)
    with pytest.raises(ValueError, match="efficiency"):
        links.Link("bad", 1e9, 0.0, "a test", efficiency=1.5)


def test_link_products_are_per_gpu_unidirectional_with_sources():
    by_name = {p.name: p for p in links.PRODUCTS}
    assert by_name["nvlink-h100"].bandwidth_Bps == 900e9 / 2  # the datasheet's 900 GB/s is both directions
    assert by_name["nvlink-b200"].bandwidth_Bps == 1.8e12 / 2
    assert by_name["ib-ndr"].bandwidth_Bps == 400e9 / 8  # 400 Gb/s per NIC
    assert by_name["ib-hdr"].bandwidth_Bps == 200e9 / 8 and by_name["ib-xdr"].bandwidth_Bps == 800e9 / 8
    assert by_name["pcie5"].bandwidth_Bps == pytest.approx(63.0e9, rel=1e-3)  # 32 GT/s x 16, 128b/130b
    assert all(p.source and p.bandwidth_Bps > 0 for p in links.PRODUCTS)
    for gpu, link in links.DEFAULT_INTRA_NODE.items():
        assert gpu in hardware.known_names() and link in links.known_names()


def test_a_link_is_named_or_a_number_in_gb_per_s():
    assert links.parse_link("NDR").name == links.parse_link("ib_ndr").name == "ib-ndr"
    ndr = links.parse_link("InfiniBand NDR", efficiency=0.9)
    assert (ndr.bandwidth_Bps, ndr.efficiency) == (50e9, 0.9)
    number = links.parse_link("25")
    assert (number.bandwidth_Bps, number.efficiency) == (25e9, links.DEFAULT_EFFICIENCY)
    with pytest.raises(ValueError, match="unknown link 'infiniband-qdr'; known: nvlink-v100, .*ib-ndr.*pcie5"):
        links.parse_link("infiniband-qdr")
    for bad in ("0", "-5", "nan", "inf"):
        with pytest.raises(ValueError, match="positive number of GB/s"):
            links.parse_link(bad)
    measured = links.parse_link("46@1", efficiency=0.5)  # nccl-tests' busbw per NIC, taken as achieved: its own efficiency wins
    assert (measured.bandwidth_Bps, measured.efficiency, measured.achievable_Bps) == (46e9, 1.0, 46e9)
    assert links.parse_link("ndr@0.9").achievable_Bps == pytest.approx(45e9)
    for bad in ("ndr@", "ndr@1.5", "ndr@x", "46@0"):
        with pytest.raises(ValueError, match="the efficiency after '@' must be a number in"):
            links.parse_link(bad)


def test_a_group_spanning_nodes_runs_on_the_nics_its_ranks_hold_up_to_the_node_link():
    """links.across_nodes: NCCL's ring channels cross between nodes one per NIC, so a group with k ranks on each
    node gets k NICs' bus bandwidth, no more than the intra-node link carries; a measured bus bandwidth (a bench
    table's fit) is already what its groups reached."""
    ndr, nvlink = links.parse_link("ib-ndr"), links.parse_link("nvlink-h100")
    assert ndr.per_nic and links.parse_link("46@1").per_nic and not nvlink.per_nic
    assert links.across_nodes(ndr, nvlink, 1) is ndr  # hybrid's replicate group: one rank, one NIC per node
    four = links.across_nodes(ndr, nvlink, 4)
    assert four.achievable_Bps == pytest.approx(4 * 40e9) and four.latency_s == ndr.latency_s and four.name == "ib-ndr x 4 rails"
    capped = links.across_nodes(links.parse_link("ib-xdr"), nvlink, 8)  # 8 x 80 GB/s > NVLink's 360
    assert capped.achievable_Bps == pytest.approx(360e9) and "capped by nvlink-h100" in capped.name
    measured = links.Link("bench nccl", 300e9, 30e-6, "a bench table")
    assert links.across_nodes(measured, nvlink, 8) is measured
    with pytest.raises(ValueError, match="whole number >= 1 of ranks per node"):
        links.across_nodes(ndr, nvlink, 0)


# ----------------------------------------------------------------------------- collective sizes
@pytest.mark.parametrize("stage", ZERO_STAGES)
def test_collective_sizes_add_up_to_accountings_bytes(stage):
    """The sizes are nccl-tests' (an all-reduce of S is S); communication counts an all-reduce 2S."""
    for precision in PRECISION_NAMES:
        for grad_reduce in communication.GRAD_REDUCE:
            for n in (1, 2, 8):
                step = RankStep(precision, stage, n, 1, grad_reduce=grad_reduce)
                sizes = collective_sizes(1_000_003, step)
                handed = sum(size * links.handed_per_size(c) for c, size in sizes.items())
                assert handed == communication.comm_bytes_per_step(1_000_003, step)


def test_collective_kinds_and_calls_follow_the_strategy():
    psi = flops.param_count(EXAMPLE_CFG)
    assert collective_sizes(psi, RankStep("bf16", 0, 8, 1)) == {"all_reduce": 4 * psi}  # fp32 gradients all-reduced
    assert collective_sizes(psi, RankStep("fp32", 1, 8, 1)) == {"all_reduce": 4 * psi, "broadcast": 4 * psi}
    assert collective_sizes(psi, RankStep("bf16", 3, 8, 1)) == {"reduce_scatter": 4 * psi, "all_gather": 2 * 2 * psi}
    sizes = collective_sizes(psi, RankStep("bf16", 3, 8, 1))
    assert collective_calls(EXAMPLE_CFG, 3, "bf16", sizes) == {"reduce_scatter": 25, "all_gather": 50}  # 24 blocks + root
    ddp = collective_calls(EXAMPLE_CFG, 0, "fp16", collective_sizes(psi, RankStep("fp16", 0, 8, 1)))
    assert ddp == {"all_reduce": math.ceil(4 * psi / (25 * 2 ** 20)) + 1}  # 25 MiB buckets + the scaler's flag
    big = collective_calls(EXAMPLE_CFG, 0, "fp16", collective_sizes(psi, RankStep("fp16", 0, 8, 1)), bucket_mb=100)
    assert big == {"all_reduce": math.ceil(4 * psi / (100 * 2 ** 20)) + 1}  # a run's own bucket cap


# ----------------------------------------------------------------------------- the command
def test_the_documented_example_runs_and_its_figures_hold_together(example):
    rows = example["rows"]
    assert example["prediction"] is True and [r["gpus"] for r in rows] == [8, 16, 32, 64, 128, 256, 512]
    assert rows[0]["scaling_efficiency"] == 1.0
    per_gpu = [r["tokens_per_s_per_gpu"] for r in rows]
    assert all(b <= a for a, b in zip(per_gpu, per_gpu[1:]))  # ZeRO-3 at a fixed per-GPU batch: never better
    assert per_gpu[-1] < per_gpu[0]  # leaving NVLink for NDR costs something
    for r in rows:
        assert r["step_time_s"] == pytest.approx(r["compute_s"] + r["exposed_comm_s"])
        assert 0 <= r["exposed_comm_s"] <= sum(r["comm_s"].values()) + 1e-12
        assert r["tokens_per_s_per_gpu"] == pytest.approx(4 * 2048 / r["step_time_s"])
        assert r["mfu"] == pytest.approx(r["tokens_per_s_per_gpu"] * example["flops_per_token"] / 989.5e12)
        # across nodes every GPU of a node carries the ring on its own NIC: 8 rails (links.across_nodes)
        assert r["links"] == dict.fromkeys(("reduce_scatter", "all_gather"),
                                           "nvlink-h100" if r["gpus"] <= 8 else "ib-ndr x 8 rails")
    a = example["assumptions"]
    assert a["mfu_without_communication"] == 0.4 and a["mfu_default"] and a["link_efficiency"] == links.DEFAULT_EFFICIENCY
    assert rows[0]["compute_s"] == pytest.approx(example["flops_per_token"] * 4 * 2048 / (989.5e12 * 0.4))


def test_one_rows_communication_computed_by_hand(example):
    """16 GPUs = 2 nodes: every collective spans them and runs on the 8 NICs of each node, NDR's 50 GB/s x 0.8
    each (320 GB/s, below NVLink's 360), 50 us a call."""
    psi = flops.param_count(EXAMPLE_CFG)
    row = next(r for r in example["rows"] if r["gpus"] == 16)
    bandwidth, latency, units = 8 * 50e9 * 0.8, 50e-6, 24 + 1
    last = tensor_parallelism.last_block_params(EXAMPLE_CFG)  # kept gathered from its forward to its backward: gathered once
    gather = (2 * units - 1) * latency + (15 / 16) * ((2 * psi - last) * 2) / bandwidth  # forward + backward, bf16
    scatter = units * latency + (15 / 16) * (psi * 4) / bandwidth  # fp32 gradients
    assert row["comm_s"]["all_gather"] == pytest.approx(gather, rel=1e-9)
    assert row["comm_s"]["reduce_scatter"] == pytest.approx(scatter, rel=1e-9)


def test_the_table_labels_its_figures_predictions_and_shows_its_assumptions(capsys):
    code, out, _ = _estimate(capsys, *EXAMPLE)
    assert code == 0
    assert out.startswith("PREDICTION, not a measurement")
    assert "MFU 40.0% without communication (default; --mfu)" in out
    assert "efficiency 0.80 (default; --link-efficiency)" in out
    assert "intra-node link: nvlink-h100" in out and "inter-node link: ib-ndr" in out
    assert "spans nodes at the inter-node link times the group's ranks per node" in out and "out of scope: NVLink SHARP" in out
    assert "every figure above is predicted" in out


def test_a_node_alone_needs_no_inter_node_link(capsys):
    code, out, _ = _estimate(capsys, "scaling", "--model", "gpt2", "--zero-stage", "0", "--gpu", "A100", "--gpus", "1,2,4,8",
                             "--intra-node", "300", "--link-efficiency", "1", "--mfu", "0.5", "--json")
    rows = json.loads(out)["rows"]
    assert code == 0 and [r["links"] for r in rows] == [{}] + [{"all_reduce": "300 GB/s"}] * 3
    assert rows[0]["exposed_comm_s"] == 0.0 and rows[0]["scaling_efficiency"] == 1.0


@pytest.mark.parametrize("change, message", [
    (["--inter-node", "ib-qdr"], "--inter-node: unknown link 'ib-qdr'; known: nvlink-v100"),
    (["--inter-node", "0"], "--inter-node: link bandwidth '0' must be a positive number"),
    (["--inter-node", "nowhere/bench.parquet"], "--inter-node nowhere/bench.parquet: no such file"),
    (["--mfu", "1.5"], "--mfu must be in (0, 1], got 1.5"),
    (["--link-efficiency", "0"], "--link-efficiency must be in (0, 1], got 0"),
    (["--micro-batch", "0"], "--micro-batch must be a positive number"),
    (["--gpu", "H900"], "--gpu H900: unknown GPU type 'H900'"),
    (["--zero-stage", "hybrid", "--gpus", "8,12"], "--gpus 12: hybrid sharding shards within a node of 8 GPUs"),
])
def test_bad_inputs_name_the_option(capsys, change, message):
    args = list(EXAMPLE)
    for option, value in zip(change[::2], change[1::2]):
        if option in args:
            args[args.index(option) + 1] = value
        else:
            args += [option, value]
    code, _, err = _estimate(capsys, *args)
    assert code == 2 and message in err, err


def test_missing_links_and_shapes_are_named(capsys):
    without_inter = [a for a in EXAMPLE if a not in ("--inter-node", "ib-ndr")]
    code, _, err = _estimate(capsys, *without_inter)
    assert code == 2 and "--inter-node: 16 GPUs span nodes of 8 (--gpus-per-node)" in err
    code, _, err = _estimate(capsys, "scaling", "--params", "1.3B", "--zero-stage", "3", "--gpu", "H100", "--gpus", "8")
    assert code == 2 and "needs the model's shape" in err
    code, _, err = _estimate(capsys, "scaling", "--model", "gpt2", "--zero-stage", "3", "--gpu", "H100 NVL", "--gpus", "8")
    assert code == 2 and "--intra-node: no default link for H100 NVL" in err
    with pytest.raises(SystemExit):
        main(["estimate", "scaling", "--model", "gpt2", "--zero-stage", "3", "--gpu", "H100", "--gpus", "8,x"])
    assert "argument --gpus: '8,x': every GPU count must be a whole number" in capsys.readouterr().err


def _bench_table(path, alpha_s: float, bandwidth_Bps: float, device_type: str, hosts: tuple[str, ...]):
    """A `bench comm` table whose times are an alpha-beta link's exactly (scalelab.run.commbench's columns)."""
    import pandas as pd

    link = links.Link("truth", bandwidth_Bps, alpha_s, "a test")
    rows = [{"collective": c, "world_size": n, "bytes": b, "batch": 1, "time_s": links.collective_seconds(c, b, n, link)}
            for c in links.COLLECTIVES for n in (2, 4) for b in (4096, 2 ** 20, 64 * 2 ** 20)]
    table = pd.DataFrame(rows)
    table["algbw_Bps"] = table["bytes"] / table["time_s"]
    table["busbw_Bps"] = table["algbw_Bps"] * [links.bus_factor(c, n) for c, n in zip(table["collective"], table["world_size"])]
    table["backend"], table["device_type"], table["device_name"] = "nccl" if device_type == "cuda" else "gloo", device_type, "x"
    table["hostname"] = [hosts[i % len(hosts)] for i in range(len(table))]
    table.to_parquet(path)
    return path


def test_a_measured_bench_table_is_the_link_as_measured(tmp_path, capsys):
    table = _bench_table(tmp_path / "comm.parquet", 30e-6, 20e9, "cuda", ("node1", "node2"))
    code, out, _ = _estimate(capsys, *EXAMPLE[:EXAMPLE.index("--inter-node") + 1], str(table), "--gpus", "16", "--json")
    result = json.loads(out)
    inter = result["assumptions"]["inter_node"]
    assert code == 0 and inter["efficiency"] == 1.0  # measured: no efficiency on top
    assert inter["achievable_gb_per_s"] == pytest.approx(20.0, rel=1e-6) and inter["latency_us"] == pytest.approx(30.0, rel=1e-6)
    psi = flops.param_count(EXAMPLE_CFG)
    last = tensor_parallelism.last_block_params(EXAMPLE_CFG)  # the last block gathered once per micro-batch
    expected = (2 * 25 - 1) * 30e-6 + (15 / 16) * ((2 * psi - last) * 2) / 20e9  # a measured bus bandwidth: no rails on top
    assert result["rows"][0]["comm_s"]["all_gather"] == pytest.approx(expected, rel=1e-6)
    assert "note" not in result

    cpu = _bench_table(tmp_path / "cpu.parquet", 30e-6, 1e9, "cpu", ("laptop",))
    code, out, _ = _estimate(capsys, *EXAMPLE[:EXAMPLE.index("--inter-node") + 1], str(cpu), "--gpus", "16")
    assert code == 0 and "measured on CPU (gloo): a CPU's link" in out and "measured within one host" in out
    assert "x efficiency" not in out.split("inter-node link:")[1].split("\n")[0]  # shown as measured


def test_hybrid_sharding_keeps_its_gathers_in_the_node_and_sends_one_all_reduce_across(capsys, example):
    """HSDP (#28): shard groups of one node (NVLink), replicas across nodes (NDR): only each rank's
    gradient shard, all-reduced over its replicate group, crosses nodes."""
    args = list(EXAMPLE)
    args[args.index("--zero-stage") + 1] = "hybrid"
    code, out, _ = _estimate(capsys, *args, "--json")
    result = json.loads(out)
    assert code == 0 and result["zero_stage"] == "hybrid"
    psi = flops.param_count(EXAMPLE_CFG)
    for row, zero3 in zip(result["rows"], example["rows"]):
        n = row["gpus"]
        assert row["replicas"] == max(1, n // 8)
        assert row["links"]["all_gather"] == row["links"]["reduce_scatter"] == "nvlink-h100"
        assert row["step_time_s"] == pytest.approx(row["compute_s"] + row["exposed_comm_s"])
        if n > 8:
            assert row["links"]["all_reduce"] == "ib-ndr"  # a replicate group holds one rank per node: one NIC
            replicas = n // 8
            # 25 calls (24 blocks + root), each a unit's fp32 gradient shard: Psi x 4 / 8 bytes in all
            by_hand = 25 * 50e-6 + 2 * (replicas - 1) / replicas * (psi * 4 / 8) / (50e9 * 0.8)
            assert row["comm_s"]["all_reduce"] == pytest.approx(by_hand, rel=1e-9)
            # what crosses nodes shrinks 8x (the gradient shard, not the whole gradient), and so does the rate it
            # crosses at (one NIC per replicate group, where ZeRO-3's ring has a node's 8): no faster on rails
            assert row["collective_bytes"]["all_reduce"] == pytest.approx(zero3["collective_bytes"]["reduce_scatter"] / 8)
            assert row["comm_s"]["all_reduce"] > zero3["comm_s"]["reduce_scatter"]
        else:
            assert "all_reduce" not in row["links"]
            assert row["step_time_s"] == pytest.approx(zero3["step_time_s"])  # one replica is ZeRO-3


def test_the_compute_efficiency_can_come_from_a_sweeps_runs_without_communication(tmp_path, capsys):
    import pandas as pd

    pd.DataFrame({"run_id": ["bf16-z3-w1", "bf16-z3-w1-r2", "bf16-z3-w2", "fp32-z3-w1"], "status": ["ok"] * 4,
                  "precision": ["bf16", "bf16", "bf16", "fp32"], "mfu": [0.50, 0.54, 0.30, 0.2], "world_size": [1, 1, 2, 1],
                  "device_type": ["cuda"] * 4, "device_name": ["NVIDIA H100 80GB HBM3"] * 4}).to_parquet(tmp_path / "metrics.parquet")
    code, out, _ = _estimate(capsys, *EXAMPLE, "--mfu-from", str(tmp_path), "--json")
    result = json.loads(out)
    assert code == 0 and result["assumptions"]["mfu_without_communication"] == pytest.approx(0.52)  # world size 1 only
    assert result["assumptions"]["mfu_source"]["runs"] == ["bf16-z3-w1", "bf16-z3-w1-r2"]
    code, out, _ = _estimate(capsys, *EXAMPLE, "--mfu-from", str(tmp_path))
    assert "at MFU 52.0% without communication (measured: the median of 2 ok world-size-1 run(s)" in out
    code, _, err = _estimate(capsys, *EXAMPLE, "--mfu-from", str(tmp_path), "--mfu", "0.4")
    assert code == 2 and "give --mfu or --mfu-from, not both" in err


def test_the_method_doc_shows_the_documented_examples_output_and_every_link(capsys):
    """docs/prediction.md: the example's command is EXAMPLE and its output what the command prints now
    (regenerate the block after a model change), and the link table lists every product."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "prediction.md").read_text()
    command = "$ scalelab estimate " + " ".join(EXAMPLE)
    assert command in doc, "docs/prediction.md: the documented example's command differs from tests' EXAMPLE"
    block = doc.split(command + "\n", 1)[1].split("\n```", 1)[0]
    code, out, _ = _estimate(capsys, *EXAMPLE)
    assert code == 0 and block == out.rstrip("\n"), (
        "docs/prediction.md's example output is stale: paste the output of `" + command[2:] + "`")
    table = {cells[0].strip("` "): (float(cells[1]), float(cells[2]))
             for cells in (line.strip("|").split("|") for line in doc.splitlines() if line.startswith("| `"))
             if cells[0].strip("` ") in links.known_names()}
    assert sorted(table) == sorted(links.known_names())
    for product in links.PRODUCTS:
        gb_per_s, latency_us = table[product.name]
        assert gb_per_s == pytest.approx(product.bandwidth_Bps / 1e9, rel=2e-3), product.name
        assert latency_us == pytest.approx(product.latency_s * 1e6), product.name


def test_gpu_counts_are_listed_or_continued_as_the_issue_writes_them():
    import argparse

    assert gpu_counts("8,16,...,1024") == (8, 16, 32, 64, 128, 256, 512, 1024)
    assert gpu_counts("8,16,24,...,48") == (8, 16, 24, 32, 40, 48)
    assert gpu_counts("64, 8,1K") == (8, 64, 1000)
    for bad, why in (("8,...,64", "needs two counts before it"), ("8,16,...", "needs two counts before it and one after"),
                     ("8,16,...,100", "does not reach 100"), ("16,8,...,64", "must grow"), ("8,0", "whole number >= 1")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            gpu_counts(bad)


def test_tensor_parallel_collectives_are_on_the_critical_path_over_their_link(capsys):
    """--tensor-parallel T: T GPUs split every block, the strategy runs over N / T data-parallel ranks; the
    tensor-parallel all-reduces (four per block and micro-batch of B T d values) run over NVLink while T fits
    a node, over the inter-node link once it does not, and are exposed (added to the step)."""
    base = ["scaling", "--model", "llama3-8b", "--zero-stage", "3", "--gpu", "H100", "--inter-node", "ib-ndr"]
    code, out, _ = _estimate(capsys, *base, "--tensor-parallel", "8", "--gpus", "8,16,...,512")
    assert code == 0 and "tensor parallelism: 8 GPUs split every block" in out and "over nvlink-h100" in out
    assert "TP AR:nvlink-h100, ib-ndr" in out  # from 16 GPUs the data-parallel ranks span nodes
    code, out, _ = _estimate(capsys, *base, "--tensor-parallel", "8", "--gpus", "8,64", "--json")
    result = json.loads(out)
    from scalelab.registries.presets import PRESETS

    cfg = ModelConfig(**PRESETS["llama3-8b"].shape)
    for row in result["rows"]:
        tp = row["tensor_parallel_comm"]
        assert (row["tensor_parallel"], row["data_parallel"]) == (8, row["gpus"] // 8)
        # nccl-tests' size: communication's unit counts an all-reduce of S bytes as 2 S; a ring moves 2 (T-1)/T of S per GPU
        step = RankStep("bf16", 3, row["gpus"] // 8, 1, tensor_parallel=8, device_type="cuda")
        assert tp["size_bytes"] == tensor_parallelism.tensor_parallel_bytes(cfg, step) / 2
        assert tp["ring_bytes_per_gpu"] == pytest.approx(tp["size_bytes"] * 2 * 7 / 8)
        assert tp["calls"] == 4 * cfg.n_layers and tp["link"] == "nvlink-h100" and tp["exposed"]
        assert row["exposed_comm_s"] >= tp["seconds"] > 0
    assert result["rows"][0]["collective_bytes"] == {}  # one data-parallel rank: no strategy traffic
    one = json.loads(_estimate(capsys, *base, "--gpus", "8", "--json")[1])["rows"][0]
    assert result["rows"][0]["peak_memory_bytes"] < one["peak_memory_bytes"]  # 1/8 of the blocks' weights and activations
    code, out, _ = _estimate(capsys, *base, "--tensor-parallel", "8", "--gpus", "16", "--gpus-per-node", "4", "--json")
    # 8 > 4 per node: the group spans two nodes, four of its ranks (four NICs) on each
    assert code == 0 and json.loads(out)["rows"][0]["tensor_parallel_comm"]["link"] == "ib-ndr x 4 rails"
    code, _, err = _estimate(capsys, *base, "--tensor-parallel", "4", "--gpus", "6")
    assert code == 2 and "--tensor-parallel 4 does not divide 6 GPUs" in err


@pytest.mark.parametrize("args, strategy_link, tp_link", [
    (["--gpus", "16", "--tensor-parallel", "2"], "ib-ndr x 4 rails", "nvlink-h100"),  # each data-parallel group: 4 per node
    (["--gpus", "16", "--tensor-parallel", "8"], "ib-ndr", "nvlink-h100"),  # one rank of each per node: one NIC
    (["--gpus", "12"], "ib-ndr x 4 rails", None),  # the second node holds 4 of the 12: the ring's thinnest node
    (["--gpus", "12", "--tensor-parallel", "4"], "ib-ndr", "nvlink-h100"),  # group {0, 4, 8}: one rank on node 2
    (["--gpus", "12", "--gpus-per-node", "6", "--tensor-parallel", "4"], "ib-ndr", "ib-ndr x 2 rails"),  # {4..7} straddles
    (["--gpus", "24", "--gpus-per-node", "6", "--tensor-parallel", "8"], "ib-ndr", "ib-ndr x 2 rails"),
])
def test_a_groups_rails_are_its_fewest_ranks_on_a_node_over_every_group_of_its_kind(capsys, args, strategy_link, tp_link):
    """step.groups_link: the strategy's groups (every t-th rank) and tensor parallelism's (t consecutive ranks) run
    at once; the slowest paces the step: within a node the intra-node link, else the NICs of the spanning group with
    the fewest ranks on one of its nodes."""
    code, out, err = _estimate(capsys, "scaling", "--model", "llama3-8b", "--zero-stage", "3", "--gpu", "H100",
                               "--inter-node", "ib-ndr", *args, "--json")
    assert code == 0, err
    row = json.loads(out)["rows"][0]
    assert row["links"] == {"reduce_scatter": strategy_link, "all_gather": strategy_link}
    assert row["tensor_parallel_comm"]["link"] == tp_link


def test_hybrid_sharding_whose_shard_group_spans_nodes_times_each_group_over_its_own_ranks():
    """A sweep's forecast takes any replicas (planning.top_k): 32 GPUs as 2 replicas of 16 shard their gathers and
    reduce-scatters over 16 ranks on two nodes' rails, and all-reduce across the 2 replicas on one NIC each."""
    from scalelab.forecast.predict import predict_point
    from scalelab.forecast.step import Machine, Point
    from scalelab.registries.strategies import HYBRID_KEY

    psi = flops.param_count(EXAMPLE_CFG)
    machine = Machine(product=hardware.gpu_by_name("H100"), peak_flops=989.5e12, mfu=0.4, per_node=8,
                      intra=links.parse_link("nvlink-h100"), inter=links.parse_link("ib-ndr"), overlap_efficiency=1.0)
    point = Point(cfg=EXAMPLE_CFG, n_params=psi, key=HYBRID_KEY, precision="bf16", micro_batch=4, replicas=2)
    row = predict_point(point, machine, 32)
    assert row["links"] == {"reduce_scatter": "ib-ndr x 8 rails", "all_gather": "ib-ndr x 8 rails", "all_reduce": "ib-ndr"}
    rails, nic = 8 * 50e9 * 0.8, 50e9 * 0.8
    assert row["comm_s"]["reduce_scatter"] == pytest.approx(25 * 50e-6 + 15 / 16 * psi * 4 / rails, rel=1e-9)
    assert row["comm_s"]["all_reduce"] == pytest.approx(25 * 50e-6 + 2 * (1 / 2) * (psi * 4 / 16) / nic, rel=1e-9)


def test_nccls_latency_is_linear_in_a_rings_ranks_and_logarithmic_in_a_trees_nodes():
    """links.nccl_latency_s: NCCL's tuner (Simple protocol): a ring reduce-scatter over 256 ranks on 32 nodes takes 255
    steps, 31 of them between nodes; a tree all-reduce 2 x (7 + log2 32) steps; a broadcast one."""
    us = 1e-6
    assert links.nccl_latency_s("reduce_scatter", "ring", 256, 32) == pytest.approx((8.4 + 224 * 3.4 + 31 * 14) * us)
    assert links.nccl_latency_s("all_reduce", "ring", 256, 32) == pytest.approx((8.4 + 448 * 3.4 + 62 * 14) * us)
    assert links.nccl_latency_s("all_reduce", "tree", 256, 32) == pytest.approx((8.4 + 14 * 4.0 + 10 * 14) * us)
    assert links.nccl_latency_s("broadcast", "ring", 256, 32) == pytest.approx((8.4 + 14) * us)
    # a tree's latency barely grows with the nodes, a ring's with every rank
    assert links.nccl_latency_s("all_reduce", "tree", 512, 64) < 1.2 * links.nccl_latency_s("all_reduce", "tree", 256, 32)
    assert links.nccl_latency_s("reduce_scatter", "ring", 512, 64) > 1.9 * links.nccl_latency_s("reduce_scatter", "ring", 256, 32)


def test_a_fabric_measured_at_several_counts_gives_each_group_its_trees_rate_up_to_its_nics():
    """busbw:GBPS/RANKS at several counts (links.measured_busbw, links.across_nodes): at N nodes a group's rings run on
    its ranks' share of the measurement there, its all-reduce tree at the whole measurement up to its own NICs (the
    fewest nodes' share each); one count alone gives the tree no more than the rails."""
    nvlink = links.parse_link("busbw:436/8")
    fabric = links.measured_busbw("busbw:361.7/16,160.1/32,64.9/256", 8, True)
    assert [n for n, _ in fabric.fabric] == [2, 4, 32]
    assert [b for _, b in fabric.fabric] == pytest.approx([361.7e9, 160.1e9, 64.9e9])
    assert fabric.achievable_Bps == pytest.approx(64.9e9 / 8)
    assert [n for n, _ in links.parse_link("busbw:361.7/16,64.9/256").fabric] == [2, 32]
    two = links.across_nodes(fabric, nvlink, 2, nodes=32)  # a TP 4 data-parallel group: 2 ranks a node
    assert two.achievable_Bps == pytest.approx(2 * 64.9e9 / 8) and two.tree_Bps == pytest.approx(64.9e9)
    one = links.across_nodes(fabric, nvlink, 1, nodes=32)  # TP 8: one rank a node, its NIC binds
    assert one.tree_Bps == pytest.approx(361.7e9 / 8) and one.span == (1, 32)
    between = links.fabric_Bps(fabric, 8)  # 4 and 32 nodes measured: log-log in between
    assert between == pytest.approx((160.1e9 * 64.9e9) ** 0.5 * (160.1 / 64.9) ** (1 / 6), rel=1e-9)
    assert links.fabric_Bps(fabric, 64) == pytest.approx(64.9e9) and links.fabric_Bps(fabric, 1) == pytest.approx(361.7e9)
    single = links.across_nodes(links.measured_busbw("busbw:64.9/256", 8, True), nvlink, 2, nodes=32)
    assert single.tree_Bps == pytest.approx(single.achievable_Bps) == pytest.approx(2 * 64.9e9 / 8)
    # an all-reduce takes the faster of the ring and the tree; a reduce-scatter has only the ring
    size, n = 1e9, 64
    ring = links.nccl_latency_s("all_reduce", "ring", n, 32) + 2 * 63 / 64 * size / two.achievable_Bps
    tree = links.nccl_latency_s("all_reduce", "tree", n, 32) + 2 * 63 / 64 * size / two.tree_Bps
    assert links.collective_seconds("all_reduce", size, n, two) == pytest.approx(min(ring, tree))
    assert links.collective_seconds("reduce_scatter", size, n, two) == pytest.approx(
        links.nccl_latency_s("reduce_scatter", "ring", n, 32) + 63 / 64 * size / two.achievable_Bps)
    with pytest.raises(ValueError, match="within a node give one measurement"):
        links.measured_busbw("busbw:436/8,400/4", 8, False)
