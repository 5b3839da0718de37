"""The model a forecast is about, from the command line (scalelab.forecast.model_input): a config file's model as the
workflow reads it (family keys, presets, models: with a name), a head tied in every family, the GPU names people
write, and the refusals naming the key. In process (unit tier)."""
import json

import pytest

from scalelab.cli import main
from scalelab.config import ModelConfig
from scalelab.formulas import flops, links
from scalelab.registries import hardware
from scalelab.registries.presets import PRESETS

CLUSTER = ["--gpus", "16", "--gpu", "H100", "--inter-node", "ib-ndr", "--global-batch", "64", "--tokens", "1B", "--json"]
LLAMA_1B = "family: llama\n  n_layers: 16\n  d_model: 2048\n  n_heads: 32\n  n_kv_heads: 8\n  ffn_dim: 8192\n"


def _run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exited:
        code = exited.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_llama_written_in_the_model_section_is_the_model_planned(tmp_path, capsys):
    path = tmp_path / "my.yaml"
    path.write_text(f"model:\n  {LLAMA_1B}  seq_len: 4096\n  tie_embeddings: true\ndataset: {{tokenizer: bpe, "
                    "bpe_vocab_size: 128256}\n")
    code, out, err = _run(capsys, "plan", "--config", str(path), *CLUSTER)
    assert code == 0, err
    result = json.loads(out)
    # Llama 3.2 1B's shape, tied: its published count
    assert result["n_params"] == PRESETS["llama3.2-1b"].published_params and result["seq_len"] == 4096
    assert result["model"] == f"the model: section of {path}" and "llama, 16 layers" in result["shape"]
    assert "tied head" in result["shape"] and "vocab 128256" in result["shape"]
    code, out, _ = _run(capsys, "estimate", "memory", "--config", str(path), "--json")
    assert code == 0 and json.loads(out)["n_params"] == result["n_params"]


def test_a_models_entry_is_planned_by_its_name_and_never_the_default_silently(tmp_path, capsys):
    path = tmp_path / "models.yaml"
    path.write_text(f"model: {{seq_len: 4096}}\nmodels:\n  l1b:\n    {LLAMA_1B.replace(chr(10) + '  ', chr(10) + '    ')}"
                    "  small: {n_layers: 2}\n")
    code, _, err = _run(capsys, "plan", "--config", str(path), *CLUSTER)
    assert code == 2 and "its models: table has l1b, small and sweep.model does not say which" in err
    code, out, err = _run(capsys, "plan", "--config", str(path), "--model", "l1b", *CLUSTER)
    result = json.loads(out)
    assert code == 0 and result["model"] == f"models.l1b of {path}" and "untied head" in result["shape"], err
    untied = ModelConfig(family="llama", n_layers=16, d_model=2048, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=256,
                         tie_embeddings=False)
    assert result["n_params"] == flops.param_count(untied)
    path.write_text(path.read_text() + "sweep: {model: [l1b]}\n")
    assert json.loads(_run(capsys, "plan", "--config", str(path), *CLUSTER)[1])["n_params"] == result["n_params"]
    code, _, err = _run(capsys, "plan", "--config", str(path), "--model", "nope", *CLUSTER)
    assert code == 2 and "has no models: entry of that name (it has: base, l1b, small)" in err


