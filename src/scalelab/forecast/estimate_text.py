"""`scalelab estimate`'s results as text: one table per subcommand."""
from __future__ import annotations

# The precisions whose records say they have a memory convention of their own (fp8 holds bf16's
from scalelab.forecast.estimate import _human, _mfu_text, _percent
from scalelab.forecast.inputs import (
    UNITS,
)
from scalelab.registries.strategies import HYBRID_KEY


def _size(value: float) -> str:
    """A memory figure in a table's unit to three decimals, or to three significant digits where those would print a
    nonzero size as 0.000 (a tiny model's)."""
    return f"{value:>10.3f}" if value == 0 or value >= 0.0005 else f"{value:>10.3g}"


_COLLECTIVE_SHORT = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "broadcast": "BC"}


def _mfu_origin(a: dict) -> str:
    if "mfu_source" in a:
        source = a["mfu_source"]
        return (f"measured: the median of {len(source['runs'])} ok world-size-1 run(s) of {source['results']}, "
                f"{', '.join(source['devices']) or 'an unnamed device'}")
    return "default; --mfu" if a["mfu_default"] else "--mfu"


def _render_pipeline(r: dict, first: dict) -> list[str]:
    """estimate scaling's pipeline lines (none without pipelining): at the largest count, its bubble, sends and memory
    per stage, and how a pipelined step is read."""
    lines: list[str] = []
    if r.get("pipeline_parallel", 1) > 1:
        pl = first["pipeline"]
        memory = ", ".join(f"{s['peak_memory_bytes'] / UNITS['GiB']:.1f}" for s in pl["stages"])
        lines.append(f"pipeline parallelism: {r['pipeline_parallel']} stages, {r['pipeline_schedule']}, at {first['gpus']} "
                     f"GPUs {pl['microbatches']} micro-batches per step: bubble {_percent(pl['bubble_fraction'])} "
                     f"({pl['bubble_s'] * 1e3:.1f} ms); sends {pl['boundary_bytes'] / 1e6:.3g} MB per micro-batch and "
                     f"boundary, {pl['p2p_sent_bytes'] / 1e9:.3g} GB per step from the busiest rank over {pl['p2p_link']} "
                     f"({'across nodes' if pl['p2p_across_nodes'] else 'within a node'}), {pl['p2p_s'] * 1e3:.1f} ms"
                     + (f"; tied embedding sync {pl['tied_sync_s'] * 1e3:.1f} ms" if pl["tied_sync_bytes"] else "")
                     + f"; peak GiB per stage: {memory}")
        lines.append(f"pipeline step: {r['pipeline_reading']}")
    return lines


def _scaling_header(r: dict) -> list[str]:
    """estimate scaling's first lines: the configuration, its compute and the trainer priced."""
    a = r["assumptions"]
    shape = r["shape"]
    model = (f"{r['model']} ({_human(r['n_params'])} parameters)" if "model" in r else
             f"a {shape['family']} of {_human(r['n_params'])} parameters ({shape['n_layers']} layers, d_model "
             f"{shape['d_model']}, {shape['n_heads']} heads)")
    how = "hybrid sharding" if r["zero_stage"] == HYBRID_KEY else f"ZeRO stage {r['zero_stage']}"
    t = r.get("tensor_parallel", 1)
    per = "GPU" if t == 1 else f"tensor-parallel group of {t} GPUs"
    batch = (f"global batch {r['global_batch']} sequences (each {per}'s share in micro-batches of at most "
             f"{r['micro_batch']}, accumulated)" if r.get("global_batch") else
             f"micro-batch {r['micro_batch']} per {per} ({r['tokens_per_gpu_per_step']:,.0f} tokens per GPU per step)")
    recompute = (f" + {r['recompute_flops_per_token']:.3g} recomputed (activation checkpointing; MFU counts model FLOPs only)"
                 if r.get("activation_checkpointing") else "")
    lines = [f"PREDICTION, not a measurement: {model}, {how} "
             f"({r['strategy']}), {r['precision']}, seq {r['seq_len']}, {batch}, {r['gpu']}, {r['gpus_per_node']} GPUs per node",
             f"compute: {r['flops_per_token']:.3g} FLOP/token{recompute} at MFU "
             f"{_mfu_text(a['mfu_without_communication'], 'mfu_source' in a, a['mfu_default'])} "
             f"without communication ({_mfu_origin(a)}) of the {r['precision']} dense peak "
             f"{r['peak_flops_per_gpu'] / 1e12:.1f} TFLOP/s = {r['rows'][0]['compute_s'] * 1e3:.1f} ms per step"
             + (f" at {r['rows'][0]['gpus']} GPUs (each GPU's share of the global batch shrinks as GPUs grow)"
                if r.get("global_batch") else "")]
    lines.append(f"trainer priced: {r['trainer']} ({r['trainer_priced']}); gradients reduced in "
                 f"{'fp32' if r['grad_reduce'] == 'fp32' else 'the compute dtype'}")
    return lines


