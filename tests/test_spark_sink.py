"""The replog sink with a real local Spark and a real cluster: exactly once, whatever replays."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from datasource.options import parse_sink_options
from datasource.sink import TOPIC_WAIT_MS, ReplogBatchWriter, write_transaction
from replication.client import (
    Admin,
    ConsumerRecord,
    NewTopic,
    Producer,
    TopicPartition,
)
from replication.errors import UnknownTopicOrPartitionError
from tests.cluster import BrokerProcess
from tests.helpers import unique_name
from tests.readback import read_to_end

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


def create(bootstrap: str, *topics: str, partitions: int = 2) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(t, partitions, 1) for t in topics])


def produce_ids(bootstrap: str, topic: str, ids: range) -> None:
    values = [json.dumps({"id": i}) for i in ids]
    with Producer(bootstrap_servers=bootstrap) as producer:
        for future in producer.send_arrow(
            topic, pa.table({"value": pa.array(values, pa.string())})
        ):
            future.result()


def committed_records(bootstrap: str, topic: str, partitions: int = 2) -> list[ConsumerRecord]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    return read_to_end(bootstrap, tps, timeout=120).records


def committed_values(bootstrap: str, topic: str, partitions: int = 2) -> list[bytes]:
    return [r.value or b"" for r in committed_records(bootstrap, topic, partitions)]


def pipeline(spark: Any, bootstrap: str, source: str, sink: str, checkpoint: Path) -> Any:
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("replog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "400")
        .load()
    )
    doubled = events.select(
        F.to_json(
            F.struct(
                (F.get_json_object(F.col("value").cast("string"), "$.id").cast("long") * 2).alias(
                    "x"
                )
            )
        ).alias("value")
    )
    return (
        doubled.writeStream.format("replog")
        .option("bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def doubled_ids(values: list[bytes]) -> Counter[int]:
    return Counter(json.loads(v)["x"] // 2 for v in values)


def test_streaming_pipeline_writes_every_row_exactly_once(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    source, sink = unique_name("in"), unique_name("out")
    create(broker.bootstrap, source, sink)
    produce_ids(broker.bootstrap, source, range(1000))
    query = pipeline(spark, broker.bootstrap, source, sink, tmp_path / "ckpt")
    query.awaitTermination(240)
    assert query.exception() is None
    counts = doubled_ids(committed_values(broker.bootstrap, sink))
    assert counts == Counter(range(1000))  # every row once: no loss, no duplicate


def test_a_replayed_micro_batch_is_not_written_twice(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    source, sink = unique_name("in"), unique_name("out")
    create(broker.bootstrap, source, sink)
    produce_ids(broker.bootstrap, source, range(1000))
    checkpoint = tmp_path / "ckpt"
    pipeline(spark, broker.bootstrap, source, sink, checkpoint).awaitTermination(240)
    # Spark forgets that it committed its last batches (the sink did commit them): it runs
    # them again on restart, exactly as after a crash between the sink's commit and Spark's
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert len(commits) >= 2
    last = commits[-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    query = pipeline(spark, broker.bootstrap, source, sink, checkpoint)
    query.awaitTermination(240)
    assert query.exception() is None
    # Spark did run the forgotten batch again, with rows: the replay reached the sink
    assert sum(p["numInputRows"] for p in query.recentProgress) > 0
    assert doubled_ids(committed_values(broker.bootstrap, sink)) == Counter(range(1000))


def test_batch_write_is_atomic_and_needs_mode_append(spark: Any, broker: BrokerProcess) -> None:
    sink = unique_name("batch")
    create(broker.bootstrap, sink)
    rows = spark.range(0, 500, 1, 4).selectExpr(
        "CAST(id AS STRING) AS key", "CAST(id * 3 AS STRING) AS value"
    )
    rows.write.format("replog").option("bootstrap.servers", broker.bootstrap).option(
        "topic", sink
    ).mode("append").save()
    values = committed_values(broker.bootstrap, sink)
    assert sorted(int(v) for v in values) == [i * 3 for i in range(500)]

    def writer() -> Any:
        return rows.write.format("replog").option("bootstrap.servers", broker.bootstrap)

    with pytest.raises(Exception, match="append-only") as overwrite:
        writer().option("topic", sink).mode("overwrite").save()
    assert "mode('append')" in str(overwrite.value)
    assert "update" not in str(overwrite.value)
    # Spark itself refuses its default mode (errorifexists) for any Python data source, before
    # replog is asked; its message names Append, which is what replog takes
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE") as default:
        writer().option("topic", sink).save()
    assert "Append" in str(default.value)
    assert sorted(int(v) for v in committed_values(broker.bootstrap, sink)) == [
        i * 3 for i in range(500)
    ]


@pytest.mark.parametrize(
    ("select", "message"),
    [
        (["CAST(id AS STRING) AS key"], "no 'value' column"),
        (["id AS value"], "column 'value' has type bigint"),
        (["CAST(id AS STRING) AS value", "CAST(id AS STRING) AS partition"], "column 'partition'"),
    ],
)
def test_bad_columns_are_named(
    spark: Any, broker: BrokerProcess, select: list[str], message: str
) -> None:
    df = spark.range(3).selectExpr(*select)
    with pytest.raises(Exception, match=message):
        df.write.format("replog").option("bootstrap.servers", broker.bootstrap).option(
            "topic", "whatever"
        ).mode("append").save()


def test_unknown_topic_is_a_named_error(spark: Any, broker: BrokerProcess) -> None:
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match="does-not-exist"):
        df.write.format("replog").option("bootstrap.servers", broker.bootstrap).option(
            "topic", "does-not-exist"
        ).mode("append").save()


def test_unknown_sink_option_is_refused_with_the_known_ones(
    spark: Any, broker: BrokerProcess
) -> None:
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match="option lingerms='5' is not valid: unknown option") as e:
        df.write.format("replog").option("bootstrap.servers", broker.bootstrap).option(
            "topic", "whatever"
        ).option("lingerms", "5").mode("append").save()
    assert "linger.ms" in str(e.value)


def test_topic_option_overrides_the_topic_column(spark: Any, broker: BrokerProcess) -> None:
    sink, other = unique_name("sink"), unique_name("other")
    create(broker.bootstrap, sink, other)
    rows = spark.range(0, 50, 1, 2).selectExpr(
        "CAST(id AS STRING) AS value", f"'{other}' AS topic", "CAST(NULL AS STRING) AS key"
    )
    # kafka.bootstrap.servers, as Kafka's sink is configured
    rows.write.format("replog").option("kafka.bootstrap.servers", broker.bootstrap).option(
        "topic", sink
    ).mode("append").save()
    assert sorted(int(v) for v in committed_values(broker.bootstrap, sink)) == list(range(50))
    assert committed_values(broker.bootstrap, other) == []


def test_timestamp_column_sets_the_record_timestamp(spark: Any, broker: BrokerProcess) -> None:
    sink = unique_name("ts")
    create(broker.bootstrap, sink)
    t0 = 1_700_000_000_000
    rows = spark.range(0, 20, 1, 2).selectExpr(
        "CAST(id AS STRING) AS value",
        f"timestamp_millis({t0} + id * 1000) AS timestamp",
    )
    rows.write.format("replog").option("bootstrap.servers", broker.bootstrap).option(
        "topic", sink
    ).mode("append").save()
    records = committed_records(broker.bootstrap, sink)
    assert {int(r.value or b""): (r.timestamp, r.timestamp_type) for r in records} == {
        i: (t0 + i * 1000, 0) for i in range(20)
    }
    # the source's timestamp column reads them back the same
    read = (
        spark.read.format("replog")
        .option("bootstrap.servers", broker.bootstrap)
        .option("subscribe", sink)
        .load()
        .selectExpr("CAST(CAST(value AS STRING) AS INT) AS i", "unix_millis(timestamp) AS ms")
        .collect()
    )
    assert {r["i"]: r["ms"] for r in read} == {i: t0 + i * 1000 for i in range(20)}
    with pytest.raises(Exception, match="column 'timestamp' has type bigint"):
        rows.selectExpr("value", "unix_millis(timestamp) AS timestamp").write.format(
            "replog"
        ).option("bootstrap.servers", broker.bootstrap).option("topic", sink).mode("append").save()


def counts_by_key(spark: Any, bootstrap: str, source: str) -> Any:
    """Records per id % 3 of the source, read 300 records per micro-batch."""
    from pyspark.sql import functions as F

    ids = (
        spark.readStream.format("replog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "300")
        .load()
        .select(F.get_json_object(F.col("value").cast("string"), "$.id").cast("long").alias("id"))
    )
    counts = ids.groupBy((F.col("id") % 3).alias("k")).agg(F.count("*").alias("n"))
    return counts.select(F.to_json(F.struct("k", "n")).alias("value"))


def test_complete_mode_writes_every_micro_batch_result_once(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    source, sink = unique_name("in"), unique_name("out")
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics([NewTopic(source, 1, 1), NewTopic(sink, 2, 1)])
    produce_ids(broker.bootstrap, source, range(900))
    query = (
        counts_by_key(spark, broker.bootstrap, source)
        .writeStream.format("replog")
        .outputMode("complete")
        .option("bootstrap.servers", broker.bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert query.exception() is None
    results = Counter(
        (doc["k"], doc["n"]) for doc in map(json.loads, committed_values(broker.bootstrap, sink))
    )
    # batch b (300 ids of the one source partition) leaves 100 * (b + 1) per key: each batch's
    # whole result table, written once
    assert results == Counter({(k, 100 * (b + 1)): 1 for k in range(3) for b in range(3)})


def test_update_mode_is_refused_by_spark(spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    source, sink = unique_name("in"), unique_name("out")
    create(broker.bootstrap, source, sink)
    query = (
        counts_by_key(spark, broker.bootstrap, source)
        .writeStream.format("replog")
        .outputMode("update")
        .option("bootstrap.servers", broker.bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        # Spark's own check: a Python data source's writer has no update mode
        with pytest.raises(Exception, match="does not support Update mode"):
            query.awaitTermination(240)
    finally:
        query.stop()


def test_a_missing_topic_fails_when_the_writer_is_made(broker: BrokerProcess) -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField("value", StringType())])
    missing = unique_name("missing")
    raw = {"bootstrap.servers": broker.bootstrap, "topic": missing}
    # on the driver, before any task runs; within TOPIC_WAIT_MS, not the producer's minute
    with pytest.raises(UnknownTopicOrPartitionError, match=missing) as caught:
        ReplogBatchWriter(schema, raw, False)
    assert f"(max.block.ms={TOPIC_WAIT_MS})" in str(caught.value)
    present = unique_name("present")
    create(broker.bootstrap, present)
    ReplogBatchWriter(schema, {**raw, "topic": present}, False)


def test_a_missing_topic_in_the_topic_column_fails_the_task_naming_it(
    broker: BrokerProcess,
) -> None:
    present, missing = unique_name("present"), unique_name("missing")
    create(broker.bootstrap, present)
    options = parse_sink_options({"bootstrap.servers": broker.bootstrap})
    batch = pa.record_batch(
        {"value": pa.array([b"a", b"b"]), "topic": pa.array([present, missing])}
    )
    with pytest.raises(UnknownTopicOrPartitionError, match=missing) as caught:
        write_transaction(options, unique_name("sink"), 0, 0, iter([batch]))
    # within TOPIC_WAIT_MS, not the producer's max.block.ms (a minute per task attempt)
    assert f"(max.block.ms={TOPIC_WAIT_MS})" in str(caught.value)
    # the task's transaction was aborted: nothing of the row for the present topic shows
    assert committed_values(broker.bootstrap, present) == []
