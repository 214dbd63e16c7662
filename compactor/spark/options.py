"""How the Spark engine runs: master or Spark Connect server, Spark settings, split sizes."""

from __future__ import annotations

import os
from typing import Final

from shale.ledger.errors import InvalidInputError, ShaleError
from shale.ledger.masking import mask_secrets
from shale.ledger.values import dataclass

__all__ = ["DEFAULT_MASTER", "DEFAULT_SPLIT_BYTES", "SparkJobError", "SparkOptions", "SparkUnavailableError",
           "require_pyspark"]

DEFAULT_MASTER: Final = "local[*]"
#: Entry bytes one task reads in pass two (and whose footer rows it reads in pass one).
DEFAULT_SPLIT_BYTES: Final = 128 * 1024 * 1024
#: Records one task handles at most, so a task's arrays stay small (~33 B per record).
DEFAULT_SPLIT_RECORDS: Final = 4_000_000
#: Keys one reduce task sorts, for the default number of reduce partitions.
REDUCE_RECORDS_PER_PARTITION: Final = 4_000_000


class SparkUnavailableError(InvalidInputError):
    """``--engine spark`` was asked for but PySpark is not installed, or Spark cannot start."""


class SparkJobError(ShaleError):
    """A Spark job failed for a reason other than a Shale error in a task (an executor
    lost, out of memory, a bad master URL ...)."""


def require_pyspark() -> None:
    """Raise a one-line error saying how to install PySpark when it is missing."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise SparkUnavailableError("the Spark engine needs PySpark: pip install 'shale[spark]' "
                                    "(or pip install pyspark)") from None


@dataclass(frozen=True, slots=True)
class SparkOptions:
    """Settings of the Spark engine.

    * ``master`` — any master Spark accepts: ``local[*]``, ``spark://host:7077``,
      ``k8s://https://...``, ``yarn``.  ``None``: the master ``spark-submit`` was given
      when running under it, else ``local[*]``.
    * ``remote`` — run as a client of a Spark Connect server instead: ``sc://host:15002``
      (with ``/;token=...`` and the other parameters Spark Connect takes), or ``local[N]``
      for a server started in this process.  ``None``: Spark's own ``SPARK_REMOTE``
      variable when set (and neither ``master`` nor spark-submit says otherwise).
    * ``conf`` — extra Spark settings, ``(key, value)`` pairs, applied when the engine
      starts its own session (through Spark Connect, only the settings a session may
      change: ``spark.sql.*`` and the like).
    * ``split_bytes`` / ``split_records`` — the most one task handles; a big ledger is
      split at entry boundaries.
    * ``reduce_partitions`` — partitions of pass one's shuffle (default: enough for
      about four million keys each, and at least Spark's default parallelism).
    * ``forward_credentials`` — send the driver's AWS credentials to the executors with
      the tasks, in the storage options of the topic's store (never logged); turn off when
      executors have their own identity (IRSA, instance profiles).  Endpoint, region and
      the other storage options are always sent.
    * ``ship_code`` — add Shale's own packages to the session as a zip artifact
      (``addArtifacts``; default: yes unless the master, or the Connect server, is
      ``local``), so executors need only its dependencies installed.
    * ``key_filter`` — when the new records are few beside the previous compacted
      parts (an incremental run), first build a Bloom filter of the new keys, so that
      the tasks reading the parts settle the records whose key is surely not new
      themselves and shuffle only the rest.  Off: every record is shuffled.
    """

    master: str | None = None
    remote: str | None = None
    conf: tuple[tuple[str, str], ...] = ()
    split_bytes: int = DEFAULT_SPLIT_BYTES
    split_records: int = DEFAULT_SPLIT_RECORDS
    reduce_partitions: int | None = None
    forward_credentials: bool = True
    ship_code: bool | None = None
    app_name: str = "shale-compact"
    key_filter: bool = True

    def __post_init__(self) -> None:
        if self.master is not None and not self.master.strip():
            raise InvalidInputError("the Spark master must not be empty")
        if self.remote is not None:
            _check_remote(self.remote)
            if self.master is not None:
                raise InvalidInputError("give a Spark master or a Spark Connect server (--spark-remote), not both")
        if self.split_bytes < 1 << 16:
            raise InvalidInputError("the Spark split size must be at least 64 KiB")
        if self.split_records < 1:
            raise InvalidInputError("the Spark split record count must be at least 1")
        if self.reduce_partitions is not None and self.reduce_partitions < 1:
            raise InvalidInputError("the number of Spark reduce partitions must be at least 1")
        for k, _ in self.conf:
            if not k.startswith("spark."):
                raise InvalidInputError(f"Spark setting {k!r} must start with 'spark.'")

    @property
    def under_spark_submit(self) -> bool:
        """Whether this process was started by ``spark-submit`` (which sets the master)."""
        return "PYSPARK_GATEWAY_PORT" in os.environ

    @property
    def effective_remote(self) -> str | None:
        """The Spark Connect server to connect to, if any: ``remote``, else ``SPARK_REMOTE``
        unless a master is given or spark-submit started this process."""
        if self.remote is not None:
            return self.remote
        given = os.environ.get("SPARK_REMOTE", "").strip()
        if not given or self.master is not None or self.under_spark_submit:
            return None
        try:
            _check_remote(given)
        except InvalidInputError as e:
            raise InvalidInputError(f"SPARK_REMOTE: {e}") from None
        return given

    @property
    def effective_master(self) -> str | None:
        """The master to ask for (none through Spark Connect); ``None`` leaves it to
        ``spark-submit``."""
        if self.master is not None:
            return self.master
        return None if self.under_spark_submit or self.effective_remote else DEFAULT_MASTER

    @property
    def is_local(self) -> bool:
        """Whether Spark runs in this process's machine: a ``local`` master, or a Spark
        Connect server started here."""
        where = self.effective_remote or self.effective_master
        return where is not None and where.startswith("local")


def _check_remote(remote: str) -> None:
    """Refuse what is neither a Spark Connect URL nor a local master for an in-process server."""
    if not (remote.startswith("sc://") and len(remote) > len("sc://")) and not remote.startswith("local"):
        raise InvalidInputError(f"the Spark Connect server {mask_secrets(remote)!r} is neither sc://HOST[:PORT] "
                                "nor local[N]")
