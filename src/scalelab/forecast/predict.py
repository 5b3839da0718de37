"""A point's predicted step at n GPUs, pipelined or not: the one entry every forecast calls (estimate scaling,
scalelab plan, the sweep's pruning, the published validation). One stage's step is priced by
scalelab.forecast.step, P stages, their bubble and the sends between them by scalelab.forecast.pipeline_step."""
from __future__ import annotations

from scalelab.forecast.pipeline_step import predict_pipeline
from scalelab.forecast.step import Machine, Point, predict_unpipelined


def predict_point(point: Point, machine: Machine, n: int) -> dict:
    """The point's predicted row at n GPUs (step time, tokens/s per GPU, MFU, collectives, peak memory; a
    pipelined point's also carries ``pipeline``: micro-batches, bubble, sends and every stage)."""
    if point.pipeline_parallel > 1:
        return predict_pipeline(point, machine, n)
    return predict_unpipelined(point, machine, n)
