"""What an output format is: :class:`OutputFormat` (its rules, how its published rows are
read back, what a restatement reads of them, its owner records) and the :class:`Writer` it
stages a run's datasets with.

Each format is one module of this package holding all of it (:mod:`jobs.output.parquet`,
:mod:`jobs.output.iceberg`, :mod:`jobs.output.delta`), registered by name in
:mod:`jobs.output`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from jobs.config import BatchConfig, FormatSettings, Naming, OutputKeys
from jobs.errors import BatchArgumentError
from jobs.output.commits import StagedDataset
from jobs.output.directories import (
    OutputOwner,
    create_owner_file,
    dataset_directory,
    directories,
    read_owner_file,
    replace_owner_file,
)
from jobs.output.taskwriter import WriteOptions
from jobs.output.writing import Written
from jobs.sources import RestateRefusedError
from publisher import StepsBuilder
from store.urls import decode_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class Writer(abc.ABC):
    """Writes a DataFrame into a staging directory and builds that dataset's commit."""

    #: The ``output.format`` this writer serves (errors name it).
    format: ClassVar[str]
    #: True when :meth:`write` measures checks' figures while it writes: it is then given
    #: a frame with hidden columns that ``options.measures`` (:mod:`jobs.measuring`) measures
    #: and leaves out of the files, as :class:`~jobs.output.parquet.ParquetWriter` does (a
    #: subclass that hands the frame on to ``ParquetWriter.write`` keeps it); False: the
    #: checks read the staged files back.
    measures_checks: ClassVar[bool] = False
    #: True when :meth:`commit` publishes ``StagedDataset.replace`` (a restatement,
    #: ``Batch.stage(replace=...)``): the commit sets aside the files of the replaced
    #: partitions before the new ones go in, as :class:`~jobs.output.parquet.ParquetWriter`
    #: does by returning the staged dataset itself. False: ``replace=`` is refused.
    replaces_partitions: ClassVar[bool] = False
    #: True when a restatement that stages no row empties the partitions it names, as
    #: :class:`~jobs.output.parquet.ParquetWriter` does; False: it is refused (a table commit
    #: adds files).
    empties_partitions: ClassVar[bool] = True
    #: True when the output keeps what a restatement replaces in its own history (a table,
    #: until its maintenance removes it), so ``keep_replaced`` changes nothing; False: the
    #: replaced files are deleted once the commit is done unless ``keep_replaced`` keeps them.
    history_keeps_replaced: ClassVar[bool] = False

    def check_replace(
        self, dataset: str, partition_by: tuple[str, ...], replace: tuple[str, ...] | bool
    ) -> None:
        """Refuse, before anything is written, a restatement's partitions (directories
        relative to the dataset's, or True: those staged) the format cannot replace; the
        default refuses any unless :attr:`replaces_partitions`.

        Raises:
            BatchArgumentError: naming the partition, or the format.
        """
        if not self.replaces_partitions:
            raise BatchArgumentError(
                f"argument 'replace' of dataset {dataset!r}: the {self.format} output "
                "format cannot replace partitions"
            )

    def published_partitions(self, staged: tuple[str, ...]) -> tuple[str, ...]:
        """The output partition directories that staged partition directories stand for (as
        a restatement's ``replace=True`` names them in the report): the same by default."""
        return staged

    @abc.abstractmethod
    def write(self, frame: DataFrame, directory: str, options: WriteOptions) -> Written:
        """Write ``frame`` into ``directory``, which must not exist yet.

        Returns:
            What is in ``directory`` now; zero files when the frame had no rows.
        """

    @abc.abstractmethod
    def commit(self, staged: StagedDataset) -> StepsBuilder:
        """The picklable builder of a staged dataset's commit sequence, run in a publish
        task."""


