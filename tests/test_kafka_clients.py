"""Kafka clients nobody here wrote, against replog's Kafka listener on real broker processes:
confluent-kafka (librdkafka), kafka-python and kcat produce to and consume from a cluster of
three brokers, with every compression codec, keys, headers and timestamps, and read what
replog's own client wrote (and the other way round)."""

from __future__ import annotations

import datetime
import io
import shutil
import socket
import struct
import subprocess
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer

from replication import protocol as p
from replication.client import Producer as ReplogProducer
from replication.common import TopicPartition
from replication.kafka.wire import response_class
from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.readback import confluent_read_count, read_to_end
from tests.wire import RawConnection

pytestmark = pytest.mark.cluster

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
#: a fixed CreateTime in the past (2023-11-14), so that timestamps cannot come from the broker
BASE_TIMESTAMP = 1_700_000_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("kafka-clients"), brokers=3, kafka=True).start()
    yield c
    c.stop()


def create_topic(cluster: Cluster, partitions: int = 3, replication: int = 3) -> str:
    """A new topic, created through the Kafka listener, with a leader for every partition."""
    topic = unique_name("kafka")
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(
                topic,
                partitions,
                replication,
                config={"min.insync.replicas": str(min(2, replication))},
            )
        ]
    )
    futures[topic].result(timeout=60)

    wait_known(cluster, topic, partitions)
    return topic


def wait_known(cluster: Cluster, topic: str, partitions: int) -> None:
    """Wait until every broker knows ``topic`` with ``partitions`` partitions and their leaders.

    Each broker learns of a change from the cluster metadata on its own (as Kafka's do), and
    a Kafka client may ask any of them: ask every one, on its own connection."""

    def ready() -> bool:
        for broker in cluster.brokers.values():
            with RawConnection(broker.bootstrap) as conn:
                response = conn.request(
                    p.ApiKey.METADATA,
                    p.MetadataRequest(topics=[p.MetadataRequestTopic(name=topic)]),
                )
            (info,) = response.topics
            if info.error_code or len(info.partitions) != partitions:
                return False
            if any(part.leader_id < 0 for part in info.partitions):
                return False
        return True

    wait_until(ready, timeout=60, message=f"every broker knows {topic} and its leaders")


def sample(n: int) -> list[tuple[bytes, bytes | None, list[tuple[str, bytes | None]], int]]:
    """(key, value, headers, timestamp) records, with a null value and header value among them."""
    out: list[tuple[bytes, bytes | None, list[tuple[str, bytes | None]], int]] = []
    for i in range(n):
        value = None if i % 97 == 13 else (f"value-{i}-" * 8).encode()
        headers: list[tuple[str, bytes | None]] = [("i", str(i).encode()), ("h2", None)]
        out.append((f"key-{i}".encode(), value, headers if i % 3 else [], BASE_TIMESTAMP + i))
    return out


def as_tuples(messages: list[Any]) -> set[Any]:
    return {(m.key(), m.value(), tuple(m.headers() or ()), m.timestamp()[1]) for m in messages}


def expected(records: list[Any]) -> set[Any]:
    return {(k, v, tuple(h), ts) for k, v, h, ts in records}


# --- confluent-kafka ---------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_produces_and_consumes_with_every_codec(
    cluster: Cluster, codec: str
) -> None:
    topic = create_topic(cluster)
    records: list[Any] = sample(600)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": codec,
            "linger.ms": 5,
        }
    )
    delivered: dict[Any, Any] = {}
    failed: list[Any] = []

    def on_delivery(err: Any, message: Any) -> None:
        if err is not None:
            failed.append(err)
        else:
            delivered[(message.partition(), message.offset())] = message.key()

    for key, value, headers, ts in records:
        producer.produce(
            topic, value=value, key=key, headers=headers, timestamp=ts, on_delivery=on_delivery
        )
    assert producer.flush(60) == 0
    assert failed == []
    assert len(delivered) == len(records)

    messages = confluent_read_count(
        {"bootstrap.servers": cluster.kafka_bootstrap}, topic, 3, len(records)
    )
    assert len(messages) == len(records)
    assert as_tuples(messages) == expected(records)
    # every record is where its delivery report said, and offsets are dense from 0
    assert {(m.partition(), m.offset()): m.key() for m in messages} == delivered
    for partition in range(3):
        offsets = sorted(m.offset() for m in messages if m.partition() == partition)
        assert offsets == list(range(len(offsets)))


