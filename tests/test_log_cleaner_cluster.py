"""The broker's log cleaner on a real cluster: a compacted topic on 3 brokers takes many updates
to few keys; every replica (leader and followers, each on its own store) cleans its log, which
shrinks; a Kafka consumer (confluent-kafka) reading from offset 0 sees each key's latest value,
every record it reads at the offset it was written at, and no half-cleaned state. A record
without a key is refused through replog's own protocol too."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from logstore.log import open_replica_log
from logstore.storage import Storage
from replication.client import Producer as ReplogProducer
from replication.errors import InvalidRecordError
from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.test_kafka_clients import kcat
from tests.test_metrics import scrape, value

pytestmark = pytest.mark.cluster

KEYS = 8
ROUNDS = 40


Row = tuple[int, bytes | None, bytes | None]  # offset, key, value


def read_from_zero(bootstrap: str, topic: str) -> list[Row]:
    """(offset, key, value) of every record of partition 0, from offset 0 to the HW."""
    settings = {"bootstrap.servers": bootstrap, "isolation.level": "read_committed"}
    consumer = confluent_kafka.Consumer({**settings, "group.id": unique_name("cleaned")})
    try:
        _, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition(topic, 0), timeout=30
        )
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        got: list[Row] = []
        deadline = time.monotonic() + 60
        while not got or got[-1][0] < high - 1:
            assert time.monotonic() < deadline, f"read {len(got)} records, up to {got[-1:]}"
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            offset = message.offset()
            assert offset is not None
            got.append((offset, message.key(), message.value()))
        return got
    finally:
        consumer.close()


def test_a_compacted_topic_is_cleaned_on_every_replica(
    cluster_factory: Callable[..., Cluster],
) -> None:
    cluster = cluster_factory(kafka=True, metrics=True, overrides={"log.cleaner.backoff.ms": "200"})
    topic = unique_name("compacted")
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    config = {
        "cleanup.policy": "compact",
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0",
        "min.insync.replicas": "2",
    }
    admin.create_topics([NewTopic(topic, 1, 3, config=config)])[topic].result(timeout=60)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all", "linger.ms": 0}
    )
    written: dict[int, tuple[bytes | None, bytes | None]] = {}

    def delivered(err: object, message: confluent_kafka.Message) -> None:
        assert err is None, err
        offset = message.offset()
        assert offset is not None
        written[offset] = (message.key(), message.value())

    for round_ in range(ROUNDS):
        for key in range(KEYS):
            payload = f"{key}@{round_}".encode() * 200
            producer.produce(topic, payload, f"k{key}".encode(), on_delivery=delivered)
        producer.flush(30)  # one chunk per round on every replica
    assert len(written) == KEYS * ROUNDS

    uncleaned = sum(
        len(k or b"") + len(v or b"") for k, v in written.values()
    )  # less than the log held

    def replica_sizes() -> list[int] | None:
        sizes = []
        for broker in cluster.brokers.values():
            root = Storage.from_url(broker.log_dir)
            replica = open_replica_log(root, topic, 0, read_only=True)
            if replica.clean_generation < 1 or replica.size_in_bytes >= uncleaned / 4:
                return None
            sizes.append(replica.size_in_bytes)
        return sizes

    wait_until(replica_sizes, timeout=60, message="every replica cleaned and shrank its log")
    for broker in cluster.brokers.values():  # each broker counts its own cleaner's work
        samples = scrape(broker)
        assert value(samples, "replog_log_cleaner_rounds_total") >= 1
        assert value(samples, "replog_log_cleaner_records_read_total") > value(
            samples, "replog_log_cleaner_records_kept_total"
        )
        read = value(samples, "replog_log_cleaner_bytes_read_total")
        assert 0 < value(samples, "replog_log_cleaner_bytes_written_total") < read

    records = read_from_zero(cluster.kafka_bootstrap, topic)
    offsets = [o for o, _, _ in records]
    assert offsets == sorted(set(offsets))
    for row in records:
        assert written[row[0]] == row[1:], f"offset {row[0]} holds what it was written with"
    assert len(records) < len(written)  # the log has offset gaps now
    latest = {key: value for _, (key, value) in sorted(written.items())}
    seen = {key: value for _, key, value in records}
    assert seen == latest
    # kcat (librdkafka's command-line consumer) reads the cleaned log alike, gaps and all
    kcat_read = ["-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q", "-f", "%o %k %s\n"]
    shown = subprocess.run(
        [kcat(), "-b", cluster.kafka_bootstrap, *kcat_read],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert shown == [f"{o} {(k or b'').decode()} {(v or b'').decode()}" for o, k, v in records]

    with (
        ReplogProducer(bootstrap_servers=cluster.bootstrap, acks="all") as replog,
        pytest.raises(InvalidRecordError, match=rf"{topic}.*cleanup.policy=compact"),
    ):
        replog.send(topic, b"no key", partition=0).result(timeout=30)
