"""infra/: the Kubernetes manifests, rendered without kubectl (tests/k8s_render.py) and
validated against the Kubernetes schemas in strict mode; the settings they give
``compact``; the Dockerfile, read as text (Docker is not available here); and the Spark
image's entrypoint, run with a fake ``compact`` and a fake ``java``."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from compactor.cli import build_compact_parser
from tests.k8s_render import UnsupportedError, render

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "infra" / "k8s"
DOCKER = ROOT / "infra" / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
ENTRYPOINT_SCRIPT = DOCKER / "spark-entrypoint.sh"
OVERLAYS = ("local", "spark")
KUBERNETES_VERSION = "1.32.0"
IMAGE_REPO = "ghcr.io/shale-project/shale"
# Values the downward API would give the spark overlay's pod.
POD_FIELDS = {"status.podIP": "10.1.2.3", "metadata.name": "shale-compact-29000000-abcde",
              "metadata.namespace": "shale"}


# --- helpers ---------------------------------------------------------------------------------

def rendered(overlay: str) -> list[dict[str, Any]]:
    return render(K8S / "overlays" / overlay)


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


def container_environment(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The environment the compact container gets: its envFrom ConfigMaps, then its env
    entries in order (downward API fields filled in, ``$(NAME)`` expanded)."""
    container = compact_container(one(docs, "CronJob"))
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

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_documents_are_valid_kubernetes(overlay: str) -> None:
    docs = rendered(overlay)
    kinds = sorted(d["kind"] for d in docs)
    expected = ["ConfigMap", "CronJob", "ServiceAccount"] + (["Role", "RoleBinding"] if overlay == "spark" else [])
    assert kinds == sorted(expected)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_kubernetes_validate_command_accepts_the_rendered_overlay(overlay: str, tmp_path: Path) -> None:
    # The command line a user would run (`kubectl kustomize ... > out.yaml` then this).
    out = tmp_path / f"{overlay}.yaml"
    out.write_text(yaml.safe_dump_all(rendered(overlay)))
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


RAW_FILES = sorted([*(K8S / "base").glob("*.yaml"), K8S / "overlays" / "spark" / "rbac.yaml"])


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


@pytest.mark.parametrize("breakage", [_unknown_spec_field, _unknown_container_field, _wrong_type, _missing_required])
def test_validation_rejects_a_broken_cronjob(breakage: Callable[[dict[str, Any]], None]) -> None:
    good = one(rendered("local"), "CronJob")
    kubernetes_validate.validate(good, KUBERNETES_VERSION, strict=True)
    broken = copy.deepcopy(good)
    breakage(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


# --- the renderer is honest -------------------------------------------------------------------

def _write(directory: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)


DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
      - name: x
        image: example.org/img:1
        args: [one]
        env: [{name: A, value: "1"}, {name: B, value: "2"}, {name: D, value: "4"}]
        volumeMounts: [{name: v, mountPath: /a}, {name: v, mountPath: /b}]
        resources: {limits: {cpu: "1", memory: 1Gi}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: sa}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: rb}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}
