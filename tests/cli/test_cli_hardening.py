"""Settings that could not work are refused before anything is written, values out of
range are bad input (exit 2) naming what was given, and secrets never show: not in the
command's line, not in a Python exception, a traceback, a JSON log, a run summary or
``--print-config``."""

from __future__ import annotations

import json
import os
import socket
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shale.cli.errors import exit_code_of
from shale.compactor import Compactor
from shale.ledger.errors import StoragePermissionError
from shale.metadata.topic import TopicMetadata
from shale.producer import TopicWriter
from shale.reader import TopicReader
from shale.storage import clear_backend_cache
from tests.cli.test_cli_errors import one_line_error
from tests.conftest import run_cli

# ------------------------------------------------------------- settings that cannot work


def produce(uri: str, n: int) -> None:
    with TopicWriter(uri) as w:
        for i in range(n):
            w.append(f"k{i % 50}", f"value {i} " * 4)


def test_zstd_dict_is_refused_at_config_set_while_the_topic_has_no_dictionary(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 10)
    for value in ("zstd-dict", "zstd-dict:5"):
        r = run_cli("config", uri, "--set", f"compression={value}")
        one_line_error(r, 2, "--set compression", f"shale dictionary {uri} --train")
    assert TopicMetadata.open(uri).load_policy().version == 0  # nothing was written
    # the topic still takes records and compacts (a policy set would have wedged both)
    assert run_cli("produce", uri, input='{"key":"a","value":"b"}\n').returncode == 0
    assert run_cli("compact", uri).returncode == 0


def test_dictionary_train_use_still_sets_zstd_dict(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    with TopicWriter(uri, batch_size=2) as w:
        for i in range(3000):
            w.append(f"user-{i % 400:05d}", json.dumps({"id": i % 400, "email": f"user{i % 400}@example.com",
                                                        "status": ("active", "invited")[i % 2], "seq": i}))
    r = run_cli("dictionary", uri, "--train", "--size", "4KiB", "--use")
    assert r.returncode == 0, r.stderr
    assert str(TopicMetadata.open(uri).load_policy().compression).startswith("zstd-dict")
    # with a dictionary registered, config --set takes it too
    assert run_cli("config", uri, "--set", "compression=zstd-dict:7").returncode == 0
    assert str(TopicMetadata.open(uri).load_policy().compression) == "zstd-dict:7"


@pytest.mark.parametrize("args, needle", [
    (["compact", "--max-read-bytes-per-second", "1"], "--max-read-bytes-per-second"),
    (["compact", "--max-write-bytes-per-second", "65535"], "--max-write-bytes-per-second"),
    (["verify", "--scrub", "--max-read-bytes-per-second", "1KiB"], "--max-read-bytes-per-second"),
])
def test_throttles_below_the_floor_are_refused(tmp_path: Path, args: list[str], needle: str) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 200)
    r = run_cli(args[0], uri, *args[1:])
    one_line_error(r, 2, needle, "64KiB")
    assert not (tmp_path / "t" / "compacted").exists()  # nothing written


def test_a_throttle_variable_below_the_floor_is_refused_naming_it(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 200)
    r = run_cli(uri, env={"SHALE_MAX_READ_BYTES_PER_SECOND": "1"}, script="compact")
    one_line_error(r, 2, "SHALE_MAX_READ_BYTES_PER_SECOND", "64KiB")
    assert not (tmp_path / "t" / "compacted").exists()
    # the floor itself, and 0 (no limit), are taken
    r = run_cli(uri, "--max-read-bytes-per-second", "64KiB", "--max-write-bytes-per-second", "0", script="compact")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("setting", [
    "retention=1e30", "retention=P99999999999D", "retention-bytes=9EB", "retention-bytes=99999999999999999999",
    "delete-retention=1e30", "min-compaction-lag=1e300", "max-compaction-lag=1e30", "min-dirty-ratio=1.5",
    "min-dirty-ratio=nan", "retain-null-key=maybe", "compression=zstd:99",
])
def test_policy_values_out_of_range_are_bad_input_naming_the_key(tmp_path: Path, setting: str) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 10)
    assert run_cli("config", uri, "--set", "delete-retention=7d").returncode == 0
    before = (tmp_path / "t" / "_meta" / "policy.json").read_bytes()
    r = run_cli("config", uri, "--set", setting)
    line = one_line_error(r, 2, f"--set {setting.split('=')[0]}:")
    assert "policy.json" not in line  # a value given is never blamed on the document
    assert (tmp_path / "t" / "_meta" / "policy.json").read_bytes() == before


