"""A throwaway PostgreSQL server on 127.0.0.1 for the Iceberg catalog tests, started by
the tests themselves (as SeaweedFS is): ``initdb`` into a fresh folder, ``postgres`` on a
free port with trust authentication for local connections only, stopped and removed at
the end.  PostgreSQL refuses to run as root: as root the server runs as the ``postgres``
user Debian's package makes, in a folder that user owns."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Final

__all__ = ["PostgresServer", "find_postgres"]

_READY_S: Final = 60.0


def find_postgres() -> str | None:
    """The folder of PostgreSQL's server programs (initdb, postgres), or None."""
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(os.path.realpath(found))
    folders = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]) if
                     p.split("/")[-2].isdigit() else 0)
    return next((f for f in reversed(folders) if os.path.exists(os.path.join(f, "initdb"))), None)


def missing() -> str | None:
    """What is missing to run the server (None: nothing)."""
    if find_postgres() is None:
        return "PostgreSQL's initdb is not installed (the Debian package postgresql, which scripts/_system.sh installs)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root needs the postgres user (Debian's postgresql package makes it)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """A server for one test session: :attr:`uri` reaches its ``postgres`` database."""

    def __init__(self) -> None:
        bin_dir = find_postgres()
        assert bin_dir is not None
        self._bin = bin_dir
        # (not under pytest's folder: its 0700 parents would keep the postgres user out)
        self.root = tempfile.mkdtemp(prefix="shale-pg-")
        self.port = _free_port()
        self._user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        kw = {"user": self._user.pw_uid, "group": self._user.pw_gid} if self._user else {}
        subprocess.run(argv, check=True, capture_output=True, **kw)  # type: ignore[call-overload]

    def start(self) -> PostgresServer:
        data = os.path.join(self.root, "data")
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        self._run(os.path.join(self._bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8")
        kw = {"user": self._user.pw_uid, "group": self._user.pw_gid} if self._user else {}
        log = os.path.join(self.root, "log")
        with open(log, "wb") as err:
            self._proc = subprocess.Popen(  # type: ignore[call-overload]
                [os.path.join(self._bin, "postgres"), "-D", data, "-p", str(self.port), "-k", self.root,
                 "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"], stdout=subprocess.DEVNULL, stderr=err, **kw)
        deadline = time.monotonic() + _READY_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                with open(log) as f:
                    raise RuntimeError(f"postgres exited: {f.read()[-2000:]}")
            if self._ready():
                return self
            time.sleep(0.1)
        raise RuntimeError("postgres did not start")

    def _ready(self) -> bool:
        """Whether the server answers a query (a port that accepts is not enough: it says
        "starting up" for a while)."""
        import psycopg2

        try:
            psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                             connect_timeout=2).close()
            return True
        except psycopg2.OperationalError:
            return False

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()
