"""Results taken where people work (issue #45): TensorBoard event files read back with TensorBoard's own
reader, and the best configuration as a trainer's configuration, held against that trainer's keys."""
import json

import pytest
import tomllib

from devtools.fixtures import synthetic_results
from scalelab.cli import main
from scalelab.report.export import STEP_SCALARS, export_config, pick_run
from scalelab.report.report import load_tables


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = tmp_path_factory.mktemp("export")
    synthetic_results(path, n_runs=40, n_steps=12)
    return path


def test_tensorboard_holds_every_run_and_every_scalar(results, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs, steps = load_tables(results)
    assert main(["export", "tensorboard", str(results), str(tmp_path / "tb")]) == 0
    for row in runs.to_dict("records"):
        events = EventAccumulator(str(tmp_path / "tb" / str(row["run_id"])))
        events.Reload()
        mine = steps[steps["run_id"].astype(str) == str(row["run_id"])]
        for column, tag in STEP_SCALARS.items():
            expected = mine[["step", column]].dropna()
            if expected.empty:  # e.g. loss_scale outside fp16: no scalar at all
                assert tag not in events.Tags()["scalars"]
                continue
            got = events.Scalars(tag)
            assert [e.step for e in got] == expected["step"].astype(int).tolist()
            assert [e.value for e in got] == pytest.approx(expected[column].astype(float).tolist(), rel=1e-6)
        assert "final/tokens_per_s" in events.Tags()["scalars"] or row["status"] != "ok"
        # the HParams table: the run's axes (its plugin data names them)
        plugin = events.PluginTagToContent("hparams")
        assert plugin and any(b"zero_stage" in content for content in plugin.values())
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == sorted(runs["run_id"].astype(str))


def test_export_without_tables_names_the_folder(tmp_path, capsys):
    assert main(["export", "tensorboard", str(tmp_path), str(tmp_path / "tb")]) == 2
    assert "metrics.parquet is missing" in capsys.readouterr().err
    assert main(["export", "config", str(tmp_path), "--to", "hf"]) == 2


# Each trainer's documented keys (what its own parser accepts), from its source:
# torchtitan/config/job_config.py (JobConfig's dataclasses), transformers' TrainingArguments fields,
# Lightning's Trainer and strategy arguments.
TORCHTITAN_KEYS = {
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "max_norm", "mixed_precision_param",
                 "mixed_precision_reduce", "compile"},
    "model": {"converters"}, "activation_checkpoint": {"mode"},
}
TORCHTITAN_VALUES = {"fsdp_reshard_after_forward": {"default", "always", "never"},
                     "mixed_precision_param": {"bfloat16", "float32"}, "mixed_precision_reduce": {"float32"},
                     "mode": {"selective", "full", "none"}}
HF_KEYS = {"per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "gradient_checkpointing",
           "torch_compile", "max_grad_norm", "fsdp", "fsdp_config"}


