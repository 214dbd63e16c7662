"""What the docs promise about subscriptions, positions and times, held against hostile
documents, skewed clocks and careless input: a commit time far ahead of any clock cannot
keep a subscription active for ever nor crash a command; a position has one spelling and
never lies past the topic's end; an empty ``--to`` is a bad ``--to``; times print with
four-digit years and never overflow; an epoch above the id bound is refused; msgspec's
messages keep their acronyms.  On a local folder and on S3 (moto) where storage is read."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.ledger.errors import InvalidInputError, InvalidMetadataError, mid_sentence
from shale.ledger.ids import MIN_ID, MessageId
from shale.maintenance.subscriptions import subscription_statuses
from shale.metadata.snapshots import parse_as_of
from shale.metadata.subscriptions import CLOCK_SKEW_MS, Subscriptions, hold_floor
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.conftest import run_cli_here
from tests.tamper import edit, read_raw

DAY = 86_400_000
WEEK = 7 * DAY
FAR = 2**62 - 1  # the greatest time the schema takes: year 146 million


def produce(uri: str, items: list[tuple[str, str | None]], clock: float | None = None) -> None:
    """Four records a ledger, two an entry."""
    opts: dict[str, Any] = {} if clock is None else {"clock": lambda: clock}
    with TopicWriter(uri, batch_size=2, max_ledger_records=4, **opts) as w:
        for k, v in items:
            w.append(k, v)


def records(n: int) -> list[tuple[str, str | None]]:
    return [(f"k{i}", f"v{i}") for i in range(n)]


def now_ms() -> int:
    return int(time.time() * 1000)


def one_line_error(r: Any, code: int, *words: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("shale: error: "), r.stderr
    assert "Traceback" not in r.stderr and "unexpected error" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def committed_at(uri: str, name: str, ms: int) -> None:
    """Set ``name``'s commit time by hand, as a clock set wrong or a hostile writer would."""
    edit(uri, f"subscriptions/{name}.json", lambda doc: doc["value"].update(committed_ms=ms))


def position_of(uri: str, name: str) -> str:
    return str(json.loads(read_raw(uri, f"_meta/subscriptions/{name}.json"))["value"]["position"])


# ------------------------------------------------------------------ commits from the future


def test_a_commit_far_in_the_future_is_listed_and_expires_from_its_last_write(disk_topic_uri: str) -> None:
    """``committed_ms = 2**62-1`` (valid by the schema): every command lists it or reads
    on, none crashes; it counts as committed when its document was last written (by the
    store's clock), so a week later it is expired and holds nothing back."""
    uri = disk_topic_uri
    produce(uri, [*records(6), ("k1", None), ("k9", "v9")])
    meta = TopicMetadata.open(uri)
    Subscriptions(meta).create("far")
    committed_at(uri, "far", FAR)
    written = now_ms()
    r = run_cli_here("subscriptions", uri)
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("far "))
    assert row.split()[-2:] == ["active", "-"] and "(*)" in row and "after" not in row, r.stdout
    assert "far: commit time after 9999-12-31 23:59:59 UTC in its document is more than 1h ahead" in r.stdout
    doc = json.loads(run_cli_here("subscriptions", uri, "--json").stdout)["subscriptions"][0]
    assert (doc["committed_ms"], doc["state"], doc["commit_ahead"]) == (FAR, "active", True)
    for args in (["status", uri], ["status", uri, "--json"], ["topics", uri.rsplit("/", 1)[0]]):
        r = run_cli_here(*args)
        assert r.returncode == 0 and "unexpected" not in r.stderr, (args, r.stderr)
    # a week after its last write, by any judge: expired, holding nothing
    later = written + WEEK + DAY
    (status,) = subscription_statuses(meta, now_ms=later)
    assert not status.active and status.ahead
    assert hold_floor(Subscriptions(meta).list(), later, WEEK) is None
    s = Compactor(uri, CompactionConfig(delete_retention_ms=0), clock=lambda: later / 1000).run()
    assert (s.status, s.tombstones_dropped, s.tombstones_kept) == ("compacted", 1, 0), s
    # its reader goes on, and its commit says the time again
    r = run_cli_here("read", uri, "--subscription", "far", "--limit", "2")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    after = Subscriptions(meta).get("far")
    assert after.position > MIN_ID and abs(after.committed_ms - now_ms()) < CLOCK_SKEW_MS


