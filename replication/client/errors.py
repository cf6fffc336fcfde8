"""Errors raised by the client library itself (no wire code of their own).

They extend the one tree in :mod:`replication.errors`; wire errors (UnknownTopicOrPartitionError,
RecordTooLargeError, ...) are raised as their own classes from there.
"""

from __future__ import annotations

from replication.errors import OffsetOutOfRangeError, ReplogError

__all__ = [
    "ClientClosedError",
    "ConsumerStateError",
    "DeliveryTimeoutError",
    "NoOffsetForPartitionError",
    "PartitionNotAssignedError",
    "TransactionAbortedError",
    "TransactionStateError",
]


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
