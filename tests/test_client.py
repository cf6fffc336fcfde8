"""The client library: partitioner, config, accumulator, futures, fetch decoding, and the wire
behaviour against a scripted in-process broker (unit). Against a real broker:
tests/test_client_broker.py."""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import random
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from logstore.batch import (
    Compression,
    ControlType,
    Record,
    TimestampType,
    build,
    build_control,
    iter_batches,
)
from replication import protocol as p
from replication.client import (
    FETCH_SCHEMA,
    Admin,
    ClientClosedError,
    Consumer,
    ConsumerConfig,
    NoOffsetForPartitionError,
    PartitionNotAssignedError,
    Producer,
    ProducerConfig,
    RecordBatchMetadata,
    RecordMetadata,
    TopicPartition,
)
from replication.client.accumulator import RecordAccumulator
from replication.client.config import load, parse_bootstrap
from replication.client.connection import BrokerConnection
from replication.client.fetcher import decode_fetched
from replication.client.futures import ProduceFuture, complete_all, fail_all
from replication.client.partitioner import (
    KeyHashCache,
    murmur2,
    murmur2_arrow,
    partition_for_key,
    partitions_for_keys,
)
from replication.errors import (
    BrokerUnreachableError,
    ConfigError,
    CorruptFrameError,
    CorruptRecordError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from tests.helpers import free_port, wait_until

# --- murmur2 and the partitioner ----------------------------------------------------------------

#: Kafka's UtilsTest.testMurmur2, plus values other ports check against Kafka (Akka's
#: Murmur2Spec) and murmur2(b"") from the spec of this client.
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"1": -1993445489,
    b"12": 126087238,
    b"123": -267702483,
    b"1234": -1614185708,
    b"12345": -1188365604,
    b"": 275646681,
}


@pytest.mark.unit
@pytest.mark.parametrize(("key", "expected"), list(KAFKA_MURMUR2.items()))
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.unit
def test_partition_for_key_is_to_positive_mod() -> None:
    for key, h in KAFKA_MURMUR2.items():
        for n in (1, 3, 7, 100):
            assert partition_for_key(key, n) == (h & 0x7FFFFFFF) % n
    cache = KeyHashCache(size=2)
    for key in [b"a", b"b", b"c", b"a", b"21"] * 2:
        assert cache.partition(key, 7) == partition_for_key(key, 7)


