"""Batches with offset gaps (what the log cleaner writes) through every reader.

A cleaned batch keeps its base offset and lastOffsetDelta with fewer records, each carrying its
offset delta (``logstore.batch.build_retained``). Each reader that turns a batch into offsets is
checked on one: the batch itself, the Spark source's direct reads (``to_read_batch`` and a
``SegmentReader`` over a log), the client consumer (``decode_fetched``), the Kafka listener's
transcoding (read back by kafka-python), ``replog log dump`` and the log's timestamp lookup.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from kafka.record.memory_records import MemoryRecords

from logstore import batch as batch_format
from logstore.batch import (
    GAPPED_RECORD_SCHEMA,
    Compression,
    Record,
    RecordBatch,
    build,
    build_retained,
    parse_header,
    set_base_offset,
)
from logstore.dump import dump
from logstore.errors import CorruptRecordError, InvalidRecordError
from logstore.log import Log
from logstore.reader import SegmentReader, to_read_batch
from logstore.storage import Storage
from replication.client.fetcher import decode_fetched
from replication.kafka.records import replog_to_kafka

pytestmark = pytest.mark.unit

BASE = 100
#: positions kept of a 10-record batch: offsets 100, 103, 104, 108 (109, the last, is gone)
KEEP = [0, 3, 4, 8]
OFFSETS = [BASE + i for i in KEEP]


def full_batch(compression: Compression = Compression.NONE, base: int = BASE) -> RecordBatch:
    records = [
        Record(f"k{i}".encode(), f"v{i}".encode(), 1_000 + i, (("h", str(i).encode()),))
        for i in range(10)
    ]
    data = bytearray(
        build(
            records,
            compression=compression,
            producer_id=7,
            producer_epoch=2,
            base_sequence=50,
            partition_leader_epoch=3,
        )
    )
    set_base_offset(data, base)
    return parse_header(bytes(data))


def gapped(compression: Compression = Compression.NONE, base: int = BASE) -> RecordBatch:
    out = parse_header(build_retained(full_batch(compression, base), KEEP))
    out.ensure_valid()
    return out


@pytest.mark.parametrize("compression", list(Compression))
def test_a_retained_batch_keeps_its_offsets_and_header(compression: Compression) -> None:
    original = full_batch(compression)
    batch = gapped(compression)
    assert batch.has_gaps
    assert not original.has_gaps
    assert batch.record_count == len(KEEP)
    assert batch.base_offset == BASE
    assert batch.last_offset == BASE + 9
    for name in ("attributes", "producer_id", "producer_epoch", "base_sequence"):
        assert getattr(batch, name) == getattr(original, name)
    assert batch.partition_leader_epoch == 3
    assert batch.last_sequence == original.last_sequence
    assert (batch.first_timestamp, batch.max_timestamp) == (1_000, 1_008)
    assert [r.offset for r in batch.records()] == OFFSETS
    assert [r.value for r in batch.records()] == [f"v{i}".encode() for i in KEEP]
    assert batch.offset_deltas() == KEEP
    assert batch.to_arrow().schema.equals(batch_format.RECORD_SCHEMA)
    # cleaned again: the kept records keep their offsets
    again = build_retained(batch, [1, 3])
    assert [r.offset for r in parse_header(again).records()] == [OFFSETS[1], OFFSETS[3]]


def test_keeping_all_or_none_and_batches_without_gaps() -> None:
    original = full_batch()
    assert build_retained(original, range(10)) == bytes(original.buffer)
    assert original.offset_deltas() is None
    # dropping only the last record still leaves a gap at the end
    tail = build_retained(original, range(9))
    batch = parse_header(tail)
    assert batch.has_gaps
    assert batch.next_offset == BASE + 10
    assert [r.offset for r in batch.records()] == list(range(BASE, BASE + 9))


def _bad_deltas(deltas: list[int], last_offset_delta: int = 9) -> RecordBatch:
    data = full_batch().to_arrow().slice(0, len(deltas))
    payload = pa.RecordBatch.from_arrays(
        [*data.columns, pa.array(deltas, pa.int32())], schema=GAPPED_RECORD_SCHEMA
    )
    raw = batch_format._encode(
        payload,
        base_offset=0,
        partition_leader_epoch=-1,
        attributes=0,
        compression=Compression.NONE,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        last_offset_delta=last_offset_delta,
    )
    batch = parse_header(raw)
    batch.ensure_valid()
    return batch


@pytest.mark.parametrize("deltas", [[0, 2, 2], [3, 1, 5], [-1, 2, 3], [0, 4, 10]])
def test_offset_deltas_are_checked(deltas: list[int]) -> None:
    with pytest.raises(CorruptRecordError, match="strictly increasing"):
        _bad_deltas(deltas).to_arrow()


def test_a_gapped_header_needs_the_offset_delta_column() -> None:
    buf = bytearray(build([Record(b"k", b"v", 1), Record(b"k", b"w", 2)]))
    struct.pack_into(">i", buf, batch_format.ATTRIBUTES_OFFSET + 2, 5)  # lastOffsetDelta
    crc = batch_format._crc32c(memoryview(buf)[batch_format.ATTRIBUTES_OFFSET :])
    struct.pack_into(">I", buf, batch_format.CRC_OFFSET, crc)
    batch = parse_header(buf)
    batch.ensure_valid()
    with pytest.raises(CorruptRecordError, match="not GAPPED_RECORD_SCHEMA"):
        batch.to_arrow()


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, 200, OFFSETS),
        (101, 200, OFFSETS[1:]),
        (103, 105, [103, 104]),
        (105, 108, []),
        (104, 109, [104, 108]),
        (109, 110, []),
    ],
)
def test_direct_reads_give_each_record_its_offset(
    start: int, end: int, expected: list[int]
) -> None:
    out = to_read_batch(gapped(), start, end)
    got = [] if out is None else out.column("offset").to_pylist()
    assert got == expected
    if out is not None:
        values = [int(v[1:]) + BASE for v in out.column("value").to_pylist()]
        assert values == expected


@pytest.mark.parametrize(
    ("fetch_offset", "expected"), [(0, OFFSETS), (101, OFFSETS[1:]), (109, [])]
)
def test_the_client_consumer_reads_the_offsets(fetch_offset: int, expected: list[int]) -> None:
    fetched = decode_fetched(bytes(gapped().buffer), fetch_offset)
    got = [o for b in fetched.batches for o in b.column("offset").to_pylist()]
    assert got == expected
    assert fetched.next_offset == BASE + 10


def test_the_kafka_listener_sends_each_records_offset_delta() -> None:
    memory = MemoryRecords(replog_to_kafka(bytes(gapped(Compression.ZSTD).buffer)))
    batch = memory.next_batch()
    assert batch.validate_crc()
    assert (batch.base_offset, batch.last_offset_delta) == (BASE, 9)
    records = list(batch)
    assert [r.offset for r in records] == OFFSETS
    assert [r.value for r in records] == [f"v{i}".encode() for i in KEEP]
    assert [r.timestamp for r in records] == [1_000 + i for i in KEEP]


def test_a_log_serves_gapped_batches_to_its_readers(tmp_path: pytest.TempPathFactory) -> None:
    storage = Storage.from_url(f"file://{tmp_path}/t/0")
    log = Log.open(storage)
    log.truncate_fully_and_start_at(BASE)
    log.append_as_follower(bytes(gapped().buffer))
    log.append_as_follower(bytes(full_batch(base=BASE + 10).buffer))
    log.flush()
    assert log.log_end_offset == BASE + 20
    assert log.offset_for_timestamp(1_001) == (103, 1_003)
    reader = SegmentReader(storage)
    offsets = [
        o
        for chunk in reader.read(BASE, BASE + 20)
        if chunk.records is not None
        for o in chunk.records.column("offset").to_pylist()
    ]
    assert offsets == [*OFFSETS, *range(BASE + 10, BASE + 20)]
    lines = [line.text for line in dump(storage.url, records=True)]
    assert [line.split()[2] for line in lines if line.startswith("| offset:")][:5] == [
        "100",
        "103",
        "104",
        "108",
        "110",
    ]
    # a leader never appends a batch with gaps: only the cleaner writes them
    with pytest.raises(InvalidRecordError, match="only the log cleaner"):
        log.append(bytes(gapped().buffer), leader_epoch=3)
    log.close()


def test_a_batch_that_lost_every_record_stays_as_an_empty_batch() -> None:
    original = full_batch()
    empty = parse_header(build_retained(original, []))
    empty.ensure_valid()
    assert (empty.base_offset, empty.next_offset, empty.record_count) == (BASE, BASE + 10, 0)
    assert empty.size_in_bytes == batch_format.HEADER_SIZE
    assert (empty.producer_id, empty.producer_epoch, empty.base_sequence) == (7, 2, 50)
    assert not empty.is_transactional
    assert empty.records() == []
    assert empty.offset_deltas() == []
    assert to_read_batch(empty, 0, 1_000) is None
    fetched = decode_fetched(bytes(empty.buffer) + bytes(gapped(base=BASE + 10).buffer), BASE)
    got = [o for b in fetched.batches for o in b.column("offset").to_pylist()]
    assert got == [o + 10 for o in OFFSETS]
    memory = MemoryRecords(replog_to_kafka(bytes(empty.buffer)))
    kafka_batch = memory.next_batch()
    assert kafka_batch.validate_crc()
    assert list(kafka_batch) == []
    assert kafka_batch.base_offset + kafka_batch.last_offset_delta == BASE + 9
    # an empty payload is all an empty batch may have
    buf = bytearray(build([Record(b"k", b"v", 1)]))
    struct.pack_into(">i", buf, batch_format.RECORD_COUNT_OFFSET, 0)
    crc = batch_format._crc32c(memoryview(buf)[batch_format.ATTRIBUTES_OFFSET :])
    struct.pack_into(">I", buf, batch_format.CRC_OFFSET, crc)
    with pytest.raises(CorruptRecordError, match="record count 0 < 1"):
        parse_header(buf).ensure_valid()


def test_the_delete_horizon_is_kept_in_the_first_timestamp_field() -> None:
    original = full_batch()
    assert original.delete_horizon_ms is None
    marked = parse_header(build_retained(original, range(10), delete_horizon_ms=5_000))
    marked.ensure_valid()
    assert marked.delete_horizon_ms == 5_000
    assert not marked.has_gaps
    assert [r.timestamp for r in marked.records()] == [1_000 + i for i in range(10)]
    kept = parse_header(build_retained(marked, KEEP))
    assert kept.delete_horizon_ms == 5_000
    records = list(MemoryRecords(replog_to_kafka(bytes(kept.buffer))).next_batch())
    assert [r.timestamp for r in records] == [1_000 + i for i in KEEP]
