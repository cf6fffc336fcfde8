"""replog's wire protocol: the API table (versions per API) and framing of requests and
responses.

Framing (as Kafka's)::

    request  = length:int32  api_key:int16 api_version:int16 correlation_id:int32
               client_id:nullable_string  body
    response = length:int32  correlation_id:int32  body

``length`` counts the bytes after itself. All integers are big-endian.

Example::

    >>> header = RequestHeader(api_key=ApiKey.API_VERSIONS, api_version=0,
    ...                        correlation_id=7, client_id="cli")
    >>> frame = encode_request(header, ApiVersionsRequest())
    >>> decode_request(frame[4:])[0].correlation_id
    7
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from replication.errors import (
    CorruptFrameError,
    FrameTooLargeError,
    InvalidFieldError,
    InvalidFrameLengthError,
    UnsupportedVersionError,
)
from replication.protocol import (
    acls,
    admin,
    controller,
    fetch,
    groups,
    log_objects,
    metadata,
    produce,
    quotas,
    reassignments,
    security,
    transactions,
)
from replication.protocol.api import ApiKey, RequestHeader
from replication.protocol.codec import (
    _I32,
    _INT32_MAX,
    NULLABLE_STRING,
    Bytes,
    Parts,
    _bad_value,
    _codec,
    _decode_to_end,
    _view,
)

# --- the API table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Api:
    request: type
    response: type
    min_version: int
    max_version: int


_APIS: Final[Mapping[ApiKey, _Api]] = {
    ApiKey.PRODUCE: _Api(produce.ProduceRequest, produce.ProduceResponse, 0, 0),
    ApiKey.FETCH: _Api(fetch.FetchRequest, fetch.FetchResponse, 0, 0),
    ApiKey.LIST_OFFSETS: _Api(fetch.ListOffsetsRequest, fetch.ListOffsetsResponse, 0, 0),
    ApiKey.METADATA: _Api(metadata.MetadataRequest, metadata.MetadataResponse, 0, 1),
    ApiKey.LEADER_AND_ISR: _Api(
        controller.LeaderAndIsrRequest, controller.LeaderAndIsrResponse, 0, 0
    ),
    ApiKey.API_VERSIONS: _Api(metadata.ApiVersionsRequest, metadata.ApiVersionsResponse, 0, 1),
    ApiKey.SASL_HANDSHAKE: _Api(
        security.SaslHandshakeRequest, security.SaslHandshakeResponse, 1, 1
    ),
    ApiKey.SASL_AUTHENTICATE: _Api(
        security.SaslAuthenticateRequest, security.SaslAuthenticateResponse, 0, 1
    ),
    ApiKey.CREATE_TOPICS: _Api(metadata.CreateTopicsRequest, metadata.CreateTopicsResponse, 0, 1),
    ApiKey.DELETE_TOPICS: _Api(metadata.DeleteTopicsRequest, metadata.DeleteTopicsResponse, 0, 0),
    ApiKey.INIT_PRODUCER_ID: _Api(
        transactions.InitProducerIdRequest, transactions.InitProducerIdResponse, 0, 0
    ),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: _Api(
        fetch.OffsetsForLeaderEpochRequest, fetch.OffsetsForLeaderEpochResponse, 0, 0
    ),
    ApiKey.ADD_PARTITIONS_TO_TXN: _Api(
        transactions.AddPartitionsToTxnRequest, transactions.AddPartitionsToTxnResponse, 0, 0
    ),
    ApiKey.END_TXN: _Api(transactions.EndTxnRequest, transactions.EndTxnResponse, 0, 0),
    ApiKey.WRITE_TXN_MARKERS: _Api(
        transactions.WriteTxnMarkersRequest, transactions.WriteTxnMarkersResponse, 0, 0
    ),
    ApiKey.ALTER_PARTITION: _Api(
        controller.AlterPartitionRequest, controller.AlterPartitionResponse, 0, 0
    ),
    ApiKey.BROKER_REGISTRATION: _Api(
        controller.BrokerRegistrationRequest, controller.BrokerRegistrationResponse, 0, 0
    ),
    ApiKey.BROKER_HEARTBEAT: _Api(
        controller.BrokerHeartbeatRequest, controller.BrokerHeartbeatResponse, 0, 0
    ),
    ApiKey.DESCRIBE_LOG_DIRS: _Api(
        metadata.DescribeLogDirsRequest, metadata.DescribeLogDirsResponse, 0, 0
    ),
    ApiKey.FIND_COORDINATOR: _Api(
        transactions.FindCoordinatorRequest, transactions.FindCoordinatorResponse, 0, 0
    ),
    ApiKey.LIST_TRANSACTIONS: _Api(
        transactions.ListTransactionsRequest, transactions.ListTransactionsResponse, 0, 0
    ),
    ApiKey.DESCRIBE_TRANSACTIONS: _Api(
        transactions.DescribeTransactionsRequest, transactions.DescribeTransactionsResponse, 0, 0
    ),
    ApiKey.DESCRIBE_PRODUCERS: _Api(
        transactions.DescribeProducersRequest, transactions.DescribeProducersResponse, 0, 0
    ),
    ApiKey.ALLOCATE_PRODUCER_IDS: _Api(
        transactions.AllocateProducerIdsRequest, transactions.AllocateProducerIdsResponse, 0, 0
    ),
    ApiKey.COMMIT_SINK_BATCH: _Api(
        transactions.CommitSinkBatchRequest, transactions.CommitSinkBatchResponse, 0, 0
    ),
    ApiKey.DESCRIBE_SINK: _Api(
        transactions.DescribeSinkRequest, transactions.DescribeSinkResponse, 0, 0
    ),
    ApiKey.DESCRIBE_LOG_OBJECTS: _Api(
        log_objects.DescribeLogObjectsRequest, log_objects.DescribeLogObjectsResponse, 0, 0
    ),
    ApiKey.ADD_OFFSETS_TO_TXN: _Api(
        transactions.AddOffsetsToTxnRequest, transactions.AddOffsetsToTxnResponse, 0, 0
    ),
    ApiKey.TXN_OFFSET_COMMIT: _Api(
        groups.TxnOffsetCommitRequest, groups.TxnOffsetCommitResponse, 0, 0
    ),
    ApiKey.OFFSET_COMMIT: _Api(groups.OffsetCommitRequest, groups.OffsetCommitResponse, 0, 0),
    ApiKey.OFFSET_FETCH: _Api(groups.OffsetFetchRequest, groups.OffsetFetchResponse, 0, 0),
    ApiKey.JOIN_GROUP: _Api(groups.JoinGroupRequest, groups.JoinGroupResponse, 0, 0),
    ApiKey.HEARTBEAT: _Api(groups.HeartbeatRequest, groups.HeartbeatResponse, 0, 0),
    ApiKey.LEAVE_GROUP: _Api(groups.LeaveGroupRequest, groups.LeaveGroupResponse, 0, 0),
    ApiKey.SYNC_GROUP: _Api(groups.SyncGroupRequest, groups.SyncGroupResponse, 0, 0),
    ApiKey.DESCRIBE_GROUPS: _Api(groups.DescribeGroupsRequest, groups.DescribeGroupsResponse, 0, 0),
    ApiKey.LIST_GROUPS: _Api(groups.ListGroupsRequest, groups.ListGroupsResponse, 0, 0),
    ApiKey.DELETE_GROUPS: _Api(groups.DeleteGroupsRequest, groups.DeleteGroupsResponse, 0, 0),
    ApiKey.OFFSET_DELETE: _Api(groups.OffsetDeleteRequest, groups.OffsetDeleteResponse, 0, 0),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: _Api(
        groups.ConsumerGroupHeartbeatRequest, groups.ConsumerGroupHeartbeatResponse, 0, 0
    ),
    ApiKey.CONSUMER_GROUP_DESCRIBE: _Api(
        groups.ConsumerGroupDescribeRequest, groups.ConsumerGroupDescribeResponse, 0, 0
    ),
    ApiKey.DELETE_RECORDS: _Api(admin.DeleteRecordsRequest, admin.DeleteRecordsResponse, 0, 0),
    ApiKey.DESCRIBE_CONFIGS: _Api(
        admin.DescribeConfigsRequest, admin.DescribeConfigsResponse, 0, 0
    ),
    ApiKey.CREATE_PARTITIONS: _Api(
        admin.CreatePartitionsRequest, admin.CreatePartitionsResponse, 0, 0
    ),
    ApiKey.ALTER_CONFIGS: _Api(admin.AlterConfigsRequest, admin.AlterConfigsResponse, 0, 0),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _Api(
        admin.IncrementalAlterConfigsRequest, admin.IncrementalAlterConfigsResponse, 0, 0
    ),
    ApiKey.ELECT_LEADERS: _Api(
        reassignments.ElectLeadersRequest, reassignments.ElectLeadersResponse, 0, 0
    ),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: _Api(
        reassignments.AlterPartitionReassignmentsRequest,
        reassignments.AlterPartitionReassignmentsResponse,
        0,
        0,
    ),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: _Api(
        reassignments.ListPartitionReassignmentsRequest,
        reassignments.ListPartitionReassignmentsResponse,
        0,
        0,
    ),
    ApiKey.UNREGISTER_BROKER: _Api(
        reassignments.UnregisterBrokerRequest, reassignments.UnregisterBrokerResponse, 0, 0
    ),
    ApiKey.DESCRIBE_ACLS: _Api(acls.DescribeAclsRequest, acls.DescribeAclsResponse, 0, 0),
    ApiKey.CREATE_ACLS: _Api(acls.CreateAclsRequest, acls.CreateAclsResponse, 0, 0),
    ApiKey.DELETE_ACLS: _Api(acls.DeleteAclsRequest, acls.DeleteAclsResponse, 0, 0),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: _Api(
        acls.DescribeUserScramCredentialsRequest, acls.DescribeUserScramCredentialsResponse, 0, 0
    ),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: _Api(
        acls.AlterUserScramCredentialsRequest, acls.AlterUserScramCredentialsResponse, 0, 0
    ),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: _Api(
        quotas.DescribeClientQuotasRequest, quotas.DescribeClientQuotasResponse, 0, 0
    ),
    ApiKey.ALTER_CLIENT_QUOTAS: _Api(
        quotas.AlterClientQuotasRequest, quotas.AlterClientQuotasResponse, 0, 0
    ),
}

#: The (min, max) version replog speaks for each API.
SUPPORTED_VERSIONS: Final[Mapping[ApiKey, tuple[int, int]]] = {
    key: (api.min_version, api.max_version) for key, api in _APIS.items()
}


def _api(api_key: int, version: int) -> _Api:
    try:
        key = ApiKey(api_key)
    except ValueError:
        raise UnsupportedVersionError(f"unknown API key {api_key}") from None
    api = _APIS.get(key)
    if api is None:  # a Kafka API that only the Kafka listener serves (DescribeCluster)
        raise UnsupportedVersionError(f"{key.name} is not part of replog's protocol")
    if not api.min_version <= version <= api.max_version:
        raise UnsupportedVersionError(
            f"{key.name} version {version} is not supported "
            f"(replog speaks versions {api.min_version} to {api.max_version})"
        )
    return api


def request_class(api_key: int, version: int) -> type:
    """The request message class of ``api_key`` at ``version`` (UnsupportedVersionError if none)."""
    return _api(api_key, version).request


def response_class(api_key: int, version: int) -> type:
    """The response message class of ``api_key`` at ``version``."""
    return _api(api_key, version).response


# --- frames ---------------------------------------------------------------------------------------

_REQUEST_HEADER_CODEC: Final = _codec(RequestHeader, 0)


def _frame(parts: Parts) -> Parts:
    """Fill in parts[0], the length prefix, from the sizes of the rest."""
    size = sum(map(len, parts))
    if size > _INT32_MAX:
        raise InvalidFieldError(f"frame of {size} bytes exceeds the int32 length limit")
    parts[0] = _I32.pack(size)
    return parts


def _encode_body(cls: type, body: object, version: int, parts: Parts) -> None:
    if type(body) is not cls:
        raise TypeError(f"expected a {cls.__name__}, got {type(body).__name__}")
    _codec(cls, version).encode(body, parts)


def encode_request(header: RequestHeader, body: object) -> bytes:
    """The frame (length prefix included) of a request."""
    api = _api(header.api_key, header.api_version)
    parts: Parts = [b""]
    _REQUEST_HEADER_CODEC.encode(header, parts)
    _encode_body(api.request, body, header.api_version, parts)
    return b"".join(_frame(parts))


def encode_response_parts(
    correlation_id: int, api_key: int, api_version: int, body: object
) -> Parts:
    """A response frame as buffers, for ``writer.writelines`` without joining (no record copy)."""
    api = _api(api_key, api_version)
    parts: Parts = [b""]
    try:
        parts.append(_I32.pack(correlation_id))
    except struct.error as err:
        raise _bad_value("correlation_id", correlation_id, err) from err
    _encode_body(api.response, body, api_version, parts)
    return _frame(parts)


def encode_response(correlation_id: int, api_key: int, api_version: int, body: object) -> bytes:
    """The frame (length prefix included) of a response."""
    return b"".join(encode_response_parts(correlation_id, api_key, api_version, body))


_REQUEST_HEADER_FIXED: Final = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_CLIENT_ID_DECODER: Final = NULLABLE_STRING.decoder(0, "RequestHeader.client_id")


def decode_request_header(frame: Bytes) -> tuple[RequestHeader, int]:
    """The header of a request frame (bytes after the length prefix) and where its body starts.

    The API key and version are not checked here, so a broker can still answer an
    ApiVersions request of an unknown version (with UNSUPPORTED_VERSION at v0). A known API
    key comes back as an :class:`ApiKey`.
    """
    buf = _view(frame)
    try:
        api_key, api_version, correlation_id = _REQUEST_HEADER_FIXED.unpack_from(buf, 0)
        client_id, pos = _CLIENT_ID_DECODER(buf, 8)
    except struct.error as err:
        raise CorruptFrameError(
            f"corrupt request header: {len(buf)} bytes, too short for a request header"
        ) from err
    except CorruptFrameError as err:
        raise CorruptFrameError(f"corrupt request header: {err}") from err
    header = RequestHeader(
        api_key=ApiKey(api_key) if api_key in _APIS else api_key,
        api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    return header, pos


def decode_request(frame: Bytes) -> tuple[RequestHeader, Any]:
    """Decode a request frame (the bytes after the length prefix) into (header, body).

    Raises CorruptFrameError for malformed bytes and UnsupportedVersionError for an API key or
    version replog does not speak.
    """
    buf = _view(frame)
    header, pos = decode_request_header(buf)
    api = _api(header.api_key, header.api_version)

    def what() -> str:
        return (
            f"{ApiKey(header.api_key).name} request v{header.api_version} "
            f"(correlation id {header.correlation_id})"
        )

    body = _decode_to_end(_codec(api.request, header.api_version).decode, buf, pos, what)
    return header, body


def decode_response(frame: Bytes, api_key: int, api_version: int) -> tuple[int, Any]:
    """Decode a response frame (the bytes after the length prefix) into (correlation id, body).

    An ApiVersions response that does not parse at ``api_version`` is parsed at v0, since a
    broker answers an unsupported ApiVersions version at v0 (as Kafka's clients do).
    """
    buf = _view(frame)
    api = _api(api_key, api_version)
    name = ApiKey(api_key).name
    if len(buf) < 4:
        raise CorruptFrameError(
            f"corrupt {name} response v{api_version}: {len(buf)} bytes, "
            "too short for a correlation id"
        )
    (correlation_id,) = _I32.unpack_from(buf, 0)

    def what() -> str:
        return f"{name} response v{api_version} (correlation id {correlation_id})"

    try:
        body = _decode_to_end(_codec(api.response, api_version).decode, buf, 4, what)
    except CorruptFrameError:
        if api_key != ApiKey.API_VERSIONS or api_version == 0:
            raise
        body = _decode_to_end(_codec(api.response, 0).decode, buf, 4, what)
    return correlation_id, body


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    """Read one frame and return the bytes after its length prefix.

    Raises InvalidFrameLengthError for a negative length and FrameTooLargeError for one over
    ``max_bytes`` (both CorruptFrameError: close the connection, since the stream cannot be
    resynchronised). At end of stream, raises asyncio.IncompleteReadError (an EOFError) from
    ``readexactly``; its ``partial`` is empty when the peer closed between frames.
    """
    prefix = await reader.readexactly(4)
    (size,) = _I32.unpack(prefix)
    if size < 0:
        raise InvalidFrameLengthError(
            f"frame length {size} is negative; the peer is not speaking the replog protocol"
        )
    if size > max_bytes:
        raise FrameTooLargeError(
            f"frame of {size} bytes exceeds the limit of {max_bytes} bytes "
            f"(prefix {prefix.hex()}, {prefix!r}); raise the limit "
            "(socket.request.max.bytes on a broker) or check that the peer speaks the replog "
            "protocol: a TLS or HTTP client looks like a huge frame"
        )
    return await reader.readexactly(size)
