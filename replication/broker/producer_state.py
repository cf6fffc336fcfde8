"""Producer state of one partition: idempotence, open transactions, the aborted index.

As Kafka's ProducerStateManager. For every producer id that wrote to the partition it keeps
the epoch and the metadata of the last five batches, so a retried batch is recognised and
answered with its original offsets instead of being appended twice; a gap in sequence numbers
is OUT_OF_ORDER_SEQUENCE_NUMBER and an older epoch is fenced. It also tracks the first offset
of every open transaction, and of every ended one whose marker the HW has not passed yet (the
last stable offset is the smallest, or the HW: :meth:`ProducerStateManager.last_stable_offset`),
and the index of aborted transactions that read_committed fetches use to drop aborted records.

The state is rebuilt from the log on recovery: a snapshot object (``producer-state.json``,
versioned) taken at checkpoints, plus the batches after it. Followers maintain it from the
batches they replicate, so a new leader has it.

Expiry (Kafka's ``producer.id.expiration.ms``): a producer with no open transaction on the
partition whose last batch was appended that long ago is removed (:meth:`remove_expired`, run
periodically by the replica manager and after every rebuild, so an expired id does not come
back at recovery). Its next batch must then start at sequence 0: a later one is refused with
UNKNOWN_PRODUCER_ID, on which an idempotent producer resets its sequence numbers and retries.
"""

from __future__ import annotations

import bisect
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from logstore.batch import NO_PRODUCER_EPOCH, NO_SEQUENCE, ControlType, RecordBatch
from logstore.errors import CorruptRecordError
from replication.errors import (
    InvalidProducerEpochError,
    OutOfOrderSequenceNumberError,
    UnknownProducerIdError,
)

SNAPSHOT_NAME = "producer-state.json"
#: 2: entries carry ``last_timestamp`` (another version is rebuilt from the log)
FORMAT_VERSION = 2
#: batches remembered per producer for duplicate detection (Kafka's NUM_BATCHES_TO_RETAIN)
BATCHES_TO_RETAIN = 5
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_TO_RETAIN))
    coordinator_epoch: int = -1
    #: first offset of this producer's open transaction on this partition, or -1
    current_txn_first_offset: int = -1
    #: when its last batch here was appended (Kafka's lastTimestamp: the batch's max
    #: timestamp, or the append time if later), for expiry
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, batch: RecordBatch) -> BatchMetadata | None:
        if batch.producer_epoch != self.producer_epoch:
            return None
        for meta in self.batches:
            if meta.first_seq == batch.base_sequence and meta.last_seq == batch.last_sequence:
                return meta
        return None


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    #: offset of the ABORT marker
    last_offset: int


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (last_seq == _INT32_MAX and next_seq == 0)


