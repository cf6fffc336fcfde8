"""The one error tree of replog.

Every error a user or a peer can cause is a :class:`ReplogError`. Class attributes drive
behaviour, as in aiokafka's errors: ``retriable`` (the same request may succeed later) and
``refresh_metadata`` (the client's view of leaders is stale). Classes that travel on the wire
carry a Kafka error code; the table from code to class lives beside the wire errors, in
:mod:`replication.errors` (``for_code``), built from every coded class of both modules.

Subclasses inherit from a builtin where the meaning matches (``FileNotFoundError``,
``FileExistsError``, ``ValueError``), so callers that only know the builtin still work.
"""

from __future__ import annotations

from typing import ClassVar


class ReplogError(Exception):
    """Base of every replog error. Raised with no message, the class docstring (what happened,
    then what to do) is the message."""

    #: Kafka's wire error code; None for errors that never travel on the wire.
    code: ClassVar[int | None] = None
    retriable: ClassVar[bool] = False
    refresh_metadata: ClassVar[bool] = False

    def __init__(self, *args: object) -> None:
        if not args:
            doc = type(self).__doc__
            args = (" ".join(doc.split()) if doc else type(self).__name__,)
        super().__init__(*args)


class UnknownServerError(ReplogError):
    """The peer failed in a way it could not name (Kafka's UNKNOWN_SERVER_ERROR, -1)."""

    code = -1


# --- log and storage errors -------------------------------------------------------------------


class OffsetOutOfRangeError(ReplogError):
    """The requested offset is outside [log start offset, log end offset]."""

    code = 1


class CorruptRecordError(ReplogError):
    """A record batch failed validation (CRC, length, magic, or a malformed header)."""

    code = 2


class RecordTooLargeError(ReplogError, ValueError):
    """A record batch is larger than the topic's max.message.bytes."""

    code = 10


class InvalidRecordError(ReplogError, ValueError):
    """A record batch is well formed but not acceptable here (e.g. offsets out of order)."""

    code = 87


class KafkaStorageError(ReplogError):
    """The replica's storage failed; the request may succeed on another replica or later."""

    code: ClassVar[int | None] = 56
    retriable = True


class LogLayoutError(KafkaStorageError):
    """A partition directory is not what the opener expects: another topic id's log (a topic
    deleted and re-created under the same name), or a log over the broker WAL opened without
    it (``log.wal.enable`` turned off after data was written through the WAL)."""

    retriable = False


class StorageError(KafkaStorageError):
    """A storage backend (local files, S3, memory) failed an operation."""

    code = None


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The storage object does not exist."""

    retriable = False


class ObjectExistsError(StorageError, FileExistsError):
    """A put-if-absent found the object already there (someone else won the race)."""

    retriable = False


class ConfigError(ReplogError, ValueError):
    """A configuration key is unknown or its value is not allowed."""

    code = 40  # INVALID_CONFIG
