"""The broker WAL's recovery: footers, scans, zombie incarnations and temporary files; a writer
SIGKILLed mid-flush; and a model of appends, flushes, store failures, torn writes and crashes in
any order. One object per flush and its failures: tests/test_wal.py."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from logstore.batch import Record, build, iter_batches
from logstore.buffered_source import BufferedSource
from logstore.errors import CorruptRecordError
from logstore.storage import TEMP_PREFIX, ObjectInfo, Storage
from logstore.wal import (
    WalWriter,
)
from logstore.wal_format import ChunkInput, UnsupportedWalFormatError, encode_object, object_name
from logstore.wal_index import WAL_PREFIX, ChunkExtent, WalIndex
from tests.conftest import (
    BROKER_ROOT_KINDS,
    S3Location,
    open_broker_root,
)
from tests.faulty_fs import FaultyStorage
from tests.helpers import LineWorker, wait_until
from tests.wal_sources import TOPICS, append, batch, memory_root, sources_for
from tests.wal_worker import TOPIC_ID, recover


@pytest.fixture(params=BROKER_ROOT_KINDS)
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    """A broker root on memory, local files, or moto S3."""
    yield from open_broker_root(request, tmp_path, "test-wal")


# --- recovery: footers, scans, zombies, temp files ----------------------------------------------


@pytest.mark.unit
def test_torn_object_recovers_its_valid_prefix_only(tmp_path: Path) -> None:
    """A torn object (a store that breaks atomicity) is scanned: whole CRC-valid batches of its
    valid prefix, never a partial one; truncating the file anywhere gives the same guarantee."""
    root = Storage.from_url(str(tmp_path / "broker-0"))
    storage = FaultyStorage(root)
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, fence=False, autostart=False)
    sources = sources_for(writer, 5)
    for source in sources:
        append(source, 4)
    writer.start()
    writer.close()
    durable = {(s.topic_id, s.partition): s.durable_end_offset for s in sources}
    writer = WalWriter(
        storage,
        broker_id=0,
        broker_epoch=1,
        next_seq=2,
        fence=False,
        retry_backoff_ms=1,
        autostart=False,
    )
    for source in sources:
        source.writer = writer
        append(source, 4)
    storage.tear(fraction=0.6, path_prefix=WAL_PREFIX)
    storage.fail("write", times=1_000, path_prefix=WAL_PREFIX)
    writer.start()
    wait_until(lambda: writer.stats.failures >= 2, message="the torn write and a retry")
    writer.close(drain=False)
    assert all(s.durable_end_offset == 4 for s in sources)

    torn_path = f"{WAL_PREFIX}/{object_name(2, 1)}"
    full_size = len(encode_object([], seq=2, broker_id=0, broker_epoch=1)[0])
    assert root.size(torn_path) > full_size
    index = WalIndex.load(root)
    assert index.stats.scans == 1
    torn = index.objects()[1]
    assert torn.index.scanned
    assert torn.index.reason is not None
    _check_whole_batches(root, index, durable)

    # every cut of the object: whole batches only, the first object's data intact
    path = tmp_path / "broker-0" / torn_path
    whole = path.read_bytes()
    for cut in sorted(random.Random(7).sample(range(len(whole)), 25)):
        path.write_bytes(whole[:cut])
        _check_whole_batches(root, WalIndex.load(root), durable)


def _check_whole_batches(
    storage: Storage, index: WalIndex, durable: dict[tuple[str, int], int]
) -> None:
    for (topic_id, partition), end in durable.items():
        offset = 0
        for extent in index.chunks_for(topic_id, partition):
            assert extent.base_offset == offset
            data = extent.read(storage)
            batches = list(iter_batches(data, validate=True))
            assert sum(b.size_in_bytes for b in batches) == extent.size
            assert batches[-1].next_offset == extent.next_offset
            offset = extent.next_offset
        assert offset >= end


@pytest.mark.unit
def test_flipped_byte_is_never_served() -> None:
    storage = memory_root()
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, fence=False)
    sources = sources_for(writer, 2)
    for source in sources:
        append(source, 3)
    writer.flush(timeout=30)
    writer.close()
    extent = sources[1].extents[0]
    data = bytearray(storage.read(extent.object))
    data[extent.position + 80] ^= 0x01  # inside the chunk's only batch's records
    storage.write(extent.object, data)
    index = WalIndex.load(storage)  # the footer still checks: the damage is in a batch
    assert index.stats.scans == 0
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        index.chunks_for(extent.topic_id, extent.partition)[0].read(storage)


@pytest.mark.unit
def test_zombie_rule() -> None:
    """Objects of an older broker epoch written after a newer one started are ignored: the
    newer one's fence object (its first seq) marks where it began."""
    storage = memory_root()

    def write(epoch: int, next_seq: int, partitions: int, fence: bool) -> list[BufferedSource]:
        writer = WalWriter(
            storage,
            broker_id=0,
            broker_epoch=epoch,
            next_seq=next_seq,
            fence=fence,
            autostart=False,
        )
        sources = [BufferedSource("t", TOPICS[0], p, writer=writer) for p in range(partitions)]
        for source in sources:
            append(source)
        writer.start()
        writer.flush(timeout=30)
        writer.close()
        return sources

    write(1, 1, 2, fence=True)  # epoch 1: seqs 1 (fence), 2
    new = WalIndex.load(storage)
    assert new.next_seq == 3
    # epoch 2 starts and writes only its fence (seq 3); the paused epoch 1 wakes up and
    # writes seqs 3 and 4 (it never listed epoch 2's objects)
    WalWriter(storage, broker_id=0, broker_epoch=2, next_seq=3).close()
    write(1, 3, 3, fence=False)
    write(1, 4, 3, fence=False)
    index = WalIndex.load(storage)
    assert index.zombies == [
        f"{WAL_PREFIX}/{object_name(3, 1)}",
        f"{WAL_PREFIX}/{object_name(4, 1)}",
    ]
    assert [o.path for o in index.objects()] == [
        f"{WAL_PREFIX}/{object_name(s, e)}" for s, e in ((1, 1), (2, 1), (3, 2))
    ]
    assert index.chunks_for(TOPICS[0], 2) == []  # only the zombies wrote partition 2
    assert [e.object for e in index.chunks_for(TOPICS[0], 0)] == [
        f"{WAL_PREFIX}/{object_name(2, 1)}"
    ]
    assert index.next_seq == 5


