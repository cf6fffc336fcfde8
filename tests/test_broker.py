"""One broker process: produce, fetch (long poll), list offsets, restart durability."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from logstore.batch import Record, build, iter_batches
from replication import protocol as p
from tests.cluster import BrokerProcess
from tests.helpers import unique_name, wait_until
from tests.wire import RawConnection, create_topic, fetch, produce, read_records

pytestmark = pytest.mark.cluster


def values_of(records: bytes | memoryview | None) -> list[tuple[int, bytes | None]]:
    return [(r.offset, r.value) for b in iter_batches(records or b"") for r in b.records()]


def read_all(conn: RawConnection, topic: str, partition: int = 0) -> list[tuple[int, bytes | None]]:
    return [(r.offset, r.value) for r in read_records(conn, topic, partition)]


def batch(*values: bytes, ts: int = 1_000) -> bytes:
    return build([Record(None, v, ts + i) for i, v in enumerate(values)])


def test_produce_fetch_round_trip(broker: BrokerProcess) -> None:
    topic = unique_name()
    with RawConnection(broker.bootstrap) as conn:
        result = create_topic(conn, topic, partitions=3).topics[0]
        assert (result.error_code, result.num_partitions) == (0, 3)
        for acks in (-1, 1):
            resp = produce(conn, topic, 1, batch(b"a", b"b"), acks=acks)
            assert resp.responses[0].partition_responses[0].error_code == 0
        assert produce(conn, topic, 1, batch(b"c"), acks=0) is None
        wait_until(lambda: len(read_all(conn, topic, 1)) == 5, message="acks=0 record visible")
        assert read_all(conn, topic, 1) == [(0, b"a"), (1, b"b"), (2, b"a"), (3, b"b"), (4, b"c")]
        assert read_all(conn, topic, 0) == []
        meta = conn.request(
            p.ApiKey.METADATA, p.MetadataRequest(topics=[p.MetadataRequestTopic(name=topic)])
        )
        assert [pt.leader_id for pt in meta.topics[0].partitions] == [0, 0, 0]
        assert meta.brokers[0].port == broker.port


def test_long_poll_returns_when_data_arrives(broker: BrokerProcess) -> None:
    topic = unique_name()
    events: list[str] = []
    result: list[object] = []
    with RawConnection(broker.bootstrap) as admin:
        create_topic(admin, topic)

    def poll() -> None:
        with RawConnection(broker.bootstrap, timeout=120) as conn:
            events.append("fetch sent")
            result.append(fetch(conn, topic, 0, 0, max_wait_ms=60_000))
            events.append("fetch returned")

    thread = threading.Thread(target=poll)
    thread.start()
    wait_until(lambda: events == ["fetch sent"], message="fetch sent")
    with RawConnection(broker.bootstrap) as conn:
        # the fetch is parked: nothing has returned before we produce
        assert events == ["fetch sent"]
        events.append("produce")
        produce(conn, topic, 0, batch(b"wake up"), acks=1)
    thread.join(timeout=30)
    assert events == ["fetch sent", "produce", "fetch returned"]
    part = result[0].responses[0].partitions[0]  # type: ignore[attr-defined]
    assert values_of(part.records) == [(0, b"wake up")]


def test_fetch_max_bytes_and_out_of_range(broker: BrokerProcess) -> None:
    topic = unique_name()
    with RawConnection(broker.bootstrap) as conn:
        create_topic(conn, topic)
        for i in range(5):
            produce(conn, topic, 0, batch(bytes([65 + i]) * 200))
        one = fetch(conn, topic, 0, 0, max_bytes=10).responses[0].partitions[0]
        assert [o for o, _ in values_of(one.records)] == [0]  # at least one whole batch
        bad = fetch(conn, topic, 0, 99).responses[0].partitions[0]
        assert bad.error_code == 1  # OFFSET_OUT_OF_RANGE


def test_list_offsets(broker: BrokerProcess) -> None:
    topic = unique_name()
    with RawConnection(broker.bootstrap) as conn:
        create_topic(conn, topic)
        produce(conn, topic, 0, build([Record(None, b"a", 100), Record(None, b"b", 200)]))
        produce(conn, topic, 0, build([Record(None, b"c", 300)]))

        def offset_for(ts: int) -> tuple[int, int]:
            resp = conn.request(
                p.ApiKey.LIST_OFFSETS,
                p.ListOffsetsRequest(
                    replica_id=-1,
                    topics=[
                        p.ListOffsetsRequestTopic(
                            name=topic,
                            partitions=[
                                p.ListOffsetsRequestPartition(partition_index=0, timestamp=ts)
                            ],
                        )
                    ],
                ),
            )
            part = resp.topics[0].partitions[0]
            assert part.error_code == 0
            return part.offset, part.timestamp

        assert offset_for(p.EARLIEST_TIMESTAMP)[0] == 0
        assert offset_for(p.LATEST_TIMESTAMP)[0] == 3
        assert offset_for(150) == (1, 200)
        assert offset_for(301)[0] == -1


def test_sigterm_then_restart_keeps_every_acked_record(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory()
    topic = unique_name()
    with RawConnection(broker.bootstrap) as conn:
        create_topic(conn, topic, partitions=2)
        for i in range(50):
            resp = produce(conn, topic, i % 2, batch(f"v{i}".encode()), acks=1)
            assert resp.responses[0].partition_responses[0].error_code == 0
    assert broker.stop() == 0
    broker.start()
    with RawConnection(broker.bootstrap) as conn:
        assert [v for _, v in read_all(conn, topic, 0)] == [
            f"v{i}".encode() for i in range(0, 50, 2)
        ]
        assert [v for _, v in read_all(conn, topic, 1)] == [
            f"v{i}".encode() for i in range(1, 50, 2)
        ]


def test_sigkill_then_restart_keeps_records_acked_and_flushed(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory()
    topic = unique_name()
    with RawConnection(broker.bootstrap) as conn:
        create_topic(conn, topic)
        for i in range(20):
            produce(conn, topic, 0, batch(f"v{i}".encode()), acks=-1)  # acks=all: flushed
        for i in range(20, 40):
            produce(conn, topic, 0, batch(f"v{i}".encode()), acks=1)
        # acks=1 records are durable once flushed: the HW reaches them after group commit
        wait_until(lambda: len(read_all(conn, topic)) == 40, message="acks=1 records flushed")
    broker.kill()
    broker.start()
    with RawConnection(broker.bootstrap) as conn:
        assert [v for _, v in read_all(conn, topic)] == [f"v{i}".encode() for i in range(40)]
        # the log goes on where it stopped
        resp = produce(conn, topic, 0, batch(b"after"), acks=-1)
        assert resp.responses[0].partition_responses[0].base_offset == 40
