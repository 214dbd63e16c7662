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


def register(spark: Any) -> None:
    """Register the ``shale`` data source with a Spark session."""
    from shale.compactor.spark import require_pyspark

    require_pyspark()
    from shale.spark.source import ShaleDataSource

    spark.dataSource.register(ShaleDataSource)
