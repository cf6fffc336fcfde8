"""Kafka's embedded consumer protocol (subscriptions and assignments inside JoinGroup and
SyncGroup), byte for byte as Kafka's ConsumerProtocol writes it."""

from __future__ import annotations

import struct

import pytest

from replication.errors import CorruptFrameError
from replication.protocol.consumer import (
    ASSIGNMENT_VERSION,
    SUBSCRIPTION_VERSION,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    ConsumerProtocolTopicPartitions,
    decode_embedded,
    encode_embedded,
)

pytestmark = pytest.mark.unit


def kafka_string(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def test_an_assignment_reads_as_kafka_wrote_it() -> None:
    # ConsumerProtocolAssignment v0: version, [topic, [partition]], user_data (null)
    data = (
        struct.pack(">hi", 0, 1)
        + kafka_string("events")
        + struct.pack(">iii", 2, 0, 3)
        + struct.pack(">i", -1)
    )
    version, assignment = decode_embedded(ConsumerProtocolAssignment, ASSIGNMENT_VERSION, data)
    assert version == 0
    assert assignment.assigned_partitions == [
        ConsumerProtocolTopicPartitions(topic="events", partitions=[0, 3])
    ]
    assert encode_embedded(assignment, 0) == data


def test_a_subscription_round_trips_at_every_version_and_newer_fields_are_skipped() -> None:
    full = ConsumerProtocolSubscription(
        topics=["a", "b"],
        user_data=b"u",
        owned_partitions=[ConsumerProtocolTopicPartitions(topic="a", partitions=[1])],
        generation_id=7,
        rack_id="r1",
    )
    for version in range(SUBSCRIPTION_VERSION + 1):
        data = encode_embedded(full, version)
        got_version, got = decode_embedded(
            ConsumerProtocolSubscription, SUBSCRIPTION_VERSION, data
        )
        assert got_version == version
        assert got.topics == ["a", "b"]
        assert got.owned_partitions == (full.owned_partitions if version >= 1 else [])
        assert got.generation_id == (7 if version >= 2 else -1)
    # a newer Kafka's v4 (some field appended): read as v3, the new bytes ignored
    v4 = struct.pack(">h", 4) + encode_embedded(full, 3)[2:] + b"\x00\x01newer"
    version, got = decode_embedded(ConsumerProtocolSubscription, SUBSCRIPTION_VERSION, v4)
    assert (version, got.rack_id) == (4, "r1")


@pytest.mark.parametrize("data", [b"", b"\x00", b"\xff\xff", b"\x00\x00\x00\x00\x00\x05ab"])
def test_broken_bytes_are_a_corrupt_frame_error(data: bytes) -> None:
    with pytest.raises(CorruptFrameError):
        decode_embedded(ConsumerProtocolAssignment, ASSIGNMENT_VERSION, data)
