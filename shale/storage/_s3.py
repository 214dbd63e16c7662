"""S3 backend (boto3): the only module that talks to S3.

Endpoint, region and credentials come from the store's
:class:`~shale.storage.options.S3Options` (read from the standard AWS variables at the
edge: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, a web identity ...),
so moto's server, MinIO and R2 work unchanged; what they leave unset boto3 finds on its
own (profiles, an instance role).  A store pickles with its options, never with its
client.  botocore's own retries are off: transient failures are retried by
:class:`~shale.storage.retry.RetryPolicy`, once, here.  Conditional writes use
``If-None-Match: *`` and ``If-Match: <etag>``.  Error messages name the bucket and key,
never credentials: botocore's own texts name the endpoint URL, which may carry a password,
so an error translated from one is masked, and so is the cause it is chained to.
"""

from __future__ import annotations

import dataclasses
import email.utils
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from shale.ledger.errors import (
    AlreadyExistsError,
    BucketNotFoundError,
    ConflictError,
    InvalidInputError,
    ObjectNotFoundError,
    ShaleError,
    StateUnknownError,
    StorageError,
    StoragePermissionError,
    TransientStorageError,
    UnsupportedOperationError,
)
from shale.ledger.masking import masked_cause
from shale.storage.base import ObjectInfo, ObjectStore, ObjectWriter
from shale.storage.options import S3Options, StorageOptions
from shale.storage.registry import open_store, register_backend
from shale.storage.retry import RetryPolicy

__all__ = ["S3Store"]

T = TypeVar("T")

_TRANSIENT_CODES = frozenset({
    "SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeTooSkewed",
    "Throttling", "ThrottlingException", "RequestLimitExceeded", "ConditionalRequestConflict",
    "OperationAborted", "BadDigest", "IncompleteBody",
})
_MISSING_CODES = frozenset({"NoSuchKey", "NotFound", "404", "NoSuchUpload"})
_PART_SIZE = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class _Refusal:
    """What S3 answered to one request (its error code and HTTP status), and about what."""

    what: str
    code: str
    status: int
    error: dict[str, Any]
    options: S3Options | None


def _missing_bucket(r: _Refusal) -> ShaleError:
    bucket = r.error.get("BucketName") or r.what.removeprefix("s3://").split("/", 1)[0]
    at = f" at {r.options.endpoint_url}" if r.options is not None and r.options.endpoint_url else ""
    return BucketNotFoundError(f"{r.what}: no such bucket {bucket!r}{at}")


# What an error answer means, in order: the first rule that matches the answer names the error.
_REFUSALS: tuple[tuple[Callable[[_Refusal], bool], Callable[[_Refusal], ShaleError]], ...] = (
    (lambda r: r.code in _MISSING_CODES or (r.status == 404 and r.code != "NoSuchBucket"),
     lambda r: ObjectNotFoundError(f"{r.what}: no such object")),
    (lambda r: r.code == "NoSuchBucket", _missing_bucket),
    (lambda r: r.code == "PreconditionFailed" or r.status == 412,
     lambda r: ConflictError(f"{r.what}: precondition failed (changed since it was read)")),
    (lambda r: r.code in _TRANSIENT_CODES or r.status in (409, 429) or r.status >= 500,
     lambda r: TransientStorageError(f"{r.what}: {r.code or r.status} (transient)")),
    (lambda r: r.code == "NotImplemented" or r.status == 501,
     lambda r: UnsupportedOperationError(f"{r.what}: the server does not implement this request")),
    # how the command is run (its identity, the bucket's policy), not the data
    (lambda r: r.code in ("AccessDenied", "403") or r.status == 403,
     lambda r: StoragePermissionError(f"{r.what}: access denied")),
)


def _translate_refusal(response: dict[str, Any], what: str, options: S3Options | None) -> ShaleError:
    err = response.get("Error", {})
    refusal = _Refusal(what, str(err.get("Code", "")),
                       int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0), err, options)
    for matches, error in _REFUSALS:
        if matches(refusal):
            return error(refusal)
    return StorageError(f"{what}: {refusal.code or refusal.status}: {err.get('Message', '')}".rstrip(": "))


