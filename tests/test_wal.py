"""The broker WAL: WalWriter, one object per flush, and its failures (nothing is durable unless
a write returned). Recovery, SIGKILL mid-flush and the model: tests/test_wal_recovery.py."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from logstore.batch import iter_batches
from logstore.buffered_source import BufferedSource
from logstore.storage import Storage
from logstore.wal import (
    INLINE_PAUSE_MIN_S,
    INLINE_SLOW_S,
    FlushResult,
    PendingChunk,
    WalClosedError,
    WalWriter,
)
from logstore.wal_format import object_name
from logstore.wal_index import WAL_PREFIX, ChunkExtent, WalIndex
from tests.conftest import (
    BROKER_ROOT_KINDS,
    open_broker_root,
)
from tests.faulty_fs import FaultyStorage
from tests.helpers import wait_until
from tests.wal_sources import TOPICS, append, batch, memory_root, sources_for, wal_objects


@pytest.fixture(params=BROKER_ROOT_KINDS)
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    """A broker root on memory, local files, or moto S3."""
    yield from open_broker_root(request, tmp_path, "test-wal")


# --- one object per flush ---------------------------------------------------------------------


def test_many_partitions_one_flush_one_object(root: Storage) -> None:
    storage = FaultyStorage(root)
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, fence=False, autostart=False)
    sources = sources_for(writer, 50)
    for source in sources:
        append(source, 3)
    assert storage.calls["write"] == 0
    writer.start()
    writer.flush(timeout=30)
    assert storage.calls["write"] == 1
    assert wal_objects(storage) == [f"{WAL_PREFIX}/{object_name(1, 1)}"]
    for source in sources:
        assert source.durable_end_offset == 3
        (extent,) = source.extents
        data = extent.read(storage)  # CRC-checked
        values = [r.value for b in iter_batches(data) for r in b.records()]
        assert values == [f"{source.partition}:{o}".encode() for o in range(3)]
    writer.close()

    index = WalIndex.load(storage)
    assert index.stats.lists == 1
    assert index.stats.tail_reads == 1
    assert index.stats.scans == 0
    assert index.next_seq == 2
    for source in sources:
        assert index.chunks_for(source.topic_id, source.partition) == source.extents
    assert index.partitions() == {(s.topic_id, s.partition) for s in sources}


@pytest.mark.unit
def test_appends_during_a_write_join_the_next_object() -> None:
    """Group commit without a timer: the first append starts a flush at once; what arrives
    while it is being written goes, all of it, into the next object."""
    storage = FaultyStorage(memory_root())
    storage.stall("write", 1.0)
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, fence=False)
    sources = sources_for(writer, 10)
    append(sources[0])
    wait_until(lambda: storage.calls["write"] == 1, message="the first write began")
    for source in sources[1:]:
        append(source)
    writer.flush(timeout=30)
    writer.close()
    assert storage.calls["write"] == 2
    index = WalIndex.load(storage)
    first, second = index.objects()
    assert [(c.topic_id, c.partition) for c in first.index.chunks] == [(TOPICS[0], 0)]
    assert len(second.index.chunks) == len(sources) - 1


class ManualClock:
    """A clock for the writer that moves only when the test moves it; counts its reads."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.reads += 1
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


