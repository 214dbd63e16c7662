"""Metrics a CronJob pushes to a Prometheus Pushgateway (``compact --pushgateway URL``),
fed by :func:`~shale.compactor.run_many.compact_topics`'s events.

Each topic is its own group (``job``, ``topic``), pushed with POST once its run ends, so a
run that compacts some topics leaves the others' figures alone, and a failed run leaves
``shale_compaction_last_success_timestamp_seconds`` at the last success: alert on its
age.  The Pushgateway adds ``push_time_seconds`` itself.

Gauges (all per topic): ``shale_compaction_last_run_timestamp_seconds``,
``shale_compaction_last_success_timestamp_seconds``, ``shale_compaction_exit_code``,
``shale_compaction_status{status}`` (1 for this run's status, 0 for the others),
``shale_compaction_duration_seconds{phase}`` (``total`` and each phase),
``shale_compaction_records_read``, ``..._bytes_read``, ``..._records_written``,
``..._bytes_written``, ``..._records_reused``, ``..._keys``, ``..._tombstones_kept``,
``..._tombstones_dropped``, ``..._dirty_ratio_before`` (the run's plan) and
``..._dirty_ratio_after`` (estimated from ledger sizes after the run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from shale.compactor.summary import STATUSES, RunStatus, RunSummary
from shale.ledger.masking import mask_secrets

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["DEFAULT_JOB", "build_registry", "push_summary"]

DEFAULT_JOB: Final = "shale_compact"
_COUNTS: Final = (("records_read", "records read from ledgers and previous compacted parts"),
                  ("bytes_read", "bytes read"),
                  ("records_written", "records written to the new compacted ledger"),
                  ("bytes_written", "bytes written"),
                  ("records_reused", "live records of previous compacted parts kept in place"),
                  ("keys", "distinct live keys below the new horizon"),
                  ("tombstones_kept", "tombstones kept in the compacted ledger"),
                  ("tombstones_dropped", "tombstones dropped (past the delete retention)"))


def build_registry(summary: RunSummary, *, exit_code: int, now_s: float,
                   dirty_ratio_after: float | None) -> CollectorRegistry:
    """The gauges of one topic's run, which ended with ``exit_code``."""
    # imported here: only a run that pushes metrics pays for the client's import
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()

    def gauge(name: str, doc: str, value: float) -> None:
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
    if dirty_ratio_after is not None:
        gauge("dirty_ratio_after", "bytes above the horizon / live bytes after the run (by ledger sizes)",
              dirty_ratio_after)
    return reg


def push_summary(url: str, summary: RunSummary, *, exit_code: int, now_s: float, dirty_ratio_after: float | None,
                 job: str = DEFAULT_JOB, timeout_s: float = 10.0, attempts: int = 3) -> None:
    """Push one topic's gauges to the Pushgateway at ``url`` (a few tries; raises the last
    error).  ``user:password@`` in the URL is sent as HTTP basic authentication."""
    import urllib.parse

    from prometheus_client import pushadd_to_gateway
    from prometheus_client.exposition import basic_auth_handler, default_handler
    from tenacity import retry, stop_after_attempt, wait_exponential

    reg = build_registry(summary, exit_code=exit_code, now_s=now_s, dirty_ratio_after=dirty_ratio_after)
    grouping = {"topic": mask_secrets(summary.topic)}
    u = urllib.parse.urlsplit(url)
    handler = default_handler
    if u.username is not None:
        user, password = urllib.parse.unquote(u.username), urllib.parse.unquote(u.password or "")
        url = urllib.parse.urlunsplit((u.scheme, u.netloc.rpartition("@")[2], u.path, u.query, u.fragment))

        def handler(url: str, method: str, timeout: float | None, headers: list[tuple[str, str]],
                    data: bytes) -> Any:
            return basic_auth_handler(url, method, timeout, headers, data, user, password)

    @retry(stop=stop_after_attempt(attempts), wait=wait_exponential(multiplier=0.5, max=4), reraise=True)
    def push() -> None:
        pushadd_to_gateway(url, job=job, registry=reg, grouping_key=grouping, timeout=timeout_s, handler=handler)

    push()
