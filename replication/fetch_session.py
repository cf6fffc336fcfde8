"""Incremental fetch sessions (KIP-227), leader and fetcher side, as pure logic.

A fetcher (a follower's replica fetcher, or a consumer) that fetches the same partitions from
the same broker over and over need not name all of them in every request, nor hear about all
of them in every response. The first request is *full*: it names every partition, and the
leader answers with every partition and, if it has a free slot, a new session id. Later
requests are *incremental*: they carry the session id and the next session epoch and name only
the partitions that are new or whose fetch state changed (plus the ones to forget); the leader
reads all of the session's partitions but answers only those with news (records, an error, a
diverging epoch, or a high watermark / log start offset / last stable offset different from the
one it last sent in this session). An unknown session id or an unexpected epoch is answered
with FETCH_SESSION_ID_NOT_FOUND or INVALID_FETCH_SESSION_EPOCH, and the fetcher falls back to a
full fetch.

This module follows Kafka's ``FetchSession.scala`` (the leader: :class:`FetchSessionCache`,
the :class:`FetchContext` kinds) and ``FetchSessionHandler.java`` with ``FetchMetadata.java``
(the fetcher: :class:`FetchSessionHandler`). It holds no sockets and no event loop: the broker
and the replica fetcher call it on their event loop, so it needs no locks.

Session epochs (as ``FetchMetadata``): a request with epoch :data:`INITIAL_EPOCH` (0) asks for
a full fetch that opens a session (closing the one it names, if any); :data:`FINAL_EPOCH` (-1)
asks for a full fetch without a session (closing the one it names); any other epoch is an
incremental fetch in the named session. A new session starts at epoch 1; each incremental
fetch moves it on by :func:`next_epoch`, which wraps from int32 max back to 1.

Example, a fetcher and a leader wired together in memory::

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
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol, TypeAlias, TypeVar

from replication.errors import (
    FetchSessionIdNotFoundError,
    InvalidFetchSessionEpochError,
    ReplogError,
)

__all__ = [
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "INVALID_SESSION_ID",
    "CachedPartition",
    "FetchContext",
    "FetchMetadata",
    "FetchRequestData",
    "FetchResponsePartitionLike",
    "FetchSession",
    "FetchSessionCache",
    "FetchSessionHandler",
    "FullFetchContext",
    "IncrementalFetchContext",
    "PartitionFetchState",
    "SessionErrorContext",
    "SessionlessFetchContext",
    "TopicPartition",
    "next_epoch",
]

log = logging.getLogger(__name__)

#: A partition as (topic, partition index).
TopicPartition: TypeAlias = tuple[str, int]

#: The session id of a fetch without a session (in requests and responses).
INVALID_SESSION_ID: Final = 0
#: The epoch of a full fetch that opens a new session (closing the one it names).
INITIAL_EPOCH: Final = 0
#: The epoch of a full fetch without a session (closing the one it names).
FINAL_EPOCH: Final = -1
#: Default ``min.incremental.fetch.session.eviction.ms``: a session unused this long is stale.
DEFAULT_EVICTION_MS: Final = 120_000

_INT32_MAX: Final = 2**31 - 1


def next_epoch(epoch: int) -> int:
    """The session epoch after ``epoch``: +1, wrapping from int32 max to 1; FINAL stays FINAL."""
    if epoch < 0:
        return FINAL_EPOCH
    if epoch == _INT32_MAX:
        return 1
    return epoch + 1


@dataclass(frozen=True, slots=True)
class FetchMetadata:
    """The (session id, epoch) a fetch request carries (Kafka's ``FetchMetadata``)."""

    session_id: int = INVALID_SESSION_ID
    epoch: int = INITIAL_EPOCH

    @property
    def is_full(self) -> bool:
        """True for a full fetch (epoch INITIAL or FINAL), which names every partition."""
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)

    @classmethod
    def new_incremental(cls, session_id: int) -> FetchMetadata:
        """The first incremental fetch of a session the leader just created."""
        return cls(session_id, next_epoch(INITIAL_EPOCH))

    def next_incremental(self) -> FetchMetadata:
        """The incremental fetch after this one, in the same session."""
        return FetchMetadata(self.session_id, next_epoch(self.epoch))

    def next_close_existing(self) -> FetchMetadata:
        """A full fetch that closes this session and opens none."""
        return FetchMetadata(self.session_id, FINAL_EPOCH)

    def next_close_existing_attempt_new(self) -> FetchMetadata:
        """A full fetch that closes this session and asks for a new one."""
        return FetchMetadata(self.session_id, INITIAL_EPOCH)


#: The metadata of a fetcher with no session: a full fetch asking for one.
INITIAL_METADATA: Final = FetchMetadata(INVALID_SESSION_ID, INITIAL_EPOCH)


@dataclass(frozen=True, slots=True)
class PartitionFetchState:
    """What a fetch request asks of one partition (Kafka's ``FetchRequest.PartitionData``).

    ``log_start_offset`` is the fetcher's own log start offset (a follower reports it; a
    consumer sends -1). Two states are equal when every field is: any change is sent.
    """

    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    log_start_offset: int = -1


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
        return (self.topic, self.partition)

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
