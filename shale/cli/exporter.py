"""``shale exporter``: every subscription's lag and state, watched continuously, served on
``/metrics`` for Prometheus to scrape (Kafka operators' lag exporters).

It reads the topics on its own schedule (``--interval``, :func:`~shale.maintenance.lag.read_lag`)
and a scrape serves the last reading, so scrapes cost the store nothing and many
Prometheus replicas may scrape it.  Why an exporter and not pushes to the Pushgateway
(which ``compact`` uses): lag is state, not the outcome of a batch job.  Scraped, a
deleted subscription or topic disappears at once (pushed, its last lag would stay in the
Pushgateway and alert for ever), an exporter that stops is ``up == 0``, and Prometheus
decides how often it looks.

Gauges per subscription (labels ``topic``, ``subscription``): ``shale_subscription_lag_records``
and ``..._lag_bytes`` (what a plain read from its position has left),
``..._active`` (1 active, 0 expired: it holds nothing back), ``..._last_commit_timestamp_seconds``,
``..._expiry_timestamp_seconds`` (when it expires, or expired, unless it commits),
``..._held`` (1 while a reader holds it: its heartbeat is live) and
``..._heartbeat_age_seconds`` (of the reader its document names, when one does).  Per
topic: ``shale_exporter_topic_up`` (0: its subscriptions could not be read; the error is
logged).  The exporter's own: ``shale_exporter_up`` (0: the prefix could not be listed),
``shale_exporter_last_update_timestamp_seconds``, ``shale_exporter_update_duration_seconds``,
``shale_exporter_interval_seconds``.
"""

from __future__ import annotations

import argparse
import signal
import time
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from shale.cli.app import Streams
from shale.ledger.errors import InvalidInputError

if TYPE_CHECKING:
    from shale.maintenance.lag import LagReading

__all__ = ["families", "run_exporter"]

_PER_SUBSCRIPTION: Final = (
    ("lag_records", "records a plain read from the subscription's position has left"),
    ("lag_bytes", "stored bytes a plain read from the subscription's position has left"),
    ("active", "1 while the subscription is active (committed within subscription-expiry), 0 once expired"),
    ("last_commit_timestamp_seconds", "when the subscription last committed (Unix time)"),
    ("expiry_timestamp_seconds", "when the subscription expires (or expired) unless it commits (Unix time)"),
    ("held", "1 while a reader holds the subscription (its heartbeat is live)"),
    ("heartbeat_age_seconds", "seconds since the last heartbeat of the reader the subscription's document names"),
)


def families(reading: LagReading, interval_s: float) -> Iterator[Any]:
    """The gauges of one reading (prometheus_client metric families)."""
    from prometheus_client.core import GaugeMetricFamily

    subs = {name: GaugeMetricFamily(f"shale_subscription_{name}", doc, labels=["topic", "subscription"])
            for name, doc in _PER_SUBSCRIPTION}
    up = GaugeMetricFamily("shale_exporter_topic_up", "1 when the topic's subscriptions were read at the last "
                           "reading, 0 when they could not be", labels=["topic"])
    for t in reading.topics:
        up.add_metric([t.topic], 0 if t.error else 1)
        for r in t.rows:
            labels = [t.topic, r.subscription.name]
            m = r.member
            values = {"lag_records": r.lag.records, "lag_bytes": r.lag.bytes, "active": int(r.active),
                      "last_commit_timestamp_seconds": r.commit_ms / 1000, "held": int(r.held),
                      "expiry_timestamp_seconds": r.expires_ms / 1000,
                      "heartbeat_age_seconds": None if m is None else (r.heartbeat_age_ms or 0) / 1000}
            for name, value in values.items():
                if value is not None:
                    subs[name].add_metric(labels, value)
    yield from subs.values()
    yield up
    yield GaugeMetricFamily("shale_exporter_up", "1 when the last reading listed the topics, 0 when it could not",
                            value=0 if reading.error else 1)
    yield GaugeMetricFamily("shale_exporter_last_update_timestamp_seconds", "when the last reading ended (Unix time)",
                            value=reading.ended_s)
    yield GaugeMetricFamily("shale_exporter_update_duration_seconds", "how long the last reading took",
                            value=reading.duration_s)
    yield GaugeMetricFamily("shale_exporter_interval_seconds", "how often the exporter reads (--interval)",
                            value=interval_s)


