"""Running ``compact`` on a platform: settings from ``SHALE_*`` variables (flags win),
``--print-config`` with secrets masked, JSON logs, the terminal-only progress display and
metrics pushed to a stand-in HTTP endpoint (for what a real Pushgateway cannot show:
basic authentication, an unreachable one; tests/cli/test_prometheus.py pushes to a real
one)."""

from __future__ import annotations

import base64
import json
import os
import pty
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shale.ledger.masking import mask_secrets
from shale.metadata.topic import TopicMetadata
from tests.compactor.test_many_topics import lines, produce
from tests.conftest import ROOT, run_cli


def config(r: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    assert r.returncode == 0, r.stderr
    doc: dict[str, dict[str, object]] = json.loads(r.stdout)["settings"]
    return doc


# ------------------------------------------------------------ settings

def test_variables_set_every_flag_and_flags_win() -> None:
    env = {"SHALE_ALL": "/data/topics", "SHALE_MAX_TOPICS": "7", "SHALE_PARALLEL": "3", "SHALE_DRY_RUN": "yes",
           "SHALE_MAX_COMPACTION_LAG": "2h", "SHALE_MAX_MAP_BYTES": "64MiB", "SHALE_LOG_FORMAT": "json",
           "SHALE_NO_GC": "off", "SHALE_METADATA": ""}
    got = config(run_cli("--print-config", "--parallel", "2", env=env, script="compact"))
    assert got["--all"] == {"value": "/data/topics", "source": "env", "variable": "SHALE_ALL"}
    assert got["--max-topics"]["value"] == 7 and got["--max-topics"]["source"] == "env"
    assert got["--parallel"] == {"value": 2, "source": "flag", "variable": "SHALE_PARALLEL"}
    assert got["--dry-run"]["value"] is True
    assert got["--no-gc"] == {"value": False, "source": "env", "variable": "SHALE_NO_GC"}
    assert got["--max-compaction-lag"]["value"] == 7_200_000
    assert got["--max-map-bytes"]["value"] == 64 << 20
    assert got["--log-format"]["value"] == "json"
    assert got["--metadata"] == {"value": None, "source": "default", "variable": "SHALE_METADATA"}  # empty = unset
    assert got["--workers"] == {"value": 0, "source": "default", "variable": "SHALE_WORKERS"}
    # topic URIs on the command line replace SHALE_ALL (the topic list is one setting)
    got = config(run_cli("--print-config", "/a", "/b", env=env, script="compact"))
    assert got["TOPIC_URI"]["value"] == ["/a", "/b"] and got["--all"]["value"] is None


def test_a_cronjob_needs_no_arguments(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    produce(a, 60)
    produce(b, 80)
    r = run_cli(env={"SHALE_TOPICS": f"{a}\n{b}", "SHALE_JSON": "1"}, script="compact")
    assert r.returncode == 0, r.stderr
    assert [(x["topic"], x["status"]) for x in lines(r.stdout)] == [(a, "compacted"), (b, "compacted")]
    # SHALE_ALL finds both; flags win over SHALE_MAX_TOPICS
    produce(a, 30, first=60)
    produce(b, 30, first=80)
    r = run_cli("--max-topics", "1", env={"SHALE_ALL": str(tmp_path), "SHALE_JSON": "true",
                                                      "SHALE_MAX_TOPICS": "2"}, script="compact")
    assert r.returncode == 0, r.stderr
    assert len(lines(r.stdout)) == 1


@pytest.mark.parametrize(("env", "named"), [
    ({"SHALE_PARALLEL": "lots"}, "SHALE_PARALLEL"),
    ({"SHALE_DRY_RUN": "maybe"}, "SHALE_DRY_RUN"),
    ({"SHALE_ENGINE": "flink"}, "SHALE_ENGINE"),
    ({"SHALE_MAX_COMPACTION_LAG": "soon"}, "SHALE_MAX_COMPACTION_LAG"),
    ({"SHALE_SPARK_CONF": "executor.cores=2"}, "SHALE_SPARK_CONF"),
    ({"SHALE_SPARK_CONF": "spark.executor.cores=2"}, "SHALE_SPARK_CONF needs --engine spark"),
    ({"SHALE_SPARK_REMOTE": "sc://localhost:15002"}, "SHALE_SPARK_REMOTE needs --engine spark"),
    ({"SHALE_LOG_FORMAT": "xml"}, "SHALE_LOG_FORMAT"),
])
def test_a_bad_variable_is_a_one_line_usage_error(env: dict[str, str], named: str, tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    produce(topic, 30)
    r = run_cli(topic, env=env, script="compact")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and named in r.stderr, r.stderr
    assert not (tmp_path / "t" / "compacted").exists()  # nothing ran


def test_print_config_from_a_variable_is_refused(tmp_path: Path) -> None:
    """Set in a ConfigMap, it would turn every scheduled run into a silent no-op."""
    topic = str(tmp_path / "t")
    produce(topic, 30)
    for script in ("compact", "shale"):
        args = (topic,) if script == "compact" else ("compact", topic)
        r = run_cli(*args, env={"SHALE_PRINT_CONFIG": "1"}, script=script)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "SHALE_PRINT_CONFIG" in r.stderr, r.stderr
    assert not (tmp_path / "t" / "compacted").exists()


def test_every_subcommand_reads_its_variables(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    produce(topic, 30)
    # read: SHALE_LIMIT and SHALE_COMPACTED; a flag still wins
    r = run_cli("read", topic, env={"SHALE_LIMIT": "3"})
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3, r.stderr
    r = run_cli("read", topic, "--limit", "5", env={"SHALE_LIMIT": "3"})
    assert len(r.stdout.splitlines()) == 5
    # produce: SHALE_BATCH_SIZE and SHALE_MAX_LEDGER_RECORDS shape the ledgers written
    records = "".join(json.dumps({"key": f"k{i}", "value": "v"}) + "\n" for i in range(10))
    r = run_cli("produce", str(tmp_path / "p"), input=records,
                env={"SHALE_MAX_LEDGER_RECORDS": "4", "SHALE_BATCH_SIZE": "2"})
    assert r.returncode == 0, r.stderr
    ledgers = TopicMetadata.open(str(tmp_path / "p")).load_topic().ledgers
    assert [(lg.records, lg.entries) for lg in ledgers] == [(4, 2), (4, 2), (2, 1)]
    # verify: SHALE_JSON; gc: SHALE_DRY_RUN; a bad value of a subcommand's variable is named
    assert run_cli("compact", topic).returncode == 0
    r = run_cli("verify", topic, env={"SHALE_JSON": "yes"})
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True, r.stdout
    r = run_cli("gc", topic, env={"SHALE_GC_GRACE": "a while"})
    assert r.returncode == 2 and "SHALE_GC_GRACE" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    # status, topics, config and get read theirs too
    assert json.loads(run_cli("status", topic, env={"SHALE_JSON": "1"}).stdout)["records"] == 30
    listed = run_cli("topics", str(tmp_path), env={"SHALE_JSON": "true"}).stdout.splitlines()
    assert {json.loads(x)["topic"] for x in listed} == {topic, str(tmp_path / "p")}
    r = run_cli("config", topic, env={"SHALE_SET": "delete-retention=2h\nmin-compaction-lag=1m", "SHALE_JSON": "1"})
    assert json.loads(r.stdout)["policy"] == {"delete-retention": "2h", "min-compaction-lag": "1m"}, r.stderr
    key = json.loads(run_cli("read", topic, "--limit", "1").stdout)["key"]
    r = run_cli("get", topic, key, env={"SHALE_VALUE_FORMAT": "bogus"})
    assert r.returncode == 2 and "SHALE_VALUE_FORMAT" in r.stderr, r.stderr
    # truncate's required --before-ledger may come from its variable too
    r = run_cli("truncate", topic, "--json", env={"SHALE_BEFORE_LEDGER": "1"})
    assert r.returncode == 0 and json.loads(r.stdout)["removed"] == [], r.stderr


@pytest.mark.parametrize("command", [("read", "--limit"), ("produce", "--batch-size"), ("gc", "--gc-grace"),
                                     ("verify", "--json"), ("compact", "--max-topics")])
def test_help_names_each_flags_variable(command: tuple[str, str]) -> None:
    name, flag = command
    r = run_cli(name, "--help")
    assert r.returncode == 0, r.stderr
    variable = "SHALE_" + flag[2:].upper().replace("-", "_")
    assert f"[env var: {variable}]" in " ".join(r.stdout.split())


def test_sizes_and_durations_are_read_one_way_by_every_command(tmp_path: Path) -> None:
    """KB, MB, GB are powers of 1000 and KiB, MiB, GiB powers of 1024 (humanfriendly);
    durations take units, combinations and ISO 8601 (pytimeparse2, isodate)."""
    r = run_cli("--print-config", "/t", "--max-part-bytes", "256MB", "--max-map-bytes", "1GiB",
                "--max-compaction-lag", "1h30m", "--min-compaction-lag", "PT2M", "--gc-grace", "1w", script="compact")
    got = config(r)
    assert got["--max-part-bytes"]["value"] == 256_000_000 and got["--max-map-bytes"]["value"] == 1 << 30
    assert got["--max-compaction-lag"]["value"] == 5_400_000 and got["--min-compaction-lag"]["value"] == 120_000
    assert got["--gc-grace"]["value"] == 7 * 86_400_000
    records = "".join(json.dumps({"key": f"k{i}", "value": "v" * 100}) + "\n" for i in range(50))
    r = run_cli("produce", str(tmp_path / "p"), "--max-ledger-bytes", "1KB", "--batch-size", "1", input=records)
    assert r.returncode == 0, r.stderr
    assert len(TopicMetadata.open(str(tmp_path / "p")).load_topic().ledgers) > 5  # sealed at 1000 bytes
    r = run_cli("gc", str(tmp_path / "p"), "--gc-grace", "1 fortnight")
    assert r.returncode == 2 and "bad duration" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = run_cli("produce", str(tmp_path / "p"), "--max-ledger-bytes", "lots", input="")
    assert r.returncode == 2 and "bad size" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_abbreviated_flags_are_refused(tmp_path: Path) -> None:
    """A flag is spelt in full: whether it came from the command line or a variable must
    be certain."""
    r = run_cli("read", str(tmp_path / "t"), "--lim", "3")
    assert r.returncode == 2 and "--lim" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_print_config_masks_secrets() -> None:
    env = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEYID0001", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value-777",
           "AWS_SESSION_TOKEN": "tok-session-888", "AWS_REGION": "eu-west-1",
           "SHALE_PUSHGATEWAY": "http://ops:pw-999@gateway:9091/?token=tok-query-555",
           "SHALE_ENGINE": "spark",
           "SHALE_SPARK_CONF": "spark.hadoop.fs.s3a.secret.key=sk-conf-666\nspark.executor.cores=2"}
    r = run_cli("--print-config", "s3://bucket/t", env=env, script="compact")
    assert r.returncode == 0, r.stderr
    for secret in ("AKIAEXAMPLEKEYID0001", "s3cr3t-value-777", "tok-session-888", "pw-999", "tok-query-555",
                   "sk-conf-666"):
        assert secret not in r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["environment"]["AWS_REGION"] == "eu-west-1"
    assert doc["environment"]["AWS_SECRET_ACCESS_KEY"] == "****"
    assert doc["settings"]["--spark-conf"]["value"] == ["spark.hadoop.fs.s3a.secret.key=****",
                                                        "spark.executor.cores=2"]
    assert doc["settings"]["--pushgateway"]["value"].startswith("http://ops:****@gateway:9091/")
    assert mask_secrets("s3://bucket/prefix") == "s3://bucket/prefix"


def test_print_config_says_which_kernels_run() -> None:
    """The C kernels by default (the suite is run where they build), the NumPy
    fallbacks when SHALE_KERNELS=numpy asks for them."""
    assert json.loads(run_cli("--print-config", "/t", env={}, script="compact").stdout)["kernels"] == "native"
    r = run_cli("--print-config", "/t", env={"SHALE_KERNELS": "numpy"}, script="compact")
    doc = json.loads(r.stdout)
    assert doc["kernels"] == "numpy" and doc["environment"]["SHALE_KERNELS"] == "numpy"


# ------------------------------------------------------------ logs and progress

def test_json_logs_are_one_object_per_event(tmp_path: Path) -> None:
    good, missing = str(tmp_path / "good"), str(tmp_path / "missing")
    produce(good, 200)
    r = run_cli(good, missing, "--log-format", "json", script="compact")
    assert r.returncode == 7, r.stderr  # one topic failed, the other completed
    events = [json.loads(x) for x in r.stderr.splitlines()]  # every line is JSON
    names = [e["event"] for e in events]
    assert names[0] == "run.start" and names[-1] == "run.done"
    phases = [e["phase"] for e in events if e["event"] == "topic.phase" and e["topic"] == good]
    assert phases[0] == "planning" and phases[-1] == "publishing" and any(p.startswith("pass one") for p in phases)
    done = next(e for e in events if e["event"] == "topic.done")
    assert done["topic"] == good and done["summary"]["status"] == "compacted" and done["summary"]["keys"] == 17
    error = next(e for e in events if e["event"] == "topic.error")
    assert error["topic"] == missing and error["exit_code"] == 2 and error["level"] == "error"
    assert events[-1]["exit_code"] == 7 and events[-1]["failed_topics"] == [{"topic": missing, "exit_code": 2}]
    assert all(e["ts"].endswith("Z") for e in events)
    assert "compacted to horizon" in r.stdout  # the summary still goes to standard output


def _read_pty(fd: int) -> bytes:
    chunks = []
    while select.select([fd], [], [], 0.5)[0]:
        try:
            data = os.read(fd, 65536)
        except OSError:  # the other side closed
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def test_progress_shows_on_a_terminal_only(tmp_path: Path) -> None:
    topic = str(tmp_path / "t")
    produce(topic, 3000)
    exe = Path(sys.executable).parent / "compact"
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(exe), topic], stdout=subprocess.PIPE, stderr=slave, cwd=ROOT,
                            env={**os.environ, "COLUMNS": "120", "TERM": "xterm"})
    os.close(slave)
    out, _ = proc.communicate(timeout=120)
    shown = _read_pty(master).decode("utf-8", "replace")
    os.close(master)
    assert proc.returncode == 0
    assert "\x1b[" in shown and topic in shown and "/1" in shown  # a live display with the topic count
    assert b"\x1b" not in out and b"compacted to horizon" in out
    # not a terminal: plain lines only
    produce(topic, 100, first=3000)
    r = run_cli(topic, script="compact")
    assert r.returncode == 0 and "\x1b" not in r.stderr + r.stdout and r.stderr == ""


def test_produce_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    topic = str(tmp_path / "p")
    records = "".join(json.dumps({"key": f"k{i}", "value": "v" * 200}) + "\n" for i in range(60_000))
    exe = Path(sys.executable).parent / "shale"
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(exe), "produce", topic], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=slave, cwd=ROOT, env={**os.environ, "TERM": "xterm"})
    os.close(slave)
    out, _ = proc.communicate(records.encode(), timeout=300)
    shown = _read_pty(master).decode("utf-8", "replace")
    os.close(master)
    assert proc.returncode == 0
    assert "records/s" in shown and "MB" in shown  # records, bytes and rate, redrawn
    assert b"appended 60,000 records" in out and b"records/s" not in out
    r = run_cli("produce", str(tmp_path / "q"), input=records[: records.index("\n", 10_000) + 1])
    assert r.returncode == 0 and r.stderr == ""  # not a terminal: no display


