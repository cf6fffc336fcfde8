"""Record batches: a Kafka RecordBatch v2 header followed by an Arrow IPC stream of records.

A batch is the unit of append, replication, CRC and transfer. The broker never decodes the
records: it validates the header and CRC (:func:`parse_header`, :meth:`RecordBatch.ensure_valid`)
and assigns offsets by rewriting fields outside the CRC (:func:`set_base_offset`,
:func:`set_partition_leader_epoch`). A reader hands the payload to Arrow
(:meth:`RecordBatch.to_arrow`) without a per-record Python loop.

Layout (big-endian, as Kafka's DefaultRecordBatch)::

    baseOffset             int64   offset of the first record
    batchLength            int32   bytes after this field (header rest + payload)
    partitionLeaderEpoch   int32   epoch of the leader that appended the batch
    magic                  int8    2
    crc                    uint32  CRC-32C of bytes [ATTRIBUTES_OFFSET, end of batch)
    attributes             int16   bits 0-2 compression, 3 timestamp type,
                                   4 transactional, 5 control, 6 delete horizon set
    lastOffsetDelta        int32   offset of the last record (or of the last record the batch
                                   held before the log cleaner removed it) - baseOffset
    firstTimestamp         int64   timestamp of the first record (ms); with bit 6, the
                                   delete horizon instead (KIP-534: when the log cleaner may
                                   drop the batch's tombstones, or the marker itself)
    maxTimestamp           int64   largest record timestamp (ms)
    producerId             int64   -1 if none
    producerEpoch          int16   -1 if none
    baseSequence           int32   -1 if none
    recordCount            int32   number of records in the payload (0 only in an empty
                                   batch the log cleaner left: no payload at all)
    records                        Arrow IPC stream, exactly recordCount rows: schema
                                   RECORD_SCHEMA when lastOffsetDelta == recordCount - 1
                                   (record i has offset baseOffset + i), else
                                   GAPPED_RECORD_SCHEMA, whose int32 column offset_delta gives
                                   each record's offset - baseOffset (strictly increasing)

A batch with gaps is what the log cleaner writes (:func:`build_retained`), as Kafka's cleaned
batches keep their base offset and lastOffsetDelta with fewer records. Every other batch has
no ``offset_delta`` column, so its bytes are what they were before gaps existed. Readers get
the offsets with :meth:`RecordBatch.offset_deltas` (None for a batch without gaps). A batch
whose every record the cleaner removed stays as an *empty batch* (recordCount 0, no payload,
neither transactional nor control), as Kafka keeps one for its producer's sequence: the
batches of a log stay contiguous, so every check that a batch starts where the previous one
ended still holds.

Compression is Arrow IPC buffer compression (lz4 frame or zstd), recorded in the attribute bits
with Kafka's codes. Kafka's gzip (1) and snappy (2) codes are refused: Arrow IPC cannot carry them.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import google_crc32c
import pyarrow as pa
import pyarrow.compute as pc

from logstore.errors import CorruptRecordError

__all__ = [
    "ATTRIBUTES_OFFSET",
    "CRC_OFFSET",
    "GAPPED_RECORD_SCHEMA",
    "HEADERS_TYPE",
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "RECORD_SCHEMA",
    "Compression",
    "ControlType",
    "Record",
    "RecordBatch",
    "TimestampType",
    "build",
    "build_checked",
    "build_control",
    "build_empty",
    "build_retained",
    "count_records",
    "iter_batches",
    "parse_header",
    "records_to_arrow",
    "set_base_offset",
    "set_partition_leader_epoch",
    "to_record_schema",
    "valid_prefix",
]

# --- header layout --------------------------------------------------------------------------

_HEADER: Final = struct.Struct(
    ">"
    "q"  # baseOffset            int64
    "i"  # batchLength           int32  (bytes after this field)
    "i"  # partitionLeaderEpoch  int32
    "b"  # magic                 int8   (= 2)
    "I"  # crc                   uint32 (CRC-32C of [ATTRIBUTES_OFFSET, end of batch))
    "h"  # attributes            int16
    "i"  # lastOffsetDelta       int32
    "q"  # firstTimestamp        int64
    "q"  # maxTimestamp          int64
    "q"  # producerId            int64
    "h"  # producerEpoch         int16
    "i"  # baseSequence          int32
    "i"  # recordCount           int32
)
HEADER_SIZE: Final = _HEADER.size
#: baseOffset + batchLength: the bytes of a batch not counted in batchLength.
LOG_OVERHEAD: Final = struct.calcsize(">qi")
PARTITION_LEADER_EPOCH_OFFSET: Final = struct.calcsize(">qi")
MAGIC_OFFSET: Final = struct.calcsize(">qii")
CRC_OFFSET: Final = struct.calcsize(">qiib")
#: The CRC covers [ATTRIBUTES_OFFSET, end of batch): everything after the crc field. baseOffset,
#: batchLength, partitionLeaderEpoch and magic are outside it, so the broker may rewrite them.
ATTRIBUTES_OFFSET: Final = struct.calcsize(">qiibI")
#: Smallest sane batchLength: the header after batchLength, with an empty payload.
_MIN_BATCH_LENGTH: Final = HEADER_SIZE - LOG_OVERHEAD

#: recordCount, the last field of the header
RECORD_COUNT_OFFSET: Final = HEADER_SIZE - struct.calcsize(">i")

_BASE_OFFSET: Final = struct.Struct(">q")
_BATCH_LENGTH: Final = struct.Struct(">i")
_RECORD_COUNT: Final = struct.Struct(">i")
_PARTITION_LEADER_EPOCH: Final = struct.Struct(">i")
_CRC: Final = struct.Struct(">I")

MAGIC: Final = 2
NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1
NO_PARTITION_LEADER_EPOCH: Final = -1

_INT32_MAX: Final = 2**31 - 1
_INT64_MAX: Final = 2**63 - 1

# --- attributes -----------------------------------------------------------------------------

_COMPRESSION_MASK: Final = 0x07  # bits 0-2
_TIMESTAMP_TYPE_BIT: Final = 0x08  # bit 3
_TRANSACTIONAL_BIT: Final = 0x10  # bit 4
_CONTROL_BIT: Final = 0x20  # bit 5
_DELETE_HORIZON_BIT: Final = 0x40  # bit 6 (KIP-534)


class Compression(IntEnum):
    """Kafka's compression codes that an Arrow IPC payload can carry."""

    NONE = 0
    LZ4 = 3
    ZSTD = 4


