"""What a broker root's WAL holds: its live objects, each partition's chunks in them, and who
refers to them (:class:`WalIndex`), rebuilt at start from storage.

Every object under ``_replog/wal/`` is an L0 object the writer (:mod:`logstore.wal`) wrote or
a packed L1 object the compactor (:mod:`logstore.compaction`) wrote, in the format of
:mod:`logstore.wal_format`; a partition log holds :class:`ChunkExtent` values, byte ranges of
them.

At start (before the writer), :meth:`WalIndex.load` rebuilds what the WAL holds from one LIST
of ``_replog/wal/`` and one tail read per object (its footer), scanning an object whose footer
does not check (a torn write under a faulty store) to its valid prefix. It applies the zombie
rule: a broker epoch E fences every object of an older epoch whose seq is at or above the
smallest L0 seq written under E (a paused old incarnation wrote it after the new one started;
its data was never acknowledged by anyone reading this store). The writer writes an empty
*fence* object first so that an incarnation that writes nothing else still fences its
predecessors.

The index counts references per object, one per chunk extent a log holds, so that the
compactor's collector deletes only objects nobody refers to.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from logstore.batch import iter_batches
from logstore.errors import CorruptRecordError, ObjectNotFoundError
from logstore.storage import Storage
from logstore.wal_format import (
    DEFAULT_TAIL_BYTES,
    FooterIncompleteError,
    InvalidWalObjectError,
    WalChunk,
    WalObjectIndex,
    WalObjectName,
    parse_object_name,
    read_footer,
    scan_object,
)

__all__ = [
    "FIRST_SEQ",
    "WAL_PREFIX",
    "ChunkExtent",
    "LoadStats",
    "WalIndex",
    "WalObject",
]

log = logging.getLogger(__name__)


#: Where WAL and packed objects live under a broker root (``_replog`` cannot collide with a
#: partition directory: those are ``<topic>/<digits>``).
WAL_PREFIX = "_replog/wal"
#: The first seq of a broker root that has none; 0 never names an object (a truncation record
#: ``(0, X)`` voids nothing).
FIRST_SEQ = 1


@dataclass(frozen=True, slots=True)
class ChunkExtent:
    """A partition's batches at a byte range of a WAL or packed object (what a log reads)."""

    #: the object's path relative to the broker root (``_replog/wal/L0/...wal``)
    object: str
    level: int
    topic_id: str
    partition: int
    #: bytes ``[position, position + size)`` of the object: whole batches
    position: int
    size: int
    base_offset: int
    next_offset: int
    max_timestamp: int
    first_seq: int
    last_seq: int
    epochs: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, path: str, level: int, chunk: WalChunk) -> ChunkExtent:
        return cls(
            path,
            level,
            chunk.topic_id,
            chunk.partition,
            chunk.position,
            chunk.size,
            chunk.base_offset,
            chunk.next_offset,
            chunk.max_timestamp,
            chunk.first_seq,
            chunk.last_seq,
            chunk.epochs,
        )

    def read(self, storage: Storage) -> bytes:
        """The extent's bytes, CRC-checked batch by batch (CorruptRecordError names the
        object); ``storage`` is the broker root."""
        data = storage.read_range(self.object, self.position, self.position + self.size)
        if len(data) != self.size:
            raise CorruptRecordError(
                f"{storage.url}/{self.object}: {len(data)} bytes at {self.position}, the "
                f"chunk of partition {self.partition} has {self.size}"
            )
        try:
            for _ in iter_batches(data, validate=True):
                pass
        except CorruptRecordError as err:
            raise CorruptRecordError(f"{storage.url}/{self.object}: {err}") from err
        return data


@dataclass(frozen=True, slots=True)
class WalObject:
    """One live WAL or packed object as the index knows it."""

    #: relative to the broker root (``_replog/wal/L0/...wal``)
    path: str
    name: WalObjectName
    index: WalObjectIndex


@dataclass(slots=True)
class LoadStats:
    """Requests :meth:`WalIndex.load` made (for tests and logs)."""

    lists: int = 0
    tail_reads: int = 0
    extra_reads: int = 0
    scans: int = 0
    temp_files_removed: int = 0