@pytest.mark.unit
def test_leftover_temp_files_are_deleted(tmp_path: Path) -> None:
    storage = Storage.from_url(str(tmp_path / "broker-0"))
    WalWriter(storage, broker_id=0, broker_epoch=1).close()
    directory = tmp_path / "broker-0" / WAL_PREFIX / "L0"
    (directory / f"{TEMP_PREFIX}dead").write_bytes(b"half an obj")
    index = WalIndex.load(storage)
    assert index.stats.temp_files_removed == 1
    assert sorted(os.listdir(directory)) == [object_name(1, 1).split("/")[1]]


@pytest.mark.unit
def test_footer_longer_than_the_tail_read() -> None:
    storage = memory_root()
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, fence=False, autostart=False)
    sources = sources_for(writer, 20)
    for source in sources:
        append(source)
    writer.start()
    writer.flush(timeout=30)
    writer.close()
    index = WalIndex.load(storage, tail_bytes=256)
    assert index.stats.extra_reads == 1
    assert index.stats.scans == 0
    assert len(index.partitions()) == len(sources)


@pytest.mark.unit
def test_unknown_format_is_refused_naming_the_object() -> None:
    storage = memory_root()
    data, _ = encode_object(
        [ChunkInput("t", TOPICS[0], 0, [batch(0, 0)])], seq=1, broker_id=0, broker_epoch=1
    )
    data[-1:] = b"2"  # trailer magic RPLWEND2
    data[4:6] = (2).to_bytes(2, "big")  # header format 2
    path = f"{WAL_PREFIX}/{object_name(1, 1)}"
    storage.write(path, data)
    with pytest.raises(UnsupportedWalFormatError, match=rf"{path}.*format 2.*[Uu]pgrade"):
        WalIndex.load(storage)


