"""The Spark engine: pass one and pass two as Spark jobs, published by the driver.

Import :class:`~shale.compactor.spark.engine.SparkEngine` from
:mod:`shale.compactor.spark.engine`; that module needs PySpark (``pip install
'shale[spark]'``).  This package itself imports without it, so the command line can say
how to install it.
"""

from shale.compactor.spark.options import SparkOptions, SparkUnavailableError, require_pyspark

__all__ = ["SparkOptions", "SparkUnavailableError", "require_pyspark"]