# --- kafka-python ------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_produces_and_consumes_with_every_codec(cluster: Cluster, codec: str) -> None:
    topic = create_topic(cluster)
    # kafka-python takes no null header values
    records: list[Any] = [
        (k, v, [(hk, hv if hv is not None else b"") for hk, hv in h], ts)
        for k, v, h, ts in sample(300)
    ]
    producer = kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap,
        acks="all",
        compression_type=None if codec == "none" else codec,
        linger_ms=5,
    )
    futures = [
        producer.send(topic, value=value, key=key, headers=headers, timestamp_ms=ts)
        for key, value, headers, ts in records
    ]
    producer.flush(60)
    metadata = [f.get(timeout=30) for f in futures]
    producer.close()
    assert len({(m.partition, m.offset) for m in metadata}) == len(records)

    consumer = kafka.KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=20_000,
    )
    consumer.assign([kafka.TopicPartition(topic, p) for p in range(3)])
    got = []
    for message in consumer:
        got.append(message)
        if len(got) == len(records):
            break
    consumer.close()
    assert {(m.key, m.value, tuple(m.headers), m.timestamp) for m in got} == expected(records)


# --- kcat --------------------------------------------------------------------------------------


def kcat() -> str:
    path = shutil.which("kcat") or shutil.which("kafkacat")
    assert path, "kcat is not installed: install Debian's kcat package (apt-get install kcat)"
    return path