class VanishingStorage(FaultyStorage):
    """Deletes one object right after each LIST (a garbage collector racing the load)."""

    victim = ""

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        found = super().list(prefix)
        self.inner.delete(self.victim)
        return found


@pytest.mark.unit
def test_object_deleted_after_the_list_is_skipped() -> None:
    storage = VanishingStorage(memory_root())
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, autostart=False)
    sources = sources_for(writer, 2)
    for source in sources:
        append(source)
    writer.start()
    writer.close()
    storage.victim = f"{WAL_PREFIX}/{object_name(1, 1)}"  # the fence
    index = WalIndex.load(storage)
    assert [o.path for o in index.objects()] == [f"{WAL_PREFIX}/{object_name(2, 1)}"]
    assert index.next_seq == 3


@pytest.mark.unit
def test_foreign_names_are_ignored() -> None:
    storage = memory_root()
    storage.write(f"{WAL_PREFIX}/L0/notes.txt", b"hello")
    index = WalIndex.load(storage)
    assert index.foreign == [f"{WAL_PREFIX}/L0/notes.txt"]
    assert index.objects() == []


@pytest.mark.unit
def test_references() -> None:
    storage = memory_root()
    index = WalIndex.load(storage)
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, index=index, autostart=False)
    sources = sources_for(writer, 3)
    for source in sources:
        append(source)
    writer.start()
    writer.flush(timeout=30)
    writer.close()
    fence, data = (o.path for o in index.objects())
    assert index.unreferenced() == [fence]
    assert index.references(data) == len(sources)
    index.release(data, len(sources) - 1)
    assert index.unreferenced() == [fence]
    index.release(data)
    assert index.unreferenced() == [fence, data]
    with pytest.raises(ValueError, match="releasing"):
        index.release(data)
    # after a restart, references start at 0 and logs acquire what they open
    reloaded = WalIndex.load(storage)
    assert reloaded.unreferenced() == [fence, data]
    for source in sources:
        for extent in reloaded.chunks_for(source.topic_id, source.partition):
            reloaded.acquire(extent.object)
    assert reloaded.unreferenced() == [fence]
    # retire: forgets only an unreferenced object, atomically with the check
    assert not reloaded.retire(data)
    assert reloaded.retire(fence)
    assert [o.path for o in reloaded.objects()] == [data]
    reloaded.remove_object(data)
    assert reloaded.partitions() == set()


@pytest.mark.unit
def test_retire_many_forgets_only_the_unreferenced() -> None:
    """The garbage collector's batch: unreferenced objects go together, their chunks leave
    every partition's list, and referenced ones (and unknown paths) stay as they were."""
    storage = memory_root()
    index = WalIndex.load(storage)
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, index=index)
    sources = sources_for(writer, 2)
    for _ in range(4):
        for source in sources:
            append(source)
        writer.flush(timeout=30)
    writer.close()
    fence, *data = (o.path for o in index.objects())
    assert len(data) >= 4
    for path in data:
        index.release(path, index.references(path))
    held = data[1]
    index.acquire(held)  # a reader still holds it
    before = {(s.topic_id, s.partition): index.chunks_for(s.topic_id, s.partition) for s in sources}
    gone = index.retire_many([fence, *data, f"{WAL_PREFIX}/L0/never-was.wal"])
    assert sorted(gone) == sorted({fence, *data} - {held})
    assert [o.path for o in index.objects()] == [held]
    for key, extents in before.items():
        assert index.chunks_for(*key) == [e for e in extents if e.object == held]
    index.release(held)
    assert index.retire_many([held]) == [held]
    assert index.objects() == []
    assert index.partitions() == set()


