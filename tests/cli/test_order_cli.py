"""``--order``, ``--key-ttl`` and ``--rewrite`` from the command line, and the policy keys
``order`` and ``key-ttl``: what a user sees."""

from __future__ import annotations

import json
from pathlib import Path

from shale.ledger.record import Record
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from tests.conftest import run_cli_here

BASE = 1_700_000_000_000


def _topic(tmp_path: Path) -> str:
    uri = str(tmp_path / "t")
    with TopicWriter(uri, batch_size=1) as w:
        w.send(Record(b"a", b"new", {}, BASE + 10, BASE + 500))
        w.send(Record(b"a", b"late", {}, BASE + 20, BASE + 100))
        w.send(Record(b"b", b"old", {}, BASE + 30, BASE + 1))
    return uri


def _compacted(uri: str) -> dict[str, str]:
    r = run_cli_here("read", uri, "--compacted", "--table")
    assert r.returncode == 0, r.stderr
    return {m["key"]: m["value"] for m in map(json.loads, r.stdout.splitlines())}


def test_compact_in_event_time_order_from_the_command_line(tmp_path: Path) -> None:
    uri = _topic(tmp_path)
    r = run_cli_here("compact", uri, "--order", "event-time", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["keys"] == 2
    assert _compacted(uri) == {"a": "new", "b": "old"}
    status = run_cli_here("status", uri)
    assert "order     event-time" in status.stdout
    doc = json.loads(run_cli_here("status", uri, "--json").stdout)
    assert doc["compaction"]["order"] == "event-time" and doc["compaction"]["key_ttl_ms"] == 0


def test_changing_the_order_is_refused_in_one_line_until_rewrite(tmp_path: Path) -> None:
    uri = _topic(tmp_path)
    assert run_cli_here("compact", uri).returncode == 0
    assert _compacted(uri) == {"a": "late", "b": "old"}
    r = run_cli_here("config", uri, "--set", "order=event-time")
    assert r.returncode == 0 and "--rewrite" in r.stderr
    r = run_cli_here("compact", uri)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "offset order" in lines[0] and "--rewrite" in lines[0] and "1 ledger" in lines[0]
    assert "Traceback" not in r.stderr and "Error" not in r.stderr.split(":", 2)[-1]
    assert _compacted(uri) == {"a": "late", "b": "old"}  # nothing changed
    assert TopicMetadata.open(uri).load_compaction().epoch == 1
    # the policy's order, applied by a rewrite
    r = run_cli_here("compact", uri, "--rewrite")
    assert r.returncode == 0, r.stderr
    assert _compacted(uri) == {"a": "new", "b": "old"}
    assert TopicMetadata.open(uri).load_compaction().order.order == "event-time"
    # and the policy's runs go on without --rewrite
    assert run_cli_here("compact", uri).returncode == 0


def test_key_ttl_from_the_policy_counts_expired_keys(tmp_path: Path) -> None:
    uri = _topic(tmp_path)
    assert run_cli_here("config", uri, "--set", "key-ttl=1d").returncode == 0
    r = run_cli_here("compact", uri, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["keys_expired"] == 2 and summary["keys"] == 0  # the records are from 2023
    assert "keys expired 2" in run_cli_here("compact", uri, "--rewrite").stdout
    status = run_cli_here("status", uri).stdout
    assert "keys expire 1d after their latest record" in status
    # the plain log keeps them
    assert len(run_cli_here("read", uri).stdout.splitlines()) == 3


def test_bad_order_and_ttl_flags_are_one_line_errors(tmp_path: Path) -> None:
    uri = _topic(tmp_path)
    for args in (("--order", "newest"), ("--key-ttl", "soon")):
        r = run_cli_here("compact", uri, *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr
    r = run_cli_here("config", uri, "--set", "order=newest")
    assert r.returncode == 2 and "offset, event-time" in r.stderr