@pytest.mark.unit
def test_murmur2_arrow_matches_scalar() -> None:
    rng = random.Random(7)
    keys: list[bytes | None] = [rng.randbytes(rng.randrange(0, 70)) for _ in range(500)]
    keys += [None, b"", *KAFKA_MURMUR2]
    column = pa.array(keys, pa.binary())
    expected = [murmur2(k or b"") & 0xFFFFFFFF for k in keys]
    assert murmur2_arrow(column).to_pylist() == expected
    # Sliced (non-zero offset), chunked and string input.
    assert murmur2_arrow(column.slice(10, 50)).to_pylist() == expected[10:60]
    chunked = pa.chunked_array([column.slice(0, 100), column.slice(100)])
    assert murmur2_arrow(chunked).to_pylist() == expected
    text = pa.array(["user-1", "user-22", "üñí"])
    assert murmur2_arrow(text).to_pylist() == [
        murmur2(s.encode()) & 0xFFFFFFFF for s in ["user-1", "user-22", "üñí"]
    ]
    assert partitions_for_keys(column, 13).to_pylist() == [
        partition_for_key(k or b"", 13) for k in keys
    ]
    assert murmur2_arrow(pa.array([], pa.binary())).to_pylist() == []


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.unit
def test_producer_config_defaults_and_names() -> None:
    config = load(ProducerConfig, {"bootstrap.servers": "h:1"}, {})
    assert config.acks == -1
    assert config.linger_ms == 5
    assert config.batch_size == 1024 * 1024
    assert config.compression_type == "none"
    assert config.max_in_flight_requests_per_connection == 1
    assert config.bootstrap == [("h", 1)]
    merged = load(
        ProducerConfig,
        {"bootstrap.servers": "a:1", "acks": "1"},
        {"bootstrap_servers": "PLAINTEXT://b:2,[::1]:3", "linger_ms": "20", "acks": "all"},
    )
    assert merged.bootstrap == [("b", 2), ("::1", 3)]
    assert merged.linger_ms == 20
    assert merged.acks == -1
    for value, expected in (("0", 0), (1, 1), ("-1", -1), ("ALL", -1)):
        assert (
            load(ProducerConfig, {"bootstrap.servers": "h:1", "acks": value}, {}).acks == expected
        )
    assert load(ProducerConfig, {}, {"bootstrap_servers": ["a:1", "b:2"]}).bootstrap == [
        ("a", 1),
        ("b", 2),
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "bootstrap.servers is required"),
        ({"bootstrap.servers": "nohost"}, "is not host:port"),
        ({"bootstrap.servers": "h:99999"}, "bad port"),
        ({"bootstrap.servers": "h:1", "acks": "2"}, "acks"),
        ({"bootstrap.servers": "h:1", "acks": "some"}, "expected all, -1, 0 or 1"),
        ({"bootstrap.servers": "h:1", "compression.type": "gzip"}, "gzip and snappy"),
        ({"bootstrap.servers": "h:1", "compression.type": "brotli"}, "none, lz4, zstd"),
        ({"bootstrap.servers": "h:1", "linger.ms": "soon"}, "linger.ms"),
        ({"bootstrap.servers": "h:1", "batch.size": 0}, "batch.size"),
        ({"bootstrap.servers": "h:1", "enable.idempotence": "true", "acks": "1"}, "acks=all"),
        ({"bootstrap.servers": "h:1", "transactional.id": "t", "enable.idempotence": 0}, "needs"),
        ({"bootstrap.servers": "h:1", "enable.idempotence": "maybe"}, "enable.idempotence"),
        ({"bootstrap.servers": "h:1", "delivery.timeout.ms": 10}, r"linger.ms \+ request.timeout"),
    ],
)
def test_producer_config_errors_name_the_key(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(ProducerConfig, values, {})


@pytest.mark.unit
def test_consumer_config() -> None:
    config = load(ConsumerConfig, {}, {"bootstrap_servers": "h:1"})
    assert config.isolation_level == "read_uncommitted"
    assert config.auto_offset_reset == "latest"
    assert not config.read_committed
    config = load(
        ConsumerConfig,
        {"bootstrap.servers": "h:1", "isolation.level": "READ_COMMITTED"},
        {"auto_offset_reset": "earliest"},
    )
    assert config.read_committed
    assert config.auto_offset_reset == "earliest"
    with pytest.raises(ConfigError, match=r"isolation\.level.*read_uncommitted, read_committed"):
        load(ConsumerConfig, {"bootstrap.servers": "h:1", "isolation.level": "dirty"}, {})
    with pytest.raises(ConfigError, match=r"auto\.offset\.reset"):
        load(ConsumerConfig, {"bootstrap.servers": "h:1", "auto.offset.reset": "smallest"}, {})
    with pytest.raises(ConfigError, match=r"group\.id: give a non-empty group id"):
        Consumer({"bootstrap.servers": "h:1", "group.id": ""})
    with pytest.raises(ConfigError, match=r"partition\.assignment\.strategy='sticky'"):
        load(
            ConsumerConfig,
            {"bootstrap.servers": "h:1", "partition.assignment.strategy": "sticky"},
            {},
        )
    with pytest.raises(ConfigError, match=r"heartbeat\.interval\.ms=9000 must be below"):
        load(
            ConsumerConfig,
            {"bootstrap.servers": "h:1", "heartbeat.interval.ms": 9000, "session.timeout.ms": 6000},
            {},
        )
    assert parse_bootstrap(" a:1 , b:2 ") == [("a", 1), ("b", 2)]


# --- futures ------------------------------------------------------------------------------------


@pytest.mark.unit
def test_produce_futures_behave_as_futures() -> None:
    condition = threading.Condition()
    futures = [ProduceFuture(condition) for _ in range(50)]
    seen: list[int] = []
    futures[3].add_done_callback(lambda f: seen.append(f.result().offset))
    assert not futures[0].cancel()
    assert not futures[0].done()
    with pytest.raises(concurrent.futures.TimeoutError):
        futures[0].result(timeout=0.01)
    results: list[Any] = []
    waiters = [
        threading.Thread(target=lambda f=f: results.append(f.result(timeout=10)))
        for f in futures[:5]
    ]
    for t in waiters:
        t.start()

    def finish() -> None:
        wait_until(lambda: len(condition._waiters) >= 5, timeout=10)  # type: ignore[attr-defined]
        complete_all(futures[:25], [RecordMetadata("t", 0, i, 0) for i in range(25)])
        fail_all(futures[25:], RecordTooLargeError("too big"))

    finisher = threading.Thread(target=finish)
    finisher.start()
    done, _ = concurrent.futures.wait(futures, timeout=10)
    finisher.join(10)
    assert len(done) == 50
    # typeshed's as_completed wants a settable ``_waiters``; ProduceFuture's is a property
    # (created on first use), and as_completed only appends to it.
    completed: list[Any] = list(
        concurrent.futures.as_completed(futures, timeout=10)  # type: ignore[arg-type]
    )
    assert len(completed) == 50
    for t in waiters:
        t.join(10)
    assert sorted(r.offset for r in results) == [0, 1, 2, 3, 4]
    assert seen == [3]
    assert futures[24].result().offset == 24
    assert isinstance(futures[30].exception(), RecordTooLargeError)
    with pytest.raises(RecordTooLargeError):
        futures[49].result()
    late: list[Any] = []
    futures[49].add_done_callback(late.append)
    assert late == [futures[49]]


@pytest.mark.unit
def test_shared_condition_does_not_time_out_waiters_early() -> None:
    condition = threading.Condition()
    first, second = ProduceFuture(condition), ProduceFuture(condition)
    errors: list[BaseException] = []

    def wait_second() -> None:
        try:
            second.result(timeout=5)
        except BaseException as err:
            errors.append(err)

    def waiting() -> bool:
        return len(condition._waiters) == 1  # type: ignore[attr-defined]

    thread = threading.Thread(target=wait_second)
    thread.start()
    wait_until(waiting, timeout=10)
    first.set_result(1)  # wakes the waiter of `second`, which must wait again
    wait_until(waiting, timeout=10)
    second.set_result(2)
    thread.join(5)
    assert errors == []


# --- the accumulator ----------------------------------------------------------------------------


def _accumulator(**kwargs: Any) -> RecordAccumulator:
    values: dict[str, Any] = {
        "batch_size": 1000,
        "linger_ms": 5,
        "buffer_memory": 1 << 20,
        "delivery_timeout_ms": 60_000,
        "rng": random.Random(1),
    }
    values.update(kwargs)
    return RecordAccumulator(**values)


@pytest.mark.unit
def test_accumulator_batches_by_size_and_linger() -> None:
    acc = _accumulator()
    now = acc.clock()
    with acc.lock:
        for i in range(25):  # 100-byte records: a batch closes at 1000 bytes
            acc.append("t", 0, None, b"x" * 80, i, None, 100)
        queue = acc.queues["t", 0]
        assert [len(b.values) for b in queue] == [10, 10, 5]
        assert [b.closed for b in queue] == [True, True, False]
        plans, wake, unknown = acc.drain(now, lambda tp: 7, lambda node: True, 10_000)
        assert not unknown
        # One batch per partition per drain; the partition is muted until unmuted.
        assert [len(b.values) for b in plans[7].batches] == [10]
        plans, wake, _ = acc.drain(now, lambda tp: 7, lambda node: True, 10_000)
        assert plans == {}
        acc.unmute([("t", 0)])
        plans, _, _ = acc.drain(now, lambda tp: 7, lambda node: True, 10_000)
        acc.unmute([("t", 0)])
        plans, wake, _ = acc.drain(acc.clock(), lambda tp: 7, lambda node: True, 10_000)
        # The last, open batch waits for linger.ms.
        if not plans:
            assert wake is not None
        plans, _, _ = acc.drain(acc.clock() + 1, lambda tp: 7, lambda node: True, 10_000)
        assert [len(b.values) for b in plans[7].batches] == [5]
        # Unknown leaders are reported, not drained.
        acc.append("u", 0, None, b"x", 0, None, 2000)
        plans, _, unknown = acc.drain(acc.clock() + 1, lambda tp: None, lambda n: True, 10_000)
        assert plans == {}
        assert unknown


@pytest.mark.unit
def test_accumulator_requeues_at_the_head_and_expires() -> None:
    acc = _accumulator(delivery_timeout_ms=1000)
    with acc.lock:
        acc.append("t", 0, None, b"a", 0, None, 1000)
        acc.append("t", 0, None, b"b", 0, None, 1000)
        now = acc.clock()
        plans, _, _ = acc.drain(now, lambda tp: 1, lambda n: True, 10_000)
        (first,) = plans[1].batches
        acc.reenqueue(first)
        acc.unmute([("t", 0)])
        assert [b.values for b in acc.queues["t", 0]] == [[b"a"], [b"b"]]
        expired = acc.expire(now + 2)
        assert [b.values for b in expired] == [[b"a"], [b"b"]]
        assert not acc.has_queued()


@pytest.mark.unit
def test_accumulator_offers_a_newly_ready_batch_to_dispatch() -> None:
    """With a dispatch hook (linger.ms 0), append() offers a partition when it opens a batch or
    fills one; records joining an open batch are not offered. take_one() takes a partition's
    only queued batch, and mutes the partition, as drain() would."""
    acc = _accumulator(linger_ms=0)
    offered: list[tuple[str, int]] = []
    taken: list[Any] = []

    def dispatch(tp_key: tuple[str, int]) -> bool:
        offered.append(tp_key)
        batch = acc.take_one(tp_key, acc.clock())
        taken.append(batch)
        return batch is not None

    acc.dispatch = dispatch
    with acc.lock:
        acc.append("t", 0, None, b"a", 0, None, 100)  # a new batch: offered and taken
        assert offered == [("t", 0)]
        assert [len(b.values) for b in taken] == [1]
        assert ("t", 0) in acc.muted
        assert not acc.queues["t", 0]
        acc.append("t", 0, None, b"b", 0, None, 100)  # muted (in flight): offered, not taken
        assert offered == [("t", 0)] * 2
        assert taken[-1] is None
        for _ in range(9):  # join the open batch; the 10th record fills it and is offered
            acc.append("t", 0, None, b"c", 0, None, 100)
        assert len(offered) == 3
        assert taken[-1] is None
        acc.append("t", 0, None, b"d", 0, None, 100)  # a second queued batch
        acc.unmute([("t", 0)])
        assert acc.take_one(("t", 0), acc.clock()) is None  # not the only queued batch
        plans, _, _ = acc.drain(acc.clock(), lambda tp: 1, lambda n: True, 10_000)
        assert [len(b.values) for b in plans[1].batches] == [10]
        acc.unmute([("t", 0)])
        acc.queues["t", 0][0].retry_at = acc.clock() + 60
        assert acc.take_one(("t", 0), acc.clock()) is None  # waiting to be retried
        acc.queues["t", 0][0].retry_at = 0.0
        (last,) = [acc.take_one(("t", 0), acc.clock())]
        assert last is not None
        assert last.values == [b"d"]
        assert last.closed
        assert acc.take_one(("t", 1), acc.clock()) is None  # nothing queued


@pytest.mark.unit
def test_sticky_partitioner_sticks_until_the_batch_closes() -> None:
    acc = _accumulator()
    picked = []
    with acc.lock:
        for _ in range(40):  # 100 bytes each: 10 records per batch
            p_ = acc.sticky_partition("t", (0, 1, 2, 3), 4)
            acc.append("t", p_, None, b"x", 0, None, 100, sticky=True)
            picked.append(p_)
    runs = [picked[i : i + 10] for i in range(0, 40, 10)]
    for run in runs:
        assert len(set(run)) == 1  # one partition per batch
    for a, b in itertools.pairwise(runs):
        assert a[0] != b[0]  # switches to another partition when a batch is full
    # Only available partitions are chosen, and a drained batch also makes it switch.
    acc2 = _accumulator()
    with acc2.lock:
        first = acc2.sticky_partition("t", (2,), 4)
        assert first == 2
        acc2.append("t", first, None, b"x", 0, None, 10, sticky=True)
        assert acc2.sticky_partition("t", (2,), 4) == 2
        acc2.drain(acc2.clock() + 1, lambda tp: 0, lambda n: True, 10_000)
        assert acc2.sticky_partition("t", (1, 2), 4) == 1


@pytest.mark.unit
def test_producer_batch_encodes_keys_headers_and_tombstones() -> None:
    acc = _accumulator(batch_size=1 << 20)
    with acc.lock:
        acc.append("t", 0, b"k1", b"v1", 10, [("h", b"1"), ("n", None)], 10)
        acc.append("t", 0, None, None, 11, None, 10)
        acc.append("t", 0, b"k3", b"v3", 12, None, 10)
    (batch,) = acc.queues["t", 0]
    (parsed,) = iter_batches(batch.encode(Compression.ZSTD))
    assert parsed.compression is Compression.ZSTD
    assert parsed.records() == [
        Record(b"k1", b"v1", 10, (("h", b"1"), ("n", None)), 0),
        Record(None, None, 11, (), 1),
        Record(b"k3", b"v3", 12, (), 2),
    ]
    halves = batch.split(0.0)
    assert [len(h.values) for h in halves] == [1, 2]
    assert [h.futures for h in halves] == [batch.futures[:1], batch.futures[1:]]


# --- fetched data ---------------------------------------------------------------------------


def _records(n: int, start_ts: int = 1000, prefix: bytes = b"v") -> list[Record]:
    return [Record(None, prefix + b"%d" % i, start_ts + i) for i in range(n)]


@pytest.mark.unit
def test_decode_fetched_drops_records_below_the_fetch_offset() -> None:
    data = build(_records(5), base_offset=10) + build(_records(3, prefix=b"w"), base_offset=15)
    out = decode_fetched(data, 12)
    assert out.next_offset == 18
    table = pa.Table.from_batches(out.batches)
    assert table.schema == FETCH_SCHEMA
    assert table.column("offset").to_pylist() == [12, 13, 14, 15, 16, 17]
    assert table.column("value").to_pylist() == [b"v2", b"v3", b"v4", b"w0", b"w1", b"w2"]
    assert table.column("timestamp_type").to_pylist() == [0] * 6
    # A partial batch at the end is ignored; so is a fetch past everything.
    out = decode_fetched(data[:-7], 10)
    assert out.next_offset == 15
    assert out.partial_bytes > 0
    assert decode_fetched(data, 18).batches == []
    assert decode_fetched(b"", 0).next_offset is None


@pytest.mark.unit
def test_decode_fetched_log_append_time_and_crc() -> None:
    data = bytearray(
        build(_records(3), base_offset=0, timestamp_type=TimestampType.LOG_APPEND_TIME)
    )
    (batch,) = decode_fetched(bytes(data), 0).batches
    assert batch.column(3).to_pylist() == [1002] * 3  # the batch's max timestamp
    assert batch.column(4).to_pylist() == [1] * 3
    data[-3] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="t-0: fetched data at offset 0 is corrupt"):
        decode_fetched(bytes(data), 0, where="t-0")


