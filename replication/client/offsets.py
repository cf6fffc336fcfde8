"""Offset lookups (ListOffsets) and partition-existence checks shared by Consumer and Admin.

:class:`OffsetLookup` sends one ListOffsets per leader broker, retries retriable errors
(refreshing metadata) until a timeout, and reports a partition missing from fresh metadata as
UnknownTopicOrPartitionError once it has been missing for :data:`MISSING_PARTITION_GRACE_MS`
(or default.api.timeout.ms, if that is shorter).

Why not wait default.api.timeout.ms, as Kafka's blocking calls do: Kafka's brokers may create
a topic on first use (auto.create.topics.enable), so its clients wait for it to appear. replog
creates no topic on first use, so a partition missing from the metadata either does not exist
(a typo, a partition number past the topic's count, a deleted topic) or was created a moment
ago and the broker asked has not heard of it yet: brokers learn new metadata with their next
heartbeat (broker.heartbeat.interval.ms, 500 ms by default). A few heartbeats cover that, also
on a loaded machine; past them, the caller hears that the partition does not exist, instead of
getting nothing for a minute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Final

from replication.client.cluster import Cluster
from replication.client.errors import denied
from replication.client.retry import RetryPolicy, call_with_retries
from replication.client.types import TopicPartition
from replication.errors import (
    LeaderNotAvailableError,
    NetworkError,
    ReplogError,
    UnknownTopicOrPartitionError,
    for_code,
)
from replication.protocol import (
    ApiKey,
    ListOffsetsRequest,
    ListOffsetsRequestPartition,
    ListOffsetsRequestTopic,
    ListOffsetsResponse,
)

__all__ = ["MISSING_PARTITION_GRACE_MS", "OffsetLookup"]

log = logging.getLogger(__name__)

#: How long a partition may be missing from fresh metadata before it is reported as not
#: existing (see the module docstring): ten heartbeats of a broker at the default interval.
MISSING_PARTITION_GRACE_MS: Final = 5_000


class OffsetLookup:
    """ListOffsets against the leaders of partitions, with metadata refreshes and retries."""

    def __init__(self, cluster: Cluster, *, default_api_timeout_ms: int) -> None:
        self.cluster = cluster
        self.default_api_timeout_ms = default_api_timeout_ms
        self._unknown_since: dict[TopicPartition, float] = {}

    def forget(self, keep: Iterable[TopicPartition]) -> None:
        """Drop the missing-since times of partitions not in ``keep``."""
        kept = set(keep)
        for tp in [tp for tp in self._unknown_since if tp not in kept]:
            del self._unknown_since[tp]

    # --- metadata ---------------------------------------------------------------------------

    def ensure_metadata(self, tps: Iterable[TopicPartition]) -> None:
        """Refresh metadata if a partition has no known leader or a refresh was requested.

        Raises BrokerUnreachableError at once if no broker was ever reached.
        """
        cluster = self.cluster
        tps = list(tps)
        cluster.add_interest({tp.topic for tp in tps})
        if not cluster.bootstrapped:
            cluster.refresh()
            return
        snapshot = cluster.snapshot
        if any(snapshot.leader(tp.topic, tp.partition) is None for tp in tps):
            cluster.request_update()
        cluster.maybe_refresh()

    @property
    def missing_limit_ms(self) -> int:
        """How long a partition may be missing from the metadata before it is reported."""
        return min(self.default_api_timeout_ms, MISSING_PARTITION_GRACE_MS)

    def check_unknown(self, tps: Iterable[TopicPartition]) -> None:
        """UnknownTopicOrPartitionError, naming the topic, for a partition missing from the
        metadata for longer than :attr:`missing_limit_ms` (logged when first missed)."""
        snapshot = self.cluster.snapshot
        now = time.monotonic()
        limit_ms = self.missing_limit_ms
        for tp in tps:
            meta = snapshot.topics.get(tp.topic)
            if meta is None or meta.error_code == UnknownTopicOrPartitionError.code:
                what = f"topic {tp.topic!r} does not exist"
            elif not meta.error_code and tp.partition not in meta.partitions:
                what = f"topic {tp.topic!r} has {len(meta.partitions)} partitions"
            else:  # it exists, or its topic has another error
                self._unknown_since.pop(tp, None)
                cls = for_code(meta.error_code) if meta.error_code else None
                if cls is not None and not cls.retriable:  # e.g. an invalid topic name
                    raise cls(f"{tp}: {denied(self.cluster.config, cls, 'Topic', tp.topic)}")
                continue
            first = self._unknown_since.get(tp)
            if first is None:
                self._unknown_since[tp] = now
                log.warning(
                    "%s is not in the cluster metadata (%s); it is reported as not existing if "
                    "it is still missing in %d ms",
                    tp,
                    what,
                    limit_ms,
                )
            elif (now - first) * 1000 >= limit_ms:
                raise UnknownTopicOrPartitionError(
                    f"{tp} does not exist: {what} (still missing from the cluster metadata "
                    f"after {limit_ms} ms); create it (`replog topics create`) or fix the name"
                )

    def no_leader_error(self, tp: TopicPartition) -> ReplogError:
        meta = self.cluster.snapshot.topics.get(tp.topic)
        if meta is None or meta.error_code or tp.partition not in meta.partitions:
            return UnknownTopicOrPartitionError(f"{tp} is not in the cluster metadata")
        return LeaderNotAvailableError(f"{tp} has no leader right now")

    # --- ListOffsets ------------------------------------------------------------------------

    def list(
        self, specs: Mapping[TopicPartition, int], isolation_level: int, timeout_ms: int
    ) -> dict[TopicPartition, tuple[int, int]]:
        """(offset, timestamp) per partition, retrying retriable errors until ``timeout_ms``.

        ``specs`` maps partitions to LATEST_TIMESTAMP, EARLIEST_TIMESTAMP or a time in ms.
        """
        results: dict[TopicPartition, tuple[int, int]] = {}
        pending = dict(specs)

        def attempt() -> dict[TopicPartition, tuple[int, int]]:
            nonlocal pending
            self.ensure_metadata(pending)
            got, errors = self.list_once(pending, isolation_level)
            results.update(got)
            pending = {tp: pending[tp] for tp in errors}
            if pending:
                raise next(iter(errors.values()))  # each names its partition
            return results

        return call_with_retries(
            f"listing offsets of {len(specs)} partition(s)",
            attempt,
            RetryPolicy.of(self.cluster.config, timeout_ms, "timeout_ms"),
            retriable=self.cluster.retriable,
            on_retry=lambda error, attempt: self.check_unknown(pending),
        )

    def list_once(
        self, specs: Mapping[TopicPartition, int], isolation_level: int
    ) -> tuple[dict[TopicPartition, tuple[int, int]], dict[TopicPartition, ReplogError]]:
        """One ListOffsets per leader. Retriable failures are returned, others raised."""
        cluster = self.cluster
        snapshot = cluster.snapshot
        results: dict[TopicPartition, tuple[int, int]] = {}
        errors: dict[TopicPartition, ReplogError] = {}
        by_node: dict[int, dict[TopicPartition, int]] = {}
        for tp, ts in specs.items():
            node = snapshot.leader(tp.topic, tp.partition)
            if node is None:
                errors[tp] = self.no_leader_error(tp)
            else:
                by_node.setdefault(node, {})[tp] = ts
        for node, part in by_node.items():
            topics: dict[str, list[ListOffsetsRequestPartition]] = {}
            for tp, ts in part.items():
                topics.setdefault(tp.topic, []).append(
                    ListOffsetsRequestPartition(partition_index=tp.partition, timestamp=ts)
                )
            request = ListOffsetsRequest(
                isolation_level=isolation_level,
                topics=[
                    ListOffsetsRequestTopic(name=name, partitions=ps) for name, ps in topics.items()
                ],
            )
            try:
                response: ListOffsetsResponse = cluster.connection(node).send(
                    ApiKey.LIST_OFFSETS, 0, request
                )
            except ReplogError as err:
                if not err.retriable:
                    raise
                cluster.request_update()
                errors.update(dict.fromkeys(part, err))
                continue
            answered: set[TopicPartition] = set()
            for t in response.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, p.partition_index)
                    answered.add(tp)
                    if p.error_code == 0:
                        results[tp] = (int(p.offset), int(p.timestamp))
                        continue
                    cls = for_code(p.error_code) or ReplogError
                    error = cls(f"list offsets of {tp}: {cls()}")
                    if not cls.retriable:
                        raise error
                    if cls.refresh_metadata:
                        cluster.request_update()
                    errors[tp] = error
            for tp in part:
                if tp not in answered:
                    errors[tp] = NetworkError(f"broker {node} did not answer for {tp}")
        return results, errors
