"""OpenLineage: a START event when a run starts, COMPLETE or FAIL when it ends.

Both events of a run carry one run id. Inputs are the source's datasets, each with the
watermark range the run read (a ``commitpub_watermarks`` input facet); outputs are the
published datasets or tables with their row and file counts (the standard
``outputStatistics`` facet) and, for a dataset with checks, each check's result (the
standard ``dataQualityAssertions`` dataset facet); a dataset held by failed checks is an
output with its assertions and no ``outputStatistics``, as nothing of it was published.
Events go out through an openlineage-python transport built from the job's ``[lineage]``
table (``{ type = "file", ... }``, ``{ type = "http", ... }`` or any other the client
knows), never from a record.

Lineage is an observer of the commit, never part of it: an endpoint that is down, slow or
refuses the event costs a run at most ``timeout`` seconds per event and never fails it. Each
event is sent on a worker thread that the run waits for only that long; once an event has
failed or timed out, the run's later events are not sent (so a COMPLETE never overtakes its
START still in flight), and every event not delivered is logged and counted in
:attr:`Lineage.failed`. The ``[lineage]`` extra installs openlineage-python; it is imported
only when a job configures lineage.
"""

from __future__ import annotations

import functools
import logging
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from store.errors import ConfigurationError
from store.urls import is_local, local_path

if TYPE_CHECKING:
    from openlineage.client.client import OpenLineageClient

log = logging.getLogger(__name__)

PRODUCER = "https://pypi.org/project/commitpub/"
#: What a run waits for one event at most, unless the job's ``[lineage]`` says otherwise.
DEFAULT_TIMEOUT = 5.0


