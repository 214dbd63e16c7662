"""Metadata documents edited by hand, damaged, or written by a hostile writer of the
same bucket: every command refuses them with exit 4 and one line naming the document
and the field, and nothing is deleted, changed or published on their strength.  Also:
one topic's failure never stops another's run, topics refuse to nest (and gc never
takes a nested topic for leftovers), credentials never reach the output, and a
truncation interrupted between its two writes is finished by the next one.

Commands run as real processes (``run_cli``) wherever exit codes and messages matter;
documents are edited round Shale (``tests/tamper.py``: file writes, or boto3
``put_object`` against the moto server).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.compactor import cli as compact_cli
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.conftest import make_root, run_cli
from tests.tamper import edit, read_raw, snapshot, write_raw

RECORD = '{"key": "z", "value": "new"}\n'
#: Python class names that must never reach an operator's one-line error.
CLASS_NAMES = ("Traceback", "TypeError", "RecursionError", "KeyError", "ValueError", "IndexError",
               "AttributeError", "OverflowError", "ValidationError", "DecodeError")
DEEP = 200_000
HOURS_3 = 3 * 3600


# ------------------------------------------------------------------------ helpers


def one_line(p: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """Exit ``code``, exactly one line on stderr holding every needle, no Python class name."""
    what = f"{p.args[1:]}: exit {p.returncode}, stdout {p.stdout[:500]!r}, stderr {p.stderr[:1000]!r}"
    assert p.returncode == code, what
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip() and p.stderr.endswith("\n"), f"not one line: {what}"
    for n in needles:
        assert n in lines[0], f"{n!r} not named: {what}"
    for name in CLASS_NAMES:
        assert name not in p.stderr, f"{name} shown: {what}"
    return lines[0]


def shale(*args: str, input: str | None = None, env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    if args[0] == "compact":  # the compact console script itself
        return run_cli(*args[1:], input=input, env=env, script="compact")
    return run_cli(*args, input=input, env=env)


def shale_many(*commands: tuple[str, ...], input: str | None = None) -> list[subprocess.CompletedProcess[str]]:
    """Run commands that must each refuse (and change nothing) side by side."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        return list(pool.map(lambda args: shale(*args, input=input), commands))


def append(uri: str, *pairs: tuple[str, str]) -> None:
    """One sealed ledger holding ``pairs``."""
    with TopicWriter(uri) as w:
        for k, v in pairs:
            w.append(k, v)


FIRST = (("k0", "v0"), ("k1", "v1"), ("k2", "v2"))
SECOND = (("k0", "v0b"), ("k3", "v3"))


def make_topic(uri: str) -> list[tuple[str, str]]:
    """Ledger 1, compacted (epoch 1), then ledger 2 above the horizon; returns every
    record as (key, value), in order."""
    append(uri, *FIRST)
    assert Compactor(uri, CompactionConfig()).run().status == "compacted"
    append(uri, *SECOND)
    return [*FIRST, *SECOND]


def records(p: subprocess.CompletedProcess[str]) -> list[tuple[str, str]]:
    assert p.returncode == 0, p.stderr
    return [(d["key"], d["value"]) for d in map(json.loads, p.stdout.splitlines())]


def replay(uri: str) -> list[tuple[str, str]]:
    with TopicReader(uri) as r:
        return [((m.key or b"").decode(), (m.value or b"").decode()) for m in r]