def _translate(e: Exception, what: str, options: S3Options | None = None) -> ShaleError:
    """Map a botocore exception to our error hierarchy (the one place this happens);
    ``options``, the store's, name the endpoint of a missing bucket."""
    import botocore.exceptions as bex

    if isinstance(e, bex.ClientError):
        return _translate_refusal(e.response, what, options)
    if isinstance(e, bex.NoCredentialsError | bex.PartialCredentialsError):
        return StorageError(f"{what}: no AWS credentials found (none in the storage options, the environment, "
                            "the AWS profile or an instance role)")
    if isinstance(e, bex.EndpointConnectionError | bex.ConnectionError | bex.HTTPClientError
                  | bex.ReadTimeoutError | bex.ConnectTimeoutError | bex.ResponseStreamingError
                  | bex.IncompleteReadError | ConnectionError | TimeoutError):
        # botocore's own text names the endpoint ("Could not connect to the endpoint URL: ...")
        return TransientStorageError(f"{what}: {e or type(e).__name__} (transient)")
    if isinstance(e, bex.BotoCoreError):
        return StorageError(f"{what}: {e or type(e).__name__}")
    return StorageError(f"{what}: {type(e).__name__}: {e}")


class _S3Writer(ObjectWriter):
    """Single PUT for small objects, multipart upload beyond one part; ``if_absent``:
    both with ``If-None-Match: *``."""

    def __init__(self, store: S3Store, key: str, *, if_absent: bool = False) -> None:
        self._s, self._key = store, key
        self._if_absent = if_absent
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._done = False

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        self._buf += data
        while len(self._buf) >= _PART_SIZE:
            self._send_part(bytes(self._buf[:_PART_SIZE]))
            del self._buf[:_PART_SIZE]
        return len(data)

    def _send_part(self, chunk: bytes) -> None:
        s = self._s
        if self._upload_id is None:
            r = s._call("create_multipart_upload", self._key, Bucket=s.bucket, Key=self._key)
            self._upload_id = r["UploadId"]
        n = len(self._parts) + 1
        r = s._call("upload_part", self._key, Bucket=s.bucket, Key=self._key,
                    UploadId=self._upload_id, PartNumber=n, Body=chunk)
        self._parts.append({"ETag": r["ETag"], "PartNumber": n})

    def close(self) -> None:
        if self._done:
            return
        try:
            if self._upload_id is None and self._if_absent:
                self._s.put_if_absent(self._key, bytes(self._buf))
            elif self._upload_id is None:
                self._s.put(self._key, bytes(self._buf))
            else:
                if self._buf:
                    self._send_part(bytes(self._buf))
                cond = {"IfNoneMatch": "*"} if self._if_absent else {}
                try:
                    self._s._call("complete_multipart_upload", self._key, Bucket=self._s.bucket,
                                  Key=self._key, UploadId=self._upload_id,
                                  MultipartUpload={"Parts": self._parts}, **cond)
                except ConflictError as e:
                    raise AlreadyExistsError(f"{self._s.url(self._key)}: already exists") from e
        except BaseException:
            self.abort()
            raise
        self._done = True
        self._buf = bytearray()

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        self._buf = bytearray()
        if self._upload_id is not None:
            try:
                self._s._call("abort_multipart_upload", self._key, Bucket=self._s.bucket,
                              Key=self._key, UploadId=self._upload_id)
            except ShaleError:
                pass  # an unfinished upload is invisible; bucket lifecycle rules expire it


