"""``shale read --subscription``, ``shale subscriptions`` (list with lag; create, delete,
reset like ``kafka-consumer-groups``), the slowest subscription in ``status`` and
``topics``, ``truncate`` that keeps what a subscription has yet to read, and bad input as
one line with the right exit code."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from shale.cli import build_parser, run_command
from shale.ledger.ids import MIN_ID
from shale.metadata.subscriptions import Subscriptions
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from tests.conftest import run_cli_here
from tests.tamper import edit


def produce(uri: str, n: int, first: int = 0, clock: float | None = None) -> None:
    """``n`` records, four a ledger, two an entry: ``k<i>`` = ``v<i>``."""
    opts = {} if clock is None else {"clock": lambda: clock}
    with TopicWriter(uri, batch_size=2, max_ledger_records=4, **opts) as w:  # type: ignore[arg-type]
        for i in range(first, first + n):
            w.append(f"k{i}", f"v{i}")


def read(*args: str) -> list[str]:
    r = run_cli_here("read", *args)
    assert r.returncode == 0, r.stderr
    return [json.loads(line)["value"] for line in r.stdout.splitlines()]


def one_line_error(r: object, code: int, *words: str) -> None:
    """``r`` failed with ``code`` and one line naming ``words``, without a traceback."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)  # type: ignore[attr-defined]
    err = r.stderr  # type: ignore[attr-defined]
    assert err.count("\n") == 1 and err.startswith("shale: error: ") and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


@pytest.fixture
def topic(tmp_path: Path) -> str:
    uri = str(tmp_path / "t")
    produce(uri, 10)
    return uri


def test_read_as_a_subscription_goes_on_where_it_stopped(topic: str) -> None:
    assert read(topic, "--subscription", "cli", "--limit", "3") == ["v0", "v1", "v2"]
    assert read(topic, "--subscription", "cli", "--limit", "2", "--follow") == ["v3", "v4"]
    assert read(topic, "--subscription", "cli", "--compacted") == [f"v{i}" for i in range(5, 10)]
    assert read(topic, "--subscription", "cli") == []
    produce(topic, 2, first=10)
    assert read(topic, "--subscription", "cli", "--follow", "--limit", "2") == ["v10", "v11"]
    # --start places a new subscription only: given for an existing one, it is refused, not ignored
    assert read(topic, "--subscription", "late", "--start", "latest") == []
    one_line_error(run_cli_here("read", topic, "--subscription", "late", "--start", "earliest"), 2,
                   "--start places a new subscription", "subscription 'late' already (at 5:0:0)",
                   "--reset late --to earliest")
    assert read(topic, "--subscription", "late") == []
    one_line_error(run_cli_here("read", topic, "--subscription", "x", "--table"), 2, "--subscription")
    one_line_error(run_cli_here("read", topic, "--subscription", "no/slash"), 2, "bad subscription name")


def test_subscriptions_lists_creates_resets_and_deletes(topic: str) -> None:
    r = run_cli_here("subscriptions", topic)
    assert r.returncode == 0 and "no subscriptions" in r.stdout
    read(topic, "--subscription", "app", "--limit", "3")
    r = run_cli_here("subscriptions", topic, "--create", "ops", "--to", "2:0:0")
    assert r.returncode == 0 and "created subscription 'ops' at 2:0:0 (6 records behind)" in r.stdout, r.stdout
    r = run_cli_here("subscriptions", topic)
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NAME", "POSITION", "LAG", "RECORDS", "LAG", "BYTES", "LAST", "COMMIT", "(UTC)",
                                "STATE", "READER"]
    assert lines[1].split()[:3] == ["app", "1:1:1", "7"] and lines[1].split()[-2:] == ["active", "-"]
    assert lines[2].split()[:3] == ["ops", "2:0:0", "6"]
    doc = json.loads(run_cli_here("subscriptions", topic, "--json").stdout)
    assert [(s["name"], s["position"], s["lag_records"], s["state"]) for s in doc["subscriptions"]] == [
        ("app", "1:1:1", 7, "active"), ("ops", "2:0:0", 6, "active")]
    assert doc["subscriptions"][0]["lag_bytes"] > doc["subscriptions"][1]["lag_bytes"] > 0
    # a dry run says what a reset would do, and does nothing
    r = run_cli_here("subscriptions", topic, "--reset", "app", "--to", "earliest", "--dry-run", "--json")
    plan = json.loads(r.stdout)
    assert 0 < plan.pop("lag_bytes_before") < plan.pop("lag_bytes_after")
    assert plan == {"topic": topic, "subscription": "app", "action": "reset", "dry_run": True, "before": "1:1:1",
                    "after": "0:0:0", "after_removed": False, "lag_records_before": 7, "lag_records_after": 10,
                    "held_by": None}
    assert read(topic, "--subscription", "app", "--limit", "1") == ["v3"]
    for to, first in (("earliest", "v0"), ("latest", None), ("1:1:0", "v2"), ("2000-01-01", "v0"),
                      ("2999-01-01T00:00:00+02:00", None)):
        r = run_cli_here("subscriptions", topic, "--reset", "app", "--to", to, "--execute")
        assert r.returncode == 0 and "reset subscription 'app' from" in r.stdout, r.stderr
        assert read(topic, "--subscription", "app", "--limit", "1") == ([first] if first else [])
    r = run_cli_here("subscriptions", topic, "--delete", "ops")
    assert r.returncode == 0 and "deleted subscription 'ops'" in r.stdout
    assert [s.name for s in Subscriptions(TopicMetadata.open(topic)).list()] == ["app"]


