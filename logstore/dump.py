"""``replog log dump``: describe the batches of segment objects, WAL objects, or a WAL.

As kafka-dump-log.sh: one line per batch with its offsets, leader epoch, producer fields,
record count, timestamps and whether its CRC is valid; ``records=True`` adds the records.
A torn or corrupt stretch is reported with its byte position and the walk stops there.

It reads what a broker root holds (docs/storage.md §2.2): a partition's ``.seg`` objects, one
WAL or packed object (``_replog/wal/L<n>/....wal``: its header, whether its footer checks,
then each chunk and its batches), or the ``_replog/wal`` directory (every object in seq
order). An object whose footer does not check is walked the way recovery walks it
(:func:`logstore.wal_format.scan_object`), and the byte where its valid prefix ends is
reported: what a broker would recover from it is exactly what is printed before that line.

A partition directory written through the broker WAL (its checkpoint is format 2) is dumped
as recovery reads it: its segment objects and its chunks in the WAL objects of the broker root
two levels up, in offset order, nothing on storage changed (``Log.open(read_only=True)``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from logstore.batch import RecordBatch, parse_header
from logstore.checkpoint import CHECKPOINT_NAME, WAL_FORMAT_VERSION, Checkpoint
from logstore.errors import ConfigError, CorruptRecordError, ObjectNotFoundError, ReplogError
from logstore.log import open_replica_log
from logstore.segment import SUFFIX, ChunkSegment
from logstore.storage import Storage
from logstore.wal_format import (
    HEADER_SIZE,
    FooterIncompleteError,
    InvalidWalObjectError,
    WalChunk,
    parse_object_name,
    read_footer,
    read_header_fields,
    scan_object,
)
from logstore.wal_format import SUFFIX as WAL_SUFFIX
from logstore.wal_index import WAL_PREFIX


@dataclass(frozen=True)
class DumpLine:
    """One line of output; ``batch`` is None for a header or error line."""

    text: str
    batch: RecordBatch | None = None
    error: bool = False


def describe(batch: RecordBatch, position: int) -> str:
    valid = batch.is_valid()
    kind = " control" if batch.is_control else ""
    txn = " transactional" if batch.is_transactional else ""
    return (
        f"baseOffset: {batch.base_offset} lastOffset: {batch.last_offset} "
        f"count: {batch.record_count} position: {position} size: {batch.size_in_bytes} "
        f"leaderEpoch: {batch.partition_leader_epoch} producerId: {batch.producer_id} "
        f"producerEpoch: {batch.producer_epoch} baseSequence: {batch.base_sequence} "
        f"compression: {batch.compression.name.lower()} "
        f"timestampType: {batch.timestamp_type.name} firstTimestamp: {batch.first_timestamp} "
        f"maxTimestamp: {batch.max_timestamp}{txn}{kind} "
        f"crc: {batch.crc} isValid: {str(valid).lower()}"
    )


def dump_object(
    data: bytes, *, records: bool = False, start: int = 0, end: int | None = None
) -> Iterator[DumpLine]:
    """The batches in ``data[start:end]`` (positions are ``data``'s: for a WAL chunk, the
    object's byte positions); a batch that runs past ``end`` is reported as corrupt."""
    stop = len(data) if end is None else end
    position = start
    while position < stop:
        try:
            batch = parse_header(data, position)
        except CorruptRecordError as err:
            yield DumpLine(f"corrupt at byte {position}: {err}", error=True)
            return
        if position + batch.size_in_bytes > stop:
            yield DumpLine(
                f"corrupt at byte {position}: a batch of {batch.size_in_bytes} bytes runs past "
                f"the chunk's end at byte {stop}",
                error=True,
            )
            return
        yield DumpLine(describe(batch, position), batch, error=not batch.is_valid())
        if records and batch.is_valid():
            if batch.is_control:
                yield DumpLine(
                    f"| offset: {batch.base_offset} control: {batch.control_type()} "
                    f"coordinatorEpoch: {batch.coordinator_epoch()}"
                )
            else:
                for record in batch.records():
                    headers = ", ".join(f"{k}={v!r}" for k, v in record.headers)
                    yield DumpLine(
                        f"| offset: {record.offset} CreateTime: {record.timestamp} "
                        f"key: {_show(record.key)} value: {_show(record.value)}"
                        + (f" headers: [{headers}]" if headers else "")
                    )
        position += batch.size_in_bytes


def dump(url: str, *, records: bool = False) -> Iterator[DumpLine]:
    """Dump one ``.seg`` object, every segment object under a partition directory, one WAL
    or packed object (``.wal``), or every object of a ``_replog/wal`` directory.

    A path that is missing, an object that is neither (``checkpoint.json``, say) and a
    directory without such objects raise :class:`ConfigError` naming what to give instead.
    """
    if not url.endswith((SUFFIX, WAL_SUFFIX)) and _walked_as_recovery(url):
        yield from _dump_partition_over_wal(url, records)
        return
    storage, names = _objects(url)
    for name in names:
        yield DumpLine(f"Dumping {storage.url.rstrip('/')}/{name}")
        if name.endswith(WAL_SUFFIX):
            yield from dump_wal_object(storage.read(name), name=name, records=records)
        else:
            yield from dump_object(storage.read(name), records=records)


def dump_wal_object(data: bytes, *, name: str = "", records: bool = False) -> Iterator[DumpLine]:
    """A WAL or packed object: its header, whether its footer checks, then each chunk as
    ``Chunk <topic>-<p> [base, next) position size seq`` followed by its batches.

    With a valid footer the chunks are the footer's; without, the object is scanned as
    recovery scans it, and the line ``valid up to byte X of N`` says where its valid prefix
    ends (an error). ``name`` is the object's path relative to ``_replog/wal`` (or its file
    name); if it is a WAL object name, it must agree with the header.
    """
    try:
        header = read_header_fields(data, name=name)
    except ReplogError as err:  # unreadable header, or a format this replog does not read
        yield DumpLine(f"unreadable WAL object: {err}", error=True)
        return
    yield DumpLine(
        f"format: {header.format} level: {header.level} brokerId: {header.broker_id} "
        f"brokerEpoch: {header.broker_epoch} seq: {header.seq} size: {len(data)}"
    )
    stated = parse_object_name(_relative_wal_name(name))
    if stated is not None and (stated.level, stated.max_seq, stated.broker_epoch) != (
        header.level,
        header.seq,
        header.broker_epoch,
    ):
        yield DumpLine(
            f"name says level {stated.level}, seq {stated.max_seq}, broker epoch "
            f"{stated.broker_epoch}; the header says otherwise (recovery uses nothing in it)",
            error=True,
        )
    try:
        footer = read_footer(data, len(data), name=name)
    except (InvalidWalObjectError, FooterIncompleteError) as err:
        reason = str(err).removeprefix(f"WAL object {name}: ")
        yield DumpLine(f"footer: invalid ({reason}); scanning the object", error=True)
    except ReplogError as err:  # a footer of a format this replog does not read
        yield DumpLine(f"footer: {err}", error=True)
        return
    else:
        yield DumpLine(
            f"footer: valid chunks: {len(footer.chunks)} minSeq: {footer.min_seq} "
            f"maxSeq: {footer.max_seq} createdMs: {footer.created_ms} "
            f"footerBytes: {len(data) - (footer.chunks[-1].end if footer.chunks else HEADER_SIZE)}"
        )
        for chunk in footer.chunks:
            yield from _dump_chunk(data, chunk, records)
        return
    try:
        scanned = scan_object(data, name=name)
    except ReplogError as err:
        yield DumpLine(f"scan: {err}", error=True)
        return
    for chunk in scanned.chunks:
        yield from _dump_chunk(data, chunk, records)
    why = f": {scanned.reason}" if scanned.reason else ""
    yield DumpLine(
        f"valid up to byte {scanned.valid_length} of {len(data)} "
        f"({len(scanned.chunks)} whole chunk(s) recoverable){why}",
        error=True,
    )


def _dump_chunk(data: bytes, chunk: WalChunk, records: bool) -> Iterator[DumpLine]:
    topic = chunk.topic or f"<topic id {chunk.topic_id}>"  # a scan knows only the id
    seq = (
        str(chunk.first_seq)
        if chunk.first_seq == chunk.last_seq
        else f"{chunk.first_seq}..{chunk.last_seq}"
    )
    yield DumpLine(
        f"Chunk {topic}-{chunk.partition} [{chunk.base_offset}, {chunk.next_offset}) "
        f"position: {chunk.position} size: {chunk.size} seq: {seq} topicId: {chunk.topic_id} "
        f"maxTimestamp: {chunk.max_timestamp}"
    )
    expected = chunk.base_offset
    for line in dump_object(data, records=records, start=chunk.position, end=chunk.end):
        yield line
        batch = line.batch
        if batch is not None:
            if batch.base_offset != expected:
                yield DumpLine(
                    f"batch at offset {batch.base_offset} where the chunk expects {expected}",
                    error=True,
                )
            expected = batch.next_offset
    if expected != chunk.next_offset:
        yield DumpLine(
            f"the chunk's batches end at offset {expected}, it says {chunk.next_offset}",
            error=True,
        )


def _walked_as_recovery(url: str) -> bool:
    """Whether ``url`` is a partition directory whose checkpoint says its log is over the
    broker WAL or was cleaned by the log cleaner: its objects are then the log only as
    recovery walks them."""
    try:
        checkpoint = Checkpoint.from_bytes(Storage.from_url(url).read(CHECKPOINT_NAME))
    except (ObjectNotFoundError, CorruptRecordError):
        return False
    return checkpoint.format_version == WAL_FORMAT_VERSION or checkpoint.clean_generation > 0


def _dump_partition_over_wal(url: str, records: bool) -> Iterator[DumpLine]:
    root_url, topic, partition = url.rstrip("/").rsplit("/", 2)
    if not partition.isdigit():
        raise ConfigError(f"{url}: a partition directory is <log.dir>/<topic>/<partition>")
    root = Storage.from_url(root_url)
    log = open_replica_log(root, topic, int(partition), read_only=True)
    extents = log.extents()
    over = f" over the broker WAL of {root.url}" if log.wal is not None else ""
    yield DumpLine(
        f"Dumping {url.rstrip('/')}{over}: log start {log.log_start_offset}, end "
        f"{log.log_end_offset}, {len(extents)} extent(s), as recovery reads them"
    )
    for extent in extents:
        if isinstance(extent, ChunkSegment):
            chunk = extent.chunk
            yield DumpLine(
                f"Chunk {topic}-{partition} [{chunk.base_offset}, {chunk.next_offset}) in "
                f"{chunk.object} position: {chunk.position} size: {chunk.size} seq: "
                f"{chunk.first_seq}..{chunk.last_seq} (batch positions within the chunk)"
            )
            end = chunk.position + chunk.size
            yield from dump_object(
                root.read_range(chunk.object, chunk.position, end), records=records
            )
        else:
            yield DumpLine(f"Dumping {log.storage.url.rstrip('/')}/{extent.name}")
            yield from dump_object(log.storage.read(extent.name), records=records)


def _relative_wal_name(name: str) -> str:
    """``L<n>/<stem>.wal`` from a path that ends with one (else ``name``)."""
    parts = name.rsplit("/", 2)
    return "/".join(parts[-2:]) if len(parts) >= 2 else name


_WHAT_TO_GIVE = (
    f"give a segment object (*{SUFFIX}) or a partition directory, e.g. <log.dir>/events/0, "
    f"a WAL object (*{WAL_SUFFIX}) or a broker's {WAL_PREFIX} directory"
)


def _objects(url: str) -> tuple[Storage, list[str]]:
    """The storage to read from and the objects in it that ``url`` names."""
    parent, _, name = url.rstrip("/").rpartition("/")
    container = Storage.from_url(parent or ".")
    if url.endswith(SUFFIX):
        if not container.exists(name):
            raise ConfigError(f"{url}: no such segment object; {_WHAT_TO_GIVE}")
        return container, [name]
    if url.endswith(WAL_SUFFIX):
        if not container.exists(name):
            raise ConfigError(f"{url}: no such WAL object; {_WHAT_TO_GIVE}")
        # the level directory too, so the name can be checked against the header
        level_dir, _, _ = (parent or ".").rpartition("/")
        level = (parent or ".").rpartition("/")[2]
        if parse_object_name(f"{level}/{name}") is not None and level_dir:
            return Storage.from_url(level_dir), [f"{level}/{name}"]
        return container, [name]
    storage = Storage.from_url(url)
    listed = storage.list()
    names = [i.path for i in listed if i.path.endswith(SUFFIX)]
    if names:
        return storage, names
    wal = sorted(
        (
            (parsed.min_seq, parsed.max_seq, parsed.level, i.path)
            for i in listed
            if (parsed := parse_object_name(i.path)) is not None
        ),
    )
    if wal:
        return storage, [path for *_, path in wal]
    if name and container.exists(name):
        raise ConfigError(f"{url} is not a segment object; {_WHAT_TO_GIVE}")
    if listed:
        raise ConfigError(
            f"{url} holds no segment objects (*{SUFFIX}) nor WAL objects; {_WHAT_TO_GIVE}"
        )
    raise ConfigError(f"{url}: no such path; {_WHAT_TO_GIVE}")


def _show(value: bytes | None) -> str:
    if value is None:
        return "null"
    try:
        return value.decode()
    except UnicodeDecodeError:
        return value.hex()
