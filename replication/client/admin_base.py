"""What every admin call stands on: the client's connections to the cluster, and sending a
request to any broker, a partition's leader or the active controller, retried as Kafka's
admin client retries (until default.api.timeout.ms, refreshing metadata on NOT_CONTROLLER
and on errors that ask for it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from replication.client.cluster import Cluster
from replication.client.config import AdminConfig, load
from replication.client.coordinator import CoordinatorClient
from replication.client.errors import ClientClosedError
from replication.client.group_admin import GroupAdmin
from replication.client.offsets import OffsetLookup
from replication.client.retry import RetryPolicy, call_with_retries
from replication.client.transaction_admin import TransactionAdmin
from replication.client.types import TopicPartition
from replication.errors import NotControllerError, ReplogError, for_code
from replication.protocol import MetadataResponse

log = logging.getLogger(__name__)

T = TypeVar("T")


def _error(code: int, message: str | None, what: str) -> ReplogError:
    cls = for_code(code) or ReplogError
    return cls(f"{what}: {message or str(cls())}")


class AdminBase:
    """The state and the request plumbing the admin call families share."""

    def __init__(self, config: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self.config = load(AdminConfig, config, kwargs)
        self._cluster = Cluster(self.config)
        self._offsets = OffsetLookup(
            self._cluster, default_api_timeout_ms=self.config.default_api_timeout_ms
        )
        self._coordinator = CoordinatorClient(self._cluster, self.config.client_id)
        self._sink_coordinators: dict[str, CoordinatorClient] = {}
        self._groups = GroupAdmin(self._cluster, self.config.default_api_timeout_ms)
        self._transactions = TransactionAdmin(self._cluster, self._coordinator)
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self._cluster.close()

    # --- plumbing ---------------------------------------------------------------------------

    def _deadline(self, timeout_ms: int | None) -> float:
        ms = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
        return time.monotonic() + ms / 1000

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the admin client is closed")

    def _metadata(self, topics: list[str] | None) -> MetadataResponse:
        self._check_open()
        cluster = self._cluster
        if topics is None:
            return self._retrying("listing topics", lambda: cluster.refresh(all_topics=True))
        what = f"describing topics {', '.join(topics)}" if topics else "describing the cluster"
        return self._retrying(what, lambda: cluster.refresh(topics))

    def _send_to_controller(self, api_key: int, build: Callable[[int], Any], version: int) -> Any:
        self._check_open()
        cluster = self._cluster
        if not cluster.bootstrapped:
            cluster.refresh()
        controller = cluster.snapshot.controller_id
        if controller >= 0 and controller in cluster.snapshot.brokers:
            conn = cluster.connection(controller)
            use = conn.max_version(api_key, version)
            return conn.send(api_key, use, build(use))
        return cluster.any_connection_send(api_key, build, version)

    def _controller_call(
        self,
        api_key: int,
        request: Any,
        what: str,
        *,
        codes: Callable[[Any], Iterable[int]] = lambda response: (response.error_code,),
        version: int = 0,
    ) -> Any:
        """``request`` to the active controller (or any broker, which forwards it), resent
        while the answer says NOT_CONTROLLER (``codes``: the answer's error codes, per entry
        for the APIs that answer per topic, ACL or user) or a retriable error comes, until
        default.api.timeout.ms."""

        def send() -> Any:
            response = self._send_to_controller(api_key, lambda version: request, version)
            if NotControllerError.code in codes(response):
                raise NotControllerError()
            return response

        return self._retrying(what, send)

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """Run ``call``, retrying retriable errors (refreshing metadata) until
        default.api.timeout.ms. A broker that cannot be reached before any other ever was is
        reported at once."""

        def on_retry(err: ReplogError, attempt: int) -> None:
            if err.refresh_metadata or isinstance(err, NotControllerError):
                try:
                    self._cluster.refresh()
                except ReplogError as refresh_error:
                    log.debug("metadata refresh failed: %s", refresh_error)

        return call_with_retries(
            what,
            call,
            RetryPolicy.of(
                self.config, self.config.default_api_timeout_ms, "default.api.timeout.ms"
            ),
            retriable=self._cluster.retriable,
            on_retry=on_retry,
        )

    @staticmethod
    def _raise_first(errors: list[ReplogError]) -> None:
        if not errors:
            return
        for extra in errors[1:]:
            log.error("%s", extra)
        raise errors[0]

    def _any_broker(self, api_key: int, request: Any) -> Any:
        self._check_open()
        return self._cluster.any_connection_send(api_key, lambda version: request, 0)

    def _leader_of(self, tp: TopicPartition) -> int:
        self._offsets.ensure_metadata([tp])
        leader = self._cluster.snapshot.leader(tp.topic, tp.partition)
        if leader is None:
            self._cluster.refresh([tp.topic])
            leader = self._cluster.snapshot.leader(tp.topic, tp.partition)
        if leader is None:
            raise self._offsets.no_leader_error(tp)
        return leader