class S3Store(ObjectStore):
    """One S3 bucket (or S3-compatible store)."""

    scheme = "s3"
    supports_conditional_writes = True  # If-None-Match: * and If-Match: <etag>
    shared_between_processes = True

    def __init__(self, bucket: str, *, options: StorageOptions | None = None, retry: RetryPolicy | None = None,
                 client: Any = None, max_workers: int = 8) -> None:
        self.bucket = self.authority = bucket
        #: what the client is made from (the environment's, read now, when not given)
        self.options = StorageOptions.from_environment() if options is None else options
        self.retry = self.options.retry if retry is None else retry
        self._client = client
        self._injected = client is not None
        self._lock = threading.Lock()
        self.max_workers = max_workers
        _STORES.add(self)

    @property
    def process_safe(self) -> bool:  # type: ignore[override]
        # A forked child makes its own client (a client's pooled connections must not be
        # shared between processes); one handed in from outside cannot be remade.
        return not self._injected

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = _make_client(self.options.s3)
        return self._client

    def __reduce__(self) -> tuple[object, ...]:
        # A store travels as its bucket and options (the retry policy among them); the
        # receiving process opens its own client, once per set of options.
        if self._injected:
            raise TypeError(f"{self.url('')}: a store given a client of its own cannot be sent to another process")
        return (open_store, ("s3", self.bucket, dataclasses.replace(self.options, retry=self.retry)))

    def without_credentials(self) -> S3Store:
        if self._injected:
            return self
        return S3Store(self.bucket, options=self.options.without_credentials(), retry=self.retry,
                       max_workers=self.max_workers)

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _call(self, op: str, key: str, **kwargs: Any) -> Any:
        return self._retrying(lambda: self._raw(op, key, **kwargs))

    def _raw(self, op: str, key: str, **kwargs: Any) -> Any:
        client = self.client  # a bad AWS setting is its own error, not this object's
        try:
            return getattr(client, op)(**kwargs)
        except Exception as e:  # translated, never swallowed
            failure = e
        raise self._translated(failure, key)

    def _translated(self, e: Exception, key: str) -> ShaleError:
        """``e`` as a Shale error, chained to it, or to a stand-in when its text names the
        endpoint with a password.  Raised outside the ``except`` block that caught ``e``,
        so that ``e`` is not left as the error's context either."""
        err = _translate(e, self.url(key), self.options.s3)
        err.__cause__ = masked_cause(e)
        return err

    def _retrying(self, fn: Callable[[], T]) -> T:
        for attempt in self.retry.retrying():
            with attempt:
                return fn()
        raise AssertionError("unreachable")  # tenacity reraises on the last attempt

    def _read_body(self, key: str, **kwargs: Any) -> tuple[bytes, dict[str, Any]]:
        def once() -> tuple[bytes, dict[str, Any]]:
            r = self._raw("get_object", key, Bucket=self.bucket, Key=key, **kwargs)
            try:
                return r["Body"].read(), r
            except Exception as e:
                failure = e
            raise self._translated(failure, key)
        return self._retrying(once)

    def get(self, key: str) -> bytes:
        return self._read_body(key)[0]

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        try:
            return self._read_body(key, Range=f"bytes={start}-{end - 1}")[0]
        except StorageError as e:
            if "InvalidRange" in str(e):
                return b""
            raise

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if len(ranges) <= 1:
            return [self.get_range(key, s, e) for s, e in ranges]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(ranges))) as pool:
            return list(pool.map(lambda r: self.get_range(key, r[0], r[1]), ranges))

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        if length <= 0:
            return b"", self.stat(key).size
        try:
            data, r = self._read_body(key, Range=f"bytes=-{length}")
        except StorageError as e:
            # only an empty object has no last byte: S3 and SeaweedFS refuse the range (416),
            # where moto answers with the empty body
            if "InvalidRange" in str(e):
                return b"", 0
            raise
        content_range = r.get("ContentRange") or ""
        size = int(content_range.rsplit("/", 1)[1]) if "/" in content_range else len(data)
        return data, size

    def stat(self, key: str) -> ObjectInfo:
        r = self._call("head_object", key, Bucket=self.bucket, Key=key)
        return ObjectInfo(key, int(r["ContentLength"]), r["LastModified"].timestamp(), r["ETag"])

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        self._call("put_object", key, Bucket=self.bucket, Key=key, Body=data)

    def open_writer(self, key: str) -> ObjectWriter:
        return _S3Writer(self, key)

    def open_writer_if_absent(self, key: str) -> ObjectWriter:
        return _S3Writer(self, key, if_absent=True)

    def get_with_token(self, key: str) -> tuple[bytes, str]:
        data, r = self._read_body(key)
        return data, str(r["ETag"])

    def _conditional_put(self, key: str, data: bytes, **cond: str) -> str:
        # A retried conditional PUT may find its own earlier attempt already applied:
        # then the precondition fails although the write succeeded.  If the object still
        # holds our bytes it was our write; if it holds other bytes, ours may have landed
        # and been replaced since, or never landed: the outcome is unknown, and callers
        # must re-read before they decide (never delete on a guess).
        attempts = 0

        def once() -> str:
            nonlocal attempts
            attempts += 1
            try:
                r = self._raw("put_object", key, Bucket=self.bucket, Key=key, Body=data, **cond)
                return str(r["ETag"])
            except ConflictError:
                if attempts == 1:
                    raise
                try:
                    current, token = self.get_with_token(key)
                except ObjectNotFoundError:
                    current, token = b"", ""
                if current == data:
                    return token
                raise StateUnknownError(
                    f"{self.url(key)}: a retried conditional write failed its precondition; "
                    "the first attempt may or may not have been applied") from None

        try:
            return self._retrying(once)
        except TransientStorageError as e:
            if attempts > 0:
                raise StateUnknownError(f"{e}; the conditional write may or may not have been applied") from e
            raise
    def put_if_absent(self, key: str, data: bytes) -> str:
        try:
            return self._conditional_put(key, data, IfNoneMatch="*")
        except AlreadyExistsError:
            raise
        except ConflictError as e:
            raise AlreadyExistsError(f"{self.url(key)}: already exists") from e

    def put_if_match(self, key: str, data: bytes, token: str) -> str:
        if not token:
            # an empty If-Match is ignored by some S3 implementations: the write would be
            # unconditional
            raise ConflictError(f"{self.url(key)}: no token to compare against")
        try:
            return self._conditional_put(key, data, IfMatch=token)
        except ObjectNotFoundError as e:
            raise ConflictError(f"{self.url(key)}: vanished") from e

    def delete(self, key: str) -> None:
        try:
            self._call("delete_object", key, Bucket=self.bucket, Key=key)
        except ObjectNotFoundError:
            pass

    def now_ms(self, prefix: str) -> int:
        # The ``Date`` of any response is the store's clock (to the second, rounded down,
        # which only makes ages look younger): a listing costs no write.
        head = prefix.rstrip("/") + "/" if prefix else ""
        r = self._call("list_objects_v2", head, Bucket=self.bucket, Prefix=head, MaxKeys=1)
        date = r.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        try:
            return int(email.utils.parsedate_to_datetime(date).timestamp() * 1000)
        except (TypeError, ValueError):
            return super().now_ms(prefix)  # no usable Date: time a marker object instead

    def unfinished_writes(self, prefix: str) -> Iterator[ObjectInfo]:
        head = prefix.rstrip("/") + "/" if prefix else ""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": head}
        while True:
            r = self._call("list_multipart_uploads", head, **kwargs)
            for u in r.get("Uploads", []):
                # the upload id travels as the token; mtime is when it was started
                yield ObjectInfo(u["Key"], 0, u["Initiated"].timestamp(), u["UploadId"])
            if not r.get("IsTruncated"):
                return
            kwargs["KeyMarker"] = r.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = r.get("NextUploadIdMarker", "")

    def discard_write(self, info: ObjectInfo) -> None:
        try:
            self._call("abort_multipart_upload", info.key, Bucket=self.bucket, Key=info.key, UploadId=info.token)
        except ObjectNotFoundError:
            pass  # already completed or aborted

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        head = prefix.rstrip("/") + "/" if prefix else ""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": head}
            if token:
                kwargs["ContinuationToken"] = token
            r = self._call("list_objects_v2", head, **kwargs)
            for o in r.get("Contents", []):
                yield ObjectInfo(o["Key"], int(o["Size"]), o["LastModified"].timestamp(), o.get("ETag", ""))
            if not r.get("IsTruncated"):
                return
            token = r.get("NextContinuationToken")