def test_a_committer_whose_clock_runs_years_ahead_holds_back_only_until_expiry(disk_topic_uri: str) -> None:
    """Its own clock says years ahead, so its commit is taken when written; a compactor
    with a good clock counts it as made when the document was written, and a week
    without another commit expires it."""
    uri = disk_topic_uri
    produce(uri, [*records(4), ("k0", None), ("k5", "v5")])
    meta = TopicMetadata.open(uri)
    years = 3 * 365 * DAY
    sub = Subscriptions(meta, clock=lambda: (now_ms() + years) / 1000).create("skewed")
    assert sub.committed_ms - now_ms() > years - DAY
    written = now_ms()
    # while it keeps to the expiry it holds the tombstone, as any subscription
    held = Compactor(uri, CompactionConfig(delete_retention_ms=0), clock=lambda: (written + DAY) / 1000).run()
    assert (held.tombstones_dropped, held.tombstones_kept) == (0, 1)
    later = written + WEEK + DAY
    assert not Subscriptions(meta).get("skewed").active(later, WEEK)
    s = Compactor(uri, CompactionConfig(delete_retention_ms=0), clock=lambda: later / 1000).run()
    assert (s.tombstones_dropped, s.tombstones_kept) == (1, 0), s


def test_retention_is_not_pinned_by_a_commit_from_the_future(tmp_path: Path) -> None:
    """A document committed in year 146 million, last written eight days ago (its file's
    time, set by hand): expired, so ``truncate`` removes what it has not read."""
    uri = str(tmp_path / "t")
    produce(uri, records(12))
    Subscriptions(TopicMetadata.open(uri)).create("far")
    committed_at(uri, "far", FAR)
    eight_days_ago = time.time() - 8 * 86_400
    os.utime(Path(uri) / "_meta/subscriptions/far.json", (eight_days_ago, eight_days_ago))
    r = run_cli_here("truncate", uri, "--before-ledger", "3", "--allow-uncompacted")
    assert r.returncode == 0, r.stderr
    assert TopicMetadata.open(uri).load_topic().ledgers[0].id == 3


