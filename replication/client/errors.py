"""Errors raised by the client library itself (no wire code of their own).

They extend the one tree in :mod:`replication.errors`; wire errors (UnknownTopicOrPartitionError,
RecordTooLargeError, ...) are raised as their own classes from there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replication.errors import AuthorizationError, OffsetOutOfRangeError, ReplogError

if TYPE_CHECKING:
    from replication.client.config import ClientConfig

__all__ = [
    "ClientClosedError",
    "ConsumerStateError",
    "DeliveryTimeoutError",
    "NoOffsetForPartitionError",
    "PartitionNotAssignedError",
    "TransactionAbortedError",
    "TransactionStateError",
    "denied",
]


#: The operation a refused Metadata lookup was denied (Kafka checks Describe on the topic).
_LOOKUP_OPERATION = "Describe"


def denied(
    config: ClientConfig,
    cls: type[ReplogError],
    kind: str,
    name: str,
    operation: str = _LOOKUP_OPERATION,
) -> str:
    """The message of an error from an answer that carries none (Metadata's topic errors,
    AddPartitionsToTxn's partition errors): for an authorization failure, who was refused what
    (``User:alice is not authorized to Describe Topic:events``) and what to do; otherwise the
    error's own text."""
    if not issubclass(cls, AuthorizationError):
        return str(cls())
    from replication.security.connector import client_principal

    who = client_principal(config)
    return f"{who} is not authorized to {operation} {kind}:{name}. {cls()}"


class ClientClosedError(ReplogError, RuntimeError):
    """The client was closed; it cannot be used any more.

    Create a new Producer, Consumer or Admin.
    """


class DeliveryTimeoutError(ReplogError, TimeoutError):
    """Records were not delivered within delivery.timeout.ms (or flush() ran out of time).

    Check that the brokers run (`replog cluster status`), or raise delivery.timeout.ms.
    """


class NoOffsetForPartitionError(OffsetOutOfRangeError):
    """The partition has no position and auto.offset.reset is none.

    Call seek() (or seek_to_beginning / seek_to_end) before poll(), or set auto.offset.reset.
    """

    # A subclass without its own ``code`` is not registered in the wire-code table.


class PartitionNotAssignedError(ReplogError, ValueError):
    """The partition is not assigned to this consumer.

    assign() it before seek(), position() or pause().
    """


class ConsumerStateError(ReplogError, RuntimeError):
    """The call is not valid in the consumer's state (Kafka's IllegalStateException).

    A consumer either subscribe()s (with a group.id) or assign()s its partitions, not both.
    """


class TransactionStateError(ReplogError, RuntimeError):
    """The call is not valid in the producer's transaction state (Kafka's IllegalStateException).

    Transactional producers go init_transactions(), then begin_transaction(), send(),
    commit_transaction() or abort_transaction(), again and again; the message names the state.
    """


class TransactionAbortedError(ReplogError):
    """The record was not sent: its transaction was aborted first.

    Nothing of the aborted transaction is visible to read_committed consumers; send it again in
    a new transaction.
    """
