"""The contract every :class:`~commitsteps.CommitStep` must keep, as a suite you can run.

commitpub runs it against its own steps; a user's step binds it in a few lines (pytest must
be installed). The base class's ``step`` fixture raises until it is bound to a fixture that
builds a fresh step, ready to execute, in a fresh environment (``tmp_path``)::

    import pathlib
    import pytest
    from commitsteps.testing import CommitStepContract

    from acme_steps import SuccessMarkerStep

    class TestSuccessMarkerStep(CommitStepContract):
        @pytest.fixture
        def step(self, tmp_path):
            return SuccessMarkerStep(str(tmp_path / "out" / "_SUCCESS"), "day=1")

        def effect(self, step):  # optional: what the step's effect looks like from outside
            path = pathlib.Path(step.path)
            return path.read_text() if path.exists() else None

What it checks, each test on a step of its own:

* ``verify()`` is False before ``execute()``, and has no side effects;
* ``execute()`` makes ``verify()`` True (which the publisher checks on a step's first
  publish, too), and ``verify_many`` agrees with ``verify``;
* ``execute()`` twice has the effect of once;
* a crash between ``execute()`` and the check after it: a fresh step read back from the
  step's record (what recovery works on) verifies True, and executing it again is harmless;
* ``abort()`` then ``rollback()`` twice (what a discard does) leaves nothing of the effect
  (``undone()``) and ``verify()`` False, after an execute and on a step that never ran;
* the record round trip: :func:`commitsteps.loads` of :func:`commitsteps.dumps` is the
  same step, and writes the same record;
* the step travels to Spark executors: its reduction (what pickling ships) is plain data
  naming an importable class, and rebuilds an equal step. Nothing pickled is ever loaded.

Every test runs as a job (``store.fencing(None, job=JOB)``), as the publisher runs steps, so a
step that acts on the job's watermarks finds one. Pytest collects only ``Test*`` classes, so
the base never runs on its own. To see plain ``assert`` operands in failures, call
``pytest.register_assert_rewrite("commitsteps.testing")`` in your ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import store
from commitsteps.base import CommitStep
from commitsteps.serialization import dumps, loads
from store.testing import travelled_copy

#: The job the contract's steps run in.
JOB = "step-contract"


def _travelled(step: CommitStep) -> CommitStep:
    """``step`` as a Spark task gets it (see :func:`store.testing.travelled_copy`)."""
    rebuilt: CommitStep = travelled_copy(step, deep=True)
    return rebuilt


def _name(step: CommitStep) -> str:
    return type(step).__qualname__


class CommitStepContract:
    """Behaviour every :class:`~commitsteps.CommitStep` must show; bind :meth:`step`."""

    @pytest.fixture
    def step(self) -> CommitStep:
        """A fresh step, ready to execute, in a fresh environment (its staged input made,
        its store empty): bind it to a fixture of your own, typically taking ``tmp_path``."""
        raise NotImplementedError(
            "bind the step fixture: a fresh step of your class, ready to execute"
        )

    def effect(self, step: CommitStep) -> Any:
        """The step's effect as seen from outside (a published file's bytes, a watermark, a
        table's rows), compared between executions. The default sees nothing beyond
        ``verify()``; override it to have the kit check that repeats change nothing."""
        return None

    @pytest.fixture(autouse=True)
    def _as_a_job(self) -> Iterator[None]:
        with store.fencing(None, job=JOB):
            yield

    # -- before and after execute ----------------------------------------------------------
    def test_does_not_verify_before_execute(self, step: CommitStep) -> None:
        assert not step.verify(), f"{_name(step)}.verify() is True before execute()"
        assert type(step).verify_many([step]) == [False]

    def test_verify_has_no_side_effects(self, step: CommitStep) -> None:
        before = self.effect(step)
        for _ in range(3):
            assert not step.verify()
        assert before == self.effect(step), f"{_name(step)}.verify() changed the effect"
        step.execute()
        assert step.verify()

    def test_verifies_after_execute(self, step: CommitStep) -> None:
        step.execute()
        assert step.verify(), f"{_name(step)}.verify() is False right after execute()"
        assert type(step).verify_many([step]) == [True]

    def test_execute_many_is_execute(self, step: CommitStep) -> None:
        type(step).execute_many([step])
        assert step.verify(), f"{_name(step)}.verify() is False after execute_many()"

    def test_execute_twice_is_once(self, step: CommitStep) -> None:
        step.execute()
        once = self.effect(step)
        step.execute()
        assert step.verify(), f"{_name(step)}.verify() is False after a second execute()"
        assert once == self.effect(step), f"a second {_name(step)}.execute() changed the effect"

    # -- recovery --------------------------------------------------------------------------
    def test_crash_between_execute_and_verify(self, step: CommitStep) -> None:
        record = dumps(step)
        step.execute()
        done = self.effect(step)
        # What the next run's recovery holds: the record, read back in a fresh step.
        recovered = loads(record)
        assert recovered.verify(), f"{_name(step)} read back from its record does not verify"
        recovered.execute()
        assert recovered.verify()
        assert done == self.effect(recovered), "executing the recovered step again changed it"

    def test_crash_before_execute_then_recovery(self, step: CommitStep) -> None:
        recovered = loads(dumps(step))
        assert not recovered.verify()
        recovered.execute()
        assert recovered.verify()
        assert step.verify(), "the original step does not see the recovered step's effect"

    # -- discard -----------------------------------------------------------------------------
    def test_rollback_twice(self, step: CommitStep) -> None:
        step.execute()
        step.abort()
        step.rollback()
        step.rollback()
        assert step.undone(), f"{_name(step)}.undone() is False after abort() and rollback()"
        assert not step.verify(), f"{_name(step)}.verify() is True after rollback()"
        assert type(step).undone_many([step]) == [True]

    def test_rollback_twice_of_a_step_that_never_ran(self, step: CommitStep) -> None:
        step.abort()
        step.rollback()
        step.rollback()
        assert step.undone()
        assert not step.verify()

    # -- records and executors -------------------------------------------------------------
    def test_record_round_trip(self, step: CommitStep) -> None:
        record = dumps(step)
        loaded = loads(record)
        assert type(loaded) is type(step)
        assert step == loaded
        assert record == dumps(loaded)

    def test_travels_to_executors(self, step: CommitStep) -> None:
        travelled = _travelled(step)
        assert type(travelled) is type(step)
        assert step == travelled
        step.execute()
        assert travelled.verify(), f"{_name(step)} rebuilt on an executor does not verify"
