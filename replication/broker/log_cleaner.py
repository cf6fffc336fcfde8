"""The broker's log cleaner (Kafka's LogCleaner threads and LogCleanerManager): which of this
broker's compacted logs to clean, when, and how fast; the round itself is
:func:`logstore.log_cleaner.clean_log`. Bound as a :class:`~replication.broker.replica_manager
.ReplicaManager` method.

Every replica cleans its own store, leader and follower alike, as Kafka's do: the rounds of two
replicas of a partition need not match, and offsets stay what they were, so a follower keeps
fetching from its LEO whatever its leader's log looks like below it. Each pass plans every
compacted log (in memory: no storage request), cleans the filthiest ones first (the highest
dirty ratio, Kafka's ``grabFilthiestCompactedLog``), up to ``log.cleaner.threads`` at a time,
each bounded by the partition's last stable offset; when none needs a clean it sleeps
``log.cleaner.backoff.ms``. ``log.cleaner.io.max.bytes.per.second`` paces the rounds: a round
that read and wrote faster is followed by a pause.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from logstore.errors import ReplogError
from logstore.log_cleaner import CleanerStats, CleaningPlan, clean_log, plan_cleaning

if TYPE_CHECKING:
    from replication.broker.partition import Partition
    from replication.broker.replica_manager import ReplicaManager

log = logging.getLogger(__name__)


#: what :class:`CleanerTotals` counts, each a :class:`CleanerStats` field summed over the
#: committed rounds (``rounds`` and ``failures`` aside)
COUNTED = ("bytes_read", "bytes_written", "records_read", "records_kept")


@dataclass(slots=True)
class CleanerTotals:
    """What the broker's cleaner did since it started (its metrics): ``counts`` holds the
    rounds committed, the rounds failed and the sums of :data:`COUNTED`."""

    counts: Counter[str] = field(default_factory=Counter)
    #: the highest dirty ratio among the compacted logs at the last pass (Kafka's
    #: max-dirty-percent, as a ratio)
    max_dirty_ratio: float = 0.0
    #: bytes written / bytes read of the last round (Kafka's cleaner-recopy-percent, as a ratio)
    last_recopy_ratio: float = 0.0

    def add(self, stats: CleanerStats) -> None:
        self.counts["rounds"] += 1
        for name in COUNTED:
            self.counts[name] += getattr(stats, name)
        self.last_recopy_ratio = stats.bytes_written / max(stats.bytes_read, 1)


def _plans(rm: ReplicaManager) -> list[tuple[CleaningPlan, Partition, int]]:
    """Every compacted log that needs a clean now, the filthiest first, with the partition's
    last stable offset (read here, on the event loop that changes it)."""
    now = time.time_ns() // 1_000_000
    bound = rm.config.log_cleaner_dedupe_buffer_size
    plans = []
    for partition in list(rm.partitions.values()):
        plog = partition.log
        if not plog.config.compact:
            continue
        lso = partition.last_stable_offset
        plan = plan_cleaning(plog, now, lso, max_dirty_bytes=bound)
        if plan is not None:
            plans.append((plan, partition, lso))
    plans.sort(key=lambda p: p[0].dirty_ratio, reverse=True)
    return plans


def _clean(rm: ReplicaManager, partition: Partition, lso: int) -> CleanerStats | None:
    """One round over one partition's log (in a worker thread)."""
    bound = rm.config.log_cleaner_dedupe_buffer_size
    return clean_log(partition.log, last_stable_offset=lso, max_dirty_bytes=bound)


async def clean_filthiest(rm: ReplicaManager) -> int:
    """Clean the filthiest logs (up to ``log.cleaner.threads``, in worker threads); the bytes
    read and written."""
    plans = _plans(rm)
    totals = rm.cleaner_totals
    totals.max_dirty_ratio = plans[0][0].dirty_ratio if plans else 0.0
    chosen = [(partition, lso) for _, partition, lso in plans[: rm.config.log_cleaner_threads]]
    results = await asyncio.gather(
        *(asyncio.to_thread(_clean, rm, p, lso) for p, lso in chosen), return_exceptions=True
    )
    moved = 0
    for (partition, _), result in zip(chosen, results, strict=True):
        if isinstance(result, ReplogError):
            totals.counts["failures"] += 1
            log.warning("cleaning %r failed, retrying later: %s", partition, result)
        elif isinstance(result, BaseException):
            totals.counts["failures"] += 1  # a bug: say so loudly, keep the loop alive
            log.error("cleaning %r failed", partition, exc_info=result)
        elif result is not None and result.committed:
            totals.add(result)
            moved += result.bytes_read + result.bytes_written
            log.debug("cleaned %r: %s", partition, result)
    return moved


async def cleaner_loop(rm: ReplicaManager) -> None:
    """Clean while logs need it, pacing by ``log.cleaner.io.max.bytes.per.second``; sleep
    ``log.cleaner.backoff.ms`` when none does."""
    config = rm.config
    while True:
        moved = 0
        if rm._every_replica_open():
            started = time.monotonic()
            moved = await clean_filthiest(rm)
            pause = moved / config.log_cleaner_io_max_bytes_per_second
            pause -= time.monotonic() - started
            if pause > 0:
                await asyncio.sleep(pause)
        if not moved:
            await asyncio.sleep(config.log_cleaner_backoff_ms / 1000)
