"""A WAL compactor as a process, for SIGKILL tests (tests/test_compaction.py)::

    python -m tests.compaction_worker --url DIR --epoch E [--fault none|stall-put|tear-put|
        stall-delete] [--deletes-before-stall N]

It loads the broker root's WAL index, opens every partition the way ``Log.open`` will (the
recovery walk of docs/storage.md §2.6 over the chunks, :class:`ExtentTable`, which takes one
reference per live extent), and compacts every L0 object holding chunks into one L1 object,
deleting the sources at once (``delete_delay_ms=0``). It prints, flushed:

- ``READY <n sources>`` once loaded;
- ``WRITING <path>`` as a stalled L1 write begins (``stall-put``: it never ends);
- ``FAILED <path>`` after a torn L1 write (``tear-put``: a random prefix of the object is
  stored, the write fails and the worker waits to be killed);
- ``DELETING <path>`` as a stalled delete begins, after ``--deletes-before-stall`` deletes
  went through (``stall-delete``);
- ``DONE <json>`` after a round that ran to the end.

The parent kills it at the line it waits for, then checks what :class:`ExtentTable` recovers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import threading
import time
from collections.abc import Sequence

from logstore.batch import iter_batches
from logstore.compaction import Compactor
from logstore.errors import StorageError
from logstore.storage import Data, Storage
from logstore.wal_index import WAL_PREFIX, ChunkExtent, WalIndex
from tests.faulty_fs import FaultyStorage


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class ExtentTable:
    """Each partition's live chunk extents, chosen by the recovery walk ``Log.open`` will do
    (the :class:`~logstore.compaction.ExtentHolder` a Log will be): from the lowest offset,
    among the chunks holding the next offset the one reaching furthest (then the higher
    level); a chunk that starts below it is entered at its batch starting exactly there (a
    shorter extent of the same object); a gap ends the partition. One reference per extent."""

    def __init__(self, storage: Storage, index: WalIndex) -> None:
        self.storage = storage
        self.index = index
        self._lock = threading.Lock()
        self.extents: dict[tuple[str, int], list[ChunkExtent]] = {}
        for key in sorted(index.partitions()):
            chosen = self._walk(index.chunks_for(*key))
            for extent in chosen:
                index.acquire(extent.object)
            self.extents[key] = chosen

    def _walk(self, chunks: list[ChunkExtent]) -> list[ChunkExtent]:
        chosen: list[ChunkExtent] = []
        if not chunks:
            return chosen
        expected = min(c.base_offset for c in chunks)
        while True:
            candidates = [c for c in chunks if c.base_offset <= expected < c.next_offset]
            if not candidates:
                return chosen
            best = max(candidates, key=lambda c: (c.next_offset, c.level))
            if best.base_offset < expected:
                entered = self._enter(best, expected)
                if entered is None:
                    return chosen  # no batch starts exactly there: a gap
                best = entered
            chosen.append(best)
            expected = best.next_offset

    def _enter(self, extent: ChunkExtent, offset: int) -> ChunkExtent | None:
        data = extent.read(self.storage)
        position = 0
        for batch in iter_batches(data):
            if batch.base_offset == offset:
                return dataclasses.replace(
                    extent,
                    position=extent.position + position,
                    size=extent.size - position,
                    base_offset=offset,
                )
            position += batch.size_in_bytes
        return None

    # --- ExtentHolder -------------------------------------------------------------------------

    def live_chunks(self, topic_id: str, partition: int) -> Sequence[ChunkExtent]:
        with self._lock:
            return list(self.extents.get((topic_id, partition), ()))

    def cached_chunk(self, extent: ChunkExtent) -> bytes | None:
        return None  # a table of extents: the compactor reads every chunk from its object

    def replace_extents(self, old: Sequence[ChunkExtent], new: ChunkExtent) -> bool:
        key = (new.topic_id, new.partition)
        with self._lock:
            live = self.extents.get(key, [])
            for start in range(len(live) - len(old) + 1):
                if live[start : start + len(old)] == list(old):
                    live[start : start + len(old)] = [new]
                    return True
            return False

    # --- reading ------------------------------------------------------------------------------

    def read(self, topic_id: str, partition: int) -> list[tuple[int, bytes]]:
        """(offset, value) of every record of the partition, extent by extent (CRC-checked)."""
        out: list[tuple[int, bytes]] = []
        for extent in self.live_chunks(topic_id, partition):
            for batch in iter_batches(extent.read(self.storage), validate=True):
                for record in batch.records():
                    assert record.value is not None
                    out.append((record.offset, record.value))
        return out


class KillableStorage(FaultyStorage):
    """Announces L1 writes and stalls deletes after a number of them went through."""

    announce_writes = False
    deletes_before_stall: int | None = None

    def write(self, path: str, data: Data) -> None:
        if self.announce_writes and path.startswith(f"{WAL_PREFIX}/L1/"):
            emit(f"WRITING {path}")
        super().write(path, data)

    def delete(self, path: str) -> None:
        if self.deletes_before_stall is not None:
            if self.deletes_before_stall == 0:
                emit(f"DELETING {path}")
                time.sleep(3600)
            self.deletes_before_stall -= 1
        super().delete(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--storage-options", default="{}", help="JSON, for Storage.from_url")
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fault", choices=["none", "stall-put", "tear-put", "stall-delete"], default="none"
    )
    parser.add_argument("--deletes-before-stall", type=int, default=0)
    args = parser.parse_args(argv)
    storage = KillableStorage(Storage.from_url(args.url, **json.loads(args.storage_options)))
    index = WalIndex.load(storage)
    table = ExtentTable(storage, index)
    compactor = Compactor(
        storage, index, table, broker_id=1, broker_epoch=args.epoch, delete_delay_ms=0
    )
    sources = compactor.l0_sources()
    emit(f"READY {len(sources)}")
    l1 = f"{WAL_PREFIX}/L1/"
    if args.fault == "stall-put":
        storage.announce_writes = True
        storage.stall("write", 3600, path_prefix=l1)
    elif args.fault == "tear-put":
        storage.tear(fraction=random.Random(args.seed).uniform(0.05, 0.95), path_prefix=l1)
    elif args.fault == "stall-delete":
        storage.deletes_before_stall = args.deletes_before_stall
    try:
        result = compactor.compact(sources)
    except StorageError as err:
        emit(f"FAILED {err}")
        time.sleep(3600)
        return 1
    emit("DONE " + json.dumps({"output": result.output, "deleted": list(result.deleted)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