@pytest.mark.unit
def test_linger_gathers_until_max_bytes() -> None:
    """With a linger (remote stores) an object starts no sooner than linger_ms after the
    previous object's start. An idle writer writes a lone mark at once, even with an hour's
    linger; the marks made after it gather until max_bytes are pending, then one object holds
    them all (the hour is not over: the size trigger fired); flush() cuts the wait short.
    The writer's clock stands still (the hour never passes); the test waits for the writer to
    look at it after each mark, so that every mark had its chance to be written alone."""
    storage = FaultyStorage(memory_root())
    clock = ManualClock()
    sources = sources_for(None, 30)
    batches = [batch(s.partition, 0) for s in sources]
    writer = WalWriter(
        storage,
        broker_id=0,
        broker_epoch=1,
        fence=False,
        linger_ms=3_600_000,
        max_bytes=sum(len(b) for b in batches[1:]),
        clock=clock,
    )
    lone = sources[0]
    lone.writer = writer
    lone.append(batches[0])
    wait_until(lambda: lone.durable_end_offset == 2, message="the lone mark written at once")
    assert storage.calls["write"] == 1
    durable = threading.Event()
    sources[-1].on_durable = lambda end: durable.set()
    for source, data in zip(sources[1:], batches[1:], strict=True):
        source.writer = writer
        reads = clock.reads
        source.append(data)
        wait_until(lambda n=reads: clock.reads > n, message="the writer to see the mark")
    assert durable.wait(30), "the size trigger did not fire"
    assert storage.calls["write"] == 2
    assert all(s.durable_end_offset == 2 for s in sources)
    # flush() cuts the spacing short
    append(lone)
    writer.flush(timeout=30)
    assert storage.calls["write"] == 3
    writer.close()
    first, gathered, flushed = WalIndex.load(storage).objects()
    assert [(c.topic_id, c.partition) for c in first.index.chunks] == [(TOPICS[0], 0)]
    assert len(gathered.index.chunks) == len(sources) - 1
    assert [(c.topic_id, c.partition, c.base_offset) for c in flushed.index.chunks] == [
        (TOPICS[0], 0, 2)
    ]


@pytest.mark.unit
def test_marks_within_the_linger_of_a_start_wait_for_it_then_go_as_one_object() -> None:
    """Spacing, on an injected clock: after an object started, marks made before linger_ms
    passed (on the writer's clock) are not written, however long the test waits; once the
    clock passes the previous start + linger_ms they go, all of them, as one object."""
    storage = FaultyStorage(memory_root())
    clock = ManualClock()
    # (binary fractions of a second: the clock reaches the deadline exactly)
    writer = WalWriter(
        storage, broker_id=0, broker_epoch=1, fence=False, linger_ms=62.5, clock=clock
    )
    sources = sources_for(writer, 5)
    append(sources[0])
    wait_until(lambda: sources[0].durable_end_offset == 2, message="the lone mark written")
    clock.advance(0.03125)  # within the linger of that start
    for source in sources:
        append(source)
    reads = clock.reads
    # the writer looked at the clock again after every mark was made, and waited on
    wait_until(lambda: clock.reads >= reads + 2, message="the writer to look at the clock")
    assert storage.calls["write"] == 1
    assert [s.durable_end_offset for s in sources] == [2] + [0] * (len(sources) - 1)
    clock.advance(0.03125)  # the linger since the previous start is over
    wait_until(
        lambda: all(s.log_end_offset == s.durable_end_offset for s in sources),
        message="the gathered marks written",
    )
    assert storage.calls["write"] == 2
    writer.close()
    _, gathered = WalIndex.load(storage).objects()
    assert sorted((c.topic_id, c.partition) for c in gathered.index.chunks) == sorted(
        (s.topic_id, s.partition) for s in sources
    )


@pytest.mark.unit
def test_a_flush_whose_marks_are_being_written_does_not_cut_the_next_spacing() -> None:
    """flush() cuts the spacing short only for marks no object has taken yet: a flush that
    came while the object holding its marks was being written must not leave a force behind
    that sends the next marks at once (a CI run under load saw an object start halfway
    through a round of appends that way)."""
    storage = FaultyStorage(memory_root())
    clock = ManualClock()
    writer = WalWriter(
        storage, broker_id=0, broker_epoch=1, fence=False, linger_ms=3_600_000, clock=clock
    )
    first, second = sources_for(writer, 1)[:2]
    storage.stall("write", 2.0)
    append(first)  # an idle writer: written at once (slowly)
    wait_until(lambda: storage.calls["write"] == 1, message="the first object being written")
    writer.flush(timeout=30)  # its mark is taken: nothing to force
    assert first.durable_end_offset == 2
    reads = clock.reads
    append(second)
    wait_until(lambda: clock.reads > reads, message="the writer to look at the clock")
    assert storage.calls["write"] == 1
    assert second.durable_end_offset == 0  # within the hour's spacing
    writer.flush(timeout=30)  # a mark nobody took: forced
    assert (storage.calls["write"], second.durable_end_offset) == (2, 2)
    writer.close()


