"""Kafka clients and Spark's ``format("replog")`` on one cluster, both ways round.

Kafka client -> replog -> Spark: what confluent-kafka (librdkafka) and kafka-python produce
through the brokers' Kafka listeners, Spark reads (batch and streaming) on replog's own
listeners with the same key, value, headers (shaped as Spark's Kafka source shapes them:
array<struct<key string, value binary>>, null when a record has none), timestamp, partition and
offset as the producers wrote and their delivery reports said.

Spark -> replog -> Kafka client: what the sink writes (batch and streaming, transactionally), a
confluent-kafka consumer with read_committed reads back through the Kafka listener, each row
exactly once and nothing else; read_uncommitted sees only those rows too.

One cluster of three brokers with Kafka listeners for the module; the run's one SparkSession.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import confluent_kafka
import kafka
import pytest

from tests.cluster import Cluster
from tests.helpers import unique_name
from tests.test_kafka_clients import create_topic

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

PARTITIONS = 3
#: CreateTime timestamps an hour in the past (so that they cannot be the broker's clock), but
#: recent enough that no retention setting could remove them
BASE_TIMESTAMP = int(time.time() * 1000) - 3_600_000

Headers = tuple[tuple[str, bytes | None], ...]
#: (partition, key, value, headers, timestamp ms): a record as every side sees it
Rec = tuple[int, bytes | None, bytes | None, Headers, int]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("spark-kafka"), brokers=3, kafka=True).start()
    yield c
    c.stop()


# --- records --------------------------------------------------------------------------------------


def key_of(i: int) -> bytes | None:
    """Keys of every kind: none, ASCII, and bytes that are not UTF-8."""
    if i % 41 == 7:
        return None
    return f"key-{i}".encode() if i % 2 else b"\x00\xffkey-%d\xfe" % i


def value_of(i: int) -> bytes | None:
    """A tombstone now and then; otherwise up to a few hundred bytes, some not UTF-8."""
    if i % 97 == 13:
        return None
    return (f"value-{i}-" * (i % 23)).encode() + bytes([i % 256, 0, 255])


def headers_of(i: int, null_values: bool = True) -> Headers:
    """No headers, or several: a repeated key, a non-ASCII key, binary and null values
    (kafka-python takes no null header value: ``null_values=False`` makes them empty)."""
    if i % 5 == 0:
        return ()
    null: bytes | None = None if null_values else b""
    out: list[tuple[str, bytes | None]] = [("i", str(i).encode()), ("nul", null)]
    if i % 3 == 0:
        out += [("i", b"again"), ("schlüssel", bytes(range(i % 7)))]
    return tuple(out)


def records(n: int, null_header_values: bool = True) -> list[Rec]:
    """n records with explicit partitions (i % PARTITIONS) and CreateTimes in the past."""
    return [
        (
            i % PARTITIONS,
            key_of(i),
            value_of(i),
            headers_of(i, null_header_values),
            BASE_TIMESTAMP + i * 3,
        )
        for i in range(n)
    ]


def spark_headers(headers: Any) -> Headers:
    """Spark's headers column (null, or Rows of key and a bytearray value) as a tuple."""
    return tuple(
        (h["key"], None if h["value"] is None else bytes(h["value"])) for h in headers or ()
    )


def spark_bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def kafka_headers(message: Any) -> Headers:
    return tuple(message.headers() or ())


# --- Kafka clients -------------------------------------------------------------------------------


class Read(NamedTuple):
    """What :func:`confluent_read` read, and each partition's high watermark afterwards."""

    messages: list[Any]
    high_watermarks: dict[int, int]


