"""``shale exporter``: one reading of every subscription's lag and state (``--once``, the
same gauges the server serves; the server itself is scraped by a real Prometheus in
``tests/cli/test_prometheus.py``), a damaged topic reported without stopping the others,
one topic named instead of a prefix, and bad usage in one line."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from shale.ledger.ids import MIN_ID
from shale.metadata.subscriptions import Subscriptions
from shale.metadata.topic import TopicMetadata
from shale.reader import TopicReader
from tests.cli.test_subscriptions_cli import produce
from tests.conftest import run_cli_here

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def one(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


def test_one_reading_of_every_subscription(tmp_path: Path) -> None:
    root = tmp_path / "topics"
    a, b, bad = str(root / "a"), str(root / "b"), str(root / "bad")
    for uri in (a, b, bad):
        produce(uri, 10)
    (root / "bad" / "_meta" / "topic.json").write_text("{")
    subs = Subscriptions(TopicMetadata.open(a))
    subs.create("slow")
    subs.create("gone", MIN_ID, now_ms=5_000)
    Subscriptions(TopicMetadata.open(b)).create("caught-up", TopicMetadata.open(b).load_topic().next_id)
    with TopicReader(a, subscription="held"):
        r = run_cli_here("exporter", str(root), "--once", "--interval", "5m")
    assert r.returncode == 0, r.stderr
    # the damaged topic: said once on standard error, reported, and the others read
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"shale exporter: warning: {bad}: ") \
        and "topic.json" in r.stderr, r.stderr
    m = samples(r.stdout)
    assert one(m, "shale_exporter_topic_up", topic=a) == one(m, "shale_exporter_topic_up", topic=b) == 1
    assert one(m, "shale_exporter_topic_up", topic=bad) == 0
    assert one(m, "shale_exporter_up") == 1 and one(m, "shale_exporter_interval_seconds") == 300
    lag = {dict(k[1])["subscription"]: v for k, v in m.items() if k[0] == "shale_subscription_lag_records"}
    assert lag == {"slow": 10, "gone": 10, "held": 10, "caught-up": 0}
    assert one(m, "shale_subscription_active", topic=a, subscription="gone") == 0
    assert one(m, "shale_subscription_active", topic=a, subscription="slow") == 1
    # expired in 1970, 7 days (the default expiry) after its commit
    assert one(m, "shale_subscription_expiry_timestamp_seconds", topic=a, subscription="gone") == 5 + 7 * 86_400
    assert one(m, "shale_subscription_last_commit_timestamp_seconds", topic=a, subscription="gone") == 5
    # the reader holding one; none holds the others
    assert one(m, "shale_subscription_held", topic=a, subscription="held") == 1
    assert one(m, "shale_subscription_held", topic=a, subscription="slow") == 0
    assert [dict(k[1])["subscription"] for k in m if k[0] == "shale_subscription_heartbeat_age_seconds"] == ["held"]
    # one topic named instead of a prefix
    r = run_cli_here("exporter", a, "--once")
    assert r.returncode == 0 and set(re.findall(r'topic="([^"]+)"', r.stdout)) == {a}, r.stdout


def test_bad_usage_is_one_line(tmp_path: Path) -> None:
    for args, words in ((["--listen", "nowhere"], "--listen 'nowhere': expected HOST:PORT"),
                        (["--interval", "10ms"], "--interval"), (["--json"], "unrecognized arguments: --json")):
        r = run_cli_here("exporter", str(tmp_path), *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, (args, r.stderr)


def test_sigterm_stops_the_server_with_exit_0(tmp_path: Path) -> None:
    """Kubernetes stops the Deployment's pod with SIGTERM, and the exporter runs there as the
    container's first process, which the kernel shields from any signal it has no handler
    for: without one, every rollout would wait out the grace period and end in a SIGKILL."""
    produce(str(tmp_path / "t"), 3)
    proc = subprocess.Popen([sys.executable, "-m", "shale.cli", "exporter", str(tmp_path), "--listen", "127.0.0.1:0",
                             "--interval", "1h"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        first = proc.stderr.readline()
        found = re.search(r"serving (http://127\.0\.0\.1:[0-9]+/metrics)", first)
        assert found, first
        # once it serves its first reading it waits an hour for the next: SIGTERM ends the wait
        while "shale_exporter_up 1.0" not in urllib.request.urlopen(found.group(1), timeout=30).read().decode():
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert proc.stderr.read() == "shale exporter: stopped (SIGTERM)\n"
    finally:
        proc.kill()  # (a failed test leaves no exporter behind; nothing once it has exited)
        proc.wait()
