"""Kafka's embedded consumer protocol: what consumers put in JoinGroup's protocol metadata
(``ConsumerProtocolSubscription``) and in SyncGroup's assignments
(``ConsumerProtocolAssignment``). Each is an int16 version followed by the body at that version,
so replog's consumers and Kafka's read each other's. A body written by a newer version is read
at the newest version known here, its extra trailing fields ignored (as Kafka does).
"""

from __future__ import annotations

import struct
from dataclasses import field
from typing import Final, TypeVar

from replication.errors import CorruptFrameError
from replication.protocol.codec import (
    INT32,
    NULLABLE_BYTES,
    NULLABLE_STRING,
    STRING,
    Array,
    Bytes,
    _codec,
    _view,
    array_field,
    encode_message,
    message,
    wire,
)

#: the newest versions known here (Kafka 3.x: subscription v3 adds rack_id)
SUBSCRIPTION_VERSION: Final = 3
ASSIGNMENT_VERSION: Final = 3
_VERSION = struct.Struct(">h")


@message
class ConsumerProtocolTopicPartitions:
    topic: str = field(metadata=wire(STRING))
    partitions: list[int] = array_field(INT32)


@message
class ConsumerProtocolSubscription:
    topics: list[str] = array_field(STRING)
    user_data: bytes | None = field(default=None, metadata=wire(NULLABLE_BYTES))
    #: what the member owns now (cooperative rebalancing)
    owned_partitions: list[ConsumerProtocolTopicPartitions] = field(
        default_factory=list,
        metadata=wire(Array(ConsumerProtocolTopicPartitions), since=1, ignorable=True),
    )
    generation_id: int = field(default=-1, metadata=wire(INT32, since=2, ignorable=True))
    rack_id: str | None = field(
        default=None, metadata=wire(NULLABLE_STRING, since=3, ignorable=True)
    )


@message
class ConsumerProtocolAssignment:
    assigned_partitions: list[ConsumerProtocolTopicPartitions] = array_field(
        ConsumerProtocolTopicPartitions
    )
    user_data: bytes | None = field(default=None, metadata=wire(NULLABLE_BYTES))


_T = TypeVar("_T")


def encode_embedded(body: object, version: int) -> bytes:
    """``version`` (int16) and ``body`` at that version."""
    return _VERSION.pack(version) + encode_message(body, version)


def decode_embedded(cls: type[_T], newest: int, data: Bytes) -> tuple[int, _T]:
    """(version, body) of an embedded consumer protocol value; CorruptFrameError if broken."""
    buf = _view(data)
    if len(buf) < _VERSION.size:
        raise CorruptFrameError(f"{cls.__name__}: {len(buf)} bytes, too short for a version")
    (version,) = _VERSION.unpack_from(buf, 0)
    if version < 0:
        raise CorruptFrameError(f"{cls.__name__}: negative version {version}")
    try:
        value, _end = _codec(cls, min(version, newest)).decode(buf, _VERSION.size)
    except (struct.error, IndexError, ValueError, OverflowError) as err:
        raise CorruptFrameError(f"corrupt {cls.__name__} v{version}: {err}") from err
    return version, value  # trailing bytes of a newer version are its newer fields


__all__ = [
    "ASSIGNMENT_VERSION",
    "SUBSCRIPTION_VERSION",
    "ConsumerProtocolAssignment",
    "ConsumerProtocolSubscription",
    "ConsumerProtocolTopicPartitions",
    "decode_embedded",
    "encode_embedded",
]