class _Latest:
    """A collector serving the last reading (none yet: nothing)."""

    def __init__(self, interval_s: float) -> None:
        self.reading: LagReading | None = None
        self.interval_s = interval_s

    def collect(self) -> Iterator[Any]:
        reading = self.reading  # (replaced whole by the reading loop: one consistent reading)
        if reading is not None:
            yield from families(reading, self.interval_s)


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise InvalidInputError(f"--listen {text!r}: expected HOST:PORT (e.g. 0.0.0.0:9838, or 127.0.0.1:0 for any "
                                "free port)")
    return host.strip("[]") or "0.0.0.0", int(port)


def _report(reading: LagReading, io: Streams, said: dict[str, str]) -> None:
    """Each failing topic (and the prefix) on standard error once, when its error changes."""
    errors = {t.topic: t.error for t in reading.topics if t.error}
    if reading.error:
        errors[""] = reading.error
    for where, error in errors.items():
        if said.get(where) != error:
            io.err.write(f"shale exporter: warning: {where + ': ' if where else ''}{error}\n")
    said.clear()
    said.update(errors)
    io.err.flush()


class _Stopped(Exception):
    """SIGTERM arrived while the exporter waited for its next reading."""


class _Sigterm:
    """SIGTERM's handler while the exporter serves.  Kubernetes stops a pod with SIGTERM,
    and in its container the exporter is the first process, which the kernel spares any
    signal it has no handler for: without one, every rollout would wait out the grace
    period and end in a SIGKILL.  During a reading it only says so (raising there could
    land half-way through the reading's thread pool starting a thread): the reading ends,
    then the loop; during the wait between readings it ends the wait at once."""

    def __init__(self) -> None:
        self.asked = False
        self.waiting = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.asked = True
        if self.waiting:
            self.waiting = False  # (once: a second SIGTERM must not land in the cleanup)
            raise _Stopped


def _serve(prefix: str, interval_s: float, collector: _Latest, io: Streams, term: _Sigterm) -> None:
    """Read every ``interval_s`` into ``collector`` until ``term`` is asked to stop."""
    from shale.maintenance.lag import read_lag

    said: dict[str, str] = {}
    try:
        while not term.asked:
            collector.reading = read_lag(prefix)
            _report(collector.reading, io, said)
            term.waiting = True
            if not term.asked:
                time.sleep(max(0.0, interval_s - collector.reading.duration_s))
            term.waiting = False
    except _Stopped:
        pass
    io.err.write("shale exporter: stopped (SIGTERM)\n")


def run_exporter(args: argparse.Namespace, io: Streams) -> int:
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server

    from shale.maintenance.lag import read_lag

    interval_s = args.interval / 1000
    collector = _Latest(interval_s)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    if args.once:
        collector.reading = read_lag(args.prefix)
        _report(collector.reading, io, {})
        io.out.write(generate_latest(registry).decode())
        return 0
    host, port = _listen(args.listen)
    term = _Sigterm()  # (before it says it serves: from then on SIGTERM is a stop)
    previous = signal.signal(signal.SIGTERM, term)
    try:
        server, _ = start_http_server(port, host, registry)
        io.err.write(f"shale exporter: serving http://{host}:{server.server_port}/metrics; reading {args.prefix} "
                     f"every {interval_s:g}s\n")
        io.err.flush()
        try:
            _serve(args.prefix, interval_s, collector, io, term)
        except KeyboardInterrupt:
            pass  # a service asked to stop (Ctrl-C) has done nothing wrong
        finally:
            server.shutdown()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
