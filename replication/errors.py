"""Kafka's wire errors, and the client-side errors of the cluster layer.

Every class here extends the one tree in :mod:`logstore.errors`. The wire error table
(:func:`for_code`) is built at the end of this module from every class of both modules that has
a ``code``, so whoever can call ``for_code`` has the whole table. Codes, ``retriable`` and
``refresh_metadata`` follow Kafka's ``Errors`` enum (the Java exception hierarchy:
``InvalidMetadataException`` means retriable and refresh metadata).

Each docstring says what happened and what to do; it is the default message (on one line),
so ``raise NotLeaderOrFollowerError()`` says something useful.
Codes the log layer owns (-1, 1, 2, 10, 40, 56, 87) live in :mod:`logstore.errors` and are
re-exported here so callers need one import.
"""

from __future__ import annotations

from typing import Any

from logstore.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    ReplogError,
    UnknownServerError,
)

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "BrokerIdNotRegisteredError",
    "BrokerNotAvailableError",
    "BrokerUnreachableError",
    "ClusterAuthorizationFailedError",
    "CommitFailedError",
    "CommitStateUnknownError",
    "ConcurrentTransactionsError",
    "ConfigError",
    "CoordinatorLoadInProgressError",
    "CoordinatorNotAvailableError",
    "CorruptFrameError",
    "CorruptRecordError",
    "DuplicateBrokerRegistrationError",
    "DuplicateResourceError",
    "DuplicateSequenceNumberError",
    "ElectionNotNeededError",
    "EligibleLeadersNotAvailableError",
    "FencedInstanceIdError",
    "FencedLeaderEpochError",
    "FencedMemberEpochError",
    "FetchSessionIdNotFoundError",
    "FrameTooLargeError",
    "GroupAuthorizationFailedError",
    "GroupIdNotFoundError",
    "GroupMaxSizeReachedError",
    "GroupNotEmptyError",
    "GroupSubscribedToTopicError",
    "IllegalGenerationError",
    "IllegalSaslStateError",
    "InconsistentClusterIdError",
    "InconsistentGroupProtocolError",
    "IneligibleReplicaError",
    "InvalidFetchSessionEpochError",
    "InvalidFieldError",
    "InvalidFrameLengthError",
    "InvalidGroupIdError",
    "InvalidPartitionsError",
    "InvalidProducerEpochError",
    "InvalidProducerIdMappingError",
    "InvalidRecordError",
    "InvalidRegularExpressionError",
    "InvalidReplicaAssignmentError",
    "InvalidReplicationFactorError",
    "InvalidRequestError",
    "InvalidRequiredAcksError",
    "InvalidSessionTimeoutError",
    "InvalidTopicError",
    "InvalidTransactionTimeoutError",
    "InvalidTxnStateError",
    "InvalidUpdateVersionError",
    "KafkaStorageError",
    "LeaderNotAvailableError",
    "MemberIdRequiredError",
    "NetworkError",
    "NoReassignmentInProgressError",
    "NotControllerError",
    "NotCoordinatorError",
    "NotEnoughReplicasAfterAppendError",
    "NotEnoughReplicasError",
    "NotLeaderOrFollowerError",
    "OffsetNotAvailableError",
    "OffsetOutOfRangeError",
    "OperationNotAttemptedError",
    "OutOfOrderSequenceNumberError",
    "PreferredLeaderNotAvailableError",
    "ProducerFencedError",
    "ProtocolError",
    "RebalanceInProgressError",
    "RecordTooLargeError",
    "ReplicaNotAvailableError",
    "ReplogError",
    "RequestTimedOutError",
    "ResourceNotFoundError",
    "SaslAuthenticationFailedError",
    "SecurityDisabledError",
    "SslAuthenticationError",
    "StaleBrokerEpochError",
    "StaleControllerEpochError",
    "StaleMemberEpochError",
    "TopicAlreadyExistsError",
    "TopicAuthorizationFailedError",
    "TransactionCoordinatorFencedError",
    "TransactionalIdAuthorizationFailedError",
    "TransactionalIdNotFoundError",
    "UnacceptableCredentialError",
    "UnknownLeaderEpochError",
    "UnknownMemberIdError",
    "UnknownProducerIdError",
    "UnknownServerError",
    "UnknownTopicOrPartitionError",
    "UnreleasedInstanceIdError",
    "UnstableOffsetCommitError",
    "UnsupportedAssignorError",
    "UnsupportedCompressionTypeError",
    "UnsupportedSaslMechanismError",
    "UnsupportedVersionError",
    "WireError",
    "for_code",
    "raise_for_code",
]


