"""The partition log: append, group commit, read, truncate, recovery, retention, merge."""

from __future__ import annotations

import itertools
import logging
import os
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from logstore.batch import Record, build, iter_batches
from logstore.config import LogConfig
from logstore.errors import CorruptRecordError, InvalidRecordError, OffsetOutOfRangeError
from logstore.log import Log
from logstore.segment import object_name
from logstore.storage import Storage
from tests.readback import log_values as values

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def batch_of(*vals: bytes, ts: int = 1000) -> bytes:
    return build([Record(None, v, ts + i) for i, v in enumerate(vals)])


@pytest.fixture
def storage() -> Storage:
    return Storage.from_url(f"memory://test-log-{uuid.uuid4().hex}/topic/0")


@pytest.fixture
def file_storage(tmp_path: Path) -> Storage:
    return Storage.from_url(str(tmp_path / "topic" / "0"))


def test_append_assigns_offsets_and_stamps_epoch(storage: Storage) -> None:
    log = Log.open(storage)
    info = log.append(batch_of(b"a", b"b"), leader_epoch=3)
    assert (info.first_offset, info.last_offset) == (0, 1)
    info = log.append(batch_of(b"c"), leader_epoch=4)
    assert (info.first_offset, info.last_offset) == (2, 2)
    assert log.log_end_offset == 3
    assert log.durable_end_offset == 0
    assert values(log) == [(0, b"a"), (1, b"b"), (2, b"c")]  # readable before flush
    assert log.flush() == 3
    batches = list(iter_batches(log.read(0, 1 << 20)))
    assert [b.partition_leader_epoch for b in batches] == [3, 4]
    assert [b.base_offset for b in batches] == [0, 2]
    assert log.end_offset_for_epoch(3) == (3, 2)
    assert log.end_offset_for_epoch(4) == (4, 3)


def test_read_returns_whole_batches_within_budget(storage: Storage) -> None:
    log = Log.open(storage)
    for i in range(10):
        log.append(batch_of(bytes([65 + i]) * 100), leader_epoch=0)
        if i % 3 == 0:
            log.flush()
    one = len(batch_of(b"x" * 100))
    # max_bytes smaller than a batch still returns one whole batch (progress guaranteed)
    assert [b.base_offset for b in iter_batches(log.read(4, 1))] == [4]
    assert log.read(4, 1, min_one_batch=False) == b""
    # a budget of three batches spans objects and the unflushed tail
    assert [b.base_offset for b in iter_batches(log.read(2, 3 * one))] == [2, 3, 4]
    assert [b.base_offset for b in iter_batches(log.read(8, 10 * one))] == [8, 9]
    # max_offset (the HW for consumers) is never passed
    assert [b.base_offset for b in iter_batches(log.read(0, 1 << 20, max_offset=5))] == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert log.read(10, 100) == b""
    with pytest.raises(OffsetOutOfRangeError, match="out of range"):
        log.read(11, 100)


def test_follower_append_keeps_leader_offsets_and_epochs(storage: Storage) -> None:
    leader = Log.open(storage)
    leader.append(batch_of(b"a", b"b"), leader_epoch=1)
    leader.append(batch_of(b"c"), leader_epoch=2)
    follower = Log.open(Storage.from_url(f"memory://follower-{uuid.uuid4().hex}"))
    follower.append_as_follower(leader.read(0, 1 << 20))
    assert values(follower) == values(leader)
    assert follower.leader_epoch_cache.entries() == leader.leader_epoch_cache.entries()
    with pytest.raises(InvalidRecordError, match="log ends at 3"):
        follower.append_as_follower(leader.read(0, 1 << 20))


