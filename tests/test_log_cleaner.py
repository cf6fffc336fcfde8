"""The log cleaner over one log (logstore.log_cleaner), standalone and over the broker WAL.

A seeded random generator writes many histories (updates to few keys, tombstones, committed
and aborted transactions, rolls) and cleans them, some more than once as time passes, some in
rounds bounded to one dirty segment with nothing kept in memory between passes; after
each clean: every offset that remains holds exactly what it held, the log end offset and the
HW are unchanged, the read_committed view is the original's minus superseded records (and
tombstones past their horizon), the latest value of every key is unchanged, and a reopened log
reads the same.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from logstore.batch import ControlType, Record, build, build_control, iter_batches
from logstore.config import LogConfig
from logstore.dump import dump
from logstore.log import Log
from logstore.log_cleaner import DEFAULT_MAX_DIRTY_BYTES, clean_log, plan_cleaning
from logstore.reader import SegmentReader
from logstore.segment import cleaned_object_of
from logstore.storage import Storage
from replication.broker.producer_state import ProducerStateManager
from replication.client.fetcher import decode_fetched
from replication.protocol import AbortedTransaction
from tests.test_wal_log import Node

pytestmark = pytest.mark.unit

NOW = 10_000_000
DAY = 86_400_000
CONFIG = LogConfig(
    cleanup_policy="compact",
    min_cleanable_dirty_ratio=0.0,
    min_compaction_lag_ms=0,
    delete_retention_ms=DAY,
    file_delete_delay_ms=0,
    segment_bytes=4096,
    retention_ms=-1,
)

View = list[tuple[int, bytes | None, bytes | None, int]]  # offset, key, value, timestamp


def read_committed(log: Log) -> View:
    """What a read_committed consumer reads from offset 0 (markers resolve transactions)."""
    out: View = []
    open_txns: dict[int, View] = {}
    data = log.read(log.log_start_offset, 1 << 30, max_offset=log.high_watermark)
    for batch in iter_batches(data):
        if batch.is_control:
            records = open_txns.pop(batch.producer_id, [])
            if batch.control_type() is ControlType.COMMIT:
                out.extend(records)
            continue
        rows = [(r.offset, r.key, r.value, r.timestamp) for r in batch.records()]
        if batch.is_transactional:
            open_txns.setdefault(batch.producer_id, []).extend(rows)
        else:
            out.extend(rows)
    assert not open_txns
    return sorted(out)


def every_record(log: Log) -> dict[int, tuple[bytes | None, bytes | None, int]]:
    """Offset -> (key, value, timestamp) of every record the log holds, markers aside."""
    data = log.read(log.log_start_offset, 1 << 30)
    return {
        r.offset: (r.key, r.value, r.timestamp)
        for b in iter_batches(data)
        if not b.is_control
        for r in b.records()
    }


@dataclass
class History:
    """What was written: the batches' bytes are appended by ``write``."""

    rng: random.Random
    keys: int
    ts: int = 1_000

    def data_batch(self, producer: int = -1, epoch: int = 0, seq: int = 0) -> bytes:
        records = []
        for _ in range(self.rng.randint(1, 6)):
            key = f"k{self.rng.randrange(self.keys)}".encode()
            value = None if self.rng.random() < 0.15 else f"v{self.rng.random():.6f}".encode()
            records.append(Record(key, value, self.ts))
            self.ts += 1
        return build(
            records,
            producer_id=producer,
            producer_epoch=epoch if producer >= 0 else -1,
            base_sequence=seq if producer >= 0 else -1,
            is_transactional=producer >= 0,
        )

    def write(self, log: Log, batches: int, flush: Callable[[], None] | None = None) -> None:
        seqs: dict[int, int] = {}
        for _ in range(batches):
            if self.rng.random() < 0.2:
                producer = self.rng.randrange(1, 4)
                for _ in range(self.rng.randint(1, 3)):
                    seq = seqs.get(producer, 0)
                    batch = self.data_batch(producer, seq=seq)
                    seqs[producer] = seq + next(iter_batches(batch)).record_count
                    log.append(batch, leader_epoch=0)
                marker = ControlType.COMMIT if self.rng.random() < 0.6 else ControlType.ABORT
                log.append(
                    build_control(
                        marker,
                        producer_id=producer,
                        producer_epoch=0,
                        coordinator_epoch=0,
                        timestamp=self.ts,
                    ),
                    leader_epoch=0,
                )
            else:
                log.append(self.data_batch(), leader_epoch=0)
            if self.rng.random() < 0.3:
                if flush is None:
                    log.roll()
                    log.flush()
                else:
                    flush()
        if flush is None:
            log.roll()
            log.flush()
        else:
            flush()
        log.update_high_watermark(log.log_end_offset)


