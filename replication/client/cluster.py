"""The client's view of the cluster: a metadata cache and a pool of broker connections.

:class:`Cluster` starts from ``bootstrap.servers``, asks any reachable broker for Metadata, and
keeps an immutable :class:`MetadataSnapshot` that readers use without locks (the reference is
swapped atomically on refresh). Connections are pooled per broker address (and per slot, for
callers that want several requests in flight to one broker).

A refresh is requested with :meth:`Cluster.request_update` (for example when an error with
``refresh_metadata`` arrives) and done by :meth:`Cluster.maybe_refresh`, rate-limited by
retry.backoff.ms, or forced with :meth:`Cluster.refresh`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from replication.client.config import ClientConfig
from replication.client.connection import BrokerConnection
from replication.client.errors import ClientClosedError
from replication.client.types import BrokerInfo, PartitionInfo
from replication.errors import BrokerNotAvailableError, BrokerUnreachableError, ReplogError
from replication.protocol import (
    ApiKey,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
)
from replication.security.connector import client_login_factory, client_ssl_context

__all__ = ["Cluster", "MetadataSnapshot", "TopicMetadata"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicMetadata:
    """One topic as the last Metadata response described it (``error_code`` 0 if known)."""

    name: str
    error_code: int
    partitions: Mapping[int, PartitionInfo]
    is_internal: bool = False
    #: Partitions that have a leader, ascending.
    available_partitions: tuple[int, ...] = ()


@dataclass(frozen=True)
class MetadataSnapshot:
    """An immutable view of brokers, controller and topics, safe to read from any thread."""

    brokers: Mapping[int, BrokerInfo] = field(default_factory=dict)
    topics: Mapping[str, TopicMetadata] = field(default_factory=dict)
    controller_id: int = -1
    cluster_id: str | None = None
    #: topic -> number of partitions, for topics known without error (the producer's hot path).
    partition_counts: Mapping[str, int] = field(default_factory=dict)

    def leader(self, topic: str, partition: int) -> int | None:
        """The leader's broker id, or None if unknown (no leader, topic or partition)."""
        meta = self.topics.get(topic)
        if meta is None:
            return None
        info = meta.partitions.get(partition)
        if info is None or info.leader < 0 or info.leader not in self.brokers:
            return None
        return info.leader


def _topic_from_response(topic: Any) -> TopicMetadata:
    partitions = {
        int(p.partition_index): PartitionInfo(
            partition=int(p.partition_index),
            leader=int(p.leader_id) if p.error_code in (0, 9) else -1,
            leader_epoch=int(p.leader_epoch),
            replicas=tuple(p.replica_nodes),
            isr=tuple(p.isr_nodes),
            offline_replicas=tuple(p.offline_replicas),
        )
        for p in topic.partitions
    }
    available = tuple(p for p, info in sorted(partitions.items()) if info.leader >= 0)
    return TopicMetadata(
        topic.name, int(topic.error_code), partitions, bool(topic.is_internal), available
    )


