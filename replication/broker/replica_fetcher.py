"""Follower fetchers: keep this broker's follower replicas in step with their leaders.

As Kafka's ReplicaFetcherManager / ReplicaFetcherThread, one asyncio task per (leader broker,
fetcher index): ``num.replica.fetchers`` fetchers per leader, a partition going to the one its
name hashes to. Each fetcher serves all its partitions through one incremental fetch session
(KIP-227). Fetched batches are appended to this broker's own store and flushed as a segment
object before the next fetch, so the fetch offset a follower reports is its durable LEO: the
leader's HW (min LEO over the ISR) then counts only data that is on every ISR member's storage.
All partitions of one response are appended in one thread hop and flushed concurrently; over
the broker WAL (``log.wal.enable``) one WAL object holds them all, so a response costs one write
whatever the number of partitions in it, and a small response (a tailing follower's) is
appended on the event loop, which then writes the WAL object itself on a journaled local root
(``WalWriter.write_now``) or awaits it without any thread hop.

The next fetch follows at once: the leader's long poll paces an idle follower, so only errors
pause it (``replica.fetch.backoff.ms``, as Kafka's fetchBackOffMs): a failed request or a
repeated session error pauses the fetcher, a partition error delays that partition alone.

Divergence is settled by leader epoch (KIP-101/279, Fetch v12's DivergingEpoch): the fetch
carries the epoch of the follower's last batch; if the leader's log ends that epoch earlier,
the follower truncates there and fetches again, never truncating to its HW alone.

A replica catching up in a reassignment (in its partition's adding replicas, not yet in the
ISR) is throttled: the broker's one :class:`~replication.broker.throttle.TokenBucket` limits the
bytes fetched for such replicas to the reassignment's throttle (or
follower.replication.throttled.rate), as Kafka's follower throttle does; in-sync replicas are
never throttled.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import replace
from typing import Final

from logstore.epoch_cache import UNDEFINED_EPOCH
from logstore.errors import ReplogError
from replication import protocol as p
from replication.broker.fetch_metadata import PartitionFetchState
from replication.broker.fetch_session_handler import FetchSessionHandler
from replication.broker.partition import Partition
from replication.broker.replica_manager import ReplicaManager
from replication.broker.throttle import TokenBucket
from replication.common import TopicPartition
from replication.config import BrokerConfig
from replication.errors import (
    BrokerUnreachableError,
    FencedLeaderEpochError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
    for_code,
)
from replication.metadata.image import MetadataImage
from replication.protocol.rpc import AsyncConnection
from replication.security.connector import Connector, broker_connector

log = logging.getLogger(__name__)

#: how soon a partition is fetched again after the leader's metadata and this follower's
#: disagreed about it, doubled for each such refusal in a row up to replica.fetch.backoff.ms.
#: Brokers learn a new metadata version up to a heartbeat interval apart, and such a refusal
#: makes the side that may be behind read the metadata store at once (BrokerLifecycle.
#: catch_up: the leader for a partition or epoch it does not know; this follower for a
#: leadership it does not know); the leader may also still be opening its replica. Either way
#: the disagreement lasts a store read or an open, not a heartbeat, so the follower asks again
#: soon instead of backing off a whole replica.fetch.backoff.ms (Kafka's brokers tail the
#: metadata log and rarely disagree; the first records to a new topic waited 0.5-1.3 s here).
METADATA_RETRY_MS = 50
#: the partition errors that say the leader has not read the metadata this follower has
_LEADER_BEHIND: tuple[type[Exception], ...] = (
    UnknownTopicOrPartitionError,
    UnknownLeaderEpochError,
)
#: the partition errors that say this follower may not have read the leader's metadata (or
#: the leader is still opening its replica: Kafka's answer, and this one's, for that too)
_FOLLOWER_BEHIND: tuple[type[Exception], ...] = (
    NotLeaderOrFollowerError,
    FencedLeaderEpochError,
)
#: every metadata disagreement (retried per METADATA_RETRY_MS)
_DISAGREEMENT = _LEADER_BEHIND + _FOLLOWER_BEHIND


def _now_s() -> float:
    """The clock of partition delays (monotonic seconds; the replication model sets its own)."""
    return time.monotonic()


class ReplicaFetcher:
    def __init__(
        self,
        config: BrokerConfig,
        replica_manager: ReplicaManager,
        image: Callable[[], MetadataImage],
        leader_id: int,
        fetcher_id: int,
        throttle: TokenBucket | None = None,
        *,
        connect: Connector | None = None,
    ) -> None:
        self.config = config
        #: how this follower reaches its leader (with the broker's credentials)
        self._connect = connect or broker_connector(config)
        #: the broker's replication throttle (shared by its fetchers)
        self.throttle = throttle or TokenBucket(0)
        self.replica_manager = replica_manager
        self.image = image
        self.leader_id = leader_id
        self.fetcher_id = fetcher_id
        self.partitions: dict[TopicPartition, Partition] = {}
        #: partitions that must flush their unflushed tail before fetching (former leaders)
        self._fresh: set[TopicPartition] = set()
        self.session = FetchSessionHandler(leader_id)
        self._conn: AsyncConnection | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: fetch requests sent and their total bytes (counters: a list of every request's size
        #: grew with the fetcher's age), for tests and metrics
        self.requests_sent = 0
        self.request_bytes = 0
        #: times this fetcher paused replica.fetch.backoff.ms (after errors only), for tests
        #: and metrics
        self.backoffs = 0
        #: partitions whose last fetch failed with a partition error, and when (monotonic s)
        #: they may be fetched again (Kafka's delayed partitions): an error of one partition
        #: neither stalls the others nor makes the fetcher spin on it
        self._delayed: dict[TopicPartition, float] = {}
        #: per partition, the metadata disagreements in a row (see METADATA_RETRY_MS)
        self._disagreements: dict[TopicPartition, int] = {}
        #: session errors in a row: the first fetches again (full) at once, as Kafka; a
        #: repeated one backs off
        self._session_errors = 0
        #: per partition, how far this replica was behind the leader's high watermark after
        #: the last fetch (Kafka's FetcherLagMetrics; their max is ReplicaFetcherManager.MaxLag)
        self.lags: dict[TopicPartition, int] = {}

    def __repr__(self) -> str:
        return (
            f"ReplicaFetcher(leader={self.leader_id}, id={self.fetcher_id}, "
            f"{len(self.partitions)} partitions)"
        )

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=repr(self))

    async def stop(self) -> None:
        self._stopping = True
        if self._conn is not None:
            await self._conn.close()  # a fetch in flight fails now instead of long-polling on
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def retire(self) -> asyncio.Task[None] | None:
        """No partition left to fetch (Kafka shuts such fetcher threads down): the loop ends
        after the fetch in flight, if any, and closes its connection. Its task, or None."""
        self._stopping = True
        self._wake.set()
        return self._task

    def add(self, partition: Partition) -> None:
        self.partitions[partition.key] = partition
        self._fresh.add(partition.key)
        self._delayed.pop(partition.key, None)  # a new leader or epoch: fetch it at once
        self._disagreements.pop(partition.key, None)
        self._wake.set()

    def remove(self, key: TopicPartition) -> None:
        self.partitions.pop(key, None)
        self._fresh.discard(key)
        self._delayed.pop(key, None)
        self._disagreements.pop(key, None)
        self.lags.pop(key, None)

    def _connection(self) -> AsyncConnection | None:
        broker = self.image().broker(self.leader_id)
        if broker is None:
            return None
        conn = self._conn
        if conn is None or (conn.host, conn.port) != (broker.host, broker.port):
            self._conn = self._connect(
                broker.host,
                broker.port,
                client_id=f"replica-fetcher-{self.config.broker_id}-{self.fetcher_id}",
                timeout_ms=self.config.replica_fetch_wait_max_ms + self.config.request_timeout_ms,
            )
        return self._conn

    async def _run(self) -> None:
        while not self._stopping:
            if not self.partitions:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                ok = await self._fetch_once()
            except ReplogError as err:
                log.warning(
                    "%r: %s; backing off %d ms", self, err, self.config.replica_fetch_backoff_ms
                )
                ok = False
            if not ok:
                await self._back_off()
        if self._conn is not None:
            await self._conn.close()

    async def _back_off(self) -> None:
        """Pause ``replica.fetch.backoff.ms`` after an error (Kafka's fetchBackOffMs): only
        then. A response without records is no error: the leader's long poll already paced it,
        and sleeping after it would make the next produce wait for this timer. With every
        partition delayed by its own error (a metadata disagreement's delay is shorter: see
        METADATA_RETRY_MS), wait only until the first is due: that is no back-off."""
        if self._delayed and self.partitions and not self._ready():
            await asyncio.sleep(max(0.0, min(self._delayed.values()) - _now_s()))
            return
        self.backoffs += 1
        await asyncio.sleep(self.config.replica_fetch_backoff_ms / 1000)

    async def _prepare(self) -> None:
        """Former leaders flush what they appended before following (their fetch offset is
        their durable LEO)."""
        fresh = [self.partitions[k] for k in list(self._fresh) if k in self.partitions]
        self._fresh.clear()
        if fresh:  # concurrently: after a leader moves, many partitions may come at once
            await asyncio.gather(*(asyncio.to_thread(p.log.flush) for p in fresh))

    def _fetch_state(self, partition: Partition) -> PartitionFetchState:
        plog = partition.log
        return PartitionFetchState(
            fetch_offset=plog.durable_end_offset,
            max_bytes=self.config.replica_fetch_max_bytes,
            current_leader_epoch=partition.leader_epoch,
            last_fetched_epoch=plog.latest_epoch
            if plog.log_end_offset > plog.log_start_offset
            else -1,
            log_start_offset=plog.log_start_offset,
        )

    def throttled_rate(self, partition: Partition) -> int:
        """Bytes/s this replica may fetch at (0: unthrottled): a reassignment's adding replica
        that is not in the ISR yet."""
        state = partition.state
        if self.config.broker_id not in state.adding_replicas or self.config.broker_id in state.isr:
            return 0
        return state.throttled_rate or self.config.follower_replication_throttled_rate

    def _ready(self) -> dict[TopicPartition, Partition]:
        """The partitions to fetch now: all but those delayed after a partition error."""
        if self._delayed:
            now = _now_s()
            self._delayed = {k: t for k, t in self._delayed.items() if t > now}
        return {k: v for k, v in self.partitions.items() if k not in self._delayed}

    async def _fetch_once(self) -> bool:
        """One fetch and its handling; False when it failed and the fetcher should back off
        (no leader to fetch from, a repeated session error, an unusable response, or every
        partition delayed by its error: see :meth:`_back_off`). A response that carries no
        records is a success. One step, never a sleep: the replication model drives it."""
        await self._prepare()
        conn = self._connection()
        if conn is None:
            return False
        ready = self._ready()
        if not ready:
            return False
        states = {k: self._fetch_state(v) for k, v in ready.items()}
        rates = {k: r for k, v in ready.items() if (r := self.throttled_rate(v)) > 0}
        if rates:
            self.throttle.set_rate(min(rates.values()))
            allowance = self.throttle.available()
            for key in rates:
                if allowance <= 0:  # left out until the bucket refills
                    del states[key]
                else:
                    states[key] = replace(
                        states[key], max_bytes=min(states[key].max_bytes, max(int(allowance), 1))
                    )
            if not states:
                await asyncio.sleep(min(self.throttle.seconds_until_available(), 1.0))
                return True
        data = self.session.build(states)
        topics: dict[str, list[p.FetchRequestPartition]] = {}
        for (topic, index), state in data.to_send:
            topics.setdefault(topic, []).append(
                p.FetchRequestPartition(
                    partition=index,
                    current_leader_epoch=state.current_leader_epoch,
                    fetch_offset=state.fetch_offset,
                    last_fetched_epoch=state.last_fetched_epoch,
                    log_start_offset=state.log_start_offset,
                    partition_max_bytes=state.max_bytes,
                )
            )
        forgotten: dict[str, list[int]] = {}
        for topic, index in data.to_forget:
            forgotten.setdefault(topic, []).append(index)
        request = p.FetchRequest(
            replica_id=self.config.broker_id,
            max_wait_ms=self.config.replica_fetch_wait_max_ms,
            min_bytes=self.config.replica_fetch_min_bytes,
            max_bytes=self.config.replica_fetch_response_max_bytes,
            isolation_level=0,
            session_id=data.session_id,
            session_epoch=data.session_epoch,
            topics=[p.FetchRequestTopic(topic=t, partitions=ps) for t, ps in topics.items()],
            forgotten_topics_data=[
                p.ForgottenTopic(topic=t, partitions=ps) for t, ps in forgotten.items()
            ],
        )
        sent_before = conn.bytes_sent
        try:
            response = await conn.request(p.ApiKey.FETCH, request)
        except BrokerUnreachableError as err:
            self.session.handle_error(err)
            raise
        finally:
            self.requests_sent += 1
            self.request_bytes += conn.bytes_sent - sent_before
        responded = [
            (TopicPartition(t.topic, part.partition_index), part)
            for t in response.responses
            for part in t.partitions
        ]
        if not self.session.handle_response(
            response.session_id, response.error_code, [tp for tp, _ in responded]
        ):
            # A session error: fetch again (full) at once, as Kafka; back off if it repeats.
            # An unusable response (no error code) backs off.
            self._session_errors = self._session_errors + 1 if response.error_code else 2
            return self._session_errors < 2
        self._session_errors = 0
        if self._disagreements:  # a run of disagreements ends with a fetch that names none
            refused = {key for key, part in responded if part.error_code}
            for key in states.keys() - refused:
                self._disagreements.pop(key, None)
        ready_parts: list[tuple[Partition, p.FetchResponsePartition]] = []
        for key, part in responded:
            if key in rates and part.records is not None:
                self.throttle.consume(len(part.records))
            partition = self.partitions.get(key)
            if partition is None or partition.state.leader != self.leader_id:
                continue
            if await self._settle(partition, part):
                ready_parts.append((partition, part))
        stored = await self._append_all(
            [(pt, bytes(part.records)) for pt, part in ready_parts if part.records]
        )
        for partition, part in ready_parts:
            await self._advance(partition, part, partition.key in stored)
        return True

    def _delay(self, key: TopicPartition, error: type[Exception] | None = None) -> None:
        """Leave ``key`` out of fetches for replica.fetch.backoff.ms after its ``error``, or
        less if the error is a metadata disagreement (see METADATA_RETRY_MS)."""
        backoff_ms = self.config.replica_fetch_backoff_ms
        if error is not None and issubclass(error, _DISAGREEMENT):
            n = self._disagreements.get(key, 0)
            self._disagreements[key] = n + 1
            backoff_ms = min(backoff_ms, METADATA_RETRY_MS << min(n, 16))
        self._delayed[key] = _now_s() + backoff_ms / 1000

    async def _settle(self, partition: Partition, part: p.FetchResponsePartition) -> bool:
        """Handle a partition's error or divergence; True if its data can be taken in."""
        if part.error_code:
            error = for_code(part.error_code)
            if error is OffsetOutOfRangeError:
                await asyncio.to_thread(self._handle_out_of_range, partition, part)
                return False
            if error is not None and issubclass(error, _DISAGREEMENT):
                # the leader catches up on its own refusal; this side may be the one behind
                catch_up = self.replica_manager.catch_up_metadata
                if issubclass(error, _FOLLOWER_BEHIND) and catch_up is not None:
                    catch_up()
                log.debug("%r: the leader's metadata disagrees (%s)", partition, error.__name__)
            else:
                log.info(
                    "%r: fetch error %s", partition, error.__name__ if error else part.error_code
                )
            self._delay(partition.key, error)
            return False
        if part.diverging_epoch.epoch != UNDEFINED_EPOCH or part.diverging_epoch.end_offset >= 0:
            await asyncio.to_thread(
                self._truncate_on_divergence,
                partition,
                part.diverging_epoch.epoch,
                part.diverging_epoch.end_offset,
            )
            return False
        return True

    async def _append_all(self, work: list[tuple[Partition, bytes]]) -> set[TopicPartition]:
        """Append every partition's fetched batches in one thread hop (CRC checks and copies,
        no I/O but a former leader's tail), then flush the appended logs, each as one object:
        in that same hop when there is one, else concurrently. A response naming N partitions
        costs at most N + 1 hops and N writes in parallel, not N sequential hops and writes.
        Returns the partitions now durable to their new LEO (their next fetch offset, which is
        what the leader's HW and acks=all rest on); one that failed is delayed and fetched
        again from its durable end."""
        if not work:
            return set()
        wal_timeout = self.config.replica_lag_time_max_ms / 1000
        partitions = [pt for pt, _ in work]
        if (
            _over_wal(partitions)
            and sum(len(records) for _, records in work) <= INLINE_APPEND_BYTES
            and all(pt.log.log_end_offset == pt.log.durable_end_offset for pt in partitions)
        ):
            # Small responses (a tailing follower's): append on the loop (a CRC check of a few
            # KiB; the leader appends produced batches on its loop the same way) and await the
            # WAL object on the loop. Through a worker thread the same wait cost three thread
            # hops per fetch (loop -> worker -> writer's completion on the loop -> worker ->
            # loop), the largest share of an acks=all round trip on a busy 2-core machine.
            appended, failed, _ = self._append_in_memory(work, None)
            link = appended[0].log.wal if appended else None
            flushed: BaseException | int | None = None
            # On a journaled store, written here when the writer is idle (no hop at all).
            if link is not None and not link.writer.write_now():
                try:
                    await asyncio.wait_for(link.writer.wait_durable(), wal_timeout)
                except (TimeoutError, ReplogError) as wal_err:
                    flushed = wal_err
        else:
            appended, failed, flushed = await asyncio.to_thread(
                self._append_in_memory, work, wal_timeout
            )
        for partition, err in failed:
            log.warning("%r: could not append fetched batches: %s", partition, err)
            self._delay(partition.key)
        outcomes: list[BaseException | int | None] = (
            [flushed] * len(appended)
            if len(appended) == 1 or _over_wal(appended)
            else await asyncio.gather(
                *(asyncio.to_thread(pt.log.flush) for pt in appended), return_exceptions=True
            )
        )
        stored: set[TopicPartition] = set()
        for partition, outcome in zip(appended, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("%r: flush of fetched batches failed: %s", partition, outcome)
                self._delay(partition.key)
            else:
                stored.add(partition.key)
        return stored

    @staticmethod
    def _append_in_memory(
        work: list[tuple[Partition, bytes]], wal_timeout: float | None
    ) -> tuple[list[Partition], list[tuple[Partition, ReplogError]], BaseException | int | None]:
        """Append each partition's batches; the partitions appended, those that failed, and
        if only one was appended, the outcome of flushing it here too (one hop in all: the
        common case of one busy partition pays no second hop). Over the broker WAL every
        appended partition is made durable by one wait here: the appends marked their logs
        dirty, and one object holds them all (waiting at most ``wal_timeout``: a store that
        does not take writes must not keep this fetcher from seeing role changes; the
        batches stay pending and the next fetch starts from the durable end). ``wal_timeout``
        None: no wait here (the caller awaits the WAL on the loop)."""
        appended: list[Partition] = []
        failed: list[tuple[Partition, ReplogError]] = []
        for partition, records in work:
            plog = partition.log
            try:
                if plog.log_end_offset != plog.durable_end_offset:
                    plog.flush()  # a tail from a failed flush: the fetch came from its start
                partition.append_as_follower(records)
            except ReplogError as err:
                failed.append((partition, err))
            else:
                appended.append(partition)
        flushed: BaseException | int | None = None
        if appended and _over_wal(appended):
            if wal_timeout is None:
                return appended, failed, None
            link = appended[0].log.wal
            assert link is not None
            try:
                # not forced: on an object store the batches wait for the writer's linger and
                # share its one PUT with every other partition's (the request rate must not
                # follow the fetch rate); on local files the linger is 0 anyway
                link.writer.flush(wal_timeout, force=False)
            except Exception as err:  # noqa: BLE001 - reported by the caller, as gather's
                flushed = err
        elif len(appended) == 1:
            try:
                flushed = appended[0].log.flush()
            except Exception as err:  # noqa: BLE001 - reported by the caller, as gather's
                flushed = err
        return appended, failed, flushed

    async def _advance(
        self, partition: Partition, part: p.FetchResponsePartition, stored: bool
    ) -> None:
        """After a fetch: the HW (never past what this replica holds durably), the lag, the
        log start offset (DeleteRecords / retention on the leader)."""
        plog = partition.log
        plog.update_high_watermark(min(part.high_watermark, plog.durable_end_offset))
        partition.producer_state.on_high_watermark(plog.high_watermark)
        self.lags[partition.key] = max(0, part.high_watermark - plog.log_end_offset)
        if part.log_start_offset > plog.log_start_offset:
            await asyncio.to_thread(plog.delete_records_before, part.log_start_offset)
        if stored:
            self.replica_manager.follower_appended(partition)

    @staticmethod
    def _truncate_on_divergence(partition: Partition, epoch: int, end_offset: int) -> None:
        """Kafka's truncation by diverging epoch: to the end of the largest epoch both logs
        share, never below what the leader says that epoch holds."""
        plog = partition.log
        follower_epoch, follower_end = plog.end_offset_for_epoch(epoch)
        if follower_epoch == UNDEFINED_EPOCH:
            target = min(end_offset, plog.log_end_offset)
        elif follower_epoch != epoch:
            target = follower_end
        else:
            target = min(end_offset, follower_end)
        log.info(
            "%r: diverged from the leader at epoch %d (leader ends it at %d, this replica at "
            "%d): truncating to %d",
            partition,
            epoch,
            end_offset,
            follower_end,
            target,
        )
        partition.truncate_to(max(target, plog.log_start_offset))

    @staticmethod
    def _handle_out_of_range(partition: Partition, part: p.FetchResponsePartition) -> None:
        plog = partition.log
        if part.log_start_offset > plog.log_end_offset:
            log.warning(
                "%r: the leader's log starts at %d, past this replica's end %d: starting over",
                partition,
                part.log_start_offset,
                plog.log_end_offset,
            )
            partition.truncate_fully_and_start_at(part.log_start_offset)
        elif part.high_watermark >= 0 and plog.log_end_offset > part.high_watermark:
            partition.truncate_to(part.high_watermark)


class ReplicaFetcherManager:
    def __init__(
        self,
        config: BrokerConfig,
        replica_manager: ReplicaManager,
        image: Callable[[], MetadataImage],
        *,
        connect: Connector | None = None,
    ) -> None:
        self.config = config
        self._connect = connect or broker_connector(config)
        self.replica_manager = replica_manager
        self.image = image
        self.fetchers: dict[tuple[int, int], ReplicaFetcher] = {}
        self._assigned: dict[TopicPartition, tuple[int, int]] = {}
        #: tasks of fetchers left without partitions, finishing their last fetch
        self._retiring: set[asyncio.Task[None]] = set()
        #: follower.replication.throttled.rate, for every fetcher of this broker
        self.throttle = TokenBucket(0)

    def _fetcher_id(self, key: TopicPartition) -> int:
        return zlib.crc32(f"{key[0]}-{key[1]}".encode()) % self.config.num_replica_fetchers

    def add(self, partition: Partition) -> None:
        slot = (partition.state.leader, self._fetcher_id(partition.key))
        old = self._assigned.get(partition.key)
        if old is not None and old != slot:
            self.fetchers[old].remove(partition.key)
            self._retire_if_idle(old)
        fetcher = self.fetchers.get(slot)
        if fetcher is None:
            fetcher = ReplicaFetcher(
                self.config,
                self.replica_manager,
                self.image,
                *slot,
                throttle=self.throttle,
                connect=self._connect,
            )
            self.fetchers[slot] = fetcher
            fetcher.start()
        fetcher.add(partition)
        self._assigned[partition.key] = slot

    def remove(self, partition: Partition) -> None:
        slot = self._assigned.pop(partition.key, None)
        if slot is not None:
            self.fetchers[slot].remove(partition.key)
            self._retire_if_idle(slot)

    def _retire_if_idle(self, slot: tuple[int, int]) -> None:
        """A fetcher left without partitions goes (its leader may never lead here again: the
        fetchers would otherwise accumulate with every broker that ever led a partition)."""
        fetcher = self.fetchers.get(slot)
        if fetcher is None or fetcher.partitions:
            return
        del self.fetchers[slot]
        task = fetcher.retire()
        if task is not None and not task.done():
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    def max_lag(self) -> int:
        """The largest lag in records of a partition fetched here (0 if none)."""
        return max((lag for f in self.fetchers.values() for lag in f.lags.values()), default=0)

    async def shutdown(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        await asyncio.gather(*(f.stop() for f in self.fetchers.values()))


#: A fetch response over the WAL up to this size is appended on the event loop (no worker
#: thread): a tailing follower's responses are a few KiB; bulk catch-up goes to a thread so
#: CRC checks of megabytes do not hold the loop.
INLINE_APPEND_BYTES: Final = 256 * 1024


def _over_wal(partitions: list[Partition]) -> bool:
    """Whether every one of ``partitions`` keeps its log over the broker WAL (one writer)."""
    return all(p.log.wal is not None for p in partitions)
