"""The typed run plan (scalelab.planning.run_plan, issue #42): made once from the config, read back by
the ranks from run_plan.json exactly as it was made, and the one place a run's micro-batch, launch
plan and collective dtypes are derived."""
import json

from scalelab.formulas.communication import comm_dtypes
from scalelab.planning.placement import launch_plan
from scalelab.planning.run_plan import RunPlan, result_params, run_plan
from scalelab.planning.sweep import micro_batch_plan, sweep_points
from scalelab.planning.validation import validate_config
from support import tiny_config

SWEEP = {"precision": ["fp32", "fp16", "bf16", "fp8"], "zero_stage": [0, 1, 2, 3], "world_size": [1, 2, 4],
         "model": ["base", "ltiny"], "lora_rank": [None, 4], "micro_batch": [None, 1],
         "activation_checkpointing": [False, True], "grad_reduce": ["fp32", "compute"]}


def _config(**cluster):
    return validate_config(tiny_config(sweep=SWEEP, models={"ltiny": {"preset": "llama-tiny"}},
                                       train={"profile": [3, 4], "peak_tflops": {"bf16": 1.0}},
                                       cluster={"ranks_per_node": 2, **cluster} if cluster else {"ranks_per_node": 2}))


def test_every_point_plans_as_its_parts_and_reads_back_as_written(tmp_path):
    config = _config()
    points = sweep_points(config)
    assert len(points) > 200
    for point in points:
        plan = run_plan(config, point, device="cpu", device_reason="test")
        assert (plan.micro_batch, plan.accumulation_steps) == micro_batch_plan(plan.train, point.world_size, point.micro_batch)
        assert plan.launch == launch_plan(config, point.world_size)
        assert plan.comm == comm_dtypes(point.precision, point.zero_stage, point.grad_reduce)
        assert plan.precision.name == point.precision and plan.model.family == ("llama" if point.model == "ltiny" else "gpt2")
        placed = plan.at(vocab_size=257, train_bin=tmp_path / "train.bin", token_dtype="uint16", run_dir=tmp_path / point.run_id,
                         threads=4)
        assert placed.model.vocab_size == 257 and placed.threads_per_rank == max(1, 4 // point.world_size)
        placed.write(tmp_path / "run_plan.json")
        assert RunPlan.read(tmp_path / "run_plan.json") == placed, point.run_id
        json.dumps(placed.to_json())  # plain JSON, what a rank reads without scalelab's types
        row = plan.formula_row()  # what the formulas read of it, as of a result row
        assert row == {**point.values(), "micro_batch": plan.micro_batch, "accumulation_steps": plan.accumulation_steps,
                       "device_type": "cpu"}
    spanning = [run_plan(config, p).launch for p in points if p.world_size == 4]
    assert spanning and all(launch.multi_launcher and launch.launchers == 2 for launch in spanning)


def test_the_result_params_read_the_plan():
    config = _config()
    point = next(p for p in sweep_points(config) if p.precision == "bf16" and p.zero_stage == 3 and p.world_size == 4)
    params = result_params(config, run_plan(config, point, device="cpu"))
    assert params["comm_dtypes"] == {"param_gather_dtype": "bfloat16"}
    assert params["layout"] == {"launchers": 2, "ranks_per_launcher": 2, "nodes": 2}