def _txn(pid: int, n: int, base: int, prefix: bytes) -> bytes:
    return build(
        _records(n, prefix=prefix),
        base_offset=base,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )


def _marker(kind: ControlType, pid: int, base: int) -> bytes:
    return build_control(
        kind, producer_id=pid, producer_epoch=0, coordinator_epoch=0, timestamp=5, base_offset=base
    )


@pytest.mark.unit
def test_read_committed_drops_aborted_transactions_and_markers() -> None:
    # offsets: 0-1 pid 1 (aborted), 2-3 pid 2 (committed), 4 pid 1 ABORT, 5 pid 2 COMMIT,
    #          6 plain, 7-8 pid 1 again (a later, committed transaction), 9 pid 1 COMMIT,
    #          10 pid 3 (aborted), 11 pid 3 ABORT
    data = b"".join(
        [
            _txn(1, 2, 0, b"a"),
            _txn(2, 2, 2, b"c"),
            _marker(ControlType.ABORT, 1, 4),
            _marker(ControlType.COMMIT, 2, 5),
            build(_records(1, prefix=b"plain"), base_offset=6),
            _txn(1, 2, 7, b"d"),
            _marker(ControlType.COMMIT, 1, 9),
            _txn(3, 1, 10, b"x"),
            _marker(ControlType.ABORT, 3, 11),
        ]
    )
    aborted = [
        p.AbortedTransaction(producer_id=1, first_offset=0),
        p.AbortedTransaction(producer_id=3, first_offset=10),
    ]

    def values(**kwargs: Any) -> list[bytes]:
        out = decode_fetched(data, kwargs.pop("fetch_offset", 0), **kwargs)
        assert out.next_offset == 12
        return [v for b in out.batches for v in b.column(2).to_pylist()]

    committed = values(read_committed=True, aborted_transactions=aborted)
    assert committed == [b"c0", b"c1", b"plain0", b"d0", b"d1"]
    assert values(read_committed=False) == [
        b"a0",
        b"a1",
        b"c0",
        b"c1",
        b"plain0",
        b"d0",
        b"d1",
        b"x0",
    ]
    # Starting inside the data: an abort listed with an earlier first offset still applies.
    assert values(read_committed=True, aborted_transactions=aborted[1:], fetch_offset=10) == []
    # Aborted list in any order (Kafka orders it by first offset).
    assert values(read_committed=True, aborted_transactions=aborted[::-1]) == committed


