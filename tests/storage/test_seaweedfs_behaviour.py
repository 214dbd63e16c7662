"""Where SeaweedFS's S3 gateway and moto's server answer differently, and where they
agree on what Shale relies on: one test for each point of docs/operations.md, "Running
on SeaweedFS (and other S3-compatible stores)".  Each asserts the raw answer of the
server (through boto3) and what Shale's S3 store makes of it."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shale.ledger.errors import (
    AlreadyExistsError,
    BucketNotFoundError,
    ConflictError,
    ObjectNotFoundError,
    StoragePermissionError,
)
from shale.storage import Location, ObjectInfo, S3Options, StorageOptions, resolve
from tests.conftest import make_root

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Server:
    """One S3 server under test: its name, a raw client, and a fresh folder on it."""

    name: str
    client: Any
    bucket: str
    loc: Location

    def key(self, name: str) -> str:
        return self.loc.key(name)

    def error(self, call: Callable[[], object]) -> tuple[str, int]:
        """The error code and HTTP status ``call`` is refused with."""
        import botocore.exceptions

        with pytest.raises(botocore.exceptions.ClientError) as e:
            call()
        return e.value.response["Error"]["Code"], e.value.response["ResponseMetadata"]["HTTPStatusCode"]


@pytest.fixture(params=[pytest.param("moto", marks=pytest.mark.s3),
                        pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Server:
    import boto3

    root = make_root("s3" if request.param == "moto" else "seaweedfs", request, tmp_path)
    loc = resolve(root)
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"])
    return Server(str(request.param), client, loc.store.bucket, loc)


@pytest.fixture
def seaweed(request: pytest.FixtureRequest, tmp_path: Path) -> Server:
    """A fresh folder on SeaweedFS alone."""
    import boto3

    loc = resolve(make_root("seaweedfs", request, tmp_path))
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"])
    return Server("seaweedfs", client, loc.store.bucket, loc)


# -------------------------------------------------------------------------- listing

def test_listing_walks_folder_by_folder_on_seaweedfs(server: Server) -> None:
    """SeaweedFS keeps real folders and lists one folder's objects where the folder's
    name falls (``d/a/b`` before ``d/a.b``); moto (and S3) list in byte order of whole
    keys.  Both list every object once, in pages, and see a write at once."""
    names = ["d/a.b", "d/a/b", "d/a/c/d", "d/a0", "d/b", "d.txt", "c/x"]
    for n in names:
        server.loc.store.put(server.key(n), n.encode())
    listed = [server.loc.relative(o.key) for o in server.loc.store.list(server.loc.prefix)]
    if server.name == "seaweedfs":
        assert listed == ["c/x", "d/a/b", "d/a/c/d", "d/a.b", "d/a0", "d/b", "d.txt"]
    else:
        assert listed == sorted(names)
    pages, token = [], None
    while True:  # two keys a page: the continuation follows the same order
        kwargs: dict[str, Any] = {"Bucket": server.bucket, "Prefix": server.loc.prefix + "/", "MaxKeys": 2}
        if token:
            kwargs["ContinuationToken"] = token
        r = server.client.list_objects_v2(**kwargs)
        pages += [server.loc.relative(o["Key"]) for o in r.get("Contents", [])]
        if not r.get("IsTruncated"):
            break
        token = r["NextContinuationToken"]
    assert pages == listed
    server.loc.store.delete(server.key("d/a.b"))
    assert "d/a.b" not in [server.loc.relative(o.key) for o in server.loc.store.list(server.loc.prefix)]


def test_listing_sees_concurrent_writes_at_once(server: Server) -> None:
    """Read-after-write and list-after-write, as on S3 since 2020: objects written by
    many threads at once are all listed as soon as their writes return."""
    keys = [server.key(f"many/{i:03d}") for i in range(48)]
    threads = [threading.Thread(target=server.loc.store.put, args=(k, b"x")) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o.key for o in server.loc.store.list(server.key("many"))) == keys
    for k in keys[::2]:
        server.loc.store.delete(k)
    assert sorted(o.key for o in server.loc.store.list(server.key("many"))) == keys[1::2]


# --------------------------------------------------------------------------- ranges

def test_a_range_of_an_empty_object(server: Server) -> None:
    """SeaweedFS refuses any range of an empty object, a suffix range too (416
    InvalidRange, as S3 does), where moto answers a suffix range with the empty body.
    Shale's store reads an empty tail on both."""
    server.loc.store.put(server.key("empty"), b"")
    suffix = lambda: server.client.get_object(Bucket=server.bucket, Key=server.key("empty"),  # noqa: E731
                                              Range="bytes=-8")
    if server.name == "seaweedfs":
        assert server.error(suffix) == ("InvalidRange", 416)
    else:
        assert suffix()["Body"].read() == b""
    assert server.error(lambda: server.client.get_object(Bucket=server.bucket, Key=server.key("empty"),
                                                         Range="bytes=0-4")) == ("InvalidRange", 416)
    assert server.loc.store.get_tail(server.key("empty"), 8) == (b"", 0)
    assert server.loc.store.get_tail(server.key("empty"), 0) == (b"", 0)
    assert server.loc.store.get_range(server.key("empty"), 0, 5) == b""


