"""Storage settings as a value: :class:`~shale.storage.StorageOptions` is read from the
environment once, pickles as it is, never shows a secret, and a store pickled with its
options reaches the same storage from a process whose environment says nothing of it.
The conformance suite ships for plugin authors, who run it from their own tests."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from shale.ledger.errors import InvalidInputError, TransientStorageError
from shale.storage import Location, S3Options, StorageOptions, resolve
from shale.storage._s3 import S3Store
from shale.storage.options import CREDENTIAL_FIELDS
from shale.storage.retry import RetryPolicy

SECRETS = {"AWS_ENDPOINT_URL": "http://admin:pw-7f3a@minio:9000", "AWS_ACCESS_KEY_ID": "AKIAKEY7F3A",
           "AWS_SECRET_ACCESS_KEY": "secret-7f3a", "AWS_SESSION_TOKEN": "token-7f3a"}


def test_options_come_from_the_environment_once_and_pickle_as_they_are() -> None:
    env = {**SECRETS, "AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-east-2", "AWS_PROFILE": "ops",
           "AWS_ROLE_ARN": "arn:aws:iam::1:role/shale", "SHALE_S3_ADDRESSING_STYLE": "path",
           "SHALE_S3_READ_TIMEOUT": "2.5", "UNRELATED": "x"}
    opts = StorageOptions.from_environment(env)
    s3 = opts.s3
    assert (s3.endpoint_url, s3.region, s3.profile, s3.access_key_id, s3.secret_access_key, s3.session_token) == (
        "http://admin:pw-7f3a@minio:9000", "eu-west-1", "ops", "AKIAKEY7F3A", "secret-7f3a", "token-7f3a")
    assert (s3.addressing_style, s3.read_timeout, s3.connect_timeout) == ("path", 2.5, 10.0)
    assert s3.named("region") == "AWS_REGION" and s3.named("ca_bundle") == "ca_bundle"
    assert StorageOptions.from_environment({"AWS_ENDPOINT_URL_S3": "http://s3-only", "AWS_ENDPOINT_URL": "http://all"}
                                           ).s3.endpoint_url == "http://s3-only"

    copy = pickle.loads(pickle.dumps(opts))
    assert copy == opts and hash(copy) == hash(opts) and copy.s3.origins == s3.origins
    bare = opts.without_credentials()
    assert all(getattr(bare.s3, name) is None for name in CREDENTIAL_FIELDS)
    assert (bare.s3.endpoint_url, bare.s3.region, bare.s3.read_timeout) == (s3.endpoint_url, "eu-west-1", 2.5)
    assert StorageOptions.from_environment({}) == StorageOptions()


def test_options_never_show_a_secret() -> None:
    opts = replace(StorageOptions.from_environment(SECRETS),
                   fsspec={"gcs": {"token": "gcs-token-7f3a", "project": "analytics"}})
    shown = repr(opts) + str(opts) + repr(opts.s3) + repr(pickle.loads(pickle.dumps(opts)))
    for secret in ("pw-7f3a", "AKIAKEY7F3A", "secret-7f3a", "token-7f3a"):
        assert secret not in shown
    assert "http://admin:****@minio:9000" in shown and "'project': 'analytics'" in shown


def test_a_bad_setting_is_named_where_it_is_used() -> None:
    """A bad S3 variable stops what uses S3, naming the variable, and nothing else."""
    opts = StorageOptions.from_environment({"SHALE_S3_CONNECT_TIMEOUT": "soon"})
    loc = resolve(f"memory://opts-{uuid.uuid4().hex[:8]}/t", opts)
    loc.store.put(loc.key("a"), b"fine")
    s3 = resolve("s3://some-bucket/t", opts).store
    with pytest.raises(InvalidInputError, match=r"^SHALE_S3_CONNECT_TIMEOUT 'soon': expected a number of seconds$"):
        s3.get("t/a")
    bad_style = resolve("s3://some-bucket/t", StorageOptions.from_environment({"SHALE_S3_ADDRESSING_STYLE": "up"}))
    with pytest.raises(InvalidInputError, match=r"^SHALE_S3_ADDRESSING_STYLE 'up': one of auto, virtual, path$"):
        bad_style.store.get("t/a")
    with pytest.raises(InvalidInputError, match=r"^addressing_style 'sideways': one of auto, virtual, path$"):
        S3Options(addressing_style="sideways")
    with pytest.raises(InvalidInputError, match=r"^read_timeout 0: must be more than 0 seconds$"):
        S3Options(read_timeout=0)


def test_shale_s3_attempts_sets_how_often_a_transient_failure_is_tried() -> None:
    """``SHALE_S3_ATTEMPTS`` is the retry policy's number of attempts; a value that is no
    whole number from 1 is refused by the first S3 request, naming the variable."""
    assert StorageOptions.from_environment({"SHALE_S3_ATTEMPTS": "2"}).retry == RetryPolicy(attempts=2)
    assert StorageOptions.from_environment({"SHALE_S3_ATTEMPTS": ""}).retry == RetryPolicy()
    # an endpoint nothing listens on: each attempt fails at once, and every one is counted
    waits: list[float] = []
    for given in ("1", "3"):
        opts = StorageOptions.from_environment({"SHALE_S3_ATTEMPTS": given, "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                                                "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                                                "AWS_DEFAULT_REGION": "us-east-1"})
        store = S3Store("some-bucket", options=replace(opts, retry=replace(opts.retry, sleep=waits.append)))
        with pytest.raises(TransientStorageError, match=r"127\.0\.0\.1:9"):
            store.get("t/a")
        assert len(waits) == int(given) - 1  # a wait between two attempts
        waits.clear()
    for bad in ("0", "-1", "two", "1.5", "99999"):
        s3 = resolve("s3://some-bucket/t", StorageOptions.from_environment({"SHALE_S3_ATTEMPTS": bad})).store
        with pytest.raises(InvalidInputError, match=rf"^SHALE_S3_ATTEMPTS '{re.escape(bad)}': expected a whole"):
            s3.get("t/a")


@pytest.mark.s3
def test_resolve_opens_a_store_per_set_of_options(s3_bucket: str) -> None:
    """Given options win over the environment; without options, the environment is
    read when resolving."""
    uri = f"s3://{s3_bucket}/t"
    mine = resolve(uri).store
    assert isinstance(mine, S3Store) and mine.options == StorageOptions.from_environment()
    assert resolve(uri).store is mine
    mine.put("t/a", b"x")
    elsewhere = StorageOptions(s3=S3Options(endpoint_url="http://127.0.0.1:9", connect_timeout=1.0),
                               retry=RetryPolicy(attempts=1))
    other = resolve(uri, elsewhere).store
    assert isinstance(other, S3Store) and other is not mine and other.options == elsewhere
    assert resolve(uri, elsewhere).store is other
    with pytest.raises(TransientStorageError, match=r"127\.0\.0\.1:9"):
        other.get("t/a")
    assert mine.get("t/a") == b"x"


CHILD = r"""
import os, pickle, sys
assert not [k for k in os.environ if k.startswith("AWS_") and k != "AWS_EC2_METADATA_DISABLED"], os.environ
loc, bare = pickle.loads(sys.stdin.buffer.read())
loc.store.put(loc.key("reply"), loc.store.get(loc.key("hello")) + b", read by the child")
try:
    bare.store.get(bare.key("hello"))
