"""Kafka's wire protocol on the Kafka listener: which API versions are served, and requests
and responses as bytes.

The message schemas are kio's (Aiven's ``kio`` package): dataclasses generated from the
JSON message definitions inside Apache Kafka's own source, one class per API version, with
flexible versions, compact types and tagged fields, and a native reader. Writing those
schemas again by hand would be a second copy of Kafka's that nobody keeps current; kio is
regenerated from Kafka's as it moves.

Frames are Kafka's (an int32 length, then the message: the same framing as replog's own
listener, :func:`replication.protocol.read_frame`). The request header is v1, or v2 (tagged
fields) for a flexible request version; the response header is v0, or v1 for a flexible
version, except ApiVersions whose response header is always v0 so that any client can read
the versions it may use.
"""

from __future__ import annotations

import functools
import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from replication.errors import CorruptFrameError, UnsupportedVersionError
from replication.kafka.frame_check import check_request
from replication.kafka.schemas import OWN_RESPONSE_SCHEMAS
from replication.protocol.api import ApiKey
from replication.protocol.codec import Parts

__all__ = [
    "SASL_VERSIONS",
    "SERVED_VERSIONS",
    "KafkaRequest",
    "decode_request",
    "encode_response",
    "peek_header",
    "response_class",
]

#: The APIs and versions the Kafka listener serves, as (lowest, highest). The lowest is the
#: oldest Kafka 4.0 still serves (it dropped older ones; so does kio). The highest is the
#: newest whose meaning replog implements in full: Produce 12 and EndTxn 4 onwards belong to
#: KIP-890's transactions v2, Fetch 13 and Metadata 13 onwards name topics by id only,
#: ListOffsets 8 onwards ask for tiered storage's offsets (KIP-405, KIP-1005), which replog has
#: no tiers for (v7's max-timestamp query, -3, is answered), FindCoordinator 4 batches keys
#: (served), OffsetFetch 8 batches groups (not yet), JoinGroup
#: starts at 4 because replog's coordinator always asks a new member to rejoin with the id it
#: gives it (KIP-394), which older versions cannot carry. DescribeTransactions
#: is encoded with the listener's own response class (kafka/schemas.py: -1 as the start time
#: of no transaction, as Kafka sends it, which kio's class cannot hold).
#: OffsetCommit 9 is 8 for members of consumer-protocol groups (KIP-848: the generation is the
#: member epoch); ConsumerGroupHeartbeat 1 has the client make its member id (KIP-1082), v0
#: lets the coordinator make it; ListGroups 5 filters by group type.
SERVED_VERSIONS: Final[dict[ApiKey, tuple[int, int]]] = {
    ApiKey.PRODUCE: (3, 11),
    ApiKey.FETCH: (4, 12),
    ApiKey.LIST_OFFSETS: (1, 7),
    ApiKey.METADATA: (1, 12),
    ApiKey.OFFSET_COMMIT: (2, 9),
    ApiKey.OFFSET_FETCH: (1, 7),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.JOIN_GROUP: (4, 9),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 5),
    ApiKey.INIT_PRODUCER_ID: (0, 4),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 3),
    ApiKey.END_TXN: (0, 3),
    ApiKey.TXN_OFFSET_COMMIT: (0, 3),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.ELECT_LEADERS: (0, 2),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.UNREGISTER_BROKER: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
    ApiKey.LIST_TRANSACTIONS: (0, 2),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_LOG_DIRS: (1, 4),
    ApiKey.DESCRIBE_ACLS: (1, 3),
    ApiKey.CREATE_ACLS: (1, 3),
    ApiKey.DELETE_ACLS: (1, 3),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ApiKey.ALTER_CLIENT_QUOTAS: (0, 1),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 1),
}

