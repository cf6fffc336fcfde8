"""The client library against a real broker process: Admin, Producer and Consumer round trips
(records and Arrow), positions and committed offsets, named errors, fetch limits, and a
producer and consumer that carry on across a broker restart."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from replication.client import (
    FETCH_SCHEMA,
    Admin,
    Consumer,
    ConsumerRecord,
    FetchedBatch,
    NewTopic,
    Producer,
    TopicPartition,
)
from replication.client.partitioner import (
    partition_for_key,
)
from replication.errors import (
    InvalidPartitionsError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from tests import cluster
from tests.cluster import BrokerProcess
from tests.helpers import unique_name, wait_until
from tests.readback import read_count

# --- against a real broker ---------------------------------------------------------------------

# The fixtures of tests/cluster.py, under the names tests ask for.
broker = cluster.broker
broker_factory = cluster.broker_factory


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[Admin]:
    with Admin(bootstrap_servers=broker.bootstrap, default_api_timeout_ms=10_000) as client:
        yield client


@pytest.mark.cluster
def test_admin_create_describe_list_delete(broker: BrokerProcess, admin: Admin) -> None:
    name = unique_name("admin")
    admin.create_topics([NewTopic(name, 3, 1, {"retention.ms": "3600000"})])
    assert name in admin.list_topics()
    (description,) = admin.describe_topics([name])
    assert [pi.partition for pi in description.partitions] == [0, 1, 2]
    assert all(pi.leader == 0 and pi.isr == (0,) for pi in description.partitions)
    cluster = admin.describe_cluster()
    assert cluster.controller_id == 0
    assert [(b.node_id, b.port) for b in cluster.brokers] == [(0, broker.port)]
    with pytest.raises(TopicAlreadyExistsError, match=name):
        admin.create_topic(name, 1, 1)
    with pytest.raises(InvalidPartitionsError):
        admin.create_topic(unique_name(), 0, 1)
    with pytest.raises(UnknownTopicOrPartitionError, match="missing-topic"):
        admin.describe_topics(["missing-topic"])
    admin.delete_topics([name])
    wait_until(lambda: name not in admin.list_topics(), timeout=10)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topics([name])


@pytest.mark.cluster
@pytest.mark.parametrize("acks", ["0", "1", "all"])
@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_round_trip_records(
    broker: BrokerProcess, admin: Admin, acks: str, compression: str
) -> None:
    name = unique_name("rt")
    admin.create_topic(name, 3, 1)
    headers = [("trace", b"abc"), ("empty", None)]
    with Producer(
        bootstrap_servers=broker.bootstrap, acks=acks, compression_type=compression
    ) as producer:
        futures = [
            producer.send(
                name,
                b"value-%d" % i,
                key=b"key-%d" % (i % 17),
                headers=headers if i % 2 else None,
                timestamp=1_700_000_000_000 + i,
            )
            for i in range(300)
        ]
        producer.flush(timeout=30)
        metas = [f.result(timeout=1) for f in futures]
    for i, meta in enumerate(metas):
        assert meta.partition == partition_for_key(b"key-%d" % (i % 17), 3)
        assert (meta.offset >= 0) == (acks != "0")
    records = read_count(broker.bootstrap, [TopicPartition(name, i) for i in range(3)], 300)
    assert len(records) == 300
    by_value = {r.value: r for r in records}
    for i in range(300):
        r = by_value[b"value-%d" % i]
        assert r.key == b"key-%d" % (i % 17)
        assert r.partition == partition_for_key(r.key, 3)
        assert r.timestamp == 1_700_000_000_000 + i
        assert r.timestamp_type == 0
        assert r.headers == (tuple(headers) if i % 2 else ())
        if acks != "0":
            assert (r.partition, r.offset) == (metas[i].partition, metas[i].offset)
    for part in range(3):
        offsets = [r.offset for r in records if r.partition == part]
        assert offsets == list(range(len(offsets)))


@pytest.mark.cluster
def test_round_trip_arrow(broker: BrokerProcess, admin: Admin) -> None:
    name = unique_name("arrow")
    admin.create_topic(name, 2, 1)
    n = 20_000
    table = pa.table(
        {
            "value": pa.array([f"v{i}" for i in range(n)]),
            "timestamp": pa.array(range(1000, 1000 + n), pa.int64()),
            "partition": pa.array([i % 2 for i in range(n)], pa.int32()),
        }
    )
    with Producer(bootstrap_servers=broker.bootstrap, acks="1", batch_size=64 * 1024) as producer:
        metas = [f.result(timeout=30) for f in producer.send_arrow(name, table)]
    assert sum(m.record_count for m in metas) == n
    assert len(metas) > 2
    with Consumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(name, 0), TopicPartition(name, 1)])
        batches: list[FetchedBatch] = []

        def polled() -> bool:
            batches.extend(consumer.poll_arrow(500))
            return sum(b.num_rows for b in batches) >= n

        wait_until(polled, timeout=30, interval=0, message=f"{n} rows")
    assert all(b.batch.schema == FETCH_SCHEMA for b in batches)
    for part in (0, 1):
        rows = pa.Table.from_batches([b.batch for b in batches if b.partition == part])
        assert rows.column("offset").to_pylist() == list(range(n // 2))
        assert rows.column("value").to_pylist() == [b"v%d" % i for i in range(part, n, 2)]
        assert rows.column("timestamp").to_pylist() == list(range(1000 + part, 1000 + n, 2))


@pytest.mark.cluster
def test_consumer_positions_and_offsets(broker: BrokerProcess, admin: Admin) -> None:
    name = unique_name("pos")
    admin.create_topic(name, 1, 1)
    tp = TopicPartition(name, 0)
    with Producer(bootstrap_servers=broker.bootstrap) as producer:
        for i in range(10):
            producer.send(name, b"%d" % i, timestamp=10_000 + 100 * i).result(timeout=10)
    with Consumer(bootstrap_servers=broker.bootstrap) as consumer:
        consumer.assign([tp])
        assert consumer.assignment() == {tp}
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        assert consumer.position(tp) == 10  # auto.offset.reset latest
        assert consumer.poll(100) == []
        found = consumer.offsets_for_times({tp: 10_450})
        assert found[tp] == (5, 10_500)
        assert consumer.offsets_for_times({tp: 99_999}) == {tp: None}
        consumer.seek(tp, 7)
        assert [r.value for r in consumer.poll(5000)] == [b"7", b"8", b"9"]
        consumer.seek_to_beginning()
        assert consumer.position(tp) == 0
        first = consumer.poll(5000, max_records=4)
        assert [r.offset for r in first] == [0, 1, 2, 3]
        assert consumer.position(tp) == 4
        consumer.seek_to_end(tp)
        assert consumer.position(tp) == 10
    assert admin.list_offsets({tp: "earliest"}) == {tp: 0}
    assert admin.list_offsets({(name, 0): "latest"}) == {tp: 10}
    assert admin.list_offsets({tp: 10_450}) == {tp: 5}
    assert admin.list_offsets({tp: "latest"}, isolation_level="read_committed") == {tp: 10}


def _poll_until_error(consumer: Consumer, deadline: float) -> None:
    while time.monotonic() < deadline:
        consumer.poll(100)


@pytest.mark.cluster
def test_named_errors_against_the_broker(broker: BrokerProcess, admin: Admin) -> None:
    name = unique_name("err")
    admin.create_topic(name, 1, 1, {"max.message.bytes": "2000"})
    with Producer(bootstrap_servers=broker.bootstrap, max_block_ms=500) as producer:
        with pytest.raises(UnknownTopicOrPartitionError, match="not present in metadata"):
            producer.send(unique_name("missing"), b"x").result(timeout=10)
        with pytest.raises(RecordTooLargeError):
            producer.send(name, b"x" * 5000).result(timeout=10)
        assert producer.send(name, b"small").result(timeout=10).offset >= 0
    with Consumer(bootstrap_servers=broker.bootstrap, default_api_timeout_ms=500) as consumer:
        consumer.assign([TopicPartition("no-such-topic", 0)])
        with pytest.raises(UnknownTopicOrPartitionError, match="no-such-topic"):
            consumer.end_offsets([TopicPartition("no-such-topic", 0)])
        with pytest.raises(UnknownTopicOrPartitionError, match="does not exist"):
            _poll_until_error(consumer, deadline=time.monotonic() + 10)


@pytest.mark.cluster
@pytest.mark.parametrize("how", ["stop", "kill"])
def test_producer_survives_a_broker_restart(
    broker_factory: Any, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    node = broker_factory()
    with Admin(bootstrap_servers=node.bootstrap) as admin:
        admin.create_topic("restart", 2, 1)
    delivered: list[bytes] = []
    failed: list[BaseException] = []
    with Producer(
        bootstrap_servers=node.bootstrap,
        acks="all",
        linger_ms=2,
        retry_backoff_ms=50,
        delivery_timeout_ms=60_000,
        request_timeout_ms=5000,
    ) as producer:
        futures: list[tuple[bytes, Any]] = []
        stop = threading.Event()

        def produce() -> None:
            i = 0
            while not stop.is_set():
                value = b"r%d" % i
                futures.append((value, producer.send("restart", value, key=value)))
                i += 1
                stop.wait(0.0005)  # pace the producer; ends at once when stopped

        thread = threading.Thread(target=produce)
        thread.start()
        wait_until(lambda: len(futures) > 500, timeout=20)
        with caplog.at_level(logging.WARNING, logger="replication.client.producer"):
            if how == "stop":
                node.stop()
            else:
                node.kill()
            down = len(futures)
            wait_until(lambda: len(futures) > down + 200, timeout=20)  # produce while down
            node.start()
        count = len(futures)
        wait_until(lambda: len(futures) > count + 500, timeout=30)
        stop.set()
        thread.join(10)
        producer.flush(timeout=60)
        for value, future in futures:
            try:
                future.result(timeout=1)
                delivered.append(value)
            except Exception as err:
                failed.append(err)
    assert failed == []
    assert any("retrying" in r.getMessage() for r in caplog.records)
    got = read_count(
        node.bootstrap,
        [TopicPartition("restart", 0), TopicPartition("restart", 1)],
        len(delivered),
    )
    assert set(delivered) <= {r.value for r in got}


@pytest.mark.cluster
def test_consumer_keeps_polling_across_a_broker_restart(broker_factory: Any) -> None:
    node = broker_factory()
    with Admin(bootstrap_servers=node.bootstrap) as admin:
        admin.create_topic("across", 1, 1)
    tp = TopicPartition("across", 0)
    with (
        Producer(bootstrap_servers=node.bootstrap, retry_backoff_ms=50) as producer,
        Consumer(
            bootstrap_servers=node.bootstrap, auto_offset_reset="earliest", retry_backoff_ms=50
        ) as consumer,
    ):
        consumer.assign([tp])
        producer.send("across", b"before").result(timeout=10)
        got: list[bytes | None] = []

        def polled(count: int) -> bool:
            got.extend(r.value for r in consumer.poll(200))
            return len(got) >= count

        wait_until(lambda: polled(1), timeout=10)
        node.stop()
        assert consumer.poll(300) == []  # the broker is down: nothing, no error
        node.start()
        producer.send("across", b"after").result(timeout=30)
        wait_until(lambda: polled(2), timeout=30)
        assert got == [b"before", b"after"]
        assert consumer.position(tp) == 2


@pytest.mark.cluster
def test_fetch_limits_and_out_of_range(broker: BrokerProcess, admin: Admin) -> None:
    name = unique_name("limits")
    admin.create_topic(name, 1, 1)
    tp = TopicPartition(name, 0)
    with Producer(bootstrap_servers=broker.bootstrap) as producer:
        producer.send(name, b"B" * 200_000).result(timeout=10)
        producer.send(name, b"small").result(timeout=10)
    with Consumer(
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="none",
        max_partition_fetch_bytes=1000,
        fetch_max_bytes=1000,
    ) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[ConsumerRecord] = []

        def polled() -> bool:
            got.extend(consumer.poll(200))
            return len(got) >= 2

        wait_until(polled, timeout=10)
        # A batch larger than the fetch limits still comes whole (KIP-74).
        assert [len(r.value or b"") for r in got] == [200_000, 5]
        consumer.seek(tp, 1000)
        with pytest.raises(OffsetOutOfRangeError, match=rf"offset 1000 .*{name}-0.*\[0, 2\)"):
            consumer.poll(2000)
