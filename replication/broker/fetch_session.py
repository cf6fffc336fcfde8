"""The leader's side of incremental fetch sessions (KIP-227), as Kafka's ``FetchSession.scala``:
the bounded :class:`FetchSessionCache` and the :class:`FetchContext` kinds that decide what a
fetch response names. Pure logic: the broker calls it on its event loop, so it needs no locks.
Session ids and epochs: :mod:`replication.broker.fetch_metadata`.

Example, a fetcher and a leader wired together in memory::

    >>> from replication.broker.fetch_session_handler import FetchSessionHandler
    >>> cache = FetchSessionCache(max_slots=10, time_ms=lambda: 0)
    >>> handler = FetchSessionHandler(node_id=1)
    >>> wanted = {("t", 0): PartitionFetchState(fetch_offset=0, max_bytes=1024)}
    >>> req = handler.build(wanted)
    >>> (req.is_full, req.session_epoch)
    (True, 0)
    >>> ctx = cache.new_context(req.session_id, req.session_epoch, req.to_send, req.to_forget,
    ...                         is_from_follower=True)
    >>> from replication.protocol import FetchResponsePartition
    >>> results = {tp: FetchResponsePartition(partition_index=tp[1]) for tp, _ in req.to_send}
    >>> sent = ctx.filter_response(results)
    >>> handler.handle_response(ctx.session_id, ctx.error_code, [tp for tp, _ in sent])
    True
    >>> req = handler.build(wanted)  # nothing changed: an incremental fetch naming nothing
    >>> (req.is_full, req.session_epoch, req.to_send)
    (False, 1, [])
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sized
from dataclasses import dataclass
from typing import Protocol, TypeVar

from replication.broker.fetch_metadata import (
    _INT32_MAX,
    DEFAULT_EVICTION_MS,
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    FetchMetadata,
    PartitionFetchState,
    next_epoch,
)
from replication.common import TopicPartition
from replication.errors import (
    FetchSessionIdNotFoundError,
    InvalidFetchSessionEpochError,
    ReplogError,
)

__all__ = [
    "CachedPartition",
    "FetchContext",
    "FetchResponsePartitionLike",
    "FetchSession",
    "FetchSessionCache",
    "FullFetchContext",
    "IncrementalFetchContext",
    "SessionErrorContext",
    "SessionlessFetchContext",
]

log = logging.getLogger(__name__)

# --- what the leader answers for one partition ----------------------------------------------


class _EpochEndOffsetLike(Protocol):
    @property
    def epoch(self) -> int: ...


class FetchResponsePartitionLike(Protocol):
    """The fields of :class:`replication.protocol.FetchResponsePartition` a session looks at."""

    @property
    def error_code(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def last_stable_offset(self) -> int: ...

    @property
    def log_start_offset(self) -> int: ...

    @property
    def diverging_epoch(self) -> _EpochEndOffsetLike: ...

    @property
    def preferred_read_replica(self) -> int: ...

    @property
    def records(self) -> Sized | None: ...


R = TypeVar("R", bound=FetchResponsePartitionLike)


# --- leader side: sessions and their cache ----------------------------------------------------


@dataclass(slots=True)
class CachedPartition:
    """One partition of a session: the fetch state last requested, the news last sent.

    The leader reads each partition with :attr:`state` (what the fetcher last asked for; an
    incremental request updates it only for the partitions it names), and compares its answer
    with ``high_watermark``, ``log_start_offset`` and ``last_stable_offset``, the values it last
    sent in this session, to tell whether the partition has news. -1 means "never sent", so a
    new partition is always answered.
    """

    topic: str
    partition: int
    state: PartitionFetchState
    #: The leader's high watermark last sent (-1 after an error, so the next answer resends it).
    high_watermark: int = -1
    #: The leader's log start offset last sent.
    log_start_offset: int = -1
    #: The leader's last stable offset last sent.
    last_stable_offset: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def fetch_offset(self) -> int:
        return self.state.fetch_offset

    @property
    def max_bytes(self) -> int:
        return self.state.max_bytes

    @property
    def current_leader_epoch(self) -> int:
        return self.state.current_leader_epoch

    @property
    def last_fetched_epoch(self) -> int:
        return self.state.last_fetched_epoch

    @property
    def fetcher_log_start_offset(self) -> int:
        """The fetcher's log start offset (not the leader's: that is :attr:`log_start_offset`)."""
        return self.state.log_start_offset

    def must_respond(self, resp: FetchResponsePartitionLike, *, update: bool) -> bool:
        """Whether ``resp`` has news for the fetcher; with ``update``, remember it as sent.

        News is records, an error, a diverging epoch, a preferred read replica, or a high
        watermark, log start offset or last stable offset different from the last one sent
        (Kafka's ``CachedPartition.maybeUpdateResponseData``, plus the last stable offset).
        """
        news = False
        records = resp.records
        if records is not None and len(records) > 0:
            news = True
        if self.high_watermark != resp.high_watermark:
            news = True
            if update:
                self.high_watermark = resp.high_watermark
        if self.log_start_offset != resp.log_start_offset:
            news = True
            if update:
                self.log_start_offset = resp.log_start_offset
        if self.last_stable_offset != resp.last_stable_offset:
            news = True
            if update:
                self.last_stable_offset = resp.last_stable_offset
        if resp.preferred_read_replica >= 0:
            news = True
        if resp.diverging_epoch.epoch >= 0:
            # The fetcher must truncate: always tell it.
            news = True
        if resp.error_code != 0:
            # Always answered; forget the high watermark so it is resent once the error clears.
            news = True
            if update:
                self.high_watermark = -1
        return news


@dataclass(eq=False, slots=True)
class FetchSession:
    """An incremental fetch session held by the leader (Kafka's ``FetchSession``).

    ``partitions`` keeps the session's order: a partition answered in an incremental response
    moves to the end, so that when responses are size-limited the others get their turn.
    ``epoch`` is the epoch the next request in this session must carry.
    """

    id: int
    #: Sessions of followers are privileged: they may evict consumers' sessions.
    privileged: bool
    partitions: dict[TopicPartition, CachedPartition]
    creation_ms: int
    last_used_ms: int
    epoch: int

    def __len__(self) -> int:
        return len(self.partitions)

    def fetch_offset(self, tp: TopicPartition) -> int | None:
        cached = self.partitions.get(tp)
        return None if cached is None else cached.fetch_offset

    def update(
        self,
        fetch_data: Mapping[TopicPartition, PartitionFetchState],
        to_forget: Iterable[TopicPartition],
    ) -> tuple[list[TopicPartition], list[TopicPartition], list[TopicPartition]]:
        """Apply an incremental request: add or update what it names, drop what it forgets.

        Returns the partitions (added, updated, removed).
        """
        added: list[TopicPartition] = []
        updated: list[TopicPartition] = []
        removed: list[TopicPartition] = []
        for tp, state in fetch_data.items():
            cached = self.partitions.get(tp)
            if cached is None:
                self.partitions[tp] = CachedPartition(tp[0], tp[1], state)
                added.append(tp)
            else:
                cached.state = state
                updated.append(tp)
        for tp in to_forget:
            if self.partitions.pop(tp, None) is not None:
                removed.append(tp)
        return added, updated, removed


class FetchContext:
    """How the leader serves one fetch request (Kafka's ``FetchContext``).

    The broker reads :meth:`partitions`, builds a result for each, passes them all to
    :meth:`filter_response`, and answers with what it returns, top-level :attr:`error_code`
    and :attr:`session_id` (read both after :meth:`filter_response`: a full fetch creates its
    session there, and an incremental one may find its session moved on meanwhile).
    """

    @property
    def session_id(self) -> int:
        """The session id to put in the response."""
        return INVALID_SESSION_ID

    @property
    def error(self) -> type[ReplogError] | None:
        """The top-level error of the response, or None."""
        return None

    @property
    def error_code(self) -> int:
        """The top-level error code of the response (0: none)."""
        error = self.error
        return 0 if error is None or error.code is None else error.code

    def partitions(self) -> list[tuple[str, int, PartitionFetchState]]:
        """The partitions to read for this fetch, as (topic, partition, fetch state)."""
        return []

    def fetch_offset(self, tp: TopicPartition) -> int | None:
        """The offset this fetch reads ``tp`` from, or None if it does not read it."""
        return None

    def filter_response(
        self, results: Mapping[TopicPartition, R]
    ) -> list[tuple[TopicPartition, R]]:
        """The partitions to include in the response, in order, from the results of all."""
        return []


class SessionErrorContext(FetchContext):
    """A fetch whose session is unknown or out of step: answer only the error, no partitions."""

    def __init__(self, error: type[ReplogError]) -> None:
        self._error = error

    @property
    def error(self) -> type[ReplogError] | None:
        return self._error

    def __repr__(self) -> str:
        return f"SessionErrorContext({self._error.__name__})"


class SessionlessFetchContext(FetchContext):
    """A full fetch without a session (epoch FINAL): read and answer every named partition."""

    def __init__(self, fetch_data: Mapping[TopicPartition, PartitionFetchState]) -> None:
        self._fetch_data = fetch_data

    def partitions(self) -> list[tuple[str, int, PartitionFetchState]]:
        return [(tp[0], tp[1], state) for tp, state in self._fetch_data.items()]

    def fetch_offset(self, tp: TopicPartition) -> int | None:
        state = self._fetch_data.get(tp)
        return None if state is None else state.fetch_offset

    def filter_response(
        self, results: Mapping[TopicPartition, R]
    ) -> list[tuple[TopicPartition, R]]:
        return list(results.items())

    def __repr__(self) -> str:
        return f"SessionlessFetchContext({len(self._fetch_data)} partition(s))"


class FullFetchContext(SessionlessFetchContext):
    """A full fetch (epoch INITIAL): answer every partition and try to open a session.

    The session is created by :meth:`filter_response`, holding the values it answers, so that
    the next incremental response can leave out what has not changed since. If the cache has
    no slot for it, :attr:`session_id` stays 0 and the fetcher keeps sending full fetches.
    """

    def __init__(
        self,
        cache: FetchSessionCache,
        fetch_data: Mapping[TopicPartition, PartitionFetchState],
        *,
        privileged: bool,
    ) -> None:
        super().__init__(fetch_data)
        self._cache = cache
        self._privileged = privileged
        self._session_id = INVALID_SESSION_ID
        self._answered = False

    @property
    def session_id(self) -> int:
        return self._session_id

    def filter_response(
        self, results: Mapping[TopicPartition, R]
    ) -> list[tuple[TopicPartition, R]]:
        if not self._answered:
            self._answered = True
            cached: dict[TopicPartition, CachedPartition] = {}
            for tp, state in self._fetch_data.items():
                part = CachedPartition(tp[0], tp[1], state)
                resp = results.get(tp)
                if resp is not None:
                    part.must_respond(resp, update=True)
                cached[tp] = part
            self._session_id = self._cache.maybe_create_session(self._privileged, cached)
        return list(results.items())

    def __repr__(self) -> str:
        return (
            f"FullFetchContext({len(self._fetch_data)} partition(s), "
            f"privileged={self._privileged}, session_id={self._session_id})"
        )


class IncrementalFetchContext(FetchContext):
    """An incremental fetch: read all of the session's partitions, answer those with news."""

    def __init__(self, session: FetchSession, request_epoch: int) -> None:
        self._session = session
        self._request_epoch = request_epoch
        self._error: type[ReplogError] | None = None

    @property
    def session(self) -> FetchSession:
        return self._session

    @property
    def session_id(self) -> int:
        return self._session.id

    @property
    def error(self) -> type[ReplogError] | None:
        return self._error

    def partitions(self) -> list[tuple[str, int, PartitionFetchState]]:
        return [(c.topic, c.partition, c.state) for c in self._session.partitions.values()]

    def fetch_offset(self, tp: TopicPartition) -> int | None:
        return self._session.fetch_offset(tp)

    def filter_response(
        self, results: Mapping[TopicPartition, R]
    ) -> list[tuple[TopicPartition, R]]:
        session = self._session
        expected = next_epoch(self._request_epoch)
        if session.epoch != expected:
            # Another request of this session was served meanwhile (a duplicate or a retry):
            # this response would disagree with what the session now remembers as sent.
            log.info(
                "Incremental fetch session %d expected epoch %d, but got %d. "
                "Possible duplicate request.",
                session.id,
                expected,
                session.epoch,
            )
            self._error = InvalidFetchSessionEpochError
            return []
        partitions = session.partitions
        included: list[tuple[TopicPartition, R]] = []
        for tp, resp in results.items():
            cached = partitions.get(tp)
            if cached is None:
                raise ValueError(
                    f"partition {tp[0]}-{tp[1]} is not in fetch session {session.id}; "
                    "answer only the partitions the context named"
                )
            if cached.must_respond(resp, update=True):
                included.append((tp, resp))
                # Move it to the end, so the partitions it did not answer come first next time.
                partitions[tp] = partitions.pop(tp)
        return included

    def __repr__(self) -> str:
        return (
            f"IncrementalFetchContext(session_id={self._session.id}, "
            f"epoch={self._request_epoch}, {len(self._session)} partition(s))"
        )


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class FetchSessionCache:
    """The leader's bounded cache of incremental fetch sessions (Kafka's ``FetchSessionCache``).

    ``max_slots`` is ``max.incremental.fetch.session.cache.slots``; ``eviction_ms`` is
    ``min.incremental.fetch.session.eviction.ms``. When a full fetch wants a session and every
    slot is taken, the new session may evict (see :meth:`try_evict`):

    1. the least recently used session, if it is stale (unused for more than eviction_ms);
    2. otherwise the least valuable evictable session, if the new one is worth more. Sessions
       rank by (privileged, partition count, id): a follower's (privileged) session outranks
       any consumer's, and between two of the same kind, more partitions win. A privileged new
       session may evict any unprivileged session, or a privileged one created more than
       eviction_ms ago; an unprivileged one only an unprivileged session created more than
       eviction_ms ago (so a consumer's new session is not evicted before it is used).

    Example::

        >>> cache = FetchSessionCache(max_slots=1, time_ms=lambda: 0)
        >>> full = cache.new_context(0, INITIAL_EPOCH, [], [], is_from_follower=True)
        >>> _ = full.filter_response({})
        >>> (len(cache), cache.get(full.session_id).epoch)
        (1, 1)
    """

    def __init__(
        self,
        max_slots: int,
        eviction_ms: int = DEFAULT_EVICTION_MS,
        time_ms: Callable[[], int] = _monotonic_ms,
        rng: random.Random | None = None,
    ) -> None:
        if max_slots < 0:
            raise ValueError(f"max_slots must be at least 0, not {max_slots}")
        if eviction_ms < 0:
            raise ValueError(f"eviction_ms must be at least 0, not {eviction_ms}")
        self.max_slots = max_slots
        self.eviction_ms = eviction_ms
        self._time_ms = time_ms
        self._rng = rng if rng is not None else random.Random()
        self._sessions: dict[int, FetchSession] = {}
        #: Sessions evicted to make room for new ones (a metric).
        self.evictions = 0

    def __len__(self) -> int:
        """The number of sessions (Kafka's NumIncrementalFetchSessions)."""
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    @property
    def total_partitions(self) -> int:
        """Partitions over all sessions (Kafka's NumIncrementalFetchPartitionsCached)."""
        return sum(len(s.partitions) for s in self._sessions.values())

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def new_context(
        self,
        session_id: int,
        session_epoch: int,
        fetch_partitions: Iterable[tuple[TopicPartition, PartitionFetchState]],
        forgotten: Iterable[TopicPartition] = (),
        *,
        privileged: bool | None = None,
        is_from_follower: bool = False,
    ) -> FetchContext:
        """The context that serves a fetch request (Kafka's ``FetchManager.newContext``).

        ``fetch_partitions`` are the request's partitions (all of them for a full fetch, the
        changed ones for an incremental fetch); ``forgotten`` its forgotten partitions. A
        session opened here is privileged if ``privileged`` says so, by default if the fetch
        comes from a follower.
        """
        fetch_data = dict(fetch_partitions)
        metadata = FetchMetadata(session_id, session_epoch)
        if metadata.is_full:
            if session_id != INVALID_SESSION_ID and self.remove(session_id) is not None:
                log.debug("Full fetch closed fetch session %d", session_id)
            if session_epoch == FINAL_EPOCH:
                return SessionlessFetchContext(fetch_data)
            if privileged is None:
                privileged = is_from_follower
            return FullFetchContext(self, fetch_data, privileged=privileged)

        session = self._sessions.get(session_id)
        if session is None:
            log.debug("Fetch session error for %d: no such session id", session_id)
            return SessionErrorContext(FetchSessionIdNotFoundError)
        if session.epoch != session_epoch:
            log.debug(
                "Fetch session error for %d: expected epoch %d, got %d",
                session_id,
                session.epoch,
                session_epoch,
            )
            return SessionErrorContext(InvalidFetchSessionEpochError)
        added, updated, removed = session.update(fetch_data, forgotten)
        if not session.partitions:
            log.debug(
                "Closing fetch session %d at epoch %d: no partitions left after removing %d",
                session.id,
                session.epoch,
                len(removed),
            )
            self.remove(session.id)
            return SessionlessFetchContext(fetch_data)
        self.touch(session, self._time_ms())
        session.epoch = next_epoch(session.epoch)
        log.debug(
            "Incremental fetch in session %d, epoch %d: added %d, updated %d, removed %d "
            "partition(s)",
            session.id,
            session_epoch,
            len(added),
            len(updated),
            len(removed),
        )
        return IncrementalFetchContext(session, session_epoch)

    def maybe_create_session(
        self, privileged: bool, partitions: dict[TopicPartition, CachedPartition]
    ) -> int:
        """Open a session on ``partitions`` if a slot can be had; its id, else 0."""
        now = self._time_ms()
        if len(self._sessions) < self.max_slots or self.try_evict(privileged, len(partitions), now):
            session = FetchSession(
                id=self.new_session_id(),
                privileged=privileged,
                partitions=partitions,
                creation_ms=now,
                last_used_ms=now,
                epoch=next_epoch(INITIAL_EPOCH),
            )
            self._sessions[session.id] = session
            log.debug(
                "Created fetch session %d (privileged=%s, %d partition(s))",
                session.id,
                privileged,
                len(partitions),
            )
            return session.id
        log.debug(
            "No fetch session created for privileged=%s, %d partition(s): the cache is full",
            privileged,
            len(partitions),
        )
        return INVALID_SESSION_ID

    def new_session_id(self) -> int:
        """A random positive session id not in use."""
        while True:
            session_id = self._rng.randrange(1, _INT32_MAX)
            if session_id not in self._sessions:
                return session_id

    def try_evict(self, privileged: bool, size: int, now: int) -> bool:
        """Evict one session to make room for a new one of ``size`` partitions; True if done."""
        if not self._sessions:
            return False
        lru = min(self._sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now - lru.last_used_ms > self.eviction_ms:
            log.debug("Evicting stale fetch session %d", lru.id)
            self._evict(lru)
            return True
        evictable = [s for s in self._sessions.values() if self._evictable(s, privileged, now)]
        if not evictable:
            return False
        victim = min(evictable, key=lambda s: (s.privileged, len(s.partitions), s.id))
        # A new session ranks as (privileged, size, 0): it must not rank below the victim.
        if (privileged, size, 0) < (victim.privileged, len(victim.partitions), victim.id):
            return False
        log.debug(
            "Evicting fetch session %d (privileged=%s, %d partition(s)) for a new one "
            "(privileged=%s, %d partition(s))",
            victim.id,
            victim.privileged,
            len(victim.partitions),
            privileged,
            size,
        )
        self._evict(victim)
        return True

    def _evictable(self, session: FetchSession, privileged: bool, now: int) -> bool:
        established = now - session.creation_ms > self.eviction_ms
        if privileged:
            return established or not session.privileged
        return established

    def _evict(self, session: FetchSession) -> None:
        self.remove(session.id)
        self.evictions += 1

    def remove(self, session_id: int) -> FetchSession | None:
        """Close a session; the removed session, or None if there was none."""
        return self._sessions.pop(session_id, None)

    def touch(self, session: FetchSession, now: int) -> None:
        """Mark a session used at ``now``."""
        session.last_used_ms = now

    def __repr__(self) -> str:
        return (
            f"FetchSessionCache({len(self._sessions)}/{self.max_slots} session(s), "
            f"eviction_ms={self.eviction_ms})"
        )
