"""Spark: the session of a job and :class:`SparkRunner`, which runs publisher work in tasks.

The publisher hands a runner a picklable function and a list of items (dataset names to
recover, or datasets to publish with a builder that lists their staging). ``SparkRunner``
splits the *items* into a few groups, one Spark task each; each task runs the function on
its group, so an executor reads its own datasets' sequences from the store (the store
travels by URL) and the driver only gathers one small report per dataset. It uses DataFrame
operations only, no RDD and no ``SparkContext``: a classic session and a Spark Connect
session (``SparkSession.builder.remote(...)``) run the same code.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

import commitsteps
from jobs import stepmodules
from publisher import DeadlineError, RunDeadlineError, StepDeadlineError
from publisher.integration import call_within, task_attempt, work_name
from store.errors import ConfigurationError, FencedError, NotImportableError
from store.failpoints import ENV_VAR as FAILPOINTS_ENV
from store.failpoints import MARKS_ENV_VAR
from store.loader import load
from store.urls import REDIS_PASSWORD_ENV, redis_password

#: Environment variables of the driver that executors need as well.
_EXECUTOR_ENV = (
    FAILPOINTS_ENV,
    MARKS_ENV_VAR,
    "COMMITPUB_REDIS_PASSWORD",
    # How long a Redis write waits for its replicas: the same in tasks as on the driver.
    "COMMITPUB_REDIS_WAIT_MS",
    # Where the object stores are ([s3], [gcs], [azure] tables or the driver's environment,
    # jobs.config.OBJECT_STORE_ENVIRONMENT); credentials are the cluster's.
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "STORAGE_EMULATOR_HOST",
    "GOOGLE_CLOUD_PROJECT",
    "AZURE_STORAGE_ACCOUNT_NAME",
)

#: Prefixes of the object stores' own settings: fsspec's per protocol, and gcsfs's.
_SETTINGS_PREFIXES = (
    "FSSPEC_S3_",
    "FSSPEC_GS_",
    "FSSPEC_GCS_",
    "FSSPEC_ABFS_",
    "FSSPEC_AZ_",
    "GCSFS_",
)

_CREDENTIAL = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL|CONNECTION_STRING|SAS")

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from jobs.config import BatchConfig, OperatorConfig

log = logging.getLogger("commitpub.jobs")
T = TypeVar("T")
R = TypeVar("R")

#: Defaults under the job's ``[spark] conf``: quiet logs (none at all in sessions
#: :func:`build_session` makes, see :data:`QUIET_LOG4J`), dates in UTC, no progress bar
#: mixed into our own output.
SPARK_DEFAULTS = {
    "spark.log.level": "ERROR",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
}

#: Log4j's configuration of a driver JVM that logs nothing, from its start on: what failed
#: reaches the user as one line (:mod:`jobs.messages`), not as Spark's warnings and Java
#: stack traces. ``spark.log.level`` is left unset with it (setting it prints a line).
QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")
#: Where log4j looks for its configuration file (the property ``log4j2.configurationFile``).
_LOG4J_ENV = "LOG4J_CONFIGURATION_FILE"
_SPARK_LOGS = {"verbose": False}


def show_spark_logs(verbose: bool) -> None:
    """Let Spark's own WARN lines and Java stack traces through (``commitpub -v``), or keep
    them out (the default), in the sessions :func:`build_session` makes from now on."""
    _SPARK_LOGS["verbose"] = verbose


def ensure_python() -> None:
    """Make Spark's Python workers run this interpreter unless PYSPARK_PYTHON says otherwise.

    Spark's default (``python3`` on the PATH) may be another interpreter without this project
    installed, and executors would fail to import it.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


#: The arguments pyspark gives spark-submit when it starts a driver JVM (default
#: ``pyspark-shell``).
_SUBMIT_ENV = "PYSPARK_SUBMIT_ARGS"
#: Without Spark's progress bar, which pyspark's driver shows even where no one looks (cron).
_QUIET_SUBMIT = "--conf spark.ui.showConsoleProgress=false pyspark-shell"


