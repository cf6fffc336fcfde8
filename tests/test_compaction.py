"""WAL compaction, L0 -> L1 (logstore.compaction): reads unchanged, one PUT per round whatever
the partition count, references and delayed deletes, and SIGKILL mid-compaction."""

from __future__ import annotations

import dataclasses
import json
import random
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from logstore.batch import Record, build, iter_batches
from logstore.buffered_source import BufferedSource
from logstore.compaction import Compactor, fences, round_phase
from logstore.errors import StorageError
from logstore.storage import Storage
from logstore.wal import WalWriter
from logstore.wal_format import WalObjectIndex, object_name
from logstore.wal_index import WAL_PREFIX, ChunkExtent, WalIndex
from tests.compaction_worker import ExtentTable
from tests.conftest import (
    BROKER_ROOT_KINDS,
    S3Location,
    memory_broker_root,
    open_broker_root,
)
from tests.faulty_fs import FaultyStorage
from tests.helpers import LineWorker

TOPICS = (uuid.UUID(int=1).hex, uuid.UUID(int=2).hex)

Key = tuple[str, int]


def memory_root() -> Storage:
    return memory_broker_root("test-compaction")


@pytest.fixture(params=BROKER_ROOT_KINDS)
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    """A broker root on memory, local files, or moto S3."""
    yield from open_broker_root(request, tmp_path, "test-compaction")


def write_l0(
    storage: Storage,
    keys: Sequence[Key],
    *,
    flushes: int,
    batches_per_flush: int,
    epoch: int = 1,
    next_seq: int = 1,
    seed: int = 0,
) -> dict[Key, list[tuple[int, bytes]]]:
    """``flushes`` L0 objects (after a fence object) of ``batches_per_flush`` one-record
    batches spread over ``keys``; what each partition holds, as (offset, value)."""
    rng = random.Random(seed)
    written: dict[Key, list[tuple[int, bytes]]] = {key: [] for key in keys}
    sources = {key: BufferedSource(f"topic-{key[0][-1]}", key[0], key[1]) for key in keys}
    seq = next_seq
    for flush in range(flushes):
        writer = WalWriter(
            storage,
            broker_id=1,
            broker_epoch=epoch,
            next_seq=seq,
            fence=flush == 0,
            autostart=False,
        )
        for i in range(batches_per_flush):
            key = keys[(flush * batches_per_flush + i) % len(keys)]
            source = sources[key]
            source.writer = writer
            end = source.log_end_offset
            value = f"{key[1]}:{end}:{rng.randrange(1 << 30)}".encode()
            source.append(build([Record(None, value, 1000 + end)], base_offset=end))
            written[key].append((end, value))
        writer.start()
        writer.close()
        seq = writer.next_seq
    return written


def open_table(storage: Storage) -> tuple[WalIndex, ExtentTable]:
    index = WalIndex.load(storage)
    return index, ExtentTable(storage, index)


def keys_of(partitions: int) -> list[Key]:
    return [(topic_id, p) for topic_id in TOPICS for p in range(partitions)]


def wal_paths(storage: Storage) -> list[str]:
    return [info.path for info in storage.list(WAL_PREFIX)]


# --- a round ----------------------------------------------------------------------------------


def test_reads_identical_before_and_after(root: Storage) -> None:
    written = write_l0(root, keys_of(5), flushes=6, batches_per_flush=25)
    index, table = open_table(root)
    before = {key: table.read(*key) for key in written}
    assert before == written
    sources = [o.path for o in index.objects() if o.index.chunks]
    assert len(sources) == 6

    compactor = Compactor(root, index, table, broker_id=1, broker_epoch=1, delete_delay_ms=0)
    result = compactor.compact()
    assert result.sources == tuple(sources)
    assert result.output == f"{WAL_PREFIX}/{object_name(7, 1, level=1, min_seq=2)}"
    assert result.index is not None
    assert len(result.index.chunks) == len(written)  # one chunk per partition
    for chunk in result.index.chunks:
        assert (chunk.first_seq, chunk.last_seq) == (2, 7)
    assert sorted(result.deleted) == sources
    assert {key: table.read(*key) for key in written} == written
    # the fence stays; everything else is in the packed object
    assert wal_paths(root) == [f"{WAL_PREFIX}/{object_name(1, 1)}", result.output]

    index, table = open_table(root)  # recovery over the new layout
    assert index.stats.scans == 0
    assert {key: table.read(*key) for key in written} == written
    assert all(e.level == 1 for key in written for e in table.live_chunks(*key))


