"""``replog log dump``: describe the batches of a segment object or a partition directory.

As kafka-dump-log.sh: one line per batch with its offsets, leader epoch, producer fields,
record count, timestamps and whether its CRC is valid; ``records=True`` adds the records.
A torn or corrupt stretch is reported with its byte position and the walk stops there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from logstore.batch import RecordBatch, parse_header
from logstore.errors import ConfigError, CorruptRecordError
from logstore.segment import SUFFIX
from logstore.storage import Storage


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


def dump_object(data: bytes, *, records: bool = False) -> Iterator[DumpLine]:
    position = 0
    while position < len(data):
        try:
            batch = parse_header(data, position)
        except CorruptRecordError as err:
            yield DumpLine(f"corrupt at byte {position}: {err}", error=True)
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
    """Dump one ``.seg`` object, or every segment object under a partition directory.

    A path that is missing, an object that is not a segment (``checkpoint.json``, say) and a
    directory without segment objects raise :class:`ConfigError` naming what to give instead.
    """
    storage, names = _segments(url)
    for name in names:
        yield DumpLine(f"Dumping {storage.url.rstrip('/')}/{name}")
        yield from dump_object(storage.read(name), records=records)


_WHAT_TO_GIVE = (
    f"give a segment object (*{SUFFIX}) or a partition directory, e.g. <log.dir>/events/0"
)


def _segments(url: str) -> tuple[Storage, list[str]]:
    """The storage to read from and the segment objects in it that ``url`` names."""
    parent, _, name = url.rstrip("/").rpartition("/")
    container = Storage.from_url(parent or ".")
    if url.endswith(SUFFIX):
        if not container.exists(name):
            raise ConfigError(f"{url}: no such segment object; {_WHAT_TO_GIVE}")
        return container, [name]
    storage = Storage.from_url(url)
    names = [i.path for i in storage.list() if i.path.endswith(SUFFIX)]
    if names:
        return storage, names
    if name and container.exists(name):
        raise ConfigError(f"{url} is not a segment object; {_WHAT_TO_GIVE}")
    if Storage.from_url(url).list():
        raise ConfigError(f"{url} holds no segment objects (*{SUFFIX}); {_WHAT_TO_GIVE}")
    raise ConfigError(f"{url}: no such path; {_WHAT_TO_GIVE}")


def _show(value: bytes | None) -> str:
    if value is None:
        return "null"
    try:
        return value.decode()
    except UnicodeDecodeError:
        return value.hex()
