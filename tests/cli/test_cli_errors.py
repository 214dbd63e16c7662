"""The ``shale`` command on bad input: one clear line on stderr naming what and where,
a non-zero exit code, and nothing lost.  Every case runs the console script as a real
process."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from shale.ledger.format import FRAME_HEADER
from shale.ledger.reader import LedgerFile
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.storage import resolve
from tests.conftest import run_cli


def one_line_error(p: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """Check the exit code, that stderr names ``needles``, and that it is exactly one line."""
    assert p.returncode == code, (p.returncode, p.stderr)
    err = p.stderr
    assert "Traceback" not in err, err
    for n in needles:
        assert n in err, f"{n!r} not in {err!r}"
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].strip(), f"stderr is not one line: {err!r}"
    assert err.endswith("\n")
    return lines[0]


def jl(*docs: object) -> str:
    return "".join((d if isinstance(d, str) else json.dumps(d)) + "\n" for d in docs)


def values(topic: str) -> list[bytes | None]:
    return [m.value for m in TopicReader(topic).read()]


def produce(topic: str, n: int) -> None:
    with TopicWriter(topic) as w:
        for i in range(n):
            w.append(f"k{i}", f"v{i}")


# -------------------------------------------------------------- missing topics


@pytest.mark.parametrize("command", ["read", "status"])
def test_missing_topic(disk_topic_uri: str, command: str) -> None:
    p = run_cli(command, disk_topic_uri)
    line = one_line_error(p, 2, disk_topic_uri)
    assert "no topic" in line
    assert p.stdout == ""
    # looking at a missing topic does not create it
    assert not TopicMetadata.open(disk_topic_uri).exists()


def test_read_of_a_folder_without_a_topic(tmp_path: Path) -> None:
    (tmp_path / "t" / "ledgers").mkdir(parents=True)
    p = run_cli("read", str(tmp_path / "t"))
    one_line_error(p, 2, str(tmp_path / "t"), "topic.json")


# --------------------------------------------------------------------- bad URIs


@pytest.mark.parametrize("command, uri, needle", [
    ("read", "s3://bucket/a/../b", "s3://bucket/a/../b"),
    ("produce", "s3://bucket/a/../b", "s3://bucket/a/../b"),
    ("read", "nosuchscheme://x/y", "nosuchscheme"),
    ("status", "nosuchscheme://x/y", "nosuchscheme"),
    ("read", "file://somehost/x/y", "file://somehost/x/y"),
    ("status", "s3://just-a-bucket", "s3://just-a-bucket"),
    ("produce", "memory://m/t?x=1", "memory://m/t?x=1"),
])
def test_bad_uris(command: str, uri: str, needle: str) -> None:
    p = run_cli(command, uri, input=jl({"key": "k", "value": "v"}))
    one_line_error(p, 2, needle)
    assert p.stdout == ""


def test_dot_dot_in_a_local_path(tmp_path: Path) -> None:
    uri = f"{tmp_path}/a/../b"
    p = run_cli("produce", uri, input=jl({"key": "k", "value": "v"}))
    one_line_error(p, 2, "'..'")
    assert not (tmp_path / "b").exists() and not (tmp_path / "a").exists()


# -------------------------------------------------------------------- bad flags


@pytest.mark.parametrize("args, needle", [
    (["read", "{T}", "--limit", "0"], "--limit"),
    (["produce", "{T}", "--batch-size", "x"], "--batch-size"),
    (["produce", "{T}", "--max-ledger-records", "0"], "--max-ledger-records"),
    (["frobnicate", "{T}"], "frobnicate"),
    (["read", "{T}", "--bogus"], "--bogus"),
    ([], "COMMAND"),
])
def test_bad_flags(tmp_path: Path, args: list[str], needle: str) -> None:
    topic = str(tmp_path / "t")
    p = run_cli(*[a.replace("{T}", topic) for a in args], input=jl({"key": "k", "value": "v"}))
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""
    assert not Path(topic).exists()  # nothing was created or appended
    one_line_error(p, 2, needle)


def test_table_implies_compacted(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    produce(topic, 3)
    p = run_cli("read", topic, "--table")
    assert p.returncode == 0 and p.stdout, p.stderr
    assert p.stdout == run_cli("read", topic, "--compacted", "--table").stdout
    p = run_cli("read", topic, "--table", "--follow")
    one_line_error(p, 2, "--table", "--follow")


@pytest.mark.parametrize("start", ["not-an-id", "3:17"])
def test_read_start_not_an_id(disk_topic_uri: str, start: str) -> None:
    produce(disk_topic_uri, 5)
    p = run_cli("read", disk_topic_uri, "--start", start)
    one_line_error(p, 2, repr(start), "LEDGER:ENTRY:BATCH")
    assert p.stdout == ""


# ------------------------------------------------------------------- bad records


def test_bad_json_line_3_keeps_the_two_records_before_it(disk_topic_uri: str) -> None:
    text = jl({"key": "a", "value": "1"}, {"key": "b", "value": "2"}, '{"key": "c", "value": ', {"key": "d"})
    p = run_cli("produce", disk_topic_uri, input=text)
    line = one_line_error(p, 2, "<stdin>:3", "not valid JSON")
    assert "2 earlier records were appended" in line and "1:0:1" in line
    assert p.stdout == ""
    # the two good records are there, readable by a new process; nothing after line 3 is
    r = run_cli("read", disk_topic_uri)
    assert r.returncode == 0, r.stderr
    got = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(g["id"], g["key"], g["value"]) for g in got] == [("1:0:0", "a", "1"), ("1:0:1", "b", "2")]


def test_bad_line_in_an_input_file_is_named_by_path_and_line(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    src = tmp_path / "records.jsonl"
    src.write_text(jl({"key": "a", "value": "1"}, "", {"key": "b", "value": "2"}, "{oops", {"key": "c"}))
    p = run_cli("produce", topic, "--input", str(src))
    one_line_error(p, 2, f"{src}:4")  # blank lines count
    assert values(topic) == [b"1", b"2"]


def test_bad_line_after_sealed_ledgers_loses_nothing(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    good = [{"key": f"k{i}", "value": f"v{i}"} for i in range(7)]
    p = run_cli("produce", topic, "--max-ledger-records", "3", "--batch-size", "2",
                input=jl(*good, {"key": "x", "value": 5}, {"key": "z", "value": "never"}))
    one_line_error(p, 2, "<stdin>:8", "'value'")
    assert values(topic) == [f"v{i}".encode() for i in range(7)]
    assert len(TopicMetadata.open(topic).load_topic().ledgers) == 3


@pytest.mark.parametrize("bad, needle", [
    ({"key": "b", "value": "2", "colour": "red"}, "colour"),
    ({"key": "b", "value_b64": "not base64!!"}, "value_b64"),
    ({"key": "b", "value_b64": "QUJ"}, "value_b64"),
    ({"key": "b", "value": "2", "value_b64": "QUJD"}, "value_b64"),
    ({"key": 5, "value": "2"}, "'key'"),
    ({"key": "b", "value": "2", "properties": {"p": 1}}, "properties"),
    ({"key": "b", "value": "2", "event_time": 1.5}, "event_time"),
    ("[1, 2, 3]", "JSON object"),
])
def test_bad_record_fields(tmp_path: Path, bad: object, needle: str) -> None:
    topic = str(tmp_path / "t")
    p = run_cli("produce", topic, input=jl({"key": "a", "value": "1"}, bad, {"key": "c", "value": "3"}))
    one_line_error(p, 2, "<stdin>:2", needle)
    assert p.stdout == ""
    assert values(topic) == [b"1"]


def test_valid_base64_is_accepted(tmp_path: Path) -> None:
    """The counterpart of the base64 errors: the same field, well formed, goes through."""
    topic = str(tmp_path / "t")
    raw = bytes([0, 255, 254, 10])
    p = run_cli("produce", topic, input=jl({"key": "a", "value_b64": base64.b64encode(raw).decode()}))
    assert p.returncode == 0, p.stderr
    assert values(topic) == [raw]


def test_invalid_utf8_in_the_input_is_a_bad_record(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    src = tmp_path / "records.jsonl"
    src.write_bytes(jl({"key": "a", "value": "1"}, {"key": "b", "value": "2"}).encode()
                    + b'{"key": "c", "value": "\xff\xfe"}\n')
    p = run_cli("produce", topic, "--input", str(src))
    one_line_error(p, 2, f"{src}:3")
    assert values(topic) == [b"1", b"2"]


def test_lone_surrogate_in_a_record_is_a_bad_record(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    p = run_cli("produce", topic, input=jl({"key": "a", "value": "1"}) + '{"key": "\\ud800", "value": "2"}\n')
    one_line_error(p, 2, "<stdin>:2")
    assert values(topic) == [b"1"]


def test_event_time_out_of_range_is_a_bad_record(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    p = run_cli("produce", topic, input=jl({"key": "a", "value": "1"},
                                           {"key": "b", "value": "2", "event_time": 10 ** 30},
                                           {"key": "c", "value": "3"}))
    one_line_error(p, 2, "<stdin>:2", "event_time")
    assert values(topic) == [b"1"]


def test_missing_input_file(tmp_path: Path) -> None:
    topic = tmp_path / "t"
    missing = tmp_path / "no-such-file.jsonl"
    p = run_cli("produce", str(topic), "--input", str(missing))
    one_line_error(p, 2, str(missing))
    assert p.stdout == ""
    assert not topic.exists()
    p = run_cli("produce", str(topic), "--input", str(tmp_path))  # a folder, not a file
    one_line_error(p, 2, str(tmp_path))


# ------------------------------------------------------------------ corrupt data


def _topic_with_ledger(tmp_path: Path) -> tuple[str, Path, bytes]:
    topic = str(tmp_path / "t")
    with TopicWriter(topic, batch_size=4) as w:
        for i in range(12):
            w.append(f"k{i}", f"value-{i}")
    (ledger,) = sorted((tmp_path / "t" / "ledgers").glob("*.ledger"))
    meta = (tmp_path / "t" / "_meta" / "topic.json").read_bytes()
    return topic, ledger, meta


def test_bit_flip_in_a_ledger_object(tmp_path: Path) -> None:
    topic, ledger, meta = _topic_with_ledger(tmp_path)
    loc = resolve(str(ledger))
    f = LedgerFile.open(loc.store, loc.prefix)
    off = int(f.footer.col("e_offset")[0])
    data = bytearray(ledger.read_bytes())
    data[off + FRAME_HEADER.size + 5] ^= 0x10  # inside entry 1:0's payload
    ledger.write_bytes(bytes(data))
    p = run_cli("read", topic)
    one_line_error(p, 4, str(ledger), "entry 1:0", f"byte {off}", "checksum mismatch")
    assert p.stdout == ""
    # nothing was changed or removed by the failed read
    assert (tmp_path / "t" / "_meta" / "topic.json").read_bytes() == meta
    assert ledger.read_bytes() == bytes(data)
    assert sorted(x.name for x in (tmp_path / "t" / "ledgers").iterdir()) == [ledger.name]


def test_bit_flip_in_a_later_entry_prints_the_records_before_it(tmp_path: Path) -> None:
    topic, ledger, meta = _topic_with_ledger(tmp_path)
    loc = resolve(str(ledger))
    f = LedgerFile.open(loc.store, loc.prefix)
    off = int(f.footer.col("e_offset")[2])
    data = bytearray(ledger.read_bytes())
    data[off + FRAME_HEADER.size + 2] ^= 0x01
    ledger.write_bytes(bytes(data))
    p = run_cli("read", topic)
    one_line_error(p, 4, str(ledger), "entry 1:2")
    assert [json.loads(x)["value"] for x in p.stdout.splitlines()] == [f"value-{i}" for i in range(8)]
    assert (tmp_path / "t" / "_meta" / "topic.json").read_bytes() == meta


def test_truncated_ledger_object(tmp_path: Path) -> None:
    topic, ledger, meta = _topic_with_ledger(tmp_path)
    size = ledger.stat().st_size
    ledger.write_bytes(ledger.read_bytes()[:-25])
    p = run_cli("read", topic)
    one_line_error(p, 4, str(ledger), "truncated", f"size {size - 25}")
    assert p.stdout == ""
    # status reports the damaged topic (the one that needs attention) and names the object
    p = run_cli("status", topic, "--json")
    assert p.returncode == 0 and p.stderr.count("\n") == 1, p.stderr
    assert str(ledger) in p.stderr and "truncated" in p.stderr and f"size {size - 25}" in p.stderr
    assert json.loads(p.stdout)["damaged"][0]["object"] == f"ledgers/{ledger.name}"
    assert (tmp_path / "t" / "_meta" / "topic.json").read_bytes() == meta


def test_ledger_object_replaced_by_garbage(tmp_path: Path) -> None:
    topic, ledger, meta = _topic_with_ledger(tmp_path)
    ledger.write_bytes(b"\x00" * 10)
    p = run_cli("read", topic)
    one_line_error(p, 4, str(ledger), "10 bytes")
    assert (tmp_path / "t" / "_meta" / "topic.json").read_bytes() == meta


def test_missing_ledger_object(tmp_path: Path) -> None:
    topic, ledger, meta = _topic_with_ledger(tmp_path)
    ledger.unlink()
    p = run_cli("read", topic)
    assert p.returncode != 0
    one_line_error(p, p.returncode, str(ledger))
    assert (tmp_path / "t" / "_meta" / "topic.json").read_bytes() == meta


# ------------------------------------------------------------------------- help


@pytest.mark.parametrize("command", [[], ["produce"], ["read"], ["status"], ["compact"], ["gc"]])
def test_help_mentions_exit_codes(command: list[str]) -> None:
    p = run_cli(*command, "--help")
    assert p.returncode == 0, p.stderr
    assert "exit codes" in p.stdout
    assert "usage:" in p.stdout
    assert p.stderr == ""