# --- a scripted broker on a real socket ----------------------------------------------------


Handler = Callable[[p.RequestHeader, Any], Any]
NO_RESPONSE = object()


class ScriptedBroker:
    """A TCP server speaking replog's protocol with scripted handlers (one per API key).

    A handler returns a response body, NO_RESPONSE, or ``(correlation_id, body)`` to answer
    with another correlation id. Requests are recorded in ``requests``.
    """

    def __init__(self, topics: dict[str, int] | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)  # so close() stops the accept loop promptly
        self.port = self.sock.getsockname()[1]
        self.topics = dict(topics or {})
        self.requests: list[tuple[p.RequestHeader, Any]] = []
        self.handlers: dict[int, Handler] = {
            p.ApiKey.API_VERSIONS: self.api_versions,
            p.ApiKey.METADATA: self.metadata,
            # the idempotent producer (the default) asks for a producer id first
            p.ApiKey.INIT_PRODUCER_ID: lambda h, b: p.InitProducerIdResponse(producer_id=7),
        }
        self._conns: list[socket.socket] = []
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def api_versions(self, header: p.RequestHeader, body: Any) -> Any:
        return p.ApiVersionsResponse(
            api_keys=[
                p.ApiVersionsResponseKey(api_key=k, min_version=lo, max_version=hi)
                for k, (lo, hi) in p.SUPPORTED_VERSIONS.items()
            ]
        )

    def metadata(self, header: p.RequestHeader, body: p.MetadataRequest) -> Any:
        names = list(self.topics) if body.topics is None else [t.name for t in body.topics]
        topics = []
        for name in names:
            if name not in self.topics:
                topics.append(p.MetadataResponseTopic(error_code=3, name=name))
                continue
            topics.append(
                p.MetadataResponseTopic(
                    name=name,
                    partitions=[
                        p.MetadataResponsePartition(
                            partition_index=i, leader_id=0, replica_nodes=[0], isr_nodes=[0]
                        )
                        for i in range(self.topics[name])
                    ],
                )
            )
        return p.MetadataResponse(
            brokers=[p.MetadataResponseBroker(node_id=0, host="127.0.0.1", port=self.port)],
            cluster_id="scripted",
            controller_id=0,
            topics=topics,
        )

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    head = conn.recv(4, socket.MSG_WAITALL)
                    if len(head) < 4:
                        return
                    (size,) = struct.unpack(">i", head)
                    frame = conn.recv(size, socket.MSG_WAITALL)
                    header, body = p.decode_request(frame)
                    self.requests.append((header, body))
                    response = self.handlers[header.api_key](header, body)
                    if response is NO_RESPONSE:
                        continue
                    correlation_id = header.correlation_id
                    version = header.api_version
                    if isinstance(response, tuple):
                        correlation_id, response = response
                    if isinstance(response, p.ApiVersionsResponse) and response.error_code:
                        version = 0
                    conn.sendall(
                        p.encode_response(correlation_id, header.api_key, version, response)
                    )
                except OSError:
                    return

    def close(self) -> None:
        self._closed = True
        self._thread.join(5)
        self.sock.close()
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()


