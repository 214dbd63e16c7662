"""What the commands say and how they fail, as a new user meets it: a bad URI or value is
bad usage naming it (exit 2), the same state is said in the same words by every
command, counts are in the plural only when they are not 1, and what a run shows while
it works agrees with what it reports at the end.  Each case runs the command in process
(``main(argv)``)."""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import pytest

from shale.compactor import CompactionConfig, Compactor
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from tests.conftest import run_cli
from tests.needs import need_module


def run(capsys: pytest.CaptureFixture[str], *argv: str, script: str = "shale") -> tuple[int, str, str]:
    """``script argv...`` in this process: its exit code, output and errors."""
    from shale.cli import main
    from shale.compactor.cli import main as compact

    code = (compact if script == "compact" else main)(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def produce(uri: str, n: int, *, first: int = 0, keys: int = 50, value: str = "v", tombstone_every: int = 0,
            batch_size: int = 100) -> None:
    with TopicWriter(uri, batch_size=batch_size) as w:
        for i in range(first, first + n):
            w.append(f"k{i % keys}", None if tombstone_every and i % tombstone_every == 0 else f"{value}{i}")


def one_line(err: str, *needles: str) -> str:
    assert err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)
    return err


# ------------------------------------------------------------------ bad input is exit 2


@pytest.mark.parametrize("argv", [
    ("read", "s3:/bucket/x"), ("status", "s3:/bucket/x"), ("gc", "/tmp/t", "--metadata", "s3:/bucket/x"),
    ("compact", "s3:/bucket/x"), ("compact", "--all", "s3:/bucket/x"), ("topics", "s3:/bucket/x"),
])
def test_a_uri_with_one_slash_is_bad_usage_naming_it(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    one_line(err, "s3:/bucket/x")


@pytest.mark.parametrize("uri", ["ftp://x/y", "webhdfs://x/y"])
def test_a_filesystem_a_uri_alone_cannot_open_is_one_line(uri: str) -> None:
    """fsspec knows the scheme but its filesystem needs settings a URI does not give (a
    host): one line naming the scheme, exit 2, and nothing of the half-made filesystem's
    own complaints (FTP's finalizer raises) or of Python's names."""
    r = run_cli("read", uri)
    assert r.returncode == 2 and r.stdout == ""
    one_line(r.stderr, f"{uri.split('/')[0]}// storage cannot be opened")
    assert not any(word in r.stderr for word in ("Error", "Exception", "FileSystem", "__")), r.stderr


def test_exports_compression_is_checked_and_read_from_a_variable_of_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    need_module("pyarrow")
    topic, out = str(tmp_path / "t"), tmp_path / "t.parquet"
    produce(topic, 20)
    code, _, err = run(capsys, "export", topic, str(out), "--compression", "zstd:3")
    assert code == 2 and not out.exists()
    one_line(err, "--compression", "'zstd:3'", "zstd, lz4, snappy, none")
    code, _, err = run(capsys, "export", topic, str(out), "--format", "arrow", "--compression", "snappy")
    assert code == 2 and not out.exists()
    one_line(err, "--compression", "'snappy'", "zstd, lz4, none")
    # produce's and compact's codec, set for them in the environment, is not export's
    monkeypatch.setenv("SHALE_COMPRESSION", "zstd:3")
    monkeypatch.setenv("SHALE_FORMAT", "csv")
    code, _, err = run(capsys, "export", topic, str(out))
    assert code == 0 and err == "" and out.exists()
    monkeypatch.setenv("SHALE_EXPORT_COMPRESSION", "zstd:3")
    code, _, err = run(capsys, "export", topic, str(tmp_path / "u.parquet"))
    assert code == 2
    one_line(err, "SHALE_EXPORT_COMPRESSION", "zstd, lz4, snappy, none")


@pytest.mark.parametrize("argv", [("read",), ("status",), ("verify",), ("compact",), ("config",), ("produce",)])
def test_a_file_given_as_a_topic_is_bad_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             argv: tuple[str, ...]) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a topic\n")
    code, _, err = run(capsys, *argv, str(path))
    assert code == 2
    one_line(err, str(path), "not a topic")
    assert path.read_text() == "not a topic\n"


def test_a_part_size_below_its_least_names_the_flag_or_the_variable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    topic = str(tmp_path / "t")
    produce(topic, 20)
    code, _, err = run(capsys, topic, "--max-part-bytes", "1000", script="compact")
    assert code == 2 and "chunk bytes" not in err
    one_line(err, "--max-part-bytes", "'1000'", "64KiB")
    monkeypatch.setenv("SHALE_MAX_PART_BYTES", "1000")
    code, _, err = run(capsys, topic, script="compact")
    assert code == 2
    one_line(err, "SHALE_MAX_PART_BYTES", "64KiB")
    assert not (tmp_path / "t" / "compacted").exists()


def test_a_flag_a_command_does_not_take_points_at_that_commands_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "read", "/tmp/t", "--compact")
    assert code == 2
    one_line(err, "--compact", "(see shale read --help)")


# ------------------------------------------------------------------- the same words


def test_verify_says_never_compacted_as_status_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topic = str(tmp_path / "t")
    produce(topic, 20)
    code, verified, _ = run(capsys, "verify", topic)
    assert code == 0 and "never compacted" in verified and "None" not in verified
    code, status, _ = run(capsys, "status", topic)
    assert code == 0 and "never compacted" in status


