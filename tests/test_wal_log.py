"""Log over the broker WAL: many logs, one WalWriter, one object per flush; recovery of the
logs from segment objects plus WAL chunks (docs/storage.md §2.6); truncation records (§2.7);
compaction with the logs as extent holders (§2.8)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from logstore.batch import Record, build
from logstore.checkpoint import CHECKPOINT_NAME, BrokerCheckpoint, Checkpoint
from logstore.compaction import Compactor, HolderTable
from logstore.config import LogConfig
from logstore.errors import CorruptRecordError, KafkaStorageError, LogLayoutError
from logstore.log import Log, open_replica_log
from logstore.segment import ChunkSegment, LogSegment
from logstore.storage import Data, Storage
from logstore.wal import WalWriter
from logstore.wal_format import ChunkInput, encode_object, object_name
from logstore.wal_index import WAL_PREFIX, ChunkExtent, WalIndex
from tests.conftest import (
    BROKER_ROOT_KINDS,
    S3Location,
    memory_broker_root,
    open_broker_root,
)
from tests.faulty_fs import OPERATIONS, FaultyStorage
from tests.helpers import LineWorker
from tests.readback import log_values as values
from tests.wal_log_worker import TOPIC as WORKER_TOPIC
from tests.wal_log_worker import TOPIC_ID as WORKER_TOPIC_ID

PARTITIONS = 10  # the worker's default

TOPICS = {"orders": uuid.UUID(int=1).hex, "events": uuid.UUID(int=2).hex}


def batch_of(*vals: bytes, ts: int = 1000) -> bytes:
    return build([Record(None, v, ts + i) for i, v in enumerate(vals)])


class Node:
    """A broker root with one WalWriter, its WalIndex and a Log per partition (the wiring the
    broker will do): ``start`` loads the index and opens every log, ``crash`` kills the
    incarnation (every storage call of it fails from then on, as if the process were gone,
    and its writer stops without writing what it had), ``stop`` closes cleanly."""

    def __init__(self, root: Storage, partitions: list[tuple[str, int]]) -> None:
        self.base = root
        #: this incarnation's view of the root (killed by ``crash``)
        self.root: FaultyStorage = FaultyStorage(root)
        self.partitions = partitions
        self.epoch = 0
        self.config = LogConfig(file_delete_delay_ms=0, retention_ms=-1)
        self.logs: dict[tuple[str, int], Log] = {}
        self.holders = HolderTable()
        self.index: WalIndex | None = None
        self.writer: WalWriter | None = None
        self.writer_started = False

    def start(self, *, autostart: bool | None = None, linger_ms: float = 3_600_000) -> None:
        """A new incarnation. With the default linger (an hour) objects are written only when
        ``flush()`` asks (deterministic chunk boundaries). The writer spaces object starts by
        its linger but writes a mark on an idle writer at once (its fence is no start), so
        here it starts only at the first ``flush()`` with something to write (or ``stop()``):
        its first object takes every mark made before, and the hour after that start
        outlasts any test. ``linger_ms=0`` is the local-files policy (write as soon as the
        previous write is done), started at once. ``autostart``: True starts the writer at
        once, False leaves it to the test (or the first ``flush()``); None (the default): at
        once only with ``linger_ms=0``."""
        if autostart is None:
            autostart = linger_ms == 0
        self.writer_started = autostart
        self.epoch += 1
        self.root = FaultyStorage(self.base)
        self.index = WalIndex.load(self.root)
        self.writer = WalWriter(
            self.root,
            broker_id=0,
            broker_epoch=self.epoch,
            next_seq=self.index.next_seq,
            index=self.index,
            autostart=autostart,
            linger_ms=linger_ms,
        )
        self.holders = HolderTable()
        self.logs = {key: self.open(*key) for key in self.partitions}

    def open(self, topic: str, partition: int) -> Log:
        assert self.writer is not None
        assert self.index is not None
        log = Log.open(
            self.root.child(f"{topic}/{partition}"),
            self.config,
            topic_id=TOPICS[topic],
            topic=topic,
            partition=partition,
            wal_writer=self.writer,
            wal_index=self.index,
        )
        self.holders.register(TOPICS[topic], partition, log)
        return log

    def compactor(self) -> Compactor:
        assert self.index is not None
        return Compactor(
            self.root,
            self.index,
            self.holders,
            broker_id=0,
            broker_epoch=self.epoch,
            delete_delay_ms=0,
        )

    def flush(self) -> None:
        assert self.writer is not None
        if not self.writer_started:  # see start
            if all(log.durable_end_offset == log.log_end_offset for log in self.logs.values()):
                return  # nothing to write: a started writer would take nothing, start nothing
            self.start_writer()
        self.writer.flush(timeout=30)

    def start_writer(self) -> None:
        assert self.writer is not None
        self.writer.start()
        self.writer_started = True

    def crash(self) -> None:
        assert self.writer is not None
        for op in OPERATIONS:
            self.root.fail(op, 1 << 30)
        self.writer.close(drain=False, timeout=30)

    def stop(self) -> None:
        self.start_writer()  # the logs' close flushes through it
        for log in self.logs.values():
            log.close()
        assert self.writer is not None
        self.writer.close(timeout=30)


def wal_objects(root: Storage) -> list[str]:
    return sorted(info.path for info in root.list(WAL_PREFIX))


def memory_root() -> Storage:
    return memory_broker_root("test-wal-log")


@pytest.fixture(params=BROKER_ROOT_KINDS)
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    """A broker root on memory, local files, or moto S3."""
    yield from open_broker_root(request, tmp_path, "test-wal-log")


def fill(log: Log, key: tuple[str, int], count: int, epoch: int = 0) -> list[tuple[int, bytes]]:
    """Append ``count`` one-record batches; the (offset, value) pairs appended."""
    out = []
    for _ in range(count):
        offset = log.log_end_offset
        value = f"{key[0]}-{key[1]}:{offset}:e{epoch}".encode()
        assert log.append(batch_of(value), leader_epoch=epoch).first_offset == offset
        out.append((offset, value))
    return out


# --- one object per flush, reads, recovery ------------------------------------------------------


def test_many_logs_one_object_per_flush_and_reopen(root: Storage) -> None:
    storage = FaultyStorage(root)
    partitions = [(t, p) for t in TOPICS for p in range(15)]
    node = Node(storage, partitions)
    node.start(autostart=False)
    written = {key: fill(log, key, 3) for key, log in node.logs.items()}
    assert wal_objects(storage) == []
    for key, log in node.logs.items():
        assert (log.durable_end_offset, log.log_end_offset) == (0, 3)
        assert values(log) == written[key]  # from memory, before any write
    wal_writes = storage.calls["write"]
    node.start_writer()
    node.flush()
    # one fence object, then one object for all 30 partitions
    assert wal_objects(storage) == [
        f"{WAL_PREFIX}/{object_name(1, 1)}",
        f"{WAL_PREFIX}/{object_name(2, 1)}",
    ]
    assert storage.calls["write"] - wal_writes == 2
    for key, log in node.logs.items():
        assert log.durable_end_offset == 3
        (extent,) = log.extents()
        assert isinstance(extent, ChunkSegment)
        assert values(log) == written[key]
        assert log.read_from_memory(0, 1 << 20) == log.read(0, 1 << 20)
    # a second round: each log gets a second chunk, again one object
    for key, log in node.logs.items():
        written[key] += fill(log, key, 2, epoch=1)
    node.flush()
    assert len(wal_objects(storage)) == 3
    checkpoints_before = storage.calls["write"]
    for log in node.logs.values():
        log.checkpoint()  # only the HW / epochs changed: format 2, no chunk list
    assert storage.calls["write"] - checkpoints_before == len(partitions)
    for log in node.logs.values():
        assert not log.checkpoint_needed()  # a flush alone never needs a checkpoint
    node.stop()

    node.start()
    assert node.index is not None
    assert node.index.stats.scans == 0
    for key, log in node.logs.items():
        assert log.log_end_offset == log.durable_end_offset == 5
        assert values(log) == written[key]  # read from the WAL objects, CRC-checked
        assert [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.entries()] == [
            (0, 0),
            (1, 3),
        ]
        assert log.size_in_bytes == sum(e.size for e in log.extents())
        assert log.offset_for_timestamp(1000) == (0, 1000)
        doc = json.loads(log.storage.read(CHECKPOINT_NAME))
        assert (doc["format_version"], doc["topic_id"]) == (2, TOPICS[key[0]])
    for path in wal_objects(storage)[1:3]:
        assert node.index.references(path) == len(partitions)
    node.stop()


class GatedStorage(FaultyStorage):
    """WAL writes wait at a gate while it is closed (a slow store, under the test's control)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()

    def write(self, path: str, data: Data) -> None:
        if path.startswith(WAL_PREFIX + "/") and not self.gate.is_set():
            self.waiting.set()
            self.gate.wait()
        super().write(path, data)


@pytest.mark.unit
def test_durable_end_moves_only_when_the_object_is_written() -> None:
    storage = GatedStorage(memory_root())
    node = Node(storage, [("orders", 0)])
    node.start(linger_ms=0)
    node.flush()  # the fence
    log = node.logs[("orders", 0)]
    storage.gate.clear()
    written = fill(log, ("orders", 0), 4)
    assert storage.waiting.wait(30)  # the object with them is being written
    assert (log.durable_end_offset, log.log_end_offset) == (0, 4)
    assert values(log) == written
    assert log.read_from_memory(0, 1 << 20) == log.read(0, 1 << 20)
    storage.gate.set()
    node.flush()
    assert log.durable_end_offset == 4
    assert values(log) == written
    node.stop()


@pytest.mark.unit
def test_crash_recovers_every_durable_offset_and_nothing_else() -> None:
    root = memory_root()
    keys = [("orders", p) for p in range(4)]
    node = Node(root, keys)
    node.start()
    durable = {key: fill(log, key, 5) for key, log in node.logs.items()}
    node.flush()
    for key, log in node.logs.items():
        fill(log, key, 2)  # never flushed
    node.crash()
    node.start()
    for key, log in node.logs.items():
        assert log.log_end_offset == 5
        assert values(log) == durable[key]
    node.stop()


@pytest.mark.unit
def test_appends_racing_the_writer() -> None:
    """No linger (local files): the writer writes while appends go on from several threads;
    every appended record is durable after flush, and recovered."""
    root = memory_root()
    keys = [("events", p) for p in range(6)]
    node = Node(root, keys)
    node.start(linger_ms=0)
    written: dict[tuple[str, int], list[tuple[int, bytes]]] = {}

    def appender(key: tuple[str, int]) -> None:
        written[key] = fill(node.logs[key], key, 60)

    threads = [threading.Thread(target=appender, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    node.flush()
    for key, log in node.logs.items():
        assert log.durable_end_offset == 60
        assert values(log) == written[key]
    node.crash()
    node.start()
    for key, log in node.logs.items():
        assert values(log) == written[key]
    node.stop()


# --- truncation ----------------------------------------------------------------------------------


def three_chunks(node: Node, key: tuple[str, int]) -> list[tuple[int, bytes]]:
    """Three flushes of [0, 4), [4, 8), [8, 12): one chunk each."""
    log = node.logs[key]
    written = []
    for _ in range(3):
        written += fill(log, key, 4)
        node.flush()
    return written


@pytest.mark.unit
@pytest.mark.parametrize("cut", [2, 4, 6, 11])
def test_truncate_then_reopen_does_not_resurrect(cut: int) -> None:
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    written = three_chunks(node, key)
    log = node.logs[key]
    assert log.truncate_to(cut) == cut
    assert values(log) == written[:cut]
    doc = json.loads(log.storage.read(CHECKPOINT_NAME))
    assert [x for _, x in doc["truncations"]] == [cut]  # written before truncate returned
    node.crash()
    node.start()
    log = node.logs[key]
    assert log.log_end_offset == cut
    assert values(log) == written[:cut]
    node.stop()


@pytest.mark.unit
def test_truncation_waits_for_the_chunk_in_flight() -> None:
    """The object holding the log's taken batches is being written when a truncation comes:
    the truncation waits for it, then cuts, and its record covers that object's seq, so the
    disowned batches in it do not come back."""
    storage = GatedStorage(memory_root())
    key = ("orders", 0)
    node = Node(storage, [key])
    node.start(linger_ms=0)
    log = node.logs[key]
    written = fill(log, key, 4)
    node.flush()
    storage.gate.clear()
    fill(log, key, 4)  # [4, 5) is taken at once, its object stalls at the gate; [5, 8) wait
    assert storage.waiting.wait(30)
    done = threading.Event()
    result: list[int] = []

    def truncate() -> None:
        result.append(log.truncate_to(4))
        done.set()

    thread = threading.Thread(target=truncate)
    thread.start()
    assert not done.is_set()  # cannot have cut: the chunk's outcome is not known yet
    storage.gate.set()
    thread.join(30)
    assert result == [4]
    assert values(log) == written
    node.crash()
    node.start()
    assert values(node.logs[key]) == written
    node.stop()


@pytest.mark.unit
@pytest.mark.parametrize("torn_checkpoint", [False, True])
def test_truncate_append_reopen_serves_the_new_history(torn_checkpoint: bool) -> None:
    """Also when a torn write left the partition checkpoint (and its truncation record)
    unreadable: the chunks written after the truncation prove it again."""
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    written = three_chunks(node, key)
    log = node.logs[key]
    log.truncate_to(6)
    again = fill(log, key, 5, epoch=3)  # offsets 6..10 again, different bytes
    node.flush()
    expected = written[:6] + again
    assert values(log) == expected
    node.crash()
    if torn_checkpoint:
        checkpoint = f"{key[0]}/{key[1]}/{CHECKPOINT_NAME}"
        root.write(checkpoint, root.read(checkpoint)[:40])  # a prefix stored, then a crash
    node.start()
    log = node.logs[key]
    assert values(log) == expected
    assert log.end_offset_for_epoch(0) == (0, 6)
    # and a second truncation over the new chunks plus the old voided ones
    log.truncate_to(8)
    node.crash()
    node.start()
    assert values(node.logs[key]) == expected[:8]
    node.stop()


@pytest.mark.unit
def test_truncate_fully_voids_every_older_chunk() -> None:
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    three_chunks(node, key)
    log = node.logs[key]
    log.truncate_fully_and_start_at(20)
    new = fill(log, key, 3, epoch=2)
    node.flush()
    node.crash()
    node.start()
    log = node.logs[key]
    assert (log.log_start_offset, log.log_end_offset) == (20, 23)
    assert values(log) == new
    node.stop()


@pytest.mark.unit
def test_a_new_partition_ignores_chunks_of_an_earlier_incarnation() -> None:
    """A replica moved away (its directory deleted) and back: the chunks it left in the
    WAL objects are not its data any more."""
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    three_chunks(node, key)
    node.logs[key].delete()
    node.crash()
    node.start()
    log = node.logs[key]
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    node.stop()


@pytest.mark.unit
def test_a_missing_object_ends_the_log_and_stays_ended() -> None:
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    written = three_chunks(node, key)
    node.stop()
    middle = wal_objects(root)[2]  # [fence, [0,4), [4,8), [8,12)]
    root.delete(middle)
    node.start()
    log = node.logs[key]
    assert values(log) == written[:4]  # cut at the gap
    new = fill(log, key, 2, epoch=5)
    node.flush()
    node.crash()
    node.start()  # the [8, 12) chunk must not come back after the new [4, 6)
    assert values(node.logs[key]) == written[:4] + new
    node.stop()


@pytest.mark.unit
def test_truncation_records_go_once_nothing_they_void_is_left() -> None:
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    written = three_chunks(node, key)
    log = node.logs[key]
    log.truncate_to(6)
    again = fill(log, key, 3, epoch=2)
    node.flush()
    assert len(json.loads(log.storage.read(CHECKPOINT_NAME))["truncations"]) == 1
    result = node.compactor().compact()  # everything live into one packed chunk
    assert result.output is not None
    assert result.deleted  # the L0 objects with the voided bytes are gone
    node.stop()
    node.start()
    log = node.logs[key]
    assert values(log) == written[:6] + again
    assert json.loads(log.storage.read(CHECKPOINT_NAME))["truncations"] == []
    node.stop()


@pytest.mark.unit
def test_retention_over_chunks_releases_their_objects() -> None:
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.config = LogConfig(file_delete_delay_ms=0, retention_ms=-1, retention_bytes=1)
    node.start()
    written = three_chunks(node, key)
    log = node.logs[key]
    log.update_high_watermark(12)
    assert log.delete_retained_segments() == 2  # whole chunks; the last one stays
    assert log.log_start_offset == 8
    assert values(log) == written[8:]
    assert node.index is not None
    l0 = [o.path for o in node.index.objects()]
    assert [node.index.references(p) for p in l0] == [0, 0, 0, 1]  # fence, [0,4), [4,8), [8,12)
    assert len(node.compactor().collect_garbage()) == 2
    node.crash()
    node.start()
    log = node.logs[key]
    assert (log.log_start_offset, log.log_end_offset) == (8, 12)
    assert values(log) == written[8:]
    node.stop()


@pytest.mark.unit
def test_a_directory_of_another_topic_id_is_refused() -> None:
    root = memory_root()
    node = Node(root, [("orders", 0)])
    node.start()
    node.stop()
    assert node.writer is not None
    assert node.index is not None
    with pytest.raises(KafkaStorageError, match=r"topic id .* delete the directory"):
        Log.open(
            root.child("orders/0"),
            topic_id=uuid.UUID(int=99).hex,
            topic="orders",
            partition=0,
            wal_writer=node.writer,
            wal_index=node.index,
        )


@pytest.mark.unit
def test_half_the_wal_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="wal_writer, wal_index, topic_id and partition"):
        Log.open(memory_root().child("orders/0"), topic_id=TOPICS["orders"])


@pytest.mark.unit
def test_checkpoint_formats() -> None:
    v2 = Checkpoint(
        log_start_offset=3,
        high_watermark=7,
        recovery_point=9,
        epochs=((1, 3),),
        format_version=2,
        topic_id=TOPICS["orders"],
        wal_start_seq=5,
        truncations=((12, 8), (20, 6)),
    )
    assert Checkpoint.from_bytes(v2.to_bytes()) == v2
    v1 = Checkpoint(log_start_offset=3, high_watermark=7, recovery_point=9)
    doc = json.loads(v1.to_bytes())
    assert doc["format_version"] == 1
    assert "topic_id" not in doc  # exactly what format-1 code writes
    assert Checkpoint.from_bytes(v1.to_bytes()) == v1
    # a cleaned log's checkpoint: format 3 over format 1, 4 over format 2 (docs/storage.md
    # §2.10.1), which a replog without the log cleaner refuses
    for plain, on_storage in ((v1, 3), (v2, 4)):
        cleaned = dataclasses.replace(plain, clean_generation=2, cleaned_end=6)
        assert json.loads(cleaned.to_bytes())["format_version"] == on_storage
        assert Checkpoint.from_bytes(cleaned.to_bytes()) == cleaned
    with pytest.raises(CorruptRecordError, match=r"format_version 5 is not supported.*upgrade"):
        Checkpoint.from_bytes(json.dumps({**doc, "format_version": 5}).encode())


# --- the recovery walk over overlapping extents --------------------------------------------------


def one_batch(key: tuple[str, int], base: int, count: int = 2, epoch: int = 0) -> bytes:
    records = [
        Record(None, f"{key[0]}-{key[1]}:{o}".encode(), 1000 + o) for o in range(base, base + count)
    ]
    return build(records, base_offset=base, partition_leader_epoch=epoch)


@pytest.mark.unit
def test_walk_enters_an_overlapping_chunk_at_its_batch_boundary() -> None:
    """L0 [0, 4) and a packed chunk [2, 8): the walk takes [0, 4), then enters the packed
    chunk at its batch starting at 4."""
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start(autostart=False)  # writes the partition checkpoint (wal_start_seq 1)
    node.crash()
    b = {base: one_batch(key, base, epoch=base // 4) for base in (0, 2, 4, 6)}
    tid = TOPICS["orders"]
    l0, _ = encode_object(
        [ChunkInput("orders", tid, 0, [b[0], b[2]])], seq=5, broker_id=0, broker_epoch=1
    )
    root.write(f"{WAL_PREFIX}/{object_name(5, 1)}", l0)
    l1, _ = encode_object(
        [ChunkInput("orders", tid, 0, [b[2], b[4], b[6]], first_seq=6, last_seq=7)],
        seq=7,
        min_seq=6,
        level=1,
        broker_id=0,
        broker_epoch=1,
    )
    root.write(f"{WAL_PREFIX}/{object_name(7, 1, level=1, min_seq=6)}", l1)
    node.start()
    log = node.logs[key]
    assert [(e.base_offset, e.next_offset) for e in log.extents()] == [(0, 4), (4, 8)]
    assert values(log) == [(o, f"orders-0:{o}".encode()) for o in range(8)]
    assert [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.entries()] == [
        (0, 0),
        (1, 4),
    ]
    node.stop()


@pytest.mark.unit
def test_a_torn_object_gives_its_whole_batches_only() -> None:
    """An object cut mid-way (a torn write under a faulty store): the index scans it, the
    log holds the whole batches of its valid prefix and nothing partial."""
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start(autostart=False)  # the partition checkpoint (wal_start_seq 1)
    node.crash()
    batches = [one_batch(key, base, count=1) for base in range(10)]
    tid = TOPICS["orders"]
    data, index = encode_object(
        [ChunkInput("orders", tid, 0, batches)], seq=3, broker_id=0, broker_epoch=1
    )
    (chunk,) = index.chunks
    tear = chunk.position + sum(len(b) for b in batches[:6]) + len(batches[6]) // 2
    root.write(f"{WAL_PREFIX}/{object_name(3, 1)}", bytes(data[:tear]))
    node.start()
    assert node.index is not None
    assert node.index.stats.scans == 1
    log = node.logs[key]
    assert log.log_end_offset == 6
    assert values(log) == [(o, f"orders-0:{o}".encode()) for o in range(6)]
    node.stop()


@pytest.mark.unit
def test_a_flipped_byte_in_a_chunk_is_never_served(tmp_path: Path) -> None:
    root = Storage.from_url(str(tmp_path / "broker-0"))
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    written = three_chunks(node, key)
    node.stop()
    node.start()  # nothing cached: reads go to the objects
    log = node.logs[key]
    (extent,) = [e for e in log.extents() if e.base_offset == 4]
    assert isinstance(extent, ChunkSegment)
    path = tmp_path / "broker-0" / extent.chunk.object
    raw = bytearray(path.read_bytes())
    raw[extent.chunk.position + extent.chunk.size - 3] ^= 0xFF  # inside the batch of offset 7
    path.write_bytes(bytes(raw))
    assert values(log, 0, 4) == written[:4]
    with pytest.raises(CorruptRecordError, match=extent.chunk.object):
        log.read(7, 1 << 20)
    assert log.read_from_memory(7, 1 << 20) is None
    node.stop()


@pytest.mark.unit
def test_format1_directory_opens_over_the_wal_and_is_migrated() -> None:
    root = memory_root()
    key = ("orders", 0)
    legacy = Log.open(root.child("orders/0"))
    old = fill(legacy, key, 3)
    legacy.flush()
    legacy.close()
    assert json.loads(root.child("orders/0").read(CHECKPOINT_NAME))["format_version"] == 1
    node = Node(root, [key])
    node.start()
    log = node.logs[key]
    assert json.loads(log.storage.read(CHECKPOINT_NAME))["format_version"] == 2
    assert values(log) == old
    new = fill(log, key, 2, epoch=1)
    node.flush()
    kinds = [type(e) for e in log.extents()]
    assert kinds == [LogSegment, ChunkSegment]
    node.crash()
    node.start()
    log = node.logs[key]
    assert values(log) == old + new
    assert [type(e) for e in log.extents()] == [LogSegment, ChunkSegment]
    node.stop()


# --- compaction with the logs as holders ---------------------------------------------------------


def test_compaction_then_reopen(root: Storage) -> None:
    keys = [(t, p) for t in TOPICS for p in range(3)]
    node = Node(root, keys)
    node.start()
    written: dict[tuple[str, int], list[tuple[int, bytes]]] = {k: [] for k in keys}
    for _ in range(3):
        for key, log in node.logs.items():
            written[key] += fill(log, key, 2)
        node.flush()
    l0 = [p for p in wal_objects(root) if "/L0/" in p]
    assert len(l0) == 4  # the fence and three flushes
    result = node.compactor().compact()
    assert result.output is not None
    assert len(result.switched) == len(keys)
    assert len(result.deleted) == 3  # the fence is kept
    for key, log in node.logs.items():
        (extent,) = log.extents()
        assert isinstance(extent, ChunkSegment)
        assert extent.chunk.level == 1
        assert values(log) == written[key]
    for key, log in node.logs.items():
        written[key] += fill(log, key, 1)
    node.flush()
    node.stop()
    node.start()
    for key, log in node.logs.items():
        assert [(e.chunk.level, e.base_offset, e.next_offset) for e in log.extents()] == [  # type: ignore[union-attr]
            (1, 0, 6),
            (0, 6, 7),
        ]
        assert values(log) == written[key]
    node.stop()


@pytest.mark.unit
@pytest.mark.parametrize("cached", ["all", "one_evicted"])
def test_compaction_caches_the_packed_chunk_when_its_sources_were(cached: str) -> None:
    """The packed chunk's tail-cache entry is its sources' cached bytes joined (before the
    swap takes the log's lock): byte for byte the packed object's chunk, so the log's reads
    after compaction are served from memory. A source not in the cache leaves the packed
    chunk out of it too, and reads go to storage. The compactor reads from the store only
    the sources whose live chunks are not cached."""
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    written = three_chunks(node, key)
    log = node.logs[key]
    sources = log.extents()
    assert all(isinstance(e, ChunkSegment) and log._cache_get(e.name) for e in sources)
    if cached == "one_evicted":
        log._cache_drop(sources[1].name)
    result = node.compactor().compact()
    assert len(result.switched) == 1
    (extent,) = log.extents()
    assert isinstance(extent, ChunkSegment)
    c = extent.chunk
    entry = log._cache_get(extent.name)
    if cached == "all":
        assert entry == root.read_range(c.object, c.position, c.position + c.size)
        assert result.read == ()
    else:
        assert entry is None
        assert isinstance(sources[1], ChunkSegment)
        assert result.read == (sources[1].chunk.object,)
    assert all(log._cache_get(e.name) is None for e in sources)
    assert values(log) == written
    node.stop()


@pytest.mark.unit
def test_compaction_racing_a_truncation_loses() -> None:
    """A truncation shortens the chunk the compactor read: the swap is refused, nothing
    voided comes back through the packed object."""
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    written = three_chunks(node, key)
    log = node.logs[key]

    class Racing(HolderTable):
        def replace_extents(self, old: Sequence[ChunkExtent], new: ChunkExtent) -> bool:
            log.truncate_to(6)
            return super().replace_extents(old, new)

    racing = Racing()
    racing.register(TOPICS["orders"], 0, log)
    assert node.index is not None
    compactor = Compactor(root, node.index, racing, broker_id=0, broker_epoch=1, delete_delay_ms=0)
    result = compactor.compact()
    assert result.refused
    assert not result.switched
    assert values(log) == written[:6]
    node.crash()
    node.start()
    assert values(node.logs[key]) == written[:6]
    node.stop()


# --- a Hypothesis state machine against a plain model --------------------------------------------


class WalLogMachine(RuleBasedStateMachine):
    """Two logs over one WAL against a model: per partition, its (offset, value) records and
    how many of them are durable. Objects are written only by ``flush`` (and ``stop``), so a
    crash loses exactly the records appended since."""

    KEYS = (("orders", 0), ("events", 1))
    #: the writer's linger: long (objects only on flush) or 0 (written as appends come)
    LINGER_MS = 3_600_000.0

    def __init__(self) -> None:
        super().__init__()
        self.node = Node(memory_root(), list(self.KEYS))
        self.node.config = LogConfig(file_delete_delay_ms=0, retention_ms=-1)
        self.node.start(linger_ms=self.LINGER_MS)
        self.records: dict[tuple[str, int], list[tuple[int, bytes]]] = {k: [] for k in self.KEYS}
        self.start = dict.fromkeys(self.KEYS, 0)
        self.durable = dict.fromkeys(self.KEYS, 0)  # offsets below this are in WAL objects
        self.epoch = dict.fromkeys(self.KEYS, 0)
        self.counter = 0

    def end(self, key: tuple[str, int]) -> int:
        return self.start[key] + len(self.records[key])

    @rule(key=st.sampled_from(KEYS), n=st.integers(1, 3), bump=st.booleans())
    def append(self, key: tuple[str, int], n: int, bump: bool) -> None:
        if bump:
            self.epoch[key] += 1
        log = self.node.logs[key]
        for _ in range(n):
            self.counter += 1
            value = f"r{self.counter}".encode()
            info = log.append(batch_of(value), leader_epoch=self.epoch[key])
            assert info.first_offset == self.end(key)
            self.records[key].append((info.first_offset, value))

    @rule()
    def flush(self) -> None:
        self.node.flush()
        for key in self.KEYS:
            self.durable[key] = self.end(key)

    # Draws never depend on the state (a fraction of a range instead of an offset in it): with
    # linger 0 what a crash keeps varies from run to run, and Hypothesis needs the same draws.

    @rule(key=st.sampled_from(KEYS), where=st.integers(0, 100))
    def truncate(self, key: tuple[str, int], where: int) -> None:
        target = self.start[key] + (self.end(key) - self.start[key]) * where // 100
        new_end = self.node.logs[key].truncate_to(target)
        assert new_end == target  # one-record batches: every offset is a batch boundary
        del self.records[key][new_end - self.start[key] :]
        self.durable[key] = min(self.durable[key], new_end)

    @rule(key=st.sampled_from(KEYS), ahead=st.integers(0, 5))
    def truncate_fully(self, key: tuple[str, int], ahead: int) -> None:
        at = self.end(key) + ahead
        self.node.logs[key].truncate_fully_and_start_at(at)
        self.records[key] = []
        self.start[key] = self.durable[key] = at

    @rule(key=st.sampled_from(KEYS), where=st.integers(0, 100))
    def delete_records(self, key: tuple[str, int], where: int) -> None:
        log = self.node.logs[key]
        log.update_high_watermark(self.durable[key])
        cut = self.start[key] + (self.durable[key] - self.start[key]) * where // 100
        new_start = log.delete_records_before(cut)
        del self.records[key][: new_start - self.start[key]]
        self.start[key] = new_start
        self.durable[key] = max(self.durable[key], new_start)

    @rule()
    def compact(self) -> None:
        self.node.compactor().compact()

    @rule()
    def crash_and_recover(self) -> None:
        self.node.crash()
        self.node.start(linger_ms=self.LINGER_MS)
        for key in self.KEYS:
            recovered = self.node.logs[key].log_end_offset
            if self.LINGER_MS:
                assert recovered == self.durable[key]
            # a prefix at least as long as what was durable (more if written meanwhile)
            assert self.durable[key] <= recovered <= self.end(key)
            del self.records[key][recovered - self.start[key] :]
            self.durable[key] = recovered

    @rule()
    def stop_and_restart(self) -> None:
        self.node.stop()
        self.node.start(linger_ms=self.LINGER_MS)
        for key in self.KEYS:
            self.durable[key] = self.end(key)

    @invariant()
    def matches_model(self) -> None:
        for key in self.KEYS:
            log = self.node.logs[key]
            assert log.log_start_offset == self.start[key]
            assert log.log_end_offset == self.end(key)
            if self.LINGER_MS:
                assert log.durable_end_offset == self.durable[key]
            assert self.durable[key] <= log.durable_end_offset <= self.end(key)
            assert values(log) == self.records[key]

    def teardown(self) -> None:
        self.node.crash()


TestWalLogMachine = WalLogMachine.TestCase
TestWalLogMachine.settings = settings(
    max_examples=int(os.environ.get("WAL_LOG_MACHINE_EXAMPLES", "60")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWalLogMachine = pytest.mark.unit(TestWalLogMachine)


# --- SIGKILL: tests/wal_log_worker.py ------------------------------------------------------------


class Worker(LineWorker):
    """tests/wal_log_worker.py as a subprocess, its stdout read line by line on a thread."""

    def __init__(
        self,
        url: str,
        options: dict[str, Any],
        epoch: int,
        seed: int,
        fault: str,
        after: int,
        *,
        compact: bool = False,
    ) -> None:
        args = ["--url", url, "--epoch", str(epoch), "--seed", str(seed), "--fault", fault]
        args += ["--fault-after", str(after), "--storage-options", json.dumps(options)]
        args += ["--compact"] if compact else []
        super().__init__("tests.wal_log_worker", args)


class Acked:
    """What the worker's lines promise, per partition: offsets below ``end`` were durable,
    and from each printed truncation's end on, records are of its generation or later."""

    def __init__(self) -> None:
        self.end: dict[int, int] = {}
        self.truncations: dict[int, list[tuple[int, int]]] = {}

    def line(self, line: str) -> bool:
        kind, *fields = line.split()
        if kind == "D":
            p, end = map(int, fields)
            self.end[p] = max(self.end.get(p, 0), end)
        elif kind == "TRUNCATING":  # the worker may die in it: the cut may have happened
            p, end = map(int, fields)
            self.end[p] = min(self.end.get(p, 0), end)
        elif kind == "T":
            p, end, gen = map(int, fields)
            self.end[p] = min(self.end.get(p, 0), end)
            self.truncations.setdefault(p, []).append((end, gen))
        else:
            return False
        return True

    def required_gen(self, p: int, offset: int) -> int:
        return max((g for end, g in self.truncations.get(p, ()) if end <= offset), default=0)


def recovered(root: Storage, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    """Every partition's records as a restarted broker would open them (no writes: the
    writer never starts, so no fence object changes the zombie rule for the next worker)."""
    index = WalIndex.load(root)
    writer = WalWriter(
        root, broker_id=1, broker_epoch=0, next_seq=index.next_seq, index=index, autostart=False
    )
    out = {}
    for p in range(partitions):
        log = Log.open(
            root.child(f"{WORKER_TOPIC}/{p}"),
            topic_id=WORKER_TOPIC_ID,
            topic=WORKER_TOPIC,
            partition=p,
            wal_writer=writer,
            wal_index=index,
        )
        out[p] = values(log)
        assert log.log_start_offset == 0
    return out


def kill_rounds(
    url: str,
    options: dict[str, Any],
    root: Storage,
    fault: str,
    *,
    rounds: int,
    seed: str,
    compact: bool = False,
) -> None:
    rng = random.Random(seed)
    acked = Acked()
    stop_at = None if fault == "none" else "WRITING "
    for epoch in range(1, rounds + 1):
        worker = Worker(
            url,
            options,
            epoch,
            rng.randrange(1 << 30),
            fault,
            rng.randint(2, 12),
            compact=compact,
        )
        try:
            line = worker.next_line()
            assert line.startswith("READY ")
            stop_after = rng.randint(20, 200)
            reports = 0
            while True:
                line = worker.next_line()
                if acked.line(line):
                    reports += 1
                    if stop_at is None and reports >= stop_after:
                        break
                elif stop_at is not None and line.startswith(stop_at):
                    break
        finally:
            worker.kill()
        # what it printed before it died counts too (a truncation it began, more durable ends)
        for line in worker.rest():
            acked.line(line)
        assert acked.end, "the worker reported nothing durable"
        for p, records in recovered(root, PARTITIONS).items():
            assert [o for o, _ in records] == list(range(len(records)))  # contiguous from 0
            assert len(records) >= acked.end.get(p, 0), f"partition {p} lost acked offsets"
            for offset, value in records:
                vp, vo, gen = map(int, value.decode().split(":"))
                assert (vp, vo) == (p, offset)
                assert gen >= acked.required_gen(p, offset), (
                    f"partition {p} offset {offset}: generation {gen} came back after a "
                    f"truncation to generation {acked.required_gen(p, offset)}"
                )


@pytest.mark.chaos
@pytest.mark.parametrize("fault", ["none", "stall", "stall-checkpoint"])
def test_sigkill_logs_over_the_wal(tmp_path: Path, fault: str) -> None:
    """The worker appends to 10 logs over one WalWriter on local files and truncates now and
    then, printing durable ends and truncations; it is SIGKILLed at random points, while a
    WAL write is stalled, or while a truncation's checkpoint write is stalled. Reopened, every
    log holds every printed durable offset, contiguous from 0, CRC-valid, and nothing a
    printed truncation disowned; each round restarts on what the previous one left."""
    url = str(tmp_path / "broker-0")
    kill_rounds(url, {}, Storage.from_url(url), fault, rounds=4, seed=f"{fault}-19")


@pytest.mark.chaos
@pytest.mark.s3
@pytest.mark.parametrize("fault", ["none", "stall"])
def test_sigkill_logs_over_the_wal_on_s3(s3_url: S3Location, fault: str) -> None:
    """The same on moto S3."""
    options = dict(s3_url.storage_options)
    with Storage.from_url(s3_url.url, **options) as root:
        kill_rounds(s3_url.url, options, root, fault, rounds=2, seed=f"s3-{fault}-19")


@pytest.mark.chaos
@pytest.mark.parametrize("fault", ["none", "stall-l1", "stall-checkpoint"])
def test_sigkill_logs_over_the_wal_while_compacting(tmp_path: Path, fault: str) -> None:
    """As above with a compactor thread racing the appends and truncations (the logs are its
    holders, sources deleted at once): killed at random points, while a packed object's write
    is stalled, or while a truncation's checkpoint write is stalled. Same promises."""
    url = str(tmp_path / "broker-0")
    root = Storage.from_url(url)
    kill_rounds(url, {}, root, fault, rounds=4, seed=f"compact-{fault}-19", compact=True)
    assert any("/L1/" in info.path for info in root.list(WAL_PREFIX))


class ConcurrentWalLogMachine(WalLogMachine):
    """The same with the writer writing whenever anything is pending (linger 0: the policy
    for local files), so objects are written concurrently with the rules: a log's durable end
    lies between the model's and its end, and a crash keeps a prefix at least that long."""

    LINGER_MS = 0.0


TestConcurrentWalLogMachine = ConcurrentWalLogMachine.TestCase
TestConcurrentWalLogMachine.settings = TestWalLogMachine.settings
TestConcurrentWalLogMachine = pytest.mark.unit(TestConcurrentWalLogMachine)


# --- high watermarks: the broker checkpoint, not one checkpoint per partition ------------------


@pytest.mark.unit
def test_a_moving_high_watermark_does_not_rewrite_the_partition_checkpoint() -> None:
    """Over the WAL the HW is not in the partition checkpoint's change test (the broker keeps
    every HW in one object): acknowledging data writes no per-partition checkpoint."""
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    log = node.logs[key]
    fill(log, key, 3)
    node.flush()
    log.checkpoint()
    assert not log.checkpoint_needed()
    log.update_high_watermark(log.durable_end_offset)
    assert log.high_watermark == 3
    assert not log.checkpoint_needed()
    log.truncate_fully_and_start_at(10)  # what a checkpoint records still triggers one
    assert not log.checkpoint_needed()  # (truncate_fully wrote it)
    node.stop()


@pytest.mark.unit
def test_the_broker_checkpoints_hw_is_a_hint_within_the_log() -> None:
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    fill(node.logs[key], key, 5)
    node.flush()
    node.crash()
    node.start()
    assert node.logs[key].high_watermark == 0  # the partition checkpoint's
    node.crash()
    node.epoch += 1
    node.root = FaultyStorage(node.base)
    node.index = WalIndex.load(node.root)
    node.writer = WalWriter(
        node.root, broker_id=0, broker_epoch=node.epoch, next_seq=node.index.next_seq
    )
    common: dict[str, Any] = {
        "topic_id": TOPICS["orders"],
        "topic": "orders",
        "partition": 0,
        "wal_writer": node.writer,
        "wal_index": node.index,
    }
    reopened = Log.open(node.root.child("orders/0"), node.config, high_watermark_hint=4, **common)
    assert reopened.high_watermark == 4
    reopened.close()
    beyond = Log.open(node.root.child("orders/0"), node.config, high_watermark_hint=99, **common)
    assert beyond.high_watermark == beyond.log_end_offset == 5
    beyond.close()
    node.writer.close()


@pytest.mark.unit
def test_broker_checkpoint_round_trip_and_refusals() -> None:
    doc = BrokerCheckpoint({f"{'a' * 32}:0": 7, f"{'b' * 32}:3": 0})
    assert BrokerCheckpoint.from_bytes(doc.to_bytes()) == doc
    with pytest.raises(CorruptRecordError, match="format_version 9 is not supported"):
        BrokerCheckpoint.from_bytes(b'{"format_version": 9, "high_watermarks": {}}')
    with pytest.raises(CorruptRecordError, match="unreadable broker checkpoint"):
        BrokerCheckpoint.from_bytes(b'{"format_version": 1, "high_watermarks": [1]}')
    with pytest.raises(CorruptRecordError, match="unreadable broker checkpoint"):
        BrokerCheckpoint.from_bytes(b"not json")


@pytest.mark.unit
def test_a_wal_log_opened_standalone_is_refused_and_read_only_open_changes_nothing() -> None:
    """A partition written through the WAL cannot be opened as a standalone log (its tail is
    in WAL objects it would not read): the error names the broker config. A read-only open
    over the WAL (tools, tests beside a running broker) writes nothing to storage."""
    root = memory_root()
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    written = fill(node.logs[key], key, 4)
    node.flush()
    node.crash()
    with pytest.raises(LogLayoutError, match=r"log\.wal\.enable=true"):
        Log.open(root.child("orders/0"))
    before = {i.path: i.size for i in root.list()}
    log = open_replica_log(root, "orders", 0, read_only=True)
    assert values(log) == written
    assert {i.path: i.size for i in root.list()} == before
