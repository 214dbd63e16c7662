"""``compact --all --pushgateway`` into a real Pushgateway, scraped by a real Prometheus
with the shipped config: every metric docs/operations.md documents, asked of
Prometheus's HTTP API, after runs over a few topics of which one fails, then fails
again, then is mended.  ``shale exporter`` scraped by the same Prometheus: every
subscription's lag and state as it changes, a deleted one gone, the shipped alert on an
expired one firing; and every panel of the shipped dashboard answering."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shale.cli.metrics import failures_after
from shale.compactor.summary import RunStatus
from shale.ledger.ids import MIN_ID
from shale.metadata.subscriptions import Subscriptions
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.compactor.test_many_topics import lines, produce
from tests.conftest import ROOT, run_cli_here
from tests.monitoring import MONITORING, PrometheusStack

HOUR = 3600.0
PHASES = {"total", "plan", "pass_one", "pass_two", "publish", "gc"}
Series = dict[tuple[str, str, tuple[tuple[str, str], ...]], float]


def documented() -> set[str]:
    """The metric names of the table in docs/operations.md (``_x`` short for
    ``shale_compaction_x``, as the table writes them)."""
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text[text.index("| metric | meaning |"):]
    names = set()
    for row in table[: table.index("\n\n")].splitlines()[2:]:
        first = row.split("|")[1]
        for token in re.findall(r"`([^`]+)`", first):
            name = token.split("{")[0]
            names.add("shale_compaction" + name if name.startswith("_") else name)
    return names


def scraped(stack: PrometheusStack, root: str) -> Series:
    """Every series of the topics under ``root`` as Prometheus has them after the
    Pushgateway's latest pushes."""
    stack.sync()
    under = re.escape(root).replace("\\", "\\\\")  # a regular expression, in a PromQL string
    rows = stack.query(f'{{__name__=~"shale_compaction_.+", topic=~"{under}/.+"}}')
    return {(r["__name__"], r["topic"], tuple(sorted((k, v) for k, v in r.items()
                                                     if k not in ("__name__", "topic", "job", "instance")))): v
            for r, v in rows}


def one(series: Series, name: str, topic: str, **labels: str) -> float | None:
    return series.get((f"shale_compaction_{name}", topic, tuple(sorted(labels.items()))))


def mixed_ages(uri: str, now: float) -> None:
    """A ledger of 30 records three hours old, then 15 half an hour old (a lag of an hour
    puts the horizon inside it), and a ledger of records ten minutes old."""
    t = [now - 3 * HOUR]
    with TopicWriter(uri, max_ledger_records=50, batch_size=10, clock=lambda: t[0]) as w:
        for i in range(45):
            if i == 30:
                t[0] = now - HOUR / 2
            w.append(f"k{i % 17}", f"v{i}")
    produce(uri, 20, first=45, t=now - HOUR / 6)


def compact(*args: str) -> dict[str, dict[str, Any]]:
    r = run_cli_here("compact", *args, "--json", "--min-compaction-lag", "1h")
    return {str(s["topic"]): s for s in lines(r.stdout)}


