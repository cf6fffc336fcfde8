"""The fetcher's side of an incremental fetch session (KIP-227), as Kafka's
``FetchSessionHandler.java``: which partitions the next request names, and whether a response
kept the session. Used by the replica fetchers; pure logic, no sockets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from replication.broker.fetch_metadata import (
    INITIAL_METADATA,
    INVALID_SESSION_ID,
    FetchMetadata,
    PartitionFetchState,
)
from replication.common import TopicPartition
from replication.errors import FetchSessionIdNotFoundError

__all__ = ["FetchRequestData", "FetchSessionHandler"]

log = logging.getLogger(__name__)

# --- fetcher side -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchRequestData:
    """What the next fetch request carries (Kafka's ``FetchSessionHandler.FetchRequestData``).

    ``to_send`` are the partitions to name (all of them in a full fetch; the new and changed
    ones, new first, in an incremental one); ``to_forget`` the ones to drop from the session;
    ``session_partitions`` every partition the fetch covers, named or implied.
    """

    session_id: int
    session_epoch: int
    to_send: list[tuple[TopicPartition, PartitionFetchState]]
    to_forget: list[TopicPartition]
    is_full: bool
    session_partitions: dict[TopicPartition, PartitionFetchState] = field(repr=False)


class _Problem(NamedTuple):
    omitted: list[TopicPartition]
    extra: list[TopicPartition]

    def __str__(self) -> str:
        parts = []
        if self.omitted:
            parts.append(f"omitted {_tps(self.omitted)}")
        if self.extra:
            parts.append(f"extra {_tps(self.extra)}")
        return ", ".join(parts)


def _tps(tps: list[TopicPartition], limit: int = 10) -> str:
    shown = ", ".join(f"{t}-{p}" for t, p in tps[:limit])
    more = f" and {len(tps) - limit} more" if len(tps) > limit else ""
    return f"({shown}{more})"


class FetchSessionHandler:
    """A fetcher's side of its fetch session with one broker (Kafka's ``FetchSessionHandler``).

    Call :meth:`build` with every partition to fetch before each request, then exactly one of
    :meth:`handle_response` (a response arrived) or :meth:`handle_error` (the request or its
    response was lost).

    Example::

        >>> handler = FetchSessionHandler(node_id=2)
        >>> state = PartitionFetchState(fetch_offset=0, max_bytes=1 << 20)
        >>> handler.build({("t", 0): state}).is_full
        True
        >>> handler.handle_response(1234, 0, [("t", 0)])  # the leader opened session 1234
        True
        >>> req = handler.build({("t", 0): state, ("t", 1): state})
        >>> (req.session_id, req.session_epoch, [tp for tp, _ in req.to_send])
        (1234, 1, [('t', 1)])
    """

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        #: The session id and epoch of the next request.
        self.next_metadata: FetchMetadata = INITIAL_METADATA
        self._session_partitions: dict[TopicPartition, PartitionFetchState] = {}

    @property
    def session_id(self) -> int:
        return self.next_metadata.session_id

    @property
    def session_epoch(self) -> int:
        return self.next_metadata.epoch

    @property
    def session_partitions(self) -> Mapping[TopicPartition, PartitionFetchState]:
        """Every partition in the session as last sent."""
        return self._session_partitions

    def build(
        self, next_partitions: Mapping[TopicPartition, PartitionFetchState]
    ) -> FetchRequestData:
        """The next request, for ``next_partitions`` (every partition to fetch, in order)."""
        metadata = self.next_metadata
        if metadata.is_full:
            self._session_partitions = dict(next_partitions)
            to_send = list(self._session_partitions.items())
            log.debug(
                "Built full fetch %s for node %d with %d partition(s)",
                metadata,
                self.node_id,
                len(to_send),
            )
            return FetchRequestData(
                session_id=metadata.session_id,
                session_epoch=metadata.epoch,
                to_send=to_send,
                to_forget=[],
                is_full=True,
                session_partitions=dict(self._session_partitions),
            )

        session = self._session_partitions
        altered: list[tuple[TopicPartition, PartitionFetchState]] = []
        removed: list[TopicPartition] = []
        for tp, prev in list(session.items()):
            state = next_partitions.get(tp)
            if state is None:
                del session[tp]
                removed.append(tp)
            elif state != prev:
                session[tp] = state
                altered.append((tp, state))
        added: list[tuple[TopicPartition, PartitionFetchState]] = []
        for tp, state in next_partitions.items():
            if tp not in session:
                session[tp] = state
                added.append((tp, state))
        log.debug(
            "Built incremental fetch %s for node %d: added %d, altered %d, removed %d out of %d",
            metadata,
            self.node_id,
            len(added),
            len(altered),
            len(removed),
            len(session),
        )
        return FetchRequestData(
            session_id=metadata.session_id,
            session_epoch=metadata.epoch,
            to_send=added + altered,
            to_forget=removed,
            is_full=False,
            session_partitions=dict(session),
        )

    def handle_response(
        self,
        response_session_id: int,
        top_level_error_code: int,
        responded_partitions: Iterable[TopicPartition],
        *,
        throttle_time_ms: int = 0,
    ) -> bool:
        """Take in a response to the last :meth:`build`; False if it cannot be used.

        A top-level error resets the session (FETCH_SESSION_ID_NOT_FOUND: forget it; any
        other: close it and ask for a new one): the next request is a full fetch. A full
        response must name exactly the session's partitions; an incremental one only
        partitions of the session.
        """
        metadata = self.next_metadata
        if top_level_error_code != 0:
            log.info(
                "Node %d was unable to process the fetch request with %s: error %d",
                self.node_id,
                metadata,
                top_level_error_code,
            )
            if top_level_error_code == FetchSessionIdNotFoundError.code:
                self.next_metadata = INITIAL_METADATA
            else:
                self.next_metadata = metadata.next_close_existing_attempt_new()
            return False

        responded = list(responded_partitions)
        if metadata.is_full:
            if not responded and throttle_time_ms > 0:
                # KIP-219: an empty full response only says "you are throttled".
                self.next_metadata = INITIAL_METADATA
                return False
            problem = self._verify(responded, full=True)
            if problem is not None:
                log.info("Node %d sent an invalid full fetch response: %s", self.node_id, problem)
                self.next_metadata = INITIAL_METADATA
                return False
            if response_session_id == INVALID_SESSION_ID:
                self.next_metadata = INITIAL_METADATA
            else:
                log.debug(
                    "Node %d created fetch session %d with %d partition(s)",
                    self.node_id,
                    response_session_id,
                    len(responded),
                )
                self.next_metadata = FetchMetadata.new_incremental(response_session_id)
            return True

        problem = self._verify(responded, full=False)
        if problem is not None:
            log.info(
                "Node %d sent an invalid incremental fetch response: %s", self.node_id, problem
            )
            self.next_metadata = metadata.next_close_existing_attempt_new()
            return False
        if response_session_id == INVALID_SESSION_ID:
            # The leader closed the session (e.g. every partition was forgotten).
            self.next_metadata = INITIAL_METADATA
        else:
            self.next_metadata = metadata.next_incremental()
        return True

    def handle_error(self, error: BaseException | None = None) -> None:
        """The request failed or its response was lost: the next fetch is full.

        As Kafka, the next request names the old session with epoch INITIAL, which closes it on
        the leader and asks for a new one.
        """
        log.info(
            "Error sending fetch request %s to node %d: %r", self.next_metadata, self.node_id, error
        )
        self.next_metadata = self.next_metadata.next_close_existing_attempt_new()

    def notify_close(self) -> None:
        """Close the session with the next request (a full fetch with epoch FINAL)."""
        self.next_metadata = self.next_metadata.next_close_existing()

    def _verify(self, responded: list[TopicPartition], *, full: bool) -> _Problem | None:
        session = self._session_partitions
        extra = [tp for tp in responded if tp not in session]
        omitted: list[TopicPartition] = []
        if full:
            seen = set(responded)
            omitted = [tp for tp in session if tp not in seen]
        if extra or omitted:
            return _Problem(omitted, extra)
        return None

    def __repr__(self) -> str:
        return (
            f"FetchSessionHandler(node_id={self.node_id}, {self.next_metadata}, "
            f"{len(self._session_partitions)} partition(s))"
        )
