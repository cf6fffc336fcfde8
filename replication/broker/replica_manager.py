"""The replica manager: this broker's partitions and their roles, as Kafka's ReplicaManager.

It applies each metadata image (becoming leader or follower of each partition, reconfiguring
topics), opens replica logs off the loop and deletes the ones the image no longer gives this
broker, changes the ISR through the controller, and runs the broker's maintenance loops.
Appends run on the event loop (CRC check and an offset rewrite, no decoding); storage I/O
(flushes, reads, checkpoints, retention) runs in worker threads. Its paths live beside it, as
functions bound as its methods: produce (appendRecords) in
:mod:`~replication.broker.replica_produce`, fetch (fetchMessages) in
:mod:`~replication.broker.replica_fetch`, group commit, WAL compaction and checkpoints in
:mod:`~replication.broker.log_flush`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

from logstore.compaction import Compactor, HolderTable, round_phase
from logstore.config import LogConfig, keys_of, parse, to_mapping
from logstore.errors import ConfigError, LogLayoutError, ReplogError
from logstore.log import Log
from logstore.storage import Storage
from logstore.tail_cache import TailCache
from logstore.wal import INLINE_MAX_BYTES, WalWriter
from logstore.wal_index import WAL_PREFIX, WalIndex
from replication import events
from replication import protocol as p
from replication.broker import log_cleaner, log_flush, replica_fetch, replica_produce
from replication.broker.log_flush import (
    compaction_window_bytes,
    flush_interval_ms,
)
from replication.broker.partition import Partition, TopicPolicy
from replication.broker.purgatory import Purgatory
from replication.broker.topic_stats import BrokerTopicStats
from replication.common import TopicPartition
from replication.config import BrokerConfig
from replication.dynamic_config import effective_broker_config
from replication.errors import (
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from replication.metadata.image import MetadataImage, PartitionState, TopicInfo

log = logging.getLogger(__name__)

#: a partition directory's topic part (Kafka's legal topic names)
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")

#: how many partition logs a broker opens at once when an image gives it several
OPEN_PARALLELISM = 16
#: the pause before retrying a replica whose open failed (a storage error): doubled at each
#: consecutive failure up to OPEN_RETRY_BACKOFF_MAX_MS (as Kafka's retry.backoff.ms and
#: retry.backoff.max.ms), so a store that is down is not hammered and one that heals is
#: noticed within seconds
OPEN_RETRY_BACKOFF_MS = 100
OPEN_RETRY_BACKOFF_MAX_MS = 10_000
#: the state a replica is built with off the loop: no role yet (the roles of the newest image
#: are applied on the loop when it is registered)
_NO_ROLE = PartitionState((), (), -1, -1, -1)


def open_retry_backoff_ms(failures: int) -> int:
    """The pause after ``failures`` consecutive failed opens of one replica."""
    return min(OPEN_RETRY_BACKOFF_MAX_MS, OPEN_RETRY_BACKOFF_MS << min(failures - 1, 20))


class FetcherHooks(Protocol):
    """What the replica manager needs from the replica fetchers."""

    def add(self, partition: Partition) -> None: ...

    def remove(self, partition: Partition) -> None: ...


class ReplicaManager:
    def __init__(self, config: BrokerConfig, storage: Storage) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.storage = storage
        #: the recent objects' bytes of every log this broker hosts, under one bound
        self.tail_cache = TailCache(config.log_tail_cache_total_bytes)
        self.partitions: dict[TopicPartition, Partition] = {}
        self.image = MetadataImage()
        #: ``config`` with the dynamic broker configs of ``image`` laid over it
        self.current_config = config
        self.produce_purgatory = Purgatory("produce")
        self.fetch_purgatory = Purgatory("fetch")
        self._dirty: set[Partition] = set()
        #: set when a partition becomes dirty: the flush loop waits on it (no timer when idle)
        self._flush_wanted = asyncio.Event()
        #: log.flush.interval.ms in force: the least spacing between two flush starts
        self.flush_interval_ms = flush_interval_ms(config, storage)
        #: wal.compaction.window.bytes in force
        self.compaction_window_bytes = compaction_window_bytes(config, storage)
        #: times the flush loop woke up, and flushes that wrote something (counters, for
        #: tests and metrics: an idle broker's stay put)
        self.flush_wakeups = 0
        self.flushes = 0
        #: fetch reads: partitions served from memory on the loop, and reads that took the
        #: rest of a fetch to a worker thread (counters, for tests and metrics)
        self.memory_reads = 0
        self.storage_reads = 0
        #: WAL compaction rounds done (log.wal.enable)
        self.compactions = 0
        #: the log cleaner's rounds and bytes (replication.broker.log_cleaner)
        self.cleaner_totals = log_cleaner.CleanerTotals()
        #: rounds of the periodic checkpoint, and logs it found changed and checkpointed
        self.checkpoint_rounds = 0
        self.checkpoints = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.on_partition_change: list[Callable[[Partition], None]] = []
        #: called when a partition's leader or leader epoch changes here (or it is opened)
        self.on_role_change: list[Callable[[Partition], None]] = []
        #: set by the broker: follower partitions are fetched by the replica fetchers
        self.fetchers: FetcherHooks | None = None
        #: set by the broker: sends an AlterPartition to the active controller
        self.send_alter_partition: Callable[[p.AlterPartitionRequest], Awaitable[Any]] | None = None
        #: set by the broker: read the metadata store now, a request having shown this broker
        #: behind (BrokerLifecycle.catch_up; rate-limited there)
        self.catch_up_metadata: Callable[[], None] | None = None
        self._isr_pending: set[TopicPartition] = set()
        #: the broker epoch of this process's registration (-1: not registered yet)
        self.broker_epoch = -1
        #: metrics, read by the Prometheus collector at scrape time: per-topic traffic, and
        #: the ISR changes of partitions led here (as Kafka's IsrShrinksPerSec/IsrExpandsPerSec)
        self.topic_stats = BrokerTopicStats()
        self.isr_shrinks = 0
        self.isr_expands = 0
        #: registered, unfenced brokers in the image applied last: the only ones an ISR
        #: expansion proposes (KIP-841)
        self._live: frozenset[int] = frozenset()
        #: the broker WAL (log.wal.enable): its index is loaded and its writer started on
        #: the first image carrying this process's registration, before any partition opens
        #: (a partition's recovery takes its chunks from the index)
        self.wal_index: WalIndex | None = None
        self.wal_writer: WalWriter | None = None
        self._wal_journaled = False  # Storage.journal took the L0 objects
        self.compactor: Compactor | None = None
        #: each open partition's log, by (topic id, partition): the compactor switches their
        #: extents, and a written WAL object names its chunks so
        self._holders = HolderTable()
        self._by_topic_id: dict[tuple[str, int], Partition] = {}
        #: the broker checkpoint's HWs: read at start (hints for the logs it opens), and the
        #: ones written last (the next is written only if one moved)
        self._hw_hints: dict[str, int] = {}
        self._hw_written: dict[str, int] | None = None
        #: broker checkpoints written (for tests and metrics)
        self.broker_checkpoints = 0
        #: set when a WAL object is written and the compaction loop should look: it holds
        #: nothing to compact (an idle broker's loop sleeps), or the bytes trigger is met
        self._wal_written = asyncio.Event()
        #: the compaction loop waits with no live L0 object: any write wakes it
        self._compaction_idle = True
        # Opening replicas costs storage requests (a few per log on S3, the WAL index before
        # any): it runs in the background (:meth:`_open_replicas`), never on the event loop,
        # which must keep heartbeating and serving the partitions already open.
        #: the newest image carrying this process's registration: roles come from it only
        self._roles_image: MetadataImage | None = None
        #: replicas that image gives this broker, not open yet and not being opened, each
        #: with the loop time of its next try (0: now; later after a failed open)
        self._to_open: dict[TopicPartition, float] = {}
        #: opens running in the open pool (one per partition at most), with the topic id
        #: each was opened for
        self._opening: dict[TopicPartition, tuple[asyncio.Future[Partition], str]] = {}
        #: consecutive failed opens per replica (for the backoff)
        self._open_failures: dict[TopicPartition, int] = {}
        #: replicas dropped by an image before they were opened: their storage is deleted (as
        #: an open replica's would be) before any other open starts
        self._to_delete: set[TopicPartition] = set()
        #: replicas being opened that an image dropped meanwhile: deleted when their open
        #: ends, never registered (opened again from empty if a later image gives them back)
        self._open_dropped: set[TopicPartition] = set()
        #: stray replicas deleted and, over the WAL, its index loaded (before any open)
        self._storage_ready = False
        self._open_task: asyncio.Task[None] | None = None
        #: completed by apply_image to wake the opener (new replicas, or ones dropped)
        self._open_wake: asyncio.Future[None] | None = None
        #: the threads that open replicas (storage I/O), shut down and waited for at shutdown
        self._open_pool: concurrent.futures.ThreadPoolExecutor | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._isr_loop(), name="isr"),
            asyncio.create_task(self._checkpoint_loop(), name="checkpoint"),
            asyncio.create_task(self._retention_loop(), name="retention"),
            asyncio.create_task(self._producer_expiration_loop(), name="producer-expiration"),
        ]
        if self.config.log_cleaner_enable:
            self._tasks.append(asyncio.create_task(self._cleaner_loop(), name="log-cleaner"))
        if self.config.log_wal_enable:
            self._tasks.append(asyncio.create_task(self._compaction_loop(), name="compaction"))
        else:  # over the WAL its writer's I/O thread is the group commit
            self._tasks.append(asyncio.create_task(self._flush_loop(), name="flush"))

    async def shutdown(self) -> None:
        """Flush and checkpoint every log (graceful shutdown)."""
        self._stopping = True
        tasks = [*self._tasks, *([self._open_task] if self._open_task is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        unregistered = await self._stop_opening()
        self.produce_purgatory.complete_all()
        self.fetch_purgatory.complete_all()
        logs = [p.log for p in self.partitions.values()] + unregistered
        writer = self.wal_writer
        if writer is not None:
            # what was appended becomes durable in one last object; the logs' checkpoints follow
            await asyncio.to_thread(
                writer.close, drain=True, timeout=self.config.shutdown_timeout_ms / 2000
            )
        await asyncio.gather(*(asyncio.to_thread(lg.close) for lg in logs))
        await self._checkpoint_broker()

    # --- metadata --------------------------------------------------------------------------------

    def topic_log_config(self, topic: TopicInfo) -> tuple[LogConfig, TopicPolicy]:
        """A topic's log config and policy: its overrides over this broker's config in force
        (the static one with the dynamic broker configs laid over it)."""
        configs = topic.config_map()
        log_keys = set(keys_of(LogConfig))
        broker = self.current_config
        defaults = to_mapping(broker.log)
        defaults.update({k: v for k, v in configs.items() if k in log_keys})
        policy = TopicPolicy(
            min_insync_replicas=int(configs.get("min.insync.replicas", broker.min_insync_replicas)),
            unclean_leader_election_enable=str(
                configs.get("unclean.leader.election.enable", broker.unclean_leader_election_enable)
            ).lower()
            == "true",
        )
        return parse(LogConfig, defaults), policy

    def _reconfigure(self, previous: MetadataImage, image: MetadataImage) -> None:
        """Apply changed topic configs and dynamic broker configs to the hosted logs, without
        a restart (Kafka's dynamic topic and log configs): retention at its next check, segment
        rolling at the next append, min.insync.replicas at the next produce."""
        broker_changed = previous.broker_configs != image.broker_configs
        if broker_changed:
            self.current_config = effective_broker_config(self.config, image)
        changed: dict[str, TopicInfo] = {}
        for topic in image.topics:
            before = previous.topic(topic.name)
            if broker_changed or (before is not None and before.configs != topic.configs):
                changed[topic.name] = topic
        if not changed:
            return
        settings: dict[str, tuple[LogConfig, TopicPolicy]] = {}
        for key, partition in self.partitions.items():
            info = changed.get(key.topic)
            if info is None:
                continue
            if key.topic not in settings:
                try:
                    settings[key.topic] = self.topic_log_config(info)
                except ReplogError as err:  # validated by the controller; kept as they were
                    log.warning("configs of topic %s not applied: %s", key.topic, err)
                    continue
            log_config, policy = settings[key.topic]
            if log_config != partition.log.config or policy != partition.policy:
                partition.log.reconfigure(log_config)
                partition.policy = policy
                log.info("%r: configs changed: %s, %s", partition, log_config, policy)

    def check_storage_layout(self) -> None:
        """Refuse to start without the WAL on a root written through it (one LIST): its
        partitions' recent batches are in WAL objects a standalone log never reads, so they
        would be served with their tails missing."""
        if self.config.log_wal_enable:
            return
        found = self.storage.list(WAL_PREFIX)
        if found:
            raise ConfigError(
                f"log.dir {self.storage.url} holds {len(found)} broker WAL object(s) under "
                f"{WAL_PREFIX}/ (written with log.wal.enable=true): start this broker with "
                "log.wal.enable=true (turning the WAL off for a written log dir is not supported)"
            )

    def registered(self, broker_epoch: int) -> None:
        """This process registered with the controller and holds ``broker_epoch``."""
        self.broker_epoch = broker_epoch

    def apply_image(self, image: MetadataImage) -> None:
        """Become leader/follower for this broker's replicas; drop deleted partitions.

        Rule: a process takes partition roles only from an image that carries its own
        registration (this broker's epoch in the image is the one the controller gave this
        process). Before that the image only answers Metadata requests. Metadata on storage
        may name this broker as leader at an epoch its previous incarnation held; the
        controller fences that incarnation when this one registers (see
        ``Controller.register_broker``), so acting on the stored image would append at a
        leader epoch whose earlier records followers may already hold, different ones.

        Runs on the event loop, so it does only what is cheap here: configs, the live set,
        the roles of partitions already open, deletions. Replicas not open yet are opened in
        the background (:meth:`_open_replicas`: storage I/O, a few requests per log on S3),
        and take the roles of the newest image when they are registered; until then requests
        for them get a retriable NOT_LEADER_OR_FOLLOWER (:meth:`get_partition`). Without a
        running event loop (tools, unit tests) there is no loop to keep free: they open here.
        """
        if image.version <= self.image.version:
            return
        previous, self.image = self.image, image
        self._reconfigure(previous, image)
        self._live = frozenset(b.broker_id for b in image.brokers if not b.fenced)
        me = image.broker(self.broker_id)
        if self.broker_epoch < 0 or me is None or me.epoch != self.broker_epoch:
            log.info(
                "metadata version %d does not carry this broker's registration yet: serving it "
                "for metadata only",
                image.version,
            )
            return
        self._roles_image = image
        wanted: set[TopicPartition] = set()
        broker_epochs = {b.broker_id: b.epoch for b in image.brokers}
        for topic in image.topics:
            for index, state in enumerate(topic.partitions):
                if self.broker_id not in state.replicas:
                    continue
                key = TopicPartition(topic.name, index)
                wanted.add(key)
                partition = self.partitions.get(key)
                if partition is None:
                    if key not in self._opening:
                        self._to_open.setdefault(key, 0.0)
                    continue
                self._roles_applied(partition, state, broker_epochs, partition.apply_state(state))
        for key in set(self._to_open) - wanted:
            # dropped before it was opened: its storage goes as an open replica's would (even
            # if a later image gives it back: that is a new replica, or another topic's)
            del self._to_open[key]
            self._to_delete.add(key)
        self._open_dropped.update(set(self._opening) - wanted)
        for key in set(self._open_failures) - wanted:
            del self._open_failures[key]
        for key in set(self.partitions) - wanted:
            partition = self.partitions.pop(key)
            self._dirty.discard(partition)
            self._forget_wal_log(partition)
            if self.fetchers is not None:
                self.fetchers.remove(partition)
            partition.state = PartitionState(partition.state.replicas, (), -1, -1, -1)
            self._role_changed(partition)
            self._partition_changed(partition)
            self._delete_replica_log(partition, "")
            self.topic_stats.retain(tp.topic for tp in self.partitions)
        self._start_opening()

    def _roles_applied(
        self,
        partition: Partition,
        state: PartitionState,
        broker_epochs: dict[int, int],
        changed: bool,
    ) -> None:
        """What follows a partition's new state: followers' registrations, and on a change of
        leader or epoch the event, the fetchers and the parked requests."""
        if partition.is_leader:
            partition.note_follower_registrations(broker_epochs)
        if changed:
            events.event(
                log,
                events.BECOME_LEADER if partition.is_leader else events.BECOME_FOLLOWER,
                topic=partition.topic,
                partition=partition.index,
                leader=state.leader,
                leader_epoch=state.leader_epoch,
                partition_epoch=state.partition_epoch,
                isr=state.isr,
                log_end_offset=partition.log.log_end_offset,
                high_watermark=partition.high_watermark,
            )
            self._role_changed(partition)
            self._partition_changed(partition)

    # --- opening replicas, off the event loop -----------------------------------------------------

    def _start_opening(self) -> None:
        """Wake the opener, or start it, if there is something to open or delete (or, once,
        the storage to prepare)."""
        if self._stopping:
            return
        if self._storage_ready and not self._to_open and not self._to_delete:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._open_inline()
            return
        if self._open_wake is not None and not self._open_wake.done():
            self._open_wake.set_result(None)
        if self._open_task is None or self._open_task.done():
            self._open_task = loop.create_task(self._open_replicas(), name="open-replicas")
            self._open_task.add_done_callback(self._opener_ended)

    def _opener_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            # a bug; the next image starts it again
            log.error("opening replicas failed", exc_info=task.exception())

    def _open_inline(self) -> None:
        """No event loop runs (tools, unit tests): prepare the storage and open every replica
        on this thread, as the opener would in the background."""
        if not self._storage_ready:
            index, hints = self._prepare_storage(self._roles_image or self.image)
            if index is not None:
                self._start_wal(index, hints)
            self._storage_ready = True
        for key in sorted(self._to_delete):
            self._delete_unopened(key)
        self._to_delete.clear()
        image = self._roles_image
        for key in list(self._to_open):
            info = image.topic(key.topic) if image is not None else None
            if info is None:
                continue
            built = self._new_partition(info, key.partition, _NO_ROLE)
            del self._to_open[key]
            if not self._register_opened(built, info.topic_id):
                built.log.delete()

    async def wait_for_opens(
        self, timeout_s: float | None = None, *, tried_once: bool = False
    ) -> bool:
        """Wait until no replica waits to be opened, or ``timeout_s``; whether none does (for
        callers that applied an image and use its partitions next: a broker answering a
        controller change, tests; a replica whose open keeps failing keeps this waiting).
        With ``tried_once`` it also returns (False) once every replica still waiting has
        failed to open at least once (and none is opening): a broker starting up says it is
        ready then, as Kafka's does with a failed log dir, rather than never; the failing
        replicas are retried in the background (:meth:`failing_opens`)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while self._open_task is not None and not self._open_task.done():
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            if tried_once and self._only_failed_opens_left():
                return False
            wait = left
            if tried_once:  # polled (an open may fail meanwhile); the opener's end wakes it
                wait = 0.1 if left is None else min(0.1, left)
            await asyncio.wait([self._open_task], timeout=wait)
        return True

    def _only_failed_opens_left(self) -> bool:
        return (
            self._storage_ready
            and not self._opening
            and bool(self._to_open)
            and len(self.failing_opens()) == len(self._to_open)
        )

    def failing_opens(self) -> dict[TopicPartition, int]:
        """Replicas waiting to be opened again after failed opens, with their failure counts."""
        return {
            key: self._open_failures[key] for key in self._to_open if key in self._open_failures
        }

    def _pending_open(self, key: TopicPartition) -> bool:
        return key in self._to_open or key in self._opening

    async def _open_replicas(self) -> None:
        """The opener: prepares the storage once (stray replicas, the WAL index: before any
        replica opens), then opens the replicas the newest image gives this broker,
        OPEN_PARALLELISM at a time in its own threads, and registers each batch that finished
        with the roles of the newest image (leadership may have moved while it opened; a
        replica the image dropped meanwhile is deleted instead). A failed open is retried
        after open_retry_backoff_ms. Ends when nothing is left to open; apply_image starts it
        again."""
        loop = asyncio.get_running_loop()
        pool = self._pool()
        failures = 0
        while not self._storage_ready:
            try:
                image = self._roles_image or self.image
                index, hints = await loop.run_in_executor(pool, self._prepare_storage, image)
            except ReplogError as err:
                failures += 1
                delay_ms = open_retry_backoff_ms(failures)
                log.warning(
                    "preparing %s failed (no replica opens before it), retrying in %d ms: %s",
                    self.storage.url,
                    delay_ms,
                    err,
                )
                await asyncio.sleep(delay_ms / 1000)
                continue
            if index is not None:
                self._start_wal(index, hints)
            self._storage_ready = True
        while True:
            if self._to_delete:
                keys, self._to_delete = sorted(self._to_delete), set()
                await loop.run_in_executor(pool, self._delete_unopened_all, keys)
                continue  # images may have come meanwhile
            now = loop.time()
            for key, due in list(self._to_open.items()):
                if len(self._opening) >= OPEN_PARALLELISM:
                    break
                if due > now:
                    continue
                del self._to_open[key]
                found = self._replica_state(key)
                if found is None:  # (apply_image drops these; kept safe)
                    self._to_delete.add(key)
                    continue
                info = found[0]
                future = loop.run_in_executor(
                    pool, self._new_partition, info, key.partition, _NO_ROLE
                )
                self._opening[key] = (future, info.topic_id)
            if self._to_delete:
                continue
            if not self._opening and not self._to_open:
                return
            wake = self._open_wake = loop.create_future()
            waiting = [future for future, _ in self._opening.values()]
            retry = min((due for due in self._to_open.values() if due > now), default=None)
            await asyncio.wait(
                [*waiting, wake],
                timeout=None if retry is None else retry - now,
                return_when=asyncio.FIRST_COMPLETED,
            )
            self._open_wake = None
            finished = [(k, f, t) for k, (f, t) in self._opening.items() if f.done()]
            unwanted: list[Partition] = []
            registered = 0
            for key, future, topic_id in finished:
                del self._opening[key]
                failure = future.exception()
                if failure is not None:
                    self._open_failed(key, failure)
                    continue
                self._open_failures.pop(key, None)
                built = future.result()
                if self._register_opened(built, topic_id):
                    registered += 1
                else:
                    unwanted.append(built)
            if registered:
                log.debug(
                    "registered %d opened replica(s); %d still opening, %d waiting",
                    registered,
                    len(self._opening),
                    len(self._to_open),
                )
            if unwanted:
                await loop.run_in_executor(pool, self._delete_unwanted, unwanted)

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._open_pool is None:
            self._open_pool = concurrent.futures.ThreadPoolExecutor(
                OPEN_PARALLELISM, "open-partition"
            )
        return self._open_pool

    def _open_failed(self, key: TopicPartition, err: BaseException) -> None:
        """Retry ``key``'s open after the backoff, if the newest image still gives it here
        (dropped meanwhile: its storage is deleted, as an open replica's would be)."""
        failures = self._open_failures.get(key, 0) + 1
        delay_ms = open_retry_backoff_ms(failures)
        wanted = self._replica_state(key) is not None
        if key in self._open_dropped:
            self._open_dropped.discard(key)
            self._to_delete.add(key)
            if wanted:  # given back: a new replica, opened once the old storage is gone
                self._open_failures.pop(key, None)
                self._to_open.setdefault(key, 0.0)
            return
        if isinstance(err, ReplogError):
            log.warning(
                "%s-%d: opening the replica failed (%d time(s))%s: %s",
                *key,
                failures,
                f", retrying in {delay_ms} ms" if wanted else "",
                err,
            )
        else:  # a bug: say so loudly; retrying costs little and a transient cause may pass
            log.error("%s-%d: opening the replica failed", *key, exc_info=err)
        if not wanted:
            self._open_failures.pop(key, None)
            self._to_delete.add(key)
            return
        self._open_failures[key] = failures
        self._to_open[key] = asyncio.get_running_loop().time() + delay_ms / 1000

    def _replica_state(self, key: TopicPartition) -> tuple[TopicInfo, PartitionState] | None:
        """The topic and state of ``key`` in the newest image carrying this registration, if
        that image gives this broker a replica of it."""
        image = self._roles_image
        info = image.topic(key.topic) if image is not None else None
        if info is None or key.partition >= len(info.partitions):
            return None
        state = info.partitions[key.partition]
        return (info, state) if self.broker_id in state.replicas else None

    def _register_opened(self, built: Partition, topic_id: str) -> bool:
        """Register a replica opened off the loop, with the roles and configs of the newest
        image; False (not registered) if that image no longer gives it here, or gives a topic
        of that name created again (another topic id: it opens again, from empty)."""
        key = built.key
        found = self._replica_state(key)
        dropped = key in self._open_dropped
        self._open_dropped.discard(key)
        if self._stopping or found is None or found[0].topic_id != topic_id or dropped:
            if found is not None and not self._stopping:
                # given back, or a new topic of that name: a new replica, opened from empty
                # once the caller has deleted this one
                self._to_open.setdefault(key, 0.0)
            return False
        info, state = found
        try:
            log_config, policy = self.topic_log_config(info)
        except ReplogError as err:  # validated by the controller; kept as it was opened
            log.warning("configs of topic %s not applied: %s", key.topic, err)
        else:
            if log_config != built.log.config:
                built.log.reconfigure(log_config)
            built.policy = policy
        image = self._roles_image
        assert image is not None
        partition = self._open_partition(built)
        partition.apply_state(state)
        if partition.is_leader:
            partition.maybe_increment_high_watermark()
        broker_epochs = {b.broker_id: b.epoch for b in image.brokers}
        self._roles_applied(partition, state, broker_epochs, True)
        return True

    def _delete_unwanted(self, built: list[Partition]) -> None:
        """Delete replicas opened for an image that dropped them meanwhile (any thread)."""
        for partition in built:
            self._delete_replica_log(partition, " while it opened")

    @staticmethod
    def _delete_replica_log(partition: Partition, when: str) -> None:
        """Delete a replica's log that no image gives this broker any more (any thread)."""
        log.info(
            "deleting %s-%d (topic deleted or replica moved away%s)",
            partition.topic,
            partition.index,
            when,
        )
        try:
            partition.log.delete()
        except ReplogError as err:  # the replica is gone either way; its storage stays
            log.warning(
                "%s-%d: could not delete the replica's storage %s: %s",
                partition.topic,
                partition.index,
                partition.log.storage.url,
                err,
            )

    def _delete_unopened_all(self, keys: list[TopicPartition]) -> None:
        for key in keys:
            self._delete_unopened(key)

    def _delete_unopened(self, key: TopicPartition) -> None:
        """Delete the storage of a replica dropped before it was opened (any thread): what
        deleting it open would have removed."""
        log.info("deleting %s-%d (topic deleted or replica moved away before it opened)", *key)
        try:
            self.storage.child(f"{key.topic}/{key.partition}").delete_all()
        except ReplogError as err:  # as for an open replica: its storage stays
            log.warning("%s-%d: could not delete the replica's storage: %s", *key, err)

    async def _stop_opening(self) -> list[Log]:
        """At shutdown, after the opener is cancelled: wait for the opens running in its
        threads (no thread touches storage after shutdown), and return the logs opened but
        never registered, to be closed with the others."""
        pool, self._open_pool = self._open_pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
        futures = [future for future, _ in self._opening.values()]
        self._opening.clear()
        self._to_open.clear()
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        return [built.log for built in outcomes if isinstance(built, Partition)]

    def _delete_stray_replicas(self, image: MetadataImage) -> None:
        """Delete the replicas on this broker's storage that the metadata does not give it:
        moved away or deleted while this broker was down (as Kafka's stray replicas,
        KAFKA-14616). Run once, on the first image that carries this process's registration,
        before any partition is opened, so no image can give one back meanwhile.

        Only ``<topic>/<partition>/`` directories of a legal topic name are considered, never
        the metadata root (which may live under ``log.dir``)."""
        root = self.storage.url.rstrip("/") + "/"
        meta = self.config.metadata_root.rstrip("/") + "/"
        skip = {"__cluster_metadata"}  # the default metadata root, whatever the URL's spelling
        if meta.startswith(root):
            skip.add(meta[len(root) :].split("/", 1)[0])
        try:
            objects = self.storage.list()
        except ReplogError as err:
            log.warning("could not look for stray replicas on %s: %s", self.storage.url, err)
            return
        found: set[tuple[str, int]] = set()
        for obj in objects:
            parts = obj.path.split("/")
            if (
                len(parts) >= 3
                and parts[0] not in skip
                and _LEGAL_TOPIC.match(parts[0])
                and parts[1].isdigit()
            ):
                found.add((parts[0], int(parts[1])))
        for topic, index in sorted(found):
            info = image.topic(topic)
            if (
                info is not None
                and index < len(info.partitions)
                and self.broker_id in info.partitions[index].replicas
            ):
                continue
            log.info(
                "deleting stray replica %s-%d: the metadata (version %d) gives this broker no "
                "replica of it (moved away or deleted while this broker was down)",
                topic,
                index,
                image.version,
            )
            try:
                self.storage.child(f"{topic}/{index}").delete_all()
            except ReplogError as err:
                log.warning("could not delete stray replica %s-%d: %s", topic, index, err)

    def _prepare_storage(self, image: MetadataImage) -> tuple[WalIndex | None, dict[str, int]]:
        """Before any replica opens (storage I/O; any thread): delete the stray replicas,
        and over the WAL load its index (one LIST, one footer read per object) and the broker
        checkpoint's HWs. A storage error leaves it to be done again (the stray check is
        idempotent; it only warns if it cannot list)."""
        self._delete_stray_replicas(image)
        if not self.config.log_wal_enable:
            return None, {}
        if self.config.log_wal_journal_enable:
            # local files: L0 objects in journals, durable in a fraction of a millisecond
            self._wal_journaled = self.storage.journal(f"{WAL_PREFIX}/L0")
        return WalIndex.load(self.storage), self._read_broker_checkpoint()

    def _start_wal(self, index: WalIndex, hints: dict[str, int]) -> None:
        """Start the writer of the broker WAL whose index was loaded (on the loop: its hooks
        call back into it); the compactor runs once every partition of the image is open
        (see :meth:`_compaction_loop`)."""
        self._hw_hints = hints
        if index.zombies:
            log.warning(
                "WAL objects written by an older incarnation after a newer one started are "
                "ignored: %s",
                ", ".join(index.zombies),
            )
        self.wal_index = index
        self.wal_writer = WalWriter(
            self.storage,
            broker_id=self.broker_id,
            broker_epoch=self.broker_epoch,
            next_seq=index.next_seq,
            loop=asyncio.get_running_loop(),
            # Logs are thread-safe WAL sources: their durable ends move on the writer's
            # thread, so a truncation (in a worker thread) waiting for its chunk in flight
            # never waits for the event loop.
            hooks_on_loop=False,
            # One object per flush for every partition: local files and memory flush as soon
            # as the previous write is done; object stores gather log.flush.interval.ms of
            # appends into one PUT (the flush interval in force, by storage kind).
            linger_ms=self.flush_interval_ms,
            on_flushed=self._wal_flushed,
            on_error=self._wal_write_failed,
            index=index,
            # On a journaled root the loop writes what it appended (produced or fetched
            # batches) itself when the writer is idle (see logstore.wal): such a write is
            # cheaper than the two thread hand-offs around it, for small objects only.
            inline_max_bytes=INLINE_MAX_BYTES if self._wal_journaled else 0,
        )
        self.compactor = Compactor(
            self.storage,
            index,
            self._holders,
            broker_id=self.broker_id,
            broker_epoch=self.broker_epoch,
            delete_delay_ms=self.config.log.file_delete_delay_ms,
            phase=round_phase(self.broker_id),
        )
        log.info(
            "broker WAL of %s: %d object(s) loaded (%d partition(s)), next seq %d",
            self.storage.url,
            len(index.objects()),
            len(index.partitions()),
            index.next_seq,
        )

    def _open_log(self, topic: TopicInfo, index: int, log_config: LogConfig) -> Log:
        storage = self.storage.child(f"{topic.name}/{index}")
        if self.wal_writer is None or self.wal_index is None:
            return Log.open(storage, log_config, tail_cache=self.tail_cache)
        open_over_wal = functools.partial(
            Log.open,
            storage,
            log_config,
            tail_cache=self.tail_cache,
            topic_id=topic.topic_id,
            topic=topic.name,
            partition=index,
            wal_writer=self.wal_writer,
            wal_index=self.wal_index,
        )
        try:
            return open_over_wal(
                high_watermark_hint=self._hw_hints.get(f"{topic.topic_id}:{index}", 0)
            )
        except LogLayoutError as err:
            # The topic was deleted and re-created under its name while this broker was down
            # and it is a replica of the new one: the old directory is another log (as Kafka
            # compares partition.metadata's topic id). Start empty; the leader fills it.
            log.warning(
                "%s-%d: %s; deleting the old log and starting empty", topic.name, index, err
            )
            storage.delete_all()
            return open_over_wal()

    def _new_partition(self, topic: TopicInfo, index: int, state: PartitionState) -> Partition:
        """A replica's partition, its log opened and recovered (storage I/O; any thread)."""
        log_config, policy = self.topic_log_config(topic)
        return Partition(
            topic.name,
            index,
            self._open_log(topic, index, log_config),
            self.broker_id,
            policy,
            state,
            producer_id_expiration_ms=self.config.producer_id_expiration_ms,
        )

    def _open_partition(self, partition: Partition) -> Partition:
        """Register a replica opened (log recovered, producer state loaded): requests and
        the WAL's hooks find it from now on."""
        plog = partition.log
        self.partitions[partition.key] = partition
        link = plog.wal
        if link is not None:
            self._by_topic_id[(link.topic_id, link.partition)] = partition
            self._holders.register(link.topic_id, link.partition, plog)
        log.info(
            "opened %r: log start %d, LEO %d, HW %d",
            partition,
            plog.log_start_offset,
            plog.log_end_offset,
            plog.high_watermark,
        )
        return partition

    def _role_changed(self, partition: Partition) -> None:
        for callback in self.on_role_change:
            callback(partition)
        if self.fetchers is None:
            return
        if partition.is_leader or partition.state.leader < 0:
            self.fetchers.remove(partition)
        else:
            self.fetchers.add(partition)

    def _partition_changed(self, partition: Partition) -> None:
        for callback in self.on_partition_change:
            callback(partition)
        self.produce_purgatory.check_and_complete(partition.key)
        self.fetch_purgatory.check_and_complete(partition.key)

    def get_partition(self, topic: str, index: int) -> Partition:
        partition = self.partitions.get(TopicPartition(topic, index))
        if partition is None:
            known = self.image.topic(topic)
            if known is not None and 0 <= index < len(known.partitions):
                if self.broker_epoch < 0:
                    raise NotLeaderOrFollowerError(
                        f"broker {self.broker_id} is starting: it serves no partition until it "
                        "has registered with the controller; retry"
                    )
                if self._pending_open(TopicPartition(topic, index)):
                    # Kafka answers so for a replica it has not made leader or follower yet
                    raise NotLeaderOrFollowerError(
                        f"broker {self.broker_id} is still opening its replica of "
                        f"{topic}-{index} (reading it from storage); retry"
                    )
                raise NotLeaderOrFollowerError(
                    f"broker {self.broker_id} hosts no replica of {topic}-{index}; refresh "
                    "metadata and retry"
                )
            shown = topic if len(topic) <= 80 else topic[:77] + "..."
            raise UnknownTopicOrPartitionError(
                f"unknown topic or partition {shown}-{index}; create it with "
                f"`replog topics create {shown}` or check the name"
            )
        return partition

    # --- the produce path (appendRecords) and the fetch path (fetchMessages) --------------------
    # Functions of the ReplicaManager bound as its methods: a call costs what a method's does.

    append_records = replica_produce.append_records
    write_txn_markers = replica_produce.write_txn_markers
    fetch = replica_fetch.fetch_messages

    def _check_behind(self, error: ReplogError) -> None:
        """A request named a partition this broker does not know or a leader epoch newer than
        its own: its sender (a follower, a client) has read metadata this broker has not, so
        read it now rather than at the next heartbeat (see replication.broker.lifecycle)."""
        if self.catch_up_metadata is not None and isinstance(
            error, UnknownTopicOrPartitionError | UnknownLeaderEpochError
        ):
            self.catch_up_metadata()

    def follower_appended(self, partition: Partition) -> None:
        """The replica fetcher appended to a follower replica (and flushed it)."""
        for callback in self.on_partition_change:
            callback(partition)

    # --- ISR changes, committed through the controller before use --------------------------------

    async def _isr_loop(self) -> None:
        lag = self.config.replica_lag_time_max_ms
        while True:
            await asyncio.sleep(lag / 2000)
            for partition in list(self.partitions.values()):
                shrunk = partition.isr_to_shrink(lag)
                if shrunk is not None:
                    self._alter_isr(partition, shrunk)

    def _alter_isr(self, partition: Partition, new_isr: tuple[int, ...]) -> None:
        if partition.key in self._isr_pending or self.send_alter_partition is None:
            return
        self._isr_pending.add(partition.key)
        asyncio.get_running_loop().create_task(self._send_alter_isr(partition, new_isr))

    async def _send_alter_isr(self, partition: Partition, new_isr: tuple[int, ...]) -> None:
        state = partition.state
        request = p.AlterPartitionRequest(
            broker_id=self.broker_id,
            topics=[
                p.AlterPartitionRequestTopic(
                    topic_name=partition.topic,
                    partitions=[
                        p.AlterPartitionRequestPartition(
                            partition_index=partition.index,
                            leader_epoch=state.leader_epoch,
                            new_isr=list(new_isr),
                            partition_epoch=state.partition_epoch,
                        )
                    ],
                )
            ],
        )
        try:
            assert self.send_alter_partition is not None
            response = await self.send_alter_partition(request)
            result = response.topics[0].partitions[0] if response.topics else None
            code = response.error_code or (result.error_code if result else 0)
            if code or result is None:
                log.info("%r: ISR change to %s refused (error %d)", partition, list(new_isr), code)
                return
            committed = replace(
                state,
                isr=tuple(result.isr),
                leader=result.leader_id,
                leader_epoch=result.leader_epoch,
                partition_epoch=result.partition_epoch,
            )
            if set(state.isr) - set(committed.isr):
                self.isr_shrinks += 1
            if set(committed.isr) - set(state.isr):
                self.isr_expands += 1
            if self.partitions.get(partition.key) is partition and partition.apply_state(committed):
                self._role_changed(partition)
            log.info(
                "%r: ISR now %s (partition epoch %d)",
                partition,
                list(committed.isr),
                committed.partition_epoch,
            )
            if partition.maybe_increment_high_watermark():
                self._hw_moved(partition)
            self._partition_changed(partition)
        except ReplogError as err:
            log.warning("%r: ISR change to %s failed: %s", partition, list(new_isr), err)
        finally:
            self._isr_pending.discard(partition.key)

    # --- high watermark and group commit ---------------------------------------------------------

    def _hw_moved(self, partition: Partition) -> None:
        self.produce_purgatory.check_and_complete(partition.key)
        self.fetch_purgatory.check_and_complete(partition.key)

    def _mark_dirty(self, partition: Partition) -> None:
        """``partition`` has appended batches to flush: wake the flush loop (over the WAL the
        log told the writer itself)."""
        if partition.log.wal is not None:
            return
        self._dirty.add(partition)
        self._flush_wanted.set()

    # --- the broker WAL (log.wal.enable) ---------------------------------------------------------

    def _forget_wal_log(self, partition: Partition) -> None:
        link = partition.log.wal
        if link is None:
            return
        if self._by_topic_id.get((link.topic_id, link.partition)) is partition:
            del self._by_topic_id[(link.topic_id, link.partition)]
            self._holders.unregister(link.topic_id, link.partition)

    # --- group commit, the broker WAL, checkpoints (replication.broker.log_flush) -------------

    # group commit: flushes of dirty partitions, or the WAL writer's objects
    flush_dirty = log_flush.flush_dirty
    _flush_loop = log_flush.flush_loop
    _wal_flushed = log_flush.wal_flushed
    _wal_write_failed = log_flush.wal_write_failed

    # WAL compaction, once every replica is open
    _every_replica_open = log_flush.every_replica_open
    _compaction_loop = log_flush.compaction_loop
    _cleaner_loop = log_cleaner.cleaner_loop

    # the logs' checkpoints and, over the WAL, the broker checkpoint of HWs
    _read_broker_checkpoint = log_flush.read_broker_checkpoint
    _wal_high_watermarks = log_flush.wal_high_watermarks
    _checkpoint_broker = log_flush.checkpoint_broker
    _checkpoint_loop = log_flush.checkpoint_loop

    async def _producer_expiration_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.producer_id_expiration_check_interval_ms / 1000)
            self.remove_expired_producers()

    def remove_expired_producers(self) -> int:
        """Kafka's producer id expiration on every partition here (leaders and followers
        apply the same rule to the same batch timestamps); the number removed."""
        now = time.time_ns() // 1_000_000
        return sum(len(p.remove_expired_producers(now)) for p in list(self.partitions.values()))

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.log_retention_check_interval_ms / 1000)
            await self.run_maintenance()

    async def run_maintenance(self) -> None:
        """Retention, merging of small objects, and delayed deletes, for every log; over the
        WAL, then the objects nobody refers to any more go (after file.delete.delay.ms)."""
        for partition in list(self.partitions.values()):
            plog = partition.log
            try:
                await asyncio.to_thread(plog.delete_retained_segments)
                await asyncio.to_thread(plog.merge_segments)
                await asyncio.to_thread(plog.delete_due_objects)
            except ReplogError as err:
                log.warning("maintenance of %r failed: %s", partition, err)
            # the aborted transactions index follows the log start (retention, DeleteRecords,
            # a follower following its leader's), as Kafka's drops with its segments
            partition.producer_state.truncate_head(plog.log_start_offset)
        compactor = self.compactor
        if compactor is not None and self._every_replica_open():
            try:
                await asyncio.to_thread(compactor.collect_garbage)
            except ReplogError as err:
                log.warning("WAL garbage collection on %s failed: %s", self.storage.url, err)