def confluent_read(
    cluster: Cluster, topic: str, at_least: int, isolation: str = "read_committed"
) -> Read:
    """Every record of ``topic`` from its beginning, with a confluent-kafka consumer on the
    Kafka listeners: polls until it has ``at_least`` records and stands at the end of every
    partition (the LSO under read_committed, else the high watermark), then a moment longer,
    so that a record beyond the expected ones shows."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": unique_name("g"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(PARTITIONS)
            ]
        )
        out: list[Any] = []
        at_end: set[int] = set()

        def poll(seconds: float) -> None:
            message: Any = consumer.poll(seconds)
            if message is None:
                return
            error = message.error()
            if error is not None:
                assert error.code() == confluent_kafka.KafkaError._PARTITION_EOF, error
                at_end.add(message.partition())
                return
            at_end.discard(message.partition())
            out.append(message)

        deadline = time.monotonic() + 90
        while len(out) < at_least or len(at_end) < PARTITIONS:
            assert time.monotonic() < deadline, (
                f"{isolation}: read {len(out)} of {at_least} records of {topic}; at the end of"
                f" partitions {sorted(at_end)}"
            )
            poll(0.5)
        settle = time.monotonic() + 1.5
        while time.monotonic() < settle:
            poll(0.1)
        highs = {
            p: consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(topic, p), timeout=30, cached=False
            )[1]
            for p in range(PARTITIONS)
        }
        return Read(out, highs)
    finally:
        consumer.close()


def as_record(message: Any) -> Rec:
    kind, ms = message.timestamp()
    assert kind == confluent_kafka.TIMESTAMP_CREATE_TIME, (kind, ms)
    return (message.partition(), message.key(), message.value(), kafka_headers(message), ms)


def confluent_produce(cluster: Cluster, topic: str, recs: list[Rec]) -> dict[tuple[int, int], int]:
    """Produce with acks=all, idempotence and zstd, each record to its partition (every 4th to
    the one librdkafka's partitioner picks). Returns (partition, offset) -> record index from
    the delivery reports, which must also report each record's timestamp as its CreateTime."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "zstd",
            "linger.ms": 5,
        }
    )
    delivered: dict[tuple[int, int], int] = {}
    timestamps: dict[int, Any] = {}
    failed: list[Any] = []

    def report(i: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, message: Any) -> None:
            if err is not None:
                failed.append((i, err))
                return
            delivered[(message.partition(), message.offset())] = i
            timestamps[i] = message.timestamp()

        return on_delivery

    for i, (partition, key, value, headers, ts) in enumerate(recs):
        extra: dict[str, Any] = {} if i % 4 == 0 else {"partition": partition}
        producer.produce(
            topic,
            value=value,
            key=key,
            headers=list(headers),
            timestamp=ts,
            on_delivery=report(i),
            **extra,
        )
        producer.poll(0)
    assert producer.flush(60) == 0
    assert failed == []
    assert len(delivered) == len(recs)
    assert timestamps == {
        i: (confluent_kafka.TIMESTAMP_CREATE_TIME, ts) for i, (*_, ts) in enumerate(recs)
    }
    return delivered


# --- Kafka client -> replog -> Spark ----------------------------------------------------------


def assert_rows_match(
    rows: list[Any], topic: str, recs: list[Rec], delivered: dict[tuple[int, int], int]
) -> None:
    """Spark's rows are the produced records, each where its delivery report put it."""
    assert len(rows) == len(recs)
    by_position = {(r["partition"], r["offset"]): r for r in rows}
    assert set(by_position) == set(delivered)  # no record lost, duplicated or moved
    for partition in range(PARTITIONS):  # offsets dense from 0: the topic holds nothing else
        offsets = sorted(o for p, o in by_position if p == partition)
        assert offsets == list(range(len(offsets)))
    mismatches = []
    for position, i in sorted(delivered.items()):
        row = by_position[position]
        _, key, value, headers, ts = recs[i]
        got = (
            row["topic"],
            spark_bytes(row["key"]),
            spark_bytes(row["value"]),
            spark_headers(row["headers"]),
            row["ms"],
            row["us"],
            row["timestampType"],
        )
        want = (topic, key, value, headers, ts, ts * 1000, 0)
        if got != want:
            mismatches.append((position, i, got, want))
    assert mismatches == [], f"{len(mismatches)} rows differ, first: {mismatches[:3]}"
    # records with no headers come out as null, as from Spark's Kafka source
    assert all(row["headers"] is None for row in rows if not spark_headers(row["headers"]))


#: the source's columns, with the timestamp also as epoch milli- and microseconds (exact, and
#: free of the session's and the Python worker's time zones)
COLUMNS = ("*", "unix_millis(timestamp) AS ms", "unix_micros(timestamp) AS us")