@attrs.frozen
class LineageConfig:
    """The job's ``[lineage]`` table.

    Attributes:
        namespace: the OpenLineage job namespace (default: the job's name).
        transport: an openlineage-python transport table, ``type`` first.
        timeout: seconds a run waits for one event at most.
    """

    namespace: str
    transport: Mapping[str, Any]
    timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def from_table(cls, table: Mapping[str, Any], job: str) -> LineageConfig:
        """Check a ``[lineage]`` table of a job file.

        Raises:
            ConfigurationError: naming the key that is missing or of the wrong type.
        """
        unknown = set(table) - {"namespace", "transport", "timeout"}
        if unknown:
            raise ConfigurationError(f"unknown key(s) in [lineage]: {', '.join(sorted(unknown))}")
        namespace = table.get("namespace", job)
        if not isinstance(namespace, str) or not namespace:
            raise ConfigurationError("key 'lineage.namespace' must be a non-empty string")
        transport = table.get("transport")
        if not isinstance(transport, Mapping) or not isinstance(transport.get("type"), str):
            raise ConfigurationError(
                "key 'lineage.transport' must be a table with a 'type' (e.g. "
                '{ type = "file", log_file_path = "lineage.jsonl", append = true })'
            )
        timeout = table.get("timeout", DEFAULT_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigurationError("key 'lineage.timeout' must be a number of seconds above 0")
        return cls(namespace, dict(transport), float(timeout))


@attrs.frozen
class LineageInput:
    """A dataset a run read: where, and the watermark range per partition."""

    url: str
    #: partition -> (the committed watermark before the run, the one the run read up to).
    watermarks: Mapping[str, tuple[Any, Any]] = attrs.field(factory=dict)


@attrs.frozen
class LineageAssertion:
    """One check's result on an output: a ``dataQualityAssertions`` facet's assertion."""

    #: The check's name (``unique(order_id)``).
    assertion: str
    success: bool
    #: The check's column where it reads exactly one, else None (the whole dataset).
    column: str | None = None
    #: ``error`` or ``warn``.
    severity: str | None = None


@attrs.frozen
class LineageOutput:
    """A dataset or table a run published (or held back), with what it added."""

    url: str
    rows: int | None = None
    files: int | None = None
    #: A table's (namespace, name) where it has one (``warehouse.orders``), else the URL's.
    name: tuple[str, str] | None = None
    #: The dataset's check results, in the order the checks were declared.
    assertions: Sequence[LineageAssertion] = ()
    #: Held by failed checks: nothing published, so no ``outputStatistics``.
    held: bool = False
    #: A restatement (``stage(replace=...)``): the partitions whose files it replaced
    #: (``""``: the whole dataset); None: it only added. Told as OpenLineage's
    #: ``lifecycleStateChange`` ``OVERWRITE`` and the ``commitpub_replaced`` facet.
    replaced: Sequence[str] | None = None


def dataset_name(url: str) -> tuple[str, str]:
    """OpenLineage's (namespace, name) of a path or URL, without any credentials in it.

    A local path is ``("file", "/abs/path")``; ``s3://bucket/key`` is
    ``("s3://bucket", "key")``; user and password of a URL are dropped, so a record of the
    run never carries them.
    """
    if is_local(url):
        return "file", local_path(url)
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return f"{parts.scheme}://{netloc}", parts.path.lstrip("/")


def _client(config: LineageConfig) -> OpenLineageClient:
    try:
        from openlineage.client.client import OpenLineageClient
        from openlineage.client.transport import get_default_factory
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ConfigurationError(
            "[lineage] needs openlineage-python: pip install 'commitpub[lineage]'"
        ) from e
    transport = dict(config.transport)
    if transport["type"] == "http":
        # The client's own defaults retry with back-off for far longer than a run waits.
        transport.setdefault("timeout", config.timeout)
        transport.setdefault("retry", {"total": 0})
    try:
        built = get_default_factory().create(config=transport)
    except Exception as e:  # the client raises anything from KeyError to RuntimeError
        raise ConfigurationError(
            f"key 'lineage.transport' is not a usable transport ({type(e).__name__}: {e})"
        ) from e
    return OpenLineageClient(transport=built)


@attrs.define
class Lineage:
    """The lineage of one run: call :meth:`start` once, then :meth:`complete` or :meth:`fail`."""

    config: LineageConfig
    job: str
    run_id: str = attrs.field(init=False)
    #: Events delivered, and events not delivered (failed, timed out or skipped after one).
    emitted: int = attrs.field(init=False, default=0)
    failed: int = attrs.field(init=False, default=0)
    _client: OpenLineageClient = attrs.field(init=False)
    _down: bool = attrs.field(init=False, default=False)
    _inputs: Sequence[LineageInput] = attrs.field(init=False, factory=tuple)

    FACET_SCHEMA: ClassVar[str] = "https://pypi.org/project/commitpub/#lineage-facets"

    def __attrs_post_init__(self) -> None:
        from openlineage.client.uuid import generate_new_uuid

        self._client = _client(self.config)
        self.run_id = str(generate_new_uuid())

    def start(self, inputs: Sequence[LineageInput] = ()) -> None:
        """The run started, reading ``inputs``."""
        self._inputs = tuple(inputs)
        self._emit("START", [])

    def complete(
        self, outputs: Sequence[LineageOutput], inputs: Sequence[LineageInput] | None = None
    ) -> None:
        """The run ended having published ``outputs`` (the inputs as read, if now known)."""
        if inputs is not None:
            self._inputs = tuple(inputs)
        self._emit("COMPLETE", outputs)

    def fail(
        self,
        error: str,
        outputs: Sequence[LineageOutput] = (),
        inputs: Sequence[LineageInput] | None = None,
    ) -> None:
        """The run ended in ``error``; ``outputs`` are what it did publish (the inputs as
        read, if now known)."""
        if inputs is not None:
            self._inputs = tuple(inputs)
        self._emit("FAIL", outputs, error=error)

    def _event(self, state: str, outputs: Sequence[LineageOutput], error: str | None) -> Any:
        from openlineage.client.event_v2 import (
            InputDataset,
            Job,
            OutputDataset,
            Run,
            RunEvent,
            RunState,
        )
        from openlineage.client.facet_v2 import (
            data_quality_assertions_dataset,
            error_message_run,
            lifecycle_state_change_dataset,
            output_statistics_output_dataset,
        )

        inputs = []
        for i in self._inputs:
            namespace, name = dataset_name(i.url)
            facets: dict[str, Any] = {}
            if i.watermarks:
                facets["commitpub_watermarks"] = _watermarks_facet(i.watermarks)
            inputs.append(InputDataset(namespace, name, inputFacets=facets))
        published = []
        for o in outputs:
            namespace, name = o.name or dataset_name(o.url)
            output_facets: dict[str, Any] = {}
            if not o.held:
                output_facets["outputStatistics"] = (
                    output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                        rowCount=o.rows, fileCount=o.files
                    )
                )
            dataset_facets: dict[str, Any] = {}
            if o.replaced is not None and not o.held:
                dataset_facets["lifecycleStateChange"] = (
                    lifecycle_state_change_dataset.LifecycleStateChangeDatasetFacet(
                        lifecycleStateChange=lifecycle_state_change_dataset.LifecycleStateChange.OVERWRITE
                    )
                )
                dataset_facets["commitpub_replaced"] = _replaced_facet_class()(
                    partitions=list(o.replaced)
                )
            if o.assertions:
                # OpenLineage defines this facet among an input's facets (a test reads a dataset);
                # commitpub checks the data it writes, so it is the output's dataset facet.
                dataset_facets["dataQualityAssertions"] = (
                    data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet(
                        assertions=[
                            data_quality_assertions_dataset.Assertion(
                                assertion=a.assertion,
                                success=a.success,
                                column=a.column,
                                severity=a.severity,
                            )
                            for a in o.assertions
                        ]
                    )
                )
            published.append(
                OutputDataset(namespace, name, facets=dataset_facets, outputFacets=output_facets)
            )
        run_facets: dict[str, Any] = {}
        if error is not None:
            run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
                message=error, programmingLanguage="python"
            )
        return RunEvent(
            eventType=RunState[state],
            eventTime=datetime.now(UTC).isoformat(),
            run=Run(runId=self.run_id, facets=run_facets),
            job=Job(namespace=self.config.namespace, name=self.job),
            producer=PRODUCER,
            inputs=inputs,
            outputs=published,
        )

    def _emit(self, state: str, outputs: Sequence[LineageOutput], error: str | None = None) -> None:
        if self._down:
            self.failed += 1
            log.warning("lineage: %s event of run %s not sent (endpoint down)", state, self.run_id)
            return
        event = self._event(state, outputs, error)
        failure: list[BaseException] = []

        def send() -> None:
            try:
                self._client.emit(event)
            except Exception as e:  # any transport error: logged and counted, never raised
                failure.append(e)

        sender = threading.Thread(target=send, name=f"lineage-{state}", daemon=True)
        sender.start()
        sender.join(self.config.timeout)
        if sender.is_alive() or failure:
            why = (
                f"no answer within {self.config.timeout:g} s"
                if sender.is_alive()
                else f"{type(failure[0]).__name__}: {failure[0]}"
            )
            self._down = True
            self.failed += 1
            log.warning("lineage: %s event of run %s not delivered: %s", state, self.run_id, why)
            return
        self.emitted += 1


