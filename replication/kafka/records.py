"""Transcoding between Kafka's RecordBatch v2 and replog's batches.

Kafka clients produce, and expect in fetch responses, Kafka's DefaultRecordBatch (magic 2): a
61-byte header, then the records, each a run of varints (length, attributes, timestamp delta,
offset delta, key, value, headers), the whole record section compressed with the batch's codec
(gzip, snappy, lz4 or zstd). replog's batch (:mod:`logstore.batch`) has byte for byte the same
header, but its payload after recordCount is an Arrow IPC stream with ``RECORD_SCHEMA``.

Design: the Kafka listener transcodes at the edge, and replog keeps its Arrow payload in
storage. The Spark read path, which reads Arrow straight from segment objects, neither changes
nor slows down; the cost is CPU at the Kafka listener, measured by
``benchmarks/kafka_records.py``.

- :func:`kafka_to_replog` takes the ``records`` of one partition of a Produce request: exactly
  one batch (as Kafka for Produce v3+), validated as Kafka's broker does (magic 2, lengths,
  CRC-32C, no control batch from a client, offset deltas 0..n-1, each record's length, no
  trailing bytes, UTF-8 header keys), decompressed, and rebuilt as a replog batch with base
  offset 0 (the broker assigns offsets and the partition leader epoch). It keeps the timestamp
  type, the transactional bit, producer id, producer epoch and base sequence.
- :func:`replog_to_kafka` turns a fetch result (replog batches, possibly ending with a partial
  one, which is dropped) into uncompressed Kafka batches with the same header fields and a new
  CRC. Transaction markers come out as Kafka's control records: ``build_control`` stores
  Kafka's control key and value bytes as the record's key and value.

Timestamps. A replog record stores its timestamp; a Kafka record stores a delta from the
batch's firstTimestamp. ``build`` derives replog's firstTimestamp (the first record's) and
maxTimestamp (the largest) from the records. With a CREATE_TIME batch that is what Kafka's
broker stores too: its LogValidator recomputes maxTimestamp from the records, and Kafka's
producers set firstTimestamp to the first record's timestamp (only a client writing a nonzero
delta for record 0 would see firstTimestamp change, never a record's timestamp). A Kafka reader
gives every record of a LOG_APPEND_TIME batch the batch's maxTimestamp and ignores the deltas;
here such a batch (unusual from a client; the bit is kept) stores maxTimestamp as every
record's timestamp, so replog's header carries Kafka's maxTimestamp and every reader (Kafka
client, replog client, Spark) sees the timestamps a Kafka reader would.

Compression. Arrow IPC buffer compression can carry only lz4 and zstd, so the replog batch is
compressed with lz4 for Kafka's lz4 and snappy (both fast codecs), zstd for zstd and gzip (both
dense), none for none. Fetched batches go to Kafka clients uncompressed (compression bits 0):
the listener does not spend CPU recompressing, so a fetch response can be larger on the wire
than the stored batches.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, NoReturn

import cramjam
import google_crc32c
import pyarrow as pa
import pyarrow.compute as pc

from logstore.batch import (
    HEADER_SIZE,
    HEADERS_TYPE,
    LOG_OVERHEAD,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    RECORD_SCHEMA,
    Compression,
    RecordBatch,
    TimestampType,
    parse_header,
)
from logstore.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError

__all__ = ["kafka_to_replog", "replog_to_kafka"]

# --- Kafka's batch header (the same layout as logstore.batch's) -----------------------------

_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
#: baseOffset, batchLength, partitionLeaderEpoch, magic, crc: the bytes before the CRC'd part.
_PREFIX: Final = struct.Struct(">qiibI")
#: attributes .. recordCount: the header bytes the CRC covers.
_TAIL: Final = struct.Struct(">hiqqqhii")
_INT32: Final = struct.Struct(">i")
assert _HEADER.size == HEADER_SIZE == _PREFIX.size + _TAIL.size

#: Where the magic byte is, in magic 2 batches and in v0/v1 message sets alike.
_MAGIC_OFFSET: Final = 16
#: batchLength of a batch with no records: the header after the batchLength field.
_MIN_BATCH_LENGTH: Final = HEADER_SIZE - LOG_OVERHEAD
_INT32_MAX: Final = 2**31 - 1
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1

_COMPRESSION_MASK: Final = 0x07
_TIMESTAMP_TYPE_BIT: Final = 0x08
_TRANSACTIONAL_BIT: Final = 0x10
_CONTROL_BIT: Final = 0x20
#: The attribute bits a fetched batch keeps: timestamp type, transactional, control.
_FETCH_ATTRIBUTES: Final = _TIMESTAMP_TYPE_BIT | _TRANSACTIONAL_BIT | _CONTROL_BIT

_GZIP: Final = 1
_SNAPPY: Final = 2
_LZ4: Final = 3
_ZSTD: Final = 4
_CODEC_NAMES: Final = {0: "none", _GZIP: "gzip", _SNAPPY: "snappy", _LZ4: "lz4", _ZSTD: "zstd"}
#: replog's compression for each Kafka codec. Arrow IPC buffer compression can carry only lz4
#: and zstd: gzip (dense, slow) becomes zstd, snappy (fast) becomes lz4.
_REPLOG_COMPRESSION: Final = {
    0: Compression.NONE,
    _GZIP: Compression.ZSTD,
    _SNAPPY: Compression.LZ4,
    _LZ4: Compression.LZ4,
    _ZSTD: Compression.ZSTD,
}

#: As logstore.batch writes its Arrow IPC payloads (build's options for each compression).
_IPC_OPTIONS: Final = {
    Compression.NONE: pa.ipc.IpcWriteOptions(compression=None),
    Compression.LZ4: pa.ipc.IpcWriteOptions(compression="lz4"),
    Compression.ZSTD: pa.ipc.IpcWriteOptions(compression="zstd"),
}

#: The xerial snappy framing Kafka's Java client writes: this magic, int32 version, int32
#: compat, then blocks, each an int32 length and raw snappy bytes.
_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE: Final = 16

#: A record is at least: attributes, timestamp delta, offset delta, key and value lengths and the
#: header count, one byte each.
_MIN_RECORD_SIZE: Final = 6

#: Zigzag varint encodings of 0 .. _VARINTS - 1: lengths, offset deltas and small timestamp
#: deltas (a constant table, built once at import).
_VARINTS: Final = 1 << 13


def _encode_varint(value: int) -> bytes:
    """Kafka's zigzag varint (varlong) of a signed integer."""
    unsigned = (value << 1) if value >= 0 else ((~value) << 1) | 1
    out = bytearray()
    while unsigned >= 0x80:
        out.append((unsigned & 0x7F) | 0x80)
        unsigned >>= 7
    out.append(unsigned)
    return bytes(out)


