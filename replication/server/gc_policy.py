"""A node's garbage-collector policy: full collections that scan what survived since the last.

CPython's cyclic collector scans every tracked object in a full (generation 2) collection and
runs one whenever the objects that survived the young generations grew by a quarter since the
last. A broker's heap is mostly long-lived: its modules, classes and functions (about 95,000
objects once started) and the WAL index (about 15 objects per WAL object, thousands of small
L0 objects until they are compacted). Measured on a synchronous acks=all run (3 brokers, one
record at a time, 40 s): full collections every ~10 s taking 50-85 ms and growing with the
index, each one a pause of the broker's event loop and so of every request it serves; the
producer saw them as 50-90 ms sends.

So, as servers that preload their code do with :func:`gc.freeze`: once the node has started,
and again after every full collection, the survivors move to the permanent generation, and
the next full collection scans only what survived since (the same run: no send over 30 ms
after the start). A frozen object that later becomes part of unreachable cycles is not
collected while frozen, so every ``unfreeze_interval_s`` the permanent generation goes back
(:func:`gc.unfreeze`): the next full collection scans, and collects, the whole heap once, and
freezing resumes after it. Acyclic garbage never waits: reference counting frees it, frozen
or not.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["GcPolicy"]

log = logging.getLogger(__name__)

#: how often the whole heap is collected once (its cycles among long-frozen objects)
UNFREEZE_INTERVAL_S = 600.0


class GcPolicy:
    """Freeze the survivors of each full collection (see the module docstring).

    ``start()`` on the node's event loop once the node has started; ``stop()`` at shutdown.
    The collector's callback may run on any thread: it only schedules the freeze on ``loop``.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        unfreeze_interval_s: float = UNFREEZE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if unfreeze_interval_s <= 0:
            raise ValueError(f"unfreeze_interval_s must be > 0, not {unfreeze_interval_s}")
        self._loop = loop
        self._interval_s = unfreeze_interval_s
        self._clock = clock
        self._last_unfreeze = clock()
        self._started = False
        #: full collections seen, and how many of them were followed by a freeze / an unfreeze
        self.full_collections = 0
        self.freezes = 0
        self.unfreezes = 0

    def start(self) -> None:
        """Collect what starting left behind, freeze the rest, and follow full collections."""
        if self._started:
            return
        self._started = True
        gc.collect()
        gc.freeze()
        self.freezes += 1
        self._last_unfreeze = self._clock()
        gc.callbacks.append(self._on_gc)
        log.debug("gc: froze %d objects after start", gc.get_freeze_count())

    def stop(self) -> None:
        """Stop following collections (what is frozen stays so until the process exits)."""
        if not self._started:
            return
        self._started = False
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:  # removed by someone else
            pass

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Inside the collector, on whichever thread allocated: only note it and hand over.
        if phase != "stop" or info.get("generation") != 2:
            return
        self.full_collections += 1
        try:
            self._loop.call_soon_threadsafe(self._after_full_collection)
        except RuntimeError:  # the loop is closed: the node is gone
            pass

    def _after_full_collection(self) -> None:
        if not self._started:
            return
        now = self._clock()
        if now - self._last_unfreeze >= self._interval_s:
            gc.unfreeze()  # the next full collection scans the whole heap, then we freeze again
            self._last_unfreeze = now
            self.unfreezes += 1
            return
        gc.freeze()
        self.freezes += 1
