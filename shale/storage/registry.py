"""Backends chosen by URI scheme, and :func:`resolve`, which turns a URI into a folder on
a store opened with the given :class:`~shale.storage.options.StorageOptions`.

Built-in backends: local paths and ``file://``, ``memory://`` (tests), ``s3://`` (boto3);
any other scheme fsspec knows is served through fsspec (data only; no compare-and-swap).
Another distribution adds a backend through the ``shale.storage`` entry-point group.
"""

from __future__ import annotations

import importlib
import inspect
import os
import threading
import urllib.parse
from collections.abc import Callable
from typing import Final

from shale.ledger.errors import InvalidURIError
from shale.ledger.masking import userinfo
from shale.storage.base import _CONTROL, Location, ObjectStore, mask_uri
from shale.storage.options import StorageOptions

__all__ = ["ENTRY_POINT_GROUP", "BackendFactory", "clear_backend_cache", "open_store", "register_backend", "resolve"]

#: Opens the store of one bucket or host (the URI's netloc) with the given options.  A
#: factory that takes the netloc alone is accepted too, for stores that need no options.
BackendFactory = Callable[[str, StorageOptions], ObjectStore]

_HADOOP_S3: Final = frozenset({"s3a", "s3n"})
_REGISTRY: dict[str, BackendFactory] = {}
# Keyed by options, to open each store once per set of settings, and by process id: a
# client must not cross a fork.
_CACHE: dict[tuple[str, str, StorageOptions, int], ObjectStore] = {}
_CACHE_LOCK = threading.Lock()


def register_backend(scheme: str, factory: Callable[[str, StorageOptions], ObjectStore] | Callable[[str], ObjectStore],
                     ) -> None:
    """Make ``scheme://netloc/...`` URIs open ``factory(netloc, options)`` (or
    ``factory(netloc)`` for a factory of one parameter)."""
    _REGISTRY[scheme] = _with_options(factory)
    with _CACHE_LOCK:
        for k in [k for k in _CACHE if k[0] == scheme]:
            del _CACHE[k]


def _with_options(factory: Callable[..., ObjectStore]) -> BackendFactory:
    try:
        takes_options = len(inspect.signature(factory).parameters) >= 2
    except (TypeError, ValueError):  # (a builtin without a signature: called as documented)
        takes_options = True
    if takes_options:
        return factory
    return lambda netloc, _options: factory(netloc)


def clear_backend_cache() -> None:
    """Drop cached stores: the next :func:`resolve` opens them again."""
    with _CACHE_LOCK:
        _CACHE.clear()


# Built-in backends register themselves when imported; each is imported only when its
# scheme is first used (the S3 one pulls in boto3's retry machinery).
_BUILT_IN: Final = {"file": "shale.storage._local", "memory": "shale.storage._memory", "s3": "shale.storage._s3"}


#: The entry-point group through which an installed distribution adds a backend: the
#: entry point's name is the URI scheme, its value a :data:`BackendFactory`, e.g. in the
#: plugin's pyproject.toml ``[project.entry-points."shale.storage"] gcsx = "mypkg:open_store"``.
ENTRY_POINT_GROUP: Final = "shale.storage"


def open_store(scheme: str, netloc: str, options: StorageOptions | None = None) -> ObjectStore:
    """The store of ``scheme://netloc`` opened with ``options`` (the environment's when
    ``None``): one per scheme, netloc and options in each process."""
    options = StorageOptions.from_environment() if options is None else options
    if scheme not in _REGISTRY and scheme in _BUILT_IN:
        importlib.import_module(_BUILT_IN[scheme])
    elif scheme not in _REGISTRY:
        _register_entry_point(scheme)
    key = (scheme, netloc, options, os.getpid())
    with _CACHE_LOCK:
        store = _CACHE.get(key)
        if store is None:
            factory = _REGISTRY.get(scheme)
            if factory is None:
                from shale.storage._fsspec import fsspec_factory

                factory = fsspec_factory(scheme)
            store = factory(netloc, options)
            _CACHE[key] = store
        return store


def _register_entry_point(scheme: str) -> None:
    # Looked up only for a scheme nothing registered: a plugin is imported when first used
    # (and so is importlib.metadata, which pulls in the email package: too much for every start).
    import importlib.metadata

    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=scheme)
    for entry in found:
        try:
            factory = entry.load()
        except Exception as exc:
            raise InvalidURIError(f"the storage backend for {scheme}:// ({entry.value}, entry point "
                                  f"{ENTRY_POINT_GROUP!r}) cannot be loaded: {exc}") from exc
        register_backend(scheme, factory)
        return


def resolve(uri: str, options: StorageOptions | None = None) -> Location:
    """Turn a URI or local path into a :class:`Location` on a store opened with
    ``options`` (read from the environment now when ``None``).

    ``/data/t``, ``./t``, ``file:///data/t`` → local folder; ``s3://bucket/t``;
    ``memory://name/t``; a scheme an installed plugin declares in the ``shale.storage``
    entry-point group; any other scheme fsspec supports.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise InvalidURIError("empty URI")
    if any(c in _CONTROL for c in uri):
        raise InvalidURIError(f"URI {mask_uri(uri)!r} contains control characters")
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        path = parts.path if scheme == "file" else uri
        if scheme == "file" and parts.netloc not in ("", "localhost"):
            raise InvalidURIError(f"file URI {uri!r} names a host; use file:///path")
        _check_segments(path, uri)
        # The operator's own path may pass through links (/data -> /mnt/volume); it is
        # resolved once, here.  Below it the local store follows no link at all.
        abspath = os.path.realpath(os.path.expanduser(path))
        return Location(open_store("file", "", options), abspath.strip("/"), abspath)
    _, slashes, rest = uri.partition("://")
    if not slashes:
        raise InvalidURIError(f"URI {mask_uri(uri)!r} has no '//' after its scheme: {scheme}://bucket/prefix")
    if scheme in _HADOOP_S3:
        raise InvalidURIError(f"{mask_uri(uri)}: {scheme}:// is Hadoop's name for S3; use s3://{rest}")
    if "@" in parts.netloc or userinfo(rest):
        raise InvalidURIError(f"URI {mask_uri(uri)} carries credentials: Shale takes them only from the "
                              "environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, a web identity, an instance role) "
                              "or the storage options")
    if parts.query or parts.fragment:
        raise InvalidURIError(f"URI {mask_uri(uri)!r} must not have a query or fragment")
    if not parts.netloc:
        raise InvalidURIError(f"URI {uri!r} names no bucket or host")
    _check_segments(parts.path, uri)
    prefix = "/".join(s for s in parts.path.split("/") if s)
    canonical = f"{scheme}://{parts.netloc}/{prefix}".rstrip("/")
    return Location(open_store(scheme, parts.netloc, options), prefix, canonical)


def _check_segments(path: str, uri: str) -> None:
    for seg in path.replace("\\", "/").split("/"):
        if seg == "..":
            raise InvalidURIError(f"URI {uri!r} must not contain '..'")