class WireError(ReplogError):
    """An error a peer reports on the wire."""


# --- topics, partitions and leadership ---------------------------------------------------------


class UnknownTopicOrPartitionError(WireError):
    """This broker does not host that topic or partition.

    Check the name with `replog topics list`; if the topic was just created or moved, the
    client refreshes its metadata and retries.
    """

    code = 3
    retriable = True
    refresh_metadata = True


class LeaderNotAvailableError(WireError):
    """The partition has no leader right now (an election is in progress).

    Retry after refreshing metadata; if it persists, check `replog cluster status` for
    brokers that are down.
    """

    code = 5
    retriable = True
    refresh_metadata = True


class NotLeaderOrFollowerError(WireError):
    """This broker is not the leader (or a follower) of that partition any more.

    Leadership moved: refresh metadata and send the request to the new leader.
    """

    code = 6
    retriable = True
    refresh_metadata = True


class RequestTimedOutError(WireError):
    """The broker did not complete the request within its timeout.

    For acks=all produce requests the outcome is unknown: an idempotent producer retries
    safely; raise timeout_ms if replicas are slow.
    """

    code = 7
    retriable = True


class BrokerNotAvailableError(WireError):
    """The broker named in the request is not alive.

    Check `replog cluster status`; the client refreshes metadata and retries.
    """

    code = 8
    retriable = True
    refresh_metadata = True


class ReplicaNotAvailableError(WireError):
    """A replica of the partition is not available on the broker that should hold it.

    Retry after refreshing metadata; if it persists, check that broker's storage.
    """

    # Kafka: ReplicaNotAvailableException extends InvalidMetadataException.
    code = 9
    retriable = True
    refresh_metadata = True


class StaleControllerEpochError(WireError):
    """The request came from a controller whose epoch is older than the current one.

    A newer controller has taken over; the stale controller must stop acting.
    """

    code = 11


class NetworkError(WireError):
    """The connection to the broker broke before the response arrived.

    Retry after refreshing metadata; the outcome of the request is unknown.
    """

    code = 13  # NETWORK_EXCEPTION
    retriable = True
    refresh_metadata = True


class CoordinatorLoadInProgressError(WireError):
    """The coordinator is still loading its state after taking over.

    Retry shortly.
    """

    code = 14
    retriable = True


class CoordinatorNotAvailableError(WireError):
    """The coordinator is not available (not elected yet, or its broker is down).

    Find the coordinator again and retry.
    """

    code = 15
    retriable = True


class NotCoordinatorError(WireError):
    """This broker is not the coordinator for that id.

    Find the coordinator again and retry.
    """

    code = 16
    retriable = True


class InvalidTopicError(WireError, ValueError):
    """The topic name is not valid.

    Use 1-249 characters from [a-zA-Z0-9._-], not "." or "..".
    """

    code = 17  # INVALID_TOPIC_EXCEPTION


class NotEnoughReplicasError(WireError):
    """Fewer in-sync replicas than min.insync.replicas; the batch was not appended.

    Nothing was written: retry once failed brokers are back (`replog cluster status`), or
    lower min.insync.replicas for the topic.
    """

    code = 19
    retriable = True


class NotEnoughReplicasAfterAppendError(WireError):
    """The batch was appended, but the ISR shrank below min.insync.replicas before it was acked.

    The batch may be visible later: an idempotent producer retries safely (it is appended once).
    """

    code = 20
    retriable = True


class InvalidRequiredAcksError(WireError, ValueError):
    """The acks value is not one of 0, 1 or -1 (all).

    Set acks to 0, 1 or all.
    """

    code = 21


class IllegalGenerationError(WireError):
    """The generation id is not the current one.

    Rejoin to get the current generation.
    """

    code = 22


class InconsistentGroupProtocolError(WireError):
    """The member's protocol type, or every protocol it offers, differs from the group's.

    Join with the group's protocol type (``consumer`` for consumers) and a protocol (assignor)
    the other members support, or use another group id.
    """

    code = 23


class InvalidGroupIdError(WireError, ValueError):
    """The group id is empty or null.

    Give a non-empty ``group.id``.
    """

    code = 24