#: Kafka codes that exist but that Arrow IPC buffer compression cannot carry.
_REFUSED_CODECS: Final = {1: "gzip", 2: "snappy"}
_IPC_CODEC: Final[dict[Compression, str | None]] = {
    Compression.NONE: None,
    Compression.LZ4: "lz4",
    Compression.ZSTD: "zstd",
}


class TimestampType(IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ControlType(IntEnum):
    """The type of a transaction marker, as Kafka's ControlRecordType."""

    ABORT = 0
    COMMIT = 1


# Control record key and value, as Kafka's ControlRecordType / EndTransactionMarker.
_CONTROL_KEY: Final = struct.Struct(
    ">"
    "h"  # version  int16 (= 0)
    "h"  # type     int16 (ControlType)
)
_CONTROL_VALUE: Final = struct.Struct(
    ">"
    "h"  # version            int16 (= 0)
    "i"  # coordinator_epoch  int32
)
_CONTROL_VERSION: Final = 0

# --- payload schema -------------------------------------------------------------------------

#: Record headers. The list is nullable and null means "no headers", the same as an empty list
#: (the builder writes null when its input has no headers; readers must treat both alike, as
#: Kafka has no such distinction). Each header is a non-null struct with a non-null string key and
#: a nullable binary value, as Kafka's record headers.
HEADERS_TYPE: Final = pa.list_(
    pa.field(
        "item",
        pa.struct(
            [
                pa.field("key", pa.string(), nullable=False),
                pa.field("value", pa.binary(), nullable=True),
            ]
        ),
        nullable=False,
    )
)

#: The schema of the Arrow IPC stream in every batch. Record i has offset baseOffset + i; the
#: offset is not stored, so rewriting baseOffset moves every record without touching the payload.
RECORD_SCHEMA: Final = pa.schema(
    [
        pa.field("key", pa.binary(), nullable=True),
        pa.field("value", pa.binary(), nullable=True),
        pa.field("timestamp", pa.int64(), nullable=False),  # ms since the epoch
        pa.field("headers", HEADERS_TYPE, nullable=True),
    ]
)

#: The payload schema of a batch with offset gaps (lastOffsetDelta > recordCount - 1): each
#: record's offset - baseOffset, strictly increasing, in a last column.
OFFSET_DELTA_FIELD: Final = pa.field("offset_delta", pa.int32(), nullable=False)
GAPPED_RECORD_SCHEMA: Final = RECORD_SCHEMA.append(OFFSET_DELTA_FIELD)

_EMPTY_RECORDS: Final = pa.RecordBatch.from_pylist([], schema=RECORD_SCHEMA)
_EMPTY_DELTAS: Final = pa.array([], pa.int32())

_WRITE_OPTIONS: Final = {
    codec: pa.ipc.IpcWriteOptions(compression=name) for codec, name in _IPC_CODEC.items()
}
# An uncompressed payload is the IPC stream the stream writer writes (the schema message, one
# record batch message, the end-of-stream marker), put together from the schema's bytes, made
# once, and the batch's own serialization: a lone record's encoding makes a synchronous send's
# client spend ~250 us of CPU when Arrow's code is cold (as it is between sends ms apart) and the
# writer object is most of it. tests/test_batch.py checks the bytes are the writer's.
_SCHEMA_MESSAGE: Final = RECORD_SCHEMA.serialize().to_pybytes()
_END_OF_STREAM: Final = b"\xff\xff\xff\xff\x00\x00\x00\x00"
# Payloads start 61 bytes into a batch, so their buffers are rarely aligned; have Arrow realign
# (copy) the buffers whose type needs it rather than hand out misaligned arrays.
_READ_OPTIONS: Final = pa.ipc.IpcReadOptions(ensure_alignment=pa.ipc.Alignment.DataTypeSpecific)

# Arrow and the CRC library raise these for malformed input.
_DECODE_ERRORS: Final = (pa.ArrowException, ValueError, OSError, TypeError, IndexError, KeyError)


@dataclass(frozen=True, slots=True)
class Record:
    """One record. ``offset`` is -1 until the record is read back from a batch."""

    key: bytes | None
    value: bytes | None
    timestamp: int  # ms since the epoch
    headers: tuple[tuple[str, bytes | None], ...] = ()
    offset: int = -1


def _crc32c(view: memoryview) -> int:
    # google_crc32c's C functions take only objects whose buffer needs no release (bytes, and
    # pyarrow Buffers); wrapping the memoryview in a pyarrow Buffer avoids copying the batch.
    return int(google_crc32c.value(pa.py_buffer(view)))


def _as_view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _compression_of(attributes: int) -> Compression:
    code = attributes & _COMPRESSION_MASK
    try:
        return Compression(code)
    except ValueError as err:
        name = _REFUSED_CODECS.get(code, "unknown")
        raise CorruptRecordError(
            f"compression code {code} ({name}) is not supported: "
            "Arrow IPC payloads carry only none (0), lz4 (3) or zstd (4)"
        ) from err


class RecordBatch:
    """A view over the bytes of one batch (no copy); build it with :func:`parse_header`.

    The fields covered by the CRC are read once. ``base_offset`` and ``partition_leader_epoch``
    are read from the buffer on each access, so they follow :func:`set_base_offset` and
    :func:`set_partition_leader_epoch`. The view keeps a bytearray it was taken from from being
    resized while the batch (or an Arrow batch read from it) is alive.
    """

    __slots__ = (
        "_control",
        "attributes",
        "base_sequence",
        "batch_length",
        "buffer",
        "crc",
        "first_timestamp",
        "last_offset_delta",
        "magic",
        "max_timestamp",
        "position",
        "producer_epoch",
        "producer_id",
        "record_count",
    )

    buffer: memoryview  # exactly this batch's bytes
    position: int  # where the batch starts in the buffer it was parsed from
    batch_length: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    def __init__(self, buffer: memoryview, position: int = 0) -> None:
        """Wrap ``buffer``, which must hold exactly one batch whose header is well formed."""
        (
            _base_offset,
            self.batch_length,
            _partition_leader_epoch,
            self.magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.first_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.record_count,
        ) = _HEADER.unpack_from(buffer)
        self.buffer = buffer
        self.position = position
        #: a control batch's (key, value), read once (:meth:`_control_record`)
        self._control: tuple[bytes | None, bytes | None] | None = None

    def __repr__(self) -> str:
        return (
            f"RecordBatch(base_offset={self.base_offset}, record_count={self.record_count}, "
            f"size_in_bytes={self.size_in_bytes}, position={self.position})"
        )

    # --- header fields outside the CRC (rewritable) ---

    @property
    def base_offset(self) -> int:
        return int(_BASE_OFFSET.unpack_from(self.buffer, 0)[0])

    @property
    def partition_leader_epoch(self) -> int:
        value = _PARTITION_LEADER_EPOCH.unpack_from(self.buffer, PARTITION_LEADER_EPOCH_OFFSET)
        return int(value[0])

    # --- derived ---

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def has_gaps(self) -> bool:
        """Whether the log cleaner removed records of this batch: record i's offset is then
        ``base_offset + offset_deltas()[i]``, else ``base_offset + i``."""
        return self.last_offset_delta != self.record_count - 1

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def size_in_bytes(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def compression(self) -> Compression:
        """The payload's compression; CorruptRecordError for gzip, snappy or unknown codes."""
        return _compression_of(self.attributes)

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & _TIMESTAMP_TYPE_BIT:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def delete_horizon_ms(self) -> int | None:
        """When the log cleaner may drop this batch's tombstones (or this marker), once it set
        one (KIP-534: then the firstTimestamp field holds it); None before."""
        return self.first_timestamp if self.attributes & _DELETE_HORIZON_BIT else None

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record, wrapping at int32 max as Kafka; -1 without sequence."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        if self.base_sequence > _INT32_MAX - self.last_offset_delta:
            return self.last_offset_delta - (_INT32_MAX - self.base_sequence) - 1
        return self.base_sequence + self.last_offset_delta

    # --- validation ---

    def _where(self) -> str:
        return f"batch at position {self.position} (base offset {self.base_offset})"

    def compute_crc(self) -> int:
        """CRC-32C of the bytes the crc field covers: [ATTRIBUTES_OFFSET, end of batch)."""
        return _crc32c(self.buffer[ATTRIBUTES_OFFSET:])

    def ensure_valid(self) -> None:
        """Check the CRC and the header fields it covers; CorruptRecordError says what is wrong."""
        computed = self.compute_crc()
        if computed != self.crc:
            raise CorruptRecordError(
                f"{self._where()}: CRC mismatch (stored {self.crc:#010x}, "
                f"computed {computed:#010x})"
            )
        try:
            _compression_of(self.attributes)
        except CorruptRecordError as err:
            raise CorruptRecordError(f"{self._where()}: {err}") from err
        if self.record_count < 1 and (
            self.record_count < 0
            or self.batch_length != _MIN_BATCH_LENGTH
            or self.attributes & (_CONTROL_BIT | _TRANSACTIONAL_BIT)
        ):
            raise CorruptRecordError(
                f"{self._where()}: record count {self.record_count} < 1 (only an empty batch "
                "with no payload, neither transactional nor control, has none)"
            )
        if self.last_offset_delta < self.record_count - 1:
            raise CorruptRecordError(
                f"{self._where()}: last offset delta {self.last_offset_delta} is smaller than "
                f"record count {self.record_count} - 1"
            )

    def is_valid(self) -> bool:
        try:
            self.ensure_valid()
        except CorruptRecordError:
            return False
        return True

    # --- payload ---

    def to_arrow(self) -> pa.RecordBatch:
        """The records as one Arrow batch with RECORD_SCHEMA (no offsets column).

        Does not check the CRC (see :meth:`ensure_valid`), but fully validates the decoded
        payload, so malformed bytes give CorruptRecordError rather than a bad array.
        """
        return self.to_arrow_with_deltas()[0]

    def offset_deltas(self) -> list[int] | None:
        """Each record's offset - base_offset for a batch with gaps; None without gaps
        (record i then has offset base_offset + i). Reads the header only in that case."""
        if not self.has_gaps:
            return None
        deltas = self.to_arrow_with_deltas()[1]
        assert deltas is not None
        return deltas.to_pylist()  # type: ignore[no-any-return]

    def to_arrow_with_deltas(self) -> tuple[pa.RecordBatch, pa.Array | None]:
        """:meth:`to_arrow`, and the records' ``offset_delta`` column (int32) for a batch with
        gaps (None without gaps), checked: strictly increasing, from 0 to lastOffsetDelta."""
        if self.record_count == 0 and len(self.buffer) == HEADER_SIZE:
            return _EMPTY_RECORDS, _EMPTY_DELTAS  # an empty batch the log cleaner left
        payload = self.buffer[HEADER_SIZE:]
        gapped = self.has_gaps
        expected = GAPPED_RECORD_SCHEMA if gapped else RECORD_SCHEMA
        try:
            source = pa.BufferReader(pa.py_buffer(payload))
            with pa.ipc.open_stream(source, options=_READ_OPTIONS) as reader:
                schema = reader.schema
                if not schema.equals(expected):
                    name = "GAPPED_RECORD_SCHEMA" if gapped else "RECORD_SCHEMA"
                    raise CorruptRecordError(
                        f"{self._where()}: payload schema {schema} is not {name}"
                    )
                batches = list(reader)
            if source.tell() != len(payload):
                raise CorruptRecordError(
                    f"{self._where()}: {len(payload) - source.tell()} bytes after the end "
                    "of the Arrow IPC stream"
                )
            rows = sum(b.num_rows for b in batches)
            if rows != self.record_count or rows == 0:
                raise CorruptRecordError(
                    f"{self._where()}: payload has {rows} rows, header says "
                    f"{self.record_count} records"
                )
            # The builder writes one Arrow batch; accept a stream of several all the same.
            result = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
            result.validate(full=True)
        except _DECODE_ERRORS as err:
            raise CorruptRecordError(
                f"{self._where()}: malformed Arrow IPC payload: {err}"
            ) from err
        _check_not_null(result, self._where())
        if not gapped:
            return result, None
        deltas = result.column(4)
        self._check_deltas(deltas)
        return result.select(range(4)), deltas

    def _check_deltas(self, deltas: pa.Array) -> None:
        if deltas.null_count:
            raise CorruptRecordError(f"{self._where()}: null offset deltas in the payload")
        first, last = deltas[0].as_py(), deltas[-1].as_py()
        steps = pc.pairwise_diff(deltas) if len(deltas) > 1 else None
        if (
            first < 0
            or last > self.last_offset_delta
            or (steps is not None and pc.min(steps).as_py() < 1)
        ):
            raise CorruptRecordError(
                f"{self._where()}: offset deltas are not strictly increasing within "
                f"[0, {self.last_offset_delta}]"
            )

    def records(self) -> list[Record]:
        """The records as Python objects, with their offsets filled in."""
        data, deltas = self.to_arrow_with_deltas()
        base = self.base_offset
        keys = data.column(0).to_pylist()
        values = data.column(1).to_pylist()
        timestamps = data.column(2).to_pylist()
        headers = data.column(3).to_pylist()
        offsets = (
            range(base, base + data.num_rows)
            if deltas is None
            else [base + d for d in deltas.to_pylist()]
        )
        return [
            Record(
                key=key,
                value=value,
                timestamp=timestamp,
                headers=tuple((h["key"], h["value"]) for h in hs) if hs else (),
                offset=offset,
            )
            for offset, key, value, timestamp, hs in zip(
                offsets, keys, values, timestamps, headers, strict=True
            )
        ]

    def _control_record(self) -> tuple[bytes | None, bytes | None] | None:
        """A control batch's one record as (key, value), decoded once and kept: a marker's
        type and coordinator epoch are both read where it is applied (producer state, on
        every replica), and each decode of the Arrow payload costs tens of microseconds."""
        if not self.is_control:
            return None
        if self._control is None:
            data = self.to_arrow()
            if data.num_rows != 1:
                raise CorruptRecordError(
                    f"{self._where()}: control batch has {data.num_rows} records, expected 1"
                )
            self._control = (data.column(0)[0].as_py(), data.column(1)[0].as_py())
        return self._control

    def control_type(self) -> ControlType | None:
        """The transaction marker's type for a control batch; None for a data batch."""
        record = self._control_record()
        if record is None:
            return None
        key = record[0]
        try:
            version, code = _CONTROL_KEY.unpack(key or b"")
            if version != _CONTROL_VERSION:
                raise CorruptRecordError(f"{self._where()}: unknown control key version {version}")
            return ControlType(code)
        except (struct.error, ValueError) as err:
            raise CorruptRecordError(
                f"{self._where()}: malformed control record key {key!r}"
            ) from err

    def coordinator_epoch(self) -> int | None:
        """The transaction coordinator's epoch for a control batch; None for a data batch."""
        record = self._control_record()
        if record is None:
            return None
        value = record[1]
        try:
            version, epoch = _CONTROL_VALUE.unpack(value or b"")
        except struct.error as err:
            raise CorruptRecordError(
                f"{self._where()}: malformed control record value {value!r}"
            ) from err
        if version != _CONTROL_VERSION:
            raise CorruptRecordError(f"{self._where()}: unknown control value version {version}")
        return int(epoch)


def _check_not_null(data: pa.RecordBatch, where: str) -> None:
    """Arrow does not enforce non-nullable fields; check the ones RECORD_SCHEMA declares."""
    if data.column(2).null_count:
        raise CorruptRecordError(f"{where}: null timestamps in the payload")
    headers = data.column(3)
    if not len(headers.values):
        # No header items at all (most batches): nothing to flatten. (``values`` is every
        # item under the list array, a slice's neighbours' too; flattening is an Arrow
        # compute call, ~20 us, paid per batch read or built.)
        return
    items = headers.flatten()
    if items.null_count or items.field(0).null_count:
        raise CorruptRecordError(f"{where}: null header or header key in the payload")


# --- reading --------------------------------------------------------------------------------


def parse_header(buf: bytes | bytearray | memoryview, position: int = 0) -> RecordBatch:
    """The batch starting at ``position``, with its header checked (not its CRC).

    CorruptRecordError if the header is truncated, the batch length is absurd or runs past the
    end of ``buf``, or the magic is not 2.
    """
    view = _as_view(buf)
    if position < 0:
        raise ValueError(f"negative position {position}")
    available = len(view) - position
    if available < HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated header at position {position}: {max(available, 0)} bytes, "
            f"a header needs {HEADER_SIZE}"
        )
    base_offset, batch_length, _epoch, magic = _HEADER.unpack_from(view, position)[:4]
    if batch_length < _MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"absurd batch length {batch_length} at position {position} "
            f"(base offset {base_offset}): smaller than the header"
        )
    if magic != MAGIC:
        raise CorruptRecordError(
            f"unknown magic {magic} at position {position} (base offset {base_offset}), "
            f"expected {MAGIC}"
        )
    end = position + LOG_OVERHEAD + batch_length
    if end > len(view):
        raise CorruptRecordError(
            f"absurd batch length {batch_length} at position {position} "
            f"(base offset {base_offset}): only {available - LOG_OVERHEAD} bytes follow "
            "(truncated batch)"
        )
    return RecordBatch(view[position:end], position)