def _scaling_links(a: dict) -> list[str]:
    """Each link as taken: nominal x efficiency = achieved, its latency and its source."""
    lines = []
    for side in ("intra_node", "inter_node"):
        link = a[side]
        if link:
            eff = (f" x efficiency {link['efficiency']:.2f}" + (" (default; --link-efficiency)" if a["link_efficiency_default"]
                                                                 and link["efficiency"] != 1 else "")
                   if link["efficiency"] != 1 else " (measured)")
            lines.append(f"{side.replace('_', '-')} link: {link['name']}, {link['bandwidth_gb_per_s']:.4g} GB/s per GPU{eff} = "
                         f"{link['achievable_gb_per_s']:.4g} GB/s, "
                         + ("latency by NCCL's model, per group and call " if link.get("latency_model") == "nccl" else
                            f"latency {link['latency_us']:.3g} us per call ")
                         + f"({link['source']})")
    return lines


def _scaling_collectives(r: dict, first: dict) -> list[str]:
    """The collectives per step at the largest count, and tensor parallelism's apart."""
    lines = ["collectives per step (nccl-tests size, calls): " + ", ".join(
        f"{c} {first['collective_bytes'][c] / 1e9:.3g} GB in {first['collective_calls'][c]}" for c in first["collective_bytes"])]
    if r.get("tensor_parallel", 1) > 1:
        tp = first["tensor_parallel_comm"]
        kinds = ", ".join(f"{c} {v['size_bytes'] / 1e9:.3g} GB in {v['calls']}" for c, v in tp["collectives"].items())
        lines.append(f"tensor parallelism: {r['tensor_parallel']} GPUs split every block (the strategy runs over "
                     f"GPUs / {r['tensor_parallel']} data-parallel ranks, each GPU holds 1/{r['tensor_parallel']} of the "
                     f"blocks' linears): per step {kinds} (nccl-tests size: the buffers reduced or gathered); a ring moves "
                     f"{tp['ring_bytes_per_gpu'] / 1e9:.3g} GB per GPU of it (x the bus factor) over {tp['link']}, "
                     f"{tp['seconds'] * 1e3:.1f} ms" + (" on the critical path (exposed: no schedule here hides them)"
                                                        if tp["exposed"] else f", {tp['exposed_s'] * 1e3:.1f} ms of it on the "
                                                        "critical path (userbuffers overlap the rest with the blocks' GEMMs)"))
    return lines


def _scaling_row(row: dict, piped: bool) -> str:
    """One GPU count's line of the table."""
    comm = sum(row["comm_s"].values()) + row.get("tensor_parallel_comm", {}).get("seconds", 0.0)
    by_link: dict[str, list[str]] = {}
    for c, name in row["links"].items():
        by_link.setdefault(name, []).append(_COLLECTIVE_SHORT[c])
    link = next(iter(by_link)) if len(by_link) == 1 else " ".join(f"{'+'.join(cs)}:{name}" for name, cs in by_link.items())
    if row.get("tensor_parallel", 1) > 1:
        kinds = "+".join(_COLLECTIVE_SHORT[c] for c in row["tensor_parallel_comm"]["collectives"]) or "AR"
        link = f"TP {kinds}:{row['tensor_parallel_comm']['link']}" + (f", {link}" if by_link else "")
    memory = f"{row['peak_memory_gib']:.1f} GiB" + ("" if row["fits_memory"] else "!")
    batching = f"{row['micro_batch']} x {row['accumulation_steps']}"
    return (f"{row['gpus']:>5} {row['nodes']:>5} {batching:>8} "
            f"{row['step_time_s'] * 1e3:>8.1f} "
            f"{row['compute_s'] * 1e3:>8.1f} {comm * 1e3:>8.1f} {row['exposed_comm_s'] * 1e3:>8.1f} "
            + (f"{row['pipeline']['bubble_fraction']:>7.1%} {row['pipeline']['p2p_s'] * 1e3:>7.1f} " if piped else "")
            + f"{row['tokens_per_s_per_gpu']:>10,.0f} {row['mfu']:>6.1%} {row['scaling_efficiency']:>7.1%} "
            f"{memory:>9}  {link or '-'}")