@pytest.mark.unit
@pytest.mark.parametrize("partitions", [1, 100])
def test_request_count_does_not_depend_on_partitions(partitions: int) -> None:
    """The same bytes (200 batches in 10 flushes) into 1 or 100 partitions: one GET per
    source, one PUT, one DELETE per source, and no other request."""
    storage = FaultyStorage(memory_root())
    keys = [(TOPICS[0], p) for p in range(partitions)]
    write_l0(storage, keys, flushes=10, batches_per_flush=20)
    index, table = open_table(storage)
    before = storage.calls
    compactor = Compactor(storage, index, table, broker_id=1, broker_epoch=1, delete_delay_ms=0)
    result = compactor.compact()
    calls = storage.calls - before
    assert result.index is not None
    assert len(result.index.chunks) == partitions
    # a LIST before deleting: has a newer broker epoch written here?
    assert dict(calls) == {"read": 10, "write": 1, "list": 1, "delete": 10}


@pytest.mark.unit
def test_a_step_back_of_the_wall_clock_does_not_hold_a_round_back() -> None:
    storage = memory_root()
    write_l0(storage, keys_of(2), flushes=3, batches_per_flush=2)
    index, table = open_table(storage)
    monotonic = [100.0]
    compactor = Compactor(
        storage, index, table, broker_id=1, broker_epoch=1, clock=lambda: monotonic[0]
    )
    sources = compactor.l0_sources()
    created = min(o.index.created_ms for o in index.objects())
    stepped_back = created - 600_000  # the clock went back 10 minutes after the writes
    assert compactor.next_round(window_bytes=1 << 30, now_ms=stepped_back) == ([], 60.0)
    monotonic[0] += 60.5
    assert compactor.due_sources(window_bytes=1 << 30, now_ms=stepped_back + 60_500) == sources


@pytest.mark.unit
def test_due_sources_by_bytes_and_by_age() -> None:
    storage = memory_root()
    write_l0(storage, keys_of(2), flushes=6, batches_per_flush=4)
    index, table = open_table(storage)
    compactor = Compactor(storage, index, table, broker_id=1, broker_epoch=1)
    sources = compactor.l0_sources()
    objects = {o.path: o.index for o in index.objects()}
    sizes = [objects[p].object_size for p in sources]
    created = min(objects[p].created_ms for p in sources)
    young = created + 1000
    assert compactor.due_sources(window_bytes=sum(sizes) + 1, now_ms=young) == []
    # enough bytes: the oldest objects up to the window
    window = sum(sizes[:4])
    assert compactor.due_sources(window_bytes=window, now_ms=young) == sources[:4]
    # old enough: everything the window holds
    old = created + 60_000
    assert compactor.due_sources(window_bytes=10 * sum(sizes), now_ms=old) == sources
    # a window smaller than one object still makes progress
    assert compactor.due_sources(window_bytes=1, now_ms=young) == sources[:1]
    # when nothing is due: the seconds until the oldest comes of age (the broker's compaction
    # loop sleeps that long unless more is written, rather than checking every second)
    assert compactor.next_round(window_bytes=sum(sizes) + 1, now_ms=young) == ([], 59.0)
    assert compactor.next_round(window_bytes=window, now_ms=young) == (sources[:4], 0.0)
    compactor.compact(sources)
    assert compactor.next_round(now_ms=young) == ([], None)


