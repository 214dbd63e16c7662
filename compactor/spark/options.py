"""How the Spark engine runs: master, Spark settings, split sizes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from shale.ledger.errors import InvalidInputError

__all__ = ["DEFAULT_MASTER", "DEFAULT_SPLIT_BYTES", "SparkOptions", "SparkUnavailableError", "require_pyspark"]

DEFAULT_MASTER: Final = "local[*]"
#: Entry bytes one task reads in pass two (and whose footer rows it reads in pass one).
DEFAULT_SPLIT_BYTES: Final = 128 * 1024 * 1024
#: Records one task handles at most, so a task's arrays stay small (~33 B per record).
DEFAULT_SPLIT_RECORDS: Final = 4_000_000
#: Keys one reduce task sorts, for the default number of reduce partitions.
REDUCE_RECORDS_PER_PARTITION: Final = 4_000_000


class SparkUnavailableError(InvalidInputError):
    """``--engine spark`` was asked for but PySpark is not installed."""


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
    * ``conf`` — extra Spark settings, ``(key, value)`` pairs, applied when the engine
      starts its own session.
    * ``split_bytes`` / ``split_records`` — the most one task handles; a big ledger is
      split at entry boundaries.
    * ``reduce_partitions`` — partitions of pass one's shuffle (default: enough for
      about four million keys each, and at least Spark's default parallelism).
    * ``forward_credentials`` — send the driver's AWS credentials to the executors with
      the tasks, in the storage options of the topic's store (never logged); turn off when
      executors have their own identity (IRSA, instance profiles).  Endpoint, region and
      the other storage options are always sent.
    * ``ship_code`` — add Shale's own packages to the Spark application as a zip
      (default: yes unless the master is ``local``), so executors need only its
      dependencies installed.
    * ``key_filter`` — when the new records are few beside the previous compacted
      parts (an incremental run), first build a Bloom filter of the new keys, so that
      the tasks reading the parts settle the records whose key is surely not new
      themselves and shuffle only the rest.  Off: every record is shuffled.
    """

    master: str | None = None
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
    def effective_master(self) -> str | None:
        """The master to ask for; ``None`` leaves it to ``spark-submit``."""
        if self.master is not None:
            return self.master
        return None if self.under_spark_submit else DEFAULT_MASTER

    @property
    def is_local(self) -> bool:
        master = self.effective_master
        return master is not None and master.startswith("local")