class UnknownMemberIdError(WireError):
    """The coordinator does not know this member id: its session expired, or it left.

    Rejoin the group with an empty member id.
    """

    code = 25


class InvalidSessionTimeoutError(WireError, ValueError):
    """The session timeout is outside the broker's group.min/max.session.timeout.ms.

    Set ``session.timeout.ms`` within the broker's bounds.
    """

    code = 26


class RebalanceInProgressError(WireError):
    """The group is rebalancing.

    Rejoin the group (its next generation) and retry with the new generation id.
    """

    code = 27


class GroupNotEmptyError(WireError):
    """The group still has members.

    Stop (or close) its consumers first, then delete it or reset its offsets.
    """

    code = 68


class GroupIdNotFoundError(WireError):
    """No group has this id on its coordinator.

    Check the group id (``replog consumer-groups list``).
    """

    code = 69


class GroupSubscribedToTopicError(WireError):
    """The group's members are subscribed to the topic, so its offsets of it stay.

    Stop the group's consumers (or unsubscribe them from the topic) first, then delete the
    offsets.
    """

    code = 86


class InvalidRegularExpressionError(WireError):
    """A pattern in the request is not a valid regular expression.

    Fix the pattern (a Java regular expression, such as ``orders-.*``).
    """

    code = 128


class MemberIdRequiredError(WireError):
    """The member joined without a member id; the response carries the one assigned to it.

    Join again with that member id (clients do this by themselves).
    """

    code = 79


class GroupMaxSizeReachedError(WireError):
    """The group has group.max.size members already.

    Use fewer consumers, or raise the broker's group.max.size.
    """

    code = 81


class FencedInstanceIdError(WireError):
    """Another member joined with this group.instance.id after this one: this one is fenced.

    Give every consumer its own ``group.instance.id``; a zombie with the same id stops here.
    """

    code = 82


class FencedMemberEpochError(WireError):
    """The member epoch of a ConsumerGroupHeartbeat is not the one the coordinator knows.

    The member gives up its partitions and joins again with epoch 0 (clients do this).
    """

    code = 110


class UnreleasedInstanceIdError(WireError):
    """A static member joined with a ``group.instance.id`` its previous member still holds.

    Stop the other consumer with that ``group.instance.id``, or wait for it to leave.
    """

    code = 111


class UnsupportedAssignorError(WireError):
    """The ConsumerGroupHeartbeat names a server assignor the broker does not have.

    Use ``uniform`` or ``range`` (``group.remote.assignor``).
    """

    code = 112


class StaleMemberEpochError(WireError):
    """An offset commit carries a member epoch older than the member's current one.

    The consumer retries with its current epoch (clients do this).
    """

    code = 113


class UnstableOffsetCommitError(WireError):
    """A transaction has committed offsets of this partition that it has not finished yet.

    Retry: the answer settles when the transaction commits or aborts.
    """

    code = 88
    retriable = True


class UnsupportedVersionError(WireError):
    """The peer does not support this request's API or version.

    Upgrade the older side, or let the client negotiate versions with ApiVersions.
    """

    code = 35


class TopicAlreadyExistsError(WireError):
    """A topic with that name already exists.

    Use it, or delete it first with `replog topics delete`.
    """

    code = 36


class InvalidPartitionsError(WireError, ValueError):
    """The number of partitions is not valid (it must be at least 1, or -1 for the default).

    Pass a positive num_partitions.
    """

    code = 37


class InvalidReplicationFactorError(WireError, ValueError):
    """The replication factor is not valid: below 1, or larger than the number of live brokers.

    Pass a replication factor between 1 and the number of brokers in `replog cluster status`.
    """

    code = 38


class UnsupportedCompressionTypeError(WireError):
    """The request's version cannot carry the records' compression codec (zstd needs Produce
    v7 or later, as in Kafka).

    Upgrade the client, or produce with another codec.
    """

    code = 76


class InvalidReplicaAssignmentError(WireError, ValueError):
    """A replica assignment is not valid: wrong count, repeated or unknown brokers.

    Name, for each new partition, as many distinct live brokers as the topic's replication
    factor, or leave the assignment to the controller.
    """

    code = 39


class NotControllerError(WireError):
    """This broker is not the active controller.

    Refresh metadata to find the controller and retry.
    """

    code = 41
    retriable = True
    refresh_metadata = True


