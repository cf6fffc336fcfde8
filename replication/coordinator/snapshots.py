"""Bounding a coordinator's internal partition by snapshots (``__consumer_offsets``,
``__transaction_state``).

Kafka compacts its internal topics; replog's logs are objects that are never rewritten. So a
coordinator counts the records it appends to a partition and, once there are enough since the
last snapshot (:meth:`SnapshotSchedule.note`), appends a snapshot: one record per live key, as
one batch, acks=all. Then it moves the partition's log start to the snapshot's first offset
(DeleteRecords; followers follow the leader's log start, and whole objects below it are
deleted). A partition so holds its live state plus what came after the last snapshot, and a
coordinator that takes over reads no more than that.

The snapshot must be the state as of its offset: no state change may have been appended but
not yet applied in memory while it is built. The caller passes what it holds for that
(:func:`take_snapshot` ``exclusive``): the group coordinator holds every group's lock and its
append lock; the transaction coordinator holds its :class:`WriteGate` exclusively.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from logstore.batch import Record, build
from logstore.errors import ReplogError
from replication.broker.partition import Partition

log = logging.getLogger(__name__)

__all__ = ["SnapshotSchedule", "WriteGate", "hold_all", "take_snapshot"]


class SnapshotSchedule:
    """When a partition's next snapshot is due: once it has taken ``max(min_records,
    2 * live keys)`` records since the last one (a snapshot then costs at most half of what
    it frees)."""

    def __init__(self) -> None:
        #: records appended since the last snapshot (or since the load)
        self.records_since_snapshot = 0
        #: a snapshot is being taken (at most one at a time)
        self.snapshotting = False

    def note(self, records: int, live_keys: int, min_records: int) -> bool:
        """Count ``records`` appended; True (and marked as snapshotting) if one is due now."""
        self.records_since_snapshot += records
        if self.snapshotting or self.records_since_snapshot < max(min_records, 2 * live_keys):
            return False
        self.snapshotting = True
        return True


class WriteGate:
    """Appends (with their in-memory update) share it; a snapshot holds it alone.

    A snapshot waits for the appends in flight to finish, and new appends wait for the
    snapshot from the moment it is due (:meth:`reserve`): appends stay concurrent with each
    other (a lock would serialise every state change behind one acks=all round trip), and a
    log grows by at most the appends in flight between a snapshot falling due and its cut."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._appends = 0
        self._exclusive = False
        #: snapshots due that have not entered yet: new appends wait for them
        self._reserved = 0

    def reserve(self) -> None:
        """Hold new appends back, now, for the next :meth:`exclusive` (which must follow)."""
        self._reserved += 1

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._exclusive and not self._reserved)
            self._appends += 1
        try:
            yield
        finally:
            async with self._cond:
                self._appends -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold the gate alone (taking the reservation :meth:`reserve` made, if any)."""
        async with self._cond:
            try:
                await self._cond.wait_for(lambda: not self._exclusive)
            finally:
                self._reserved = max(0, self._reserved - 1)  # taken (or given up)
            self._exclusive = True
            try:
                await self._cond.wait_for(lambda: self._appends == 0)
            except BaseException:
                self._exclusive = False
                self._cond.notify_all()
                raise
        try:
            yield
        finally:
            async with self._cond:
                self._exclusive = False
                self._cond.notify_all()


@contextlib.asynccontextmanager
async def hold_all(locks: Sequence[asyncio.Lock]) -> AsyncIterator[None]:
    """Acquire several asyncio locks in the given (fixed) order; release in reverse."""
    held: list[asyncio.Lock] = []
    try:
        for lock in locks:
            await lock.acquire()
            held.append(lock)
        yield
    finally:
        for lock in reversed(held):
            lock.release()


async def take_snapshot(
    what: str,
    schedule: SnapshotSchedule,
    exclusive: Callable[[], contextlib.AbstractAsyncContextManager[None]],
    records: Callable[[], list[Record] | None],
    append: Callable[[bytes], Awaitable[int]],
    partition: Partition | None,
    still_current: Callable[[], bool],
) -> None:
    """Append the snapshot ``records()`` builds (None or empty: not now) while holding
    ``exclusive()``, then start ``partition``'s log at it if this coordinator still leads it.

    ``append`` returns the batch's base offset once the ISR has it (acks=all). A failure is
    logged and the next write tries again; the log is only ever cut at a complete snapshot.
    """
    try:
        async with exclusive():
            snapshot = records()
            if not snapshot:
                return
            # in batches well below max.message.bytes; the log is cut only once all are in,
            # and a partial snapshot is harmless (each record is its key's current value)
            base = -1
            for chunk in _chunks(snapshot):
                offset = await append(build(chunk))
                base = offset if base < 0 else base
            schedule.records_since_snapshot = 0
        if partition is not None and still_current() and base >= 0:
            start = await asyncio.to_thread(partition.log.delete_records_before, base)
            log.info(
                "%s: snapshot of %d records at offset %d; log starts at %d",
                what,
                len(snapshot),
                base,
                start,
            )
    except ReplogError as err:
        log.warning("%s: snapshot failed, the next write retries it: %s", what, err)
    finally:
        schedule.snapshotting = False


#: the largest snapshot batch (record keys and values), well below max.message.bytes
SNAPSHOT_BATCH_BYTES = 1024 * 1024


def _chunks(records: list[Record]) -> list[list[Record]]:
    out: list[list[Record]] = [[]]
    size = 0
    for record in records:
        n = len(record.key or b"") + len(record.value or b"") + 16
        if out[-1] and size + n > SNAPSHOT_BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(record)
        size += n
    return out