def test_a_range_past_the_end(server: Server) -> None:
    """Both refuse a range that starts at or past the end (416); a suffix range longer
    than the object is the whole object."""
    s, k = server.loc.store, server.key("ten")
    s.put(k, b"0123456789")
    for start in (10, 12):
        assert server.error(lambda start=start: server.client.get_object(
            Bucket=server.bucket, Key=k, Range=f"bytes={start}-{start + 9}")) == ("InvalidRange", 416)
        assert s.get_range(k, start, start + 10) == b""
    assert s.get_tail(k, 100) == (b"0123456789", 10)
    assert s.get_tail(k, 0) == (b"", 10)


# ---------------------------------------------------------------------------- ETags

def test_etags_are_s3s(server: Server) -> None:
    """A single PUT's ETag is the quoted MD5 of the bytes, a multipart upload's the MD5
    of its parts' MD5s with ``-<parts>``, the same in the answer to the write, in HEAD
    and in a listing: Shale's compare-and-swap token is that ETag."""
    s = server.loc.store
    token = s.put_if_absent(server.key("small"), b"hello")
    assert token == f'"{hashlib.md5(b"hello").hexdigest()}"'
    assert s.stat(server.key("small")).token == token
    assert [o.token for o in s.list(server.loc.prefix + "/")] == [token]
    part, rest = b"a" * (16 * MiB), b"b" * 10
    with s.open_writer(server.key("parts")) as w:  # Shale's part size: 16 MiB
        w.write(part + rest)
    digest = hashlib.md5(hashlib.md5(part).digest() + hashlib.md5(rest).digest()).hexdigest()
    assert s.stat(server.key("parts")).token == f'"{digest}-2"'
    assert s.get_with_token(server.key("parts"))[1] == f'"{digest}-2"'


# --------------------------------------------------------------- conditional writes

def test_if_match_on_a_missing_object(server: Server) -> None:
    """SeaweedFS answers a PUT with ``If-Match`` on a missing key with 412
    PreconditionFailed, moto (and S3) with 404 NoSuchKey: Shale's store calls both a
    conflict, and creates nothing."""
    k = server.key("missing")
    code = server.error(lambda: server.client.put_object(Bucket=server.bucket, Key=k, Body=b"x",
                                                         IfMatch='"0123456789abcdef0123456789abcdef"'))
    assert code == (("PreconditionFailed", 412) if server.name == "seaweedfs" else ("NoSuchKey", 404))
    with pytest.raises(ConflictError):
        server.loc.store.put_if_match(k, b"x", '"0123456789abcdef0123456789abcdef"')
    assert not server.loc.store.exists(k)


def test_if_none_match_on_a_put_and_on_completing_an_upload(server: Server) -> None:
    """Both refuse ``If-None-Match: *`` on a taken key with 412, on a PUT and when a
    multipart upload is completed: a create-only write never replaces an object."""
    s, k = server.loc.store, server.key("taken")
    s.put(k, b"first")
    assert server.error(lambda: server.client.put_object(Bucket=server.bucket, Key=k, Body=b"x",
                                                         IfNoneMatch="*")) == ("PreconditionFailed", 412)
    upload = server.client.create_multipart_upload(Bucket=server.bucket, Key=k)["UploadId"]
    etag = server.client.upload_part(Bucket=server.bucket, Key=k, UploadId=upload, PartNumber=1, Body=b"y")["ETag"]
    assert server.error(lambda: server.client.complete_multipart_upload(
        Bucket=server.bucket, Key=k, UploadId=upload, IfNoneMatch="*",
        MultipartUpload={"Parts": [{"ETag": etag, "PartNumber": 1}]})) == ("PreconditionFailed", 412)
    with pytest.raises(AlreadyExistsError), s.open_writer_if_absent(k) as w:
        w.write(b"z" * (17 * MiB))
    assert s.get(k) == b"first"
    server.client.abort_multipart_upload(Bucket=server.bucket, Key=k, UploadId=upload)
    assert list(s.unfinished_writes(server.loc.prefix + "/")) == []
    # aborting it again: SeaweedFS answers 204, moto 404 NoSuchUpload; an upload id it
    # never gave out is NoSuchUpload on both.  Discarding an unfinished write takes either.
    again = lambda: server.client.abort_multipart_upload(Bucket=server.bucket, Key=k, UploadId=upload)  # noqa: E731
    if server.name == "seaweedfs":
        assert again()["ResponseMetadata"]["HTTPStatusCode"] == 204
    else:
        assert server.error(again) == ("NoSuchUpload", 404)
    assert server.error(lambda: server.client.abort_multipart_upload(
        Bucket=server.bucket, Key=k, UploadId="no-such-upload")) == ("NoSuchUpload", 404)
    s.discard_write(ObjectInfo(k, 0, 0.0, upload))


