"""A small renderer for the kustomize subset ``infra/k8s/`` uses, so tests can check the
rendered manifests without kustomize or kubectl installed.

Supported, with kustomize's (v5) semantics:

* ``resources``: YAML files (one or more documents) and directories holding a
  kustomization, recursively;
* ``patches`` with only ``path:``: one strategic-merge patch document, applied to the one
  resource with its apiVersion group, kind and name.  Maps merge key by key (``null``
  deletes a key); the lists Kubernetes merges by a key (containers and env by ``name``,
  volumeMounts by ``mountPath``, ...) merge element by element, in the patch's order
  followed by the elements only the original has; other lists are replaced;
* ``namespace`` (and the ServiceAccount subjects of RoleBindings that kustomize moves with it);
* ``labels`` with ``pairs`` and ``includeSelectors: false`` (metadata labels only);
* ``images`` with ``name`` and ``newName`` / ``newTag``, in every ``containers`` and
  ``initContainers`` list;
* ``replacements`` from one resource's field to fields of resources selected by kind and
  name, with ``[key=value]`` list selectors in field paths.

Transformations run in kustomize's order: patches, namespace, labels, images,
replacements.  Anything else (a field, an option, a patch directive, a list whose merge
key is unknown) raises :class:`UnsupportedError`: this renderer never guesses.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["UnsupportedError", "render"]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = frozenset({"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches",
                              "replacements"})
# List fields Kubernetes merges element by element, and the key it merges them by.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "hostAliases": "ip",
}
# Lists of scalars that Kubernetes merges instead of replacing.
MERGED_SCALAR_LISTS = frozenset({"finalizers"})
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                            "PersistentVolume", "StorageClass", "PriorityClass", "Node",
                            "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"})
_SEGMENT = re.compile(r"\[([^=\]]+)=([^\]]*)\]|([^.\[\]]+)")


class UnsupportedError(ValueError):
    """The kustomization uses something this renderer does not implement."""


def render(overlay_dir: Path) -> list[dict[str, Any]]:
    """The documents ``kustomize build overlay_dir`` would output (in no particular order)."""
    return _build(Path(overlay_dir).resolve(), ())


def _load_kustomization(directory: Path) -> tuple[Path, dict[str, Any]]:
    found = [directory / n for n in KUSTOMIZATION_FILES if (directory / n).is_file()]
    if len(found) != 1:
        raise UnsupportedError(f"{directory}: expected exactly one of {', '.join(KUSTOMIZATION_FILES)}")
    doc = yaml.safe_load(found[0].read_text())
    if not isinstance(doc, dict):
        raise UnsupportedError(f"{found[0]}: not a mapping")
    unknown = sorted(set(doc) - SUPPORTED_FIELDS)
    if unknown:
        raise UnsupportedError(f"{found[0]}: unsupported kustomization field(s): {', '.join(unknown)}")
    if doc.get("apiVersion", "kustomize.config.k8s.io/v1beta1") != "kustomize.config.k8s.io/v1beta1" or \
            doc.get("kind", "Kustomization") != "Kustomization":
        raise UnsupportedError(f"{found[0]}: not a kustomize.config.k8s.io/v1beta1 Kustomization")
    return found[0], doc


def _build(directory: Path, seen: tuple[Path, ...]) -> list[dict[str, Any]]:
    if directory in seen:
        raise UnsupportedError(f"{directory}: kustomization cycle")
    path, k = _load_kustomization(directory)
    docs: list[dict[str, Any]] = []
    for entry in k.get("resources", []):
        if not isinstance(entry, str) or "://" in entry or entry.startswith(("github.com/", "git@")):
            raise UnsupportedError(f"{path}: unsupported resource {entry!r} (local files and directories only)")
        target = (directory / entry).resolve()
        if target.is_dir():
            docs += _build(target, (*seen, directory))
        elif target.is_file():
            docs += _load_documents(target)
        else:
            raise UnsupportedError(f"{path}: resource {entry!r} does not exist")
    _check_unique(docs, path)
    for patch in k.get("patches", []):
        _apply_patch(docs, patch, directory, path)
    if "namespace" in k:
        _set_namespace(docs, k["namespace"], path)
    for entry in k.get("labels", []):
        _add_labels(docs, entry, path)
    for entry in k.get("images", []):
        _set_image(docs, entry, path)
    for entry in k.get("replacements", []):
        _replace(docs, entry, path)
    _check_unique(docs, path)
    return docs


def _load_documents(path: Path) -> list[dict[str, Any]]:
    docs = []
    for doc in yaml.safe_load_all(path.read_text()):
        if doc is None:
            continue
        if not isinstance(doc, dict) or not {"apiVersion", "kind", "metadata"} <= set(doc) or \
                "name" not in doc["metadata"]:
            raise UnsupportedError(f"{path}: a document is not a Kubernetes resource with a name")
        if doc["kind"].endswith("List"):
            raise UnsupportedError(f"{path}: List resources are not supported")
        docs.append(doc)
    return docs


def _resource_id(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    group = doc["apiVersion"].rpartition("/")[0]
    return group, doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


def _check_unique(docs: list[dict[str, Any]], where: Path) -> None:
    ids = [_resource_id(d) for d in docs]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise UnsupportedError(f"{where}: resources defined more than once: {duplicates}")


# --- patches ---------------------------------------------------------------------------------

def _apply_patch(docs: list[dict[str, Any]], entry: Any, directory: Path, where: Path) -> None:
    if not isinstance(entry, dict) or set(entry) != {"path"}:
        raise UnsupportedError(f"{where}: only patches with just 'path:' (strategic merge) are supported: {entry!r}")
    patch_file = directory / entry["path"]
    patches = [d for d in yaml.safe_load_all(patch_file.read_text()) if d is not None]
    if len(patches) != 1 or not isinstance(patches[0], dict):
        raise UnsupportedError(f"{patch_file}: expected one strategic-merge patch document (JSON patches and "
                               "several documents are not supported)")
    patch = patches[0]
    try:
        group, kind, namespace, name = _resource_id(patch)
    except (KeyError, AttributeError):
        raise UnsupportedError(f"{patch_file}: a patch needs apiVersion, kind and metadata.name") from None
    matches = [i for i, d in enumerate(docs)
               if _resource_id(d)[:2] == (group, kind) and d["metadata"]["name"] == name
               and (not namespace or d["metadata"].get("namespace", "") == namespace)]
    if len(matches) != 1:
        raise UnsupportedError(f"{patch_file}: the patch matches {len(matches)} resources, not one")
    docs[matches[0]] = _merge(docs[matches[0]], patch, f"{patch_file}:")


def _merge(original: Any, patch: Any, at: str) -> Any:
    if isinstance(patch, dict):
        directives = [k for k in patch if isinstance(k, str) and k.startswith("$")]
        if directives:
            raise UnsupportedError(f"{at} patch directives are not supported: {directives}")
        if not isinstance(original, dict):
            return _without_nulls(patch)
        merged = copy.deepcopy(original)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = _merge_field(key, merged[key], value, f"{at}{key}.")
            else:
                merged[key] = _without_nulls(value)
        return merged
    return copy.deepcopy(patch)


def _merge_field(key: str, original: Any, patch: Any, at: str) -> Any:
    if not (isinstance(patch, list) and isinstance(original, list)):
        return _merge(original, patch, at)
    if key in MERGED_SCALAR_LISTS:
        raise UnsupportedError(f"{at} merging the list {key!r} is not supported")
    if not any(isinstance(v, dict) for v in original + patch):
        return copy.deepcopy(patch)  # lists of scalars are replaced
    if not patch:
        raise UnsupportedError(f"{at} an empty list patching the list {key!r} is not supported")
    merge_key = MERGE_KEYS.get(key)
    if merge_key is None:
        raise UnsupportedError(f"{at} unknown merge strategy for the list {key!r}")
    for item in original + patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise UnsupportedError(f"{at} an element of {key!r} has no {merge_key!r}")
        if any(isinstance(k, str) and k.startswith("$") for k in item):
            raise UnsupportedError(f"{at} patch directives are not supported in {key!r}")
    by_key = {item[merge_key]: item for item in original}
    in_patch = {item[merge_key] for item in patch}
    merged = [_merge(by_key[item[merge_key]], item, f"{at}[{item[merge_key]}].") if item[merge_key] in by_key
              else _without_nulls(item) for item in patch]
    return merged + [copy.deepcopy(item) for item in original if item[merge_key] not in in_patch]


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


# --- namespace, labels, images ---------------------------------------------------------------

def _set_namespace(docs: list[dict[str, Any]], namespace: Any, where: Path) -> None:
    if not isinstance(namespace, str) or not namespace:
        raise UnsupportedError(f"{where}: namespace must be a non-empty string")
    accounts = {d["metadata"]["name"]: d["metadata"].get("namespace", "")
                for d in docs if d["kind"] == "ServiceAccount"}
    for d in docs:
        if d["kind"] in CLUSTER_SCOPED:
            raise UnsupportedError(f"{where}: cluster-scoped {d['kind']} with a namespace is not supported")
        d["metadata"]["namespace"] = namespace
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for s in d.get("subjects", []):
                if s.get("kind") != "ServiceAccount":
                    continue
                name, current = s.get("name"), s.get("namespace", "")
                # kustomize moves the "default" account, and accounts it renders, with the namespace
                if name == "default" or (name in accounts and current in ("", accounts[name])):
                    s["namespace"] = namespace


def _add_labels(docs: list[dict[str, Any]], entry: Any, where: Path) -> None:
    if not isinstance(entry, dict) or not set(entry) <= {"pairs", "includeSelectors", "includeTemplates"} or \
            entry.get("includeSelectors", False) or entry.get("includeTemplates", False):
        raise UnsupportedError(f"{where}: only labels with pairs and includeSelectors/includeTemplates false are "
                               f"supported: {entry!r}")
    pairs = entry.get("pairs", {})
    if not isinstance(pairs, dict) or not all(isinstance(v, str) for v in pairs.values()):
        raise UnsupportedError(f"{where}: label values must be strings: {pairs!r}")
    for d in docs:
        d["metadata"].setdefault("labels", {}).update(pairs)


def _split_image(image: str) -> tuple[str, str]:
    """``repo/name:tag`` → (``repo/name``, ``:tag``); a digest stays with its ``@``."""
    at = image.find("@")
    if at >= 0:
        return image[:at], image[at:]
    colon = image.rfind(":")
    if colon > image.rfind("/"):
        return image[:colon], image[colon:]
    return image, ""


def _set_image(docs: list[dict[str, Any]], entry: Any, where: Path) -> None:
    if not isinstance(entry, dict) or "name" not in entry or not set(entry) <= {"name", "newName", "newTag"}:
        raise UnsupportedError(f"{where}: only images with name, newName and newTag are supported: {entry!r}")
    name = entry["name"]
    new_name = str(entry.get("newName", name))
    new_tag = entry.get("newTag")

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    for c in value:
                        if isinstance(c, dict) and isinstance(c.get("image"), str):
                            current, suffix = _split_image(c["image"])
                            if current == name:
                                c["image"] = new_name + (f":{new_tag}" if new_tag is not None else suffix)
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    for d in docs:
        visit(d)


# --- replacements ----------------------------------------------------------------------------

def _parse_field_path(text: Any, where: Path) -> list[str | tuple[str, str]]:
    if not isinstance(text, str) or not text:
        raise UnsupportedError(f"{where}: a fieldPath must be a non-empty string")
    segments: list[str | tuple[str, str]] = []
    for part in text.split("."):
        m = _SEGMENT.fullmatch(part)
        if m is None:
            raise UnsupportedError(f"{where}: unsupported fieldPath {text!r}")
        segments.append((m.group(1), m.group(2)) if m.group(1) is not None else m.group(3))
    return segments


def _walk(doc: dict[str, Any], segments: list[str | tuple[str, str]], where: str) -> tuple[Any, Any]:
    """The container of the field ``segments`` names and the field's key or index."""
    node: Any = doc
    for i, seg in enumerate(segments):
        if isinstance(seg, tuple):
            if not isinstance(node, list):
                raise UnsupportedError(f"{where}: [{seg[0]}={seg[1]}] applied to a non-list")
            found = [j for j, item in enumerate(node) if isinstance(item, dict) and str(item.get(seg[0])) == seg[1]]
            if len(found) != 1:
                raise UnsupportedError(f"{where}: [{seg[0]}={seg[1]}] matches {len(found)} elements")
            key: Any = found[0]
        else:
            if not isinstance(node, dict) or seg not in node:
                raise UnsupportedError(f"{where}: no field {seg!r}")
            key = seg
        if i == len(segments) - 1:
            return node, key
        node = node[key]
    raise UnsupportedError(f"{where}: empty fieldPath")