def topic_uri(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"{make_root(kind, request, tmp_path)}/topics/orders"


def doc(uri: str, name: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(read_raw(uri, f"_meta/{name}"))["value"]
    return value


# ------------------------------------------- 1. retired entries naming what is not retired


@pytest.mark.parametrize("kind, target", [
    ("local", "registered-ledger"), ("local", "topic.json"), ("local", "ledger-through-dot-dot"),
    pytest.param("s3", "registered-ledger", marks=pytest.mark.s3),
    pytest.param("s3", "topic.json", marks=pytest.mark.s3),
])
def test_a_retired_entry_naming_a_ledger_or_a_document_deletes_nothing(kind: str, target: str,
                                                                       request: pytest.FixtureRequest,
                                                                       tmp_path: Path) -> None:
    uri = topic_uri(kind, request, tmp_path)
    expected = make_topic(uri)
    ledger = TopicMetadata.open(uri).load_topic().ledgers[0].object
    run = doc(uri, "compaction.json")["compacted_ledger"]
    name = {"registered-ledger": ledger, "topic.json": "_meta/topic.json",
            "ledger-through-dot-dot": f"compacted/{run}/../../{ledger}"}[target]
    # retired long ago by the current epoch: due for deletion under any grace
    edit(uri, "compaction.json",
         lambda d: d["value"]["retired"].append({"objects": [name], "retired_ms": 0, "epoch": 1}))
    before = snapshot(uri)
    assert ledger in before and "_meta/topic.json" in before

    for p in shale_many(("compact", uri), ("gc", uri, "--grace", "0")):
        one_line(p, 4, "_meta/compaction.json", "retired[0].objects[0]")
        assert p.stdout == ""
    assert snapshot(uri) == before  # the ledger, topic.json and compaction.json, byte for byte
    assert records(shale("read", uri)) == expected


# ------------------------------------------------------------------ 2. duplicated parts


def _duplicate_part(d: dict[str, Any]) -> None:
    d["value"]["parts"].append(dict(d["value"]["parts"][0]))


def _same_object_twice(d: dict[str, Any]) -> None:
    """Two parts with disjoint ids that name one object: it would be read twice."""
    p0 = d["value"]["parts"][0]
    assert p0["first_id"] == "1:0:0" and p0["last_id"] == "1:0:2", p0
    d["value"]["parts"] = [{**p0, "last_id": "1:0:1", "records": 2},
                           {**p0, "first_id": "1:0:2", "last_id": "1:0:2", "records": 1, "entries": 1}]


@pytest.mark.parametrize("kind, change", [
    ("local", _duplicate_part), pytest.param("s3", _duplicate_part, marks=pytest.mark.s3),
    ("local", _same_object_twice),
], ids=["local-same-part-twice", "s3-same-part-twice", "local-same-object"])
def test_duplicated_parts_are_refused_and_nothing_is_published(kind: str, change: Callable[[dict[str, Any]], None],
                                                                request: pytest.FixtureRequest,
                                                                tmp_path: Path) -> None:
    uri = topic_uri(kind, request, tmp_path)
    make_topic(uri)
    edit(uri, "compaction.json", change)
    before = snapshot(uri)
    for p in shale_many(("compact", uri), ("read", uri, "--compacted"), ("verify", uri)):
        one_line(p, 4, "_meta/compaction.json", "parts[1]")
        assert p.stdout == "", p.args
    assert snapshot(uri) == before


# ------------------------------------------- 3 and 8. invalid documents, every command

Change = Callable[[dict[str, Any]], object]


def _value(**fields: object) -> Change:
    return lambda d: d["value"].update(fields)


def _ledger(i: int, **fields: object) -> Change:
    return lambda d: d["value"]["ledgers"][i].update(fields)


TAMPERS: list[tuple[str, str, Change, tuple[str, ...]]] = [
    ("ids-swapped", "topic.json", lambda d: d["value"]["ledgers"].reverse(), ("ledgers[1].id",)),
    ("id-minus-1", "topic.json", _ledger(0, id=-1), ("ledgers[0].id",)),
    ("id-null", "topic.json", _ledger(0, id=None), ("ledgers[0].id",)),
    ("ledgers-abc", "topic.json", _value(ledgers="abc"), ("ledgers",)),
    ("unknown-field", "topic.json", _value(surprise=1), ("surprise",)),
    ("deep-array", "topic.json", lambda d: "[" * DEEP + "]" * DEEP, ()),
    ("deep-array-in-value", "topic.json",
     lambda d: '{"version": 1, "value": {"format": 1, "created_ms": 1, "ledgers": ' + "[" * DEEP + "]" * DEEP + "}}",
     ()),
    ("not-json", "topic.json", lambda d: '{"version": 1, "value": {', ()),
    ("horizon-5", "compaction.json", _value(horizon=5), ("horizon",)),
    ("retired-objects-string", "compaction.json",
     lambda d: d["value"]["retired"].append({"objects": "compacted/000000000001-0123456789ab/part-00000.ledger",
                                             "retired_ms": 0, "epoch": 1}),
     ("retired[0].objects",)),
    ("epoch-2**64-1", "compaction.json", _value(epoch=2**64 - 1), ("epoch",)),
    ("version-0", "compaction.json", lambda d: d.update(version=0), ("version",)),
]
ON_S3 = {("ids-swapped", "topic.json"), ("deep-array", "topic.json"), ("horizon-5", "compaction.json")}


def _tamper_params() -> list[Any]:
    params = []
    for name, document, change, needles in TAMPERS:
        for kind in ("local", "s3") if (name, document) in ON_S3 else ("local",):
            marks = [pytest.mark.s3] if kind == "s3" else []
            params.append(pytest.param(kind, document, change, needles, marks=marks,
                                       id=f"{kind}-{document.split('.')[0]}-{name}"))
    return params


@pytest.mark.parametrize("kind, document, change, needles", _tamper_params())
def test_an_invalid_document_is_refused_by_every_command(kind: str, document: str, change: Change,
                                                         needles: tuple[str, ...], request: pytest.FixtureRequest,
                                                         tmp_path: Path) -> None:
    uri = topic_uri(kind, request, tmp_path)
    expected = make_topic(uri)
    edit(uri, document, change)
    before = snapshot(uri)
    other = ({"topic.json", "compaction.json"} - {document}).pop()
    # Plain reads and producers use only topic.json (producers and compactors never
    # share a document); compaction.json is read by everything else, and by --compacted.
    read = ("read", uri) if document == "topic.json" else ("read", uri, "--compacted")
    commands = [read, ("status", uri), ("compact", uri), ("verify", uri), ("gc", uri, "--grace", "0")]
    if document == "topic.json":
        commands.append(("produce", uri))
    for p in shale_many(*commands, input=RECORD):
        line = one_line(p, 4, f"_meta/{document}", *needles)
        assert other not in line, line
        assert p.stdout == "", p.args
    assert snapshot(uri) == before  # nothing deleted or changed, and produce registered nothing
    if document == "compaction.json":
        # ... so a damaged compaction state stops neither the full replay nor producers
        # (in-process here: the commands' exit codes are checked above), and they leave
        # it as it is.
        assert replay(uri) == expected
        append(uri, ("z", "new"))
        assert replay(uri) == [*expected, ("z", "new")]
        assert read_raw(uri, "_meta/compaction.json") == before["_meta/compaction.json"]


# ---------------------------------------------- 4. one topic's failure, another's run


def _two_topics(tmp_path: Path) -> tuple[str, str]:
    a, b = str(tmp_path / "A"), str(tmp_path / "B")
    append(a, ("a", "1"))
    assert Compactor(a, CompactionConfig()).run().status == "compacted"
    append(a, ("a", "2"))
    append(b, ("b", "1"), ("b", "2"))
    return a, b


def _by_topic(stdout: str) -> dict[str, dict[str, Any]]:
    lines = [json.loads(x) for x in stdout.splitlines()]
    assert len(lines) == 3 and "topic" not in lines[-1], stdout  # the two topics, then the run's last line
    return {Path(d["topic"]).name: d for d in lines[:-1]}


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_an_invalid_state_of_one_topic_does_not_stop_the_next(tmp_path: Path, parallel: str) -> None:
    a, b = _two_topics(tmp_path)
    edit(a, "compaction.json", _value(epoch="1"))
    a_before = snapshot(a)
    p = shale("compact", a, b, "--json", "--parallel", parallel)
    assert p.returncode == 7, (p.stdout, p.stderr)  # one failed, the other was compacted
    got = _by_topic(p.stdout)
    assert got["A"]["status"] == "error" and got["A"]["exit_code"] == 4, got["A"]
    assert f"{a}/_meta/compaction.json" in got["A"]["error"] and "epoch" in got["A"]["error"], got["A"]
    assert got["B"]["status"] == "compacted" and got["B"]["epoch"] == 1, got["B"]
    assert doc(b, "compaction.json")["epoch"] == 1
    assert snapshot(a) == a_before
    errors = [x for x in p.stderr.splitlines() if "compaction.json" in x]
    assert len(errors) == 1 and not any(n in p.stderr for n in CLASS_NAMES), p.stderr


FAILURES: list[Any] = [
    pytest.param(lambda: OSError(errno.ENOSPC, "No space left on device", "/x/part"), ("no space left", "/x/part"), 1,
                 id="ENOSPC"),
    pytest.param(lambda: PermissionError(errno.EACCES, "Permission denied", "/x/part"),
                 ("permission denied", "/x/part"), 2, id="EACCES"),
    pytest.param(lambda: TypeError("boom"), ("boom",), 1, id="TypeError"),
    pytest.param(lambda: TypeError("boom\n  and a second line"), ("boom", "and a second line"), 1,
                 id="TypeError-two-lines"),
]


@pytest.mark.parametrize("parallel", ["1", "2"])
@pytest.mark.parametrize("failure, needles, code", FAILURES)
def test_any_failure_of_one_topic_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str], failure: Callable[[], Exception],
                                             needles: tuple[str, ...], code: int, parallel: str) -> None:
    a, b = _two_topics(tmp_path)
    real = Compactor.run

    def run(self: Compactor) -> Any:
        if Path(self.meta.uri).name == "A":
            raise failure()
        return real(self)

    monkeypatch.setattr(Compactor, "run", run)
    assert compact_cli.main([a, b, "--json", "--parallel", parallel]) == 7  # one failed, the other completed
    out, err = capsys.readouterr()
    got = _by_topic(out)
    assert got["A"]["status"] == "error" and got["A"]["exit_code"] == code, got["A"]
    error = got["A"]["error"]
    assert "\n" not in error and all(n in error.lower() for n in needles), error
    assert got["B"]["status"] == "compacted" and doc(b, "compaction.json")["epoch"] == 1, got["B"]
    assert "Traceback" not in err
    shown = [x for x in err.splitlines() if "boom" in x or "/x/part" in x]
    assert len(shown) == 1, err