_ZIGZAG: Final[tuple[bytes, ...]] = tuple(_encode_varint(n) for n in range(_VARINTS))
_NULL: Final = _encode_varint(-1)  # the length of a null key, value or header value


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint (up to 10 bytes: a varlong) at ``pos``, and the position after it."""
    result = 0
    shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")


# --- Kafka -> replog ----------------------------------------------------------------------


def _as_view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _decompress_snappy(data: memoryview) -> bytes:
    if data[: len(_XERIAL_MAGIC)].tobytes() != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(data))
    blocks: list[bytes] = []
    pos = _XERIAL_HEADER_SIZE
    end = len(data)
    if end < pos:
        raise ValueError(f"xerial snappy header truncated ({end} bytes)")
    while pos < end:
        if end - pos < _INT32.size:
            raise ValueError(f"xerial snappy block length truncated at byte {pos}")
        (size,) = _INT32.unpack_from(data, pos)
        pos += _INT32.size
        if size < 0 or size > end - pos:
            raise ValueError(
                f"xerial snappy block at byte {pos} has length {size}, {end - pos} bytes follow"
            )
        blocks.append(bytes(cramjam.snappy.decompress_raw(data[pos : pos + size])))
        pos += size
    return b"".join(blocks)


def _decompress(codec: int, data: memoryview) -> bytes:
    try:
        if codec == 0:
            return bytes(data)
        if codec == _GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == _SNAPPY:
            return _decompress_snappy(data)
        if codec == _LZ4:
            return bytes(cramjam.lz4.decompress(data))
        return bytes(cramjam.zstd.decompress(data))
    except (cramjam.DecompressionError, ValueError) as err:
        raise InvalidRecordError(
            f"record batch: malformed {_CODEC_NAMES[codec]} payload: {err}"
        ) from err


class _Records:
    """The columns of a Kafka batch's records, decoded by :func:`_decode_records`."""

    __slots__ = (
        "header_counts",
        "header_keys",
        "header_values",
        "keys",
        "timestamp_deltas",
        "values",
    )

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamp_deltas: list[int] = []
        self.header_keys: list[bytes] = []
        self.header_values: list[bytes | None] = []
        #: (record index, header count) for the records that have headers.
        self.header_counts: list[tuple[int, int]] = []


