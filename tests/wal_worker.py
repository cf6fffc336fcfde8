"""A WAL writer as a process, for SIGKILL tests (tests/test_wal_recovery.py)::

    python -m tests.wal_worker --url DIR --epoch E --seed S [--fault none|stall|tear]

It recovers its partitions from the broker root's WAL
(:class:`~logstore.wal_index.WalIndex`), then appends batches to ``--partitions`` partitions
through one :class:`~logstore.wal.WalWriter` (completions on its asyncio loop) until it is
killed. Record values are ``"<p>:<offset>"``, so the parent can check every recovered record.
It prints, flushed, one line per event:

- ``READY <json {partition: end}>`` once recovered;
- ``D <partition> <end>`` after the writer reported ``[.., end)`` durable (``wal_flushed``):
  the parent's "acknowledged" offsets;
- with ``--fault stall``: after ``--fault-after`` flushes every further WAL write stalls for an
  hour: ``ARMED``, then ``WRITING <path>`` as the stalled write begins;
- with ``--fault tear``: the next write stores a random prefix of the object and fails, then
  its retries stall: ``ARMED``, then ``FAILED <path>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from typing import Any

from logstore.batch import Record, build, iter_batches
from logstore.buffered_source import BufferedSource
from logstore.storage import Data, Storage
from logstore.wal import FlushResult, WalWriter
from logstore.wal_index import WAL_PREFIX, ChunkExtent, WalIndex
from tests.faulty_fs import FaultyStorage

TOPIC = "events"
TOPIC_ID = "5e1f0c3a9b2d4e6f8a7b6c5d4e3f2a1b"


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class AnnouncingStorage(FaultyStorage):
    """Prints ``WRITING <path>`` before each WAL write once :attr:`announce` is set."""

    announce = False

    def write(self, path: str, data: Data) -> None:
        if self.announce and path.startswith(WAL_PREFIX + "/"):
            emit(f"WRITING {path}")
        super().write(path, data)


def recover(storage: Storage, index: WalIndex, partition: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every record the partition's chunks hold contiguously from offset 0,
    read and CRC-checked extent by extent; a covered chunk is skipped, a chunk overlapping the
    end is entered at its batch starting exactly there, and a gap ends the log (the rules
    ``Log.open`` will apply)."""
    out: list[tuple[int, bytes]] = []
    expected = 0
    extents = index.chunks_for(TOPIC_ID, partition)
    while True:
        candidates = [e for e in extents if e.base_offset <= expected < e.next_offset]
        if not candidates:
            return out
        best: ChunkExtent = max(candidates, key=lambda e: (e.next_offset, e.level))
        data = best.read(storage)
        for batch in iter_batches(data, validate=True):
            if batch.next_offset <= expected:
                continue
            if batch.base_offset != expected:
                return out  # no batch starts exactly at the end: a gap
            for record in batch.records():
                assert record.value is not None
                out.append((record.offset, record.value))
            expected = batch.next_offset


def open_storage(url: str, options: dict[str, Any]) -> AnnouncingStorage:
    return AnnouncingStorage(Storage.from_url(url, **options))


async def run(args: argparse.Namespace) -> None:
    storage = open_storage(args.url, json.loads(args.storage_options))
    index = WalIndex.load(storage)
    ends = {p: len(recover(storage, index, p)) for p in range(args.partitions)}
    loop = asyncio.get_running_loop()
    flushed = asyncio.Event()
    flushes = 0

    def on_flushed(result: FlushResult) -> None:
        nonlocal flushes
        flushes += 1
        flushed.set()
        if args.fault != "none" and flushes == args.fault_after:
            if args.fault == "stall":
                storage.announce = True
                storage.stall("write", 3600, path_prefix=WAL_PREFIX + "/")
            else:
                storage.tear(fraction=rng.uniform(0.05, 0.95), path_prefix=WAL_PREFIX + "/")
                storage.stall("write", 3600, path_prefix=WAL_PREFIX + "/")
            emit("ARMED")

    def on_error(err: BaseException) -> None:
        emit(f"FAILED {err}")

    rng = random.Random(args.seed)
    writer = WalWriter(
        storage,
        broker_id=1,
        broker_epoch=args.epoch,
        next_seq=index.next_seq,
        loop=loop,
        on_flushed=on_flushed,
        on_error=on_error,
        index=index,
    )
    sources = []
    for p in range(args.partitions):

        def durable(end: int, p: int = p) -> None:
            emit(f"D {p} {end}")

        sources.append(
            BufferedSource(
                TOPIC, TOPIC_ID, p, next_offset=ends[p], writer=writer, on_durable=durable
            )
        )
    emit("READY " + json.dumps(ends))
    while True:
        for p in rng.sample(range(args.partitions), rng.randint(1, args.partitions)):
            source = sources[p]
            end = source.log_end_offset
            count = rng.randint(1, 4)
            records = [Record(None, f"{p}:{o}".encode(), 1000 + o) for o in range(end, end + count)]
            source.append(build(records, base_offset=end, partition_leader_epoch=args.epoch))
        # bounded memory: wait for the writer when it falls behind
        while max(s.log_end_offset - s.durable_end_offset for s in sources) > 40:
            flushed.clear()
            await flushed.wait()
        await asyncio.sleep(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--storage-options", default="{}", help="JSON, for Storage.from_url")
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--fault", choices=["none", "stall", "tear"], default="none")
    parser.add_argument("--fault-after", type=int, default=5, help="flushes before the fault")
    args = parser.parse_args(argv)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
