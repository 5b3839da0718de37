"""A finished run is never retrained silently because a value it depends on changed under the user (a new release's
default): the guard names the runs, the values then and now, and what keeps them."""
from scalelab.io import write_json
from scalelab.results.retrain_guard import changed_defaults, refusal, user_keys
from scalelab.results.status import TRAINED_WITH


def _finished(root, run_id, trained_with):
    run_dir = root / "runs" / run_id
    write_json(run_dir / "summary.json", {"run_id": run_id, "status": "ok"})
    write_json(run_dir / TRAINED_WITH, trained_with)


def test_a_changed_default_names_the_runs_and_the_line_that_keeps_them(tmp_path):
    _finished(tmp_path, "fp32-z0-w1", {"model": {}, "train": {}})  # trained at the schema's measure_s (0)
    _finished(tmp_path, "bf16-z0-w1", {"model": {}, "train": {"measure_s": 2}})
    (tmp_path / "runs" / "fp32-z3-w1").mkdir()  # not finished: rerun anyway, nothing to say
    planned = {run_id: {"model": {}, "train": {"measure_s": 2}} for run_id in ("fp32-z0-w1", "bf16-z0-w1", "fp32-z3-w1")}
    found = changed_defaults(tmp_path, planned, mine=set())
    assert found == {"fp32-z0-w1": [("train.measure_s", "0", "2")]}, found
    text = refusal(found)
    assert "1 finished run(s) would be retrained" in text and "fp32-z0-w1" in text and "train.measure_s: 0 then, 2 now" in text
    assert "set in your config what they trained with (train.measure_s: 0)" in text
    assert "planning.retrain_changed_defaults: true" in text
    # the user set it: what they asked for, no question
    assert changed_defaults(tmp_path, planned, mine=user_keys([{"train": {"measure_s": 2}}])) == {}


def test_a_model_key_the_user_set_in_a_models_entry_is_theirs(tmp_path):
    _finished(tmp_path, "fp32-z0-w1-small", {"model": {"n_layers": 1}, "train": {}})
    planned = {"fp32-z0-w1-small": {"model": {"n_layers": 2}, "train": {}}}
    assert changed_defaults(tmp_path, planned, mine=set()) == {"fp32-z0-w1-small": [("model.n_layers", "1", "2")]}
    assert changed_defaults(tmp_path, planned, mine=user_keys([{"models": {"small": {"n_layers": 2}}}])) == {}