def _invalid(message: str) -> NoReturn:
    raise InvalidRecordError(message)


def _bad_offset_delta(index: int, offset_delta: int) -> NoReturn:
    raise InvalidRecordError(
        f"record {index}: offset delta {offset_delta}, expected {index} "
        "(offset deltas must be 0, 1, 2, ...)"
    )


def _decode_records(buf: bytes, count: int) -> _Records:
    """Kafka records (uncompressed) as Python lists; InvalidRecordError names what is wrong.

    The varints are decoded inline for their common one- and two-byte forms (this loop is the
    listener's cost per produced record); longer ones go through :func:`_varint`.
    """
    out = _Records()
    keys = out.keys.append
    values = out.values.append
    deltas = out.timestamp_deltas.append
    header_keys = out.header_keys.append
    header_values = out.header_values.append
    size = len(buf)
    pos = 0
    i = 0
    try:
        for i in range(count):
            # length: varint
            b = buf[pos]
            if b < 0x80:
                pos += 1
                length = (b >> 1) ^ -(b & 1)
            elif (c := buf[pos + 1]) < 0x80:
                b = (b & 0x7F) | (c << 7)
                pos += 2
                length = (b >> 1) ^ -(b & 1)
            else:
                length, pos = _varint(buf, pos)
            end = pos + length
            if length < _MIN_RECORD_SIZE or end > size:
                _invalid(f"record {i}: invalid record length {length} ({size - pos} bytes follow)")
            # attributes: int8, unused by Kafka, must be 0
            if buf[pos]:
                _invalid(f"record {i}: attributes {buf[pos]}, expected 0")
            # timestampDelta: varlong
            pos += 1
            b = buf[pos]
            if b < 0x80:
                pos += 1
                deltas((b >> 1) ^ -(b & 1))
            elif (c := buf[pos + 1]) < 0x80:
                b = (b & 0x7F) | (c << 7)
                pos += 2
                deltas((b >> 1) ^ -(b & 1))
            else:
                delta, pos = _varint(buf, pos)
                deltas(delta)
            # offsetDelta: varint, must be i (replog's offsets have no gaps): compared in its
            # zigzag form, 2i, when it takes one or two bytes
            b = buf[pos]
            if b < 0x80:
                pos += 1
                if b != i << 1:
                    _bad_offset_delta(i, (b >> 1) ^ -(b & 1))
            elif (c := buf[pos + 1]) < 0x80:
                pos += 2
                b = (b & 0x7F) | (c << 7)
                if b != i << 1:
                    _bad_offset_delta(i, (b >> 1) ^ -(b & 1))
            else:
                offset_delta, pos = _varint(buf, pos)
                if offset_delta != i:
                    _bad_offset_delta(i, offset_delta)
            # key: varint length (-1: null), bytes
            b = buf[pos]
            if b == 1:  # -1: null, the common case
                pos += 1
                keys(None)
            else:
                if b < 0x80:
                    pos += 1
                    n = (b >> 1) ^ -(b & 1)
                else:
                    n, pos = _varint(buf, pos)
                if n >= 0:
                    keys(buf[pos : pos + n])
                    pos += n
                elif n == -1:
                    keys(None)
                else:
                    _invalid(f"record {i}: invalid key length {n}")
            # value: varint length (-1: null), bytes
            b = buf[pos]
            if b < 0x80:
                pos += 1
                n = (b >> 1) ^ -(b & 1)
            elif (c := buf[pos + 1]) < 0x80:
                b = (b & 0x7F) | (c << 7)
                pos += 2
                n = (b >> 1) ^ -(b & 1)
            else:
                n, pos = _varint(buf, pos)
            if n >= 0:
                values(buf[pos : pos + n])
                pos += n
            elif n == -1:
                values(None)
            else:
                _invalid(f"record {i}: invalid value length {n}")
            # headers: varint count, then (varint length + UTF-8 key, varint length + value)
            if buf[pos] == 0:
                pos += 1
            else:
                n, pos = _varint(buf, pos)
                if not 0 <= n <= (end - pos) // 2:
                    _invalid(f"record {i}: invalid header count {n}")
                if n:
                    out.header_counts.append((i, n))
                for _ in range(n):
                    key_length, pos = _varint(buf, pos)
                    if key_length < 0:
                        _invalid(f"record {i}: invalid header key length {key_length}")
                    header_keys(buf[pos : pos + key_length])
                    pos += key_length
                    value_length, pos = _varint(buf, pos)
                    if value_length >= 0:
                        header_values(buf[pos : pos + value_length])
                        pos += value_length
                    elif value_length == -1:
                        header_values(None)
                    else:
                        _invalid(f"record {i}: invalid header value length {value_length}")
            if pos != end:
                _invalid(
                    f"record {i}: invalid record size: its length says {length} bytes, "
                    f"its fields take {length + pos - end}"
                )
    except InvalidRecordError:
        raise
    except (IndexError, ValueError) as err:
        raise InvalidRecordError(
            f"record {i}: truncated or malformed ({err}); the batch says {count} records"
        ) from err
    if pos != size:
        raise InvalidRecordError(
            f"{size - pos} trailing bytes after the {count} records the batch header counts"
        )
    return out


