"""What the broker WAL tests share: batches of two topics' partitions and their sources."""

from __future__ import annotations

import uuid

from logstore.batch import Record, build
from logstore.buffered_source import BufferedSource
from logstore.storage import Storage
from logstore.wal import (
    WalWriter,
)
from logstore.wal_index import WAL_PREFIX
from tests.conftest import (
    memory_broker_root,
)

TOPICS = (uuid.UUID(int=1).hex, uuid.UUID(int=2).hex)


def batch(partition: int, base: int, count: int = 2, epoch: int = 0) -> bytes:
    records = [
        Record(None, f"{partition}:{o}".encode(), 1000 + o) for o in range(base, base + count)
    ]
    return build(records, base_offset=base, partition_leader_epoch=epoch)


def append(source: BufferedSource, count: int = 2) -> None:
    source.append(batch(source.partition, source.log_end_offset, count))


def sources_for(writer: WalWriter | None, partitions: int) -> list[BufferedSource]:
    return [
        BufferedSource(f"topic-{t}", topic_id, p, writer=writer)
        for t, topic_id in enumerate(TOPICS)
        for p in range(partitions)
    ]


def wal_objects(storage: Storage) -> list[str]:
    return [info.path for info in storage.list(WAL_PREFIX)]


def memory_root() -> Storage:
    return memory_broker_root("test-wal")