def iter_batches(
    buf: bytes | bytearray | memoryview, position: int = 0, *, validate: bool = True
) -> Iterator[RecordBatch]:
    """The batches concatenated in ``buf`` from ``position`` to its end.

    With ``validate`` each batch's CRC is checked. Any problem is a CorruptRecordError naming
    the position (and base offset, once the header is readable).
    """
    view = _as_view(buf)
    while position < len(view):
        batch = parse_header(view, position)
        if validate:
            batch.ensure_valid()
        yield batch
        position += batch.size_in_bytes


def count_records(buf: bytes | bytearray | memoryview) -> int:
    """The records (recordCount summed) of the whole batches at the start of ``buf``.

    Reads two header fields per batch and checks nothing else (for metrics of data already
    checked when it was appended); stops at a partial or absurd batch.
    """
    view = _as_view(buf)
    position = 0
    count = 0
    end = len(view)
    while position + HEADER_SIZE <= end:
        (batch_length,) = _BATCH_LENGTH.unpack_from(view, position + _BASE_OFFSET.size)
        size = LOG_OVERHEAD + batch_length
        if batch_length < _MIN_BATCH_LENGTH or position + size > end:
            break
        count += _RECORD_COUNT.unpack_from(view, position + RECORD_COUNT_OFFSET)[0]
        position += size
    return count


