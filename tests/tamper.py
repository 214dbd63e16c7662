"""Edit a topic's metadata documents by hand, going round Shale, as an operator, a
damaged disk or a hostile writer of the same bucket would; and snapshot every object of
a topic to prove that nothing was deleted or changed.

Works on a local folder (plain file writes) and on S3 (boto3 ``put_object`` against the
endpoint in ``AWS_ENDPOINT_URL``, i.e. the test suite's moto server).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["edit", "read_raw", "snapshot", "write_raw"]


def _s3(uri: str) -> tuple[Any, str, str]:
    import boto3

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    return client, bucket, prefix.strip("/")


def read_raw(uri: str, name: str) -> bytes:
    """The bytes of ``name`` (relative to the topic's folder, e.g. ``_meta/topic.json``)."""
    if uri.startswith("s3://"):
        client, bucket, prefix = _s3(uri)
        body: bytes = client.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read()
        return body
    return (Path(uri) / name).read_bytes()


def write_raw(uri: str, name: str, data: bytes) -> None:
    """Overwrite ``name`` unconditionally (no compare-and-swap: a hand edit)."""
    if uri.startswith("s3://"):
        client, bucket, prefix = _s3(uri)
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)
        return
    (Path(uri) / name).write_bytes(data)


def edit(uri: str, doc: str, change: Callable[[dict[str, Any]], object]) -> bytes:
    """Apply ``change`` to the whole document ``_meta/<doc>`` (the envelope
    ``{"version", "value", ...}``) and write it back.  When ``change`` returns text or
    bytes, that is written instead of the edited document.  Returns what was written."""
    name = f"_meta/{doc}"
    envelope = json.loads(read_raw(uri, name))
    result = change(envelope)
    if isinstance(result, str):
        data = result.encode()
    elif isinstance(result, bytes):
        data = result
    else:
        data = json.dumps(envelope).encode()
    write_raw(uri, name, data)
    return data


def snapshot(uri: str) -> dict[str, bytes]:
    """Every object under the topic's folder, by name relative to it, with its bytes;
    Shale's own lock and temporary files (``.shale-*``) are left out."""
    out: dict[str, bytes] = {}
    if uri.startswith("s3://"):
        client, bucket, prefix = _s3(uri)
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
            for item in page.get("Contents", []):
                rel = item["Key"][len(prefix) + 1:]
                if not rel.rpartition("/")[2].startswith(".shale-"):
                    out[rel] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        return out
    root = Path(uri)
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.startswith(".shale-"):
            out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out
