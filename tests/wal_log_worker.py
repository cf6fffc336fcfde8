"""Partition logs over one WalWriter as a process, for SIGKILL tests (tests/test_wal_log.py)::

    python -m tests.wal_log_worker --url DIR --epoch E --seed S
        [--fault none|stall|stall-checkpoint|stall-l1] [--fault-after N] [--compact]

It loads the broker root's WAL index and opens ``--partitions`` :class:`~logstore.log.Log`\\ s
over it (the wiring the broker will do), then appends to random partitions and now and then
truncates one (as a follower does after a divergence) until it is killed. Record values are
``"<p>:<offset>:<gen>"``; ``gen`` grows with every truncation (and starts at
``epoch * 1,000,000`` in each incarnation), so the parent can tell the data a truncation
disowned from what replaced it. It prints, flushed, one line per event, from one thread:

- ``READY <json {partition: log end}>`` once recovered;
- ``D <partition> <end>`` when the log's durable end moved to ``end`` (its batches are in a
  written WAL object): the parent's "acknowledged" offsets;
- ``TRUNCATING <partition> <end>`` before a truncation to the batch boundary ``end`` (from
  then on, offsets from ``end`` may be gone), and ``T <partition> <end> <gen>`` after
  ``truncate_to`` returned (the truncation record is in the partition checkpoint): offsets
  from ``end`` on hold generation ``gen`` or later;
- with ``--fault stall``: after ``--fault-after`` WAL objects every further WAL write stalls
  for an hour: ``ARMED``, then ``WRITING <path>`` as the stalled write begins;
- with ``--fault stall-checkpoint``: after ``--fault-after`` objects, the next truncation's
  checkpoint write stalls (the cut is made in memory, the record not yet written):
  ``ARMED``, then ``WRITING <path>``.

With ``--compact`` a thread compacts the L0 objects into packed L1 objects round after round
(the logs are its holders; unreferenced objects are deleted at once), racing the appends,
flushes and truncations; ``--fault stall-l1`` stalls its writes once ``--fault-after`` WAL
objects and one packed object were written (so every incarnation wrote one, however slow its
compactor): ``ARMED``, then ``WRITING <path>`` as a packed object's write begins.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading

from logstore.batch import Record, build
from logstore.checkpoint import CHECKPOINT_NAME
from logstore.compaction import Compactor, HolderTable
from logstore.config import LogConfig
from logstore.log import Log
from logstore.storage import Data, Storage
from logstore.wal import FlushResult, WalWriter
from logstore.wal_index import WAL_PREFIX, WalIndex
from tests.faulty_fs import FaultyStorage, _Plan

TOPIC = "events"
TOPIC_ID = "6f2a1b3c4d5e4f60a1b2c3d4e5f60718"
GEN_PER_EPOCH = 1_000_000

_emit_lock = threading.Lock()


def emit(line: str) -> None:
    with _emit_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class AnnouncingStorage(FaultyStorage):
    """Prints ``WRITING <path>`` before each write under a watched prefix (shared with its
    children, which the logs use)."""

    def __init__(
        self,
        inner: Storage,
        *,
        _plan: _Plan | None = None,
        _base: str = "",
        _watch: list[str] | None = None,
    ) -> None:
        super().__init__(inner, _plan=_plan, _base=_base)
        self.watch = _watch if _watch is not None else []

    def write(self, path: str, data: Data) -> None:
        full = f"{self._base}/{path}" if self._base else path
        if any(full.startswith(prefix) for prefix in self.watch):
            emit(f"WRITING {full}")
        super().write(path, data)

    def child(self, prefix: str) -> AnnouncingStorage:
        base = f"{self._base}/{prefix}" if self._base else prefix
        return AnnouncingStorage(
            self.inner.child(prefix), _plan=self._plan, _base=base, _watch=self.watch
        )


def value_of(partition: int, offset: int, gen: int) -> bytes:
    return f"{partition}:{offset}:{gen}".encode()


def run(args: argparse.Namespace) -> None:
    storage = AnnouncingStorage(Storage.from_url(args.url, **json.loads(args.storage_options)))
    index = WalIndex.load(storage)
    flushes = 0
    armed = threading.Event()
    l1_armed = threading.Event()

    def on_flushed(result: FlushResult) -> None:
        nonlocal flushes
        flushes += 1
        if args.fault == "stall" and flushes == args.fault_after:
            storage.watch.append(WAL_PREFIX + "/")
            storage.stall("write", 3600, path_prefix=WAL_PREFIX + "/")
            emit("ARMED")
        elif args.fault == "stall-checkpoint" and flushes == args.fault_after:
            armed.set()
            emit("ARMED")
        elif (
            args.fault == "stall-l1"
            and flushes >= args.fault_after
            and not l1_armed.is_set()
            and any(obj.name.level == 1 for obj in index.objects())
        ):
            l1_armed.set()  # once a packed object exists: each incarnation leaves one behind
            storage.watch.append(WAL_PREFIX + "/L1/")
            storage.stall("write", 3600, path_prefix=WAL_PREFIX + "/L1/")
            emit("ARMED")

    writer = WalWriter(
        storage,
        broker_id=1,
        broker_epoch=args.epoch,
        next_seq=index.next_seq,
        index=index,
        on_flushed=on_flushed,
    )
    config = LogConfig()
    logs = [
        Log.open(
            storage.child(f"{TOPIC}/{p}"),
            config,
            topic_id=TOPIC_ID,
            topic=TOPIC,
            partition=p,
            wal_writer=writer,
            wal_index=index,
        )
        for p in range(args.partitions)
    ]
    printed = [log.durable_end_offset for log in logs]
    if args.compact:
        holders = HolderTable()
        for p, log in enumerate(logs):
            holders.register(TOPIC_ID, p, log)
        compactor = Compactor(
            storage, index, holders, broker_id=1, broker_epoch=args.epoch, delete_delay_ms=0
        )

        def compact_forever() -> None:
            pace = threading.Event()
            while True:
                compactor.compact()
                pace.wait(0.02)  # pacing, not synchronisation: rounds of a few objects

        threading.Thread(target=compact_forever, name="compactor", daemon=True).start()
    emit("READY " + json.dumps({p: log.log_end_offset for p, log in enumerate(logs)}))
    rng = random.Random(args.seed)
    gen = args.epoch * GEN_PER_EPOCH
    # batch boundaries this incarnation appended (truncations cut at one of them, so the
    # parent knows where a truncation it was told of lands even if the worker dies in it)
    bases: list[list[int]] = [[] for _ in logs]
    while True:
        for p in rng.sample(range(args.partitions), rng.randint(1, args.partitions)):
            log = logs[p]
            end = log.log_end_offset
            count = rng.randint(1, 3)
            records = [Record(None, value_of(p, o, gen), 1000 + o) for o in range(end, end + count)]
            log.append(build(records), leader_epoch=args.epoch)
            bases[p].append(end)
        if rng.random() < 0.1:
            p = rng.randrange(args.partitions)
            log = logs[p]
            low = max(log.log_start_offset, log.log_end_offset - 6)
            choices = [b for b in bases[p] if b >= low] + [log.log_end_offset]
            cut = rng.choice(choices)
            bases[p] = [b for b in bases[p] if b < cut]
            emit(f"TRUNCATING {p} {cut}")
            if armed.is_set():
                armed.clear()
                prefix = f"{TOPIC}/{p}/{CHECKPOINT_NAME}"
                storage.watch.append(prefix)
                storage.stall("write", 3600, path_prefix=prefix)
            end = log.truncate_to(cut)
            gen += 1
            printed[p] = min(printed[p], log.durable_end_offset)
            emit(f"T {p} {end} {gen}")
        for p, log in enumerate(logs):
            durable = log.durable_end_offset
            if durable > printed[p]:
                printed[p] = durable
                emit(f"D {p} {durable}")
        # bounded memory: wait for the writer when it falls behind
        if max(log.log_end_offset - log.durable_end_offset for log in logs) > 60:
            writer.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--storage-options", default="{}", help="JSON, for Storage.from_url")
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument(
        "--fault", choices=["none", "stall", "stall-checkpoint", "stall-l1"], default="none"
    )
    parser.add_argument("--compact", action="store_true", help="compact L0 objects meanwhile")
    parser.add_argument("--fault-after", type=int, default=5, help="objects before the fault")
    args = parser.parse_args(argv)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