def valid_prefix(
    buf: bytes | bytearray | memoryview,
) -> tuple[list[RecordBatch], int, str | None]:
    """For log recovery: the longest prefix of whole, valid batches.

    Returns the batches, the prefix's length in bytes, and why the rest is invalid (None if the
    whole buffer is valid). Never raises on bad data.
    """
    view = _as_view(buf)
    batches: list[RecordBatch] = []
    position = 0
    try:
        for batch in iter_batches(view, validate=True):
            batches.append(batch)
            position += batch.size_in_bytes
    except CorruptRecordError as err:
        return batches, position, str(err)
    return batches, position, None


# --- rewriting header fields outside the CRC ------------------------------------------------


def set_base_offset(buf: bytearray | memoryview, base_offset: int, position: int = 0) -> None:
    """Set the base offset of the batch at ``position``; its CRC stays valid."""
    batch = parse_header(buf, position)
    if not 0 <= base_offset <= _INT64_MAX - batch.last_offset_delta:
        raise ValueError(f"base offset {base_offset} out of range")
    _BASE_OFFSET.pack_into(buf, position, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, epoch: int, position: int = 0) -> None:
    """Set the partition leader epoch of the batch at ``position``; its CRC stays valid."""
    parse_header(buf, position)
    if not -1 <= epoch <= _INT32_MAX:
        raise ValueError(f"partition leader epoch {epoch} out of range")
    _PARTITION_LEADER_EPOCH.pack_into(buf, position + PARTITION_LEADER_EPOCH_OFFSET, epoch)