def _headers_column(records: _Records, count: int) -> pa.Array:
    """The headers column: null for a record without headers (Kafka has no null/empty split)."""
    if not records.header_counts:
        # Not pa.nulls: its buffers are not the ones build's conversion makes (4 KiB more per
        # 500 rows in the IPC stream); this is.
        return pa.array([None] * count, HEADERS_TYPE)
    try:
        keys = pa.array(records.header_keys, pa.binary()).cast(pa.string())
    except pa.ArrowInvalid as err:
        raise InvalidRecordError(f"a record header key is not valid UTF-8: {err}") from err
    items = pa.StructArray.from_arrays(
        [keys, pa.array(records.header_values, pa.binary())],
        fields=list(HEADERS_TYPE.value_type),
    )
    offsets = [0] * (count + 1)
    null = [True] * count
    for index, n in records.header_counts:
        offsets[index + 1] = n
        null[index] = False
    total = 0
    for index in range(1, count + 1):
        total += offsets[index]
        offsets[index] = total
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), items, type=HEADERS_TYPE, mask=pa.array(null, pa.bool_())
    )


def _magic_error(magic: int) -> InvalidRecordError:
    if magic in (0, 1):
        return InvalidRecordError(
            f"record batch has magic {magic}: message format v0/v1 is not supported; "
            "use a client with magic 2 (Kafka 0.11+)"
        )
    return InvalidRecordError(f"record batch has unknown magic {magic}, expected {MAGIC}")


def kafka_to_replog(records: bytes | memoryview, *, compacted: bool = False) -> bytes:
    """One partition's ``records`` from a Kafka Produce request as one replog batch.

    ``records`` must hold exactly one Kafka RecordBatch v2 (as Kafka requires for Produce v3+).
    Returns a replog batch with base offset 0 and partition leader epoch -1: the broker assigns
    both. CorruptRecordError for a CRC mismatch or an absurd batch length (Kafka's
    CORRUPT_MESSAGE), InvalidRecordError for anything else a client got wrong
    (INVALID_RECORD); each message names the problem. With ``compacted`` (the topic's
    cleanup.policy names compact) a record without a key is refused with INVALID_RECORD, as
    Kafka 2.5+ refuses it (older brokers answered CORRUPT_MESSAGE).
    """
    return _build_replog(_decode_kafka(records, compacted=compacted))


