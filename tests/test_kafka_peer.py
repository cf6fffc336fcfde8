"""The Apache Kafka peer (benchmarks/peers/kafka.py) brings up a working cluster: a KRaft
controller and three Kafka 4.4.0 brokers as JVM processes, an RF=3 topic, records produced with
acks=all and read back with confluent-kafka, and a SIGKILLed partition leader replaced with no
acknowledged record lost, the benchmarks' failover measure, on the peer. The same records then
go through replog's Kafka listener with the same client and the same checks.

One cluster per module (starting four JVMs is most of this module's time).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from benchmarks.peers.kafka import KafkaCluster
from tests.cluster import FAST_FAILOVER, Cluster
from tests.helpers import unique_name, wait_until
from tests.readback import confluent_read_count

pytestmark = pytest.mark.cluster

PARTITIONS = 3
RECORDS = 300


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    # replog's test clusters' failover timings (Kafka's names): a killed broker is fenced
    # after 2 s without heartbeats instead of Kafka's default 9 s
    with KafkaCluster(tmp_path_factory.mktemp("kafka"), brokers=3, overrides=FAST_FAILOVER) as k:
        yield k


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, PARTITIONS, 3, config={"min.insync.replicas": "2"})]
    )
    futures[topic].result(timeout=60)


def produce(bootstrap: str, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
    """acks=all, idempotent; every record's (partition, offset) as acknowledged."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
    )
    acked: list[tuple[int, int]] = []
    errors: list[object] = []

    def delivered(err: object, message: confluent_kafka.Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            partition, offset = message.partition(), message.offset()
            assert partition is not None
            assert offset is not None
            acked.append((partition, offset))

    for i, value in enumerate(values):
        producer.produce(topic, value, key=b"%d" % i, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0, "records left undelivered after 60 s"
    assert not errors, errors[:3]
    return acked


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return int(metadata.topics[topic].partitions[partition].leader)


def check_round_trip(bootstrap: str, topic: str) -> None:
    values = [b"value-%04d" % i for i in range(RECORDS)]
    acked = produce(bootstrap, topic, values)
    got = confluent_read_count({"bootstrap.servers": bootstrap}, topic, PARTITIONS, RECORDS)
    assert sorted((m.partition(), m.offset()) for m in got) == sorted(acked)
    assert sorted(m.value() or b"" for m in got) == values
    # every record reads back with the key it was produced with
    for m in got:
        assert m.value() == b"value-%04d" % int(m.key() or b"-1")


def test_cluster_starts_with_every_broker_registered(kafka: KafkaCluster) -> None:
    assert kafka.registered_brokers() == [0, 1, 2]
    assert len(kafka.pids) == 3
    assert kafka.brokers_cpu_seconds() > 0


def test_rf3_topic_round_trip_acks_all(kafka: KafkaCluster) -> None:
    topic = unique_name("peer")
    create_topic(kafka.bootstrap, topic)
    metadata = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(topic, timeout=10)
    for partition in metadata.topics[topic].partitions.values():
        assert sorted(partition.replicas) == [0, 1, 2]
        assert sorted(partition.isrs) == [0, 1, 2]
    check_round_trip(kafka.bootstrap, topic)


def test_leader_sigkill_loses_no_acked_record(kafka: KafkaCluster) -> None:
    topic = unique_name("failover")
    create_topic(kafka.bootstrap, topic)
    before = produce(kafka.bootstrap, topic, [b"before-%d" % i for i in range(100)])
    leader = leader_of(kafka.bootstrap, topic, 0)
    kafka.kill(leader)
    assert leader not in [b for b in kafka.broker_ids if kafka.brokers[b].alive]
    wait_until(
        lambda: leader_of(kafka.bootstrap, topic, 0) not in (leader, -1),
        timeout=60,
        interval=0.2,
        message=f"a new leader for {topic}-0 after broker {leader} was killed",
    )
    after = produce(kafka.bootstrap, topic, [b"after-%d" % i for i in range(100)])
    got = confluent_read_count({"bootstrap.servers": kafka.bootstrap}, topic, PARTITIONS, 200)
    assert sorted((m.partition(), m.offset()) for m in got) == sorted(before + after)
    kafka.restart(leader)
    wait_until(
        lambda: leader in kafka.registered_brokers(),
        timeout=60,
        interval=0.2,
        message=f"broker {leader} registered again after its restart",
    )


def test_same_round_trip_through_replog_kafka_listener(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "replog", brokers=3, kafka=True)
    cluster.start()
    try:
        topic = unique_name("peer")
        create_topic(cluster.kafka_bootstrap, topic)
        wait_until(
            lambda: all(
                leader_of(cluster.kafka_bootstrap, topic, p) >= 0 for p in range(PARTITIONS)
            ),
            timeout=30,
            message=f"leaders for {topic}",
        )
        check_round_trip(cluster.kafka_bootstrap, topic)
    finally:
        cluster.stop()
