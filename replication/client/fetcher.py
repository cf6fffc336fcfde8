"""Turning the records of a fetch response into Arrow batches, as Kafka's consumer does.

:func:`decode_fetched` takes the ``records`` bytes of one partition of a FetchResponse and
returns Arrow record batches with :data:`~replication.client.types.FETCH_SCHEMA`:

- every batch is CRC-checked (:func:`logstore.batch.iter_batches` with ``validate=True``);
  a corrupt batch is a CorruptRecordError naming the partition and offset;
- a partial batch at the end (the broker cut the response at max bytes) is ignored;
- records below the fetch offset (in the first batch) are dropped;
- control batches (transaction markers) are skipped;
- with read_committed, records of aborted transactions are dropped using the response's
  ``aborted_transactions`` exactly as Kafka's ``CompletedFetch``: aborted transactions are
  taken in order of their first offset; once a batch's last offset reaches a transaction's
  first offset, its producer id is aborted until that producer's ABORT marker.

The position after the fetched data is the next offset after the last complete batch,
skipped ones included, so a fetch that returns only markers or aborted data still advances.
"""

from __future__ import annotations

import bisect
import heapq
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from logstore.batch import LOG_OVERHEAD, ControlType, RecordBatch, TimestampType, iter_batches
from replication.client.types import FETCH_SCHEMA
from replication.errors import CorruptRecordError
from replication.protocol import AbortedTransaction, Bytes

__all__ = ["FetchedRecords", "decode_fetched", "to_fetch_batch"]

_BATCH_LENGTH: Final = struct.Struct(">i")
_BATCH_LENGTH_OFFSET: Final = struct.calcsize(">q")


@dataclass
class FetchedRecords:
    """What one partition's records hold for the consumer."""

    #: Arrow batches with FETCH_SCHEMA, offsets ascending, all at or after the fetch offset.
    batches: list[pa.RecordBatch] = field(default_factory=list)
    #: The offset to fetch next (after the last complete batch); None if there was none.
    next_offset: int | None = None
    #: Bytes of a trailing partial batch (0 if none).
    partial_bytes: int = 0


def _complete_prefix(view: memoryview) -> int:
    """Length of the whole batches at the start of ``view`` (a partial one at the end is cut)."""
    pos = 0
    end = len(view)
    while pos + LOG_OVERHEAD <= end:
        (length,) = _BATCH_LENGTH.unpack_from(view, pos + _BATCH_LENGTH_OFFSET)
        if length < 0:
            return end  # iter_batches reports the corrupt header
        size = LOG_OVERHEAD + length
        if pos + size > end:
            return pos
        pos += size
    return pos  # fewer than LOG_OVERHEAD bytes left: the start of a partial batch


def to_fetch_batch(batch: RecordBatch, fetch_offset: int = 0) -> pa.RecordBatch | None:
    """A data batch as Arrow with FETCH_SCHEMA, without records below ``fetch_offset``."""
    data, deltas = batch.to_arrow_with_deltas()
    base = batch.base_offset
    skip = max(fetch_offset - base, 0)
    offsets: pa.Array
    if deltas is not None:
        # a batch the log cleaner left with offset gaps: each record carries its own delta
        first = bisect.bisect_left(deltas.to_pylist(), skip)
        if first >= data.num_rows:
            return None
        data = data.slice(first)
        offsets = pc.add(deltas.slice(first).cast(pa.int64()), pa.scalar(base, pa.int64()))
    else:
        if skip:
            if skip >= data.num_rows:
                return None
            data = data.slice(skip)
        offsets = pc.cumulative_sum(
            pa.repeat(pa.scalar(1, pa.int64()), data.num_rows), start=base + skip - 1
        )
    rows = data.num_rows
    ts_type = batch.timestamp_type
    timestamps = data.column(2)
    if ts_type is TimestampType.LOG_APPEND_TIME:
        timestamps = pa.repeat(pa.scalar(batch.max_timestamp, pa.int64()), rows)
    return pa.RecordBatch.from_arrays(
        [
            offsets,
            data.column(0),
            data.column(1),
            timestamps,
            pa.repeat(pa.scalar(int(ts_type), pa.int32()), rows),
            data.column(3),
        ],
        schema=FETCH_SCHEMA,
    )


def decode_fetched(
    records: Bytes | None,
    fetch_offset: int,
    *,
    read_committed: bool = False,
    aborted_transactions: Iterable[AbortedTransaction] | None = None,
    where: str = "",
) -> FetchedRecords:
    """The consumer's view of one partition's fetched ``records`` (see the module doc)."""
    out = FetchedRecords()
    if not records:
        return out
    view = memoryview(records).cast("B") if not isinstance(records, bytes) else memoryview(records)
    complete = _complete_prefix(view)
    out.partial_bytes = len(view) - complete
    aborted_queue: list[tuple[int, int]] = []
    if read_committed and aborted_transactions:
        aborted_queue = [(int(t.first_offset), int(t.producer_id)) for t in aborted_transactions]
        heapq.heapify(aborted_queue)
    aborted_producers: set[int] = set()
    try:
        for batch in iter_batches(view[:complete], validate=True):
            out.next_offset = batch.next_offset
            if batch.next_offset <= fetch_offset:
                continue
            if read_committed and batch.producer_id >= 0:
                last = batch.last_offset
                while aborted_queue and aborted_queue[0][0] <= last:
                    aborted_producers.add(heapq.heappop(aborted_queue)[1])
                if batch.is_control:
                    if batch.control_type() is ControlType.ABORT:
                        aborted_producers.discard(batch.producer_id)
                    continue
                if batch.is_transactional and batch.producer_id in aborted_producers:
                    continue
            if batch.is_control:
                continue
            fetched = to_fetch_batch(batch, fetch_offset)
            if fetched is not None:
                out.batches.append(fetched)
    except CorruptRecordError as err:
        prefix = f"{where}: " if where else ""
        raise CorruptRecordError(
            f"{prefix}fetched data at offset {fetch_offset} is corrupt and was not used: {err}"
        ) from err
    return out
