"""Whole-object storage under one root URL: local files, memory, S3, or any fsspec filesystem.

A :class:`Storage` holds immutable objects named by relative, ``/``-separated paths. Every
backend keeps the same contract, so the log runs the same code on local disk as on S3:

- :meth:`Storage.write` replaces an object atomically: a reader sees the old bytes or the new
  bytes, never a part of them, and :meth:`Storage.list` never shows a half-written object.
- :meth:`Storage.put_if_absent` creates an object only if no object has that path, atomically
  and race-free across threads, processes and hosts (local: ``link(2)``; S3: ``If-None-Match:
  *``; memory: a lock). Controllers and metadata logs coordinate with it.
- A missing object raises :class:`~logstore.errors.ObjectNotFoundError` (also a
  ``FileNotFoundError``); a lost put-if-absent race raises
  :class:`~logstore.errors.ObjectExistsError` (also a ``FileExistsError``); every other backend
  failure raises :class:`~logstore.errors.StorageError` naming the operation and the URL.

A path never starts or ends with ``/``, has no empty, ``.`` or ``..`` component, and no
component starts with ``.replog-tmp-`` (the prefix of local temporary files). A path cannot be
both an object and the prefix of other objects: local files cannot hold that, and S3 and memory
should not be asked to.

Every operation can be observed (:data:`StorageObserver`): a Storage whose :attr:`observer` is
set calls it after each operation with the operation's name, its duration and its error, and
passes it on to its children. The broker binds it to its Prometheus metrics
(``replog_storage_*``); logstore itself stays free of any metrics library and of process-wide
state: it is also used alone (``replog log dump``, Spark executors reading segments), where
nothing collects metrics, and an unset observer costs one attribute test per operation.

Examples
--------
>>> storage = Storage.from_url("memory://doctest-storage/broker-0")
>>> storage.write("orders/0/00000000000000000000.seg", b"batch")
>>> storage.put_if_absent("controller/epoch-1", b"broker-0")
>>> [info.path for info in storage.list("orders")]
['orders/0/00000000000000000000.seg']
>>> storage.child("orders/0").read_range("00000000000000000000.seg", 1, 100)
b'atch'
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import functools
import mmap
import os
import pathlib
import shutil
import stat
import threading
import time
import urllib.parse
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import fsspec

from logstore.errors import ObjectExistsError, ObjectNotFoundError, ReplogError, StorageError
from logstore.journal import (
    DEFAULT_CAPACITY,
    DEFAULT_MAX_OBJECT_BYTES,
    JOURNAL_DIR,
    Journal,
    JournalEntry,
)

__all__ = ["Data", "ObjectInfo", "Storage", "StorageObserver"]

Data = bytes | bytearray | memoryview

#: Told of each storage operation once it is over: the operation (``read``, ``read_range``,
#: ``exists``, ``size``, ``list``, ``write``, ``put_if_absent``, ``delete``, ``close``), its
#: duration in seconds, and the error it raised (already translated into the replog error
#: tree: ObjectNotFoundError, ObjectExistsError, StorageError...) or None. It runs on the
#: thread that did the operation, so it must be quick and thread-safe.
StorageObserver = Callable[[str, float, BaseException | None], None]

#: Prefix of the temporary files a local write renames into place; never listed.
TEMP_PREFIX = ".replog-tmp-"

# Operations whose FileNotFoundError means "no such object". Elsewhere (write into a missing
# bucket, a parent that is a file) a missing path is a broken store, not a missing object.
_READ_OPS = frozenset({"read", "read_range", "size"})


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object found by :meth:`Storage.list`."""

    #: Relative to the storage root, ``/``-separated, no leading ``/``.
    path: str
    #: Size in bytes.
    size: int