# ------------------------------------------------------------ metrics

class _Gateway(BaseHTTPRequestHandler):
    received: list[tuple[str, str, str]]
    authorization: list[str] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        self.received.append((self.command, self.path, body))
        self.authorization.append(self.headers.get("Authorization", ""))
        self.send_response(200)
        self.end_headers()

    do_PUT = do_POST

    def do_GET(self) -> None:  # the failure count read back: this stand-in holds none
        self.received.append((self.command, self.path, ""))
        self.authorization.append(self.headers.get("Authorization", ""))
        body = b'{"status":"success","data":[]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    received: list[tuple[str, str, str]] = []
    handler = type("Gateway", (_Gateway,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def _metrics(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body) for s in fam.samples}


def _group(path: str) -> str:
    # /metrics/job/<job>/topic@base64/<urlsafe base64 of the topic>
    parts = path.split("/")
    assert parts[1:4] == ["metrics", "job", "shale_compact"] and parts[4] == "topic@base64"
    return base64.urlsafe_b64decode(parts[5] + "=" * (-len(parts[5]) % 4)).decode()


def test_pushgateway_credentials_in_the_url_are_basic_auth(tmp_path: Path,
                                                          gateway: tuple[str, list[tuple[str, str, str]]]) -> None:
    """``http://user:password@host`` authenticates (HTTP basic) and the password is shown
    nowhere."""
    url, received = gateway
    _Gateway.authorization.clear()
    a = str(tmp_path / "a")
    produce(a, 50)
    r = run_cli(a, "--json", "--pushgateway", url.replace("http://", "http://ops:pw%2F123@"), script="compact")
    assert r.returncode == 0, r.stderr
    assert [m for m, _, _ in received] == ["GET", "POST"] and "pw" not in r.stdout + r.stderr
    assert received[0][1] == "/api/v1/metrics"  # the failure count, read back before the push
    _, path, body = received[1]
    assert _group(path) == a and _metrics(body)[("shale_compaction_consecutive_failures", ())] == 0
    assert _Gateway.authorization == 2 * ["Basic " + base64.b64encode(b"ops:pw/123").decode()]


def test_an_unreachable_gateway_is_a_warning(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    topic = str(tmp_path / "t")
    produce(topic, 100)
    r = run_cli(topic, "--pushgateway", f"http://127.0.0.1:{port}", script="compact")
    assert r.returncode == 0  # the compaction was published; the push is not its outcome
    assert r.stderr.count("\n") == 1 and "compact: warning: could not push metrics" in r.stderr
    assert f"127.0.0.1:{port}" in r.stderr
