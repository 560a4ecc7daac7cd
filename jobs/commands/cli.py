"""The ``commitpub`` command line: ``run``, ``recover``, ``status``, ``inspect``, ``retry``,
``discard``, ``release``, ``revert``, ``unlock``, ``adopt-watermarks``, ``set-watermark``,
``rename-job`` and ``demo``.

The operator commands take a JOB.toml, or a ``jobs.Batch`` job's ``--job NAME --store URL
--watermarks URL`` (see :func:`jobs.config.operator_config`). Exit codes: see
:mod:`jobs.exitcodes`. Logs go to stderr:
rich lines and progress bars on a terminal, plain lines otherwise (cron, Airflow), or JSON
lines with ``--log-format json``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

import commitsteps
from jobs import exitcodes
from jobs.config import (
    JobConfig,
    OperatorConfig,
    apply_object_stores,
    load_config,
    load_operator_config,
    operator_config,
)
from jobs.exitcodes import ExitCode
from jobs.messages import explain
from jobs.output import names as format_names
from jobs.progress import Progress, showing
from jobs.runs.report import EMPTY_RUNS_WARNING, RunReport, summary_lines
from jobs.runs.report import as_json as report_json
from store.errors import CommitPubError, ConfigurationError, NotImportableError

if TYPE_CHECKING:
    from jobs.commands.ops import DatasetState
    from publisher import DatasetReport

log = logging.getLogger("commitpub.jobs")


class _JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers (``--log-format json``)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def _setup_logging(verbose: int, quiet: bool, log_format: str) -> None:
    from jobs.spark import show_spark_logs

    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    # Spark's own warnings, Java stack traces and py4j's connection chatter only with -v:
    # what failed reaches the user as one line (jobs.messages).
    show_spark_logs(bool(verbose))
    logging.getLogger("py4j").setLevel(logging.NOTSET if verbose else logging.CRITICAL)
    root = logging.getLogger("commitpub")
    root.setLevel(level)
    root.handlers.clear()
    handler: logging.Handler
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_JsonFormatter())
    elif _fancy(log_format):
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.propagate = False


def _fancy(log_format: str) -> bool:
    """Rich output and progress bars: on a terminal, unless plain or JSON lines were asked."""
    return log_format == "auto" and sys.stderr.isatty()


def _log_format() -> str:
    ctx = click.get_current_context().find_root()
    return str(ctx.params.get("log_format") or "auto")


class _FormatName(click.ParamType[str]):
    """An output format's name, checked against the registry (:mod:`jobs.output`) when
    given, so formats registered through entry points are accepted too."""

    name = "format"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        known = format_names()
        if value not in known:
            self.fail(f"{value!r} is not one of {', '.join(map(repr, known))}", param, ctx)
        return str(value)


def _fail(message: str, code: ExitCode) -> NoReturn:
    click.echo(f"commitpub: error: {message}", err=True)
    sys.exit(code)


def _load(job_file: str) -> JobConfig:
    try:
        config = load_config(job_file)
    except ConfigurationError as e:
        _fail(str(e), ExitCode.CONFIG)
    apply_object_stores(config)
    return config


#: The options naming a ``jobs.Batch`` job, by their parameter's name.
_BATCH_OPTIONS = {
    "job_name": "--job",
    "store": "--store",
    "watermarks": "--watermarks",
    "lock": "--lock",
    "staging": "--staging",
    "output": "--output",
    "output_format": "--format",
    "reports": "--reports",
}
_BATCH_JOB_USAGE = "--job NAME --store URL --watermarks URL"


def _batch_job(f: Callable[..., None]) -> Callable[..., None]:
    """The options naming a ``jobs.Batch`` job instead of a JOB.toml: what its script gives
    Batch, with Batch's defaults."""
    options = [
        click.option(
            "--job",
            "job_name",
            metavar="NAME",
            help="Instead of JOB.toml: a jobs.Batch job's name (with --store and --watermarks).",
        ),
        click.option("--store", metavar="URL", help="Its commit store (Batch's store=)."),
        click.option("--watermarks", metavar="URL", help="Its watermark store (watermarks=)."),
        click.option("--lock", metavar="URL", help="Its job lock (lock=; default: the store)."),
        click.option("--staging", metavar="PATH", help="Its staging (discard, recover)."),
        click.option("--output", metavar="PATH", help="Its output (discard, recover)."),
        click.option(
            "--format",
            "output_format",
            type=_FormatName(),
            help="Its output format (format=; default parquet).",
        ),
        click.option(
            "--reports", metavar="PATH", help="Its run reports (default: beside a local store)."
        ),
        click.option(
            "--steps",
            "step_modules",
            metavar="MODULE",
            multiple=True,
            help="A module of the job's own CommitSteps to import (repeatable), beside "
            "[job] steps of JOB.toml: a pending commit holding such steps needs it.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _by_options(where: dict[str, str | None]) -> bool:
    return any(where.get(name) is not None for name in _BATCH_OPTIONS)


def _operator_config(job_file: str | None, where: dict[str, str | None]) -> OperatorConfig:
    """The job an operator command is about: JOB.toml (with or without ``[source]``), or a
    ``jobs.Batch`` job's name and store URLs given as options; exactly one of the two."""
    _load_step_modules(where.pop("step_modules", None))
    given = [flag for name, flag in _BATCH_OPTIONS.items() if where.get(name) is not None]
    if job_file is not None and given:
        raise click.UsageError(
            f"give JOB.toml or {', '.join(given)}, not both: a job file, or a jobs.Batch job's "
            f"{_BATCH_JOB_USAGE}"
        )
    if job_file is None and not given:
        raise click.UsageError(f"give JOB.toml, or a jobs.Batch job's {_BATCH_JOB_USAGE}")
    missing = [f for f in ("--job", "--store", "--watermarks") if given and f not in given]
    if missing:
        raise click.UsageError(
            f"{_BATCH_JOB_USAGE} name a jobs.Batch job together: missing {', '.join(missing)}"
        )
    try:
        if job_file is not None:
            config = load_operator_config(job_file)
        else:
            config = operator_config(
                str(where["job_name"]),
                store=str(where["store"]),
                watermarks=str(where["watermarks"]),
                lock=where.get("lock"),
                staging=where.get("staging"),
                output=where.get("output"),
                format=where.get("output_format"),
                reports=where.get("reports"),
            )
    except ConfigurationError as e:
        _fail(str(e), ExitCode.CONFIG)
    apply_object_stores(config)
    return config


def _load_step_modules(modules: Any) -> None:
    """Import the modules given with ``--steps`` (the working directory is on sys.path)."""
    try:
        commitsteps.load_step_modules(modules or (), search_path=os.getcwd())
    except ConfigurationError as e:
        _fail(f"option '--steps': {e}", ExitCode.CONFIG)


def _job_and_dataset(args: tuple[str, ...], where: dict[str, str | None]) -> tuple[str | None, str]:
    """``[JOB.toml] DATASET``: the job file (None when the job is named by options) and the
    dataset."""
    if len(args) == 2:
        return args[0], args[1]
    if len(args) == 1 and _by_options(where):
        return None, args[0]
    raise click.UsageError(f"expected JOB.toml DATASET, or {_BATCH_JOB_USAGE} DATASET")


def _require_places(config: OperatorConfig, command: str) -> None:
    try:
        config.require_places(command)
    except ConfigurationError as e:
        _fail(str(e), ExitCode.CONFIG)


def _progress() -> AbstractContextManager[Progress]:
    """Progress bars per phase on a terminal; plain log lines otherwise (cron, Airflow)."""
    return showing(_fancy(_log_format()))


def _finish(report: RunReport, as_json: bool) -> NoReturn:
    try:
        if as_json:
            click.echo(json.dumps(report_json(report), indent=2, ensure_ascii=False))
        else:
            for line in summary_lines(report):
                click.echo(line)
    except BrokenPipeError:
        # The run is done: a reader that stopped reading does not change how it ended.
        _reader_gone()
    sys.exit(report.exit_code)


def _reader_gone() -> None:
    """Standard output's reader went away (``commitpub status | head``): nothing more is
    printed, and the interpreter's last flush must not complain about it either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


_EXIT_CODES = exitcodes.HELP


class _Commands(click.Group):
    """The command group: a failure no command caught still ends in one line that says what
    happened and what to do (:func:`jobs.messages.explain`); its traceback is logged at
    debug level (``-v``)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:
            # What a command prints is for its reader; once the reader has what it wanted
            # (``| head``), the command has done its part: quiet, and exit 0.
            _reader_gone()
            sys.exit(ExitCode.OK)
        except Exception as e:
            log.debug("%s failed", ctx.invoked_subcommand or "commitpub", exc_info=True)
            _fail(explain(e).line, exitcodes.for_error(e))


@click.group(
    cls=_Commands,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=f"""\b
Examples:
  commitpub demo --dir /tmp/commitpub-demo
  commitpub run jobs/orders.toml
  commitpub status jobs/orders.toml --json
  commitpub --log-format json run jobs/orders.toml 2>> /var/log/commitpub.jsonl

{_EXIT_CODES}""",
)
@click.version_option(
    package_name="commitpub", prog_name="commitpub", message="%(prog)s %(version)s"
)
@click.option(
    "-v", "--verbose", count=True, help="More log lines (debug), and Spark's own warnings."
)
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
@click.option(
    "--log-format",
    type=click.Choice(["auto", "plain", "json"]),
    default="auto",
    show_default=True,
    help="auto: progress bars on a terminal, plain lines otherwise; json: one object per line.",
)
def main(verbose: int, quiet: bool, log_format: str) -> None:
    """Publish PySpark batch ingestion output exactly once."""
    _setup_logging(verbose, quiet, log_format)


_JOB = click.argument("job_file", metavar="JOB.toml", type=click.Path(dir_okay=False))
#: An operator command's job file, unless the options name a jobs.Batch job.
_JOB_OR_OPTIONS = click.argument(
    "job_file", metavar="[JOB.toml]", required=False, type=click.Path(dir_okay=False)
)
#: ``[JOB.toml] DATASET``, split by :func:`_job_and_dataset`.
_JOB_AND_DATASET = click.argument("args", metavar="[JOB.toml] DATASET", nargs=-1)
_AS_JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


def _hold_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A hold's id as ``--hold`` takes it: the hex digits ``status`` shows."""
    from publisher.integration import status

    digits = status.HOLD_ID_DIGITS
    if value is None:
        return None
    if re.fullmatch(f"[0-9a-f]{{{digits}}}", value.lower()) is None:
        raise click.BadParameter(
            f"a hold's id is {digits} hex digits, as commitpub status shows it "
            f"(HELD (hold 3fa9c1d2e4b5) ...), got {value!r}"
        )
    return value.lower()


_HOLD = click.option(
    "--hold",
    "hold_id",
    metavar="ID",
    callback=_hold_id,
    help="Act only on this hold of the dataset (its id, as status and inspect show it); "
    "refused, nothing changed, if the dataset's hold is another one. Without it, the hold "
    "the question shows (with --yes: whatever is held).",
)


@main.command(
    epilog=f"""\b
Examples:
  commitpub run jobs/orders.toml
  COMMITPUB_REDIS_PASSWORD=... commitpub run jobs/orders.toml --json > report.json
  commitpub run jobs/orders.toml --restate orders --from 2026-11-01 --to 2026-11-03
  commitpub run jobs/orders.toml --restate orders --from 2026-11-01 --keep-replaced

{_EXIT_CODES}"""
)
@_JOB
@click.option("--run-id", help="Name of this run (staging directory, published file names).")
@click.option(
    "--restate",
    "restate",
    metavar="DATASET",
    multiple=True,
    help="Instead of new records: replace the output partitions of the dates --from..--to "
    "of DATASET (repeatable) with the landing records still present, read up to the "
    "committed watermarks, which stay where they are. Parquet directories, Iceberg and "
    "Delta tables (one overwrite or replaceWhere commit).",
)
@click.option(
    "--from",
    "first",
    metavar="DATE",
    type=click.DateTime(formats=["%Y-%m-%d"]),
    help="With --restate: the first date restated (YYYY-MM-DD).",
)
@click.option(
    "--to",
    "last",
    metavar="DATE",
    type=click.DateTime(formats=["%Y-%m-%d"]),
    help="With --restate: the last date restated, included (default: --from).",
)
@click.option(
    "--keep-replaced",
    is_flag=True,
    help="With --restate: keep the Parquet files replaced (in "
    "<output>/.commitpub-replaced/) so that `commitpub revert` of this run puts them back. "
    "An Iceberg or Delta table keeps them in its history until its maintenance: no effect "
    "there.",
)
@_AS_JSON
def run(
    job_file: str,
    *,
    run_id: str | None,
    restate: tuple[str, ...],
    first: dt.datetime | None,
    last: dt.datetime | None,
    keep_replaced: bool,
    as_json: bool,
) -> None:
    """Recover, extract new records with Spark, publish them exactly once.

    The job file is checked and the job lock taken before Spark starts; the run writes a
    JSON report into the job's reports directory (default: next to the commit store).

    With --restate, the run ingests nothing new: it replaces the output partitions of the
    dates given (Parquet directories; an Iceberg or Delta table's date partitions), in one
    sealed commit per dataset, with the job's transform of the landing records still
    present (refused, exit 2, nothing changed, when records the output's rows of those
    dates came from are gone, or the dates lie past what was published).
    """
    from jobs.runs.run import run_job

    if not restate and (first is not None or last is not None):
        raise click.UsageError("--from and --to choose the dates of --restate DATASET")
    if not restate and keep_replaced:
        raise click.UsageError("--keep-replaced keeps what --restate DATASET replaces")
    restatement = None
    if restate:
        from jobs.runs.restate import Restatement

        if first is None:
            raise click.UsageError("--restate DATASET needs --from DATE (and --to DATE)")
        restatement = Restatement(
            restate, first.date(), (last or first).date(), keep_replaced=keep_replaced
        )
    config = _load(job_file)

    def go() -> RunReport:
        with _progress() as progress:
            if restatement is None:
                return run_job(config, run_id=run_id, progress=progress)
            from jobs.runs.restate import restate_job

            return restate_job(config, restatement, run_id=run_id, progress=progress)

    _finish(_store_call(go), as_json)


@main.command(
    epilog=f"""\b
Examples:
  commitpub recover jobs/orders.toml
  commitpub recover --job orders-ingest --store state/steps --watermarks state/wm \\
      --staging staging --output warehouse

{_EXIT_CODES}"""
)
@_JOB_OR_OPTIONS
@_batch_job
@_AS_JSON
def recover(job_file: str | None, as_json: bool, **where: str | None) -> None:
    """Finish commits a crashed run left pending, in Spark tasks; ingest nothing new."""
    from jobs.runs.run import recover_job

    config = _operator_config(job_file, where)
    _require_places(config, "recover")

    def go() -> RunReport:
        with _progress() as progress:
            return recover_job(config, progress=progress)

    _finish(_store_call(go), as_json)


def _state(state: DatasetState, sealed: bool | None = None, otherwise: str | None = None) -> str:
    """How ``status`` and ``inspect`` name a dataset's state, ``sealed`` that of its pending
    sequence (None: unreadable, or none); ``otherwise`` for one without a pending sequence
    that is neither quarantined nor being discarded."""
    held = state.held
    if held is not None:
        by = f" by run {held.run_id}" if held.run_id else ""
        unfinished = ""
        if held.discarding:
            unfinished = ", DISCARDING (unfinished: run discard again)"
        elif sealed:
            unfinished = ", its release is written ahead (release again, or recover, finishes it)"
        elif sealed is False:
            unfinished = ", its release was cut off writing ahead (release again resumes it)"
        return f"HELD (hold {held.id}) since {held.since}{by}{unfinished}"
    if state.newer_format:
        return (
            "WRITTEN BY A NEWER COMMITPUB (upgrade commitpub to read it; do not discard it): "
            f"{state.newer_format}"
        )
    if state.discarding:
        return "DISCARDING (unfinished: run discard again)"
    if state.quarantined:
        refused = " (discard refused by the table: retry publishes the commit as it stands)"
        return f"QUARANTINED{refused if state.discard_refused else ''}"
    if otherwise is not None:
        return otherwise
    return "UNREADABLE" if sealed is None else "sealed" if sealed else "unsealed"


#: What the next steps need besides the dataset, for a ``jobs.Batch`` job named by options.
_BATCH_PLACES = "; for a Batch job both take its --staging and --output too"


def _echo_next(state: DatasetState, batch_job: bool, indent: str = "    ") -> None:
    """What to do about a quarantined or held dataset, under its line in ``status``."""
    if state.quarantined:
        click.echo(
            f"{indent}commitpub retry tries its commit again once the cause is fixed; "
            "commitpub discard gives it up and the data is read again"
        )
    _echo_hold(state, indent, batch_job=batch_job)


def _echo_hold(state: DatasetState, indent: str = "    ", *, batch_job: bool = False) -> None:
    """A held dataset's failed checks (one line each, with their figures), where its
    staged data is and what to do, under its line in ``status`` and ``inspect``."""
    held = state.held
    if held is None:
        return
    for check in held.checks:
        # The failed checks are JSON objects as the run that held the dataset gave them.
        if "message" in check and isinstance(check.get("figures"), dict):
            # A result of jobs.quality.checks: its severity, its line, its figures.
            figures = json.dumps(check["figures"], ensure_ascii=False, default=str)
            shown = f" ({check.get('severity', '?')}): {check['message']} {figures}"
        else:
            rest = {k: v for k, v in check.items() if k != "name"}
            shown = f": {json.dumps(rest, ensure_ascii=False, default=str)}" if rest else ""
        click.echo(f"{indent}failed check {check.get('name', '?')}{shown}")
    click.echo(f"{indent}staged data: {held.staging_dir}")
    click.echo(
        f"{indent}commitpub release publishes it as staged; commitpub discard deletes it "
        "and the data is read again" + (_BATCH_PLACES if batch_job else "")
    )


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


@main.command(
    epilog="""\b
Examples:
  commitpub status jobs/orders.toml
  commitpub status jobs/orders.toml --json | jq '.quarantined'
  commitpub status jobs/orders.toml --show-watermarks
  commitpub status --job orders-ingest --store state/steps --watermarks state/wm"""
)
@_JOB_OR_OPTIONS
@_batch_job
@_AS_JSON
@click.option(
    "--show-watermarks",
    is_flag=True,
    help="Also every committed watermark: dataset, partition, value.",
)
def status(job_file: str | None, as_json: bool, show_watermarks: bool, **where: str | None) -> None:
    """Pending and quarantined sequences per dataset, the job lock, the last run; with
    --show-watermarks the committed watermarks. Read-only."""
    from jobs.commands import ops

    config = _operator_config(job_file, where)
    doc = _store_call(lambda: ops.status(config, watermarks=show_watermarks))
    if as_json:
        click.echo(json.dumps(ops.as_json(doc), indent=2, ensure_ascii=False))
        return
    lock, lease = doc.lock, doc.lock.lease
    click.echo(f"job {doc.job} (store {doc.store})")
    held = f", token {lease.token}, pid {lease.pid} on {lease.host}" if lease is not None else ""
    click.echo(f"lock: {lock.state}{held}")
    if lock.stalled:
        about = lock.stalled_about_s
        click.echo(
            f"  stalled: no progress for {lock.stalled_renewals} renewals of the lease"
            + (f" (about {about:.0f}s)" if about is not None else "")
            + "; its run is alive but has not advanced (a hung step?). It ends at "
            "publish.step_timeout_s; see docs/operations.md"
        )
    if not doc.pending:
        click.echo("pending: none")
    for p in doc.pending:
        st = p.state
        click.echo(
            f"  {p.dataset}: {_state(st, p.sealed)}, {p.steps} steps, {st.attempts} attempts, "
            f"age {_age(p.age_s)}"
            + (f", last error: {st.last_error}" if st.last_error else "")
            + (f", unreadable: {p.error}" if p.error else "")
        )
        _echo_next(st, batch_job=job_file is None)
    for f in doc.without_pending:
        st = f.state
        if st.held is not None:
            click.echo(f"  {f.dataset}: {_state(st)}, {st.held.steps} steps held, not published")
        else:
            click.echo(
                f"  {f.dataset}: {_state(st, otherwise='failed')}, no pending commit, "
                f"{st.attempts} attempts"
                + (f", last error: {st.last_error}" if st.last_error else "")
            )
        _echo_next(st, batch_job=job_file is None)
    if doc.watermarks is not None:
        _echo_watermarks(doc.watermarks)
    last = doc.last_run
    if last is None:
        click.echo("last run: none recorded")
        return
    if last.state != "finished":
        click.echo(
            f"last run: {last.command} {last.run_id} started {last.started}, "
            + ("still running (it holds the job lock)" if last.state == "running" else "")
            + ("did not finish (killed?)" if last.state == "did not finish" else "")
        )
    shown = doc.last_finished_run
    if shown is None:
        click.echo("last finished run: none recorded")
        return
    counts = ", ".join(f"{k} {v}" for k, v in (shown.counts or {}).items() if v)
    click.echo(
        f"{'last run' if last.state == 'finished' else 'last finished run'}: {shown.command} "
        f"{shown.run_id} {shown.status} (exit {shown.exit_code}) at "
        f"{shown.finished}: "
        + (counts or ("nothing to do" if shown.exit_code == 0 else "nothing published"))
    )
    _echo_restated(shown.restated)
    if shown.empty_runs >= EMPTY_RUNS_WARNING:
        click.echo(
            f"  {shown.empty_runs} runs in a row staged no record: is the job reading the "
            "right input?"
        )


def _echo_restated(restated: dict[str, list[str]]) -> None:
    """The datasets a run restated, a line each with the partitions it replaced."""
    for dataset, partitions in restated.items():
        replaced = ", ".join(p or "the whole dataset" for p in partitions) or "no partition"
        click.echo(f"  restated {dataset}: replaced {replaced}")


def _echo_watermarks(marks: dict[str, dict[str, Any]]) -> None:
    """The committed watermarks, a line per dataset and partition."""
    if not any(marks.values()):
        click.echo("watermarks: none committed")
        return
    click.echo("watermarks:")
    for dataset, values in marks.items():
        for partition, value in sorted(values.items()):
            click.echo(f"  {dataset} {partition}: {json.dumps(value, ensure_ascii=False)}")


@main.command(
    epilog="""\b
Examples:
  commitpub inspect jobs/orders.toml orders
  commitpub inspect jobs/orders.toml orders --json | jq '.steps[] | select(.verified == false)'
  commitpub inspect --job orders-ingest --store state/steps --watermarks state/wm orders"""
)
@_JOB_AND_DATASET
@_batch_job
@_AS_JSON
def inspect(args: tuple[str, ...], as_json: bool, **where: str | None) -> None:
    """Show a pending sequence's (or a held commit's) decoded steps and whether each
    verifies. Changes nothing."""
    from jobs.commands import ops

    job_file, dataset = _job_and_dataset(args, where)
    config = _operator_config(job_file, where)
    doc = _store_call(lambda: ops.inspect(config, dataset))
    if as_json:
        click.echo(json.dumps(ops.as_json(doc), indent=2, ensure_ascii=False, default=str))
        return
    st = doc.state
    last_error = f", last error: {st.last_error}" if st.last_error else ""
    if not doc.pending and st.held is None:
        click.echo(
            f"{doc.dataset}: {_state(st, otherwise='healthy')}, no pending commit, "
            f"{st.attempts} attempts{last_error}"
        )
        return
    click.echo(
        f"{doc.dataset}: {_state(st, doc.sealed)}, {len(doc.steps)} steps, {doc.done} done, "
        f"{st.attempts} attempts{last_error}" + ("" if doc.pending else ", not written ahead")
    )
    _echo_hold(st, indent="  ")
    if doc.unreadable:
        click.echo(f"  unreadable: {doc.unreadable}")
    for step in doc.steps:
        mark = {True: "done", False: "todo", None: "?"}[step.verified]
        if step.failing:
            mark = "FAILED"
        fields = {**step.fields, **({} if step.error is None else {"error": step.error})}
        shown = " ".join(
            f"{k}={v}"
            for k, v in fields.items()
            if k not in ("index", "type", "verified", "failing")
        )
        click.echo(f"  [{step.index:>4}] {mark:<4} {step.type} {shown}")
        if step.failing:
            click.echo(f"         ^ the last attempt failed here: {st.last_error}")


@main.command(
    epilog="""\b
Example:
  commitpub retry jobs/orders.toml orders   # after fixing what made it fail
  commitpub retry --job orders-ingest --store state/steps --watermarks state/wm orders"""
)
@_JOB_AND_DATASET
@_batch_job
def retry(args: tuple[str, ...], **where: str | None) -> None:
    """Lift a dataset's quarantine; the next run tries its pending commit again."""
    from jobs.commands import ops

    job_file, dataset = _job_and_dataset(args, where)
    config = _operator_config(job_file, where)

    def go() -> bool | None:
        try:
            return ops.retry(config, dataset)
        except ops.NothingPendingError:
            return None

    was = _store_call(go)
    if was is None:
        click.echo(f"nothing to retry for {dataset}: no pending commit, not quarantined")
        return
    click.echo(
        f"{dataset}: quarantine lifted; the next run retries it"
        if was
        else f"{dataset}: was not quarantined; attempts reset"
    )


@main.command(
    epilog="""\b
Examples:
  commitpub discard jobs/orders.toml orders
  commitpub discard jobs/orders.toml orders --yes   # no question (scripts)
  commitpub discard jobs/orders.toml orders --keep-table   # after a table refused it
  commitpub discard jobs/orders.toml orders --force   # a commit whose record is unreadable
  commitpub discard jobs/orders.toml orders --yes --hold 3fa9c1d2e4b5   # that hold only
  commitpub discard --job orders-ingest --store state/steps --watermarks state/wm \\
      --staging staging --output warehouse orders"""
)
@_JOB_AND_DATASET
@_batch_job
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--keep-table",
    is_flag=True,
    help="Roll nothing back: keep the table commit (its data steps must be done), move the "
    "watermarks, skip the other unfinished steps, drop the commit record.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Drop a commit whose record cannot be read: nothing of it is rolled back, and what "
    "it published stays (the next run reads that data again).",
)
@_HOLD
def discard(
    args: tuple[str, ...],
    yes: bool,
    keep_table: bool,
    force: bool,
    hold_id: str | None,
    **where: str | None,
) -> None:
    """Throw a pending commit (or a held dataset's data) away; its data is extracted again
    by the next run.

    Steps already done are rolled back (watermarks set back, files it published deleted),
    its staged files deleted. Watermarks end where they were before it. A held dataset
    published nothing: its held staged files are deleted and the hold dropped; only the
    hold that was shown (or named by --hold), refused if another one holds it meanwhile.
    """
    from jobs.commands import ops

    job_file, dataset = _job_and_dataset(args, where)
    config = _operator_config(job_file, where)
    _require_places(config, "discard")

    def nothing() -> NoReturn:
        click.echo(f"nothing to discard for {dataset}: no pending commit, not quarantined")
        sys.exit(ExitCode.OK)

    if not _store_call(lambda: ops.has_work(config, dataset)):
        nothing()
    expected = hold_id
    hold = None if yes or keep_table else _store_call(lambda: ops.held(config, dataset))
    if hold is not None:
        # The answer is about this hold and no other; one not named is refused under the
        # lock, no question asked.
        expected = hold_id or hold.id
    if not yes and (hold is None or expected == hold.id):
        click.confirm(
            f"Drop the pending commit of {dataset!r} in job {config.name!r}, keeping what it "
            "published in the table and moving its watermarks? Its unfinished steps are skipped"
            if keep_table
            else f"Discard the held data of {dataset!r} in job {config.name!r} (hold {hold.id})? "
            f"Its held staged files in {hold.staging_dir} are deleted and its data will be read "
            "again"
            if hold is not None
            else f"Discard the pending commit of {dataset!r} in job {config.name!r}? Its data "
            "will be extracted again",
            abort=True,
        )

    def go() -> DatasetReport | None:
        try:
            return ops.discard(
                config, dataset, keep_table=keep_table, force=force, expected=expected
            )
        except ops.NothingPendingError:
            return None  # another command finished it meanwhile

    report = _store_call(go)
    if report is None:
        nothing()
    if keep_table:
        if report.outcome != "discarded":
            _fail(
                f"{dataset}: the commit record stays ({report.outcome}): {report.error}",
                ExitCode.FAILURE,
            )
        click.echo(
            f"{dataset}: commit record dropped, the table commit kept ({report.outcome}, "
            f"{report.executed} watermark steps executed)"
            + (f": {report.error}" if report.error else "")
        )
        return
    how = "" if report.outcome == "discarded" else f"{report.outcome}, "
    click.echo(
        f"{dataset}: discarded ({how}{report.steps} steps)"
        + (f": {report.error}" if report.error else "")
    )


@main.command(
    epilog=f"""\b
Examples:
  commitpub release jobs/orders.toml orders   # after looking at why it was held
  commitpub release jobs/orders.toml orders --yes   # no question (scripts)
  commitpub release jobs/orders.toml orders --yes --hold 3fa9c1d2e4b5   # that hold only
  commitpub release --job orders-ingest --store state/steps --watermarks state/wm \\
      --staging staging --output warehouse orders

{_EXIT_CODES}"""
)
@_JOB_AND_DATASET
@_batch_job
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@_HOLD
def release(args: tuple[str, ...], yes: bool, hold_id: str | None, **where: str | None) -> None:
    """Publish a held dataset's data as it was staged, exactly once, though its checks
    failed.

    Refused, with nothing changed, if a watermark it moves moved meanwhile or a staged file
    of it is gone: discard it then (its data is read again). Only the hold that was shown
    (or named by --hold) is released: refused if another one holds the dataset meanwhile.
    Exit 2 for a dataset that is not held.
    """
    from jobs.commands import ops
    from publisher import NotHeldError

    job_file, dataset = _job_and_dataset(args, where)
    config = _operator_config(job_file, where)
    _require_places(config, "release")
    expected = hold_id
    if not yes:
        # Not held (or not the hold named): no question, release under the lock says why.
        hold = _store_call(lambda: ops.held(config, dataset))
        if hold is not None and hold_id in (None, hold.id):
            names = ", ".join(str(c.get("name", "?")) for c in hold.checks) or "none named"
            click.confirm(
                f"Publish the held data of {dataset!r} in job {config.name!r} (hold {hold.id}, "
                f"{hold.steps} steps, in {hold.staging_dir}) as it was staged, though its "
                f"checks failed ({names})?",
                abort=True,
            )
            expected = hold.id  # the one the answer is about, and no other

    def go() -> DatasetReport:
        try:
            return ops.release(config, dataset, expected=expected)
        except NotHeldError as e:
            _fail(str(e), ExitCode.CONFIG)

    report = _store_call(go)
    line = f"{dataset}: released ({report.outcome}, {report.steps} steps)"
    if report.outcome != "published":
        todo = (
            "commitpub retry, then the next run, finishes it"
            if report.outcome == "quarantined"
            else "the next run or commitpub recover finishes it"
        )
        _fail(f"{line}: {report.error}; its commit is written ahead: {todo}", ExitCode.FAILURE)
    click.echo(line)


@main.command(
    epilog=f"""\b
Examples:
  commitpub revert jobs/orders.toml 20250101T120000Z-3fa9c1            # every dataset
  commitpub revert jobs/orders.toml 20250101T120000Z-3fa9c1 orders --yes
  commitpub revert --job orders-ingest --store state/steps --watermarks state/wm \\
      --staging staging --output warehouse 20250101T120000Z-3fa9c1 orders

{_EXIT_CODES}"""
)
@click.argument("args", metavar="[JOB.toml] RUN_ID [DATASET]", nargs=-1)
@_batch_job
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def revert(args: tuple[str, ...], yes: bool, **where: str | None) -> None:
    """Take back what a finished run published, in one sealed commit per dataset: its files
    removed (tables: a new Iceberg snapshot or Delta commit removing them and putting back
    what its restatement replaced), its watermarks set back to where they were before it
    (the next run reads that data again).

    Refused, with nothing changed (exit 2), for a run or dataset with no record (unknown,
    older than the last 20 uses of the job lock, reverted already), a watermark a later run
    moved further or a table partition a later run committed to (named: revert that run
    first), a published file gone since, or a table commit that maintenance (compaction,
    vacuum, snapshot expiry) made impossible to take back. Files a Parquet restatement
    replaced are put back when it kept them (``keep_replaced``; refused if one is gone or
    changed since); otherwise they were deleted after its commit and are not put back.
    """
    from jobs.commands import revert as reverting

    by_options = _by_options(where)
    positional = list(args)
    job_file = None if by_options else (positional.pop(0) if positional else None)
    if not 1 <= len(positional) <= 2 or (job_file is None and not by_options):
        raise click.UsageError(
            f"expected JOB.toml RUN_ID [DATASET], or {_BATCH_JOB_USAGE} RUN_ID [DATASET]"
        )
    run_id, dataset = positional[0], (positional[1] if len(positional) == 2 else None)
    config = _operator_config(job_file, where)
    _require_places(config, "revert")
    if not yes:
        shown = _store_call(lambda: reverting.plan(config, run_id, dataset))
        click.confirm(
            f"Revert run {run_id} of job {config.name!r}?\n{shown.describe()}\nThe data will be "
            "read again by the next run",
            abort=True,
        )
    reports = _store_call(lambda: reverting.revert(config, run_id, dataset))
    failed = [r for r in reports if r.outcome != "published"]
    for report in reports:
        click.echo(
            f"{report.dataset}: reverted run {run_id} ({report.steps} steps)"
            if report.outcome == "published"
            else f"{report.dataset}: revert {report.outcome}: {report.error}; its commit is "
            "written ahead: the next run or commitpub recover finishes it"
        )
    if failed:
        sys.exit(ExitCode.FAILURE)


@main.command(
    epilog="""\b
Example:
  commitpub unlock jobs/orders.toml --force   # a lease whose run died on another host
  commitpub unlock --job orders-ingest --store state/steps --watermarks state/wm --force"""
)
@_JOB_OR_OPTIONS
@_batch_job
@click.option("--force", is_flag=True, help="Required: confirms this is about a dead run.")
def unlock(job_file: str | None, force: bool, **where: str | None) -> None:
    """Free the job lock of a run that died: only a lease whose holder is proven dead, or
    that is not renewed for its whole TTL (watched on this host's clock; Redis: expired by
    the server)."""
    from jobs.commands import ops
    from store import Lease

    if not force:
        raise click.UsageError("unlock changes the job lock: pass --force")

    def watching(lease: Lease, wait_s: float) -> None:
        click.echo(
            f"the lease ({lease.describe()}) is not proven dead: watching it for up to "
            f"{wait_s:g}s; a live run renews it within a third of that",
            err=True,
        )

    config = _operator_config(job_file, where)
    freed = _store_call(lambda: ops.unlock(config, watching=watching))
    click.echo("lock was free" if freed is None else f"freed the lease ({freed.describe()})")


@main.command(
    "adopt-watermarks",
    epilog=f"""\b
Examples:
  commitpub adopt-watermarks jobs/clicks-eu.toml --from-legacy events
  commitpub adopt-watermarks jobs/orders.toml --all
  commitpub adopt-watermarks jobs/a.toml --from-legacy events --keep-legacy
  commitpub adopt-watermarks --job orders-ingest --store state/steps --watermarks state/wm \\
      --from-legacy orders

{_EXIT_CODES}""",
)
@click.argument("args", nargs=-1, metavar="[JOB.toml] [DATASET]...")
@_batch_job
@click.option(
    "--from-legacy",
    "from_legacy",
    is_flag=True,
    help="Adopt the datasets named: their legacy watermarks are this job's.",
)
@click.option("--all", "all_legacy", is_flag=True, help="Adopt every legacy dataset.")
@click.option(
    "--keep-legacy", is_flag=True, help="Leave the legacy copy, for another job to adopt too."
)
@_AS_JSON
def adopt_watermarks(
    args: tuple[str, ...],
    *,
    from_legacy: bool,
    all_legacy: bool,
    keep_legacy: bool,
    as_json: bool,
    **where: str | None,
) -> None:
    """Make legacy (un-scoped) watermarks of earlier versions this job's own.

    Earlier versions kept watermarks per dataset only, shared by every job on one watermark
    store. Each partition is copied into the job's namespace (never over a value the job
    has), then the legacy copy is set to null. Takes the job lock; safe to run again.
    """
    from jobs.commands import ops

    # A job file first, unless the options name a jobs.Batch job: then all are datasets.
    job_file: str | None = None
    datasets = args
    if args and not _by_options(where):
        job_file, datasets = args[0], args[1:]
    if all_legacy == (from_legacy and bool(datasets)) or bool(datasets) != from_legacy:
        raise click.UsageError("give --from-legacy DATASET [DATASET...], or --all")
    config = _operator_config(job_file, where)
    done = _store_call(
        lambda: ops.adopt_watermarks(
            config, datasets, all_legacy=all_legacy, keep_legacy=keep_legacy
        )
    )
    if as_json:
        click.echo(json.dumps(ops.as_json(done), indent=2, ensure_ascii=False))
        return
    if not done:
        click.echo("no legacy watermarks found")
    for d in done:
        click.echo(
            f"{d.dataset}: {len(d.copied)} partition(s) copied, {len(d.already)} adopted "
            f"before, legacy copy cleared for {len(d.cleared)}"
        )
        for partition, (own, legacy) in sorted(d.kept.items()):
            click.echo(
                f"  {partition}: kept the job's value {own!r}; the legacy one ({legacy!r}) "
                "stays where it is"
            )


@main.command(
    "set-watermark",
    epilog=f"""\b
Examples:
  commitpub set-watermark jobs/orders.toml orders 0 0   # read partition 0 from offset 0
  commitpub set-watermark jobs/orders.toml orders 0 null --yes   # from its beginning
  commitpub set-watermark --job orders-ingest --store state/steps --watermarks state/wm \\
      orders p0 1200

{_EXIT_CODES}""",
)
@click.argument("args", nargs=-1, metavar="[JOB.toml] DATASET PARTITION VALUE")
@_batch_job
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@_AS_JSON
def set_watermark(args: tuple[str, ...], yes: bool, as_json: bool, **where: str | None) -> None:
    """Set a partition's committed watermark to VALUE; the next run reads the partition
    from there.

    VALUE is JSON: 0, "2025-01-01T00:00:00", null (never committed: read from the
    beginning). For a source that went backwards (a partition wiped and landed again, a
    topic recreated, a backup restored): runs fail its dataset until its watermark is set
    deliberately. Takes the job lock; refused while a commit of the dataset is pending or
    held. One compare-and-set from the value shown: killed anywhere, the watermark holds the
    old value or the new one. Then the dataset's failure for a source that went backwards
    is cleared (its quarantine lifted); killed before that, run it again.
    """
    from jobs.commands import ops

    if len(args) == 4 or (len(args) == 3 and _by_options(where)):
        job_file, (dataset, partition, raw) = (args[0] if len(args) == 4 else None), args[-3:]
    else:
        raise click.UsageError(
            f"expected JOB.toml DATASET PARTITION VALUE, or {_BATCH_JOB_USAGE} DATASET "
            "PARTITION VALUE"
        )
    try:
        value = json.loads(raw)
    except ValueError:
        value = []  # refused below, as a list is
    if isinstance(value, list | dict):
        raise click.UsageError(
            "VALUE must be a JSON scalar: 0, '\"2025-01-01T00:00:00\"' (a string in its "
            f"quotes), null; got {raw!r}"
        )
    config = _operator_config(job_file, where)
    where_shown = f"{dataset}/{partition} in job {config.name!r}"

    def confirm(old: Any) -> bool:
        if yes:
            return True
        return click.confirm(
            f"Set the watermark of {where_shown} from {json.dumps(old)} to "
            f"{json.dumps(value)}? The next run reads the partition from there",
            abort=True,
        )

    done = _store_call(
        lambda: ops.set_watermark(config, dataset, partition, value, confirm=confirm)
    )
    if as_json:
        click.echo(json.dumps(ops.as_json(done), indent=2, ensure_ascii=False))
        return
    cleared = "; its failure for a source that went backwards is cleared" if done.cleared else ""
    if not done.changed:
        click.echo(
            f"{dataset}/{partition}: the watermark is {json.dumps(done.old)} already{cleared}"
        )
        return
    click.echo(
        f"{dataset}/{partition}: watermark set from {json.dumps(done.old)} to "
        f"{json.dumps(done.new)}; the next run reads the partition from there{cleared}"
    )


@main.command(
    "rename-job",
    epilog=f"""\b
Examples:
  commitpub rename-job jobs/orders-v2.toml --from orders-ingest
  commitpub rename-job --job orders-v2 --store state/steps --watermarks state/wm \\
      --staging staging --output warehouse --from orders-ingest

{_EXIT_CODES}""",
)
@_JOB_OR_OPTIONS
@_batch_job
@click.option(
    "--from",
    "old_name",
    required=True,
    metavar="OLD_NAME",
    help="The job's former name (its job.name before the change).",
)
@_AS_JSON
def rename_job(job_file: str | None, old_name: str, as_json: bool, **where: str | None) -> None:
    """Move a renamed job's state to the name in its configuration: watermarks, output
    ownership, staging claim.

    Holds the locks of both names; refused, nothing changed, while the old name has a
    pending, held or quarantined commit. Safe to run again after a crash: it finishes
    where it stopped, and until it has, runs of both names are refused at the outputs.
    """
    from jobs.commands.rename import rename_job as rename

    config = _operator_config(job_file, where)
    _require_places(config, "rename-job")
    done = _store_call(lambda: rename(config, old_name))
    if as_json:
        click.echo(json.dumps(done.to_dict(), indent=2, ensure_ascii=False, default=str))
        return
    copied = sum(len(p) for p in done.watermarks.values())
    click.echo(
        f"job {done.old!r} renamed to {done.new!r}: {copied} watermark(s) moved, "
        f"{len(done.outputs)} output(s) now record {done.new!r}, staging claim moved for "
        f"{len(done.staging)} path(s), {len(done.swept)} orphaned run director(ies) swept, "
        f"{done.records} record(s) of what its runs published carried over"
    )
    if done.left_failures:
        click.echo(
            f"failure counts of {', '.join(done.left_failures)} stay with the old name "
            "(not carried over)"
        )


@main.command(
    "postgres-schema",
    epilog="""\b
Example:
  commitpub postgres-schema | psql -v ON_ERROR_STOP=1 "postgresql://admin@db.example.com/jobs"
""",
)
def postgres_schema() -> None:
    """Print the SQL that creates the PostgreSQL store's schema, for a role that may create
    tables to run ahead of a job whose own role may not (docs/storage-format.md).

    The job's role then needs USAGE on schema commitpub and SELECT, INSERT, UPDATE, DELETE
    on its tables. A store whose role may create them makes them itself on first use.
    """
    from store.loader import load

    try:
        schema_sql = load("store.postgres:schema_sql", hint="pip install 'commitpub[postgres]'")
    except NotImportableError as e:
        _fail(str(e), ExitCode.CONFIG)
    click.echo(schema_sql(), nl=False)


T = TypeVar("T")


def _store_call(fn: Callable[[], T]) -> T:
    """Run a command's work; map its typed errors to exit codes (see jobs.exitcodes)."""
    from jobs.commands.ops import NothingPendingError

    try:
        return fn()
    except CommitPubError as e:
        code = exitcodes.for_error(e)
        message = str(e) if isinstance(e, NothingPendingError) else explain(e).line
        _fail(message, code)


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
@click.option(
    "--format",
    "output_format",
    default="parquet",
    show_default=True,
    type=_FormatName(),
    help="Publish Parquet files, or into Iceberg or Delta tables (or another registered format).",
)
def demo(directory: Path, records: int, output_format: str) -> None:
    """Ingest a generated landing zone through a real SIGKILL mid-publish; count the output.

    Local Spark, filesystem store and watermarks, no server. Ends with "exactly once: yes"
    only if every landing record was counted exactly once in the published Parquet (or
    Iceberg or Delta tables, read back by pyiceberg or deltalake).
    """
    from jobs.commands.demo import run_demo

    if not click.get_current_context().find_root().params.get("verbose"):
        # The demo tells its own story; the runs' log lines are for -v.
        logging.getLogger("commitpub").setLevel(logging.WARNING)
    try:
        exact = run_demo(directory, records=records, echo=click.echo, output_format=output_format)
    except ConfigurationError as e:
        _fail(str(e), ExitCode.CONFIG)
    sys.exit(ExitCode.OK if exact else ExitCode.FAILURE)