@pytest.mark.parametrize("codec", CODECS)
def test_kcat_produces_and_consumes_with_every_codec(
    cluster: Cluster, codec: str, tmp_path: Path
) -> None:
    topic = create_topic(cluster)
    lines = [f"key-{i}\tvalue-{i}" for i in range(200)]
    produced = subprocess.run(
        [
            kcat(),
            "-P",
            "-b",
            cluster.kafka_bootstrap,
            "-t",
            topic,
            "-K",
            "\t",
            "-z",
            codec,
            "-H",
            "source=kcat",
            "-X",
            "acks=all",
        ],
        input="\n".join(lines) + "\n",
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(
        [
            kcat(),
            "-C",
            "-b",
            cluster.kafka_bootstrap,
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-f",
            "%k\t%s\t%h\n",
        ],
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert consumed.returncode == 0, consumed.stderr
    got = sorted(line for line in consumed.stdout.splitlines() if line)
    assert got == sorted(f"{line}\tsource=kcat" for line in lines)


def test_kcat_lists_the_brokers_kafka_listeners(cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=2)
    listed = subprocess.run(
        [kcat(), "-L", "-b", cluster.kafka_bootstrap, "-t", topic],
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    for broker in cluster.brokers.values():
        assert f"broker {broker.broker_id} at 127.0.0.1:{broker.kafka_port}" in listed.stdout
    assert f'topic "{topic}" with 2 partitions' in listed.stdout


# --- both protocols ----------------------------------------------------------------------------


def test_replog_reads_what_a_kafka_client_wrote(cluster: Cluster) -> None:
    topic = create_topic(cluster)
    records: list[Any] = sample(300)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all", "compression.type": "lz4"}
    )
    for key, value, headers, ts in records:
        producer.produce(topic, value=value, key=key, headers=headers, timestamp=ts)
    assert producer.flush(60) == 0
    read = read_to_end(cluster.bootstrap, [TopicPartition(topic, p) for p in range(3)])
    got = {(r.key, r.value, tuple(r.headers), r.timestamp) for r in read.records}
    assert got == expected(records)


def test_a_kafka_client_reads_what_replog_wrote(cluster: Cluster) -> None:
    topic = create_topic(cluster)
    records = sample(300)
    with ReplogProducer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        futures = [
            producer.send(topic, value=value, key=key, headers=headers, timestamp=ts)
            for key, value, headers, ts in records
        ]
        offsets = {(f.result(30).partition, f.result(30).offset) for f in futures}
    messages = confluent_read_count(
        {"bootstrap.servers": cluster.kafka_bootstrap}, topic, 3, len(records)
    )
    assert len(messages) == len(records)
    assert as_tuples(messages) == expected(records)
    assert {(m.partition(), m.offset()) for m in messages} == offsets


# --- admin -------------------------------------------------------------------------------------


def test_kafka_admin_describes_the_cluster_and_configs_grows_topics_and_deletes_records(
    cluster: Cluster,
) -> None:
    topic = create_topic(cluster, partitions=2)
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})

    described = admin.describe_cluster(request_timeout=30).result(30)
    assert sorted((n.id, n.port) for n in described.nodes) == sorted(
        (b.broker_id, b.kafka_port) for b in cluster.brokers.values()
    )
    assert described.cluster_id

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["min.insync.replicas"].value == "2"  # the topic's own
    assert configs["retention.ms"].value is not None  # the broker's default
    assert not configs["min.insync.replicas"].is_default

    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    wait_known(cluster, topic, 4)
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_PARTITIONS"):
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"}
    )
    failed: list[Any] = []

    def on_delivery(err: Any, message: Any) -> None:
        if err is not None:
            failed.append(err)

    for i in range(40):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 4, on_delivery=on_delivery)
    assert producer.flush(60) == 0
    assert failed == []
    deleted = admin.delete_records([confluent_kafka.TopicPartition(topic, 3, 4)])
    (result,) = deleted.values()
    assert result.result(30).low_watermark == 4
    messages = confluent_read_count(
        {"bootstrap.servers": cluster.kafka_bootstrap}, topic, 4, 36
    )
    assert len(messages) == 36
    assert min(m.offset() for m in messages if m.partition() == 3) == 4
    assert {m.partition() for m in messages} == {0, 1, 2, 3}


def test_zstd_on_produce_before_v7_is_refused_as_kafka_refuses_it(cluster: Cluster) -> None:
    """KIP-110: zstd batches need Produce v7; older versions get UNSUPPORTED_COMPRESSION_TYPE."""
    topic = create_topic(cluster, partitions=1, replication=1)
    records = _kafka_batch([(b"k", b"v" * 100)], compression_type=4)
    leader = cluster.brokers[_leader(cluster, topic)]
    for version, expected_code in ((6, 76), (7, 0)):
        partition = _produce(leader.kafka_port, version, topic, records)
        assert partition.error_code.value == expected_code