@pytest.fixture
def scripted() -> Iterator[ScriptedBroker]:
    broker = ScriptedBroker({"t": 2})
    yield broker
    broker.close()


@pytest.mark.unit
def test_connection_unreachable_is_quick_and_named() -> None:
    port = free_port()
    conn = BrokerConnection("127.0.0.1", port, "test", 1000)
    with pytest.raises(BrokerUnreachableError, match=f"127.0.0.1:{port}") as info:
        conn.send(p.ApiKey.METADATA, 1, p.MetadataRequest())
    # quick: the refusal itself is reported, not a connect timeout waited out
    assert isinstance(info.value.__cause__, ConnectionRefusedError)
    assert "no connection within" not in str(info.value)
    assert info.value.retriable
    assert info.value.port == port
    conn.close()


@pytest.mark.unit
def test_connection_round_trip_versions_and_reconnect(scripted: ScriptedBroker) -> None:
    conn = BrokerConnection("127.0.0.1", scripted.port, "me", 2000)
    response = conn.send(p.ApiKey.METADATA, 1, p.MetadataRequest(topics=None))
    assert [t.name for t in response.topics] == ["t"]
    assert conn.api_versions[p.ApiKey.FETCH] == (0, 0)
    assert scripted.requests[0][0].api_key == p.ApiKey.API_VERSIONS
    assert scripted.requests[1][0].client_id == "me"
    with pytest.raises(UnsupportedVersionError, match="METADATA versions 0-1, not 5"):
        conn.send(p.ApiKey.METADATA, 5, p.MetadataRequest())
    # A wrong correlation id closes the connection; the next request reconnects.
    scripted.handlers[p.ApiKey.METADATA] = lambda h, b: (h.correlation_id + 1, p.MetadataResponse())
    with pytest.raises(CorruptFrameError, match="correlation id"):
        conn.send(p.ApiKey.METADATA, 1, p.MetadataRequest())
    assert not conn.connected
    scripted.handlers[p.ApiKey.METADATA] = scripted.metadata
    assert conn.send(p.ApiKey.METADATA, 1, p.MetadataRequest(topics=None)).topics
    # No response within the timeout.
    scripted.handlers[p.ApiKey.METADATA] = lambda h, b: NO_RESPONSE
    with pytest.raises(RequestTimedOutError, match="within 200 ms"):
        conn.send(p.ApiKey.METADATA, 1, p.MetadataRequest(), timeout_ms=200)
    conn.close()