# ------------------------------------------------------------------------ 5. nesting


@pytest.mark.parametrize("kind, inner", [
    ("local", "compacted/inner"), ("local", "ledgers/inner2"), ("local", "_meta/x"),
    pytest.param("s3", "compacted/inner", marks=pytest.mark.s3),
])
def test_a_topic_inside_a_topic_is_refused(kind: str, inner: str, request: pytest.FixtureRequest,
                                           tmp_path: Path) -> None:
    nest = topic_uri(kind, request, tmp_path)
    assert shale("produce", nest, input=RECORD).returncode == 0
    before = snapshot(nest)
    p = shale("produce", f"{nest}/{inner}", input=RECORD)
    one_line(p, 2, "would lie inside the topic", nest)
    assert p.stdout == ""
    assert snapshot(nest) == before


def test_a_topic_around_a_topic_is_refused(disk_topic_uri: str) -> None:
    outer = disk_topic_uri
    inner = f"{outer}/sub/t"
    assert shale("produce", inner, input=RECORD).returncode == 0
    before = snapshot(outer)
    p = shale("produce", outer, input=RECORD)
    one_line(p, 2, "lies inside it", inner)
    assert snapshot(outer) == before and "_meta/topic.json" not in before


def _age(root: Path, seconds: float) -> None:
    then = time.time() - seconds
    for path in root.rglob("*"):
        os.utime(path, (then, then), follow_symlinks=False)