class ProducerStateManager:
    def __init__(self, topic_partition: str = "") -> None:
        self.topic_partition = topic_partition
        self.producers: dict[int, ProducerStateEntry] = {}
        #: (first offset, producer id) of open transactions, sorted
        self._ongoing: list[tuple[int, int]] = []
        #: (first offset, marker offset) of transactions that ended here with a marker the HW
        #: may not have passed yet, sorted (Kafka's unreplicatedTxns): their outcome is not
        #: yet in every ISR member's log, so a new leader may still hold them open
        self._unreplicated: list[tuple[int, int]] = []
        self.aborted: list[AbortedTxn] = []
        #: the log offset up to which this state reflects the log
        self.map_end_offset = 0

    # --- validation (leader) -------------------------------------------------------------------

    def check(self, batch: RecordBatch) -> BatchMetadata | None:
        """Validate a batch about to be appended by the leader.

        Returns the metadata of the original batch if this one is a retry already in the log
        (the caller answers with its offsets and appends nothing), None if it may be
        appended. Raises InvalidProducerEpochError or OutOfOrderSequenceNumberError.
        """
        if batch.producer_id < 0:
            return None
        entry = self.producers.get(batch.producer_id)
        where = f"{self.topic_partition}, producer {batch.producer_id}"
        if entry is None:
            if batch.base_sequence not in (0, NO_SEQUENCE) and not batch.is_control:
                raise UnknownProducerIdError(
                    f"{where}: the partition has no state for this producer (its id expired "
                    "after producer.id.expiration.ms without a batch here, or its batches were "
                    f"removed by retention) and the batch has sequence {batch.base_sequence}, "
                    "expected 0; the producer must reset its sequence numbers"
                )
            return None
        if batch.producer_epoch < entry.producer_epoch:
            raise InvalidProducerEpochError(
                f"{where}: epoch {batch.producer_epoch} is older than the current epoch "
                f"{entry.producer_epoch}; this producer was fenced by a newer instance"
            )
        if batch.is_control or batch.base_sequence == NO_SEQUENCE:
            return None
        duplicate = entry.find_duplicate(batch)
        if duplicate is not None:
            return duplicate
        if batch.producer_epoch > entry.producer_epoch:
            if batch.base_sequence != 0:
                raise OutOfOrderSequenceNumberError(
                    f"{where}: a new epoch {batch.producer_epoch} must start at sequence 0, "
                    f"got {batch.base_sequence}"
                )
        elif entry.last_seq == NO_SEQUENCE:
            if batch.base_sequence != 0:
                raise OutOfOrderSequenceNumberError(
                    f"{where}: expected sequence 0, got {batch.base_sequence}"
                )
        elif not _in_sequence(entry.last_seq, batch.base_sequence):
            raise OutOfOrderSequenceNumberError(
                f"{where}: expected sequence {entry.last_seq + 1}, got {batch.base_sequence} "
                "(a batch is missing: an earlier send failed and was not retried)"
            )
        return None

    # --- updates (leader and follower) ---------------------------------------------------------

    def update(
        self, batch: RecordBatch, base_offset: int | None = None, now_ms: int | None = None
    ) -> None:
        """Take in a batch as appended (data or control), at ``base_offset`` if given (the
        leader assigns offsets in its own copy of the bytes), else at its own offsets.

        ``now_ms``: the time it is appended (leader and followers), so a producer writing
        records with old timestamps is not expired while it writes; replayed at recovery,
        only the batch's own timestamp is known."""
        base = batch.base_offset if base_offset is None else base_offset
        last = base + batch.last_offset_delta  # a cleaned batch may lack its last records
        self.map_end_offset = max(self.map_end_offset, last + 1)
        if batch.producer_id < 0:
            return
        entry = self.producers.get(batch.producer_id)
        if entry is None:
            entry = self.producers[batch.producer_id] = ProducerStateEntry(batch.producer_id)
        if batch.producer_epoch > entry.producer_epoch:
            entry.producer_epoch = batch.producer_epoch
            entry.batches.clear()
        entry.last_timestamp = max(
            entry.last_timestamp, batch.max_timestamp, -1 if now_ms is None else now_ms
        )
        if batch.is_control:
            self._end_transaction(entry, batch, base)
            return
        if batch.base_sequence != NO_SEQUENCE:
            entry.batches.append(
                BatchMetadata(batch.base_sequence, batch.last_sequence, base, last)
            )
        if batch.is_transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = base
            bisect.insort(self._ongoing, (base, batch.producer_id))

    def _end_transaction(self, entry: ProducerStateEntry, marker: RecordBatch, offset: int) -> None:
        control = marker.control_type()
        coordinator_epoch = marker.coordinator_epoch()
        if coordinator_epoch is not None:
            entry.coordinator_epoch = coordinator_epoch
        first = entry.current_txn_first_offset
        if first < 0:
            return  # a marker for a transaction that wrote nothing here
        self._ongoing.remove((first, entry.producer_id))
        bisect.insort(self._unreplicated, (first, offset))
        entry.current_txn_first_offset = -1
        if control == ControlType.ABORT:
            self.aborted.append(AbortedTxn(entry.producer_id, first, offset))

    # --- queries -------------------------------------------------------------------------------

    def first_unstable_offset(self) -> int | None:
        """First offset of the oldest open transaction, or None."""
        return self._ongoing[0][0] if self._ongoing else None

    def last_stable_offset(self, high_watermark: int) -> int:
        """The LSO: the first offset of the oldest transaction that is open, or that ended
        with a marker at or above ``high_watermark``; else ``high_watermark``.

        As Kafka's firstUnstableOffset: a transaction stays unstable until the HW passes its
        marker, so read_committed never shows an outcome that only this leader holds, and the
        LSO does not go back when a leader that lacks the marker takes over."""
        self.on_high_watermark(high_watermark)
        firsts = [t[0] for t in self._ongoing[:1] + self._unreplicated[:1]]
        return min([high_watermark, *firsts])

    def on_high_watermark(self, high_watermark: int) -> None:
        """Forget the ended transactions whose markers are below ``high_watermark``."""
        if self._unreplicated and self._unreplicated[0][1] < high_watermark:
            self._unreplicated = [t for t in self._unreplicated if t[1] >= high_watermark]

    def ongoing(self) -> list[tuple[int, int]]:
        """(first offset, producer id) of every open transaction."""
        return list(self._ongoing)

    def aborted_in_range(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in [start, end) (what a fetch there must drop)."""
        return [a for a in self.aborted if a.last_offset >= start and a.first_offset < end]

    def remove_expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Remove every producer with no open transaction here whose last batch is at least
        ``expiration_ms`` older than ``now_ms`` (Kafka's rule); return their ids."""
        expired = [
            pid
            for pid, e in self.producers.items()
            if e.current_txn_first_offset < 0 and now_ms - e.last_timestamp >= expiration_ms
        ]
        for pid in expired:
            del self.producers[pid]
        return expired

    def truncate_head(self, log_start_offset: int) -> None:
        self.aborted = [a for a in self.aborted if a.last_offset >= log_start_offset]

    # --- snapshots -----------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "offset": self.map_end_offset,
            "producers": [
                {
                    "id": e.producer_id,
                    "epoch": e.producer_epoch,
                    "coordinator_epoch": e.coordinator_epoch,
                    "txn_first_offset": e.current_txn_first_offset,
                    "last_timestamp": e.last_timestamp,
                    "batches": [
                        [b.first_seq, b.last_seq, b.first_offset, b.last_offset] for b in e.batches
                    ],
                }
                for e in self.producers.values()
            ],
            "aborted": [[a.producer_id, a.first_offset, a.last_offset] for a in self.aborted],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, topic_partition: str = "") -> ProducerStateManager:
        try:
            doc = json.loads(data)
            if doc.get("format_version") != FORMAT_VERSION:
                raise CorruptRecordError(
                    f"{topic_partition}: producer state format_version "
                    f"{doc.get('format_version')!r} is not supported; it is rebuilt from the log"
                )
            state = cls(topic_partition)
            state.map_end_offset = int(doc["offset"])
            for p in doc["producers"]:
                entry = ProducerStateEntry(
                    int(p["id"]),
                    int(p["epoch"]),
                    coordinator_epoch=int(p["coordinator_epoch"]),
                    current_txn_first_offset=int(p["txn_first_offset"]),
                    last_timestamp=int(p["last_timestamp"]),
                )
                entry.batches.extend(BatchMetadata(*map(int, b)) for b in p["batches"])
                state.producers[entry.producer_id] = entry
                if entry.current_txn_first_offset >= 0:
                    bisect.insort(
                        state._ongoing, (entry.current_txn_first_offset, entry.producer_id)
                    )
            state.aborted = [AbortedTxn(*map(int, a)) for a in doc["aborted"]]
            return state
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptRecordError(
                f"{topic_partition}: unreadable producer state: {err}"
            ) from err
