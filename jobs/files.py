"""The local files a run writes for its operator (the JSON report, the metrics textfile):
each appears whole or not at all, and is never more open than the files a run publishes.
"""

from __future__ import annotations

from store.files import PUBLIC_FILE_MODE, write_stream


def write_whole(path: str, data: bytes) -> None:
    """Write ``data`` to the local file ``path``, replacing it in one rename.

    The file is created ``0644`` less the process's umask, like the files a run publishes:
    readable by all and writable by its owner at most, whatever the umask (``open()`` would
    give ``0666`` less the umask). Its directory is created if needed. The data and the new
    name are synced (:func:`store.files.write_stream`), so a crash leaves the old file or
    the new one, never half of one.

    Raises:
        OSError: if the file cannot be written; nothing is left behind then.
    """
    write_stream(path, [data], mode=PUBLIC_FILE_MODE, dir_mode=0o755)
