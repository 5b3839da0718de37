"""Result tables: explicit pyarrow schemas with a schema version, atomic Parquet writes."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from scalelab.analysis.dictionary import IDENTITY, RUN, STEP, field_metadata
from scalelab.io import atomic_path
from scalelab.migrate import check_layout
from scalelab.sweep import AXES, POINT_FILE, RUN_DIR_GLOB, read_point

SCHEMA_VERSION = "4"  # 2: lever identity columns; 3: device plan, launch and provenance sources;
# 4: the compile lever (identity column, compile time), MFU against the bf16 peak, activations outside the blocks predicted
_META = {b"scalelab.schema_version": SCHEMA_VERSION.encode()}

# Identity columns repeated on every row of every table: the run id and one per sweep axis.
# micro_batch is the resolved size (sequences per rank per forward): null only for a
# missing/corrupt run whose path said 'auto'. bucket_mb is null for strategies without buckets.
# Every field carries its unit and meaning from the data dictionary (scalelab.analysis.dictionary)
# in its Parquet field metadata; a column the dictionary lacks fails here, at import.
IDENTITY_FIELDS = [pa.field("run_id", pa.string(), nullable=False, metadata=field_metadata(IDENTITY["run_id"]))] + [
    pa.field(axis.name, pa.type_for_alias(axis.arrow), nullable=axis.nullable, metadata=field_metadata(IDENTITY[axis.name]))
    for axis in AXES]


def _field(name: str, type_: pa.DataType, columns: dict, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata=field_metadata(columns[name]))


STEP_SCHEMA = pa.schema(IDENTITY_FIELDS + [
    _field("step", pa.int32(), STEP, nullable=False),
    *(_field(name, type_, STEP) for name, type_ in [
        ("loss", pa.float64()), ("grad_norm", pa.float64()), ("lr", pa.float64()), ("loss_scale", pa.float64()),
        ("skipped", pa.bool_()), ("step_time_s", pa.float64()), ("tokens", pa.int64()), ("tokens_per_s", pa.float64())]),
], metadata=_META)


def steps_table(identity: dict, records: list[dict]) -> pa.Table:
    columns = {f.name: [] for f in STEP_SCHEMA}
    for rec in records:
        row = {**rec, **identity}
        t = rec.get("step_time_s")
        row["tokens_per_s"] = rec["tokens"] / t if t else None
        for name in columns:
            columns[name].append(row.get(name))
    return pa.Table.from_pydict(columns, schema=STEP_SCHEMA)


def write_parquet(table: pa.Table, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def schema_version(path: str | Path) -> str | None:
    meta = pq.read_schema(path).metadata or {}
    value = meta.get(b"scalelab.schema_version")
    return value.decode() if value else None


# ----------------------------------------------------------------------------- runs table

COLLECTIVES = ("all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single")

_RUN_FIELDS = [
    ("status", pa.string()), ("reason", pa.string()), ("teardown_warning", pa.string()), ("steps_problem", pa.string()), ("dataset", pa.string()),
    ("n_params", pa.int64()), ("n_trainable_params", pa.int64()), ("lora_alpha", pa.float64()),
    ("n_layers", pa.int32()), ("d_model", pa.int32()), ("n_heads", pa.int32()),
    ("seq_len", pa.int32()), ("vocab_size", pa.int64()), ("tie_embeddings", pa.bool_()),
    ("steps", pa.int32()), ("completed_steps", pa.int32()), ("warmup_steps", pa.int32()),
    ("global_batch", pa.int32()), ("accumulation_steps", pa.int32()),
    ("tokens_per_step", pa.int64()), ("measured_steps", pa.int32()),
    ("tokens_per_s", pa.float64()), ("step_time_s_mean", pa.float64()), ("step_time_s_median", pa.float64()),
    ("loop_time_s_per_step", pa.float64()),
    ("compile_time_s", pa.float64()), ("compile_graphs", pa.int32()), ("compile_graphs_in_loop", pa.int32()),
    ("flops_per_token", pa.float64()), ("peak_flops_per_device", pa.float64()), ("peak_flops_source", pa.string()),
    ("mfu", pa.float64()), ("peak_flops_bf16", pa.float64()), ("peak_flops_bf16_source", pa.string()),
    ("mfu_bf16_peak", pa.float64()),
    ("final_loss", pa.float64()), ("skipped_steps", pa.int32()), ("resumed_from_step", pa.int32()), ("final_loss_scale", pa.float64()),
    ("model_state_bytes_measured", pa.int64()), ("model_state_params_bytes_measured", pa.int64()),
    ("model_state_grads_bytes_measured", pa.int64()), ("model_state_optimizer_bytes_measured", pa.int64()),
    ("model_state_bytes_measured_per_rank", pa.list_(pa.int64())),
    ("model_state_bytes_predicted", pa.float64()), ("model_state_params_bytes_predicted", pa.float64()),
    ("model_state_grads_bytes_predicted", pa.float64()), ("model_state_optimizer_bytes_predicted", pa.float64()),
    ("model_state_bytes_predicted_paper", pa.float64()),
    ("comm_bytes_per_step_measured", pa.float64()), ("comm_bytes_per_step_predicted", pa.float64()),
    ("comm_bytes_per_step_predicted_paper", pa.float64()),
    *[(f"comm_{c}_bytes_per_step", pa.float64()) for c in COLLECTIVES],
    *[(f"comm_{c}_calls_per_step", pa.float64()) for c in COLLECTIVES],
    ("activation_bytes_measured", pa.int64()), ("activation_bytes_outside_blocks_measured", pa.int64()),
    ("activation_bytes_predicted", pa.float64()), ("activation_bytes_predicted_paper", pa.float64()),
    ("activation_bytes_outside_blocks_predicted", pa.float64()),
    ("activation_measure", pa.string()),
    ("recompute_flops_per_token", pa.float64()), ("hfu", pa.float64()),
    ("fp8_linears", pa.int32()), ("fp8_emulated", pa.bool_()),
    ("ddp_buckets_predicted", pa.int32()),
    ("predicted_peak_bytes", pa.float64()), ("predicted_activation_bytes", pa.float64()),
    ("predicted_transient_param_bytes", pa.float64()), ("device_memory_bytes", pa.float64()), ("predicted_oom_reason", pa.string()),
    ("peak_mem_allocated_bytes", pa.int64()), ("peak_mem_reserved_bytes", pa.int64()), ("peak_rss_bytes", pa.int64()),
    ("wall_time_s", pa.float64()), ("startup_s", pa.float64()),
    ("requested_device", pa.string()), ("planned_device_reason", pa.string()),
    ("device_type", pa.string()), ("device_name", pa.string()), ("backend", pa.string()),
    ("launch", pa.string()), ("launchers", pa.int32()),
    ("threads", pa.int32()), ("threads_per_rank", pa.int32()),
    ("torch_version", pa.string()), ("cuda_version", pa.string()), ("nccl_version", pa.string()),
    ("python_version", pa.string()), ("hostname", pa.string()), ("git_commit", pa.string()), ("git_dirty", pa.bool_()),
    ("git_commit_source", pa.string()), ("dataset_sha256_train", pa.string()),
    ("seed", pa.int64()), ("config_hash", pa.string()), ("started_utc", pa.string()), ("run_path", pa.string()),
]
RUN_SCHEMA = pa.schema(IDENTITY_FIELDS + [_field(n, t, RUN) for n, t in _RUN_FIELDS], metadata=_META)


# Summary keys that run_row spreads over several columns (comm_<collective>_...).
_FLATTENED = {"comm_bytes_per_step_by_type", "comm_calls_per_step"}


def unknown_summary_keys(summary: dict) -> list[str]:
    """Keys of a run's summary that no column of RUN_SCHEMA holds (they would be lost)."""
    return sorted(set(summary) - set(RUN_SCHEMA.names) - _FLATTENED)