class InvalidRequestError(WireError):
    """The request is malformed or not valid for this API version.

    This is a client bug or a version mismatch; upgrade the client or report it.
    """

    code = 42


class OutOfOrderSequenceNumberError(WireError):
    """The broker received a sequence number that leaves a gap after the last one it appended.

    Records may have been lost between producer and broker; the idempotent producer must
    reset (abort its transaction or get a new producer id).
    """

    code = 45


class DuplicateSequenceNumberError(WireError):
    """The batch's sequence number was already appended (a retry of an acked batch).

    Nothing to do: the batch is already in the log once.
    """

    code = 46


class InvalidProducerEpochError(WireError):
    """The producer epoch is older than the current one for this producer id.

    Another producer instance with the same transactional id took over; close this one.
    """

    code = 47


class InvalidTxnStateError(WireError):
    """The request is not valid in the transaction's current state.

    For example, adding partitions to a transaction that is committing: abort it and start over.
    """

    code = 48


class InvalidProducerIdMappingError(WireError):
    """The producer id is not the one the coordinator holds for this transactional id.

    Call InitProducerId again to get the current producer id and epoch.
    """

    code = 49


class InvalidTransactionTimeoutError(WireError, ValueError):
    """transaction.timeout.ms is larger than the broker allows (or not positive).

    Lower transaction.timeout.ms to at most the broker's transaction.max.timeout.ms.
    """

    code = 50


class ConcurrentTransactionsError(WireError):
    """The previous transaction of this producer is still being completed.

    Retry shortly; the coordinator is writing its markers.
    """

    code = 51
    retriable = True


class TransactionCoordinatorFencedError(WireError):
    """The transaction coordinator that sent this request has been replaced by a newer one.

    The stale coordinator must stop; the new one takes over its transactions.
    """

    code = 52


class UnknownProducerIdError(WireError):
    """The broker has no state for this producer id (it expired or was never written here).

    The idempotent producer must reset its sequence numbers (get a new producer id).
    """

    code = 59


class FetchSessionIdNotFoundError(WireError):
    """The fetch session id is not in the leader's session cache (evicted or never created).

    Send a full fetch request to start a new session.
    """

    code = 70
    retriable = True


class InvalidFetchSessionEpochError(WireError):
    """The fetch session epoch is not the one the leader expects.

    Send a full fetch request to start a new session.
    """

    code = 71
    retriable = True


class FencedLeaderEpochError(WireError):
    """The request's leader epoch is older than the broker's: the client's metadata is stale.

    Refresh metadata and retry with the current leader epoch.
    """

    code = 74
    retriable = True
    refresh_metadata = True


class UnknownLeaderEpochError(WireError):
    """The request's leader epoch is newer than the broker's: the broker has not caught up yet.

    Refresh metadata and retry shortly.
    """

    code = 75
    retriable = True
    refresh_metadata = True


class OffsetNotAvailableError(WireError):
    """The leader cannot answer the offset query yet (the high watermark is not known).

    Retry shortly.
    """

    code = 78
    retriable = True


class ProducerFencedError(WireError):
    """A newer producer with the same transactional id has been initialised; this one is fenced.

    Close this producer: its transaction is aborted.
    """

    code = 90


class InvalidUpdateVersionError(WireError):
    """The partition epoch in the update is not the current one (someone else changed it first).

    Refresh the partition state and retry the update from it.
    """

    code = 95


class DuplicateBrokerRegistrationError(WireError):
    """Another live process is registered with this broker id.

    Give every broker its own broker.id; a restarted broker registers once its previous
    session has expired (broker.session.timeout.ms).
    """

    code = 101


class InconsistentClusterIdError(WireError):
    """The broker's log.dir belongs to another cluster than the metadata it was started on.

    Its meta.properties names the cluster the log.dir was first written for: point
    metadata.log.dir at that cluster's metadata (every node of a cluster shares one), or
    start the broker on an empty log.dir.
    """

    code = 104


class StaleBrokerEpochError(WireError):
    """The broker epoch in the request is not the broker's current registration.

    The broker re-registers with the controller and carries on.
    """

    code = 77


class BrokerIdNotRegisteredError(WireError):
    """The broker id is not registered with the controller.

    Register the broker (restart it) before sending heartbeats.
    """

    code = 102


