"""moto's S3 server, with conditional writes made atomic as on S3, for the test endpoint.

    python tests/s3_server.py --port PORT

moto (5.x) honours ``If-None-Match: *`` and ``If-Match`` on PUT, but checks the condition and
then stores the object without a lock (``moto/s3/responses.py``, ``put_object``), so two
conditional PUTs in flight together can both pass the check. S3 itself decides them
atomically, and the stores rely on that, so this server runs moto's application behind one
lock for conditional writes only; everything else stays concurrent.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple

_CONDITIONS = ("HTTP_IF_NONE_MATCH", "HTTP_IF_MATCH")

App = Callable[[dict[str, Any], Any], Iterable[bytes]]


def atomic_conditional_writes(app: App) -> App:
    """Wrap a WSGI ``app`` so conditional PUT/POST requests run one at a time."""
    lock = threading.Lock()

    def wrapped(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] in ("PUT", "POST") and any(h in environ for h in _CONDITIONS):
            with lock:
                # The whole response is produced under the lock: moto stores while building it.
                return list(app(environ, start_response))
        return app(environ, start_response)

    return wrapped


def s3_only(dispatcher: DomainDispatcherApplication) -> App:
    """Hand every request to moto's S3 application, but for moto's own API.

    moto's dispatcher works out each request's service under one global lock, listing its
    modules on disk every time: a third of the server's CPU in the S3 crash tests, and
    requests in flight together waited for each other there. This endpoint is S3's alone.
    """
    s3 = create_backend_app("s3")

    def dispatch(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        own_api = environ.get("PATH_INFO", "").startswith("/moto-api")
        response: Iterable[bytes] = (dispatcher if own_api else s3)(environ, start_response)
        return response

    return dispatch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    run_simple(
        args.host,
        args.port,
        atomic_conditional_writes(s3_only(DomainDispatcherApplication(create_backend_app))),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
