"""infra/k8s/components/lag-exporter: ``shale exporter`` as a Deployment and its Service,
rendered by the real kustomize with each overlay and validated against the Kubernetes
schemas in strict mode; the environment it gives the exporter, taken by the real command;
and the monitoring component's ServiceMonitor, which must select that Service and name the
job the shipped rule watches."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.needs import needs, program

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
MONITORING = ROOT / "infra" / "monitoring"
KUBERNETES_VERSION = "1.32.0"

needs_kubectl = needs(program("kubectl"))


def render(tmp_path: Path, overlay: str, components: list[str]) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a copy of an overlay with ``components`` added, as an
    operator would add them."""
    k8s = tmp_path / "k8s"
    shutil.copytree(K8S, k8s, dirs_exist_ok=True)
    path = k8s / "overlays" / overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    kustomization["components"] = kustomization.get("components", []) + [f"../../components/{c}" for c in components]
    path.write_text(yaml.safe_dump(kustomization))
    proc = subprocess.run(["kubectl", "kustomize", str(path.parent)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def environment(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """What the container's ``env`` gives it, ConfigMap keys looked up."""
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    environ: dict[str, str] = {}
    for entry in container["env"]:
        ref = entry.get("valueFrom", {}).get("configMapKeyRef")
        if ref is None:
            environ[entry["name"]] = entry["value"]
        elif ref["key"] in configmaps[ref["name"]] or not ref.get("optional", False):
            environ[entry["name"]] = configmaps[ref["name"]][ref["key"]]
    return environ


@needs_kubectl
@pytest.mark.parametrize("overlay", ["local", "spark"])
def test_the_component_renders_a_valid_deployment_and_service(overlay: str, tmp_path: Path) -> None:
    docs = render(tmp_path, overlay, ["lag-exporter"])
    deployment, service = one(docs, "Deployment", "shale-exporter"), one(docs, "Service", "shale-exporter")
    for doc in (deployment, service):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert doc["metadata"]["namespace"] == "shale"
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["shale", "exporter", "$(SHALE_ALL)"]
    assert container["command"][0] in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert container["image"].startswith("ghcr.io/shale-project/shale:")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["metrics"] and ports == {"metrics": 9838}
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert probe["httpGet"] == {"path": "/metrics", "port": "metrics"}
    # as locked down as the CronJob's pod, with the same identity (read access to the bucket)
    spec = pod["spec"]
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    assert spec["serviceAccountName"] in accounts and spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False and spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert [m["mountPath"] for m in container["volumeMounts"] if "emptyDir" in volumes[m["name"]]] == ["/tmp"]
    resources = container["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]


@needs_kubectl
def test_the_exporter_takes_the_environment_the_deployment_gives_it(tmp_path: Path) -> None:
    docs = render(tmp_path, "local", ["lag-exporter"])
    [container] = one(docs, "Deployment", "shale-exporter")["spec"]["template"]["spec"]["containers"]
    environ = environment(docs, container)
    assert environ["SHALE_ALL"] == "s3://my-bucket/topics/" and environ["AWS_REGION"]
    # the real command, with that environment, on a local prefix in place of the bucket
    from tests.cli.test_subscriptions_cli import produce

    produce(str(tmp_path / "topics" / "t"), 4)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SHALE_", "AWS_"))}
    args = [a.replace("$(SHALE_ALL)", str(tmp_path / "topics")) for a in container["command"][1:]]
    proc = subprocess.run([sys.executable, "-m", "shale.cli", *args, "--once"], capture_output=True, text=True,
                          env={**clean, **environ}, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "shale_exporter_interval_seconds 60.0" in proc.stdout  # SHALE_INTERVAL taken
    assert re.search(r'shale_exporter_topic_up\{topic=".*/topics/t"\} 1\.0', proc.stdout), proc.stdout


@needs_kubectl
def test_the_servicemonitor_scrapes_the_service_as_the_job_the_rules_watch(tmp_path: Path) -> None:
    docs = render(tmp_path, "local", ["lag-exporter", "monitoring"])
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service", "shale-exporter")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    # the Prometheus Operator names the job after the Service; plain Prometheus's config names it so too
    rules = (MONITORING / "rules" / "shale.yml").read_text()
    assert f'up{{job="{service["metadata"]["name"]}"}}' in rules
    jobs = [j["job_name"] for j in yaml.safe_load((MONITORING / "prometheus.yml").read_text())["scrape_configs"]]
    assert service["metadata"]["name"] in jobs
