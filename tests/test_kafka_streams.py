"""A Kafka-ecosystem program end to end on replog: Kafka Streams' word count (kafka-streams
4.4.0 from Maven Central, ``tests/java/streams/WordCount.java``) on three real brokers' Kafka
listener, exactly once (exactly_once_v2).

What Streams asks of a broker, all of it real here: CreateTopics for its internal topics with
their configs (a repartition topic, and the state store's changelog with
``cleanup.policy=compact``), a consumer group with its own assignor, transactions with offsets
sent to them, DeleteRecords on the repartition topic, and, on a start with no local state,
restoring the store by reading its changelog. The test checks the counts the output topic
holds (read_committed) after a first run, and after a second run on an empty state directory
whose store can only come back from the changelog.

Between the two runs the changelog is compacted: the first run updates a few words many times,
the brokers' log cleaners (every replica's, each on its own store) clean the changelog, which
was written in transactions, down to one record per word, and the second run restores its
store from that cleaned log, read through the Kafka listener with its offset gaps."""

from __future__ import annotations

import json
import struct
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from logstore.batch import iter_batches
from logstore.log import open_replica_log
from logstore.storage import Storage
from replication.client.partitioner import partition_for_key
from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.kafka_jvm import streams_app
from tests.test_kafka_clients import wait_known
from tests.test_metrics import scrape, value

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

FIRST = ["the quick brown fox", "the lazy dog", "The fox jumps over the dog"]
SECOND = ["a fox and a dog", "the end"]
#: many updates of a few words, one on each of the changelog's 3 partitions
MANY = ["the fox red"] * 100
#: new words, one on each changelog partition: the last transaction on each partition holds
#: only its word, so once everything before it is cleaned every word has exactly one record
LAST = ["blue pink green"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("kafka-streams"),
        brokers=3,
        kafka=True,
        metrics=True,
        overrides={"log.cleaner.backoff.ms": "200"},
    ).start()
    yield c
    c.stop()


def word_counts(lines: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in lines:
        for word in line.lower().split():
            counts[word] = counts.get(word, 0) + 1
    return counts


def produce(bootstrap: str, topic: str, lines: list[str]) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
    )
    for i, line in enumerate(lines):
        producer.produce(topic, key=str(i).encode(), value=line.encode())
    assert producer.flush(30) == 0


Row = tuple[int, int, bytes, bytes]  # partition, offset, key, value


