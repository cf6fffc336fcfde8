"""Requests to a coordinator: find it, send, retry what Kafka's clients retry.

A transaction coordinator is the broker leading ``__transaction_state``-0; a group's is the
broker leading its ``__consumer_offsets`` partition. Any broker names it (FindCoordinator,
which creates the topic on first use). :class:`CoordinatorClient` keeps the
coordinator's address, sends a request there on a connection of its own (so a long EndTxn does
not wait behind produce requests), and retries until a deadline:

- NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, a broken or silent connection: find the
  coordinator again (it moved or its broker died) and resend;
- COORDINATOR_LOAD_IN_PROGRESS (a new coordinator is reading its log back) and
  CONCURRENT_TRANSACTIONS (the previous transaction is still writing its markers): back off
  and resend.

Everything else is raised as its own class. A :class:`CallState` records whether some attempt
may have been carried out although no answer came back (a broken connection or a timeout after
sending, or NOT_COORDINATOR, which the coordinator also answers when its own log write failed
with an unknown outcome): callers use it to tell "did not happen" from "outcome unknown".
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Final

from replication.client.cluster import Cluster
from replication.client.config import ClientConfig
from replication.client.connection import BrokerConnection
from replication.client.errors import denied
from replication.client.retry import RetryPolicy, call_with_retries
from replication.errors import (
    BrokerNotAvailableError,
    BrokerUnreachableError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NetworkError,
    NotCoordinatorError,
    OperationNotAttemptedError,
    ReplogError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
    for_code,
)
from replication.protocol import ApiKey, FindCoordinatorRequest, FindCoordinatorResponse

__all__ = ["COORDINATOR_SLOT", "CallState", "CoordinatorClient"]

log = logging.getLogger(__name__)

#: The connection-pool slot of coordinator requests (produce requests use slots 0..4).
COORDINATOR_SLOT: Final = 1 << 16
_TRANSACTION_KEY_TYPE: Final = 1
#: Errors after which the coordinator may have carried the request out.
_MAYBE_DONE: Final = (NetworkError, RequestTimedOutError, NotCoordinatorError)
#: Errors in a response that say the coordinator is elsewhere (or nowhere yet).
_COORDINATOR_MOVED: Final = (NotCoordinatorError, CoordinatorNotAvailableError)
#: Errors after which the coordinator is looked up again.
_FIND_AGAIN: Final = (
    NotCoordinatorError,
    CoordinatorNotAvailableError,
    BrokerUnreachableError,
    BrokerNotAvailableError,
    NetworkError,
    RequestTimedOutError,
)


@dataclass
class CallState:
    """What the attempts of one coordinator call left behind (shared across retries)."""

    #: True once an attempt may have been carried out without its answer reaching us.
    maybe_done: bool = False
    attempts: int = 0
    last_error: ReplogError | None = None


def response_error(response: Any, config: ClientConfig | None = None) -> tuple[int, str | None]:
    """The first error code (and message) of a coordinator response, 0 if none.

    AddPartitionsToTxn's errors are per partition and carry no message: the one named is a
    partition's own refusal, not OPERATION_NOT_ATTEMPTED (which only says another partition
    of the request was refused), with its topic and, for TOPIC_AUTHORIZATION_FAILED, who was
    refused Write on it (with ``config``)."""
    code = int(getattr(response, "error_code", 0) or 0)
    if code:
        return code, getattr(response, "error_message", None)
    failed = [
        (int(part.error_code), topic.name, part.partition_index)
        for topic in getattr(response, "results", ())  # AddPartitionsToTxn: per partition
        for part in topic.results
        if part.error_code
    ]
    if not failed:
        return 0, None
    code, name, index = next(
        (f for f in failed if f[0] != OperationNotAttemptedError.code), failed[0]
    )
    cls = for_code(code)
    if cls is None:
        return code, None
    if config is not None and issubclass(cls, TopicAuthorizationFailedError):
        return code, f"{name}-{index}: {denied(config, cls, 'Topic', name, 'Write')}"
    return code, f"{name}-{index}: {cls()}"


class CoordinatorClient:
    """Send requests to the coordinator of ``key`` with Kafka's retries.

    ``key_type`` is FindCoordinator's: 1 for a transactional id (the default), 0 for a group
    id. ``slot`` picks the pooled connection, so that requests that may wait long (a JoinGroup
    waits for the whole group) do not hold up others (heartbeats) to the same broker.
    """

    def __init__(
        self,
        cluster: Cluster,
        key: str,
        *,
        key_type: int = _TRANSACTION_KEY_TYPE,
        slot: int = COORDINATOR_SLOT,
    ) -> None:
        self.cluster = cluster
        self.key = key
        self.key_type = key_type
        self.slot = slot
        self._address: tuple[str, int] | None = None
        self.node_id = -1

    def __repr__(self) -> str:
        return f"CoordinatorClient({self.key!r}, coordinator={self.node_id})"

    def forget(self) -> None:
        """Look the coordinator up again before the next request."""
        self._address = None
        self.node_id = -1

    def _find(self) -> BrokerConnection:
        if self._address is None:
            cluster = self.cluster
            if not cluster.bootstrapped:
                cluster.refresh()  # BrokerUnreachableError at once if no broker answers
            response: FindCoordinatorResponse = cluster.any_connection_send(
                ApiKey.FIND_COORDINATOR,
                lambda version: FindCoordinatorRequest(key=self.key, key_type=self.key_type),
                0,
            )
            if response.error_code:
                cls = for_code(response.error_code) or CoordinatorNotAvailableError
                what = "group" if self.key_type == 0 else "transaction"
                raise cls(
                    f"finding the {what} coordinator of {self.key!r}: "
                    f"{response.error_message or cls()}"
                )
            self._address = (response.host, response.port)
            self.node_id = response.node_id
            log.debug("coordinator of %r is broker %d", self.key, self.node_id)
        return self.cluster.connection_to(*self._address, self.slot)

    def request(
        self, api_key: ApiKey, request: Any, *, what: str, deadline: float, wait_ms: int = 0
    ) -> Any:
        """Send ``request`` and return the response whatever its errors, except that a
        coordinator that moved, is not available or is still loading (NOT_COORDINATOR,
        COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, a broken connection) is found
        again and the request resent until ``deadline``. For APIs whose errors the caller reads
        itself (the group APIs: per member, per partition). ``wait_ms``: how long the
        coordinator may hold the request (a JoinGroup waits for the other members)."""
        config = self.cluster.config
        timeout_ms = config.request_timeout_ms + wait_ms

        def attempt() -> Any:
            try:
                response = self._find().send(api_key, 0, request, timeout_ms=timeout_ms)
            except _FIND_AGAIN:
                self.forget()
                raise
            error = for_code(int(getattr(response, "error_code", 0) or 0))
            if error is not None and issubclass(error, _COORDINATOR_MOVED):
                self.forget()
                raise error(f"{what}: {error()}")
            if error is CoordinatorLoadInProgressError:
                raise error(f"{what}: {error()}")
            return response

        return call_with_retries(
            what,
            attempt,
            RetryPolicy.of(config, None),
            retriable=self.cluster.retriable,
            deadline=deadline,
        )

    def with_slot(self, slot: int) -> CoordinatorClient:
        """A client of the same coordinator on another pooled connection."""
        return CoordinatorClient(self.cluster, self.key, key_type=self.key_type, slot=slot)

    def call(
        self,
        api_key: ApiKey,
        request: Any,
        *,
        what: str,
        deadline: float,
        state: CallState | None = None,
    ) -> Any:
        """Send ``request`` to the coordinator, retrying retriable errors until ``deadline``
        (time.monotonic()). Returns the response; raises the error (by class) otherwise.

        ``state`` (updated in place) says afterwards whether an attempt may have been carried
        out; pass the same one to calls that retry the same operation.
        """
        state = CallState() if state is None else state
        if state.attempts and state.last_error is not None and time.monotonic() >= deadline:
            raise state.last_error  # an earlier call ran into this deadline: no new attempt
        config = self.cluster.config
        timeout_ms = config.request_timeout_ms

        def attempt() -> Any:
            state.attempts += 1
            try:
                conn = self._find()
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                response = conn.send(
                    api_key, 0, request, timeout_ms=min(timeout_ms, max(remaining_ms, 1000))
                )
                code, message = response_error(response, config)
                if code:
                    cls = for_code(code) or ReplogError
                    raise cls(f"{what}: {message or cls()}")
            except ReplogError as err:
                state.last_error = err
                if isinstance(err, _MAYBE_DONE):
                    state.maybe_done = True
                if isinstance(err, _FIND_AGAIN):
                    self.forget()
                raise
            return response

        return call_with_retries(
            what,
            attempt,
            RetryPolicy.of(config, None),
            retriable=self.cluster.retriable,
            deadline=deadline,
        )
