"""A real moto S3 server over HTTP on an ephemeral port, for the test suite.

Run as a script: prints ``PORT <n>`` once listening.  Requests are served by threads
but, unless ``--concurrent`` is given (benchmarks of parallel reads), executed one at a
time: moto checks a conditional write's precondition and then stores the object in two
steps, and real S3 makes that pair atomic; serialising the
requests gives moto the same atomicity, so races in the tests test our code, not moto.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any


def main() -> None:
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    concurrent = "--concurrent" in sys.argv[1:]
    # --latency-ms N: wait before answering, as object storage's first byte does
    latency = next((int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--latency-ms=")), 0) / 1000

    def serialized(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if latency:
            time.sleep(latency)
        with lock if not concurrent else contextlib.nullcontext():
            result = app(environ, start_response)
            try:
                body = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        return [body]

    server = make_server("127.0.0.1", 0, serialized, threaded=True)
    print(f"PORT {server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
