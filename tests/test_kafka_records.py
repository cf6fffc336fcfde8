"""replication.kafka.records against kafka-python's own RecordBatch v2 writer and reader.

kafka-python (nobody here wrote it) builds the Kafka batches a client would produce, in every
codec, and reads back what replog_to_kafka makes of replog's batches, checking the CRC. Bytes
no client writes (bad offset deltas, invalid UTF-8 header keys, trailing bytes, xerial snappy
blocks, zstd frames without a content size) are assembled here by hand from Kafka's layout.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import cramjam
import pyarrow as pa
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import (
    ControlRecord,
    DefaultRecordBatch,
    DefaultRecordBatchBuilder,
)
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c, encode_varint

from logstore.batch import (
    HEADER_SIZE,
    Compression,
    ControlType,
    Record,
    TimestampType,
    build,
    build_control,
    iter_batches,
    parse_header,
    set_base_offset,
)
from logstore.errors import CorruptRecordError, InvalidRecordError
from replication.kafka import records as kafka_records
from replication.kafka.records import kafka_to_replog, replog_to_kafka

pytestmark = pytest.mark.unit

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODECS = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
REPLOG_COMPRESSION = {
    NONE: Compression.NONE,
    GZIP: Compression.ZSTD,
    SNAPPY: Compression.LZ4,
    LZ4: Compression.LZ4,
    ZSTD: Compression.ZSTD,
}

# Kafka's batch header: baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes,
# lastOffsetDelta, firstTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence,
# recordCount.
HEADER = struct.Struct(">qiibIhiqqqhii")
FIELDS = (
    "base_offset",
    "batch_length",
    "partition_leader_epoch",
    "magic",
    "crc",
    "attributes",
    "last_offset_delta",
    "first_timestamp",
    "max_timestamp",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "record_count",
)
CRC_START = 21  # the CRC covers [attributes, end)

KafkaRecord = tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]

T0 = 1_700_000_000_000


def sample_records(n: int = 40) -> list[KafkaRecord]:
    """Keys and values with nulls, headers with null values and non-ASCII keys, timestamps
    that go back and forth (negative deltas), compressible values."""
    out: list[KafkaRecord] = []
    for i in range(n):
        key = None if i % 4 == 0 else f"key-{i}".encode()
        value = None if i % 9 == 4 else (b"value %d " % i) * (1 + i % 5)
        headers: list[tuple[str, bytes | None]] = []
        if i % 3 == 0:
            headers = [("trace", b"t%d" % i), ("é-ünïcode", None), ("empty", b"")]
        out.append((key, value, T0 + (i * 37) % 101 - 50, headers))
    return out


def kafka_batch(
    records: Sequence[KafkaRecord],
    codec: int = NONE,
    *,
    transactional: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """A batch as kafka-python's producer builds it; the codec must really be applied."""
    builder = DefaultRecordBatchBuilder(
        2, codec, transactional, producer_id, producer_epoch, base_sequence, 1 << 30
    )
    for i, (key, value, timestamp, headers) in enumerate(records):
        assert builder.append(i, timestamp, key, value, headers) is not None
    data = bytes(builder.build())
    assert DefaultRecordBatch(data).compression_type == codec, "not compressible enough"
    return data


def header_of(data: bytes) -> dict[str, int]:
    return dict(zip(FIELDS, HEADER.unpack_from(data), strict=True))


def rewrite(data: bytes, *, recrc: bool = True, **fields: int) -> bytes:
    """``data`` with header fields replaced (and its CRC recomputed unless told not to)."""
    values = header_of(data) | fields
    out = bytearray(data)
    HEADER.pack_into(out, 0, *(values[f] for f in FIELDS))
    if recrc and "crc" not in fields:
        struct.pack_into(">I", out, 17, calc_crc32c(bytes(out[CRC_START:])))
    return bytes(out)


def varint(value: int) -> bytes:
    out = bytearray()
    encode_varint(value, out.append)
    return bytes(out)


