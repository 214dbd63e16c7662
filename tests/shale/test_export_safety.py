"""``shale export`` writes only where it may: never inside a topic (the source, another
one, a nested one), never over anything but a regular file, and over that only with
``--overwrite``; ``-`` and ``/dev/stdout`` stream to standard output; a killed export's
temporary file is removed by the next export into the folder, and nothing else is.

Locally and on S3 (a real moto server over HTTP); the commands run as real processes
where what they print or how they die matters, in-process (``run_command``) where a
test runs many of them.
"""

from __future__ import annotations

import io
import json
import os
import pty
import signal
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from shale.cli import build_parser, run_command
from shale.cli.errors import exit_code_of
from shale.compactor import CompactionConfig, Compactor
from shale.export import export_topic
from shale.ledger.errors import InvalidInputError, OutputExistsError
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.conftest import ROOT, run_cli
from tests.craft import snapshot, snapshot_diff
from tests.needs import need_module

pa = need_module("pyarrow")
pq = need_module("pyarrow.parquet")


def _topic(uri: str, records: int = 60) -> None:
    """Three ledgers compacted (a part, a compaction state), then one more above the horizon."""
    with TopicWriter(uri, max_ledger_records=20, batch_size=5) as w:
        for i in range(records):
            w.append(f"k{i % 15}", f"v{i}")
    Compactor(uri, CompactionConfig(delete_retention_ms=0)).run()
    with TopicWriter(uri, batch_size=5) as w:
        for i in range(7):
            w.append(f"k{i}", f"late-{i}")


def _cli(*args: str) -> tuple[int, str, str]:
    """``shale ARGS`` in this process: exit code, standard output, standard error."""
    out, err = io.StringIO(), io.StringIO()
    code = run_command(list(args), build_parser(), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def _state(uri: str) -> Any:
    """Everything around a topic: the test folder's files, folders and links (bytes and
    targets), or the bucket's objects (bytes) and unfinished multipart uploads."""
    if _is_s3(uri):
        import boto3

        bucket = uri.removeprefix("s3://").split("/", 1)[0]
        client = boto3.client("s3", region_name="us-east-1")
        keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
                for o in page.get("Contents", [])]
        uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        return ({k: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys},
                sorted(u["Key"] for u in uploads))
    return snapshot(Path(uri).parents[1])


