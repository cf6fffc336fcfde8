"""Tests of logstore.batch: the Kafka v2 header, the Arrow IPC payload, and corruption handling."""

from __future__ import annotations

import struct
import time
from typing import Any

import google_crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import batch as B
from logstore.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    RECORD_SCHEMA,
    Compression,
    ControlType,
    Record,
    RecordBatch,
    TimestampType,
    build,
    build_control,
    iter_batches,
    parse_header,
    set_base_offset,
    set_partition_leader_epoch,
    valid_prefix,
)
from logstore.errors import CorruptRecordError

pytestmark = pytest.mark.unit

ALL_COMPRESSIONS = list(Compression)


def sample_records(n: int = 5) -> list[Record]:
    return [
        Record(
            key=None if i % 3 == 0 else b"key-%d" % i,
            value=None if i % 4 == 1 else b"value-%d" % i * (i + 1),
            timestamp=1_700_000_000_000 + i * 7,
            headers=() if i % 2 else (("h", b"x"), ("n", None), ("h", b"")),
        )
        for i in range(n)
    ]


def without_offsets(records: list[Record]) -> list[Record]:
    return [Record(r.key, r.value, r.timestamp, r.headers) for r in records]


def patched(data: bytes, offset: int, fmt: str, value: int) -> bytearray:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, value)
    return buf


def recrc(buf: bytearray) -> bytearray:
    """Fix the CRC after a deliberate change inside the CRC range."""
    struct.pack_into(">I", buf, CRC_OFFSET, google_crc32c.value(bytes(buf[ATTRIBUTES_OFFSET:])))
    return buf


# --- layout ---------------------------------------------------------------------------------


def test_header_layout_matches_kafka() -> None:
    assert HEADER_SIZE == 61
    assert LOG_OVERHEAD == 12
    assert CRC_OFFSET == 17
    assert ATTRIBUTES_OFFSET == 21
    assert MAGIC == 2


# --- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ALL_COMPRESSIONS)
def test_python_records_round_trip(compression: Compression) -> None:
    records = sample_records(7)
    data = build(records, base_offset=100, compression=compression, partition_leader_epoch=3)
    batch = parse_header(data)
    batch.ensure_valid()
    assert batch.is_valid()
    assert batch.buffer.nbytes == len(data) == batch.size_in_bytes
    assert batch.base_offset == 100
    assert batch.last_offset == 106
    assert batch.next_offset == 107
    assert batch.last_offset_delta == 6
    assert batch.record_count == 7
    assert batch.magic == MAGIC
    assert batch.partition_leader_epoch == 3
    assert batch.compression is compression
    assert batch.timestamp_type is TimestampType.CREATE_TIME
    assert not batch.is_transactional
    assert not batch.is_control
    assert batch.first_timestamp == records[0].timestamp
    assert batch.max_timestamp == max(r.timestamp for r in records)
    assert batch.producer_id == NO_PRODUCER_ID
    assert batch.last_sequence == NO_SEQUENCE
    assert batch.control_type() is None
    assert batch.coordinator_epoch() is None
    got = batch.records()
    assert [r.offset for r in got] == list(range(100, 107))
    assert without_offsets(got) == records


def test_python_records_timestamps_out_of_order_and_from_an_iterator() -> None:
    records = [Record(b"k", b"v", t) for t in (500, 100, 900, 300)]
    batch = parse_header(build(iter(records)))  # any iterable, read once
    batch.ensure_valid()
    assert (batch.first_timestamp, batch.max_timestamp) == (500, 900)
    assert without_offsets(batch.records()) == records


