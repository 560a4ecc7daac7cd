"""Each setting is declared once: the job file, Batch's arguments and the docs follow from it.

The docs are written by hand and checked here against the declarations: every key of the job
file has a row in ``docs/configuration.md`` showing its default, no row names a key that does
not exist, and ``docs/api.md``'s table of Batch's arguments names each argument's key.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from jobhelpers import write_job

from jobs import Batch
from jobs.config import BatchConfig, JobConfig, SourceConfig, load_config, load_operator_config
from jobs.errors import BatchArgumentError
from jobs.settings import POSITIVE_SECONDS, Setting, argument_docs, arguments, settings
from store.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
#: Every setting a job file may hold.
JOB_FILE = (JobConfig, SourceConfig)

_SECTION = re.compile(r"^## \[(\w+)\]\s*$")
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|([^|]*)\|([^|]*)\|")


def configuration_rows(text: str) -> dict[str, str]:
    """``docs/configuration.md``'s key rows: ``"table.key"`` -> the default column's text,
    from the first table under each ``## [table]`` heading (and ``"table"`` -> ``""`` for
    the heading itself)."""
    rows: dict[str, str] = {}
    table = None
    in_rows = False
    for line in text.splitlines():
        section = _SECTION.match(line)
        if section:
            table, in_rows = section.group(1), False
            rows[table] = ""
            continue
        if line.startswith("## "):
            table = None
        if table is None:
            continue
        row = _ROW.match(line)
        if row and row.group(1) != "key":
            in_rows = True
            rows[f"{table}.{row.group(1)}"] = row.group(3).strip()
        elif in_rows and not line.startswith("|"):
            table = None  # a section's first table only
    return rows


def configuration_problems(text: str, records: tuple[type, ...] = JOB_FILE) -> list[str]:
    """What ``docs/configuration.md`` (``text``) says otherwise than the declarations."""
    rows = configuration_rows(text)
    problems = []
    declared = {s.key: s for s in settings(*records)}
    for key, setting in declared.items():
        if "." not in key:  # a free-form table, documented on its own
            if key not in rows:
                problems.append(f"no section ## [{key}] for table [{key}]")
            continue
        if key not in rows:
            problems.append(f"no row for key '{key}'")
        elif not rows[key].startswith(setting.shown_default()):
            problems.append(
                f"key '{key}': the default shown is {rows[key]!r}, declared "
                f"{setting.shown_default()!r}"
            )
    free_form = {key for key in declared if "." not in key}
    tables = {key.partition(".")[0] for key in declared}
    for key in rows:
        table = key.partition(".")[0]
        if key not in declared and table not in free_form and (key not in tables):
            problems.append(f"row for key '{key}', which is not a setting")
    return problems


_ARGUMENT_ROW = re.compile(r"^\|\s*`(\w+)`\s*\|\s*`?([^|`]*)`?\s*\|")


def api_problems(text: str) -> list[str]:
    """What ``docs/api.md``'s table of Batch's arguments says otherwise than the
    declarations: each setting's argument with its key, no argument that is not one."""
    section = text.split("### Arguments", 1)[1].split("\n### ", 1)[0]
    shown = {
        m.group(1): m.group(2).strip().strip("[]")
        for m in map(_ARGUMENT_ROW.match, section.splitlines())
        if m and m.group(1) != "argument"
    }
    declared = {argument: key for key, argument in arguments(BatchConfig).items()}
    problems = [
        f"argument '{argument}' ({key}) has no row"
        for argument, key in declared.items()
        if argument not in shown
    ]
    problems += [
        f"argument '{argument}': the row names key {shown[argument]!r}, declared {key!r}"
        for argument, key in declared.items()
        if argument in shown and shown[argument] != key
    ]
    problems += [
        f"row for argument '{argument}' ({key}), which is not a setting"
        for argument, key in shown.items()
        if key and argument not in declared
    ]
    return problems


def test_the_configuration_reference_shows_every_setting_and_its_default() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert len(configuration_rows(text)) > 40
    assert configuration_problems(text) == []


def test_the_api_reference_names_every_argument_of_batch_with_its_key() -> None:
    assert api_problems((ROOT / "docs" / "api.md").read_text(encoding="utf-8")) == []