def test_gc_never_takes_a_nested_topic_or_a_strangers_file_for_an_orphan(tmp_path: Path) -> None:
    source = str(tmp_path / "source")
    expected = make_topic(source)
    nest = tmp_path / "nest"
    assert shale("produce", str(nest), input=RECORD).returncode == 0
    # as an older Shale allowed: whole topics inside the nest's own folders
    shutil.copytree(source, nest / "compacted" / "inner")
    shutil.copytree(source, nest / "ledgers" / "inner2")
    ledger = TopicMetadata.open(str(nest)).load_topic().ledgers[0].object
    strangers = {"ledgers/notes.txt": b"notes", "ledgers/00000000000000000099-zzz.ledger": b"not ours",
                 "compacted/x/part-00000.ledger": b"not ours either"}
    for rel, data in strangers.items():
        (nest / rel).parent.mkdir(parents=True, exist_ok=True)
        (nest / rel).write_bytes(data)
    orphan = "ledgers/00000000000000000099-0123456789ab.ledger"
    shutil.copyfile(nest / ledger, nest / orphan)  # correctly named, never registered
    _age(nest, HOURS_3)
    before = snapshot(str(nest))
    assert len([n for n in before if n.startswith(("compacted/inner/", "ledgers/inner2/"))]) >= 2 * 4

    p = shale("gc", str(nest), "--orphan-grace", "15m", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["deleted"] == [orphan]
    after = snapshot(str(nest))
    assert after == {n: data for n, data in before.items() if n != orphan}

    p = shale("compact", str(nest), "--orphan-grace", "15m")  # a compaction's gc as well
    assert p.returncode == 0, p.stderr
    after_compact = snapshot(str(nest))
    assert {n: after_compact.get(n) for n in after if n != "_meta/compaction.json"} == \
        {n: data for n, data in after.items() if n != "_meta/compaction.json"}
    assert records(shale("read", str(nest / "compacted" / "inner"))) == expected
    assert records(shale("read", str(nest / "ledgers" / "inner2"))) == expected


# ------------------------------------------------------------------------ 6. secrets

SECRET_URIS = [
    pytest.param("s3://AKIAKEY:SUPERSECRET@bucket/t", ("AKIAKEY", "SUPERSECRET"), id="key-secret"),
    # AWS's documented example: secret access keys hold '/' and '+'
    pytest.param("s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY@bucket/t",
                 ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "K7MDENG", "bPxRfiCYEXAMPLEKEY"), id="secret-with-slash"),
    pytest.param("s3://AKIAKEY:pa55@w0rd@bucket/t", ("AKIAKEY", "pa55", "w0rd"), id="secret-with-at-sign"),
]
# no real AWS, ever: a dead endpoint and no instance metadata
NO_AWS = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_EC2_METADATA_DISABLED": "true",
          "AWS_ACCESS_KEY_ID": "env-key-id", "AWS_SECRET_ACCESS_KEY": "env-secret"}


