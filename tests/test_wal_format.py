"""The WAL object format: encode, the trusted footer, and the scan of a damaged object."""

from __future__ import annotations

import dataclasses
import json
import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore.batch import Record, build, iter_batches
from logstore.wal_format import (
    CHUNK_HEADER_SIZE,
    HEADER_SIZE,
    TRAILER_SIZE,
    ChunkInput,
    FooterIncompleteError,
    InvalidWalObjectError,
    UnsupportedWalFormatError,
    WalChunk,
    WalObjectIndex,
    WalObjectName,
    encode_object,
    footer_span,
    object_name,
    parse_object_name,
    read_footer,
    read_header,
    scan_object,
)

pytestmark = pytest.mark.unit

TOPIC_A = "0" * 31 + "a"
TOPIC_B = "f" * 32


def batches(partition: int, base: int, count: int, *, epoch: int = 0, per: int = 2) -> list[bytes]:
    """``count`` batches of ``per`` records from offset ``base``; values name partition+offset."""
    out = []
    for i in range(count):
        offset = base + i * per
        records = [
            Record(None, f"{partition}:{offset + j}".encode(), 1000 + offset + j)
            for j in range(per)
        ]
        out.append(build(records, base_offset=offset, partition_leader_epoch=epoch))
    return out


def chunk(topic_id: str, partition: int, base: int = 0, count: int = 3, **kw: int) -> ChunkInput:
    return ChunkInput(
        f"t-{topic_id[-1]}", topic_id, partition, batches(partition, base, count, **kw)
    )


def encode(chunks: list[ChunkInput], seq: int = 7) -> tuple[bytes, WalObjectIndex]:
    data, index = encode_object(chunks, seq=seq, broker_id=2, broker_epoch=11, created_ms=123)
    return bytes(data), index


def values(data: bytes, c: WalChunk) -> list[bytes]:
    """Every record value of a chunk, CRC-checked."""
    return [
        r.value or b""
        for b in iter_batches(data[c.position : c.end], validate=True)
        for r in b.records()
    ]


def unnamed(index: WalObjectIndex) -> tuple[WalChunk, ...]:
    """The chunks as a scan sees them: the topic name lives only in the footer."""
    return tuple(dataclasses.replace(c, topic="") for c in index.chunks)


# --- round trip -------------------------------------------------------------------------------


def test_round_trip_through_footer_and_scan() -> None:
    data, index = encode([chunk(TOPIC_B, 0), chunk(TOPIC_A, 1, base=10), chunk(TOPIC_A, 0)])
    assert index.object_size == len(data)
    assert (index.level, index.broker_id, index.broker_epoch) == (0, 2, 11)
    assert (index.min_seq, index.max_seq, index.created_ms) == (7, 7, 123)
    # sorted by (topic id, partition), tiling the object from the header on
    assert [(c.topic_id, c.partition) for c in index.chunks] == [
        (TOPIC_A, 0),
        (TOPIC_A, 1),
        (TOPIC_B, 0),
    ]
    assert index.chunks[0].position == HEADER_SIZE + CHUNK_HEADER_SIZE
    for before, after in zip(index.chunks, index.chunks[1:], strict=False):
        assert after.header_position == before.end
    a1 = index.chunks[1]
    assert (a1.base_offset, a1.next_offset, a1.first_seq, a1.last_seq) == (10, 16, 7, 7)
    assert a1.max_timestamp == 1000 + 15
    assert values(data, a1) == [f"1:{o}".encode() for o in range(10, 16)]

    assert read_footer(data, len(data), name="o") == index
    assert read_footer(data[-4096:], len(data)) == index  # the tail is enough
    scanned = scan_object(data, name="o")
    assert scanned.scanned
    assert scanned.reason is None
    assert scanned.chunks == unnamed(index)
    assert scanned.valid_length == index.chunks[-1].end
    assert read_header(data) == WalObjectName(0, 7, 7, 11)


def test_pause_is_called_after_each_part_and_changes_no_byte() -> None:
    """A compaction yields the GIL between copies (``pause``); the object is the same."""
    chunks = [chunk(TOPIC_A, 0, count=4), chunk(TOPIC_B, 1, base=5)]
    calls: list[int] = []
    data, index = encode_object(
        chunks, seq=7, broker_id=2, broker_epoch=11, created_ms=123, pause=lambda: calls.append(1)
    )
    assert len(calls) == sum(len(c.parts) for c in chunks)
    assert (bytes(data), index) == encode(chunks)