def import_client() -> None:
    """Import what a client is made of (boto3 takes a tenth of a second or more), so that
    a process forked after this one makes its clients without; ``ImportError`` when
    boto3 is not installed."""
    import boto3  # noqa: F401
    import botocore.session  # noqa: F401
    from botocore.config import Config  # noqa: F401


def _make_client(options: S3Options) -> Any:
    try:
        import boto3
        import botocore.session
        from botocore.config import Config
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise UnsupportedOperationError(
            "s3:// needs boto3: pip install 'shale[s3]'"
        ) from e
    if options.problems:
        raise InvalidInputError(options.problems[0])
    config = Config(
        # total_max_attempts counts the first request (max_attempts would count retries): botocore
        # must never retry on its own, or a conditional write could find its own first attempt
        # applied and report a conflict that was not one (our policy retries, knowing that)
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=options.connect_timeout,
        read_timeout=options.read_timeout,
        max_pool_connections=32,
        s3={"addressing_style": options.addressing_style},
    )
    import botocore.exceptions as bex

    try:
        core = botocore.session.Session(profile=options.profile)
        for name, value in (("region", options.region), ("ca_bundle", options.ca_bundle),
                            ("sts_regional_endpoints", options.sts_regional_endpoints)):
            if value:
                core.set_config_variable(name, value)
        if options.access_key_id and options.secret_access_key:
            core.set_credentials(options.access_key_id, options.secret_access_key, options.session_token)
        elif options.role_arn and options.web_identity_token_file:
            core.get_component("credential_provider").insert_before("env", _web_identity(core, options))
        region = None if core.get_config_variable("region") else "us-east-1"
        return boto3.session.Session(botocore_session=core).client(
            "s3", config=config, region_name=region, endpoint_url=options.endpoint_url or None)
    except bex.ProfileNotFound:
        raise InvalidInputError(f"{options.named('profile')} {options.profile or ''!r}: no such profile in the AWS "
                                "config and credentials files") from None
    except ValueError as e:
        if "endpoint" in str(e).lower():
            shown = f"{options.named('endpoint_url')} {options.endpoint_url!r}" if options.endpoint_url else \
                "the AWS endpoint"
            raise InvalidInputError(f"{shown} is not an endpoint URL (e.g. http://minio:9000)") from None
        raise InvalidInputError(f"the AWS settings: {e}") from None
    except bex.BotoCoreError as e:
        raise InvalidInputError(f"the AWS settings: {e}") from None


def _web_identity(core: Any, options: S3Options) -> Any:
    """botocore's web-identity provider, reading the role and the token file from
    ``options`` rather than from this process's environment."""
    from botocore.credentials import AssumeRoleWithWebIdentityProvider

    config = {"role_arn": options.role_arn, "web_identity_token_file": options.web_identity_token_file}
    if options.role_session_name:
        config["role_session_name"] = options.role_session_name
    return AssumeRoleWithWebIdentityProvider(load_config=lambda: {"profiles": {"shale": config}},
                                             client_creator=core.create_client, profile_name="shale",
                                             disable_env_vars=True)


_STORES: weakref.WeakSet[S3Store] = weakref.WeakSet()


def _forget_clients_after_fork() -> None:
    for store in list(_STORES):
        store._lock = threading.Lock()
        if not store._injected:
            store._client = None


os.register_at_fork(after_in_child=_forget_clients_after_fork)
register_backend("s3", lambda bucket, options: S3Store(bucket, options=options))
