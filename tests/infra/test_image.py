"""The container image, built and run for real: ``infra/docker/build.sh local`` builds it
(docker where an engine answers, else buildah), and ``infra/docker/run.sh`` runs it as the
CronJob does (uid 10001, read-only root, writable /tmp, the topic folder at /data).

The Spark image is built and run only with ``SHALE_LONG_TESTS=1``: Java and PySpark make
its build several minutes longer."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shale.producer import TopicWriter
from shale.reader import TopicReader
from tests.conftest import ROOT, run_cli
from tests.needs import need

DOCKER = ROOT / "infra" / "docker"
UID = 10001
LONG = os.environ.get("SHALE_LONG_TESTS") == "1"


def _engine_missing() -> str | None:
    """Why no image can be built here, or None."""
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return None
    if not shutil.which("buildah"):
        return "no Docker engine and no buildah (scripts/test.sh installs buildah as root on Debian)"
    if os.geteuid() != 0:
        return "buildah's chroot isolation needs root here"
    return None


def build(target: str) -> str:
    need(_engine_missing())
    started = time.monotonic()
    res = subprocess.run([str(DOCKER / "build.sh"), target], capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, res.stderr[-4000:]
    print(f"built {target} image in {time.monotonic() - started:.0f}s")
    return res.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def local_image() -> str:
    return build("local")


def run(target: str, data: Path, *args: str, entrypoint: str | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    cmd = [str(DOCKER / "run.sh"), target, str(data)]
    if entrypoint:
        cmd += ["--entrypoint", entrypoint]
    return subprocess.run([*cmd, "--", *args], capture_output=True, text=True, timeout=timeout)


def produce(uri: str, seed: int, n: int = 4_000) -> None:
    rnd = random.Random(seed)
    with TopicWriter(uri, max_ledger_records=1_000, batch_size=50) as w:
        for i in range(n):
            key = f"key-{rnd.randrange(600)}"
            w.append(key, None if rnd.random() < 0.05 else f"value-{seed}-{i}")


def compacted(uri: str) -> list[tuple[str, Any, Any]]:
    with TopicReader(uri, read_compacted=True) as r:
        return [(str(m.id), m.key, m.value) for m in r.read()]


def owned_by_the_image(path: Path) -> None:
    for p in (path, *path.rglob("*")):
        os.chown(p, UID, UID)


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    """A folder for /data that uid 10001 may write, as an fsGroup makes the CronJob's."""
    d = tmp_path / "data"
    d.mkdir()
    yield d


def host_reference(tmp_path: Path, seed: int) -> list[tuple[str, Any, Any]]:
    """The same topic produced and compacted on the host, by the host's own Shale."""
    ref = str(tmp_path / "ref")
    produce(ref, seed)
    res = run_cli(ref, script="compact")
    assert res.returncode == 0, res.stderr
    return compacted(ref)


# --- what needs no image ---------------------------------------------------------------------

def test_run_script_refuses_a_folder_the_image_user_cannot_write(tmp_path: Path) -> None:
    d = tmp_path / "root-owned"
    d.mkdir(mode=0o755)
    res = run("local", d, "/data/t")
    assert res.returncode == 2
    assert res.stderr.strip() == (f"run.sh: {d} is not writable by uid {UID}, which the image runs as "
                                  f"(chown -R {UID}:{UID} {d})")
    res = run("local", tmp_path / "missing", "/data/t")
    assert (res.returncode, res.stderr.strip()) == (2, f"run.sh: {tmp_path / 'missing'} is not a directory")


def test_scripts_refuse_an_unknown_target() -> None:
    for cmd in ([str(DOCKER / "build.sh"), "gpu"], [str(DOCKER / "run.sh"), "gpu", "/tmp", "--", "x"]):
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 2 and res.stderr.startswith("usage: infra/docker/"), res.stderr


# --- the local image -------------------------------------------------------------------------

@pytest.mark.slow
def test_image_runs_the_c_kernels(local_image: str, data: Path) -> None:
    owned_by_the_image(data)
    res = run("local", data, "--print-config")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["kernels"] == "native"


@pytest.mark.slow
def test_a_failing_command_in_the_image_gives_its_own_line_and_exit_code(local_image: str, data: Path) -> None:
    owned_by_the_image(data)
    res = run("local", data, "/data/missing")
    assert res.returncode == 2
    assert res.stderr.strip() == ("compact: error: no topic at /data/missing "
                                  "(/data/missing/_meta/topic.json is missing)")


