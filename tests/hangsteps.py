"""A registered test step that hangs until a gate file appears, in a module of its own that
subprocesses and Spark executors can import (tests ship it with ``SparkContext.addPyFile``)."""

from __future__ import annotations

import os
import threading

import attrs

import commitsteps

#: Never set: the step waits on it, a tick at a time, until its gate file exists.
_NEVER = threading.Event()


@commitsteps.register("tests.gate")
@attrs.frozen
class GateStep(commitsteps.CommitStep):
    """Blocks until ``gate`` exists (forever, if nobody creates it), then appends ``line``
    to ``out``: a step that hangs, and once unblocked leaves a trace of every execution."""

    gate: str
    out: str
    line: str

    def verify(self) -> bool:
        try:
            with open(self.out) as f:
                return self.line in f.read().splitlines()
        except FileNotFoundError:
            return False

    def execute(self) -> None:
        while not os.path.exists(self.gate):
            _NEVER.wait(0.05)
        os.makedirs(os.path.dirname(self.out), exist_ok=True)
        with open(self.out, "a") as f:
            f.write(f"{self.line}\n")

    def published_paths(self) -> tuple[str, ...]:
        return (self.out,)
