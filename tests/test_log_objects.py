"""DescribeLogObjects (1003) over real broker processes: every replica (leader or follower)
names the objects that hold a partition's offsets on its storage, and the bytes at those
extents read back as the partition's batches (what Spark's planner relies on instead of
listing storage)."""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import Any

import pytest

from benchmarks.s3_counter import CountingMotoServer
from datasource.options import parse_source_options
from datasource.partitions import OffsetRangePartition, ReplicaLocation
from datasource.planner import Planner
from datasource.reader import read_partition
from logstore.batch import iter_batches
from logstore.reader import ObjectExtent, SegmentObject
from logstore.storage import Storage
from replication.client import Admin, Producer, TopicPartition
from replication.client.admin import LogObjects
from replication.errors import (
    InvalidRequestError,
    ReplogError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from replication.protocol import (
    ApiKey,
    DescribeLogObjectsPartition,
    DescribeLogObjectsRequest,
    DescribeLogObjectsTopic,
    decode_response,
    encode_response,
)
from tests.cluster import Cluster
from tests.conftest import _DUMMY_AWS_ENV
from tests.helpers import free_port, unique_name, wait_until
from tests.proxy import TcpProxy

pytestmark = [pytest.mark.cluster]

N = 600  # records per partition

#: the storage layouts the brokers are run with: segment objects per partition, or the broker
#: WAL with compaction held off (every extent an L0 chunk)
LAYOUTS = pytest.mark.parametrize(
    "layout",
    [
        pytest.param({"log.wal.enable": "false"}, id="segments"),
        pytest.param(
            {"log.wal.enable": "true", "wal.compaction.l0.max.age.ms": "3600000"}, id="wal"
        ),
    ],
)


def _produce(bootstrap: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """N values per partition, sent in several flushes (so each log has several objects)."""
    sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=0) as producer:
        for round_ in range(6):
            futures = []
            for p in range(partitions):
                for i in range(N // 6):
                    value = b"%d-%d-%d" % (p, round_, i)
                    sent[p].append(value)
                    futures.append(producer.send(topic, value=value, partition=p))
            for future in futures:
                future.result(timeout=60)
    return sent


def _records_at(storage: Storage, found: LogObjects) -> list[tuple[int, bytes]]:
    """The (offset, value) pairs in the extents' bytes, every batch CRC-checked, checking that
    the extents follow one another and hold exactly the batches they claim."""
    out: list[tuple[int, bytes]] = []
    expected = found.extents[0].base_offset if found.extents else 0
    for extent in found.extents:
        assert extent.base_offset == expected, found.extents
        assert storage.exists(extent.path), extent
        data = storage.read_range(extent.path, extent.position, extent.position + extent.size)
        assert len(data) == extent.size, extent
        batches = list(iter_batches(data, validate=True))
        assert sum(b.size_in_bytes for b in batches) == extent.size
        assert batches[0].base_offset == extent.base_offset
        assert batches[-1].next_offset == extent.next_offset
        for batch in batches:
            values = batch.to_arrow().column(1).to_pylist()
            out.extend(zip(range(batch.base_offset, batch.next_offset), values, strict=True))
        expected = extent.next_offset
    return out


def _led(admin: Admin, topic: str) -> bool:
    try:
        described = admin.describe_topic(topic)
    except UnknownTopicOrPartitionError:
        return False  # a broker that has not seen the new metadata yet
    return all(p.leader >= 0 for p in described.partitions)


def _durable(admin: Admin, broker: int, tps: list[TopicPartition]) -> dict[TopicPartition, Any]:
    found = admin.describe_log_objects(broker, dict.fromkeys(tps, (0, -1)))
    if all(isinstance(f, LogObjects) and f.durable_end_offset == N for f in found.values()):
        return found
    return {}


@LAYOUTS
def test_every_replica_names_objects_whose_bytes_are_the_partitions_batches(
    cluster_factory: Any, layout: dict[str, str]
) -> None:
    cluster: Cluster = cluster_factory(brokers=3, overrides=layout)
    topic = unique_name("objects")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topic(topic, 2, 3)
        wait_until(lambda: _led(admin, topic), message=f"leaders of {topic}")
        sent = _produce(cluster.bootstrap, topic, 2)
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        leaders = {p.partition: p.leader for p in admin.describe_topic(topic).partitions}
        for broker_id in cluster.brokers:
            answers = wait_until(
                lambda b=broker_id: _durable(admin, b, tps),
                message=f"broker {broker_id} durable to {N}",
            )
            for tp, found in answers.items():
                assert isinstance(found, LogObjects)
                storage = Storage.from_url(found.log_dir, fsync=False)
                assert found.log_dir == cluster.brokers[broker_id].log_dir
                assert found.log_start_offset == 0
                assert len(found.extents) >= 2  # several flushes: several objects
                if layout["log.wal.enable"] == "true":  # chunks of the WAL objects, shared
                    assert all(e.path.startswith("_replog/wal/L0/") for e in found.extents)
                    assert not any(e.is_segment for e in found.extents)
                else:
                    assert all(e.is_segment for e in found.extents)
                    assert all(e.path.startswith(f"{topic}/{tp.partition}/") for e in found.extents)
                records = _records_at(storage, found)
                role = "leader" if leaders[tp.partition] == broker_id else "follower"
                assert records == list(enumerate(sent[tp.partition])), f"{role} {broker_id}"
            # A range inside the log: only the extents overlapping it, the first holding its
            # start and the last its end.
            middle = admin.describe_log_objects(broker_id, {tps[0]: (N // 3, N // 2)})[tps[0]]
            assert isinstance(middle, LogObjects)
            whole = answers[tps[0]].extents
            assert middle.extents == tuple(
                e for e in whole if e.next_offset > N // 3 and e.base_offset < N // 2
            )
            assert middle.extents[0].base_offset <= N // 3 < middle.extents[0].next_offset
            assert middle.extents[-1].base_offset < N // 2 <= middle.extents[-1].next_offset
            # Past the end: nothing (never an extent beyond what storage holds).
            beyond = admin.describe_log_objects(broker_id, {tps[0]: (N, N + 50)})[tps[0]]
            assert isinstance(beyond, LogObjects)
            assert beyond.extents == ()

        # Errors per partition, named: an unknown partition, a range that is not one.
        broker_id = leaders[0]
        errors = admin.describe_log_objects(broker_id, {(topic, 7): (0, -1), tps[0]: (0, 10)})
        assert isinstance(errors[TopicPartition(topic, 7)], UnknownTopicOrPartitionError)
        assert isinstance(errors[tps[0]], LogObjects)
        with pytest.raises(ValueError, match=r"\[5, 2\) of .*-0 is not a range"):
            admin.describe_log_objects(broker_id, {tps[0]: (5, 2)})
        conn = admin._cluster.connection(broker_id)
        raw = conn.send(
            ApiKey.DESCRIBE_LOG_OBJECTS,
            0,
            DescribeLogObjectsRequest(
                topics=[
                    DescribeLogObjectsTopic(
                        name=topic,
                        partitions=[
                            DescribeLogObjectsPartition(
                                partition_index=0, start_offset=9, end_offset=3
                            )
                        ],
                    )
                ]
            ),
        )
        answer = raw.topics[0].partitions[0]
        assert answer.error_code == InvalidRequestError.code
        assert "[9, 3)" in answer.error_message
        assert "0 <= start <= end" in answer.error_message


# --- Spark's planner and executors over DescribeLogObjects (no Spark needed) -----------------


def _plan(bootstrap: str, topic: str, end: int, **extra: str) -> list[OffsetRangePartition]:
    """The input partitions of ``[0, end)`` of both partitions; asserts the planner touched no
    storage (its only storage access is listing a replica's segment objects)."""
    opts = parse_source_options(
        {"bootstrap.servers": bootstrap, "subscribe": topic, "read.mode": "direct", **extra},
        streaming=False,
    )
    planner = Planner(opts)
    try:
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        planned = planner.plan(dict.fromkeys(tps, 0), dict.fromkeys(tps, end))
        assert planner._readers == {}  # no SegmentReader opened: nothing listed
    finally:
        planner.close()
    return planned


def _read(partition: OffsetRangePartition) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for batch in read_partition(partition):
        out.extend(
            zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True)
        )
    return out


@LAYOUTS
def test_planner_cuts_at_described_extents_and_executors_read_them(
    cluster_factory: Any, layout: dict[str, str]
) -> None:
    cluster: Cluster = cluster_factory(brokers=3, overrides=layout)
    topic = unique_name("planned")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topic(topic, 2, 3)
        wait_until(lambda: _led(admin, topic), message=f"leaders of {topic}")
        sent = _produce(cluster.bootstrap, topic, 2)
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        for broker_id in cluster.brokers:
            wait_until(lambda b=broker_id: _durable(admin, b, tps), message=f"{broker_id} durable")
    planned = _plan(cluster.bootstrap, topic, N, minPartitions="6")
    assert len(planned) >= 6
    by_partition: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    for piece in planned:
        held = [o for o in piece.objects if isinstance(o, ObjectExtent)]
        assert held
        assert len(held) == len(piece.objects)  # extents, not a listing
        # cut at extent boundaries or inside one; every extent named overlaps the piece
        assert held[0].base_offset <= piece.start
        assert held[-1].next_offset >= piece.end
        assert all(o.next_offset > piece.start and o.base_offset < piece.end for o in held)
        by_partition[piece.partition].extend(_read(piece))
    for p in (0, 1):
        assert sorted(by_partition[p]) == list(enumerate(sent[p]))

    # A stale hint (the object named is gone: compacted and deleted since planning): the
    # executor asks the replica's broker again and reads on, in direct mode.
    piece = next(q for q in planned if q.partition == 0 and len(q.objects) > 1)
    extents = [o for o in piece.objects if isinstance(o, ObjectExtent)]
    gone = tuple(replace(o, path=o.path + ".gone") for o in extents)
    only_first = replace(piece, replicas=piece.replicas[:1])
    assert _read(replace(only_first, objects=gone)) == _read(piece)
    # The first replica unreadable here: the next one's broker says where its own copy is.
    first = piece.replicas[0]
    elsewhere = ReplicaLocation(first.broker_id, first.log_dir + "-moved")
    assert len(piece.replicas) == 3
    moved = replace(piece, replicas=(elsewhere, *piece.replicas[1:]))
    assert _read(moved) == _read(piece)
    # ... and with no other replica, direct mode fails naming the cause.
    alone = replace(moved, replicas=(elsewhere,))
    with pytest.raises(ReplogError, match=r"\.gone|-moved"):
        _read(replace(alone, objects=gone))


class OlderBroker(TcpProxy):
    """A real broker shown the way a replog without DescribeLogObjects shows itself: its
    ApiVersions answers, relayed through this proxy, leave API 1003 out."""

    def __init__(self, target_port: int, listen_port: int) -> None:
        super().__init__("127.0.0.1", target_port, listen_port)
        self._asked: dict[tuple[int, int], int] = {}  # (connection, correlation id) -> version

    def _record_request(self, conn: Any, frame: bytes) -> None:
        super()._record_request(conn, frame)
        api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
        if api_key == ApiKey.API_VERSIONS:
            self._asked[(conn.id, correlation_id)] = version

    def _send(self, conn: Any, sock: Any, data: bytes) -> None:
        if sock is conn.client and len(data) >= 8:
            (correlation_id,) = struct.unpack_from(">i", data, 4)
            version = self._asked.pop((conn.id, correlation_id), None)
            if version is not None:
                _, answer = decode_response(data[4:], ApiKey.API_VERSIONS, version)
                kept = [k for k in answer.api_keys if k.api_key != ApiKey.DESCRIBE_LOG_OBJECTS]
                answer = replace(answer, api_keys=kept)
                data = encode_response(correlation_id, ApiKey.API_VERSIONS, version, answer)
        super()._send(conn, sock, data)


def test_a_broker_without_describe_log_objects_is_listed_instead(broker_factory: Any) -> None:
    broker_port, relay_port = free_port(), free_port()
    with OlderBroker(broker_port, relay_port) as relay:
        b = broker_factory(
            port=broker_port,
            overrides={
                "advertised.listeners": f"REPLOG://127.0.0.1:{relay_port}",
                # a replog without DescribeLogObjects has no WAL either: segment objects only
                "log.wal.enable": "false",
            },
        )
        topic = unique_name("older")
        bootstrap = relay.address
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topic(topic, 2, 1)
            wait_until(lambda: _led(admin, topic), message=f"leaders of {topic}")
            with pytest.raises(UnsupportedVersionError, match="does not support"):
                admin.describe_log_objects(0, {(topic, 0): (0, -1)})
        sent = _produce(bootstrap, topic, 2)
        opts = parse_source_options(
            {"bootstrap.servers": bootstrap, "subscribe": topic, "read.mode": "direct"},
            streaming=False,
        )
        planner = Planner(opts)
        try:
            tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
            planned = planner.plan(dict.fromkeys(tps, 0), dict.fromkeys(tps, N))
            assert len(planner._readers) == 2  # each partition's segment objects were listed
            assert planner._no_log_objects == {0}
        finally:
            planner.close()
        assert b.alive
    assert all(r.api_key != ApiKey.DESCRIBE_LOG_OBJECTS for r in relay.requests)
    got: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    for piece in planned:
        assert piece.objects
        assert all(isinstance(o, SegmentObject) for o in piece.objects)
        got[piece.partition].extend(_read(piece))
    assert got == {p: list(enumerate(sent[p])) for p in (0, 1)}


@pytest.mark.s3
@LAYOUTS
def test_planning_on_s3_issues_no_list_request(broker_factory: Any, layout: dict[str, str]) -> None:
    """Counted at the S3 endpoint (moto behind benchmarks/s3_counter.py's counter): planning a
    direct read asks the broker, and LISTs nothing; the listing path it replaces LISTs once per
    partition (what cost 1,000 LIST/s at 1,000 partitions and a trigger a second)."""
    import boto3

    with pytest.MonkeyPatch.context() as mp:
        for name, value in _DUMMY_AWS_ENV.items():
            mp.setenv(name, value)
        with CountingMotoServer() as s3:
            bucket = unique_name("planning")
            boto3.client("s3", endpoint_url=s3.endpoint).create_bucket(Bucket=bucket)
            b = broker_factory(
                log_dir=f"s3://{bucket}/broker-0",
                overrides={"storage.endpoint.url": s3.endpoint, **layout},
            )
            topic = unique_name("planned")
            with Admin(bootstrap_servers=b.bootstrap) as admin:
                admin.create_topic(topic, 2, 1)
                wait_until(lambda: _led(admin, topic), message=f"leaders of {topic}")
                sent = _produce(b.bootstrap, topic, 2)
                tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
                wait_until(lambda: _durable(admin, 0, tps), message="durable")
            opts = parse_source_options(
                {
                    "bootstrap.servers": b.bootstrap,
                    "subscribe": topic,
                    "read.mode": "direct",
                    "storage.endpoint_url": s3.endpoint,
                    # Its own key (moto takes any): the broker's background requests to the
                    # same endpoint (merges, WAL cleanup) are not counted against the planner.
                    "storage.key": "planner",
                    "storage.secret": "testing",
                },
                streaming=False,
            )
            ends = dict.fromkeys(tps, N)
            planner = Planner(opts)

            def lists() -> int:
                mine = s3.counts_by_access_key().get("planner")
                return mine["LIST"]["requests"] if mine else 0

            try:
                s3.reset()
                planned = planner.plan(dict.fromkeys(tps, 0), ends)
                described = lists()
                # The way before (an older broker): one LIST per partition.
                planner._no_log_objects.add(0)
                s3.reset()
                listed = planner.plan(dict.fromkeys(tps, 0), ends)
                listing = lists()
            finally:
                planner.close()
            assert described == 0
            assert listing >= 2
            assert all(isinstance(o, ObjectExtent) for q in planned for o in q.objects)
            assert all(isinstance(o, SegmentObject) for q in listed for o in q.objects)
            got: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
            for piece in planned:
                got[piece.partition].extend(_read(piece))
            assert got == {p: list(enumerate(sent[p])) for p in (0, 1)}
