"""`scalelab estimate` as a new user meets it (#32): counts written as the output prints them,
row filters, a subcommand's own usage on a bad option, claims that cannot be right said so,
and the MFU a sweep measured. In process (unit tier); tests/test_accounting.py runs the command."""
import argparse
import json

import pandas as pd
import pytest

from scalelab.analysis.estimate import _human, count
from scalelab.cli import main


def _estimate(capsys, *args) -> tuple[int, str, str]:
    code = main(["estimate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.unit
@pytest.mark.parametrize("text, value", [("1B", 1e9), ("20B", 20e9), ("350M", 350e6), ("1.3B", 1.3e9), ("2k", 2e3),
                                         ("1T", 1e12), ("7.5e9", 7.5e9), ("120", 120.0)])
def test_counts_are_read_as_the_output_prints_them(text, value):
    assert count(text) == pytest.approx(value)
    assert count(_human(value)) == pytest.approx(value, rel=1e-3)  # what it prints, it reads


@pytest.mark.unit
def test_a_count_that_is_not_one_is_refused_by_the_subcommand(capsys):
    with pytest.raises(argparse.ArgumentTypeError, match="1.3X"):
        count("1.3X")
    code, out, _ = _estimate(capsys, "time", "--params", "20B", "--tokens", "1T", "--gpus", "1K", "--gpu", "H100", "--json")
    result = json.loads(out)
    assert code == 0 and (result["n_params"], result["tokens"], result["gpus"]) == (20_000_000_000, 1e12, 1000)


@pytest.mark.unit
def test_memory_and_fit_tables_filter_by_precision_and_stage(capsys):
    code, out, _ = _estimate(capsys, "memory", "--params", "1B", "--world-size", "8", "--precision", "bf16",
                             "--zero-stage", "2", "3", "--json")
    assert code == 0 and [(r["precision"], r["zero_stage"]) for r in json.loads(out)["rows"]] == [("bf16", 2), ("bf16", 3)]
    code, out, _ = _estimate(capsys, "fit", "--gpu-memory", "80", "--world-size", "8", "--zero-stage", "3", "--json")
    assert code == 0 and [(r["precision"], r["zero_stage"]) for r in json.loads(out)["rows"]] == [
        ("fp32", 3), ("fp16", 3), ("bf16", 3)]


@pytest.mark.unit
def test_an_unknown_option_is_the_subcommands_error_with_its_usage(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["estimate", "memory", "--params", "1e9", "--precison", "bf16"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.startswith("usage: scalelab estimate memory ")
    assert err.rstrip().endswith("scalelab estimate memory: error: unrecognized arguments: --precison bf16")


@pytest.mark.unit
def test_claim_says_when_an_implied_mfu_is_too_low_to_be_right(capsys):
    """It printed 'implied MFU 0.0%: plausible': no lower bound, a percentage rounded to zero, and
    --params 1.3 (meaning billions) truncated by int() to one parameter."""
    code, _, err = _estimate(capsys, "claim", "--params", "1.3", "--tokens-per-s", "2M", "--gpus", "8", "--gpu", "H100")
    assert code == 2 and "--params 1.3 is 1.3 parameters, a count: write 1.3B" in err
    code, out, _ = _estimate(capsys, "claim", "--params", "1.3B", "--tokens", "1e9", "--days", "30", "--gpus", "8",
                             "--gpu", "H100")
    assert code == 0 and "implied MFU 0.038%: implausibly low" in out and "0.0%" not in out
    code, out, _ = _estimate(capsys, "claim", "--params", "1.3B", "--tokens-per-s", "100K", "--gpus", "8", "--gpu", "H100")
    assert code == 0 and "implied MFU 9.9%: plausible" in out


@pytest.mark.unit
def test_time_takes_the_mfu_a_sweep_measured(tmp_path, capsys):
    pd.DataFrame({
        "run_id": ["fp32-z0-w1", "fp32-z0-w2", "fp32-z3-w2", "fp32-z1-w2", "bf16-z0-w1"],
        "status": ["ok", "ok", "ok", "failed", "ok"],
        "precision": ["fp32", "fp32", "fp32", "fp32", "bf16"],
        "mfu": [0.10, 0.30, 0.20, None, 0.05],
        "device_type": ["cpu"] * 5,
        "device_name": ["AMD EPYC"] * 5,
    }).to_parquet(tmp_path / "metrics.parquet")
    base = ["time", "--params", "1B", "--tokens", "1e10", "--gpus", "8", "--gpu", "H100", "--precision", "fp32"]
    code, out, _ = _estimate(capsys, *base, "--mfu-from", str(tmp_path), "--json")
    result = json.loads(out)
    assert code == 0 and result["mfu"] == pytest.approx(0.20)  # the median of the three ok fp32 runs
    assert result["mfu_source"]["runs"] == ["fp32-z0-w1", "fp32-z0-w2", "fp32-z3-w2"]
    assert "says nothing about what a GPU reaches" in result["note"]
    code, out, _ = _estimate(capsys, *base, "--mfu-from", str(tmp_path))
    assert "MFU 20.0% measured: the median of 3 ok fp32 run(s)" in out and "measured on CPU" in out
    code, _, err = _estimate(capsys, *base[:-1], "fp16", "--mfu-from", str(tmp_path))
    assert code == 2 and "no ok run of precision fp16 with an MFU (precisions measured: bf16, fp32)" in err
    code, _, err = _estimate(capsys, *base, "--mfu", "0.4", "--mfu-from", str(tmp_path))
    assert code == 2 and "not both" in err
    code, _, err = _estimate(capsys, *base, "--mfu-from", str(tmp_path / "nowhere"))
    assert code == 2 and "scalelab collect" in err


@pytest.mark.unit
def test_estimate_says_whether_fp8_pays_at_the_models_width(capsys):
    code, out, _ = _estimate(capsys, "memory", "--model", "gpt2-medium", "--world-size", "8")
    assert code == 0 and "fp8 against bf16: costs at d_model 1024: about 0.84x bf16" in out and "H200" in out
    code, out, _ = _estimate(capsys, "memory", "--params", "1e9", "--world-size", "8")
    assert code == 0 and "fp8 against bf16" not in out  # no shape, no width to judge by


@pytest.mark.unit
def test_an_mfu_prints_as_given_not_rounded_to_a_whole_percent(capsys):
    """`estimate time --mfu 0.397` printed "MFU 40%" (issue #41)."""
    code, out, _ = _estimate(capsys, "time", "--params", "1e9", "--tokens", "1e12", "--gpus", "8", "--gpu", "H100",
                             "--mfu", "0.397")
    assert code == 0 and "at MFU 39.7%:" in out, out


@pytest.mark.unit
def test_every_override_flag_wins_over_a_presets_field(capsys):
    """--seq, --vocab and --untied with --model: the flag wins over the preset's own context, vocabulary and
    head (issue #44: `estimate scaling --model llama3-8b --seq 8192` stopped with a TypeError)."""
    import argparse

    from scalelab.analysis.estimate import _model
    from scalelab.presets import PRESETS

    base = dict(model="gpt2-medium", params=None, config=None, layers=None, d_model=None, heads=None, vocab=None, seq=None,
                untied=False)
    _, plain = _model(argparse.Namespace(**base))
    assert (plain.seq_len, plain.vocab_size, plain.tie_embeddings) == tuple(
        PRESETS["gpt2-medium"].shape[k] for k in ("seq_len", "vocab_size", "tie_embeddings"))
    n, cfg = _model(argparse.Namespace(**{**base, "seq": 8192, "vocab": 50_000, "untied": True}))
    assert (cfg.seq_len, cfg.vocab_size, cfg.tie_embeddings) == (8192, 50_000, False) and n > _model(argparse.Namespace(**base))[0]
    for kind, extra in (("memory", ["--world-size", "8"]), ("time", ["--tokens", "1e9", "--gpus", "8", "--gpu", "H100"]),
                        ("scaling", ["--gpu", "H100", "--gpus", "8,16", "--zero-stage", "3", "--inter-node", "ib-ndr"])):
        for flags in (["--seq", "8192"], ["--vocab", "50000"], ["--untied"]):
            code, _, err = _estimate(capsys, kind, "--model", "llama3-8b", *flags, *extra)
            assert code == 0, (kind, flags, err)