@pytest.mark.unit
def test_the_live_l0_tally_follows_references() -> None:
    """The index keeps the live L0 objects and their bytes as references change (the
    compaction loop reads the sum at every check instead of listing every object): only L0
    objects with chunks some log refers to count; the fence never does."""
    storage = memory_root()
    write_l0(storage, keys_of(2), flushes=6, batches_per_flush=4)
    index, table = open_table(storage)

    def scanned() -> list[str]:  # the tally's meaning, by a full scan
        return sorted(
            o.path
            for o in index.objects()
            if o.name.level == 0 and o.index.chunks and index.references(o.path) > 0
        )

    def size(paths: list[str]) -> int:
        sizes = {o.path: o.index.object_size for o in index.objects()}
        return sum(sizes[p] for p in paths)

    live = scanned()
    assert len(live) == 6  # the fence holds no chunk
    assert [o.path for o in index.l0_live()] == live
    assert index.l0_live_bytes() == size(live)
    first = live[0]
    held = index.references(first)
    index.release(first, held)  # its holders dropped it: garbage, not a source
    assert [o.path for o in index.l0_live()] == live[1:] == scanned()
    assert index.l0_live_bytes() == size(live[1:])
    index.acquire(first)
    assert index.l0_live_bytes() == size(live)
    index.release(first)
    assert index.retire(first)
    assert index.l0_live_bytes() == size(live[1:])
    compactor = Compactor(storage, index, table, broker_id=1, broker_epoch=1, phase=0.5)
    total = index.l0_live_bytes()
    # with the phase, 1.5 windows must be live
    assert compactor.bytes_due(window_bytes=total * 2 // 3)
    assert not compactor.bytes_due(window_bytes=total * 2 // 3 + 2)
    result = compactor.compact()
    assert result.output is not None
    assert index.l0_live() == []
    assert index.l0_live_bytes() == 0 == len(scanned())
    assert not compactor.bytes_due(window_bytes=1)


@pytest.mark.unit
def test_a_phase_holds_every_round_back_by_its_share_of_a_window() -> None:
    """With a phase p a round comes once (1 + p) windows are live and takes one window, so
    the broker's live bytes run between p and 1 + p windows and its rounds stay p of a window
    (in bytes ingested) after a broker with phase 0, round after round (replicas fed the same
    bytes then never compact at the same moment, even after a backlog left them with equal
    live bytes). The age trigger is unchanged."""
    storage = memory_root()
    write_l0(storage, keys_of(2), flushes=12, batches_per_flush=4)
    index, table = open_table(storage)
    phased = Compactor(storage, index, table, broker_id=1, broker_epoch=1, phase=0.5)
    plain = Compactor(storage, index, table, broker_id=1, broker_epoch=1)
    sources = phased.l0_sources()
    objects = {o.path: o.index for o in index.objects()}
    sizes = [objects[p].object_size for p in sources]
    young = min(objects[p].created_ms for p in sources) + 1000
    total = sum(sizes)
    window = sum(sizes[:5])  # 12 objects hold more than 1.5 windows of 5
    assert total >= 1.5 * window

    def oldest(start: int, limit: int) -> list[str]:
        """The oldest sources from ``start`` whose sizes add up to at most ``limit``."""
        out: list[str] = []
        size = 0
        for path, n in zip(sources[start:], sizes[start:], strict=True):
            if out and size + n > limit:
                break
            out.append(path)
            size += n
        return out

    # live bytes between one and 1.5 windows: due without the phase only
    between = int(total / 1.25)
    assert between <= total < 1.5 * between
    assert plain.next_round(window_bytes=between, now_ms=young)[0] == oldest(0, between)
    assert phased.next_round(window_bytes=between, now_ms=young)[0] == []
    assert plain.bytes_due(between)
    assert not phased.bytes_due(between)
    # past 1.5 windows: a round of one window, the oldest first
    first = phased.next_round(window_bytes=window, now_ms=young)[0]
    assert first == sources[:5]
    assert phased.bytes_due(window)
    phased.compact(first)
    # what is left (7 objects: less than 1.5 windows) waits with the phase, not without it:
    # the phase was not spent by the round
    left = sum(sizes[5:])
    assert window <= left < 1.5 * window
    assert plain.next_round(window_bytes=window, now_ms=young)[0] == oldest(5, window)
    assert phased.next_round(window_bytes=window, now_ms=young) == (
        [],
        (objects[sources[5]].created_ms + 60_000 - young) / 1000,
    )
    assert not phased.bytes_due(window)
    # old enough: due whatever the phase
    old = objects[sources[5]].created_ms + 60_000
    assert phased.next_round(window_bytes=window, now_ms=old)[0] == oldest(5, window)
    with pytest.raises(ValueError, match="phase"):
        Compactor(storage, index, table, broker_id=1, broker_epoch=1, phase=1.0)


@pytest.mark.unit
def test_round_phases_put_consecutive_broker_ids_a_third_apart() -> None:
    for first in (0, 1, 7, 100):
        phases = sorted(round_phase(b) for b in range(first, first + 3))
        assert phases == [0.0, 1 / 3, 2 / 3]


@pytest.mark.unit
def test_deletes_wait_for_the_delay_and_for_references() -> None:
    storage = memory_root()
    written = write_l0(storage, keys_of(3), flushes=3, batches_per_flush=6)
    index, table = open_table(storage)
    now = [100.0]
    compactor = Compactor(
        storage,
        index,
        table,
        broker_id=1,
        broker_epoch=1,
        delete_delay_ms=5000,
        clock=lambda: now[0],
    )
    result = compactor.compact()
    assert result.deleted == ()
    assert len(wal_paths(storage)) == 5  # fence, 3 sources, the packed object
    # a reader (a Spark plan, say) takes a reference on one source meanwhile
    held = result.sources[0]
    index.acquire(held)
    now[0] += 4.9
    assert compactor.collect_garbage() == []
    now[0] += 0.2
    assert compactor.collect_garbage() == list(result.sources[1:])
    index.release(held)
    assert compactor.collect_garbage() == []  # its delay starts now
    now[0] += 5
    assert compactor.collect_garbage() == [held]
    assert {key: table.read(*key) for key in written} == written
    assert wal_paths(storage) == [f"{WAL_PREFIX}/{object_name(1, 1)}", result.output]


class RefusingTable(ExtentTable):
    """A holder whose partition ``refuse`` changed meanwhile (a truncation, say)."""

    refuse: Key = ("", -1)

    def replace_extents(self, old: Sequence[ChunkExtent], new: ChunkExtent) -> bool:
        if (new.topic_id, new.partition) == self.refuse:
            return False
        return super().replace_extents(old, new)


@pytest.mark.unit
def test_a_holder_that_changed_keeps_its_extents() -> None:
    storage = memory_root()
    written = write_l0(storage, keys_of(2), flushes=2, batches_per_flush=4)
    index = WalIndex.load(storage)
    table = RefusingTable(storage, index)
    table.refuse = (TOPICS[1], 1)
    compactor = Compactor(storage, index, table, broker_id=1, broker_epoch=1, delete_delay_ms=0)
    result = compactor.compact()
    assert [(e.topic_id, e.partition) for e in result.refused] == [table.refuse]
    assert len(result.switched) == 3
    assert result.deleted == ()  # every source still holds the refusing partition's chunks
    assert result.output is not None
    assert index.references(result.output) == 3
    assert {key: table.read(*key) for key in written} == written
    _, reopened = open_table(storage)
    assert {key: reopened.read(*key) for key in written} == written


@pytest.mark.unit
def test_only_live_bytes_are_copied() -> None:
    """A truncation cut a live extent short (its object keeps the bytes): the packed chunk
    holds only what the holder says is live."""
    storage = memory_root()
    key = (TOPICS[0], 0)
    written = write_l0(storage, [key], flushes=2, batches_per_flush=3)
    index, table = open_table(storage)
    first, second = table.extents[key]
    sizes = [b.size_in_bytes for b in iter_batches(second.read(storage))]
    cut = dataclasses.replace(second, size=sizes[0], next_offset=second.base_offset + 1)
    table.extents[key] = [first, cut]
    compactor = Compactor(storage, index, table, broker_id=1, broker_epoch=1, delete_delay_ms=0)
    result = compactor.compact()
    assert result.index is not None
    (chunk,) = result.index.chunks
    assert (chunk.base_offset, chunk.next_offset) == (0, 4)
    assert table.read(*key) == written[key][:4]


@pytest.mark.unit
def test_fences_are_never_deleted() -> None:
    """The lowest L0 seq of each broker epoch fences older epochs (zombie rule): kept."""
    storage = memory_root()
    keys = keys_of(2)
    write_l0(storage, keys, flushes=2, batches_per_flush=4, epoch=1)
    index = WalIndex.load(storage)
    write_l0(storage, keys[:1], flushes=2, batches_per_flush=2, epoch=2, next_seq=index.next_seq)
    index, table = open_table(storage)
    expected_fences = {f"{WAL_PREFIX}/{object_name(1, 1)}", f"{WAL_PREFIX}/{object_name(4, 2)}"}
    assert fences(index.objects()) == expected_fences
    compactor = Compactor(storage, index, table, broker_id=1, broker_epoch=3, delete_delay_ms=0)
    result = compactor.compact()
    assert len(result.deleted) == 4
    assert set(wal_paths(storage)) == expected_fences | {result.output}
    assert WalIndex.load(storage).zombies == []


@pytest.mark.unit
def test_a_torn_source_contributes_its_valid_prefix(tmp_path: Path) -> None:
    """A torn L0 object (a faulty store) is scanned at load: compaction copies exactly what
    recovery serves from it, and reads stay the same after the round and after a reload."""
    storage = Storage.from_url(str(tmp_path / "broker-0"))
    written = write_l0(storage, keys_of(4), flushes=4, batches_per_flush=16)
    torn = tmp_path / "broker-0" / WAL_PREFIX / object_name(4, 1)
    torn.write_bytes(torn.read_bytes()[: int(torn.stat().st_size * 0.6)])
    index, table = open_table(storage)
    assert index.stats.scans == 1
    before = {key: table.read(*key) for key in written}
    assert before != written  # the torn object cut some partitions short
    for key, records in before.items():
        assert records == written[key][: len(records)]
    compactor = Compactor(storage, index, table, broker_id=1, broker_epoch=1, delete_delay_ms=0)
    result = compactor.compact()
    assert len(result.deleted) == 4
    assert {key: table.read(*key) for key in written} == before
    _, reopened = open_table(storage)
    assert {key: reopened.read(*key) for key in written} == before


@pytest.mark.unit
def test_a_round_without_sources_still_collects_garbage() -> None:
    storage = memory_root()
    write_l0(storage, keys_of(1), flushes=2, batches_per_flush=2)
    index, table = open_table(storage)
    compactor = Compactor(storage, index, table, broker_id=1, broker_epoch=1, delete_delay_ms=0)
    first = compactor.compact()
    assert compactor.compact().output is None
    assert first.output is not None
    for key in list(table.extents):  # retention drops everything
        for extent in table.extents.pop(key):
            index.release(extent.object)
    # the newest object stays (it carries the highest seq the next incarnation continues
    # from), so garbage needs a newer object first
    assert compactor.compact().deleted == ()
    newer = WalWriter(storage, broker_id=1, broker_epoch=1, next_seq=index.next_seq + 10)
    newer.close()  # an empty object of seq next + 10: the newest now
    index.add_object(*_listed_fence(storage, newer))
    assert compactor.compact().deleted == (first.output,)


def _listed_fence(storage: Storage, writer: WalWriter) -> tuple[str, WalObjectIndex]:
    fresh = WalIndex.load(storage, delete_temp_files=False)
    newest = max(fresh.objects(), key=lambda o: o.name.max_seq)
    assert newest.name.max_seq == writer.next_seq - 1
    return newest.path, newest.index


@pytest.mark.unit
def test_seqs_never_go_back_after_the_newest_objects_are_collected() -> None:
    """Everything written is compacted and then dropped (retention, truncate_fully): the
    collector deletes every object but the newest, so a restart continues above every seq
    written (checkpoints name seqs: wal_start_seq and truncation records; a reused seq would
    void new chunks as if they had been written before)."""
    storage = memory_root()
    write_l0(storage, keys_of(2), flushes=4, batches_per_flush=3)
    index, table = open_table(storage)
    highest = index.next_seq - 1
    compactor = Compactor(storage, index, table, broker_id=1, broker_epoch=1, delete_delay_ms=0)
    compactor.compact()
    for key in list(table.extents):
        for extent in table.extents.pop(key):
            index.release(extent.object)
    compactor.collect_garbage()
    assert WalIndex.load(storage).next_seq == highest + 1


@pytest.mark.unit
def test_a_superseded_compactor_deletes_nothing() -> None:
    """A paused incarnation resumed after its successor (a newer broker epoch) started must
    not delete: the successor's index may rely on those objects."""
    storage = memory_root()
    written = write_l0(storage, keys_of(2), flushes=3, batches_per_flush=4, epoch=1)
    index, table = open_table(storage)
    compactor = Compactor(storage, index, table, broker_id=1, broker_epoch=1, delete_delay_ms=0)
    successor = WalWriter(storage, broker_id=1, broker_epoch=2, next_seq=index.next_seq)
    successor.close()  # its fence object is written
    before = set(wal_paths(storage))
    result = compactor.compact()
    assert result.deleted == ()
    assert compactor.superseded
    assert set(wal_paths(storage)) == before | {result.output}
    _, reopened = open_table(storage)
    assert {key: reopened.read(*key) for key in written} == written


# --- SIGKILL mid-compaction -------------------------------------------------------------------


class Worker(LineWorker):
    """tests/compaction_worker.py as a subprocess, its stdout read line by line on a thread."""

    def __init__(self, url: str, options: dict[str, Any], epoch: int, fault: str, n: int) -> None:
        args = ["--url", url, "--epoch", str(epoch), "--seed", str(epoch), "--fault", fault]
        args += ["--deletes-before-stall", str(n), "--storage-options", json.dumps(options)]
        super().__init__("tests.compaction_worker", args)

    def wait_for(self, prefix: str, timeout: float = 120) -> str:
        """The next line that starts with ``prefix`` (the lines before it are passed over)."""
        while not (line := self.next_line(timeout)).startswith(prefix):
            pass
        return line


def check_recovered(storage: Storage, written: dict[Key, list[tuple[int, bytes]]]) -> WalIndex:
    """Recovery returns every partition's data exactly once per offset, and every copy of a
    batch in any live object (covered chunks included) has the same bytes."""
    index, table = open_table(storage)
    for key, records in written.items():
        assert table.read(*key) == records, f"partition {key}"
    copies: dict[tuple[Key, int], bytes] = {}
    for key in index.partitions():
        for extent in index.chunks_for(*key):
            data = extent.read(storage)  # whole CRC-valid batches (a torn object: its prefix)
            position = 0
            for batch in iter_batches(data, validate=True):
                raw = data[position : position + batch.size_in_bytes]
                assert copies.setdefault((key, batch.base_offset), raw) == raw
                position += batch.size_in_bytes
    return index


@pytest.mark.chaos
@pytest.mark.parametrize(
    ("fault", "signal"),
    [
        ("stall-put", "WRITING "),
        ("tear-put", "FAILED "),
        ("stall-delete", "DELETING "),
    ],
)
def test_sigkill_mid_compaction(tmp_path: Path, fault: str, signal: str) -> None:
    """A compactor process is SIGKILLed while its L1 write is stalled, after its L1 write was
    torn, or in the middle of its deletes (after 0-5 went through). Recovery then reads every
    partition whole, each offset once, and every duplicate copy is byte-identical; a second
    compactor (new epoch) finishes the job and recovery still reads the same."""
    url = str(tmp_path / "broker-0")
    kill_and_finish(url, {}, Storage.from_url(url), fault, signal)


@pytest.mark.chaos
@pytest.mark.s3
@pytest.mark.parametrize(
    ("fault", "signal"), [("stall-put", "WRITING "), ("stall-delete", "DELETING ")]
)
def test_sigkill_mid_compaction_on_s3(s3_url: S3Location, fault: str, signal: str) -> None:
    """The same on moto S3 (a PUT is atomic: the packed object is whole or absent)."""
    options = dict(s3_url.storage_options)
    with Storage.from_url(s3_url.url, **options) as storage:
        kill_and_finish(s3_url.url, options, storage, fault, signal)


def kill_and_finish(
    url: str, options: dict[str, Any], storage: Storage, fault: str, signal: str
) -> None:
    written = write_l0(storage, keys_of(10), flushes=12, batches_per_flush=30, seed=19)
    rng = random.Random(fault)
    worker = Worker(url, options, 2, fault, rng.randint(0, 5))
    try:
        assert worker.wait_for("READY ") == "READY 12"
        worker.wait_for(signal)
    finally:
        worker.kill()
    index = check_recovered(storage, written)
    if fault == "tear-put":
        assert index.stats.scans == 1
    if fault == "stall-delete":
        assert any(o.name.level == 1 for o in index.objects())

    worker = Worker(url, options, 3, "none", 0)
    try:
        done = json.loads(worker.wait_for("DONE ")[5:])
    finally:
        worker.kill()
    index = check_recovered(storage, written)
    levels = sorted(o.name.level for o in index.objects() if o.index.chunks)
    assert levels[0] == 1, f"L0 data left after a full round: {done}"


# --- a model: flushes, compaction rounds, torn packed writes, delayed deletes, crashes ----------


class CompactionMachine(RuleBasedStateMachine):
    """L0 flushes, compaction rounds of the oldest objects (some with a torn L1 write),
    garbage collections as time passes, and crashes (the index reloaded, a new broker epoch)
    in any order, against a model of what was written: every partition always reads exactly
    what was written, and every copy of a batch anywhere in the WAL is byte-identical."""

    KEYS = keys_of(3)

    def __init__(self) -> None:
        super().__init__()
        self.storage = FaultyStorage(memory_root())
        self.written: dict[Key, list[tuple[int, bytes]]] = {key: [] for key in self.KEYS}
        self.now = 0.0
        self.epoch = 0
        self._start()

    def _start(self) -> None:
        self.epoch += 1
        self.index, self.table = open_table(self.storage)
        fence = WalWriter(
            self.storage,
            broker_id=1,
            broker_epoch=self.epoch,
            next_seq=self.index.next_seq,
            index=self.index,
        )
        fence.close()
        self.compactor = Compactor(
            self.storage,
            self.index,
            self.table,
            broker_id=1,
            broker_epoch=self.epoch,
            delete_delay_ms=500,
            clock=lambda: self.now,
        )

    @rule(appends=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3)), min_size=1, max_size=6))
    def flush(self, appends: list[tuple[int, int]]) -> None:
        writer = WalWriter(
            self.storage,
            broker_id=1,
            broker_epoch=self.epoch,
            next_seq=self.index.next_seq,
            index=self.index,
            fence=False,
            autostart=False,
        )
        sources: dict[Key, BufferedSource] = {}
        for which, count in appends:
            key = self.KEYS[which]
            source = sources.get(key)
            if source is None:
                end = len(self.written[key])
                source = BufferedSource("t", key[0], key[1], next_offset=end, writer=writer)
                sources[key] = source
            base = source.log_end_offset
            values = [f"{key[1]}:{o}:{self.epoch}".encode() for o in range(base, base + count)]
            source.append(build([Record(None, v, 1) for v in values], base_offset=base))
            self.written[key].extend(zip(range(base, base + count), values, strict=True))
        writer.start()
        writer.close()
        for key, source in sources.items():
            self.table.extents.setdefault(key, []).extend(source.extents)

    @rule(count=st.integers(1, 6), tear=st.floats(0, 0.99) | st.none())
    def compact(self, count: int, tear: float | None) -> None:
        sources = self.compactor.l0_sources()[:count]
        if tear is not None:
            self.storage.tear(fraction=tear, path_prefix=f"{WAL_PREFIX}/L1/")
        try:
            result = self.compactor.compact(sources)
        except StorageError:
            assert tear is not None
            event("compaction: torn L1 write")
        else:
            event(f"compaction: {'an' if result.output else 'no'} output")
            event(f"compaction: {'some' if result.deleted else 'no'} deletes")
        self.storage.heal()

    @rule(seconds=st.floats(0, 2))
    def collect(self, seconds: float) -> None:
        self.now += seconds
        event(f"collect: {'some' if self.compactor.collect_garbage() else 'no'} deletes")

    @rule()
    def crash(self) -> None:
        index = check_recovered(self.storage, self.written)
        event(f"crash: {'with' if index.stats.scans else 'no'} scans")
        self._start()

    @invariant()
    def reads_what_was_written(self) -> None:
        for key, records in self.written.items():
            assert self.table.read(*key) == records, f"partition {key}"


TestCompactionMachine = pytest.mark.unit(CompactionMachine.TestCase)
TestCompactionMachine.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