def test_a_run_over_topics_shows_in_prometheus(prometheus_stack: PrometheusStack, tmp_path: Path) -> None:
    stack, now = prometheus_stack, time.time()
    root = str(tmp_path / "topics")
    a, b, c, d = (f"{root}/{x}" for x in "abcd")
    produce(a, 100, t=now - 3 * HOUR)
    produce(b, 40, t=now - 3 * HOUR)
    mixed_ages(c, now)
    TopicMetadata.open(c).update_policy({"max_compaction_lag_ms": 2 * 3_600_000})
    produce(d, 10, t=now - 3 * HOUR)  # one entry whose records all survive: pass two reads it
    [victim] = (tmp_path / "topics" / "d" / "ledgers").glob("*.ledger")
    good = victim.read_bytes()
    victim.write_bytes(good[:60] + bytes([good[60] ^ 0xFF]) + good[61:])

    start = time.time()
    first = compact("--all", root, "--pushgateway", stack.pushgateway_url)
    m = scraped(stack, root)
    assert {s["status"] for s in first.values()} == {"compacted", "error"} and first[d]["exit_code"] == 4
    # every documented metric, for every topic (but a success time for the failing one)
    names = {n for n, _, _ in m}
    assert documented() <= names, documented() - names
    for topic in (a, b, c, d):
        assert {n for n, t, _ in m if t == topic} == documented() - ({
            "shale_compaction_last_success_timestamp_seconds"} if topic == d else set())
    _outcomes(m, first, (a, b, c), d, start)
    _volumes(m, first, a, c)
    _delays(m, a, b, c, d)

    second = compact("--all", root, "--pushgateway", stack.pushgateway_url)
    assert second[a]["status"] == "nothing-to-do" and second[d]["status"] == "error"
    m = scraped(stack, root)
    assert one(m, "consecutive_failures", d) == 2 and one(m, "uncleanable", d) == 1
    assert one(m, "consecutive_failures", a) == 0 and one(m, "records_reclaimed", a) == 0
    assert one(m, "bytes_reclaimed", a) == 0
    # a dry run (it reads footers only, so it does not meet the damage) neither counts nor clears
    assert compact(d, "--dry-run", "--pushgateway", stack.pushgateway_url)[d]["status"] == "dry-run"
    m = scraped(stack, root)
    assert one(m, "consecutive_failures", d) == 2 and one(m, "uncleanable", d) == 0
    assert one(m, "last_success_timestamp_seconds", d) is None

    victim.write_bytes(good)  # mended: the next run compacts it and clears the count
    third = compact(d, "--pushgateway", stack.pushgateway_url)
    assert third[d]["status"] == "compacted"
    m = scraped(stack, root)
    assert one(m, "consecutive_failures", d) == 0 and one(m, "uncleanable", d) == 0
    assert one(m, "exit_code", d) == 0 and (one(m, "last_success_timestamp_seconds", d) or 0) >= start
    assert one(m, "max_delay_seconds", d) == 0
    if list((MONITORING / "rules").glob("*.yml")):  # the shipped recording rule, once rules are shipped
        rows = stack.wait_for(f'shale:compaction_seconds_since_success{{topic="{a}"}}')
        assert 0 <= rows[0][1] < time.time() - start + 60


def _outcomes(m: Series, s: dict[str, dict[str, Any]], good: tuple[str, ...], bad: str, start: float) -> None:
    for topic in good:
        assert one(m, "uncleanable", topic) == 0 and one(m, "consecutive_failures", topic) == 0
        assert one(m, "exit_code", topic) == 0 and one(m, "status", topic, status="compacted") == 1
        assert start <= (one(m, "last_success_timestamp_seconds", topic) or 0) <= time.time()
        phases = {dict(ls)["phase"] for n, t, ls in m if n == "shale_compaction_duration_seconds" and t == topic}
        assert phases == PHASES
        total = one(m, "duration_seconds", topic, phase="total") or 0
        assert total > 0 and all((one(m, "duration_seconds", topic, phase=p) or 0) <= total for p in PHASES)
        assert abs(total - s[topic]["durations"]["total"]) < 1e-3
    assert one(m, "uncleanable", bad) == 1 and one(m, "consecutive_failures", bad) == 1
    assert one(m, "exit_code", bad) == 4 and one(m, "status", bad, status="error") == 1
    assert one(m, "status", bad, status="compacted") == 0
    assert start <= (one(m, "last_run_timestamp_seconds", bad) or 0) <= time.time()