@dataclass(frozen=True, slots=True)
class _Decoded:
    """A Kafka batch's records as Arrow, and the header fields of its replog batch (the
    arguments :func:`logstore.batch.build` would take, and the timestamps it would derive)."""

    data: pa.RecordBatch
    compression: Compression
    timestamp_type: TimestampType
    is_transactional: bool
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int


def _decode_kafka(records: bytes | memoryview, *, compacted: bool = False) -> _Decoded:
    """Validate and decode one Kafka batch (see :func:`kafka_to_replog`)."""
    view = _as_view(records)
    size = len(view)
    if size == 0:
        raise InvalidRecordError(
            "no record batch: a Produce request (v3+) must carry exactly one record batch "
            "per partition"
        )
    if size > _MAGIC_OFFSET:
        magic = struct.unpack_from(">b", view, _MAGIC_OFFSET)[0]
        if magic != MAGIC:
            raise _magic_error(magic)
    if size < HEADER_SIZE:
        raise InvalidRecordError(
            f"truncated record batch: {size} bytes, a batch header needs {HEADER_SIZE}"
        )
    (
        base_offset,
        batch_length,
        _partition_leader_epoch,  # assigned by the broker
        _magic,
        crc,
        attributes,
        last_offset_delta,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    ) = _HEADER.unpack_from(view)
    if batch_length < _MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"record batch length {batch_length} is smaller than the batch header "
            f"({_MIN_BATCH_LENGTH} bytes after the length field)"
        )
    end = LOG_OVERHEAD + batch_length
    if end > size:
        raise InvalidRecordError(
            f"truncated record batch: its length says {batch_length} bytes follow the length "
            f"field, {size - LOG_OVERHEAD} do"
        )
    if end < size:
        raise InvalidRecordError(
            f"{size - end} bytes after the first record batch: a Produce request (v3+) must "
            "carry exactly one record batch per partition"
        )
    computed = int(google_crc32c.value(pa.py_buffer(view[_PREFIX.size :])))
    if computed != crc:
        raise CorruptRecordError(
            f"record batch is corrupt: CRC-32C mismatch (stored {crc:#010x}, "
            f"computed {computed:#010x})"
        )
    if base_offset != 0:
        raise InvalidRecordError(
            f"record batch has base offset {base_offset}: a producer's batch must have 0"
        )
    if attributes & _CONTROL_BIT:
        raise InvalidRecordError("clients are not allowed to write control batches")
    codec = attributes & _COMPRESSION_MASK
    if codec not in _REPLOG_COMPRESSION:
        raise InvalidRecordError(f"compression codec {codec} is not supported")
    if record_count <= 0:
        raise InvalidRecordError(f"record batch has record count {record_count}, expected > 0")
    if last_offset_delta != record_count - 1:
        raise InvalidRecordError(
            f"record batch's last offset delta {last_offset_delta} does not match its record "
            f"count {record_count}"
        )
    transactional = bool(attributes & _TRANSACTIONAL_BIT)
    if transactional and producer_id < 0:
        raise InvalidRecordError("transactional record batch without a producer id")
    if producer_id >= 0 and base_sequence < 0:
        raise InvalidRecordError(
            f"invalid base sequence {base_sequence} in a record batch with producer id "
            f"{producer_id}"
        )
    payload = _decompress(codec, view[HEADER_SIZE:])
    decoded = _decode_records(payload, record_count)
    if compacted and None in decoded.keys:
        raise InvalidRecordError(
            f"Compacted topic cannot accept message without key: record "
            f"{decoded.keys.index(None)} has none (cleanup.policy names compact, which keeps "
            "the latest record per key; give every record a key)"
        )

    if attributes & _TIMESTAMP_TYPE_BIT:
        timestamp_type = TimestampType.LOG_APPEND_TIME
        # Kafka readers give every record of a LOG_APPEND_TIME batch the batch's maxTimestamp.
        first_timestamp = max_timestamp
        timestamps = pa.repeat(pa.scalar(max_timestamp, pa.int64()), record_count)
    else:
        timestamp_type = TimestampType.CREATE_TIME
        deltas = decoded.timestamp_deltas
        low = min(deltas)
        high = max(deltas)
        base = first_timestamp
        if min(low, base + low) < _INT64_MIN or max(high, base + high) > _INT64_MAX:
            raise InvalidRecordError(
                f"record timestamps out of range: first timestamp {base}, deltas {low} .. {high}"
            )
        first_timestamp = base + deltas[0]
        max_timestamp = base + high
        timestamps = pc.add(pa.array(deltas, pa.int64()), pa.scalar(base, pa.int64()))
    data = pa.RecordBatch.from_arrays(
        [
            pa.array(decoded.keys, pa.binary()),
            pa.array(decoded.values, pa.binary()),
            timestamps,
            _headers_column(decoded, record_count),
        ],
        schema=RECORD_SCHEMA,
    )
    return _Decoded(
        data=data,
        compression=_REPLOG_COMPRESSION[codec],
        timestamp_type=timestamp_type,
        is_transactional=transactional,
        first_timestamp=first_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def _build_replog(decoded: _Decoded) -> bytes:
    """The bytes :func:`logstore.batch.build` makes of ``decoded`` with base offset 0, without
    its input conversion and checks (``decoded.data`` has RECORD_SCHEMA, no nulls where it allows
    none, and the timestamps given are its first and largest). tests/test_kafka_records.py
    checks that the bytes are the same as build's.
    """
    data = decoded.data
    compression = decoded.compression
    attributes = int(compression)
    if decoded.timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= _TIMESTAMP_TYPE_BIT
    if decoded.is_transactional:
        attributes |= _TRANSACTIONAL_BIT
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RECORD_SCHEMA, options=_IPC_OPTIONS[compression]) as writer:
        writer.write_batch(data)
    payload = sink.getvalue()
    batch_length = _MIN_BATCH_LENGTH + payload.size
    if batch_length > _INT32_MAX:
        raise RecordTooLargeError(f"replog batch of {batch_length} bytes is too large")
    count = data.num_rows
    tail = _TAIL.pack(
        attributes,
        count - 1,
        decoded.first_timestamp,
        decoded.max_timestamp,
        decoded.producer_id,
        decoded.producer_epoch,
        decoded.base_sequence,
        count,
    )
    crc = google_crc32c.extend(google_crc32c.value(tail), payload)
    prefix = _PREFIX.pack(0, batch_length, NO_PARTITION_LEADER_EPOCH, MAGIC, crc)
    return b"".join((prefix, tail, payload))