class WalIndex:
    """Every live WAL and packed object of a broker root, and each partition's chunks in them.

    Built by :meth:`load` at start; the writer adds what it writes (:meth:`add_object`).
    Counts references per object (one per chunk extent a log holds) so that compaction can
    delete objects nobody refers to (:meth:`unreferenced`). Thread-safe.
    """

    def __init__(
        self,
        objects: Iterable[WalObject] = (),
        *,
        next_seq: int = FIRST_SEQ,
        zombies: Iterable[str] = (),
        foreign: Iterable[str] = (),
        stats: LoadStats | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, WalObject] = {}
        self._chunks: dict[tuple[str, int], list[ChunkExtent]] = {}
        self._refs: dict[str, int] = {}
        #: the live L0 objects (holding chunks some log refers to) and their bytes, kept as
        #: references change: the broker reads the sum after every WAL object it writes (the
        #: compaction loop's bytes trigger), and scanning every object for it (tens of
        #: thousands of small L0 objects by the age trigger) held the GIL 15-25 ms each time
        self._l0: dict[str, WalObject] = {}
        self._l0_bytes = 0
        self.next_seq = next_seq
        #: objects of an older broker epoch written after a newer one started (ignored)
        self.zombies = sorted(zombies)
        #: names under ``_replog/wal/`` this code does not know (ignored, left alone)
        self.foreign = sorted(foreign)
        self.stats = stats or LoadStats()
        for obj in objects:
            self._add(obj, 0)

    # --- loading ----------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        storage: Storage,
        *,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
        parallelism: int = 8,
        delete_temp_files: bool = True,
    ) -> WalIndex:
        """Rebuild the index of the broker root ``storage``: one LIST of ``_replog/wal/``,
        one tail read per live object (a second if its footer is longer than ``tail_bytes``),
        a whole read and a scan for an object whose footer does not check (``parallelism``
        objects at a time). Temporary files
        of writes killed mid-way are deleted. Call it before a :class:`WalWriter` of this
        root starts. UnsupportedWalFormatError (naming the object) for a format this replog
        does not read: refusing beats serving a log with a hole.
        """
        stats = LoadStats()
        if delete_temp_files:  # (not when reading beside a running writer: they are its own)
            stats.temp_files_removed = storage.delete_temp_files(WAL_PREFIX)
        if stats.temp_files_removed:
            log.info(
                "%s: deleted %d temporary file(s) of WAL writes killed mid-way",
                storage.url,
                stats.temp_files_removed,
            )
        listed = storage.list(WAL_PREFIX)
        stats.lists += 1
        named: list[tuple[str, int, WalObjectName]] = []
        foreign: list[str] = []
        for info in listed:
            parsed = parse_object_name(info.path[len(WAL_PREFIX) + 1 :])
            if parsed is None:
                foreign.append(info.path)
                log.warning("%s: ignoring %s: not a WAL object name", storage.url, info.path)
                continue
            named.append((info.path, info.size, parsed))
        next_seq = max((n.max_seq + 1 for _, _, n in named), default=FIRST_SEQ)
        fenced = _zombies([(path, n) for path, _, n in named])
        for path in sorted(fenced):
            log.warning(
                "%s: ignoring %s: written by an older broker epoch after a newer one started "
                "(zombie rule)",
                storage.url,
                path,
            )
        live = [(path, size, name) for path, size, name in named if path not in fenced]

        def load_one(entry: tuple[str, int, WalObjectName]) -> tuple[WalObject | None, LoadStats]:
            path, size, name = entry
            own = LoadStats()
            try:
                index = _load_object(storage, path, size, name, tail_bytes, own)
            except ObjectNotFoundError:
                # Deleted since the LIST: only the garbage collector deletes, and only objects
                # whose data is elsewhere (an old incarnation's collector may still run).
                log.info("%s: %s went away while the WAL was loaded", storage.url, path)
                return None, own
            return WalObject(path, name, index), own

        # The footer reads are independent: on S3 each is a 10-50 ms GET, so they overlap.
        with concurrent.futures.ThreadPoolExecutor(max(1, min(parallelism, len(live)))) as pool:
            loaded = list(pool.map(load_one, live))
        objects = [obj for obj, _ in loaded if obj is not None]
        for _, own in loaded:
            stats.tail_reads += own.tail_reads
            stats.extra_reads += own.extra_reads
            stats.scans += own.scans
        return cls(objects, next_seq=next_seq, zombies=fenced, foreign=foreign, stats=stats)

    # --- queries ----------------------------------------------------------------------------

    def chunks_for(self, topic_id: str, partition: int) -> list[ChunkExtent]:
        """The partition's chunks in every live object, by (base offset, last seq). They may
        overlap (a chunk and its compacted copy, or data a truncation voided): the log's
        recovery walk picks among them."""
        with self._lock:
            return list(self._chunks.get((topic_id, partition), ()))

    def partitions(self) -> set[tuple[str, int]]:
        """Every (topic id, partition) with a chunk in a live object."""
        with self._lock:
            return set(self._chunks)

    def objects(self) -> list[WalObject]:
        """The live objects, by path."""
        with self._lock:
            return [self._objects[p] for p in sorted(self._objects)]

    # --- changes ----------------------------------------------------------------------------

    def add_object(self, path: str, index: WalObjectIndex, *, references: int = 0) -> None:
        """Add an object just written (``references``: the chunk extents handed out)."""
        name = parse_object_name(path[len(WAL_PREFIX) + 1 :])
        if not path.startswith(WAL_PREFIX + "/") or name is None:
            raise ValueError(f"{path!r} is not a WAL object path under {WAL_PREFIX}/")
        with self._lock:
            self._add(WalObject(path, name, index), references)
            self.next_seq = max(self.next_seq, name.max_seq + 1)

    def _add(self, obj: WalObject, references: int) -> None:
        if obj.path in self._objects:
            raise ValueError(f"{obj.path} is already in the WAL index")
        self._objects[obj.path] = obj
        self._refs[obj.path] = references
        self._l0_update(obj.path)
        for chunk in obj.index.chunks:
            extent = ChunkExtent.of(obj.path, obj.name.level, chunk)
            chunks = self._chunks.setdefault((chunk.topic_id, chunk.partition), [])
            bisect.insort(chunks, extent, key=lambda e: (e.base_offset, e.last_seq))

    def remove_object(self, path: str) -> None:
        """Forget an object (deleted by the garbage collector)."""
        with self._lock:
            self._remove(path)

    def retire(self, path: str) -> bool:
        """Forget ``path`` if nothing refers to it (True), atomically with the check: the
        garbage collector deletes it next, and nobody can acquire it in between."""
        with self._lock:
            if self._refs.get(path, -1) != 0:
                return False
            self._remove(path)
            return True

    def retire_many(self, paths: Iterable[str]) -> list[str]:
        """:meth:`retire` for several objects at once (the garbage collector's batch): the
        paths forgotten, those nothing referred to. Each partition's chunk list is filtered
        once, not once per object (thousands of small L0 objects go together)."""
        with self._lock:
            gone = [p for p in paths if self._refs.get(p, -1) == 0]
            self._remove_all(gone)
            return gone

    def _remove(self, path: str) -> None:
        self._remove_all([path])

    def _remove_all(self, paths: list[str]) -> None:
        keys: set[tuple[str, int]] = set()
        for path in paths:
            obj = self._objects.pop(path)
            self._refs.pop(path, None)
            self._l0_update(path)
            keys.update((chunk.topic_id, chunk.partition) for chunk in obj.index.chunks)
        removed = set(paths)
        for key in keys:
            kept = [e for e in self._chunks.get(key, ()) if e.object not in removed]
            if kept:
                self._chunks[key] = kept
            else:
                self._chunks.pop(key, None)

    # --- references -------------------------------------------------------------------------

    def acquire(self, path: str, count: int = 1) -> None:
        """A log holds ``count`` more extents in ``path`` (at open, or after compaction)."""
        with self._lock:
            if path not in self._refs:
                raise KeyError(f"{path} is not a live object of the WAL index")
            self._refs[path] += count
            self._l0_update(path)

    def release(self, path: str, count: int = 1) -> None:
        """A log dropped ``count`` extents in ``path`` (truncation, retention, compaction)."""
        with self._lock:
            held = self._refs.get(path)
            if held is None or held < count:
                raise ValueError(f"{path}: releasing {count} references of {held}")
            self._refs[path] = held - count
            self._l0_update(path)

    def references(self, path: str) -> int:
        with self._lock:
            return self._refs[path]

    def l0_live(self) -> list[WalObject]:
        """The live L0 objects holding chunks some log refers to, by seq: what compaction
        chooses from (fence objects and objects nobody refers to are not among them)."""
        with self._lock:
            held = list(self._l0.values())
        held.sort(key=lambda o: o.name.max_seq)
        return held

    def l0_live_bytes(self) -> int:
        """The bytes of :meth:`l0_live`'s objects, without listing them."""
        with self._lock:
            return self._l0_bytes

    def _l0_update(self, path: str) -> None:
        """Under the lock: enter or drop ``path`` in the live L0 tally after a change."""
        obj = self._objects.get(path)
        live = (
            obj is not None
            and obj.name.level == 0
            and bool(obj.index.chunks)
            and self._refs.get(path, 0) > 0
        )
        if live and path not in self._l0:
            assert obj is not None
            self._l0[path] = obj
            self._l0_bytes += obj.index.object_size
        elif not live and path in self._l0:
            self._l0_bytes -= self._l0.pop(path).index.object_size

    def unreferenced(self) -> list[str]:
        """Live objects no log refers to: garbage once every partition of the broker was
        opened (before that, a partition not yet open makes its chunks look unreferenced)."""
        with self._lock:
            return sorted(p for p, n in self._refs.items() if n == 0)


