"""The producer's idempotence and transaction state, as Kafka's ``TransactionManager``.

Idempotence. The producer gets a producer id and epoch (InitProducerId; with a
transactional.id from its coordinator, which fences older instances). Each batch is stamped
with them and with the partition's next sequence number when it is first sent (the stamp is
inside the CRC, so the bytes are built then and kept for retries): a retried batch carries the
same sequence numbers and the broker answers it with its original offsets instead of appending
it twice. At most one batch per partition is in flight, so sequence numbers reach each
partition in order.

A batch that fails for good after it was stamped leaves the partition's sequence unresolved:
the broker may or may not have appended it, so the next sequence number is unknown. Kafka's
answer, kept here: an idempotent producer takes a new producer id before its next batch (its
sequence numbers restart at 0 everywhere); a transactional producer can only abort, and the
abort bumps its epoch (InitProducerId again, which also restarts sequence numbers). A batch
the broker refused as too large is split and its halves take the refused batch's sequence
numbers again, since nothing of it was written.

Transactions. ``init_transactions`` -> ``begin_transaction`` -> sends -> ``commit_transaction``
or ``abort_transaction``. Before the first batch of a partition goes out in a transaction, the
sender adds the partition to the transaction (AddPartitionsToTxn; the partition's batches wait
meanwhile), so the coordinator knows where to write the COMMIT or ABORT markers. A failed
batch makes the transaction abortable only (commit raises, abort works); a fenced producer
(another instance called init_transactions with the same transactional.id, or the coordinator
aborted the transaction after transaction.timeout.ms) is fatal: every later call raises
ProducerFencedError and the producer can only be closed.

State is guarded by the accumulator's lock (the sender drains under it) except the producer
id, epoch and sequence numbers, which have a lock of their own (stamping happens in I/O
threads).
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Final

from logstore.batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, parse_header
from replication.client.accumulator import ProducerBatch
from replication.client.cluster import Cluster
from replication.client.config import ProducerConfig
from replication.client.coordinator import COORDINATOR_SLOT, CallState, CoordinatorClient
from replication.client.errors import TransactionAbortedError, TransactionStateError
from replication.client.retry import RetryPolicy
from replication.client.types import (
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    TopicPartition,
    TransactionHandle,
)
from replication.errors import (
    CommitFailedError,
    CommitStateUnknownError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    ProducerFencedError,
    ReplogError,
    for_code,
)
from replication.protocol import (
    GROUP_KEY_TYPE,
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnTopic,
    ApiKey,
    EndTxnRequest,
    InitProducerIdRequest,
    InitProducerIdResponse,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    TxnOffsetCommitRequest,
)

__all__ = ["TransactionManager", "TxnState", "increment_sequence"]

log = logging.getLogger(__name__)

TpKey = tuple[str, int]
_INT32_MAX: Final = 2**31 - 1
#: Errors that end a producer: a newer instance (or the coordinator) fenced it.
FENCED_ERRORS: Final = (
    ProducerFencedError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
)


#: the pooled connection of TxnOffsetCommit requests to a group's coordinator
_TXN_GROUP_SLOT: Final = COORDINATOR_SLOT + 4


def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment``, wrapping past int32 max to 0 as Kafka's sequence numbers do."""
    if sequence > _INT32_MAX - increment:
        return increment - (_INT32_MAX - sequence) - 1
    return sequence + increment


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized (call init_transactions())"
    READY = "ready (no transaction open: call begin_transaction())"
    IN_TRANSACTION = "in a transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "failed (call abort_transaction())"
    HANDED_OFF = "handed off (its transaction belongs to whoever holds the handle)"
    FATAL_ERROR = "fenced or failed for good (close it)"


