"""Where a topic's Iceberg table lives: its catalog, its name, its warehouse.

A catalog is named by a URI (:class:`IcebergTarget`):

* ``sqlite:///PATH`` (or a bare local path): pyiceberg's SQL catalog on a SQLite file,
  the embedded default; without a warehouse, the tables go in a ``warehouse`` folder beside
  the file;
* ``postgresql://USER@HOST:PORT/DB`` (``postgresql+psycopg2://`` too): the SQL catalog on
  PostgreSQL, for real deployments (the password from ``PGPASSWORD`` or ``~/.pgpass``,
  as every libpq client reads it, rather than in the URI); a warehouse is needed;
* ``http://`` or ``https://``: a REST catalog (Polaris, Nessie, Gravitino, Lakekeeper,
  AWS Glue's or Snowflake's endpoints...), with its properties passed through as given
  (``credential``, ``token``, ``warehouse``, ``s3.*``...).

A warehouse on S3 (``s3://bucket/prefix``) is reached with the settings every Shale
command uses (``AWS_ENDPOINT_URL``, the keys, the region), unless the properties give
``s3.*`` of their own.  What goes wrong is said in one line, as every Shale error is
(:func:`translated`): a catalog that cannot be reached is transient (exit 1), one that
refuses to be written, or a warehouse that cannot be written, is an access error (2).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from shale.ledger.errors import (
    ConflictError,
    InvalidInputError,
    ShaleError,
    StorageError,
    StoragePermissionError,
    TransientStorageError,
)
from shale.ledger.masking import mask_secrets
from shale.ledger.values import dataclass

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

__all__ = ["IcebergTarget", "open_catalog", "require_pyiceberg", "translated"]

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
#: The catalog's name in pyiceberg (it never reaches the catalog's storage).
_CATALOG_NAME: Final = "shale"


@dataclass(frozen=True, slots=True)
class IcebergTarget:
    """A topic's table: the catalog's URI, the table's ``NAMESPACE.NAME``, the warehouse
    (None: the catalog's own, or beside a SQLite file), how keys and values are kept
    (:data:`~shale.iceberg.schema.VALUE_FORMATS`; None: as the table keeps them, binary for
    a new one), the catalog's other properties, and the
    deleted fraction past which a data file is rewritten."""

    catalog: str
    table: str
    warehouse: str | None = None
    #: None: as the table keeps them (binary for a new one)
    value_format: str | None = None
    properties: tuple[tuple[str, str], ...] = ()
    rewrite_fraction: float = 0.2

    def __post_init__(self) -> None:
        if not self.catalog.strip():
            raise InvalidInputError("the Iceberg catalog's URI is empty")
        if _NAME.fullmatch(self.table) is None:
            raise InvalidInputError(f"bad Iceberg table name {self.table!r}: expected NAMESPACE.NAME (letters, digits "
                                    "and underscores, e.g. shale.users)")

    @property
    def identifier(self) -> tuple[str, ...]:
        return tuple(self.table.split("."))

    @property
    def shown(self) -> str:
        """The table as messages name it (no password)."""
        return f"Iceberg table {self.table} in {mask_secrets(self.catalog)}"


def require_pyiceberg() -> None:
    """A one-line error saying how to install pyiceberg, where it is missing."""
    try:
        import pyarrow  # noqa: F401
        import pyiceberg  # noqa: F401
    except ImportError:
        raise InvalidInputError("Iceberg tables need pyiceberg: pip install 'shale[iceberg]'") from None


def _sql_uri(uri: str) -> str | None:
    """The SQLAlchemy URI of a SQL catalog (None: not one)."""
    if uri.startswith(("sqlite:", "postgresql+")):
        return uri
    if uri.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg2://" + uri.split("://", 1)[1]
    if "://" not in uri:  # a local path: a SQLite file
        return "sqlite:///" + os.path.abspath(uri)
    return None


def _default_warehouse(sql: str | None) -> str | None:
    if sql is None or not sql.startswith("sqlite:///"):
        return None
    path = sql[len("sqlite:///"):]
    return "file://" + os.path.join(os.path.dirname(os.path.abspath(path)), "warehouse")


def _s3_properties() -> dict[str, str]:
    """Shale's S3 settings (the standard variables) as pyiceberg's FileIO takes them."""
    from shale.storage.options import S3Options

    o = S3Options.from_environment()
    given = {"s3.endpoint": o.endpoint_url, "s3.region": o.region, "s3.access-key-id": o.access_key_id,
             "s3.secret-access-key": o.secret_access_key, "s3.session-token": o.session_token}
    out = {k: v for k, v in given.items() if v}
    if o.addressing_style == "path" or o.endpoint_url:
        out["s3.force-virtual-addressing"] = "false"
    return out


def open_catalog(target: IcebergTarget) -> Catalog:
    """The catalog ``target`` names, connected (see the module)."""
    require_pyiceberg()
    sql = _sql_uri(target.catalog)
    props: dict[str, str] = {**_s3_properties(), **dict(target.properties)}
    if sql is not None and sql.startswith("sqlite:///") and not sql.startswith("sqlite:///file:"):
        path = sql[len("sqlite:///"):].split("?", 1)[0]
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise InvalidInputError(f"the folder of the Iceberg catalog {path} does not exist")
    warehouse = target.warehouse or _default_warehouse(sql)
    if warehouse is not None:
        props["warehouse"] = warehouse if "://" in warehouse else "file://" + os.path.abspath(warehouse)
    with translated(target):
        if sql is not None:
            from pyiceberg.catalog.sql import SqlCatalog

            if warehouse is None:
                raise InvalidInputError(f"{target.shown} needs a warehouse (--iceberg-warehouse: a folder or "
                                        "s3://bucket/prefix)")
            return SqlCatalog(_CATALOG_NAME, uri=sql, **props)
        if target.catalog.startswith(("http://", "https://")):
            from pyiceberg.catalog.rest import RestCatalog

            return RestCatalog(_CATALOG_NAME, uri=target.catalog, **props)
    raise InvalidInputError(f"unknown Iceberg catalog {mask_secrets(target.catalog)!r}: expected sqlite:///PATH, a "
                            "path, postgresql://USER@HOST:PORT/DB, or a REST catalog's http(s):// URI")


def _kind(e: BaseException) -> str:
    """What failed: ``access`` (refused), ``transient`` (unreachable, busy), ``conflict``,
    ``usage`` or ``other``."""
    name = type(e).__name__
    text = str(e).lower()
    if isinstance(e, PermissionError) or any(w in text for w in (
            "readonly database", "read-only", "permission denied", "access denied", "forbidden",
            "insufficient privilege", "not authorized", "unauthorized", "accessdenied")):
        return "access"
    if name in ("CommitFailedException", "CommitStateUnknownException"):
        return "conflict"
    if name in ("ForbiddenError", "UnauthorizedError", "OAuthError"):
        return "access"
    if name in ("OperationalError", "InterfaceError", "ConnectionError", "ServiceUnavailableError", "ServerError",
                "Timeout", "ConnectTimeout", "ReadTimeout", "TimeoutError", "ConnectionRefusedError") \
            or isinstance(e, (ConnectionError, TimeoutError)):
        return "transient"
    if name in ("NoSuchPropertyException", "BadRequestError", "ValidationError", "NoSuchNamespaceError",
                "NoSuchTableError", "ArgumentError"):
        return "usage"
    return "other"


@contextlib.contextmanager
def translated(target: IcebergTarget) -> Iterator[None]:
    """Errors of the catalog, its database and its warehouse as Shale's, in one line
    naming the table (the password masked)."""
    try:
        yield
    except ShaleError:
        raise
    except Exception as e:
        raise _as_shale(e, target) from e


def _as_shale(e: Exception, target: IcebergTarget) -> ShaleError:
    text = " ".join(str(e).split())
    # (SQLAlchemy appends the statement, its parameters and a link: not what went wrong)
    text = re.split(r" \[SQL: | \(Background on this error", text, maxsplit=1)[0]
    detail = mask_secrets(text[:300] or type(e).__name__)
    kind = _kind(e)
    classes: dict[str, Any] = {"access": StoragePermissionError, "transient": TransientStorageError,
                               "conflict": ConflictError, "usage": InvalidInputError}
    if kind == "other" and isinstance(e, OSError):
        return StorageError(f"{target.shown}: {detail}")
    if kind == "other":
        return StorageError(f"{target.shown}: {type(e).__name__}: {detail}")
    verb = {"access": "refused", "transient": "could not be reached", "conflict": "changed meanwhile",
            "usage": "refused the request"}[kind]
    error: ShaleError = classes[kind](f"{target.shown} {verb}: {detail}")
    return error