#: The SASL APIs, served on SASL listeners only (before authentication, by the socket server's
#: gate). SaslHandshake v0 is served too (after it the SASL tokens travel raw,
#: length-prefixed, outside Kafka's framing): librdkafka 2.0 takes a broker without
#: SaslHandshake v0 for one without SASL.
SASL_VERSIONS: Final[dict[ApiKey, tuple[int, int]]] = {
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
}

_HEAD: Final = struct.Struct(">hhi")  # api key, api version, correlation id
_SIZE: Final = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class KafkaRequest:
    """One decoded request: its header's fields and its body (a kio entity)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any


def peek_header(frame: bytes) -> tuple[int, int, int] | None:
    """(api key, api version, correlation id) of a frame, if it is long enough to have them
    (what an UNSUPPORTED_VERSION answer needs when the rest cannot be read)."""
    if len(frame) < _HEAD.size:
        return None
    api_key, api_version, correlation_id = _HEAD.unpack_from(frame)
    return api_key, api_version, correlation_id


@functools.cache
def _request_codec(api_key: int, api_version: int) -> tuple[Callable[..., Any], ...]:
    cls = load_request_schema(api_key, api_version)
    return entity_reader(cls.__header_schema__), entity_reader(cls)


@functools.cache
def _response_codec(api_key: int, api_version: int) -> tuple[type, Callable[..., Any], Any]:
    cls: Any = response_class(api_key, api_version)
    header_cls = cls.__header_schema__
    return cls, entity_writer(cls), (header_cls, entity_writer(header_cls))


def response_class(api_key: int, api_version: int) -> type:
    """The response class of an API version: kio's, or where kio's cannot carry what Kafka
    sends, the listener's own of the same bytes (:mod:`replication.kafka.schemas`). Whoever
    reads the listener's answers reads them with this class."""
    own = OWN_RESPONSE_SCHEMAS.get((api_key, api_version))
    return own if own is not None else load_response_schema(api_key, api_version)


def decode_request(frame: bytes) -> KafkaRequest:
    """The request in ``frame`` (the bytes after its length prefix).

    Raises UnsupportedVersionError for an API or version this listener does not serve, and
    CorruptFrameError for bytes that are not a well-formed request of the version they claim.
    """
    head = peek_header(frame)
    if head is None:
        raise CorruptFrameError(
            f"a Kafka request of {len(frame)} bytes is too short for a request header"
        )
    api_key, api_version, _ = head
    try:
        served = SERVED_VERSIONS.get(ApiKey(api_key)) or SASL_VERSIONS.get(ApiKey(api_key))
    except ValueError:
        served = None
    if served is None:
        raise UnsupportedVersionError(f"API key {api_key} is not served by this Kafka listener")
    if not served[0] <= api_version <= served[1]:
        raise UnsupportedVersionError(
            f"{ApiKey(api_key).name} v{api_version} is not served by this Kafka listener "
            f"(it serves v{served[0]} to v{served[1]})"
        )
    read_header, read_body = _request_codec(api_key, api_version)
    what = f"{ApiKey(api_key).name} v{api_version} request"
    check_request(load_request_schema(api_key, api_version), frame, what)
    try:
        header, size = read_header(frame, 0)
        body, _ = read_body(frame, size)
    except Exception as err:
        raise CorruptFrameError(f"malformed {what}: {type(err).__name__}: {err}") from err
    # Bytes after the message are ignored, as Kafka's broker ignores them (it parses a
    # request from the buffer and does not look at what remains): librdkafka 2.x sends three
    # more bytes after its Metadata v12 requests.
    return KafkaRequest(
        api_key, api_version, header.correlation_id, getattr(header, "client_id", None), body
    )


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> Parts:
    """A response frame (length prefix included) for a request of ``api_version``."""
    _, write_body, (header_cls, write_header) = _response_codec(api_key, api_version)
    out = io.BytesIO()
    write_header(out, header_cls(correlation_id=correlation_id))
    write_body(out, body)
    data = out.getvalue()
    return [_SIZE.pack(len(data)), data]