def check_path(path: str) -> str:
    """Return ``path`` if it is a valid object path; raise ``ValueError`` otherwise."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"object path must be a non-empty string, not {path!r}")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(
                f"object path {path!r}: no leading or trailing '/', no empty, '.' or '..' parts"
            )
        if part.startswith(TEMP_PREFIX):
            raise ValueError(f"object path {path!r}: names starting {TEMP_PREFIX!r} are reserved")
        if "\x00" in part:
            raise ValueError(f"object path {path!r}: contains NUL")
    return path


def _check_prefix(prefix: str) -> str:
    """A list prefix: '' (everything) or a path; one trailing '/' is allowed and dropped."""
    prefix = prefix.removesuffix("/")
    return check_path(prefix) if prefix else ""


def _check_range(start: int, end: int) -> None:
    if start < 0 or end < start:
        raise ValueError(f"byte range [{start}, {end}) must have 0 <= start <= end")


def _bytes(data: Data) -> bytes:
    return data if isinstance(data, bytes) else bytes(data)


@contextmanager
def _translating(
    op: str,
    target: str,
    backend_errors: tuple[type[BaseException], ...],
    observer: StorageObserver | None = None,
) -> Iterator[None]:
    """:func:`_translate_errors`, and tell ``observer`` (if any) of the operation."""
    if observer is None:
        with _translate_errors(op, target, backend_errors):
            yield
        return
    started = time.perf_counter()
    try:
        with _translate_errors(op, target, backend_errors):
            yield
    except BaseException as err:
        observer(op, time.perf_counter() - started, err)
        raise
    observer(op, time.perf_counter() - started, None)


@contextmanager
def _translate_errors(
    op: str, target: str, backend_errors: tuple[type[BaseException], ...]
) -> Iterator[None]:
    """Translate a backend's exceptions into the replog error tree (the only place that does).

    ``FileNotFoundError`` becomes :class:`ObjectNotFoundError` for reads, and
    ``FileExistsError`` becomes :class:`ObjectExistsError` for put-if-absent; any other
    backend error becomes :class:`StorageError`. Errors already in the tree pass through.
    """
    try:
        yield
    except ReplogError:
        raise
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as err:
        if op in _READ_OPS:
            raise ObjectNotFoundError(f"{op} {target}: no such object") from err
        raise StorageError(f"{op} {target} failed: {type(err).__name__}: {err}") from err
    except FileExistsError as err:
        if op == "put_if_absent":
            raise ObjectExistsError(f"{op} {target}: the object already exists") from err
        raise StorageError(f"{op} {target} failed: {type(err).__name__}: {err}") from err
    except backend_errors as err:
        raise StorageError(f"{op} {target} failed: {type(err).__name__}: {err}") from err


class Storage(ABC):
    """Immutable objects under one root URL. Create one with :meth:`Storage.from_url`.

    Methods are safe to call from several threads. Paths are relative to :attr:`url`.

    Examples
    --------
    >>> with Storage.from_url("memory://doctest-storage-class") as storage:
    ...     storage.write("a/b", b"hello")
    ...     storage.read("a/b"), storage.size("a/b"), storage.exists("a/c")
    (b'hello', 5, False)
    """

    #: The root URL, without a trailing ``/``.
    url: str
    #: Told of every operation of this Storage and of its children (see the module doc).
    observer: StorageObserver | None = None

    @staticmethod
    def from_url(url: str, *, fsync: bool = True, **storage_options: Any) -> Storage:
        """Open the storage rooted at ``url``.

        Parameters
        ----------
        url
            ``file:///abs/dir`` or a plain local path; ``memory://name/prefix`` (one store per
            Python process); ``s3://bucket/prefix``; or any other fsspec URL (whose
            :meth:`put_if_absent` raises :class:`StorageError`: fsspec offers no atomic
            create for it).
        fsync
            Local files only: fsync each written file and its directory before returning.
        **storage_options
            Passed to the fsspec filesystem (for S3: ``endpoint_url``, ``key``, ``secret``,
            ``client_kwargs``, ...). Local files take none.
        """
        protocol, sep, rest = url.partition("://")
        if not sep or protocol in ("file", "local"):
            if storage_options:
                raise ValueError(
                    f"local storage {url!r} takes no storage options, got {sorted(storage_options)}"
                )
            if sep and not rest.startswith("/"):
                raise ValueError(f"storage url {url!r}: a file url needs an absolute path")
            path = urllib.parse.unquote(rest) if sep else url
            return LocalStorage(os.path.abspath(path), fsync=fsync)
        if not rest.strip("/"):
            raise ValueError(f"storage url {url!r} needs a bucket or a name after '://'")
        url = url.rstrip("/")
        options = dict(storage_options)
        if protocol in ("s3", "s3a"):
            # Other brokers write to the same bucket, so a cached listing would be stale.
            options.setdefault("use_listings_cache", False)
        with _translating("open", url, (OSError,)):
            fs, root = fsspec.url_to_fs(url, **options)
        root = root.rstrip("/")
        if not root.strip("/"):
            raise ValueError(f"storage url {url!r} needs a bucket or a name after '://'")
        if protocol == "memory":
            return MemoryStorage(fs, root, url)
        if protocol in ("s3", "s3a"):
            # fsspec shares one client among equal options unless skip_instance_cache is set.
            return S3Storage(fs, root, url, owns_fs=bool(options.get("skip_instance_cache")))
        return FsspecStorage(fs, root, url)

    # --- reading ---------------------------------------------------------------------------

    @abstractmethod
    def read(self, path: str) -> bytes:
        """The whole object; :class:`ObjectNotFoundError` if there is none."""

    @abstractmethod
    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object, clipped at its size (so possibly short)."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether an object has this path (a prefix of other objects is not an object)."""

    @abstractmethod
    def size(self, path: str) -> int:
        """The object's size in bytes; :class:`ObjectNotFoundError` if there is none."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object at or below ``prefix`` (a path, not a string prefix: ``"a"`` finds
        ``a/x`` but not ``ab``), recursively, sorted by path; ``""`` lists everything, and a
        prefix with nothing below it gives ``[]``."""

    # --- writing ---------------------------------------------------------------------------

    @abstractmethod
    def write(self, path: str, data: Data) -> None:
        """Create or replace the object, atomically: readers see old or new, never a part."""

    @abstractmethod
    def put_if_absent(self, path: str, data: Data) -> None:
        """Create the object only if none has this path, atomically and race-free.

        Raises :class:`ObjectExistsError` if one does; it is left unchanged. Any other
        :class:`StorageError` leaves the outcome unknown (the object may have been written).
        On S3, s3fs retries a request whose response was lost, and the retry may find the
        caller's own object: an ObjectExistsError there can hide a win, so a caller that must
        know reads the object back and compares.
        """

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove the object; a missing object is fine."""

    def delete_many(self, paths: Iterable[str]) -> dict[str, StorageError]:
        """Remove several objects (missing ones are fine), carrying on past failures; the
        failures, by path (empty: every one is gone). The default deletes one by one; local
        files make a directory's deletes durable together (one fsync)."""
        failed: dict[str, StorageError] = {}
        for path in paths:
            try:
                self.delete(path)
            except StorageError as err:
                failed[path] = err
        return failed

    def delete_all(self) -> int:
        """Delete every object under this storage's root (and, on a local filesystem, the
        directories); returns how many objects went. For a replica that is gone for good."""
        objects = self.list()
        for info in objects:
            self.delete(info.path)
        return len(objects)

    def journal(
        self,
        prefix: str,
        *,
        max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES,
        capacity: int = DEFAULT_CAPACITY,
    ) -> bool:
        """From now on, write objects under ``prefix`` of at most ``max_object_bytes`` into
        pre-written journal files (:mod:`logstore.journal`) if this backend has them: local
        files only (True); an object store has no cheaper write than a PUT (False). One
        writer per root and process (the broker, for its L0 WAL objects)."""
        return False

    def delete_temp_files(self, prefix: str = "") -> int:
        """Delete the temporary files that writes killed mid-way (SIGKILL before the rename)
        left at or below ``prefix``; returns how many went. Only local files have any: they
        are never listed, so nothing else finds them. Call it where no write can be running
        (e.g. at start-up, before the writer of that prefix starts)."""
        return 0

    # --- structure -------------------------------------------------------------------------

    @abstractmethod
    def child(self, prefix: str) -> Storage:
        """A Storage rooted at ``url/prefix`` sharing this one's filesystem and client."""

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to close
        """Release the client, if this Storage owns one (never a child); safe to repeat."""

    def __enter__(self) -> Storage:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