# --- SIGKILL mid-flush ------------------------------------------------------------------------


class Worker(LineWorker):
    """tests/wal_worker.py as a subprocess, its stdout read line by line on a thread."""

    def __init__(
        self, url: str, options: dict[str, Any], epoch: int, seed: int, fault: str, after: int
    ) -> None:
        args = ["--url", url, "--epoch", str(epoch), "--seed", str(seed), "--fault", fault]
        args += ["--fault-after", str(after), "--storage-options", json.dumps(options)]
        super().__init__("tests.wal_worker", args)


@pytest.mark.chaos
@pytest.mark.parametrize("fault", ["none", "stall", "tear"])
def test_sigkill_mid_flush(tmp_path: Path, fault: str) -> None:
    """The worker appends to 20 partitions through a WalWriter on local files and prints each
    durable end; it is SIGKILLed at random points (after a random number of durable
    reports), while a WAL write is stalled, or after a torn write. Then every printed offset
    is recovered, contiguous from 0, CRC-valid, with its own value; nothing partial is
    returned. Each round restarts from what the previous one recovered, with a new epoch."""
    url = str(tmp_path / "broker-0")
    kill_rounds(url, {}, Storage.from_url(url), fault, rounds=4)


@pytest.mark.chaos
@pytest.mark.s3
@pytest.mark.parametrize("fault", ["none", "stall"])
def test_sigkill_mid_flush_on_s3(s3_url: S3Location, fault: str) -> None:
    """The same on moto S3 (a PUT is atomic: the object is whole or absent)."""
    options = dict(s3_url.storage_options)
    with Storage.from_url(s3_url.url, **options) as storage:
        kill_rounds(s3_url.url, options, storage, fault, rounds=3)


def kill_rounds(
    url: str, options: dict[str, Any], storage: Storage, fault: str, *, rounds: int
) -> None:
    rng = random.Random(f"{fault}-19")
    acked: dict[int, int] = {}
    for epoch in range(1, rounds + 1):
        worker = Worker(url, options, epoch, rng.randrange(1 << 30), fault, rng.randint(2, 12))
        try:
            line = worker.next_line()
            assert line.startswith("READY ")
            ready = {int(p): end for p, end in json.loads(line[6:]).items()}
            for p, end in acked.items():
                assert ready[p] >= end, f"partition {p}: restarted at {ready[p]} < acked {end}"
            stop_after = rng.randint(20, 300)
            reports = 0
            while True:
                line = worker.next_line()
                if line.startswith("D "):
                    _, partition, offset = line.split()
                    acked[int(partition)] = max(acked.get(int(partition), 0), int(offset))
                    reports += 1
                    if fault == "none" and reports >= stop_after:
                        break
                elif (fault == "stall" and line.startswith("WRITING ")) or (
                    fault == "tear" and line.startswith("FAILED ")
                ):
                    break
        finally:
            worker.kill()
        index = WalIndex.load(storage)
        if fault == "tear":  # one torn object per round so far
            assert index.stats.scans == epoch
        assert acked, "the worker reported nothing durable"
        for p in range(20):
            records = recover(storage, index, p)
            assert records == [(o, f"{p}:{o}".encode()) for o in range(len(records))]
            assert len(records) >= acked.get(p, 0), f"partition {p} lost acked offsets"
        _check_whole_batches_all(storage, index)


def _check_whole_batches_all(storage: Storage, index: WalIndex) -> None:
    """Every chunk in the index is whole CRC-valid batches, exactly its size."""
    for topic_id, partition in index.partitions():
        for extent in index.chunks_for(topic_id, partition):
            assert isinstance(extent, ChunkExtent)
            assert topic_id == TOPIC_ID
            data = extent.read(storage)
            assert sum(b.size_in_bytes for b in iter_batches(data)) == extent.size


# --- a model: appends, flushes, store failures, torn writes and crashes in any order ------------