def test_a_preset_entry_keeps_its_vocabulary_and_head(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text("models:\n  mine: {preset: llama3.2-3b}\nsweep: {model: [mine]}\n")
    code, out, err = _run(capsys, "estimate", "time", "--config", str(path), "--tokens", "1T", "--gpus", "8", "--gpu", "H100",
                          "--json")
    assert code == 0 and json.loads(out)["n_params"] == PRESETS["llama3.2-3b"].published_params, err


@pytest.mark.parametrize("text, message", [
    ("model: {family: llama, n_kv_heads: 5}\n", "model.n_kv_heads=5 does not divide n_heads=4"),
    ("model: {family: llama, ffn_dim: -1}\n", "ffn_dim"),
    ("model: {n_layer: 2}\n", "model.n_layer: unknown key"),
    ("models:\n  m: {module: 'os.path:join'}\nsweep: {model: [m]}\n", "the user's module 'os.path:join'"),
    ("sweep: {model: [a, b]}\nmodels: {a: {n_layers: 2}, b: {n_layers: 3}}\n", "sweep.model names 2 models (a, b)"),
    ("- a list\n", "a config file holds keys at top level"),
    ("model: {d_model: [\n", "not valid YAML"),
])
def test_a_config_it_cannot_read_is_one_line_naming_the_key(tmp_path, capsys, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code, _, err = _run(capsys, "estimate", "memory", "--config", str(path))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_every_family_can_tie_its_head():
    for name in ("llama3.2-1b", "llama3.2-3b", "gpt2"):
        cfg = ModelConfig(**PRESETS[name].shape)
        untied = ModelConfig(**{**PRESETS[name].shape, "tie_embeddings": False})
        assert cfg.tie_embeddings and flops.param_count(untied) - flops.param_count(cfg) == cfg.vocab_size * cfg.d_model


@pytest.mark.parametrize("name, product", [
    ("H100 80GB", "H100 SXM"), ("h100-80gb", "H100 SXM"), ("NVIDIA H100 SXM5 80GB", "H100 SXM"), ("A100 40GB", "A100 SXM 40GB"),
    ("A100-80GB", "A100 SXM 80GB"), ("H100 PCIe 80GB", "H100 PCIe"), ("H200 141GB", "H200 SXM")
])
def test_the_gpu_names_people_write_are_accepted(name, product, capsys):
    assert hardware.gpu_by_name(name).name == product
    code, out, err = _run(capsys, "estimate", "time", "--model", "llama3.2-1b", "--tokens", "1T", "--gpus", "8", "--gpu", name,
                          "--json")
    assert code == 0 and json.loads(out)["gpu"] == product, err


@pytest.mark.parametrize("name", ["H100 40GB", "A100 PCIe 24GB", "80GB"])
def test_a_gpu_name_no_product_fits_is_refused(name):
    with pytest.raises(ValueError, match="unknown GPU type"):
        hardware.gpu_by_name(name)


def test_a_measured_busbw_is_given_as_nccl_tests_printed_it(capsys):
    """busbw:GBPS/RANKS: nccl-tests' all-reduce busbw over RANKS ranks (every GPU of their nodes); scalelab divides it by
    the NICs of a node, so the playbook's 64.9 GB/s over 256 ranks moves bytes as 64.9/8 per GPU at efficiency 1 does;
    measured with NCCL, its calls pay NCCL's latency for 256 ranks on 32 nodes (links.nccl_latency_s: a tree all-reduce,
    a chain's broadcast) where a number pays its 50 us a call."""
    base = ["estimate", "scaling", "--model", "llama3.2-1b", "--zero-stage", "1", "--gpu", "H100", "--gpus", "256", "--json",
            "--overlap-efficiency", "0"]
    measured = json.loads(_run(capsys, *base, "--inter-node", "busbw:64.9/256", "--intra-node", "busbw:436/8")[1])
    by_hand = json.loads(_run(capsys, *base, "--inter-node", "8.1125@1", "--intra-node", "436@1")[1])
    row = measured["rows"][0]
    latency = sum(n * (links.nccl_latency_s(c, "tree" if c == "all_reduce" else "ring", 256, 32) - links.LATENCY_NUMBER_S)
                  for c, n in row["collective_calls"].items())
    assert row["step_time_s"] == pytest.approx(by_hand["rows"][0]["step_time_s"] + latency)
    assert measured["assumptions"]["inter_node"]["achievable_gb_per_s"] == pytest.approx(64.9 / 8)
    for bad, why in (("busbw:64.9/8", "every GPU of two nodes or more"), ("busbw:64.9", "busbw:GBPS/RANKS"),
                     ("busbw:-1/256", "positive number")):
        code, _, err = _run(capsys, *base, "--inter-node", bad)
        assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err