# --- local files ----------------------------------------------------------------------------


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: local writes larger than this are synced in slices of this size (see ``_write_temp``)
SYNC_SLICE_BYTES = 4 * 1024 * 1024
#: local writes at least this large bypass the page cache (O_DIRECT; see ``_write_direct``)
DIRECT_MIN_BYTES = 4 * 1024 * 1024
#: O_DIRECT's alignment of buffers, offsets and lengths (a page: every block size up to it)
DIRECT_ALIGN = 4096
#: ``os.O_DIRECT`` where the platform has it (Linux), else 0: no direct writes
O_DIRECT: int = getattr(os, "O_DIRECT", 0)


def _write_direct(fd: int, view: memoryview) -> None:
    """Write ``view`` from the start of the empty file ``fd`` (opened with O_DIRECT), through
    the page cache for the unaligned tail only. Bypassing the page cache
    is why: a compaction's 64 MiB output written through it cost the kernel a copy and a
    writeback on top of the disk write, and while three brokers did that on one disk their
    small fsync'd WAL writes stalled (acks=all p99 at 376k records/s 130-350 ms; written
    direct, 37-56 ms, as with the packed objects on tmpfs). The aligned part goes through a
    page-aligned buffer (an anonymous mmap), one slice at a time; a file system that refuses
    O_DIRECT writes (EINVAL) gets the rest through the page cache. Durability still needs
    the caller's fsync (the device's cache, the file's size)."""
    written = 0
    aligned = len(view) - len(view) % DIRECT_ALIGN
    if aligned:
        buffer = mmap.mmap(-1, min(SYNC_SLICE_BYTES, aligned))
        try:
            with memoryview(buffer) as slot:
                while written < aligned:
                    n = min(len(slot), aligned - written)
                    slot[:n] = view[written : written + n]
                    try:
                        done = os.write(fd, slot[:n])
                    except OSError as err:
                        if err.errno != errno.EINVAL:
                            raise
                        break  # not on this file system: the page cache takes the rest
                    written += done
                    if done % DIRECT_ALIGN:  # a short write off the alignment: finish buffered
                        break
        finally:
            buffer.close()
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~O_DIRECT)
    while written < len(view):
        written += os.write(fd, view[written:])