except Exception as e:
    print(type(e).__name__, e)
"""


@pytest.mark.s3
def test_a_pickled_store_reaches_s3_from_a_process_with_no_aws_variables(s3_bucket: str, tmp_path: Path) -> None:
    """What a Spark executor gets: the store, pickled with the driver's options.  The same
    store without credentials (``--no-forward-credentials``) leaves the child to its own
    identity, which here is none."""
    loc = resolve(f"s3://{s3_bucket}/t")
    loc.store.put(loc.key("hello"), b"from the parent")
    bare = Location(loc.store.without_credentials(), loc.prefix, loc.uri)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # no instance role to look for, no ~/.aws to read: the child has no identity of its own
    env.update(AWS_EC2_METADATA_DISABLED="true", HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", CHILD], input=pickle.dumps((loc, bare)), env=env,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    assert loc.store.get(loc.key("reply")) == b"from the parent, read by the child"
    assert r.stdout.decode().startswith("StorageError ") and "no AWS credentials" in r.stdout.decode()


PLUGIN_TESTS = '''
import uuid

import pytest

from shale.storage import resolve
from shale.testing.storage import StoreConformance


class TestPluggedStore(StoreConformance):
    flags = {"supports_conditional_writes": True, "process_safe": False,
             "shared_between_processes": False, "reads_are_local": True}
    leaves_unfinished_writes = False

    @pytest.fixture
    def store(self):
        return resolve(f"memory://plugin-{uuid.uuid4().hex[:12]}").store
'''


def test_a_plugin_author_runs_the_shipped_conformance_suite(tmp_path: Path) -> None:
    """From a folder of its own, with no conftest of Shale's: the suite is in the package."""
    (tmp_path / "test_plugged_store.py").write_text(PLUGIN_TESTS)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = r.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
