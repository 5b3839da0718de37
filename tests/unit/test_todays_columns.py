"""Result tables an earlier version wrote read with today's columns: cached results report without being collected
again (scalelab.planning.result_tables.with_todays_columns)."""
from scalelab.planning.result_tables import read_runs, runs_table, with_todays_columns, write_parquet
from scalelab.planning.sweep import RunPoint


def test_a_table_without_the_columns_added_since_reads_them_as_defaults_and_nulls(tmp_path):
    row = {**RunPoint("fp32", 3, 2).identity(), "status": "ok", "tokens_per_s": 1000.0, "n_params": 12}
    today = runs_table([row])
    # as written before pipeline parallelism and the per-stage bubble existed
    old = today.drop_columns(["pipeline_parallel", "pipeline_schedule", "bubble_fraction_measured"])
    write_parquet(old, tmp_path / "metrics.parquet")
    runs = read_runs(tmp_path / "metrics.parquet")
    assert list(runs.columns) == today.schema.names
    assert runs.loc[0, "pipeline_parallel"] == 1 and runs.loc[0, "pipeline_schedule"] == "1f1b"  # the axes' defaults
    assert runs["bubble_fraction_measured"].isna().all() and runs.loc[0, "tokens_per_s"] == 1000.0
    assert str(runs["n_params"].dtype) == "Int64"  # pandas' nullable integers, as today's tables read


def test_a_table_of_todays_schema_is_returned_as_it_is():
    table = runs_table([{**RunPoint("bf16", 0, 1).identity(), "status": "ok"}])
    assert with_todays_columns(table, table.schema) is table
