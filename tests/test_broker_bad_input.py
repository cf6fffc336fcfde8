"""A broker under bad input: malformed frames, bad requests, bad batches, and a frame fuzzer.

The contract (DESIGN "Errors"): a malformed frame, an unknown API key or version, or a frame over
``socket.request.max.bytes`` gets an error response or closes that connection, and every other
client keeps being served; a corrupt batch is never appended nor served; no acked record is
lost. Every test runs against real broker processes on 127.0.0.1 and speaks raw frames
(tests/wire.py), so nothing in a client library hides what the broker does.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import random
import socket
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import google_crc32c
import pytest

from logstore.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    MAGIC_OFFSET,
    Record,
    build,
)
from replication import protocol as p
from tests.cluster import BrokerProcess
from tests.helpers import unique_name, wait_until
from tests.wire import RawConnection, create_topic, produce, read_records, register_broker

pytestmark = pytest.mark.cluster

NONE = 0
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
RECORD_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUIRED_ACKS = 21
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_CONFIG = 40
INVALID_RECORD = 87

_I32 = struct.Struct(">i")


# --- helpers --------------------------------------------------------------------------------------


def _frame(api_key: int, version: int, body: bytes, correlation_id: int = 1) -> bytes:
    """A request frame with any header values (the wire helpers refuse unknown versions)."""
    header = p.RequestHeader(
        api_key=api_key, api_version=version, correlation_id=correlation_id, client_id="bad-input"
    )
    payload = p.encode_message(header, 0) + body
    return _I32.pack(len(payload)) + payload


def _api_versions_frame(correlation_id: int) -> bytes:
    return _frame(p.ApiKey.API_VERSIONS, 0, b"", correlation_id)


class Ledger:
    """The records a topic's partition 0 must hold: exactly the acked ones, in offset order."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.acked: list[tuple[bytes, bytes]] = []

    def produce(self, conn: RawConnection, count: int = 2, value_size: int = 16) -> None:
        """Produce ``count`` records with acks=all; they must be acked at the log end."""
        n = len(self.acked)
        records = [
            (f"k{n + i}".encode(), f"v{n + i}-".encode().ljust(value_size, b"x"))
            for i in range(count)
        ]
        batch = build([Record(key=k, value=v, timestamp=1_700_000_000_000) for k, v in records])
        part = _partition_response(produce(conn, self.topic, 0, batch))
        assert (part.error_code, part.error_message) == (NONE, None)
        assert part.base_offset == n, f"acked at {part.base_offset}, the log ended at {n}"
        self.acked.extend(records)

    def check(self, conn: RawConnection) -> None:
        """The partition holds exactly the acked records at their offsets, all CRC-valid."""
        expected = [(offset, k, v) for offset, (k, v) in enumerate(self.acked)]
        assert _read_all(conn, self.topic) == expected


def _partition_response(response: Any) -> p.ProduceResponsePartition:
    [topic] = response.responses
    [part] = topic.partition_responses
    return part  # type: ignore[no-any-return]