KEY_SECRET = SECRET_URIS[0].values
EVERY_COMMAND = [("compact", "{U}", "--json"), ("read", "{U}"), ("status", "{U}"), ("produce", "{U}"),
                 ("gc", "{U}"), ("verify", "{U}"), ("truncate", "{U}", "--before-ledger", "2"), ("compact", "{U}"),
                 ("read", "/tmp/shale-no-such-topic", "--metadata", "{U}")]


def _secret_params() -> list[Any]:
    def name(args: tuple[str, ...]) -> str:
        return "-".join(a for a in args if a != "{U}" and "/" not in a)

    params = [pytest.param(*KEY_SECRET, args, id=f"key-secret-{name(args)}") for args in EVERY_COMMAND]
    for p in SECRET_URIS[1:]:  # the brief's commands for the other shapes of secret
        params += [pytest.param(*p.values, args, id=f"{p.id}-{name(args)}") for args in EVERY_COMMAND[:2]]
    return params


@pytest.mark.parametrize("uri, secrets, args", _secret_params())
def test_a_uri_carrying_credentials_is_refused_and_never_shown(uri: str, secrets: tuple[str, ...],
                                                               args: tuple[str, ...]) -> None:
    p = shale(*[uri if a == "{U}" else a for a in args], input=RECORD, env=NO_AWS)
    leaked = [s for s in secrets if s in p.stdout + p.stderr]
    assert not leaked, f"{leaked} shown: exit {p.returncode}, stdout {p.stdout!r}, stderr {p.stderr!r}"
    one_line(p, 2, "carries credentials")
    if "--json" in args:
        (line,) = p.stdout.splitlines()
        d = json.loads(line)
        assert d["status"] == "error" and d["exit_code"] == 2 and "carries credentials" in d["error"], d
    else:
        assert p.stdout == ""


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_bad_pushgateway_url_is_a_usage_error_before_any_work(tmp_path: Path, how: str) -> None:
    topic = str(tmp_path / "t")
    append(topic, ("a", "1"), ("a", "2"))
    before = snapshot(topic)
    url = "http://u:pw-123@127.0.0.1:99999/"
    p = (shale("compact", topic, "--pushgateway", url) if how == "flag"
         else shale("compact", topic, env={"SHALE_PUSHGATEWAY": url}))
    assert "pw-123" not in p.stdout + p.stderr, (p.stdout, p.stderr)
    one_line(p, 2, "99999")
    assert p.stdout == ""
    assert snapshot(topic) == before  # nothing compacted