@pytest.mark.parametrize("compression", ALL_COMPRESSIONS)
def test_arrow_round_trip(compression: Compression) -> None:
    table = pa.table(
        {
            "key": pa.array(["a", None, "c"], pa.string()),
            "value": pa.array(["x" * 100, "y", None], pa.large_string()),
            "timestamp": pa.array([5, 3, 9], pa.int64()),
            "headers": pa.array(
                [[{"key": "k", "value": b"v"}], None, []],
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
            "ignored": pa.array([1, 2, 3]),
        }
    )
    data = build(table, compression=compression)
    batch = parse_header(data)
    batch.ensure_valid()
    out = batch.to_arrow()
    assert out.schema.equals(RECORD_SCHEMA)
    assert out.column("key").to_pylist() == [b"a", None, b"c"]
    assert out.column("value").to_pylist() == [b"x" * 100, b"y", None]
    assert batch.first_timestamp == 5
    assert batch.max_timestamp == 9
    assert [r.headers for r in batch.records()] == [(("k", b"v"),), (), ()]


def test_arrow_record_batch_input_value_only_and_chunked() -> None:
    before = time.time_ns() // 1_000_000
    table = pa.Table.from_batches(
        [pa.record_batch({"value": pa.array([b"a", b"b"])})] * 3
    )  # three chunks
    assert table.column("value").num_chunks == 3
    batch = parse_header(build(table))
    records = batch.records()
    assert [r.value for r in records] == [b"a", b"b"] * 3
    assert all(r.key is None and r.headers == () for r in records)
    assert all(before <= r.timestamp <= time.time_ns() // 1_000_000 for r in records)
    # a RecordBatch works too
    single = parse_header(build(pa.record_batch({"value": pa.array(["s"])}))).records()
    assert single[0].value == b"s"


def test_arrow_timestamp_types_and_null_timestamps() -> None:
    stamps = pa.array([1_000_123_456, None], pa.timestamp("us", tz="UTC"))
    table = pa.table({"value": pa.array([b"a", b"b"]), "timestamp": stamps})
    before = time.time_ns() // 1_000_000
    records = parse_header(build(table)).records()
    assert records[0].timestamp == 1_000_123  # truncated to ms
    assert records[1].timestamp >= before  # null means now
    seconds = pa.table({"value": [b"a"], "timestamp": pa.array([2], pa.timestamp("s"))})
    assert parse_header(build(seconds)).records()[0].timestamp == 2000
    dictionary = pa.table({"value": pa.array(["d", "d"]).dictionary_encode()})
    assert [r.value for r in parse_header(build(dictionary)).records()] == [b"d", b"d"]
    int32 = pa.table({"value": [b"a"], "timestamp": pa.array([7], pa.int32())})
    assert parse_header(build(int32)).records()[0].timestamp == 7


def test_a_batch_already_in_record_schema_is_taken_as_it_is() -> None:
    """The producer builds its batches in RECORD_SCHEMA; they skip the conversion, but a null
    timestamp still means now and a null in a non-nullable field is still refused."""
    headers = pa.array([[("h", b"1")], None], B.HEADERS_TYPE)
    columns = [pa.array([b"k", None]), pa.array([b"a", None]), pa.array([5, 6]), headers]
    ready = pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA)
    assert B.to_record_schema(ready) is ready
    records = parse_header(build(ready)).records()
    assert [(r.key, r.value, r.timestamp, r.headers) for r in records] == [
        (b"k", b"a", 5, (("h", b"1"),)),
        (None, None, 6, ()),
    ]
    before = time.time_ns() // 1_000_000
    stamps = pa.array([None, 6], pa.int64())
    now = pa.RecordBatch.from_arrays([*columns[:2], stamps, headers], schema=RECORD_SCHEMA)
    assert parse_header(build(now)).records()[0].timestamp >= before
    bad_header = pa.array([[{"key": None, "value": b"1"}], None], B.HEADERS_TYPE)
    broken = pa.RecordBatch.from_arrays([*columns[:3], bad_header], schema=RECORD_SCHEMA)
    with pytest.raises(ValueError, match="null"):
        build(broken)


def test_an_uncompressed_payload_is_the_stream_writers_bytes() -> None:
    """Uncompressed payloads are put together from the schema's bytes and the batch's own
    serialization: the bytes Arrow's stream writer writes, which readers of any Arrow
    implementation take."""
    for records in (sample_records(1), sample_records(7)):
        data = B.records_to_arrow(records)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, RECORD_SCHEMA) as writer:
            writer.write_batch(data)
        encoded = build(records)
        assert encoded[HEADER_SIZE:] == sink.getvalue().to_pybytes()
        assert parse_header(encoded).records() == parse_header(build(data)).records()


