"""What the Spark source tests share: topics, producing, the source's options and frames, and
the check that a read is each partition's offsets once, in order."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import functions as F

from datasource.partitions import (
    OffsetRangePartition,
)
from replication.client import Admin, Producer
from replication.errors import UnknownTopicOrPartitionError
from tests.helpers import wait_until

T0 = 1_700_000_000_000  # record timestamps of the batch test: T0 + row number


def create_topic(bootstrap: str, name: str, partitions: int, rf: int = 1, **configs: str) -> None:
    """Create a topic and wait until every broker asked knows its leaders."""
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topic(name, partitions, rf, configs)

        def led() -> bool:
            try:
                described = admin.describe_topic(name)
            except UnknownTopicOrPartitionError:
                return False  # a broker that has not seen the new metadata yet
            return all(p.leader >= 0 for p in described.partitions)

        wait_until(led, message=f"leaders of {name}")


def produce(
    bootstrap: str,
    topic: str,
    partitions: list[int],
    values: list[bytes],
    timestamps: list[int] | None = None,
) -> None:
    """Rows i goes to ``partitions[i]``; acks=all, waits for every batch."""
    columns: dict[str, Any] = {
        "value": pa.array(values, pa.binary()),
        "partition": pa.array(partitions, pa.int32()),
    }
    if timestamps is not None:
        columns["timestamp"] = pa.array(timestamps, pa.int64())
    with Producer(bootstrap_servers=bootstrap, linger_ms=20) as producer:
        for future in producer.send_arrow(topic, pa.table(columns)):
            future.result(timeout=120)


def offset_ranges(planned: list[Any]) -> list[OffsetRangePartition]:
    """The planned input partitions (pyspark's InputPartition), each an OffsetRangePartition."""
    for q in planned:
        assert isinstance(q, OffsetRangePartition), q
    return planned


def options(bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, "subscribe": topic, **extra}


def batch_df(spark: Any, opts: dict[str, str]) -> Any:
    return spark.read.format("replog").options(**opts).load()


def stream_df(spark: Any, opts: dict[str, str]) -> Any:
    return spark.readStream.format("replog").options(**opts).load()


def assert_contiguous(df: Any, ends: dict[int, int], starts: dict[int, int] | None = None) -> None:
    """Per partition p: offsets are exactly [starts[p], ends[p]), once each.

    Checked by count, bounds, and the sums of offsets and of their squares (a duplicate
    cannot make up for a gap in both sums at once), which is far cheaper in Spark than
    counting distinct offsets.
    """
    offset = F.col("offset")
    got = {
        r["partition"]: (r["n"], r["lo"], r["hi"], r["s1"], r["s2"])
        for r in df.groupBy("partition")
        .agg(
            F.count("*").alias("n"),
            F.min(offset).alias("lo"),
            F.max(offset).alias("hi"),
            F.sum(offset).alias("s1"),
            F.sum(offset.cast("decimal(38,0)") * offset.cast("decimal(38,0)")).alias("s2"),
        )
        .collect()
    }
    starts = starts or dict.fromkeys(ends, 0)
    want = {
        p: (
            end - starts[p],
            starts[p],
            end - 1,
            sum(range(starts[p], end)),
            sum(i * i for i in range(starts[p], end)),
        )
        for p, end in ends.items()
        if end > starts[p]
    }
    assert got == want