def test_conditional_deletes_are_honoured(server: Server) -> None:
    """Both refuse a DELETE whose ``If-Match`` is stale (412) and keep the object; one
    that matches deletes it.  (Shale deletes only what no published state names, so it
    sends plain DELETEs; a store ignoring the header would not matter to it.)"""
    s, k = server.loc.store, server.key("doc")
    token = s.put_if_absent(k, b"v1")
    s.put_if_match(k, b"v2", token)
    assert server.error(lambda: server.client.delete_object(Bucket=server.bucket, Key=k,
                                                            IfMatch=token)) == ("PreconditionFailed", 412)
    assert s.get(k) == b"v2"
    server.client.delete_object(Bucket=server.bucket, Key=k, IfMatch=s.get_with_token(k)[1])
    assert not s.exists(k)


#: a writer that meets another on the same key waits on the server, in steps of about a
#: second: few rounds by default, the long campaign behind SHALE_LONG_TESTS=1
ROUNDS, WRITERS = (40, 16) if os.environ.get("SHALE_LONG_TESTS") == "1" else (2, 8)


def test_conditional_writes_are_atomic_unserialised(seaweed: Server) -> None:
    """SeaweedFS checks a write's precondition and stores it as one step: rounds of many
    concurrent writers, with nothing serialising them, have exactly one winner each,
    creating a key and swapping it.  (The moto server serialises every request for that.)"""
    s = seaweed.loc.store
    for r in range(ROUNDS):
        k = seaweed.key(f"race/{r}")
        created = _race(lambda i, k=k: s.put_if_absent(k, f"creator {i}".encode()))
        assert len(created) == 1, created
        (winner, token), = created.items()
        assert s.get_with_token(k) == (f"creator {winner}".encode(), token)
        swapped = _race(lambda i, k=k, token=token: s.put_if_match(k, f"swapper {i}".encode(), token))
        assert len(swapped) == 1, swapped
        (winner, token), = swapped.items()
        assert s.get_with_token(k) == (f"swapper {winner}".encode(), token)


def _race(write: Callable[[int], str]) -> dict[int, str]:
    """Run ``write(i)`` in :data:`WRITERS` threads released together; the winners' tokens."""
    barrier, wins = threading.Barrier(WRITERS), {}

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            wins[i] = write(i)
        except ConflictError:
            pass

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return wins


# ------------------------------------------------------------- errors, credentials

def test_error_codes(server: Server) -> None:
    """A missing object (NoSuchKey on GET, a bare 404 on HEAD) and a missing bucket
    (NoSuchBucket) answer alike on both; a DELETE of a missing key succeeds."""
    k = server.key("nope")
    assert server.error(lambda: server.client.get_object(Bucket=server.bucket, Key=k)) == ("NoSuchKey", 404)
    assert server.error(lambda: server.client.head_object(Bucket=server.bucket, Key=k)) == ("404", 404)
    assert server.client.delete_object(Bucket=server.bucket, Key=k)["ResponseMetadata"]["HTTPStatusCode"] == 204
    with pytest.raises(ObjectNotFoundError):
        server.loc.store.get(k)
    other = f"no-such-{uuid.uuid4().hex[:8]}"
    assert server.error(lambda: server.client.list_objects_v2(Bucket=other)) == ("NoSuchBucket", 404)
    with pytest.raises(BucketNotFoundError, match=rf"no such bucket '{other}' at http://127\.0\.0\.1:"):
        loc = resolve(f"s3://{other}/t")
        loc.store.get(loc.key("x"))


def test_signatures_are_checked_on_seaweedfs(seaweed: Server) -> None:
    """SeaweedFS checks every request's signature against its own keys (as S3 does;
    moto takes any keys): a wrong secret is refused with 403 SignatureDoesNotMatch, an
    unknown key with 403 InvalidAccessKeyId, which Shale reports as access denied."""
    import boto3

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    for key_id, code in ((os.environ["AWS_ACCESS_KEY_ID"], "SignatureDoesNotMatch"),
                         ("someone-else", "InvalidAccessKeyId")):
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id=key_id, aws_secret_access_key="wrong-secret")
        assert seaweed.error(lambda c=client: c.list_objects_v2(Bucket=seaweed.bucket)) == (code, 403)
        options = StorageOptions(s3=S3Options(endpoint_url=endpoint, region="us-east-1", access_key_id=key_id,
                                              secret_access_key="wrong-secret"))
        loc = resolve(seaweed.loc.uri, options)
        with pytest.raises(StoragePermissionError, match="access denied"):
            loc.store.put(loc.key("x"), b"x")
    assert not seaweed.loc.store.exists(seaweed.key("x"))