def _write_all(f: Any, view: memoryview) -> None:
    """Write every byte of ``view`` to the unbuffered file ``f`` (a raw write may be short)."""
    while view:
        written = f.write(view)
        view = view[written:]


def _unlink_quietly(path: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)


def _scan_dir(directory: str, rel: str, out: list[ObjectInfo]) -> None:
    """Append every file below ``directory`` to ``out``, skipping temporary files."""
    try:
        entries = os.scandir(directory)
    except FileNotFoundError:  # removed while we listed
        return
    with entries:
        for entry in entries:
            if entry.name.startswith(TEMP_PREFIX) or entry.name == JOURNAL_DIR:
                continue
            path = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                _scan_dir(entry.path, path, out)
            elif entry.is_file():
                try:
                    out.append(ObjectInfo(path, entry.stat().st_size))
                except FileNotFoundError:  # deleted while we listed
                    continue


@dataclass(frozen=True)
class _JournalView:
    """A journal as a LocalStorage sees it: its root is ``under`` ("" or "a/b/") below the
    directory that holds the journal (a child storage, or a reader opened on a subdirectory
    of a broker root, e.g. ``replog log dump <root>/_replog/wal``)."""

    journal: Journal
    under: str

    def lookup(self, path: str) -> JournalEntry | None:
        return self.journal.lookup(self.under + path)

    def remove(self, path: str) -> bool:
        """Delete a journaled object (False if ``path`` is not one). Only the journal's writer
        records deletes: another process refuses rather than forget it for itself alone."""
        name = self.under + path
        if not self.journal.writer and self.journal.lookup(name) is not None:
            raise StorageError(
                f"{name} is journaled (log.wal.journal.enable) by the process that writes "
                f"{self.journal.directory}: only that process (its broker) deletes it"
            )
        return self.journal.remove(name)

    def with_listed(self, prefix: str, out: list[ObjectInfo]) -> list[ObjectInfo]:
        """``out`` with the journaled objects at or below ``prefix`` (a journaled object's
        bytes win over a file of the same name, as reads do)."""
        start = len(self.under)
        below = self.under + (f"{prefix}/" if prefix else "")
        journaled = {name[start:]: size for name, size in self.journal.names(below)}
        if prefix:
            exact = self.lookup(prefix)
            if exact is not None:
                journaled[prefix] = exact.size
        if not journaled:
            return out
        merged = [info for info in out if info.path not in journaled]
        merged.extend(ObjectInfo(name, size) for name, size in journaled.items())
        return merged


def _find_journal(root: str) -> tuple[str, str] | None:
    """The nearest directory at or above ``root`` holding a journal, and ``root``'s path
    below it ("" or "a/b/")."""
    directory, under = root, ""
    while True:
        if os.path.isdir(os.path.join(directory, JOURNAL_DIR)):
            return directory, under
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        under = f"{os.path.basename(directory)}/{under}"
        directory = parent


#: How many roots' reader journals a process keeps (see :func:`_reader_journal`)
_READER_JOURNALS_KEPT = 16
_reader_journals: collections.OrderedDict[tuple[str, bool], Journal] = collections.OrderedDict()
_reader_journals_lock = threading.Lock()


def _reader_journal(directory: str, *, fsync: bool) -> Journal:
    """The one reader Journal of ``directory`` in this process, shared by every LocalStorage
    opened on it (or below it), the most recently used few kept. Why: Spark opens the root
    afresh in every task, and each walk of a new Journal starts at the journal's first
    frame; a shared one walks only what was appended since (a reused Python worker's next
    task). A reader's Journal holds no file open, so nothing closes it."""
    key = (os.path.realpath(directory), fsync)
    with _reader_journals_lock:
        journal = _reader_journals.get(key)
        if journal is None:
            journal = _reader_journals[key] = Journal(directory, fsync=fsync)
            while len(_reader_journals) > _READER_JOURNALS_KEPT:
                _reader_journals.popitem(last=False)
        else:
            _reader_journals.move_to_end(key)
        return journal


