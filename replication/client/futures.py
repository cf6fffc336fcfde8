"""Light produce futures: real :class:`concurrent.futures.Future` objects, cheap in bulk.

A producer hands out one future per record, so their cost is part of the cost of ``send()``
and of completing a batch. A stock ``Future()`` builds its own ``threading.Condition`` (about
ten garbage-collected objects, ~2 us) and ``set_result`` runs ~10 Python calls (~3 us).
Here every record of a batch shares the batch's condition, the waiter and callback lists are
created only when used, and :func:`complete_all` / :func:`fail_all` finish a whole batch under
one lock acquisition.

This leans on the attributes of CPython's ``concurrent.futures.Future`` (``_condition``,
``_state``, ``_result``, ``_exception``, ``_waiters``, ``_done_callbacks``,
``_invoke_callbacks``), unchanged since Python 3.2; tests cover ``result()``,
``exception()``, callbacks, ``concurrent.futures.wait`` and ``as_completed`` so a change
would show. Because the condition is shared, a waiter can wake for another record's
completion; :meth:`ProduceFuture.result` and :meth:`ProduceFuture.exception` wait again then.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import Any, Final

__all__ = ["ProduceFuture", "complete_all", "fail_all", "failed_future"]

_DONE: Final = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))
_NO_CALLBACKS: Final[tuple[Any, ...]] = ()


class ProduceFuture(Future[Any]):
    """The future of one produced record (or batch). It cannot be cancelled: the record was
    handed to the producer."""

    #: The waiter list, created on first use (a class default keeps instances dict-free).
    _waiter_list: list[Any] | None = None

    def __init__(self, condition: threading.Condition | None = None) -> None:
        # Deliberately not Future.__init__: share ``condition`` and create lists lazily.
        self._condition = threading.Condition() if condition is None else condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._done_callbacks: list[Any] | tuple[Any, ...] = _NO_CALLBACKS

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        # concurrent.futures.wait / as_completed append to it; created on first use.
        waiters = self._waiter_list
        if waiters is None:
            waiters = self._waiter_list = []
        return waiters

    def cancel(self) -> bool:
        return False

    def add_done_callback(self, fn: Callable[[Future[Any]], object]) -> None:
        with self._condition:
            if self._done_callbacks is _NO_CALLBACKS:
                self._done_callbacks = []
        super().add_done_callback(fn)

    def _wait_done(self, timeout: float | None) -> None:
        """Wait (condition held) until done; TimeoutError after ``timeout`` seconds."""
        if self._state in _DONE:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._state not in _DONE:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError()
            self._condition.wait(remaining)

    def result(self, timeout: float | None = None) -> Any:
        with self._condition:
            self._wait_done(timeout)
            return super().result(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        with self._condition:
            self._wait_done(timeout)
            return super().exception(0)


def _finish_all(
    futures: Sequence[ProduceFuture], results: Sequence[object] | None, error: BaseException | None
) -> None:
    """Finish futures that share one condition under one acquisition, then run callbacks."""
    if not futures:
        return
    condition = futures[0]._condition
    with condition:
        for i, future in enumerate(futures):
            if future._condition is not condition:
                raise ValueError("complete_all/fail_all need futures that share one condition")
            if future._state in _DONE:
                raise InvalidStateError(f"{future!r} is already done")
            if error is None:
                assert results is not None
                future._result = results[i]
            else:
                future._exception = error
            future._state = FINISHED
            waiters = future._waiter_list
            if waiters:
                for waiter in waiters:
                    if error is None:
                        waiter.add_result(future)
                    else:
                        waiter.add_exception(future)
        condition.notify_all()
    for future in futures:
        if future._done_callbacks:
            future._invoke_callbacks()  # type: ignore[attr-defined]


def complete_all(futures: Sequence[ProduceFuture], results: Sequence[object]) -> None:
    """Set the result of every future (all sharing one condition), then run callbacks."""
    if len(results) != len(futures):
        raise ValueError(f"{len(futures)} futures but {len(results)} results")
    _finish_all(futures, results, None)


def fail_all(futures: Sequence[ProduceFuture], error: BaseException) -> None:
    """Set ``error`` on every future (all sharing one condition), then run callbacks."""
    _finish_all(futures, None, error)


def failed_future(error: BaseException) -> ProduceFuture:
    future = ProduceFuture()
    future.set_exception(error)
    return future
