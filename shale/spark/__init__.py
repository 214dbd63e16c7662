"""Shale topics in Spark: a PySpark Python data source named ``shale``.

>>> import shale.spark                                      # doctest: +SKIP
>>> shale.spark.register(spark)                             # doctest: +SKIP
>>> spark.read.format("shale").option("compacted", "true").load("s3://bucket/topics/users")  # doctest: +SKIP

Reading gives a DataFrame of the topic (or its compacted view), one Spark partition per
compacted part or slice of an original ledger, read on the executors as Arrow batches.
Writing appends a DataFrame's rows: each task writes its own ledgers and the job's driver
registers all of them at once, or none.  ``readStream`` is a Structured Streaming source
whose offsets are message ids.  ``docs/spark.md`` has the options.  Needs PySpark 4
(``pip install 'shale[spark]'``) and pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shale.storage import StorageOptions

__all__ = ["SOURCE_NAME", "register"]

#: The name the data source is registered under: ``spark.read.format("shale")``.
SOURCE_NAME = "shale"


def register(spark: Any, *, forward_credentials: bool = True, storage_options: StorageOptions | None = None) -> None:
    """Register the ``shale`` data source with a Spark session.

    ``storage_options`` (default: this process's environment, read now) travel with the
    registered source to the processes that plan and run its reads and writes, which
    Spark may have started with another environment; unless ``forward_credentials`` is
    false, the credentials among them travel too.  Nothing is written to those processes'
    environments, and the options' secrets are never printed."""
    from shale.compactor.spark import require_pyspark

    require_pyspark()
    from shale.spark.source import ShaleDataSource
    from shale.storage import StorageOptions

    options = StorageOptions.from_environment() if storage_options is None else storage_options
    # A class made here is pickled by value with the registration, its settings with it.
    source = type("ShaleDataSource", (ShaleDataSource,),
                  {"storage": options if forward_credentials else options.without_credentials(),
                   "__doc__": ShaleDataSource.__doc__})
    spark.dataSource.register(source)
