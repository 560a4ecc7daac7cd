"""A user's own step module, declared once in the job file, loaded by every command.

The newcomer's path: ``acme_steps.py`` lives beside the job file, in a directory that is
not on the shell's ``PYTHONPATH``; the job file says ``steps = ["acme_steps"]`` in
``[job]``. A user's script (its own process, the module imported as a script imports it)
publishes a commit holding an ``acme.catalog-partitions`` step and is SIGKILLed between its
steps (fail point ``step.executed``), or holds a dataset whose commit holds one. Then the
operator's commands of the runbook, each the ``commitpub`` console script in its own
process: ``status``, ``inspect``, ``retry``, ``discard``, ``release`` and ``recover``.
Without the declaration, the same commit is a configuration error (exit 2) naming how to
declare the module, and is neither quarantined nor counted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import commitsteps
from tests.jobs.jobhelpers import commitpub

STEPS_MODULE = """\
import json
import os

import attrs

import commitsteps


@commitsteps.register("acme.catalog-partitions")
@attrs.frozen
class CatalogPartitionsStep(commitsteps.CommitStep):
    \"\"\"Registers a dataset's partition in a JSON catalog.\"\"\"

    catalog: str
    dataset: str
    partition: str

    def _entries(self):
        try:
            with open(self.catalog) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def verify(self):
        return self.partition in self._entries().get(self.dataset, [])

    def execute(self):
        entries = self._entries()
        if self.partition in entries.get(self.dataset, []):
            return
        entries.setdefault(self.dataset, []).append(self.partition)
        tmp = self.catalog + ".tmp"
        with open(tmp, "w") as f:
            json.dump(entries, f)
        os.replace(tmp, self.catalog)

    def rollback(self):
        entries = self._entries()
        if self.partition not in entries.get(self.dataset, []):
            return
        entries[self.dataset].remove(self.partition)
        tmp = self.catalog + ".tmp"
        with open(tmp, "w") as f:
            json.dump(entries, f)
        os.replace(tmp, self.catalog)

    def published_paths(self):
        return (self.catalog,)
"""

JOB_FILE = """\
[job]
name = "acme"
{steps}
[store]
url = "state/steps"
[watermarks]
url = "state/wm"
[staging]
path = "staging"
[output]
path = "warehouse"
"""

#: The user's script: the module imported as a script does (its directory on sys.path),
#: a commit of a rename, the user's step and a watermark step; published or held.
SCRIPT = """\
import sys
from pathlib import Path

project = Path(sys.argv[1])
sys.path.insert(0, str(project))
import acme_steps
from commitsteps import FsRenameCommitStep, WatermarkCommitStep
from publisher import Publisher

pub = Publisher(
    str(project / "state/steps"),
    "acme",
    staging_roots=[str(project / "staging")],
    output_roots=[str(project / "warehouse")],
    stores=[str(project / "state/wm")],
)
run_id = sys.argv[3]
run_dir = pub.create_run_dir(run_id)
staged = Path(run_dir) / "events"
staged.mkdir(parents=True)
(staged / "part-0.csv").write_text("a,b\\n")
steps = [
    FsRenameCommitStep.from_staged(
        str(staged / "part-0.csv"), str(project / f"warehouse/events/part-0-{run_id}.csv")
    ),
    acme_steps.CatalogPartitionsStep(
        str(project / "warehouse/_catalog.json"), "events", "2026-11-27"
    ),
    WatermarkCommitStep(str(project / "state/wm"), "events", "0", None, 1),
]
if sys.argv[2] == "hold":
    checks = [{"name": "row_count", "severity": "error", "figures": {"rows": 0, "min": 1}}]
    pub.hold("events", steps, staging_dir=str(staged), checks=checks, run_id=run_id)
else:
    pub.publish({"events": steps}, staging_dirs={"events": str(staged)})