class LocalStorage(Storage):
    """Objects as files under a directory, using ``os`` directly.

    A write goes to a temporary file in the object's directory (named ``.replog-tmp-*``,
    never listed), is fsynced, then renamed over the object (``os.replace``) or linked to it
    (``os.link``, for put-if-absent, which fails if the object exists), and the directory is
    fsynced. A crash leaves the old object or the new one, and at worst a temporary file.

    Small objects under a prefix given to :meth:`journal` are written into pre-written
    journal files instead (:mod:`logstore.journal`: one ``fdatasync``, no new file, no journal
    commit of the file system); every reader, in any process, sees them as objects.
    """

    def __init__(self, root: str, *, fsync: bool = True) -> None:
        self._root = root
        self._fsync = fsync
        self.url = pathlib.Path(root).as_uri()
        self._view: _JournalView | None = None
        self._view_lock = threading.Lock()
        #: (prefix, max object bytes) journaled by this instance's writes, once :meth:`journal`
        self._journaled: tuple[str, int] | None = None

    def journal(
        self,
        prefix: str,
        *,
        max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES,
        capacity: int = DEFAULT_CAPACITY,
    ) -> bool:
        prefix = _check_prefix(prefix)
        if not 0 <= max_object_bytes <= capacity // 2:
            raise ValueError(
                f"max_object_bytes must be between 0 and half the journal capacity "
                f"({capacity // 2}), got {max_object_bytes}"
            )
        with self._view_lock:
            view = self._view
            if (
                view is None
                or view.under
                or not view.journal.writer
                or view.journal.capacity != capacity
            ):
                journal = Journal(self._root, capacity=capacity, fsync=self._fsync, writer=True)
                journal.refresh()
                journal.remove_dead_files()
                journal.open_file()
                self._view = _JournalView(journal, "")
        self._journaled = (f"{prefix}/" if prefix else "", max_object_bytes)
        return True

    def _journal_view(self, *, refresh: bool) -> _JournalView | None:
        """The journal of this root, or of the nearest directory above it that has one (a
        broker root), walked again with ``refresh`` (objects another process journaled since);
        None if there is none."""
        view = self._view
        if view is None:
            found = _find_journal(self._root)
            if found is None:
                return None
            with self._view_lock:
                if self._view is None:
                    journal = _reader_journal(found[0], fsync=self._fsync)
                    self._view = _JournalView(journal, found[1])
                    refresh = True  # what was journaled before this instance was opened
                view = self._view
        if refresh and not view.journal.writer:  # a writer's map is whole since its start
            view.journal.refresh()
        return view

    def _journaled_entry(self, path: str, *, refresh: bool) -> tuple[Journal, JournalEntry] | None:
        view = self._journal_view(refresh=refresh)
        if view is None:
            return None
        entry = view.lookup(path)
        return None if entry is None else (view.journal, entry)

    def _path(self, path: str) -> str:
        return os.path.join(self._root, *check_path(path).split("/"))

    def _translating(self, op: str, path: str) -> Any:
        return _translating(op, f"{self.url}/{path}", (OSError,), self.observer)

    # --- reading ---------------------------------------------------------------------------

    def read(self, path: str) -> bytes:
        full = self._path(path)
        with self._translating("read", path):
            return self._read_either(path, full, 0, None)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        full = self._path(path)
        _check_range(start, end)
        with self._translating("read_range", path):
            return self._read_either(path, full, start, end)

    def _read_either(self, path: str, full: str, start: int, end: int | None) -> bytes:
        """The bytes of a journaled object, else of the file (journals walked again when
        neither has it: another process may have journaled it since)."""
        for refresh in (False, True):
            found = self._journaled_entry(path, refresh=refresh)
            if found is not None:
                journal, entry = found
                return journal.read(entry, start, end)
            if refresh:
                break
            try:
                with open(full, "rb") as f:
                    if start:
                        f.seek(start)
                    return f.read() if end is None else f.read(end - start)
            except (FileNotFoundError, NotADirectoryError):
                if self._journal_view(refresh=False) is None:
                    raise
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), full)

    def exists(self, path: str) -> bool:
        full = self._path(path)
        with self._translating("exists", path):
            try:
                return self._size_either(path, full) >= 0
            except (FileNotFoundError, NotADirectoryError):
                return False
            except IsADirectoryError:
                return False

    def size(self, path: str) -> int:
        full = self._path(path)
        with self._translating("size", path):
            return self._size_either(path, full)

    def _size_either(self, path: str, full: str) -> int:
        found = self._journaled_entry(path, refresh=False)
        if found is not None and not found[0].writer:
            # Another process journals this root and may have deleted the object since this
            # process last walked: walk again before saying it is there, as an object store's
            # HEAD sees a delete at once (a reader polling exists() for a delete otherwise
            # waited forever once it had seen the object). Reads do not walk again: the bytes
            # of an object deleted since stay valid until its journal file goes (then the
            # read finds no file), as a segment stays readable for file.delete.delay.ms.
            found = self._journaled_entry(path, refresh=True)
        if found is not None:
            return int(found[1].size)
        try:
            st = os.stat(full)
        except (FileNotFoundError, NotADirectoryError):
            found = self._journaled_entry(path, refresh=True)
            if found is None:
                raise
            return int(found[1].size)
        if not stat.S_ISREG(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), full)
        return st.st_size

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        prefix = _check_prefix(prefix)
        base = os.path.join(self._root, *prefix.split("/")) if prefix else self._root
        out: list[ObjectInfo] = []
        with self._translating("list", prefix):
            try:
                st = os.stat(base)
            except (FileNotFoundError, NotADirectoryError):
                pass
            else:
                if stat.S_ISREG(st.st_mode):
                    out.append(ObjectInfo(prefix, st.st_size))
                else:
                    _scan_dir(base, prefix, out)
            view = self._journal_view(refresh=True)
            if view is not None:
                out = view.with_listed(prefix, out)
        out.sort(key=lambda info: info.path)
        return out

    # --- writing ---------------------------------------------------------------------------

    def write(self, path: str, data: Data) -> None:
        full = self._path(path)
        journaled = self._journaled
        if journaled is not None and path.startswith(journaled[0]):
            view = memoryview(data).cast("B")
            if len(view) <= journaled[1]:
                assert self._view is not None
                with self._translating("write", path):
                    self._view.journal.append(path, view)
                return
        if self._view is not None:  # a file takes over a journaled name
            self._view.remove(path)
        with self._translating("write", path):
            temp = self._write_temp(full, data)
            try:
                os.replace(temp, full)
            except BaseException:
                _unlink_quietly(temp)
                raise
            if self._fsync:
                _fsync_dir(os.path.dirname(full))

    def put_if_absent(self, path: str, data: Data) -> None:
        full = self._path(path)
        with self._translating("put_if_absent", path):
            if self._journaled_entry(path, refresh=True) is not None:
                raise FileExistsError(errno.EEXIST, "a journaled object has this name", full)
            temp = self._write_temp(full, data)
            try:
                os.link(temp, full)  # FileExistsError if the object exists
            finally:
                _unlink_quietly(temp)
            if self._fsync:
                _fsync_dir(os.path.dirname(full))

    def _write_temp(self, full: str, data: Data) -> str:
        directory = os.path.dirname(full)
        self._makedirs(directory)
        temp = os.path.join(directory, TEMP_PREFIX + uuid.uuid4().hex)
        view = memoryview(data).cast("B")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        direct = bool(O_DIRECT) and self._fsync and len(view) >= DIRECT_MIN_BYTES
        try:
            fd = os.open(temp, flags | O_DIRECT if direct else flags, 0o666)
        except OSError as err:
            if not direct or err.errno != errno.EINVAL:
                raise
            # tmpfs (before Linux 6.6) and others refuse O_DIRECT, some after creating the
            # file: through the page cache
            direct = False
            _unlink_quietly(temp)
            fd = os.open(temp, flags, 0o666)
        try:
            if direct:
                try:
                    _write_direct(fd, view)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                return temp
            with open(fd, "wb", buffering=0) as f:
                if self._fsync and len(view) > SYNC_SLICE_BYTES:
                    # A big object where O_DIRECT is refused goes down in slices, each synced
                    # before the next: the fsyncs of small foreground writes (the WAL's, for
                    # acks=all) then wait behind one slice's write-back, not the whole
                    # object's (64 MiB at once stalled them 35 ms here, 4 MiB slices 17 ms).
                    for start in range(0, len(view), SYNC_SLICE_BYTES):
                        _write_all(f, view[start : start + SYNC_SLICE_BYTES])
                        if start + SYNC_SLICE_BYTES < len(view):
                            os.fdatasync(f.fileno())
                else:
                    _write_all(f, view)
                if self._fsync:
                    os.fsync(f.fileno())
        except BaseException:
            _unlink_quietly(temp)
            raise
        return temp

    def _makedirs(self, directory: str) -> None:
        """Create ``directory`` and its missing parents, fsyncing each new entry's parent."""
        missing: list[str] = []
        current = directory
        while not os.path.isdir(current):
            missing.append(current)
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
        for new in reversed(missing):
            try:
                os.mkdir(new)
            except FileExistsError as err:
                if not os.path.isdir(new):  # an object is in the way
                    raise NotADirectoryError(errno.ENOTDIR, "an object is in the way", new) from err
            if self._fsync:
                _fsync_dir(os.path.dirname(new))

    def delete(self, path: str) -> None:
        full = self._path(path)
        with self._translating("delete", path):
            journal = self._journal_view(refresh=False)
            if journal is not None and journal.remove(path):
                return  # (a file of the same name is never made while a name is journaled)
            try:
                os.unlink(full)
            except (FileNotFoundError, NotADirectoryError):
                return
            if self._fsync:
                _fsync_dir(os.path.dirname(full))

    def delete_many(self, paths: Iterable[str]) -> dict[str, StorageError]:
        # One fsync per directory once its unlinks are done, not one per object: a garbage
        # collection of thousands of WAL objects otherwise forces thousands of journal
        # commits, and the fsyncs of foreground writes (acks=all) queue behind them.
        failed: dict[str, StorageError] = {}
        by_directory: dict[str, list[str]] = {}
        journal = self._journal_view(refresh=False)
        for path in paths:
            full = self._path(path)
            try:
                with self._translating("delete", path):
                    if journal is not None and journal.remove(path):
                        continue
                    try:
                        os.unlink(full)
                    except (FileNotFoundError, NotADirectoryError):
                        continue
            except StorageError as err:
                failed[path] = err
            else:
                by_directory.setdefault(os.path.dirname(full), []).append(path)
        if self._fsync:
            for directory, removed in by_directory.items():
                try:
                    with _translate_errors("delete", directory, (OSError,)):
                        _fsync_dir(directory)
                except StorageError as err:  # gone from listings, but maybe not durably
                    failed.update(dict.fromkeys(removed, err))
        return failed

    def delete_temp_files(self, prefix: str = "") -> int:
        prefix = _check_prefix(prefix)
        base = os.path.join(self._root, *prefix.split("/")) if prefix else self._root
        removed = 0
        with self._translating("delete", prefix):
            for directory, _dirs, files in os.walk(base):
                temps = [name for name in files if name.startswith(TEMP_PREFIX)]
                for name in temps:
                    _unlink_quietly(os.path.join(directory, name))
                removed += len(temps)
                if temps and self._fsync:
                    _fsync_dir(directory)
        return removed

    def delete_all(self) -> int:
        deleted = super().delete_all()
        # the directories too (and any temporary file a crash left): nothing of it stays
        with self._translating("delete", ""), contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self._root)
        return deleted

    # --- structure -------------------------------------------------------------------------

    def close(self) -> None:
        view = self._view
        if view is not None and self._journaled is not None:  # this instance writes it
            view.journal.close()
        self._view = None
        self._journaled = None

    def child(self, prefix: str) -> LocalStorage:
        child = LocalStorage(self._path(prefix), fsync=self._fsync)
        if self._view is not None:  # the same journal (and map), seen from below
            child._view = _JournalView(self._view.journal, f"{self._view.under}{prefix}/")
        child.observer = self.observer
        return child