def _one_line_refusal(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def _topic_still_works(uri: str) -> None:
    for args in (("read", uri), ("read", uri, "--table"), ("verify", uri), ("status", uri)):
        r = run_cli(*args)
        assert r.returncode == 0, (args, r.stderr)
    r = run_cli("compact", uri, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "compacted", r.stdout + r.stderr
    assert run_cli("verify", uri).returncode == 0


# ------------------------------------------------------------------ inside a topic

def test_export_over_the_topic_it_reads_is_refused_and_the_topic_stays_whole(disk_topic_uri: str) -> None:
    """The issue's reproduction: OUT = the topic's metadata documents, a registered
    ledger (the only copy of its records), a compacted part, the topic's folder and a
    new name in it, with and without --overwrite, in every format."""
    uri = disk_topic_uri
    _topic(uri)
    meta = TopicMetadata.open(uri)
    ledger = meta.load_topic().ledgers[0].object
    part = meta.load_compaction().parts[0].object
    before = _state(uri)
    outs = [f"{uri}/_meta/topic.json", f"{uri}/_meta/compaction.json", f"{uri}/{ledger}", f"{uri}/{part}",
            f"{uri}/export.parquet", f"{uri}/ledgers/new.jsonl", uri]
    for out in outs:
        for flags in ((), ("--overwrite",), ("--format", "jsonl", "--overwrite"), ("--table", "--format", "arrow")):
            code, _, err = _cli("export", uri, out, *flags)
            _one_line_refusal(code, err, "inside the topic", meta.uri, "export never writes into a topic")
    # as a real process too, the issue's own command line
    r = run_cli("export", uri, f"{uri}/_meta/topic.json", "--format", "jsonl")
    _one_line_refusal(r.returncode, r.stderr, f"{uri}/_meta/topic.json", "inside the topic")
    assert _state(uri) == before  # byte for byte, nothing created, no upload left
    _topic_still_works(uri)


def test_export_into_another_topics_layout_is_refused(disk_topic_uri: str, tmp_path: Path) -> None:
    """Another topic beside the source, one nested inside it by hand, and names shaped as
    a topic's objects where no topic is registered."""
    source = disk_topic_uri
    _topic(source, records=20)
    root = source.rsplit("/", 2)[0]
    other = f"{root}/topics/other"
    _topic(other, records=20)
    # a topic moved by hand into a folder of `other` (creating it there is refused)
    stray = f"{root}/stray/inner"
    _topic(stray, records=20)
    nested = f"{other}/sub/inner"
    _move(stray, nested)
    meta = TopicMetadata.open(other)
    ledger = meta.load_topic().ledgers[-1].object
    part = meta.load_compaction().parts[0].object
    before = _state(source)
    for out, named in [(f"{other}/_meta/topic.json", other), (f"{other}/_meta/compaction.json", other),
                       (f"{other}/{ledger}", other), (f"{other}/{part}", other), (f"{other}/x.parquet", other),
                       (f"{other}/sub/x.parquet", other), (f"{nested}/_meta/topic.json", nested),
                       (f"{nested}/ledgers/y.parquet", nested), (f"{nested}/deeper/z.parquet", nested)]:
        for flags in ((), ("--overwrite",)):
            code, _, err = _cli("export", source, out, *flags)
            _one_line_refusal(code, err, _canonical(out), "inside the topic", _canonical(named))
    for out in [f"{root}/elsewhere/ledgers/00000000000000000001-0123456789ab.ledger",
                f"{root}/elsewhere/compacted/000000000001-0123456789ab/part-00000.ledger",
                f"{root}/elsewhere/compacted/000000000001-0123456789ab/x.parquet",
                f"{root}/elsewhere/dictionaries/0000000001-0123456789ab.zdict",
                f"{root}/elsewhere/_meta/x.parquet", f"{root}/elsewhere/.shale-lock-topic.json"]:
        code, _, err = _cli("export", source, out, "--overwrite")
        _one_line_refusal(code, err, "named as Shale names a topic's own objects")
    assert _state(source) == before
    _topic_still_works(nested)
    # a new file beside the topics is written
    assert _cli("export", source, f"{root}/topics-export.parquet")[0] == 0


@pytest.mark.s3
def test_export_into_a_topic_at_a_bucket_root_is_refused(s3_bucket: str, tmp_path: Path) -> None:
    """A topic's objects at a bucket's root (``_meta/topic.json`` at the top: a topic
    copied there whole, as ``aws s3 sync s3://a/t s3://b`` does; Shale itself creates no
    topic at a root): no export goes anywhere in that bucket, at its top or in any folder,
    with or without ``--overwrite``, and the bucket stays as it was."""
    import boto3

    root = f"s3://{s3_bucket}"
    _topic(f"{root}/t", records=20)
    client = boto3.client("s3", region_name="us-east-1")
    for o in client.list_objects_v2(Bucket=s3_bucket, Prefix="t/")["Contents"]:
        client.copy_object(Bucket=s3_bucket, Key=o["Key"].removeprefix("t/"),
                           CopySource={"Bucket": s3_bucket, "Key": o["Key"]})
        client.delete_object(Bucket=s3_bucket, Key=o["Key"])
    assert client.head_object(Bucket=s3_bucket, Key="_meta/topic.json")
    source = str(tmp_path / "src")
    _topic(source, records=20)
    before = _state(root)
    for out in (f"{root}/x.parquet", f"{root}/exports/2024/x.parquet", f"{root}/ledgers/x.jsonl"):
        for flags in ((), ("--overwrite",)):
            code, _, err = _cli("export", source, out, *flags)
            _one_line_refusal(code, err, f"{out}: is inside the topic {root}", "_meta/topic.json")
    assert _state(root) == before


def _canonical(uri: str) -> str:
    return uri if _is_s3(uri) else os.path.realpath(uri)


def _move(src: str, dst: str) -> None:
    if not _is_s3(src):
        Path(dst).parent.mkdir(parents=True)
        os.rename(src, dst)
        return
    import boto3

    bucket, prefix = src.removeprefix("s3://").split("/", 1)
    new_prefix = dst.removeprefix(f"s3://{bucket}/")
    client = boto3.client("s3", region_name="us-east-1")
    for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]:
        new_key = new_prefix + o["Key"][len(prefix):]
        client.copy_object(Bucket=bucket, Key=new_key, CopySource={"Bucket": bucket, "Key": o["Key"]})
        client.delete_object(Bucket=bucket, Key=o["Key"])


def test_export_into_the_metadata_folder_is_refused(tmp_path: Path) -> None:
    uri, metadata = str(tmp_path / "t"), str(tmp_path / "meta")
    with TopicWriter(uri, metadata_uri=metadata) as w:
        w.append("k", "v")
    docs = sorted(p for p in Path(metadata).rglob("*") if p.is_file())
    before = snapshot(tmp_path)
    for out in [*map(str, docs), f"{metadata}/x.parquet", f"{metadata}/file/y.jsonl"]:
        code, _, err = _cli("export", uri, out, "--metadata", metadata, "--overwrite")
        _one_line_refusal(code, err, "metadata")
    assert snapshot_diff(before, snapshot(tmp_path)) == []


# ------------------------------------------------------------------ what stands at OUT

def test_an_existing_output_is_replaced_only_with_overwrite(disk_topic_uri: str, tmp_path: Path) -> None:
    uri = disk_topic_uri
    _topic(uri, records=20)
    out = (f"{uri.rsplit('/', 2)[0]}/exports/view.parquet" if _is_s3(uri) else str(tmp_path / "view.parquet"))
    _put(out, b"precious")
    code, _, err = _cli("export", uri, out)
    _one_line_refusal(code, err, out, "already exists", "--overwrite")
    assert _get(out) == b"precious"
    code, _, err = _cli("export", uri, out, "--overwrite", "--compacted")
    assert code == 0, err
    assert pq.read_table(io.BytesIO(_get(out))).num_rows == len(TopicReader(uri, read_compacted=True).read())
    if _is_s3(uri):  # a "folder" on S3: objects under OUT/
        code, _, err = _cli("export", uri, out.rsplit("/", 1)[0], "--overwrite")
        _one_line_refusal(code, err, "is a folder")
        code, _, err = _cli("export", uri, out.rsplit("/", 1)[0] + "/")
        _one_line_refusal(code, err, "names a folder")


def _put(uri: str, data: bytes) -> None:
    if _is_s3(uri):
        import boto3

        bucket, key = uri.removeprefix("s3://").split("/", 1)
        boto3.client("s3", region_name="us-east-1").put_object(Bucket=bucket, Key=key, Body=data)
    else:
        Path(uri).write_bytes(data)


def _get(uri: str) -> bytes:
    if _is_s3(uri):
        import boto3

        bucket, key = uri.removeprefix("s3://").split("/", 1)
        return bytes(boto3.client("s3", region_name="us-east-1").get_object(Bucket=bucket, Key=key)["Body"].read())
    return Path(uri).read_bytes()


def test_an_output_that_appears_meanwhile_is_never_replaced(disk_topic_uri: str, tmp_path: Path) -> None:
    """Without --overwrite the export is published create-only: a file or object that
    appears while it is written stays, and the export fails in one line (exit 2) leaving
    nothing of its own behind."""
    uri = disk_topic_uri
    _topic(uri, records=20)
    out = (f"{uri.rsplit('/', 2)[0]}/exports/raced.parquet" if _is_s3(uri) else str(tmp_path / "raced.parquet"))
    appeared: list[int] = []

    def progress(rows: int, nbytes: int) -> None:
        if not appeared:
            appeared.append(nbytes)
            _put(out, b"written meanwhile")

    with pytest.raises(OutputExistsError, match="appeared while the export was written") as caught:
        export_topic(uri, out, progress=progress)
    assert exit_code_of(caught.value) == 2
    assert appeared and _get(out) == b"written meanwhile"
    if _is_s3(uri):
        assert _state(uri)[1] == []  # no upload left unfinished
    else:
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".shale")) == []