def test_an_unreachable_pushgateway_is_a_warning_without_its_password(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    append(topic, ("a", "1"), ("a", "2"))
    p = shale("compact", topic, "--pushgateway", "http://u:pw-123@127.0.0.1:9/", "--json")
    assert p.returncode == 0, p.stderr
    assert "pw-123" not in p.stdout + p.stderr, (p.stdout, p.stderr)
    assert json.loads(p.stdout)["status"] == "compacted"
    assert doc(topic, "compaction.json")["epoch"] == 1
    warnings = [x for x in p.stderr.splitlines() if "could not push" in x]
    assert len(warnings) == 1 and "127.0.0.1:9" in warnings[0], p.stderr


# ---------------------------------------------------- 7. an interrupted truncation


def test_truncate_finishes_a_truncation_killed_between_its_two_writes(disk_topic_uri: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    uri = disk_topic_uri
    for i in range(3):
        append(uri, (f"k{i}", f"v{i}"))
    assert Compactor(uri, CompactionConfig()).run().status == "compacted"
    real = TopicMetadata._stamp_generation
    calls: list[int] = []

    def killed_first_time(self: TopicMetadata, generation: int, attempts: int) -> None:
        calls.append(generation)
        if len(calls) == 1:
            raise SystemExit("killed between the two writes")
        real(self, generation, attempts)

    monkeypatch.setattr(TopicMetadata, "_stamp_generation", killed_first_time)
    with pytest.raises(SystemExit):
        TopicMetadata.open(uri).truncate(2)
    meta = TopicMetadata.open(uri)
    topic = meta.load_topic()
    assert [lg.id for lg in topic.ledgers] == [2, 3] and topic.generation == 1
    state = meta.load_compaction()
    assert state.topic_generation < topic.generation and state.epoch == 1

    p = shale("truncate", uri, "--before-ledger", "2", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["removed"] == []
    assert doc(uri, "compaction.json")["topic_generation"] == doc(uri, "topic.json")["generation"] == 1
    assert doc(uri, "compaction.json")["epoch"] == 1


def test_tamper_helper_round_trips(disk_topic_uri: str) -> None:
    """The helper writes exactly what it is given (the cases above rely on it)."""
    uri = disk_topic_uri
    append(uri, ("a", "1"))
    write_raw(uri, "_meta/topic.json", b"{}")
    assert read_raw(uri, "_meta/topic.json") == b"{}" and snapshot(uri)["_meta/topic.json"] == b"{}"
