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

from typing import Any

__all__ = ["SOURCE_NAME", "register"]

#: The name the data source is registered under: ``spark.read.format("shale")``.
SOURCE_NAME = "shale"


def register(spark: Any, *, forward_credentials: bool = True) -> None:
    """Register the ``shale`` data source with a Spark session.

    The storage settings of this process's environment (endpoint, region and, unless
    ``forward_credentials`` is false, static credentials: the variables the Spark engine
    forwards) travel with the registered source to the processes that plan and run its
    reads and writes, which Spark may have started with another environment.  Their
    values are never printed."""
    from shale.compactor.spark import require_pyspark

    require_pyspark()
    from shale.compactor.spark.environment import ForwardedEnvironment
    from shale.spark.source import ShaleDataSource

    # A class made here is pickled by value with the registration, its settings with it.
    source = type("ShaleDataSource", (ShaleDataSource,),
                  {"forwarded": ForwardedEnvironment.capture(credentials=forward_credentials),
                   "__doc__": ShaleDataSource.__doc__})
    spark.dataSource.register(source)
