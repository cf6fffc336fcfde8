"""Producer id expiration (Kafka's ``producer.id.expiration.ms``): a partition's producer state
keeps a producer id only while it is live.

Unit tier on a real Partition over a real Log (local files): an idle producer id is removed,
an open transaction's is kept, the removal holds across a reopen (recovery replays the log and
applies the same rule) and a truncation, and the expired producer's next batch must start at
sequence 0. Cluster tier on a real broker process with a short expiration: idle ids disappear,
stay gone across a restart, an open transaction's id stays, and a live idempotent producer
keeps producing across expirations with every acked record in the log once, in order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logstore.batch import Compression, Record, build
from logstore.config import LogConfig
from logstore.log import Log
from logstore.storage import Storage
from replication.broker.partition import Partition, TopicPolicy
from replication.broker.producer_state import ProducerStateManager
from replication.broker.replica_fetcher import ReplicaFetcherManager
from replication.broker.replica_manager import ReplicaManager
from replication.client import Admin, Producer, ProducerConfig, TopicPartition
from replication.client.accumulator import ProducerBatch
from replication.client.cluster import Cluster
from replication.client.config import load
from replication.client.transactions import TransactionManager
from replication.config import BrokerConfig, broker_config_from
from replication.errors import ConfigError, UnknownProducerIdError
from replication.metadata.image import MetadataImage, PartitionState
from tests.cluster import BrokerProcess
from tests.helpers import unique_name, wait_until
from tests.readback import read_to_end

LEADER = PartitionState((0,), (0,), 0, 1, 0)
HOUR_MS = 3_600_000
#: producer ids of the unit tests
IDLE, OPEN_TXN, RECENT, OLD_RECORDS = 1, 2, 3, 4


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _open(root: Path, expiration_ms: int | None = HOUR_MS) -> Partition:
    storage = Storage.from_url(f"file://{root}/events/0", fsync=False)
    plog = Log.open(storage, LogConfig())
    return Partition(
        "events", 0, plog, 0, TopicPolicy(), LEADER, producer_id_expiration_ms=expiration_ms
    )


def _batch(pid: int, seq: int, timestamp: int, *, txn: bool = False, n: int = 2) -> bytes:
    records = [Record(None, b"p%d-%d" % (pid, seq + i), timestamp) for i in range(n)]
    return build(
        records, producer_id=pid, producer_epoch=0, base_sequence=seq, is_transactional=txn
    )


def _fill(partition: Partition) -> None:
    """Batches whose records are old (IDLE's 2 hours, OPEN_TXN's transaction 3 hours) or new
    (RECENT's), all appended now."""
    now = _now_ms()
    partition.append_as_leader(_batch(IDLE, 0, now - 3 * HOUR_MS), acks=1)
    partition.append_as_leader(_batch(OPEN_TXN, 0, now - 3 * HOUR_MS, txn=True), acks=1)
    partition.append_as_leader(_batch(IDLE, 2, now - 2 * HOUR_MS), acks=1)
    partition.append_as_leader(_batch(RECENT, 0, now), acks=1)
    partition.log.flush()


@pytest.mark.unit
def test_an_idle_producer_id_expires_and_an_open_transaction_keeps_its_own(
    tmp_path: Path,
) -> None:
    partition = _open(tmp_path, expiration_ms=None)  # nothing expires: all three are kept
    _fill(partition)
    state = partition.producer_state
    assert sorted(state.producers) == [IDLE, OPEN_TXN, RECENT]
    now = _now_ms()
    assert state.producers[IDLE].last_timestamp > now - 60_000, "appended now: old records"

    partition.producer_id_expiration_ms = HOUR_MS
    assert partition.remove_expired_producers(now) == [], "a producer writing now is live"
    assert partition.remove_expired_producers(now + HOUR_MS) == [IDLE, RECENT]
    assert sorted(state.producers) == [OPEN_TXN], "an open transaction is never expired"
    assert state.first_unstable_offset() == 2, "the open transaction still bounds the LSO"
    assert partition.remove_expired_producers(now + 5 * HOUR_MS) == []

    # the transaction ends: its producer expires at a check once idle long enough
    partition.append_marker(OPEN_TXN, 0, commit=True, coordinator_epoch=0)
    assert partition.remove_expired_producers(_now_ms() + HOUR_MS - 60_000) == []
    assert partition.remove_expired_producers(_now_ms() + HOUR_MS) == [OPEN_TXN]
    assert state.producers == {}


@pytest.mark.unit
def test_an_expired_producer_must_start_again_at_sequence_zero(tmp_path: Path) -> None:
    partition = _open(tmp_path)
    _fill(partition)
    assert partition.remove_expired_producers(_now_ms() + HOUR_MS) == [IDLE, RECENT]
    end = partition.log.log_end_offset
    with pytest.raises(UnknownProducerIdError, match=r"producer.id.expiration.ms.*sequence 4"):
        partition.append_as_leader(_batch(IDLE, 4, _now_ms()), acks=1)
    assert partition.log.log_end_offset == end, "the refused batch was not appended"
    # the producer reset: its new producer id starts at 0, and its retries are recognised
    info = partition.append_as_leader(_batch(IDLE + 10, 0, _now_ms()), acks=1)
    assert (info.first_offset, info.duplicate) == (end, False)
    retry = partition.append_as_leader(_batch(IDLE + 10, 0, _now_ms()), acks=1)
    assert (retry.first_offset, retry.duplicate) == (end, True), "a retry is recognised"
    # the transaction's producer, kept, continues in sequence
    info = partition.append_as_leader(_batch(OPEN_TXN, 2, _now_ms(), txn=True), acks=1)
    assert not info.duplicate


@pytest.mark.unit
def test_expired_ids_do_not_come_back_at_recovery_or_truncation(tmp_path: Path) -> None:
    """Recovery replays the log, where only the batches' own timestamps are known: the same
    rule applied to them removes the producers whose records are old (IDLE's)."""
    first = _open(tmp_path)
    _fill(first)
    first.log.close()

    reopened = _open(tmp_path)
    assert sorted(reopened.producer_state.producers) == [OPEN_TXN, RECENT]
    assert reopened.producer_state.first_unstable_offset() == 2
    with pytest.raises(UnknownProducerIdError):
        reopened.append_as_leader(_batch(IDLE, 4, _now_ms()), acks=1)

    # a producer appending old records now: a truncation's rebuild keeps its append time
    reopened.append_as_leader(_batch(OLD_RECORDS, 0, _now_ms() - 3 * HOUR_MS), acks=1)
    end = reopened.log.log_end_offset
    reopened.append_as_leader(_batch(RECENT, 2, _now_ms()), acks=1)
    reopened.log.flush()
    reopened.truncate_to(end)  # a follower's truncation rebuilds the state from the log
    assert sorted(reopened.producer_state.producers) == [OPEN_TXN, RECENT, OLD_RECORDS]
    assert reopened.producer_state.producers[RECENT].last_seq == 1
    reopened.log.close()

    # the control: without expiration, recovery keeps every producer the log names
    assert sorted(_open(tmp_path, expiration_ms=None).producer_state.producers) == [
        IDLE,
        OPEN_TXN,
        RECENT,
        OLD_RECORDS,
    ]


@pytest.mark.unit
def test_the_snapshot_keeps_last_timestamps(tmp_path: Path) -> None:
    partition = _open(tmp_path, expiration_ms=None)
    _fill(partition)
    data = partition.producer_state.to_bytes()
    loaded = ProducerStateManager.from_bytes(data, "events-0")
    for pid, entry in partition.producer_state.producers.items():
        assert loaded.producers[pid].last_timestamp == entry.last_timestamp
    assert loaded.remove_expired(_now_ms() + HOUR_MS, HOUR_MS) == [IDLE, RECENT]


def _stamped(txn: TransactionManager, partition: int) -> ProducerBatch:
    batch = ProducerBatch(TopicPartition("t", partition), created=0.0, deadline=1e9, seq=0)
    batch.values += [b"a", b"b"]
    txn.stamp(batch)
    return batch


@pytest.mark.unit
def test_the_idempotent_producer_restamps_only_a_batch_surely_not_in_the_log() -> None:
    """UNKNOWN_PRODUCER_ID on a stamp's first attempt: the broker refused it, so the batch
    may take a new producer id and sequence 0. After an attempt whose outcome is unknown (a
    timeout), a copy in the log would have kept the producer's state unless it was judged by
    old record timestamps at a restart: with old records the batch fails instead (and the
    producer resets), with recent ones it is restamped."""
    config = load(ProducerConfig, {"bootstrap_servers": "127.0.0.1:9"}, {})
    txn = TransactionManager(config, Cluster(config), threading.Lock(), threading.Condition())
    with txn._seq_lock:
        txn._set_producer(7, 0)
    first, other = _stamped(txn, 0), _stamped(txn, 1)
    assert (first.producer_id, first.base_sequence, txn.needs_producer_id()) == (7, 0, False)
    assert txn.restamp_after_unknown_producer(first)
    assert (first.producer_id, first.base_sequence, first.payload) == (-1, -1, None)
    assert txn.needs_producer_id(), "a new producer id before the next stamp"
    other.timestamps += [_now_ms() - 3 * HOUR_MS] * 2
    other.encode(Compression.NONE)
    other.attempts += 1  # its first attempt timed out: it may be in the log
    assert not txn.restamp_after_unknown_producer(other)
    assert (other.producer_id, other.base_sequence) == (7, 0)
    recent = _stamped(txn, 2)
    recent.timestamps += [_now_ms()] * 2
    recent.encode(Compression.NONE)
    recent.attempts += 1
    assert txn.restamp_after_unknown_producer(recent)
    assert (recent.producer_id, recent.base_sequence) == (-1, -1)
    with txn._seq_lock:
        txn._set_producer(8, 0)
    txn._reset_pending = False
    txn.stamp(first)
    assert (first.producer_id, first.base_sequence) == (8, 0), "sequences restart"


@pytest.mark.unit
def test_the_aborted_transactions_index_follows_the_log_start(tmp_path: Path) -> None:
    """Every abort added an entry to the index, dropped only when a rebuild ran: the broker's
    maintenance now drops those below the log start, as Kafka's go with their segments."""
    partition = _open(tmp_path)
    for i in range(5):
        partition.append_as_leader(_batch(OPEN_TXN, 2 * i, _now_ms(), txn=True), acks=1)
        partition.append_marker(OPEN_TXN, 0, commit=False, coordinator_epoch=0)
    partition.log.flush()
    assert [a.first_offset for a in partition.producer_state.aborted] == [0, 3, 6, 9, 12]
    rm = ReplicaManager(BrokerConfig(broker_id=0), partition.log.storage)
    rm.partitions[TopicPartition("events", 0)] = partition
    partition.log.update_high_watermark(partition.log.log_end_offset)
    partition.log.delete_records_before(6)
    asyncio.run(rm.run_maintenance())
    assert [a.first_offset for a in partition.producer_state.aborted] == [6, 9, 12]
    assert partition.producer_state.aborted_in_range(6, 15) == partition.producer_state.aborted


@pytest.mark.unit
def test_a_replica_fetcher_left_without_partitions_goes(tmp_path: Path) -> None:
    """The fetchers (one per leader and fetcher id) no longer accumulate with every broker that
    ever led a partition here: the last partition's removal ends its fetcher, as Kafka's
    shutdownIdleFetcherThreads does. Each fetcher counts its requests instead of keeping a list
    of their sizes."""
    follower = PartitionState((1, 0), (1, 0), 1, 1, 0)
    partitions = [
        Partition(
            "events",
            i,
            Log.open(Storage.from_url(f"file://{tmp_path}/events/{i}", fsync=False), LogConfig()),
            0,
            TopicPolicy(),
            follower,
        )
        for i in range(2)
    ]

    async def scenario() -> None:
        config = BrokerConfig(broker_id=0, num_replica_fetchers=1)
        rm = ReplicaManager(config, Storage.from_url(f"file://{tmp_path}", fsync=False))
        manager = ReplicaFetcherManager(config, rm, MetadataImage)
        for partition in partitions:
            manager.add(partition)
        (fetcher,) = manager.fetchers.values()
        assert (fetcher.requests_sent, fetcher.request_bytes) == (0, 0)
        manager.remove(partitions[0])
        assert list(manager.fetchers.values()) == [fetcher], "a partition is left to fetch"
        manager.remove(partitions[1])
        assert manager.fetchers == {}
        task = fetcher._task
        assert task is not None
        await asyncio.wait_for(asyncio.shield(task), timeout=30)  # its loop ended by itself
        manager.add(partitions[0])  # a new fetcher when the leader leads here again
        assert list(manager.fetchers) == [(1, 0)]
        assert manager.fetchers[(1, 0)] is not fetcher
        await manager.shutdown()

    asyncio.run(scenario())


@pytest.mark.unit
def test_expiration_configs_are_validated() -> None:
    config = broker_config_from({})
    assert (config.producer_id_expiration_ms, config.producer_id_expiration_check_interval_ms) == (
        86_400_000,
        600_000,
    )
    with pytest.raises(ConfigError, match=r"producer.id.expiration.ms=0: must be at least 1"):
        broker_config_from({"producer.id.expiration.ms": 0})
    with pytest.raises(
        ConfigError, match=r"producer.id.expiration.check.interval.ms='soon': expected an integer"
    ):
        broker_config_from({"producer.id.expiration.check.interval.ms": "soon"})


# --- a real broker process -------------------------------------------------------------------

EXPIRATION_MS = 1500
OVERRIDES = {
    "producer.id.expiration.ms": str(EXPIRATION_MS),
    "producer.id.expiration.check.interval.ms": "100",
}
FAST = {
    "linger_ms": 2,
    "retry_backoff_ms": 20,
    "retry_backoff_max_ms": 200,
    "request_timeout_ms": 10_000,
    "delivery_timeout_ms": 60_000,
    "max_block_ms": 60_000,
}


def _producer_ids(bootstrap: str, tp: TopicPartition) -> set[int]:
    with Admin(bootstrap_servers=bootstrap) as admin:
        return {s.producer_id for s in admin.describe_producers([tp])[tp]}


def _send(prod: Producer, topic: str, partition: int, values: list[bytes]) -> dict[int, bytes]:
    """Send and wait for every ack: offset -> value."""
    futures = [prod.send(topic, v, partition=partition) for v in values]
    return {f.result(timeout=60).offset: v for f, v in zip(futures, values, strict=True)}


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_producer_ids_expire_on_a_broker_and_a_live_producer_keeps_producing(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(overrides=OVERRIDES)
    topic = unique_name("expiry")
    shared, live_tp = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topic(topic, 2, 1)

    txn = Producer(
        {
            "bootstrap_servers": broker.bootstrap,
            "transactional_id": unique_name("open"),
            "transaction_timeout_ms": 170_000,
            **FAST,
        }
    )
    live = Producer({"bootstrap_servers": broker.bootstrap, **FAST})
    try:
        txn.init_transactions()
        txn.begin_transaction()
        txn_acked = _send(txn, topic, 0, [b"txn-0", b"txn-1"])
        txn_pid = txn._txn.producer_id

        # an idempotent producer writes after the transaction's batch, then goes away
        with Producer({"bootstrap_servers": broker.bootstrap, **FAST}) as idle:
            idle_acked = _send(idle, topic, 0, [b"idle-0", b"idle-1"])
            idle_pid = idle._txn.producer_id

        acked: dict[int, bytes] = {}
        pids: list[int] = []

        def live_round(n: int) -> None:
            acked.update(_send(live, topic, 1, [b"live-%d-%d" % (n, i) for i in range(20)]))
            pids.append(live._txn.producer_id)

        live_round(0)
        # the idle id goes after the expiration; the transaction's, older, stays
        wait_until(
            lambda: idle_pid not in _producer_ids(broker.bootstrap, shared),
            message="the idle producer id to expire",
        )
        assert _producer_ids(broker.bootstrap, shared) == {txn_pid}
        for n in range(1, 3):
            wait_until(
                lambda: not _producer_ids(broker.bootstrap, live_tp),
                message="the live producer's id to expire",
            )
            live_round(n)  # its next batch is refused (UNKNOWN_PRODUCER_ID): it resets

        broker.stop()
        broker.start()
        # recovery replays the log, idle producers' batches included: they stay gone
        ids = _producer_ids(broker.bootstrap, shared)
        assert idle_pid not in ids, ids
        assert txn_pid in ids, ids
        wait_until(
            lambda: not _producer_ids(broker.bootstrap, live_tp),
            message="the live producer's id to expire after the restart",
        )
        live_round(3)

        txn_acked.update(_send(txn, topic, 0, [b"txn-2"]))
        txn.commit_transaction()
    finally:
        live.close()
        txn.close()

    assert len(set(pids)) == len(pids), f"a new producer id after each expiration: {pids}"
    read: dict[TopicPartition, dict[int, bytes]] = {shared: {}, live_tp: {}}
    for record in read_to_end(broker.bootstrap, [shared, live_tp]).records:
        read[TopicPartition(record.topic, record.partition)][record.offset] = record.value or b""
    assert read[live_tp] == acked, "every acked record once, where it was acked, nothing else"
    assert list(acked.values()) == [b"live-%d-%d" % (n, i) for n in range(4) for i in range(20)]
    expected: dict[int, Any] = {**txn_acked, **idle_acked}
    assert read[shared] == expected
