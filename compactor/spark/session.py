"""The Spark engine's session: a classic one (a master, or the application spark-submit
made) or a Spark Connect client (``sc://`` server, or ``local[N]`` started in this
process), and the code shipped to it.  The engine uses only what both kinds offer: the
DataFrame API, Arrow-native Python functions, artifacts and tags.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

from pyspark.sql import SparkSession

from shale.compactor.spark.options import SparkJobError, SparkOptions, SparkUnavailableError
from shale.ledger.errors import InvalidInputError, ShaleError
from shale.ledger.masking import mask_secrets

__all__ = ["DAEMON_MODULE", "active_session", "first_line", "is_connect", "open_session", "package_zip",
           "spark_call", "stop_session", "tagged", "worker_settings"]

T = TypeVar("T")

_PANDAS_WARNING: Final = "PySpark does not yet fully support pandas"
_PANDAS_FILTER: Final = f"ignore:{_PANDAS_WARNING}:FutureWarning"
#: The daemon that imports Shale's task modules before forking the Python workers.
DAEMON_MODULE: Final = "shale.spark.daemon"


def package_zip() -> str:
    """The ``shale`` package as one zip, for ``addArtifacts(..., pyfile=True)`` (its
    subpackages are links in a source tree, hence a walk that follows them)."""
    fd, path = tempfile.mkstemp(prefix="shale-code-", suffix=".zip")
    os.close(fd)
    root = Path(sys.modules["shale"].__file__ or "").parent
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for folder, dirs, files in os.walk(root, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                p = Path(folder) / name
                if p.suffix in (".py", ".typed", ".properties"):
                    z.write(p, str(Path("shale") / p.relative_to(root)))
    return path


def worker_settings(*, shale_installed: bool) -> tuple[tuple[str, str], ...]:
    """The Spark settings for executors' Python workers that the engine's own session
    takes (before the user's ``conf``, which may override them): reuse workers across
    tasks, and, when Shale is installed where the executors run (not shipped as a zip,
    which reaches only the workers), fork them from :mod:`shale.spark.daemon`, so that
    no task pays Shale's and NumPy's imports."""
    reuse = (("spark.python.worker.reuse", "true"),)
    return (*reuse, ("spark.python.daemon.module", DAEMON_MODULE)) if shale_installed else reuse


def is_connect(session: Any) -> bool:
    """Whether ``session`` is a Spark Connect client."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def active_session() -> Any | None:
    """The session this thread would join, classic or Spark Connect, if any."""
    found: Any = SparkSession.getActiveSession()
    if found is None and "pyspark.sql.connect.session" in sys.modules:
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        found = ConnectSession.getActiveSession()
    return found


def _warning_filters() -> str:
    """``PYTHONWARNINGS`` for the Python workers: this process's, and PySpark's warning
    about the pandas installed silenced (Shale's tasks use no pandas, and a run's standard
    error is one line per error)."""
    given = os.environ.get("PYTHONWARNINGS", "")
    return given if _PANDAS_FILTER in given else ",".join(filter(None, (given, _PANDAS_FILTER)))


@contextlib.contextmanager
def _local_worker_environment(local: bool) -> Iterator[None]:
    """Python workers must run this interpreter, which has Shale and its dependencies:
    PySpark takes theirs from ``PYSPARK_PYTHON`` (else ``python3`` on the path) as the
    application starts, and a JVM started then keeps it for the workers it starts, a Spark
    Connect server's too (whose workers get no ``spark.executorEnv`` settings: they
    inherit the warning filter the same way).  Set for that moment only, and only for a
    local application."""
    if not local:
        yield
        return
    saved = {"PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON"), "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS")}
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONWARNINGS"] = _warning_filters()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                with contextlib.suppress(KeyError):  # (a write, not a read of a variable)
                    del os.environ[k]
            else:
                os.environ[k] = v


def _builder_settings(options: SparkOptions, ship: bool) -> list[tuple[str, str]]:
    """The settings the engine's own application starts with (not for a remote server)."""
    # Workers get the warning filter as an executor variable.
    out = [("spark.app.name", options.app_name), ("spark.executorEnv.PYTHONWARNINGS", _warning_filters()),
           *worker_settings(shale_installed=not ship)]
    if options.is_local:
        out.append(("spark.ui.showConsoleProgress", "false"))
        if not any(k == "spark.driver.extraJavaOptions" for k, _ in options.conf):
            log_conf = Path(__file__).with_name("log4j2.properties")
            out.append(("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log_conf}"))
    return [*out, *options.conf]


