"""What ``compact`` tells its operator on standard error: one line per error in text
(the default), or one JSON object per event with ``--log-format json`` for log
collectors.

Events (the ``event`` field of a JSON line): ``run.start``, ``topic.start``, ``topic.phase``
(planning, pass one, pass two, publishing), ``topic.done`` (the run summary's figures),
``topic.error``, ``metrics.pushed``, ``metrics.error`` and ``run.done``.  Text mode shows
only warnings and errors, as ``compact: error: ...``; the per-topic summary goes to
standard output either way.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final, TextIO

__all__ = ["LOG_FORMATS", "JsonFormatter", "TextFormatter", "event", "foreign_lines_as_json", "logger",
           "logging_to"]

LOG_FORMATS: Final = ("text", "json")
logger: Final = logging.getLogger("shale")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``event``,
    ``message`` and the event's own fields."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        doc: dict[str, Any] = {"ts": ts, "level": record.levelname.lower(), "logger": record.name,
                               "event": getattr(record, "event", "log"), "message": record.getMessage()}
        doc.update(getattr(record, "fields", {}))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``prog: error: message`` — the one-line form every Shale command uses."""

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        return f"{self.prog}: {record.levelname.lower()}: {record.getMessage()}"


def event(level: int, name: str, message: str = "", /, **fields: Any) -> None:
    """Log one event of a run (its fields appear as JSON keys in JSON mode)."""
    logger.log(level, message or name, extra={"event": name, "fields": fields})


@contextmanager
def logging_to(stream: TextIO, fmt: str, prog: str) -> Iterator[None]:
    """Send Shale's events to ``stream`` for the duration: every event as JSON, or
    warnings and errors as text lines."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(prog))
    handler.setLevel(logging.INFO if fmt == "json" else logging.WARNING)
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the command owns standard error; no duplicate lines via the root logger
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate


@contextmanager
def foreign_lines_as_json(source: str) -> Iterator[None]:
    """Every line written to standard error's file descriptor while this lasts is JSON.

    Lines that already are JSON objects (Shale's own events) pass unchanged; any other
    line (a JVM's or a library's own warnings, written past Python to the descriptor) is
    wrapped as an event ``{"event": "<source>.output", "message": ...}``.  Child
    processes started meanwhile (the Spark JVM) inherit the descriptor, so their output
    is wrapped too for as long as they run."""
    sys.stderr.flush()
    real = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    out = os.fdopen(real, "w", buffering=1, encoding="utf-8", errors="replace")
    pump = threading.Thread(target=_wrap_lines, args=(read_end, out, source), name="shale-stderr", daemon=True)
    pump.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(out.fileno(), 2)  # standard error is itself again
        # The pipe ends only when every child holding it does (the Spark gateway's JVM may
        # outlive its session): what is in it now is passed on, and the pump goes on
        # wrapping whatever a child still writes, as long as this process lives.
        pump.join(timeout=0.5)


def _wrap_lines(read_end: int, out: TextIO, source: str) -> None:
    with os.fdopen(read_end, "r", encoding="utf-8", errors="replace") as lines:
        for line in lines:
            text = line.rstrip("\n")
            if not text.strip():
                continue
            if text.startswith("{"):
                try:
                    if isinstance(json.loads(text), dict):
                        out.write(text + "\n")
                        continue
                except ValueError:
                    pass
            ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
            out.write(json.dumps({"ts": ts, "level": "warning", "logger": source, "event": f"{source}.output",
                                  "message": text}, separators=(",", ":"), ensure_ascii=False) + "\n")
