"""Fault injection for tests and fault drills: one hook the training worker calls at each moment a fault can
strike (before a step, after its backward, in teardown), driven by ``SCALELAB_FAULT``."""
from __future__ import annotations

import os
import time

import torch


class Fault:
    """Fault injection for tests and drills, from SCALELAB_FAULT="kind@step=S,rank=R".

    kinds: inf_grad (a non-finite gradient element on that rank), crash (raise), oom (raise
    torch's out-of-memory error, as a GPU would), hang
    (sleep before the step's collectives), delay (sleep ``ms=`` milliseconds before each step
    of ``step=A-B``: a straggler the other ranks wait for in their first collective), exit (hard
    exit without cleanup), teardown (abort in process-group teardown, after the results are
    written). Any other value (scalelab.io.fault_point's names) injects nothing here.
    """

    # The moment each kind strikes: the hook is called at every one of them.
    MOMENT = {"hang": "before_step", "crash": "before_step", "oom": "before_step", "exit": "before_step",
              "delay": "before_step", "inf_grad": "after_backward", "teardown": "teardown"}

    def __init__(self, spec: str | None):
        self.kind = None
        if spec:
            self.kind, _, args = spec.partition("@")
            kv = dict(item.split("=") for item in args.split(",") if item)
            first, _, last = str(kv.get("step", 0)).partition("-")
            self.steps = range(int(first), int(last or first) + 1)
            self.step, self.rank = int(first), int(kv.get("rank", 0))
            self.ms = float(kv.get("ms", 0))

    @classmethod
    def from_env(cls) -> "Fault":
        return cls(os.environ.get("SCALELAB_FAULT"))

    def inject(self, moment: str, step: int, rank: int, model: torch.nn.Module | None = None) -> None:
        """The one hook: inject this fault if it is due at this moment of this step on this rank.
        model: the wrapped model whose gradients inf_grad spoils (at "after_backward")."""
        if self.MOMENT.get(self.kind) != moment or step not in self.steps or rank != self.rank:
            return
        if self.kind == "delay":
            time.sleep(self.ms / 1e3)
        elif self.kind == "hang":
            time.sleep(10 ** 6)
        elif self.kind == "crash":
            raise RuntimeError(f"injected crash at step {step} on rank {rank}")
        elif self.kind == "oom":
            raise torch.OutOfMemoryError(f"injected: out of memory at step {step} on rank {rank}")
        elif self.kind == "exit":
            os._exit(17)
        elif self.kind == "inf_grad":
            grad = next(p.grad for p in model.parameters() if p.grad is not None)
            (grad.to_local() if hasattr(grad, "to_local") else grad).view(-1)[0] = float("inf")
        elif self.kind == "teardown":
            os.abort()