def test_epoch_starts_are_listed_per_chunk() -> None:
    parts = batches(0, 0, 2, epoch=3) + batches(0, 4, 1, epoch=3) + batches(0, 6, 2, epoch=5)
    data, index = encode([ChunkInput("t", TOPIC_A, 0, parts)])
    assert index.chunks[0].epochs == ((3, 0), (5, 6))
    assert scan_object(data).chunks[0].epochs == ((3, 0), (5, 6))


def test_footer_too_large_for_the_tail_asks_for_more() -> None:
    data, index = encode([chunk(TOPIC_A, p, count=1) for p in range(40)])
    span = footer_span(data[-TRAILER_SIZE:], len(data))
    with pytest.raises(FooterIncompleteError) as err:
        read_footer(data[-100:], len(data))
    assert err.value.needed == span
    assert read_footer(data[-span:], len(data)) == index


def test_empty_object_is_valid() -> None:
    """No chunk: a marker object (a new incarnation's first write fences older ones)."""
    data, index = encode([])
    assert index.chunks == ()
    assert read_footer(data, len(data)) == index
    assert scan_object(data).chunks == ()


def test_encoder_refuses_bad_chunks() -> None:
    with pytest.raises(ValueError, match="two chunks for one partition"):
        encode([chunk(TOPIC_A, 0), chunk(TOPIC_A, 0, base=6)])
    gap = batches(0, 0, 1) + batches(0, 5, 1)
    with pytest.raises(ValueError, match="contiguous"):
        encode([ChunkInput("t", TOPIC_A, 0, gap)])
    with pytest.raises(ValueError, match="not whole record batches"):
        encode([ChunkInput("t", TOPIC_A, 0, [batches(0, 0, 1)[0][:-3]])])
    with pytest.raises(ValueError, match="at least one record batch"):
        encode([ChunkInput("t", TOPIC_A, 0, [])])
    with pytest.raises(ValueError, match="32 hex digits"):
        encode([chunk("orders", 0)])
    with pytest.raises(ValueError, match="next offset 6, not 9"):
        encode([dataclasses.replace(chunk(TOPIC_A, 0), next_offset=9)])


def test_object_names() -> None:
    assert object_name(5, 3) == "L0/00000000000000000005-0000000003.wal"
    assert parse_object_name(object_name(5, 3)) == WalObjectName(0, 5, 5, 3)
    packed = object_name(9, 3, level=2, min_seq=4)
    assert packed == "L2/00000000000000000009-00000000000000000004-0000000003.wal"
    assert parse_object_name(packed) == WalObjectName(2, 4, 9, 3)
    big = object_name(5, 12_345_678_901)  # wider than the padding: still parsed
    assert parse_object_name(big) == WalObjectName(0, 5, 5, 12_345_678_901)
    for other in ("L0/5-3.wal", "x/00000000000000000005-0000000003.wal", "L0/a.seg"):
        assert parse_object_name(other) is None


# --- a damaged footer or trailer: not trusted, the scan still finds every chunk -----------------


def test_flipped_footer_byte_is_not_trusted() -> None:
    data, index = encode([chunk(TOPIC_A, 0), chunk(TOPIC_A, 1)])
    footer_at = index.chunks[-1].end
    damaged = bytearray(data)
    damaged[footer_at + 5] ^= 0x01
    with pytest.raises(InvalidWalObjectError, match="footer CRC mismatch"):
        read_footer(bytes(damaged), len(damaged), name="obj-1")
    scanned = scan_object(bytes(damaged))
    assert scanned.chunks == unnamed(index)
    assert scanned.reason is None