@pytest.mark.unit
def test_a_retried_write_is_not_a_new_start() -> None:
    """The spacing counts from the object's first attempt: a write that failed and was
    retried later does not push the next object's start back."""
    storage = FaultyStorage(memory_root())
    clock = ManualClock()
    storage.fail("write", 1)
    writer = WalWriter(
        storage,
        broker_id=0,
        broker_epoch=1,
        fence=False,
        linger_ms=1000,
        retry_backoff_ms=10,
        clock=clock,
        on_error=lambda err: clock.advance(0.9),  # the retry comes 0.9 s (clock) later
    )
    source = sources_for(writer, 1)[0]
    append(source)
    wait_until(lambda: source.durable_end_offset == 2, message="the retried write")
    assert (storage.calls["write"], writer.stats.failures) == (2, 1)
    clock.advance(0.1)  # 1 s after the first attempt, 0.1 s after the retry
    append(source)
    wait_until(lambda: source.durable_end_offset == 4, message="the next object, unspaced")
    assert writer.stats.objects == 2
    writer.close()


@pytest.mark.unit
def test_completions_on_the_loop_in_seq_order() -> None:
    seen: list[int] = []
    flushed_on: set[int] = set()

    async def main() -> list[FlushResult]:
        loop = asyncio.get_running_loop()
        results: list[FlushResult] = []
        done = asyncio.Event()

        def on_flushed(result: FlushResult) -> None:
            results.append(result)
            flushed_on.add(threading.get_ident())
            if sum(s.durable_end_offset for s in sources) == 2 * 10 * len(sources):
                done.set()

        writer = WalWriter(storage, broker_id=0, broker_epoch=1, loop=loop, on_flushed=on_flushed)
        sources = sources_for(writer, 5)
        for source in sources:
            source.on_durable = seen.append
        for _ in range(10):
            for source in sources:
                append(source)
            await asyncio.sleep(0)
        await asyncio.wait_for(done.wait(), 30)
        writer.close()
        return results

    storage = memory_root()
    main_thread = threading.get_ident()
    results = asyncio.run(main())
    assert flushed_on == {main_thread}
    seqs = [r.seq for r in results]
    assert seqs == sorted(seqs)
    assert seqs == list(range(1, len(seqs) + 1))  # the fence is seq 1
    assert results[0].extents == ()
    assert len(seen) == sum(len(r.extents) for r in results)


@pytest.mark.unit
def test_hooks_on_the_io_thread_and_on_flushed_on_the_loop() -> None:
    """For thread-safe sources (Log): wal_flushed runs on the writer's thread, then the
    broker's on_flushed on the loop, which sees the durable ends already moved."""
    hooks_on: set[int] = set()
    seen_by_loop: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def on_flushed(result: FlushResult) -> None:
            for extent in result.extents:
                seen_by_loop.append(sources[extent.partition].durable_end_offset)
            if all(s.durable_end_offset == 2 for s in sources):
                done.set()

        writer = WalWriter(
            memory_root(),
            broker_id=0,
            broker_epoch=1,
            loop=loop,
            hooks_on_loop=False,
            on_flushed=on_flushed,
            autostart=False,
        )
        sources = [BufferedSource("t", TOPICS[0], p, writer=writer) for p in range(4)]
        for source in sources:
            source.on_durable = lambda end: hooks_on.add(threading.get_ident())
            append(source)
        writer.start()
        await asyncio.wait_for(done.wait(), 30)
        await asyncio.to_thread(writer.close)

    asyncio.run(main())
    assert threading.get_ident() not in hooks_on
    assert len(hooks_on) == 1
    assert seen_by_loop == [2, 2, 2, 2]


