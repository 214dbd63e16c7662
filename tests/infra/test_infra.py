"""infra/: the Kubernetes manifests, rendered by the real kustomize (``kubectl kustomize``)
and validated against the Kubernetes schemas in strict mode; the settings they give
``compact``; what the Dockerfile's instructions promise about the images (the images are
built and run in ``tests/infra/test_image.py``); and the Spark image's entrypoint, run with a
fake ``compact`` and a fake ``java``."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import kubernetes_validate
import pytest
import yaml

from shale.compactor.cli import build_compact_parser
from tests.needs import needs, program

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
DOCKER = ROOT / "infra" / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
ENTRYPOINT_SCRIPT = DOCKER / "spark-entrypoint.sh"
OVERLAYS = ("local", "spark", "spark-connect")
SPARK_OVERLAYS = ("spark", "spark-connect")
KUBERNETES_VERSION = "1.32.0"
IMAGE_REPO = "ghcr.io/shale-project/shale"
# Values the downward API would give the spark overlay's pod.
POD_FIELDS = {"status.podIP": "10.1.2.3", "metadata.name": "shale-compact-29000000-abcde",
              "metadata.namespace": "shale"}

needs_kubectl = needs(program("kubectl"))

Render = Callable[[str], list[dict[str, Any]]]


# --- helpers ---------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def kustomize() -> Callable[[str], str]:
    """``kubectl kustomize infra/k8s/overlays/<overlay>``: the YAML ``kubectl apply -k``
    would send, rendered once per overlay for the whole session."""
    cache: dict[str, str] = {}

    def build(overlay: str) -> str:
        if overlay not in cache:
            proc = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)], capture_output=True,
                                  text=True, timeout=120)
            assert proc.returncode == 0, f"kubectl kustomize {overlay}: {proc.stderr}"
            cache[overlay] = proc.stdout
        return cache[overlay]

    return build


@pytest.fixture(scope="session")
def rendered(kustomize: Callable[[str], str]) -> Render:
    """An overlay's rendered documents, parsed afresh on each call (a test may change them)."""
    def parse(overlay: str) -> list[dict[str, Any]]:
        return [d for d in yaml.safe_load_all(kustomize(overlay)) if d is not None]

    return parse


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec(cronjob: dict[str, Any]) -> dict[str, Any]:
    return cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def compact_container(cronjob: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec(cronjob)["containers"]
    assert [c["name"] for c in containers] == ["compact"]
    return containers[0]


def expand(value: str, defined: dict[str, str]) -> str:
    """Kubernetes' expansion of ``$(NAME)`` in an env value: only names defined before
    (by envFrom or earlier env entries) are replaced; ``$$`` is a literal ``$``."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return defined.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, value)


def container_environment(docs: list[dict[str, Any]], container: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment the compact container (or ``container``) gets: its envFrom
    ConfigMaps, then its env entries in order (downward API fields filled in, ``$(NAME)``
    expanded)."""
    container = compact_container(one(docs, "CronJob")) if container is None else container
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    environ: dict[str, str] = {}
    for source in container.get("envFrom", []):
        environ.update(configmaps[source["configMapRef"]["name"]]["data"])
    for entry in container.get("env", []):
        if "valueFrom" in entry:
            environ[entry["name"]] = POD_FIELDS[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            environ[entry["name"]] = expand(entry.get("value", ""), environ)
    return environ


# --- (a) every document is valid Kubernetes, strictly -----------------------------------------

@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_documents_are_valid_kubernetes(overlay: str, rendered: Render) -> None:
    docs = rendered(overlay)
    kinds = sorted(d["kind"] for d in docs)
    expected = ["ConfigMap", "CronJob", "ServiceAccount"] + (["Role", "RoleBinding"] if overlay in SPARK_OVERLAYS
                                                             else [])
    expected += ["Deployment", "NetworkPolicy", "Service"] if overlay == "spark-connect" else []
    assert kinds == sorted(expected)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_kubernetes_validate_command_accepts_the_rendered_overlay(
        overlay: str, kustomize: Callable[[str], str], rendered: Render, tmp_path: Path) -> None:
    # The command line a user would run (`kubectl kustomize ... > out.yaml` then this).
    out = tmp_path / f"{overlay}.yaml"
    out.write_text(kustomize(overlay))
    exe = Path(sys.executable).parent / "kubernetes-validate"
    r = subprocess.run([str(exe), "--strict", "-k", KUBERNETES_VERSION, str(out)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("INFO") == len(rendered(overlay)), r.stdout  # one line per valid document
    bad = tmp_path / "bad.yaml"
    bad.write_text(out.read_text().replace("concurrencyPolicy:", "concurrencyPolicyy:"))
    r = subprocess.run([str(exe), "--strict", "-k", KUBERNETES_VERSION, str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "concurrencyPolicyy" in r.stdout + r.stderr


# (the overlays' patches are partial documents: they are validated as rendered)
RAW_FILES = sorted([*(K8S / "base").glob("*.yaml"), K8S / "overlays" / "spark" / "rbac.yaml",
                    *(K8S / "overlays" / "spark-connect" / name for name in ("server.yaml", "rbac.yaml",
                                                                             "networkpolicy.yaml"))])


@pytest.mark.parametrize("path", [p for p in RAW_FILES if p.name != "kustomization.yaml"],
                         ids=lambda p: str(p.relative_to(K8S)))
def test_raw_manifest_files_are_valid_kubernetes(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


# --- (b) the validation is real ---------------------------------------------------------------

def _unknown_spec_field(cj: dict[str, Any]) -> None:
    cj["spec"]["concurrencyPolicyy"] = "Forbid"


def _unknown_container_field(cj: dict[str, Any]) -> None:
    compact_container(cj)["securityContext"]["readOnlyRootFileSystem"] = True  # wrong capitalisation


def _wrong_type(cj: dict[str, Any]) -> None:
    cj["spec"]["jobTemplate"]["spec"]["backoffLimit"] = "two"


def _missing_required(cj: dict[str, Any]) -> None:
    del compact_container(cj)["name"]


@needs_kubectl
@pytest.mark.parametrize("breakage", [_unknown_spec_field, _unknown_container_field, _wrong_type, _missing_required])
def test_validation_rejects_a_broken_cronjob(breakage: Callable[[dict[str, Any]], None], rendered: Render) -> None:
    good = one(rendered("local"), "CronJob")
    kubernetes_validate.validate(good, KUBERNETES_VERSION, strict=True)
    broken = copy.deepcopy(good)
    breakage(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


# --- (c) what the CronJob guarantees, in every overlay ----------------------------------------

@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cronjob_schedule_retries_and_deadlines(overlay: str, rendered: Render) -> None:
    cj = one(rendered(overlay), "CronJob")
    assert cj["metadata"]["name"] == "shale-compact"
    assert cj["apiVersion"] == "batch/v1"
    spec = cj["spec"]
    assert spec["schedule"] == "30 2 * * *"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] == 3600
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (3, 5)
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 2
    assert job["activeDeadlineSeconds"] == 10800
    assert job["ttlSecondsAfterFinished"] == 86400
    rules = job["podFailurePolicy"]["rules"]
    fail = [r for r in rules if r["action"] == "FailJob"]
    assert len(fail) == 1
    assert fail[0]["onExitCodes"] == {"containerName": "compact", "operator": "In", "values": [2, 3, 4, 7]}
    ignore = [r for r in rules if r["action"] == "Ignore"]
    assert len(ignore) == 1
    assert [c["type"] for c in ignore[0]["onPodConditions"]] == ["DisruptionTarget"]
    assert ignore[0]["onPodConditions"][0].get("status", "True") == "True"
    assert pod_spec(cj)["restartPolicy"] == "Never"  # podFailurePolicy requires it


def assert_secure(pod: dict[str, Any]) -> None:
    """What every pod of the overlays promises: not root, no privilege, a read-only root
    filesystem, memory requests equal to limits and no CPU limit."""
    pod_sc = pod["securityContext"]
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod_sc["fsGroup"] == 10001
    assert pod.get("hostNetwork", False) is False and pod.get("hostPID", False) is False
    assert pod["enableServiceLinks"] is False
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c["securityContext"]
        effective = {**pod_sc, **sc}
        assert effective["runAsNonRoot"] is True
        assert sc["runAsNonRoot"] is True
        assert effective["runAsUser"] == 10001 and effective["runAsGroup"] == 10001
        assert effective["runAsUser"] != 0
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc.get("privileged", False) is False
        resources = c["resources"]
        assert resources["requests"]["memory"] == resources["limits"]["memory"]
        assert "cpu" in resources["requests"] and "cpu" not in resources["limits"]


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cronjob_pod_security(overlay: str, rendered: Render) -> None:
    assert_secure(pod_spec(one(rendered(overlay), "CronJob")))


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cronjob_has_a_writable_tmp_and_runs_compact_from_the_environment(overlay: str, rendered: Render) -> None:
    docs = rendered(overlay)
    cj = one(docs, "CronJob")
    pod = pod_spec(cj)
    c = compact_container(cj)
    volumes = {v["name"]: v for v in pod["volumes"]}
    tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert len(tmp) == 1
    assert "emptyDir" in volumes[tmp[0]["name"]]
    assert volumes[tmp[0]["name"]]["emptyDir"]["sizeLimit"] == "2Gi"
    # The image's CMD is --help; naming the command drops it, and settings come from the environment.
    assert c["command"] == ["compact"]
    assert "args" not in c
    assert [s["configMapRef"]["name"] for s in c["envFrom"]] == ["shale-compact-config"]
    assert one(docs, "ConfigMap")["metadata"]["name"] == "shale-compact-config"
    image, _, tag = c["image"].rpartition(":")
    assert image == IMAGE_REPO
    assert tag == ("0.1.0-spark" if overlay in SPARK_OVERLAYS else "0.1.0")


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_account_and_namespace(overlay: str, rendered: Render) -> None:
    docs = rendered(overlay)
    assert {d["metadata"].get("namespace") for d in docs} == {"shale"}
    assert all(d["metadata"]["labels"]["app.kubernetes.io/name"] == "shale" for d in docs)
    sa = one(docs, "ServiceAccount")
    pod = pod_spec(one(docs, "CronJob"))
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == "shale-compact"
    annotations = sa["metadata"]["annotations"]
    assert re.fullmatch(r"arn:aws:iam::\d{12}:role/.+", annotations["eks.amazonaws.com/role-arn"])
    assert re.fullmatch(r"[^@]+@[^@]+\.iam\.gserviceaccount\.com", annotations["iam.gke.io/gcp-service-account"])
    # Only the Spark driver talks to the Kubernetes API (with Spark Connect, the server: not the CronJob).
    assert pod["automountServiceAccountToken"] is (overlay == "spark")


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configmap_holds_only_shale_and_aws_settings(overlay: str, rendered: Render) -> None:
    data = one(rendered(overlay), "ConfigMap")["data"]
    assert data
    assert all(k.startswith(("SHALE_", "AWS_")) for k in data), sorted(data)
    assert all(isinstance(v, str) for v in data.values())
    assert not any(re.search(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY", k) for k in data)


@needs_kubectl
def test_memory_requests_per_overlay(rendered: Render) -> None:
    local = compact_container(one(rendered("local"), "CronJob"))["resources"]
    spark = compact_container(one(rendered("spark"), "CronJob"))["resources"]
    client = compact_container(one(rendered("spark-connect"), "CronJob"))["resources"]
    assert local == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert spark == {"requests": {"cpu": "2", "memory": "6Gi"}, "limits": {"memory": "6Gi"}}
    # a Spark Connect client: no JVM, the documents and at most two footers
    assert client == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}


@needs_kubectl
def test_local_memory_limit_is_sized_from_max_memory(rendered: Render) -> None:
    from shale.compactor.budget import OBJECT_STORE_OVERHEAD
    from shale.settings.units import parse_size

    docs = rendered("local")
    limit = compact_container(one(docs, "CronJob"))["resources"]["limits"]["memory"]
    assert limit.endswith("Gi")
    bound = parse_size(container_environment(docs)["SHALE_MAX_MEMORY"])
    assert bound + OBJECT_STORE_OVERHEAD == int(limit[:-2]) << 30  # the run stays within the limit


@needs_kubectl
def test_local_overlay_has_no_spark_settings(rendered: Render) -> None:
    docs = rendered("local")
    environ = container_environment(docs)
    assert not any(k.startswith("SHALE_SPARK") or k == "SHALE_ENGINE" for k in environ)
    assert "env" not in compact_container(one(docs, "CronJob"))


@needs_kubectl
def test_spark_overlay_rbac(rendered: Render) -> None:
    docs = rendered("spark")
    role, binding, sa = one(docs, "Role"), one(docs, "RoleBinding"), one(docs, "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert {"kind": "ServiceAccount", "name": sa["metadata"]["name"],
            "namespace": sa["metadata"]["namespace"]} in binding["subjects"]
    assert len(binding["subjects"]) == 1
    grants: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""], "core API group only"
        assert "*" not in rule["resources"] and "*" not in rule["verbs"]
        assert "resourceNames" not in rule
        for resource in rule["resources"]:
            grants.setdefault(resource, set()).update(rule["verbs"])
    assert {"create", "get", "list", "watch", "delete", "deletecollection"} <= grants["pods"]
    assert set(grants) == {"pods", "services", "configmaps", "persistentvolumeclaims"}
    assert "secrets" not in grants


@needs_kubectl
def test_spark_overlay_driver_settings(rendered: Render) -> None:
    docs = rendered("spark")
    cj = one(docs, "CronJob")
    c = compact_container(cj)
    env = c["env"]
    by_name = {e["name"]: e for e in env}
    assert by_name["SHALE_ENGINE"]["value"] == "spark"
    assert by_name["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert by_name["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert by_name["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert by_name["SHALE_SPARK_MASTER"]["value"] == "k8s://https://kubernetes.default.svc:443"
    # Kubernetes expands $(NAME) only for names defined earlier in the list (or by envFrom).
    defined: set[str] = set(one(docs, "ConfigMap")["data"])
    for e in env:
        for ref in re.findall(r"\$\(([^)]+)\)", e.get("value", "")):
            assert ref in defined, f"{e['name']} uses $({ref}) before it is defined"
        defined.add(e["name"])

    conf = dict(line.split("=", 1) for line in container_environment(docs)["SHALE_SPARK_CONF"].splitlines())
    assert conf["spark.driver.host"] == POD_FIELDS["status.podIP"]
    assert conf["spark.kubernetes.driver.pod.name"] == POD_FIELDS["metadata.name"]
    assert conf["spark.kubernetes.namespace"] == POD_FIELDS["metadata.namespace"]
    assert conf["spark.kubernetes.container.image"] == c["image"] == f"{IMAGE_REPO}:0.1.0-spark"
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == sa
    assert conf["spark.kubernetes.authenticate.executor.serviceAccountName"] == sa
    assert conf["spark.driver.bindAddress"] == "0.0.0.0"
    assert (conf["spark.driver.port"], conf["spark.blockManager.port"]) == ("7078", "7079")
    assert (conf["spark.executor.instances"], conf["spark.executor.cores"], conf["spark.executor.memory"]) == \
        ("4", "2", "6g")
    assert conf["spark.kubernetes.executor.request.cores"] == "2"
    assert conf["spark.kubernetes.executor.deleteOnTermination"] == "true"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert conf["spark.local.dir"] in mounts  # writable under a read-only root filesystem


@needs_kubectl
def test_spark_connect_overlay_server_and_its_client(rendered: Render) -> None:
    """The Spark Connect server: the image's entrypoint runs it (``connect-server``) with
    the settings of SPARK_CONNECT_CONF, on the port its Service and the CronJob's client
    name; executors are pods of its image with the ServiceAccount's identity; only the
    compactor's pods reach its port, only executors its driver ports."""
    docs = rendered("spark-connect")
    deployment, service, policy = one(docs, "Deployment"), one(docs, "Service"), one(docs, "NetworkPolicy")
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    for selector in (deployment["spec"]["selector"]["matchLabels"], service["spec"]["selector"],
                     policy["spec"]["podSelector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    pod = template["spec"]
    assert_secure(pod)
    [c] = pod["containers"]
    assert c["args"] == ["connect-server"] and "command" not in c  # through the image's entrypoint
    assert c["image"] == f"{IMAGE_REPO}:0.1.0-spark"
    environ = container_environment(docs, c)
    conf = dict(line.split("=", 1) for line in environ["SPARK_CONNECT_CONF"].splitlines())
    assert conf["spark.master"] == "k8s://https://kubernetes.default.svc:443"
    port = int(conf["spark.connect.grpc.binding.port"])
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "grpc": port, "driver": int(conf["spark.driver.port"]), "block-manager": int(conf["spark.blockManager.port"])}
    assert conf["spark.driver.host"] == POD_FIELDS["status.podIP"]
    assert conf["spark.kubernetes.driver.pod.name"] == POD_FIELDS["metadata.name"]
    assert conf["spark.kubernetes.namespace"] == POD_FIELDS["metadata.namespace"]
    assert conf["spark.kubernetes.container.image"] == c["image"]
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["serviceAccountName"] == sa and pod["automountServiceAccountToken"] is True
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == sa
    assert conf["spark.kubernetes.authenticate.executor.serviceAccountName"] == sa
    assert (conf["spark.python.daemon.module"], conf["spark.python.worker.reuse"]) == ("shale.spark.daemon", "true")
    assert conf["spark.dynamicAllocation.enabled"] == "true" and conf["spark.dynamicAllocation.minExecutors"] == "0"
    assert conf["spark.local.dir"] in {m["mountPath"] for m in c["volumeMounts"]}
    # the client: the Service's name and port, which lead to the server's port
    [svc_port] = service["spec"]["ports"]
    assert svc_port["targetPort"] == "grpc"
    client = container_environment(docs)
    assert client["SHALE_SPARK_REMOTE"] == f"sc://{service['metadata']['name']}:{svc_port['port']}"
    assert "SHALE_SPARK_MASTER" not in client and "SHALE_SPARK_CONF" not in client
    # who may reach what
    cronjob_labels = one(docs, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    allowed = {p["port"]: r["from"] for r in policy["spec"]["ingress"] for p in r["ports"]}
    assert set(allowed) == {port, 7078, 7079}
    [client_pods] = allowed[port]
    assert client_pods["podSelector"]["matchLabels"].items() <= cronjob_labels.items()
    assert allowed[7078] == allowed[7079] == [{"podSelector": {"matchLabels": {"spark-role": "executor"}}}]


# --- (e) the settings are real `compact` flags, with values it accepts ------------------------

def long_options() -> set[str]:
    parser = build_compact_parser()
    return {s for action in parser._actions for s in action.option_strings if s.startswith("--")}


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_shale_variable_is_a_compact_flag(overlay: str, rendered: Render) -> None:
    options = long_options()
    docs = rendered(overlay)
    names = set(one(docs, "ConfigMap")["data"]) | set(container_environment(docs))
    shale = sorted(n for n in names if n.startswith("SHALE_"))
    assert "SHALE_ALL" in shale
    for name in shale:
        x = name.removeprefix("SHALE_")
        assert x == "TOPICS" or "--" + x.lower().replace("_", "-") in options, f"{name} is not a compact flag"


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_compact_accepts_the_settings(overlay: str, rendered: Render) -> None:
    """``compact --print-config`` with the pod's environment: every value parses, and each
    non-empty SHALE_* variable is taken."""
    environ = container_environment(rendered(overlay))
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SHALE_", "AWS_"))}
    proc = subprocess.run([sys.executable, "-m", "shale.compactor.cli", "--print-config"], capture_output=True,
                          text=True, env={**clean, **environ}, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    settings = json.loads(proc.stdout)["settings"]
    by_variable = {s["variable"]: s for s in settings.values()}
    for name, value in environ.items():
        if name.startswith("SHALE_"):
            assert by_variable[name]["source"] == ("env" if value.strip() else "default"), name
    assert settings["--all"]["value"] == "s3://my-bucket/topics/"
    assert settings["--json"]["value"] is True
    assert settings["--log-format"]["value"] == "json"
    if overlay in SPARK_OVERLAYS:
        assert settings["--engine"]["value"] == "spark"
        # the overlay empties --max-map-bytes: the default then bounds each reduce task
        assert settings["--max-map-bytes"]["value"] is None
        assert settings["--no-forward-credentials"]["value"] is True
    if overlay == "spark":
        assert f"spark.driver.host={POD_FIELDS['status.podIP']}" in settings["--spark-conf"]["value"]
        assert settings["--spark-remote"]["value"] is None
    elif overlay == "spark-connect":
        assert settings["--spark-remote"]["value"] == "sc://shale-spark-connect:15002"
        assert settings["--spark-master"]["value"] is None and settings["--spark-conf"]["value"] == []
    else:
        assert settings["--engine"]["value"] == "local"
        assert settings["--max-map-bytes"]["value"] == 1 << 30


# --- (d) the Dockerfile ----------------------------------------------------------------------
# These tests parse the Dockerfile's instructions for promises about every target that
# hold without building it; tests/infra/test_image.py builds the images and runs them (and the
# build itself checks that the C kernels import and that SPARK_HOME holds Spark's jars).

class Stage(NamedTuple):
    base: str  # an image, or the name of an earlier stage
    instructions: list[tuple[str, str]]  # (INSTRUCTION, arguments)


class Dockerfile(NamedTuple):
    stages: dict[str, Stage]  # in the file's order

    @property
    def targets(self) -> list[str]:
        """The stages that are images: neither the base of another stage nor copied from."""
        used = {s.base for s in self.stages.values()}
        used |= {flag.removeprefix("--from=") for s in self.stages.values() for k, args in s.instructions
                 if k == "COPY" for flag in shlex.split(args) if flag.startswith("--from=")}
        return [name for name in self.stages if name not in used]

    @property
    def default_target(self) -> str:
        return list(self.stages)[-1]  # what `docker build` without --target builds

    def effective(self, stage: str) -> list[tuple[str, str]]:
        """The instructions that made ``stage``: its base stages' and then its own."""
        s = self.stages[stage]
        return (self.effective(s.base) if s.base in self.stages else []) + s.instructions

    def last(self, stage: str, keyword: str) -> str | None:
        found = [args for k, args in self.effective(stage) if k == keyword]
        return found[-1] if found else None

    def env(self, stage: str) -> dict[str, str]:
        """The variables ENV sets in ``stage`` (values as written: ``$PATH`` stays)."""
        env: dict[str, str] = {}
        for keyword, args in self.effective(stage):
            words = shlex.split(args) if keyword == "ENV" else []
            if words and "=" not in words[0]:  # the old form, ENV NAME VALUE
                words = [f"{words[0]}={' '.join(words[1:])}"]
            env.update(w.split("=", 1) for w in words)
        return env

    def copies(self, stage: str) -> list[tuple[list[str], str, list[str]]]:
        """(sources, destination, flags) of each COPY of ``stage`` itself."""
        out = []
        for k, args in self.stages[stage].instructions:
            if k == "COPY":
                words = json.loads(args) if args.startswith("[") else shlex.split(args)
                flags = [w for w in words if w.startswith("--")]
                paths = [w for w in words if not w.startswith("--")]
                out.append((paths[:-1], paths[-1], flags))
        return out


def parse_dockerfile(text: str) -> Dockerfile:
    """Comment lines dropped, continuation lines joined, ``${ARG}`` in FROM expanded."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        keyword, _, args = (pending + line).strip().partition(" ")
        pending = ""
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, "a continuation line ends the file"
    args_before_from: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    for keyword, args in instructions:
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args_before_from[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages[name] = Stage(base, [])
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, default = args.partition("=")
            args_before_from[name] = default
        else:
            stages[list(stages)[-1]].instructions.append((keyword, args))
    return Dockerfile(stages)


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Whether a .dockerignore leaves ``path`` (relative to the context) out: the last
    pattern matching it or one of its parent folders decides (``!`` lets it in)."""
    def regex(pattern: str) -> str:
        out = ""
        for token in re.findall(r"\*\*/|\*\*|\*|\?|[^*?]+", pattern.strip("/")):
            out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
        return out

    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        if any(re.fullmatch(regex(pattern.removeprefix("!")), c) for c in candidates):
            excluded = not negated
    return excluded


def test_dockerfile_final_stages_run_as_a_non_root_user() -> None:
    # Numeric, so that Kubernetes can check runAsNonRoot against the image.
    dockerfile = parse_dockerfile(DOCKERFILE.read_text())
    assert dockerfile.targets
    for stage in dockerfile.targets:
        user = dockerfile.last(stage, "USER")
        assert user is not None, f"{stage} runs as root"
        uid, _, gid = user.partition(":")
        assert uid.isdigit() and int(uid) != 0, f"{stage} runs as {user}"
        assert gid == "" or gid.isdigit(), f"{stage} runs as {user}"


def test_dockerfile_copies_every_package_of_the_project() -> None:
    """Every package of pyproject.toml (and the files the wheel is built from) is copied
    into the build, and the build context's ignore file lets each of their files in."""
    dockerfile = parse_dockerfile(DOCKERFILE.read_text())
    sources = {source.rstrip("/") for stage in dockerfile.stages for sources, _, flags in dockerfile.copies(stage)
               if not any(f.startswith("--from=") for f in flags) for source in sources}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*").rstrip(".") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages | {"pyproject.toml", project["project"]["readme"]} <= sources
    patterns = [line.strip() for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    for source in sorted(sources):
        path = ROOT / source
        assert path.exists(), source
        files = [path] if path.is_file() else [
            f for f in path.rglob("*")
            if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".so", ".pyc")]  # build output
        assert files, source
        for f in files:
            relative = f.relative_to(ROOT).as_posix()
            assert not dockerignore_excludes(relative, patterns), f"{relative} is left out of the build context"


def test_dockerfile_images_run_compact() -> None:
    """What ``docker run IMAGE ARGS`` runs: the default target runs ``compact``; the
    ``spark`` target (``--target spark``) runs spark-entrypoint.sh, which runs ``compact``
    or a Spark executor (see the tests below)."""
    dockerfile = parse_dockerfile(DOCKERFILE.read_text())
    entrypoint = dockerfile.last(dockerfile.default_target, "ENTRYPOINT")
    assert entrypoint is not None and json.loads(entrypoint) == ["compact"]
    assert "spark" in dockerfile.targets
    entrypoint = dockerfile.last("spark", "ENTRYPOINT")
    assert entrypoint is not None
    script = json.loads(entrypoint)
    assert len(script) == 1
    copied = [dest for sources, dest, _ in dockerfile.copies("spark")
              if sources == [str(ENTRYPOINT_SCRIPT.relative_to(ROOT))]]
    assert copied == script


def image_for(overlay: str, dockerfile: Dockerfile) -> str:
    """The stage built for ``overlay``'s image (``--target spark``, or the default)."""
    return "spark" if overlay in SPARK_OVERLAYS else dockerfile.default_target


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_images_home_is_writable_in_the_pod(overlay: str, rendered: Render) -> None:
    # The root filesystem is read-only: HOME must lie on one of the pod's emptyDir volumes.
    dockerfile = parse_dockerfile(DOCKERFILE.read_text())
    home = dockerfile.env(image_for(overlay, dockerfile)).get("HOME")
    assert home
    cj = one(rendered(overlay), "CronJob")
    volumes = {v["name"]: v for v in pod_spec(cj)["volumes"]}
    writable = [m["mountPath"] for m in compact_container(cj)["volumeMounts"]
                if "emptyDir" in volumes[m["name"]] and not m.get("readOnly", False)]
    assert any(os.path.commonpath([home, w]) == w for w in writable), (home, writable)


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pods_command_is_on_the_images_path(overlay: str, rendered: Render) -> None:
    # The CronJob names its command: a script of the project, in the bin folder of the
    # venv the image copies from its build stage, which must be on the image's PATH.
    dockerfile = parse_dockerfile(DOCKERFILE.read_text())
    stage = image_for(overlay, dockerfile)
    command = compact_container(one(rendered(overlay), "CronJob"))["command"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[0] in scripts
    venvs = [dest for _, dest, flags in dockerfile.copies(stage) if any(f.startswith("--from=") for f in flags)]
    path = dockerfile.env(stage).get("PATH", "").split(":")
    assert [v for v in venvs if f"{v.rstrip('/')}/bin" in path], (venvs, path)


# --- the Spark image's entrypoint -------------------------------------------------------------

def fake_program(path: Path, label: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{label}"\nfor a in "$@"; do echo "[$a]"; done\n'
                    'echo "PYSPARK_PYTHON=${PYSPARK_PYTHON:-}"\n')
    path.chmod(0o755)


def run_entrypoint(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    assert bash
    return subprocess.run([bash, str(ENTRYPOINT_SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


def test_spark_entrypoint_is_a_bash_script() -> None:
    # The image runs it directly (ENTRYPOINT): its #! line must name bash, which parses it.
    proc = subprocess.run(["bash", "-n", str(ENTRYPOINT_SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first = ENTRYPOINT_SCRIPT.read_text().splitlines()[0]
    assert first.startswith("#!"), first
    words = first[2:].split()
    interpreter = words[1] if Path(words[0]).name == "env" else words[0]
    assert Path(interpreter).name == "bash", first


def test_spark_entrypoint_runs_compact_with_its_arguments(tmp_path: Path) -> None:
    fake_program(tmp_path / "bin" / "compact", "compact")
    proc = run_entrypoint(["--all", "s3://x/", "--spark-conf", "spark.a=b c"],
                          {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:5] == ["compact", "[--all]", "[s3://x/]", "[--spark-conf]", "[spark.a=b c]"]
    proc = run_entrypoint([], {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "compact"


def test_spark_entrypoint_runs_the_executor_like_spark(tmp_path: Path) -> None:
    fake_program(tmp_path / "bin" / "compact", "compact")
    fake_program(tmp_path / "jdk" / "bin" / "java", "java")
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "JAVA_HOME": str(tmp_path / "jdk"),
        "SPARK_HOME": "/opt/spark-home",
        "SPARK_JAVA_OPT_0": "-Dspark.driver.port=7078",
        "SPARK_JAVA_OPT_10": "-Dspark.app.name=with space",
        "SPARK_JAVA_OPT_2": "-Dspark.executor.id=3",
        "SPARK_EXECUTOR_MEMORY": "6g",
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.1.2.3:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "2",
        "SPARK_APPLICATION_ID": "spark-application-1",
        "SPARK_EXECUTOR_POD_IP": "10.1.2.9",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "shale-exec-3",
    }
    proc = run_entrypoint(["executor"], env)
    assert proc.returncode == 0, proc.stderr
    argv = [line[1:-1] for line in proc.stdout.splitlines() if line.startswith("[")]
    assert proc.stdout.splitlines()[0] == "java"
    assert argv == [
        "-Dspark.driver.port=7078", "-Dspark.executor.id=3", "-Dspark.app.name=with space",  # numeric order
        "-Xms6g", "-Xmx6g",
        "-cp", "/opt/spark-home/conf:/opt/spark-home/jars/*",
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
        "--driver-url", "spark://CoarseGrainedScheduler@10.1.2.3:7078",
        "--executor-id", "3",
        "--cores", "2",
        "--app-id", "spark-application-1",
        "--hostname", "10.1.2.9",
        "--resourceProfileId", "0",
        "--podName", "shale-exec-3",
    ]
    assert "PYSPARK_PYTHON=/opt/shale/bin/python" in proc.stdout.splitlines()

    # SPARK_CONF_DIR (Spark mounts its configuration there) and extra jars join the classpath
    proc = run_entrypoint(["executor"], {**env, "SPARK_CONF_DIR": "/opt/spark/conf", "SPARK_EXTRA_CLASSPATH": "/x/*"})
    assert proc.returncode == 0, proc.stderr
    assert "[/opt/spark/conf:/opt/spark-home/jars/*:/x/*]" in proc.stdout.splitlines()


def test_spark_entrypoint_runs_a_spark_connect_server(tmp_path: Path) -> None:
    """``connect-server``: Spark's SparkConnectServer through spark-submit, in the
    foreground, a --conf for each line of SPARK_CONNECT_CONF (blank lines and indentation
    dropped), then the arguments; its Python workers run the image's Python."""
    fake_program(tmp_path / "spark" / "bin" / "spark-submit", "spark-submit")
    env = {"PATH": "/usr/bin:/bin", "SPARK_HOME": str(tmp_path / "spark"),
           "SPARK_CONNECT_CONF": "spark.master=k8s://https://kubernetes.default.svc:443\n  spark.app.x=with space\n\n"}
    proc = run_entrypoint(["connect-server", "--verbose"], env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "spark-submit"
    assert [line[1:-1] for line in lines if line.startswith("[")] == [
        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "shale-spark-connect",
        "--conf", "spark.master=k8s://https://kubernetes.default.svc:443", "--conf", "spark.app.x=with space",
        "--verbose"]
    assert "PYSPARK_PYTHON=/opt/shale/bin/python" in lines
    proc = run_entrypoint(["connect-server"], {**env, "SPARK_CONNECT_CONF": ""})
    assert proc.returncode == 0, proc.stderr
    assert "[--conf]" not in proc.stdout.splitlines()


def test_spark_entrypoint_executor_needs_spark_variables(tmp_path: Path) -> None:
    fake_program(tmp_path / "jdk" / "bin" / "java", "java")
    proc = run_entrypoint(["executor"], {"PATH": "/usr/bin:/bin", "JAVA_HOME": str(tmp_path / "jdk"),
                                         "SPARK_HOME": "/opt/spark-home"})
    assert proc.returncode != 0
    assert "java" not in proc.stdout
    assert "unbound variable" in proc.stderr