def _render_scaling(r: dict) -> list[str]:
    """estimate scaling's text: the assumptions, then one line per GPU count."""
    a, first = r["assumptions"], r["rows"][-1]
    lines = _scaling_header(r) + _scaling_links(a) + _scaling_collectives(r, first)
    lines += _render_pipeline(r, first)
    lines.append(f"overlap: {a['overlap']}; overlap efficiency {a['overlap_efficiency']:g}"
                 + (" (default; --overlap-efficiency)" if a["overlap_efficiency_default"] else ""))
    lines.append(f"rule: {a['link_rule']}; out of scope: {a['out_of_scope']}")
    piped = r.get("pipeline_parallel", 1) > 1
    lines.append(f"{'gpus':>5} {'nodes':>5} {'mb x acc':>8} {'step ms':>8} {'compute':>8} {'comm':>8} {'exposed':>8} "
                 + (f"{'bubble':>7} {'P2P ms':>7} " if piped else "")
                 + f"{'tok/s/GPU':>10} {'MFU':>6} {'scaling':>7} {'memory':>9}  links")
    lines += [_scaling_row(row, piped) for row in r["rows"]]
    if not all(row["fits_memory"] for row in r["rows"]):
        lines.append(f"! the predicted peak per GPU exceeds the {r['gpu']}'s memory less the reserve a prediction "
                     "does not count (the budget scalelab plan ranks by): the run would not fit")
    lines.append("every figure above is predicted; times in ms per optimizer step; comm = every collective's time, "
                 "exposed = what overlap leaves on the step" + (" (with the pipeline's sends, P2P ms, which comm does "
                                                                  "not count)" if piped else "")
                 + "; scaling = tokens/s per GPU against the smallest count"
                 + ("; AR all-reduce, RS reduce-scatter, AG all-gather, BC broadcast" if any(
                     len(set(row["links"].values())) > 1 for row in r["rows"]) else ""))
    return lines


def _render_memory(result: dict) -> list[str]:
    u = result["unit"].lower()
    named = f"{result['model']} ({result['family']}, {result['n_params']:,} parameters)" if "model" in result else \
        f"{_human(result['n_params'])} parameters"
    tp = result["rows"][0].get("tensor_parallel", 1) if result["rows"] else 1
    lines = [f"model state per rank for {named} at world size {result['world_size']}"
             + (f" = {result['world_size'] // tp} data-parallel x {tp} tensor-parallel ranks (each holds 1/{tp} of "
                "the blocks' linears; the stage works over the data-parallel ranks)" if tp > 1 else "")
             + f" ({result['unit']})"]
    extra = f"activations_{u}" in result["rows"][0]
    head = f"{'precision':<9} {'stage':>5} {'params':>10} {'grads':>10} {'optimizer':>10} {'total':>10} {'paper':>10}"
    lines.append(head + (f" {'activ.':>10} {'peak':>10}" if extra else ""))
    keys = ["pytorch_params", "pytorch_grads", "pytorch_optimizer", "pytorch_total", "paper_total",
            *(["activations", "peak"] if extra else [])]
    for r in result["rows"]:
        lines.append(f"{r['precision']:<9} {r['zero_stage']:>5} " + " ".join(_size(r[f"{k}_{u}"]) for k in keys))
    return lines


def _render_time(r: dict) -> list[str]:
    lines = [(f"{r['model']} ({r['family']}): " if "model" in r else "") +
             f"{_human(r['n_params'])} parameters x {_human(r['tokens'])} tokens = {r['total_flops']:.3e} FLOPs ({r['flops_rule']})",
             f"on {r['gpus']} x {r['gpu']} ({r['precision']} dense peak {r['peak_flops_per_gpu'] / 1e12:.1f} TFLOP/s) "
             f"at MFU {_mfu_text(r['mfu'], 'mfu_source' in r, r.get('mfu_default', False))}:",
             f"  {r['days']:.2f} days ({r['gpu_hours']:.4g} GPU-hours)"]
    if "mfu_source" in r:
        source = r["mfu_source"]
        lines.append(f"MFU {_percent(r['mfu'])} measured: the median of {len(source['runs'])} ok {source['precision']} "
                     f"run(s) of {source['results']} ({', '.join(source['runs'])}) on "
                     f"{', '.join(source['devices']) or 'an unnamed device'}")
    return lines


