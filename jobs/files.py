"""The local files a run writes for its operator (the JSON report, the metrics textfile):
each appears whole or not at all, and is never more open than the files a run publishes.
"""

from __future__ import annotations

import contextlib
import os
import secrets

from commitsteps.fs import PUBLISHED_MODE


def write_whole(path: str, data: bytes) -> None:
    """Write ``data`` to the local file ``path``, replacing it in one rename.

    The file is created ``0644`` less the process's umask, like the files a run publishes:
    readable by all and writable by its owner at most, whatever the umask (``open()`` would
    give ``0666`` less the umask). Its directory is created if needed. The data is synced
    before the rename, so a crash leaves the old file or the new one, never half of one.

    Raises:
        OSError: if the file cannot be written; nothing is left behind then.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    # A name of its own, created exclusively: a leftover of a killed writer (with whatever
    # mode it had) is never reused.
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PUBLISHED_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