@pytest.mark.parametrize(
    "where",
    [
        "magic",
        "length",
        "crc",
        "size",
    ],
)
def test_damaged_trailer_is_not_trusted(where: str) -> None:
    data, index = encode([chunk(TOPIC_A, 0), chunk(TOPIC_A, 1)])
    damaged = bytearray(data)
    if where == "magic":
        damaged[-1] = ord("X")
    elif where == "length":
        struct.pack_into(">I", damaged, len(damaged) - TRAILER_SIZE, 1 << 30)
    elif where == "crc":
        damaged[len(damaged) - TRAILER_SIZE + 5] ^= 0xFF
    else:  # bytes appended after the trailer: the sizes no longer add up
        damaged += data[-TRAILER_SIZE:]
    with pytest.raises(InvalidWalObjectError):
        read_footer(bytes(damaged), len(damaged))
    assert scan_object(bytes(damaged)).chunks == unnamed(index)


def test_footer_whose_sizes_do_not_tile_the_object_is_not_trusted() -> None:
    """A footer with a valid CRC that describes other bytes (e.g. a chunk's size edited) is
    refused: recovery trusts a footer only if the object's size is exactly what it says."""
    data, index = encode([chunk(TOPIC_A, 0)])
    footer_start = index.chunks[-1].end
    doc = json.loads(data[footer_start:-TRAILER_SIZE])
    doc["chunks"][0]["size"] -= 1
    import google_crc32c

    footer = json.dumps(doc).encode()
    trailer = struct.pack(">II8s", len(footer), google_crc32c.value(footer), b"RPLWEND1")
    forged = data[:footer_start] + footer + trailer
    with pytest.raises(InvalidWalObjectError, match="describes"):
        read_footer(forged, len(forged))


# --- torn and corrupt objects: the scan keeps whole valid batches only --------------------------


def test_torn_object_scans_to_its_valid_prefix() -> None:
    data, index = encode([chunk(TOPIC_A, p, count=4) for p in range(3)])
    second = index.chunks[1]
    batch_ends = [second.position]
    for b in iter_batches(data[second.position : second.end]):
        batch_ends.append(batch_ends[-1] + b.size_in_bytes)
    cut = batch_ends[2] + 7  # two whole batches of the second chunk, then part of the third
    torn = data[:cut]
    with pytest.raises(InvalidWalObjectError):
        read_footer(torn[-4096:], len(torn))
    scanned = scan_object(torn)
    assert [c.partition for c in scanned.chunks] == [0, 1]
    assert scanned.chunks[0] == unnamed(index)[0]
    kept = scanned.chunks[1]
    assert (kept.base_offset, kept.next_offset) == (0, 4)
    assert kept.size == batch_ends[2] - second.position
    assert scanned.valid_length == batch_ends[2]
    assert scanned.reason is not None
    assert "partition 1" in scanned.reason
    assert values(torn, kept) == [b"1:0", b"1:1", b"1:2", b"1:3"]


@pytest.mark.parametrize("cut", [0, 10, HEADER_SIZE - 1])
def test_object_torn_inside_its_header(cut: int) -> None:
    data, _ = encode([chunk(TOPIC_A, 0)])
    with pytest.raises(InvalidWalObjectError, match="too short"):
        scan_object(data[:cut])


def test_object_torn_inside_a_chunk_header() -> None:
    data, index = encode([chunk(TOPIC_A, 0), chunk(TOPIC_A, 1)])
    torn = data[: index.chunks[1].header_position + 20]
    scanned = scan_object(torn)
    assert scanned.chunks == unnamed(index)[:1]


def test_flipped_byte_in_a_batch_excludes_that_batch_and_everything_after() -> None:
    data, index = encode([chunk(TOPIC_A, p, count=3) for p in range(3)])
    second = index.chunks[1]
    first_batch = next(iter_batches(data[second.position : second.end]))
    damaged = bytearray(data)
    damaged[second.position + first_batch.size_in_bytes + 70] ^= 0x10  # the 2nd batch's payload
    scanned = scan_object(bytes(damaged))
    assert [c.partition for c in scanned.chunks] == [0, 1]
    kept = scanned.chunks[1]
    assert (kept.base_offset, kept.next_offset, kept.size) == (0, 2, first_batch.size_in_bytes)
    assert scanned.reason is not None
    assert "CRC mismatch" in scanned.reason
    # the footer still checks (it covers itself), but the batch is caught on every read
    assert read_footer(bytes(damaged), len(damaged)).chunks[1] == second


