"""Metrics a CronJob pushes to a Prometheus Pushgateway (``compact --pushgateway URL``),
fed by :func:`~shale.compactor.run_many.compact_topics`'s events.

Each topic is its own group (``job``, ``topic``), pushed with POST once its run ends, so a
run that compacts some topics leaves the others' figures alone, and a failed run leaves
``shale_compaction_last_success_timestamp_seconds`` at the last success: alert on its
age (the recording rule ``shale:compaction_seconds_since_success``).  The Pushgateway
adds ``push_time_seconds`` itself.

Gauges (all per topic): ``shale_compaction_last_run_timestamp_seconds``,
``shale_compaction_last_success_timestamp_seconds``, ``shale_compaction_exit_code``,
``shale_compaction_status{status}`` (1 for this run's status, 0 for the others),
``shale_compaction_duration_seconds{phase}`` (``total`` and each phase),
``shale_compaction_records_read``, ``..._bytes_read``, ``..._records_written``,
``..._bytes_written``, ``..._records_reused``, ``..._keys``, ``..._tombstones_kept``,
``..._tombstones_dropped``, ``..._keys_expired``, ``..._dirty_ratio_before`` (the run's plan),
``..._dirty_ratio_after`` (estimated from ledger sizes after the run), and what Kafka's
log cleaner reports:

- ``..._max_delay_seconds``: how old, when the run ended, the oldest record above the new
  horizon was (0 when nothing is above it): Kafka's max compaction delay.
- ``..._max_lag_seconds``: the max compaction lag in force for the topic (the run's
  ``--max-compaction-lag``, else the topic's policy; 0 when none is set).
- ``..._subscription_lag_records`` and ``..._subscription_lag_bytes``: what the slowest
  active durable subscription has yet to read (0 when none is active).
- ``..._uncleanable``: 1 when the run failed (status ``error``), else 0.
- ``..._consecutive_failures``: failed runs in a row.  A gauge holds no history, so the
  count is read back from the Pushgateway before each push: a run that fails adds one, a
  run that succeeds (compacted, nothing to do, skipped) sets 0, and a dry run or a lost
  race leaves it as it was.
- ``..._records_reclaimed``: records the run removed from the compacted view, records read
  minus records kept (written anew or kept in place); 0 for a run that published nothing.
- ``..._bytes_reclaimed``: stored bytes the run removed from the compacted view, the bytes
  its parts replace (:attr:`~shale.compactor.summary.RunSummary.bytes_replaced`) minus the
  bytes it wrote; 0 for a run that published nothing.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any, Final

from shale.compactor.summary import STATUSES, RunStatus, RunSummary
from shale.ledger.masking import mask_secrets
from shale.ledger.values import dataclass

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["DEFAULT_JOB", "AfterRun", "build_registry", "failures_after", "push_summary"]

DEFAULT_JOB: Final = "shale_compact"
_FAILURES: Final = "shale_compaction_consecutive_failures"
_COUNTS: Final = (("records_read", "records read from ledgers and previous compacted parts"),
                  ("bytes_read", "bytes read"),
                  ("records_written", "records written to the new compacted ledger"),
                  ("bytes_written", "bytes written"),
                  ("records_reused", "live records of previous compacted parts kept in place"),
                  ("keys", "distinct live keys below the new horizon"),
                  ("tombstones_kept", "tombstones kept in the compacted ledger"),
                  ("tombstones_dropped", "tombstones dropped (past the delete retention or the key TTL)"),
                  ("keys_expired", "live keys dropped past the key TTL"))
#: the runs that set the failure count back to 0 (those that did what a CronJob asks)
_SUCCESSES: Final = (RunStatus.COMPACTED, RunStatus.NOTHING_TO_DO, RunStatus.SKIPPED)


@dataclass(frozen=True, slots=True)
class AfterRun:
    """What the topic's metadata says once its run ended (None: it could not be read, and
    the gauge keeps its previous value)."""

    dirty_ratio: float | None = None
    max_delay_s: float | None = None
    max_lag_s: float = 0.0
    subscription_lag_records: float | None = None
    subscription_lag_bytes: float | None = None


def failures_after(status: RunStatus, previous: int | None) -> int | None:
    """The consecutive-failure count after a run that ended with ``status``, given the
    count before it (None: unknown).  None: leave the gauge as it is."""
    if status is RunStatus.ERROR:
        return 1 if previous is None else previous + 1  # at least this one
    return 0 if status in _SUCCESSES else previous


def build_registry(summary: RunSummary, *, exit_code: int, now_s: float, after: AfterRun = AfterRun(),
                   failures: int | None = None) -> CollectorRegistry:
    """The gauges of one topic's run, which ended with ``exit_code``."""
    # imported here: only a run that pushes metrics pays for the client's import
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()

    def gauge(name: str, doc: str, value: float | None) -> None:
        if value is not None:
            Gauge(f"shale_compaction_{name}", doc, registry=reg).set(value)

    gauge("last_run_timestamp_seconds", "when the last run of this topic ended (Unix time)", now_s)
    if exit_code == 0 and summary.status is not RunStatus.DRY_RUN:
        gauge("last_success_timestamp_seconds", "when a run of this topic last succeeded (Unix time)", now_s)
    gauge("exit_code", "exit code of the last run (0 ok, 2 usage, 3 lost the publish race, 4 corrupt, 1 other)",
          exit_code)
    status = Gauge("shale_compaction_status", "1 for the last run's status", ["status"], registry=reg)
    for s in STATUSES:
        status.labels(status=s).set(1 if s == summary.status else 0)
    duration = Gauge("shale_compaction_duration_seconds", "wall time of the last run, per phase", ["phase"],
                     registry=reg)
    for phase, seconds in summary.durations.items():
        duration.labels(phase=phase).set(seconds)
    for name, doc in _COUNTS:
        gauge(name, doc, getattr(summary, name))
    gauge("dirty_ratio_before", "bytes above the horizon / live bytes, before the run", summary.dirty_ratio)
    gauge("dirty_ratio_after", "bytes above the horizon / live bytes after the run (by ledger sizes)",
          after.dirty_ratio)
    gauge("max_delay_seconds", "age, when the run ended, of the oldest record above the horizon (0: none)",
          after.max_delay_s)
    gauge("max_lag_seconds", "the topic's max compaction lag in force (0: none)", after.max_lag_s)
    gauge("subscription_lag_records", "records the slowest active subscription has yet to read (0: none)",
          after.subscription_lag_records)
    gauge("subscription_lag_bytes", "stored bytes the slowest active subscription has yet to read (0: none)",
          after.subscription_lag_bytes)
    gauge("uncleanable", "1 when the topic's last run failed", 1 if summary.status is RunStatus.ERROR else 0)
    if summary.iceberg is not None:  # (a topic whose policy names an Iceberg table)
        gauge("iceberg_ok", "1 when the run brought the topic's Iceberg table to its epoch, 0 when it failed to",
              0 if summary.iceberg_failure is not None else 1)
        gauge("iceberg_epoch", "the epoch the topic's Iceberg table holds after the run", summary.iceberg.get("epoch"))
    gauge("consecutive_failures", "failed runs of this topic in a row", failures)
    published = summary.status is RunStatus.COMPACTED
    gauge("records_reclaimed", "records the run removed from the compacted view (read minus kept)",
          summary.records_read - summary.records_written - summary.records_reused if published else 0)
    gauge("bytes_reclaimed", "stored bytes the run removed from the compacted view (replaced minus written)",
          summary.bytes_replaced - summary.bytes_written if published else 0)
    return reg