class TransactionManager:
    """Producer id, epoch, sequence numbers and transaction state of one producer."""

    def __init__(
        self,
        config: ProducerConfig,
        cluster: Cluster,
        lock: threading.Lock,
        wake: threading.Condition,
    ) -> None:
        self.config = config
        self.transactional_id = config.transactional_id
        self.idempotent = config.enable_idempotence
        self._cluster = cluster
        #: the accumulator's lock: guards state and the partition sets below
        self._lock = lock
        #: the accumulator's ``ready`` condition: wakes the sender
        self._wake = wake
        self._seq_lock = threading.Lock()
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self._next_seq: dict[TpKey, int] = {}
        self._reset_pending = False
        self._init_attempts = 0
        self.init_retry_at = 0.0
        #: the waits between InitProducerId attempts (the sender thread retries them)
        self._backoff = RetryPolicy.of(config, None)
        self.state = TxnState.UNINITIALIZED if self.transactional else TxnState.READY
        #: the abortable or fatal error (None otherwise)
        self.error: ReplogError | None = None
        #: partitions of the open transaction known to the coordinator
        self.partitions: set[TpKey] = set()
        #: partitions with records in the transaction, not yet added
        self.pending: set[TpKey] = set()
        #: partitions in the AddPartitionsToTxn request in flight
        self.adding: set[TpKey] = set()
        #: an AddPartitionsToTxn of this transaction may have reached the coordinator
        self.maybe_open = False
        #: a stamped batch of this transaction failed: the abort must bump the epoch
        self.unresolved = False
        self._handle: TransactionHandle | None = None
        self._commit_state: CallState | None = None
        self.coordinator = (
            CoordinatorClient(cluster, self.transactional_id)
            if self.transactional_id is not None
            else None
        )

    @property
    def transactional(self) -> bool:
        return self.transactional_id is not None

    def __repr__(self) -> str:
        return (
            f"TransactionManager(id={self.transactional_id!r}, producer_id={self.producer_id}, "
            f"epoch={self.producer_epoch}, state={self.state.name})"
        )

    # --- errors ---------------------------------------------------------------------------------

    def fenced_error(self, cause: BaseException | None = None) -> ProducerFencedError:
        if self.transactional:
            why = (
                f"the producer with transactional.id={self.transactional_id!r} (producer id "
                f"{self.producer_id}, epoch {self.producer_epoch}) was fenced: another producer "
                "with the same transactional.id called init_transactions(), or its transaction "
                f"ran past transaction.timeout.ms={self.config.transaction_timeout_ms} and the "
                "coordinator aborted it"
            )
        else:
            why = (
                f"the idempotent producer (producer id {self.producer_id}, epoch "
                f"{self.producer_epoch}) was fenced by a newer epoch"
            )
        detail = f" ({cause})" if cause is not None else ""
        return ProducerFencedError(f"{why}{detail}; close this producer and create a new one")

    def _fatal(self, error: ReplogError) -> ReplogError:
        """Enter the fatal state (lock held); returns the error to raise."""
        if self.state is not TxnState.FATAL_ERROR:
            log.error("producer %r failed for good: %s", self.transactional_id, error)
            self.state = TxnState.FATAL_ERROR
            self.error = error
            self._wake.notify_all()
        return self.error or error

    def raise_if_fatal(self) -> None:
        if self.state is TxnState.FATAL_ERROR and self.error is not None:
            raise self.error

    def check_send(self) -> None:
        """Raise unless records may be sent now (lock not needed: a snapshot read)."""
        state = self.state
        if state is TxnState.FATAL_ERROR and self.error is not None:
            raise self.error
        if not self.transactional:
            return
        if state is TxnState.IN_TRANSACTION:
            return
        if state is TxnState.ABORTABLE_ERROR:
            raise TransactionStateError(
                f"cannot send: the transaction failed ({self.error}); call abort_transaction() "
                "and send again in a new transaction"
            ) from self.error
        raise TransactionStateError(
            f"cannot send: the transactional producer is {state.value}; call "
            "begin_transaction() first"
        )

    # --- the producer id (idempotent, not transactional) ---------------------------------------

    def needs_producer_id(self) -> bool:
        return (
            self.idempotent
            and not self.transactional
            and self.state is not TxnState.FATAL_ERROR
            and (self.producer_id < 0 or self._reset_pending)
        )

    def init_idempotent(self, now: float) -> None:
        """One InitProducerId (sender thread); on a retriable failure, retry after a backoff."""
        self._init_attempts += 1
        try:
            response: InitProducerIdResponse = self._cluster.any_connection_send(
                ApiKey.INIT_PRODUCER_ID,
                lambda version: InitProducerIdRequest(
                    transactional_id=None,
                    transaction_timeout_ms=self.config.transaction_timeout_ms,
                ),
                0,
            )
            if response.error_code:
                cls = for_code(response.error_code) or ReplogError
                raise cls(f"getting a producer id: {cls()}")
        except ReplogError as err:
            if err.retriable:
                delay = self._backoff.backoff_s(self._init_attempts, random.random())
                self.init_retry_at = now + delay
                log.warning(
                    "getting a producer id failed (attempt %d, retrying in %d ms): %s",
                    self._init_attempts,
                    round(delay * 1000),
                    err,
                )
                return
            with self._lock:
                self._fatal(err)
            return
        with self._seq_lock:
            old = self.producer_id
            self._set_producer(response.producer_id, response.producer_epoch)
            self._reset_pending = False
        self._init_attempts = 0
        if old >= 0:
            log.info(
                "idempotent producer reset: producer id %d -> %d (a batch failed after it was "
                "sent, or a partition's leader no longer knew the producer id: sequence numbers "
                "restart)",
                old,
                self.producer_id,
            )

    def _set_producer(self, producer_id: int, producer_epoch: int) -> None:
        """A new producer id or epoch: sequence numbers restart at 0 (seq lock held)."""
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self._next_seq.clear()

    # --- stamping batches (I/O threads) ---------------------------------------------------------

    def stamp(self, batch: ProducerBatch) -> None:
        """Give a batch about to be sent for the first time its producer id, epoch and
        sequence numbers (a retried batch keeps its stamp)."""
        if not self.idempotent or batch.base_sequence != NO_SEQUENCE:
            return
        with self._seq_lock:
            if self.producer_id < 0:
                raise TransactionStateError("no producer id yet: a batch cannot be stamped")
            seq = self._next_seq.get(batch.tp, 0)
            batch.producer_id = self.producer_id
            batch.producer_epoch = self.producer_epoch
            batch.base_sequence = seq
            batch.transactional = self.transactional
            batch.stamped_attempt = batch.attempts
            self._next_seq[batch.tp] = increment_sequence(seq, batch.record_count)

    def rewind(self, batch: ProducerBatch) -> None:
        """The broker refused ``batch`` before appending it (too large): its sequence numbers
        go to the halves it is split into."""
        if batch.base_sequence == NO_SEQUENCE:
            return
        with self._seq_lock:
            mine = (batch.producer_id, batch.producer_epoch) == (
                self.producer_id,
                self.producer_epoch,
            )
            end = increment_sequence(batch.base_sequence, batch.record_count)
            if mine and self._next_seq.get(batch.tp) == end:
                self._next_seq[batch.tp] = batch.base_sequence
                return
        self._unresolved(batch)

    def _unresolved(self, batch: ProducerBatch) -> None:
        with self._seq_lock:
            if (batch.producer_id, batch.producer_epoch) != (
                self.producer_id,
                self.producer_epoch,
            ):
                return  # stamped by an earlier producer id or epoch: nothing to repair
            if self.transactional:
                self.unresolved = True
            else:
                self._reset_pending = True

    def restamp_after_unknown_producer(self, batch: ProducerBatch) -> bool:
        """The partition's leader has no state for ``batch``'s producer id (it expired:
        UNKNOWN_PRODUCER_ID) and refused it, appending nothing. An idempotent producer takes a
        new producer id (its sequence numbers restart at 0 everywhere, as Kafka's producer
        bumps its epoch) and the batch is sent again with a new stamp: True.

        If an earlier attempt with the same stamp failed otherwise (a timeout, a lost
        response), that copy may be in the log, and a new stamp would append it twice. Its
        append would have left the producer state the broker keeps for
        producer.id.expiration.ms, far longer than a batch is retried (delivery.timeout.ms),
        except after a restart, where the state is rebuilt from the log and judged by the
        records' own timestamps: so the batch is restamped only if its records are recent.
        Otherwise, and for a transactional producer, False: the batch fails and its sequence
        is unresolved, so an idempotent producer resets anyway, and a transaction must be
        aborted (the abort bumps the epoch)."""
        if not self.idempotent or self.transactional or batch.base_sequence == NO_SEQUENCE:
            return False
        if batch.attempts != batch.stamped_attempt:
            oldest_allowed = time.time() * 1000 - self.config.delivery_timeout_ms
            if batch.payload is None or parse_header(batch.payload).max_timestamp < oldest_allowed:
                return False
        with self._seq_lock:
            if (batch.producer_id, batch.producer_epoch) == (self.producer_id, self.producer_epoch):
                self._reset_pending = True
            # at most one batch per partition is in flight and none after it is stamped yet:
            # restamped, it is the partition's first batch of the new producer id
            batch.producer_id = NO_PRODUCER_ID
            batch.producer_epoch = NO_PRODUCER_EPOCH
            batch.base_sequence = NO_SEQUENCE
            batch.payload = None
        return True

    def batch_failed(self, batch: ProducerBatch, error: BaseException) -> None:
        """A batch failed for good (lock held)."""
        if isinstance(error, FENCED_ERRORS):
            self._fatal(
                error if isinstance(error, ProducerFencedError) else self.fenced_error(error)
            )
        if batch.base_sequence != NO_SEQUENCE:
            self._unresolved(batch)
        if (
            self.transactional
            and self.state in (TxnState.IN_TRANSACTION, TxnState.HANDED_OFF)
            and not isinstance(error, TransactionAbortedError)
        ):
            self.state = TxnState.ABORTABLE_ERROR
            failure = error if isinstance(error, ReplogError) else ReplogError(str(error))
            self.error = failure
            log.warning(
                "transaction of %r must be aborted: a batch for %s failed: %s",
                self.transactional_id,
                batch.tp,
                error,
            )

    # --- what the sender may drain (lock held) --------------------------------------------------

    def sendable(self) -> bool:
        """Whether batches may be drained now."""
        if self.state is TxnState.FATAL_ERROR:
            return False
        if not self.idempotent:
            return True
        if not self.transactional:
            return self.producer_id >= 0 and not self._reset_pending
        return self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING, TxnState.HANDED_OFF)

    def doomed_error(self) -> ReplogError | None:
        """The error queued batches must fail with now (fatal, or the transaction failed)."""
        if self.state is TxnState.FATAL_ERROR:
            return self.error
        if self.state is TxnState.ABORTABLE_ERROR:
            err = TransactionAbortedError(
                f"not sent: the transaction failed ({self.error}) and must be aborted"
            )
            err.__cause__ = self.error
            return err
        return None

    def note_partition(self, tp: TpKey) -> None:
        """A record for ``tp`` was queued in the transaction."""
        if self.transactional and tp not in self.partitions and tp not in self.adding:
            self.pending.add(tp)

    def held(self) -> set[TpKey]:
        """Partitions whose batches wait for AddPartitionsToTxn."""
        return self.pending | self.adding if self.pending or self.adding else set()

    def take_partitions_to_add(self) -> list[TpKey]:
        """Partitions to add now (one AddPartitionsToTxn at a time); they become ``adding``."""
        if not self.pending or self.adding or self.state is not TxnState.IN_TRANSACTION:
            return []
        self.adding, self.pending = self.pending, set()
        self.maybe_open = True
        return sorted(self.adding)

    # --- coordinator requests -------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float:
        seconds = self.config.max_block_ms / 1000 if timeout is None else timeout
        return time.monotonic() + seconds

    def _coordinator(self) -> CoordinatorClient:
        if self.coordinator is None:
            raise TransactionStateError(
                "not a transactional producer: set transactional.id to use transactions"
            )
        return self.coordinator

    def add_partitions(self, tps: list[TpKey]) -> None:
        """AddPartitionsToTxn for ``tps`` (an I/O thread), retried until delivery.timeout.ms."""
        by_topic: dict[str, list[int]] = {}
        for topic, index in tps:
            by_topic.setdefault(topic, []).append(index)
        request = AddPartitionsToTxnRequest(
            transactional_id=self.transactional_id or "",
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            topics=[AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
        )
        error: ReplogError | None = None
        try:
            self._coordinator().call(
                ApiKey.ADD_PARTITIONS_TO_TXN,
                request,
                what=f"adding {len(tps)} partition(s) to the transaction",
                deadline=time.monotonic() + self.config.delivery_timeout_ms / 1000,
            )
        except ReplogError as err:
            error = err
        with self._lock:
            self.adding.difference_update(tps)
            if error is None:
                self.partitions.update(tps)
            elif isinstance(error, FENCED_ERRORS):
                self._fatal(self.fenced_error(error))
            elif self.state is TxnState.IN_TRANSACTION:
                self.state = TxnState.ABORTABLE_ERROR
                self.error = error
                log.warning("transaction of %r must be aborted: %s", self.transactional_id, error)
            self._wake.notify_all()

    def send_offsets(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        group: ConsumerGroupMetadata,
        timeout: float | None,
    ) -> None:
        """AddOffsetsToTxn, then TxnOffsetCommit at the group's coordinator: the offsets
        commit with the transaction (KIP-98, KIP-447)."""
        deadline = self._deadline(timeout)
        with self._lock:
            self.raise_if_fatal()
            coordinator = self._coordinator()
            if self.state is not TxnState.IN_TRANSACTION:
                raise TransactionStateError(
                    f"send_offsets_to_transaction() needs an open transaction: the producer is "
                    f"{self.state.value} (call begin_transaction() first)"
                )
            self.maybe_open = True
        try:
            coordinator.call(
                ApiKey.ADD_OFFSETS_TO_TXN,
                AddOffsetsToTxnRequest(
                    transactional_id=self.transactional_id or "",
                    producer_id=self.producer_id,
                    producer_epoch=self.producer_epoch,
                    group_id=group.group_id,
                ),
                what=f"adding group {group.group_id!r}'s offsets to the transaction",
                deadline=deadline,
            )
        except FENCED_ERRORS as err:
            with self._lock:
                raise self._fatal(self.fenced_error(err)) from err
        by_topic: dict[str, list[OffsetCommitRequestPartition]] = {}
        for tp, value in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append(
                OffsetCommitRequestPartition(
                    partition_index=tp.partition,
                    committed_offset=value.offset,
                    committed_metadata=value.metadata,
                )
            )
        group_coordinator = CoordinatorClient(
            self._cluster, group.group_id, key_type=GROUP_KEY_TYPE, slot=_TXN_GROUP_SLOT
        )
        response = group_coordinator.request(
            ApiKey.TXN_OFFSET_COMMIT,
            TxnOffsetCommitRequest(
                transactional_id=self.transactional_id or "",
                group_id=group.group_id,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                generation_id=group.generation_id,
                member_id=group.member_id,
                group_instance_id=group.group_instance_id,
                topics=[
                    OffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()
                ],
            ),
            what=f"committing group {group.group_id!r}'s offsets in the transaction",
            deadline=deadline,
        )
        for topic in response.topics:
            for part in topic.partitions:
                error = for_code(part.error_code)
                if error is None:
                    continue
                failure = error(
                    f"committing {topic.name}-{part.partition_index} of group "
                    f"{group.group_id!r} in the transaction: {error()}"
                )
                with self._lock:
                    if isinstance(failure, FENCED_ERRORS):
                        raise self._fatal(self.fenced_error(failure))
                    # the transaction must not commit without its offsets
                    self.state = TxnState.ABORTABLE_ERROR
                    self.error = failure
                raise CommitFailedError(
                    f"{failure}; the transaction must be aborted (abort_transaction()), and the "
                    "consumer rejoin its group before the records are processed again"
                ) from failure

    def init_transactions(self, timeout: float | None) -> None:
        """InitProducerId for transactional.id: a new epoch, fencing older instances."""
        coordinator = self._coordinator()
        with self._lock:
            self.raise_if_fatal()
            if self.state is not TxnState.UNINITIALIZED:
                raise TransactionStateError(
                    f"init_transactions() was already called (the producer is {self.state.value})"
                )
        request = InitProducerIdRequest(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.config.transaction_timeout_ms,
        )
        try:
            response: InitProducerIdResponse = coordinator.call(
                ApiKey.INIT_PRODUCER_ID,
                request,
                what=f"init_transactions() of {self.transactional_id!r}",
                deadline=self._deadline(timeout),
            )
        except FENCED_ERRORS as err:
            with self._lock:
                raise self._fatal(self.fenced_error(err)) from err
        with self._seq_lock:
            self._set_producer(response.producer_id, response.producer_epoch)
        with self._lock:
            self.state = TxnState.READY
        log.info(
            "transactional producer %r: producer id %d, epoch %d",
            self.transactional_id,
            response.producer_id,
            response.producer_epoch,
        )

    def _bump_epoch(self, deadline: float) -> None:
        """After an abort with unresolved sequence numbers: a new epoch restarts them."""
        response: InitProducerIdResponse = self._coordinator().call(
            ApiKey.INIT_PRODUCER_ID,
            InitProducerIdRequest(
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self.config.transaction_timeout_ms,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
            ),
            what=f"bumping the epoch of {self.transactional_id!r}",
            deadline=deadline,
        )
        with self._seq_lock:
            self._set_producer(response.producer_id, response.producer_epoch)
        log.info(
            "transactional producer %r: epoch bumped to %d after an abort (sequence numbers "
            "restart)",
            self.transactional_id,
            response.producer_epoch,
        )

    def begin(self) -> None:
        with self._lock:
            self.raise_if_fatal()
            self._coordinator()
            if self.state is not TxnState.READY:
                raise TransactionStateError(
                    f"cannot begin a transaction: the producer is {self.state.value}"
                )
            self.state = TxnState.IN_TRANSACTION
            self.partitions.clear()
            self.pending.clear()
            self.maybe_open = False
            self.unresolved = False
            self.error = None
            self._handle = None
            self._commit_state = None

    def start_commit(self) -> bool:
        """Check that a commit may start; True if the flush already happened (a retry)."""
        with self._lock:
            self.raise_if_fatal()
            self._coordinator()
            if self.state is TxnState.COMMITTING:
                return True  # retrying a commit whose outcome was unknown
            if self.state is TxnState.ABORTABLE_ERROR:
                raise CommitFailedError(
                    f"cannot commit: the transaction failed ({self.error}); nothing of it is "
                    "visible. Call abort_transaction() and retry in a new transaction"
                ) from self.error
            if self.state is not TxnState.IN_TRANSACTION:
                raise TransactionStateError(f"cannot commit: the producer is {self.state.value}")
            return False

    def end(self, commit: bool, timeout: float | None) -> None:
        """EndTxn after the flush (the caller checked the state). Raises CommitFailedError
        (nothing happened), CommitStateUnknownError (it may have), or ProducerFencedError."""
        deadline = self._deadline(timeout)
        with self._lock:
            if commit and self.error is not None:
                self.state = TxnState.ABORTABLE_ERROR
                raise CommitFailedError(
                    f"cannot commit: a record of the transaction failed ({self.error}); "
                    "nothing of it is visible. Call abort_transaction() and retry"
                ) from self.error
            if commit:
                self.state = TxnState.COMMITTING
            if self._commit_state is None:
                self._commit_state = CallState()
            state = self._commit_state
            needed = self.maybe_open or bool(self.partitions)
        if needed:
            request = EndTxnRequest(
                transactional_id=self.transactional_id or "",
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                committed=commit,
            )
            verb = "commit" if commit else "abort"
            try:
                self._coordinator().call(
                    ApiKey.END_TXN,
                    request,
                    what=f"{verb} of the transaction of {self.transactional_id!r}",
                    deadline=deadline,
                    state=state,
                )
            except FENCED_ERRORS as err:
                with self._lock:
                    raise self._fatal(self.fenced_error(err)) from err
            except ReplogError as err:
                if not commit:
                    raise
                if state.maybe_done or err.retriable:
                    raise CommitStateUnknownError(
                        f"the commit of the transaction of {self.transactional_id!r} may or may "
                        f"not have happened ({err}); call commit_transaction() again to find "
                        "out, do not abort"
                    ) from err
                with self._lock:
                    self.state = TxnState.ABORTABLE_ERROR
                    self.error = err
                raise CommitFailedError(
                    f"the commit of the transaction of {self.transactional_id!r} did not "
                    f"happen ({err}); call abort_transaction()"
                ) from err
        if not commit and self.unresolved:
            self._bump_epoch(deadline)
        with self._lock:
            self.state = TxnState.READY
            self.partitions.clear()
            self.maybe_open = False
            self.unresolved = False
            self.error = None
            self._commit_state = None

    def start_abort(self) -> None:
        with self._lock:
            self.raise_if_fatal()
            self._coordinator()
            if self.state is TxnState.COMMITTING:
                raise TransactionStateError(
                    "cannot abort: a commit was sent and its outcome is unknown; call "
                    "commit_transaction() again"
                )
            if self.state not in (
                TxnState.IN_TRANSACTION,
                TxnState.ABORTABLE_ERROR,
                TxnState.ABORTING,  # an abort that failed (e.g. timed out) is retried
            ):
                raise TransactionStateError(f"cannot abort: the producer is {self.state.value}")
            self.state = TxnState.ABORTING
            self._wake.notify_all()

    def in_flight_done(self, muted: Iterable[TpKey]) -> bool:
        """No produce and no AddPartitionsToTxn in flight (lock held)."""
        return not self.adding and not any(True for _ in muted)

    def hand_off(self) -> TransactionHandle:
        """After the flush: the transaction now belongs to the holder of the handle."""
        with self._lock:
            self.raise_if_fatal()
            if self.state is TxnState.HANDED_OFF and self._handle is not None:
                return self._handle
            if self.state is TxnState.ABORTABLE_ERROR:
                raise CommitFailedError(
                    f"the transaction failed ({self.error}); nothing of it is visible. Call "
                    "abort_transaction() and retry in a new transaction"
                ) from self.error
            if self.state is not TxnState.IN_TRANSACTION:
                raise TransactionStateError(
                    f"no transaction to hand off: the producer is {self.state.value}"
                )
            if self.pending or self.adding:
                raise TransactionStateError("partitions are still being added; flush() first")
            self.state = TxnState.HANDED_OFF
            self._handle = TransactionHandle(
                self.transactional_id or "", self.producer_id, self.producer_epoch
            )
            return self._handle