@pytest.mark.unit
def test_wait_durable_resolves_on_the_loop_once_the_object_is_written() -> None:
    """A follower awaits its appended batches on the loop: wait_durable returns only after
    the object holding them is written and on_flushed ran, and a writer whose store keeps
    failing keeps it waiting, then fails it when closed."""
    storage = FaultyStorage(memory_root())
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        writer = WalWriter(
            storage,
            broker_id=0,
            broker_epoch=1,
            fence=False,
            loop=loop,
            hooks_on_loop=False,
            retry_backoff_ms=1,
            retry_backoff_max_ms=5,
            on_flushed=lambda result: order.append(f"flushed {result.seq}"),
        )
        sources = sources_for(writer, 2)
        await writer.wait_durable()  # nothing marked: at once
        for source in sources:
            append(source)
        await asyncio.wait_for(writer.wait_durable(), 30)
        order.append("awake")
        assert all(s.durable_end_offset == 2 for s in sources)

        storage.fail("write", times=1_000, path_prefix=WAL_PREFIX)
        append(sources[0])
        waiting = asyncio.ensure_future(writer.wait_durable())
        await asyncio.to_thread(
            wait_until, lambda: writer.stats.failures >= 3, message="three failed writes"
        )
        assert not waiting.done()
        assert sources[0].durable_end_offset == 2
        with pytest.raises(TimeoutError):  # wait_for's timeout leaves the writer intact
            await asyncio.wait_for(writer.wait_durable(), 0.05)
        await asyncio.to_thread(writer.close, drain=False)
        with pytest.raises(WalClosedError):
            await asyncio.wait_for(waiting, 30)
        with pytest.raises(WalClosedError):
            await writer.wait_durable()
        assert sources[0].durable_end_offset == 2

    asyncio.run(main())
    assert order[-1] == "awake"
    assert order[0].startswith("flushed")


@pytest.mark.unit
def test_wait_durable_waits_for_its_own_marks_not_an_earlier_object() -> None:
    """Batches appended while an object is being written are durable only with the next one:
    the earlier object's completion wakes the waiters of its own marks and no later one."""
    storage = FaultyStorage(memory_root())
    storage.stall("write", 0.3, times=1, path_prefix=WAL_PREFIX)

    async def main() -> None:
        writer = WalWriter(
            storage,
            broker_id=0,
            broker_epoch=1,
            fence=False,
            loop=asyncio.get_running_loop(),
            hooks_on_loop=False,
            retry_backoff_ms=1,
            retry_backoff_max_ms=5,
        )
        first, second = sources_for(writer, 1)[:2][:2]
        append(first)
        early = asyncio.ensure_future(writer.wait_durable())
        await asyncio.to_thread(  # the first object is being written (stalled)
            wait_until, lambda: writer.stats.write_calls >= 1, message="the first write"
        )
        storage.fail("write", times=1_000, path_prefix=WAL_PREFIX)  # the second one fails
        append(second)
        late = asyncio.ensure_future(writer.wait_durable())
        await asyncio.wait_for(early, 30)
        await asyncio.to_thread(
            wait_until, lambda: writer.stats.failures >= 3, message="three failed writes"
        )
        assert not late.done()
        assert second.durable_end_offset == 0
        storage.heal()
        await asyncio.wait_for(late, 30)
        assert second.durable_end_offset == 2
        assert writer.stats.objects == 2
        await asyncio.to_thread(writer.close)

    asyncio.run(main())


def inline_writer(storage: Storage, **options: Any) -> WalWriter:
    """A writer on the running loop that may write there (write_now), without a fence; its
    clock stands still unless the test moves it (a write takes no time)."""
    settings: dict[str, Any] = {
        "clock": ManualClock(),
        "broker_id": 0,
        "broker_epoch": 1,
        "fence": False,
        "loop": asyncio.get_running_loop(),
        "hooks_on_loop": False,
        "inline_max_bytes": 1 << 20,
    }
    return WalWriter(storage, **{**settings, **options})