def _volumes(m: Series, s: dict[str, dict[str, Any]], a: str, c: str) -> None:
    for topic, read, kept in ((a, 100, 17), (c, 30, 17)):
        assert one(m, "records_read", topic) == s[topic]["records_read"] == read
        assert one(m, "records_written", topic) == s[topic]["records_written"] == kept
        assert one(m, "records_reclaimed", topic) == read - kept
        assert one(m, "bytes_written", topic) == s[topic]["bytes_written"] > 0
        assert one(m, "keys", topic) == 17 and one(m, "dirty_ratio_before", topic) == 1.0
    # what the run replaced, by the topics' own ledger sizes: all of a's, 30 of c's 45 records
    replaced_a = sum(lg.bytes for lg in TopicMetadata.open(a).load_topic().ledgers)
    ledger_c = TopicMetadata.open(c).load_topic().ledgers[0]
    assert one(m, "bytes_reclaimed", a) == replaced_a - s[a]["bytes_written"] > 0
    assert one(m, "bytes_reclaimed", c) == ledger_c.bytes * 30 // 45 - s[c]["bytes_written"]
    assert one(m, "dirty_ratio_after", a) == 0 and (one(m, "dirty_ratio_after", c) or 0) > 0


def _delays(m: Series, a: str, b: str, c: str, d: str) -> None:
    # c: the horizon lies inside its ledger, above it records half an hour old
    assert HOUR / 2 <= (one(m, "max_delay_seconds", c) or 0) < HOUR / 2 + 600
    assert one(m, "max_delay_seconds", a) == one(m, "max_delay_seconds", b) == 0
    # d failed: its records wait since they were published
    assert 3 * HOUR <= (one(m, "max_delay_seconds", d) or 0) < 3 * HOUR + 600
    assert one(m, "max_lag_seconds", c) == 2 * HOUR and one(m, "max_lag_seconds", a) == 0


def test_the_failure_count_rules() -> None:
    """A failure adds one (one when the count could not be read back), a success clears
    it, a dry run or a lost race leaves it (None: the gauge is not pushed, so it stays)."""
    assert failures_after(RunStatus.ERROR, 2) == 3 and failures_after(RunStatus.ERROR, None) == 1
    for ok in (RunStatus.COMPACTED, RunStatus.NOTHING_TO_DO, RunStatus.SKIPPED):
        assert failures_after(ok, 5) == 0 == failures_after(ok, None)
    for neither in (RunStatus.DRY_RUN, RunStatus.CONFLICT):
        assert failures_after(neither, 4) == 4 and failures_after(neither, None) is None