def test_flipped_byte_in_a_chunk_header_ends_the_scan_there() -> None:
    data, index = encode([chunk(TOPIC_A, p) for p in range(3)])
    damaged = bytearray(data)
    damaged[index.chunks[1].header_position + 10] ^= 0x01
    scanned = scan_object(bytes(damaged))
    assert scanned.chunks == unnamed(index)[:1]
    assert scanned.reason is not None
    assert "chunk header" in scanned.reason


# --- unknown versions are refused, naming the object -----------------------------------------


def test_unknown_header_version_is_refused() -> None:
    data, _ = encode([chunk(TOPIC_A, 0)])
    future = bytearray(data)
    struct.pack_into(">H", future, 4, 2)
    with pytest.raises(UnsupportedWalFormatError, match=r"L0/x\.wal.*format 2.*[Uu]pgrade"):
        scan_object(bytes(future), name="L0/x.wal")


def test_unknown_trailer_version_is_refused() -> None:
    data, _ = encode([chunk(TOPIC_A, 0)])
    future = data[:-1] + b"2"
    with pytest.raises(UnsupportedWalFormatError, match=r"obj.*format 2"):
        read_footer(future, len(future), name="obj")


def test_unknown_footer_version_is_refused() -> None:
    data, index = encode([chunk(TOPIC_A, 0)])
    footer_start = index.chunks[-1].end
    doc = json.loads(data[footer_start:-TRAILER_SIZE])
    doc["format"] = 9
    import google_crc32c

    footer = json.dumps(doc).encode()
    trailer = struct.pack(">II8s", len(footer), google_crc32c.value(footer), b"RPLWEND1")
    future = data[:footer_start] + footer + trailer
    with pytest.raises(UnsupportedWalFormatError, match=r"the-object.*format 9"):
        read_footer(future, len(future), name="the-object")


def test_unknown_chunk_header_version_is_refused() -> None:
    import google_crc32c

    data, index = encode([chunk(TOPIC_A, 0)])
    future = bytearray(data)
    at = index.chunks[0].header_position
    struct.pack_into(">H", future, at + 2, 7)
    struct.pack_into(">I", future, at + 60, google_crc32c.value(bytes(future[at : at + 60])))
    with pytest.raises(UnsupportedWalFormatError, match="version 7"):
        scan_object(bytes(future), name="o")


# --- property: any set of chunks round-trips, and any cut scans to a whole-batch prefix -------


@st.composite
def chunk_sets(draw: st.DrawFn) -> list[ChunkInput]:
    topics = draw(st.lists(st.uuids().map(lambda u: u.hex), min_size=1, max_size=3, unique=True))
    out = []
    for topic_id in topics:
        for partition in draw(st.sets(st.integers(0, 5), min_size=1, max_size=3)):
            base = draw(st.integers(0, 1 << 40))
            count = draw(st.integers(1, 3))
            per = draw(st.integers(1, 3))
            epoch = draw(st.integers(-1, 5))
            out.append(chunk(topic_id, partition, base, count, per=per, epoch=epoch))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=chunk_sets(), seq=st.integers(0, 1 << 40), cut=st.floats(0, 1))
def test_property_round_trip_and_torn_prefix(
    chunks: list[ChunkInput], seq: int, cut: float
) -> None:
    data, index = encode(chunks, seq=seq)
    assert read_footer(data, len(data)) == index
    assert scan_object(data).chunks == unnamed(index)
    by_key = {(c.topic_id, c.partition): c for c in chunks}
    for c in index.chunks:
        assert data[c.position : c.end] == b"".join(by_key[(c.topic_id, c.partition)].parts)
    # a torn copy: only whole, CRC-valid batches, each a prefix of what was written
    torn = data[: max(HEADER_SIZE, int(len(data) * cut))]
    scanned = scan_object(torn)
    for got, want in zip(scanned.chunks, index.chunks, strict=False):
        assert (got.topic_id, got.partition, got.base_offset) == (
            want.topic_id,
            want.partition,
            want.base_offset,
        )
        assert got.size <= want.size
        assert got.next_offset <= want.next_offset
        assert torn[got.position : got.end] == data[want.position : want.position + got.size]
        assert list(iter_batches(torn[got.position : got.end], validate=True))
    assert len(scanned.chunks) <= len(index.chunks)


def test_topic_ids_from_uuid4_are_accepted() -> None:
    data, index = encode([chunk(uuid.uuid4().hex, 0)])
    assert read_footer(data, len(data)) == index