def test_a_retried_idempotent_batch_is_answered_as_kafka_answers_it(cluster: Cluster) -> None:
    """As Kafka's ProducerStateEntry.findDuplicateBatch and ProducerAppendInfo.checkSequence: a
    retry of one of a producer's last 5 batches is answered NONE with the base offset of the
    original (so a client such as librdkafka reports that offset) and appended nothing; a
    retry of an older batch, and a gap, are OUT_OF_ORDER_SEQUENCE_NUMBER."""
    topic = create_topic(cluster, partitions=1)
    port = cluster.brokers[_leader(cluster, topic)].kafka_port
    init_cls: Any = load_request_schema(22, 1)
    init = _kafka_request(
        port, 22, 1, init_cls(transactional_id=None, transaction_timeout=datetime.timedelta(0))
    )
    assert init.error_code.value == 0

    def produce(sequence: int) -> tuple[int, int]:
        """Send the batch of records ``sequence`` and ``sequence + 1``: (error code, base
        offset)."""
        records = _kafka_batch(
            [(None, b"a"), (None, b"b")],
            producer_id=init.producer_id,
            producer_epoch=init.producer_epoch,
            base_sequence=sequence,
        )
        part = _produce(port, 9, topic, records)
        return part.error_code.value, part.base_offset

    assert [produce(2 * n) for n in range(7)] == [(0, 2 * n) for n in range(7)]
    # the last 5 batches are sequences 4..13: any of them again is its original
    assert produce(4) == (0, 4)
    assert produce(12) == (0, 12)
    out_of_order = 45
    assert produce(2)[0] == out_of_order  # an older batch: Kafka keeps 5 too
    assert produce(16)[0] == out_of_order  # a gap: 14 is next
    assert produce(14) == (0, 14)  # the duplicates appended nothing


def _kafka_batch(
    records: list[tuple[bytes | None, bytes]],
    *,
    compression_type: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """One Kafka RecordBatch v2 of (key, value) records, as kafka-python builds it."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression_type,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp=BASE_TIMESTAMP, key=key, value=value, headers=[])
    return bytes(builder.build())


def _produce(port: int, version: int, topic: str, records: bytes) -> Any:
    """Produce ``records`` to partition 0 of ``topic`` (acks=all): the partition's response."""
    request_cls: Any = load_request_schema(0, version)
    body = request_cls(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            _topic_cls(request_cls)(
                name=topic,
                partition_data=(_partition_cls(request_cls)(index=0, records=records),),
            ),
        ),
    )
    (partition,) = _kafka_request(port, 0, version, body).responses[0].partition_responses
    return partition


def _topic_cls(request_cls: Any) -> Any:
    return typing.get_type_hints(request_cls)["topic_data"].__args__[0]


def _partition_cls(request_cls: Any) -> Any:
    return typing.get_type_hints(_topic_cls(request_cls))["partition_data"].__args__[0]


def _leader(cluster: Cluster, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    return int(admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader)


def _kafka_request(port: int, api_key: int, version: int, body: Any) -> Any:
    """One Kafka request on a new connection, encoded and decoded with kio."""
    request_cls = type(body)
    header_cls = request_cls.__header_schema__
    out = io.BytesIO()
    entity_writer(header_cls)(
        out,
        header_cls(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=7,
            client_id="test",
        ),
    )
    entity_writer(request_cls)(out, body)
    frame = out.getvalue()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _recv(sock, 4))[0]
        data = _recv(sock, size)
    response_cls: Any = response_class(api_key, version)
    header, offset = entity_reader(response_cls.__header_schema__)(data, 0)
    assert header.correlation_id == 7
    return entity_reader(response_cls)(data, offset)[0]


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return data


def test_offsets_for_times_and_the_ends_of_a_partition(cluster: Cluster) -> None:
    """ListOffsets through a Kafka client: by timestamp, earliest and latest."""
    topic = create_topic(cluster, partitions=1)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"}
    )
    for i in range(200):
        producer.produce(topic, value=f"v{i}".encode(), timestamp=BASE_TIMESTAMP + 10 * i)
    assert producer.flush(60) == 0
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": unique_name("g")}
    )
    try:
        wanted = [confluent_kafka.TopicPartition(topic, 0, BASE_TIMESTAMP + 10 * 57 - 5)]
        (found,) = consumer.offsets_for_times(wanted, 30)
        assert found.offset == 57  # the first record at or after the timestamp
        (beyond,) = consumer.offsets_for_times(
            [confluent_kafka.TopicPartition(topic, 0, BASE_TIMESTAMP + 10_000)], 30
        )
        assert beyond.offset == -1  # none that late: Kafka's "no offset" (end)
        low, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), 30)
        assert (low, high) == (0, 200)
    finally:
        consumer.close()