def type_problems(row: dict) -> list[str]:
    """'field=value (expected type)' for each value of a row its RUN_SCHEMA column cannot hold."""
    bad = []
    for f in RUN_SCHEMA:
        try:
            pa.array([row.get(f.name)], type=f.type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            bad.append(f"{f.name}={row.get(f.name)!r} (expected {f.type})")
    return bad


def run_row(summary: dict, run_path: str) -> dict:
    """Flatten a run's summary.json into one row of RUN_SCHEMA."""
    row = dict(summary)
    for c in COLLECTIVES:
        row[f"comm_{c}_bytes_per_step"] = (summary.get("comm_bytes_per_step_by_type") or {}).get(c)
        row[f"comm_{c}_calls_per_step"] = (summary.get("comm_calls_per_step") or {}).get(c)
    row["run_path"] = run_path
    return {f.name: row.get(f.name) for f in RUN_SCHEMA}


def runs_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=RUN_SCHEMA)


def _identity_of(run_dir: Path) -> dict | None:
    """The identity columns of a run folder, from its point.json (None without a readable one)."""
    try:
        return read_point(run_dir).identity()
    except (OSError, ValueError):
        return None


def _with_identity(table: pa.Table, identity: dict | None) -> pa.Table:
    """A run's steps with every identity column of STEP_SCHEMA: steps written before an axis
    existed lack its column, which holds the run's value (its point.json says it: the default)."""
    for f in IDENTITY_FIELDS:
        if f.name not in table.column_names and identity is not None:
            table = table.append_column(f.name, pa.array([identity.get(f.name)] * table.num_rows, type=f.type))
    return table.select(STEP_SCHEMA.names).cast(STEP_SCHEMA)