def open_session(options: SparkOptions) -> tuple[Any, str | None]:
    """Start (or join) the Spark session the engine runs in; also return the code zip
    shipped to it, if any (the caller deletes it when done).  This process's environment
    is left as it is: what Spark's processes need goes through Spark's settings."""
    warnings.filterwarnings("ignore", message=_PANDAS_WARNING, category=FutureWarning)
    # (a Spark Connect client warns as it gives up on its server: the error says it in one line)
    warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]", category=UserWarning)
    remote = options.effective_remote
    ship = options.ship_code if options.ship_code is not None else not options.is_local
    where = remote or options.effective_master or "from spark-submit"
    try:
        if remote is not None and remote.startswith("sc://"):
            session = _open_client(options, remote)
        else:
            builder = SparkSession.builder
            if remote is not None:
                builder = builder.remote(remote)  # a Spark Connect server started in this process
            elif options.effective_master is not None:
                builder = builder.master(options.effective_master)
            for k, v in _builder_settings(options, ship):
                builder = builder.config(k, v)
            with _local_worker_environment(options.is_local), warnings.catch_warnings():
                # A Spark Connect server started here takes every setting as it starts,
                # then its client warns that it cannot set those again.
                warnings.filterwarnings("ignore", message="Failed to set spark", category=UserWarning)
                session = builder.getOrCreate()
    except ShaleError:
        raise
    except Exception as e:
        raise SparkUnavailableError(f"cannot start Spark with {'server' if remote else 'master'} "
                                    f"{mask_secrets(where)!r}: {first_line(e)}") from None
    shipped = None
    if ship:
        shipped = package_zip()
        spark_call(lambda: session.addArtifacts(shipped, pyfile=True))
    return session, shipped


def _open_client(options: SparkOptions, remote: str) -> Any:
    """A client of a Spark Connect server: only the settings a session may change apply."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(remote).getOrCreate()
    _check_reachable(session)
    for k, v in options.conf:
        try:
            session.conf.set(k, v)
        except Exception as e:
            raise InvalidInputError(f"--spark-conf {k}: the Spark Connect server refuses it ({first_line(e)}); "
                                    "set it where the server starts") from None
    return session


#: How long a new client waits for its server, at most, before the run fails: the client's
#: own retries wait ten minutes (for a server restarting under a live session).
_CONNECT_RETRIES: Final = 5
_CONNECT_BACKOFF_MS: Final = (250, 4000)


@contextlib.contextmanager
def _patient_for_seconds(session: Any) -> Iterator[None]:
    """Meanwhile, a Spark Connect client gives up on its server after a few seconds."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    client = session.client
    saved = client.get_retry_policies()
    client.set_retry_policies([DefaultPolicy(max_retries=_CONNECT_RETRIES, initial_backoff=_CONNECT_BACKOFF_MS[0],
                                             backoff_multiplier=2.0, max_backoff=_CONNECT_BACKOFF_MS[1])])
    try:
        yield
    finally:
        client.set_retry_policies(saved)


def _check_reachable(session: Any) -> None:
    """Ask the server its version; if it does not answer, close the client (else, as this
    process exits, it would try again to reach the server for minutes)."""
    try:
        with _patient_for_seconds(session):
            session.version  # noqa: B018
    except BaseException:
        with contextlib.suppress(Exception):
            session.client.close()
        raise


def stop_session(session: Any) -> None:
    """Stop a session this engine started (a Spark Connect client's: released on its
    server, giving up after a few seconds if the server is gone).  Never raises."""
    with contextlib.suppress(Exception):
        if is_connect(session) and not session.is_stopped:
            with _patient_for_seconds(session):
                session.stop()
        else:
            session.stop()
    if is_connect(session):
        with contextlib.suppress(Exception):
            session.client.close()


_EXCEPTION_LINE: Final = re.compile(r"^\s*((?:\w+\.)*\w*(?:Error|Exception|Exit)\b:?.*)$")
#: what a gRPC error (a Spark Connect client's) says went wrong
_GRPC_DETAILS: Final = re.compile(r'^\s*details = "(.*)"\s*$', re.M)


def first_line(e: BaseException) -> str:
    """The line that says what went wrong, secrets masked: the innermost Python exception
    a task raised if there is one, else the first line."""
    text = str(e)
    grpc = _GRPC_DETAILS.search(text)
    if grpc:
        return mask_secrets(grpc.group(1)[:300])
    lines = text.splitlines()
    found = [m.group(1) for m in map(_EXCEPTION_LINE.match, lines) if m and "Traceback" not in m.group(1)]
    python = [f for f in found if not f.startswith(("org.", "java.", "py4j.", "scala.", "io.grpc."))]
    if python:
        return mask_secrets(python[0][:300])
    for line in lines:
        line = line.strip()
        if line:
            return mask_secrets(line[:300])
    return type(e).__name__


def spark_call(fn: Callable[[], T]) -> T:
    """Run a Spark action; a failed job becomes one :class:`SparkJobError` line."""
    try:
        return fn()
    except ShaleError:
        raise
    except Exception as e:
        raise SparkJobError(f"Spark job failed: {first_line(e)}") from None


@contextlib.contextmanager
def tagged(session: Any, tag: str) -> Iterator[None]:
    """Tag the Spark jobs this thread runs meanwhile (``spark.job.tags`` in Spark's UI
    and event log), so that an operator sees which of a run's passes each one is."""
    with contextlib.suppress(Exception):
        session.addTag(tag)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            session.removeTag(tag)