@pytest.mark.unit
def test_write_now_writes_on_the_loop_and_delivers_there() -> None:
    """On a store whose small writes are fast (a journaled local root) a follower's fetcher
    writes its batches on the loop: one object, durable and delivered when write_now returns,
    in the seq order the I/O thread follows; nothing when nothing is marked."""
    storage = FaultyStorage(memory_root())
    flushed_on: list[tuple[int, int]] = []

    async def main() -> None:
        writer = inline_writer(
            storage,
            on_flushed=lambda r: flushed_on.append((r.seq, threading.get_ident())),
            autostart=False,  # no I/O thread to race with: only write_now writes,
        )
        sources = sources_for(writer, 2)
        assert writer.write_now()  # nothing marked: durable already
        assert writer.stats.objects == 0
        for source in sources:
            append(source)
        assert writer.write_now()
        assert all(s.durable_end_offset == 2 for s in sources)
        await writer.wait_durable()  # at once: the marks are durable
        append(sources[0])
        assert writer.write_now()
        assert sources[0].durable_end_offset == 4
        assert writer.stats.objects == 2
        writer.close()

    asyncio.run(main())
    assert flushed_on == [(1, threading.get_ident()), (2, threading.get_ident())]
    assert wal_objects(storage) == [f"{WAL_PREFIX}/{object_name(s, 1)}" for s in (1, 2)]
    recovered = WalIndex.load(storage)
    assert [len(o.index.chunks) for o in recovered.objects()] == [4, 1]


