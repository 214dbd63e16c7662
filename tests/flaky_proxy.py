"""An HTTP proxy in front of the moto server that misbehaves like object storage on a
bad day: a share of requests gets ``503 SlowDown`` or ``500 InternalError`` without
reaching the store, has its connection reset before or after the store acted (a lost
response), or is answered only after the client's read timeout.

Faults are spread evenly over the requests in the order they arrive (a golden-ratio
sequence from a seeded start), not drawn at random: how many of each were injected
depends only on how many requests there were, never on how threads interleaved them.

It can also hold requests: those ``hold`` picks wait until :meth:`FlakyProxy.release`,
then have their connection reset without reaching the store (as a client that died
while its request was in flight never gets an answer).  A test holds a write to know
that the task making it is still running."""

from __future__ import annotations

import contextlib
import http.client
import math
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_ERRORS = {
    503: b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
         b"<Message>Please reduce your request rate.</Message></Error>",
    500: b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
         b"<Message>We encountered an internal error.</Message></Error>",
}


#: The golden ratio's fractional part: successive multiples fill [0, 1) most evenly.
_STEP = (math.sqrt(5) - 1) / 2


class FlakyProxy:
    """``faults`` maps a fault to its share of requests: ``"503"``, ``"500"``,
    ``"reset"`` (no answer, store untouched), ``"lost"`` (the store acted, the answer is
    lost), ``"slow"`` (answered after ``slow_seconds``); ``methods`` limits faults to
    some HTTP methods.  ``hold(method, path)`` picks requests to hold until
    :meth:`release` (their paths are listed in :attr:`held`)."""

    def __init__(self, upstream: str, faults: dict[str, float], *, seed: int = 1, slow_seconds: float = 2.0,
                 methods: frozenset[str] | None = None, hold: Callable[[str, str], bool] | None = None) -> None:
        self.upstream = urlsplit(upstream)
        self.faults = faults
        self._at = random.Random(seed).random()
        self._eligible = 0
        self.lock = threading.Lock()
        self.slow_seconds = slow_seconds
        self.methods = methods
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.trace: list[tuple[str, str, str, int]] = []  # method, path, fault, status (for debugging)
        self.hold = hold
        self.held: list[str] = []
        self._released = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FlakyProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()

    def release(self) -> None:
        """Reset every held request's connection, and hold no more."""
        self._released.set()

    def _held(self, method: str, path: str) -> bool:
        if self.hold is None or self._released.is_set() or not self.hold(method, path):
            return False
        with self.lock:
            self.held.append(path)
        self._released.wait()
        return True

    def _pick(self, method: str) -> str:
        with self.lock:
            self.requests += 1
            if self.methods is not None and method not in self.methods:
                return "ok"
            r = (self._at + self._eligible * _STEP) % 1.0
            self._eligible += 1
            for fault, share in self.faults.items():
                if r < share:
                    self.injected[fault] += 1
                    return fault
                r -= share
            return "ok"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if not size:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _reset(self) -> None:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.close_connection = True
                self.connection.close()

            def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
                up = proxy.upstream
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "transfer-encoding", "content-length", "connection")}
                headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                conn.close()
                return r.status, r.getheaders(), data

            def _handle(self) -> None:
                body = self._body()
                if proxy._held(self.command, self.path):
                    with contextlib.suppress(OSError):  # the client may be gone (killed)
                        self._reset()
                    return
                fault = proxy._pick(self.command)
                proxy.trace.append((self.command, self.path, fault, 0))
                if fault in ("503", "500"):
                    self._send(int(fault), [("Content-Type", "application/xml")], _ERRORS[int(fault)])
                    return
                if fault == "reset":
                    self._reset()
                    return
                status, headers, data = self._forward(body)
                proxy.trace.append((self.command, self.path, fault, status))
                if fault == "lost":
                    self._reset()
                    return
                if fault == "slow":
                    time.sleep(proxy.slow_seconds)
                self._send(status, headers, data)

            def _send(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
                try:
                    self.send_response(status)
                    for k, v in headers:
                        if k.lower() not in ("transfer-encoding", "content-length", "connection", "date", "server"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                except OSError:
                    self.close_connection = True  # the client gave up (its timeout)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        return Handler