def push_summary(url: str, summary: RunSummary, *, exit_code: int, now_s: float, after: AfterRun = AfterRun(),
                 job: str = DEFAULT_JOB, timeout_s: float = 10.0, attempts: int = 3) -> None:
    """Push one topic's gauges to the Pushgateway at ``url`` (a few tries; raises the last
    error), after reading its failure count back from there.  ``user:password@`` in the
    URL is sent as HTTP basic authentication."""
    from prometheus_client import pushadd_to_gateway
    from prometheus_client.exposition import basic_auth_handler, default_handler
    from tenacity import retry, stop_after_attempt, wait_exponential

    url, auth = _split_credentials(url)
    topic = mask_secrets(summary.topic)
    previous = _previous_failures(url, auth, job=job, topic=topic, timeout_s=timeout_s)
    reg = build_registry(summary, exit_code=exit_code, now_s=now_s, after=after,
                         failures=failures_after(summary.status, previous))
    handler = default_handler
    if auth is not None:
        user, password = auth

        def handler(url: str, method: str, timeout: float | None, headers: list[tuple[str, str]],
                    data: bytes) -> Any:
            return basic_auth_handler(url, method, timeout, headers, data, user, password)

    @retry(stop=stop_after_attempt(attempts), wait=wait_exponential(multiplier=0.5, max=4), reraise=True)
    def push() -> None:
        pushadd_to_gateway(url, job=job, registry=reg, grouping_key={"topic": topic}, timeout=timeout_s,
                           handler=handler)

    push()


def _split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without ``user:password@``, and those (unquoted)."""
    u = urllib.parse.urlsplit(url)
    if u.username is None:
        return url, None
    auth = urllib.parse.unquote(u.username), urllib.parse.unquote(u.password or "")
    return urllib.parse.urlunsplit((u.scheme, u.netloc.rpartition("@")[2], u.path, u.query, u.fragment)), auth


def _previous_failures(url: str, auth: tuple[str, str] | None, *, job: str, topic: str,
                       timeout_s: float) -> int | None:
    """The group's consecutive-failure count as the Pushgateway holds it (its JSON API):
    0 when it holds none (a first run, or a Pushgateway restarted without persistence),
    None when it cannot be asked."""
    base = url if "://" in url else f"http://{url}"  # as the client's push takes it
    request = urllib.request.Request(f"{base.rstrip('/')}/api/v1/metrics", headers={"Accept": "application/json"})
    if auth is not None:
        import base64

        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            groups = json.load(r)["data"]
        for g in groups:
            if g.get("labels", {}).get("job") == job and g["labels"].get("topic") == topic and _FAILURES in g:
                return int(float(g[_FAILURES]["metrics"][0]["value"]))
    except Exception:  # an older Pushgateway, a proxy that only takes pushes, or none at all
        return None
    return 0
