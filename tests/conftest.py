"""Shared fixtures: a real moto S3 server and a real SeaweedFS server (each started once
per session, when first needed), fresh topics on every backend, and helpers to run the
console scripts."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.needs import check_needs, need, need_module

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ["memory", "local", "s3"]
AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
            "AWS_SESSION_TOKEN", "AWS_REGION")


@contextmanager
def without_aws_environment() -> Iterator[None]:
    """Every test that starts Spark starts it inside this.  PySpark launches its JVM once per
    process, with the environment of that moment, and every process Spark starts later
    (Python workers, local-cluster executors) inherits it: a JVM launched while the moto
    fixture's variables were set would hand them to every executor of every later test,
    and the tests that prove executors reach S3 through the shipped store alone would
    prove nothing."""
    saved = {k: os.environ.pop(k) for k in AWS_VARS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


#: the local Spark application shared by the tests that run Spark in this process, while it
#: runs, and the Spark Connect client of it (if one was asked for)
_LOCAL_SPARK: list[Any] = []
_LOCAL_CONNECT: list[Any] = []


#: This process's environment just before and just after the shared application last started.
LOCAL_SPARK_ENVIRONMENT: dict[str, dict[str, str]] = {}

#: The two ways the Spark tests reach the shared application: a classic session, and a
#: Spark Connect client (which has no RDD API and no ``sparkContext``: a test run through
#: it fails if the code under test reaches for either).
SPARK_APIS = ("classic", "connect")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_spark(*, fresh: bool = False) -> Any:
    """The local Spark application (``local[2,2]``: two cores, a failed task tried once
    more) that the tests running Spark in this process share, started on first use inside
    :func:`without_aws_environment` and stopped when the session ends; it also serves
    Spark Connect clients (:func:`local_connect`), on a port of its own.  PySpark keeps one
    application per process: one for every module would cost each its start and stop.
    Engines given it (``SparkEngine(options, session=...)``) do not stop it; a module
    whose application needs another master calls :func:`stop_local_spark` first.  The
    modules that register the ``shale`` data source ask for a ``fresh`` one: a session on
    which an earlier module had registered it once failed to find it for writes."""
    if fresh:
        stop_local_spark()
    if _LOCAL_SPARK and _LOCAL_SPARK[0].sparkContext._jsc is not None:
        return _LOCAL_SPARK[0]
    from shale.compactor.spark import SparkOptions
    from shale.compactor.spark.engine import open_session

    conf = (("spark.ui.enabled", "false"), ("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin"),
            ("spark.connect.grpc.binding.address", "127.0.0.1"), ("spark.connect.grpc.binding.port", str(_free_port())))
    with without_aws_environment():
        LOCAL_SPARK_ENVIRONMENT["before"] = dict(os.environ)
        session, _ = open_session(SparkOptions(master="local[2,2]", conf=conf))
        LOCAL_SPARK_ENVIRONMENT["after"] = dict(os.environ)
    _LOCAL_SPARK[:] = [session]
    return session


def need_spark_connect() -> None:
    """Spark Connect's client (PySpark's ``connect`` extra, which ``shale[spark]`` asks for),
    or :func:`~tests.needs.missing` it."""
    for module in ("grpc", "grpc_status", "google.rpc"):
        need_module(module)


def local_connect(*, fresh: bool = False) -> Any:
    """A Spark Connect client of the shared local application (:func:`local_spark`)."""
    need_spark_connect()
    classic = local_spark(fresh=fresh)
    if _LOCAL_CONNECT and _LOCAL_CONNECT[0][0] is classic:
        return _LOCAL_CONNECT[0][1]
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    port = classic.conf.get("spark.connect.grpc.binding.port")
    client = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").create()
    _LOCAL_CONNECT[:] = [(classic, client)]
    return client


def spark_session(api: str, *, fresh: bool = False) -> Any:
    """The shared local application as ``api`` (one of :data:`SPARK_APIS`) reaches it."""
    return local_connect(fresh=fresh) if api == "connect" else local_spark(fresh=fresh)


def stop_local_spark() -> None:
    """Stop the shared local Spark application, if it runs (and its Spark Connect client)."""
    while _LOCAL_CONNECT:
        with contextlib.suppress(Exception):
            _LOCAL_CONNECT.pop()[1].stop()
    while _LOCAL_SPARK:
        _LOCAL_SPARK.pop().stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stop_local_spark()


def pytest_runtest_setup(item: pytest.Item) -> None:
    check_needs(item)  # before the test's fixtures start anything


@pytest.fixture(autouse=True)
def golden_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``shale read`` run in this process, record by record and in Arrow batches,
    compared byte for byte (tests/golden.py)."""
    from tests.golden import compare_reads

    compare_reads(monkeypatch)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """Start ``tests/moto_server.py`` on port 0 and point the AWS environment at it."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "moto_server.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"moto server did not start: {line!r}")
    endpoint = f"http://127.0.0.1:{int(line.split()[1])}"
    saved = {k: os.environ.get(k) for k in
             ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
              "AWS_SESSION_TOKEN", "AWS_PROFILE")}
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing-key-id",
                      AWS_SECRET_ACCESS_KEY="testing-secret-key", AWS_DEFAULT_REGION="us-east-1")
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    from shale.storage import clear_backend_cache

    clear_backend_cache()
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        clear_backend_cache()


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> str:
    """A new, empty bucket on the moto server."""
    import boto3

    name = f"shale-test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


#: the one bucket the tests share on SeaweedFS (each test gets a fresh folder in it)
SEAWEEDFS_BUCKET = "shale-tests"


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A SeaweedFS server (``weed mini``, :mod:`shale.testing.seaweedfs`) on 127.0.0.1,
    its data under the session's temporary folder, with :data:`SEAWEEDFS_BUCKET`.  It
    leaves the environment alone: a test reaches it through :func:`seaweedfs_env`."""
    from shale.testing.seaweedfs import SeaweedFS

    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs"), buckets=(SEAWEEDFS_BUCKET,)) as weed:
        yield weed