@pytest.mark.unit
def test_marks_on_the_loop_are_written_by_the_loop_after_the_ready_callbacks() -> None:
    """With inline writes a mark made on the loop does not wake the I/O thread: the loop
    writes the object once the callbacks ready at the mark have run (a produce's append lets
    the followers' parked fetches answer first); a mark made on another thread wakes the
    I/O thread as before."""
    storage = FaultyStorage(memory_root())
    order: list[tuple[str, int]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        writer = inline_writer(
            storage,
            on_flushed=lambda r: order.append(("flushed", threading.get_ident())),
            autostart=False,  # no I/O thread: only the loop can write the first two
        )
        first, second = sources_for(writer, 1)[:2]
        append(first)
        loop.call_soon(lambda: order.append(("ready", first.durable_end_offset)))
        append(second)  # one write for both marks
        await asyncio.wait_for(writer.wait_durable(), 30)
        assert first.durable_end_offset == second.durable_end_offset == 2
        assert writer.stats.objects == 1
        writer.start()
        await asyncio.to_thread(append, first)
        await asyncio.wait_for(writer.wait_durable(), 30)
        assert first.durable_end_offset == 4
        await asyncio.to_thread(writer.close)

    asyncio.run(main())
    me = threading.get_ident()
    assert order[:2] == [("ready", 0), ("flushed", me)]
    assert order[2][0] == "flushed"  # delivered on the loop, written by the thread
    assert wal_objects(storage) == [f"{WAL_PREFIX}/{object_name(s, 1)}" for s in (1, 2)]


@pytest.mark.unit
@pytest.mark.parametrize(
    "why",
    ["not asked", "too big", "linger", "no loop", "fence not written", "I/O thread busy", "closed"],
)
def test_write_now_declines_and_the_io_thread_writes(why: str) -> None:
    """write_now writes only up to inline_max_bytes marked, without a linger, on a loop,
    after the fence, with the I/O thread idle, before close; otherwise it says so (False) and
    the batches stay for the I/O thread."""
    storage = FaultyStorage(memory_root())

    async def main() -> None:
        writer = inline_writer(
            storage,
            fence=why == "fence not written",
            loop=None if why == "no loop" else asyncio.get_running_loop(),
            inline_max_bytes=0 if why == "not asked" else 100 if why == "too big" else 1 << 20,
            linger_ms=5 if why == "linger" else 0,
            autostart=False,
        )
        (source,) = sources_for(writer, 1)[:1]
        if why == "I/O thread busy":
            storage.stall("write", 0.5, times=1, path_prefix=WAL_PREFIX)
            writer.start()
            await asyncio.to_thread(append, source)  # off the loop: the thread writes it
            await asyncio.to_thread(
                wait_until, lambda: writer.stats.write_calls == 1, message="the thread writing"
            )
            append(source)  # marked while the thread writes the first
        elif why == "closed":
            append(source)
            writer.close(drain=False)
        else:
            append(source, count=1 if why != "too big" else 20)
        assert not writer.write_now()
        assert writer.stats.objects == 0
        if why == "closed":
            assert source.durable_end_offset == 0
            return
        if not writer._started:
            writer.start()
        await asyncio.to_thread(writer.flush, 30)
        assert source.durable_end_offset == source.log_end_offset
        await asyncio.to_thread(writer.close)

    asyncio.run(main())


@pytest.mark.unit
def test_a_slow_write_now_hands_the_writes_to_the_io_thread_for_a_while() -> None:
    """A write on the loop blocks everything the loop serves: one slower than INLINE_SLOW_S
    (a disk stalling) sends the writes to the I/O thread for INLINE_PAUSE_MIN_S (doubled for
    slow ones in a row), then the loop writes again."""
    clock = ManualClock()
    write_takes = [0.0]

    class SlowStorage(FaultyStorage):
        def write(self, path: str, data: Any) -> None:
            clock.advance(write_takes[0])
            super().write(path, data)

    storage = SlowStorage(memory_root())

    async def main() -> None:
        writer = inline_writer(
            storage,
            clock=clock,
            autostart=False,
        )
        (source,) = sources_for(writer, 1)[:1]
        append(source)
        write_takes[0] = INLINE_SLOW_S * 2  # this write takes twice too long
        assert writer.write_now()  # written, slowly
        write_takes[0] = 0.0
        append(source)
        assert not writer.write_now()  # paused: for the thread
        writer.start()
        await asyncio.wait_for(writer.wait_durable(), 30)
        assert source.durable_end_offset == 4
        clock.advance(INLINE_PAUSE_MIN_S)
        # the thread posts its delivery just before it lets go of the write lock
        await asyncio.to_thread(
            wait_until, lambda: not writer._io.locked(), message="the thread idle"
        )
        append(source)
        write_takes[0] = INLINE_SLOW_S * 2  # slow again, right after the pause: a longer one
        assert writer.write_now()  # the loop writes again
        assert source.durable_end_offset == 6
        write_takes[0] = 0.0
        clock.advance(INLINE_PAUSE_MIN_S)
        append(source)
        assert not writer.write_now()  # two slow ones in a row: paused twice as long
        await asyncio.wait_for(writer.wait_durable(), 30)
        clock.advance(INLINE_PAUSE_MIN_S + INLINE_SLOW_S)  # past 2 x INLINE_PAUSE_MIN_S
        await asyncio.to_thread(
            wait_until, lambda: not writer._io.locked(), message="the thread idle"
        )
        append(source)
        assert writer.write_now()
        assert source.durable_end_offset == 10
        await asyncio.to_thread(writer.close)

    asyncio.run(main())


@pytest.mark.unit
def test_write_now_leaves_a_steady_stream_of_writes_to_the_io_thread() -> None:
    """A write on the loop stops everything the loop serves for its fsync; the I/O thread
    lets the loop serve meanwhile. So once the store has been busy more than half the time
    since the last write began (writes back to back: a high rate), the thread writes; after
    an idle gap longer than the last write took, the loop writes again."""
    clock = ManualClock()

    class TimedStorage(FaultyStorage):
        def write(self, path: str, data: Any) -> None:
            clock.advance(0.001)  # every write takes 1 ms, well under INLINE_SLOW_S
            super().write(path, data)

    async def main() -> None:
        writer = inline_writer(TimedStorage(memory_root()), clock=clock, autostart=False)
        (source,) = sources_for(writer, 1)[:1]
        append(source)
        assert writer.write_now()  # the store was idle: written on the loop, in 1 ms
        append(source)
        assert not writer.write_now()  # right after it: the store is busy
        clock.advance(0.0005)
        assert not writer.write_now()  # idle 0.5 ms of the last 1.5: still busy
        clock.advance(0.0006)
        assert writer.write_now()  # idle longer than it was busy: the loop writes
        assert source.durable_end_offset == 4
        append(source)
        assert not writer.write_now()
        writer.start()  # the thread writes what the loop left
        await asyncio.wait_for(writer.wait_durable(), 30)
        assert source.durable_end_offset == 6
        await asyncio.to_thread(writer.close)

    asyncio.run(main())


@pytest.mark.unit
def test_write_now_waits_for_the_threads_delivery_to_reach_the_loop() -> None:
    """An object the I/O thread wrote is delivered on the loop later: until then write_now
    declines, so the loop hears of the objects in seq order."""
    storage = FaultyStorage(memory_root())
    seqs: list[int] = []

    async def main() -> None:
        writer = inline_writer(
            storage,
            on_flushed=lambda r: seqs.append(r.seq),
        )
        first, second = sources_for(writer, 1)[:2]
        # marked off the loop (this loop blocked meanwhile): written by the thread, whose
        # delivery waits for this loop (blocked in the poll below)
        marker = threading.Thread(target=append, args=(first,))
        marker.start()
        marker.join()
        wait_until(lambda: writer._posted == 1, message="the thread's delivery posted")
        append(second)
        assert not writer.write_now()  # the first object's delivery has not run yet
        assert second.durable_end_offset == 0
        await asyncio.wait_for(writer.wait_durable(), 30)
        assert second.durable_end_offset == 2
        await asyncio.to_thread(writer.close)

    asyncio.run(main())
    assert seqs == sorted(seqs) == list(range(1, len(seqs) + 1))


@pytest.mark.unit
def test_a_failed_write_now_leaves_the_batches_to_the_io_thread() -> None:
    """One attempt on the loop: if it fails nothing is durable, the error is reported, and the
    I/O thread retries the same batches under the same name (backoff, not on the loop)."""
    storage = FaultyStorage(memory_root())
    errors: list[BaseException] = []

    async def main() -> None:
        writer = inline_writer(
            storage,
            retry_backoff_ms=1,
            on_error=errors.append,
            autostart=False,
        )
        sources = sources_for(writer, 2)
        for source in sources:
            append(source)
        storage.fail("write", times=2, path_prefix=WAL_PREFIX)
        assert not writer.write_now()
        assert all(s.durable_end_offset == 0 for s in sources)
        assert writer.stats.failures == 1
        writer.start()
        await asyncio.wait_for(writer.wait_durable(), 30)
        assert all(s.durable_end_offset == 2 for s in sources)
        await asyncio.to_thread(writer.close)

    asyncio.run(main())
    assert len(errors) == 2
    assert wal_objects(storage) == [f"{WAL_PREFIX}/{object_name(1, 1)}"]


@pytest.mark.unit
def test_wait_durable_needs_a_loop() -> None:
    writer = WalWriter(memory_root(), broker_id=0, broker_epoch=1, autostart=False)
    with pytest.raises(RuntimeError, match="event loop"):
        asyncio.run(writer.wait_durable())


# --- failures: nothing is durable unless a write returned -----------------------------------------


@pytest.mark.unit
def test_failed_writes_are_retried_and_nothing_is_durable_meanwhile() -> None:
    storage = FaultyStorage(memory_root())
    errors: list[BaseException] = []
    storage.fail("write", times=1_000, path_prefix=WAL_PREFIX)
    writer = WalWriter(
        storage,
        broker_id=0,
        broker_epoch=1,
        fence=False,
        retry_backoff_ms=1,
        retry_backoff_max_ms=5,
        on_error=errors.append,
    )
    sources = sources_for(writer, 3)
    for source in sources:
        append(source)
    wait_until(lambda: writer.stats.failures >= 3, message="three failed writes")
    assert all(s.durable_end_offset == 0 for s in sources)
    for source in sources:  # more appends while failing: they wait for the next object
        append(source)
    storage.heal()
    writer.flush(timeout=30)
    writer.close()
    assert all(s.durable_end_offset == 4 for s in sources)
    assert len(errors) == writer.stats.failures >= 3
    assert writer.stats.objects == 2
    # the failed object was retried under its own name: one object per seq, none lost
    assert wal_objects(storage) == [f"{WAL_PREFIX}/{object_name(s, 1)}" for s in (1, 2)]


@pytest.mark.unit
def test_torn_write_is_retried_whole() -> None:
    storage = FaultyStorage(memory_root())
    storage.tear(fraction=0.5, path_prefix=WAL_PREFIX)
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, fence=False, retry_backoff_ms=1)
    sources = sources_for(writer, 4)
    for source in sources:
        append(source)
    writer.flush(timeout=30)
    writer.close()
    assert writer.stats.failures == 1
    index = WalIndex.load(storage)
    assert index.stats.scans == 0  # the retry replaced the torn object whole
    for source in sources:
        assert index.chunks_for(source.topic_id, source.partition) == source.extents