"""


def _project(tmp_path: Path, *, declared: bool = True) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "acme_steps.py").write_text(STEPS_MODULE)
    steps = 'steps = ["acme_steps"]' if declared else ""
    (project / "job.toml").write_text(JOB_FILE.format(steps=steps))
    return project


def _script(project: Path, mode: str, run_id: str, failpoint: str | None = None) -> int:
    script = project.parent / "script.py"
    script.write_text(SCRIPT)
    env = {"COMMITPUB_FAILPOINTS": failpoint} if failpoint else {}
    done = subprocess.run(
        [sys.executable, str(script), str(project), mode, run_id],
        env={**_env(), **env},
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode


def _env() -> dict[str, str]:
    return dict(os.environ)


def _catalog(project: Path) -> dict[str, list[str]]:
    try:
        return json.loads((project / "warehouse" / "_catalog.json").read_text())  # type: ignore[no-any-return]
    except FileNotFoundError:
        return {}


def _pending(project: Path, cwd: Path) -> dict[str, object] | None:
    """The pending commit of ``events`` as ``status --json`` shows it; None without one."""
    shown = commitpub("status", str(project / "job.toml"), "--json", cwd=cwd)
    assert shown.returncode in (0, 1, 3), shown.stderr
    found = [d for d in json.loads(shown.stdout)["pending"] if d["dataset"] == "events"]
    return found[0] if found else None


def _crashed(tmp_path: Path, *, declared: bool = True) -> Path:
    """A commit SIGKILLed after its rename, before the user's step."""
    project = _project(tmp_path, declared=declared)
    code = _script(project, "publish", "r1", failpoint="step.executed@1")
    assert code == -signal.SIGKILL
    assert _catalog(project) == {}
    return project


def test_a_declared_step_module_beside_the_job_file_serves_the_runbook(tmp_path: Path) -> None:
    project = _crashed(tmp_path)
    job = str(project / "job.toml")
    # The shell is elsewhere, and its PYTHONPATH does not name the project.
    cwd = tmp_path

    events = _pending(project, cwd)
    assert events is not None
    assert events["sealed"], events
    assert events["error"] is None, events

    shown = commitpub("inspect", job, "events", cwd=cwd)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "CatalogPartitionsStep" in shown.stdout or "acme.catalog-partitions" in shown.stdout
    assert "UnknownStepTypeError" not in shown.stdout

    # retry: nothing is quarantined, so it says so and changes nothing; not an error.
    retried = commitpub("retry", job, "events", cwd=cwd)
    assert retried.returncode in (0, 1), retried.stdout + retried.stderr
    assert "UnknownStepTypeError" not in retried.stdout + retried.stderr

    # discard rolls back what ran (the rename) and drops the commit.
    discarded = commitpub("discard", job, "events", "--yes", cwd=cwd)
    assert discarded.returncode == 0, discarded.stdout + discarded.stderr
    assert not list((project / "warehouse").rglob("part-0-r1.csv"))
    assert _pending(project, cwd) is None

    # A new crash, then recover finishes it: the user's step executed exactly once.
    assert _script(project, "publish", "r2", failpoint="step.executed@1") == -signal.SIGKILL
    recovered = commitpub("recover", job, cwd=cwd)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert _catalog(project) == {"events": ["2026-11-27"]}
    assert len(list((project / "warehouse").rglob("part-0-r2.csv"))) == 1
    assert _pending(project, cwd) is None


def test_a_held_commit_with_a_declared_user_step_is_released(tmp_path: Path) -> None:
    project = _project(tmp_path)
    assert _script(project, "hold", "r1") == 0
    job = str(project / "job.toml")
    released = commitpub("release", job, "events", "--yes", cwd=tmp_path)
    assert released.returncode == 0, released.stdout + released.stderr
    assert _catalog(project) == {"events": ["2026-11-27"]}


def test_release_of_a_hold_whose_step_module_is_not_declared_is_refused_and_kept(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path, declared=False)
    assert _script(project, "hold", "r1") == 0
    job = str(project / "job.toml")
    released = commitpub("release", job, "events", "--yes", cwd=tmp_path)
    assert released.returncode == 2, released.stdout + released.stderr
    assert "declare its module" in released.stdout + released.stderr
    assert _catalog(project) == {}
    # Declared with --steps (run from the module's directory), the same hold is released.
    released = commitpub("release", job, "events", "--yes", "--steps", "acme_steps", cwd=project)
    assert released.returncode == 0, released.stdout + released.stderr
    assert _catalog(project) == {"events": ["2026-11-27"]}


