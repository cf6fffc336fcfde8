"""A Kafka-ecosystem program end to end on replog: Kafka Streams' word count (kafka-streams
4.4.0 from Maven Central, ``tests/java/streams/WordCount.java``) on three real brokers' Kafka
listener, exactly once (exactly_once_v2).

What Streams asks of a broker, all of it real here: CreateTopics for its internal topics with
their configs (a repartition topic, and the state store's changelog with
``cleanup.policy=compact``), a consumer group with its own assignor, transactions with offsets
sent to them, DeleteRecords on the repartition topic, and, on a start with no local state,
restoring the store by reading its changelog. The test checks the counts the output topic
holds (read_committed) after a first run, and after a second run on an empty state directory
whose store can only come back from the changelog."""

from __future__ import annotations

import json
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic  # type: ignore[attr-defined]

from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.kafka_jvm import streams_app
from tests.test_kafka_clients import wait_known

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

FIRST = ["the quick brown fox", "the lazy dog", "The fox jumps over the dog"]
SECOND = ["a fox and a dog", "the end"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("kafka-streams"), brokers=3, kafka=True).start()
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


def latest_counts(bootstrap: str, topic: str, partitions: int) -> dict[str, int]:
    """The last count per word in ``topic`` (String keys, Long values), read_committed from the
    start of every partition to its end."""
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
        counts: dict[str, int] = {}
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
            counts[key.decode()] = struct.unpack(">q", value)[0]
            positions[partition] = offset + 1
        return counts
    finally:
        consumer.close()


def run_until_counted(
    cluster: Cluster, state_dir: Path, app: str, topics: tuple[str, str], expected: dict[str, int]
) -> None:
    """Start the word count, wait until the output topic holds ``expected``, stop it cleanly."""
    source, sink = topics
    process = streams_app(
        "WordCount", cluster.kafka_bootstrap, app, source, sink, str(state_dir), state_dir=state_dir
    )
    try:
        wait_until(
            lambda: (
                latest_counts(cluster.kafka_bootstrap, sink, 3) == expected
                or _failed(process, state_dir)
            ),
            timeout=240,
            interval=1,
            message=f"the word counts in {sink}: {expected}",
        )
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

    produce(bootstrap, source, FIRST)
    run_until_counted(cluster, tmp_path / "first", app, (source, sink), word_counts(FIRST))

    # the store's changelog, made by Streams with the configs it asked for
    changelog = f"{app}-counts-changelog"
    resource = ConfigResource("topic", changelog)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["cleanup.policy"].value == "compact"

    # a second run with no local state: the counts go on from what the changelog restored
    produce(bootstrap, source, SECOND)
    run_until_counted(
        cluster, tmp_path / "second", app, (source, sink), word_counts(FIRST + SECOND)
    )