def test_spark_batch_read_sees_what_confluent_kafka_produced(spark: Any, cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=PARTITIONS)
    recs = records(1500)
    delivered = confluent_produce(cluster, topic, recs)
    df = (
        spark.read.format("replog")
        .option("bootstrap.servers", cluster.bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
    )
    assert [f.name for f in df.schema.fields] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert df.schema["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    assert_rows_match(df.selectExpr(*COLUMNS).collect(), topic, recs, delivered)


def test_spark_streaming_read_sees_what_kafka_python_produced(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    topic = create_topic(cluster, partitions=PARTITIONS)
    recs = records(1200, null_header_values=False)
    producer = kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap, acks="all", compression_type="lz4", linger_ms=5
    )
    futures = [
        producer.send(
            topic,
            value=value,
            key=key,
            headers=list(headers),
            timestamp_ms=ts,
            partition=partition,
        )
        for partition, key, value, headers, ts in recs
    ]
    producer.flush(60)
    metadata = [f.get(timeout=30) for f in futures]
    producer.close()
    delivered = {(m.partition, m.offset): i for i, m in enumerate(metadata)}
    assert len(delivered) == len(recs)
    assert [m.timestamp for m in metadata] == [ts for *_, ts in recs]

    name = unique_name("kafka_python").replace("-", "_")
    query = (
        spark.readStream.format("replog")
        .option("kafka.bootstrap.servers", cluster.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("maxOffsetsPerTrigger", "400")
        .load()
        .selectExpr(*COLUMNS)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(240), "the availableNow query did not finish"
        assert query.exception() is None
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
        assert sum(sizes) == len(recs)
        assert len(sizes) >= 3  # several micro-batches, none over maxOffsetsPerTrigger
        assert max(sizes) <= 400
        assert_rows_match(spark.table(name).collect(), topic, recs, delivered)
    finally:
        query.stop()
        spark.catalog.dropTempView(name)


# --- Spark -> replog -> Kafka client --------------------------------------------------------------


def sink_frame(spark: Any, recs: list[Rec]) -> Any:
    """A DataFrame of ``recs`` with the sink's columns: key, value, headers, partition,
    timestamp."""
    rows = [
        (key, value, [(k, v) for k, v in headers] if headers else None, partition, ts)
        for partition, key, value, headers, ts in recs
    ]
    schema = (
        "key binary, value binary, headers array<struct<key: string, value: binary>>,"
        " partition int, ms bigint"
    )
    return spark.createDataFrame(rows, schema).selectExpr(
        "key", "value", "headers", "partition", "timestamp_millis(ms) AS timestamp"
    )


def assert_kafka_reads_exactly(cluster: Cluster, topic: str, recs: list[Rec]) -> None:
    """read_committed: each of ``recs`` once, nothing else; read_uncommitted: nothing but them
    (a retried task's aborted attempt may leave copies that only read_uncommitted sees)."""
    want = Counter(recs)
    read = confluent_read(cluster, topic, len(recs))
    committed = Counter(as_record(m) for m in read.messages)
    assert committed == want, (
        f"read_committed: missing {list((want - committed).items())[:3]},"
        f" extra {list((committed - want).items())[:3]}"
    )
    # the rows came in transactions: their commit markers (Kafka's control records, which a
    # consumer never delivers) take offsets of their own, after the rows of each commit
    for partition in range(PARTITIONS):
        offsets = sorted(m.offset() for m in read.messages if m.partition() == partition)
        assert offsets, f"nothing in partition {partition}"
        assert read.high_watermarks[partition] > offsets[-1] + 1, (
            f"no commit marker after the last record of partition {partition}: high watermark"
            f" {read.high_watermarks[partition]}, last record at {offsets[-1]}"
        )
    uncommitted = Counter(
        as_record(m) for m in confluent_read(cluster, topic, len(recs), "read_uncommitted").messages
    )
    assert set(uncommitted) == set(want), (
        f"read_uncommitted: missing {list(set(want) - set(uncommitted))[:3]},"
        f" extra {list(set(uncommitted) - set(want))[:3]}"
    )


def test_confluent_kafka_reads_a_spark_batch_write(spark: Any, cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=PARTITIONS)
    recs = records(1500)
    sink_frame(spark, recs).repartition(4).write.format("replog").option(
        "bootstrap.servers", cluster.bootstrap
    ).option("topic", topic).mode("append").save()
    assert_kafka_reads_exactly(cluster, topic, recs)


def test_confluent_kafka_reads_a_spark_streaming_write(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    topic = create_topic(cluster, partitions=PARTITIONS)
    recs = records(1500)
    frame = sink_frame(spark, recs)
    files = tmp_path / "rows"
    frame.repartition(3).write.parquet(str(files))
    query = (
        spark.readStream.schema(frame.schema)
        .option("maxFilesPerTrigger", "1")
        .parquet(str(files))
        .writeStream.format("replog")
        .option("bootstrap.servers", cluster.bootstrap)
        .option("topic", topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(240), "the availableNow query did not finish"
        assert query.exception() is None
    finally:
        query.stop()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
    assert sum(sizes) == len(recs)
    assert len(sizes) == 3  # one file per micro-batch: three committed batches
    assert_kafka_reads_exactly(cluster, topic, recs)


def test_kafka_to_spark_to_kafka_keeps_every_field(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """confluent-kafka produces; a streaming query copies the source's rows (key, value,
    headers, partition, timestamp) to another topic; confluent-kafka reads the copy."""
    source = create_topic(cluster, partitions=PARTITIONS)
    sink = create_topic(cluster, partitions=PARTITIONS)
    recs = records(900)
    delivered = confluent_produce(cluster, source, recs)
    query = (
        spark.readStream.format("replog")
        .option("bootstrap.servers", cluster.bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("maxOffsetsPerTrigger", "300")
        .load()
        .select("key", "value", "headers", "partition", "timestamp")
        .writeStream.format("replog")
        .option("kafka.bootstrap.servers", cluster.bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(240), "the availableNow query did not finish"
        assert query.exception() is None
    finally:
        query.stop()
    # where each record landed in the source (a record without a partition given went where
    # librdkafka's partitioner put it): the copy keeps that partition
    placed: list[Rec] = []
    for (partition, _), i in sorted(delivered.items(), key=lambda item: item[1]):
        _, key, value, headers, ts = recs[i]
        placed.append((partition, key, value, headers, ts))
    assert len(placed) == len(recs)
    assert_kafka_reads_exactly(cluster, sink, placed)