@pytest.mark.slow
def test_image_compacts_a_topic_produced_on_the_host(local_image: str, data: Path, tmp_path: Path) -> None:
    produce(str(data / "t"), seed=1)
    owned_by_the_image(data)
    res = run("local", data, "/data/t", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "compacted" and summary["records_read"] == 4_000
    res = run("local", data, "verify", "/data/t", entrypoint="shale")
    assert res.returncode == 0 and " ok: " in res.stdout, res.stdout + res.stderr
    assert compacted(str(data / "t")) == host_reference(tmp_path, seed=1)
    # what the container wrote is uid 10001's
    written = [p for p in (data / "t" / "compacted").rglob("*") if p.is_file()]
    assert written and {p.stat().st_uid for p in written} == {UID}


@pytest.mark.slow
@pytest.mark.s3
def test_image_compacts_a_topic_on_the_hosts_s3_server(local_image: str, data: Path, tmp_path: Path,
                                                       s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/t"
    produce(uri, seed=2)
    owned_by_the_image(data)
    # the endpoint and credentials reach the container only as AWS_* variables of run.sh's shell
    assert os.environ["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    res = run("local", data, uri, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["status"] == "compacted"
    assert compacted(uri) == host_reference(tmp_path, seed=2)
    assert run_cli("verify", uri).returncode == 0


PROBE = r"""
id -u; id -g
for d in / /etc /opt/shale /opt/shale/bin /home/shale /root /run /var/tmp /usr/local /tmp /data; do
  if (echo x > "$d/.probe") 2>/dev/null; then echo "writable $d"; rm -f "$d/.probe"; fi
done
find / -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type d -writable -print \
  2>/dev/null || true  # folders it may not read make find exit 1
"""


@pytest.mark.slow
def test_image_runs_as_10001_and_writes_only_tmp_and_data(local_image: str, data: Path) -> None:
    owned_by_the_image(data)
    res = run("local", data, "-c", PROBE, entrypoint="sh")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split()
    assert lines[:2] == [str(UID), str(UID)]
    tried = [line for line in res.stdout.splitlines() if line.startswith("writable ")]
    assert tried == ["writable /tmp", "writable /data"]
    found = [line for line in res.stdout.splitlines()[2:] if line.startswith("/")]
    assert found and all(p == "/tmp" or p.startswith(("/tmp/", "/data")) for p in found), found
    # the container's /tmp was a fresh directory, and is gone with the container
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("shale-run-tmp.*"))


_COMPILED = """
import importlib.util, os, pathlib, sys, shale
root = pathlib.Path(shale.__file__).parent
sources = sorted(root.rglob("*.py"))
missing = [str(p) for p in sources if not os.path.isfile(importlib.util.cache_from_source(str(p)))]
print(len(sources), sys.flags.dont_write_bytecode, *missing)
"""


@pytest.mark.slow
def test_image_carries_shales_modules_compiled(local_image: str, data: Path) -> None:
    # the image cannot write a bytecode cache: without its modules compiled at build time
    # every command would compile them again
    owned_by_the_image(data)
    res = run("local", data, "-c", _COMPILED, entrypoint="python")
    assert res.returncode == 0, res.stderr
    count, no_writes, *missing = res.stdout.split()
    assert int(count) > 100 and no_writes == "1" and missing == []


# --- the Spark image (SHALE_LONG_TESTS=1) ----------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not LONG, reason="the Spark image's build takes minutes: SHALE_LONG_TESTS=1 runs it")
def test_spark_image_compacts_with_the_spark_engine(data: Path, tmp_path: Path) -> None:
    build("spark")
    produce(str(data / "t"), seed=3)
    owned_by_the_image(data)
    res = run("spark", data, "--engine", "spark", "--spark-master", "local[2]", "/data/t", "--json",
              timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert json.loads(res.stdout.strip().splitlines()[-1])["status"] == "compacted"
    assert compacted(str(data / "t")) == host_reference(tmp_path, seed=3)
    res = run("spark", data, "--print-config")
    assert res.returncode == 0 and json.loads(res.stdout)["kernels"] == "native", res.stderr