# --- replog -> Kafka ----------------------------------------------------------------------


def _encode_batch(batch: RecordBatch, out: list[bytes]) -> None:
    """Append one replog batch as an uncompressed Kafka batch (prefix, CRC'd header, records)."""
    data, offset_deltas = batch.to_arrow_with_deltas()
    count = data.num_rows
    first = batch.first_timestamp
    # A batch the log cleaner left with offset gaps carries each record's offset delta, as a
    # cleaned Kafka batch does; any other batch's record i has delta i.
    positions: Iterable[int] = range(count) if offset_deltas is None else offset_deltas.to_pylist()
    keys = data.column(0).to_pylist()
    values = data.column(1).to_pylist()
    try:
        deltas = pc.subtract_checked(data.column(2), pa.scalar(first, pa.int64())).to_pylist()
    except pa.ArrowInvalid as err:
        raise CorruptRecordError(
            f"batch at base offset {batch.base_offset}: timestamp delta out of range: {err}"
        ) from err
    headers = _encoded_headers(data.column(3))
    if headers is None:
        headers = [b"\x00"] * count  # a header count of 0
    zigzag = _ZIGZAG
    limit = _VARINTS
    encode = _encode_varint
    null = _NULL
    parts: list[bytes] = []
    append = parts.append
    for i, key, value, delta, header in zip(positions, keys, values, deltas, headers, strict=True):
        if key is None:
            key_length = null
            key = b""
        else:
            n = len(key)
            key_length = zigzag[n] if n < limit else encode(n)
        if value is None:
            value_length = null
            value = b""
        else:
            n = len(value)
            value_length = zigzag[n] if n < limit else encode(n)
        record = b"".join(
            (
                b"\x00",  # attributes
                zigzag[delta] if 0 <= delta < limit else encode(delta),
                zigzag[i] if i < limit else encode(i),
                key_length,
                key,
                value_length,
                value,
                header,
            )
        )
        n = len(record)
        append(zigzag[n] if n < limit else encode(n))
        append(record)
    body = b"".join(parts)
    batch_length = _MIN_BATCH_LENGTH + len(body)
    if batch_length > _INT32_MAX:
        raise RecordTooLargeError(
            f"batch at base offset {batch.base_offset}: {batch_length} bytes uncompressed, "
            "too large for a Kafka batch"
        )
    tail = _TAIL.pack(
        batch.attributes & _FETCH_ATTRIBUTES,
        batch.last_offset_delta,
        first,
        batch.max_timestamp,
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
        count,
    )
    crc = google_crc32c.extend(google_crc32c.value(tail), body)
    out.append(
        _PREFIX.pack(batch.base_offset, batch_length, batch.partition_leader_epoch, MAGIC, crc)
    )
    out.append(tail)
    out.append(body)


