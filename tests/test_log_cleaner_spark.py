"""Spark's source over a cleaned (compacted) topic: executors reading the replica's objects
directly and reading through the broker see the same records, at the offsets they were
written at, with the offset gaps the log cleaner left."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from logstore.log import open_replica_log
from logstore.storage import Storage
from replication.client import Producer
from tests.helpers import unique_name, wait_until
from tests.spark_source_helpers import batch_df, create_topic, options

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

KEYS = 10
ROUNDS = 30


def test_direct_and_broker_reads_of_a_cleaned_topic_agree(spark: Any, cluster_factory: Any) -> None:
    cluster = cluster_factory(brokers=1, overrides={"log.cleaner.backoff.ms": "200"})
    topic = unique_name("spark-compacted")
    compacted = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
    create_topic(cluster.bootstrap, topic, 1, rf=1, **compacted)
    written: dict[int, tuple[bytes, bytes]] = {}
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for round_ in range(ROUNDS):  # a batch and a flush per round
            keys = [b"k%d" % k for k in range(KEYS)]
            values = [b"%d@%d" % (k, round_) for k in range(KEYS)]
            table = pa.table({"key": keys, "value": values, "partition": [0] * KEYS})
            row = 0  # the futures' batches take the table's rows in order
            for future in producer.send_arrow(topic, table):
                meta = future.result(timeout=60)
                for offset in range(meta.base_offset, meta.base_offset + meta.record_count):
                    written[offset] = (keys[row], values[row])
                    row += 1

    broker = next(iter(cluster.brokers.values()))

    def cleaned() -> bool:
        replica = open_replica_log(Storage.from_url(broker.log_dir), topic, 0, read_only=True)
        return replica.clean_generation >= 1

    wait_until(cleaned, timeout=60, message="the broker cleaned its replica")
    opts = options(cluster.bootstrap, topic)
    rows = {}
    for mode in ("direct", "broker"):
        df = batch_df(spark, {**opts, "read.mode": mode})
        rows[mode] = sorted((r["offset"], r["key"], r["value"]) for r in df.collect())
    assert rows["direct"] == rows["broker"]
    got = rows["direct"]
    assert len(got) < len(written)  # superseded records are gone: offsets have gaps
    for offset, key, value in got:
        assert written[offset] == (key, value)
    latest = {key: value for _, (key, value) in sorted(written.items())}
    assert {key: value for _, key, value in got} == latest