def _read_all(conn: RawConnection, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record below the high watermark of partition 0, its batches' CRCs checked."""
    return [(r.offset, r.key, r.value) for r in read_records(conn, topic)]


def _topic_error(conn: RawConnection, name: str) -> int:
    response = conn.request(
        p.ApiKey.METADATA, p.MetadataRequest(topics=[p.MetadataRequestTopic(name=name)])
    )
    [topic] = response.topics
    return topic.error_code  # type: ignore[no-any-return]


def _logged(broker: BrokerProcess, text: str) -> None:
    wait_until(
        lambda: text in broker.stderr_path.read_text(),
        timeout=10,
        message=f"the broker to log {text!r}",
    )


# --- bad frames close that connection and nothing else --------------------------------------------

_PRODUCE_V0_BODY = p.encode_message(p.ProduceRequest(acks=1, topic_data=[]), 0)

BAD_FRAMES: dict[str, tuple[bytes, str]] = {
    # Metadata v0 whose topic array claims 2**31-1 elements in 4 bytes
    "garbage body": (_frame(p.ApiKey.METADATA, 0, b"\x7f\xff\xff\xff"), "claims 2147483647"),
    "garbage after a valid body": (
        _frame(p.ApiKey.API_VERSIONS, 1, b"\x00\x00\x00\x00\xde\xad\xbe\xef"),
        "4 trailing bytes after the body",
    ),
    "truncated header": (
        _I32.pack(5) + b"\x00\x03\x00\x00\x00",
        "5 bytes, too short for a request header",
    ),
    "header cut inside client_id": (
        _I32.pack(10) + struct.pack(">hhih", 3, 0, 1, 50),
        "needs 50 bytes at offset 10",
    ),
    "negative length prefix": (_I32.pack(-1) + b"\x00" * 16, "frame length -1 is negative"),
    "unknown api key": (_frame(999, 0, b""), "unknown API key 999"),
    "unknown produce version": (
        _frame(p.ApiKey.PRODUCE, 7, _PRODUCE_V0_BODY),
        "PRODUCE version 7 is not supported",
    ),
    "api the broker does not serve": (
        _frame(
            p.ApiKey.LEADER_AND_ISR,
            0,
            p.encode_message(
                p.LeaderAndIsrRequest(controller_id=4242, controller_epoch=1, broker_epoch=1), 0
            ),
        ),
        "LEADER_AND_ISR is not served by this broker",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FRAMES))
def test_bad_frame_closes_only_that_connection(broker: BrokerProcess, case: str) -> None:
    frame, logged = BAD_FRAMES[case]
    ledger = Ledger(unique_name("bad-frame"))
    with RawConnection(broker.bootstrap) as good, RawConnection(broker.bootstrap) as bad:
        create_topic(good, ledger.topic)
        ledger.produce(good)
        # a request pipelined before the bad frame is answered; then the connection closes
        bad.send_raw(_api_versions_frame(41) + frame)
        correlation_id, versions = p.decode_response(bad.recv_frame(), p.ApiKey.API_VERSIONS, 0)
        assert (correlation_id, versions.error_code) == (41, NONE)
        assert bad.is_closed_by_peer(), "the broker answered a bad frame instead of closing"
        _logged(broker, logged)
        assert broker.alive
        ledger.produce(good)
        ledger.check(good)
    with RawConnection(broker.bootstrap) as fresh:
        ledger.produce(fresh)
        ledger.check(fresh)


def test_frame_over_socket_request_max_bytes_closes_only_that_connection(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    # 2048, not 1024: the smallest record batch is 1,029 bytes (its Arrow IPC schema), so a
    # 1024-byte limit would refuse every produce of the connection that must keep producing
    limit = 2048
    broker = broker_factory(overrides={"socket.request.max.bytes": str(limit)})
    ledger = Ledger("limited")
    with RawConnection(broker.bootstrap) as good:
        create_topic(good, ledger.topic)
        ledger.produce(good)
        # a frame of exactly the limit is served (ApiVersions v1 padded with its client name)
        with RawConnection(broker.bootstrap) as at_limit:
            empty = p.encode_message(p.ApiVersionsRequest(), 1)
            header_size = len(_frame(p.ApiKey.API_VERSIONS, 1, empty)) - 4 - len(empty)
            name = "n" * (limit - header_size - len(empty))
            body = p.encode_message(p.ApiVersionsRequest(client_software_name=name), 1)
            frame = _frame(p.ApiKey.API_VERSIONS, 1, body, correlation_id=5)
            assert len(frame) - 4 == limit
            at_limit.send_raw(frame)
            correlation_id, response = p.decode_response(
                at_limit.recv_frame(), p.ApiKey.API_VERSIONS, 1
            )
            assert (correlation_id, response.error_code) == (5, NONE)
        # one byte more is refused from its length prefix alone
        with RawConnection(broker.bootstrap) as over:
            over.send_raw(_I32.pack(limit + 1) + b"\x00" * (limit + 1))
            assert over.is_closed_by_peer()
        _logged(broker, f"frame of {limit + 1} bytes exceeds the limit of {limit} bytes")
        # a huge prefix (an HTTP client, say) is refused before any body arrives
        with RawConnection(broker.bootstrap) as http:
            http.send_raw(b"GET / HTTP/1.1\r\n\r\n")
            assert http.is_closed_by_peer()
        assert broker.alive
        ledger.produce(good)
        ledger.check(good)


# --- ApiVersions of an unknown version ------------------------------------------------------------


@pytest.mark.parametrize("version", [2, 99, 32767, -1])
def test_api_versions_of_an_unknown_version_gets_unsupported_version_at_v0(
    broker: BrokerProcess, version: int
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        # the body of an unknown version cannot be parsed, and is not needed
        conn.send_raw(_frame(p.ApiKey.API_VERSIONS, version, b"\xde\xad", correlation_id=9))
        correlation_id, response = p.decode_response(conn.recv_frame(), p.ApiKey.API_VERSIONS, 0)
        assert correlation_id == 9
        assert response.error_code == UNSUPPORTED_VERSION
        advertised = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        assert advertised[p.ApiKey.API_VERSIONS] == p.SUPPORTED_VERSIONS[p.ApiKey.API_VERSIONS]
        assert advertised[p.ApiKey.PRODUCE] == p.SUPPORTED_VERSIONS[p.ApiKey.PRODUCE]
        # the connection stays usable
        again = conn.request(p.ApiKey.API_VERSIONS, p.ApiVersionsRequest())
        assert again.error_code == NONE
        assert conn.request(p.ApiKey.METADATA, p.MetadataRequest()).brokers


# --- bad record batches in a produce --------------------------------------------------------------


def _valid_batch(value: bytes = b"payload") -> bytes:
    return build([Record(key=b"bad", value=value, timestamp=1_700_000_000_000)])


def _with_crc(batch: bytearray) -> bytes:
    """``batch`` with its CRC recomputed (to corrupt fields the CRC covers, undetected)."""
    crc = int(google_crc32c.value(bytes(batch[ATTRIBUTES_OFFSET:])))
    struct.pack_into(">I", batch, CRC_OFFSET, crc)
    return bytes(batch)


def _flip_payload_byte(batch: bytes) -> bytes:
    out = bytearray(batch)
    out[-5] ^= 0x40
    return bytes(out)


def _flip_crc(batch: bytes) -> bytes:
    out = bytearray(batch)
    out[CRC_OFFSET] ^= 0x01
    return bytes(out)


def _set_length(batch: bytes, length: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">i", out, 8, length)  # batchLength follows baseOffset
    return bytes(out)


def _set_magic(batch: bytes, magic: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">b", out, MAGIC_OFFSET, magic)
    return bytes(out)


def _set_attributes(batch: bytes, attributes: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">h", out, ATTRIBUTES_OFFSET, attributes)
    return _with_crc(out)


def _set_record_count(batch: bytes, count: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">i", out, HEADER_SIZE - 4, count)  # recordCount ends the header
    return _with_crc(out)


CORRUPT_BATCHES: dict[str, Callable[[bytes], bytes]] = {
    "payload byte flipped (CRC mismatch)": _flip_payload_byte,
    "crc field flipped": _flip_crc,
    "truncated batch": lambda b: b[:-10],
    "truncated header": lambda b: b[:30],
    "batch length smaller than a header": lambda b: _set_length(b, 5),
    "batch length negative": lambda b: _set_length(b, -1),
    "batch length past the end": lambda b: _set_length(b, 2**31 - 1),
    "magic 1": lambda b: _set_magic(b, 1),
    "magic -1": lambda b: _set_magic(b, -1),
    "gzip compression (valid CRC)": lambda b: _set_attributes(b, 1),
    "unknown compression code 7 (valid CRC)": lambda b: _set_attributes(b, 7),
    "record count 0 (valid CRC)": lambda b: _set_record_count(b, 0),
    "a valid batch then a corrupt one": lambda b: b + _flip_payload_byte(b),
    "a valid batch then garbage": lambda b: b + b"\x00\x01\x02",
}


@pytest.mark.parametrize("case", list(CORRUPT_BATCHES))
def test_corrupt_batch_gets_corrupt_message_and_is_not_appended(
    broker: BrokerProcess, case: str
) -> None:
    ledger = Ledger(unique_name("corrupt"))
    with RawConnection(broker.bootstrap) as conn:
        create_topic(conn, ledger.topic)
        ledger.produce(conn)
        for acks in (1, -1):
            part = _partition_response(
                produce(conn, ledger.topic, 0, CORRUPT_BATCHES[case](_valid_batch()), acks=acks)
            )
            assert part.error_code == CORRUPT_MESSAGE, part
            assert part.error_message, "the error names what was wrong"
            assert part.base_offset == -1
        # acks=0 gets no response; the batch must still be refused
        produce(conn, ledger.topic, 0, CORRUPT_BATCHES[case](_valid_batch()), acks=0)
        ledger.produce(conn)  # same connection, still served, and nothing was appended before
        ledger.check(conn)


@pytest.mark.parametrize("records", [b"", None], ids=["empty", "null"])
def test_produce_without_a_batch_gets_invalid_record(
    broker: BrokerProcess, records: bytes | None
) -> None:
    ledger = Ledger(unique_name("empty"))
    with RawConnection(broker.bootstrap) as conn:
        create_topic(conn, ledger.topic)
        part = _partition_response(produce(conn, ledger.topic, 0, records))  # type: ignore[arg-type]
        assert part.error_code == INVALID_RECORD
        ledger.produce(conn)
        ledger.check(conn)


def test_batch_over_max_message_bytes_gets_record_too_large(broker: BrokerProcess) -> None:
    ledger = Ledger(unique_name("too-large"))
    with RawConnection(broker.bootstrap) as conn:
        result = create_topic(conn, ledger.topic, 1, 1, **{"max.message.bytes": "2000"})
        assert result.topics[0].error_code == NONE
        big = _valid_batch(b"x" * 3000)
        assert len(big) > 2000
        part = _partition_response(produce(conn, ledger.topic, 0, big))
        assert part.error_code == RECORD_TOO_LARGE
        assert "max.message.bytes=2000" in (part.error_message or "")
        # one batch too large refuses the whole append, the valid batch before it too
        part = _partition_response(produce(conn, ledger.topic, 0, _valid_batch() + big))
        assert part.error_code == RECORD_TOO_LARGE
        ledger.produce(conn, count=1, value_size=500)  # under the limit: accepted
        ledger.check(conn)


@pytest.mark.parametrize("acks", [2, -2, 3, 32767, -32768])
def test_invalid_acks_gets_invalid_required_acks(broker: BrokerProcess, acks: int) -> None:
    ledger = Ledger(unique_name("acks"))
    with RawConnection(broker.bootstrap) as conn:
        create_topic(conn, ledger.topic)
        part = _partition_response(produce(conn, ledger.topic, 0, _valid_batch(), acks=acks))
        assert part.error_code == INVALID_REQUIRED_ACKS
        assert f"acks={acks}" in (part.error_message or "")
        ledger.produce(conn)
        ledger.check(conn)


def test_produce_to_an_unknown_topic(broker: BrokerProcess) -> None:
    unknown = unique_name("never-created")
    with RawConnection(broker.bootstrap) as conn:
        part = _partition_response(produce(conn, unknown, 0, _valid_batch()))
        assert part.error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert unknown in (part.error_message or "")
        # produce never creates topics (auto.create.topics.enable defaults to false)
        assert _topic_error(conn, unknown) == UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize("partition", [1, -1, 2**31 - 1])
def test_produce_to_an_unknown_partition(broker: BrokerProcess, partition: int) -> None:
    ledger = Ledger(unique_name("one-partition"))
    with RawConnection(broker.bootstrap) as conn:
        create_topic(conn, ledger.topic)
        part = _partition_response(produce(conn, ledger.topic, partition, _valid_batch()))
        assert part.error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert f"{ledger.topic}-{partition}" in (part.error_message or "")
        ledger.produce(conn)
        ledger.check(conn)


_LONG_NAME = "n" * 32_700  # fits an int16-length string, so the request itself is well formed


def test_produce_to_an_unknown_topic_with_a_very_long_name_gets_an_error(
    broker: BrokerProcess,
) -> None:
    # the error message must not echo the whole name: it would not fit a response string
    with RawConnection(broker.bootstrap, timeout=10) as conn:
        part = _partition_response(produce(conn, _LONG_NAME, 0, _valid_batch()))
        assert part.error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert conn.request(p.ApiKey.METADATA, p.MetadataRequest()).brokers


# --- bad CreateTopics -----------------------------------------------------------------------------


def _create(conn: RawConnection, name: str, **kwargs: Any) -> p.CreatableTopicResult:
    [result] = create_topic(conn, name, **kwargs).topics
    return result  # type: ignore[no-any-return]


@pytest.mark.parametrize("partitions", [0, -5, -(2**31), 2**31 - 1])
def test_create_topic_with_bad_partition_count(broker: BrokerProcess, partitions: int) -> None:
    name = unique_name("partitions")
    with RawConnection(broker.bootstrap) as conn:
        result = _create(conn, name, partitions=partitions)
        assert result.error_code == INVALID_PARTITIONS
        assert name in (result.error_message or "")
        assert str(partitions) in (result.error_message or "")
        assert _topic_error(conn, name) == UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize("rf", [2, 3, 32767, 0, -2])
def test_create_topic_with_impossible_replication_factor(broker: BrokerProcess, rf: int) -> None:
    name = unique_name("rf")
    with RawConnection(broker.bootstrap) as conn:
        result = _create(conn, name, rf=rf)
        assert result.error_code == INVALID_REPLICATION_FACTOR
        assert name in (result.error_message or "")
        assert _topic_error(conn, name) == UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "a/b", "with space", "ünïcode", "tab\t", "a" * 250, "x:y", "n" * 300],
    ids=lambda n: repr(n)[:20],
)
def test_create_topic_with_illegal_name(broker: BrokerProcess, name: str) -> None:
    with RawConnection(broker.bootstrap) as conn:
        result = _create(conn, name)
        assert result.error_code == INVALID_TOPIC_EXCEPTION
        assert "not legal" in (result.error_message or "")
        # the connection is still served
        assert conn.request(p.ApiKey.METADATA, p.MetadataRequest()).brokers


def test_create_topic_with_a_very_long_illegal_name_gets_an_error(broker: BrokerProcess) -> None:
    with RawConnection(broker.bootstrap, timeout=10) as conn:
        assert _create(conn, _LONG_NAME).error_code == INVALID_TOPIC_EXCEPTION
        assert conn.request(p.ApiKey.METADATA, p.MetadataRequest()).brokers


@pytest.mark.parametrize(
    ("configs", "named"),
    [
        ({"no.such.config": "1"}, "no.such.config"),
        ({"retention.ms": "1000", "cleanup.policy.x": "compact"}, "cleanup.policy.x"),
        ({"max.message.bytes": "not-a-number"}, "max.message.bytes"),
        ({"max.message.bytes": "1"}, "max.message.bytes"),
    ],
)
def test_create_topic_with_bad_config(
    broker: BrokerProcess, configs: dict[str, str], named: str
) -> None:
    name = unique_name("config")
    with RawConnection(broker.bootstrap) as conn:
        result = _create(conn, name, **configs)
        assert result.error_code == INVALID_CONFIG
        assert named in (result.error_message or "")
        assert _topic_error(conn, name) == UNKNOWN_TOPIC_OR_PARTITION


def test_create_topics_answers_each_topic_on_its_own(broker: BrokerProcess) -> None:
    good, bad, dup = unique_name("good"), unique_name("bad"), unique_name("dup")
    with RawConnection(broker.bootstrap) as conn:
        assert _create(conn, dup).error_code == NONE
        response = conn.request(
            p.ApiKey.CREATE_TOPICS,
            p.CreateTopicsRequest(
                topics=[
                    p.CreatableTopic(name=bad, num_partitions=0, replication_factor=1),
                    p.CreatableTopic(name=good, num_partitions=2, replication_factor=1),
                    p.CreatableTopic(name=dup, num_partitions=1, replication_factor=1),
                    p.CreatableTopic(name="bad name", num_partitions=1, replication_factor=1),
                ]
            ),
        )
        codes = {t.name: t.error_code for t in response.topics}
        assert codes == {
            bad: INVALID_PARTITIONS,
            good: NONE,
            dup: TOPIC_ALREADY_EXISTS,
            "bad name": INVALID_TOPIC_EXCEPTION,
        }
        assert _topic_error(conn, good) == NONE
        assert _topic_error(conn, bad) == UNKNOWN_TOPIC_OR_PARTITION


def test_create_topic_with_a_huge_partition_count_does_not_stall_other_clients(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    # one 60-byte request must not make the broker open 100,000 logs (or 2**31-1) while every
    # other client waits: it is refused, and a bystander is served all along
    broker = broker_factory()
    ledger = Ledger("bystander")
    with RawConnection(broker.bootstrap, timeout=3) as good:
        create_topic(good, ledger.topic)
        ledger.produce(good)
        with RawConnection(broker.bootstrap) as greedy:
            body = p.CreateTopicsRequest(
                topics=[p.CreatableTopic(name="huge", num_partitions=100_000)]
            )
            greedy.send_raw(_frame(p.ApiKey.CREATE_TOPICS, 0, p.encode_message(body, 0), 3))
            greedy.sock.setblocking(False)

            def answered() -> bool:
                ledger.produce(good)
                try:
                    return bool(greedy.sock.recv(1, socket.MSG_PEEK))
                except BlockingIOError:
                    return False

            # the bystander is served (within 3 s each) until the CreateTopics is answered
            wait_until(
                answered,
                timeout=10,
                interval=0.2,
                message="an answer to CreateTopics of 100,000 partitions",
            )
            greedy.sock.setblocking(True)
            correlation_id, response = p.decode_response(
                greedy.recv_frame(), p.ApiKey.CREATE_TOPICS, 0
            )
            [result] = response.topics
            assert (correlation_id, result.error_code) == (3, INVALID_PARTITIONS)
            assert "100000" in (result.error_message or "")
            assert _topic_error(good, "huge") == UNKNOWN_TOPIC_OR_PARTITION
        ledger.check(good)


# --- inter-broker APIs sent by a client -----------------------------------------------------------


@pytest.mark.parametrize(
    ("broker_id", "port"), [(0, 1), (4242, -5)], ids=["live broker id", "made-up broker"]
)
def test_broker_registration_from_a_client_is_refused(
    broker_factory: Callable[..., BrokerProcess], broker_id: int, port: int
) -> None:
    broker = broker_factory()
    with RawConnection(broker.bootstrap) as conn:
        response = register_broker(
            conn,
            broker_id,
            p.BrokerRegistrationListener(
                name="PLAINTEXT", host="hijack.invalid", port=port, security_protocol=0
            ),
            cluster_id="someone-else",
        )
        listed = conn.request(p.ApiKey.METADATA, p.MetadataRequest(topics=[])).brokers
        assert "hijack.invalid" not in {b.host for b in listed}
        assert response.error_code != NONE, f"registration of broker {broker_id} accepted"


# --- the frame fuzzer -----------------------------------------------------------------------------
#
# Threads send seeded-random frames (valid requests of every API and version with their bytes
# mutated, well-formed requests with odd field values, and noise) a few per connection, each
# connection ending with an ApiVersions sentinel; the broker closes most of them at the first bad
# frame, and the frames it did not read are sent again on a new connection. Meanwhile a
# well-behaved client keeps producing acks=all records to a topic no fuzzed frame names, and
# checks the log holds exactly what was acked; after the fuzz, and after a restart, too.

#: REPLOG_FUZZ_SEED=<int> replays or varies a run; the seed is printed and in failures
FUZZ_SEED = int(os.environ.get("REPLOG_FUZZ_SEED", "0x5EEDF422"), 0)
FUZZ_FRAMES = 15_000  # frames the broker must have read (10,000 at least, with a margin)
# a deadline for a broker that stops reading frames (a hang), not a bound on its speed
FUZZ_DEADLINE_S = 300
FRAMES_PER_CONNECTION = 4  # most mutated frames close the connection: few go unread
FUZZ_THREADS = 6
HEALTHY_EVERY = 200  # frames between two produces of the well-behaved client
READ_TIMEOUT_S = 1.5
KNOWN_TOPIC = "acked-records"  # no mutation of the fuzz topics' names below can reach it
FUZZ_TOPIC = "fz-data"
FUZZ_TEMP_TOPIC = "fz-tmp"  # created and deleted over and over
_SENTINEL_ID = 0x7FFF_0000

_FIELD_VALUES: dict[str, Any] = {
    "acks": 1,
    "timeout_ms": 200,
    "replica_id": -1,
    "max_wait_ms": 0,
    "min_bytes": 1,
    "max_bytes": 1 << 16,
    "partition_max_bytes": 1 << 16,
    "isolation_level": 0,
    "session_id": 0,
    "session_epoch": -1,
    "current_leader_epoch": -1,
    "last_fetched_epoch": -1,
    "log_start_offset": -1,
    "timestamp": -1,
    "num_partitions": 1,
    "replication_factor": 1,
    "assignments": [],
    "configs": [],
    "validate_only": False,
    "allow_auto_topic_creation": False,
    "forgotten_topics_data": [],
    "rack_id": "",
    "leader_epoch": 0,
    "producer_id": -1,
    "producer_epoch": -1,
    "port": 9092,
    # inter-broker APIs name a broker that does not exist, never this one (id 0)
    "broker_id": 4242,
    "controller_id": 4242,
}


def _example(cls: type, version: int, overrides: dict[str, Any]) -> Any:
    """A plausible instance of a request message: every field filled, arrays of one element."""
    values = {**_FIELD_VALUES, **overrides}
    kwargs = {}
    for name, spec in p.wire_fields(cls):
        if not spec.present_in(version):
            continue
        qualified = f"{cls.__name__}.{name}"  # overrides one class's field
        if qualified in values:
            kwargs[name] = values[qualified]
        elif name in values:
            kwargs[name] = values[name]
        else:
            kwargs[name] = _example_value(spec.type, version, overrides)
    return cls(**kwargs)


def _example_value(wire_type: p.WireType, version: int, overrides: dict[str, Any]) -> Any:
    if isinstance(wire_type, p.Struct):
        return _example(wire_type.cls, version, overrides)
    if isinstance(wire_type, p.Array):
        return [_example_value(wire_type.element, version, overrides)]
    if isinstance(wire_type, p.String):
        return None if wire_type.nullable else overrides.get("__string__", FUZZ_TOPIC)
    if isinstance(wire_type, p.BytesType):
        return _FUZZ_BATCH
    if isinstance(wire_type, p.UuidType):
        return uuid.UUID(int=7)
    if wire_type is p.BOOL:
        return True
    if wire_type is p.FLOAT64:
        return 0.0
    return 0


_FUZZ_BATCH = build(
    [Record(key=b"fk", value=b"fuzz", timestamp=1_700_000_000_000, headers=(("h", b"1"),))] * 2
)

# Per API: variants of the request body, as field overrides (every version of every API).
_VARIANTS: dict[p.ApiKey, list[dict[str, Any]]] = {
    p.ApiKey.PRODUCE: [{"acks": 1}, {"acks": -1}, {"acks": 0}],
    p.ApiKey.FETCH: [{"fetch_offset": 0}, {"fetch_offset": 1, "isolation_level": 1}],
    p.ApiKey.METADATA: [{"topics": None}, {}],
    p.ApiKey.CREATE_TOPICS: [
        {"__string__": FUZZ_TEMP_TOPIC},
        {"__string__": FUZZ_TEMP_TOPIC, "validate_only": True, "num_partitions": 3},
        {
            "__string__": FUZZ_TEMP_TOPIC,
            "configs": [p.CreatableTopicConfig(name="retention.ms", value="60000")],
        },
    ],
    p.ApiKey.DELETE_TOPICS: [{"__string__": FUZZ_TEMP_TOPIC}],
    # these change a topic for good: never the one whose log the test checks
    p.ApiKey.DELETE_RECORDS: [{"__string__": FUZZ_TEMP_TOPIC}],
    p.ApiKey.CREATE_PARTITIONS: [{"__string__": FUZZ_TEMP_TOPIC}],
}


@dataclass(frozen=True)
class Template:
    """A valid request of one API and version, and the integer fields it carries."""

    api_key: p.ApiKey
    version: int
    overrides: dict[str, Any]
    frame: bytes  # correlation id 0
    #: ("Class.field", bits, is an array of that integer) for every integer field
    int_fields: tuple[tuple[str, int, bool], ...]

    def encode(self, correlation_id: int, **overrides: Any) -> bytes:
        body = _example(
            p.request_class(self.api_key, self.version),
            self.version,
            {**self.overrides, **overrides},
        )
        header = p.RequestHeader(
            api_key=self.api_key,
            api_version=self.version,
            correlation_id=correlation_id,
            client_id="fuzz",
        )
        return p.encode_request(header, body)


_INT_BITS = {"b": 8, "h": 16, "i": 32, "q": 64}


def _int_fields(cls: type, version: int) -> list[tuple[str, int, bool]]:
    out = []
    for name, spec in p.wire_fields(cls):
        t = spec.type
        if not spec.present_in(version):
            continue
        element = t.element if isinstance(t, p.Array) else t
        if isinstance(element, p.Struct):
            out += _int_fields(element.cls, version)
        elif element.fmt in _INT_BITS and name not in ("broker_id", "controller_id"):
            out.append((f"{cls.__name__}.{name}", _INT_BITS[element.fmt], element is not t))
    return out


def _templates() -> list[Template]:
    """A valid request of every API and version replog speaks, in a few variants each."""
    out = []
    for api_key, (low, high) in p.SUPPORTED_VERSIONS.items():
        for version in range(low, high + 1):
            for overrides in _VARIANTS.get(api_key, [{}]):
                cls = p.request_class(api_key, version)
                fields = tuple(dict.fromkeys(_int_fields(cls, version)))
                template = Template(api_key, version, overrides, b"", fields)
                frame = template.encode(0)
                p.decode_request(frame[4:])  # the template itself is valid
                out.append(dataclasses.replace(template, frame=frame))
    return out


_INTERESTING_INTS = (0, 1, -1, 2, 255, 256, 0x7FFF, -0x8000, 0x7FFF_FFFF, -0x8000_0000, 0xFFFF)


def _interesting(rng: random.Random, bits: int) -> int:
    top = 2 ** (bits - 1)
    return rng.choice((0, 1, -1, 2, -2, top - 1, -top, top - 2, 2 ** (bits // 2), 100, -100))


class FrameFuzzer:
    """Seeded random frames: valid requests of every API with their bytes mutated, requests
    with odd field values, and noise."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.templates = _templates()
        self.next_id = 1

    def frame(self) -> tuple[bytes, int]:
        """The next frame and its correlation id (if a mutation left it alone)."""
        rng = self.rng
        while True:
            correlation_id = self.next_id
            self.next_id += 1
            roll = rng.random()
            template = rng.choice(self.templates)
            if roll < 0.12:
                frame = self._noise()
            elif roll < 0.35 and template.int_fields:  # well formed, with odd values
                name, bits, is_array = rng.choice(template.int_fields)
                value = _interesting(rng, bits)
                frame = template.encode(correlation_id, **{name: [value] if is_array else value})
            else:
                frame = template.frame[:8] + _I32.pack(correlation_id) + template.frame[12:]
                if roll < 0.97:  # a few valid frames keep the request handlers busy
                    frame = self._mutate(frame)
            return frame, correlation_id

    def _noise(self) -> bytes:
        rng = self.rng
        body = rng.randbytes(rng.randrange(0, 80))
        kind = rng.randrange(3)
        if kind == 0:  # a plausible header with a random body
            api_key = rng.choice(list(p.SUPPORTED_VERSIONS))
            header = struct.pack(">hhih", api_key, rng.randrange(-1, 3), 0, -1)
            body = header + body
        if kind == 2:  # any length prefix at all
            return _I32.pack(rng.choice((rng.randrange(-(2**31), 2**31), -1, 0, 1, 3))) + body
        return _I32.pack(len(body)) + body

    def _mutate(self, frame: bytes) -> bytes:
        rng = self.rng
        body = bytearray(frame[4:])
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            kind = rng.randrange(8)
            if not body:
                body += rng.randbytes(rng.randrange(1, 8))
            at = rng.randrange(len(body))
            if kind == 0:  # bit flips
                for _ in range(rng.randrange(1, 5)):
                    bit = rng.randrange(len(body) * 8)
                    body[bit // 8] ^= 1 << (bit % 8)
            elif kind == 1:  # an interesting byte
                body[at] = rng.choice((0x00, 0xFF, 0x7F, 0x80, 0x01))
            elif kind == 2:  # an interesting int16/int32/int64 over whatever was there
                width = rng.choice((2, 4, 8))
                value = rng.choice(_INTERESTING_INTS) % (1 << (8 * width))
                body[at : at + width] = value.to_bytes(width, "big")[: len(body) - at]
            elif kind == 3:  # truncation
                del body[at:]
            elif kind == 4:  # insertion
                body[at:at] = rng.randbytes(rng.randrange(1, 17))
            elif kind == 5:  # deletion
                del body[at : at + rng.randrange(1, 9)]
            elif kind == 6:  # duplication
                body[at:at] = body[at : at + rng.randrange(1, 17)]
            else:  # splice with another frame
                other = rng.choice(self.templates).frame[4:]
                body[at:] = other[rng.randrange(len(other)) :]
        size = len(body)
        if rng.random() < 0.1:  # a length prefix that lies
            size = rng.choice((size + 1, size - 1, size + 100, -size, 0, 2**31 - 1, -(2**31)))
        return _I32.pack(size) + bytes(body)


def _send_batch(address: tuple[str, int], frames: list[tuple[bytes, int]]) -> tuple[int, int, bool]:
    """Send frames on one new connection, then an ApiVersions sentinel, and read to EOF.

    Returns how many of the frames the broker certainly read (frames are handled in order: all
    of them when the sentinel is answered, else those up to the last answered one and the frame
    after it, at least one), how many responses came back, and whether the read timed out.
    """
    sentinel = _api_versions_frame(_SENTINEL_ID)
    index_of = {cid: i for i, (_, cid) in enumerate(frames)}
    with socket.create_connection(address, timeout=5) as sock:
        sock.settimeout(READ_TIMEOUT_S)
        try:
            sock.sendall(b"".join(f for f, _ in frames) + sentinel)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the broker closed the connection at a bad frame
        data = bytearray()
        timed_out = False
        try:
            while chunk := sock.recv(1 << 16):
                data += chunk
        except TimeoutError:  # a frame that keeps the broker waiting (a long poll, say)
            timed_out = True
        except OSError:  # reset: the broker closed with frames unread
            pass
    answered = []
    pos = 0
    while pos + 8 <= len(data):
        (size,) = _I32.unpack_from(data, pos)
        if pos + 4 + size > len(data):
            break
        answered.append(_I32.unpack_from(data, pos + 4)[0])
        pos += 4 + size
    if _SENTINEL_ID in answered:
        return len(frames), len(answered), timed_out
    last = max((index_of[c] for c in answered if c in index_of), default=-1)
    return min(len(frames), last + 2), len(answered), timed_out


class FuzzStats:
    """Counters shared by the fuzzing threads; ``changed`` wakes the well-behaved client."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.read = self.sent = self.answers = self.connections = self.timeouts = 0

    def add(self, read: int, sent: int, answers: int, timed_out: bool) -> None:
        with self.changed:
            self.read += read
            self.sent += sent
            self.answers += answers
            self.connections += 1
            self.timeouts += timed_out
            self.changed.notify_all()


def _fuzz(address: tuple[str, int], seed: int, stop: threading.Event, stats: FuzzStats) -> None:
    """Send fuzzed frames until ``stop``; frames the broker did not read are sent again."""
    fuzzer = FrameFuzzer(seed)
    pending: deque[tuple[bytes, int]] = deque()
    while not stop.is_set():
        frames = [
            pending.popleft() if pending else fuzzer.frame() for _ in range(FRAMES_PER_CONNECTION)
        ]
        read, answers, timed_out = _send_batch(address, frames)
        pending.extendleft(reversed(frames[read:]))
        stats.add(read, len(frames), answers, timed_out)


def test_fuzzed_frames_never_kill_the_broker_nor_corrupt_a_log(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory()
    address = ("127.0.0.1", broker.port)
    ledger = Ledger(KNOWN_TOPIC)
    with RawConnection(broker.bootstrap, timeout=10) as good:
        assert _create(good, KNOWN_TOPIC).error_code == NONE
        assert _create(good, FUZZ_TOPIC).error_code == NONE
        for _ in range(10):
            ledger.produce(good, count=5)

        stats, stop = FuzzStats(), threading.Event()
        started = time.monotonic()
        deadline = started + FUZZ_DEADLINE_S
        with ThreadPoolExecutor(FUZZ_THREADS) as pool:
            workers = [
                pool.submit(_fuzz, address, FUZZ_SEED + i, stop, stats) for i in range(FUZZ_THREADS)
            ]

            def read_up_to(mark: int) -> bool:
                return stats.read >= mark or any(w.done() for w in workers)

            try:
                # the well-behaved client produces every HEALTHY_EVERY frames, and checks the
                # whole log every fifth time, while the fuzzing goes on
                for mark in range(HEALTHY_EVERY, FUZZ_FRAMES + HEALTHY_EVERY, HEALTHY_EVERY):
                    with stats.changed:
                        stats.changed.wait_for(
                            functools.partial(read_up_to, mark),
                            timeout=max(0, deadline - time.monotonic()),
                        )
                    assert broker.alive, f"broker died (seed {FUZZ_SEED}):\n{broker.stderr_tail()}"
                    for worker in workers:
                        if worker.done():
                            worker.result()  # raises what went wrong in it
                    assert stats.read >= mark, (
                        f"the broker read {stats.read} of {mark} frames within {FUZZ_DEADLINE_S} s "
                        f"(seed {FUZZ_SEED})"
                    )
                    ledger.produce(good)
                    if mark % (5 * HEALTHY_EVERY) == 0:
                        ledger.check(good)
            finally:
                stop.set()
            for worker in workers:
                worker.result()
        elapsed = time.monotonic() - started
        print(
            f"fuzz: {stats.read} frames read by the broker ({stats.sent} sent on "
            f"{stats.connections} connections, {stats.answers} responses, {stats.timeouts} read "
            f"timeouts) in {elapsed:.1f} s, seed {FUZZ_SEED}"
        )
        assert stats.read >= FUZZ_FRAMES
        log = broker.stderr_path.read_text().splitlines()
        crashes = [
            i for i, line in enumerate(log) if "bug:" in line or "Unhandled exception" in line
        ]
        # each crash with the traceback after it (up to the next log line), to fix it from CI's
        shown = [
            "\n".join([log[i], *itertools.takewhile(lambda x: not x[:4].isdigit(), log[i + 1 :])])
            for i in crashes[:3]
        ]
        assert not crashes, "request handlers crashed on fuzzed input:\n" + "\n".join(shown)

        assert broker.alive
        ledger.produce(good)
        ledger.check(good)
    with RawConnection(broker.bootstrap, timeout=10) as fresh:
        ledger.produce(fresh)
        ledger.check(fresh)
        # the fuzzed topic holds whatever valid produces got through: whole, CRC-valid
        # batches at contiguous offsets (_read_all checks both)
        fuzzed = _read_all(fresh, FUZZ_TOPIC)

    assert broker.stop() == 0, broker.stderr_tail()
    broker.start()  # same port, same storage
    with RawConnection(broker.bootstrap, timeout=10) as after:
        ledger.check(after)
        assert _read_all(after, FUZZ_TOPIC)[: len(fuzzed)] == fuzzed
        ledger.produce(after)
        ledger.check(after)