#: A count of one with its noun in the plural.
_ONE_PLURAL = re.compile(r"(?<![\d,.])1 (?:\w+ )?(?:records|tombstones|frames|keys|ledgers|parts|entries|objects|"
                         r"bytes|rows|topics|leftovers)\b")


def test_counts_of_one_are_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topic, lines = str(tmp_path / "t"), tmp_path / "one.jsonl"
    lines.write_text('{"key": "a", "value": null}\n')
    texts = [run(capsys, "produce", topic, "--input", str(lines))[1]]
    texts.append(run(capsys, "compact", topic)[1])
    texts.append(run(capsys, "status", topic)[1])
    texts.append(run(capsys, "verify", topic)[1])
    texts.append(run(capsys, "verify", topic, "--scrub")[1])
    texts.append(run(capsys, "gc", topic, "--dry-run")[1])
    texts.append(run(capsys, "produce", topic, "--input", str(lines))[1])  # one record above the horizon
    code, _, err = run(capsys, "truncate", topic, "--before-ledger", "3")
    assert code == 2
    texts.append(err)
    texts.append(run(capsys, "truncate", topic, "--before-ledger", "2", "--dry-run")[1])
    for text in texts:
        assert text and not _ONE_PLURAL.search(text), text
    assert "would lose 1 record " in err


def test_pass_two_shows_the_records_its_summary_reports(tmp_path: Path) -> None:
    """The progress line and the summary count the same records: those the run keeps,
    written anew or kept in place in a previous part."""
    topic = str(tmp_path / "t")
    produce(topic, 4000, keys=2000)
    config = CompactionConfig(reuse_min_bytes=0)  # a previous part is kept in place however small
    assert Compactor(topic, config).run().status == "compacted"
    produce(topic, 100, first=4000, keys=2000)
    phases: list[str] = []
    s = Compactor(topic, config, progress=phases.append).run()
    assert s.status == "compacted" and s.records_reused > 0 and s.records_written > 0
    kept = s.records_written + s.records_reused
    [pass_two] = [p for p in phases if p.startswith("pass two")]
    assert pass_two == f"pass two: keeping {kept:,} records"
    text = s.human()
    assert f"kept {kept:,} records: wrote {s.records_written:,} (" in text
    assert f"{s.records_reused:,} kept in place" in text


def test_a_dry_run_and_a_run_say_what_the_bytes_they_read_are(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A dry run reads footers only; a run also reads the entries it keeps: each says so,
    and the footers are the same figure in both."""
    topic = str(tmp_path / "t")
    with TopicWriter(topic, batch_size=100) as w:
        for i in range(3000):  # values that do not compress: the entries outweigh the footers
            w.append(f"k{i}", base64.b64encode(os.urandom(1500)).decode())
    code, dry, _ = run(capsys, topic, "--dry-run", script="compact")
    assert code == 0
    code, real, _ = run(capsys, topic, script="compact")
    assert code == 0
    footers = [re.search(r"\(([\d.]+) MB of footers", text) for text in (dry, real)]
    assert all(footers) and footers[0].group(1) == footers[1].group(1), (dry, real)  # type: ignore[union-attr]
    entries = re.search(r"and ([\d.]+) MB of entries", real)
    assert entries and float(entries.group(1)) > 4.0, real
    assert "read the footers of 3,000 records" in dry and "reads the entries" in dry


def test_truncate_by_a_rule_says_which_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topic = str(tmp_path / "t")
    produce(topic, 20)
    code, out, _ = run(capsys, "truncate", topic, "--older-than", "30d", "--dry-run")
    assert code == 0 and "--older-than 30d" in out and "no ledger below" not in out, out
    code, out, _ = run(capsys, "truncate", topic, "--keep-bytes", "1GB", "--json")
    assert code == 0 and json.loads(out)["removed"] == []


# ----------------------------------------------------------------- --print-config


def test_print_config_shows_what_the_topics_policy_sets(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    topic = str(tmp_path / "t")
    produce(topic, 20)
    assert run(capsys, "config", topic, "--set", "compression=zstd:3", "--set", "delete-retention=1h")[0] == 0
    monkeypatch.setenv("SHALE_COMPRESSION", "lz4")  # a variable: the policy wins over it
    code, out, _ = run(capsys, "--print-config", topic, "--delete-retention", "2h", script="compact")
    assert code == 0
    doc = json.loads(out)
    settings = doc["settings"]
    assert settings["--compression"] == {"value": "zstd:3", "source": "policy", "variable": "SHALE_COMPRESSION"}
    assert settings["--delete-retention"]["value"] == 7_200_000 and settings["--delete-retention"]["source"] == "flag"
    assert settings["--gc-grace"]["source"] == "default"
    policy = doc["policies"][topic]
    assert policy["--compression"]["source"] == "policy" and policy["--delete-retention"]["source"] == "flag"
    # several topics: the run's own values, and each topic's policy beside them
    code, out, _ = run(capsys, "--print-config", topic, str(tmp_path / "other"), script="compact")
    doc = json.loads(out)
    assert doc["settings"]["--compression"] == {"value": "lz4", "source": "env", "variable": "SHALE_COMPRESSION"}
    assert doc["policies"][topic]["--compression"]["value"] == "zstd:3"
    assert doc["policies"][str(tmp_path / "other")] == {}
    assert TopicMetadata.open(topic).load_compaction().version == 0  # nothing ran
