"""The Spark source "replog" streaming, with real broker processes and the run's one local
SparkSession (``spark`` fixture): availableNow and processing-time triggers across a restart,
admission control, a leader SIGKILLed mid-stream, read_committed over raw-protocol
transactions, and data loss. Options, offsets, batch and direct reads:
tests/test_spark_source.py."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from datasource.batch import ReplogBatchReader
from datasource.errors import DataLossError
from datasource.options import parse_source_options
from datasource.reader import read_partition
from datasource.schema import arrow_schema
from datasource.stream import ReplogStreamReader, offsets_behind_latest
from logstore.batch import Record, build
from logstore.reader import ObjectExtent
from logstore.storage import Storage
from replication import protocol as p
from replication.client import Admin, Producer, TopicPartition
from tests.cluster import BrokerProcess
from tests.helpers import unique_name, wait_until
from tests.spark_source_helpers import (
    T0,
    assert_contiguous,
    batch_df,
    create_topic,
    offset_ranges,
    options,
    produce,
    stream_df,
)
from tests.wire import RawConnection

# --- streaming ------------------------------------------------------------------------------


class KeepProducing:
    """A thread appending rows (values ``b"<partition>-<n>"``) to every partition until
    stopped; ``sent[p]`` counts acknowledged rows."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rows: int = 50) -> None:
        self.producer = Producer(bootstrap_servers=bootstrap, linger_ms=5)
        self.topic = topic
        self.partitions = partitions
        self.rows = rows
        self.sent = dict.fromkeys(range(partitions), 0)
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for partition in range(self.partitions):
                first = self.sent[partition]
                values = [b"%d-%d" % (partition, first + i) for i in range(self.rows)]
                table = pa.table({"value": pa.array(values, pa.binary())})
                try:
                    for future in self.producer.send_arrow(self.topic, table, partition=partition):
                        future.result(timeout=120)
                except Exception as err:
                    self.errors.append(err)
                    return
                self.sent[partition] += self.rows
            self._stop.wait(0.1)

    def __enter__(self) -> KeepProducing:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=180)
        self.producer.close()
        assert not self.errors, self.errors


def data_batches(query: Any) -> list[dict[str, Any]]:
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def assert_exactly_once(spark: Any, path: Path, sent: dict[int, int]) -> None:
    """The sink holds every row produced to each partition once, in offset order."""
    df = spark.read.parquet(str(path))
    assert_contiguous(df, sent)
    # Values were produced in order: offset n of partition p holds b"p-n".
    mismatched = df.filter(
        F.col("value") != F.encode(F.concat_ws("-", F.col("partition"), F.col("offset")), "utf-8")
    ).count()
    assert mismatched == 0


