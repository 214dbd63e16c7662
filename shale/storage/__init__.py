"""Object storage: one small interface, backends chosen by URI scheme, and the settings
they are opened with.

>>> from shale.storage import StorageOptions, resolve
>>> loc = resolve("memory://doc/topics/t", StorageOptions())
>>> loc.store.put(loc.key("a"), b"x"); loc.store.get(loc.key("a"))
b'x'

* :class:`ObjectStore` — the interface, its capability flags (:data:`CAPABILITIES`,
  checked up front with :func:`require`) and :class:`Location`, a folder on a store;
* :func:`resolve` — a URI to a :class:`Location`, on a store opened with
  :class:`StorageOptions` (the environment's when none are given);
* :func:`register_backend` and the ``shale.storage`` entry-point group — more schemes;
* :mod:`shale.storage.retry` — the retry policies of transient errors and of
  compare-and-swap loops;
* :mod:`shale.testing.storage` — the conformance suite a backend must pass.

The backends themselves (``_local``, ``_memory``, ``_s3``, ``_fsspec``) are private:
they are reached through :func:`resolve`.
"""

from shale.storage.base import CAPABILITIES, Location, ObjectInfo, ObjectStore, ObjectWriter, require, validate_key_part
from shale.storage.options import S3Options, StorageOptions
from shale.storage.registry import (
    ENTRY_POINT_GROUP,
    BackendFactory,
    clear_backend_cache,
    open_store,
    register_backend,
    resolve,
)

__all__ = [
    "CAPABILITIES",
    "ENTRY_POINT_GROUP",
    "BackendFactory",
    "Location",
    "ObjectInfo",
    "ObjectStore",
    "ObjectWriter",
    "S3Options",
    "StorageOptions",
    "clear_backend_cache",
    "open_store",
    "register_backend",
    "require",
    "resolve",
    "validate_key_part",
]