def test_the_best_run_as_each_trainers_configuration(results, capsys):
    runs, _ = load_tables(results)
    from scalelab.report.tables import best_configurations

    best = pick_run(runs, None)  # the report's best point at the largest world size (median of its repeats)
    table = best_configurations(runs).dropna(subset=["run_id"]).sort_values("world_size")
    assert best["run_id"] == table["run_id"].iloc[-1] and best["tokens_per_s"] == table["tokens_per_s"].iloc[-1]
    assert best["_standing"].startswith(f"the best at world size {table['world_size'].iloc[-1]}")
    assert best["_standing"] in export_config(results, "torchtitan", None)[0].splitlines()[0]
    for row in runs[runs["status"] == "ok"].drop_duplicates(["precision", "zero_stage", "replicas"]).to_dict("records"):
        toml = tomllib.loads(export_config(results, "torchtitan", row["run_id"])[0])
        for section, keys in toml.items():
            assert set(keys) <= TORCHTITAN_KEYS[section], (section, set(keys) - TORCHTITAN_KEYS[section])
            for key, value in keys.items():
                assert key not in TORCHTITAN_VALUES or value in TORCHTITAN_VALUES[key], (key, value)
        parallel = toml["parallelism"]
        assert parallel["data_parallel_replicate_degree"] * parallel["data_parallel_shard_degree"] == row["world_size"]
        if row["zero_stage"] == 0:
            assert parallel["data_parallel_shard_degree"] == 1
        elif row["zero_stage"] == 3:
            assert parallel["fsdp_reshard_after_forward"] == "always"
            assert parallel["data_parallel_replicate_degree"] == int(row["replicas"])
        assert toml["training"]["mixed_precision_param"] == ("bfloat16" if row["precision"] in ("bf16", "fp8") else "float32")
        text, notes = export_config(results, "hf", row["run_id"])
        hf = json.loads(text)  # TrainingArguments' fields alone: the notes are printed apart
        assert set(hf) <= HF_KEYS and hf["bf16"] == (row["precision"] == "bf16") and row["run_id"] in notes[0]
        assert ("fsdp" in hf) == (row["zero_stage"] > 0)
        if row["zero_stage"] == 3:
            assert hf["fsdp"].split()[0] == ("hybrid_shard" if row["replicas"] > 1 else "full_shard")
        code = export_config(results, "lightning", row["run_id"])[0]
        compile(code, "<lightning>", "exec")  # Python that runs where Lightning is installed
        assert f"devices={row['world_size']}" in code
        assert {"fp32": '"32-true"', "fp16": '"16-mixed"', "bf16": '"bf16-mixed"'}.get(row["precision"], "") in code
    # clipping off, a LoRA run, two nodes: said, not guessed
    row = {**pick_run(runs, None), "grad_clip": 0.0, "lora_rank": 8, "world_size": 16, "nodes_used": 2, "zero_stage": 3}
    from scalelab.report.export import hf_arguments, lightning_code, torchtitan_toml

    assert "max_norm" not in tomllib.loads(torchtitan_toml(row))["training"] and "without clipping" in torchtitan_toml(row)
    args, notes = hf_arguments(row)
    assert args["max_grad_norm"] == 0.0 and any(n.startswith("not carried: LoRA rank 8") for n in notes)
    assert "devices=8, num_nodes=2" in lightning_code(row) and "gradient_clip_val=None" in lightning_code(row)
    assert "# not carried: LoRA rank 8" in lightning_code(row)
    assert main(["export", "config", str(results), "--to", "torchtitan", "--run", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


def test_a_pipeline_run_exports_its_stages_and_data_parallel_ranks(results):
    """A two-stage 1F1B run over 8 ranks at ZeRO-3: torchtitan's TOML holds its pipeline (degree, schedule by
    torchtitan's name, micro-batch size) and shards over its 4 data-parallel ranks; the other trainers say they do not
    carry it."""
    from scalelab.report.export import hf_arguments, torchtitan_toml

    runs, _ = load_tables(results)
    row = {**pick_run(runs, None), "world_size": 8, "zero_stage": 3, "replicas": 1, "tensor_parallel": 1,
           "pipeline_parallel": 2, "pipeline_schedule": "1f1b", "micro_batch": 1, "accumulation_steps": 4}
    toml = tomllib.loads(torchtitan_toml(row))
    assert toml["parallelism"]["pipeline_parallel_degree"] == 2
    assert toml["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
    assert toml["parallelism"]["data_parallel_shard_degree"] == 4
    assert toml["training"]["global_batch_size"] == 1 * 4 * 4
    # torchtitan's schedule runs local_batch_size / pipeline_parallel_microbatch_size micro-batches a step: the
    # run's 4, not 4 accumulated steps of a one-micro-batch pipeline (a bubble of one half)
    training, parallel = toml["training"], toml["parallelism"]
    assert training["local_batch_size"] // parallel["pipeline_parallel_microbatch_size"] == 4
    assert training["local_batch_size"] * parallel["data_parallel_shard_degree"] == training["global_batch_size"]
    assert any("pipeline parallelism over 2 stages" in note for note in hf_arguments(row)[1])


def test_the_hf_file_loads_in_transformers_as_written(results, tmp_path, capsys):
    """`export config --to hf > args.json` holds TrainingArguments' own keys alone (notes go to stderr), so that
    HfArgumentParser takes the file where transformers is installed; elsewhere the keys are held to its fields."""
    row = pick_run(load_tables(results)[0], None)
    assert main(["export", "config", str(results), "--to", "hf", "--run", row["run_id"]]) == 0
    out, err = capsys.readouterr()
    args = json.loads(out)
    assert set(args) <= HF_KEYS and not any(k.startswith("_") for k in args), args
    assert f"note: scalelab run {row['run_id']}" in err
    transformers = pytest.importorskip("transformers", reason="transformers not installed: the keys are held to HF_KEYS above")
    (tmp_path / "args.json").write_text(json.dumps({**args, "output_dir": str(tmp_path)}))
    transformers.HfArgumentParser(transformers.TrainingArguments).parse_json_file(str(tmp_path / "args.json"))


def test_a_run_that_did_not_end_ok_is_refused_in_one_line(results, capsys):
    runs, _ = load_tables(results)
    failed = runs[runs["status"] != "ok"]
    assert not failed.empty, "the fixture has runs that did not end ok"
    run_id = failed["run_id"].iloc[0]
    for trainer in ("hf", "torchtitan", "lightning"):
        assert main(["export", "config", str(results), "--to", trainer, "--run", run_id]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: run '{run_id}' ended {failed['status'].iloc[0]}") and "\n" not in err, err


def test_a_run_id_that_is_no_folder_name_writes_nothing_outside(results, tmp_path, capsys):
    """A run id read back from disk is checked against the run-id grammar before a path is built from it."""
    import pyarrow.parquet as pq

    tampered = tmp_path / "tampered"
    tampered.mkdir()
    table = pq.read_table(results / "metrics.parquet")
    ids = table.column("run_id").to_pylist()
    ids[0] = "../../escaped"
    pq.write_table(table.set_column(table.schema.get_field_index("run_id"), "run_id", [ids]), tampered / "metrics.parquet")
    pq.write_table(pq.read_table(results / "steps.parquet"), tampered / "steps.parquet")
    pytest.importorskip("tensorboard", reason="export tensorboard needs the tensorboard package")
    assert main(["export", "tensorboard", str(tampered), str(tmp_path / "out" / "tb")]) == 2
    assert "run id '../../escaped' is not one" in capsys.readouterr().err
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "out" / "escaped").exists()


def test_every_export_names_the_trainer_and_strategy_it_was_measured_with(results):
    """What another trainer's configuration carries over, and how scalelab ran it: ZeRO-1 is DDP with
    ZeroRedundancyOptimizer here, not Megatron's distributed optimizer (scalelab plan --trainer says which it prices)."""
    runs, _ = load_tables(results)
    for row in runs[runs["status"] == "ok"].drop_duplicates(["zero_stage"]).to_dict("records"):
        from scalelab.registries.strategies import strategy

        name = strategy(int(row["zero_stage"]), int(row.get("replicas") or 1)).name
        toml, _ = export_config(results, "torchtitan", row["run_id"])
        code, _ = export_config(results, "lightning", row["run_id"])
        _, notes = export_config(results, "hf", row["run_id"])
        for text in (toml, code, "\n".join(notes)):
            assert f"measured with scalelab's own trainer ({name}" in text and "--trainer scalelab" in text, text[:300]


PLAN = ["plan", "--model", "llama3.2-1b", "--gpus", "16", "--gpu", "H100", "--inter-node", "ib-ndr", "--global-batch", "64",
        "--seq", "4096", "--tokens", "1T", "--json"]


def _plan_file(tmp_path, capsys, trainer: str):
    assert main([*PLAN, "--trainer", trainer]) == 0
    path = tmp_path / f"plan-{trainer}.json"
    path.write_text(capsys.readouterr().out)
    return path, [r for r in json.loads(path.read_text())["rows"] if r["fits"]]


def _rank_of(fitting: list[dict], **wanted) -> int:
    return next(i for i, r in enumerate(fitting, 1) if all(r[k] == v for k, v in wanted.items()))


def test_a_plans_pick_exports_naming_the_trainer_it_was_priced_as(tmp_path, capsys):
    """scalelab plan --json, then export config PLAN: the pick as each trainer's configuration, its degrees those the plan
    priced, and the trainer whose implementation priced it named in every export (a user who runs torchtitan on a
    configuration priced as nanotron runs it is told)."""
    from scalelab.registries.strategies import TRAINERS

    path, fitting = _plan_file(tmp_path, capsys, "megatron")
    for rank in (1, _rank_of(fitting, strategy=1, tensor_parallel=2, pipeline_parallel=1)):
        row = fitting[rank - 1]
        text, _ = export_config(path, "torchtitan", None, rank)
        assert text.startswith("# scalelab plan (predicted, not measured): llama3.2-1b")
        assert f"# priced by scalelab plan --trainer megatron: {TRAINERS['megatron'].description}" in text
        parallel = tomllib.loads(text)["parallelism"]
        degrees = (parallel["data_parallel_replicate_degree"] * parallel["data_parallel_shard_degree"]
                   * parallel.get("tensor_parallel_degree", 1) * parallel.get("pipeline_parallel_degree", 1))
        assert degrees == row["gpus"] == 16
        assert tomllib.loads(text)["training"]["global_batch_size"] == 64
        _, notes = export_config(path, "hf", None, rank)
        code, _ = export_config(path, "lightning", None, rank)
        for said in (text, "\n".join(notes), code):
            assert "--trainer megatron" in said
    # ZeRO-1 priced as a distributed optimizer: each target says what it runs instead
    text, notes = export_config(path, "torchtitan", None, rank)
    assert "runs otherwise: ZeRO-1 was priced as a distributed optimizer" in text
    assert "torchtitan runs FSDP2 with fsdp_reshard_after_forward 'never'" in text
    assert any("Hugging Face's Trainer runs FSDP SHARD_GRAD_OP" in n for n in export_config(path, "hf", None, rank)[1])
    # torchtitan's tensor parallelism is the megatron form, sequence-parallel always
    rank = _rank_of(fitting, strategy=0, tensor_parallel=2, pipeline_parallel=1, sequence_parallel=False)
    text, _ = export_config(path, "torchtitan", None, rank)
    assert "without sequence parallelism; torchtitan's always runs it" in text
    assert "with the embedding and head whole" not in text


def test_a_plan_priced_as_scalelab_says_torchtitans_tensor_parallelism_differs(tmp_path, capsys):
    path, fitting = _plan_file(tmp_path, capsys, "scalelab")
    rank = _rank_of(fitting, tensor_parallel=2, pipeline_parallel=1)
    text, _ = export_config(path, "torchtitan", None, rank)
    assert "# priced by scalelab plan --trainer scalelab: scalelab's own strategies" in text
    assert ("runs otherwise: tensor parallelism was priced with the embedding and head whole on every rank, its backward "
            "all-reduces in fp32; torchtitan runs the embedding, head and loss split over the vocabulary") in text


def test_a_plan_source_is_refused_in_one_line_where_it_cannot_be_exported(results, tmp_path, capsys):
    path, fitting = _plan_file(tmp_path, capsys, "megatron")
    (tmp_path / "other.json").write_text('{"a": 1}')
    for argv, said in ((["--run", "x"], "--run names a measured run"),
                       (["--rank", str(len(fitting) + 1)], f"the plan has {len(fitting)} configuration(s) that fit")):
        assert main(["export", "config", str(path), "--to", "torchtitan", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and "\n" not in err, err
    assert main(["export", "config", str(tmp_path / "other.json"), "--to", "hf"]) == 2
    assert "not a plan's JSON" in capsys.readouterr().err
    assert main(["export", "config", str(results), "--to", "hf", "--rank", "2"]) == 2
    assert "--rank picks a plan's configuration" in capsys.readouterr().err


def test_a_measured_run_says_where_the_target_runs_it_otherwise(results):
    """A run scalelab measured is scalelab's own implementation: its ZeRO-1 and its tensor parallelism are not what
    torchtitan runs, and the export says so beside the figures."""
    from scalelab.report.export import torchtitan_toml

    runs, _ = load_tables(results)
    row = {**pick_run(runs, None), "world_size": 8, "zero_stage": 1, "replicas": 1, "tensor_parallel": 2, "pipeline_parallel": 1}
    text = torchtitan_toml(row)
    assert "runs otherwise: ZeRO-1 was measured as PyTorch's ZeroRedundancyOptimizer" in text
    assert "runs otherwise: tensor parallelism was measured with the embedding and head whole on every rank" in text
    assert "runs otherwise" not in torchtitan_toml({**row, "zero_stage": 3, "tensor_parallel": 1})


def test_every_trainer_a_plan_prices_with_exports(tmp_path, capsys):
    """A plan priced by any trainer `scalelab plan` takes exports at ZeRO-1 and with tensor parallelism, naming it: the
    differences are looked up by the form of its strategies (nemo prices them as megatron does)."""
    from scalelab.registries.strategies import TRAINERS

    for trainer in sorted(set(TRAINERS) - {"llm-foundry"}):  # llm-foundry is priced for ZeRO-3 alone
        path, fitting = _plan_file(tmp_path, capsys, trainer)
        for wanted in ({"strategy": 1}, {"tensor_parallel": 2}):
            rank = _rank_of(fitting, **wanted)
            text, _ = export_config(path, "torchtitan", None, rank)
            assert f"# priced by scalelab plan --trainer {trainer}:" in text, (trainer, wanted)