@contextlib.contextmanager
def exporter(stack: PrometheusStack, prefix: str) -> Iterator[subprocess.Popen[str]]:
    """``shale exporter PREFIX`` reading every half second on a free port, scraped by the
    stack's Prometheus while the block runs."""
    proc = subprocess.Popen([sys.executable, "-m", "shale.cli", "exporter", prefix, "--listen", "127.0.0.1:0",
                             "--interval", "1s"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            cwd=ROOT, env=os.environ.copy())
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        found = re.search(r"http://(127\.0\.0\.1:\d+)/metrics", first)
        assert found, first + proc.stderr.read()
        stack.scrape_exporter(found.group(1))
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        stack.scrape_exporter(None)


def by_subscription(rows: list[tuple[dict[str, str], float]]) -> dict[tuple[str, str], float]:
    return {(r["topic"].rsplit("/", 1)[1], r.get("subscription", "")): v for r, v in rows}


def test_the_exporter_serves_every_subscriptions_lag_and_state(prometheus_stack: PrometheusStack,
                                                               tmp_path: Path) -> None:
    stack = prometheus_stack
    root = str(tmp_path / "topics")
    a, b, bad = f"{root}/a", f"{root}/b", f"{root}/bad"
    produce(a, 100)
    produce(b, 10)
    produce(bad, 10)
    (tmp_path / "topics" / "bad" / "_meta" / "topic.json").write_text("{")
    subs = Subscriptions(TopicMetadata.open(a))
    subs.create("slow")
    subs.create("gone", MIN_ID, now_ms=1)  # committed in 1970: expired
    Subscriptions(TopicMetadata.open(b)).create("done", TopicMetadata.open(b).load_topic().next_id)
    mine = re.escape(root).replace("\\", "\\\\")
    with exporter(stack, root), TopicReader(a, subscription="held") as reader:
        lag = by_subscription(stack.wait_for(f'shale_subscription_lag_records{{topic=~"{mine}/.+"}}',
                                             lambda rows: len(rows) == 4))
        assert lag == {("a", "slow"): 100, ("a", "gone"): 100, ("a", "held"): 100, ("b", "done"): 0}
        active = by_subscription(stack.query(f'shale_subscription_active{{topic=~"{mine}/.+"}}'))
        assert active == {("a", "slow"): 1, ("a", "gone"): 0, ("a", "held"): 1, ("b", "done"): 1}
        held = by_subscription(stack.query(f'shale_subscription_held{{topic=~"{mine}/.+"}}'))
        assert held[("a", "slow")] == 0 and ("a", "held") in held
        # the reader holding one: its heartbeat's age is there (whether it is live depends on time)
        beats = by_subscription(stack.query(f'shale_subscription_heartbeat_age_seconds{{topic=~"{mine}/.+"}}'))
        assert set(beats) == {("a", "held")} and beats[("a", "held")] >= 0
        up = by_subscription(stack.query(f'shale_exporter_topic_up{{topic=~"{mine}/.+"}}'))
        assert up == {("a", ""): 1, ("b", ""): 1, ("bad", ""): 0}
        # the shipped rule on an expired subscription fires in the real Prometheus
        stack.wait_for(f'ALERTS{{alertname="ShaleSubscriptionExpired",alertstate="firing",topic="{a}"}}',
                       lambda rows: {r["subscription"] for r, _ in rows} == {"gone"})
        # lag as it changes: the reader reads 60 records and commits; a deleted subscription goes
        reader.read(limit=60)
        reader.commit()
        subs.delete("slow")
        stack.wait_for(f'shale_subscription_lag_records{{topic="{a}"}}',
                       lambda rows: by_subscription(rows) == {("a", "gone"): 100, ("a", "held"): 40})


def _dashboard() -> Any:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("_shale_dashboard", MONITORING / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_dashboard_panel_returns_data(prometheus_stack: PrometheusStack, tmp_path: Path) -> None:
    """Each query of each panel of the shipped dashboard, asked of the real Prometheus after
    runs over a good topic and a failing one, answers for this test's topics: a panel
    that names a metric no run pushes, or mistypes a label, shows nothing."""
    stack, now = prometheus_stack, time.time()
    root = str(tmp_path / "topics")
    good, bad = f"{root}/good", f"{root}/bad"
    mixed_ages(good, now)
    produce(bad, 10, t=now - 3 * HOUR)
    [victim] = (tmp_path / "topics" / "bad" / "ledgers").glob("*.ledger")
    data = victim.read_bytes()
    victim.write_bytes(data[:60] + bytes([data[60] ^ 0xFF]) + data[61:])
    for _ in range(2):
        compact("--all", root, "--pushgateway", stack.pushgateway_url)
    stack.sync()
    Subscriptions(TopicMetadata.open(good)).create("billing")
    mine = re.escape(root).replace("\\", "\\\\") + "/.+"
    queries = _dashboard().panel_queries()
    assert len(queries) >= 10
    with exporter(stack, root):
        stack.wait_for(f'shale_subscription_lag_records{{topic=~"{mine}"}}')
        for title, expr in queries:
            assert '".+"' in expr, (title, expr)
            rows = stack.query(expr.replace('".+"', f'"{mine}"'))
            assert rows, f"panel {title!r}: {expr} returned no data"
            topics = {r["topic"] for r, _ in rows if "topic" in r}
            assert topics <= {good, bad}, (title, topics)
