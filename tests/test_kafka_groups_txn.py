"""confluent-kafka's consumer groups and transactions against replog's Kafka listener: the
group and transaction coordinators replog's own clients use, reached through Kafka's
protocol by librdkafka."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest

from replication.common import TopicPartition
from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.readback import read_to_end
from tests.test_kafka_clients import create_topic

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("kafka-groups"), brokers=3, kafka=True).start()
    yield c
    c.stop()


def produce(cluster: Cluster, topic: str, values: list[str], partitions: int) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"}
    )
    for i, value in enumerate(values):
        producer.produce(topic, value=value.encode(), partition=i % partitions)
    assert producer.flush(60) == 0


def group_consumer(cluster: Cluster, group: str, **config: Any) -> confluent_kafka.Consumer:
    return confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            **config,
        }
    )


def poll_until(consumers: list[confluent_kafka.Consumer], done: Any, timeout: float = 60) -> Any:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while not done(out):
        assert time.monotonic() < deadline, f"gave up after {len(out)} records"
        for consumer in consumers:
            message = consumer.poll(0.1)
            if message is not None:
                assert message.error() is None, message.error()
                out.append(message)
    return out


# --- groups ------------------------------------------------------------------------------------


def test_two_consumers_split_a_topic_and_a_new_member_resumes_from_committed_offsets(
    cluster: Cluster,
) -> None:
    topic = create_topic(cluster, partitions=6)
    group = unique_name("g")
    produce(cluster, topic, [f"a{i}" for i in range(300)], 6)
    first, second = group_consumer(cluster, group), group_consumer(cluster, group)
    for consumer in (first, second):
        consumer.subscribe([topic])
    got = poll_until([first, second], lambda out: len(out) >= 300)
    assert sorted(m.value().decode() for m in got) == sorted(f"a{i}" for i in range(300))

    def split() -> bool:
        first.poll(0.05)
        second.poll(0.05)
        a = {p.partition for p in first.assignment()}
        b = {p.partition for p in second.assignment()}
        return bool(a) and bool(b) and not a & b and a | b == set(range(6))

    wait_until(split, timeout=30, message="both members own a share of the six partitions")
    for consumer in (first, second):
        consumer.commit(asynchronous=False)
    second.close()  # leaves the group: the first member takes every partition

    def owns_all() -> bool:
        first.poll(0.05)
        return {p.partition for p in first.assignment()} == set(range(6))

    wait_until(owns_all, timeout=30, message="the remaining member owns all six partitions")
    produce(cluster, topic, [f"b{i}" for i in range(60)], 6)
    more = poll_until([first], lambda out: len(out) >= 60)
    assert sorted(m.value().decode() for m in more) == sorted(f"b{i}" for i in range(60))
    first.commit(asynchronous=False)
    first.close()

    third = group_consumer(cluster, group)
    committed = third.committed([confluent_kafka.TopicPartition(topic, p) for p in range(6)], 30)
    assert sorted(tp.offset for tp in committed) == [60] * 6
    third.close()


def test_a_sigkilled_member_s_partitions_go_to_the_survivor(cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=4)
    group = unique_name("g")
    members = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.kafka_group_member",
                cluster.kafka_bootstrap,
                group,
                topic,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    events: list[list[dict[str, Any]]] = [[], []]

    def read(i: int) -> None:
        stdout = members[i].stdout
        assert stdout is not None
        for line in stdout:
            events[i].append(json.loads(line))

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(2)]
    for t in readers:
        t.start()
    try:

        def assigned(i: int) -> set[int]:
            latest = [e["assigned"] for e in events[i] if "assigned" in e]
            return set(latest[-1]) if latest else set()

        wait_until(
            lambda: assigned(0) and assigned(1) and assigned(0) | assigned(1) == set(range(4)),
            timeout=60,
            message="both members own partitions",
        )
        produce(cluster, topic, [f"before-{i}" for i in range(40)], 4)
        wait_until(
            lambda: sum("record" in e for e in events[0] + events[1]) >= 40,
            timeout=60,
            message="the members consumed the first records",
        )
        members[1].kill()
        members[1].wait()
        wait_until(
            lambda: assigned(0) == set(range(4)),
            timeout=60,
            message="the survivor owns every partition after the session timeout",
        )
        produce(cluster, topic, [f"after-{i}" for i in range(40)], 4)
        wait_until(
            lambda: (
                {e["record"][2] for e in events[0] if "record" in e}
                >= {f"after-{i}" for i in range(40)}
            ),
            timeout=60,
            message="the survivor consumed every later record",
        )
        # committed offsets were used: no record the killed member committed was read again
        seen = {e["record"][2] for e in events[0] + events[1] if "record" in e}
        killed_committed = {e["committed"] for e in events[1] if "committed" in e}
        survivor_saw = {e["record"][2] for e in events[0] if "record" in e}
        assert killed_committed, "the killed member had committed records"
        assert not killed_committed & survivor_saw
        assert seen == {f"before-{i}" for i in range(40)} | {f"after-{i}" for i in range(40)}
    finally:
        for member in members:
            member.kill()
            member.wait()
            if member.stdout is not None:
                member.stdout.close()


# --- transactions ------------------------------------------------------------------------------


def test_transactions_commit_and_abort_for_read_committed_consumers(cluster: Cluster) -> None:
    topic = create_topic(cluster)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": unique_name("tx")}
    )
    producer.init_transactions(60)
    for outcome in ("commit", "abort", "commit"):
        producer.begin_transaction()
        for i in range(30):
            producer.produce(topic, value=f"{outcome}-{i}".encode(), partition=i % 3)
        if outcome == "commit":
            producer.commit_transaction(60)
        else:
            # librdkafka drops what it has not sent when it aborts: send it, so that the
            # aborted records are in the log
            assert producer.flush(60) == 0
            producer.abort_transaction(60)

    def values(isolation: str, count: int) -> list[str]:
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": cluster.kafka_bootstrap,
                "group.id": unique_name("g"),
                "isolation.level": isolation,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(3)])
        got = poll_until([consumer], lambda out: len(out) >= count)
        # nothing more arrives: control batches and aborted records are not messages
        extra = consumer.poll(1.0)
        consumer.close()
        assert extra is None
        return [m.value().decode() for m in got]

    committed = values("read_committed", 60)
    assert sorted(committed) == sorted([f"commit-{i}" for i in range(30)] * 2)
    assert len(values("read_uncommitted", 90)) == 90
    # replog's own read_committed reader agrees
    read = read_to_end(cluster.bootstrap, [TopicPartition(topic, p) for p in range(3)])
    assert sorted(r.value or b"" for r in read.records) == sorted(v.encode() for v in committed)


def test_send_offsets_to_transaction_commits_the_group_s_offsets_with_the_output(
    cluster: Cluster,
) -> None:
    source, sink = create_topic(cluster), create_topic(cluster)
    group = unique_name("g")
    produce(cluster, source, [f"in-{i}" for i in range(90)], 3)
    consumer = group_consumer(cluster, group, **{"isolation.level": "read_committed"})
    consumer.subscribe([source])
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": unique_name("tx")}
    )
    producer.init_transactions(60)
    taken = 0
    aborted_once = False
    deadline = time.monotonic() + 90
    while taken < 90:
        assert time.monotonic() < deadline
        batch: Any = consumer.consume(30, 1.0)
        if not batch:
            continue
        producer.begin_transaction()
        for message in batch:
            assert message.error() is None
            producer.produce(sink, value=message.value().upper(), partition=message.partition())
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 60
        )
        if not aborted_once:
            # the first transaction is aborted: its output vanishes and its offsets do not
            # count, so the consumer must read those records again
            producer.abort_transaction(60)
            aborted_once = True
            for tp in consumer.assignment():
                committed = consumer.committed([tp], 30)[0]
                consumer.seek(
                    confluent_kafka.TopicPartition(
                        tp.topic, tp.partition, committed.offset if committed.offset >= 0 else 0
                    )
                )
            continue
        producer.commit_transaction(60)
        taken += len(batch)
    consumer.close()
    read = read_to_end(cluster.bootstrap, [TopicPartition(sink, p) for p in range(3)])
    assert sorted(r.value or b"" for r in read.records) == sorted(
        f"IN-{i}".encode() for i in range(90)
    )
    check = group_consumer(cluster, group)
    offsets = check.committed([confluent_kafka.TopicPartition(source, p) for p in range(3)], 30)
    check.close()
    assert sorted(tp.offset for tp in offsets) == [30, 30, 30]