@pytest.mark.spark
@pytest.mark.cluster
def test_streaming_available_now_then_processing_time_restarts_without_duplicates_or_gaps(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 2)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"

    def start(trigger: dict[str, Any]) -> Any:
        df = stream_df(spark, options(broker.bootstrap, topic, startingOffsets="earliest"))
        return (
            df.writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    with KeepProducing(broker.bootstrap, topic, 2) as producer:
        wait_until(lambda: min(producer.sent.values()) >= 500, message="500 rows each")
        first = start({"availableNow": True})
        first.awaitTermination(120)
        assert data_batches(first)
        query = start({"processingTime": "300 milliseconds"})
        wait_until(lambda: len(data_batches(query)) >= 3, timeout=90, message="3 batches")
        query.stop()
    sent = dict(producer.sent)
    # A restart from the checkpoint reads the rest, and nothing twice.
    last = start({"availableNow": True})
    last.awaitTermination(120)
    assert_exactly_once(spark, sink, sent)


@pytest.mark.spark
@pytest.mark.cluster
def test_max_offsets_per_trigger_bounds_every_batch(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 3)
    n = 9_000
    produce(broker.bootstrap, topic, [i % 3 if i < 6000 else 0 for i in range(n)], [b"x"] * n)
    df = stream_df(
        spark,
        options(broker.bootstrap, topic, startingOffsets="earliest", maxOffsetsPerTrigger="1000"),
    )
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    sizes = [p["numInputRows"] for p in data_batches(query)]
    assert sum(sizes) == n
    assert max(sizes) <= 1000
    assert len(sizes) == 9
    # reportLatestOffset: the progress shows how far the topic goes (the backlog).
    latest = data_batches(query)[0]["sources"][0]["latestOffset"]
    assert latest == f'{{"{topic}": {{"0": 5000, "1": 2000, "2": 2000}}}}'
    # Kafka's lag metrics, from latestOffset and endOffset (a Python source cannot put them in
    # the progress's metrics: see datasource.stream)
    lags = [offsets_behind_latest(p["sources"][0]) for p in data_batches(query)]
    first, last = lags[0], lags[-1]
    assert float(first["avgOffsetsBehindLatest"]) * 3 == n - 1000
    assert int(first["minOffsetsBehindLatest"]) <= int(first["maxOffsetsBehindLatest"])
    assert int(first["maxOffsetsBehindLatest"]) > 0
    assert last == {
        "minOffsetsBehindLatest": "0",
        "maxOffsetsBehindLatest": "0",
        "avgOffsetsBehindLatest": "0.0",
    }


@pytest.mark.spark
@pytest.mark.cluster
def test_min_offsets_per_trigger_waits_up_to_max_trigger_delay(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, [0] * 100, [b"x"] * 100)
    checkpoint = str(tmp_path / "checkpoint")

    def start(max_trigger_delay: str) -> Any:
        df = stream_df(
            spark,
            options(
                broker.bootstrap,
                topic,
                startingOffsets="earliest",
                minOffsetsPerTrigger="1000",
                maxTriggerDelay=max_trigger_delay,
            ),
        )
        return (
            df.writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    query = start("6s")
    try:
        wait_until(lambda: data_batches(query), timeout=60, message="the delayed batch")
        # 100 < 1000 records: the first trigger held them back (Spark reports that trigger,
        # without data); only maxTriggerDelay released them.
        assert query.recentProgress[0]["numInputRows"] == 0
        assert [p["numInputRows"] for p in data_batches(query)] == [100]
    finally:
        query.stop()
    # Enough records: the batch runs at once; a delay that cannot pass here does not hold it.
    produce(broker.bootstrap, topic, [0] * 1500, [b"x"] * 1500)
    query = start("1h")
    try:
        wait_until(lambda: data_batches(query), timeout=60, message="a full batch")
        assert [p["numInputRows"] for p in data_batches(query)] == [1500]
    finally:
        query.stop()


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.chaos
def test_leader_sigkill_while_a_streaming_query_reads(
    spark: Any, cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(brokers=3)
    topic = unique_name("spark")
    create_topic(cluster.bootstrap, topic, 2, rf=3, **{"min.insync.replicas": "2"})
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    bootstrap = cluster.bootstrap
    df = stream_df(spark, options(bootstrap, topic, startingOffsets="earliest"))
    query = (
        df.writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        with KeepProducing(bootstrap, topic, 2, rows=20) as producer:
            wait_until(lambda: len(data_batches(query)) >= 2, timeout=120, message="2 batches")
            with Admin(bootstrap_servers=bootstrap) as admin:
                leader = admin.describe_topic(topic).partitions[0].leader
                cluster.brokers[leader].kill()
                wait_until(
                    lambda: admin.describe_topic(topic).partitions[0].leader not in (-1, leader),
                    timeout=60,
                    message="a new leader",
                )
            killed_at = sum(producer.sent.values())
            wait_until(
                lambda: sum(producer.sent.values()) >= killed_at + 400,
                timeout=60,
                message="producing after the failover",
            )
        sent = dict(producer.sent)
        survivors = cluster.bootstrap
        with Admin(bootstrap_servers=survivors) as admin:
            ends = admin.list_offsets({(topic, p): "latest" for p in range(2)})
        assert {tp.partition: end for tp, end in ends.items()} == sent

        def caught_up() -> bool:
            progress = query.lastProgress
            return bool(progress) and progress["sources"][0]["endOffset"] == (
                f'{{"{topic}": {{"0": {sent[0]}, "1": {sent[1]}}}}}'
            )

        wait_until(caught_up, timeout=120, message="the query reads everything")
    finally:
        query.stop()
    assert query.exception() is None
    assert_exactly_once(spark, sink, sent)


@pytest.mark.cluster
def test_new_topics_of_a_pattern_join_at_the_next_batch_from_their_start(
    broker: BrokerProcess,
) -> None:
    prefix = unique_name("spark")
    first, second = f"{prefix}-a", f"{prefix}-b"
    create_topic(broker.bootstrap, first, 1)
    produce(broker.bootstrap, first, [0] * 10, [b"a"] * 10)
    reader = ReplogStreamReader(
        parse_source_options(
            {"bootstrap.servers": broker.bootstrap, "subscribepattern": f"{prefix}-.*"},
            streaming=True,
        )
    )
    try:
        start = reader.initialOffset()
        assert start == {first: {"0": 10}}  # startingOffsets=latest
        create_topic(broker.bootstrap, second, 2)
        produce(broker.bootstrap, second, [0, 1] * 5, [b"b"] * 10)
        produce(broker.bootstrap, first, [0] * 3, [b"a"] * 3)
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        assert end == {first: {"0": 13}, second: {"0": 5, "1": 5}}
        assert reader.reportLatestOffset() == end
        planned = offset_ranges(reader.partitions(start, end))
        assert sorted((q.topic, q.partition, q.start, q.end) for q in planned) == [
            (first, 0, 10, 13),
            (second, 0, 0, 5),
            (second, 1, 0, 5),
        ]
        read = pa.Table.from_batches([b for q in planned for b in reader.read(q)])
        assert read.num_rows == 13
        assert read.schema.equals(arrow_schema(False))
    finally:
        reader.stop()


# --- transactions ---------------------------------------------------------------------------


class RawTransaction:
    """A transaction written with raw requests (FindCoordinator, InitProducerId,
    AddPartitionsToTxn, transactional Produce, EndTxn)."""

    def __init__(self, bootstrap: str, transactional_id: str, topic: str) -> None:
        self.conn = RawConnection(bootstrap)
        self.id = transactional_id
        self.topic = topic
        self.sequence = 0

        def ready() -> Any:
            found = self.conn.request(
                p.ApiKey.FIND_COORDINATOR, p.FindCoordinatorRequest(key=transactional_id)
            )
            if found.error_code:
                return None
            init = self.conn.request(
                p.ApiKey.INIT_PRODUCER_ID,
                p.InitProducerIdRequest(
                    transactional_id=transactional_id, transaction_timeout_ms=600_000
                ),
            )
            return None if init.error_code else init

        init = wait_until(ready, message="the transaction coordinator")
        self.pid, self.epoch = init.producer_id, init.producer_epoch
        added = self.conn.request(
            p.ApiKey.ADD_PARTITIONS_TO_TXN,
            p.AddPartitionsToTxnRequest(
                transactional_id=transactional_id,
                producer_id=self.pid,
                producer_epoch=self.epoch,
                topics=[p.AddPartitionsToTxnTopic(name=topic, partitions=[0])],
            ),
        )
        assert added.results[0].results[0].error_code == 0

    def send(self, values: list[bytes]) -> None:
        data = build(
            [Record(None, v, T0) for v in values],
            producer_id=self.pid,
            producer_epoch=self.epoch,
            base_sequence=self.sequence,
            is_transactional=True,
        )
        self.sequence += len(values)
        response = self.conn.request(
            p.ApiKey.PRODUCE,
            p.ProduceRequest(
                transactional_id=self.id,
                acks=-1,
                topic_data=[
                    p.ProduceRequestTopic(
                        name=self.topic,
                        partition_data=[p.ProduceRequestPartition(index=0, records=data)],
                    )
                ],
            ),
        )
        assert response.responses[0].partition_responses[0].error_code == 0

    def end(self, commit: bool) -> None:
        response = self.conn.request(
            p.ApiKey.END_TXN,
            p.EndTxnRequest(
                transactional_id=self.id,
                producer_id=self.pid,
                producer_epoch=self.epoch,
                committed=commit,
            ),
        )
        assert response.error_code == 0

    def close(self) -> None:
        self.conn.close()


@pytest.mark.spark
@pytest.mark.cluster
def test_read_committed_hides_aborted_and_open_transactions(
    spark: Any, broker: BrokerProcess
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 1)

    def plain(*values: bytes) -> None:
        produce(broker.bootstrap, topic, [0] * len(values), list(values))

    def txn(name: str) -> RawTransaction:
        return RawTransaction(broker.bootstrap, f"{topic}-{name}", topic)

    plain(b"p1", b"p2")
    committed, aborted, still_open = txn("committed"), txn("aborted"), txn("open")
    try:
        committed.send([b"c1", b"c2"])
        aborted.send([b"a1", b"a2", b"a3"])
        committed.send([b"c3"])
        committed.end(commit=True)
        aborted.send([b"a4"])
        aborted.end(commit=False)
        plain(b"p3")
        still_open.send([b"o1", b"o2"])
        plain(b"p4")  # after the open transaction: beyond the LSO
    finally:
        for t in (committed, aborted, still_open):
            t.close()

    def values(**extra: str) -> list[bytes]:
        df = batch_df(spark, options(broker.bootstrap, topic, **extra))
        return [r["value"] for r in df.orderBy("offset").collect()]

    visible = [b"p1", b"p2", b"c1", b"c2", b"c3", b"p3"]
    assert values() == visible  # read_committed is the default
    assert values(**{"read.mode": "direct"}) == visible
    assert values(**{"read.mode": "broker"}) == visible
    everything = [b"p1", b"p2", b"c1", b"c2", b"a1", b"a2", b"a3", b"c3", b"a4", b"p3"]
    everything += [b"o1", b"o2", b"p4"]
    for mode in ("direct", "broker"):
        assert values(**{"isolation.level": "read_uncommitted", "read.mode": mode}) == everything


# --- data loss ------------------------------------------------------------------------------

RETENTION = {"log.retention.check.interval.ms": "200"}
#: wal.compaction.window.bytes of the retention-during-a-read test over the WAL
WINDOW = 64 * 1024


def _retained_topic(bootstrap: str, expire_in_ms: int) -> str:
    """A topic whose first 100 records expire ``expire_in_ms`` from now (100 more do not)."""
    topic = unique_name("spark")
    create_topic(
        bootstrap,
        topic,
        1,
        1,
        **{"segment.bytes": "1024", "retention.ms": "600000", "file.delete.delay.ms": "0"},
    )
    now = int(time.time() * 1000)
    produce(bootstrap, topic, [0] * 100, [b"old"] * 100, [now - 600_000 + expire_in_ms] * 100)
    produce(bootstrap, topic, [0] * 100, [b"new"] * 100, [now + 3_600_000] * 100)
    return topic


def _earliest(bootstrap: str, topic: str) -> int:
    with Admin(bootstrap_servers=bootstrap) as admin:
        return admin.list_offsets({(topic, 0): "earliest"})[TopicPartition(topic, 0)]


@pytest.mark.spark
@pytest.mark.cluster
def test_offsets_removed_by_retention_fail_the_query_or_are_skipped(
    spark: Any, broker_factory: Any
) -> None:
    b = broker_factory(overrides=RETENTION)
    topic = _retained_topic(b.bootstrap, 0)
    wait_until(lambda: _earliest(b.bootstrap, topic) == 100, message="retention")
    opts = options(b.bootstrap, topic, startingOffsets=f'{{"{topic}": {{"0": 0}}}}')
    with pytest.raises(Exception, match="failOnDataLoss") as caught:
        batch_df(spark, opts).count()
    assert "offsets [0, 100)" in str(caught.value)
    assert "removed by retention" in str(caught.value)
    kept = batch_df(spark, {**opts, "failOnDataLoss": "false"})
    assert_contiguous(kept, {0: 200}, {0: 100})


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["direct", "auto"])
@pytest.mark.parametrize(
    "layout",
    [
        pytest.param({"log.wal.enable": "false"}, id="segments"),
        # Over the WAL the expired records' object goes once a compaction round has dropped
        # its dead chunk and nothing refers to it (file.delete.delay.ms=0). Compaction is held
        # off by age and made due by bytes, after retention (below): compacted earlier, the
        # expired chunk would share a packed extent with live records.
        pytest.param(
            {
                "log.wal.enable": "true",
                "wal.compaction.l0.max.age.ms": "3600000",
                "wal.compaction.window.bytes": str(WINDOW),
                "file.delete.delay.ms": "0",
            },
            id="wal",
        ),
    ],
)
def test_retention_during_a_read_fails_the_task_or_skips_with_a_warning(
    broker_factory: Any, caplog: pytest.LogCaptureFixture, mode: str, layout: dict[str, str]
) -> None:
    b = broker_factory(overrides={**RETENTION, **layout})
    topic = _retained_topic(b.bootstrap, 4_000)
    opts = parse_source_options(options(b.bootstrap, topic, **{"read.mode": mode}), streaming=False)
    (planned,) = offset_ranges(ReplogBatchReader(opts).partitions())
    assert (planned.start, planned.end) == (0, 200)
    assert planned.replicas
    expired = {
        o.path for o in planned.objects if isinstance(o, ObjectExtent) and o.base_offset < 100
    }
    assert expired, planned.objects  # the planner's extents name the objects of [0, 100)
    root = Storage.from_url(planned.replicas[0].log_dir)
    # Retention moves the log start, then the objects of the expired records are deleted
    # (segment objects: file.delete.delay.ms=0; over the WAL, see the layout above).
    wait_until(lambda: _earliest(b.bootstrap, topic) == 100, timeout=60, message="retention")
    # a record past the read's range, big enough to make the WAL's compaction due
    produce(b.bootstrap, topic, [0], [b"x" * 2 * WINDOW], [int(time.time() * 1000) + 3_600_000])
    wait_until(
        lambda: not any(root.exists(path) for path in expired),
        timeout=60,
        message=f"the objects of the expired records deleted: {sorted(expired)}",
    )
    with pytest.raises(DataLossError, match=r"offsets \[0, 100\) of .* are gone"):
        list(read_partition(planned))
    lenient = replace(planned, settings=replace(planned.settings, fail_on_data_loss=False))
    with caplog.at_level(logging.WARNING, logger="datasource.reader"):
        batches = list(read_partition(lenient))
    assert pa.Table.from_batches(batches).column("offset").to_pylist() == list(range(100, 200))
    assert "offsets [0, 100)" in caplog.text
    assert "failOnDataLoss=false" in caplog.text


@pytest.mark.cluster
def test_a_recreated_topic_is_data_loss_for_a_running_stream(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, [0] * 50, [b"x"] * 50)
    raw = options(broker.bootstrap, topic, startingOffsets="earliest")

    def reader(**extra: str) -> ReplogStreamReader:
        return ReplogStreamReader(parse_source_options({**raw, **extra}, streaming=True))

    first = reader()
    try:
        start = first.initialOffset()
        end = first.latestOffset(start, first.getDefaultReadLimit())
        assert end == {topic: {"0": 50}}
    finally:
        first.stop()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.delete_topic(topic)
        wait_until(lambda: topic not in admin.list_topics(), message="the topic is gone")
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, [0] * 10, [b"y"] * 10)
    # The query restarts from its checkpoint (end of batch 0: offset 50).
    for strict in (True, False):
        again = reader(failOnDataLoss=str(strict).lower())
        try:
            latest = again.latestOffset(end, again.getDefaultReadLimit())
            assert latest == {topic: {"0": 10}}
            if strict:
                with pytest.raises(DataLossError, match="went back from 50 to 10"):
                    again.partitions(end, latest)
            else:
                with caplog.at_level(logging.WARNING, logger="datasource.planner"):
                    assert again.partitions(end, latest) == []
                assert "went back from 50 to 10" in caplog.text
        finally:
            again.stop()


@pytest.mark.spark
@pytest.mark.cluster
def test_commit_offsets_to_group_shows_the_querys_progress_to_lag_tools(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic, group = unique_name("spark"), unique_name("spark-group")
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, [i % 2 for i in range(3000)], [b"x"] * 3000)
    opts = options(
        broker.bootstrap,
        topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="1000",
        commitOffsetsToGroup=group,
    )
    query = (
        stream_df(spark, opts)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    raw = data_batches(query)[-1]["sources"][0]["endOffset"]
    end = json.loads(raw) if isinstance(raw, str) else raw
    expected = {TopicPartition(topic, int(p)): o for p, o in end[topic].items()}
    assert expected == {TopicPartition(topic, 0): 1500, TopicPartition(topic, 1): 1500}
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        # Spark commits a batch's offsets after the batch: wait for the last one
        wait_until(lambda: admin.list_consumer_group_offsets(group) == expected, timeout=60)
    # a batch read has no progress to commit
    with pytest.raises(Exception, match="commitOffsetsToGroup"):
        batch_df(spark, {**opts, "maxOffsetsPerTrigger": "1000"}).count()