@pytest.mark.unit
def test_connection_falls_back_to_the_brokers_api_versions(scripted: ScriptedBroker) -> None:
    def old_broker(header: p.RequestHeader, body: Any) -> Any:
        if header.api_version > 0:
            return p.ApiVersionsResponse(
                error_code=UnsupportedVersionError.code,
                api_keys=[p.ApiVersionsResponseKey(api_key=18, min_version=0, max_version=0)],
            )
        return p.ApiVersionsResponse(
            api_keys=[p.ApiVersionsResponseKey(api_key=18, min_version=0, max_version=0)]
        )

    scripted.handlers[p.ApiKey.API_VERSIONS] = old_broker
    conn = BrokerConnection("127.0.0.1", scripted.port, "me", 2000)
    with pytest.raises(UnsupportedVersionError, match="does not support METADATA"):
        conn.send(p.ApiKey.METADATA, 1, p.MetadataRequest())
    assert [h.api_version for h, _ in scripted.requests] == [1, 0]
    conn.close()


def _produce_ok(base: int = 0) -> Handler:
    def handle(header: p.RequestHeader, body: p.ProduceRequest) -> Any:
        return p.ProduceResponse(
            responses=[
                p.ProduceResponseTopic(
                    name=t.name,
                    partition_responses=[
                        p.ProduceResponsePartition(index=part.index, base_offset=base)
                        for part in t.partition_data
                    ],
                )
                for t in body.topic_data
            ]
        )

    return handle


def _produce_error(code: int, message: str | None = None) -> Handler:
    def handle(header: p.RequestHeader, body: p.ProduceRequest) -> Any:
        return p.ProduceResponse(
            responses=[
                p.ProduceResponseTopic(
                    name=t.name,
                    partition_responses=[
                        p.ProduceResponsePartition(
                            index=part.index, error_code=code, error_message=message
                        )
                        for part in t.partition_data
                    ],
                )
                for t in body.topic_data
            ]
        )

    return handle


def _fast_producer(bootstrap: str, **kwargs: Any) -> Producer:
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "linger_ms": 1,
        "retry_backoff_ms": 10,
        "retry_backoff_max_ms": 50,
        "request_timeout_ms": 2000,
        "delivery_timeout_ms": 5000,
        "max_block_ms": 2000,
    }
    settings.update(kwargs)
    return Producer(settings)


@pytest.mark.unit
def test_producer_retries_not_leader_then_completes(
    scripted: ScriptedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[int] = []

    def flaky(header: p.RequestHeader, body: p.ProduceRequest) -> Any:
        attempts.append(1)
        if len(attempts) < 3:
            return _produce_error(NotLeaderOrFollowerError.code)(header, body)
        return _produce_ok(base=40)(header, body)

    scripted.handlers[p.ApiKey.PRODUCE] = flaky
    with (
        caplog.at_level(logging.WARNING, logger="replication.client.producer"),
        _fast_producer(scripted.bootstrap, acks="1") as producer,
    ):
        futures = [producer.send("t", b"v%d" % i, partition=1, timestamp=7) for i in range(3)]
        results = [f.result(timeout=10) for f in futures]
    assert results == [RecordMetadata("t", 1, 40 + i, 7) for i in range(3)]
    assert len(attempts) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("attempt 1" in w and "t-1" in w for w in warnings)
    assert any("attempt 2" in w for w in warnings)
    # Metadata was refreshed after NOT_LEADER_OR_FOLLOWER.
    metadata_requests = [h for h, _ in scripted.requests if h.api_key == p.ApiKey.METADATA]
    assert len(metadata_requests) >= 2


@pytest.mark.unit
def test_linger_0_sends_go_from_send_to_an_io_thread_in_order(scripted: ScriptedBroker) -> None:
    """linger.ms 0: send() hands its batch to an I/O thread itself while the partition has
    nothing in flight; concurrent senders still get one batch in flight per partition, in
    send order, and a retried batch goes back through the sender thread."""
    offsets = itertools.count()
    lock = threading.Lock()
    seen: list[list[bytes]] = []
    attempts: list[int] = []

    def handle(header: p.RequestHeader, body: p.ProduceRequest) -> Any:
        attempts.append(1)
        if len(attempts) == 5:  # one NOT_LEADER_OR_FOLLOWER on the way: a retry
            return _produce_error(NotLeaderOrFollowerError.code)(header, body)
        ((part,),) = [t.partition_data for t in body.topic_data]
        (batch,) = iter_batches(part.records or b"")
        values = [r.value or b"" for r in batch.records()]
        with lock:
            seen.append(values)
            base = next(offsets)
            for _ in values[1:]:
                next(offsets)
        return _produce_ok(base=base)(header, body)

    scripted.handlers[p.ApiKey.PRODUCE] = handle
    with _fast_producer(scripted.bootstrap, linger_ms=0) as producer:
        sender = producer._sender
        dispatched: list[bool] = []
        real = sender.dispatch

        def spy(tp_key: tuple[str, int]) -> bool:
            took = real(tp_key)
            dispatched.append(took)
            return took

        producer._acc.dispatch = spy
        lone = [producer.send("t", b"s%d" % i, partition=0).result(timeout=10) for i in range(10)]
        assert [m.offset for m in lone] == list(range(10))
        assert dispatched.count(True) >= 9  # the first may wait for the producer id

        def sends(name: bytes) -> list[int]:
            futures = [producer.send("t", name + b"%03d" % i, partition=1) for i in range(100)]
            return [f.result(timeout=10).offset for f in futures]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(sends, [b"a", b"b", b"c", b"d"]))
    for got in results:
        assert got == sorted(got)  # each thread's records in its send order
    order = [v for values in seen for v in values if not v.startswith(b"s")]
    for name in (b"a", b"b", b"c", b"d"):
        assert [v for v in order if v.startswith(name)] == [name + b"%03d" % i for i in range(100)]
    assert len(order) == 400
    assert len(attempts) == len(seen) + 1


