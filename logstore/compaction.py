"""WAL compaction, first level: many small L0 WAL objects into one packed L1 object, and the
garbage collection of objects nobody refers to (docs/storage.md §2.8).

Why: a broker writes one L0 object per flush (:mod:`logstore.wal`), so a partition's data is
spread over many small objects, each holding a little of every partition. Keeping them costs
a GET per object per reader and a footer read per object at every recovery. Compaction takes
the live chunks of a set of L0 objects (from the logs' tail caches where they still are, else
reading an object whole: one GET each, every byte read once) and writes them as **one** packed
object (one PUT), one chunk per partition, whatever the partition count: its request count
depends on the bytes and the object count, never on the partitions.

Data is never rewritten to be made durable, only to be made cheap, so every step leaves a
state that recovery reads correctly (§2.6, §2.8):

1. the packed object is written (``_replog/wal/L1/<max_seq>-<min_seq>-<broker_epoch>.wal``);
   a crash before or during that write leaves the sources as they were (a write is atomic;
   a torn one, under a faulty store only, is scanned to its valid prefix and its sources
   cover the rest);
2. each partition's holder (``Log.replace_extents``) swaps its chunk extents in the sources
   for the new chunk, only if they are still its live extents (a truncation or retention
   meanwhile wins and the new chunk is simply unreferenced). A crash after step 1 leaves two
   copies of the same batches: the packed chunk and its sources' chunks hold identical bytes,
   and recovery takes one and skips the other as covered (never conflicting data: the
   compactor copies the live extents' bytes as they are);
3. objects with no reference left are deleted, ``delete_delay_ms`` after they became
   unreferenced (readers and Spark plans that still hold them keep working, as with
   ``file.delete.delay.ms`` for segment objects). A crash during the deletes leaves some of
   them: their chunks are covered duplicates.

The compactor copies only the extents the holders say are live (:class:`ExtentHolder`), so
data that a truncation voided is never carried into a packed object. Each output chunk has
``first_seq`` = the minimum and ``last_seq`` = the maximum of the chunks it replaces (the
truncation rule of §2.7 compares them with a truncation record's seq).

**Fences are kept.** The zombie rule (:mod:`logstore.wal_index`) fences an older broker epoch's
objects by the smallest L0 seq each newer epoch wrote. Deleting that object would unfence a
paused old incarnation's late writes, so the lowest-seq L0 object of each broker epoch (usually
the writer's empty fence object, 164 bytes per broker start) is never deleted here.

Not here yet (they need ``Log`` hooks, see docs/storage.md §2.8): per-partition segment outputs
(``<topic>/<p>/<base>.seg`` plus the partition checkpoint and producer snapshot), Ln -> Ln+1
rounds by partition group, grouping by retention class, and deleting zombie objects.

**A superseded compactor deletes nothing.** Before deleting, one LIST of the L0 level checks
that no newer broker epoch has written to the root; if one has, this incarnation is a zombie
whose deletes could remove objects its successor's index relies on (the successor listed the
root before this round's output existed). This narrows the window; closing it would need a
lease (or conditional deletes) on the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from logstore.batch import iter_batches
from logstore.errors import CorruptRecordError
from logstore.storage import Storage
from logstore.wal_format import (
    ChunkInput,
    WalObjectIndex,
    encode_object,
    object_name,
    parse_object_name,
)
from logstore.wal_index import WAL_PREFIX, ChunkExtent, WalIndex, WalObject

__all__ = ["CompactionResult", "Compactor", "ExtentHolder", "HolderTable", "fences", "round_phase"]

log = logging.getLogger(__name__)


class ExtentHolder(Protocol):
    """What owns a partition's extents (``Log`` in the broker; a table in tests and tools)."""

    def live_chunks(self, topic_id: str, partition: int) -> Sequence[ChunkExtent]:
        """The partition's live chunk extents in offset order (none: empty). Each holds one
        reference on its object in the :class:`~logstore.wal_index.WalIndex`."""

    def replace_extents(self, old: Sequence[ChunkExtent], new: ChunkExtent) -> bool:
        """Swap ``old`` (adjacent live extents) for ``new`` (the same batches, elsewhere),
        atomically, only if ``old`` are still live; False if anything changed meanwhile.
        The compactor moves the references."""

    def cached_chunk(self, extent: ChunkExtent) -> bytes | None:
        """The extent's bytes if the holder keeps them in memory, checked when they were
        appended (whole CRC-valid batches); None: the compactor reads the object."""