class WalMachine(RuleBasedStateMachine):
    """Sources over a WalWriter on a FaultyStorage, against a model of what was appended.

    After any sequence of appends, failing and torn writes and crashes (the writer dropped
    mid-way, the index reloaded, a new broker epoch started on what it recovered), every
    offset a source reported durable is recovered with the value appended there, and what is
    recovered is a prefix of what was appended: never a hole, a partial batch, or a value
    that was not written.
    """

    PARTITIONS = 4

    def __init__(self) -> None:
        super().__init__()
        self.storage = FaultyStorage(memory_root())
        self.epoch = 0
        self.appended: dict[int, list[bytes]] = {p: [] for p in range(self.PARTITIONS)}
        self.acked = dict.fromkeys(range(self.PARTITIONS), 0)
        self.writer: WalWriter | None = None
        self._start(WalIndex.load(self.storage))

    def _start(self, index: WalIndex) -> None:
        self.epoch += 1
        self.writer = WalWriter(
            self.storage,
            broker_id=0,
            broker_epoch=self.epoch,
            next_seq=index.next_seq,
            retry_backoff_ms=1,
            retry_backoff_max_ms=2,
        )
        self.sources = [
            BufferedSource(
                "t",
                TOPIC_ID,
                p,
                next_offset=len(self.appended[p]),
                writer=self.writer,
                on_durable=self._acker(p),
            )
            for p in range(self.PARTITIONS)
        ]

    def _acker(self, partition: int) -> Callable[[int], None]:
        return lambda end: self._ack(partition, end)

    def _ack(self, partition: int, end: int) -> None:
        self.acked[partition] = max(self.acked[partition], end)

    @rule(partition=st.integers(0, PARTITIONS - 1), count=st.integers(1, 3))
    def append(self, partition: int, count: int) -> None:
        source = self.sources[partition]
        base = source.log_end_offset
        values = [f"{partition}:{o}:{self.epoch}".encode() for o in range(base, base + count)]
        records = [Record(None, v, 1000) for v in values]
        source.append(build(records, base_offset=base, partition_leader_epoch=self.epoch))
        self.appended[partition].extend(values)

    @rule()
    def flush(self) -> None:
        assert self.writer is not None
        self.writer.flush(timeout=30)
        for p, source in enumerate(self.sources):
            assert source.durable_end_offset == len(self.appended[p])

    @rule(times=st.integers(1, 3))
    def fail_writes(self, times: int) -> None:
        self.storage.fail("write", times=times, path_prefix=WAL_PREFIX)

    @rule(fraction=st.floats(0, 0.99))
    def tear_a_write(self, fraction: float) -> None:
        self.storage.tear(fraction=fraction, path_prefix=WAL_PREFIX)

    @rule(stuck=st.booleans())
    def crash(self, stuck: bool) -> None:
        """Drop the writer (with ``stuck``, its writes keep failing: what it took is lost),
        reload the index, check it, and start a new epoch on what was recovered."""
        assert self.writer is not None
        if stuck:
            self.storage.fail("write", times=1_000_000, path_prefix=WAL_PREFIX)
        self.writer.close(drain=False, timeout=30)
        self.storage.heal()
        index = WalIndex.load(self.storage)
        for p in range(self.PARTITIONS):
            records = recover(self.storage, index, p)
            assert [o for o, _ in records] == list(range(len(records)))
            assert [v for _, v in records] == self.appended[p][: len(records)]
            assert len(records) >= self.acked[p], f"partition {p} lost acknowledged offsets"
            self.appended[p] = self.appended[p][: len(records)]
            self.acked[p] = len(records)
        self._start(index)

    @invariant()
    def durable_never_passes_appended(self) -> None:
        for p, source in enumerate(self.sources):
            assert source.durable_end_offset <= source.log_end_offset == len(self.appended[p])

    def teardown(self) -> None:
        if self.writer is not None:
            self.storage.heal()
            self.writer.close(drain=False, timeout=30)


TestWalMachine = pytest.mark.unit(WalMachine.TestCase)
TestWalMachine.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
