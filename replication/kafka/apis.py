"""The Kafka listener's request handlers: Kafka's messages in, replog's handlers behind them.

Every request is read at the version the client chose (:mod:`replication.kafka.wire`),
translated to replog's message (:mod:`replication.kafka.translate`), handled by the broker's
own :class:`~replication.server.apis.KafkaApis` (or the group APIs), and the answer is
translated back at the same version. So a Kafka client gets exactly what replog's own
clients get: the same log, fetch sessions, transaction and group coordinators, and errors.
What differs is handled here:

- records: a Kafka RecordBatch v2 is transcoded to replog's Arrow batch on Produce and back
  on Fetch (:mod:`replication.kafka.records`, which says why);
- addresses: Metadata and FindCoordinator name each broker's Kafka listener, not its
  replog one (a broker without a Kafka listener is left out, as Kafka leaves out brokers
  without the listener a client connected to);
- a Kafka client is never a follower: Fetch's replica id is forced to -1 (consumer).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final

from logstore.errors import ReplogError
from replication import protocol as p
from replication.common import TopicPartition
from replication.coordinator.transaction import TxnState
from replication.errors import (
    CoordinatorNotAvailableError,
    IllegalSaslStateError,
    InvalidRegularExpressionError,
    NotCoordinatorError,
    TopicAuthorizationFailedError,
    UnsupportedCompressionTypeError,
    UnsupportedVersionError,
)
from replication.kafka.records import kafka_to_replog, replog_to_kafka
from replication.kafka.translate import to_kafka, to_replog
from replication.kafka.wire import (
    SASL_VERSIONS,
    SERVED_VERSIONS,
    KafkaRequest,
    decode_request,
    encode_response,
    peek_header,
    response_class,
)
from replication.metadata.image import MetadataImage
from replication.protocol import acls, quotas
from replication.protocol.codec import Parts
from replication.server.apis import KafkaApis
from replication.server.responses import error_code, error_message

log = logging.getLogger(__name__)

#: The listener name under which brokers register their Kafka address.
KAFKA_LISTENER: Final = "KAFKA"

#: replog's request class for each API served through the generic translation.
_REQUESTS: Final[dict[p.ApiKey, type]] = {
    p.ApiKey.FETCH: p.FetchRequest,
    p.ApiKey.LIST_OFFSETS: p.ListOffsetsRequest,
    p.ApiKey.METADATA: p.MetadataRequest,
    p.ApiKey.OFFSET_COMMIT: p.OffsetCommitRequest,
    p.ApiKey.OFFSET_FETCH: p.OffsetFetchRequest,
    p.ApiKey.FIND_COORDINATOR: p.FindCoordinatorRequest,
    p.ApiKey.JOIN_GROUP: p.JoinGroupRequest,
    p.ApiKey.HEARTBEAT: p.HeartbeatRequest,
    p.ApiKey.LEAVE_GROUP: p.LeaveGroupRequest,
    p.ApiKey.SYNC_GROUP: p.SyncGroupRequest,
    p.ApiKey.DESCRIBE_GROUPS: p.DescribeGroupsRequest,
    p.ApiKey.LIST_GROUPS: p.ListGroupsRequest,
    p.ApiKey.CREATE_TOPICS: p.CreateTopicsRequest,
    p.ApiKey.DELETE_TOPICS: p.DeleteTopicsRequest,
    p.ApiKey.INIT_PRODUCER_ID: p.InitProducerIdRequest,
    p.ApiKey.OFFSET_FOR_LEADER_EPOCH: p.OffsetsForLeaderEpochRequest,
    p.ApiKey.ADD_PARTITIONS_TO_TXN: p.AddPartitionsToTxnRequest,
    p.ApiKey.ADD_OFFSETS_TO_TXN: p.AddOffsetsToTxnRequest,
    p.ApiKey.END_TXN: p.EndTxnRequest,
    p.ApiKey.TXN_OFFSET_COMMIT: p.TxnOffsetCommitRequest,
    p.ApiKey.DELETE_GROUPS: p.DeleteGroupsRequest,
    p.ApiKey.OFFSET_DELETE: p.OffsetDeleteRequest,
    p.ApiKey.DELETE_RECORDS: p.DeleteRecordsRequest,
    p.ApiKey.DESCRIBE_CONFIGS: p.DescribeConfigsRequest,
    p.ApiKey.ALTER_CONFIGS: p.AlterConfigsRequest,
    p.ApiKey.CREATE_PARTITIONS: p.CreatePartitionsRequest,
    p.ApiKey.INCREMENTAL_ALTER_CONFIGS: p.IncrementalAlterConfigsRequest,
    p.ApiKey.ELECT_LEADERS: p.ElectLeadersRequest,
    p.ApiKey.ALTER_PARTITION_REASSIGNMENTS: p.AlterPartitionReassignmentsRequest,
    p.ApiKey.LIST_PARTITION_REASSIGNMENTS: p.ListPartitionReassignmentsRequest,
    p.ApiKey.UNREGISTER_BROKER: p.UnregisterBrokerRequest,
    p.ApiKey.DESCRIBE_PRODUCERS: p.DescribeProducersRequest,
    p.ApiKey.DESCRIBE_TRANSACTIONS: p.DescribeTransactionsRequest,
    p.ApiKey.DESCRIBE_LOG_DIRS: p.DescribeLogDirsRequest,
    p.ApiKey.DESCRIBE_ACLS: acls.DescribeAclsRequest,
    p.ApiKey.CREATE_ACLS: acls.CreateAclsRequest,
    p.ApiKey.DELETE_ACLS: acls.DeleteAclsRequest,
    p.ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: acls.DescribeUserScramCredentialsRequest,
    p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS: acls.AlterUserScramCredentialsRequest,
    p.ApiKey.DESCRIBE_CLIENT_QUOTAS: quotas.DescribeClientQuotasRequest,
    p.ApiKey.ALTER_CLIENT_QUOTAS: quotas.AlterClientQuotasRequest,
    p.ApiKey.CONSUMER_GROUP_DESCRIBE: p.ConsumerGroupDescribeRequest,
}

#: The features ApiVersions v3+ names, as (name, lowest, highest level); every one is
#: finalized at its highest level. ``group.version`` 1 is the consumer group protocol (KIP-848):
#: Kafka's clients look for it before they use ``group.protocol=consumer``.
FEATURES: Final = (("group.version", 0, 1),)

#: zstd batches are refused below this Produce version, as Kafka refuses them (KIP-110)
_ZSTD_SINCE: Final = 7
_ZSTD: Final = 4
_ATTRIBUTES: Final = struct.Struct(">h")
_ATTRIBUTES_OFFSET: Final = 21  # baseOffset, batchLength, partitionLeaderEpoch, magic, crc


def _codec(records: bytes) -> int:
    """The compression codec of a Kafka batch, from its attributes (-1 if too short)."""
    if len(records) < _ATTRIBUTES_OFFSET + 2:
        return -1
    return int(_ATTRIBUTES.unpack_from(records, _ATTRIBUTES_OFFSET)[0]) & 0x07


_TRANSACTIONAL: Final = 0x10


def _transactional(records: bytes | None) -> bool:
    """Is the (first) Kafka batch transactional (attributes bit 4)? Authorization of Produce
    needs Write on the transactional id when it is."""
    if records is None or len(records) < _ATTRIBUTES_OFFSET + 2:
        return False
    return bool(_ATTRIBUTES.unpack_from(records, _ATTRIBUTES_OFFSET)[0] & _TRANSACTIONAL)


#: Kafka's UNKNOWN_TOPIC_ID: a topic named by an id no topic has
_UNKNOWN_TOPIC_ID: Final = 100

#: APIs the Kafka listener answers itself, with no replog handler behind them.
_OWN: Final = frozenset({p.ApiKey.API_VERSIONS, p.ApiKey.DESCRIBE_CLUSTER})
#: APIs of SASL listeners, answered by the socket server before authentication
_SASL: Final = {
    p.ApiKey.SASL_HANDSHAKE: p.SaslHandshakeRequest,
    p.ApiKey.SASL_AUTHENTICATE: p.SaslAuthenticateRequest,
}

_Handler = Callable[[KafkaRequest, p.RequestHeader], Awaitable[Any]]


class KafkaProtocolApis:
    """The request channel of a broker's Kafka listener (see
    :class:`~replication.server.socket_server.RequestChannel`)."""

    def __init__(self, apis: KafkaApis, *, sasl: bool = False) -> None:
        self.apis = apis
        #: a SASL listener: SaslHandshake and SaslAuthenticate are served (by the gate)
        self.sasl = sasl
        self._special: dict[int, _Handler] = {
            p.ApiKey.API_VERSIONS: self._api_versions,
            p.ApiKey.PRODUCE: self._produce,
            p.ApiKey.FETCH: self._fetch,
            p.ApiKey.METADATA: self._metadata,
            p.ApiKey.FIND_COORDINATOR: self._find_coordinator,
            p.ApiKey.LEAVE_GROUP: self._leave_group,
            p.ApiKey.DESCRIBE_CLUSTER: self._describe_cluster,
            p.ApiKey.LIST_TRANSACTIONS: self._list_transactions,
            p.ApiKey.CONSUMER_GROUP_HEARTBEAT: self._consumer_group_heartbeat,
        }

    # --- RequestChannel ---------------------------------------------------------------------

    def decode(self, frame: bytes) -> KafkaRequest:
        request = decode_request(frame)
        if not self._serves(request.api_key):
            raise UnsupportedVersionError(
                f"{p.ApiKey(request.api_key).name} is not served by this node yet"
            )
        return request

    async def handle(self, request: KafkaRequest) -> Parts | None:
        response = await self.answer(request)
        return None if response is None else self.encode(request, response)

    async def answer(self, request: KafkaRequest) -> Any:
        header = p.RequestHeader(
            api_key=request.api_key,
            api_version=0,
            correlation_id=request.correlation_id,
            client_id=request.client_id,
        )
        if request.api_key in _SASL:
            raise IllegalSaslStateError(
                f"{p.ApiKey(request.api_key).name} after authentication (re-authentication is "
                "not supported)"
            )
        special = self._special.get(request.api_key)
        if special is not None:
            response = await special(request, header)
        else:
            replog_request: Any = to_replog(request.body, _REQUESTS[p.ApiKey(request.api_key)])
            response = await self.apis.handle(header, replog_request)
        return response

    def client_id(self, request: KafkaRequest) -> str:
        return request.client_id or ""

    async def unsupported(self, frame: bytes, err: UnsupportedVersionError) -> Parts | None:
        """ApiVersions at a version this listener does not know: UNSUPPORTED_VERSION at v0,
        with the versions it does serve, so the client can retry with one of them (as Kafka
        answers); any other API or version closes the connection."""
        head = peek_header(frame)
        if head is None or head[0] != p.ApiKey.API_VERSIONS:
            return None
        body = {"error_code": UnsupportedVersionError.code, "api_keys": self._api_keys()}
        return self._encode(p.ApiKey.API_VERSIONS, 0, head[2], body)

    def describe(self, request: KafkaRequest) -> str:
        return f"Kafka {p.ApiKey(request.api_key).name} v{request.api_version}"

    def request_name(self, request: KafkaRequest) -> str:
        # a Kafka client's Fetch is a consumer's: followers fetch over replog's protocol
        return p.ApiKey(request.api_key).kafka_name

    def api_key(self, request: KafkaRequest) -> int:
        return request.api_key

    def api_version(self, request: KafkaRequest) -> int:
        return request.api_version

    def sasl_body(self, request: KafkaRequest) -> Any:
        return to_replog(request.body, _SASL[p.ApiKey(request.api_key)])

    def encode(self, request: KafkaRequest, response: Any) -> Parts:
        return self._encode(request.api_key, request.api_version, request.correlation_id, response)

    # --- helpers ----------------------------------------------------------------------------

    def _serves(self, api_key: int) -> bool:
        return api_key in _OWN or api_key in self.apis.handlers or (self.sasl and api_key in _SASL)

    def _api_keys(self) -> list[dict[str, int]]:
        served = {**SERVED_VERSIONS, **(SASL_VERSIONS if self.sasl else {})}
        return [
            {"api_key": int(key), "min_version": lo, "max_version": hi}
            for key, (lo, hi) in sorted(served.items())
            if self._serves(key)
        ]

    @staticmethod
    def _encode(api_key: int, api_version: int, correlation_id: int, response: Any) -> Parts:
        body: Any = to_kafka(response, response_class(api_key, api_version))
        return encode_response(api_key, api_version, correlation_id, body)

    @property
    def image(self) -> MetadataImage:
        return self.apis.image

    def _kafka_address(self, broker_id: int) -> tuple[str, int] | None:
        broker = self.image.broker(broker_id)
        return broker.endpoint(KAFKA_LISTENER) if broker is not None else None

    # --- handlers that are more than a translation ------------------------------------------

    async def _api_versions(self, request: KafkaRequest, header: p.RequestHeader) -> Any:
        features: list[tuple[str, int, int]] = []
        if self._serves(p.ApiKey.CONSUMER_GROUP_HEARTBEAT):
            features = [f for f in FEATURES if f[0] == "group.version"]
        return {
            "api_keys": self._api_keys(),
            "supported_features": [
                {"name": name, "min_version": lo, "max_version": hi} for name, lo, hi in features
            ],
            "finalized_features_epoch": self.image.version if features else -1,
            "finalized_features": [
                {"name": name, "min_version_level": hi, "max_version_level": hi}
                for name, _, hi in features
            ],
        }

    async def _consumer_group_heartbeat(
        self, request: KafkaRequest, header: p.RequestHeader
    ) -> Any:
        """Translated as any, but for the assignment: Kafka's is a nullable struct (replog's
        a nullable array of its topics)."""
        heartbeat = to_replog(request.body, p.ConsumerGroupHeartbeatRequest)
        response: p.ConsumerGroupHeartbeatResponse = await self.apis.handle(header, heartbeat)
        assignment = response.assignment
        return {
            **vars_of(response),
            "assignment": None if assignment is None else {"topic_partitions": assignment},
        }

    def _compacted(self, key: TopicPartition) -> bool:
        """Whether this broker's replica of ``key`` is compacted (cleanup.policy); a partition
        it does not host is refused by the append with its own error."""
        partition = self.apis.replica_manager.partitions.get(key)
        return partition is not None and partition.log.config.compact

    async def _produce(self, request: KafkaRequest, header: p.RequestHeader) -> Any:
        body: Any = request.body
        entries: list[tuple[str, int, bytes | bytearray | memoryview | None]] = []
        refused: dict[TopicPartition, ReplogError] = {}
        denied = self.apis.authorize_produce(
            getattr(body, "transactional_id", None),
            any(_transactional(part.records) for t in body.topic_data for part in t.partition_data),
            (t.name for t in body.topic_data),
        )
        for topic in body.topic_data:
            for part in topic.partition_data:
                if topic.name in denied:
                    refused[TopicPartition(topic.name, part.index)] = denied[topic.name]
                    continue
                try:
                    data = part.records if part.records is not None else b""
                    if request.api_version < _ZSTD_SINCE and _codec(data) == _ZSTD:
                        raise UnsupportedCompressionTypeError(
                            f"zstd needs Produce v{_ZSTD_SINCE} or later; this request is "
                            f"v{request.api_version}"
                        )
                    compacted = self._compacted(TopicPartition(topic.name, part.index))
                    records = kafka_to_replog(data, compacted=compacted)
                except ReplogError as err:
                    refused[TopicPartition(topic.name, part.index)] = err
                    continue
                entries.append((topic.name, part.index, records))
        timeout_ms = int(body.timeout.total_seconds() * 1000)
        results = await self.apis.replica_manager.append_records(body.acks, timeout_ms, entries)
        if body.acks == 0:
            return None
        responses = []
        for topic in body.topic_data:
            partitions = []
            for part in topic.partition_data:
                key = TopicPartition(topic.name, part.index)
                error = refused.get(key)
                if error is not None:
                    partitions.append(
                        {
                            "index": part.index,
                            "error_code": error_code(error),
                            "base_offset": -1,
                            "error_message": error_message(error),
                        }
                    )
                    continue
                r = results[key]
                partitions.append(
                    {
                        "index": part.index,
                        "error_code": error_code(r.error),
                        "base_offset": r.base_offset,
                        "log_append_time_ms": -1,
                        "log_start_offset": r.log_start_offset,
                        "error_message": error_message(r.error),
                    }
                )
            responses.append({"name": topic.name, "partition_responses": partitions})
        return {"responses": responses}

    async def _fetch(self, request: KafkaRequest, header: p.RequestHeader) -> Any:
        fetch = to_replog(request.body, p.FetchRequest)
        # A Kafka client is a consumer, whatever replica id it sends: only replog's own
        # followers (on the replog listener) may fetch past the high watermark.
        fetch = dataclasses.replace(fetch, replica_id=p.CONSUMER_REPLICA_ID)
        response: p.FetchResponse = await self.apis.handle(header, fetch)
        return {
            "error_code": response.error_code,
            "session_id": response.session_id,
            "responses": [
                {
                    "topic": t.topic,
                    "partitions": [
                        {**vars_of(part), "records": _kafka_records(part.records)}
                        for part in t.partitions
                    ],
                }
                for t in response.responses
            ],
        }

    def _kafka_brokers(self) -> list[dict[str, Any]]:
        """The live brokers, at their Kafka listeners."""
        brokers = []
        for b in self.image.brokers:
            address = b.endpoint(KAFKA_LISTENER)
            if address is not None and not b.fenced:
                brokers.append(
                    {
                        "node_id": b.broker_id,
                        "broker_id": b.broker_id,
                        "host": address[0],
                        "port": address[1],
                        "rack": b.rack,
                    }
                )
        return brokers

    async def _describe_cluster(self, request: KafkaRequest, header: p.RequestHeader) -> Any:
        return {
            "cluster_id": self.image.cluster_id,
            "controller_id": self.apis.config.broker_id,
            "brokers": self._kafka_brokers(),
        }

    async def _metadata(self, request: KafkaRequest, header: p.RequestHeader) -> Any:
        metadata = to_replog(request.body, p.MetadataRequest)
        image = self.image
        unknown_ids: list[uuid.UUID] = []
        if request.body.topics is not None:
            # Metadata v10+ may name a topic by id instead (the name null): answer by name, or
            # UNKNOWN_TOPIC_ID for an id no topic has
            by_id = {t.topic_id: t.name for t in image.topics}
            names = []
            for t in request.body.topics:
                if t.name is not None:
                    names.append(p.MetadataRequestTopic(name=t.name))
                elif t.topic_id is not None and (name := by_id.get(t.topic_id.hex)) is not None:
                    names.append(p.MetadataRequestTopic(name=name))
                else:
                    unknown_ids.append(t.topic_id or uuid.UUID(int=0))
            metadata = dataclasses.replace(metadata, topics=names)
        response: p.MetadataResponse = await self.apis.handle(header, metadata)
        image = self.image
        topics: list[dict[str, Any]] = [
            {"error_code": _UNKNOWN_TOPIC_ID, "name": "", "topic_id": topic_id}
            for topic_id in unknown_ids
        ]
        for t in response.topics:
            info = image.topic(t.name)
            topic_id = uuid.UUID(info.topic_id) if info is not None and info.topic_id else None
            if t.error_code == TopicAuthorizationFailedError.code:
                topic_id = None  # a topic it may not Describe: not even its id (as Kafka)
            topics.append({**vars_of(t), "topic_id": topic_id or uuid.UUID(int=0)})
        return {
            "brokers": self._kafka_brokers(),
            "cluster_id": response.cluster_id,
            # Any broker forwards what Kafka sends to the controller (CreateTopics, ...), so
            # this one is the controller as far as a Kafka client needs to know.
            "controller_id": self.apis.config.broker_id,
            "topics": topics,
        }

    async def _find_coordinator(self, request: KafkaRequest, header: p.RequestHeader) -> Any:
        body = request.body
        keys = list(getattr(body, "coordinator_keys", ())) or [getattr(body, "key", "")]
        coordinators = []
        for key in keys:
            found: p.FindCoordinatorResponse = await self.apis.handle(
                header, p.FindCoordinatorRequest(key=key, key_type=getattr(body, "key_type", 0))
            )
            entry: dict[str, Any] = {
                "key": key,
                "error_code": found.error_code,
                "error_message": found.error_message,
                "node_id": -1,
                "host": "",
                "port": -1,
            }
            if found.error_code == 0:
                address = self._kafka_address(found.node_id)
                if address is None:
                    entry["error_code"] = CoordinatorNotAvailableError.code
                    entry["error_message"] = (
                        f"broker {found.node_id} coordinates {key!r} but has no Kafka listener"
                    )
                else:
                    entry.update(node_id=found.node_id, host=address[0], port=address[1])
            coordinators.append(entry)
        if request.api_version >= 4:
            return {"coordinators": coordinators}
        return coordinators[0]

    async def _list_transactions(self, request: KafkaRequest, header: p.RequestHeader) -> Any:
        """The transactions this broker coordinates (Kafka's admin client asks every broker
        and merges the answers). replog has one transaction coordinator, on the leader of
        ``__transaction_state``-0: any other broker coordinates none, and answers an empty
        list, as a Kafka broker that coordinates no transactional id does. The producer id
        and (v1) duration filters are applied here; a state filter Kafka does not know is
        named in ``unknown_state_filters``, as Kafka's coordinator names it. v2's transactional
        id pattern (KIP-1152, a Java regular expression) must match a whole id, as Java's
        ``Matcher.matches``; it is read by Python's ``re``, which reads the syntax the two
        share (classes, quantifiers, groups, alternation); one that does not compile is
        INVALID_REGULAR_EXPRESSION, as Kafka answers."""
        body: Any = request.body
        pattern_text = getattr(body, "transactional_id_pattern", None)
        pattern = None
        if pattern_text:
            try:
                pattern = re.compile(pattern_text)
            except re.error as err:
                log.info("ListTransactions: pattern %r does not compile: %s", pattern_text, err)
                return {"error_code": InvalidRegularExpressionError.code}
        states = list(body.state_filters)
        known = {state.value for state in TxnState}
        unknown = [state for state in states if state not in known]
        response: p.ListTransactionsResponse = await self.apis.handle(
            header, p.ListTransactionsRequest(state_filters=[s for s in states if s in known])
        )
        if response.error_code == NotCoordinatorError.code:
            response = p.ListTransactionsResponse()
        if unknown and not set(states) - set(unknown):
            listings: list[p.TransactionListing] = []  # only unknown states: none match
        else:
            listings = list(response.transactions)
        if pattern is not None:
            listings = [t for t in listings if pattern.fullmatch(t.transactional_id)]
        producer_ids = set(body.producer_id_filters)
        if producer_ids:
            listings = [t for t in listings if t.producer_id in producer_ids]
        duration_ms = int(getattr(body, "duration_filter", -1))  # v1+, in ms; -1: none
        if duration_ms >= 0:
            # running longer than the filter: only open transactions have a start time
            now_ms = int(time.time() * 1000)
            listings = [
                t
                for t in listings
                if t.transaction_start_time_ms >= 0
                and now_ms - t.transaction_start_time_ms >= duration_ms
            ]
        return {
            "error_code": response.error_code,
            "unknown_state_filters": unknown,
            "transaction_states": [
                {
                    "transactional_id": t.transactional_id,
                    "producer_id": t.producer_id,
                    "transaction_state": t.transaction_state,
                }
                for t in listings
            ],
        }

    async def _leave_group(self, request: KafkaRequest, header: p.RequestHeader) -> Any:
        leave = to_replog(request.body, p.LeaveGroupRequest)
        member_id = getattr(request.body, "member_id", None)
        if member_id is not None:  # v0-v2: one member, by id
            leave = p.LeaveGroupRequest(
                group_id=leave.group_id, members=[p.MemberIdentity(member_id=member_id)]
            )
        return await self.apis.handle(header, leave)


def vars_of(message: Any) -> dict[str, Any]:
    """The fields of a replog message as a dict (shallow)."""
    return {name: getattr(message, name) for name in message.__dataclass_fields__}


def _kafka_records(records: Any) -> bytes | None:
    if records is None:
        return None
    return replog_to_kafka(records) if len(records) else b""