def check_cleaned(
    before_all: dict[int, tuple[bytes | None, bytes | None, int]], before: View, log: Log
) -> None:
    """The cleaner's contract, checked against the log as it was before the clean."""
    after_all = every_record(log)
    for offset, record in after_all.items():
        assert before_all[offset] == record, f"offset {offset} changed"
    after = read_committed(log)
    assert set(after) <= set(before)
    latest: dict[bytes | None, int] = {}
    for offset, key, _value, _ts in before:
        latest[key] = offset
    kept = {o for o, *_ in after}
    for offset, key, value, _ts in before:
        if offset in kept:
            continue
        # a record goes only if superseded, or if a tombstone whose horizon passed
        assert latest[key] > offset or value is None, f"offset {offset} ({key!r}) lost"
    for key, offset in latest.items():
        value = before_all[offset][1]
        if value is not None:
            assert offset in kept, f"the latest value of {key!r} (offset {offset}) is gone"


def before_swap(log: Log, action: Callable[[], object]) -> None:
    """Run ``action`` once, between the next clean's rewrite and its swap."""
    swap = log.replace_cleaned

    def acted_first(*args: Any, **kwargs: Any) -> bool:
        del log.replace_cleaned  # once
        action()
        return swap(*args, **kwargs)

    log.replace_cleaned = acted_first  # type: ignore[method-assign]