def test_the_docs_check_finds_a_missing_row_a_wrong_default_and_a_key_that_does_not_exist() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `ttl_s` |"))
    tampered = (
        text.replace(row + "\n", "")
        .replace("| `max_attempts` | integer >= 1 | `3` |", "| `max_attempts` | integer | `5` |")
        .replace("| `url` | string | required | the watermark", "| `uri` | string | none | the")
    )
    assert configuration_problems(tampered) == [
        "no row for key 'watermarks.url'",
        "key 'publish.max_attempts': the default shown is '`5`', declared '`3`'",
        "no row for key 'lock.ttl_s'",
        "row for key 'watermarks.uri', which is not a setting",
    ]


def test_batchs_docs_list_every_argument_with_its_key_and_default() -> None:
    doc = Batch.__doc__ or ""
    for key, argument in arguments(BatchConfig).items():
        assert f"{argument} (``{key}``): " in doc
    assert "max_attempts (``publish.max_attempts``): failed commits of a dataset" in doc
    assert "Default: ``3``." in doc


# -- a setting added in one place shows up everywhere -------------------------------------------


@pytest.fixture
def new_setting(monkeypatch: pytest.MonkeyPatch) -> Setting[float]:
    """A setting declared by this fixture only, as a built-in one is: no other file knows it."""
    setting = Setting[float](
        "publish.pause_s",
        default=7.0,
        validator=POSITIVE_SECONDS,
        argument="pause_s",
        doc="seconds to pause between two datasets",
    )
    monkeypatch.setattr(BatchConfig, "pause_s", setting, raising=False)
    return setting


def _places(base: Path) -> dict[str, str]:
    return {
        "store": str(base / "state" / "steps"),
        "watermarks": str(base / "state" / "wm"),
        "staging": str(base / "staging"),
        "output": str(base / "output"),
    }


def test_a_new_setting_is_in_the_job_file_batch_and_the_docs_check(
    new_setting: Setting[float], tmp_path: Path
) -> None:
    # The job file's schema: read, defaulted, checked and named like any key.
    given = load_config(write_job(tmp_path, publish={"pause_s": 9}))
    assert given.values["publish.pause_s"] == 9.0
    assert getattr(given, "pause_s") == 9.0  # noqa: B009 (an attribute mypy cannot know)
    assert load_config(write_job(tmp_path)).values["publish.pause_s"] == 7.0
    operator = load_operator_config(write_job(tmp_path, publish={"pause_s": 2}))
    assert operator.values["publish.pause_s"] == 2.0
    for publish, message in (
        ({"pause_s": "9s"}, "key 'publish.pause_s' must be a number, got '9s'"),
        ({"pause_s": 0}, "key 'publish.pause_s' must be a positive number of seconds, got 0"),
        ({"pauses": 1}, "unknown key 'publish.pauses'; known keys of [publish]: "),
    ):
        with pytest.raises(ConfigurationError) as refused:
            load_config(write_job(tmp_path, publish=publish))
        assert message in str(refused.value)
    assert str(refused.value).endswith(", pause_s")

    # Batch: accepted as a keyword, checked, and carried to where settings go.
    def no_spark() -> None:
        raise AssertionError("a Batch that is never entered never asks for Spark")

    batch = Batch(no_spark, "j", pause_s=3, **_places(tmp_path))
    assert batch.config.values["publish.pause_s"] == 3.0
    assert Batch(no_spark, "j", **_places(tmp_path)).config.values["publish.pause_s"] == 7.0
    with pytest.raises(BatchArgumentError, match="argument 'pause_s' must be a positive number"):
        Batch(no_spark, "j", pause_s=-1, **_places(tmp_path))
    assert "pause_s (``publish.pause_s``): seconds to pause between two datasets. Default: " in (
        argument_docs(BatchConfig)
    )

    # The docs check: the reference lacks it, until a row shows it with its default.
    docs = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert configuration_problems(docs) == ["no row for key 'publish.pause_s'"]
    row = "| `pause_s` | number > 0 | `7` | seconds to pause between two datasets |\n"
    anchor = "| `max_attempts` |"
    assert configuration_problems(docs.replace(anchor, row + anchor, 1)) == []
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert api_problems(api) == ["argument 'pause_s' (publish.pause_s) has no row"]