subjects:
- {kind: ServiceAccount, name: sa}
- {kind: ServiceAccount, name: elsewhere, namespace: other}
"""


def test_renderer_applies_strategic_merge_namespace_labels_images(tmp_path: Path) -> None:
    # The expected result is what `kubectl kustomize` (kustomize v5.5) outputs for this tree.
    _write(tmp_path, {
        "base/kustomization.yaml": "resources: [r.yaml]\n",
        "base/r.yaml": DEPLOYMENT,
        "overlay/kustomization.yaml": (
            "namespace: ns1\nresources: [../base]\npatches:\n- path: p.yaml\n"
            "labels:\n- pairs: {team: data}\n  includeSelectors: false\n"
            "images:\n- name: example.org/img\n  newTag: '2'\n"),
        "overlay/p.yaml": (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    spec:\n"
            "      containers:\n      - name: x\n        args: null\n"
            "        env: [{name: B, value: '9'}, {name: C, value: '3'}, {name: A, value: '8'}]\n"
            "        volumeMounts: [{name: w, mountPath: /b}]\n"
            "        resources: {limits: {cpu: null}}\n"),
    })
    docs = {d["kind"]: d for d in render(tmp_path / "overlay")}
    assert {d["metadata"]["namespace"] for d in docs.values()} == {"ns1"}
    assert all(d["metadata"]["labels"]["team"] == "data" for d in docs.values())
    assert docs["Deployment"]["spec"]["selector"] == {"matchLabels": {"a": "b"}}  # includeSelectors: false
    assert docs["Deployment"]["spec"]["template"]["spec"]["containers"] == [{
        "name": "x", "image": "example.org/img:2",
        "env": [{"name": "B", "value": "9"}, {"name": "C", "value": "3"}, {"name": "A", "value": "8"},
                {"name": "D", "value": "4"}],
        "volumeMounts": [{"name": "w", "mountPath": "/b"}, {"name": "v", "mountPath": "/a"}],
        "resources": {"limits": {"memory": "1Gi"}},
    }]
    assert docs["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns1"},
                                               {"kind": "ServiceAccount", "name": "elsewhere", "namespace": "other"}]


@pytest.mark.parametrize("kustomization", [
    "resources: [r.yaml]\ncommonLabels: {a: b}\n",
    "resources: [r.yaml]\nconfigMapGenerator: [{name: x, literals: [a=b]}]\n",
    "resources: [r.yaml]\nnamePrefix: x-\n",
    "resources: [r.yaml]\nlabels: [{pairs: {a: b}, includeSelectors: true}]\n",
    "resources: [r.yaml]\nimages: [{name: example.org/img, digest: 'sha256:00'}]\n",
    "resources: [r.yaml]\npatches: [{path: p.yaml, target: {kind: Deployment}}]\n",
    "resources: [r.yaml]\npatches: [{patch: '[]', target: {kind: Deployment}}]\n",
    "resources: [r.yaml, https://example.org/x.yaml]\n",
    "resources: [missing.yaml]\n",
], ids=["commonLabels", "generator", "namePrefix", "includeSelectors", "digest", "patch-target", "inline-patch",
        "remote", "missing"])
def test_renderer_refuses_what_it_does_not_implement(tmp_path: Path, kustomization: str) -> None:
    _write(tmp_path, {"kustomization.yaml": kustomization, "r.yaml": DEPLOYMENT, "p.yaml": "[]\n"})
    with pytest.raises(UnsupportedError):
        render(tmp_path)


def test_renderer_refuses_a_patch_with_an_unknown_list_merge(tmp_path: Path) -> None:
    patch = ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    spec:\n"
             "      containers:\n      - name: x\n        resources: {claims: [{name: gpu}]}\n")
    base = DEPLOYMENT.replace("resources: {limits:", "resources: {claims: [{name: a}], limits:")
    _write(tmp_path, {"kustomization.yaml": "resources: [r.yaml]\npatches: [{path: p.yaml}]\n",
                      "r.yaml": base, "p.yaml": patch})
    with pytest.raises(UnsupportedError, match="claims"):
        render(tmp_path)


# --- (c) what the CronJob guarantees, in every overlay ----------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cronjob_schedule_retries_and_deadlines(overlay: str) -> None:
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
    assert fail[0]["onExitCodes"] == {"containerName": "compact", "operator": "In", "values": [2, 3, 4]}
    ignore = [r for r in rules if r["action"] == "Ignore"]
    assert len(ignore) == 1
    assert [c["type"] for c in ignore[0]["onPodConditions"]] == ["DisruptionTarget"]
    assert ignore[0]["onPodConditions"][0].get("status", "True") == "True"
    assert pod_spec(cj)["restartPolicy"] == "Never"  # podFailurePolicy requires it


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cronjob_pod_security(overlay: str) -> None:
    cj = one(rendered(overlay), "CronJob")
    pod = pod_spec(cj)
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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cronjob_has_a_writable_tmp_and_runs_compact_from_the_environment(overlay: str) -> None:
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
    assert tag == ("0.1.0-spark" if overlay == "spark" else "0.1.0")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_account_and_namespace(overlay: str) -> None:
    docs = rendered(overlay)
    assert {d["metadata"].get("namespace") for d in docs} == {"shale"}
    assert all(d["metadata"]["labels"]["app.kubernetes.io/name"] == "shale" for d in docs)
    sa = one(docs, "ServiceAccount")
    pod = pod_spec(one(docs, "CronJob"))
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == "shale-compact"
    annotations = sa["metadata"]["annotations"]
    assert re.fullmatch(r"arn:aws:iam::\d{12}:role/.+", annotations["eks.amazonaws.com/role-arn"])
    assert re.fullmatch(r"[^@]+@[^@]+\.iam\.gserviceaccount\.com", annotations["iam.gke.io/gcp-service-account"])
    # Only the Spark driver talks to the Kubernetes API.
    assert pod["automountServiceAccountToken"] is (overlay == "spark")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configmap_holds_only_shale_and_aws_settings(overlay: str) -> None:
    data = one(rendered(overlay), "ConfigMap")["data"]
    assert data
    assert all(k.startswith(("SHALE_", "AWS_")) for k in data), sorted(data)
    assert all(isinstance(v, str) for v in data.values())
    assert not any(re.search(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY", k) for k in data)


def test_memory_requests_per_overlay() -> None:
    local = compact_container(one(rendered("local"), "CronJob"))["resources"]
    spark = compact_container(one(rendered("spark"), "CronJob"))["resources"]
    assert local == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert spark == {"requests": {"cpu": "2", "memory": "6Gi"}, "limits": {"memory": "6Gi"}}


def test_local_overlay_has_no_spark_settings() -> None:
    docs = rendered("local")
    environ = container_environment(docs)
    assert not any(k.startswith("SHALE_SPARK") or k == "SHALE_ENGINE" for k in environ)
    assert "env" not in compact_container(one(docs, "CronJob"))


def test_spark_overlay_rbac() -> None:
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


def test_spark_overlay_driver_settings() -> None:
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


# --- (e) the settings are real `compact` flags, with values it accepts ------------------------

def long_options() -> set[str]:
    parser = build_compact_parser()
    return {s for action in parser._actions for s in action.option_strings if s.startswith("--")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_shale_variable_is_a_compact_flag(overlay: str) -> None:
    options = long_options()
    docs = rendered(overlay)
    names = set(one(docs, "ConfigMap")["data"]) | set(container_environment(docs))
    shale = sorted(n for n in names if n.startswith("SHALE_"))
    assert "SHALE_ALL" in shale
    for name in shale:
        x = name.removeprefix("SHALE_")
        assert x == "TOPICS" or "--" + x.lower().replace("_", "-") in options, f"{name} is not a compact flag"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_compact_accepts_the_settings(overlay: str) -> None:
    """``compact --print-config`` with the pod's environment: every value parses, and each
    non-empty SHALE_* variable is taken."""
    environ = container_environment(rendered(overlay))
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SHALE_", "AWS_"))}
    proc = subprocess.run([sys.executable, "-m", "compactor.cli", "--print-config"], capture_output=True, text=True,
                          env={**clean, **environ}, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    settings = json.loads(proc.stdout)["settings"]
    by_variable = {s["variable"]: s for s in settings.values()}
    for name, value in environ.items():
        if name.startswith("SHALE_"):
            assert by_variable[name]["source"] == ("env" if value.strip() else "default"), name
    assert settings["--all"]["value"] == "s3://my-bucket/topics/"
    assert settings["--json"]["value"] is True
    assert settings["--log-format"]["value"] == "json"
    if overlay == "spark":
        assert settings["--engine"]["value"] == "spark"
        # --max-map-bytes is a usage error with the Spark engine: the overlay empties it.
        assert settings["--max-map-bytes"]["value"] is None
        assert settings["--no-forward-credentials"]["value"] is True
        assert f"spark.driver.host={POD_FIELDS['status.podIP']}" in settings["--spark-conf"]["value"]
    else:
        assert settings["--engine"]["value"] == "local"
        assert settings["--max-map-bytes"]["value"] == 1 << 30


# --- (d) the Dockerfile -----------------------------------------------------------------------

def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comment lines dropped, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    assert not pending, "a continuation line ends the file"
    return instructions


def dockerfile_stages() -> tuple[dict[str, str], dict[str, tuple[str, list[tuple[str, str]]]], list[str]]:
    """Global ARG defaults, {stage: (base, instructions)} and the stage names in order."""
    args: dict[str, str] = {}
    stages: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    order: list[str] = []
    for keyword, rest in dockerfile_instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            m = re.fullmatch(r"(\S+) AS (\S+)", rest, re.IGNORECASE)
            assert m, f"every stage is named: FROM {rest}"
            base = re.sub(r"\$\{(\w+)\}", lambda v: args[v.group(1)], m.group(1))
            order.append(m.group(2))
            stages[m.group(2)] = (base, [])
        elif not order:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            stages[order[-1]][1].append((keyword, rest))
    return args, stages, order


def last(instructions: list[tuple[str, str]], keyword: str) -> str:
    found = [rest for k, rest in instructions if k == keyword]
    assert found, f"no {keyword}"
    return found[-1]


def all_of(instructions: list[tuple[str, str]], keyword: str) -> list[str]:
    return [rest for k, rest in instructions if k == keyword]


def env_of(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in all_of(instructions, "ENV"):
        for m in re.finditer(r"(\w+)=(\S+)", rest):
            env[m.group(1)] = m.group(2)
    return env


def test_dockerfile_stages_and_default_target() -> None:
    _args, stages, order = dockerfile_stages()
    assert order == ["builder", "venv-local", "venv-spark", "spark", "local"]
    assert order[-1] == "local", "docker build without --target builds the last stage"
    readme = (DOCKER / "README.md").read_text()
    assert "--target spark" in readme
    bases = {name: base for name, (base, _) in stages.items()}
    assert bases["venv-local"] == bases["venv-spark"] == "builder"
    for name in ("builder", "spark", "local"):
        assert bases[name] == "python:3.11-slim-bookworm"
        assert re.fullmatch(r"[\w./-]+:[\w.-]*slim[\w.-]*", bases[name])


def test_dockerfile_builder_makes_wheels() -> None:
    _args, stages, _order = dockerfile_stages()
    builder = stages["builder"][1]
    runs = " ".join(all_of(builder, "RUN"))
    assert "python -m venv" in runs and "/opt/shale" in runs
    assert re.search(r"pip wheel --no-deps --wheel-dir /wheels \.", runs)
    assert re.search(r"pip wheel --wheel-dir /wheels [^&;]*\[s3\]", runs)
    for stage, extras in (("venv-local", "[s3]"), ("venv-spark", "[s3,spark]")):
        install = " ".join(all_of(stages[stage][1], "RUN"))
        assert re.search(r"pip install --no-index --find-links /wheels [^&;]*" + re.escape(extras), install), stage
        # the C kernels are optional for pip, not for the image: their import is checked
        assert re.search(r"pip install .*&& /opt/shale/bin/python -c \"import ledger._kernels\"", install), stage
    # ... and built, with a compiler the final stages do not copy
    assert re.search(r"apt-get install -y --no-install-recommends gcc libc6-dev", runs)
    assert runs.index("gcc") < runs.index("pip wheel")


def test_dockerfile_copies_every_package_of_the_project() -> None:
    _args, stages, _order = dockerfile_stages()
    copies = [c.split() for c in all_of(stages["builder"][1], "COPY")]
    sources = {s.rstrip("/") for c in copies if not c[0].startswith("--") for s in c[:-1]}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*").rstrip(".") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= sources, f"not copied into the build: {sorted(packages - sources)}"
    assert {"pyproject.toml", project["project"]["readme"]} <= sources
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    for source in sources | {"infra/docker/spark-entrypoint.sh"}:
        assert (ROOT / source).exists(), source
        assert f"!{source}" in ignore or f"!{source}/" in ignore, f"{source} is excluded from the build context"


@pytest.mark.parametrize("stage", ["local", "spark"])
def test_dockerfile_final_stages_run_unprivileged_from_the_venv(stage: str) -> None:
    _args, stages, _order = dockerfile_stages()
    instructions = stages[stage][1]
    user = last(instructions, "USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) == 10001 and gid == "10001"
    # the pods' runAsUser is the image's user
    for overlay in OVERLAYS:
        assert pod_spec(one(rendered(overlay), "CronJob"))["securityContext"]["runAsUser"] == int(uid)
    runs = " ".join(all_of(instructions, "RUN"))
    assert re.search(r"useradd --uid 10001 --gid 10001 .*--shell /usr/sbin/nologin shale", runs)
    assert "groupadd --gid 10001 shale" in runs
    copies = all_of(instructions, "COPY")
    assert f"--from=venv-{stage} /opt/shale /opt/shale" in copies
    assert not any(c.startswith("--from=builder") for c in copies), "no build tools or wheels in the image"
    env = env_of(instructions)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert env["HOME"] == "/tmp", "the only writable place under readOnlyRootFilesystem"
    assert env["PATH"].startswith("/opt/shale/bin:")
    assert last(instructions, "WORKDIR") == "/home/shale"
    assert json.loads(last(instructions, "CMD")) == ["--help"]
    # USER comes after every RUN: nothing runs as root at run time
    keywords = [k for k, _ in instructions]
    assert max(i for i, k in enumerate(keywords) if k == "RUN") < keywords.index("USER")


def test_dockerfile_local_entrypoint_is_compact() -> None:
    _args, stages, _order = dockerfile_stages()
    assert json.loads(last(stages["local"][1], "ENTRYPOINT")) == ["compact"]


def test_dockerfile_spark_target() -> None:
    _args, stages, _order = dockerfile_stages()
    base, instructions = stages["spark"]
    runs = " ".join(all_of(instructions, "RUN"))
    assert re.search(r"apt-get install -y --no-install-recommends [^&]*\bopenjdk-17-jre-headless\b", runs)
    assert "rm -rf /var/lib/apt/lists/*" in runs
    env = env_of(instructions)
    assert env["JAVA_HOME"].startswith("/usr/lib/jvm/java-17")
    python = re.match(r"python:(\d+\.\d+)-", base)
    assert python
    assert env["SPARK_HOME"] == f"/opt/shale/lib/python{python.group(1)}/site-packages/pyspark"
    assert env["PYSPARK_PYTHON"] == "/opt/shale/bin/python"
    entrypoint = json.loads(last(instructions, "ENTRYPOINT"))
    assert entrypoint == ["/opt/shale/bin/shale-spark-entrypoint"]
    copy_line = f"infra/docker/spark-entrypoint.sh {entrypoint[0]}"
    copies = all_of(instructions, "COPY")
    assert copy_line in copies or f"--chmod=0755 {copy_line}" in copies
    # executable whatever the bit in the checkout
    assert f"--chmod=0755 {copy_line}" in copies or re.search(rf"chmod 0?755 {re.escape(entrypoint[0])}", runs)


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


def test_spark_entrypoint_syntax() -> None:
    proc = subprocess.run(["bash", "-n", str(ENTRYPOINT_SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = ENTRYPOINT_SCRIPT.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert 'exec compact "$@"' in text
    assert "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend" in text


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


def test_spark_entrypoint_executor_needs_spark_variables(tmp_path: Path) -> None:
    fake_program(tmp_path / "jdk" / "bin" / "java", "java")
    proc = run_entrypoint(["executor"], {"PATH": "/usr/bin:/bin", "JAVA_HOME": str(tmp_path / "jdk"),
                                         "SPARK_HOME": "/opt/spark-home"})
    assert proc.returncode != 0
    assert "java" not in proc.stdout
    assert "unbound variable" in proc.stderr