class IneligibleReplicaError(WireError):
    """The proposed ISR contains a replica that may not join it (fenced or shutting down).

    Refresh the partition state and propose a new ISR.
    """

    code = 107


class TransactionalIdNotFoundError(WireError):
    """The transaction coordinator knows no such transactional id (never used, or expired after
    transactional.id.expiration.ms).

    Check the id; a producer with it starts afresh with init_transactions().
    """

    code = 105


# --- partition reassignment and leader election (KIP-455, KIP-460) -------------------------------


class PreferredLeaderNotAvailableError(WireError):
    """The preferred leader (the first replica) is not live or not in the ISR.

    Wait until it is back and has caught up (see `replog topics describe`), then elect again.
    """

    code = 80


class EligibleLeadersNotAvailableError(WireError):
    """No live replica may lead this partition (an unclean election found none).

    Bring one of the partition's replicas back, then elect again.
    """

    code = 83


class ElectionNotNeededError(WireError):
    """The partition already has the leader this election would choose.

    Nothing to do.
    """

    code = 84


class NoReassignmentInProgressError(WireError):
    """The partition has no reassignment in progress, so there is nothing to cancel.

    See `replog partitions reassign --verify` for the ones in progress.
    """

    code = 85


# --- wire protocol (client and broker side, never sent as their own code) ------------------------


class ProtocolError(InvalidRequestError):
    """Bytes on the wire do not follow the replog protocol.

    The peer is not speaking replog's protocol, or a different version of it.
    """

    # Kafka answers a malformed request with INVALID_REQUEST (42) when it can answer at all;
    # these subclasses carry that code by inheritance and do not register a code of their own.


class CorruptFrameError(ProtocolError):
    """A frame could not be decoded; the connection that carried it is closed.

    Check that the peer speaks the replog protocol at a supported version.
    """


class InvalidFrameLengthError(CorruptFrameError):
    """A frame's length prefix is negative; the connection is closed.

    The peer is not speaking the replog protocol.
    """


class FrameTooLargeError(InvalidFrameLengthError):
    """A frame's length prefix is larger than the limit; the connection is closed.

    Raise socket.request.max.bytes (broker) or the client's max bytes, or check that the peer
    speaks the replog protocol (a TLS or HTTP client looks like a huge frame).
    """


class InvalidFieldError(ProtocolError, ValueError):
    """A message field holds a value its wire type cannot carry, so it cannot be encoded.

    Fix the value (e.g. an int16 field out of range, a string longer than 32767 bytes).
    """


# --- security: authentication and authorization ------------------------------------------------


class AuthorizationError(WireError):
    """The principal may not do this (an ACL denies it, or none allows it).

    Ask an operator to grant it: `replog acls add --allow-principal User:NAME --operation OP
    --topic|--group|--transactional-id|--cluster ...`.
    """


class TopicAuthorizationFailedError(AuthorizationError):
    """The principal is not authorized to access this topic.

    Ask an operator for an ACL on it: `replog acls add --allow-principal User:NAME --operation
    Read|Write|Describe|... --topic NAME`.
    """

    code = 29


class GroupAuthorizationFailedError(AuthorizationError):
    """The principal is not authorized to use this consumer group.

    Ask an operator for an ACL on it: `replog acls add --allow-principal User:NAME --operation
    Read --group NAME`.
    """

    code = 30


class ClusterAuthorizationFailedError(AuthorizationError):
    """The principal is not authorized for this cluster operation.

    Ask an operator for an ACL on the cluster: `replog acls add --allow-principal User:NAME
    --operation OP --cluster`.
    """

    code = 31


class TransactionalIdAuthorizationFailedError(AuthorizationError):
    """The principal is not authorized to use this transactional id.

    Ask an operator for an ACL on it: `replog acls add --allow-principal User:NAME --operation
    Write --transactional-id ID` (--resource-pattern-type prefixed for a prefix).
    """

    code = 53


class SecurityDisabledError(WireError):
    """Security features (ACLs) are not enabled on this cluster.

    Set authorizer.class.name on the brokers and controllers (see docs/security.md).
    """

    code = 54


class OperationNotAttemptedError(WireError):
    """The broker did not attempt this part of the request because another part failed.

    Fix the other error of the same request (an authorization failure, usually) and retry.
    """

    code = 55


