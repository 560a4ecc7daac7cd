"""Bulk deletes on S3 that report every key they did not delete, retried with backoff.

A rename on an object store is a copy and a delete of the source; the sources of a batch go in
bulk deletes, one ``DeleteObjects`` request per 1,000 keys. What the clients retry, and what
they do not:

* A refused *request* (``503 SlowDown``, ``500``, a dropped connection) is retried by
  botocore (up to 5 attempts, "legacy" mode, exponential backoff) and then by s3fs (5 more
  for ``SlowDown``), for every request commitpub sends: copies, deletes, listings, the
  store's conditional writes. gcsfs retries ``429`` and ``5xx`` 6 times with backoff, and the
  items of its batch deletes one by one too.
* ``DeleteObjects`` may succeed as a request and still not delete some keys: S3 answers
  ``200`` with an ``<Error>`` (``SlowDown``, ``InternalError``, ``AccessDenied``) per key it
  did not delete. s3fs's ``rm`` does not look at those (it would report the rename done with
  its staged object still there). :func:`delete_s3_objects` sends the request itself, sends
  the keys that failed with a transient code again after a jittered backoff, a bounded number
  of times, and raises :class:`ObjectStoreRequestError` naming the first object it could
  not delete.

A key already gone counts as deleted (S3 reports it so), which makes a retry safe.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from commitsteps.errors import ObjectStoreRequestError

#: Keys of one ``DeleteObjects`` request: S3's limit.
BATCH = 1000
#: Attempts at the keys of one batch (the first included) before giving up.
ATTEMPTS = 8
#: The backoff before retry ``i`` (from 1) is drawn uniformly from 0 to
#: ``min(BACKOFF_CAP, BACKOFF_BASE * 2 ** i)`` seconds ("full jitter": clients refused
#: together do not all come back together).
BACKOFF_BASE = 0.05
BACKOFF_CAP = 5.0
#: Per-key error codes of ``DeleteObjects`` that a later attempt may not meet.
TRANSIENT = frozenset({"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout"})


def backoff(retry: int) -> float:
    """Seconds to wait before retry number ``retry`` (1, 2, ...): full jitter, capped."""
    return random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**retry))


def delete_s3_objects(fs: Any, bucket: str, keys: Sequence[str]) -> None:
    """Delete ``keys`` of ``bucket`` through s3fs ``fs``, every one or raise.

    Raises:
        ObjectStoreRequestError: a key was still refused with a transient code after
            :data:`ATTEMPTS` attempts, or at once with any other code. Keys of the same call
            reported deleted are deleted.
        OSError: from s3fs, when the request itself failed through all its retries.
    """
    for start in range(0, len(keys), BATCH):
        _delete_batch(fs, bucket, list(keys[start : start + BATCH]))


def _delete_batch(fs: Any, bucket: str, keys: list[str]) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        if attempt > 1:
            time.sleep(backoff(attempt - 1))
        out = fs.call_s3(
            "delete_objects",
            Bucket=bucket,
            Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True},
        )
        errors = out.get("Errors") or []
        for error in errors:
            if error.get("Code") not in TRANSIENT:
                raise _error(bucket, error, "refused")
        if not errors:
            return
        keys = [error["Key"] for error in errors]
    raise _error(bucket, errors[0], f"still refused after {ATTEMPTS} attempts", len(keys))


def _error(bucket: str, error: dict[str, Any], why: str, count: int = 1) -> ObjectStoreRequestError:
    url = f"{bucket}/{error.get('Key', '')}"
    code = str(error.get("Code", ""))
    more = f" (and {count - 1} more objects)" if count > 1 else ""
    return ObjectStoreRequestError(
        f"cannot delete s3://{url}{more}: DeleteObjects {why} with {code}: "
        f"{error.get('Message', '')}; the renames are copied and finish when the publish or "
        "`commitpub recover` runs again",
        url=url,
        operation="DeleteObjects",
        code=code,
    )