# --- building -------------------------------------------------------------------------------


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def records_to_arrow(records: Iterable[Record]) -> pa.RecordBatch:
    """Python records as one Arrow batch with RECORD_SCHEMA (offsets are dropped)."""
    rows = list(records)
    try:
        columns = [
            pa.array([r.key for r in rows], pa.binary()),
            pa.array([r.value for r in rows], pa.binary()),
            pa.array([r.timestamp for r in rows], pa.int64()),
            pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in rows], HEADERS_TYPE),
        ]
    except (pa.ArrowException, OverflowError) as err:
        raise ValueError(f"records do not fit RECORD_SCHEMA: {err}") from err
    data = pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA)
    _check_input_not_null(data)
    return data


def _is_bytes_like(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_large_binary(kind)
    )


def _binary_column(column: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    kind = column.type
    if kind == pa.binary():
        return column
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_string_view(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_binary_view(kind)
        or pa.types.is_fixed_size_binary(kind)
        or pa.types.is_null(kind)
        or (pa.types.is_dictionary(kind) and _is_bytes_like(kind.value_type))
    ):
        return column.cast(pa.binary())
    raise ValueError(f"column {name!r} has type {kind}, expected binary or string")


def _timestamp_column(column: pa.ChunkedArray) -> pa.ChunkedArray:
    kind = column.type
    if pa.types.is_timestamp(kind):
        options = pc.CastOptions(pa.timestamp("ms", kind.tz), allow_time_truncate=True)
        column = pc.cast(column, options=options).cast(pa.int64())
    elif pa.types.is_integer(kind) or pa.types.is_null(kind):
        column = column.cast(pa.int64())
    else:
        raise ValueError(f"column 'timestamp' has type {kind}, expected int64 ms or timestamp")
    if column.null_count:
        column = column.fill_null(_now_ms())
    return column


def to_record_schema(data: pa.Table | pa.RecordBatch) -> pa.RecordBatch:
    """Arrow input for :func:`build` as one Arrow batch with RECORD_SCHEMA, without row loops.

    ``value`` is required (binary or string); ``key``, ``timestamp`` (int64 ms or a timestamp
    type; null or absent means now) and ``headers`` (list of struct<key, value>, or a map) are
    optional. Other columns are ignored.
    """
    if (
        isinstance(data, pa.RecordBatch)
        and data.schema.equals(RECORD_SCHEMA)
        and not data.column(2).null_count  # null timestamps mean now: filled below
    ):
        _check_input_not_null(data)  # already in shape (a producer's own batch)
        return data
    table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    rows = table.num_rows
    names = set(table.schema.names)
    if "value" not in names:
        raise ValueError("Arrow input needs a 'value' column")
    try:
        key = (
            _binary_column(table.column("key"), "key")
            if "key" in names
            else pa.chunked_array([pa.nulls(rows, pa.binary())])
        )
        value = _binary_column(table.column("value"), "value")
        timestamp = (
            _timestamp_column(table.column("timestamp"))
            if "timestamp" in names
            else pa.chunked_array([pa.repeat(pa.scalar(_now_ms(), pa.int64()), rows)])
        )
        headers = (
            table.column("headers").cast(HEADERS_TYPE)
            if "headers" in names
            else pa.chunked_array([pa.nulls(rows, HEADERS_TYPE)])
        )
        columns = [c.combine_chunks() for c in (key, value, timestamp, headers)]
    except (pa.ArrowException, OverflowError) as err:
        raise ValueError(f"Arrow input does not fit RECORD_SCHEMA: {err}") from err
    result = pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA)
    _check_input_not_null(result)
    return result