def _select(docs: list[dict[str, Any]], selector: Any, where: Path) -> list[dict[str, Any]]:
    if not isinstance(selector, dict) or set(selector) != {"kind", "name"}:
        raise UnsupportedError(f"{where}: only selections by kind and name are supported: {selector!r}")
    return [d for d in docs if d["kind"] == selector["kind"] and d["metadata"]["name"] == selector["name"]]


def _replace(docs: list[dict[str, Any]], entry: Any, where: Path) -> None:
    if not isinstance(entry, dict) or set(entry) != {"source", "targets"}:
        raise UnsupportedError(f"{where}: only replacements with source and targets are supported: {entry!r}")
    source = entry["source"]
    if not isinstance(source, dict) or set(source) != {"kind", "name", "fieldPath"}:
        raise UnsupportedError(f"{where}: only sources with kind, name and fieldPath are supported: {source!r}")
    found = _select(docs, {"kind": source["kind"], "name": source["name"]}, where)
    if len(found) != 1:
        raise UnsupportedError(f"{where}: the replacement source matches {len(found)} resources, not one")
    parent, key = _walk(found[0], _parse_field_path(source["fieldPath"], where), f"{where}: source")
    value = parent[key]
    if isinstance(value, dict | list):
        raise UnsupportedError(f"{where}: only scalar replacement sources are supported")
    for target in entry["targets"]:
        if not isinstance(target, dict) or set(target) != {"select", "fieldPaths"}:
            raise UnsupportedError(f"{where}: only targets with select and fieldPaths are supported: {target!r}")
        selected = _select(docs, target["select"], where)
        if not selected:
            raise UnsupportedError(f"{where}: a replacement target selects no resource")
        for d in selected:
            for field_path in target["fieldPaths"]:
                parent, key = _walk(d, _parse_field_path(field_path, where), f"{where}: target {field_path}")
                parent[key] = copy.deepcopy(value)
