"""Flushing and compacting a broker's logs: group commit, the broker WAL's compaction and
checkpoints, as functions of the :class:`~replication.broker.replica_manager.ReplicaManager`
bound as its methods.

Group commit, event-driven: an append marks its partition dirty and wakes the flush loop; an
idle loop starts a flush at once, appends arriving while a flush runs join the next one, and
``log.flush.interval.ms`` is only the minimum spacing between flush starts (its default
depends on the storage kind, see :func:`flush_interval_ms`). Each flush writes one new segment
object per dirty partition (over the WAL, the writer writes one object for all of them); then
high watermarks move and parked requests complete. An idle broker's flush loop sleeps on its
event and never wakes. ``wal.compaction.window.bytes`` likewise defaults per storage kind
(:func:`compaction_window_bytes`): local files and memory cost nothing per request, object
stores charge per PUT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from logstore.checkpoint import BROKER_CHECKPOINT_NAME, BrokerCheckpoint
from logstore.errors import ConfigError, ObjectNotFoundError, ReplogError
from logstore.storage import Storage
from logstore.wal import FlushResult
from replication.common import TopicPartition
from replication.config import BrokerConfig

if TYPE_CHECKING:
    from replication.broker.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

#: log.flush.interval.ms when not set (-1), per storage kind. Local files and memory: 0, a
#: flush starts as soon as the previous one is done (a local fsync'd write costs ~0.5 ms and
#: nothing per request; group commit still forms from the appends that arrive while a flush
#: runs). Object stores: 250 ms, because every flush is one PUT per dirty partition, priced
#: per request (at 5 ms, 200 PUT/s per active partition replica = $86/day at S3's list price;
#: at 250 ms at most 4 PUT/s = $1.7/day). An append to an idle log is still flushed at once.
LOCAL_FLUSH_INTERVAL_MS = 0
OBJECT_STORE_FLUSH_INTERVAL_MS = 250
#: wal.compaction.window.bytes when not set (-1), per storage kind. A round reads, checks and
#: rewrites its window in one burst of CPU and disk; acks=all writes wait behind it (half-rate
#: Arrow p99 at 230k records/s on local files, 2 cores, repeated runs: 133-231 ms with 64 MiB
#: windows, 38-84 ms with 16 MiB, 54-59 ms with 8 MiB). On local files a packed object costs
#: nothing per request, so rounds are small; on object stores each packed object is a PUT
#: (64 MiB: ~$0.08 per TB at S3's list price, 16 MiB would be ~$0.31).
LOCAL_COMPACTION_WINDOW_BYTES = 16 * 1024 * 1024
OBJECT_STORE_COMPACTION_WINDOW_BYTES = 64 * 1024 * 1024
#: the least pause before retrying a failed flush (a storage outage must not spin the loop)
FLUSH_RETRY_BACKOFF_MS = 10


def _is_local(storage: Storage) -> bool:
    """Local files or memory: no price per request."""
    protocol, sep, _ = storage.url.partition("://")
    return not sep or protocol in ("file", "local", "memory")


def flush_interval_ms(config: BrokerConfig, storage: Storage) -> int:
    """log.flush.interval.ms in force: the configured value, or with -1 (the default) the one
    for this broker's storage kind (local files and memory: 0; object stores: 250)."""
    if config.log_flush_interval_ms >= 0:
        return config.log_flush_interval_ms
    return LOCAL_FLUSH_INTERVAL_MS if _is_local(storage) else OBJECT_STORE_FLUSH_INTERVAL_MS


def compaction_window_bytes(config: BrokerConfig, storage: Storage) -> int:
    """wal.compaction.window.bytes in force: the configured value, or with -1 (the default)
    the one for this broker's storage kind (local files and memory: 16 MiB; object stores:
    64 MiB)."""
    if config.wal_compaction_window_bytes > 0:
        return config.wal_compaction_window_bytes
    if config.wal_compaction_window_bytes == 0:
        raise ConfigError(
            "config wal.compaction.window.bytes=0: a round needs at least one byte; use a "
            "size in bytes, or -1 for the storage kind's default (16 MiB local, 64 MiB S3)"
        )
    if _is_local(storage):
        return LOCAL_COMPACTION_WINDOW_BYTES
    return OBJECT_STORE_COMPACTION_WINDOW_BYTES