def _zombies(named: list[tuple[str, WalObjectName]]) -> set[str]:
    """Paths fenced by the zombie rule: an object of epoch e is a zombie if some newer epoch
    E > e wrote an L0 object with a seq at or below the object's (max) seq. Only L0 seqs fence:
    a packed object's seqs are its sources', which may be older epochs'."""
    first_l0: dict[int, int] = {}
    for _, name in named:
        if name.level == 0:
            epoch = name.broker_epoch
            first_l0[epoch] = min(first_l0.get(epoch, name.max_seq), name.max_seq)
    zombies = set()
    for path, name in named:
        newer = [seq for epoch, seq in first_l0.items() if epoch > name.broker_epoch]
        if newer and name.max_seq >= min(newer):
            zombies.add(path)
    return zombies


def _check_name(index: WalObjectIndex, name: WalObjectName, where: str) -> None:
    stated = (index.level, index.min_seq, index.max_seq, index.broker_epoch)
    if stated != (name.level, name.min_seq, name.max_seq, name.broker_epoch):
        raise InvalidWalObjectError(
            f"WAL object {where}: footer says level {index.level}, seqs [{index.min_seq}, "
            f"{index.max_seq}], epoch {index.broker_epoch}; its name says otherwise"
        )


def _load_object(
    storage: Storage, path: str, size: int, name: WalObjectName, tail_bytes: int, stats: LoadStats
) -> WalObjectIndex:
    """The index of one object: its footer if it checks and agrees with the name, else a scan
    of the whole object (a torn write: only whole valid batches of its valid prefix)."""
    where = f"{storage.url}/{path}"
    start = max(0, size - tail_bytes)
    tail = storage.read_range(path, start, size)
    stats.tail_reads += 1
    try:
        try:
            index = read_footer(tail, size, name=where)
        except FooterIncompleteError as more:
            tail = storage.read_range(path, max(0, size - more.needed), size)
            stats.extra_reads += 1
            start = size - len(tail)
            index = read_footer(tail, size, name=where)
        _check_name(index, name, where)
        return index
    except InvalidWalObjectError as err:
        data = tail if start == 0 and len(tail) == size else storage.read(path)
        if data is not tail:
            stats.extra_reads += 1
        stats.scans += 1
        try:
            scanned = scan_object(data, name=where)
        except InvalidWalObjectError as unreadable:
            log.warning("%s (footer: %s); nothing in it is used", unreadable, err)
            return WalObjectIndex(
                name.level,
                -1,
                name.broker_epoch,
                name.min_seq,
                name.max_seq,
                0,
                (),
                size,
                scanned=True,
                valid_length=0,
                reason=str(unreadable),
            )
        if (scanned.level, scanned.max_seq, scanned.broker_epoch) != (
            name.level,
            name.max_seq,
            name.broker_epoch,
        ):
            log.warning("%s: its header does not match its name; nothing in it is used", where)
            return WalObjectIndex(
                name.level,
                -1,
                name.broker_epoch,
                name.min_seq,
                name.max_seq,
                0,
                (),
                size,
                scanned=True,
                valid_length=0,
                reason="header does not match the name",
            )
        log.warning(
            "%s: %s; scanned: %d whole chunk(s) up to byte %d%s",
            where,
            err,
            len(scanned.chunks),
            scanned.valid_length,
            f", cut there: {scanned.reason}" if scanned.reason else "",
        )
        return scanned