@functools.cache
def _watermarks_facet_class() -> type[Any]:
    """The ``commitpub_watermarks`` input facet, built once openlineage-python is imported."""
    from openlineage.client.generated.base import InputDatasetFacet

    @attrs.define
    class CommitpubWatermarksInputDatasetFacet(InputDatasetFacet):
        """The watermark range a run read, per partition: ``{"p0": {"from": 1, "to": 7}}``."""

        partitions: dict[str, dict[str, Any]] = attrs.field(factory=dict)

        @staticmethod
        def _get_schema() -> str:
            return Lineage.FACET_SCHEMA

    return CommitpubWatermarksInputDatasetFacet


@functools.cache
def _replaced_facet_class() -> type[Any]:
    """The ``commitpub_replaced`` dataset facet of a restatement's output."""
    from openlineage.client.generated.base import DatasetFacet

    @attrs.define
    class CommitpubReplacedDatasetFacet(DatasetFacet):
        """The partitions a restatement replaced: ``["day=2026-11-01"]`` (``""``: the whole
        dataset)."""

        partitions: list[str] = attrs.field(factory=list)

        @staticmethod
        def _get_schema() -> str:
            return Lineage.FACET_SCHEMA

    return CommitpubReplacedDatasetFacet


def _watermarks_facet(watermarks: Mapping[str, tuple[Any, Any]]) -> Any:
    return _watermarks_facet_class()(
        partitions={p: {"from": lo, "to": hi} for p, (lo, hi) in watermarks.items()}
    )