@pytest.mark.parametrize("args, needle", [
    (["compact", "--delete-retention", "1e30"], "--delete-retention"),
    (["compact", "--max-compaction-lag", "P99999999999D"], "--max-compaction-lag"),
    (["compact", "--max-map-bytes", "99999999999999999999"], "--max-map-bytes"),
    (["truncate", "--older-than", "1e30"], "--older-than"),
    (["truncate", "--keep-bytes", "9EB"], "--keep-bytes"),
    (["read", "--limit", "99999999999999999999"], "--limit"),
    (["read", "--poll-interval", "1e30"], "--poll-interval"),
])
def test_flags_out_of_range_are_bad_input_naming_the_flag(tmp_path: Path, args: list[str], needle: str) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 10)
    r = run_cli(args[0], uri, *args[1:])
    one_line_error(r, 2, needle, "out of range" if needle != "--limit" else "from 1 to")
    assert not (tmp_path / "t" / "compacted").exists()


# ------------------------------------------------------------------------- exit codes


def test_a_message_id_of_thousands_of_digits_is_bad_input_in_one_short_line(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 10)
    huge = "7" * 5000
    for start in (f"{huge}:0:0", f"1:{huge}:0", f"1:0:{huge}"):
        line = one_line_error(run_cli("read", uri, "--start", start), 2, "bad message id")
        assert len(line) < 300
    line = one_line_error(run_cli("read", uri, "--start", "18446744073709551616:0:0"), 2, "out of range")
    assert "2^64" in line
    line = one_line_error(run_cli("truncate", uri, "--before-ledger", huge), 2, "--before-ledger")
    assert len(line) < 400


def test_access_denied_is_a_permission_error_exit_2_on_every_backend() -> None:
    """Refused access is how the command is run (its identity, a bucket policy, a file's
    mode), not the data: exit 2 from S3 and fsspec stores as from a local folder."""
    import botocore.exceptions as bex
    import fsspec

    from shale.storage._fsspec import FsspecStore
    from shale.storage._s3 import _translate

    denied = bex.ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"},
                              "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject")
    e = _translate(denied, "s3://bucket/t/_meta/topic.json")
    assert isinstance(e, StoragePermissionError) and exit_code_of(e) == 2
    assert str(e) == "s3://bucket/t/_meta/topic.json: access denied"

    def refuse() -> None:
        raise PermissionError(13, "Permission denied")

    with pytest.raises(StoragePermissionError, match="permission denied") as info:
        FsspecStore(fsspec.filesystem("memory"), "memory", "x")._wrap("t/doc", refuse)
    assert exit_code_of(info.value) == 2


