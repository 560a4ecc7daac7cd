"""A user's own CommitStep, registered in a module of its own that executors can import
(the test ships it with ``SparkContext.addPyFile``, as a user would with ``--py-files``)."""

from __future__ import annotations

import os
import socket

import attrs

import commitsteps


@commitsteps.register("tests.done-marker")
@attrs.frozen
class DoneMarkerStep(commitsteps.CommitStep):
    """Writes a ``_DONE`` marker recording where it was executed."""

    path: str
    content: str

    def verify(self) -> bool:
        try:
            with open(self.path) as f:
                return f.read().split("\n", 1)[0] == self.content
        except FileNotFoundError:
            return False

    def execute(self) -> None:
        if self.verify():
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{self.content}\n{socket.gethostname()} {os.getpid()}\n")
        os.replace(tmp, self.path)

    def published_paths(self) -> tuple[str, ...]:
        return (self.path,)


@commitsteps.register("tests.wrong-verify-marker")
@attrs.frozen
class WrongVerifyStep(DoneMarkerStep):
    """A user's step with a wrong verify(): it writes its marker, but never says it did."""

    def verify(self) -> bool:
        return False

    def execute(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "w") as f:
            f.write(f"{self.content}\n")