def prepare_driver() -> None:
    """Before calling a function of the user's that builds a session (``Batch``): Spark's
    Python workers run this interpreter (:func:`ensure_python`), and a driver JVM that the
    function starts keeps Spark's own console output out, as the sessions of
    :func:`build_session` do: no log lines (:data:`QUIET_LOG4J`), no progress bar.

    What the environment sets already wins (``LOG4J_CONFIGURATION_FILE``,
    ``PYSPARK_SUBMIT_ARGS``), and so do the session's own settings: ``spark.log.level``
    (``WARN``) brings Spark's log lines back from its start on, ``spark.ui.showConsoleProgress``
    its progress bar. A session already started, or a Spark Connect one, is not changed.
    """
    ensure_python()
    if not _SPARK_LOGS["verbose"]:
        os.environ.setdefault(_LOG4J_ENV, str(QUIET_LOG4J))
    os.environ.setdefault(_SUBMIT_ENV, _QUIET_SUBMIT)


#: What a Python worker imports to run commitpub's tasks; a probe imports the same.
_WORKER_IMPORTS = "import store, commitsteps, publisher, jobs.output.taskwriter"


def is_connect(spark: SparkSession) -> bool:
    """True for a Spark Connect session (``SparkSession.builder.remote(...)``).

    Told by the session's class, not by importing ``pyspark.sql.connect``, which needs the
    Connect client's packages installed.
    """
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def default_parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism: how many tasks a job of small work items is split into.

    A classic session's SparkContext says it. A Connect session does not say it through the
    DataFrame API, so there it is counted: a range with no partition count given is split
    into that many partitions (all on the JVM). Counting is one more Spark job (measured: up
    to 4.5 s of a run on a loaded machine), so a classic session is asked.
    """
    if not is_connect(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

    numbers = spark.range(1 << 16).select(F.spark_partition_id().alias("p"))
    top = numbers.agg(F.max("p")).first()
    return 1 + (top[0] if top is not None else 0)


def use_own_python(spark: SparkSession) -> None:
    """Point a started session's local Python workers at this interpreter if the one they
    run cannot import commitpub.

    A started classic session fixed its workers' interpreter when it started
    (``PYSPARK_PYTHON``, else ``python3`` on the PATH): under cron, with a virtual
    environment's interpreter run by path, that is the system's Python, and the first task
    would fail after Spark's retries with a worker's ``No module named 'jobs'``. On a local
    master (``local``, ``local[N]``, ``local-cluster``) the workers run on this host, in this
    working directory and environment, so running that interpreter once to import what a
    task imports tells in a fraction of a second. One that cannot is replaced by this
    interpreter, which runs the script and so imports commitpub and the script's own
    modules: pyspark reads the workers' interpreter (``SparkContext.pythonExec``) each time
    it wraps a Python function for Spark, so every function from then on (commitpub's
    tasks, and the script's own) runs in workers of this interpreter, started afresh by
    Spark for it (logged at INFO, naming both). An interpreter that imports commitpub is
    left as it is. Executors of a cluster run the cluster's Python, which only a Spark job
    could try: they are not checked, nor are those of a Spark Connect server.
    """
    if is_connect(spark):  # the server's workers are the server's
        return
    context = spark.sparkContext
    if not (context.master or "").startswith("local"):
        return
    python = context.pythonExec
    found = shutil.which(python)
    if found is not None and os.path.realpath(found) == os.path.realpath(sys.executable):
        return
    why = "not found"
    if found is not None:
        try:
            probe = subprocess.run(
                [found, "-c", _WORKER_IMPORTS],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            why = f"{type(e).__name__}: {e}"
        else:
            if probe.returncode == 0:
                return
            lines = probe.stderr.strip().splitlines()
            why = lines[-1] if lines else f"exit {probe.returncode}"
    given = os.environ.get("PYSPARK_PYTHON")
    context.pythonExec = sys.executable
    log.info(
        "Spark's local Python workers ran %r (%s), which cannot import commitpub: %s; they run "
        "%s from now on",
        python,
        "PYSPARK_PYTHON unset: Spark's default"
        if given is None
        else "PYSPARK_PYTHON"
        if given == python
        else f"fixed when the session started; PYSPARK_PYTHON is now {given!r}",
        why,
        sys.executable,
    )


def executor_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of the driver's environment that executors get as well.

    Besides :data:`_EXECUTOR_ENV`, the object stores' own settings go along
    (:data:`_SETTINGS_PREFIXES`: fsspec's for S3, GCS and Azure such as
    ``FSSPEC_S3_ENDPOINT_URL``, and gcsfs's), but for credentials (names holding KEY,
    SECRET, TOKEN, PASSWORD, CREDENTIAL, CONNECTION_STRING or SAS): those are the cluster's
    own, never copied into Spark's conf.
    """
    out = {name: environ[name] for name in _EXECUTOR_ENV if environ.get(name)}
    for name, value in environ.items():
        if name.startswith(_SETTINGS_PREFIXES) and value and not _CREDENTIAL.search(name):
            out[name] = value
    return out


#: The Spark setting that gives executors (and a local master's Python workers) the variable.
EXECUTOR_PASSWORD_CONF = f"spark.executorEnv.{REDIS_PASSWORD_ENV}"


def redis_urls(config: BatchConfig) -> dict[str, str]:
    """The job's store URLs by key: the commit store, the watermarks, the lock if apart."""
    urls = {"store.url": config.store_url, "watermarks.url": config.watermarks_url}
    if config.lock_url:
        urls["lock.url"] = config.lock_url
    return urls


def redis_passwords(config: BatchConfig) -> dict[str, str]:
    """The passwords the job's Redis URLs carry, by key."""
    found = {}
    for key, url in redis_urls(config).items():
        password = redis_password(url)
        if password is not None:
            found[key] = password
    return found


def prepare_own_session(config: OperatorConfig) -> None:
    """Before a run that starts its own session: check where the session will run, and put
    the password of the job's Redis URLs into ``COMMITPUB_REDIS_PASSWORD`` of this process,
    for a classic session that :func:`build_session` will start: it passes the variable on
    to the executors.

    Nothing is done when the variable is set already (then it is the tasks' password, and
    :func:`jobs.runs.preflight.require_tasks_password` refuses a URL with another one), for
    a Spark Connect session (its executors' environment is the server's), or when the URLs
    carry no password or different ones (one variable cannot hold two: refused by
    :func:`~jobs.runs.preflight.require_tasks_password`). URLs without a password then use
    the same one on the driver and in the tasks, as they would with the variable set by
    hand.

    Raises:
        ConfigurationError: for ``[spark] master`` with ``SPARK_REMOTE`` set (see
            :func:`remote_of`), before the lock rather than once Spark starts.
    """
    remote = remote_of(config)
    if os.environ.get(REDIS_PASSWORD_ENV) or remote:
        return
    distinct = set(redis_passwords(config).values())
    if len(distinct) == 1:
        os.environ[REDIS_PASSWORD_ENV] = distinct.pop()
        log.info(
            "the Redis password of the job's URLs goes to the Spark tasks (%s)",
            (EXECUTOR_PASSWORD_CONF),
        )


def build_session(config: OperatorConfig) -> SparkSession:
    """The SparkSession of a job: its ``[spark]`` table over :data:`SPARK_DEFAULTS`.

    Spark logs nothing to the console unless :func:`show_spark_logs` asked for its WARN
    lines (a ``spark.log.level`` in ``[spark] conf``, or a log4j configuration file of the
    user's in ``LOG4J_CONFIGURATION_FILE``, wins).

    Fail points armed in this process (``COMMITPUB_FAILPOINTS``), the Redis password
    (``COMMITPUB_REDIS_PASSWORD``) and where the object stores are reach the executors too,
    whose environment otherwise comes from the cluster's workers (see :func:`executor_env`);
    Spark redacts the password in its UI and logs.

    A Spark Connect session (``[spark] remote``, else ``SPARK_REMOTE``) gets only the SQL
    defaults and ``[spark] conf``: the server's logs and its executors' environment are the
    server's own.

    Raises:
        ConfigurationError: for ``[spark] master`` with ``SPARK_REMOTE`` set.
    """
    from pyspark.sql import SparkSession

    ensure_python()
    builder = SparkSession.builder.appName(f"commitpub {config.name}")
    remote = remote_of(config)
    given = os.environ.get("SPARK_REMOTE")
    if remote and given and given != remote:
        log.info(
            "connecting to %s, the job file's spark.remote; SPARK_REMOTE (%s) is ignored",
            shown_remote(remote),
            shown_remote(given),
        )
    if remote:
        builder = builder.remote(remote)
    elif config.spark_master:
        builder = builder.master(config.spark_master)
    if remote or os.environ.get("SPARK_REMOTE"):
        # A Connect server's own settings (its logs, its console, its executors'
        # environment) are the server's: a client setting them gets a warning, or nothing.
        conf = {k: v for k, v in SPARK_DEFAULTS.items() if k.startswith("spark.sql.")}
    else:
        conf = _classic_conf()
    conf.update(config.spark_conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


@contextlib.contextmanager
def run_session(
    config: OperatorConfig, spark: SparkSession | None
) -> Iterator[Callable[[], SparkSession]]:
    """A run's session (``commitpub run``, ``recover``): ``spark``, or one built from
    ``[spark]`` (:func:`build_session`) when first asked for and stopped after; prepared
    here, before the job lock (:func:`prepare_own_session`).

    Raises:
        ConfigurationError: for ``[spark] master`` with ``SPARK_REMOTE`` set, when the run
            starts its own session.
    """
    if spark is None:
        prepare_own_session(config)
    built: list[SparkSession] = []

    def session() -> SparkSession:
        if spark is not None:
            return spark
        built.append(build_session(config))  # told as a phase by JobRun.start_spark
        return built[0]

    try:
        yield session
    finally:
        for own in built:
            own.stop()


def _classic_conf() -> dict[str, str]:
    """:data:`SPARK_DEFAULTS` and the executors' environment, for a session whose driver JVM
    this process starts; its log4j configuration set up as :func:`build_session` says."""
    conf = dict(SPARK_DEFAULTS)
    if _SPARK_LOGS["verbose"]:
        conf["spark.log.level"] = "WARN"
        if os.environ.get(_LOG4J_ENV) == str(QUIET_LOG4J):  # inherited from a quiet parent
            del os.environ[_LOG4J_ENV]
    elif os.environ.get(_LOG4J_ENV, str(QUIET_LOG4J)) == str(QUIET_LOG4J):
        # The JVM this starts reads it; a log4j configuration of the user's own wins.
        os.environ[_LOG4J_ENV] = str(QUIET_LOG4J)
        del conf["spark.log.level"]
    for name, value in executor_env(os.environ).items():
        conf[f"spark.executorEnv.{name}"] = value
    return conf


def remote_of(config: OperatorConfig) -> str | None:
    """The Spark Connect server a job's session connects to: ``[spark] remote``, which wins
    over a different ``SPARK_REMOTE`` (:func:`build_session` logs it), else
    ``SPARK_REMOTE``'s (pyspark reads it).

    Raises:
        ConfigurationError: for ``[spark] master`` with ``SPARK_REMOTE`` set, which Spark
            refuses: one of them must go.
    """
    given = os.environ.get("SPARK_REMOTE")
    if config.spark_remote:
        return config.spark_remote
    if given and config.spark_master:
        raise ConfigurationError(
            f"{config.file or config.name}: key 'spark.master' ({config.spark_master!r}) "
            f"and SPARK_REMOTE ({shown_remote(given)!r}) exclude each other: unset "
            "SPARK_REMOTE, or replace spark.master by spark.remote"
        )
    return None


def spark_target(config: OperatorConfig) -> str:
    """Where a job's Spark runs, for a progress line: its Connect server, or its master."""
    remote = config.spark_remote or os.environ.get("SPARK_REMOTE")
    if remote:
        return f"Spark Connect {shown_remote(remote)}"
    return config.spark_master or "default master"


def shown_remote(url: str) -> str:
    """A Spark Connect URL fit for logs and reports: its parameters (a token) left out."""
    return url.partition(";")[0].rstrip("/")


@attrs.frozen
class TaskInfo:
    """Where one group of items ran: enough to tell executors from the driver."""

    host: str
    pid: int
    cwd: str
    stage: int
    partition: int
    attempt: int
    items: int
    #: Step modules registered on the driver that this task could not import.
    import_errors: tuple[str, ...] = ()
    #: Set when a store refused this task's writes: the run lost its job lock.
    fenced: str | None = None
    #: Set when a step of this task exceeded its deadline and was abandoned (counted).
    abandoned: str | None = None


def step_modules() -> tuple[str, ...]:
    """Modules of every step class registered in this process, to import in each task.

    A user's step module is imported on the driver (that registers the class); executors
    import the same modules before they read sequences, so its tag is known there too.
    Classes defined in ``__main__`` cannot be imported elsewhere and are left out.
    """
    modules = {cls.__module__ for cls in commitsteps.registered().values()}
    if "__main__" in modules:
        log.warning(
            "step classes defined in __main__ cannot be recovered on executors; "
            "move them to a module that executors can import"
        )
    return tuple(sorted(m for m in modules if m != "__main__"))


def _import_all(modules: Sequence[str]) -> tuple[str, ...]:
    errors = []
    for name in modules:
        try:
            load(name)
        except NotImportableError as e:
            errors.append(f"{name}: {e.reason}")
        except Exception as e:  # any import-time error of a user module is reported, not fatal
            errors.append(f"{name}: {type(e).__name__}: {e}")
    return tuple(errors)


def _run_task(
    fn: Callable[[Sequence[T]], list[R]], modules: Sequence[str], items: Iterable[T]
) -> Iterator[tuple[TaskInfo, list[R]]]:
    from pyspark import TaskContext

    import_errors = _import_all(modules)
    # A step type of a module that failed here is that module's error, counted towards
    # quarantine like a step's, never "not declared" (the driver declared it).
    commitsteps.unimportable({e.partition(": ")[0]: e for e in import_errors})
    for error in import_errors:
        log.warning("could not import step module %s", error)
    group = list(items)
    fenced = abandoned = None
    tc = TaskContext.get()
    try:
        # Spark runs a task again when its Python worker died: the work must know.
        with task_attempt(tc.attemptNumber() if tc else 0):
            results = fn(group) if group else []
    except FencedError as e:
        # Carried back as data: the driver re-raises it as itself, not as a Spark job failure
        # (which Spark would retry and wrap in a JVM stack trace).
        results, fenced = [], str(e)
    except DeadlineError as e:
        # Carried back as data too: a retried task would run the dataset again beside the
        # step it abandoned, which still runs in a thread of this Python worker.
        results, abandoned = [], str(e)
    info = TaskInfo(
        host=socket.gethostname(),
        pid=os.getpid(),
        cwd=os.getcwd(),
        stage=tc.stageId() if tc else -1,
        partition=tc.partitionId() if tc else -1,
        attempt=tc.attemptNumber() if tc else -1,
        items=len(group),
        import_errors=import_errors,
        fenced=fenced,
        abandoned=abandoned,
    )
    yield info, results


#: Why a session with speculative execution is refused.
SPECULATION_REFUSED = (
    "spark.speculation must be off for commitpub: a speculative copy of a publish task would "
    "execute the same commit twice at once, and one of a staging write task would stage its "
    "rows beside the original's"
)


class SparkRunner:
    """A :class:`publisher.Runner` that runs each group of items in a Spark task.

    ``Publisher(store, job, runner=SparkRunner(spark))`` verifies and re-executes pending
    sequences, and builds and writes ahead new ones, in Spark tasks, each responsible for a
    group of datasets. Step classes registered on the driver are imported in each task
    first; their modules must be importable on executors (install the package there, or
    ship it with ``spark-submit --py-files`` / ``SparkContext.addPyFile``; on Spark Connect,
    ``spark.addArtifacts(path, pyfile=True)`` or the server's ``PYTHONPATH``).

    Args:
        spark: the session whose executors run the work.
        tasks: how many groups (tasks) at most; default: Spark's default parallelism.

    Raises:
        ConfigurationError: if speculative execution is on: a speculative copy of a task
            would publish the same datasets twice at once (the run makes this runner when
            Spark starts, so a staging write is refused it too).
    """

    def __init__(self, spark: SparkSession, *, tasks: int | None = None) -> None:
        if (spark.conf.get("spark.speculation", "false") or "").lower() == "true":
            raise ConfigurationError(SPECULATION_REFUSED)
        if tasks is not None and tasks < 1:
            raise ConfigurationError(f"tasks must be >= 1, got {tasks}")
        self.spark = spark
        self.tasks = tasks
        #: Top-level modules of user steps already shipped to this session's executors.
        self._shipped: set[str] = set()
        #: Where the groups of the latest :meth:`map_groups` call ran.
        self.last_tasks: tuple[TaskInfo, ...] = ()
        self._parallelism: int | None = None

    def map_groups(
        self,
        fn: Callable[[Sequence[T]], list[R]],
        items: Sequence[T],
        *,
        timeout_s: float | None = None,
    ) -> list[R]:
        """Split ``items`` into at most ``tasks`` groups, run ``fn`` on each in a Spark task.

        The groups run through DataFrame operations only, as Spark Connect has them: a
        ``spark.range`` of one row per group in as many partitions (no shuffle), mapped with
        ``mapInArrow`` to each task's pickled :class:`TaskInfo` and results.

        With ``timeout_s``, the Spark job runs under a tag of its own, from a daemon thread of
        the driver; past the deadline the job is interrupted (its tasks are killed, and Spark
        kills a Python worker that does not stop) and :class:`~publisher.RunDeadlineError` is
        raised.

        Returns:
            The concatenated results; :attr:`last_tasks` tells where each group ran.

        Raises:
            FencedError: if a task's writes were refused: another run took the job over.
            StepDeadlineError: if a task abandoned a step past its deadline (counted there).
            RunDeadlineError: if the job did not finish within ``timeout_s``; cancelled.
        """
        items = list(items)
        if not items:
            self.last_tasks = ()
            return []
        n = min(len(items), self.tasks or self._default_tasks())
        # Contiguous groups, as SparkContext.parallelize slices a list.
        groups = [items[i * len(items) // n : (i + 1) * len(items) // n] for i in range(n)]
        name = work_name(fn)
        tag = f"commitpub-{name}-{uuid.uuid4().hex}"
        modules = step_modules()
        stepmodules.ship(self.spark, modules, self._shipped)
        task = functools.partial(_run_groups, fn, modules, groups)
        tags = _Tags(self.spark)

        def collect() -> list[tuple[TaskInfo, list[R]]]:
            # Tags are local to the thread that starts the job.
            tags.add(tag)
            try:
                rows = self.spark.range(n, numPartitions=n).mapInArrow(task, _GROUP_RESULT)
                return [_unpickled(row.info, row.results) for row in rows.collect()]
            finally:
                tags.remove(tag)

        def cancel() -> list[tuple[TaskInfo, list[R]]]:
            log.error("cancelling the Spark jobs of %s (tag %s): past the run deadline", name, tag)
            tags.interrupt(tag)
            raise RunDeadlineError(
                f"{name} of {len(items)} datasets in {n} Spark tasks did not finish within "
                f"the run's deadline ({timeout_s:g}s left of run_timeout_s): its Spark job "
                "was cancelled, abandoned"
            )

        gathered = call_within(collect, timeout_s, cancel)
        self.last_tasks = tuple(info for info, _ in gathered)
        fenced = [info.fenced for info in self.last_tasks if info.fenced]
        if fenced:
            raise FencedError(fenced[0])
        abandoned = [info.abandoned for info in self.last_tasks if info.abandoned]
        if abandoned:
            raise StepDeadlineError(
                f"{abandoned[0]} (in a Spark task on "
                f"{', '.join(sorted({i.host for i in self.last_tasks if i.abandoned}))})"
            )
        for info in self.last_tasks:
            for error in info.import_errors:
                log.warning("executor %s pid %d could not import %s", info.host, info.pid, error)
        return [r for _, results in gathered for r in results]

    def _default_tasks(self) -> int:
        """Spark's default parallelism (:func:`default_parallelism`), asked once."""
        if self._parallelism is None:
            self._parallelism = default_parallelism(self.spark)
        return self._parallelism


#: The result schema of a group's task: its pickled TaskInfo and pickled list of results.
_GROUP_RESULT = "info binary, results binary"


def _run_groups(
    fn: Callable[[Sequence[T]], list[R]],
    modules: Sequence[str],
    groups: Sequence[Sequence[T]],
    batches: Iterator[Any],
) -> Iterator[Any]:
    """The task of ``mapInArrow``: runs the groups whose numbers its rows hold."""
    import pyarrow as pa

    for batch in batches:
        for number in batch.column(0).to_pylist():
            for info, results in _run_task(fn, modules, groups[number]):
                yield pa.RecordBatch.from_pydict(
                    {
                        "info": pa.array([pickle.dumps(info)], pa.binary()),
                        "results": pa.array([pickle.dumps(results)], pa.binary()),
                    }
                )


def _unpickled(info: bytes, results: bytes) -> tuple[TaskInfo, list[Any]]:
    """What :func:`_run_groups` returned: pickled by this job's own tasks (as Spark itself
    pickles what RDD tasks return), never data read from a store."""
    return pickle.loads(info), pickle.loads(results)  # noqa: S301 -- see the docstring


class _Tags:
    """Tags of the Spark jobs a thread starts, and interrupting the jobs of a tag.

    A Connect session: ``SparkSession.addTag``/``interruptTag``. A classic session: the
    SparkContext's job tags, the one use of it left: a classic session's ``interruptTag``
    interrupts nothing of a ``collect`` started in another Python thread (tried with pyspark
    4.3: it returned no operation and the job ran on), and pyspark 3.5 has it for Connect
    only.
    """

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.context = None if is_connect(spark) else spark.sparkContext

    def add(self, tag: str) -> None:
        if self.context is None:
            self.spark.addTag(tag)
        else:
            self.context.addJobTag(tag)
            self.context.setInterruptOnCancel(True)

    def remove(self, tag: str) -> None:
        if self.context is None:
            self.spark.removeTag(tag)
        else:
            self.context.removeJobTag(tag)

    def interrupt(self, tag: str) -> None:
        if self.context is None:
            self.spark.interruptTag(tag)
        else:
            self.context.cancelJobsWithTag(tag)