def test_get_with_a_key_that_is_not_base64_is_bad_input(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    produce(uri, 10)
    one_line_error(run_cli("get", uri, "!!!", "--key-b64"), 2, "'!!!'", "not base64")
    r = run_cli("get", uri, "azA=", "--key-b64")  # "k0"
    assert r.returncode == 0 and json.loads(r.stdout)["key"] == "k0"


# ---------------------------------------------------------------------------- secrets

PASSWORD = "Pa55-w0rd-6127"


def _unreachable_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


@pytest.fixture(params=["unreachable", "moto"])
def endpoint_with_password(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``AWS_ENDPOINT_URL`` with a password in it, pointing at nothing or at the moto server.
    Nothing listening is tried twice (``SHALE_S3_ATTEMPTS``) rather than six times: the
    error still comes through the retry policy, without its growing waits."""
    if request.param == "moto":
        request.applymarker(pytest.mark.s3)
        port = int(str(request.getfixturevalue("moto_endpoint")).rsplit(":", 1)[1])
    else:
        port = _unreachable_port()
        monkeypatch.setenv("SHALE_S3_ATTEMPTS", "2")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://admin:{PASSWORD}@127.0.0.1:{port}")
    for name, value in (("AWS_ACCESS_KEY_ID", "testing-key-id"), ("AWS_SECRET_ACCESS_KEY", "testing-secret-key"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, os.environ.get(name, value))
    clear_backend_cache()
    yield "s3://shale-secrets/topics/t"
    clear_backend_cache()


def _every_text_of(e: BaseException) -> str:
    """Whatever a program or a log could show of ``e``: its text, repr, args, and the
    whole traceback with every exception chained to it."""
    texts = [str(e), repr(e), repr(e.args), "".join(traceback.format_exception(e))]
    seen: list[BaseException | None] = [e.__cause__, e.__context__]
    while seen:
        x = seen.pop()
        if x is not None:
            texts += [str(x), repr(x), repr(x.args)]
            seen += [x.__cause__, x.__context__] if len(texts) < 100 else []
    return "\n".join(texts)


@pytest.mark.parametrize("use", ["writer", "reader", "compactor"])
def test_python_api_errors_never_carry_the_endpoint_password(endpoint_with_password: str, use: str) -> None:
    uri = endpoint_with_password
    calls: dict[str, Callable[[], object]] = {
        "writer": lambda: TopicWriter(uri).close(),
        "reader": lambda: list(TopicReader(uri)),
        "compactor": lambda: Compactor(uri).run(),
    }
    with pytest.raises(Exception) as info:
        calls[use]()
    text = _every_text_of(info.value)
    assert "admin:****@127.0.0.1" in text or "no such bucket" in text  # the endpoint is named, masked
    assert PASSWORD not in text


@pytest.mark.parametrize("debug", [False, True])
def test_commands_never_show_the_endpoint_password(endpoint_with_password: str, debug: bool) -> None:
    uri = endpoint_with_password
    env = {"SHALE_DEBUG": "1"} if debug else {"SHALE_DEBUG": ""}
    runs = [run_cli("read", uri, env=env), run_cli("produce", uri, input='{"key":"a","value":"b"}\n', env=env),
            run_cli("status", uri, env=env),
            run_cli(uri, "--json", "--log-format", "json", env=env, script="compact")]
    for r in runs:
        assert r.returncode != 0
        assert PASSWORD not in r.stdout + r.stderr
        assert "admin:****@" in r.stdout + r.stderr
    if debug:
        assert all("Traceback" in r.stderr for r in runs[:3])
    summary = json.loads(runs[3].stdout)  # the run summary
    assert summary["status"] == "error" and "****" in summary["error"]
    events = [json.loads(line) for line in runs[3].stderr.splitlines() if line.startswith("{")]
    assert any(e["event"] == "topic.error" for e in events)  # the JSON log


def test_print_config_masks_presigned_urls_and_endpoint_passwords() -> None:
    presigned = ("https://gateway.example.com/metrics?X-Amz-Algorithm=AWS4-HMAC-SHA256"
                 "&X-Amz-Credential=AKIAEXAMPLE%2F20240101%2Fus-east-1%2Fs3%2Faws4_request"
                 "&X-Amz-Signature=5ec2e75e1d0a5b37d2c8&X-Amz-Security-Token=FQoGZXIvYXdzEXAMPLE"
                 "&Signature=sig-v2-value&sig=azure-sas-sig&X-Amz-Date=20240101T000000Z")
    env = {"SHALE_PUSHGATEWAY": presigned, "AWS_ENDPOINT_URL": f"http://admin:{PASSWORD}@minio:9000"}
    r = run_cli("--print-config", "s3://bucket/t", env=env, script="compact")
    assert r.returncode == 0, r.stderr
    for secret in ("AKIAEXAMPLE", "5ec2e75e1d0a5b37d2c8", "FQoGZXIvYXdzEXAMPLE", "sig-v2-value", "azure-sas-sig",
                   PASSWORD):
        assert secret not in r.stdout + r.stderr, secret
    doc = json.loads(r.stdout)
    shown = doc["settings"]["--pushgateway"]["value"]
    assert "X-Amz-Signature=****" in shown and "X-Amz-Date=20240101T000000Z" in shown
    assert doc["environment"]["AWS_ENDPOINT_URL"] == "http://admin:****@minio:9000"
