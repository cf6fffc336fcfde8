"""The one local SparkSession of a test run (``spark`` fixture), and how to start one.

A local SparkSession takes about ten seconds to start, so every test that uses Spark shares
this one (session scope); it stops when the run ends. Spark's Python workers are separate
processes: they must run this interpreter (``PYSPARK_PYTHON``) and find this checkout first on
their path (``PYTHONPATH``), both set before the JVM starts, so that they import the same
``datasource`` package and ``pyspark_replog`` module as the tests.

The run's session also carries Spark's own Kafka connector (``format("kafka")``, the jars
``tests/maven.py`` fetches) so that tests can run a job written for Kafka against replog's Kafka
listener; where ``mvn`` cannot fetch them the session starts without them (:data:`KAFKA_CONNECTOR`
says why): the other Spark tests run, and those fail naming why.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = str(Path(__file__).resolve().parent.parent)

#: why the run's session has no ``format("kafka")``, or None when it has (set by ``spark``)
KAFKA_CONNECTOR: dict[str, str | None] = {"missing": None}


def kafka_connector_jars() -> list[str]:
    """Spark's Kafka connector's jars (less what pyspark ships), fetched with mvn."""
    from tests import maven

    return [str(p) for p in maven.spark_jars("spark-kafka")]


def prepare_worker_environment() -> None:
    """Make Spark's Python workers run this interpreter with this checkout on their path."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *paths])


def start_local_session(
    app_name: str, cores: int = 2, task_attempts: int = 1, jars: list[str] | None = None
) -> Any:
    """A local SparkSession: ``local[cores,task_attempts]`` (Spark's local mode tries a failed
    task once unless told more), UI and progress bars off, few shuffle partitions, quiet logs,
    and ``jars`` (local paths) as ``spark.jars``."""
    prepare_worker_environment()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    spark = (
        builder.master(f"local[{cores},{task_attempts}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The run's SparkSession (local[2], a failed task tried twice as on a cluster, where
    spark.task.maxFailures is 4) with Spark's Kafka connector; stopped when the run ends."""
    from tests.maven import MavenUnavailableError

    jars: list[str] = []
    try:
        jars = kafka_connector_jars()
    except MavenUnavailableError as e:
        KAFKA_CONNECTOR["missing"] = str(e)
    session = start_local_session("replog-tests", task_attempts=2, jars=jars)
    try:
        yield session
    finally:
        session.stop()