@pytest.mark.parametrize("compression", ALL_COMPRESSIONS)
def test_build_checked_is_build_for_a_producers_own_records(compression: Compression) -> None:
    """The producer's path: a batch it built in RECORD_SCHEMA and checked, with its first and
    largest timestamps given (here not the last one), encodes as build() would."""
    records = [
        Record(r.key, r.value, stamp, r.headers)
        for r, stamp in zip(sample_records(6), [30, 10, 60, 20, 50, 40], strict=True)
    ]
    stamp: dict[str, Any] = {
        "compression": compression,
        "producer_id": 7,
        "producer_epoch": 2,
        "base_sequence": 11,
        "is_transactional": True,
    }
    encoded = B.build_checked(B.records_to_arrow(records), timestamps=(30, 60), **stamp)
    assert encoded == build(records, **stamp)
    batch = parse_header(encoded)
    assert (batch.first_timestamp, batch.max_timestamp) == (30, 60)
    assert without_offsets(batch.records()) == records
    with pytest.raises(ValueError, match="producer id"):
        B.build_checked(B.records_to_arrow(records), timestamps=(30, 60), is_transactional=True)


def test_arrow_map_headers() -> None:
    headers = pa.array([[("a", b"1"), ("b", None)]], pa.map_(pa.string(), pa.binary()))
    table = pa.table({"value": [b"v"], "headers": headers})
    assert parse_header(build(table)).records()[0].headers == (("a", b"1"), ("b", None))


@pytest.mark.parametrize(
    "table",
    [
        pa.table({"key": [b"k"]}),  # no value column
        pa.table({"value": pa.array([1])}),  # wrong value type
        pa.table({"value": [b"v"], "timestamp": pa.array([1.5])}),
        pa.table(
            {
                "value": [b"v"],
                "headers": pa.array(
                    [[{"key": None, "value": b"x"}]],
                    pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
                ),
            }
        ),
        pa.table(
            {
                "value": [b"v"],
                "headers": pa.array(
                    [[None]], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
                ),
            }
        ),
    ],
)
def test_bad_arrow_input_is_value_error(table: pa.Table) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        build(table)


def test_empty_input_is_value_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        build([])
    with pytest.raises(ValueError, match="at least one"):
        build(pa.table({"value": pa.array([], pa.binary())}))


def test_bad_build_arguments() -> None:
    records = sample_records(1)
    with pytest.raises(ValueError, match="gzip"):
        build(records, compression=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="snappy"):
        build(records, compression=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="producer id"):
        build(records, is_transactional=True)
    with pytest.raises(ValueError, match="base offset"):
        build(records, base_offset=-1)
    with pytest.raises(ValueError, match="out of range"):
        build(records, producer_epoch=2**15)
    with pytest.raises(ValueError, match="RECORD_SCHEMA"):
        build([Record(b"k", b"v", 2**63)])


def test_producer_fields_and_last_sequence() -> None:
    data = build(
        sample_records(3),
        producer_id=42,
        producer_epoch=7,
        base_sequence=2**31 - 2,
        is_transactional=True,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
    )
    batch = parse_header(data)
    batch.ensure_valid()
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (42, 7, 2**31 - 2)
    assert batch.last_sequence == 0  # wraps past int32 max, as Kafka
    assert batch.is_transactional
    assert batch.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert parse_header(build(sample_records(3), base_sequence=5)).last_sequence == 7


@pytest.mark.parametrize("compression", ALL_COMPRESSIONS)
def test_a_batch_of_10000_arrow_rows_round_trips(compression: Compression) -> None:
    """(How fast: benchmarks/batch_codec.py, beside Arrow IPC itself.)"""
    table = pa.table({"value": pa.array([b"v" * 100] * 10_000)})
    batch = parse_header(build(table, compression=compression))
    batch.ensure_valid()
    assert batch.record_count == 10_000
    assert batch.compression is compression
    got = batch.to_arrow()
    assert got.num_rows == 10_000
    assert got.column("value").to_pylist() == table.column("value").to_pylist()


