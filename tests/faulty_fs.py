"""A Storage that fails on command, for fault tests.

:class:`FaultyStorage` wraps any :class:`~logstore.storage.Storage` and forwards every call to
it, except the calls it was told to fail::

    storage = FaultyStorage(Storage.from_url("memory://t/broker-0"))
    storage.fail("write")                       # the next write raises, nothing is written
    storage.fail("put_if_absent", after=True)   # the next one writes, then raises: the
                                                # outcome-unknown case
    storage.fail("read_range", times=3, path_prefix="orders/0/")
    storage.stall("write", 0.5, times=4)        # the next 4 writes wait 0.5 s, then happen
    storage.tear(times=2, fraction=0.5)         # the next 2 writes store the first half of
                                                # the object, then raise (a torn write)
    storage.heal()                              # forget every pending fault

Injected failures raise :class:`InjectedStorageError`, a :class:`StorageError`, so code under
test sees what a real backend failure looks like, and the test can still tell them apart.
A torn write breaks the Storage contract on purpose (a write is atomic on every real backend):
it models a store that leaves part of an object behind, which recovery must cut away by CRC.
Children (:meth:`FaultyStorage.child`) share their parent's faults; ``path_prefix`` is matched
against the path relative to the outermost FaultyStorage. ``calls`` counts the calls per
operation, failed or not.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from logstore.errors import StorageError
from logstore.journal import DEFAULT_CAPACITY, DEFAULT_MAX_OBJECT_BYTES
from logstore.storage import Data, ObjectInfo, Storage

T = TypeVar("T")

OPERATIONS = frozenset(
    {"read", "read_range", "write", "put_if_absent", "list", "delete", "exists", "size"}
)


#: Operations :meth:`FaultyStorage.tear` can tear: the ones that store an object's bytes.
TEARABLE = frozenset({"write", "put_if_absent"})


class InjectedStorageError(StorageError):
    """A failure injected by FaultyStorage."""


@dataclass
class _Fault:
    op: str
    remaining: int
    after: bool
    path_prefix: str
    #: "fail" (raise), "stall" (wait ``delay_s``, then carry on) or "tear" (store the first
    #: ``fraction`` of the bytes, then raise)
    kind: str = "fail"
    delay_s: float = 0.0
    fraction: float = 0.0


class _Plan:
    """The faults and call counts shared by a FaultyStorage and its children."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.faults: list[_Fault] = []
        self.calls: Counter[str] = Counter()

    def take(self, op: str, path: str) -> _Fault | None:
        """Count the call; consume and return the first pending fault that matches it."""
        with self.lock:
            self.calls[op] += 1
            for fault in self.faults:
                if fault.op == op and path.startswith(fault.path_prefix):
                    fault.remaining -= 1
                    if fault.remaining == 0:
                        self.faults.remove(fault)
                    return fault
        return None