def _encoded_headers(column: pa.Array) -> list[bytes] | None:
    """Each record's Kafka header section (count, then keys and values); None if none has any."""
    count = len(column)
    if column.null_count == count:
        return None
    offsets = column.offsets.to_pylist()
    if offsets[0] == offsets[-1]:
        return None
    valid = column.is_valid().to_pylist() if column.null_count else None
    key_column, value_column = column.values.flatten()
    keys = key_column.cast(pa.binary()).to_pylist()
    values = value_column.to_pylist()
    zigzag = _ZIGZAG
    limit = _VARINTS
    encode = _encode_varint
    result: list[bytes] = []
    for i in range(count):
        start = offsets[i]
        stop = offsets[i + 1]
        if start == stop or (valid is not None and not valid[i]):
            result.append(b"\x00")
            continue
        n = stop - start
        parts = [zigzag[n] if n < limit else encode(n)]
        for j in range(start, stop):
            key = keys[j]
            n = len(key)
            parts.append(zigzag[n] if n < limit else encode(n))
            parts.append(key)
            value = values[j]
            if value is None:
                parts.append(_NULL)
            else:
                n = len(value)
                parts.append(zigzag[n] if n < limit else encode(n))
                parts.append(value)
        result.append(b"".join(parts))
    return result


def replog_to_kafka(data: bytes | memoryview) -> bytes:
    """replog batches (a fetch result) as concatenated, uncompressed Kafka RecordBatch v2.

    Whole batches only: a partial batch at the end (a fetch cut at its byte limit) is dropped,
    as Kafka clients drop one. Each batch keeps its base offset, partition leader epoch, last
    offset delta, timestamps, timestamp type, transactional and control bits, producer id and
    epoch, base sequence and record count, and gets a new CRC-32C. A replog batch whose CRC or
    payload is bad is a CorruptRecordError (the data is checked before it is re-checksummed).
    """
    view = _as_view(data)
    size = len(view)
    out: list[bytes] = []
    pos = 0
    while size - pos >= HEADER_SIZE:
        (batch_length,) = _INT32.unpack_from(view, pos + 8)
        if batch_length >= _MIN_BATCH_LENGTH and batch_length > size - pos - LOG_OVERHEAD:
            break  # a partial batch at the end
        batch = parse_header(view, pos)
        batch.ensure_valid()
        _encode_batch(batch, out)
        pos += batch.size_in_bytes
    return b"".join(out)
