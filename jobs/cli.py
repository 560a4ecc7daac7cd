"""The ``commitpub`` command line: ``run``, ``recover`` and ``demo``.

Exit codes (SPEC): 0 all datasets published, 1 failure, 2 bad configuration or usage,
3 partial (some datasets quarantined). Logs go to stderr: rich lines and a progress spinner
on a terminal, plain lines otherwise (cron, Airflow).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from jobs.config import JobConfig, load_config
from jobs.run import EXIT_CONFIG, EXIT_FAILURE, RunReport
from store.errors import ConfigurationError

log = logging.getLogger("commitpub.jobs")


def _setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    root = logging.getLogger("commitpub")
    root.setLevel(level)
    root.handlers.clear()
    handler: logging.Handler
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.propagate = False


def _load(job_file: str) -> JobConfig:
    try:
        return load_config(job_file)
    except ConfigurationError as e:
        click.echo(f"commitpub: error: {e}", err=True)
        sys.exit(EXIT_CONFIG)


@contextmanager
def _progress() -> Iterator[Callable[[str], None]]:
    """A spinner with the current phase on a terminal; plain log lines otherwise."""
    if not sys.stderr.isatty():
        yield lambda line: log.info("%s", line)
        return
    from rich.console import Console

    with Console(stderr=True).status("starting") as status:

        def update(line: str) -> None:
            status.update(line)
            log.info("%s", line)

        yield update


def _finish(report: RunReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        d = report.to_dict()
        counts = ", ".join(f"{k} {v}" for k, v in d["counts"].items() if v)
        click.echo(
            f"{report.command} {report.run_id}: {report.status} ({counts or 'nothing to do'})"
        )
        if report.error:
            click.echo(f"error: {report.error}")
        for dataset, reason in sorted(report.skipped.items()):
            click.echo(f"skipped {dataset}: {reason}")
        click.echo(f"report: {report.path}")
    sys.exit(report.exit_code)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
Examples:
  commitpub demo --dir /tmp/commitpub-demo
  commitpub run jobs/orders.toml
  commitpub recover jobs/orders.toml --json

\b
Exit codes: 0 all published, 1 failure, 2 bad configuration or usage,
3 some datasets quarantined.""",
)
@click.option("-v", "--verbose", count=True, help="More log lines (debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
def main(verbose: int, quiet: bool) -> None:
    """Publish PySpark batch ingestion output exactly once."""
    _setup_logging(verbose, quiet)


@main.command(
    epilog="""\b
Example:
  commitpub run jobs/orders.toml
  COMMITPUB_REDIS_PASSWORD=... commitpub run jobs/orders.toml --json > report.json"""
)
@click.argument("job_file", metavar="JOB.toml", type=click.Path(dir_okay=False))
@click.option("--run-id", help="Name of this run (staging directory, published file names).")
@click.option("--json", "as_json", is_flag=True, help="Print the run report as JSON.")
def run(job_file: str, run_id: str | None, as_json: bool) -> None:
    """Recover, extract new records with Spark, publish them exactly once.

    The job file is checked before Spark starts; the run writes a JSON report into the
    job's reports directory (default: next to the commit store).
    """
    from jobs.run import run_job

    config = _load(job_file)
    try:
        with _progress() as progress:
            report = run_job(config, run_id=run_id, progress=progress)
    except ConfigurationError as e:
        click.echo(f"commitpub: error: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    _finish(report, as_json)


@main.command(epilog="\b\nExample:\n  commitpub recover jobs/orders.toml")
@click.argument("job_file", metavar="JOB.toml", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def recover(job_file: str, as_json: bool) -> None:
    """Finish commits a crashed run left pending, in Spark tasks; ingest nothing new."""
    from jobs.run import recover_job

    config = _load(job_file)
    with _progress() as progress:
        report = recover_job(config, progress=progress)
    _finish(report, as_json)


@main.command(epilog="\b\nExample:\n  commitpub demo --dir /tmp/commitpub-demo")
@click.option(
    "--dir",
    "directory",
    default="demo",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to create (an earlier demo there is replaced).",
)
@click.option(
    "--records",
    default=2000,
    show_default=True,
    type=click.IntRange(min=10),
    help="Records per partition in the first batch.",
)
def demo(directory: Path, records: int) -> None:
    """Ingest a generated landing zone through a real SIGKILL mid-publish; count the output.

    Local Spark, filesystem store and watermarks, no server. Ends with "exactly once: yes"
    only if every landing record was counted exactly once in the published Parquet.
    """
    from jobs.demo import run_demo

    if not click.get_current_context().find_root().params.get("verbose"):
        # The demo tells its own story; the runs' log lines are for -v.
        logging.getLogger("commitpub").setLevel(logging.WARNING)
    try:
        exact = run_demo(directory, records=records, echo=click.echo)
    except ConfigurationError as e:
        click.echo(f"commitpub: error: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    sys.exit(0 if exact else EXIT_FAILURE)