@pytest.mark.unit
def test_close_hands_taken_chunks_back() -> None:
    """A writer closed while its write keeps failing reports nothing durable, and the next
    writer takes the same batches again."""
    storage = FaultyStorage(memory_root())
    storage.fail("write", times=1_000, path_prefix=WAL_PREFIX)
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, fence=False, retry_backoff_ms=1)
    sources = sources_for(writer, 2)
    for source in sources:
        append(source)
    wait_until(lambda: writer.stats.failures >= 1, message="a failed write")
    writer.close(drain=False)
    with pytest.raises(WalClosedError):
        writer.mark_dirty(sources[0])
    assert all(s.durable_end_offset == 0 for s in sources)
    storage.heal()
    again = WalWriter(storage, broker_id=0, broker_epoch=2, fence=False, next_seq=2)
    for source in sources:
        source.writer = again
        again.mark_dirty(source)
    again.flush(timeout=30)
    again.close()
    assert all(s.durable_end_offset == 2 for s in sources)


class BrokenSource(BufferedSource):
    """A source with a bug: it hands over bytes that are not whole batches."""

    def take_pending_for_wal(self) -> PendingChunk | None:
        pending = super().take_pending_for_wal()
        if pending is None:
            return None
        return dataclasses.replace(pending, parts=(pending.parts[0][:-5],))

    def wal_flushed(self, extent: ChunkExtent) -> None:
        raise AssertionError("a broken chunk was written")


