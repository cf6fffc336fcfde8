"""The broker's write-ahead log: one object per flush holding every dirty partition's batches.

Writing one object per partition per flush makes a broker's request rate grow with its
partition count, which on S3 (priced per PUT) is the dominant cost. Here every partition log
of a broker root hands its appended-but-not-durable batches to one :class:`WalWriter`, which
writes them all as one *WAL object* (format: :mod:`logstore.wal_format`) under

    <broker-root>/_replog/wal/L0/<seq:020d>-<broker_epoch:010d>.wal

and then tells each log which byte range of the object (a :class:`ChunkExtent`) now holds its
batches. A log's durable end offset moves only then, so everything built on it (follower fetch
offsets, the leader's high watermark, acks=all) keeps its meaning: a batch is acknowledged only
once the object holding it was written to the replica's own store.

The hand-over is a small protocol (:class:`WalSource`), which ``Log`` implements and
:class:`~logstore.buffered_source.BufferedSource` implements for tools and tests:

- the owner calls :meth:`WalWriter.mark_dirty` after an append (cheap, any thread);
- the writer's I/O thread calls ``take_pending_for_wal()``: the source returns its batches that
  are neither durable nor already taken (a :class:`PendingChunk`, no copy beyond the list);
- once the object is written, ``wal_flushed(extent)``, in seq order (on the event loop if the
  writer was given one, or on the I/O thread with ``hooks_on_loop=False``, for thread-safe
  sources), then the owner's ``on_flushed(result)`` (on the loop); or ``wal_aborted(pending)``
  if the writer closed before it could write them (the next writer takes them again).

Group commit without a timer: the I/O thread sleeps until a source is marked dirty, takes
everything pending, writes one object, and meanwhile new appends gather for the next one (one
flush in flight, so each partition's chunks become durable in offset order). For remote stores
``linger_ms`` is the least spacing between two object starts, to bound the PUT rate (at most
one object per ``linger_ms``, plus those that ``max_bytes`` pending start early): an idle
writer writes a lone mark at once, marks made less than ``linger_ms`` after the previous
object's start gather until then (Kafka-style group commit, as the per-partition layout's
``log.flush.interval.ms``). A failed write is retried with backoff, with the same name and
bytes (a write whose outcome is unknown may have landed; rewriting it is harmless); the
batches stay pending meanwhile and nothing is reported durable unless a write returned.

At start (before the writer), :meth:`WalIndex.load <logstore.wal_index.WalIndex.load>`
rebuilds what the WAL holds and applies the zombie rule (:mod:`logstore.wal_index`): a newer
broker epoch fences an older one's objects of higher seqs. The writer writes an empty *fence*
object first (``fence=True``) so that an incarnation that writes nothing else still fences its
predecessors.

On local files the broker asks its root to journal its L0 objects
(``Storage.journal``, :mod:`logstore.journal`, ``log.wal.journal.enable``): an object up to
4 MiB is then a frame in a pre-written journal file, made durable with one ``fdatasync``
instead of a new file's fsync, rename and directory fsync (a file-system journal commit per
flush, most of a synchronous acks=all send when replicas share a disk). Nothing here changes:
the object keeps its name, and every read, list and delete goes through the Storage.

Such a write takes a fraction of a millisecond, about what the two thread hand-offs around it
cost (loop -> I/O thread -> loop, each a wake-up and a GIL hand-over on a busy machine). So on
a journaled root the broker's writer is given ``inline_max_bytes``: a mark made on the event
loop does not wake the I/O thread; once the callbacks ready at the mark have run (a produce's
append first answers the followers' parked fetches) the loop writes the object itself
(:meth:`WalWriter.write_now`), and a follower's fetcher writes its fetched batches the same
way before its next fetch. The loop writes only when the I/O thread is idle with nothing of its
on the way to the loop (one object at a time, delivered in seq order), only objects up to that
size (INLINE_MAX_BYTES, 32 KiB), and only while its writes stay fast: one slower than
INLINE_SLOW_S (a stalling disk blocks everything the loop serves) hands the writes to the
thread for INLINE_PAUSE_MIN_S, doubling for each slow one in a row up to INLINE_PAUSE_MAX_S.
A failed write on the loop is not retried there: the thread takes the batches again. Kafka's
request threads append without an fsync; here the fsync is the acks=all promise, so it stays,
and only the hops around it go.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from logstore.errors import ReplogError, StorageError
from logstore.storage import Storage
from logstore.wal_format import ChunkInput, WalObjectIndex, encode_object, object_name
from logstore.wal_index import FIRST_SEQ, WAL_PREFIX, ChunkExtent, WalIndex

__all__ = [
    "BufferedBatch",
    "FlushResult",
    "PendingChunk",
    "WalClosedError",
    "WalSource",
    "WalWriter",
    "WriterStats",
    "durable_count",
    "still_taken",
]

log = logging.getLogger(__name__)

#: An inline write (:meth:`WalWriter.write_now`) slower than this blocked the event loop too
#: long (a journaled write takes a fraction of a millisecond; a disk stalls): the writes go
#: to the I/O thread for INLINE_PAUSE_MIN_S, doubled for each slow one in a row up to
#: INLINE_PAUSE_MAX_S, then the loop tries again. The first pause is short: a lone fsync of
#: 6-20 ms comes a few times a minute per broker on this VM's disk (three brokers syncing at
#: once), and a 1 s pause put ~12% of a sync producer's writes back on the thread; a disk
#: that stalls is slow in a row and reaches seconds within ten writes.
INLINE_SLOW_S = 0.005
#: The largest object the loop writes itself (``inline_max_bytes`` on a journaled root): the
#: loop serves nothing while it writes, and a journaled write of this size takes a fraction of
#: a millisecond, about what the two thread hand-offs around it cost; a bigger one's time is
#: its data's, and it goes to the I/O thread (the journal takes objects up to 4 MiB).
INLINE_MAX_BYTES = 32 << 10
INLINE_PAUSE_MIN_S = 0.05
INLINE_PAUSE_MAX_S = 30.0


class WalClosedError(ReplogError):
    """The WAL writer was closed before the data was written; nothing was reported durable."""


@dataclass(frozen=True, slots=True)
class PendingChunk:
    """A partition's batches handed to the writer: neither durable nor taken before."""

    topic: str
    topic_id: str
    partition: int
    #: whole record batches, back to back, offsets ``[base_offset, next_offset)``
    parts: tuple[bytes, ...]
    base_offset: int
    next_offset: int

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.parts)

    @classmethod
    def of(
        cls, topic: str, topic_id: str, partition: int, batches: Sequence[BufferedBatch]
    ) -> PendingChunk:
        """The contiguous ``batches`` (at least one) as one chunk; their bytes are not
        copied."""
        return cls(
            topic,
            topic_id,
            partition,
            tuple(b.data for b in batches),
            batches[0].base_offset,
            batches[-1].next_offset,
        )


