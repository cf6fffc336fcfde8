"""A local SparkSession for the examples (replog's data source registered)."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_spark(
    app: str,
    jars: str | None = None,
    packages: str | None = None,
    configs: dict[str, str] | None = None,
) -> Any:
    """``jars``: comma-separated local jar paths (``spark.jars``); ``packages``: Maven
    coordinates for Spark's resolver (``spark.jars.packages``); ``configs``: more settings."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from datasource.source import ReplogDataSource

    builder = SparkSession.builder
    if jars:
        builder = builder.config("spark.jars", jars)
    if packages:
        builder = builder.config("spark.jars.packages", packages)
    for key, value in (configs or {}).items():
        builder = builder.config(key, value)
    spark = (
        builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ReplogDataSource)  # format("replog") also works without it
    return spark