class ResourceNotFoundError(WireError):
    """The resource named does not exist (e.g. a SCRAM credential to describe or delete).

    Check the name (`replog users list` shows the users and their mechanisms).
    """

    code = 91


class DuplicateResourceError(WireError):
    """The request names the same resource twice (e.g. one user's credential for one
    mechanism both upserted and deleted).

    Send each change of a resource once per request.
    """

    code = 92


class UnacceptableCredentialError(WireError):
    """The credential is not acceptable: an empty user name, an iteration count outside
    4096..16384, an empty salt, or a salted password of the wrong length.

    Fix the credential (`replog users add NAME --iterations 8192`).
    """

    code = 93


class AuthenticationError(WireError):
    """The connection could not be authenticated.

    Check the credentials (sasl.jaas.config or sasl.username/sasl.password, the certificates)
    and the mechanism (sasl.mechanism) against the broker's listener.
    """


class UnsupportedSaslMechanismError(AuthenticationError):
    """The broker does not enable this SASL mechanism on this listener.

    Use one of the mechanisms the broker lists (sasl.enabled.mechanisms), e.g. SCRAM-SHA-512.
    """

    code = 33


class IllegalSaslStateError(AuthenticationError):
    """A request came at the wrong step of the SASL handshake.

    Send SaslHandshake, then SaslAuthenticate rounds, before any other request.
    """

    code = 34


class SaslAuthenticationFailedError(AuthenticationError):
    """SASL authentication failed: an unknown user, a wrong password, or a malformed exchange.

    Check the user name and password (`replog users list` shows the users) and the mechanism.
    """

    code = 58


class SslAuthenticationError(AuthenticationError):
    """The TLS handshake failed: a certificate that is not trusted, has expired or does not
    name the host, or a peer that does not speak TLS.

    Check ssl.truststore.location (the CA that signed the broker's certificate), the
    certificate's dates and names, and that security.protocol matches the listener's.
    """

    retriable = False


# --- client side, no wire code ---------------------------------------------------------------


class BrokerUnreachableError(ReplogError, ConnectionError):
    """A broker could not be reached.

    Check that it runs (`replog cluster status`) and that --bootstrap-server / bootstrap.servers
    names the right host:port.
    """

    retriable = True
    refresh_metadata = True

    def __init__(self, host: str, port: int, reason: str = "") -> None:
        self.host = host
        self.port = port
        self.reason = reason
        detail = f": {reason}" if reason else ""
        super().__init__(
            f"cannot reach broker {host}:{port}{detail}; check that it runs "
            "(`replog cluster status`) and that --bootstrap-server / bootstrap.servers "
            "names the right host:port"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # The default reduce passes self.args (the message) back to __init__; keep the fields.
        return (type(self), (self.host, self.port, self.reason))


class CommitFailedError(WireError):
    """The commit did not happen; nothing of it is visible.

    It is safe to clean up (abort the transaction, delete temporary state) and retry the batch.
    """

    # pyiceberg's CommitFailedException: of the two, only this one may clean up.


class CommitStateUnknownError(WireError):
    """The outcome of the commit is unknown: it may or may not have happened.

    Do not clean up anything the commit may refer to; look the outcome up (or retry the
    idempotent commit) before acting.
    """

    # pyiceberg's CommitStateUnknownException: never clean up after this one.


# --- the wire error table ---------------------------------------------------------------------


def _coded_classes() -> dict[int, type[ReplogError]]:
    """Code -> class for every error of this module and of :mod:`logstore.errors`."""
    table: dict[int, type[ReplogError]] = {}
    pending: list[type[ReplogError]] = [ReplogError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        code = cls.__dict__.get("code")
        if code is None or cls.__module__ not in (__name__, "logstore.errors"):
            continue
        if code in table and table[code] is not cls:
            raise TypeError(f"error code {code} is taken by {table[code].__name__}")
        table[code] = cls
    return table


_BY_CODE: dict[int, type[ReplogError]] = _coded_classes()


def for_code(code: int) -> type[ReplogError] | None:
    """The error class for a wire error code; None for 0 (no error), UnknownServerError for a
    code this replog does not know."""
    if code == 0:
        return None
    return _BY_CODE.get(code, UnknownServerError)


def raise_for_code(code: int, message: str = "") -> None:
    """Raise the error for ``code`` unless it is 0."""
    cls = for_code(code)
    if cls is not None:
        raise cls(message) if message else cls()
