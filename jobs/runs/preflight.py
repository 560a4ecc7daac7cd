"""What a job's configuration needs of the world around it, checked before the lock and
before Spark.

The job file's keys (and ``jobs.Batch``'s arguments) are checked as they are read
(:mod:`jobs.config`: types, the shape of every URL and path, overlapping places). What
needs more than the text is checked here, once, at the start of a run, ``commitpub
recover`` and a ``Batch`` (:meth:`jobs.runs.jobrun.JobRun.open`), before the job lock is taken
and before Spark starts: a configuration that can never work is refused with exit 2 and one
line naming the key, nothing locked, no token taken, no report written.

The Redis password of the Spark tasks. A store, watermark store or lock travels into Spark
tasks with its URL but without the password (the store never holds credentials, and a
task's pickle is not the place for one either); a task reads
``COMMITPUB_REDIS_PASSWORD`` from its environment instead. So a password given only in a
URL reaches the driver and not the tasks: every run would stage its data and then fail in
the first task that opens the store. :func:`jobs.spark.prepare_own_session` closes that for
a session ``commitpub run`` starts itself (classic Spark: the password goes to the executors as
``spark.executorEnv.COMMITPUB_REDIS_PASSWORD``, which Spark redacts in its UI and logs);
:func:`require_tasks_password` refuses what is left: a URL whose password differs from the
one the tasks get.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from jobs.config import BatchConfig, OperatorConfig
from jobs.output.ownership import renamed_hint
from jobs.spark import (
    EXECUTOR_PASSWORD_CONF,
    SPECULATION_REFUSED,
    SparkRunner,
    redis_passwords,
    redis_urls,
)
from publisher.integration import staging
from store.errors import ConfigurationError
from store.urls import REDIS_PASSWORD_ENV, has_credentials, redact

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


log = logging.getLogger("commitpub.jobs")


def preflight(
    config: BatchConfig,
    spark: SparkSession | None,
    *,
    claim_staging: bool = True,
    spark_tasks: bool = True,
) -> None:
    """Everything a run (``commitpub run`` and ``recover``, a ``jobs.Batch``) can check
    before it takes the job lock and starts Spark, in one place; each check reads only.

    Args:
        config: the job's checked settings.
        spark: the run's session if it is started (a ``Batch`` given one); None when the
            run starts its own.
        claim_staging: whether the run claims the job's staging path.
        spark_tasks: whether the run's work may run in Spark tasks.

    Raises:
        ConfigurationError: naming the key (a ``BatchArgumentError`` naming the argument):
            a Redis URL's password the Spark tasks would not get
            (:func:`require_tasks_password`), a PostgreSQL URL with a password
            (:func:`require_no_postgres_password`); a session that runs speculative tasks (in
            the session, or in ``[spark] conf``); a staging path that is another job's or
            holds what no job marked (:func:`require_staging`).
    """
    if spark_tasks:
        require_tasks_password(config, spark)
        require_no_postgres_password(config)
    if spark is not None:
        SparkRunner(spark)  # refuses a session with speculative execution
    elif isinstance(config, OperatorConfig):
        speculation = config.spark_conf.get("spark.speculation", "false")
        if speculation.lower() == "true":
            raise config.naming.error(
                f"key 'spark.conf' sets spark.speculation = true: {SPECULATION_REFUSED}"
            )
    if claim_staging:
        require_staging(config)


#: The URL schemes of PostgreSQL stores (store.postgres).
_POSTGRES_SCHEMES = ("postgresql", "postgres")


def require_no_postgres_password(config: BatchConfig) -> None:
    """Refuse a PostgreSQL URL of the job that carries a password.

    Spark tasks get the stores' URLs without their password and connect with libpq's own
    ``PGPASSWORD`` or ``~/.pgpass`` of their environment, so a password only in the URL lets
    the driver in, seal the write-ahead, and then fails every task that executes it.

    Raises:
        ConfigurationError: naming the key (a ``BatchArgumentError`` naming the argument),
            without the password, and where to put it instead.
    """
    naming = config.naming
    urls = {
        "store.url": config.store_url,
        "watermarks.url": config.watermarks_url,
        "lock.url": config.lock_url,
    }
    for key, url in urls.items():
        if not url or url.split("://", 1)[0].lower() not in _POSTGRES_SCHEMES:
            continue
        if has_credentials(url):
            raise naming.error(
                f"{naming.the(key)} ({redact(url)}) carries a password that the Spark tasks "
                "would not use: a URL's password never travels to them. Set PGPASSWORD (or "
                "a ~/.pgpass) on the driver and the executors (spark.executorEnv.PGPASSWORD), "
                "and leave it out of the URL"
            )


def require_staging(config: BatchConfig) -> None:
    """Refuse a staging path :meth:`publisher.Publisher.claim_staging` would refuse once the
    lock is held (reads only; the run claims it after taking the lock).

    Raises:
        ConfigurationError: naming the key, if another job marked the staging path, or it
            holds entries no job marked.
    """
    if not config.staging:
        return
    try:
        staging.check_claim(config.staging, config.name)
    except ConfigurationError as e:
        naming = config.naming
        raise naming.error(f"{naming.the('staging.path')}: {e}{renamed_hint(config)}") from e


def tasks_password(spark: SparkSession | None) -> tuple[str | None, str]:
    """The Redis password Spark tasks read, and where it comes from: the session's
    ``spark.executorEnv.COMMITPUB_REDIS_PASSWORD`` if it has one, else
    ``COMMITPUB_REDIS_PASSWORD`` of this process (inherited by a local master's workers, and
    passed on by :func:`jobs.spark.build_session` to the executors of a session it starts).

    Args:
        spark: the run's session if it is started; None when the run starts its own.
    """
    if spark is not None:
        configured = spark.conf.get(EXECUTOR_PASSWORD_CONF, None)
        if configured:
            return configured, f"the session's {EXECUTOR_PASSWORD_CONF}"
    return os.environ.get(REDIS_PASSWORD_ENV) or None, REDIS_PASSWORD_ENV


def require_tasks_password(config: BatchConfig, spark: SparkSession | None) -> None:
    """Refuse a Redis URL of the job whose password the Spark tasks would not get.

    Args:
        config: the job's checked settings.
        spark: the run's session if it is started (a ``Batch`` given one); None when the
            run starts its own from ``[spark]``.

    Raises:
        ConfigurationError: naming the key (a ``BatchArgumentError`` naming the argument),
            without the password, and how to give it to the tasks.
    """
    naming = config.naming
    passwords = redis_passwords(config)
    if not passwords:
        return
    if len(set(passwords.values())) > 1:
        keys = " and ".join(naming.the(key) for key in passwords)
        raise naming.error(
            f"{keys} carry different passwords; Spark tasks read one, from "
            f"{REDIS_PASSWORD_ENV}: give the stores one password, in {REDIS_PASSWORD_ENV}, "
            "and leave it out of the URLs"
        )
    theirs, source = tasks_password(spark)
    for key, password in passwords.items():
        if password == theirs:
            continue
        if theirs is not None:
            what = f"they use another one, from {source}"
        elif spark is None:
            what = f"they get none ({REDIS_PASSWORD_ENV} is not set)"
        else:
            what = (
                f"they get none (neither {REDIS_PASSWORD_ENV} nor {EXECUTOR_PASSWORD_CONF} is set)"
            )
        how = f"Set {REDIS_PASSWORD_ENV} to it, on the driver and the executors"
        if spark is not None:
            how += f" (or build the session with .config('{EXECUTOR_PASSWORD_CONF}', ...))"
        raise naming.error(
            f"{naming.the(key)} ({redact(redis_urls(config)[key])}) carries a password that "
            f"the Spark tasks would not use: a URL's password never travels to them, and "
            f"{what}. {how}, and leave it out of the URL"
        )
