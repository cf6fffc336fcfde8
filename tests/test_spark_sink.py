"""The replog sink with a real local Spark and a real cluster: exactly once, whatever replays."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from replication.client import Admin, NewTopic, Producer, TopicPartition
from tests.cluster import BrokerProcess
from tests.helpers import read_to_end, unique_name

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


def committed_values(bootstrap: str, topic: str, partitions: int = 2) -> list[bytes]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    return [r.value or b"" for r in read_to_end(bootstrap, tps, timeout=120).records]


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


def test_batch_write_is_atomic_and_overwrite_is_refused(spark: Any, broker: BrokerProcess) -> None:
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
    with pytest.raises(Exception, match="append-only"):
        rows.write.format("replog").option("bootstrap.servers", broker.bootstrap).option(
            "topic", sink
        ).mode("overwrite").save()


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