class BufferedBatch(Protocol):
    """Whole batches a source keeps in its pending list until they are durable."""

    @property
    def base_offset(self) -> int: ...

    @property
    def next_offset(self) -> int: ...

    @property
    def data(self) -> bytes: ...


def durable_count(pending: Sequence[BufferedBatch], extent: ChunkExtent) -> int:
    """How many of a source's ``pending`` batches (oldest first) ``extent`` made durable: its
    ``wal_flushed`` drops them from the list."""
    done = 0
    while done < len(pending) and pending[done].next_offset <= extent.next_offset:
        done += 1
    return done


def still_taken(pending: Sequence[BufferedBatch], aborted: PendingChunk) -> int:
    """How many of a source's ``pending`` batches stay taken once the writer handed
    ``aborted`` back (``wal_aborted``): those before it."""
    return next(
        (i for i, b in enumerate(pending) if b.base_offset >= aborted.base_offset),
        len(pending),
    )


class WalSource(Protocol):
    """What a partition log offers the writer (``Log`` and
    :class:`~logstore.buffered_source.BufferedSource`).

    A source keeps three offsets: durable end <= taken end <= log end. Its batches stay in
    its pending list (readable) until ``wal_flushed`` says which prefix is durable; the writer
    never holds the only copy. With one flush in flight, ``taken end`` runs ahead of the
    durable end by at most one chunk. A truncation past the durable end must wait until the
    taken chunk is flushed or aborted (its bytes are in an object being written), then drop
    pending batches past the cut (recorded with the seq that may hold them, see docs/storage.md
    §2.7).
    """

    def take_pending_for_wal(self) -> PendingChunk | None:
        """The batches from the taken end to the log end (none: None); the taken end moves
        to the log end. Called on the writer's I/O thread; must be quick (a list slice under
        the source's lock, no copy)."""

    def wal_flushed(self, extent: ChunkExtent) -> None:
        """The batches ``[extent.base_offset, extent.next_offset)`` (exactly the taken chunk)
        are durable at ``extent``: the durable end moves to ``extent.next_offset``, and the
        source reads them from the object from now on. Called once per taken chunk, in take
        order, on the loop if the writer has one."""

    def wal_aborted(self, pending: PendingChunk) -> None:
        """The writer closed without writing ``pending``: the taken end goes back to
        ``pending.base_offset`` (the next writer takes the batches again)."""