# --- header rewrites ------------------------------------------------------------------------


def test_header_rewrites_keep_crc_valid() -> None:
    buf = bytearray(build(sample_records(4), base_offset=0))
    crc = parse_header(buf).crc
    set_base_offset(buf, 1000)
    set_partition_leader_epoch(buf, 9)
    batch = parse_header(buf)
    batch.ensure_valid()
    assert batch.crc == crc
    assert batch.base_offset == 1000
    assert batch.partition_leader_epoch == 9
    assert [r.offset for r in batch.records()] == [1000, 1001, 1002, 1003]


def test_header_rewrites_at_position_and_through_memoryview() -> None:
    first = build(sample_records(2))
    buf = bytearray(first + build(sample_records(3)))
    view = memoryview(buf)
    set_base_offset(view, 2, position=len(first))
    set_partition_leader_epoch(view, 5, position=len(first))
    batches = list(iter_batches(buf))
    assert [b.base_offset for b in batches] == [0, 2]
    assert [b.partition_leader_epoch for b in batches] == [NO_PARTITION_LEADER_EPOCH, 5]
    assert batches[1].position == len(first)
    view.release()


def test_batch_view_follows_rewrites() -> None:
    buf = bytearray(build(sample_records(2)))
    batch = parse_header(buf)
    set_base_offset(buf, 50)
    assert batch.base_offset == 50
    assert batch.is_valid()


def test_header_rewrite_arguments() -> None:
    buf = bytearray(build(sample_records(2)))
    with pytest.raises(ValueError, match="out of range"):
        set_base_offset(buf, -5)
    with pytest.raises(ValueError, match="out of range"):
        set_base_offset(buf, 2**63 - 1)  # last offset would overflow
    with pytest.raises(ValueError, match="out of range"):
        set_partition_leader_epoch(buf, 2**31)
    with pytest.raises(CorruptRecordError, match="truncated header"):
        set_base_offset(bytearray(10), 1)


# --- control batches ------------------------------------------------------------------------


@pytest.mark.parametrize("control_type", list(ControlType))
def test_control_batch(control_type: ControlType) -> None:
    data = build_control(
        control_type,
        producer_id=11,
        producer_epoch=2,
        coordinator_epoch=77,
        timestamp=123,
        base_offset=5,
        partition_leader_epoch=4,
    )
    batch = parse_header(data)
    batch.ensure_valid()
    assert batch.is_control
    assert batch.is_transactional
    assert batch.control_type() is control_type
    assert batch.coordinator_epoch() == 77
    assert (batch.producer_id, batch.producer_epoch) == (11, 2)
    assert (batch.base_offset, batch.record_count, batch.partition_leader_epoch) == (5, 1, 4)
    (record,) = batch.records()
    assert record.key == struct.pack(">hh", 0, control_type)
    assert record.value == struct.pack(">hi", 0, 77)
    assert record.timestamp == 123
    assert (batch.first_timestamp, batch.max_timestamp) == (123, 123)