class Cluster:
    """Metadata cache and connection pool of one client (producer, consumer or admin)."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._bootstrap = config.bootstrap
        self._snapshot = MetadataSnapshot()
        self._lock = threading.RLock()  # guards refreshes and the pool
        self._pool: dict[tuple[str, int, int], BrokerConnection] = {}
        self._need_update = False
        self._last_refresh = 0.0  # monotonic time of the last refresh attempt
        self._last_success = 0.0
        self._bootstrapped = False
        self._closed = False
        #: Topics whose metadata every refresh asks for (None: all topics).
        self._interest: set[str] = set()
        #: TLS for every connection (security.protocol SSL, SASL_SSL), built once: a bad
        #: truststore or keystore fails here, naming its key
        self._ssl_context = client_ssl_context(config)
        #: the SASL login of every connection (SASL_PLAINTEXT, SASL_SSL), or None
        self._sasl = client_login_factory(config)

    # --- reading --------------------------------------------------------------------------

    @property
    def snapshot(self) -> MetadataSnapshot:
        return self._snapshot

    @property
    def bootstrapped(self) -> bool:
        """True once any broker answered a Metadata request."""
        return self._bootstrapped

    def retriable(self, error: BaseException) -> bool:
        """Whether a request that failed with ``error`` is worth retrying: retriable errors,
        except BrokerUnreachableError before any broker was ever reached (bootstrap.servers is
        likely wrong: callers say so at once instead of retrying until their timeout)."""
        if isinstance(error, BrokerUnreachableError) and not self._bootstrapped:
            return False
        return isinstance(error, ReplogError) and error.retriable

    # --- connections ------------------------------------------------------------------------

    def connection(self, node_id: int, slot: int = 0) -> BrokerConnection:
        """The pooled connection to broker ``node_id`` (it must be in the metadata)."""
        broker = self._snapshot.brokers.get(node_id)
        if broker is None:
            self.request_update()
            raise BrokerNotAvailableError(
                f"broker {node_id} is not in the cluster metadata (it may have left); "
                "the client refreshes its metadata and retries"
            )
        return self._connection_to(broker.host, broker.port, slot)

    def connections(self) -> list[BrokerConnection]:
        """Every pooled connection (each one's throttle counts, for a client's metrics)."""
        return list(self._pool.values())

    def connection_to(self, host: str, port: int, slot: int = 0) -> BrokerConnection:
        """The pooled connection to ``host:port`` (e.g. a coordinator FindCoordinator named)."""
        return self._connection_to(host, port, slot)

    def _connection_to(self, host: str, port: int, slot: int = 0) -> BrokerConnection:
        key = (host, port, slot)
        conn = self._pool.get(key)
        if conn is None:
            with self._lock:
                conn = self._pool.get(key)
                if conn is None:
                    conn = BrokerConnection(
                        host,
                        port,
                        self.config.client_id,
                        self.config.request_timeout_ms,
                        connect_timeout_ms=self.config.socket_connection_setup_timeout_ms,
                        ssl_context=self._ssl_context,
                        sasl=self._sasl,
                    )
                    self._pool[key] = conn
        return conn

    def any_connection_send(self, api_key: int, build: Any, wanted_version: int | None) -> Any:
        """Send to any reachable broker (known brokers first, then bootstrap servers).

        ``build(version)`` makes the request body for the negotiated version. Raises the last
        BrokerUnreachableError if no broker could be reached.
        """
        candidates: list[tuple[str, int]] = [
            (b.host, b.port) for b in self._snapshot.brokers.values()
        ]
        random.shuffle(candidates)
        for address in self._bootstrap:
            if address not in candidates:
                candidates.append(address)
        errors: list[str] = []
        last: ReplogError | None = None
        for host, port in candidates:
            conn = self._connection_to(host, port)
            try:
                version = conn.max_version(api_key, wanted_version)
                return conn.send(api_key, version, build(version))
            except ReplogError as err:
                if not err.retriable:
                    raise
                errors.append(f"{host}:{port}: {err}")
                last = err
                log.debug("broker %s:%d failed %s: %s", host, port, ApiKey(api_key).name, err)
        if len(candidates) == 1 and isinstance(last, BrokerUnreachableError):
            raise last
        host, port = candidates[-1]
        raise BrokerUnreachableError(
            host, port, "no broker could be reached: " + "; ".join(errors)
        ) from last

    # --- metadata ---------------------------------------------------------------------------

    def add_interest(self, topics: Iterable[str]) -> None:
        """Topics that every later refresh asks for."""
        with self._lock:
            self._interest.update(topics)

    def request_update(self) -> None:
        """Mark the metadata stale; the next :meth:`maybe_refresh` refreshes it."""
        self._need_update = True

    @property
    def needs_update(self) -> bool:
        if self._need_update:
            return True
        max_age = self.config.metadata_max_age_ms / 1000
        return time.monotonic() - self._last_success >= max_age

    def maybe_refresh(self) -> bool:
        """Refresh if an update was requested (or the metadata is old), at most once per
        retry.backoff.ms. Returns True if a refresh happened. Errors are logged, not raised."""
        if not self.needs_update:
            return False
        if time.monotonic() - self._last_refresh < self.config.retry_backoff_ms / 1000:
            return False
        try:
            self.refresh()
        except ReplogError as err:
            log.info("metadata refresh failed (will retry): %s", err)
            return False
        return True

    def refresh(
        self,
        topics: Iterable[str] | None = (),
        *,
        allow_auto_topic_creation: bool = False,
        all_topics: bool = False,
    ) -> MetadataResponse:
        """Ask a broker for metadata of ``topics`` plus the topics of interest.

        With ``all_topics`` every topic is asked for (and the cache is replaced). Raises
        BrokerUnreachableError if no broker can be reached.
        """
        with self._lock:
            if self._closed:
                raise ClientClosedError()
            self._last_refresh = time.monotonic()
            self._need_update = False
            wanted: list[str] | None
            if all_topics:
                wanted = None
            else:
                names = set(self._interest)
                names.update(topics or ())
                wanted = sorted(names)

            def build(version: int) -> MetadataRequest:
                return MetadataRequest(
                    topics=None
                    if wanted is None
                    else [MetadataRequestTopic(name=t) for t in wanted],
                    allow_auto_topic_creation=allow_auto_topic_creation and version >= 1,
                )

            try:
                response: MetadataResponse = self.any_connection_send(ApiKey.METADATA, build, 1)
            except ReplogError:
                self._need_update = True
                raise
            self._apply(response, replace=wanted is None)
            self._bootstrapped = True
            self._last_success = time.monotonic()
            return response

    def _apply(self, response: MetadataResponse, *, replace: bool) -> None:
        old = self._snapshot
        brokers = {
            b.node_id: BrokerInfo(b.node_id, b.host, b.port, b.rack) for b in response.brokers
        }
        topics: dict[str, TopicMetadata] = {} if replace else dict(old.topics)
        for t in response.topics:
            topics[t.name] = _topic_from_response(t)
        counts = {
            name: len(meta.partitions)
            for name, meta in topics.items()
            if meta.partitions and meta.error_code == 0
        }
        self._snapshot = MetadataSnapshot(
            brokers=brokers,
            topics=topics,
            controller_id=int(response.controller_id),
            cluster_id=response.cluster_id,
            partition_counts=counts,
        )
        # Close pooled connections to brokers that left.
        live = {(b.host, b.port) for b in brokers.values()} | set(self._bootstrap)
        for key in [k for k in self._pool if (k[0], k[1]) not in live]:
            self._pool.pop(key).close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, {}
        for conn in pool.values():
            conn.close()
