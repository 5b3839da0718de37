"""Results taken where people work (issue #45): TensorBoard event files read back with TensorBoard's own
reader, and the best configuration as a trainer's configuration, held against that trainer's keys."""
import json

import pytest
import tomllib

from scalelab.cli import main
from scalelab.harness.fixtures import synthetic_results
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
        from scalelab.spec.strategies import strategy

        name = strategy(int(row["zero_stage"]), int(row.get("replicas") or 1)).name
        toml, _ = export_config(results, "torchtitan", row["run_id"])
        code, _ = export_config(results, "lightning", row["run_id"])
        _, notes = export_config(results, "hf", row["run_id"])
        for text in (toml, code, "\n".join(notes)):
            assert f"measured with scalelab's own trainer ({name}" in text and "--trainer scalelab" in text, text[:300]
