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

This module holds what both sides share, as Kafka's ``FetchMetadata.java``: session ids and
epochs, and the fetch state of one partition. The leader's side is
:mod:`replication.broker.fetch_session`, the fetcher's
:mod:`replication.broker.fetch_session_handler`.

Session epochs (as ``FetchMetadata``): a request with epoch :data:`INITIAL_EPOCH` (0) asks for
a full fetch that opens a session (closing the one it names, if any); :data:`FINAL_EPOCH` (-1)
asks for a full fetch without a session (closing the one it names); any other epoch is an
incremental fetch in the named session. A new session starts at epoch 1; each incremental
fetch moves it on by :func:`next_epoch`, which wraps from int32 max back to 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_EVICTION_MS",
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "INITIAL_METADATA",
    "INVALID_SESSION_ID",
    "FetchMetadata",
    "PartitionFetchState",
    "next_epoch",
]


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
