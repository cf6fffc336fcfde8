"""The tail cache: recently written (or read) object bytes kept in memory, so that a follower
or a tailing consumer is served without a GET.

Kafka leaves this to the operating system's page cache, which is bounded by the machine's
memory whatever the number of partitions. Object storage has no page cache, so replog keeps
the bytes itself, and bounds them twice:

- per log, by ``log.tail.cache.bytes`` (a topic config, read at every insert);
- per broker, by ``log.tail.cache.total.bytes`` over every log it hosts: one
  :class:`TailCache` is shared by all of them, and the least recently used entry of any log
  goes first. Without this bound a broker's memory grew with its partition count times the
  per-log limit (32 MiB each by default).

A standalone :class:`~logstore.log.Log` gets a cache of its own, bounded per log only.

Each entry is an object's (or chunk's) immutable bytes under its name, owned by one log,
and marked *checked* when every batch in it is known CRC-valid (written from appended
batches, checked on append): only checked bytes are served as they are.

>>> cache = TailCache(total_bytes=10)
>>> a, b = cache.owner(), cache.owner()
>>> cache.put(a, "x", b"123456", limit_bytes=8, checked=True)
>>> cache.put(b, "y", b"7890", limit_bytes=8)
>>> cache.get(a, "x"), cache.checked(b, "y")
(b'123456', None)
>>> cache.put(b, "z", b"ab", limit_bytes=8)  # over the total: the least recently used goes
>>> cache.get(b, "y"), cache.get(a, "x"), cache.size_bytes
(None, b'123456', 8)
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Final

#: The default bound over every log of a broker (``log.tail.cache.total.bytes``).
DEFAULT_TOTAL_BYTES: Final = 128 * 1024 * 1024

_owners = itertools.count(1)


class TailCache:
    """An LRU of object bytes shared by logs, bounded per owner and in total (see the module
    doc). Thread-safe; it takes no other lock while holding its own, so a log may call it
    while holding its state lock."""

    def __init__(self, total_bytes: int | None = DEFAULT_TOTAL_BYTES) -> None:
        #: the bound over every owner; None: bounded per owner only
        self.total_bytes = total_bytes
        self._lock = threading.Lock()
        #: (owner, name) -> (bytes, checked), least recently used first
        self._entries: OrderedDict[tuple[int, str], tuple[bytes, bool]] = OrderedDict()
        #: each owner's names, least recently used first, and its bytes
        self._names: dict[int, OrderedDict[str, None]] = {}
        self._owner_bytes: dict[int, int] = {}
        self._bytes = 0

    @staticmethod
    def owner() -> int:
        """A new owner's key (one per log)."""
        return next(_owners)

    @property
    def size_bytes(self) -> int:
        """The bytes held, over every owner."""
        return self._bytes

    def put(
        self, owner: int, name: str, data: bytes, *, limit_bytes: int, checked: bool = False
    ) -> None:
        """Keep ``data`` under ``name`` for ``owner`` (replacing what was there), then evict
        the owner's least recent entries while it holds more than ``limit_bytes``, and
        anyone's while the cache holds more than its total. Bytes larger than either bound
        are not kept."""
        total = self.total_bytes
        if len(data) > limit_bytes or (total is not None and len(data) > total):
            self.drop(owner, name)
            return
        with self._lock:
            self._drop_locked(owner, name)
            self._entries[(owner, name)] = (data, checked)
            self._names.setdefault(owner, OrderedDict())[name] = None
            self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + len(data)
            self._bytes += len(data)
            names = self._names[owner]
            while self._owner_bytes[owner] > limit_bytes:
                self._drop_locked(owner, next(iter(names)))
            while total is not None and self._bytes > total:
                self._drop_locked(*next(iter(self._entries)))

    def get(self, owner: int, name: str, *, touch: bool = True) -> bytes | None:
        """The bytes under ``name``, checked or not (``touch``: as most recently used)."""
        with self._lock:
            entry = self._entries.get((owner, name))
            if entry is None:
                return None
            if touch:
                self._entries.move_to_end((owner, name))
                self._names[owner].move_to_end(name)
            return entry[0]

    def checked(self, owner: int, name: str) -> bytes | None:
        """The bytes under ``name`` if every batch in them is known CRC-valid, else None."""
        with self._lock:
            entry = self._entries.get((owner, name))
            return entry[0] if entry is not None and entry[1] else None

    def drop(self, owner: int, name: str) -> None:
        with self._lock:
            self._drop_locked(owner, name)

    def drop_owner(self, owner: int) -> None:
        """Forget every entry of ``owner`` (its log was closed, deleted or collected)."""
        with self._lock:
            for name in list(self._names.get(owner, ())):
                self._drop_locked(owner, name)

    def _drop_locked(self, owner: int, name: str) -> None:
        entry = self._entries.pop((owner, name), None)
        if entry is None:
            return
        names = self._names[owner]
        del names[name]
        self._owner_bytes[owner] -= len(entry[0])
        self._bytes -= len(entry[0])
        if not names:
            del self._names[owner]
            del self._owner_bytes[owner]