# --- fsspec filesystems ---------------------------------------------------------------------


class FsspecStorage(Storage):
    """Objects on an fsspec filesystem, for protocols without a dedicated subclass.

    ``write`` is ``pipe_file``, which is atomic on object stores (one PUT). ``put_if_absent``
    raises :class:`StorageError`: fsspec's generic ``mode="create"`` checks, then writes, which
    is not race-free; protocols whose create is atomic get a subclass.
    """

    def __init__(self, fs: Any, root: str, url: str, *, owns_fs: bool = False) -> None:
        self._fs = fs
        self._root = root
        self._owns_fs = owns_fs
        self.url = url

    def _path(self, path: str) -> str:
        return f"{self._root}/{check_path(path)}"

    def _translating(self, op: str, path: str) -> Any:
        return _translating(op, f"{self.url}/{path}", self._backend_errors(), self.observer)

    def _backend_errors(self) -> tuple[type[BaseException], ...]:
        """The exceptions this backend raises for a failed operation."""
        return (OSError,)

    # --- reading ---------------------------------------------------------------------------

    def read(self, path: str) -> bytes:
        full = self._path(path)
        with self._translating("read", path):
            data: bytes = self._fs.cat_file(full)
            return data

    def read_range(self, path: str, start: int, end: int) -> bytes:
        full = self._path(path)
        _check_range(start, end)
        with self._translating("read_range", path):
            if start == end:
                self._file_size(full)  # still ObjectNotFoundError for a missing object
                return b""
            data: bytes = self._fs.cat_file(full, start=start, end=end)
            return data

    def exists(self, path: str) -> bool:
        full = self._path(path)
        with self._translating("exists", path):
            try:
                self._file_size(full)
            except FileNotFoundError:
                return False
            return True

    def size(self, path: str) -> int:
        full = self._path(path)
        with self._translating("size", path):
            return self._file_size(full)

    def _file_size(self, full: str) -> int:
        """The size of the object at ``full``; FileNotFoundError if it is missing or a dir."""
        info = self._fs.info(full)
        if info["type"] != "file":
            raise FileNotFoundError(errno.ENOENT, "not an object", full)
        size: int = info["size"]
        return size

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        prefix = _check_prefix(prefix)
        base = f"{self._root}/{prefix}" if prefix else self._root
        with self._translating("list", prefix):
            found: dict[str, dict[str, Any]] = self._fs.find(base, withdirs=False, detail=True)
        start = len(self._root) + 1
        out = [
            ObjectInfo(name[start:], int(info["size"]))
            for name, info in found.items()
            if info["type"] == "file" and not name.endswith("/")
        ]
        out.sort(key=lambda info: info.path)
        return out

    # --- writing ---------------------------------------------------------------------------

    def write(self, path: str, data: Data) -> None:
        full = self._path(path)
        with self._translating("write", path):
            self._fs.pipe_file(full, _bytes(data))

    def put_if_absent(self, path: str, data: Data) -> None:
        protocol = self.url.split("://", 1)[0]
        raise StorageError(
            f"put_if_absent {self.url}/{path}: conditional writes are unsupported for "
            f"protocol {protocol!r}; use file://, memory:// or s3:// for a root that "
            "coordinates (controller epochs, metadata)"
        )

    def delete(self, path: str) -> None:
        full = self._path(path)
        with self._translating("delete", path):
            try:
                self._fs.rm_file(full)
            except FileNotFoundError:
                return

    # --- structure -------------------------------------------------------------------------

    def child(self, prefix: str) -> FsspecStorage:
        check_path(prefix)
        child = type(self)(self._fs, f"{self._root}/{prefix}", f"{self.url}/{prefix}")
        child.observer = self.observer
        return child