class HolderTable:
    """One :class:`ExtentHolder` for a broker's partitions: routes each call to the holder of
    the partition (its ``Log``), registered when the partition opens. A partition without a
    holder has no live chunks (and refuses every swap)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders: dict[tuple[str, int], ExtentHolder] = {}

    def register(self, topic_id: str, partition: int, holder: ExtentHolder) -> None:
        with self._lock:
            self._holders[(topic_id, partition)] = holder

    def unregister(self, topic_id: str, partition: int) -> None:
        with self._lock:
            self._holders.pop((topic_id, partition), None)

    def _get(self, topic_id: str, partition: int) -> ExtentHolder | None:
        with self._lock:
            return self._holders.get((topic_id, partition))

    def live_chunks(self, topic_id: str, partition: int) -> Sequence[ChunkExtent]:
        holder = self._get(topic_id, partition)
        return holder.live_chunks(topic_id, partition) if holder is not None else ()

    def replace_extents(self, old: Sequence[ChunkExtent], new: ChunkExtent) -> bool:
        holder = self._get(new.topic_id, new.partition)
        return holder is not None and holder.replace_extents(old, new)

    def cached_chunk(self, extent: ChunkExtent) -> bytes | None:
        holder = self._get(extent.topic_id, extent.partition)
        return holder.cached_chunk(extent) if holder is not None else None


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """One round: what was read, written, switched and deleted."""

    #: the packed object written (None: no live chunk in the sources, nothing written)
    output: str | None
    index: WalObjectIndex | None
    sources: tuple[str, ...]
    #: per partition: the live extents replaced, and the chunk replacing them
    switched: tuple[tuple[tuple[ChunkExtent, ...], ChunkExtent], ...]
    #: per partition whose holder refused the swap (it changed meanwhile): the new chunk,
    #: left unreferenced
    refused: tuple[ChunkExtent, ...]
    #: objects deleted by the garbage collection that ended the round
    deleted: tuple[str, ...]
    #: the sources read from the store (the others' live chunks were all in the holders'
    #: memory, or they had none)
    read: tuple[str, ...] = ()


def fences(objects: Iterable[WalObject]) -> set[str]:
    """The lowest-seq L0 object of each broker epoch: what the zombie rule fences by."""
    lowest: dict[int, WalObject] = {}
    for obj in objects:
        if obj.name.level != 0:
            continue
        held = lowest.get(obj.name.broker_epoch)
        if held is None or obj.name.max_seq < held.name.max_seq:
            lowest[obj.name.broker_epoch] = obj
    return {obj.path for obj in lowest.values()}


class Compactor:
    """Compacts L0 objects of one broker root into packed L1 objects and deletes objects
    nobody refers to (see the module doc). Run it only after every partition of the broker
    was opened (before that, a partition not yet open makes its chunks look unreferenced).

    Parameters
    ----------
    storage
        The broker root.
    index
        The root's :class:`~logstore.wal_index.WalIndex`, whose reference counts the holders keep.
    holder
        The partitions' extents (:class:`ExtentHolder`).
    broker_id, broker_epoch
        Written in every output (the epoch also in its name: two incarnations never write the
        same name).
    delete_delay_ms
        How long an unreferenced object stays before it is deleted (``file.delete.delay.ms``).
    clock
        Seconds, monotonic (tests give their own).
    phase
        In [0, 1): the bytes trigger comes at ``(1 + phase) * window_bytes`` of live L0 bytes,
        and a round takes the oldest ``window_bytes`` (the rest waits), so this broker's
        rounds come at ``phase`` of a window, in bytes ingested, after those of a broker with
        phase 0, and stay there: its live bytes run between ``phase`` and ``1 + phase``
        windows. Brokers pass :func:`round_phase` of their id: replicas of a partition
        receive the same bytes, so without it their windows fill together and they compact at
        the same moment. (A phase that only brought the first round forward did not last:
        once a backlog had been compacted away, every broker was left with the same live
        bytes below one window, and their rounds coincided again.)
    """

    def __init__(
        self,
        storage: Storage,
        index: WalIndex,
        holder: ExtentHolder,
        *,
        broker_id: int,
        broker_epoch: int,
        delete_delay_ms: float = 60_000.0,
        clock: Callable[[], float] = time.monotonic,
        phase: float = 0.0,
    ) -> None:
        if delete_delay_ms < 0:
            raise ValueError(f"delete_delay_ms must be >= 0, not {delete_delay_ms}")
        if not 0 <= phase < 1:
            raise ValueError(f"phase must be in [0, 1), not {phase}")
        #: the fraction of a window this broker's bytes trigger comes after a whole window
        self._phase = phase
        self.storage = storage
        self.index = index
        self.holder = holder
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self._delay_s = delete_delay_ms / 1000
        self._clock = clock
        #: L0 object path -> ``clock()`` when :meth:`next_round` first saw it live: its age by
        #: the monotonic clock, so a step back of the wall clock (which its created_ms is in)
        #: does not hold a round back for as long as the step
        self._first_seen: dict[str, float] = {}
        self._lock = threading.Lock()  # one round or collection at a time
        self._due: dict[str, float] = {}  # unreferenced object -> when it may go
        #: a newer broker epoch wrote to the root: this compactor no longer deletes
        self.superseded = False

    # --- choosing -------------------------------------------------------------------------------

    def l0_sources(self, *, max_bytes: int | None = None) -> list[str]:
        """L0 objects holding live chunks, oldest first (up to ``max_bytes`` of them, at least
        one): what the next round would compact. Fence objects (no chunks) and objects no
        holder refers to (compacted already, waiting for their delete) are left."""
        return [obj.path for obj in self._l0_live(max_bytes)]

    def _l0_live(self, max_bytes: int | None = None) -> list[WalObject]:
        chosen: list[WalObject] = []
        total = 0
        for obj in self.index.l0_live():  # by seq
            if max_bytes is not None and chosen and total + obj.index.object_size > max_bytes:
                break
            chosen.append(obj)
            total += obj.index.object_size
        return chosen

    def bytes_due(self, window_bytes: int = 64 * 1024 * 1024) -> bool:
        """Whether the live L0 objects hold enough bytes for :meth:`next_round`'s bytes
        trigger (this broker's phase included), read from the index's running tally: the
        compaction loop asks this at every check, and asks :meth:`next_round` (which sorts
        every live L0 object) only when a round may be due."""
        return self.index.l0_live_bytes() >= window_bytes * (1 + self._phase)

    def due_sources(
        self,
        *,
        window_bytes: int = 64 * 1024 * 1024,
        max_age_ms: float = 60_000.0,
        now_ms: float | None = None,
    ) -> list[str]:
        """The L0 objects to compact now (empty: wait): the oldest ones holding up to
        ``window_bytes`` (``wal.compaction.window.bytes``) once the live L0 objects hold at
        least that much (and this broker's phase of a window more), or once the oldest of
        them is ``max_age_ms`` old (``wal.compaction.l0.max.age.ms``; its age from the
        footer's ``created_ms``, so a scanned object, which has none, counts as old). Two
        triggers: the bytes bound the memory of a round and make busy brokers write big packed
        objects; the age bounds how many small objects an idle or slow broker keeps (each
        costs a GET per reader and a footer read per recovery)."""
        return self.next_round(window_bytes=window_bytes, max_age_ms=max_age_ms, now_ms=now_ms)[0]

    def next_round(
        self,
        *,
        window_bytes: int = 64 * 1024 * 1024,
        max_age_ms: float = 60_000.0,
        now_ms: float | None = None,
    ) -> tuple[list[str], float | None]:
        """:meth:`due_sources`, and when the next round falls due if none is now: the seconds
        until the oldest live L0 object is ``max_age_ms`` old (None: no live L0 object; 0: a
        round is due). An object's age is the older of its created_ms's (the wall clock) and
        how long this compactor has seen it live (the monotonic clock). Unless more is
        written meanwhile (the bytes trigger), nothing changes before then, so a broker idle
        after traffic can sleep that long instead of checking."""
        candidates = self._l0_live()
        if not candidates:
            return [], None
        total = sum(obj.index.object_size for obj in candidates)
        now = time.time() * 1000 if now_ms is None else now_ms
        seen_now = self._clock()
        first_seen = {o.path: self._first_seen.get(o.path, seen_now) for o in candidates}
        self._first_seen = first_seen
        age = max(
            max(now - o.index.created_ms, (seen_now - first_seen[o.path]) * 1000)
            for o in candidates
        )
        if age < max_age_ms and total < window_bytes * (1 + self._phase):
            return [], (max_age_ms - age) / 1000
        chosen: list[str] = []
        size = 0
        for obj in candidates:  # the oldest, up to window_bytes (at least one)
            if chosen and size + obj.index.object_size > window_bytes:
                break
            chosen.append(obj.path)
            size += obj.index.object_size
        return chosen, 0.0

    # --- one round ------------------------------------------------------------------------------

    def compact(self, sources: Sequence[str] | None = None) -> CompactionResult:
        """Compact ``sources`` (L0 object paths; default :meth:`l0_sources`) into one packed L1
        object, switch the holders' extents to it, then collect garbage. Storage errors
        propagate (nothing was switched unless the output was written; run again later)."""
        with self._lock:
            return self._compact(list(sources) if sources is not None else self.l0_sources())

    def _compact(self, sources: list[str]) -> CompactionResult:
        objects = {obj.path: obj for obj in self.index.objects()}
        for path in sources:
            obj = objects.get(path)
            if obj is None:
                raise ValueError(f"{path} is not a live object of the WAL index")
            if obj.name.level != 0:
                raise ValueError(f"{path} is a level-{obj.name.level} object, not level 0")
        chosen = sorted(set(sources), key=lambda p: objects[p].name.max_seq)
        if not chosen:
            return CompactionResult(None, None, (), (), (), self._collect())
        data: dict[str, bytes] = {}  # the sources read so far (one GET each, when needed)
        runs = self._live_runs(chosen, objects, data)
        if not runs:
            return CompactionResult(None, None, tuple(chosen), (), (), self._collect(), tuple(data))
        inputs = [self._chunk_input(run, pieces, objects) for run, pieces in runs]
        min_seq = min(objects[p].index.min_seq for p in chosen)
        max_seq = max(objects[p].index.max_seq for p in chosen)
        body, out_index = encode_object(
            inputs,
            seq=max_seq,
            min_seq=min_seq,
            level=1,
            broker_id=self.broker_id,
            broker_epoch=self.broker_epoch,
            pause=_yield_gil,
        )
        path = f"{WAL_PREFIX}/{object_name(max_seq, self.broker_epoch, level=1, min_seq=min_seq)}"
        if path in objects:
            raise ValueError(f"{path} exists already: these sources were compacted before")
        self.storage.write(path, body)  # one PUT; only now may anything refer to it
        self.index.add_object(path, out_index)
        by_key = {(c.topic_id, c.partition): c for c in out_index.chunks}
        switched = []
        refused = []
        for run, _ in runs:
            chunk = by_key[(run[0].topic_id, run[0].partition)]
            new = ChunkExtent.of(path, 1, chunk)
            # Take the reference before the swap: a reader that sees the new extent must
            # never find the object unreferenced.
            self.index.acquire(path)
            if self.holder.replace_extents(run, new):
                for old in run:
                    self.index.release(old.object)
                switched.append((tuple(run), new))
            else:
                self.index.release(path)
                refused.append(new)
        log.info(
            "%s: compacted %d L0 object(s) into %s (%d chunk(s), %d bytes; %d refused)",
            self.storage.url,
            len(chosen),
            path,
            len(switched),
            len(body),
            len(refused),
        )
        return CompactionResult(
            path,
            out_index,
            tuple(chosen),
            tuple(switched),
            tuple(refused),
            self._collect(),
            tuple(data),
        )

    def _live_runs(
        self, chosen: list[str], objects: dict[str, WalObject], data: dict[str, bytes]
    ) -> list[tuple[list[ChunkExtent], list[bytes | memoryview]]]:
        """Per partition with live chunks in ``chosen``: its first run of adjacent live
        extents that all lie in ``chosen`` (a live extent elsewhere in between ends the run;
        the rest waits for a later round), with each extent's bytes. Extents whose bytes are
        not whole CRC-valid batches are left where they are (reported: reading them fails
        too). Sources are read into ``data`` only for extents the holders do not cache."""
        wanted = set(chosen)
        keys = sorted({(c.topic_id, c.partition) for p in chosen for c in objects[p].index.chunks})
        runs = []
        for topic_id, partition in keys:
            run: list[ChunkExtent] = []
            pieces: list[bytes | memoryview] = []
            for extent in self.holder.live_chunks(topic_id, partition):
                if extent.object in wanted and (
                    not run or extent.base_offset == run[-1].next_offset
                ):
                    piece = self._bytes_of(extent, data)
                    if piece is None:
                        break
                    run.append(extent)
                    pieces.append(piece)
                elif run:
                    break
            if run:
                runs.append((run, pieces))
        return runs

    def _bytes_of(self, extent: ChunkExtent, data: dict[str, bytes]) -> bytes | memoryview | None:
        """The extent's bytes: the holder's cached copy, else read from its object (read
        whole, once per round, and checked); None if they are damaged.

        Why the cache first: the live chunks of recent L0 objects are mostly still in their
        logs' tail caches, and reading them again is a GET each on S3 and, on local files,
        a read from the disk (the journal keeps nothing in the page cache). A cached copy is
        the bytes that went into the object (a cache key names its object, position and
        size), checked when they were appended."""
        cached = self.holder.cached_chunk(extent)
        if cached is not None and len(cached) == extent.size:
            return cached
        source = data.get(extent.object)
        if source is None:
            source = data[extent.object] = self.storage.read(extent.object)  # one GET
            _yield_gil()
        if not self._whole(extent, source):
            return None
        return memoryview(source)[extent.position : extent.position + extent.size]

    def _whole(self, extent: ChunkExtent, data: bytes) -> bool:
        why = _damage(extent, data)
        _yield_gil()
        if why is not None:
            log.error(
                "%s/%s: not compacting the chunk of partition %s [%d, %d): %s",
                self.storage.url,
                extent.object,
                extent.partition,
                extent.base_offset,
                extent.next_offset,
                why,
            )
        return why is None

    def _chunk_input(
        self,
        run: list[ChunkExtent],
        pieces: list[bytes | memoryview],
        objects: dict[str, WalObject],
    ) -> ChunkInput:
        first = run[0]
        # the footer's topic name (a scanned object knows only the id)
        topic = next(
            (
                c.topic
                for e in run
                for c in objects[e.object].index.chunks
                if c.topic and c.topic_id == first.topic_id and c.partition == first.partition
            ),
            "",
        )
        return ChunkInput(
            topic,
            first.topic_id,
            first.partition,
            pieces,  # the live bytes, as they are
            first_seq=min(e.first_seq for e in run),
            last_seq=max(e.last_seq for e in run),
            base_offset=first.base_offset,
            next_offset=run[-1].next_offset,
        )

    # --- garbage collection -----------------------------------------------------------------

    def _superseded(self) -> bool:
        """True if a newer broker epoch has written to this root (one LIST of the L0 level):
        this incarnation is a zombie (paused, then resumed after its successor started) and
        must not delete anything, since the successor's index, loaded before this round's
        output existed, may rely on the objects it would delete. Narrows the window to the
        time between this LIST and the deletes; it does not close it (that needs a lease)."""
        newer = [
            info.path
            for info in self.storage.list(f"{WAL_PREFIX}/L0")
            if (name := parse_object_name(info.path[len(WAL_PREFIX) + 1 :])) is not None
            and name.broker_epoch > self.broker_epoch
        ]
        if newer:
            log.error(
                "%s: broker epoch %d is superseded (%s was written by a newer one): this "
                "compactor deletes nothing",
                self.storage.url,
                self.broker_epoch,
                newer[0],
            )
            self.superseded = True
        return bool(newer)

    def collect_garbage(self) -> list[str]:
        """Delete the objects unreferenced for ``delete_delay_ms`` (fences and the newest
        object excepted); the paths deleted. Call it periodically; :meth:`compact` calls it
        after each round."""
        with self._lock:
            return list(self._collect())

    def _collect(self) -> tuple[str, ...]:
        now = self._clock()
        objects = self.index.objects()
        keep = fences(objects)
        if objects:
            # The newest object stays, whatever it holds: the next incarnation takes its
            # seqs from the objects it lists (WalIndex.load), and checkpoints name seqs
            # (wal_start_seq, truncation records) up to the newest one written. Were it
            # deleted, seqs would be reused and new chunks voided as if written before.
            # (A packed object carries its sources' max seq in its name: among equals the
            # highest level stays, so its compacted sources may go.)
            keep.add(max(objects, key=lambda o: (o.name.max_seq, o.name.level)).path)
        unreferenced = set(self.index.unreferenced()) - keep
        for path in list(self._due):
            if path not in unreferenced:
                del self._due[path]  # referenced again (or gone): start over if it returns
        for path in unreferenced:
            self._due.setdefault(path, now + self._delay_s)
        due = sorted(p for p, when in self._due.items() if when <= now)
        if due and self._superseded():
            return ()
        for path in due:
            del self._due[path]
        # Out of the index first, atomically with the check: nobody can acquire them after
        # (those acquired since the snapshot above stay).
        retired = self.index.retire_many(due)
        failed = self.storage.delete_many(retired)
        for path, err in failed.items():  # it stays on storage; the next load finds it again
            log.warning("%s: deleting %s failed: %s", self.storage.url, path, err)
        deleted = [path for path in retired if path not in failed]
        if deleted:
            log.info("%s: deleted %d unreferenced WAL object(s)", self.storage.url, len(deleted))
        return tuple(deleted)


def round_phase(broker_id: int) -> float:
    """The :class:`Compactor` phase of a broker: ``broker_id mod 3`` thirds, so that the three
    replicas of a partition on brokers with consecutive ids (the usual numbering, and RF=3 the
    usual factor) run their rounds a third of a window apart. Measured here (3 brokers on one
    2-core machine, acks=all Arrow at 294k records/s after the benchmark's max-rate runs), when
    the phase moved only the first round: p99 47-94 ms over 8 runs with thirds (median 52),
    65-161 ms over 10 without (median 91; the slow batches had been the moments when two
    brokers compacted at once); golden-ratio phases (0, 0.62, 0.24: gaps down to a quarter
    window) 45-94 ms over 7 (median 60)."""
    return (broker_id % 3) / 3


def _yield_gil() -> None:
    """Let other threads take the GIL now. A round is thousands of short steps (a read, a CRC
    walk, a copy) on a background thread; between them the broker's event loop would
    otherwise wait up to the interpreter's switch interval (5 ms) each time it gives the GIL
    up for I/O, and a round's second of work turned into acks=all tails of 100 ms."""
    time.sleep(0)


def _damage(extent: ChunkExtent, data: bytes) -> str | None:
    """Why the extent's bytes are not whole CRC-valid batches with its offsets (None: they
    are)."""
    piece = memoryview(data)[extent.position : extent.position + extent.size]
    end = extent.base_offset
    try:
        for batch in iter_batches(piece, validate=True):
            if batch.base_offset != end:
                return f"batch at offset {batch.base_offset} where {end} was expected"
            end = batch.next_offset
    except CorruptRecordError as err:
        return str(err)
    if len(piece) != extent.size or end != extent.next_offset:
        return f"{len(piece)} of {extent.size} bytes, batches ending at offset {end}"
    return None