def raw_record(
    offset_delta: int,
    timestamp_delta: int = 0,
    key: bytes | None = None,
    value: bytes | None = b"v",
    headers: Sequence[tuple[bytes, bytes | None]] = (),
    attributes: int = 0,
) -> bytes:
    """One Kafka record by hand (varint length first), as DefaultRecord.writeTo lays it out."""

    def nullable(b: bytes | None) -> bytes:
        return varint(-1) if b is None else varint(len(b)) + b

    body = (
        bytes([attributes])
        + varint(timestamp_delta)
        + varint(offset_delta)
        + nullable(key)
        + nullable(value)
        + varint(len(headers))
        + b"".join(varint(len(k)) + k + nullable(v) for k, v in headers)
    )
    return varint(len(body)) + body


def raw_batch(
    section: bytes,
    count: int,
    *,
    codec: int = NONE,
    attributes: int = 0,
    first_timestamp: int = T0,
    max_timestamp: int = T0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """A Kafka batch around a records section already compressed with ``codec``."""
    tail = struct.pack(
        ">hiqqqhii",
        attributes | codec,
        count - 1,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    crc = calc_crc32c(tail + section)
    return struct.pack(">qiibI", 0, 49 + len(section), -1, 2, crc) + tail + section


def kafka_view(records: Sequence[KafkaRecord]) -> list[tuple[Any, ...]]:
    """Records as kafka-python reads them: key, value, timestamp, headers."""
    return [(k, v, ts, list(h)) for k, v, ts, h in records]


def read_kafka(data: bytes) -> list[DefaultRecordBatch]:
    """Every batch of ``data`` through kafka-python's reader, CRC checked."""
    batches = []
    memory = MemoryRecords(data)
    while memory.has_next():
        batch = memory.next_batch()
        assert isinstance(batch, DefaultRecordBatch)
        assert batch.validate_crc()
        batches.append(batch)
    return batches


def replog_records(data: bytes) -> list[tuple[Any, ...]]:
    """A replog batch's records (its CRC and payload checked) as key, value, ts, headers."""
    batch = parse_header(data)
    batch.ensure_valid()
    return [(r.key, r.value, r.timestamp, list(r.headers)) for r in batch.records()]


def reference_build(data: bytes) -> bytes:
    """What logstore.batch.build makes of the same decoded records and header fields."""
    decoded = kafka_records._decode_kafka(data)
    return build(
        decoded.data,
        compression=decoded.compression,
        timestamp_type=decoded.timestamp_type,
        producer_id=decoded.producer_id,
        producer_epoch=decoded.producer_epoch,
        base_sequence=decoded.base_sequence,
        is_transactional=decoded.is_transactional,
    )


# --- Kafka -> replog ----------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS.values(), ids=CODECS.keys())
def test_every_codec_becomes_the_same_arrow_records(codec: int) -> None:
    records = sample_records()
    data = kafka_batch(records, codec)
    replog = kafka_to_replog(data)
    assert replog_records(replog) == kafka_view(records)
    batch = parse_header(replog)
    assert batch.compression is REPLOG_COMPRESSION[codec]
    assert batch.base_offset == 0
    assert batch.partition_leader_epoch == -1
    assert batch.record_count == len(records)
    assert batch.last_offset_delta == len(records) - 1
    assert batch.timestamp_type is TimestampType.CREATE_TIME
    assert not batch.is_transactional
    assert not batch.is_control
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
    kafka = header_of(data)
    assert batch.first_timestamp == kafka["first_timestamp"] == records[0][2]
    assert batch.max_timestamp == kafka["max_timestamp"] == max(r[2] for r in records)
    # The Arrow columns themselves: binary keys and values with nulls, int64 timestamps.
    arrow = batch.to_arrow()
    assert arrow.column(0).to_pylist() == [r[0] for r in records]
    assert arrow.column(1).to_pylist() == [r[1] for r in records]
    assert arrow.column(2).to_pylist() == [r[2] for r in records]
    # The fast path writes exactly what logstore.batch.build writes.
    assert replog == reference_build(data)


def test_records_without_headers_and_one_record() -> None:
    records: list[KafkaRecord] = [(None, b"only", T0, [])]
    data = kafka_batch(records)
    replog = kafka_to_replog(data)
    assert replog_records(replog) == kafka_view(records)
    assert replog == reference_build(data)
    assert parse_header(replog).to_arrow().column(3).null_count == 1


@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
def test_producer_fields_are_kept(transactional: bool) -> None:
    records = sample_records(5)
    data = kafka_batch(
        records,
        ZSTD if transactional else NONE,
        transactional=transactional,
        producer_id=123_456_789_012,
        producer_epoch=7,
        base_sequence=2_000_000_000,
    )
    replog = kafka_to_replog(data)
    batch = parse_header(replog)
    assert batch.producer_id == 123_456_789_012
    assert batch.producer_epoch == 7
    assert batch.base_sequence == 2_000_000_000
    assert batch.is_transactional is transactional
    assert replog_records(replog) == kafka_view(records)
    assert replog == reference_build(data)


def uncompressed_section(records: Sequence[KafkaRecord]) -> tuple[bytes, bytes]:
    """The uncompressed batch of ``records`` and its records section."""
    plain = kafka_batch(records)
    return plain, plain[HEADER_SIZE:]


def test_xerial_framed_snappy_by_hand() -> None:
    records = sample_records(200)
    plain, section = uncompressed_section(records)
    blocks = [section[i : i + 1000] for i in range(0, len(section), 1000)]
    assert len(blocks) > 3
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for block in blocks:
        compressed = bytes(cramjam.snappy.compress_raw(block))
        framed += struct.pack(">i", len(compressed)) + compressed
    h = header_of(plain)
    data = raw_batch(
        framed,
        len(records),
        codec=SNAPPY,
        first_timestamp=h["first_timestamp"],
        max_timestamp=h["max_timestamp"],
    )
    assert [(r.key, r.value) for r in DefaultRecordBatch(data)] == [r[:2] for r in records]
    assert replog_records(kafka_to_replog(data)) == kafka_view(records)


def test_raw_snappy_zstd_without_content_size_and_lz4_without_size() -> None:
    records = sample_records(60)
    plain, section = uncompressed_section(records)
    h = header_of(plain)
    compressor = zstandard.ZstdCompressor().compressobj()  # streaming: no content size
    zstd_frame = compressor.compress(section) + compressor.flush()
    assert zstandard.get_frame_parameters(zstd_frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    for codec, compressed in (
        (SNAPPY, bytes(cramjam.snappy.compress_raw(section))),
        (ZSTD, zstd_frame),
        (LZ4, bytes(cramjam.lz4.compress(section))),
        (GZIP, bytes(cramjam.gzip.compress(section))),
    ):
        data = raw_batch(
            compressed,
            len(records),
            codec=codec,
            first_timestamp=h["first_timestamp"],
            max_timestamp=h["max_timestamp"],
        )
        assert replog_records(kafka_to_replog(data)) == kafka_view(records), codec


def test_log_append_time_batch_keeps_the_bit_and_max_timestamp() -> None:
    records = sample_records(10)
    data = rewrite(kafka_batch(records), attributes=0x08, max_timestamp=T0 + 5_000)
    # kafka-python's reader: every record of a LOG_APPEND_TIME batch has maxTimestamp.
    assert {r.timestamp for r in DefaultRecordBatch(data)} == {T0 + 5_000}
    replog = kafka_to_replog(data)
    batch = parse_header(replog)
    assert batch.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert batch.max_timestamp == T0 + 5_000
    assert batch.first_timestamp == T0 + 5_000
    assert set(batch.to_arrow().column(2).to_pylist()) == {T0 + 5_000}
    assert replog == reference_build(data)
    (back,) = read_kafka(replog_to_kafka(replog))
    assert back.timestamp_type == 1
    assert back.max_timestamp == T0 + 5_000
    got = [(r.key, r.value, r.timestamp, r.timestamp_type) for r in back]
    assert got == [(k, v, T0 + 5_000, 1) for k, v, _, _ in records]


def test_first_timestamp_is_the_first_records_when_its_delta_is_not_zero() -> None:
    """A client may write a nonzero delta for record 0: record timestamps are kept; replog's
    firstTimestamp is the first record's (build derives it), not the client's base."""
    section = raw_record(0, timestamp_delta=5) + raw_record(1, timestamp_delta=-3)
    data = raw_batch(section, 2, first_timestamp=T0, max_timestamp=T0 + 5)
    assert [r.timestamp for r in DefaultRecordBatch(data)] == [T0 + 5, T0 - 3]
    replog = kafka_to_replog(data)
    batch = parse_header(replog)
    assert batch.to_arrow().column(2).to_pylist() == [T0 + 5, T0 - 3]
    assert (batch.first_timestamp, batch.max_timestamp) == (T0 + 5, T0 + 5)
    assert replog == reference_build(data)


def test_max_timestamp_is_derived_from_the_records_as_kafkas_broker_does() -> None:
    data = rewrite(kafka_batch([(None, b"a", T0, []), (None, b"b", T0 + 9, [])]), max_timestamp=T0)
    assert parse_header(kafka_to_replog(data)).max_timestamp == T0 + 9


# --- refused input --------------------------------------------------------------------------


def good_batch() -> bytes:
    return kafka_batch(sample_records(8))


def refused(data: bytes, error: type[Exception], *fragments: str) -> None:
    with pytest.raises(error) as info:
        kafka_to_replog(data)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message


def test_a_compacted_topic_refuses_a_record_without_a_key() -> None:
    records = sample_records(8)  # record 0 has no key
    with pytest.raises(InvalidRecordError) as info:
        kafka_to_replog(kafka_batch(records), compacted=True)
    assert "Compacted topic cannot accept message without key: record 0" in str(info.value)
    keyed = [r for r in records if r[0] is not None]
    data = kafka_batch(keyed)
    assert kafka_to_replog(data, compacted=True) == kafka_to_replog(data)
    kafka_to_replog(kafka_batch(records))  # not compacted: taken


def test_crc_mismatch_is_corrupt() -> None:
    data = bytearray(good_batch())
    data[-3] ^= 0x01
    refused(bytes(data), CorruptRecordError, "CRC-32C mismatch")
    refused(rewrite(good_batch(), crc=0), CorruptRecordError, "CRC-32C mismatch")


def test_a_memoryview_is_accepted() -> None:
    data = good_batch()
    assert kafka_to_replog(memoryview(data)) == kafka_to_replog(data)
    padded = b"xx" + data
    assert kafka_to_replog(memoryview(padded)[2:]) == kafka_to_replog(data)


def test_batch_count_must_be_exactly_one() -> None:
    data = good_batch()
    refused(b"", InvalidRecordError, "no record batch", "exactly one record batch")
    refused(data + data, InvalidRecordError, "exactly one record batch", f"{len(data)} bytes")
    refused(data + b"\x00", InvalidRecordError, "1 bytes after the first record batch")


@pytest.mark.parametrize("keep", [10, 17, 40, HEADER_SIZE, -1])
def test_truncated_batch(keep: int) -> None:
    data = good_batch()
    refused(data[:keep], InvalidRecordError, "truncated record batch")


def test_absurd_batch_length_is_corrupt() -> None:
    refused(rewrite(good_batch(), batch_length=20), CorruptRecordError, "smaller than the batch")


def test_magic_0_and_1_are_refused() -> None:
    for magic in (0, 1):
        builder = LegacyRecordBatchBuilder(magic, 0, 1 << 20)
        builder.append(0, T0 if magic else None, b"k", b"v")
        refused(
            bytes(builder.build()),
            InvalidRecordError,
            f"magic {magic}",
            "message format v0/v1 is not supported; use a client with magic 2 (Kafka 0.11+)",
        )
    refused(rewrite(good_batch(), magic=3), InvalidRecordError, "unknown magic 3")


def test_control_batch_from_a_client_is_refused() -> None:
    data = rewrite(good_batch(), attributes=0x30, producer_id=1, producer_epoch=0, base_sequence=0)
    refused(data, InvalidRecordError, "control batch")


def test_unknown_codec_is_refused() -> None:
    for codec in (5, 6, 7):
        refused(
            rewrite(good_batch(), attributes=codec),
            InvalidRecordError,
            f"compression codec {codec} is not supported",
        )


def test_malformed_compressed_payload() -> None:
    section = b"not a zstd frame at all"
    refused(raw_batch(section, 1, codec=ZSTD), InvalidRecordError, "malformed zstd payload")
    xerial = b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, 1000) + b"abc"
    refused(raw_batch(xerial, 1, codec=SNAPPY), InvalidRecordError, "malformed snappy payload")


def test_record_count_and_last_offset_delta() -> None:
    refused(rewrite(good_batch(), record_count=0), InvalidRecordError, "record count 0")
    refused(rewrite(good_batch(), last_offset_delta=3), InvalidRecordError, "last offset delta 3")
    # Header says more records than the section holds.
    data = rewrite(good_batch(), record_count=9, last_offset_delta=8)
    refused(data, InvalidRecordError, "record 8", "truncated")


def test_base_offset_and_producer_fields() -> None:
    refused(rewrite(good_batch(), base_offset=5), InvalidRecordError, "base offset 5")
    refused(
        rewrite(good_batch(), attributes=0x10), InvalidRecordError, "transactional", "producer id"
    )
    refused(
        rewrite(good_batch(), producer_id=3, producer_epoch=0, base_sequence=-1),
        InvalidRecordError,
        "base sequence -1",
    )


def test_bad_offset_delta() -> None:
    section = raw_record(0) + raw_record(2) + raw_record(3)
    refused(raw_batch(section, 3), InvalidRecordError, "record 1", "offset delta 2, expected 1")


def test_non_canonical_varints_are_read_as_kafka_reads_them() -> None:
    """Kafka's readVarint accepts padded encodings (0x80 0x00 is 0): so does the decoder."""
    padded_zero = b"\x80\x80\x00"
    body = b"\x00" + varint(0) + padded_zero + varint(1) + b"k" + varint(1) + b"v" + padded_zero
    section = varint(len(body)) + body + raw_record(1)
    data = raw_batch(section, 2)
    theirs = [(r.offset, r.key, r.value, r.headers) for r in DefaultRecordBatch(data)]
    assert theirs == [(0, b"k", b"v", []), (1, None, b"v", [])]
    assert [r[:2] for r in replog_records(kafka_to_replog(data))] == [(b"k", b"v"), (None, b"v")]


def test_record_attributes_must_be_zero() -> None:
    section = raw_record(0) + raw_record(1, attributes=4)
    refused(raw_batch(section, 2), InvalidRecordError, "record 1", "attributes 4")


def test_invalid_utf8_header_key() -> None:
    section = raw_record(0, headers=[(b"ok", b"1")]) + raw_record(1, headers=[(b"\xff\xfe", b"")])
    refused(raw_batch(section, 2), InvalidRecordError, "header key is not valid UTF-8")


def test_trailing_bytes_after_the_records() -> None:
    section = raw_record(0) + raw_record(1) + b"\x00\x00"
    refused(raw_batch(section, 2), InvalidRecordError, "2 trailing bytes", "2 records")


def test_record_length_inconsistent_with_its_fields() -> None:
    good = raw_record(0, key=b"kk", value=b"vvvv")
    longer = varint(len(good) - 1 + 2) + good[1:] + b"\x00\x00"  # says 2 more bytes
    refused(raw_batch(longer, 1), InvalidRecordError, "record 0", "invalid record size")
    shorter = varint(len(good) - 1 - 2) + good[1:]  # says 2 fewer bytes
    refused(raw_batch(shorter, 1), InvalidRecordError, "record 0")
    refused(raw_batch(varint(-7) + good[1:], 1), InvalidRecordError, "invalid record length -7")


def test_invalid_lengths_inside_a_record() -> None:
    bad_key = varint(6) + b"\x00" + varint(0) + varint(0) + varint(-2) + varint(-1) + varint(0)
    refused(raw_batch(bad_key, 1), InvalidRecordError, "invalid key length -2")
    bad_headers = varint(6) + b"\x00" + varint(0) + varint(0) + varint(-1) + varint(-1)
    refused(raw_batch(bad_headers + varint(-1), 1), InvalidRecordError, "invalid header count")
    truncated = varint(10) + b"\x00" + b"\xff" * 9
    refused(raw_batch(truncated, 1), InvalidRecordError, "record 0", "truncated")
    too_long = varint(20) + b"\x00" + b"\xff" * 11 + b"\x01" + b"\x00" * 7
    refused(raw_batch(too_long, 1), InvalidRecordError, "record 0", "varint longer than 10")


# --- replog -> Kafka ----------------------------------------------------------------------


def replog_batch(
    records: Sequence[KafkaRecord],
    *,
    base_offset: int,
    compression: Compression = Compression.NONE,
    **fields: Any,
) -> bytes:
    return build(
        [Record(key=k, value=v, timestamp=ts, headers=tuple(h)) for k, v, ts, h in records],
        base_offset=base_offset,
        compression=compression,
        **fields,
    )


@pytest.mark.parametrize("compression", list(Compression), ids=lambda c: c.name)
def test_replog_batches_read_by_kafka_python(compression: Compression) -> None:
    first = sample_records(30)
    second: list[KafkaRecord] = [
        (b"k", b"v" * 300, T0 + 1, [("h", None)]),
        (None, None, T0 - 1, []),
    ]
    third: list[KafkaRecord] = [(None, b"x", T0, [])]
    data = (
        replog_batch(first, base_offset=100, compression=compression, partition_leader_epoch=4)
        + replog_batch(
            second,
            base_offset=130,
            compression=compression,
            producer_id=42,
            producer_epoch=3,
            base_sequence=17,
            is_transactional=True,
            partition_leader_epoch=5,
        )
        + replog_batch(
            third,
            base_offset=2**40,
            compression=compression,
            timestamp_type=TimestampType.LOG_APPEND_TIME,
        )
    )
    batches = read_kafka(replog_to_kafka(data))
    assert [b.base_offset for b in batches] == [100, 130, 2**40]
    assert [b.leader_epoch for b in batches] == [4, 5, -1]
    assert [b.records_count for b in batches] == [30, 2, 1]
    assert [b.last_offset_delta for b in batches] == [29, 1, 0]
    assert [b.compression_type for b in batches] == [0, 0, 0]
    assert [b.is_transactional for b in batches] == [False, True, False]
    assert [b.is_control_batch for b in batches] == [False, False, False]
    assert [b.timestamp_type for b in batches] == [0, 0, 1]
    assert [(b.producer_id, b.producer_epoch, b.base_sequence) for b in batches] == [
        (-1, -1, -1),
        (42, 3, 17),
        (-1, -1, -1),
    ]
    for batch, records in zip(batches, (first, second, third), strict=True):
        assert batch.first_timestamp == records[0][2]
        assert batch.max_timestamp == max(r[2] for r in records)
        got = [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in batch]
        want = [(batch.base_offset + i, k, v, ts, h) for i, (k, v, ts, h) in enumerate(records)]
        assert got == want
    # The fields outside kafka-python's properties, straight from the bytes: the header of
    # each Kafka batch is the replog batch's except the compression bits and the CRC.
    out = replog_to_kafka(data)
    position = 0
    for replog in iter_batches(data):
        kafka = header_of(out[position:])
        for field in ("first_timestamp", "max_timestamp", "last_offset_delta"):
            assert kafka[field] == getattr(replog, field)
        assert kafka["attributes"] == replog.attributes & ~0x07
        position += 12 + kafka["batch_length"]
    assert position == len(out)


@pytest.mark.parametrize("control_type", list(ControlType), ids=lambda c: c.name)
def test_control_batches_are_kafkas_control_records(control_type: ControlType) -> None:
    data = build_control(
        control_type,
        producer_id=77,
        producer_epoch=2,
        coordinator_epoch=9,
        timestamp=T0,
        base_offset=500,
        partition_leader_epoch=3,
    )
    out = replog_to_kafka(data)
    (batch,) = read_kafka(out)
    assert batch.is_control_batch
    assert batch.is_transactional
    assert (batch.base_offset, batch.leader_epoch, batch.records_count) == (500, 3, 1)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 2, -1)
    assert (batch.first_timestamp, batch.max_timestamp) == (T0, T0)
    (record,) = list(batch)
    assert isinstance(record, ControlRecord)
    assert record.type == int(control_type)
    assert record.version == 0
    assert record.offset == 500
    assert record.timestamp == T0
    # Exactly Kafka's bytes: ControlRecordType key (int16 version 0, int16 type) and
    # EndTransactionMarker value (int16 version 0, int32 coordinator epoch), no headers.
    key = struct.pack(">hh", 0, int(control_type))
    value = struct.pack(">hi", 0, 9)
    assert out[HEADER_SIZE:] == raw_record(0, 0, key, value)
    assert record.key == key
    assert record.value == value


def test_trailing_partial_batch_is_dropped() -> None:
    a = replog_batch(sample_records(5), base_offset=0)
    b = replog_batch(sample_records(7), base_offset=5)
    c = replog_batch(sample_records(3), base_offset=12)
    whole = replog_to_kafka(a + b)
    assert [x.base_offset for x in read_kafka(whole)] == [0, 5]
    for cut in (1, 11, 12, 40, HEADER_SIZE, HEADER_SIZE + 10, len(c) - 1):
        assert replog_to_kafka(a + b + c[:cut]) == whole, cut
    assert replog_to_kafka(a + b + c) == whole + replog_to_kafka(c)
    assert replog_to_kafka(b"") == b""
    assert replog_to_kafka(a[:30]) == b""
    assert replog_to_kafka(memoryview(b"..." + a)[3:]) == replog_to_kafka(a)


def test_corrupt_replog_batch_is_not_rechecksummed() -> None:
    data = bytearray(replog_batch(sample_records(5), base_offset=0))
    data[-20] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        replog_to_kafka(bytes(data))
    with pytest.raises(CorruptRecordError, match="unknown magic"):
        replog_to_kafka(rewrite(bytes(data), magic=1) + bytes(data))


def test_empty_header_lists_and_null_headers_are_both_no_headers() -> None:
    table = pa.table(
        {
            "value": pa.array([b"a", b"b", b"c"]),
            "timestamp": pa.array([T0, T0, T0], pa.int64()),
            "headers": pa.array(
                [[], None, [{"key": "k", "value": b"v"}]],
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
        }
    )
    (batch,) = read_kafka(replog_to_kafka(build(table, base_offset=0)))
    assert [r.headers for r in batch] == [[], [], [("k", b"v")]]


def test_a_sliced_headers_column_is_read_from_its_offsets() -> None:
    """Headers of a replog batch built from a slice of a table: list offsets not from 0."""
    big = pa.table(
        {
            "value": pa.array([b"%d" % i for i in range(6)]),
            "timestamp": pa.array([T0 + i for i in range(6)], pa.int64()),
            "headers": pa.array(
                [[{"key": f"h{i}", "value": b"%d" % i}] * (i % 3) for i in range(6)],
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
        }
    )
    (batch,) = read_kafka(replog_to_kafka(build(big.slice(2, 3), base_offset=0)))
    assert [r.headers for r in batch] == [[("h2", b"2")] * 2, [], [("h4", b"4")]]


# --- both ways --------------------------------------------------------------------------


def test_kafka_round_trip_is_byte_identical_for_uncompressed_batches() -> None:
    """kafka-python's uncompressed batch -> replog -> Kafka: every byte the CRC covers (and so
    the CRC) is the same; only the broker-assigned fields (base offset, epoch) differ."""
    data = kafka_batch(sample_records(50))
    back = replog_to_kafka(kafka_to_replog(data))
    assert back[CRC_START:] == data[CRC_START:]
    assert back[:17] == data[:8] + data[8:12] + struct.pack(">ib", -1, 2)


_BYTES = st.one_of(st.none(), st.binary(max_size=40))
_HEADERS = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
)
_RECORDS = st.lists(
    st.tuples(_BYTES, _BYTES, st.integers(0, 2**41), _HEADERS), min_size=1, max_size=30
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=_RECORDS, codec=st.sampled_from(list(CODECS.values())), data=st.data())
def test_round_trip_property(records: list[KafkaRecord], codec: int, data: st.DataObject) -> None:
    transactional = data.draw(st.booleans(), label="transactional")
    producer = (9, 1, 100) if transactional else (-1, -1, -1)
    builder = DefaultRecordBatchBuilder(2, codec, transactional, *producer, 1 << 30)
    for i, (key, value, timestamp, headers) in enumerate(records):
        builder.append(i, timestamp, key, value, headers)
    kafka = bytes(builder.build())  # maybe uncompressed: kafka-python skips useless codecs
    replog = kafka_to_replog(kafka)
    assert replog == reference_build(kafka)
    assert replog_records(replog) == kafka_view(records)
    base = data.draw(st.integers(0, 2**50), label="base offset")
    fetched = bytearray(replog)
    set_base_offset(fetched, base)
    (batch,) = read_kafka(replog_to_kafka(bytes(fetched)))
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == producer
    assert batch.is_transactional is transactional
    got = [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in batch]
    assert got == [(base + i, k, v, ts, h) for i, (k, v, ts, h) in enumerate(records)]
    if DefaultRecordBatch(kafka).compression_type == NONE:
        assert replog_to_kafka(replog)[CRC_START:] == kafka[CRC_START:]


@settings(max_examples=50, deadline=None)
@given(
    edits=st.lists(
        st.tuples(
            st.integers(0, 10**6),
            st.sampled_from(["set", "cut", "insert"]),
            st.binary(min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=4,
    ),
    codec=st.sampled_from([NONE, GZIP, SNAPPY, LZ4, ZSTD]),
)
def test_mangled_records_are_refused_or_read_as_kafka_python_reads_them(
    edits: list[tuple[int, str, bytes]], codec: int
) -> None:
    """Bytes changed inside the records section (under a valid CRC): InvalidRecordError, or the
    same records kafka-python reads; never another exception."""
    records = sample_records(12)
    plain, section = uncompressed_section(records)
    mangled = bytearray(section)
    for where, how, what in edits:
        at = where % len(mangled)
        if how == "set":
            mangled[at : at + len(what)] = what
        elif how == "cut":
            del mangled[at : at + len(what)]
        else:
            mangled[at:at] = what
    compress: dict[int, Callable[[bytes], Any]] = {
        NONE: bytes,
        GZIP: cramjam.gzip.compress,
        SNAPPY: cramjam.snappy.compress_raw,
        LZ4: cramjam.lz4.compress,
        ZSTD: cramjam.zstd.compress,
    }
    h = header_of(plain)
    data = raw_batch(
        bytes(compress[codec](bytes(mangled))),
        len(records),
        codec=codec,
        first_timestamp=h["first_timestamp"],
        max_timestamp=h["max_timestamp"],
    )
    try:
        replog = kafka_to_replog(data)
    except InvalidRecordError:
        return
    theirs = [(r.key, r.value, r.timestamp, r.headers) for r in DefaultRecordBatch(data)]
    assert replog_records(replog) == theirs