def _check_input_not_null(data: pa.RecordBatch) -> None:
    try:
        _check_not_null(data, "input")
    except CorruptRecordError as err:
        raise ValueError(str(err)) from None


def _encode(
    data: pa.RecordBatch,
    *,
    base_offset: int,
    partition_leader_epoch: int,
    attributes: int,
    compression: Compression,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    timestamps: tuple[int, int] | None = None,
    last_offset_delta: int | None = None,
) -> bytes:
    """One batch of ``data`` (RECORD_SCHEMA; GAPPED_RECORD_SCHEMA with ``last_offset_delta``,
    for :func:`build_retained`)."""
    count = data.num_rows
    if count == 0:
        raise ValueError("a batch needs at least one record")
    if last_offset_delta is None:
        last_offset_delta = count - 1
    if not 0 <= base_offset <= _INT64_MAX - last_offset_delta:
        raise ValueError(f"base offset {base_offset} out of range")
    parts: tuple[bytes | pa.Buffer, ...]
    if compression is Compression.NONE and data.num_columns == len(RECORD_SCHEMA):
        parts = (_SCHEMA_MESSAGE, data.serialize(), _END_OF_STREAM)
    else:
        sink = pa.BufferOutputStream()
        options = _WRITE_OPTIONS[compression]
        with pa.ipc.new_stream(sink, data.schema, options=options) as writer:
            writer.write_batch(data)
        parts = (sink.getvalue(),)
    if timestamps is None:
        column = data.column(2)
        first_timestamp, max_timestamp = column[0].as_py(), pc.max(column).as_py()
    else:
        first_timestamp, max_timestamp = timestamps
    batch_length = HEADER_SIZE - LOG_OVERHEAD + sum(len(part) for part in parts)
    if batch_length > _INT32_MAX:
        raise ValueError(f"batch of {batch_length} bytes is too large")
    header = bytearray(HEADER_SIZE)
    try:
        _HEADER.pack_into(
            header,
            0,
            base_offset,
            batch_length,
            partition_leader_epoch,
            MAGIC,
            0,  # crc, filled in below
            attributes,
            last_offset_delta,
            first_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
    except struct.error as err:
        raise ValueError(f"header field out of range: {err}") from err
    crc = google_crc32c.value(bytes(header[ATTRIBUTES_OFFSET:]))
    for part in parts:
        crc = google_crc32c.extend(crc, part)
    _CRC.pack_into(header, CRC_OFFSET, crc)
    return b"".join((header, *parts))  # the one copy of the payload


def _check_compression(compression: Compression) -> Compression:
    code = int(compression)
    if code in _REFUSED_CODECS:
        raise ValueError(
            f"{_REFUSED_CODECS[code]} compression is not supported: Arrow IPC payloads "
            "carry only none, lz4 or zstd"
        )
    try:
        return Compression(code)
    except ValueError as err:
        raise ValueError(f"unknown compression code {code}") from err


def build(
    records: Iterable[Record] | pa.Table | pa.RecordBatch,
    *,
    base_offset: int = 0,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """Encode records as one batch; record i gets offset ``base_offset + i``.

    Arrow input (a table or batch) is converted without per-row Python work; see
    :func:`to_record_schema` for the columns it takes. Empty input is a ValueError.
    """
    compression = _check_compression(compression)
    timestamp_type = TimestampType(timestamp_type)
    if is_transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id")
    timestamps = None
    if isinstance(records, pa.Table | pa.RecordBatch):
        data = to_record_schema(records)
    else:
        rows = list(records)
        data = records_to_arrow(rows)  # a null timestamp is a ValueError here
        # The first and largest timestamps in Python, not with an Arrow call: a coordinator's
        # batches are a record or three.
        timestamps = (rows[0].timestamp, max(r.timestamp for r in rows)) if rows else None
    attributes = int(compression)
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= _TIMESTAMP_TYPE_BIT
    if is_transactional:
        attributes |= _TRANSACTIONAL_BIT
    return _encode(
        data,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=attributes,
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        timestamps=timestamps,
    )


def build_checked(
    data: pa.RecordBatch,
    *,
    timestamps: tuple[int, int],
    compression: Compression = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
) -> bytes:
    """:func:`build` for records its caller built in RECORD_SCHEMA and checked (no null
    timestamp, header or header key: a producer's own records), with their first and largest
    timestamps (``timestamps``): none of build()'s conversions and checks, Arrow calls that
    cost tens of microseconds each when Arrow's code is cold."""
    compression = _check_compression(compression)
    if is_transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id")
    return _encode(
        data,
        base_offset=0,
        partition_leader_epoch=NO_PARTITION_LEADER_EPOCH,
        attributes=int(compression) | (_TRANSACTIONAL_BIT if is_transactional else 0),
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        timestamps=timestamps,
    )


def build_retained(
    batch: RecordBatch,
    keep: pa.Array | Sequence[int],
    *,
    delete_horizon_ms: int | None = None,
) -> bytes:
    """``batch`` with only its records at positions ``keep`` (ascending), as the log cleaner
    writes it (Kafka's MemoryRecords.filterTo): base offset, lastOffsetDelta, attributes,
    producer fields, base sequence and partition leader epoch stay, so every kept record keeps
    its offset and the producer's last sequence stays; the timestamps are the kept records'.
    ``delete_horizon_ms`` sets the batch's delete horizon (KIP-534: bit 6, in firstTimestamp).
    The batch's own bytes when every record is kept and the horizon does not change.

    A batch that lost records carries their offset deltas (GAPPED_RECORD_SCHEMA); one that lost
    them all is an empty batch (no payload): a data batch keeps its producer id, epoch and
    sequence (not its transactional bit: it holds no transaction's data any more), a marker
    keeps nothing but its offsets."""
    positions = pa.array(keep, pa.int32()) if not isinstance(keep, pa.Array) else keep
    horizon = batch.delete_horizon_ms if delete_horizon_ms is None else delete_horizon_ms
    if len(positions) == batch.record_count and horizon == batch.delete_horizon_ms:
        return bytes(batch.buffer)
    if len(positions) == 0:
        return _empty_batch(batch)
    data, deltas = batch.to_arrow_with_deltas()
    attributes = batch.attributes
    if len(positions) == batch.record_count and deltas is None:
        kept = data  # the horizon alone changes
    else:
        kept = data.take(positions)
        kept_deltas = positions if deltas is None else deltas.take(positions)
        kept = pa.RecordBatch.from_arrays(
            [*kept.columns, kept_deltas.cast(pa.int32())], schema=GAPPED_RECORD_SCHEMA
        )
    column = kept.column(2)
    first_timestamp, max_timestamp = column[0].as_py(), pc.max(column).as_py()
    if batch.timestamp_type is TimestampType.LOG_APPEND_TIME:
        first_timestamp = max_timestamp = batch.max_timestamp
    if horizon is not None:
        attributes |= _DELETE_HORIZON_BIT
        first_timestamp = horizon
    producer = {
        "producer_id": batch.producer_id,
        "producer_epoch": batch.producer_epoch,
        "base_sequence": batch.base_sequence,
    }
    return _encode(
        kept,
        base_offset=batch.base_offset,
        partition_leader_epoch=batch.partition_leader_epoch,
        attributes=attributes,
        compression=batch.compression,
        timestamps=(first_timestamp, max_timestamp),
        last_offset_delta=batch.last_offset_delta,
        **producer,
    )


def _empty_batch(batch: RecordBatch) -> bytes:
    """The empty batch that stands for ``batch`` once the cleaner removed all its records."""
    producer = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE)
    if not batch.is_control:
        producer = (batch.producer_id, batch.producer_epoch, batch.base_sequence)
    return build_empty(
        batch.base_offset,
        batch.next_offset,
        partition_leader_epoch=batch.partition_leader_epoch,
        max_timestamp=batch.max_timestamp,
        attributes=batch.attributes & _TIMESTAMP_TYPE_BIT,
        producer=producer,
    )


def build_empty(
    base_offset: int,
    next_offset: int,
    *,
    partition_leader_epoch: int,
    max_timestamp: int,
    attributes: int = 0,
    producer: tuple[int, int, int] = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE),
) -> bytes:
    """An empty batch (no records, no payload) holding the offsets ``[base_offset,
    next_offset)``: what stays of batches whose every record the log cleaner removed (a run of
    them becomes one, when no producer needs them for its sequence)."""
    header = bytearray(HEADER_SIZE)
    _HEADER.pack_into(
        header,
        0,
        base_offset,
        _MIN_BATCH_LENGTH,
        partition_leader_epoch,
        MAGIC,
        0,  # crc, filled in below
        attributes,
        next_offset - base_offset - 1,
        max_timestamp,
        max_timestamp,
        *producer,
        0,
    )
    _CRC.pack_into(header, CRC_OFFSET, google_crc32c.value(bytes(header[ATTRIBUTES_OFFSET:])))
    return bytes(header)


def build_control(
    control_type: ControlType,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp: int,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A transaction marker: a transactional control batch with one record, as Kafka."""
    control_type = ControlType(control_type)
    if producer_id < 0:
        raise ValueError("a control batch needs a producer id")
    try:
        key = _CONTROL_KEY.pack(_CONTROL_VERSION, control_type)
        value = _CONTROL_VALUE.pack(_CONTROL_VERSION, coordinator_epoch)
    except struct.error as err:
        raise ValueError(f"coordinator epoch {coordinator_epoch} out of range") from err
    data = records_to_arrow([Record(key=key, value=value, timestamp=timestamp)])
    return _encode(
        data,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=_TRANSACTIONAL_BIT | _CONTROL_BIT,
        compression=Compression.NONE,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        timestamps=(timestamp, timestamp),  # one record: no Arrow call to find them
    )
