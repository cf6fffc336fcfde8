"""Delayed operations and their purgatory, as Kafka's DelayedOperationPurgatory.

A request that cannot be answered yet (a Fetch waiting for min_bytes, an acks=all Produce
waiting for the ISR) parks here as a :class:`DelayedOperation` watched under keys (partitions).
Whenever something happens to a partition (an append, a flush, an HW move, a leadership
change), ``check_and_complete(key)`` re-tests the operations watching it; each completes as
soon as its condition holds, or when its timeout fires. Everything runs on the broker's event
loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from contextvars import ContextVar

#: seconds the current request has spent parked in a purgatory ([total], set per request by
#: the socket server): its handling time without them is what the client request quota meters
PARKED: ContextVar[list[float] | None] = ContextVar("PARKED", default=None)


class DelayedOperation:
    """Completes when ``condition()`` is true or after ``timeout_ms``; result: True if met."""

    def __init__(self, condition: Callable[[], bool], timeout_ms: int) -> None:
        self.condition = condition
        self.timeout_ms = timeout_ms
        self.future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    @property
    def done(self) -> bool:
        return self.future.done()

    def try_complete(self) -> bool:
        if self.future.done():
            return True
        if self.condition():
            self.future.set_result(True)
            return True
        return False

    def expire(self) -> None:
        if not self.future.done():
            self.future.set_result(False)


class Purgatory:
    def __init__(self, name: str) -> None:
        self.name = name
        self._watchers: dict[Hashable, list[DelayedOperation]] = defaultdict(list)

    def __len__(self) -> int:
        return sum(len(ops) for ops in self._watchers.values())

    async def wait(self, op: DelayedOperation, keys: Iterable[Hashable]) -> bool:
        """Complete ``op`` now if it can, else park it under ``keys`` until done or expired."""
        if op.try_complete():
            return True
        keys = list(keys)
        for key in keys:
            self._watchers[key].append(op)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(op.timeout_ms / 1000, op.expire)
        parked_at = loop.time()
        try:
            return await op.future
        finally:
            timer.cancel()
            parked = PARKED.get()
            if parked is not None:
                parked[0] += loop.time() - parked_at
            for key in keys:
                ops = self._watchers.get(key)
                if ops is not None:
                    ops[:] = [o for o in ops if o is not op]
                    if not ops:
                        del self._watchers[key]

    def check_and_complete(self, key: Hashable) -> int:
        """Re-test the operations watching ``key``; returns how many completed."""
        ops = self._watchers.get(key)
        if not ops:
            return 0
        return sum(1 for op in list(ops) if not op.done and op.try_complete())

    def complete_all(self) -> None:
        """Expire everything (shutdown)."""
        for ops in list(self._watchers.values()):
            for op in ops:
                op.expire()