def collect(results_dir: str | Path, run_paths: list[str] | None = None) -> dict:
    """Gather every run's summary.json and steps.parquet under results_dir/runs/<run id>/ into
    results_dir/metrics.parquet (one row per run) and results_dir/steps.parquet (one row per
    step). A missing or corrupt file is reported by name and kept as a row with status
    'missing' or 'corrupt'; the rest is still collected. Returns {'runs', 'steps', 'problems'}.
    Raises OldLayout for a results folder holding run folders of an earlier layout.
    """
    import json

    results_dir = Path(results_dir)
    runs_root = results_dir / "runs"
    check_layout(results_dir)
    if run_paths is None:
        run_paths = sorted({p.parent.name for name in ("summary.json", "steps.parquet", POINT_FILE)
                            for p in runs_root.glob(f"{RUN_DIR_GLOB}/{name}")})
    rows, step_tables, problems = [], [], []
    for run_path in run_paths:
        run_dir = runs_root / run_path
        identity = _identity_of(run_dir)
        summary_path, steps_path = run_dir / "summary.json", run_dir / "steps.parquet"
        try:
            summary = json.loads(summary_path.read_text())
            if not isinstance(summary, dict) or "status" not in summary:
                raise ValueError("no 'status' field")
        except FileNotFoundError:
            problems.append(f"{summary_path}: missing")
            if identity:
                rows.append(run_row({**identity, "status": "missing", "reason": f"{summary_path} is missing"}, run_path))
            continue
        except (ValueError, UnicodeDecodeError) as err:
            problems.append(f"{summary_path}: corrupt ({err})")
            if identity:
                rows.append(run_row({**identity, "status": "corrupt", "reason": f"{summary_path} is corrupt: {err}"}, run_path))
            continue
        lost = unknown_summary_keys(summary)
        if lost:  # a writer and the schema disagree: say so, never drop a field silently
            problems.append(f"{summary_path}: fields not in the metrics schema, not collected: {', '.join(lost)}")
        # identity from point.json under the summary's own (micro_batch resolved at launch): a summary
        # written before an axis existed lacks it
        row = run_row({**(identity or {}), **{k: v for k, v in summary.items() if v is not None or k not in (identity or {})}},
                      run_path)
        wrong = type_problems(row)
        if wrong:  # one bad field makes a 'corrupt' row naming it; the other runs are still collected
            problems.append(f"{summary_path}: corrupt ({'; '.join(wrong)})")
            row = run_row({**(identity or {}), "status": "corrupt",
                           "reason": f"{summary_path} does not match the metrics schema: {'; '.join(wrong)}"}, run_path)
            if not identity:
                continue
        try:
            table = pq.read_table(steps_path)
            step_tables.append(_with_identity(table, identity))
        except FileNotFoundError:
            problems.append(f"{steps_path}: missing")
            row["steps_problem"] = f"{steps_path.name} is missing"
        except Exception as err:  # pyarrow raises several types for damaged files
            problems.append(f"{steps_path}: corrupt ({type(err).__name__}: {err})")
            row["steps_problem"] = f"{steps_path.name} is corrupt: {type(err).__name__}: {err}"[:500]
        rows.append(row)
    runs = runs_table(rows)
    steps = pa.concat_tables(step_tables) if step_tables else STEP_SCHEMA.empty_table()
    write_parquet(runs, results_dir / "metrics.parquet")
    write_parquet(steps, results_dir / "steps.parquet")
    return {"runs": runs.num_rows, "steps": steps.num_rows, "problems": problems}
