"""Spark's own Kafka connector (``format("kafka")``, spark-sql-kafka-0-10) on replog's Kafka
listener: a job written for Kafka runs unchanged.

Batch and streaming reads (keys, values, headers with includeHeaders, CreateTimes, offsets;
startingOffsets earliest, latest and JSON, endingOffsets JSON), the Kafka sink (batch and
streaming) read back by confluent-kafka, and a query that moves from ``format("kafka")`` to
``format("replog")`` on the same checkpoint location without losing or repeating a row.

One cluster of three brokers with Kafka listeners for the module; the run's one SparkSession
(which carries the connector's jars, see tests/spark_session.py).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster
from tests.helpers import unique_name
from tests.spark_session import KAFKA_CONNECTOR
from tests.test_kafka_clients import create_topic
from tests.test_spark_kafka_interop import (
    COLUMNS,
    PARTITIONS,
    Rec,
    as_record,
    assert_rows_match,
    confluent_produce,
    confluent_read,
    records,
    sink_frame,
)

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("spark-kafka-connector"), brokers=3, kafka=True).start()
    yield c
    c.stop()


@pytest.fixture
def kafka_spark(spark: Any) -> Any:
    """The run's SparkSession, which must have Spark's Kafka connector (README's test command
    installs mvn, which fetches its jars: a failure fails these tests, naming why)."""
    if KAFKA_CONNECTOR["missing"]:
        pytest.fail(
            f"Spark's Kafka connector's jars cannot be fetched: {KAFKA_CONNECTOR['missing']}"
        )
    return spark


def run_available_now(query: Any) -> Any:
    try:
        assert query.awaitTermination(240), "the availableNow query did not finish"
        assert query.exception() is None
    finally:
        query.stop()
    return query


def kafka_stream(spark: Any, cluster: Cluster, topic: str, starting: str, **options: str) -> Any:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", cluster.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", starting)
        .option("includeHeaders", "true")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_with_headers_and_offset_ranges(kafka_spark: Any, cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=PARTITIONS)
    recs = records(900)
    delivered = confluent_produce(cluster, topic, recs)

    def read(**options: str) -> Any:
        reader = (
            kafka_spark.read.format("kafka")
            .option("kafka.bootstrap.servers", cluster.kafka_bootstrap)
            .option("subscribe", topic)
            .option("includeHeaders", "true")
        )
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    df = read()
    assert df.schema["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    assert_rows_match(df.selectExpr(*COLUMNS).collect(), topic, recs, delivered)

    # a JSON range: -2 is earliest, -1 latest, as in Kafka
    ranged = read(
        startingOffsets=json.dumps({topic: {"0": 10, "1": -2, "2": 250}}),
        endingOffsets=json.dumps({topic: {"0": 40, "1": 5, "2": -1}}),
    )
    got = sorted(
        (r["partition"], r["offset"]) for r in ranged.select("partition", "offset").collect()
    )
    ends = {p: sum(1 for q, _ in delivered if q == p) for p in range(PARTITIONS)}
    want = sorted(
        [(0, o) for o in range(10, 40)]
        + [(1, o) for o in range(5)]
        + [(2, o) for o in range(250, ends[2])]
    )
    assert got == want


def test_streaming_read_earliest_then_latest(
    kafka_spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    topic = create_topic(cluster, partitions=PARTITIONS)
    recs = records(900)
    delivered = confluent_produce(cluster, topic, recs)
    name = unique_name("kafka_connector").replace("-", "_")
    query = run_available_now(
        kafka_stream(kafka_spark, cluster, topic, "earliest", maxOffsetsPerTrigger="300")
        .selectExpr(*COLUMNS)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "earliest"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert sum(p["numInputRows"] for p in query.recentProgress) == len(recs)
        assert_rows_match(kafka_spark.table(name).collect(), topic, recs, delivered)
    finally:
        kafka_spark.catalog.dropTempView(name)

    # latest: the first run starts at the end and reads nothing; on its checkpoint, a second
    # run reads exactly what was produced in between
    output = tmp_path / "latest-out"

    def latest_run() -> None:
        run_available_now(
            kafka_stream(kafka_spark, cluster, topic, "latest")
            .select("partition", "offset")
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(tmp_path / "latest"))
            .trigger(availableNow=True)
            .start()
        )

    latest_run()
    assert kafka_spark.read.parquet(str(output)).count() == 0
    more = confluent_produce(cluster, topic, records(300))
    latest_run()
    rows = kafka_spark.read.parquet(str(output)).collect()
    got = sorted((r["partition"], r["offset"]) for r in rows)
    assert got == sorted(more)


def assert_reads_back(cluster: Cluster, topic: str, recs: list[Rec]) -> None:
    """confluent-kafka reads each of ``recs`` once (the Kafka sink writes no timestamp: the
    broker's clock stamps them) and nothing else."""
    want = Counter(r[:4] for r in recs)
    got = Counter(as_record(m)[:4] for m in confluent_read(cluster, topic, len(recs)).messages)
    assert got == want, (
        f"missing {list((want - got).items())[:3]}, extra {list((got - want).items())[:3]}"
    )


def kafka_sink_frame(spark: Any, recs: list[Rec]) -> Any:
    """The Kafka sink's columns: key, value, headers, partition (no timestamp)."""
    return sink_frame(spark, recs).drop("timestamp")


def test_kafka_sink_batch_write(kafka_spark: Any, cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=PARTITIONS)
    recs = records(900)
    kafka_sink_frame(kafka_spark, recs).repartition(3).write.format("kafka").option(
        "kafka.bootstrap.servers", cluster.kafka_bootstrap
    ).option("topic", topic).save()
    assert_reads_back(cluster, topic, recs)


def test_kafka_sink_streaming_write(kafka_spark: Any, cluster: Cluster, tmp_path: Path) -> None:
    topic = create_topic(cluster, partitions=PARTITIONS)
    recs = records(900)
    frame = kafka_sink_frame(kafka_spark, recs)
    files = tmp_path / "rows"
    frame.repartition(3).write.parquet(str(files))
    query = run_available_now(
        kafka_spark.readStream.schema(frame.schema)
        .option("maxFilesPerTrigger", "1")
        .parquet(str(files))
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", cluster.kafka_bootstrap)
        .option("topic", topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
    assert sizes == [300, 300, 300]
    assert_reads_back(cluster, topic, recs)


def test_query_moves_from_kafka_to_replog_on_its_checkpoint(
    kafka_spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """The offsets log holds {"topic": {"0": 42}} for either source, so a query that read with
    ``format("kafka")`` goes on with ``format("replog")`` from where it stopped."""
    topic = create_topic(cluster, partitions=PARTITIONS)
    first = confluent_produce(cluster, topic, records(600))
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run(source: str, bootstrap: str) -> Any:
        return run_available_now(
            kafka_spark.readStream.format(source)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .select("partition", "offset", "value")
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    run("kafka", cluster.kafka_bootstrap)
    second = confluent_produce(cluster, topic, records(600))
    query = run("replog", cluster.bootstrap)
    # the replog query read only what came after the kafka query's last offsets
    assert sum(p["numInputRows"] for p in query.recentProgress) == len(second)
    rows = kafka_spark.read.parquet(str(output)).select("partition", "offset").collect()
    positions = [(r["partition"], r["offset"]) for r in rows]
    assert len(positions) == len(set(positions))  # no row twice
    assert sorted(positions) == sorted([*first, *second])  # no row lost