@pytest.mark.unit
def test_producer_fails_fast_on_non_retriable_errors(scripted: ScriptedBroker) -> None:
    scripted.handlers[p.ApiKey.PRODUCE] = _produce_error(
        RecordTooLargeError.code, "batch of 9000000 bytes exceeds max.message.bytes"
    )
    with _fast_producer(scripted.bootstrap) as producer:
        future = producer.send("t", b"x", partition=0)
        with pytest.raises(RecordTooLargeError, match=r"t-0.*exceeds max\.message\.bytes"):
            future.result(timeout=10)
        # A client-side check for max.request.size, before anything is sent.
        big = producer.send("t", b"x" * 3000, partition=0)
    small = _fast_producer(scripted.bootstrap, max_request_size=1000)
    with pytest.raises(RecordTooLargeError, match=r"max\.request\.size=1000"):
        small.send("t", b"x" * 3000).result(timeout=10)
    small.close()
    with pytest.raises(RecordTooLargeError):
        big.result(timeout=10)


@pytest.mark.unit
def test_producer_splits_a_batch_the_broker_finds_too_large(scripted: ScriptedBroker) -> None:
    sizes: list[int] = []

    def limited(header: p.RequestHeader, body: p.ProduceRequest) -> Any:
        records = body.topic_data[0].partition_data[0].records
        assert records is not None
        (batch,) = iter_batches(records)
        sizes.append(batch.record_count)
        if batch.record_count > 2:
            return _produce_error(RecordTooLargeError.code)(header, body)
        return _produce_ok(base=100)(header, body)

    scripted.handlers[p.ApiKey.PRODUCE] = limited
    with _fast_producer(scripted.bootstrap, linger_ms=200) as producer:
        futures = [producer.send("t", b"v", partition=0) for _ in range(8)]
        results = [f.result(timeout=10) for f in futures]
    assert sizes[0] == 8
    assert all(r.offset == 100 or r.offset == 101 for r in results)


@pytest.mark.unit
def test_producer_unknown_topic(scripted: ScriptedBroker) -> None:
    with _fast_producer(
        scripted.bootstrap, max_block_ms=200, request_timeout_ms=1000, delivery_timeout_ms=1500
    ) as producer:
        future = producer.send("nope", b"x")
        with pytest.raises(UnknownTopicOrPartitionError, match="'nope' not present in metadata"):
            future.result(timeout=10)
        # the metadata wait ended at max.block.ms, not at delivery.timeout.ms
        with pytest.raises(UnknownTopicOrPartitionError, match=r"\(max\.block\.ms=200\)"):
            future.result(timeout=0)
        assert not [b for h, b in scripted.requests if h.api_key == p.ApiKey.PRODUCE]
        with pytest.raises(UnknownTopicOrPartitionError, match="partition 5 of topic 't'"):
            producer.send("t", b"x", partition=5).result(timeout=10)
        # A topic that disappears: retried until delivery.timeout.ms, then named.
        scripted.handlers[p.ApiKey.PRODUCE] = _produce_error(UnknownTopicOrPartitionError.code)
        gone = producer.send("t", b"x", partition=0)
        with pytest.raises(UnknownTopicOrPartitionError, match=r"delivery\.timeout\.ms=1500"):
            gone.result(timeout=20)


@pytest.mark.unit
def test_producer_acks_zero_expects_no_response(scripted: ScriptedBroker) -> None:
    scripted.handlers[p.ApiKey.PRODUCE] = lambda h, b: NO_RESPONSE
    with _fast_producer(scripted.bootstrap, acks=0) as producer:
        futures = [producer.send("t", b"v", partition=0, timestamp=3) for _ in range(5)]
        assert [f.result(timeout=10) for f in futures] == [RecordMetadata("t", 0, -1, 3)] * 5
        batch = producer.send_arrow("t", pa.table({"value": [b"a", b"b"]}), partition=1)
        assert [f.result(timeout=10) for f in batch] == [RecordBatchMetadata("t", 1, -1, 2)]
    acks = {b.acks for h, b in scripted.requests if h.api_key == p.ApiKey.PRODUCE}
    assert acks == {0}


@pytest.mark.unit
def test_producer_close_with_timeout_fails_what_is_left(scripted: ScriptedBroker) -> None:
    scripted.handlers[p.ApiKey.PRODUCE] = lambda h, b: NO_RESPONSE
    producer = _fast_producer(scripted.bootstrap, request_timeout_ms=500, delivery_timeout_ms=5000)
    first = producer.send("t", b"in flight", partition=0)
    wait_until(lambda: any(h.api_key == p.ApiKey.PRODUCE for h, _ in scripted.requests), 10)
    queued = producer.send("t", b"queued", partition=0)
    producer.close(timeout=0.1)
    # close did not wait for the request or delivery timeouts: what was left failed within it
    assert first.done()
    assert queued.done()
    assert not producer._sender.is_alive()
    for future in (first, queued):
        with pytest.raises(ClientClosedError, match="closed before"):
            future.result(timeout=1)


@pytest.mark.unit
def test_producer_close_from_a_callback(scripted: ScriptedBroker) -> None:
    scripted.handlers[p.ApiKey.PRODUCE] = _produce_ok()
    producer = _fast_producer(scripted.bootstrap)
    closed = threading.Event()

    def close_it(_: Any) -> None:
        producer.close()
        closed.set()

    producer.send("t", b"x", partition=0).add_done_callback(close_it)
    assert closed.wait(10)
    wait_until(lambda: not producer._sender.is_alive(), timeout=10)
    with pytest.raises(ClientClosedError):
        producer.send("t", b"y")


