"""The controller: the one writer of cluster metadata.

It claims a controller epoch in the metadata store, then every change (a broker registering, a
topic created or deleted, a leader elected, an ISR committed) becomes the next metadata version,
written put-if-absent so that a stale controller can never write. Listeners (the brokers in
this process; remote brokers through heartbeats) apply the new image.

Methods are synchronous (they do storage I/O); the broker calls them off its event loop.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from logstore.config import LogConfig, keys_of, parse
from logstore.errors import ConfigError
from replication.errors import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from replication.metadata import BrokerInfo, MetadataImage, PartitionState, TopicInfo
from replication.metadata_store import ControllerClaim, MetadataStore

log = logging.getLogger(__name__)

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
#: topic-level configs that are not log settings but are still per topic in Kafka
TOPIC_EXTRA_KEYS = frozenset({"min.insync.replicas", "unclean.leader.election.enable"})

Listener = Callable[[MetadataImage], None]


def validate_topic_name(name: str) -> None:
    if name in (".", "..") or not _LEGAL_TOPIC.match(name):
        raise InvalidTopicError(
            f"topic name {name!r} is not legal: use 1-249 characters from a-z A-Z 0-9 . _ -"
        )


def validate_topic_configs(configs: Sequence[tuple[str, str]]) -> None:
    log_keys = set(keys_of(LogConfig))
    for name, _ in configs:
        if name not in log_keys and name not in TOPIC_EXTRA_KEYS:
            allowed = ", ".join(sorted(log_keys | TOPIC_EXTRA_KEYS))
            raise ConfigError(f"unknown topic config {name!r}; topic configs are: {allowed}")
    parse(LogConfig, {k: v for k, v in configs if k in log_keys})


def assign_replicas(
    brokers: Sequence[BrokerInfo],
    partitions: int,
    replication_factor: int,
    *,
    seed: int | None = None,
) -> list[list[int]]:
    """Kafka's rack-unaware assignment: round-robin leaders, followers shifted per round.

    With racks on every broker, brokers are first interleaved by rack (Kafka's
    rack-alternated list) so that consecutive replicas land on different racks.
    """
    ids = [b.broker_id for b in sorted(brokers, key=lambda b: b.broker_id)]
    if all(b.rack for b in brokers) and len({b.rack for b in brokers}) > 1:
        ids = _rack_alternated(brokers)
    n = len(ids)
    rng = random.Random(seed)
    start = rng.randrange(n)
    shift = rng.randrange(n)
    out: list[list[int]] = []
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            replicas.append(ids[(first + 1 + (shift + j) % (n - 1)) % n])
        out.append(replicas)
    return out


def _rack_alternated(brokers: Sequence[BrokerInfo]) -> list[int]:
    by_rack: dict[str, list[int]] = {}
    for b in sorted(brokers, key=lambda b: b.broker_id):
        by_rack.setdefault(b.rack or "", []).append(b.broker_id)
    racks = sorted(by_rack)
    out: list[int] = []
    i = 0
    while len(out) < len(brokers):
        rack = by_rack[racks[i % len(racks)]]
        if rack:
            out.append(rack.pop(0))
        i += 1
    return out


class Controller:
    """The active controller of a cluster (one per metadata root at a time)."""

    def __init__(
        self,
        store: MetadataStore,
        controller_id: int,
        host: str,
        port: int,
        *,
        time_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.store = store
        self.controller_id = controller_id
        self.host = host
        self.port = port
        self._time_ms = time_ms
        self._lock = threading.RLock()
        self._listeners: list[Listener] = []
        self.epoch = 0
        self.image = MetadataImage()

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def activate(self) -> MetadataImage:
        """Claim the next controller epoch and write a version that records it."""
        with self._lock:
            latest = self.store.latest_claim()
            epoch = (latest.epoch if latest else 0) + 1
            self.store.claim(
                ControllerClaim(epoch, self.controller_id, self.host, self.port, self._time_ms())
            )
            self.epoch = epoch
            image = self.store.read_latest()
            log.info(
                "controller %d active at epoch %d (metadata version %d)",
                self.controller_id,
                epoch,
                image.version,
            )
            return self._commit(
                image.next(
                    controller_epoch=epoch,
                    controller_id=self.controller_id,
                    cluster_id=image.cluster_id or uuid.uuid4().hex,
                )
            )

    def _commit(self, image: MetadataImage) -> MetadataImage:
        self.store.write(image)
        self.image = image
        for listener in self._listeners:
            listener(image)
        return image

    # --- brokers ------------------------------------------------------------------------------

    def register_broker(self, broker_id: int, host: str, port: int, rack: str | None) -> BrokerInfo:
        with self._lock:
            old = self.image.broker(broker_id)
            info = BrokerInfo(broker_id, host, port, rack or None, (old.epoch + 1) if old else 1)
            self._commit(self.image.next().with_broker(info))
            return info

    # --- topics -------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Sequence[tuple[str, str]] = (),
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        validate_topic_name(name)
        if num_partitions < 1:
            raise InvalidPartitionsError(
                f"topic {name!r}: number of partitions must be at least 1, got {num_partitions}"
            )
        validate_topic_configs(configs)
        with self._lock:
            if self.image.topic(name) is not None:
                raise TopicAlreadyExistsError(f"topic {name!r} already exists")
            live = [b for b in self.image.brokers if not b.fenced]
            if replication_factor < 1 or replication_factor > len(live):
                raise InvalidReplicationFactorError(
                    f"topic {name!r}: replication factor {replication_factor} is not possible "
                    f"with {len(live)} live broker(s); use 1..{len(live)}"
                )
            assignment = assign_replicas(live, num_partitions, replication_factor)
            topic = TopicInfo(
                name=name,
                topic_id=uuid.uuid4().hex,
                partitions=tuple(
                    PartitionState(tuple(r), tuple(r), r[0], 0, 0) for r in assignment
                ),
                configs=tuple((str(k), str(v)) for k, v in configs),
            )
            if not validate_only:
                self._commit(self.image.next().with_topic(topic))
            return topic

    def delete_topic(self, name: str) -> None:
        with self._lock:
            if self.image.topic(name) is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            self._commit(self.image.next().without_topic(name))

    def allocate_producer_ids(self, count: int = 1000) -> range:
        """A block of producer ids, durable before use (unique across controller failover)."""
        with self._lock:
            first = self.image.next_producer_id
            self._commit(self.image.next(next_producer_id=first + count))
            return range(first, first + count)

    def update_partition(self, topic: str, index: int, state: PartitionState) -> MetadataImage:
        with self._lock:
            info = self.image.topic(topic)
            if info is None:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
            parts = list(info.partitions)
            parts[index] = state
            return self._commit(
                self.image.next().with_topic(replace(info, partitions=tuple(parts)))
            )