def wal_flushed(rm: ReplicaManager, result: FlushResult) -> None:
    """A WAL object was written (on the loop, after every log in it heard on the writer's
    thread): what flush_dirty does after its writes, for the partitions it holds."""
    rm.flushes += 1
    compactor = rm.compactor
    if rm._compaction_idle or (
        compactor is not None and compactor.bytes_due(rm.compaction_window_bytes)
    ):
        rm._wal_written.set()
    for extent in result.extents:
        partition = rm._by_topic_id.get((extent.topic_id, extent.partition))
        if partition is None or rm.partitions.get(partition.key) is not partition:
            continue
        if partition.maybe_increment_high_watermark():
            rm._hw_moved(partition)
        for callback in rm.on_partition_change:
            callback(partition)


def wal_write_failed(rm: ReplicaManager, err: BaseException) -> None:
    """The writer's write failed (its thread); it retries with backoff, and nothing in
    the object is acknowledged meanwhile (acks=all waits, then times out)."""
    log.warning("broker WAL write on %s failed, retrying: %s", rm.storage.url, err)


def every_replica_open(rm: ReplicaManager) -> bool:
    """Whether every replica the current image gives this broker is open. Until then
    the WAL's garbage must not be collected nor compacted: a partition not open holds
    no references, so its chunks would look dead. So false too while any open runs or
    waits (even of a replica an image dropped since: its log holds references until it
    is deleted)."""
    if rm._to_open or rm._opening or not rm._storage_ready:
        return False
    for topic in rm.image.topics:
        for index, state in enumerate(topic.partitions):
            if rm.broker_id in state.replicas and (
                TopicPartition(topic.name, index) not in rm.partitions
            ):
                return False
    return True


async def compaction_loop(rm: ReplicaManager) -> None:
    """Over the WAL: compact L0 objects into packed objects once
    wal.compaction.window.bytes of them are live or the oldest is
    wal.compaction.l0.max.age.ms old, and delete the objects nobody refers to any more
    (after file.delete.delay.ms). No idle polling: it sleeps on an event while the WAL has
    no L0 object to compact, and otherwise until the oldest comes of age or until a
    written object brings the live L0 bytes to the bytes trigger (``_wal_flushed`` reads
    the index's running tally at each object: a round starts when this broker's own
    trigger is met, not at a shared cadence; brokers checking once a second compacted in
    step, whatever their phases). The live objects are listed and sorted (``next_round``)
    only when a round may be due."""
    config = rm.config
    check_s = min(1.0, config.wal_compaction_l0_max_age_ms / 4000)
    max_age_s = config.wal_compaction_l0_max_age_ms / 1000
    due_at: float | None = None  # monotonic: when the oldest live L0 object comes of age
    while True:
        # cleared before looking: a write from now on wakes the waits below
        rm._wal_written.clear()
        compactor = rm.compactor
        if compactor is None or not compactor.index.l0_live_bytes():
            due_at = None
            rm._compaction_idle = True
            try:
                await rm._wal_written.wait()
            finally:
                rm._compaction_idle = False
            continue
        wait_s = check_s  # replicas still opening: look again soon
        if every_replica_open(rm):
            now = time.monotonic()
            window = rm.compaction_window_bytes
            if due_at is None or now >= due_at or compactor.bytes_due(window):
                sources, due_in = compactor.next_round(
                    window_bytes=window, max_age_ms=config.wal_compaction_l0_max_age_ms
                )
                due_at = None
                if sources:
                    try:
                        result = await asyncio.to_thread(compactor.compact, sources)
                    except ReplogError as err:
                        log.warning(
                            "WAL compaction on %s failed, retrying: %s", rm.storage.url, err
                        )
                    except Exception:  # a bug: say so loudly, keep the broker's loop alive
                        log.exception("WAL compaction on %s failed", rm.storage.url)
                    else:
                        rm.compactions += 1
                        log.debug("WAL compaction: %s", result)
                        continue
                    await asyncio.sleep(check_s)
                    continue
                if due_in is not None:
                    # at most the max age: a wall clock set back must not stall compaction
                    due_at = now + min(max(due_in, 0.01), max_age_s)
            if due_at is not None:
                wait_s = max(due_at - now, 0.01)
        # Nothing is due before wait_s unless writes meet the bytes trigger: sleep until
        # then, or until they do.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rm._wal_written.wait(), wait_s)


