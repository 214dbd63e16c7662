"""A real Pushgateway and a real Prometheus for tests: both started on free 127.0.0.1
ports with their data under a temporary folder, Prometheus with the shipped
``infra/monitoring/prometheus.yml`` (its target rewritten to the Pushgateway, its
intervals to half a second, its rule files those shipped beside it), and a small client of
Prometheus's HTTP API.

The ``prometheus_stack`` fixture (tests/conftest.py) shares one stack per session; each
test pushes its own topics (their URIs are under its own temporary folder), so tests
never see each other's groups.  Waiting is by polling up to a generous deadline: nothing
assumes how fast the machine is.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import yaml

from tests.conftest import ROOT

__all__ = ["MONITORING", "PrometheusStack", "Rows", "missing_binaries"]

MONITORING: Final = ROOT / "infra" / "monitoring"
#: how long to wait for a server to start or for data to reach Prometheus (a loaded
#: machine may be slow; a broken feature fails after this, a working one long before)
DEADLINE_S: Final = 90.0
_BINARIES: Final = ("prometheus", "prometheus-pushgateway")

#: what a query answers: each series' labels and value
Rows = list[tuple[dict[str, str], float]]


def missing_binaries() -> str | None:
    """Why the stack cannot start here (None: it can)."""
    gone = [b for b in _BINARIES if shutil.which(b) is None]
    if gone:
        return (f"{' and '.join(gone)} not installed (scripts/_system.sh installs the Debian packages "
                "prometheus and prometheus-pushgateway as root)")
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str, timeout_s: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.load(r) if "json" in r.headers.get("Content-Type", "") else r.read().decode()


class _Server:
    """One server process on a free port, ready when ``/-/ready`` answers (started again
    on another port if it exits first, e.g. because another process took the port)."""

    def __init__(self, name: str, argv: Callable[[int], list[str]], log: Path) -> None:
        self.name, self.log = name, log
        for _ in range(5):
            self.port = _free_port()
            with log.open("ab") as out:
                self.proc = subprocess.Popen(argv(self.port), stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
            if self._ready():
                return
        raise RuntimeError(f"{name} did not start:\n{self.tail()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                _get(f"{self.url}/-/ready", timeout_s=2)
                return True
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} was not ready after {DEADLINE_S:.0f}s:\n{self.tail()}")

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def config_for_tests(shipped: Path, target: str, rules: Path, exporters: Path) -> dict[str, Any]:
    """The shipped config, scraping the Pushgateway at ``target`` and the exporters the
    file ``exporters`` lists (file discovery: a test writes it as it starts one) twice a
    second, and loading the rule files from ``rules`` (the shipped ones' folder): otherwise
    as shipped."""
    doc: dict[str, Any] = yaml.safe_load(shipped.read_text())
    doc["global"].update(scrape_interval="500ms", evaluation_interval="500ms")
    doc["rule_files"] = [str(rules / f) for f in doc.get("rule_files", [])]
    jobs = {job["job_name"]: job for job in doc["scrape_configs"]}
    assert set(jobs) == {"pushgateway", "shale-exporter"}
    assert jobs["pushgateway"]["honor_labels"] is True
    jobs["pushgateway"]["static_configs"] = [{"targets": [target]}]
    del jobs["shale-exporter"]["static_configs"]
    jobs["shale-exporter"]["file_sd_configs"] = [{"files": [str(exporters)], "refresh_interval": "1s"}]
    return doc


class PrometheusStack:
    """A Pushgateway (no persistence) and a Prometheus scraping it, under ``folder``."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.pushgateway = _Server("the Pushgateway", lambda port: [
            "prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{port}", "--persistence.file=",
            "--log.level=warn"], folder / "pushgateway.log")
        config = folder / "prometheus.yml"
        target = urllib.parse.urlsplit(self.pushgateway.url).netloc
        self.exporters = folder / "exporters.json"
        self.exporters.write_text("[]")
        config.write_text(yaml.safe_dump(config_for_tests(MONITORING / "prometheus.yml", target, MONITORING,
                                                          self.exporters)))
        try:
            self.prometheus = _Server("Prometheus", lambda port: [
                "prometheus", f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], folder / "prometheus.log")
            # ready once it has scraped the Pushgateway (its first scrape waits for target
            # discovery, some seconds): every test after this waits half a second at most
            self.wait_for('up{job="pushgateway"}', lambda rows: any(v == 1 for _, v in rows))
        except BaseException:
            self.stop()
            raise

    @property
    def pushgateway_url(self) -> str:
        return self.pushgateway.url

    @property
    def prometheus_url(self) -> str:
        return self.prometheus.url

    def query(self, expr: str) -> Rows:
        """``expr`` evaluated now (Prometheus's instant query): each series' labels and value."""
        try:
            doc = _get(f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        except urllib.error.HTTPError as e:  # a bad expression: say what Prometheus said
            raise RuntimeError(f"{expr}: {e.read().decode(errors='replace')}") from None
        if doc["status"] != "success":
            raise RuntimeError(f"{expr}: {doc}")
        data = doc["data"]
        if data["resultType"] in ("scalar", "string"):
            return [({}, float(data["result"][1]))]
        return [(row["metric"], float(row["value"][1])) for row in data["result"]]

    def wait_for(self, expr: str, predicate: Callable[[Rows], bool] = bool) -> Rows:
        """What ``expr`` answers once ``predicate`` holds for it (by default: once it
        answers anything), asked again until then; fails after a generous deadline."""
        end = time.monotonic() + DEADLINE_S
        while True:
            rows = self.query(expr)
            if predicate(rows):
                return rows
            if time.monotonic() >= end:
                raise AssertionError(f"{expr} still answered {rows} after {DEADLINE_S:.0f}s")
            time.sleep(0.2)

    def pushed(self) -> dict[tuple[str, str], float]:
        """Each group's ``push_time_seconds`` as the Pushgateway holds it, by (job, topic)."""
        groups = _get(f"{self.pushgateway_url}/api/v1/metrics")["data"]
        return {(g["labels"]["job"], g["labels"].get("topic", "")): float(g["push_time_seconds"]["metrics"][0]["value"])
                for g in groups}

    def sync(self) -> None:
        """Wait until Prometheus has scraped every push the Pushgateway holds now: what a
        query answers after this is the latest pushed value."""
        want = self.pushed()

        def caught_up(rows: Rows) -> bool:
            got = {(r.get("job", ""), r.get("topic", "")): v for r, v in rows}
            return all(abs(got.get(k, 0.0) - v) < 1e-3 for k, v in want.items())

        self.wait_for("push_time_seconds", caught_up)

    def scrape_exporter(self, target: str | None) -> None:
        """Have Prometheus scrape the exporter at ``target`` (``host:port``; None: none), and
        wait until it has (``up`` 1 for it, or gone)."""
        self.exporters.write_text(json.dumps([{"targets": [target]}] if target else []))
        if target is None:
            self.wait_for('up{job="shale-exporter"}', lambda rows: not rows)
        else:
            self.wait_for(f'up{{job="shale-exporter",instance="{target}"}}', lambda rows: any(v == 1 for _, v in rows))

    def stop(self) -> None:
        if hasattr(self, "prometheus"):
            self.prometheus.stop()
        self.pushgateway.stop()
