"""The admin client's transaction calls and Spark sink commits: ListTransactions and the
tools of :mod:`replication.client.transaction_admin`, and a sink's batch commits, sent to the
transaction coordinator (found with FindCoordinator; retried as Kafka's clients retry, see
:mod:`replication.client.coordinator`). A sink commit either raises CommitFailedError (it did
not happen: the caller may clean up, e.g. abort) or CommitStateUnknownError (it may have
happened: the caller must not clean up, and may call again, which is safe: a batch is
committed at most once)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from replication.client.admin_base import AdminBase
from replication.client.coordinator import CallState, CoordinatorClient
from replication.client.types import (
    HangingTransaction,
    ProducerState,
    SinkCommitResult,
    TopicPartition,
    TransactionHandle,
    TransactionListing,
)
from replication.errors import CommitFailedError, CommitStateUnknownError, ReplogError
from replication.protocol import (
    ApiKey,
    CommitSinkBatchRequest,
    CommitSinkBatchResponse,
    DescribeSinkRequest,
    DescribeSinkResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    SinkTransaction,
)

#: Kafka's transaction states, as ListTransactions filters take them.
TRANSACTION_STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
)
_COMMITTED_STATES = frozenset({"PrepareCommit", "CompleteCommit"})
_ABORTED_STATES = frozenset({"PrepareAbort", "CompleteAbort"})


class TransactionCalls(AdminBase):
    """List, describe and abort transactions; commit and abort Spark sink batches."""

    # --- transactions and Spark sinks ------------------------------------------------------

    def list_transactions(self, states: Iterable[str] = ()) -> list[TransactionListing]:
        """The transactions the coordinator knows, optionally only those in ``states``
        (Kafka's names: Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit,
        CompleteAbort), sorted by transactional id."""
        wanted = list(states)
        bad = [s for s in wanted if s not in TRANSACTION_STATES]
        if bad:
            raise ValueError(
                f"unknown transaction state(s) {bad}; expected some of "
                f"{', '.join(TRANSACTION_STATES)}"
            )
        self._check_open()
        response: ListTransactionsResponse = self._coordinator.call(
            ApiKey.LIST_TRANSACTIONS,
            ListTransactionsRequest(state_filters=wanted),
            what="listing transactions",
            deadline=self._deadline(None),
        )
        return sorted(
            (
                TransactionListing(
                    transactional_id=t.transactional_id,
                    producer_id=t.producer_id,
                    producer_epoch=t.producer_epoch,
                    state=t.transaction_state,
                    timeout_ms=t.transaction_timeout_ms,
                    start_time_ms=t.transaction_start_time_ms,
                    partitions=tuple(TopicPartition(q.topic, q.partition) for q in t.partitions),
                )
                for t in response.transactions
            ),
            key=lambda t: t.transactional_id,
        )

    def describe_transactions(
        self, transactional_ids: Iterable[str], *, timeout_ms: int | None = None
    ) -> dict[str, TransactionListing]:
        """The coordinator's state of each transactional id (Kafka's describeTransactions):
        producer id and epoch, state, timeout, start time and partitions of the open
        transaction. TransactionalIdNotFoundError for an id it does not know."""
        self._check_open()
        return self._transactions.describe(transactional_ids, self._deadline(timeout_ms))

    def describe_producers(
        self,
        partitions: Iterable[TopicPartition | tuple[str, int]],
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The producers each partition's leader knows, with the first offset of their open
        transaction on it (Kafka's describeProducers)."""
        self._check_open()
        tps = [TopicPartition(*tp) for tp in partitions]
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in tps:
            by_leader.setdefault(self._leader_of(tp), []).append(tp)
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        out: dict[TopicPartition, list[ProducerState]] = {}
        for leader, led in by_leader.items():
            out.update(self._transactions.describe_producers(leader, led, timeout))
        return out

    def find_hanging_transactions(
        self,
        broker_id: int,
        max_transaction_timeout_ms: int = 900_000,
        *,
        timeout_ms: int | None = None,
    ) -> list[HangingTransaction]:
        """The hanging transactions on the partitions broker ``broker_id`` leads (Kafka's
        FindHangingTransactions): open on a partition for at least
        ``max_transaction_timeout_ms`` (the brokers' transaction.max.timeout.ms, after which
        the coordinator would have aborted any transaction it knows) while the coordinator
        does not know them as ongoing on that partition. Abort each with
        :meth:`abort_transaction`."""
        self._check_open()
        metadata = self._metadata(None)
        led = [
            TopicPartition(t.name, q.partition_index)
            for t in metadata.topics
            if not t.error_code
            for q in t.partitions
            if q.leader_id == broker_id
        ]
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        return self._transactions.find_hanging(
            broker_id, led, max_transaction_timeout_ms, timeout, self._deadline(timeout_ms)
        )

    def abort_transaction(
        self,
        partition: TopicPartition | tuple[str, int],
        *,
        producer_id: int | None = None,
        producer_epoch: int | None = None,
        coordinator_epoch: int | None = None,
        start_offset: int | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        """Abort an open (hanging) transaction on one partition, as Kafka's abortTransaction:
        an ABORT marker written by the partition's leader (WriteTxnMarkers), so its LSO moves
        past it. Name the transaction by ``producer_id``, ``producer_epoch`` and
        ``coordinator_epoch``, or by its ``start_offset`` (then they are looked up with
        DescribeProducers)."""
        self._check_open()
        tp = TopicPartition(*partition)
        leader = self._leader_of(tp)
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        if start_offset is not None:
            found = self._transactions.producer_at(leader, tp, start_offset, timeout)
            producer_id, producer_epoch = found.producer_id, found.producer_epoch
            coordinator_epoch = found.coordinator_epoch
        if producer_id is None or producer_epoch is None or coordinator_epoch is None:
            raise ValueError(
                "name the transaction to abort by its start_offset, or by producer_id, "
                "producer_epoch and coordinator_epoch"
            )
        self._transactions.abort(
            leader, tp, producer_id, producer_epoch, coordinator_epoch, timeout
        )

    def transaction_coordinator(self) -> int:
        """The broker id of the transaction coordinator (FindCoordinator)."""
        self._check_open()
        self.list_transactions(["Empty"])  # finds it, retrying as the other calls do
        return self._coordinator.node_id

    def _sink_coordinator(self, sink_id: str) -> CoordinatorClient:
        """The transaction coordinator, found as the coordinator of the sink's own
        transactional id ``replog-sink/<sink_id>``: with an authorizer, FindCoordinator needs
        Describe on the id it names, and the sink's principal holds Write (so Describe) on
        ``replog-sink/`` ids, not on this admin's client.id. One per sink, kept: a commit
        goes where the sink's last lookup found the coordinator, without asking again."""
        client = self._sink_coordinators.get(sink_id)
        if client is None:
            client = CoordinatorClient(self._cluster, f"replog-sink/{sink_id}")
            self._sink_coordinators[sink_id] = client
        return client

    def last_committed_batch(self, sink_id: str, *, timeout_ms: int | None = None) -> int:
        """The last batch id committed for ``sink_id`` (-1 if none)."""
        self._check_open()
        response: DescribeSinkResponse = self._sink_coordinator(sink_id).call(
            ApiKey.DESCRIBE_SINK,
            DescribeSinkRequest(sink_id=sink_id),
            what=f"describing sink {sink_id!r}",
            deadline=self._deadline(timeout_ms),
        )
        return int(response.last_committed_batch)

    def commit_sink_batch(
        self,
        sink_id: str,
        batch_id: int,
        handles: Iterable[TransactionHandle],
        *,
        timeout_ms: int | None = None,
    ) -> SinkCommitResult:
        """Commit the transactions of ``handles`` as batch ``batch_id`` of ``sink_id``, in one
        atomic step, unless that batch is already committed: then abort them (a replay).

        Returns :class:`SinkCommitResult`; ``committed`` False means the batch had been
        committed before and these transactions were aborted, so its data is visible exactly
        once either way. Raises CommitFailedError when nothing happened (e.g. a transaction was
        fenced or timed out: abort and retry the batch) and CommitStateUnknownError when it may
        have happened (do not abort; call again, or look at :meth:`last_committed_batch`).

        Examples
        --------
        >>> handles = [p.transaction_handle() for p in task_producers]  # doctest: +SKIP
        >>> admin.commit_sink_batch("query-1", 7, handles)  # doctest: +SKIP
        SinkCommitResult(committed=True, last_committed_batch=7)
        """
        return self._sink_batch(sink_id, batch_id, list(handles), False, timeout_ms)

    def abort_sink_batch(
        self,
        sink_id: str,
        batch_id: int,
        handles: Iterable[TransactionHandle],
        *,
        timeout_ms: int | None = None,
    ) -> SinkCommitResult:
        """Abort the transactions of ``handles`` (a batch that will not be committed): nothing
        of them is ever visible to read_committed consumers. Errors as commit_sink_batch."""
        return self._sink_batch(sink_id, batch_id, list(handles), True, timeout_ms)

    def _sink_batch(
        self,
        sink_id: str,
        batch_id: int,
        handles: list[TransactionHandle],
        abort: bool,
        timeout_ms: int | None,
    ) -> SinkCommitResult:
        self._check_open()
        for handle in handles:
            if not isinstance(handle, TransactionHandle):
                raise TypeError(
                    f"expected TransactionHandle objects (from Producer.transaction_handle()), "
                    f"got {type(handle).__name__}"
                )
        request = CommitSinkBatchRequest(
            sink_id=sink_id,
            batch_id=batch_id,
            transactions=[
                SinkTransaction(
                    transactional_id=h.transactional_id,
                    producer_id=h.producer_id,
                    producer_epoch=h.producer_epoch,
                )
                for h in handles
            ],
            abort=abort,
        )
        what = f"{'abort' if abort else 'commit'} of batch {batch_id} of sink {sink_id!r}"
        state = CallState()
        deadline = self._deadline(timeout_ms)
        try:
            response: CommitSinkBatchResponse = self._sink_coordinator(sink_id).call(
                ApiKey.COMMIT_SINK_BATCH, request, what=what, deadline=deadline, state=state
            )
        except ReplogError as err:
            if state.maybe_done:
                raise CommitStateUnknownError(
                    f"the {what} may or may not have happened ({err}); do not abort its "
                    "transactions: call again (a batch is committed at most once) or check "
                    "last_committed_batch()"
                ) from err
            raise CommitFailedError(f"the {what} did not happen: {err}") from err
        committed = bool(response.committed)
        if state.maybe_done and not committed and not abort:
            # An earlier attempt may have committed these very transactions and its answer
            # was lost: then this retry finds the batch committed and reports a replay.
            committed = self._committed_by_us(sink_id, handles, what, deadline)
        return SinkCommitResult(committed, int(response.last_committed_batch))

    def _committed_by_us(
        self, sink_id: str, handles: list[TransactionHandle], what: str, deadline: float
    ) -> bool:
        """Whether the transactions of ``handles`` ended committed (after an unknown attempt)."""
        ids = {h.transactional_id: h for h in handles}
        try:
            coordinator = self._sink_coordinator(sink_id)
            listed = coordinator.call(
                ApiKey.LIST_TRANSACTIONS,
                ListTransactionsRequest(),
                what="listing transactions",
                deadline=max(deadline, time.monotonic() + 1),
            ).transactions
        except ReplogError as err:
            raise CommitStateUnknownError(
                f"the {what} was retried after an answer was lost and found the batch already "
                f"committed, but whether by these transactions is unknown ({err})"
            ) from err
        states = {
            t.transaction_state
            for t in listed
            if (h := ids.get(t.transactional_id)) is not None
            and (t.producer_id, t.producer_epoch) == (h.producer_id, h.producer_epoch)
        }
        if states & _COMMITTED_STATES and states & _ABORTED_STATES:
            raise CommitStateUnknownError(
                f"the {what} was retried after an answer was lost; its transactions ended "
                f"differently ({sorted(states)})"
            )
        return bool(states & _COMMITTED_STATES)