def _render_advise(result: dict) -> list[str]:
    u = result["unit"].lower()
    lines = [f"{_human(result['n_params'])} parameters, {result['precision']}, {result['gpus']} GPUs of "
             f"{result[f'gpu_memory_{u}']:g} {result['unit']}" + (f", micro-batch {result['micro_batch']}" if result["micro_batch"] else ""),
             f"fits: within {result[f'budget_{u}']:.3g} {result['unit']} per GPU, the GPU's memory less a "
             f"{result[f'reserve_{u}']:.3g} {result['unit']} reserve (CUDA context, NCCL buffers, fragmentation: "
             "--reserve-gib; scalelab plan keeps the same and ranks what fits by time)",
             f"{'rung':<52} {'state':>9} {'in-step':>9} {'total':>9}  fits"]
    for r in result["rungs"]:
        lines.append(f"{r['rung']:<52} {r[f'model_state_{u}']:>9.2f} {r[f'in_step_{u}']:>9.2f} {r[f'total_{u}']:>9.2f}  "
                     + ("yes" if r["fits"] else "no"))
    if "lora" in result and "max_rank" in result["lora"]:
        lora = result["lora"]
        lines.append(f"{'LoRA at ZeRO stage ' + str(lora['zero_stage']):<52} {lora[f'frozen_and_in_step_{u}']:>9.2f} "
                     f"+ {lora[f'per_rank_{u}']:.4f} per rank: up to r={lora['max_rank']}")
    lines.append(f"advice: {result['advice']}")
    return lines


def _render_claim(r: dict) -> list[str]:
    return [f"{_human(r['n_params'])} parameters at {_human(r['tokens_per_s'])} tokens/s on {r['gpus']} x {r['gpu']}: "
            f"{r['tokens_per_s'] * r['flops_per_token']:.3e} FLOP/s against {r['gpus']} x "
            f"{r['peak_flops_per_gpu'] / 1e12:.1f} TFLOP/s ({r['precision']} dense peak)",
            f"implied MFU {_percent(r['implied_mfu'])}: {r['verdict']}"]


def _render_models(result: dict) -> list[str]:
    lines = [f"{'model':<12} {'family':<6} {'params':>15} {'layers':>6} {'d_model':>7} {'heads':>5} {'kv':>3} "
             f"{'ffn':>6} {'vocab':>6} {'seq':>5}  source"]
    for r in result["rows"]:
        lines.append(f"{r['model']:<12} {r['family']:<6} {r['n_params']:>15,} {r['n_layers']:>6} {r['d_model']:>7} "
                     f"{r['n_heads']:>5} {r['n_kv_heads'] or '-':>3} {r['ffn_dim']:>6} {r['vocab_size']:>6} "
                     f"{r['seq_len']:>5}  {r['source']}")
    return lines


def _render_links(result: dict) -> list[str]:
    lines = [f"{'link':<16} {'GB/s':>7} {'lat us':>6}  source"]
    for r in result["rows"]:
        lines.append(f"{r['link']:<16} {r['bandwidth_gb_per_s']:>7.4g} {r['latency_us']:>6g}  {r['source']}")
    return lines


def _render_fit(result: dict) -> list[str]:
    u = result["unit"].lower()
    lines = [f"largest model whose model state fits {result[f'gpu_memory_{u}']:g} {result['unit']} per GPU x {result['world_size']} GPUs",
             f"{'precision':<9} {'stage':>5} {'pytorch':>10} {'paper':>10}"]
    for r in result["rows"]:
        lines.append(f"{r['precision']:<9} {r['zero_stage']:>5} {_human(r['pytorch_max_params']):>10} {_human(r['paper_max_params']):>10}")
    return lines


_RENDERERS = {"memory": _render_memory, "time": _render_time, "advise": _render_advise, "claim": _render_claim,
              "models": _render_models, "links": _render_links, "scaling": _render_scaling, "fit": _render_fit}
"""Each subcommand's text (estimate_command.run's kinds)."""


def render(kind: str, result: dict) -> str:
    lines = _RENDERERS[kind](result)
    if "fp8" in result:
        lines.append(f"fp8 against bf16: {result['fp8']['verdict']} (an estimate: {result['fp8']['basis']})")
    if "note" in result:
        lines.append(f"note: {result['note']}")
    return "\n".join(lines)