@pytest.fixture
def seaweedfs_env(seaweedfs: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The AWS environment pointed at SeaweedFS for this test only, stores resolved anew
    on both sides: moto's session-wide variables are back for the next test.  A test
    that uses moto too gets moto started first, so that moto's fixture never saves (and
    restores at the session's end) SeaweedFS's variables."""
    from shale.storage import clear_backend_cache

    if "moto_endpoint" in request.fixturenames:
        request.getfixturevalue("moto_endpoint")
    for k in (*AWS_VARS, "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in seaweedfs.environment().items():
        monkeypatch.setenv(k, v)
    clear_backend_cache()
    yield seaweedfs
    clear_backend_cache()


def seaweedfs_root(request: pytest.FixtureRequest) -> str:
    """A fresh folder on SeaweedFS, the environment pointed at it for this test.  A folder
    in one shared bucket, not a bucket of its own: SeaweedFS gives every bucket volumes of
    its own, so a bucket costs a fraction of a second and the server runs out of volumes
    after some dozens (see docs/operations.md)."""
    request.getfixturevalue("seaweedfs_env")
    request.applymarker(pytest.mark.seaweedfs)
    return f"s3://{SEAWEEDFS_BUCKET}/{uuid.uuid4().hex[:12]}/root"


def make_root(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh folder URI on backend ``kind`` (``seaweedfs``: on the SeaweedFS server,
    through ``s3://``, with the environment pointed there for the test)."""
    if kind == "memory":
        return f"memory://test-{uuid.uuid4().hex[:12]}/root"
    if kind == "local":
        return str(tmp_path / "root")
    if kind == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        return f"s3://{bucket}/root"
    if kind == "seaweedfs":
        return seaweedfs_root(request)
    raise ValueError(kind)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "s3":
        request.applymarker(pytest.mark.s3)
    if request.param == "seaweedfs":
        request.applymarker(pytest.mark.seaweedfs)
    return str(request.param)


@pytest.fixture
def root_uri(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return make_root(backend, request, tmp_path)


@pytest.fixture
def topic_uri(root_uri: str) -> str:
    return f"{root_uri}/topics/orders"


@pytest.fixture(params=["local", "s3"])
def disk_topic_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A topic on a store another process can see (local folder or moto)."""
    return f"{make_root(str(request.param), request, tmp_path)}/topics/orders"


def run_cli(*args: str, input: str | None = None, env: dict[str, str] | None = None,
            script: str = "shale", timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run an installed console script (``shale`` or ``compact``) as a real process."""
    exe = Path(sys.executable).parent / script
    cmd = [str(exe), *args] if exe.exists() else [sys.executable, "-m",
                                                   "shale.cli" if script == "shale" else "shale.compactor.cli", *args]
    return subprocess.run(cmd, input=input, capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=timeout, cwd=ROOT)


def run_cli_here(*args: str, input: str | None = None, env: dict[str, str] | None = None,
                 script: str = "shale") -> subprocess.CompletedProcess[str]:
    """:func:`run_cli` in this process: the same parser, command, one-line errors and exit
    code, without starting Python and importing Shale again (about half a second a run).
    For tests of what a command does; what only a process shows (signals, lines written
    past Python to the file descriptors, the console script itself) needs :func:`run_cli`."""
    from shale.cli import build_compact_parser, build_parser, run_command

    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in env or {}}
    stdin = sys.stdin
    try:
        os.environ.update(env or {})
        if input is not None:
            sys.stdin = io.TextIOWrapper(io.BytesIO(input.encode()), encoding="utf-8")
        parser = build_compact_parser() if script == "compact" else build_parser()
        code = run_command(list(args), parser, out=out, err=err, prog=script)
    finally:
        sys.stdin = stdin
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess([script, *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def prometheus_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Pushgateway and Prometheus (tests/monitoring.py), one per session; skipped
    where their binaries are not installed, failed in CI, whose test command installs them."""
    from tests.monitoring import PrometheusStack, missing_binaries

    need(missing_binaries())
    stack = PrometheusStack(tmp_path_factory.mktemp("monitoring"))
    try:
        yield stack
    finally:
        stack.stop()