async def flush_dirty(rm: ReplicaManager) -> bool:
    """Flush every dirty partition (one object each, in parallel threads), then move their
    HWs. False if a flush failed (that partition stays dirty and is retried)."""
    dirty = [p for p in rm._dirty if rm.partitions.get(p.key) is p]
    rm._dirty.clear()
    if not dirty:
        return True
    rm.flushes += 1
    results = await asyncio.gather(
        *(asyncio.to_thread(p.log.flush) for p in dirty), return_exceptions=True
    )
    ok = True
    for partition, outcome in zip(dirty, results, strict=True):
        if isinstance(outcome, BaseException):
            log.warning("flush of %r failed, retrying: %s", partition, outcome)
            rm._mark_dirty(partition)
            ok = False
            continue
        if partition.maybe_increment_high_watermark():
            rm._hw_moved(partition)
        for callback in rm.on_partition_change:
            callback(partition)
    return ok


async def flush_loop(rm: ReplicaManager) -> None:
    """Group commit driven by appends: sleep until one marks a partition dirty; flush at
    once unless the previous flush started less than ``log.flush.interval.ms`` ago (then
    at that moment); appends arriving meanwhile, or while the flush runs, join it or the
    next one. A failed flush is retried after at least FLUSH_RETRY_BACKOFF_MS."""
    loop = asyncio.get_running_loop()
    interval = rm.flush_interval_ms / 1000
    retry = FLUSH_RETRY_BACKOFF_MS / 1000
    next_start = loop.time()
    while True:
        await rm._flush_wanted.wait()
        rm.flush_wakeups += 1
        delay = next_start - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        rm._flush_wanted.clear()  # what is dirty now goes in this flush
        started = loop.time()
        next_start = started + interval
        if not await flush_dirty(rm):
            next_start = max(next_start, started + retry)


def read_broker_checkpoint(rm: ReplicaManager) -> dict[str, int]:
    """The HWs of the broker checkpoint (hints: none if it is missing or unreadable)."""
    try:
        data = rm.storage.read(BROKER_CHECKPOINT_NAME)
        return BrokerCheckpoint.from_bytes(data).high_watermarks
    except ObjectNotFoundError:
        return {}
    except ReplogError as err:
        log.warning("%s; high watermarks will be learned again", err)
        return {}


def write_broker_checkpoint(rm: ReplicaManager, hws: dict[str, int]) -> None:
    rm.storage.write(BROKER_CHECKPOINT_NAME, BrokerCheckpoint(hws).to_bytes())
    rm.broker_checkpoints += 1


def wal_high_watermarks(rm: ReplicaManager) -> dict[str, int]:
    return {
        f"{link.topic_id}:{link.partition}": p.log.high_watermark
        for p in rm.partitions.values()
        if (link := p.log.wal) is not None
    }


async def checkpoint_broker(rm: ReplicaManager) -> None:
    """Over the WAL: write the broker checkpoint if some partition's HW moved since the
    last one (one object for every partition; nothing when idle)."""
    if rm.wal_writer is None:
        return
    hws = wal_high_watermarks(rm)
    if hws == rm._hw_written:
        return
    try:
        await asyncio.to_thread(write_broker_checkpoint, rm, hws)
    except ReplogError as err:
        log.warning("broker checkpoint on %s failed: %s", rm.storage.url, err)
        return
    rm._hw_written = hws


async def checkpoint_loop(rm: ReplicaManager) -> None:
    """Every log.checkpoint.interval.ms, checkpoint the logs that changed since their
    last checkpoint (an idle broker writes nothing; the test is O(1) per log, on the
    loop, so unchanged logs cost no thread hop either); over the WAL, then the broker
    checkpoint if an HW moved."""
    while True:
        await asyncio.sleep(rm.config.log_checkpoint_interval_ms / 1000)
        await checkpoint_broker(rm)
        rm.checkpoint_rounds += 1
        logs = [p.log for p in rm.partitions.values() if p.log.checkpoint_needed()]
        rm.checkpoints += len(logs)
        for plog in logs:
            try:
                await asyncio.to_thread(plog.checkpoint)
            except ReplogError as err:
                log.warning("checkpoint of %s failed: %s", plog.storage.url, err)