@pytest.mark.unit
def test_producer_bootstrap_unreachable_is_quick() -> None:
    port = free_port()
    with Producer(bootstrap_servers=f"127.0.0.1:{port}") as producer:
        with pytest.raises(BrokerUnreachableError, match=f"127.0.0.1:{port}") as info:
            producer.send("t", b"x").result(timeout=10)
        # quick: said at the first refusal, not retried until max.block.ms
        assert "gave up after" not in str(info.value)
        assert isinstance(info.value.__cause__, ConnectionRefusedError)
    with pytest.raises(ClientClosedError):
        producer.send("t", b"x")
    consumer = Consumer(bootstrap_servers=f"127.0.0.1:{port}")
    consumer.assign([TopicPartition("t", 0)])
    with pytest.raises(BrokerUnreachableError):
        consumer.poll(100)
    with pytest.raises(BrokerUnreachableError):
        consumer.end_offsets([TopicPartition("t", 0)])
    consumer.close()
    with (
        Admin(bootstrap_servers=f"127.0.0.1:{port}") as admin,
        pytest.raises(BrokerUnreachableError),
    ):
        admin.list_topics()


@pytest.mark.unit
def test_send_arrow_partitions_like_send(scripted: ScriptedBroker) -> None:
    scripted.topics["wide"] = 5
    seen: dict[int, list[bytes]] = {}

    def record(header: p.RequestHeader, body: p.ProduceRequest) -> Any:
        for t in body.topic_data:
            for part in t.partition_data:
                assert part.records is not None
                for batch in iter_batches(part.records):
                    seen.setdefault(part.index, []).extend(r.value or b"" for r in batch.records())
        return _produce_ok()(header, body)

    scripted.handlers[p.ApiKey.PRODUCE] = record
    keys = [b"key-%d" % i for i in range(200)]
    table = pa.table(
        {
            "key": keys + [None] * 50,
            "value": [b"v%d" % i for i in range(250)],
            "partition": [None] * 240 + [4] * 10,
        }
    )
    with _fast_producer(scripted.bootstrap, batch_size=1000) as producer:
        futures = producer.send_arrow("wide", table)
        metas = [f.result(timeout=10) for f in futures]
    assert sum(m.record_count for m in metas) == 250
    expected: dict[int, list[bytes]] = {}
    for i, key in enumerate(keys):
        expected.setdefault(partition_for_key(key, 5), []).append(b"v%d" % i)
    for part, values in expected.items():
        assert [v for v in seen[part] if int(v[1:]) < 200] == values  # order kept
    assert [v for v in seen[4] if int(v[1:]) >= 240] == [b"v%d" % i for i in range(240, 250)]
    assert sorted(v for vs in seen.values() for v in vs) == sorted(table["value"].to_pylist())
    with _fast_producer(scripted.bootstrap) as producer:
        with pytest.raises(UnknownTopicOrPartitionError, match="partition 9"):
            producer.send_arrow("wide", table, partition=9)
        with pytest.raises(ValueError, match="value"):
            producer.send_arrow("wide", pa.table({"v": [1]}))


def _fetch_response(topic: str, partition: int, **fields: Any) -> p.FetchResponse:
    return p.FetchResponse(
        responses=[
            p.FetchResponseTopic(
                topic=topic,
                partitions=[p.FetchResponsePartition(partition_index=partition, **fields)],
            )
        ]
    )


def _list_offsets_handler(earliest: int, latest: int) -> Handler:
    def handle(header: p.RequestHeader, body: p.ListOffsetsRequest) -> Any:
        return p.ListOffsetsResponse(
            topics=[
                p.ListOffsetsResponseTopic(
                    name=t.name,
                    partitions=[
                        p.ListOffsetsResponsePartition(
                            partition_index=q.partition_index,
                            offset=earliest if q.timestamp == p.EARLIEST_TIMESTAMP else latest,
                        )
                        for q in t.partitions
                    ],
                )
                for t in body.topics
            ]
        )

    return handle


@pytest.mark.unit
def test_consumer_offset_out_of_range(scripted: ScriptedBroker) -> None:
    scripted.handlers[p.ApiKey.FETCH] = lambda h, b: _fetch_response(
        "t", 0, error_code=OffsetOutOfRangeError.code, log_start_offset=5, high_watermark=9
    )
    scripted.handlers[p.ApiKey.LIST_OFFSETS] = _list_offsets_handler(5, 9)
    tp = TopicPartition("t", 0)
    with Consumer(bootstrap_servers=scripted.bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        with pytest.raises(NoOffsetForPartitionError, match="t-0 has no position"):
            consumer.poll(0)
        consumer.seek(tp, 100)
        with pytest.raises(OffsetOutOfRangeError, match=r"offset 100 .* t-0 .*\[5, 9\)"):
            consumer.poll(100)
    with Consumer(bootstrap_servers=scripted.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 100)
        data = build(_records(4), base_offset=5)
        responses = iter([{"error_code": OffsetOutOfRangeError.code}])

        def fetch(header: p.RequestHeader, body: p.FetchRequest) -> Any:
            assert body.session_id == 0
            assert body.session_epoch == -1
            fields = next(responses, {"records": data, "high_watermark": 9})
            return _fetch_response("t", 0, **fields)

        scripted.handlers[p.ApiKey.FETCH] = fetch
        records = consumer.poll(2000)
        assert [r.offset for r in records] == [5, 6, 7, 8]
        assert consumer.position(tp) == 9
        assert consumer.highwater(tp) == 9
    with pytest.raises(PartitionNotAssignedError):
        consumer.seek(TopicPartition("t", 1), 0)