def test_the_steps_option_declares_a_module_for_a_job_file_without_the_key(
    tmp_path: Path,
) -> None:
    project = _crashed(tmp_path, declared=False)
    shown = commitpub(
        "inspect", str(project / "job.toml"), "events", "--steps", "acme_steps", cwd=project
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "UnknownStepTypeError" not in shown.stdout


def test_an_undeclared_step_module_is_a_configuration_error_never_a_quarantine(
    tmp_path: Path,
) -> None:
    project = _crashed(tmp_path, declared=False)
    job = str(project / "job.toml")
    how = "declare its module with `steps = [...]` in [job]"

    # inspect shows the commit, its user step saying how to declare the module.
    shown = commitpub("inspect", job, "events", cwd=tmp_path)
    assert "acme.catalog-partitions' is not registered: " + how in shown.stdout, shown.stdout

    recovered = commitpub("recover", job, cwd=tmp_path)
    assert recovered.returncode == 2, recovered.stdout + recovered.stderr
    assert "step type 'acme.catalog-partitions' is not registered" in recovered.stdout
    assert how in recovered.stdout
    events = _pending(project, tmp_path)
    assert events is not None
    assert not events["quarantined"], events
    assert events["attempts"] == 0, events

    discarded = commitpub("discard", job, "events", "--yes", cwd=tmp_path)
    assert discarded.returncode == 2, discarded.stdout + discarded.stderr
    assert how in discarded.stderr
    assert "delete what it published by hand" not in discarded.stdout + discarded.stderr
    assert _pending(project, tmp_path) is not None

    # Declared, the next recovery finishes the very same commit.
    (project / "job.toml").write_text(JOB_FILE.format(steps='steps = ["acme_steps"]'))
    assert commitpub("recover", job, cwd=tmp_path).returncode == 0
    assert _catalog(project) == {"events": ["2026-11-27"]}


@pytest.mark.parametrize("module", ["acme_stepz", "acme/steps.py"])
def test_a_step_module_that_cannot_be_imported_is_refused_naming_the_key(
    tmp_path: Path, module: str
) -> None:
    project = _project(tmp_path)
    job = project / "job.toml"
    job.write_text(JOB_FILE.format(steps=f'steps = ["{module}"]'))
    shown = commitpub("status", str(job), cwd=tmp_path)
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert "job.steps" in shown.stderr
    assert module in shown.stderr


#: A step module whose import fails on executors only: it needs a library the driver has and
#: the executors lack (here: any Spark task, where TaskContext is set).
EXECUTOR_ONLY_FAILS = """
from pyspark import TaskContext

if TaskContext.get() is not None:
    raise ModuleNotFoundError("No module named 'acme_catalog_client'", name="acme_catalog_client")
"""


def test_a_step_module_executors_cannot_import_is_named_counted_and_quarantined(
    tmp_path: Path,
) -> None:
    project = _crashed(tmp_path)
    (project / "acme_steps.py").write_text(EXECUTOR_ONLY_FAILS + STEPS_MODULE)
    job = project / "job.toml"
    job.write_text(
        JOB_FILE.format(steps='steps = ["acme_steps"]') + "[publish]\nmax_attempts = 2\n"
    )

    first = commitpub("recover", str(job), "--json", cwd=tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    report = json.loads(first.stdout)
    import_errors = [e for t in report["spark_tasks"]["recover"] for e in t["import_errors"]]
    assert import_errors, report["spark_tasks"]
    assert all(e.startswith("acme_steps: ModuleNotFoundError") for e in import_errors)
    assert report["failed"] == ["events"]
    [entry] = report["recovery"]["datasets"]
    error = entry["error"]
    assert error.startswith("StepModuleImportError: step type 'acme.catalog-partitions' is")
    assert "acme_steps: ModuleNotFoundError" in error
    assert "spark.addArtifacts(path, pyfile=True)" in error
    assert "--py-files" in error
    events = _pending(project, tmp_path)
    assert events is not None
    assert (events["attempts"], events["quarantined"]) == (1, False)

    second = commitpub("recover", str(job), cwd=tmp_path)
    assert second.returncode == 3, second.stdout + second.stderr
    events = _pending(project, tmp_path)
    assert events is not None
    assert (events["attempts"], events["quarantined"]) == (2, True)
    assert _catalog(project) == {}


def test_an_installed_package_declares_its_step_module_with_the_entry_point(
    tmp_path: Path,
) -> None:
    """A package installed beside commitpub (a dist-info with a ``commitpub.steps`` entry
    point) is found by every command without a declaration in the job file."""
    project = _crashed(tmp_path, declared=False)
    installed = tmp_path / "site"
    installed.mkdir()
    (installed / "acme_steps.py").write_text(STEPS_MODULE)
    dist = installed / "acme_steps-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-steps\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[commitpub.steps]\nacme = acme_steps\n")
    env = {"PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(installed)])}
    shown = commitpub("inspect", str(project / "job.toml"), "events", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "UnknownStepTypeError" not in shown.stdout
    discarded = commitpub(
        "discard", str(project / "job.toml"), "events", "--yes", cwd=tmp_path, env=env
    )
    assert discarded.returncode == 0, discarded.stdout + discarded.stderr
    assert _pending(project, tmp_path) is None


def test_the_batch_argument_imports_the_step_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.config import batch_config
    from jobs.errors import BatchArgumentError

    (tmp_path / "acme_batch_steps.py").write_text(
        STEPS_MODULE.replace("acme.catalog-partitions", "acme.batch-partitions")
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    places = {"store": "s", "watermarks": "w", "staging": "st", "output": "o"}
    monkeypatch.chdir(tmp_path)
    config = batch_config("acme", **places, steps=["acme_batch_steps"])
    assert config.steps == ("acme_batch_steps",)
    assert "acme.batch-partitions" in commitsteps.registered()
    with pytest.raises(BatchArgumentError, match="argument 'steps': step module 'acme_nope'"):
        batch_config("acme", **places, steps=["acme_nope"])


#: A user's Batch script: its own step (its module imported as a script imports it) added
#: to a staged dataset's commit, published in Spark tasks of a local master.
BATCH_SCRIPT = """\
import json
import sys
from pathlib import Path

project = Path(sys.argv[1])
sys.path.insert(0, str(project))
import acme_steps
from pyspark.sql import SparkSession

import commitpub


def session():
    return SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()


with commitpub.Batch(
    session,
    "acme",
    store=str(project / "state/steps"),
    watermarks=str(project / "state/wm"),
    staging=str(project / "staging"),
    output=str(project / "warehouse"),
    max_attempts=2,
    summary=False,
) as batch:
    df = batch.spark.createDataFrame([(1, "a")], "id long, v string")
    batch.stage("events", df, watermarks={"0": 1})
    catalog = str(project / "warehouse/_catalog.json")
    batch.add_steps("events", [acme_steps.CatalogPartitionsStep(catalog, "events", "2026-11-27")])
done = [(d.dataset, str(d.outcome), d.attempts, d.error) for d in batch.report.publish.datasets]
print(json.dumps(done))
sys.exit(batch.report.exit_code)
"""


@pytest.mark.spark
def test_a_new_commit_whose_step_module_executors_cannot_import_is_counted_and_quarantined(
    tmp_path: Path,
) -> None:
    """The publish tasks cannot import the step module of a commit the Batch made (it needs
    a library only the driver has): the dataset fails with one error naming the module and
    how to ship it, counted, and is quarantined at ``max_attempts``; not a run failing
    before its tasks began, again and again, uncounted."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "acme_steps.py").write_text(EXECUTOR_ONLY_FAILS + STEPS_MODULE)
    script = tmp_path / "ingest.py"
    script.write_text(BATCH_SCRIPT)

    def run() -> tuple[int, list[list[object]]]:
        done = subprocess.run(
            [sys.executable, str(script), str(project)],
            env=_env(),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        assert lines, done.stderr[-3000:]
        return done.returncode, json.loads(lines[-1])

    code, [(dataset, outcome, attempts, error)] = run()
    assert (code, dataset, outcome, attempts) == (1, "events", "failed", 1), error
    assert error.startswith("StepModuleImportError: the commit's steps cannot be loaded on ")
    assert "step module acme_steps: ModuleNotFoundError: No module named 'acme_catalog_client'" in (
        error
    )
    assert "spark.sparkContext.addPyFile(path) or spark-submit --py-files path" in error
    assert "\n" not in error
    assert _catalog(project) == {}

    code, [(dataset, outcome, attempts, error)] = run()
    assert (code, dataset, outcome, attempts) == (3, "events", "quarantined", 2), error
    assert _catalog(project) == {}
