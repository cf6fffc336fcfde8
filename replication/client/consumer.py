"""The consumer: fetch records of assigned partitions, as Python records or Arrow batches.

A consumer is used from one thread (as Kafka's). ``poll()`` returns records already fetched,
or sends one Fetch per leader broker covering every assigned partition it leads (in parallel
when there are several brokers), waiting up to fetch.max.wait.ms for fetch.min.bytes. Fetches
carry no session (session_id 0, epoch -1: Kafka's FINAL_EPOCH full fetch).

Positions follow Kafka: the position is the offset of the next record poll() will return. A
partition without a position (just assigned, or after seek_to_beginning / seek_to_end, or
out of range) gets one from ListOffsets per auto.offset.reset (earliest, latest, or none:
NoOffsetForPartitionError). OFFSET_OUT_OF_RANGE resets the same way, or raises
OffsetOutOfRangeError naming the partition and the log's range.

An assigned partition that does not exist (its topic is not in fresh metadata, or the topic
has fewer partitions) is logged when first missed, and makes poll() and the offset calls raise
UnknownTopicOrPartitionError naming the topic once it has been missing for 5 s
(:data:`~replication.client.offsets.MISSING_PARTITION_GRACE_MS`; default.api.timeout.ms if
that is shorter). Not default.api.timeout.ms, as Kafka's consumer waits for a topic its brokers
may create on first use: replog creates no topic on first use, so the wait only covers a topic
created a moment ago reaching the metadata of the broker asked (one heartbeat, 500 ms).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa

from replication.client.cluster import Cluster
from replication.client.config import ConsumerConfig, load
from replication.client.consumer_coordinator import (
    ConsumerCoordinator,
    ConsumerRebalanceListener,
    OffsetAndMetadata,
)
from replication.client.errors import (
    ClientClosedError,
    ConsumerStateError,
    NoOffsetForPartitionError,
    PartitionNotAssignedError,
)
from replication.client.fetcher import decode_fetched
from replication.client.metrics import ConsumerMetrics
from replication.client.offsets import OffsetLookup
from replication.client.types import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    FetchedBatch,
    OffsetAndTimestamp,
    TopicPartition,
)
from replication.errors import (
    BrokerUnreachableError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    ReplogError,
    UnknownTopicOrPartitionError,
    for_code,
)
from replication.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ApiKey,
    FetchRequest,
    FetchRequestPartition,
    FetchRequestTopic,
    FetchResponse,
)

__all__ = ["Consumer"]

log = logging.getLogger(__name__)

_OFFSET_OUT_OF_RANGE: Final = OffsetOutOfRangeError.code
_FINAL_EPOCH: Final = -1  # a fetch without a session (KIP-227)
_STRATEGY_TIMESTAMP: Final = {"earliest": EARLIEST_TIMESTAMP, "latest": LATEST_TIMESTAMP}


def _as_tp(tp: TopicPartition | tuple[str, int]) -> TopicPartition:
    if isinstance(tp, TopicPartition):
        return tp
    topic, partition = tp
    return TopicPartition(str(topic), int(partition))


@dataclass
class _Buffered:
    """Fetched, not yet returned data of one partition."""

    batches: deque[pa.RecordBatch] = field(default_factory=deque)
    next_offset: int | None = None


class Consumer:
    """Read records from assigned partitions, or from a consumer group's share of subscribed
    topics (Kafka's consumer semantics).

    With ``group_id``, :meth:`subscribe` joins the group: the group's coordinator spreads the
    topics' partitions over its members, poll() follows rebalances, positions start from the
    group's committed offsets, and positions are committed every auto.commit.interval.ms
    (``enable_auto_commit``) or by :meth:`commit`. Without it, :meth:`assign` picks the
    partitions and nothing is committed unless asked.

    Parameters
    ----------
    config
        Kafka-named settings (see :class:`~replication.client.config.ConsumerConfig`); keyword
        arguments with underscores for dots are merged over it.

    Examples
    --------
    >>> consumer = Consumer(bootstrap_servers="127.0.0.1:9092",  # doctest: +SKIP
    ...                     auto_offset_reset="earliest")
    >>> consumer.assign([TopicPartition("events", 0)])  # doctest: +SKIP
    >>> for record in consumer.poll(timeout_ms=1000):  # doctest: +SKIP
    ...     print(record.offset, record.value)

    In a group:

    >>> consumer = Consumer(  # doctest: +SKIP
    ...     bootstrap_servers="127.0.0.1:9092", group_id="billing"
    ... )
    >>> consumer.subscribe(["events"])  # doctest: +SKIP
    >>> records = consumer.poll(timeout_ms=1000)  # doctest: +SKIP
    >>> consumer.commit()  # doctest: +SKIP
    """

    def __init__(self, config: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self.config = load(ConsumerConfig, config, kwargs)
        self._cluster = Cluster(self.config)
        self._isolation = READ_COMMITTED if self.config.read_committed else READ_UNCOMMITTED
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._resets: dict[TopicPartition, str] = {}
        self._buffers: dict[TopicPartition, _Buffered] = {}
        self._paused: set[TopicPartition] = set()
        self._highwater: dict[TopicPartition, int] = {}
        self._offsets = OffsetLookup(
            self._cluster, default_api_timeout_ms=self.config.default_api_timeout_ms
        )
        self._executor: ThreadPoolExecutor | None = None
        self._commit_executor: ThreadPoolExecutor | None = None
        self._round_robin = 0
        self._closed = False
        self._coordinator: ConsumerCoordinator | None = None
        self._subscription: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        #: partitions given by the group whose committed offsets are still to be looked up
        self._awaiting_committed: set[TopicPartition] = set()
        self._metrics = ConsumerMetrics(self.config)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Consumer({self.config.bootstrap_servers!r}, assignment={self._assignment})"

    # --- assignment and positions -----------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Consume exactly these partitions (replacing the previous assignment)."""
        self._check_open()
        if self._subscription or self._pattern is not None:
            raise ConsumerStateError(
                "assign() on a consumer that subscribe()d: call unsubscribe() first "
                "(a consumer either joins a group's assignment or picks its own partitions)"
            )
        self._set_assignment(partitions)

    def _set_assignment(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        new = list(dict.fromkeys(_as_tp(tp) for tp in partitions))
        for tp in new:
            if not tp.topic or tp.partition < 0:
                raise ValueError(f"invalid partition {tp!r}: need a topic name and partition >= 0")
        keep = set(new)
        for tp in list(self._positions):
            if tp not in keep:
                del self._positions[tp]
        self._offsets.forget(keep)
        for mapping in (self._resets, self._buffers, self._highwater):
            for tp in [tp for tp in mapping if tp not in keep]:
                del mapping[tp]
        self._paused &= keep
        self._assignment = new
        self._cluster.add_interest({tp.topic for tp in new})

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    # --- consumer groups ------------------------------------------------------------------

    def subscribe(
        self,
        topics: Iterable[str] = (),
        *,
        pattern: str | None = None,
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Join the group ``group_id`` for these topics (or every topic matching ``pattern``);
        poll() then consumes this member's share. ``listener`` hears of revoked and assigned
        partitions (in poll(), before and after a rebalance)."""
        self._check_open()
        names = {topics} if isinstance(topics, str) else set(topics)
        if not names and pattern is None:
            raise ValueError("subscribe(): give topics or a pattern")
        if self.config.group_id is None:
            raise ConsumerStateError(
                "subscribe() needs a consumer group: create the Consumer with group_id=... "
                "(or pick partitions with assign())"
            )
        if self._assignment and self._coordinator is None:
            raise ConsumerStateError(
                "subscribe() on a consumer that assign()ed partitions: call unsubscribe() first"
            )
        self._subscription = names
        self._pattern = re.compile(pattern) if pattern is not None else None
        if self._coordinator is None:
            self._coordinator = ConsumerCoordinator(
                self._cluster,
                self.config,
                subscribed_topics=self._subscribed_topics,
                on_assignment=self._group_assignment,
                positions=lambda: dict(self._positions),
            )
        self._coordinator.listener = listener
        self._coordinator.request_rejoin("the subscription changed")

    def subscription(self) -> set[str]:
        return set(self._subscription)

    def unsubscribe(self) -> None:
        """Leave the group and drop the assignment."""
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator = None
        self._subscription, self._pattern = set(), None
        self._set_assignment([])

    def _subscribed_topics(self) -> set[str]:
        if self._pattern is None:
            return set(self._subscription)
        self._cluster.refresh(all_topics=True)
        pattern = self._pattern
        found = {
            t
            for t, info in self._cluster.snapshot.topics.items()
            if not info.is_internal and not t.startswith("__") and pattern.fullmatch(t)
        }
        return found | self._subscription

    def _group_assignment(self, partitions: set[TopicPartition]) -> None:
        """The group gave this member ``partitions``: start from the committed offsets."""
        before = set(self._assignment)
        self._set_assignment(sorted(partitions))
        self._awaiting_committed = (self._awaiting_committed | (partitions - before)) & partitions

    def _start_from_committed(self) -> None:
        coordinator = self._coordinator
        if coordinator is None or not self._awaiting_committed:
            return
        wanted = sorted(self._awaiting_committed)
        committed = coordinator.committed(wanted)
        for tp in wanted:
            found = committed.get(tp)
            if found is not None and tp in self._assignment:
                self._positions[tp] = found.offset
                self._resets.pop(tp, None)
        self._awaiting_committed.clear()

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This consumer's group, generation and member id, for
        :meth:`Producer.send_offsets_to_transaction`."""
        coordinator = self._group("group_metadata()")
        return ConsumerGroupMetadata(
            coordinator.group_id,
            coordinator.generation_id,
            coordinator.member_id if coordinator.generation_id >= 0 else "",
            self.config.group_instance_id if coordinator.generation_id >= 0 else None,
        )

    def commit(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        """Commit ``offsets`` (the next offset to read, per partition) for the group, or the
        current positions of every assigned partition. CommitFailedError if a rebalance took
        the partitions away (poll() rejoins)."""
        coordinator = self._group("commit()")
        coordinator.commit(self._commit_values(offsets), timeout_ms)

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        callback: Callable[[dict[TopicPartition, OffsetAndMetadata], BaseException | None], None]
        | None = None,
    ) -> Future[None]:
        """Like :meth:`commit`, without waiting: the commit runs on a thread of its own (in
        order with other async commits); ``callback(offsets, error)`` runs when it is done
        (error None if it succeeded). Returns its future."""
        coordinator = self._group("commit_async()")
        values = self._commit_values(offsets)
        if self._commit_executor is None:
            self._commit_executor = ThreadPoolExecutor(1, thread_name_prefix="replog-commit")
        future = self._commit_executor.submit(coordinator.commit, values, None)
        if callback is not None:
            future.add_done_callback(lambda f: callback(values, f.exception()))
        return future

    def _commit_values(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        if offsets is None:
            return {tp: OffsetAndMetadata(o) for tp, o in self._positions.items()}
        return {
            _as_tp(tp): v if isinstance(v, OffsetAndMetadata) else OffsetAndMetadata(int(v))
            for tp, v in offsets.items()
        }

    def committed(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timeout_ms: int | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offset of each partition (None where it has none)."""
        return self._group("committed()").committed(map(_as_tp, partitions), timeout_ms)

    def _group(self, what: str) -> ConsumerCoordinator:
        self._check_open()
        if self.config.group_id is None:
            raise ConsumerStateError(f"{what} needs a consumer group: create it with group_id=...")
        if self._coordinator is None:
            # commits of a consumer that assign()s its partitions (generation -1, as Kafka)
            self._coordinator = ConsumerCoordinator(
                self._cluster,
                self.config,
                subscribed_topics=lambda: set(),
                on_assignment=lambda _: None,
                positions=lambda: dict(self._positions),
            )
            self._coordinator.stand_alone()
        return self._coordinator

    def _check_assigned(self, tp: TopicPartition) -> None:
        if tp not in self._assignment:
            raise PartitionNotAssignedError(
                f"partition {tp} is not assigned to this consumer; assign() it first "
                f"(assigned: {', '.join(map(str, self._assignment)) or 'none'})"
            )

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """The next poll() returns records from ``offset`` of ``partition``."""
        tp = _as_tp(partition)
        self._check_assigned(tp)
        if offset < 0:
            raise ValueError(f"seek offset must be >= 0, got {offset}")
        self._positions[tp] = offset
        self._resets.pop(tp, None)
        self._buffers.pop(tp, None)

    def seek_to_beginning(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        """Start from the log start offset (of all assigned partitions if none are given)."""
        self._seek_to("earliest", partitions)

    def seek_to_end(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        """Start from the end: the high watermark (the LSO with read_committed)."""
        self._seek_to("latest", partitions)

    def _seek_to(
        self, strategy: str, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> None:
        tps = [_as_tp(tp) for tp in partitions] or list(self._assignment)
        for tp in tps:
            self._check_assigned(tp)
        for tp in tps:
            self._positions.pop(tp, None)
            self._buffers.pop(tp, None)
            self._resets[tp] = strategy

    def position(
        self, partition: TopicPartition | tuple[str, int], timeout_ms: int | None = None
    ) -> int:
        """The offset of the next record poll() returns for ``partition`` (looked up if needed)."""
        tp = _as_tp(partition)
        self._check_assigned(tp)
        if tp not in self._positions:
            self._resolve_positions([tp], self._timeout_ms(timeout_ms), partial=False)
        return self._positions[tp]

    def pause(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        """Stop fetching these partitions (and returning their buffered records)."""
        for tp in map(_as_tp, partitions):
            self._check_assigned(tp)
            self._paused.add(tp)

    def resume(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        for tp in map(_as_tp, partitions):
            self._paused.discard(tp)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def highwater(self, partition: TopicPartition | tuple[str, int]) -> int | None:
        """The high watermark the last fetch of ``partition`` reported (None before one)."""
        return self._highwater.get(_as_tp(partition))

    # --- offsets lookups --------------------------------------------------------------------

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        specs = {_as_tp(tp): EARLIEST_TIMESTAMP for tp in partitions}
        found = self._list_offsets(specs, self._timeout_ms(timeout_ms))
        return {tp: offset for tp, (offset, _) in found.items()}

    def end_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """The end of each partition: the high watermark, or the LSO with read_committed."""
        specs = {_as_tp(tp): LATEST_TIMESTAMP for tp in partitions}
        found = self._list_offsets(specs, self._timeout_ms(timeout_ms))
        return {tp: offset for tp, (offset, _) in found.items()}

    def offsets_for_times(
        self,
        timestamps: Mapping[TopicPartition | tuple[str, int], int],
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the first offset whose timestamp is >= the given one (ms).

        None where no record has such a timestamp.
        """
        specs: dict[TopicPartition, int] = {}
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"timestamp for {tp} must be >= 0 (ms since the epoch), got {ts}")
            specs[_as_tp(tp)] = ts
        found = self._list_offsets(specs, self._timeout_ms(timeout_ms))
        return {
            tp: OffsetAndTimestamp(offset, ts) if offset >= 0 else None
            for tp, (offset, ts) in found.items()
        }

    def _timeout_ms(self, timeout_ms: int | None) -> int:
        return self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms

    def _list_offsets(
        self, specs: dict[TopicPartition, int], timeout_ms: int
    ) -> dict[TopicPartition, tuple[int, int]]:
        self._check_open()
        return self._offsets.list(specs, self._isolation, timeout_ms)

    # --- positions ------------------------------------------------------------------------

    def _resolve_positions(
        self, tps: Iterable[TopicPartition], timeout_ms: int, *, partial: bool
    ) -> None:
        """Give positions to partitions without one, per their reset strategy."""
        specs: dict[TopicPartition, int] = {}
        for tp in tps:
            if tp in self._positions:
                continue
            strategy = self._resets.get(tp, self.config.auto_offset_reset)
            if strategy == "none":
                raise NoOffsetForPartitionError(
                    f"{tp} has no position and auto.offset.reset is none: call seek(), "
                    "seek_to_beginning() or seek_to_end() first"
                )
            specs[tp] = _STRATEGY_TIMESTAMP[strategy]
        if not specs:
            return
        if partial:
            self._offsets.ensure_metadata(specs)
            found, errors = self._offsets.list_once(specs, self._isolation)
            self._offsets.check_unknown(errors)
        else:
            found = self._list_offsets(specs, timeout_ms)
        for tp, (offset, _) in found.items():
            if offset < 0:
                continue  # no answer yet (e.g. the high watermark is unknown): retry later
            self._positions[tp] = offset
            self._resets.pop(tp, None)
            log.debug("reset position of %s to %d", tp, offset)

    # --- polling ----------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records fetched from the assigned partitions (at most max.poll.records).

        Returns at once when records are buffered; otherwise fetches, waiting up to
        ``timeout_ms`` for records, and returns an empty list if none came.

        Raises UnknownTopicOrPartitionError, naming the topic, for an assigned partition that
        does not exist (its topic does not, or has fewer partitions), once it has been missing
        from the metadata for 5 s (see the module docstring); OffsetOutOfRangeError or
        NoOffsetForPartitionError per auto.offset.reset.

        Examples
        --------
        >>> consumer.assign([TopicPartition("no-such-topic", 0)])  # doctest: +SKIP
        >>> while True:  # doctest: +SKIP
        ...     consumer.poll(500)
        Traceback (most recent call last):
        UnknownTopicOrPartitionError: no-such-topic-0 does not exist: topic 'no-such-topic' ...
        """
        limit = self.config.max_poll_records if max_records is None else max_records
        out: list[ConsumerRecord] = []
        for tp, batch in self._poll(timeout_ms, limit):
            out.extend(_records(tp, batch))
        return out

    def metrics(self) -> dict[str, float]:
        """This consumer's metrics, by Kafka's names (its ``consumer-fetch-manager-metrics``).

        ``records-consumed-rate``/``-total`` (records returned by poll), ``bytes-consumed-*``
        (bytes of fetched records), ``fetch-size-avg``/``-max`` (bytes per fetch response),
        ``records-per-request-avg``, ``fetch-rate``/``-total``, ``fetch-latency-avg``/``-max``
        (ms, long-poll wait included), and ``records-lag-max``: the largest ``high watermark
        - position`` over the assigned partitions, as of their last fetch (NaN before any).
        Windows as :meth:`Producer.metrics`.
        """
        lags = [
            hw - self._positions[tp]
            for tp, hw in self._highwater.items()
            if tp in self._positions and tp in self._assignment
        ]
        return self._metrics.snapshot(float(max(lags)) if lags else math.nan)

    def poll_arrow(self, timeout_ms: int = 0) -> list[FetchedBatch]:
        """Like :meth:`poll`, but everything buffered, as Arrow batches (no per-record Python).

        Each :class:`FetchedBatch` holds consecutive records of one partition with schema
        :data:`~replication.client.types.FETCH_SCHEMA` (offset, key, value, timestamp,
        timestamp_type, headers).
        """
        return [FetchedBatch(tp.topic, tp.partition, b) for tp, b in self._poll(timeout_ms, None)]

    def _poll(
        self, timeout_ms: int, limit: int | None
    ) -> list[tuple[TopicPartition, pa.RecordBatch]]:
        polled = self._poll_once(timeout_ms, limit)
        if polled:
            self._metrics.records_consumed.record(sum(b.num_rows for _, b in polled))
        return polled

    def _poll_once(
        self, timeout_ms: int, limit: int | None
    ) -> list[tuple[TopicPartition, pa.RecordBatch]]:
        self._check_open()
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        grouped = bool(self._subscription or self._pattern is not None)
        if grouped and self._coordinator is not None:
            self._coordinator.poll(timeout_ms)
            self._start_from_committed()
        if not self._assignment:
            if grouped:
                time.sleep(max(deadline - time.monotonic(), 0))
                return []
            raise PartitionNotAssignedError(
                "poll(): no partitions are assigned to this consumer; call assign() first"
            )
        while True:
            active = [tp for tp in self._assignment if tp not in self._paused]
            try:
                self._resolve_positions(active, 0, partial=True)
            except BrokerUnreachableError:
                if not self._cluster.bootstrapped:
                    raise
            drained = self._drain(limit)
            if drained:
                return drained
            now = time.monotonic()
            remaining_ms = int((deadline - now) * 1000)
            sent = self._fetch(active, max(min(self.config.fetch_max_wait_ms, remaining_ms), 0))
            if self._buffers.keys() - self._paused:
                continue
            now = time.monotonic()
            if now >= deadline:
                return []
            if not sent:
                time.sleep(min(self.config.retry_backoff_ms / 1000, deadline - now))

    def _drain(self, limit: int | None) -> list[tuple[TopicPartition, pa.RecordBatch]]:
        out: list[tuple[TopicPartition, pa.RecordBatch]] = []
        count = 0
        tps = [tp for tp in self._buffers if tp not in self._paused]
        if not tps:
            return out
        start = self._round_robin % len(tps)
        self._round_robin += 1
        for tp in tps[start:] + tps[:start]:
            buffered = self._buffers[tp]
            batches = buffered.batches
            while batches and (limit is None or count < limit):
                batch = batches[0]
                take = batch.num_rows if limit is None else min(batch.num_rows, limit - count)
                if take < batch.num_rows:
                    piece = batch.slice(0, take)
                    batches[0] = batch.slice(take)
                else:
                    piece = batches.popleft()
                out.append((tp, piece))
                count += take
                self._positions[tp] = int(piece.column(0)[take - 1].as_py()) + 1
            if not batches:
                del self._buffers[tp]
                next_offset = buffered.next_offset
                if next_offset is not None and next_offset > self._positions.get(tp, -1):
                    self._positions[tp] = next_offset
            if limit is not None and count >= limit:
                break
        return out

    def _fetch(self, active: list[TopicPartition], max_wait_ms: int) -> bool:
        """One Fetch per leader for partitions with a position and nothing buffered.

        Returns False if no request could be sent (no leader known, nothing to fetch).
        """
        fetchable = [tp for tp in active if tp in self._positions and tp not in self._buffers]
        if not fetchable:
            return False
        try:
            self._offsets.ensure_metadata(fetchable)
        except BrokerUnreachableError:
            if not self._cluster.bootstrapped:
                raise
        snapshot = self._cluster.snapshot
        by_node: dict[int, list[TopicPartition]] = {}
        missing: list[TopicPartition] = []
        for tp in fetchable:
            node = snapshot.leader(tp.topic, tp.partition)
            if node is None:
                missing.append(tp)
            else:
                by_node.setdefault(node, []).append(tp)
        if missing:
            self._cluster.request_update()
            self._offsets.check_unknown(missing)
        if not by_node:
            return False
        requests = {node: self._fetch_request(tps, max_wait_ms) for node, tps in by_node.items()}
        timeout = self.config.request_timeout_ms + max_wait_ms
        responses: dict[int, FetchResponse | ReplogError] = {}
        if len(requests) == 1:
            ((node, request),) = requests.items()
            responses[node] = self._send_fetch(node, request, timeout)
        else:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=8, thread_name_prefix=f"{self.config.client_id}-fetch"
                )
            futures = {
                node: self._executor.submit(self._send_fetch, node, request, timeout)
                for node, request in requests.items()
            }
            responses = {node: future.result() for node, future in futures.items()}
        for node, response in responses.items():
            if isinstance(response, ReplogError):
                if not response.retriable:
                    raise response
                log.info("fetch from broker %d failed (will retry): %s", node, response)
                self._cluster.request_update()
                continue
            self._handle_fetch(node, requests[node], response)
        return True

    def _fetch_request(self, tps: list[TopicPartition], max_wait_ms: int) -> FetchRequest:
        c = self.config
        topics: dict[str, list[FetchRequestPartition]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(
                FetchRequestPartition(
                    partition=tp.partition,
                    fetch_offset=self._positions[tp],
                    partition_max_bytes=c.max_partition_fetch_bytes,
                )
            )
        return FetchRequest(
            max_wait_ms=max_wait_ms,
            min_bytes=c.fetch_min_bytes,
            max_bytes=c.fetch_max_bytes,
            isolation_level=self._isolation,
            session_id=0,
            session_epoch=_FINAL_EPOCH,
            topics=[FetchRequestTopic(topic=name, partitions=ps) for name, ps in topics.items()],
        )

    def _send_fetch(
        self, node: int, request: FetchRequest, timeout_ms: int
    ) -> FetchResponse | ReplogError:
        sent = time.monotonic()
        try:
            response: FetchResponse = self._cluster.connection(node).send(
                ApiKey.FETCH, 0, request, timeout_ms=timeout_ms
            )
        except ReplogError as err:
            return err
        self._metrics.fetch_latency.record((time.monotonic() - sent) * 1000)
        return response

    def _handle_fetch(self, node: int, request: FetchRequest, response: FetchResponse) -> None:
        if response.error_code:
            cls = for_code(response.error_code) or ReplogError
            if not cls.retriable:
                raise cls(f"fetch from broker {node} failed: {cls()}")
            log.info("fetch from broker %d failed (will retry): %s", node, cls.__name__)
            self._cluster.request_update()
            return
        asked = {
            (t.topic, p.partition): p.fetch_offset for t in request.topics for p in t.partitions
        }
        fetched_bytes = 0
        fetched_records = 0
        for t in response.responses:
            for p in t.partitions:
                tp = TopicPartition(t.topic, p.partition_index)
                fetch_offset = asked.get(tp)
                if fetch_offset is None or self._positions.get(tp) != fetch_offset:
                    continue  # not asked, or the position moved (seek) meanwhile
                if tp not in self._assignment:
                    continue
                if p.error_code:
                    self._fetch_error(tp, fetch_offset, p)
                    continue
                if p.high_watermark >= 0:
                    self._highwater[tp] = int(p.high_watermark)
                fetched = decode_fetched(
                    p.records,
                    fetch_offset,
                    read_committed=self._isolation == READ_COMMITTED,
                    aborted_transactions=p.aborted_transactions,
                    where=str(tp),
                )
                if p.records:
                    self._metrics.bytes_consumed.record(len(p.records))
                    fetched_bytes += len(p.records)
                    fetched_records += sum(b.num_rows for b in fetched.batches)
                if fetched.batches or (
                    fetched.next_offset is not None and fetched.next_offset > fetch_offset
                ):
                    self._buffers[tp] = _Buffered(deque(fetched.batches), fetched.next_offset)
                elif fetched.partial_bytes and fetched.next_offset is None:
                    raise RecordTooLargeError(
                        f"{tp}: the batch at offset {fetch_offset} does not fit in the "
                        f"{fetched.partial_bytes} bytes the broker returned; raise "
                        "max.partition.fetch.bytes and fetch.max.bytes"
                    )
        self._metrics.fetch_size.record(fetched_bytes)
        self._metrics.records_per_request.record(fetched_records)

    def _fetch_error(self, tp: TopicPartition, fetch_offset: int, p: Any) -> None:
        code = int(p.error_code)
        if code == _OFFSET_OUT_OF_RANGE:
            strategy = self.config.auto_offset_reset
            if strategy == "none":
                raise OffsetOutOfRangeError(
                    f"fetch offset {fetch_offset} is out of range for partition {tp}"
                    f"{self._range_text(tp, p)}; seek() to a valid offset or set "
                    "auto.offset.reset to earliest or latest"
                )
            log.info(
                "fetch offset %d is out of range for partition %s%s, resetting to %s",
                fetch_offset,
                tp,
                self._range_text(tp, p),
                strategy,
            )
            self._positions.pop(tp, None)
            self._resets[tp] = strategy
            return
        cls = for_code(code) or ReplogError
        if cls.refresh_metadata:
            self._cluster.request_update()
        if cls.retriable:
            log.debug("fetch of %s failed (will retry): %s", tp, cls.__name__)
            if cls is UnknownTopicOrPartitionError:
                self._offsets.check_unknown([tp])
            return
        raise cls(f"fetch from {tp} failed: {cls()}")

    def _range_text(self, tp: TopicPartition, p: Any) -> str:
        """`` (the log holds offsets [start, end))`` from the response or ListOffsets."""
        start, end = int(p.log_start_offset), int(p.high_watermark)
        if start < 0 or end < 0:
            try:
                first, _ = self._offsets.list_once({tp: EARLIEST_TIMESTAMP}, self._isolation)
                last, _ = self._offsets.list_once({tp: LATEST_TIMESTAMP}, self._isolation)
            except ReplogError:
                return ""
            if tp not in first or tp not in last:
                return ""
            start, end = first[tp][0], last[tp][0]
        return f" (the log holds offsets [{start}, {end}))"

    # --- closing ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the consumer is closed")

    def close(self) -> None:
        """Leave the group (committing positions with enable.auto.commit), close connections;
        idempotent."""
        if self._closed:
            return
        if self._commit_executor is not None:
            self._commit_executor.shutdown(wait=True)  # async commits finish first
        if self._coordinator is not None:
            try:
                self._coordinator.close()
            except ReplogError as err:
                log.warning("closing the group membership failed: %s", err)
        self._closed = True
        self._buffers.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self._cluster.close()


def _records(tp: TopicPartition, batch: pa.RecordBatch) -> list[ConsumerRecord]:
    """Python records of one fetched Arrow batch."""
    topic, partition = tp
    offsets = batch.column(0).to_pylist()
    keys = batch.column(1).to_pylist()
    values = batch.column(2).to_pylist()
    timestamps = batch.column(3).to_pylist()
    types = batch.column(4).to_pylist()
    header_column = batch.column(5)
    if header_column.null_count == len(header_column):
        return [
            ConsumerRecord(topic, partition, o, ts, tt, k, v)
            for o, k, v, ts, tt in zip(offsets, keys, values, timestamps, types, strict=True)
        ]
    headers = [
        tuple((h["key"], h["value"]) for h in hs) if hs else () for hs in header_column.to_pylist()
    ]
    return [
        ConsumerRecord(topic, partition, o, ts, tt, k, v, h)
        for o, k, v, ts, tt, h in zip(
            offsets, keys, values, timestamps, types, headers, strict=True
        )
    ]