def test_what_is_not_a_regular_file_is_refused_even_with_overwrite(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _topic(uri, records=20)
    out = tmp_path / "out"
    out.mkdir()
    (out / "file.parquet").write_bytes(b"target of a link")
    os.mkfifo(out / "fifo")
    os.symlink(out / "file.parquet", out / "link")
    os.symlink(out / "missing", out / "dangling")
    os.symlink(uri + "/_meta/topic.json", out / "into-the-topic.json")
    (out / "folder").mkdir()
    kinds = {"fifo": "is a FIFO", "link": "is a symbolic link", "dangling": "is a symbolic link",
             "into-the-topic.json": "is a symbolic link", "folder": "is a folder"}
    if os.geteuid() == 0:  # a null device of our own (never the real /dev/null)
        os.mknod(out / "device", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        kinds["device"] = "is a character device"
    before = snapshot(tmp_path)
    for name, says in kinds.items():
        for flags in ((), ("--overwrite",), ("--format", "jsonl", "--overwrite")):
            code, _, err = _cli("export", uri, str(out / name), *flags)
            _one_line_refusal(code, err, str(out / name), says)
    # a missing folder is not made, a file on the way is not a folder
    code, _, err = _cli("export", uri, str(tmp_path / "missing" / "x.parquet"))
    _one_line_refusal(code, err, "does not exist", "creates no folder")
    code, _, err = _cli("export", uri, str(out / "file.parquet" / "x.parquet"), "--overwrite")
    _one_line_refusal(code, err, "is not a folder")
    for folder_name in (str(out) + "/", str(out), ".", str(tmp_path / "t" / "..")):
        code, _, err = _cli("export", uri, folder_name, "--overwrite")
        assert code == 2, (folder_name, err)
    assert snapshot_diff(before, snapshot(tmp_path)) == []


def test_dev_null_is_refused_and_stays_a_device(tmp_path: Path) -> None:
    """The issue replaced /dev/null itself as root.  The export is one that fails once it
    reads (a value that is not UTF-8, with --utf8), so even a build that did not check
    OUT would abort before replacing anything: this test never replaces /dev/null."""
    uri = str(tmp_path / "t")
    with TopicWriter(uri) as w:
        w.append("k", b"\xff")
    for flags in ((), ("--overwrite",)):
        r = run_cli("export", uri, "/dev/null", "--utf8", *flags)
        _one_line_refusal(r.returncode, r.stderr, "/dev/null: is a character device")
        assert stat.S_ISCHR(os.stat("/dev/null", follow_symlinks=False).st_mode)
    assert not [p for p in os.listdir("/dev") if p.startswith(".shale")]


# ------------------------------------------------------------------ standard output

@pytest.mark.parametrize("out", ["-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
def test_standard_output_streams_to_a_pipe(tmp_path: Path, out: str) -> None:
    uri = str(tmp_path / "t")
    _topic(uri, records=30)
    r = subprocess.run([sys.executable, "-m", "shale.cli", "export", uri, out, "--compacted"], capture_output=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    view = TopicReader(uri, read_compacted=True).read()
    assert pq.read_table(io.BytesIO(r.stdout)).column("key").to_pylist() == [m.key for m in view]
    assert b"exported the compacted view" in r.stderr  # the summary goes to standard error
    r = subprocess.run([sys.executable, "-m", "shale.cli", "export", uri, out, "--format", "jsonl", "--json"],
                       capture_output=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert [x["id"] for x in lines] == [str(m.id) for m in TopicReader(uri).read()]
    assert json.loads(r.stderr)["out"] == "-"
    r = subprocess.run([sys.executable, "-m", "shale.cli", "export", uri, out, "--format", "arrow"],
                       capture_output=True, cwd=ROOT, timeout=300)
    assert pa.ipc.open_file(io.BytesIO(r.stdout)).read_all().num_rows == len(TopicReader(uri).read())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_binary_output_is_refused_on_a_terminal(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _topic(uri, records=10)
    main, terminal = pty.openpty()
    try:
        r = subprocess.run([sys.executable, "-m", "shale.cli", "export", uri, "-"], stdout=terminal,
                           stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=300)
        _one_line_refusal(r.returncode, r.stderr, "standard output is a terminal")
        r = subprocess.run([sys.executable, "-m", "shale.cli", "export", uri, "-", "--format", "jsonl"],
                           stdout=terminal, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=300)
        assert r.returncode == 0, r.stderr
    finally:
        os.close(main)
        os.close(terminal)


# ------------------------------------------------------------------ a killed export

_BLOCKED_EXPORT = textwrap.dedent("""
    import sys, threading
    from shale.export import export_topic

    def progress(rows, nbytes):
        print("writing", flush=True)
        threading.Event().wait()  # until killed

    export_topic(sys.argv[1], sys.argv[2], progress=progress)
""")


def _blocked_export(uri: str, out: Path) -> subprocess.Popen[str]:
    """An export that has opened OUT and started writing, and stops there: its line
    'writing' has been read when this returns."""
    proc = subprocess.Popen([sys.executable, "-c", _BLOCKED_EXPORT, uri, str(out)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    assert proc.stdout.readline() == "writing\n"
    return proc


def temporary_name() -> str:
    """A name as a local export names its temporary file."""
    return f".shale-export-{uuid.uuid4().hex[:12]}.tmp"


def _temporaries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name.startswith(".shale-export-")}


def test_a_killed_exports_temporary_is_removed_by_the_next_export_and_nothing_else(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _topic(uri, records=30)
    out = tmp_path / "out"
    out.mkdir()
    alive = _blocked_export(uri, out / "alive.parquet")
    try:
        (running,) = _temporaries(out)
        killed = _blocked_export(uri, out / "killed.parquet")
        (dead,) = _temporaries(out) - {running}
        killed.send_signal(signal.SIGKILL)
        assert killed.wait() == -signal.SIGKILL
        assert _temporaries(out) == {running, dead} and not (out / "killed.parquet").exists()
        # what the clean-up must leave: anything not named as an export's temporary, and
        # whatever is so named but is not a regular file
        (tmp_path / "elsewhere").write_bytes(b"target")
        decoys = {".shale-tmp-0123456789ab-killed.parquet": b"a store's temporary", "other.parquet": b"other",
                  f"{temporary_name()}.keep": b"", f"x{temporary_name()}": b"", ".shale-export-XYZ.tmp": b""}
        for name, data in decoys.items():
            (out / name).write_bytes(data)
        os.symlink(tmp_path / "elsewhere", out / temporary_name())
        (out / temporary_name()).mkdir()
        os.mkfifo(out / temporary_name())
        before = snapshot(out)
        r = run_cli("export", uri, str(out / "next.parquet"))
        assert r.returncode == 0, r.stderr
        assert snapshot_diff(before, snapshot(out)) == [f"removed {dead}", "created next.parquet"]
        assert running in _temporaries(out)  # a live export's temporary stays
        assert (tmp_path / "elsewhere").read_bytes() == b"target"
    finally:
        alive.kill()
        alive.wait()
    # the next export removes the one whose writer has just died too
    assert run_cli("export", uri, str(out / "last.jsonl")).returncode == 0
    assert running not in _temporaries(out)


def test_the_python_api_refuses_what_the_command_refuses(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _topic(uri, records=10)
    with pytest.raises(InvalidInputError, match="inside the topic"):
        export_topic(uri, f"{uri}/_meta/topic.json", fmt="jsonl", overwrite=True)
    out = tmp_path / "x.parquet"
    out.write_bytes(b"keep")
    with pytest.raises(OutputExistsError, match="already exists"):
        export_topic(uri, str(out))
    assert out.read_bytes() == b"keep"
    assert export_topic(uri, str(out), overwrite=True).rows == len(TopicReader(uri).read())
    os.symlink(out, tmp_path / "link")
    with pytest.raises(OutputExistsError, match="symbolic link"):
        export_topic(uri, str(tmp_path / "link"), overwrite=True)
    # a failed export leaves nothing in OUT's folder (its temporary file removed)
    with TopicWriter(uri) as w:
        w.append("k", b"\xff")
    out.unlink()
    with pytest.raises(InvalidInputError, match="not valid UTF-8"):
        export_topic(uri, str(out), utf8=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "t"]
