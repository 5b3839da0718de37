"""RunPoint's fields are the sweep's axes: one field per axis of AXES, in its order, with its type and default."""
import dataclasses
import pickle

from scalelab.planning.sweep import AXES, RunPoint


def test_run_point_fields_are_the_axes_in_order_with_their_types_and_defaults():
    fields = dataclasses.fields(RunPoint)
    assert [f.name for f in fields] == [a.name for a in AXES]
    for field, axis in zip(fields, AXES):
        assert field.type in (axis.type, str(axis.type), getattr(axis.type, "__name__", None)), field.name
        required = axis.default is None and not axis.nullable
        assert (field.default is dataclasses.MISSING) == required, field.name
        if not required:
            assert field.default == axis.default, field.name


def test_a_run_plan_pickles_as_snakemake_hands_it_to_a_job():
    """The train rule's params.plan reaches the job's script pickled: the plan, its point among it, round-trips."""
    from scalelab.harness.testing import local_plan, tiny_config

    point = RunPoint("bf16", 3, 4, micro_batch=2, pipeline_parallel=2)
    plan = local_plan(tiny_config(model={"n_layers": 4}), point)
    assert pickle.loads(pickle.dumps(plan)) == plan and plan.point.run_id == "bf16-z3-w4-mb2-pp2"