def test_bad_input_is_one_line_and_exit_2_and_a_hostile_document_exit_4(topic: str, tmp_path: Path) -> None:
    Subscriptions(TopicMetadata.open(topic)).create("app")
    cases = [
        (["--create", "bad name"], "bad subscription name"),
        (["--create", "app"], "exists already"),
        (["--reset", "nope", "--to", "latest"], "no subscription 'nope'"),
        (["--delete", "nope"], "no subscription 'nope'"),
        (["--reset", "app"], "--reset needs --to"),
        (["--reset", "app", "--to", "yesterday"], "--to 'yesterday': expected earliest, latest"),
        (["--reset", "app", "--to", "9:0:0"], "past the end"),
        (["--reset", "app", "--to", "1:2"], "--to '1:2'"),
        (["--to", "latest"], "--to goes with"),
        (["--delete", "app", "--to", "latest"], "--to goes with"),
        (["--create", "a", "--delete", "b"], "not both"),
    ]
    for args, words in cases:
        r = run_cli_here("subscriptions", topic, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and words in r.stderr, (args, r.stderr)
    one_line_error(run_cli_here("subscriptions", str(tmp_path / "missing")), 2, "no topic")
    edit(topic, "subscriptions/app.json", lambda doc: doc["value"].update(position="-1"))
    for args in (["subscriptions", topic], ["status", topic], ["read", topic, "--subscription", "app"],
                 ["truncate", topic, "--before-ledger", "2", "--allow-uncompacted"]):
        one_line_error(run_cli_here(*args), 4, "_meta/subscriptions/app.json", "position")
    # the damaged document can still be deleted, and nothing else was read meanwhile
    assert run_cli_here("subscriptions", topic, "--delete", "app").returncode == 0
    assert run_cli_here("status", topic).returncode == 0


def test_status_and_topics_show_the_slowest_subscription(tmp_path: Path) -> None:
    root = tmp_path / "topics"
    a, b = str(root / "a"), str(root / "b")
    produce(a, 10)
    produce(b, 3)
    read(a, "--subscription", "fast")
    read(a, "--subscription", "slow", "--limit", "2")
    Subscriptions(TopicMetadata.open(a)).create("gone", MIN_ID, now_ms=1)  # committed in 1970: expired
    doc = json.loads(run_cli_here("status", a, "--json").stdout)
    assert doc["slowest_subscription"]["name"] == "slow" and doc["slowest_subscription"]["lag_records"] == 8
    assert [(s["name"], s["state"]) for s in doc["subscriptions"]] == [("fast", "active"), ("gone", "expired"),
                                                                       ("slow", "active")]
    text = run_cli_here("status", a).stdout
    assert "subscriptions 3: slowest slow at 1:0:2, 8 records" in text
    assert "expired (holding nothing back): gone" in text
    assert json.loads(run_cli_here("status", b, "--json").stdout)["subscriptions"] == []
    assert "subscriptions" not in run_cli_here("status", b).stdout
    rows = {d["topic"]: d for d in map(json.loads, run_cli_here("topics", str(root), "--json").stdout.splitlines())}
    assert rows[a]["slowest_subscription"]["lag_records"] == 8 and rows[b]["slowest_subscription"] is None
    table = run_cli_here("topics", str(root)).stdout.splitlines()
    assert "SUBSCRIPTION LAG" in table[0] and table[1].split()[-2] == "8" and table[2].split()[-2] == "-"


def test_truncate_keeps_what_a_subscription_has_yet_to_read_unless_told(topic: str) -> None:
    read(topic, "--subscription", "app", "--limit", "5")  # into the second ledger
    one_line_error(run_cli_here("truncate", topic, "--before-ledger", "3", "--allow-uncompacted"), 2,
                   "subscription 'app' has yet to read", "--allow-unread")
    r = run_cli_here("truncate", topic, "--older-than", "0s", "--allow-uncompacted", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["removed"] == [1], r.stderr  # stops at the subscriber's
    r = run_cli_here("truncate", topic, "--before-ledger", "3", "--allow-uncompacted", "--allow-unread", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["unread_by"] == ["app"], r.stderr
    # forced: the subscriber meets the gap, as any reader that fell behind retention
    r = run_cli_here("read", topic, "--subscription", "app")
    assert r.returncode == 6 and "were removed" in r.stderr, r.stderr
    assert json.loads(run_cli_here("read", topic, "--subscription", "app", "--on-gap", "skip").stdout.splitlines()[0]
                      )["value"] == "v8"


def test_a_reader_of_an_expired_subscription_is_warned(topic: str) -> None:
    Subscriptions(TopicMetadata.open(topic)).create("old", MIN_ID, now_ms=1)
    r = run_cli_here("read", topic, "--subscription", "old", "--limit", "1")
    assert r.returncode == 0 and r.stderr.count("\n") == 1, r.stderr
    assert "subscription 'old' had expired" in r.stderr and "deletes may have been missed" in r.stderr
    assert run_cli_here("read", topic, "--subscription", "old", "--limit", "1").stderr == ""  # active again


class _InterruptedAt(io.StringIO):
    """Standard output that is interrupted (Ctrl-C) as it writes its ``n``-th line."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def write(self, text: str) -> int:
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt
        return super().write(text)


def test_ctrl_c_while_following_commits_only_what_was_printed_whole(topic: str) -> None:
    out = _InterruptedAt(3)
    code = run_command(["read", topic, "--subscription", "f", "--follow", "--poll-interval", "10ms"], build_parser(),
                       out=out, err=io.StringIO())
    assert code == 0 and [json.loads(line)["value"] for line in out.getvalue().splitlines()] == ["v0", "v1"]
    assert read(topic, "--subscription", "f", "--limit", "2") == ["v2", "v3"]  # v2 again: it was cut short