class OutputFormat(abc.ABC):
    """One output format. Subclass it, set :attr:`name`, implement :meth:`writer` and
    :meth:`read_back`, and register the class (see :mod:`jobs.output`). The registry makes
    one instance of the class and every job of the process shares it: keep a job's state on
    its :class:`Writer`, not on the format.

    Example: Parquet files with a column saying which job wrote them::

        from pyspark.sql import functions as F

        from jobs.output import ParquetFormat, ParquetWriter


        class TaggedWriter(ParquetWriter):
            def write(self, frame, directory, options):
                return super().write(frame.withColumn("job", F.lit("orders")), directory, options)


        class TaggedFormat(ParquetFormat):
            name = "tagged"

            def writer(self, config):
                return TaggedWriter()

    registered in the package's ``pyproject.toml``::

        [project.entry-points."commitpub.formats"]
        tagged = "mypackage.formats:TaggedFormat"
    """

    #: The ``output.format`` value.
    name: ClassVar[str]
    #: True when each dataset is a table partitioned by one date column at most (that of
    #: ``source.time_field``): ``output.partition_by`` is then refused.
    table: ClassVar[bool] = False
    #: The ``[output]`` keys beyond path, format, partitioning, file size and compression
    #: that this format takes; the others are refused when given (naming the formats that
    #: take them) before :meth:`settings` is asked.
    keys: ClassVar[tuple[str, ...]] = ()
    #: True when ``commitpub run --restate`` can restate the format's output from the job
    #: file: :meth:`output_partitions` and :meth:`lowest_offsets` read what is published,
    #: and its writer replaces partitions (:attr:`Writer.replaces_partitions`). False: the
    #: restatement is refused before the job lock.
    restates: ClassVar[bool] = False

    def settings(self, output: OutputKeys, job: str, naming: Naming) -> FormatSettings:
        """Check the ``[output]`` keys for this format and return what the job carries.

        The default: the namespace given, else the job's name; no catalog.

        Args:
            output: the keys as given (none that :attr:`keys` leaves out).
            job: the job's name.
            naming: how errors name the keys (job file or ``Batch`` arguments).

        Raises:
            ConfigurationError: naming the key that is wrong.
        """
        return FormatSettings(namespace=output.namespace or job)

    def check_dataset(self, config: BatchConfig, dataset: str) -> None:  # noqa: B027 -- optional hook
        """Refuse a dataset name the format cannot publish, before Spark does any work.

        Raises:
            BatchArgumentError: naming the dataset.
        """

    def owner(self, config: BatchConfig, dataset: str) -> OutputOwner:
        """The job that the output of ``dataset`` records as its owner (see
        :mod:`jobs.output.ownership`); read-only.

        The default is for formats that publish files into ``<output>/<dataset>/``: the
        record is the file :data:`~jobs.output.directories.OWNER_FILE` there.

        Raises:
            OwnerRecordError: if the record is unreadable or of a newer layout.
        """
        return read_owner_file(dataset_directory(config.output, dataset))

    def record_owner(
        self,
        config: BatchConfig,
        dataset: str,
        job: str,
        *,
        replace: bool = False,
        moving_from: str | None = None,
    ) -> bool:
        """Record ``job`` as the owner of the output of ``dataset``, crash-safely: only where
        none is recorded (created exclusively: of two jobs one wins), or with ``replace``
        over whatever is recorded (one atomic replacement; the rename command, holding the
        locks of both names). The caller reads the owner again to learn who won.

        Args:
            moving_from: the job's former name, while a rename moves its state.

        Returns:
            False where the output cannot hold a record yet (a table not created yet).
        """
        directory = dataset_directory(config.output, dataset)
        if replace:
            replace_owner_file(directory, job, moving_from)
        else:
            create_owner_file(directory, job)
        return True

    def output_datasets(self, config: BatchConfig) -> list[str]:
        """The datasets found in the job's output, sorted (a rename looks at each one's
        owner). The default: the directories under the output path (names starting with
        "_" or "." are not datasets)."""
        return [
            decode_name(name)
            for name in directories(config.output)
            if not name.startswith(("_", "."))
        ]

    @abc.abstractmethod
    def writer(self, config: BatchConfig) -> Writer:
        """The writer that stages a run's datasets and builds each one's commit
        (:meth:`Writer.commit`); one per run."""

    @abc.abstractmethod
    def read_back(
        self, output: str, dataset: str, config: BatchConfig | None
    ) -> list[dict[str, Any]]:
        """Every published row of ``dataset`` under the local ``output``, as plain Python
        values; empty when nothing is published yet. Runs on the driver, without Spark.

        Args:
            output: the job's output directory.
            dataset: the dataset's name.
            config: the job's settings (None: only ``output`` is known).
        """

    def output_partitions(
        self, config: BatchConfig, dataset: str, columns: tuple[str, ...]
    ) -> list[tuple[str, ...]]:
        """The partitions the output of ``dataset`` holds now, each as the directory names
        down from the dataset's, one per column of ``columns`` (``("ts_date=2026-11-01",
        "country=DE")``, values escaped as Spark names directories, the null one
        ``__HIVE_DEFAULT_PARTITION__``); empty when nothing is published. What a restatement
        from the job file (``commitpub run --restate``) chooses the partitions of its dates
        from. The default refuses: see :attr:`restates`.

        Raises:
            RestateRefusedError: saying why the output's partitions cannot be replaced so (a
                level not partitioned by the job's column there); the caller adds the
                dataset and the dates.
        """
        raise RestateRefusedError(
            f"the {self.name} output format cannot be restated from the job file; restate "
            "with jobs.Batch (stage(replace=...))"
        )

    def lowest_offsets(
        self, spark: SparkSession, config: BatchConfig, dataset: str, partitions: Sequence[str]
    ) -> dict[str, int] | None:
        """Per landing partition (``_source_partition``), the lowest ``_source_offset`` of
        the published rows of ``dataset`` in the top-level partitions ``partitions`` (as
        :meth:`output_partitions` names them: ``ts_date=2026-11-01``), read from what is
        published now: the records a restatement of those dates needs from the landing.
        None when the rows do not carry both columns (a transform dropped them). The default
        refuses: see :attr:`restates`.

        Raises:
            RestateRefusedError: as :meth:`output_partitions`.
        """
        raise RestateRefusedError(
            f"the {self.name} output format cannot be restated from the job file; restate "
            "with jobs.Batch (stage(replace=...))"
        )

    def lineage_name(self, config: BatchConfig, dataset: str) -> tuple[str, str] | None:
        """The OpenLineage (namespace, name) of a published dataset, or None for that of
        its location."""
        return None
