"""A dataset as a directory under the output, and the owner record it holds.

The formats that publish files (Parquet, Delta, and one of your own by default) keep each
dataset in ``<output>/<dataset>/`` and record the job publishing into it in the file
:data:`OWNER_FILE` there (:mod:`jobs.output.ownership` says why); a format that keeps its
owner elsewhere (Iceberg: a table property) answers with the same :class:`OutputOwner`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import attrs

from store import formats
from store.errors import ConfigurationError
from store.files import PUBLIC_FILE_MODE, FileIO
from store.urls import encode_name

#: The file in a dataset's directory naming the job that publishes into it. It starts with
#: "_", so Spark, pyarrow and DuckDB do not take it for data.
OWNER_FILE = "_commitpub_owner.json"


class OwnerRecordError(ConfigurationError):
    """A dataset's owner record is unreadable, or written by a newer commitpub."""


@attrs.frozen
class OutputOwner:
    """What a dataset's output says of the job publishing into it."""

    #: The job its owner record names, or None when it has none.
    job: str | None
    #: Whether the output exists (a directory or table, with or without a record).
    exists: bool
    #: Where the record is (or would be), as messages name it.
    where: str
    #: The job's former name while ``commitpub rename-job`` moves its state (refused to
    #: runs of both names until the command finishes), else None.
    moving_from: str | None = None


def dataset_directory(output: str, dataset: str) -> str:
    """The directory (or table location) of ``dataset`` under the output path or URL."""
    return f"{output.rstrip('/')}/{encode_name(dataset, 'dataset')}"


def directories(url: str) -> list[str]:
    """The names of the directories directly under ``url``, sorted; none if it is missing."""
    io = FileIO(url)
    return sorted(io.directories(io.root))


def _owner_file_bytes(job: str, moving_from: str | None = None) -> bytes:
    doc: dict[str, Any] = {"job": job}
    if moving_from is not None:
        doc["moving_from"] = moving_from
    return json.dumps(formats.stamped(doc, formats.OWNER_RECORD)).encode()


def read_owner_file(directory: str) -> OutputOwner:
    """The owner a dataset directory's :data:`OWNER_FILE` names (None without one).

    Raises:
        OwnerRecordError: if the file is unreadable or of a newer layout.
    """
    where = f"{directory}/{OWNER_FILE}"
    io = FileIO(directory)
    try:
        # Locally the directory itself (not a file or a link in its place); an object
        # store has no directories, only keys under it.
        exists = os.path.isdir(io.root) if io.local else io.exists(io.root)
        data = io.read(io.join(OWNER_FILE))
    except (FileNotFoundError, NotADirectoryError):
        return OutputOwner(None, exists, where)
    try:
        # Read from a shared directory: hostile until checked.
        doc = json.loads(data)
        formats.check_doc(doc, f"{where} (owner record)", formats.OWNER_RECORD)
        job, moving = doc["job"], doc.get("moving_from")
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise OwnerRecordError(f"{where}: not a commitpub owner record ({e})") from e
    if not isinstance(job, str) or not job or not isinstance(moving, str | None):
        raise OwnerRecordError(f"{where}: not a commitpub owner record (no job name)")
    return OutputOwner(job, True, where, moving or None)


def create_owner_file(directory: str, job: str) -> bool:
    """Create :data:`OWNER_FILE` naming ``job`` in ``directory`` (made if need be), whole and
    durable; False if one exists already (nothing changed)."""
    io = FileIO(directory)
    # On S3 one PUT with If-None-Match: *: exactly one creator wins.
    return io.create_exclusive(
        io.join(OWNER_FILE), _owner_file_bytes(job), mode=PUBLIC_FILE_MODE, dir_mode=0o755
    )


def replace_owner_file(directory: str, job: str, moving_from: str | None = None) -> None:
    """Make :data:`OWNER_FILE` in ``directory`` name ``job`` (and ``moving_from``), in one
    atomic replacement."""
    io = FileIO(directory)
    data = _owner_file_bytes(job, moving_from)
    io.replace(io.join(OWNER_FILE), data, mode=PUBLIC_FILE_MODE, dir_mode=0o755)