def test_a_commit_time_far_ahead_of_the_writers_clock_is_refused(disk_topic_uri: str) -> None:
    """The commit time a caller gives is checked against the writer's clock: up to an hour
    ahead is skew, further is refused (and nothing is written); before 1970 too."""
    uri = disk_topic_uri
    produce(uri, records(4))
    subs = Subscriptions(TopicMetadata.open(uri))
    for bad in (FAR, now_ms() + CLOCK_SKEW_MS + 60_000, -1):
        with pytest.raises(InvalidInputError, match="commit time"):
            subs.create("x", now_ms=bad)
    assert subs.names() == []
    sub = subs.create("x", now_ms=now_ms() + CLOCK_SKEW_MS // 2)  # within the skew
    for bad in (FAR, now_ms() + 2 * CLOCK_SKEW_MS):
        with pytest.raises(InvalidInputError, match="ahead of this clock"):
            subs.commit(sub, MessageId(1, 0, 1), now_ms=bad)
        with pytest.raises(InvalidInputError, match="ahead of this clock"):
            subs.reset("x", MessageId(1, 0, 1), now_ms=bad)
    assert subs.get("x").committed_ms == sub.committed_ms and subs.get("x").position == MIN_ID


# ------------------------------------------------------------------ --to and positions


@pytest.fixture
def topic(tmp_path: Path) -> str:
    uri = str(tmp_path / "t")
    produce(uri, records(10))  # ledgers 1-3: latest is 4:0:0
    return uri


def test_an_empty_to_is_a_bad_to(topic: str) -> None:
    """An unset shell variable (``--to ""``) is a bad ``--to`` (exit 2), never ``earliest``."""
    assert run_cli_here("subscriptions", topic, "--create", "s", "--to", "2:0:0").returncode == 0
    for to in ("", "  "):
        one_line_error(run_cli_here("subscriptions", topic, "--reset", "s", "--to", to), 2, "--to is empty")
        one_line_error(run_cli_here("subscriptions", topic, "--reset", "s", "--to", to, "--dry-run"), 2, "--to")
        one_line_error(run_cli_here("subscriptions", topic, "--create", "t", "--to", to), 2, "--to is empty")
    assert position_of(topic, "s") == "2:0:0"
    assert Subscriptions(TopicMetadata.open(topic)).names() == ["s"]


def test_positions_have_one_spelling_and_lie_within_the_topic(disk_topic_uri: str) -> None:
    """``" 1:0:0 "``, ``"01:00:00"`` and ids past ``latest`` (the id the next ledger starts
    at) are refused, given (exit 2) or found in a document (exit 4, named)."""
    uri = disk_topic_uri
    produce(uri, records(10))
    assert run_cli_here("subscriptions", uri, "--create", "s", "--to", "2:0:0").returncode == 0
    for to, words in ((" 1:0:0 ", "bad message id ' 1:0:0 '"), ("01:00:00", "leading zeros"),
                      ("1:0:00", "bad message id"), ("4:0:1", "past the end"), ("99:0:0", "latest is 4:0:0")):
        one_line_error(run_cli_here("subscriptions", uri, "--reset", "s", "--to", to), 2, words)
        one_line_error(run_cli_here("subscriptions", uri, "--create", "t", "--to", to), 2, words)
    assert position_of(uri, "s") == "2:0:0"
    assert run_cli_here("subscriptions", uri, "--reset", "s", "--to", "4:0:0").returncode == 0  # latest itself
    # a reader's --start places a new subscription: within the topic too
    one_line_error(run_cli_here("read", uri, "--subscription", "n", "--start", "9:0:0"), 2, "past the end")
    one_line_error(run_cli_here("read", uri, "--start", " 1:0:0"), 2, "bad message id")
    assert Subscriptions(TopicMetadata.open(uri)).names() == ["s"]
    # found in a document: corrupt, named; a reset repairs it, a delete removes it
    for bad, words in ((" 1:0:0 ", "not a message id"), ("01:00:00", "not a message id"), ("99:0:0", "past the end")):
        edit(uri, "subscriptions/s.json", lambda doc, bad=bad: doc["value"].update(position=bad))
        for args in (["subscriptions", uri], ["status", uri], ["read", uri, "--subscription", "s"]):
            one_line_error(run_cli_here(*args), 4, "_meta/subscriptions/s.json", "position", words)
    assert run_cli_here("subscriptions", uri, "--reset", "s", "--to", "latest", "--execute").returncode == 0
    assert position_of(uri, "s") == "4:0:0"


def test_topic_reader_commit_takes_only_what_it_could_have_read(disk_topic_uri: str) -> None:
    """``commit(position)``: a MessageId, at most the position after the last message
    returned, never past the end of the topic; anything else is InvalidInputError and
    the document is left as it was."""
    uri = disk_topic_uri
    produce(uri, records(10))
    with TopicReader(uri, subscription="app") as r:
        got = r.read(limit=3)
        for bad in ("1:0:1", (1, 0, 1), 5):
            with pytest.raises(InvalidInputError, match="expected a MessageId"):
                r.commit(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="past what this reader has returned"):
            r.commit(MessageId(99, 0, 0))
        with pytest.raises(InvalidInputError, match="past what this reader has returned"):
            r.commit(got[-1].id.successor().successor())
        assert r.commit(got[1].id) == got[1].id  # one returned but not handled
        assert r.commit() == got[-1].id.successor()
        r.seek(MessageId(99, 0, 0))  # a reader may look past the end; its subscription may not stand there
        with pytest.raises(InvalidInputError, match="past the end of the topic"):
            r.commit()
    assert position_of(uri, "app") == str(got[-1].id.successor())
    subs = Subscriptions(TopicMetadata.open(uri))
    with pytest.raises(InvalidInputError, match="past the end"):
        subs.commit(subs.get("app"), MessageId(4, 0, 1))
    with pytest.raises(InvalidInputError, match="past the end"):
        subs.reset("app", MessageId(5, 0, 0))
    with pytest.raises(InvalidInputError, match="past the end"):
        subs.create("new", MessageId(4, 1, 0))
    assert subs.names() == ["app"]


# ------------------------------------------------------------------ times, epochs, messages


def test_times_have_four_digit_years_and_never_overflow(disk_topic_uri: str) -> None:
    """``--as-of 0001-01-01`` is named as 0001-01-01; times no calendar holds (a hostile
    ``topic.json`` or ``compaction.json``, an --as-of in year 10000 UTC) are said, not a
    crash, in ``status``, ``topics`` and ``read --as-of``."""
    uri = disk_topic_uri
    produce(uri, records(6))
    assert run_cli_here("compact", uri).returncode == 0
    r = run_cli_here("read", uri, "--as-of", "0001-01-01")  # the whole history kept: nothing was there then
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    # (by ledger id: the S3 store's clock has whole seconds, so "older than 0s" may remove nothing yet)
    past = TopicMetadata.open(uri).load_topic().last_ledger_id + 1
    assert run_cli_here("truncate", uri, "--before-ledger", str(past)).returncode == 0
    assert TopicMetadata.open(uri).load_topic().removed_through > 0
    one_line_error(run_cli_here("read", uri, "--as-of", "0001-01-01"), 2,
                   "0001-01-01T00:00:00Z is older than the history kept")

    def far(doc: dict[str, Any]) -> None:
        for lg in doc["value"]["ledgers"]:
            lg["first_publish"] = lg["last_publish"] = FAR

    edit(uri, "topic.json", far)
    edit(uri, "compaction.json", lambda doc: doc["value"].update(compacted_ms=FAR))
    r = run_cli_here("status", uri)
    assert r.returncode == 0 and "compacted after 9999-12-31 23:59:59 UTC" in r.stdout, (r.stdout, r.stderr)
    r = run_cli_here("topics", uri.rsplit("/", 1)[0])
    assert r.returncode == 0 and "after 9999-12-31 23:59" in r.stdout, (r.stdout, r.stderr)
    one_line_error(run_cli_here("read", uri, "--as-of", "2024-05-01"), 2,
                   "the earliest time that can be read is after 9999-12-31T23:59:59Z")
    # (year 10000 by UTC: before the view was published, by its document)
    one_line_error(run_cli_here("read", uri, "--as-of", "9999-12-31T23:59:59-01:00"), 2,
                   "a time after 9999-12-31T23:59:59Z is older than the history kept")


def test_an_epoch_above_the_id_bound_is_refused(topic: str) -> None:
    for text in ("9223372036854775808", "4611686018427387904", "99999999999999999999999", "0"):
        with pytest.raises(InvalidInputError, match="out of range"):
            parse_as_of(text)
        one_line_error(run_cli_here("read", topic, "--as-of", text), 2, "--as-of: epoch", "out of range")
    assert parse_as_of("4611686018427387903") == 2**62 - 1
    with pytest.raises(InvalidInputError, match="out of range"):
        TopicReader(topic, as_of=2**63)


def test_damaged_metadata_is_said_with_its_acronyms(disk_topic_uri: str) -> None:
    """msgspec's ``JSON is malformed`` stays so (not ``jSON``), in a damaged document's
    one-line error (exit 4) as in a bad record's."""
    uri = disk_topic_uri
    produce(uri, records(2))
    edit(uri, "topic.json", lambda doc: '{version: 1}')
    one_line_error(run_cli_here("status", uri), 4, "_meta/topic.json: not a metadata document: JSON is malformed")
    assert mid_sentence("JSON is malformed") == "JSON is malformed"
    assert mid_sentence("Input data was truncated") == "input data was truncated"
    assert mid_sentence("UTF-8 is expected") == "UTF-8 is expected"
    with pytest.raises(InvalidMetadataError, match="JSON is malformed"):
        TopicMetadata.open(uri).load_topic()
