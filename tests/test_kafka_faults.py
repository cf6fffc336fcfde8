"""Kafka clients under real faults, against replog's Kafka listener: produce responses lost on
the way (a proxy that cuts the connection instead of forwarding them), a leader SIGKILLed under
an acks=all stream, and a confluent-kafka consume-transform-produce process SIGKILLed again and
again. What acks=all and transactions promise holds for them as for replog's own clients."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from replication import protocol as p
from replication.common import TopicPartition
from tests.cluster import BrokerProcess, Cluster
from tests.helpers import free_port, kill_while_running_then_finish, unique_name, wait_until
from tests.proxy import TcpProxy
from tests.readback import read_to_end
from tests.test_kafka_clients import create_topic, wait_known

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parent.parent


def test_idempotent_producer_retries_lost_responses_without_duplicates(tmp_path: Path) -> None:
    """Each lost Produce response makes librdkafka retry the same batch with the same
    sequence on a new connection: the broker answers it as the duplicate it is."""
    broker = BrokerProcess(tmp_path / "broker", kafka=True)
    broker.kafka_port = free_port()
    proxy = TcpProxy("127.0.0.1", broker.kafka_port).start()
    broker.overrides["advertised.listeners"] = f"KAFKA://127.0.0.1:{proxy.port}"
    broker.start()
    try:
        cluster_view = _OneBroker(broker)
        topic = create_topic(cluster_view, partitions=2, replication=1)  # type: ignore[arg-type]
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": proxy.address,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "batch.num.messages": 50,
                "request.timeout.ms": 5000,
                "retry.backoff.ms": 50,
            }
        )
        failed: list[Any] = []

        def on_delivery(err: Any, message: Any) -> None:
            if err is not None:
                failed.append(err)

        n = 3000
        for i in range(n):
            if i % 300 == 150:
                producer.flush(30)
                proxy.drop_next_response(p.ApiKey.PRODUCE)
            producer.produce(topic, value=f"r{i}".encode(), on_delivery=on_delivery)
        assert producer.flush(60) == 0
        assert failed == []
        assert sum(r.dropped for r in proxy.responses) == n // 300  # the faults happened
        read = read_to_end(broker.bootstrap, [TopicPartition(topic, q) for q in range(2)])
        values = [r.value or b"" for r in read.records]
        assert len(values) == n, f"{len(values) - len(set(values))} duplicates"
        assert sorted(values) == sorted(f"r{i}".encode() for i in range(n))
    finally:
        proxy.stop()
        broker.kill()


class _OneBroker:
    """The part of Cluster that create_topic uses, for one broker."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.brokers = {broker.broker_id: broker}
        self.kafka_bootstrap = broker.kafka_bootstrap


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", brokers=3, kafka=True).start()
    yield c
    c.stop()


def test_leader_sigkill_under_an_acks_all_stream_loses_no_acked_record(cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=3)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
        }
    )
    acked: list[bytes] = []
    failed: list[Any] = []
    lock = threading.Lock()

    def on_delivery(err: Any, message: Any) -> None:
        with lock:
            if err is not None:
                failed.append(err)
            else:
                acked.append(message.value())

    stop = threading.Event()

    def stream() -> None:
        i = 0
        while not stop.is_set():
            producer.produce(topic, value=f"r{i}".encode(), on_delivery=on_delivery)
            producer.poll(0)
            i += 1
            if i % 100 == 0:
                time.sleep(0.01)
        producer.flush(120)

    writer = threading.Thread(target=stream, daemon=True)
    writer.start()
    try:
        wait_until(lambda: len(acked) > 2000, timeout=60, message="records acked before the kill")
        leader = _leader_of(cluster, topic, 0)
        victim = cluster.brokers[leader]
        victim.kill()
        at_kill = len(acked)
        wait_until(
            lambda: len(acked) > at_kill + 2000,
            timeout=90,
            message="the Kafka client acks again after failing over to the new leader",
        )
        victim.start()
        wait_known(cluster, topic, 3)
        after_restart = len(acked)
        wait_until(lambda: len(acked) > after_restart + 1000, timeout=60, message="more acks")
    finally:
        stop.set()
        writer.join(150)
    assert not writer.is_alive()
    assert failed == []
    read = read_to_end(cluster.bootstrap, [TopicPartition(topic, q) for q in range(3)])
    stored = [r.value for r in read.records]
    assert len(stored) == len(set(stored)), "duplicates in the log"
    missing = set(acked) - set(stored)
    assert not missing, f"{len(missing)} acked records lost"


def _leader_of(cluster: Cluster, topic: str, partition: int) -> int:
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    metadata = admin.list_topics(topic, timeout=10).topics[topic]
    return int(metadata.partitions[partition].leader)


def test_consume_transform_produce_on_confluent_kafka_sigkilled_again_and_again_is_exactly_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    source, sink = create_topic(cluster, partitions=2), create_topic(cluster, partitions=2)
    group = unique_name("g")
    # Each worker is killed once it has made more than 200 records of progress, and may go
    # well past that before the kill lands (a worker commits ~40 transactions a second): small
    # transactions and a source of 6,000 leave the third worker enough to make its progress
    # (with 3,000 in transactions of 200, the first two once took 2,800 and the third could
    # commit only 200 more).
    n = 6000
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"}
    )
    for i in range(n):
        producer.produce(source, value=f"r{i}".encode(), partition=i % 2)
    assert producer.flush(60) == 0
    out = [TopicPartition(sink, q) for q in range(2)]

    def committed_output() -> list[bytes]:
        return [r.value or b"" for r in read_to_end(cluster.bootstrap, out).records]

    def start() -> subprocess.Popen[bytes]:
        with open(tmp_path / "worker.stderr", "a") as stderr:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.kafka_ctp_worker",
                    cluster.kafka_bootstrap,
                    group,
                    source,
                    sink,
                    f"ctp-{group}",
                    "50",
                ],
                cwd=ROOT,
                stderr=stderr,
            )

    workers: list[subprocess.Popen[bytes]] = []
    try:
        values = kill_while_running_then_finish(start, committed_output, n, workers)
        assert sorted(values) == sorted(f"R{i}".encode() for i in range(n))  # once each
    finally:
        if workers and (worker := workers[-1]).poll() is None:
            worker.kill()
            worker.wait()