@pytest.mark.unit
def test_a_broken_source_does_not_stop_the_others() -> None:
    storage = memory_root()
    errors: list[BaseException] = []
    writer = WalWriter(
        storage, broker_id=0, broker_epoch=1, fence=False, autostart=False, on_error=errors.append
    )
    broken = BrokenSource("t", TOPICS[0], 0, writer=writer)
    sources = [BufferedSource("t", TOPICS[0], p, writer=writer) for p in (1, 2)]
    for source in [broken, *sources]:
        append(source)
    writer.start()
    writer.flush(timeout=30)
    writer.close()
    assert all(s.durable_end_offset == 2 for s in sources)
    assert broken.durable_end_offset == 0
    assert len(errors) == 1
    assert isinstance(errors[0], ValueError)
    assert "not whole record batches" in str(errors[0])
    (obj,) = WalIndex.load(storage).objects()
    assert [c.partition for c in obj.index.chunks] == [1, 2]


@pytest.mark.unit
def test_two_sources_of_one_partition_go_to_successive_objects() -> None:
    """One chunk per partition per object: a replaced log's successor waits one flush."""
    storage = memory_root()
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, fence=False, autostart=False)
    old = BufferedSource("t", TOPICS[0], 0, writer=writer)
    new = BufferedSource("t", TOPICS[0], 0, next_offset=2, writer=writer)
    append(old)
    append(new)
    writer.start()
    writer.flush(timeout=30)
    wait_until(lambda: new.durable_end_offset == 4, message="the second source's flush")
    writer.close()
    assert old.durable_end_offset == 2
    assert [e.object for e in old.extents + new.extents] == [
        f"{WAL_PREFIX}/{object_name(s, 1)}" for s in (1, 2)
    ]


@pytest.mark.unit
def test_a_failing_callback_does_not_block_the_others() -> None:
    storage = memory_root()
    writer = WalWriter(storage, broker_id=0, broker_epoch=1, fence=False, autostart=False)
    sources = sources_for(writer, 3)

    def fail(end: int) -> None:
        raise RuntimeError(f"a callback bug at {end}")

    sources[0].on_durable = fail
    for source in sources:
        append(source)
    writer.start()
    writer.flush(timeout=30)
    writer.close()
    assert all(s.durable_end_offset == 2 for s in sources)