@dataclass(frozen=True, slots=True)
class FlushResult:
    """One object written: its seq, path, size, and the chunk of each source in it."""

    seq: int
    object: str
    size: int
    extents: tuple[ChunkExtent, ...]
    #: write calls it took (1 unless the store failed)
    attempts: int


# --- the writer -----------------------------------------------------------------------------


@dataclass(slots=True)
class WriterStats:
    """What a :class:`WalWriter` did (for tests, metrics and logs)."""

    objects: int = 0
    write_calls: int = 0
    failures: int = 0
    bytes: int = 0


class WalWriter:
    """Writes every marked source's pending batches as one object per flush (see the module
    doc). One per broker root; thread-safe; its I/O runs on a dedicated thread.

    Parameters
    ----------
    storage
        The broker root (objects go under ``_replog/wal/``).
    broker_id, broker_epoch
        Written in every object; the epoch is in the names too (zombie rule).
    next_seq
        :attr:`WalIndex.next_seq` of the loaded index: seqs never repeat across restarts.
    loop
        Deliver ``on_flushed`` (and, with ``hooks_on_loop``, the sources' ``wal_flushed``) on
        this event loop (``call_soon_threadsafe``), in seq order; without one everything runs
        on the I/O thread.
    hooks_on_loop
        False: call ``wal_flushed`` on the I/O thread, then post ``on_flushed`` to the loop.
        For thread-safe sources (``Log``): their durable end moves without waiting for the
        loop, and a truncation waiting on the loop thread for an in-flight chunk cannot
        deadlock.
    linger_ms, max_bytes
        Group commit by spacing: an object starts (its pending batches are taken) no sooner
        than ``linger_ms`` after the previous object's start; a mark on an idle writer is
        written at once, marks made meanwhile gather for the next object. ``max_bytes``
        marked, or a forced flush (:meth:`flush`, ``wait_durable(force=True)``), cut the wait
        short. 0: no spacing, for local files and memory (an object starts as soon as the
        previous write returned). The fence object does not count as a start: it holds no
        data and is written once per incarnation (one PUT more at most), and counting it
        would make the first append after a start wait ``linger_ms`` for nothing (the
        per-partition layout's first flush after a start does not wait either). A retried
        write is not a new start.
    retry_backoff_ms, retry_backoff_max_ms
        A failed write is retried after this backoff, doubling up to the max.
    on_flushed
        Called with each :class:`FlushResult` after the sources heard of it.
    on_error
        Called (on the I/O thread) with each failed write's error before its retry.
    index
        If given, each written object is added to it, with one reference per chunk (the
        sources hold them; they :meth:`WalIndex.release` what they drop).
    fence
        Write an empty object first, so this epoch fences older ones even if it writes
        nothing else (zombie rule).
    inline_max_bytes
        Let :meth:`write_now` write up to this many marked bytes on the loop when the I/O
        thread is idle (0: never; only without ``linger_ms`` and with a ``loop``): for a store
        whose small writes take a fraction of a millisecond (a journaled local root), where
        the two thread hand-offs around the write cost as much as the write itself.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        broker_id: int,
        broker_epoch: int,
        next_seq: int = FIRST_SEQ,
        loop: asyncio.AbstractEventLoop | None = None,
        hooks_on_loop: bool = True,
        linger_ms: float = 0.0,
        max_bytes: int = 16 * 1024 * 1024,
        retry_backoff_ms: float = 100.0,
        retry_backoff_max_ms: float = 5000.0,
        on_flushed: Callable[[FlushResult], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        index: WalIndex | None = None,
        fence: bool = True,
        autostart: bool = True,
        clock: Callable[[], float] = time.monotonic,
        inline_max_bytes: int = 0,
    ) -> None:
        if next_seq < FIRST_SEQ:
            raise ValueError(f"next_seq must be at least {FIRST_SEQ}, not {next_seq}")
        if linger_ms < 0 or max_bytes < 1 or retry_backoff_ms <= 0:
            raise ValueError("linger_ms >= 0, max_bytes >= 1 and retry_backoff_ms > 0 are needed")
        self.storage = storage
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self._next_seq = next_seq
        self._loop = loop
        self._hooks_on_loop = hooks_on_loop
        self._linger_s = linger_ms / 1000
        self._max_bytes = max_bytes
        self._backoff_s = retry_backoff_ms / 1000
        self._backoff_max_s = max(retry_backoff_max_ms, retry_backoff_ms) / 1000
        self._on_flushed = on_flushed
        self._on_error = on_error
        self._index = index
        self._fence = fence
        self._clock = clock
        #: guards the writer's state; the I/O thread waits on it for work (marks, a force,
        #: closing), and whoever makes work notifies it
        state_lock = threading.RLock()
        self._cond = threading.Condition(state_lock)
        #: the same lock; flush() waits on it for durable marks, which each delivery notifies
        #: (not ``_cond``: every delivery would wake the idle I/O thread for nothing, and a
        #: thread woken while the loop has just marked would take that write from the loop)
        self._durable = threading.Condition(state_lock)
        #: held by whoever writes an object (the I/O thread, or the loop in write_now) from
        #: taking its batches until its delivery is posted: one object at a time, in seq order
        self._io = threading.Lock()
        self._inline_max = inline_max_bytes if linger_ms == 0 and loop is not None else 0
        #: deliveries posted to the loop and not yet applied (write_now waits for none)
        self._posted = 0
        self._fenced = not fence  # write_now writes only after the fence
        self._loop_flush_due = False  # a _loop_flush is scheduled on the loop
        self._inline_paused_until = 0.0  # clock(): no write_now before (one was slow)
        #: clock() before and after the last object's write (by whoever holds ``_io``)
        self._last_write = (0.0, 0.0)
        self._inline_pause_s = INLINE_PAUSE_MIN_S  # the next pause after a slow one
        self._dirty: dict[int, WalSource] = {}
        self._dirty_bytes = 0
        #: clock() when the last object (not the fence) was started; None: none yet
        self._last_start: float | None = None  # only the I/O thread uses it
        self._marks = 0  # mark_dirty calls so far
        self._durable_marks = 0  # marks whose data is durable (and delivered)
        self._closing = False
        #: the marks a flush() waits for without the spacing (forced until an object takes
        #: them: a force whose marks an object already took must not cut the next spacing)
        self._force_marks = 0
        self._taken_marks = 0  # marks an object has taken (written, or being written)
        self._failed: BaseException | None = None
        #: (marks target, future) of :meth:`wait_durable` callers on ``loop``, in mark order
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._stats = WriterStats()
        self._thread = threading.Thread(target=self._run, name="wal-writer", daemon=True)
        self._started = False
        if autostart:
            self.start()

    # --- control ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the I/O thread (done by the constructor unless ``autostart=False``)."""
        with self._cond:
            if self._started:
                return
            self._started = True
        self._thread.start()

    def mark_dirty(self, source: WalSource, nbytes: int = 0) -> None:
        """``source`` has new pending batches (``nbytes`` of them, for ``max_bytes``).

        With ``inline_max_bytes``, a mark made on the loop does not wake the I/O thread: the
        loop writes what is marked once the callbacks ready now have run (:meth:`write_now`;
        a produce's append first lets the followers' parked fetches answer), and wakes the
        thread only if it cannot."""
        defer = False
        with self._cond:
            if self._closing:
                raise WalClosedError(f"WAL writer of {self.storage.url} is closed")
            self._dirty[id(source)] = source
            self._dirty_bytes += nbytes
            self._marks += 1
            if (
                self._inline_max
                and asyncio._get_running_loop() is self._loop
                and self._clock() >= self._inline_paused_until
            ):
                defer = not self._loop_flush_due
                self._loop_flush_due = True
            else:
                self._cond.notify_all()
        if defer:
            # call_later(0), not call_soon: it runs after every callback made ready in this
            # iteration too (a completed fetch's task wake-up comes after this mark)
            assert self._loop is not None
            self._loop.call_later(0, self._loop_flush)

    def _loop_flush(self) -> None:
        """On the loop: write what the loop marked, or leave it to the I/O thread."""
        with self._cond:
            self._loop_flush_due = False
            if self._durable_marks >= self._marks or not self._dirty:
                return
        if not self.write_now():
            with self._cond:
                self._cond.notify_all()

    def flush(self, timeout: float | None = None, *, force: bool = True) -> None:
        """Wait until everything marked dirty before this call is durable and delivered
        (cutting the linger's spacing short, as Kafka's producer flush does; ``force=False``:
        within the spacing, so the data joins the object being gathered, as a follower's
        fetched batches should on an object store). Not from the writer's event loop
        (delivery runs there). TimeoutError after ``timeout`` s; WalClosedError if the writer
        closed first."""
        with self._cond:
            target = self._marks
            if self._durable_marks < target and force:
                self._force_marks = max(self._force_marks, target)  # no spacing: someone waits
                self._cond.notify_all()
            done = self._durable.wait_for(
                lambda: self._durable_marks >= target or self._closing, timeout
            )
            if self._durable_marks >= target:
                return
            if not done:
                raise TimeoutError(
                    f"WAL writer of {self.storage.url}: not durable after {timeout} s"
                )
            raise self._closed_error()

    async def wait_durable(self, *, force: bool = False) -> None:
        """The event loop's :meth:`flush`: await until everything marked dirty before this
        call is durable and delivered, without a thread waiting for it (a follower's fetcher
        makes its appended batches durable this way: no hop to a worker thread and back, the
        writer's completion on the loop resolves it). Only on the writer's ``loop``; within
        the linger's spacing unless ``force``. WalClosedError if the writer closed first;
        bound it with ``asyncio.wait_for``."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("wait_durable needs a writer that delivers on an event loop")
        with self._cond:
            target = self._marks
            if self._durable_marks >= target:
                return
            if self._closing:
                raise self._closed_error()
            if force:
                self._force_marks = max(self._force_marks, target)
                self._cond.notify_all()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append((target, waiter))
        await waiter

    def _wake_waiters(self) -> None:
        """On the loop: resolve the :meth:`wait_durable` callers whose marks are durable, or
        fail them all once the writer is closing."""
        with self._cond:
            durable, closing = self._durable_marks, self._closing
            ready: list[asyncio.Future[None]] = []
            while self._waiters and (closing or self._waiters[0][0] <= durable):
                ready.append(self._waiters.popleft()[1])
        for waiter in ready:
            if waiter.done():  # cancelled (wait_for's timeout)
                continue
            if closing:
                waiter.set_exception(self._closed_error())
            else:
                waiter.set_result(None)

    def _closed_error(self) -> WalClosedError:
        """What a waiter gets when the writer closed before its data was written (caused by
        the writer's failure, if one stopped it)."""
        err = WalClosedError(f"WAL writer of {self.storage.url} closed before the data was written")
        err.__cause__ = self._failed
        return err

    def _post_wake_waiters(self) -> None:
        """From any thread: let the loop fail the waiters of a closing writer."""
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._wake_waiters)
        except RuntimeError:  # the loop is closed: nobody awaits on it any more
            pass

    def close(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Stop the writer. With ``drain``, first wait (up to ``timeout``) until what is
        marked is durable. Chunks taken but not written are handed back (``wal_aborted``)."""
        if drain and self._started:
            try:
                self.flush(timeout)
            except (TimeoutError, WalClosedError) as err:
                log.warning(
                    "%s: closing the WAL writer without draining: %s", self.storage.url, err
                )
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            self._durable.notify_all()
        self._post_wake_waiters()
        if self._started:
            self._thread.join(timeout)

    @property
    def next_seq(self) -> int:
        with self._cond:
            return self._next_seq

    @property
    def stats(self) -> WriterStats:
        """Objects written, write calls (retries included), failed calls, bytes written."""
        with self._cond:
            return WriterStats(**{f: getattr(self._stats, f) for f in WriterStats.__slots__})

    # --- the I/O thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._fence:
                with self._io:
                    self._write_object([], 0, fence=True)
            while self._flush_once():
                pass
        except BaseException as err:  # a bug: fail loudly, never report anything durable
            log.exception("%s: the WAL writer stopped", self.storage.url)
            with self._cond:
                self._failed = err
                self._closing = True
                self._cond.notify_all()
                self._durable.notify_all()
            self._post_wake_waiters()

    def _flush_once(self) -> bool:
        """Wait for dirty sources and for the spacing after the previous object's start, write
        one object; False once closing."""
        with self._cond:
            while not self._dirty and not self._closing:
                self._cond.wait()
            if self._closing:
                return False
        with self._io:  # write_now may be writing: its object goes first
            return self._take_and_write()

    def _take_and_write(self) -> bool:
        with self._cond:
            if not self._dirty or self._closing:  # write_now took them
                return not self._closing
            if self._linger_s > 0 and self._last_start is not None:
                deadline = self._last_start + self._linger_s
                while (
                    not self._closing
                    and self._force_marks <= self._taken_marks
                    and self._dirty_bytes < self._max_bytes
                ):
                    left = deadline - self._clock()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            started = self._clock()
            sources = list(self._dirty.values())
            self._dirty.clear()
            self._dirty_bytes = 0
            # Every mark counted here was made after its data was appended, so the takes
            # below see that data: once this object is delivered, these marks are durable.
            marks = self._taken_marks = self._marks
        taken: list[tuple[WalSource, PendingChunk]] = []
        for source in sources:
            pending = source.take_pending_for_wal()
            if pending is not None:
                taken.append((source, pending))
        if not taken:
            self._deliver((), None, marks)
            return True
        return self._write_object(taken, marks, started=started)

    def write_now(self) -> bool:
        """On the writer's loop: make everything marked dirty so far durable by writing it
        as one object here, if it is at most ``inline_max_bytes`` and the I/O thread is idle
        (writing nothing, none of its deliveries on the way to the loop); True once it is
        durable and delivered. False if not written here (too big, the I/O thread busy, the
        store busy more than half the time since the last write began, or the one attempt
        failed: the I/O thread takes the batches again and retries): then await
        :meth:`wait_durable`. Blocks the loop for the write: only for small objects on
        a store that makes them durable in a fraction of a millisecond; after a write slower
        than INLINE_SLOW_S, the I/O thread writes for a while (INLINE_PAUSE_MIN_S, doubling
        for slow ones in a row)."""
        if not self._inline_max or self._clock() < self._inline_paused_until:
            return False
        if not self._io.acquire(blocking=False):
            return False
        try:
            began, ended = self._last_write
            if self._clock() - ended < ended - began:
                # The store was busy more than half the time since the last write began: a
                # steady stream of writes. The I/O thread writes them then, while the loop goes
                # on serving (on the loop, each fsync would stop everything it serves).
                return False
            with self._cond:
                if self._durable_marks >= self._marks:
                    return True
                if (
                    self._closing
                    or self._posted
                    or not self._fenced
                    or self._dirty_bytes > self._inline_max
                ):
                    return False
                sources = list(self._dirty.values())
                self._dirty.clear()
                self._dirty_bytes = 0
                marks = self._taken_marks = self._marks
            started = self._clock()
            taken = [
                (source, pending)
                for source in sources
                if (pending := source.take_pending_for_wal()) is not None
            ]
            if not taken:
                self._apply((), None, marks)
                return True
            written = self._write_object(taken, marks, started=started, inline=True)
            took = self._clock() - started
            if took <= INLINE_SLOW_S:
                self._inline_pause_s = INLINE_PAUSE_MIN_S
            else:
                # the loop served nothing meanwhile (a disk stalling, a store slower than it
                # was said to be): the I/O thread writes for a while, longer each time in a
                # row (a write right after a start may be slow once; a stalling disk stays)
                pause = self._inline_pause_s
                self._inline_paused_until = started + took + pause
                self._inline_pause_s = min(pause * 2, INLINE_PAUSE_MAX_S)
                log.info(
                    "%s: a WAL write on the event loop took %.1f ms; writing on the WAL "
                    "thread for %.0f ms",
                    self.storage.url,
                    took * 1000,
                    pause * 1000,
                )
            return written
        finally:
            self._io.release()

    def _write_object(
        self,
        taken: list[tuple[WalSource, PendingChunk]],
        marks: int,
        *,
        fence: bool = False,
        started: float | None = None,
        inline: bool = False,
    ) -> bool:
        """Encode and write one object (retrying), then deliver it. False if closed first.
        ``started``: when its batches were taken (the next object's spacing counts from
        there; the fence passes none: it is no start). ``inline``: from :meth:`write_now`, on
        the loop: one attempt (False if it failed, the batches handed back to the I/O
        thread), delivered here."""
        seq = self._next_seq  # only the holder of _io changes it
        taken = self._one_per_partition(taken)
        try:
            data, index = self._encode(taken, seq)
        except ValueError:
            taken = self._drop_malformed(taken, seq)
            if not taken and not fence:
                (self._apply if inline else self._deliver)((), None, marks)
                return True
            data, index = self._encode(taken, seq)
        path = f"{WAL_PREFIX}/{object_name(seq, self.broker_epoch)}"
        if started is not None:
            self._last_start = started  # its retries are not new starts
        began = self._clock()
        attempts = self._write_with_retry(path, data, once=inline)
        self._last_write = (began, self._clock())
        if attempts == 0:
            for source, pending in taken:
                source.wal_aborted(pending)
            if inline:  # the I/O thread takes them again and retries with backoff
                with self._cond:
                    for source, _ in taken:
                        self._dirty[id(source)] = source
                    self._cond.notify_all()
            return False
        with self._cond:
            if fence:
                self._fenced = True
            self._next_seq = seq + 1
            self._stats.objects += 1
            self._stats.bytes += len(data)
        if self._index is not None:
            self._index.add_object(path, index, references=len(index.chunks))
        by_key = {(c.topic_id, c.partition): ChunkExtent.of(path, 0, c) for c in index.chunks}
        pairs = tuple((s, by_key[(p.topic_id, p.partition)]) for s, p in taken)
        result = FlushResult(seq, path, len(data), tuple(e for _, e in pairs), attempts)
        if inline:
            self._apply(pairs, result, marks)
        else:
            self._deliver(pairs, result, marks)
        return True

    def _encode(
        self, taken: list[tuple[WalSource, PendingChunk]], seq: int
    ) -> tuple[bytearray, WalObjectIndex]:
        chunks = [
            ChunkInput(
                p.topic,
                p.topic_id,
                p.partition,
                p.parts,
                base_offset=p.base_offset,
                next_offset=p.next_offset,
            )
            for _, p in taken
        ]
        return encode_object(
            chunks, seq=seq, broker_id=self.broker_id, broker_epoch=self.broker_epoch
        )

    def _one_per_partition(
        self, taken: list[tuple[WalSource, PendingChunk]]
    ) -> list[tuple[WalSource, PendingChunk]]:
        """An object holds one chunk per partition: a second source of the same partition (a
        log replaced while its predecessor still had pending batches) waits for the next."""
        seen: set[tuple[str, int]] = set()
        kept = []
        for source, pending in taken:
            key = (pending.topic_id, pending.partition)
            if key in seen:
                source.wal_aborted(pending)
                with self._cond:  # take it again in the next object
                    self._dirty[id(source)] = source
                continue
            seen.add(key)
            kept.append((source, pending))
        return kept

    def _drop_malformed(
        self, taken: list[tuple[WalSource, PendingChunk]], seq: int
    ) -> list[tuple[WalSource, PendingChunk]]:
        """The chunks that encode alone; the others are handed back and reported (a source
        that gives something other than whole contiguous batches has a bug; the other
        partitions must not stop because of it)."""
        kept = []
        for source, pending in taken:
            try:
                self._encode([(source, pending)], seq)
            except ValueError as err:
                log.exception(
                    "%s: not writing %s-%d [%d, %d)",
                    self.storage.url,
                    pending.topic,
                    pending.partition,
                    pending.base_offset,
                    pending.next_offset,
                )
                source.wal_aborted(pending)
                self._report(err)
                continue
            kept.append((source, pending))
        return kept

    def _report(self, err: BaseException) -> None:
        if self._on_error is None:
            return
        try:
            self._on_error(err)
        except Exception:
            log.exception("%s: on_error failed", self.storage.url)

    def _write_with_retry(self, path: str, data: bytearray, *, once: bool = False) -> int:
        """Write until it returns; the number of calls, or 0 if the writer closed first
        (``once``: or the one attempt failed, left to the I/O thread to retry)."""
        backoff = self._backoff_s
        attempts = 0
        while True:
            attempts += 1
            with self._cond:
                self._stats.write_calls += 1
            try:
                self.storage.write(path, data)
                return attempts
            except StorageError as err:
                with self._cond:
                    self._stats.failures += 1
                log.warning(
                    "%s: writing %s failed (attempt %d), retrying in %.0f ms: %s",
                    self.storage.url,
                    path,
                    attempts,
                    0 if once else backoff * 1000,
                    err,
                )
                self._report(err)
                if once:
                    return 0
                with self._cond:
                    if self._cond.wait_for(lambda: self._closing, backoff):
                        return 0
                backoff = min(backoff * 2, self._backoff_max_s)

    def _deliver(
        self,
        pairs: tuple[tuple[WalSource, ChunkExtent], ...],
        result: FlushResult | None,
        marks: int,
    ) -> None:
        if self._loop is None:
            self._apply(pairs, result, marks)
            return
        if not self._hooks_on_loop:
            self._apply(pairs, None, -1)
            pairs = ()
        with self._cond:
            self._posted += 1
        try:
            self._loop.call_soon_threadsafe(self._apply_posted, pairs, result, marks)
        except RuntimeError:  # the loop is closed: nobody is waiting on it any more
            with self._cond:
                self._posted -= 1
            log.warning("%s: event loop closed, WAL completion dropped", self.storage.url)

    def _apply_posted(
        self,
        pairs: tuple[tuple[WalSource, ChunkExtent], ...],
        result: FlushResult | None,
        marks: int,
    ) -> None:
        with self._cond:
            self._posted -= 1
        self._apply(pairs, result, marks)

    def _apply(
        self,
        pairs: tuple[tuple[WalSource, ChunkExtent], ...],
        result: FlushResult | None,
        marks: int,
    ) -> None:
        # A failing callback must not keep the others (or flush() waiters) from hearing.
        for source, extent in pairs:
            try:
                source.wal_flushed(extent)
            except Exception:
                log.exception("%s: wal_flushed(%s) failed", self.storage.url, extent)
        if result is not None and self._on_flushed is not None:
            try:
                self._on_flushed(result)
            except Exception:
                log.exception("%s: on_flushed(seq %d) failed", self.storage.url, result.seq)
        if marks < 0:
            return
        with self._cond:
            self._durable_marks = max(self._durable_marks, marks)
            self._durable.notify_all()
        if self._loop is not None:  # on the loop: its awaiting callers
            self._wake_waiters()