class FaultyStorage(Storage):
    """Delegates to ``inner``, failing the calls :meth:`fail` asks for."""

    def __init__(self, inner: Storage, *, _plan: _Plan | None = None, _base: str = "") -> None:
        self.inner = inner
        self.url = inner.url
        self._plan = _plan or _Plan()
        self._base = _base

    # --- control ---------------------------------------------------------------------------

    def fail(self, op: str, times: int = 1, *, after: bool = False, path_prefix: str = "") -> None:
        """Make the next ``times`` calls of ``op`` raise :class:`InjectedStorageError`.

        With ``after=False`` the call fails before it reaches the inner storage (nothing
        happens); with ``after=True`` it is carried out and then raises (the caller cannot
        know it happened). Only calls on paths starting ``path_prefix`` count.
        """
        self._arm(_Fault(op, times, after, path_prefix))

    def stall(self, op: str, seconds: float, times: int = 1, *, path_prefix: str = "") -> None:
        """Make the next ``times`` calls of ``op`` wait ``seconds`` before they are carried
        out (slow storage: the call then succeeds or fails as the inner storage decides)."""
        if seconds < 0:
            raise ValueError(f"seconds must be at least 0, not {seconds}")
        self._arm(_Fault(op, times, False, path_prefix, kind="stall", delay_s=seconds))

    def tear(
        self, op: str = "write", times: int = 1, *, fraction: float = 0.5, path_prefix: str = ""
    ) -> None:
        """Make the next ``times`` calls of ``op`` (a write or put-if-absent) store only the
        first ``fraction`` of the object's bytes, then raise :class:`InjectedStorageError`."""
        if op not in TEARABLE:
            raise ValueError(f"cannot tear {op!r}; expected one of {sorted(TEARABLE)}")
        if not 0 <= fraction < 1:
            raise ValueError(f"fraction must be in [0, 1), not {fraction}")
        self._arm(_Fault(op, times, False, path_prefix, kind="tear", fraction=fraction))

    def _arm(self, fault: _Fault) -> None:
        if fault.op not in OPERATIONS:
            raise ValueError(
                f"unknown operation {fault.op!r}; expected one of {sorted(OPERATIONS)}"
            )
        if fault.remaining < 1:
            raise ValueError(f"times must be at least 1, not {fault.remaining}")
        with self._plan.lock:
            self._plan.faults.append(fault)

    def heal(self) -> None:
        """Forget every pending fault."""
        with self._plan.lock:
            self._plan.faults.clear()

    @property
    def pending(self) -> int:
        """How many injected failures are still to come."""
        with self._plan.lock:
            return sum(fault.remaining for fault in self._plan.faults)

    @property
    def calls(self) -> Counter[str]:
        """Calls per operation so far (a copy), including the failed ones."""
        with self._plan.lock:
            return Counter(self._plan.calls)

    def _call(
        self,
        op: str,
        path: str,
        action: Callable[[], T],
        torn: Callable[[float], object] | None = None,
    ) -> T:
        full = f"{self._base}/{path}" if self._base and path else self._base or path
        fault = self._plan.take(op, full)
        if fault is None:
            return action()
        if fault.kind == "stall":
            time.sleep(fault.delay_s)
            return action()
        if fault.kind == "tear":
            assert torn is not None, f"{op} cannot be torn"
            torn(fault.fraction)
            raise InjectedStorageError(
                f"{op} {self.url}/{path} failed: injected torn write ({fault.fraction:.0%} stored)"
            )
        if fault.after:
            action()
        when = "after" if fault.after else "before"
        raise InjectedStorageError(f"{op} {self.url}/{path} failed: injected fault ({when})")

    # --- Storage ---------------------------------------------------------------------------

    def read(self, path: str) -> bytes:
        return self._call("read", path, lambda: self.inner.read(path))

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return self._call("read_range", path, lambda: self.inner.read_range(path, start, end))

    def exists(self, path: str) -> bool:
        return self._call("exists", path, lambda: self.inner.exists(path))

    def size(self, path: str) -> int:
        return self._call("size", path, lambda: self.inner.size(path))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self._call("list", prefix, lambda: self.inner.list(prefix))

    def write(self, path: str, data: Data) -> None:
        self._call(
            "write",
            path,
            lambda: self.inner.write(path, data),
            lambda fraction: self.inner.write(path, _prefix(data, fraction)),
        )

    def put_if_absent(self, path: str, data: Data) -> None:
        self._call(
            "put_if_absent",
            path,
            lambda: self.inner.put_if_absent(path, data),
            lambda fraction: self.inner.put_if_absent(path, _prefix(data, fraction)),
        )

    def delete(self, path: str) -> None:
        self._call("delete", path, lambda: self.inner.delete(path))

    def delete_temp_files(self, prefix: str = "") -> int:
        return self.inner.delete_temp_files(prefix)

    def journal(
        self,
        prefix: str,
        *,
        max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES,
        capacity: int = DEFAULT_CAPACITY,
    ) -> bool:
        # The inner store journals; faults still apply here, before its writes (a torn write
        # journals the prefix of the object: a whole frame holding a torn WAL object).
        return self.inner.journal(prefix, max_object_bytes=max_object_bytes, capacity=capacity)

    def child(self, prefix: str) -> FaultyStorage:
        base = f"{self._base}/{prefix}" if self._base else prefix
        return FaultyStorage(self.inner.child(prefix), _plan=self._plan, _base=base)

    def close(self) -> None:
        self.inner.close()


def _prefix(data: Data, fraction: float) -> bytes:
    """The first ``fraction`` of ``data``: what a torn write leaves behind."""
    return bytes(data[: int(len(data) * fraction)])
