"""The report's formulas section is written for the sweep it reports (issue #42: it was GPT-2's, with no
Llama, LoRA or hybrid, for every sweep): each family's formulas, the strategy lines generated from
their records (scalelab.registries.strategies), LoRA and hybrid lines where such runs are."""
import pandas as pd

from scalelab.config import SCHEMA
from scalelab.registries.strategies import HYBRID, STRATEGIES
from scalelab.report.formula_section import FAMILY_FORMULAS, comm_text, formulas_html, model_state_text


def _runs(family="gpt2", stages=(0, 1, 2, 3), replicas=1, lora=None):
    return pd.DataFrame({"model_family": family, "zero_stage": list(stages), "replicas": replicas, "lora_rank": lora})


def test_every_family_of_the_schema_has_its_formulas():
    enum = SCHEMA["properties"]["models"]["additionalProperties"]["properties"]["family"]["enum"]
    assert set(FAMILY_FORMULAS) == {*enum, "custom"}


def test_the_strategy_lines_come_from_their_records():
    # PyTorch's 4 + 4 + 8 bytes, the paper's 2 + 2 + 12, sharded as each record says
    assert [model_state_text(STRATEGIES[s]) for s in range(4)] == ["16Ψ", "8Ψ + 8Ψ/N", "16Ψ/N", "16Ψ/N"]
    assert [model_state_text(STRATEGIES[s], paper=True) for s in range(4)] == ["16Ψ", "4Ψ + 12Ψ/N", "2Ψ + 14Ψ/N", "16Ψ/N"]
    assert [comm_text(STRATEGIES[s]) for s in range(4)] == ["2Ψ", "3Ψ", "2Ψ, (k + 1)Ψ with k micro-batches",
                                                          "3Ψ, (2k + 1)Ψ with k micro-batches"]
    assert comm_text(HYBRID).endswith("plus 2Ψ/S all-reduced across the replicas (S = N/R, a shard group)")
    assert model_state_text(HYBRID) == "16Ψ/S"  # sharded over the shard group, not the world


def test_the_section_names_what_the_sweep_ran():
    gpt = formulas_html(_runs())
    assert "12d² + 13d" in gpt and "SwiGLU" not in gpt and "LoRA" not in gpt and "hybrid" not in gpt.lower()
    llama = formulas_html(_runs("llama", stages=(3,)))
    assert "2·V·d + L·(2d² + 2·d·kv + 3·d·f + 2d)" in llama and "12d² + 13d" not in llama
    assert "stage 3" in llama and "stage 0" not in llama and "DDP buckets" not in llama  # FSDP2 only: no buckets
    both = formulas_html(pd.concat([_runs(), _runs("llama")]))
    assert "gpt2: " in both and "llama: " in both
    hybrid = formulas_html(_runs(stages=(3,), replicas=2))
    assert "across the replicas" in hybrid and "Hybrid sharding divides" in hybrid
    assert "<b>LoRA</b>" in formulas_html(_runs(lora=8))
    # one rank trains without DDP: stage 0 and FSDP2 issue nothing there, ZeRO-1 still does
    assert "On one rank stage 0, stage 2, stage 3 issue no collectives" in gpt
