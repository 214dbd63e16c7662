"""Shale's Grafana dashboard, written with grafanalib: ``shale-dashboard.json`` beside this
file is generated from it, never edited by hand.

    python infra/monitoring/dashboard.py            # write shale-dashboard.json
    python infra/monitoring/dashboard.py --check    # exit 1 if it is out of date

The dashboard reads the ``shale_compaction_*`` gauges ``compact --pushgateway`` pushes, one
group per topic, and (its last rows) the ``shale_subscription_*`` gauges ``shale exporter``
serves, one series per subscription, from the Prometheus data source chosen in its
``datasource`` variable; its ``topic`` variable selects topics (all by default).  The
queries use those gauges only, not the recording rules of ``rules/shale.yml``, so the
dashboard works on a Prometheus that does not load them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from grafanalib.core import (  # type: ignore[import-untyped]
    Dashboard,
    GridPos,
    Stat,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

__all__ = ["OUTPUT", "build", "main", "panel_queries", "render", "subscription"]

OUTPUT: Final = Path(__file__).resolve().parent / "shale-dashboard.json"
UID: Final = "shale-compaction"
DATASOURCE: Final = {"type": "prometheus", "uid": "${datasource}"}
# Every query selects the topics of the `topic` variable (a regex: Grafana joins several
# chosen topics with `|` and escapes them; "All" is `.+`).
TOPIC: Final = 'topic=~"$topic"'
ALL_TOPICS: Final = ".+"
# The panels' JSON is that of Grafana 10 and later (time series, stat); an older schema
# version would make Grafana run its migrations of old panel types on them.
SCHEMA_VERSION: Final = 39
WIDTH: Final = 24
HEIGHT: Final = 8


@dataclass(frozen=True, slots=True)
class Query:
    """One series of a panel: a PromQL expression and its legend."""

    expr: str
    legend: str = "{{topic}}"


@dataclass(frozen=True, slots=True)
class PanelSpec:
    """A time series panel (or a single-value stat panel) and its queries."""

    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    stat: bool = False
    red_from: float | None = None  # a stat panel turns red from this value


def gauge(name: str, extra: str = "") -> str:
    """The selector of one pushed gauge for the chosen topics (``extra``: more matchers)."""
    return f"shale_compaction_{name}{{{TOPIC}{', ' + extra if extra else ''}}}"


SINCE_SUCCESS: Final = f"time() - {gauge('last_success_timestamp_seconds')}"

STATS: Final = (
    PanelSpec("Topics", "Topics that have pushed metrics (the chosen ones).", "short",
              (Query(f"count({gauge('last_run_timestamp_seconds')})", "topics"),), stat=True),
    PanelSpec("Uncleanable topics", "Topics whose last run failed.", "short",
              (Query(f"sum({gauge('uncleanable')})", "uncleanable"),), stat=True, red_from=1),
    PanelSpec("Longest since a success", "The longest time since a topic's last successful run.", "s",
              (Query(f"max({SINCE_SUCCESS})", "longest"),), stat=True),
)

PANELS: Final = (
    PanelSpec("Dirty ratio before and after the run",
              "Bytes above the compaction horizon / live bytes: before the run (its plan) and after it "
              "(by ledger sizes). After a run that compacted everything it is near 0.", "percentunit",
              (Query(gauge("dirty_ratio_before"), "{{topic}} before"),
               Query(gauge("dirty_ratio_after"), "{{topic}} after"))),
    PanelSpec("Compaction delay and max compaction lag",
              "The age of the oldest record above the horizon when the last run ended, and the topic's "
              "max compaction lag (0: none set). A delay above the lag fires ShaleCompactionLagExceeded.", "s",
              (Query(gauge("max_delay_seconds"), "{{topic}} delay"),
               Query(gauge("max_lag_seconds"), "{{topic}} max lag"))),
    PanelSpec("Time since the last success", "Seconds since a run of the topic last succeeded.", "s",
              (Query(SINCE_SUCCESS),)),
    PanelSpec("Run duration per phase", "Wall time of the last run: in total and per phase.", "s",
              (Query(gauge("duration_seconds"), "{{topic}} {{phase}}"),)),
    PanelSpec("Bytes reclaimed", "Bytes the last run removed from the topic (superseded records, dropped "
              "tombstones).", "bytes",
              (Query(gauge("bytes_reclaimed")),)),
    PanelSpec("Records reclaimed", "Records the last run removed from the topic.", "short",
              (Query(gauge("records_reclaimed")),)),
    PanelSpec("Failures", "1 if the topic's last run failed (uncleanable), and how many runs failed in a row.",
              "short",
              (Query(gauge("uncleanable"), "{{topic}} uncleanable"),
               Query(gauge("consecutive_failures"), "{{topic}} failures in a row"))),
    PanelSpec("Exit code of the last run", "0 ok, 1 other failure, 2 usage or settings, 3 lost the publish "
              "race, 4 corrupt data.", "short",
              (Query(gauge("exit_code")),)),
    PanelSpec("Bytes read and written", "What the last run read (ledgers above the horizon and the "
              "previous compacted parts) and wrote.", "bytes",
              (Query(gauge("bytes_read"), "{{topic}} read"),
               Query(gauge("bytes_written"), "{{topic}} written"))),
    PanelSpec("Keys and tombstones", "Distinct live keys below the new horizon, tombstones kept and dropped.",
              "short",
              (Query(gauge("keys"), "{{topic}} keys"),
               Query(gauge("tombstones_kept"), "{{topic}} tombstones kept"),
               Query(gauge("tombstones_dropped"), "{{topic}} tombstones dropped"))),
)


def subscription(name: str) -> str:
    """The selector of one gauge of ``shale exporter`` for the chosen topics."""
    return f"shale_subscription_{name}{{{TOPIC}}}"


SUBSCRIPTION: Final = "{{topic}} {{subscription}}"

SUBSCRIPTION_STATS: Final = (
    PanelSpec("Expired subscriptions", "Subscriptions that have not committed within their topic's "
              "subscription-expiry: they hold nothing back (ShaleSubscriptionExpired).", "short",
              (Query(f"sum(1 - {subscription('active')})", "expired"),), stat=True, red_from=1),
    PanelSpec("Largest subscription lag", "The most records any chosen subscription has left to read.", "short",
              (Query(f"max({subscription('lag_records')})", "records"),), stat=True),
    PanelSpec("Topics the exporter cannot read", "Topics whose subscriptions shale exporter could not read at its "
              "last reading (its log names the error).", "short",
              (Query(f'sum(1 - shale_exporter_topic_up{{{TOPIC}}})', "topics"),), stat=True, red_from=1),
)

SUBSCRIPTION_PANELS: Final = (
    PanelSpec("Subscription lag in records", "Records a plain read from each subscription's position has left "
              "(shale exporter). Above 100,000 for 30 minutes fires ShaleSubscriptionLagHigh.", "short",
              (Query(subscription("lag_records"), SUBSCRIPTION),)),
    PanelSpec("Subscription lag in bytes", "Stored bytes a plain read from each subscription's position has left.",
              "bytes", (Query(subscription("lag_bytes"), SUBSCRIPTION),)),
    PanelSpec("Time until a subscription expires", "Seconds until each subscription expires unless it commits "
              "(negative: expired). Under a day fires ShaleSubscriptionExpiringSoon.", "s",
              (Query(f"{subscription('expiry_timestamp_seconds')} - time()", SUBSCRIPTION),)),
    PanelSpec("Readers holding subscriptions", "1 while a reader holds the subscription (its heartbeat is live), "
              "0 when none does.", "short",
              (Query(subscription("held"), SUBSCRIPTION),)),
)


def _targets(spec: PanelSpec) -> list[Target]:
    return [Target(expr=q.expr, legendFormat=q.legend, refId=chr(ord("A") + i), datasource=DATASOURCE)
            for i, q in enumerate(spec.queries)]


def _panel(spec: PanelSpec, pos: GridPos) -> Any:
    if spec.stat:
        steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
        if spec.red_from is not None:
            steps.append({"color": "red", "value": spec.red_from})
        return Stat(thresholds=steps, title=spec.title, description=spec.description, dataSource=DATASOURCE,
                    targets=_targets(spec), gridPos=pos, format=spec.unit, reduceCalc="lastNotNull",
                    graphMode="none")
    # The gauges change once per run: draw steps, not slopes between runs.
    return TimeSeries(title=spec.title, description=spec.description, dataSource=DATASOURCE,
                      targets=_targets(spec), gridPos=pos, unit=spec.unit, lineInterpolation="stepAfter",
                      legendDisplayMode="table", legendCalcs=["lastNotNull", "max"])


def _panels() -> Iterator[Any]:
    stat_width = WIDTH // len(STATS)
    for i, spec in enumerate(STATS):
        yield _panel(spec, GridPos(h=4, w=stat_width, x=i * stat_width, y=0))
    half = WIDTH // 2
    for i, spec in enumerate(PANELS):
        yield _panel(spec, GridPos(h=HEIGHT, w=half, x=(i % 2) * half, y=4 + (i // 2) * HEIGHT))
    # the subscriptions' rows, below the compaction's
    top = 4 + (len(PANELS) + 1) // 2 * HEIGHT
    stat_width = WIDTH // len(SUBSCRIPTION_STATS)
    for i, spec in enumerate(SUBSCRIPTION_STATS):
        yield _panel(spec, GridPos(h=4, w=stat_width, x=i * stat_width, y=top))
    for i, spec in enumerate(SUBSCRIPTION_PANELS):
        yield _panel(spec, GridPos(h=HEIGHT, w=half, x=(i % 2) * half, y=top + 4 + (i // 2) * HEIGHT))


def _templates() -> list[Template]:
    return [
        Template(name="datasource", label="Data source", type="datasource", query="prometheus"),
        Template(name="topic", label="Topic", dataSource=DATASOURCE,
                 query="label_values(shale_compaction_last_run_timestamp_seconds, topic)",
                 includeAll=True, multi=True, allValue=ALL_TOPICS, default="$__all"),
    ]


def build() -> Any:
    """The dashboard (a :class:`grafanalib.core.Dashboard`)."""
    return Dashboard(title="Shale compaction", uid=UID, tags=["shale"], timezone="utc", refresh="1m",
                     description="Shale's compaction runs per topic, from the metrics `compact --pushgateway` "
                                 "pushes, and its subscriptions' lag, from `shale exporter`.",
                     time=Time("now-7d", "now"), schemaVersion=SCHEMA_VERSION, panels=list(_panels()),
                     templating=Templating(list=_templates())).auto_panel_ids()


def render() -> str:
    """The dashboard's JSON, as ``shale-dashboard.json`` holds it."""
    from grafanalib._gen import DashboardEncoder  # type: ignore[import-untyped]

    return json.dumps(build().to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every query of every panel, as the dashboard's JSON
    holds them, with the ``topic`` variable replaced by a regex that matches every topic."""
    return [(panel["title"], target["expr"].replace("$topic", ALL_TOPICS))
            for panel in json.loads(render())["panels"] for target in panel["targets"]]


def main(argv: list[str] | None = None) -> int:
    """Write ``shale-dashboard.json`` (or, with ``--check``, exit 1 if it differs)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON file is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT}: out of date; run python {Path(__file__).name} to write it", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