def cleaned_rounds(log: Log, rng: random.Random) -> Iterator[int]:
    now = NOW
    for _ in range(rng.randint(1, 3)):
        yield now
        now += rng.choice([0, DAY // 2, DAY + 1])


def run_history(log: Log, seed: int, reopen: Callable[[Log], Log]) -> None:
    rng = random.Random(seed)
    history = History(rng, keys=rng.randint(1, 8))
    history.write(log, rng.randint(5, 40))
    for now in cleaned_rounds(log, rng):
        before_all, before = every_record(log), read_committed(log)
        end, hw = log.log_end_offset, log.high_watermark
        # a small bound: a round of one dirty segment, every pass reading from storage again
        bound = rng.choice([DEFAULT_MAX_DIRTY_BYTES, 1])
        stats = clean_log(log, now_ms=now, max_dirty_bytes=bound)
        assert log.log_end_offset == end
        assert log.high_watermark == hw
        check_cleaned(before_all, before, log)
        assert stats is None or stats.committed
        # more history after a clean: the next clean's dirty section
        if rng.random() < 0.5:
            history.write(log, rng.randint(1, 10))
    view, records = read_committed(log), every_record(log)
    log = reopen(log)
    assert read_committed(log) == view
    assert every_record(log) == records


@pytest.mark.parametrize("seed", range(40))
def test_cleaning_keeps_the_latest_of_every_key_standalone(tmp_path: Path, seed: int) -> None:
    storage = Storage.from_url(f"file://{tmp_path}/t/0")

    def reopen(log: Log) -> Log:
        log.close()
        return Log.open(storage, CONFIG)

    run_history(Log.open(storage, CONFIG), seed, reopen)


@pytest.mark.parametrize("seed", range(12))
def test_cleaning_over_the_wal(tmp_path: Path, seed: int) -> None:
    node = Node(Storage.from_url(f"file://{tmp_path}/root"), [("orders", 0)])
    node.config = CONFIG
    node.start()
    log = node.logs[("orders", 0)]
    rng = random.Random(seed)
    history = History(rng, keys=rng.randint(1, 8))
    history.write(log, rng.randint(5, 40), flush=node.flush)
    before_all, before = every_record(log), read_committed(log)
    compactor = node.compactor()

    def compact() -> None:
        if seed % 2:  # the WAL compactor packs the log's chunks while the round rewrites
            compactor.compact(compactor.l0_sources())

    before_swap(log, compact)
    stats = clean_log(log, now_ms=NOW)
    assert stats is not None
    if not stats.committed:
        # the packed chunk ends past the round's range: the swap is refused, nothing changed
        assert seed % 2
        assert every_record(log) == before_all
        history.write(log, 3, flush=node.flush)  # the packed chunk is no longer the active one
        before_all, before = every_record(log), read_committed(log)
        stats = clean_log(log, now_ms=NOW)
        assert stats is not None
        assert stats.committed
    check_cleaned(before_all, before, log)
    # more history, packed by the WAL compactor; the collector deletes what nobody refers to
    history.write(log, rng.randint(1, 10), flush=node.flush)
    compactor.compact(compactor.l0_sources())
    compactor.collect_garbage()
    view, records = read_committed(log), every_record(log)
    node.stop()
    node.start()
    log = node.logs[("orders", 0)]
    log.update_high_watermark(log.log_end_offset)  # as its leader does (the HW is a hint here)
    assert read_committed(log) == view
    assert every_record(log) == records
    assert log.clean_generation == 1
    node.stop()


def small_log(tmp_path: Path, config: LogConfig = CONFIG) -> Log:
    log = Log.open(Storage.from_url(f"file://{tmp_path}/t/0"), config)
    for i in range(6):
        log.append(build([Record(b"k", f"v{i}".encode(), 1_000 + i)]), leader_epoch=0)
        log.roll()
        log.flush()
    log.update_high_watermark(log.log_end_offset)
    log.checkpoint()  # as the broker's periodic checkpoint does
    return log


def test_the_active_segment_and_data_at_or_above_the_hw_or_lso_stay(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    log.update_high_watermark(4)
    plan = plan_cleaning(log, now_ms=NOW)
    assert plan is not None
    assert plan.end_offset == 4
    plan = plan_cleaning(log, now_ms=NOW, last_stable_offset=2)
    assert plan is not None
    assert plan.end_offset == 2
    log.update_high_watermark(6)
    plan = plan_cleaning(log, now_ms=NOW)
    assert plan is not None
    assert plan.end_offset == 5  # the last segment is the active one
    clean_log(log, now_ms=NOW)
    assert [v for _, (_, v, _) in sorted(every_record(log).items())] == [b"v4", b"v5"]


def test_min_and_max_compaction_lag_and_the_dirty_ratio(tmp_path: Path) -> None:
    lagged = replace(CONFIG, min_compaction_lag_ms=1_000)
    log = small_log(tmp_path, lagged)
    assert plan_cleaning(log, now_ms=1_003) is None  # every record is younger than the lag
    plan = plan_cleaning(log, now_ms=2_003)
    assert plan is not None
    assert plan.end_offset == 4  # offsets 0-3 are at least a lag old
    log.reconfigure(replace(CONFIG, min_cleanable_dirty_ratio=0.9))
    assert clean_log(log, now_ms=NOW) is not None  # all dirty: ratio 1
    assert log.cleaned_end == 5
    for i in range(6, 9):
        log.append(build([Record(b"k", f"v{i}".encode(), 1_000 + i)]), leader_epoch=0)
        log.roll()
        log.flush()
    log.update_high_watermark(log.log_end_offset)
    plan_ratio = plan_cleaning(log, now_ms=NOW)
    assert plan_ratio is None  # dirty 3 of 4 extents, below 0.9
    log.reconfigure(replace(CONFIG, min_cleanable_dirty_ratio=0.9, max_compaction_lag_ms=1_000))
    overdue = plan_cleaning(log, now_ms=NOW)
    assert overdue is not None  # the first dirty record is older than max.compaction.lag.ms
    assert overdue.first_dirty_offset == 5
    log.reconfigure(replace(CONFIG, cleanup_policy="delete"))
    assert plan_cleaning(log, now_ms=NOW) is None


def test_a_crash_before_the_commit_leaves_the_old_log(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    storage = log.storage
    before = every_record(log)

    class Crash(Exception):
        pass

    def crash() -> bool:
        raise Crash

    log.checkpoint = crash  # type: ignore[method-assign]
    with pytest.raises(Crash):
        clean_log(log, now_ms=NOW)
    written = [i.path for i in storage.list() if cleaned_object_of(i.path)]
    assert written  # the new objects were on storage when the commit failed
    reopened = Log.open(storage, CONFIG)
    assert every_record(reopened) == before
    assert not [i.path for i in storage.list() if cleaned_object_of(i.path)]
    reopened.update_high_watermark(reopened.log_end_offset)
    stats = clean_log(reopened, now_ms=NOW)
    assert stats is not None
    assert stats.committed
    assert reopened.clean_generation == 1
    again = Log.open(storage, CONFIG)
    assert [v for _, (_, v, _) in sorted(every_record(again).items())] == [b"v4", b"v5"]


def test_a_truncation_between_the_rewrite_and_the_swap_wins(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    before_swap(log, lambda: log.truncate_to(3))
    stats = clean_log(log, now_ms=NOW)
    assert stats is not None
    assert not stats.committed
    assert not [i.path for i in log.storage.list() if cleaned_object_of(i.path)]
    assert sorted(every_record(log)) == [0, 1, 2]
    log.update_high_watermark(3)
    stats = clean_log(log, now_ms=NOW)
    assert stats is not None
    assert stats.committed


def test_many_updates_to_few_keys_shrink_the_log(tmp_path: Path) -> None:
    log = Log.open(Storage.from_url(f"file://{tmp_path}/t/0"), CONFIG)
    for i in range(200):
        records = [Record(f"k{j}".encode(), f"{i}-{j}".encode() * 10, 1_000 + i) for j in range(5)]
        log.append(build(records), leader_epoch=0)
        if i % 20 == 19:
            log.roll()
            log.flush()
    log.update_high_watermark(log.log_end_offset)
    size = log.size_in_bytes
    stats = clean_log(log, now_ms=NOW)
    assert stats is not None
    assert stats.records_read == 900  # not the active segment's
    assert stats.records_kept == 5  # the latest of each key
    assert log.size_in_bytes < size / 3
    assert stats.bytes_written == sum(s.size for s in log.segments()[:-1])
    # the 179 emptied batches merged into one empty batch per cleaned extent (9), beside the
    # one batch holding every key's latest record
    cleaned = log.read(0, 1 << 30, max_offset=stats.end_offset)
    batches = list(iter_batches(cleaned))
    assert sum(1 for b in batches if b.record_count) == 1
    assert len(batches) <= 10
    assert [b.base_offset for b in batches[1:]] == [b.next_offset for b in batches[:-1]]


def test_listing_readers_and_dump_see_the_cleaned_log_only(tmp_path: Path) -> None:
    """The replaced objects stay for file.delete.delay.ms; a reader that lists the directory
    (the Spark source without a broker to ask) and `replog log dump` still see only the
    cleaned log, with its offset gaps."""
    log = small_log(tmp_path, replace(CONFIG, file_delete_delay_ms=3_600_000))
    stats = clean_log(log, now_ms=NOW)
    assert stats is not None
    assert stats.committed
    names = {i.path for i in log.storage.list()}
    assert "00000000000000000000.seg" in names  # replaced, not deleted yet
    reader = SegmentReader(log.storage)
    assert [o.name for o in reader.list_objects()] == [s.name for s in log.segments()]
    offsets = [
        o
        for chunk in reader.read(0, 6)
        if chunk.records is not None
        for o in chunk.records.column("offset").to_pylist()
    ]
    assert offsets == [4, 5]
    lines = [line.text for line in dump(log.storage.url, records=True)]
    assert [line.split()[2] for line in lines if line.startswith("| offset:")] == ["4", "5"]


@pytest.mark.parametrize("seed", range(6))
def test_a_new_follower_copies_a_cleaned_log(tmp_path: Path, seed: int) -> None:
    """A replica that fetches a cleaned log from its start (a reassignment, a replaced disk)
    takes its gapped and empty batches as they are, and its producer state, rebuilt from them,
    holds no transaction open."""
    rng = random.Random(seed)
    leader = Log.open(Storage.from_url(f"file://{tmp_path}/leader/t/0"), CONFIG)
    History(rng, keys=rng.randint(1, 8)).write(leader, rng.randint(10, 40))
    stats = clean_log(leader, now_ms=NOW + DAY + 1)
    assert stats is not None
    assert stats.committed
    clean_log(leader, now_ms=NOW + 3 * DAY)  # tombstones and markers past their horizon go
    follower = Log.open(Storage.from_url(f"file://{tmp_path}/follower/t/0"), CONFIG)
    producers = ProducerStateManager("t-0")
    data = leader.read(leader.log_start_offset, 1 << 30)
    follower.truncate_fully_and_start_at(leader.log_start_offset)
    follower.append_as_follower(data)
    for batch in iter_batches(data):
        producers.update(batch)
    follower.flush()
    follower.update_high_watermark(follower.log_end_offset)
    assert follower.log_end_offset == leader.log_end_offset
    assert every_record(follower) == every_record(leader)
    assert read_committed(follower) == read_committed(leader)
    assert producers.first_unstable_offset() is None


def test_tombstones_go_at_their_horizon_with_nothing_dirty(tmp_path: Path) -> None:
    log = Log.open(Storage.from_url(f"file://{tmp_path}/t/0"), CONFIG)
    for key, value in [(b"k0", b"v0"), (b"k1", b"v1"), (b"k0", None), (b"k2", b"v2")]:
        log.append(build([Record(key, value, 1_000)]), leader_epoch=0)
        log.roll()
        log.flush()
    log.update_high_watermark(log.log_end_offset)
    assert clean_log(log, now_ms=NOW) is not None
    assert [k for k, _, _ in every_record(log).values()] == [b"k1", b"k0", b"k2"]
    assert log.next_delete_horizon_ms == NOW + DAY
    assert plan_cleaning(log, NOW + DAY - 1) is None  # nothing dirty, the horizon ahead
    stats = clean_log(log, now_ms=NOW + DAY)
    assert stats is not None
    assert stats.committed
    assert [k for k, _, _ in every_record(log).values()] == [b"k1", b"k2"]
    assert log.next_delete_horizon_ms is None
    assert plan_cleaning(log, NOW + 2 * DAY) is None


def test_a_log_closed_before_the_commit_keeps_its_old_objects(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    before = every_record(log)
    checkpoint = log.checkpoint

    def closed_first() -> bool:
        log._closed = True  # the broker closed the log between the swap and its checkpoint
        return checkpoint()

    log.checkpoint = closed_first  # type: ignore[method-assign]
    stats = clean_log(log, now_ms=NOW)
    assert stats is not None
    assert not stats.committed
    reopened = Log.open(log.storage, CONFIG)
    assert every_record(reopened) == before
    assert reopened.clean_generation == 0


def test_segment_ms_rolls_the_active_segment_into_the_cleanable_range(tmp_path: Path) -> None:
    clock = [1_000]
    config = replace(CONFIG, segment_ms=60_000, segment_bytes=1 << 20)
    log = Log.open(Storage.from_url(f"file://{tmp_path}/t/0"), config, time_ms=lambda: clock[0])
    for i in range(4):  # one segment: every flush within segment.ms of its first
        log.append(build([Record(b"k", f"v{i}".encode(), 1_000)]), leader_epoch=0)
        log.flush()
    log.update_high_watermark(log.log_end_offset)
    assert plan_cleaning(log, NOW) is None  # all of it is the active segment
    clock[0] += 60_000  # segment.ms later, the next flush opens a new segment
    log.append(build([Record(b"k", b"v4", 1_000)]), leader_epoch=0)
    log.flush()
    log.update_high_watermark(log.log_end_offset)
    plan = plan_cleaning(log, NOW)
    assert plan is not None
    assert plan.end_offset == 4


def test_read_committed_with_the_live_aborted_index_after_cleaning(tmp_path: Path) -> None:
    """A read_committed consumer is given the partition's aborted-transaction index, kept
    beside the log: after every clean (long past every delete horizon) it still reads each
    producer's committed records, those after an aborted transaction of theirs too."""
    log = Log.open(Storage.from_url(f"file://{tmp_path}/t/0"), CONFIG)
    producers = ProducerStateManager("t-0")
    for n, (key, marker) in enumerate([(b"a", ControlType.ABORT), (b"b", ControlType.COMMIT)]):
        txn = build(
            [Record(key, b"txn", 1_000)],
            producer_id=5,
            producer_epoch=0,
            base_sequence=n,
            is_transactional=True,
        )
        end = build_control(
            marker, producer_id=5, producer_epoch=0, coordinator_epoch=0, timestamp=1_000
        )
        for data in (txn, end):
            info = log.append(data, leader_epoch=0)
            producers.update(next(iter_batches(data)), info.first_offset)
            log.roll()
            log.flush()
    log.append(build([Record(b"c", b"plain", 1_000)]), leader_epoch=0)
    log.flush()
    log.update_high_watermark(log.log_end_offset)
    for now in (NOW, NOW + 2 * DAY, NOW + 4 * DAY):
        clean_log(log, now_ms=now)
    aborted = [
        AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
        for a in producers.aborted_in_range(0, log.log_end_offset)
    ]
    assert aborted  # the index still names the aborted transaction
    data = log.read(0, 1 << 20)
    fetched = decode_fetched(data, 0, read_committed=True, aborted_transactions=aborted)
    keys = [k for b in fetched.batches for k in b.column("key").to_pylist()]
    assert keys == [b"b", b"c"]