def test_a_control_batch_is_decoded_once_for_its_type_and_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Producer state reads both from every marker it applies, on every replica."""
    data = build_control(
        ControlType.ABORT, producer_id=3, producer_epoch=1, coordinator_epoch=9, timestamp=1
    )
    decodes = []
    to_arrow = RecordBatch.to_arrow

    def counting(self: RecordBatch) -> pa.RecordBatch:
        decodes.append(self)
        return to_arrow(self)

    monkeypatch.setattr(RecordBatch, "to_arrow", counting)
    batch = parse_header(data)
    assert (batch.control_type(), batch.coordinator_epoch()) == (ControlType.ABORT, 9)
    assert (batch.control_type(), batch.coordinator_epoch()) == (ControlType.ABORT, 9)
    assert len(decodes) == 1
    assert parse_header(data).control_type() is ControlType.ABORT  # a new view decodes anew
    assert len(decodes) == 2


def test_control_batch_arguments() -> None:
    with pytest.raises(ValueError, match="producer id"):
        build_control(
            ControlType.COMMIT, producer_id=-1, producer_epoch=0, coordinator_epoch=0, timestamp=0
        )
    with pytest.raises(ValueError, match="coordinator epoch"):
        build_control(
            ControlType.COMMIT,
            producer_id=1,
            producer_epoch=0,
            coordinator_epoch=2**31,
            timestamp=0,
        )


def _forged_control(key: bytes | None, value: bytes | None, count: int = 1) -> RecordBatch:
    """A CRC-valid control batch with arbitrary record contents."""
    data = bytearray(build([Record(key, value, 0)] * count, producer_id=1, is_transactional=True))
    attributes = struct.unpack_from(">h", data, ATTRIBUTES_OFFSET)[0] | 0x20
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, attributes)
    batch = parse_header(recrc(data))
    batch.ensure_valid()
    return batch


@pytest.mark.parametrize(
    ("key", "value", "count", "method"),
    [
        (b"\x00", struct.pack(">hi", 0, 1), 1, "control_type"),
        (None, struct.pack(">hi", 0, 1), 1, "control_type"),
        (struct.pack(">hh", 0, 9), struct.pack(">hi", 0, 1), 1, "control_type"),
        (struct.pack(">hh", -1, 0), struct.pack(">hi", 0, 1), 1, "control_type"),
        (struct.pack(">hh", 0, 1), b"", 1, "coordinator_epoch"),
        (struct.pack(">hh", 0, 1), struct.pack(">hi", 3, 1), 1, "coordinator_epoch"),
        (struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 1), 2, "control_type"),
    ],
)
def test_malformed_control_record(
    key: bytes | None, value: bytes | None, count: int, method: str
) -> None:
    batch = _forged_control(key, value, count)
    with pytest.raises(CorruptRecordError, match="control"):
        getattr(batch, method)()


# --- walking concatenated batches -----------------------------------------------------------


def three_batches() -> list[bytes]:
    return [
        build(sample_records(2), base_offset=0),
        build(sample_records(3), base_offset=2, compression=Compression.ZSTD),
        build_control(
            ControlType.ABORT, producer_id=1, producer_epoch=0, coordinator_epoch=0, timestamp=1
        ),
    ]


def test_iter_batches_over_concatenated_batches() -> None:
    parts = three_batches()
    buf = b"".join(parts)
    batches = list(iter_batches(buf))
    assert [b.size_in_bytes for b in batches] == [len(p) for p in parts]
    assert [b.position for b in batches] == [0, len(parts[0]), len(parts[0]) + len(parts[1])]
    assert [bytes(b.buffer) for b in batches] == parts
    assert [len(b.records()) for b in batches] == [2, 3, 1]
    # starting in the middle
    assert len(list(iter_batches(buf, len(parts[0])))) == 2
    assert list(iter_batches(b"")) == []


def test_iter_batches_reports_position_and_base_offset() -> None:
    parts = three_batches()
    buf = bytearray(b"".join(parts))
    buf[len(parts[0]) + HEADER_SIZE + 10] ^= 0xFF
    with pytest.raises(CorruptRecordError, match=rf"position {len(parts[0])}.*base offset 2.*CRC"):
        list(iter_batches(buf))
    # without validation the CRC is not checked
    assert len(list(iter_batches(buf, validate=False))) == 3
    with pytest.raises(CorruptRecordError, match="truncated header at position"):
        list(iter_batches(bytes(buf) + b"\x00" * 5, validate=False))


def test_valid_prefix_all_valid() -> None:
    buf = b"".join(three_batches())
    batches, length, reason = valid_prefix(buf)
    assert (len(batches), length, reason) == (3, len(buf), None)


@pytest.mark.parametrize("cut", [1, HEADER_SIZE - 1, HEADER_SIZE + 1, 100])
def test_valid_prefix_torn_tail(cut: int) -> None:
    parts = three_batches()
    buf = b"".join(parts)
    batches, length, reason = valid_prefix(buf[: len(parts[0]) + len(parts[1]) + cut])
    assert len(batches) == 2
    assert length == len(parts[0]) + len(parts[1])
    assert reason is not None
    assert "truncated" in reason


def test_valid_prefix_flipped_byte_in_the_middle() -> None:
    parts = three_batches()
    buf = bytearray(b"".join(parts))
    buf[len(parts[0]) + len(parts[1]) // 2] ^= 0x01
    batches, length, reason = valid_prefix(buf)
    assert (len(batches), length) == (1, len(parts[0]))
    assert reason is not None
    assert "CRC mismatch" in reason


def test_valid_prefix_garbage() -> None:
    assert valid_prefix(b"\xff" * 200)[:2] == ([], 0)
    assert valid_prefix(b"") == ([], 0, None)


# --- bad input ------------------------------------------------------------------------------


def test_wrong_crc() -> None:
    data = bytearray(build(sample_records(2)))
    data[-1] ^= 0x80
    batch = parse_header(data)  # the header itself is fine
    assert not batch.is_valid()
    assert batch.compute_crc() != batch.crc
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        batch.ensure_valid()
    stored = patched(build(sample_records(2)), CRC_OFFSET, ">I", 0)
    with pytest.raises(CorruptRecordError, match=r"base offset 0.*CRC"):
        parse_header(stored).ensure_valid()


@pytest.mark.parametrize("size", [0, 1, LOG_OVERHEAD, HEADER_SIZE - 1])
def test_truncated_header(size: int) -> None:
    data = build(sample_records(2))
    with pytest.raises(CorruptRecordError, match="truncated header at position 0"):
        parse_header(data[:size])
    with pytest.raises(CorruptRecordError, match="truncated header at position 3"):
        parse_header(b"abc" + data[:size], 3)


@pytest.mark.parametrize("length", [-1, -(2**31), 0, HEADER_SIZE - LOG_OVERHEAD - 1])
def test_absurd_small_or_negative_length(length: int) -> None:
    buf = patched(build(sample_records(2)), 8, ">i", length)
    with pytest.raises(CorruptRecordError, match=f"absurd batch length {length} at position 0"):
        parse_header(buf)


@pytest.mark.parametrize("length", [2**31 - 1, 10_000_000])
def test_absurd_huge_length(length: int) -> None:
    buf = patched(build(sample_records(2)), 8, ">i", length)
    with pytest.raises(CorruptRecordError, match=f"absurd batch length {length}.*truncated"):
        parse_header(buf)


def test_truncated_batch() -> None:
    data = build(sample_records(2))
    with pytest.raises(CorruptRecordError, match="truncated batch"):
        parse_header(data[:-1])


@pytest.mark.parametrize("magic", [0, 1, 3, -1])
def test_unknown_magic(magic: int) -> None:
    buf = patched(build(sample_records(2)), 16, ">b", magic)
    with pytest.raises(CorruptRecordError, match=f"unknown magic {magic}"):
        parse_header(buf)


@pytest.mark.parametrize(("code", "name"), [(1, "gzip"), (2, "snappy"), (5, "unknown")])
def test_unsupported_compression_code_on_read(code: int, name: str) -> None:
    buf = recrc(patched(build(sample_records(2)), ATTRIBUTES_OFFSET, ">h", code))
    batch = parse_header(buf)
    with pytest.raises(CorruptRecordError, match=name):
        batch.ensure_valid()
    with pytest.raises(CorruptRecordError, match=name):
        _ = batch.compression


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "match"),
    [
        (HEADER_SIZE - 4, ">i", 0, "record count 0"),
        (HEADER_SIZE - 4, ">i", 3, "smaller than record count"),
        (ATTRIBUTES_OFFSET + 2, ">i", 0, "smaller than record count"),
    ],
)
def test_header_counts_checked(offset: int, fmt: str, value: int, match: str) -> None:
    buf = recrc(patched(build(sample_records(2)), offset, fmt, value))
    with pytest.raises(CorruptRecordError, match=match):
        parse_header(buf).ensure_valid()


def test_payload_row_count_must_match_header() -> None:
    # CRC-valid header claiming 3 records over a 2-row payload
    buf = bytearray(build(sample_records(2)))
    struct.pack_into(">i", buf, ATTRIBUTES_OFFSET + 2, 2)  # lastOffsetDelta
    struct.pack_into(">i", buf, HEADER_SIZE - 4, 3)  # recordCount
    batch = parse_header(recrc(buf))
    batch.ensure_valid()
    with pytest.raises(CorruptRecordError, match="2 rows, header says 3"):
        batch.to_arrow()


def _payload_batch(payload: bytes) -> RecordBatch:
    """A CRC-valid batch of one record around an arbitrary payload."""
    good = build(sample_records(1))
    buf = bytearray(good[:HEADER_SIZE] + payload)
    struct.pack_into(">i", buf, 8, len(buf) - LOG_OVERHEAD)
    batch = parse_header(recrc(buf))
    batch.ensure_valid()
    return batch


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not arrow at all",
        _ipc(pa.table({"value": [b"x"]})),  # wrong schema
        _ipc(pa.table({"value": [b"x"]})) + b"junk",
        build(sample_records(1))[HEADER_SIZE:] + b"trailing",
        build(sample_records(1))[HEADER_SIZE:-20],
        _ipc(pa.Table.from_batches([], RECORD_SCHEMA)),  # no rows
    ],
)
def test_malformed_payload(payload: bytes) -> None:
    batch = _payload_batch(payload)
    with pytest.raises(CorruptRecordError, match="base offset 0"):
        batch.to_arrow()
    with pytest.raises(CorruptRecordError):
        batch.records()


@pytest.mark.parametrize(
    ("timestamp", "headers", "match"),
    [
        (None, None, "null timestamps"),
        (1, [{"key": None, "value": b"x"}], "null header or header key"),
        (1, [None], "null header or header key"),
        (1, [{"key": "ok", "value": b"x"}, {"key": None, "value": None}], "null header"),
    ],
)
def test_payload_nulls_in_non_nullable_fields(
    timestamp: int | None, headers: list[Any] | None, match: str
) -> None:
    # Arrow does not enforce nullability; the reader does.
    columns = [
        pa.array([b"k"]),
        pa.array([b"v"]),
        pa.array([timestamp], pa.int64()),
        pa.array([headers], B.HEADERS_TYPE),
    ]
    payload = _ipc(pa.Table.from_arrays(columns, schema=RECORD_SCHEMA))
    with pytest.raises(CorruptRecordError, match=match):
        _payload_batch(payload).to_arrow()


def test_payload_with_null_or_empty_headers_is_accepted() -> None:
    columns = [
        pa.array([b"k", None, b"k3"]),
        pa.array([b"v", b"v2", None]),
        pa.array([1, 2, 3], pa.int64()),
        pa.array([None, [], [{"key": "h", "value": None}]], B.HEADERS_TYPE),
    ]
    payload = _ipc(pa.Table.from_arrays(columns, schema=RECORD_SCHEMA))
    batch = _payload_batch(payload)
    buf = bytearray(batch.buffer)
    struct.pack_into(">i", buf, ATTRIBUTES_OFFSET + 2, 2)  # lastOffsetDelta
    struct.pack_into(">i", buf, HEADER_SIZE - 4, 3)  # recordCount
    got = parse_header(recrc(buf)).records()
    assert [(r.key, r.value, r.headers) for r in got] == [
        (b"k", b"v", ()),
        (None, b"v2", ()),
        (b"k3", None, (("h", None),)),
    ]


def test_payload_split_into_several_arrow_batches_is_accepted() -> None:
    table = pa.Table.from_batches([B.records_to_arrow(sample_records(2))] * 2)
    batch = bytearray(_payload_batch(_ipc(table)).buffer)
    struct.pack_into(">i", batch, ATTRIBUTES_OFFSET + 2, 3)
    struct.pack_into(">i", batch, HEADER_SIZE - 4, 4)
    assert len(parse_header(recrc(batch)).records()) == 4


def test_negative_position() -> None:
    with pytest.raises(ValueError, match="negative position"):
        parse_header(build(sample_records(1)), -1)


# --- properties -----------------------------------------------------------------------------

headers_st = st.lists(
    st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3
).map(tuple)
record_st = st.builds(
    Record,
    key=st.none() | st.binary(max_size=20),
    value=st.none() | st.binary(max_size=50),
    timestamp=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    headers=headers_st,
)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(
    records=st.lists(record_st, min_size=1, max_size=20),
    compression=st.sampled_from(ALL_COMPRESSIONS),
    base_offset=st.integers(min_value=0, max_value=2**40),
)
def test_round_trip_property(
    records: list[Record], compression: Compression, base_offset: int
) -> None:
    data = build(records, base_offset=base_offset, compression=compression)
    (batch,) = iter_batches(data)
    got = batch.records()
    assert without_offsets(got) == records
    assert [r.offset for r in got] == list(range(base_offset, base_offset + len(records)))
    assert batch.max_timestamp == max(r.timestamp for r in records)
    assert batch.first_timestamp == records[0].timestamp


def _corpus() -> bytes:
    return b"".join(
        [
            build(sample_records(3), base_offset=0),
            build(sample_records(4), base_offset=3, compression=Compression.LZ4),
            build_control(
                ControlType.COMMIT,
                producer_id=1,
                producer_epoch=0,
                coordinator_epoch=2,
                timestamp=0,
            ),
        ]
    )


CORPUS = _corpus()


def _consume(buf: bytes | bytearray, *, validate: bool) -> None:
    """Decode everything; only CorruptRecordError may come out."""
    for batch in iter_batches(buf, validate=validate):
        batch.to_arrow()
        records = batch.records()
        assert len(records) == batch.record_count
        batch.control_type()
        batch.coordinator_epoch()


@settings(max_examples=300, deadline=None)
@given(
    flips=st.lists(
        st.tuples(st.integers(0, len(CORPUS) - 1), st.integers(1, 255)), min_size=1, max_size=4
    ),
    cut=st.none() | st.integers(0, len(CORPUS)),
)
def test_corruption_property(flips: list[tuple[int, int]], cut: int | None) -> None:
    buf = bytearray(CORPUS)
    for index, mask in flips:
        buf[index] ^= mask
    if cut is not None:
        del buf[cut:]
    # with the CRC checked: either CorruptRecordError or valid batches
    try:
        _consume(buf, validate=True)
    except CorruptRecordError:
        pass
    # without the CRC: the payload decoder alone must also only raise CorruptRecordError
    try:
        _consume(buf, validate=False)
    except CorruptRecordError:
        pass
    batches, length, reason = valid_prefix(buf)
    assert length == sum(b.size_in_bytes for b in batches)
    assert (reason is None) == (length == len(buf))
    for batch in batches:
        assert batch.is_valid()


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300))
def test_random_bytes_never_escape(data: bytes) -> None:
    try:
        _consume(data, validate=False)
    except CorruptRecordError:
        pass
    valid_prefix(data)


SINGLE_BATCHES = [build(sample_records(4), compression=c) for c in ALL_COMPRESSIONS]


@settings(max_examples=200, deadline=None)
@given(
    which=st.sampled_from(SINGLE_BATCHES),
    changes=st.lists(
        st.tuples(st.integers(HEADER_SIZE), st.integers(1, 255)), min_size=1, max_size=3
    ),
)
def test_payload_corruption_with_fixed_crc(which: bytes, changes: list[tuple[int, int]]) -> None:
    """Corrupt the Arrow payload but keep the CRC right, as a bad producer would."""
    buf = bytearray(which)
    for index, mask in changes:
        buf[HEADER_SIZE + index % (len(buf) - HEADER_SIZE)] ^= mask
    try:
        _consume(recrc(buf), validate=True)
    except CorruptRecordError:
        pass


def test_crc_helper_matches_copying_crc() -> None:
    data = bytearray(build(sample_records(5)))
    view = memoryview(data)[ATTRIBUTES_OFFSET:]
    assert B._crc32c(view) == google_crc32c.value(bytes(view))