def read_committed(bootstrap: str, topic: str, partitions: int) -> list[Row]:
    """Every record of ``topic`` with a key and a value, read_committed from the start of every
    partition to its end."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("counts"),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        tps = [confluent_kafka.TopicPartition(topic, p) for p in range(partitions)]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in ends
            ]
        )
        rows: list[Row] = []
        positions = dict.fromkeys(ends, 0)
        while any(positions[p] < ends[p] for p in ends):
            message = consumer.poll(5)
            if message is None:
                # read_committed stops at the LSO: an open transaction's records are not there yet
                break
            assert message.error() is None, message.error()
            key, value = message.key(), message.value()
            partition, offset = message.partition(), message.offset()
            assert partition is not None
            assert offset is not None
            assert key is not None, f"a null word at {partition}:{offset}"
            assert value is not None, f"a null count at {partition}:{offset}"
            rows.append((partition, offset, key, value))
            positions[partition] = offset + 1
        return rows
    finally:
        consumer.close()


def latest_counts(bootstrap: str, topic: str, partitions: int) -> dict[str, int]:
    """The last count per word in ``topic`` (String keys, Long values)."""
    return {
        key.decode(): struct.unpack(">q", value)[0]
        for _, _, key, value in read_committed(bootstrap, topic, partitions)
    }


@contextmanager
def word_count(
    cluster: Cluster,
    state_dir: Path,
    app: str,
    topics: tuple[str, str],
    before: tuple[str, ...] = (),
) -> Iterator[Callable[[list[str]], None]]:
    """The word count running on ``topics`` (source, sink), whose source holds the lines
    ``before``; yields ``count(lines)``, which produces ``lines`` to the source and waits until
    the sink holds the counts of every line in it. Stopped cleanly at the end."""
    source, sink = topics
    process = streams_app(
        "WordCount", cluster.kafka_bootstrap, app, source, sink, str(state_dir), state_dir=state_dir
    )
    produced = list(before)

    def count(lines: list[str]) -> None:
        produce(cluster.kafka_bootstrap, source, lines)
        produced.extend(lines)
        expected = word_counts(produced)
        wait_until(
            lambda: (
                latest_counts(cluster.kafka_bootstrap, sink, 3) == expected
                or _failed(process, state_dir)
            ),
            timeout=240,
            interval=1,
            message=f"the word counts in {sink}: {expected}",
        )

    try:
        yield count
        assert _failed(process, state_dir) is False
        assert process.stdin is not None
        process.stdin.close()
        assert process.wait(timeout=60) == 0, _output(state_dir)
        assert '{"done": true}' in (state_dir / "stdout.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _failed(process: subprocess.Popen[str], state_dir: Path) -> bool:
    """False while the application runs without an error; an AssertionError naming its output
    once it exits or reports an error."""
    events = [
        json.loads(line)
        for line in (state_dir / "stdout.log").read_text().splitlines()
        if line.startswith("{")
    ]
    errors = [e["error"] for e in events if "error" in e]
    states = [e["state"] for e in events if "state" in e]
    assert not errors, _output(state_dir)
    assert "ERROR" not in states, _output(state_dir)
    assert process.poll() is None, f"exited {process.returncode}: {_output(state_dir)}"
    return False


def _output(state_dir: Path) -> str:
    return (
        (state_dir / "stdout.log").read_text()
        + "\n--- stderr ---\n"
        + (state_dir / "stderr.log").read_text()[-6000:]
    )


def replica_words(cluster: Cluster, topic: str, partitions: int) -> dict[int, list[bytes | None]]:
    """Every replica's keys, in offset order, of its cleaned log's data records, by broker
    (read from the broker's own store); {} while a replica has not been cleaned yet."""
    words: dict[int, list[bytes | None]] = {}
    for broker_id, broker in cluster.brokers.items():
        root = Storage.from_url(broker.log_dir)
        for partition in range(partitions):
            replica = open_replica_log(root, topic, partition, read_only=True)
            if replica.clean_generation < 1:
                return {}
            data = replica.read(replica.log_start_offset, 1 << 30)
            for batch in iter_batches(data):
                if not batch.is_control:
                    words.setdefault(broker_id, []).extend(r.key for r in batch.records())
    return words


def test_word_count_runs_exactly_once_and_restores_its_store_from_the_changelog(
    cluster: Cluster, tmp_path: Path
) -> None:
    bootstrap = cluster.kafka_bootstrap
    app = unique_name("wordcount")
    source, sink = unique_name("lines"), unique_name("counts")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(t, num_partitions=3, replication_factor=3) for t in (source, sink)]
    ).values():
        future.result(30)
    wait_known(cluster, source, 3)
    wait_known(cluster, sink, 3)
    changelog = f"{app}-counts-changelog"
    assert sorted({partition_for_key(w.encode(), 3) for w in LAST[0].split()}) == [0, 1, 2]

    with word_count(cluster, tmp_path / "first", app, (source, sink)) as count:
        count(FIRST)
        # the store's changelog, made by Streams with the configs it asked for
        resource = ConfigResource("topic", changelog)
        configs = admin.describe_configs([resource])[resource].result(30)
        assert configs["cleanup.policy"].value == "compact"
        # clean as soon as anything is dirty; short segments (over the broker WAL every flush
        # is a segment of its own already)
        altered = ConfigResource(
            "topic",
            changelog,
            incremental_configs=[
                ConfigEntry(name, v, incremental_operation=AlterConfigOpType.SET)
                for name, v in {"min.cleanable.dirty.ratio": "0.01", "segment.ms": "100"}.items()
            ],
        )
        admin.incremental_alter_configs([altered])[altered].result(30)
        count(MANY)
        count(LAST)
    lines = FIRST + MANY + LAST
    counts = word_counts(lines)

    # every replica's cleaner cleans the changelog down to one record per word
    def cleaned() -> bool:
        words = replica_words(cluster, changelog, 3)
        return len(words) == 3 and all(len(w) == len(set(w)) for w in words.values())

    wait_until(cleaned, timeout=60, message=f"every replica of {changelog} cleaned")
    for broker in cluster.brokers.values():
        samples = scrape(broker)
        assert value(samples, "replog_log_cleaner_records_read_total") > value(
            samples, "replog_log_cleaner_records_kept_total"
        )
    # what a Kafka consumer reads from offset 0: each word once, with its latest count
    rows = read_committed(bootstrap, changelog, 3)
    assert sorted(key.decode() for _, _, key, _ in rows) == sorted(counts)
    assert latest_counts(bootstrap, changelog, 3) == counts
    assert len(rows) < sum(counts.values())  # the updates written, one record each

    # a second run with no local state: the counts go on from what the cleaned changelog restored
    with word_count(cluster, tmp_path / "second", app, (source, sink), tuple(lines)) as count:
        count(SECOND)
