"""Reading a node's state for a scrape on the node's event loop.

prometheus_client calls collectors on its HTTP server thread, while the broker's state
(partitions, purgatories, coordinators) changes on the event loop thread without locks. A
collector therefore hands its read to the loop and waits for it: the values of one scrape are
consistent with each other, and no dict is iterated while the loop changes it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: how long a scrape waits for a busy event loop before failing (Prometheus's own scrape
#: timeout is 10 s by default)
LOOP_TIMEOUT_S = 5.0


def on_loop(loop: asyncio.AbstractEventLoop | None, read: Callable[[], T]) -> T:
    """``read()`` run on ``loop`` (directly if there is none, it is not running, or this is
    its thread).

    TimeoutError if the loop does not run it within :data:`LOOP_TIMEOUT_S`: the scrape fails
    (HTTP 500), which Prometheus records as ``up == 0`` for the node.
    """
    if loop is None or not loop.is_running() or _runs_on(loop):
        return read()
    done: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if not done.set_running_or_notify_cancel():
            return
        try:
            done.set_result(read())
        except Exception as err:  # noqa: BLE001 - handed to the scraping thread, raised there
            done.set_exception(err)

    loop.call_soon_threadsafe(run)
    try:
        return done.result(LOOP_TIMEOUT_S)
    except concurrent.futures.TimeoutError:
        done.cancel()
        raise TimeoutError(
            f"the node's event loop did not answer a metrics scrape within {LOOP_TIMEOUT_S} s"
        ) from None


def _runs_on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop runs in this thread
        return False
