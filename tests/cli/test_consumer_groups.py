"""``shale subscriptions`` held to ``kafka-consumer-groups``' standard: a reset is a dry run
printing its plan until ``--execute``; it is refused while a reader holds the subscription
(readers heartbeat into its document) unless ``--force``; ``--to`` takes earliest, latest,
current, an id within the topic, a time, epoch milliseconds or ``-DURATION``, besides
``--shift-by``, ``--by-duration``, ``--from-file`` and ``--all``; ``--describe`` shows the
reader holding each and the lag of a compacted read; ``read --start`` takes a time."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import shale.reader.subscriber as subscriber
from shale.ledger.ids import MessageId
from shale.metadata.subscriptions import HEARTBEAT_MS, Member, Subscriptions
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.conftest import run_cli_here
from tests.tamper import edit

T0 = 1_700_000_000_000  # the first ledger's records are published then, each later ledger an hour later
HOUR = 3_600_000


def produce(uri: str, n: int = 12) -> None:
    """``n`` records, four a ledger (an hour apart), two an entry: key ``k<i % 3>``."""
    for first in range(0, n, 4):
        when = (T0 + first // 4 * HOUR) / 1000
        with TopicWriter(uri, batch_size=2, max_ledger_records=4, clock=lambda when=when: when) as w:
            for i in range(first, min(n, first + 4)):
                w.append(f"k{i % 3}", f"v{i}")


def position(uri: str, name: str) -> str:
    return str(Subscriptions(TopicMetadata.open(uri)).get(name).position)


def ok(*args: str) -> str:
    r = run_cli_here("subscriptions", *args)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


def refused(code: int, *args: str, words: tuple[str, ...] = ()) -> None:
    r = run_cli_here(*args)
    assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("shale: error: ") and "Traceback" not in r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


@pytest.fixture
def topic(tmp_path: Path) -> str:
    uri = str(tmp_path / "t")
    produce(uri)
    subs = Subscriptions(TopicMetadata.open(uri))
    subs.create("app", MessageId(2, 0, 0))
    subs.create("ops", MessageId(3, 1, 0))
    return uri


def test_a_reset_is_a_dry_run_printing_its_plan_until_execute(topic: str) -> None:
    out = ok(topic, "--reset", "app", "--to", "earliest")
    assert out.splitlines() == [
        f"{topic}: would reset subscription 'app' from 2:0:0 (8 records behind) to 0:0:0 (12 records behind)",
        "(a dry run: nothing changed; add --execute to reset)"]
    assert position(topic, "app") == "2:0:0"
    doc = json.loads(ok(topic, "--all", "--to", "latest", "--json"))
    assert doc["dry_run"] is True and [(r["subscription"], r["before"], r["after"], r["lag_records_before"],
                                        r["lag_records_after"]) for r in doc["subscriptions"]] == [
        ("app", "2:0:0", "4:0:0", 8, 0), ("ops", "3:1:0", "4:0:0", 2, 0)]
    table = ok(topic, "--all", "--to", "latest").splitlines()
    assert table[0] == f"{topic}: would reset 2 subscriptions"
    assert table[1].split() == ["SUBSCRIPTION", "POSITION", "NEW", "POSITION", "LAG", "NEW", "LAG", "HELD", "BY"]
    assert table[2].split() == ["app", "2:0:0", "4:0:0", "8", "0", "-"]
    assert (position(topic, "app"), position(topic, "ops")) == ("2:0:0", "3:1:0")
    refused(2, "subscriptions", topic, "--reset", "app", "--to", "latest", "--execute", "--dry-run",
            words=("--execute",))
    refused(2, "subscriptions", topic, "--create", "x", "--execute", words=("--execute goes with --reset",))
    assert "reset subscription 'app' from 2:0:0" in ok(topic, "--reset", "app", "--to", "latest", "--execute")
    assert position(topic, "app") == "4:0:0"


def test_every_way_to_say_where_it_goes(topic: str) -> None:
    def to(*how: str, name: str = "app") -> str:
        return str(json.loads(ok(topic, "--reset", name, *how, "--json"))["after"])

    assert (to("--to", "earliest"), to("--to", "latest"), to("--to", "current")) == ("0:0:0", "4:0:0", "2:0:0")
    assert to("--to", "1:1:1") == "1:1:1"
    # a time: the first record published then or later; as ISO 8601, epoch milliseconds, MILLISms
    assert to("--to", "2023-11-14T22:13:20.001Z") == "2:0:0"  # T0 + 1 ms
    assert to("--to", str(T0 + HOUR)) == to("--to", f"{T0 + HOUR}ms") == "2:0:0"
    assert to("--to", str(T0 + 3 * HOUR)) == "4:0:0"  # after every record: latest
    # -DURATION and --by-duration: back from now (every record here is years old)
    assert to("--to", "-1h") == to("--by-duration", "1h") == to("--by-duration", "-1h") == "4:0:0"
    assert to("--to", "-100000d") == to("--by-duration", "P100000D") == "1:0:0"
    # --shift-by N records, clamped at the ends
    assert (to("--shift-by", "1"), to("--shift-by", "-1"), to("--shift-by", "-3")) == ("2:0:1", "1:1:1", "1:0:1")
    assert (to("--shift-by", "-4"), to("--shift-by", "-5"), to("--shift-by", "99")) == ("1:0:0", "0:0:0", "4:0:0")
    assert to("--shift-by", "-1", name="ops") == "3:0:1"
    # ids are checked against the ledger they name: an entry or a batch past its end is refused
    refused(2, "subscriptions", topic, "--reset", "app", "--to", "1:200:0",
            words=("--to 1:200:0: past the end of ledger 1, which holds 2 entries (0 to 1)", "is 2:0:0"))
    refused(2, "subscriptions", topic, "--reset", "app", "--to", "1:1:2",
            words=("past the end of entry 1 of ledger 1, which holds 2 records",))
    refused(2, "subscriptions", topic, "--create", "new", "--to", "3:2:0", words=("past the end of ledger 3",))
    for bad, words in ((["--to", "-1x"], "-DURATION before now"), (["--by-duration", "soon"], "--by-duration"),
                       (["--to", "1h"], "expected earliest, latest, current"),
                       (["--to", "latest", "--shift-by", "1"], "give one of --to, --shift-by"),
                       ([], "--reset needs --to")):
        refused(2, "subscriptions", topic, "--reset", "app", *bad, words=((bad and bad[0]) or "--reset", words))
    refused(2, "subscriptions", topic, "--create", "new", "--to", "current", words=("a new one has none",))
    assert (position(topic, "app"), position(topic, "ops")) == ("2:0:0", "3:1:0")


def test_an_id_retention_removed_is_said_to_be_a_gap(topic: str, tmp_path: Path) -> None:
    """A subscription put where retention removed the records meets a gap at its next plain
    read (exit 6), which a compacted read fills from the compacted view: the plan says so."""
    assert run_cli_here("compact", topic).returncode == 0
    r = run_cli_here("truncate", topic, "--before-ledger", "2")
    assert r.returncode == 0, r.stderr
    note = ("(note: retention removed the records at 1:1:0, every ledger through 1: a plain read of 'app' meets "
            "that gap (exit 6; shale read --on-gap), a compacted one reads them from the compacted view; --to "
            "earliest is the oldest record left)")
    assert ok(topic, "--reset", "app", "--to", "1:1:0").splitlines()[1] == note
    assert json.loads(ok(topic, "--reset", "app", "--to", "0:0:1", "--json"))["after_removed"] is True
    (tmp_path / "plan.csv").write_text("app,1:1:0\nops,2:0:0\n")
    doc = json.loads(ok(topic, "--from-file", str(tmp_path / "plan.csv"), "--json"))
    assert [r["after_removed"] for r in doc["subscriptions"]] == [True, False]
    assert note in ok(topic, "--from-file", str(tmp_path / "plan.csv")).splitlines()
    assert "every ledger through 1: a plain read of 'new'" in ok(topic, "--create", "new", "--to", "1:0:0")
    # earliest, the first id left, and a shift back past it all stay readable, and say nothing
    for how in (["--to", "earliest"], ["--to", "2:0:0"], ["--shift-by", "-99"]):
        out = ok(topic, "--reset", "app", *how)
        assert "note:" not in out and json.loads(ok(topic, "--reset", "app", *how, "--json"))["after_removed"] is False
    ok(topic, "--reset", "app", "--to", "1:1:0", "--execute")
    r = run_cli_here("read", topic, "--subscription", "app", "--limit", "1")
    assert r.returncode == 6 and "1:1:0" in r.stderr, (r.returncode, r.stderr)
    r = run_cli_here("read", topic, "--subscription", "app", "--limit", "1", "--compacted")
    assert r.returncode == 0 and json.loads(r.stdout)["key"], (r.returncode, r.stderr)


def test_from_file_and_all_reset_many_or_none(topic: str, tmp_path: Path) -> None:
    plan = tmp_path / "plan.csv"
    plan.write_text("name,position\n# moved back for a replay\napp,earliest\n\nops, 2:1:0\n")
    doc = json.loads(ok(topic, "--from-file", str(plan), "--execute", "--json"))
    assert doc["dry_run"] is False and [(r["subscription"], r["after"]) for r in doc["subscriptions"]] == [
        ("app", "0:0:0"), ("ops", "2:1:0")]
    assert (position(topic, "app"), position(topic, "ops")) == ("0:0:0", "2:1:0")
    # one bad line: nothing is reset
    for text, words in (("app,latest\nops,1:9:0\n", "past the end of ledger 1"),
                        ("app,latest\nnope,latest\n", "no subscription 'nope'"),
                        ("app,latest\napp,earliest\n", "line 2: subscription 'app' is named twice"),
                        ("app,latest,x\n", "line 1: expected NAME,POSITION, found 3 fields"),
                        ("name,position\n", "names no subscription")):
        plan.write_text(text)
        refused(2, "subscriptions", topic, "--from-file", str(plan), "--execute", words=(words,))
    assert (position(topic, "app"), position(topic, "ops")) == ("0:0:0", "2:1:0")
    refused(2, "subscriptions", topic, "--from-file", str(tmp_path / "none.csv"), words=("no such file",))
    refused(2, "subscriptions", topic, "--from-file", str(plan), "--to", "latest", words=("--to goes with",))
    r = run_cli_here("subscriptions", topic, "--from-file", "-", "--execute", input="ops,current\napp,1:1:0\n")
    assert r.returncode == 0 and position(topic, "app") == "1:1:0", r.stderr
    ok(topic, "--all", "--shift-by", "2", "--execute")
    assert (position(topic, "app"), position(topic, "ops")) == ("2:0:0", "3:0:0")


def test_a_reset_or_delete_is_refused_while_a_reader_holds_it(topic: str) -> None:
    with TopicReader(topic, subscription="app") as reader:
        assert [m.value for m in reader.read(limit=1)] == [b"v4"]
        doc = json.loads(ok(topic, "--describe", "--json"))["subscriptions"][0]
        member = doc["member"]
        assert member["holds"] is True and member["timeout_ms"] == 3 * HEARTBEAT_MS and member["id"].count(":") == 2
        out = ok(topic, "--reset", "app", "--to", "earliest")
        assert f"; held by reader {member['id']} (heartbeat " in out and "--force while a reader holds 'app'" in out
        refused(3, "subscriptions", topic, "--reset", "app", "--to", "earliest", "--execute",
                words=(f"'app' by {member['id']} (heartbeat", "--force", "nothing was reset"))
        refused(3, "subscriptions", topic, "--all", "--to", "earliest", "--execute", words=("nothing was reset",))
        refused(3, "subscriptions", topic, "--delete", "app", words=(f"reader {member['id']} holds it", "--force"))
        r = run_cli_here("subscriptions", topic, "--delete", "app")
        assert re.search(r"\(last heartbeat [0-9]+s ago; a reader counts as gone 90s after", r.stderr), r.stderr
        assert (position(topic, "app"), position(topic, "ops")) == ("2:0:0", "3:1:0")
        ok(topic, "--reset", "app", "--to", "earliest", "--execute", "--force")
        with pytest.raises(Exception, match="changed by another writer"):
            reader.commit()  # let go by the forced reset
    assert position(topic, "app") == "0:0:0"
    # a reader that closed has left: nothing holds the subscription
    with TopicReader(topic, subscription="app") as reader:
        reader.read(limit=1)
    assert Subscriptions(TopicMetadata.open(topic)).get("app").member is None
    ok(topic, "--reset", "app", "--to", "latest", "--execute")
    # a reader that died holds it only until its heartbeat is three intervals old
    reader = TopicReader(topic, subscription="ops")
    edit(topic, "subscriptions/ops.json",
         lambda d: d["value"]["member"].update(heartbeat_ms=d["value"]["member"]["heartbeat_ms"] - 3 * HEARTBEAT_MS))
    assert "(heartbeat 1m 30s ago, gone)" in ok(topic, "--describe")
    ok(topic, "--delete", "ops")
    del reader


def test_a_heartbeat_from_a_clock_far_ahead_counts_from_the_documents_write() -> None:
    m = Member("h:1:a", T0 + 10 * HOUR, 90_000)
    assert not m.alive(T0, written_ms=None) and not m.alive(T0, written_ms=T0 - 90_000)
    assert m.alive(T0, written_ms=T0 - 89_999) and m.age_ms(T0, T0 - 1000) == 1000
    near = Member("h:1:a", T0 + 90_000, 90_000)  # ahead, but within its timeout: believed
    assert near.alive(T0 + 90_000 * 2 - 1) and not near.alive(T0 + 90_000 * 2)


def test_an_idle_reader_heartbeats_every_half_minute_and_no_more(topic: str, monkeypatch: Any) -> None:
    now = [T0 + 100 * HOUR]
    monkeypatch.setattr(subscriber, "_now_ms", lambda: now[0])
    subs = Subscriptions(TopicMetadata.open(topic))
    for auto in (False, True):
        with TopicReader(topic, subscription="app", auto_commit=auto) as r:
            joined = subs.get("app")
            assert joined.member is not None and joined.member.heartbeat_ms == now[0]
            r.read()
            r.read()  # (auto: commits what the first read handed out, which carries the heartbeat)
            first = subs.get("app")
            assert (first.version > joined.version) == auto  # only auto-commit commits as it reads
            now[0] += HEARTBEAT_MS - 1
            r.read()
            assert subs.get("app").version == first.version  # nothing new, not yet due
            now[0] += 1
            r.read()
            beat = subs.get("app")
            assert beat.version == first.version + 1 and beat.member is not None
            assert beat.member.heartbeat_ms == now[0] and beat.position == first.position
            assert (beat.committed_ms != first.committed_ms) == auto  # only a commit is a commit
        assert subs.get("app").member is None  # left as it closed


def test_describe_shows_the_compacted_lag(topic: str) -> None:
    assert run_cli_here("compact", topic, "--delete-retention", "0").returncode == 0
    ok(topic, "--create", "fresh", "--to", "earliest")
    rows = {r["name"]: r for r in json.loads(ok(topic, "--describe", "--json"))["subscriptions"]}
    # three keys: a compacted read from the start has three records left, a plain one twelve
    assert (rows["fresh"]["lag_records"], rows["fresh"]["lag_compacted_records"]) == (12, 3)
    assert (rows["app"]["lag_records"], rows["app"]["lag_compacted_records"]) == (8, 3)
    assert (rows["ops"]["lag_records"], rows["ops"]["lag_compacted_records"]) == (2, 2)
    assert all(r["member"] is None for r in rows.values())
    table = ok(topic, "--describe").splitlines()
    assert table[0].split()[:7] == ["NAME", "POSITION", "LAG", "RECORDS", "LAG", "BYTES", "LAG"]
    assert table[1].split()[:5] == ["app", "2:0:0", "8", table[1].split()[3], "3"]
    assert json.loads(ok(topic, "--json"))["subscriptions"][0]["lag_compacted_records"] is None
    refused(2, "subscriptions", topic, "--reset", "app", "--to", "latest", "--describe", words=("--describe",))


def test_read_start_takes_a_time_and_is_refused_for_an_existing_subscription(topic: str) -> None:
    def first(*args: str) -> str:
        r = run_cli_here("read", topic, *args, "--limit", "1")
        assert r.returncode == 0, r.stderr
        return str(json.loads(r.stdout)["id"]) if r.stdout else ""

    assert first("--start", str(T0 + 1)) == first("--start", f"{T0 + HOUR}ms") == "2:0:0"
    assert first("--start", "2023-11-14T23:13:20Z") == "2:0:0"  # T0 + 1h
    assert first("--start", "-1h") == ""  # nothing within the last hour
    assert first("--start", "-100000d") == first("--start", "1970-01-01") == "1:0:0"
    assert first("--subscription", "late", "--start", str(T0 + 2 * HOUR)) == "3:0:0"  # a new one starts there
    refused(2, "read", topic, "--subscription", "late", "--start", "earliest",
            words=("--start places a new subscription", "'late' already (at 3:0:1)"))
    refused(2, "read", topic, "--start", "yesterday", words=("'yesterday' is not a position",))
