"""What the layer above builds on beyond the publisher's public API (``publisher.__all__``).

``jobs`` runs the publisher's work in Spark tasks, offers the operator's commands and writes
the run report; for that it needs parts a user of :class:`~publisher.Publisher` never does.
They are reached here, and only here (an import-linter contract keeps ``jobs`` out of the
publisher's other modules), so those modules can move without touching the layer above:

* a :class:`~publisher.runner.Runner` in other processes: :func:`work_name` (what a group of
  work is called), :func:`task_attempt` (the attempt a Spark task runs) and
  :func:`call_within` (a deadline around waiting for the tasks);
* the operator's look at a pending commit: :func:`verify_all` (which steps are done) and
  :func:`check_connections` (may its steps open those stores);
* :data:`converter`, the publisher's records to and from JSON, which the run report extends;
* the staging root (:mod:`publisher.staging`: claims, run directories, deleting a tree), a
  dataset's status record (:mod:`publisher.status`) and what a finished run published
  (:mod:`publisher.published`, for ``commitpub revert``), as modules.
"""

from publisher import published, staging, status
from publisher.confinement import check_connections
from publisher.converter import converter
from publisher.deadlines import call_within
from publisher.execution import verify_all
from publisher.runner import task_attempt, work_name

__all__ = [
    "call_within",
    "check_connections",
    "converter",
    "published",
    "staging",
    "status",
    "task_attempt",
    "verify_all",
    "work_name",
]