# The memory filesystem's store is one dict per process, shared by every MemoryFileSystem
# that uses it, so one lock serialises all mutations and listings of it.
_MEMORY_LOCK = threading.Lock()


class MemoryStorage(FsspecStorage):
    """Objects in fsspec's in-process memory filesystem; one lock makes mutations atomic."""

    def put_if_absent(self, path: str, data: Data) -> None:
        full = self._path(path)
        with self._translating("put_if_absent", path), _MEMORY_LOCK:
            if full in self._fs.store:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), full)
            self._fs.pipe_file(full, _bytes(data))

    def write(self, path: str, data: Data) -> None:
        with _MEMORY_LOCK:
            super().write(path, data)

    def delete(self, path: str) -> None:
        with _MEMORY_LOCK:
            super().delete(path)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        with _MEMORY_LOCK:
            return super().list(prefix)


@functools.cache
def _s3_errors() -> tuple[type[BaseException], ...]:
    import aiohttp
    import botocore.exceptions

    return (
        OSError,
        botocore.exceptions.BotoCoreError,
        botocore.exceptions.ClientError,
        aiohttp.ClientError,
    )


class S3Storage(FsspecStorage):
    """Objects on S3 through s3fs.

    ``write`` is one PUT (a multipart upload above 100 MB, also atomic); ``put_if_absent`` is
    a PUT with ``If-None-Match: *`` (s3fs ``pipe_file(mode="create")``), which S3 answers with
    412 if the key exists and s3fs raises as ``FileExistsError``. ``read_range`` is a ranged
    GET. Listing is never cached (``use_listings_cache=False`` by default).

    Storages opened with equal options share one client (fsspec's instance cache), which
    lives until the process exits; with ``skip_instance_cache=True`` a Storage has its own
    client, and :meth:`close` closes it.
    """

    def _backend_errors(self) -> tuple[type[BaseException], ...]:
        return _s3_errors()

    def read_range(self, path: str, start: int, end: int) -> bytes:
        full = self._path(path)
        _check_range(start, end)
        with self._translating("read_range", path):
            if start == end:
                self._file_size(full)
                return b""
            try:
                data: bytes = self._fs.cat_file(full, start=start, end=end)
            except FileNotFoundError:
                raise
            except OSError:
                # S3 answers 416 for a range that starts at or past the end; that is b"".
                if start < self._file_size(full):
                    raise
                return b""
            return data

    def _file_size(self, full: str) -> int:
        # One HEAD; fs.info() would also list the prefix to tell a directory from nothing.
        bucket, key, _ = self._fs.split_path(full)
        head = self._fs.call_s3("head_object", Bucket=bucket, Key=key)
        size: int = head["ContentLength"]
        return size

    def put_if_absent(self, path: str, data: Data) -> None:
        full = self._path(path)
        with self._translating("put_if_absent", path):
            self._fs.pipe_file(full, _bytes(data), mode="create")

    def close(self) -> None:
        if not self._owns_fs:
            return
        self._owns_fs = False
        creator = getattr(self._fs, "_s3creator", None)
        if creator is not None:
            # s3fs has no public close; this is what its own finalizer runs at exit.
            with self._translating("close", ""):
                type(self._fs).close_session(self._fs.loop, creator)