def test_reopen_recovers_everything_flushed(file_storage: Storage) -> None:
    log = Log.open(file_storage)
    for i in range(5):
        log.append(batch_of(f"v{i}".encode()), leader_epoch=i // 2)
        log.flush()
    log.update_high_watermark(4)
    log.close()
    again = Log.open(file_storage)
    assert values(again) == [(i, f"v{i}".encode()) for i in range(5)]
    assert again.high_watermark == 4
    assert again.leader_epoch_cache.entries() == log.leader_epoch_cache.entries()


def test_crash_before_checkpoint_scans_new_objects(file_storage: Storage) -> None:
    log = Log.open(file_storage)
    log.append(batch_of(b"a"), leader_epoch=0)
    log.flush()
    log.checkpoint()
    log.append(batch_of(b"b"), leader_epoch=1)
    log.flush()  # object written; checkpoint not: the process "dies" here
    log.append(batch_of(b"lost"), leader_epoch=1)  # never flushed: not durable
    again = Log.open(file_storage)
    assert values(again) == [(0, b"a"), (1, b"b")]
    assert again.end_offset_for_epoch(0) == (0, 1)
    assert again.latest_epoch == 1


def test_torn_tail_is_cut_at_last_valid_batch(
    file_storage: Storage, caplog: pytest.LogCaptureFixture
) -> None:
    log = Log.open(file_storage)
    log.append(batch_of(b"a"), leader_epoch=0)
    log.append(batch_of(b"b"), leader_epoch=0)
    log.flush()
    name = object_name(0)
    data = file_storage.read(name)
    file_storage.write(name, data[:-7])  # a torn write of the last batch
    with caplog.at_level(logging.WARNING, logger="logstore.log_loader"):
        again = Log.open(file_storage)
    assert values(again) == [(0, b"a")]
    assert any(name in r.getMessage() and "offset 1" in r.getMessage() for r in caplog.records)
    again.append(batch_of(b"c"), leader_epoch=0)
    again.flush()
    assert values(Log.open(file_storage)) == [(0, b"a"), (1, b"c")]


@pytest.mark.parametrize("trusted", [True, False], ids=["checkpointed", "unchecked"])
def test_flipped_byte_is_never_served(file_storage: Storage, trusted: bool) -> None:
    log = Log.open(file_storage)
    for v in (b"first", b"second", b"third"):
        log.append(batch_of(v * 20), leader_epoch=0)
    log.flush()
    if trusted:
        log.checkpoint()
    else:
        file_storage.delete("checkpoint.json")
    name = object_name(0)
    data = bytearray(file_storage.read(name))
    second = len(batch_of(b"first" * 20))
    data[second + 70] ^= 0x01  # inside the second batch's records
    file_storage.write(name, bytes(data))
    again = Log.open(file_storage)
    if trusted:
        # the object's size matches the checkpoint, so it is trusted until read: the read of
        # the corrupt batch names the object and refuses to serve it
        assert [v for _, v in values(again, 0, 1)] == [b"first" * 20]
        with pytest.raises(CorruptRecordError, match=name):
            again.read(1, 1 << 20)
    else:
        # recovery scanned it and cut the log at the last valid batch
        assert values(again) == [(0, b"first" * 20)]


def test_crash_mid_merge_recovers(file_storage: Storage) -> None:
    log = Log.open(file_storage, LogConfig(file_delete_delay_ms=10**9))
    for v in (b"a", b"b", b"c", b"d"):
        log.append(batch_of(v), leader_epoch=0)
        log.flush()
    log.checkpoint()
    # the merge writes the merged object but the process dies before anything else
    merged = b"".join(file_storage.read(object_name(i)) for i in range(4))
    file_storage.write(object_name(0), merged)
    again = Log.open(file_storage)
    assert values(again) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    assert [s.name for s in again.segments()] == [object_name(0)]
    assert sorted(i.path for i in file_storage.list() if i.path.endswith(".seg")) == [
        object_name(0)
    ]


def test_merge_keeps_old_readers_working(file_storage: Storage) -> None:
    clock = Clock()
    log = Log.open(
        file_storage, LogConfig(merge_min_objects=3, file_delete_delay_ms=1000), time_ms=clock
    )
    for v in (b"a", b"b", b"c"):
        log.append(batch_of(v), leader_epoch=0)
        log.flush()
    first_before = file_storage.read(object_name(0))
    second_before = file_storage.read(object_name(1))
    assert log.merge_segments() == 1
    assert [s.name for s in log.segments()] == [object_name(0)]
    # a reader holding the old first object's byte range reads the same bytes
    assert file_storage.read_range(object_name(0), 0, len(first_before)) == first_before
    # a reader holding a merged-away object can finish within file.delete.delay.ms
    assert file_storage.read(object_name(1)) == second_before
    clock.now += 1001
    assert log.delete_due_objects() == 2
    assert not file_storage.exists(object_name(1))
    assert values(Log.open(file_storage)) == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_truncate_to(storage: Storage) -> None:
    log = Log.open(storage)
    for i in range(6):
        log.append(batch_of(f"v{i}".encode()), leader_epoch=i)
        if i in (1, 3):
            log.flush()
    # objects: [0,2) [2,4); pending: 4, 5
    assert log.truncate_to(5) == 5
    assert log.truncate_to(3) == 3  # mid-object: the object is rewritten as its prefix
    assert values(log) == [(i, f"v{i}".encode()) for i in range(3)]
    assert log.latest_epoch == 2
    log.append(batch_of(b"new"), leader_epoch=7)
    log.flush()
    reopened = Log.open(storage)
    assert values(reopened) == [(0, b"v0"), (1, b"v1"), (2, b"v2"), (3, b"new")]
    assert reopened.end_offset_for_epoch(2) == (2, 3)
    assert reopened.truncate_to(0) == 0
    assert reopened.log_end_offset == 0
    assert values(Log.open(storage)) == []


def test_truncating_at_the_end_forgets_an_epoch_that_holds_no_batch(storage: Storage) -> None:
    # A replica became leader at epoch 1 (its epoch starts at its LEO, 2) and lost leadership
    # before any append landed; the new leader (epoch 2) holds epoch 0 up to 2. Told that its
    # log diverges at the end of epoch 0 (offset 2), the replica truncates to 2: nothing to cut,
    # but epoch 1 must go, or it names epoch 1 as its last fetched epoch forever and the
    # leader answers "diverged at 2" forever (the chaos harness found this livelock).
    follower, leader = Log.open(storage), Log.open(Storage.from_url("memory://leader-of-it"))
    for log in (follower, leader):
        log.append(batch_of(b"a", b"b"), leader_epoch=0)
        log.flush()
    follower.leader_epoch_cache.assign(1, follower.log_end_offset)
    leader.append(batch_of(b"c"), leader_epoch=2)
    leader.flush()
    assert follower.latest_epoch == 1
    assert leader.end_offset_for_epoch(follower.latest_epoch) == (0, 2)  # "diverged at 2"
    assert follower.truncate_to(2) == 2
    assert follower.latest_epoch == 0
    assert leader.end_offset_for_epoch(follower.latest_epoch) == (0, 2)  # consistent: fetch on
    assert values(follower) == [(0, b"a"), (1, b"b")]


def test_truncate_inside_a_batch_removes_the_whole_batch(storage: Storage) -> None:
    log = Log.open(storage)
    log.append(batch_of(b"a", b"b"), leader_epoch=0)
    log.append(batch_of(b"c", b"d"), leader_epoch=0)
    log.flush()
    assert log.truncate_to(3) == 2


def test_retention_by_bytes_and_time(storage: Storage) -> None:
    clock = Clock()
    cfg = LogConfig(segment_bytes=1, retention_bytes=-1, retention_ms=1000)
    log = Log.open(storage, cfg, time_ms=clock)
    for i in range(4):
        log.append(batch_of(f"v{i}".encode(), ts=clock.now + i), leader_epoch=0)
        log.flush()  # segment.bytes=1: every object opens a segment
    log.update_high_watermark(3)
    assert log.delete_retained_segments() == 0  # nothing old yet
    clock.now += 1002  # records 0 and 1 are now older than retention.ms
    assert log.delete_retained_segments() == 2
    assert log.log_start_offset == 2
    with pytest.raises(OffsetOutOfRangeError):
        log.read(1, 100)
    assert values(Log.open(storage, cfg, time_ms=clock)) == [(2, b"v2"), (3, b"v3")]
    # retention never removes data at or above the HW
    clock.now += 10**6
    assert log.delete_retained_segments() == 1
    assert log.log_start_offset == 3


def test_retention_bytes(storage: Storage) -> None:
    one = len(batch_of(b"x"))
    log = Log.open(storage, LogConfig(segment_bytes=1, retention_bytes=2 * one, retention_ms=-1))
    for _ in range(5):
        log.append(batch_of(b"x"), leader_epoch=0)
        log.flush()
    log.update_high_watermark(5)
    assert log.delete_retained_segments() == 3
    assert log.log_start_offset == 3


@pytest.mark.parametrize(("policy", "retired"), [("compact", 0), ("compact,delete", 3)])
def test_retention_under_cleanup_policy(storage: Storage, policy: str, retired: int) -> None:
    one = len(batch_of(b"x"))
    cfg = LogConfig(
        segment_bytes=1, retention_bytes=2 * one, retention_ms=-1, cleanup_policy=policy
    )
    log = Log.open(storage, cfg)
    for _ in range(5):
        log.append(batch_of(b"x"), leader_epoch=0)
        log.flush()
    log.update_high_watermark(5)
    # compact alone: retention.bytes deletes nothing (as in Kafka); compact,delete: it applies
    assert log.delete_retained_segments() == retired
    assert log.log_start_offset == retired


def test_offset_for_timestamp(storage: Storage) -> None:
    log = Log.open(storage)
    log.append(build([Record(None, b"a", 100), Record(None, b"b", 200)]), leader_epoch=0)
    log.flush()
    log.append(build([Record(None, b"c", 300)]), leader_epoch=0)
    assert log.offset_for_timestamp(50) == (0, 100)
    assert log.offset_for_timestamp(150) == (1, 200)
    assert log.offset_for_timestamp(300) == (2, 300)
    assert log.offset_for_timestamp(301) is None


def test_offset_of_max_timestamp(storage: Storage) -> None:
    log = Log.open(storage)
    assert log.offset_of_max_timestamp() is None  # an empty log names no record
    # the largest timestamp in a flushed object, twice: the first record holding it is named
    log.append(build([Record(None, b"a", 100), Record(None, b"b", 500)]), leader_epoch=0)
    log.append(build([Record(None, b"c", 500), Record(None, b"d", 200)]), leader_epoch=0)
    log.flush()
    assert log.offset_of_max_timestamp() == (1, 500)
    log.append(build([Record(None, b"e", 300), Record(None, b"f", 900)]), leader_epoch=0)
    assert log.offset_of_max_timestamp() == (5, 900)  # a pending batch holds it


def test_roll_by_segment_bytes_and_merge_never_crosses_segments(storage: Storage) -> None:
    one = len(batch_of(b"x" * 50))
    log = Log.open(storage, LogConfig(segment_bytes=3 * one, merge_min_objects=2))
    for _ in range(7):
        log.append(batch_of(b"x" * 50), leader_epoch=0)
        log.flush()
    assert log.merge_segments() == 2  # the last segment has one object: nothing to merge
    assert [(s.base_offset, s.next_offset) for s in log.segments()] == [(0, 3), (3, 6), (6, 7)]


# --- a Hypothesis state machine against a plain model ------------------------------------------

_runs = itertools.count()


class LogMachine(RuleBasedStateMachine):
    """The log against a list of (offset, value) records and a count of durable ones."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.storage = Storage.from_url(f"memory://log-machine-{uuid.uuid4().hex}/{next(_runs)}")
        self.config = LogConfig(
            segment_bytes=600, merge_min_objects=2, file_delete_delay_ms=0, retention_ms=-1
        )
        self.log = Log.open(self.storage, self.config, time_ms=self.clock)
        self.records: list[bytes] = []  # value at offset start + i
        self.start = 0
        self.durable = 0  # offsets below this are on storage
        self.epoch = 0
        self.counter = 0

    @rule(n=st.integers(1, 4), bump=st.booleans())
    def append(self, n: int, bump: bool) -> None:
        if bump:
            self.epoch += 1
        vals = []
        for _ in range(n):
            self.counter += 1
            vals.append(f"r{self.counter}".encode())
        info = self.log.append(batch_of(*vals), leader_epoch=self.epoch)
        assert info.first_offset == self.start + len(self.records)
        self.records.extend(vals)

    @rule()
    def flush(self) -> None:
        self.log.flush()
        self.durable = self.start + len(self.records)

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def merge(self) -> None:
        self.log.merge_segments()

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        end = self.start + len(self.records)
        target = data.draw(st.integers(self.start, end))
        new_end = self.log.truncate_to(target)
        assert new_end <= target or target == end
        del self.records[new_end - self.start :]
        self.durable = min(self.durable, new_end)

    @rule()
    def crash_and_recover(self) -> None:
        """Abandon the log without flushing: only durable records survive."""
        self.log = Log.open(self.storage, self.config, time_ms=self.clock)
        del self.records[self.durable - self.start :]

    @rule()
    def close_and_reopen(self) -> None:
        self.log.close()
        self.durable = self.start + len(self.records)
        self.log = Log.open(self.storage, self.config, time_ms=self.clock)

    @precondition(lambda self: self.durable > self.start)
    @rule(data=st.data())
    def retention(self, data: st.DataObject) -> None:
        self.log.update_high_watermark(self.durable)
        cut = data.draw(st.integers(self.start, self.durable))
        new_start = self.log.delete_records_before(cut)
        del self.records[: new_start - self.start]
        self.start = new_start
        self.durable = max(self.durable, self.start)

    @invariant()
    def matches_model(self) -> None:
        assert self.log.log_start_offset == self.start
        assert self.log.log_end_offset == self.start + len(self.records)
        expected = [(self.start + i, v) for i, v in enumerate(self.records)]
        assert values(self.log) == expected


TestLogMachine = LogMachine.TestCase
TestLogMachine.settings = settings(
    max_examples=int(os.environ.get("LOG_MACHINE_EXAMPLES", "60")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
