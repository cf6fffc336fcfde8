"""The node's garbage-collector policy (replication.server.gc_policy): the survivors of each
full collection are frozen, young collections change nothing, and once an interval the whole
heap goes back to the collector."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from replication.server.gc_policy import GcPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop for the policy, with the collector's automatic runs off: only the
    test's own ``gc.collect`` calls happen (explicit collections run while it is off)."""
    loop = asyncio.new_event_loop()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield loop
    finally:
        loop.close()
        gc.unfreeze()  # the rest of the test process collects as usual
        if enabled:
            gc.enable()


def frozen(obj: object) -> bool:
    """Whether ``obj`` (a tracked object) is in the permanent generation: in no other."""
    return not any(o is obj for generation in range(3) for o in gc.get_objects(generation))


def run_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Run what the collector's callback handed to the loop."""
    loop.run_until_complete(asyncio.sleep(0))


@pytest.mark.unit
def test_survivors_of_full_collections_are_frozen(loop: asyncio.AbstractEventLoop) -> None:
    clock = Clock()
    policy = GcPolicy(loop, unfreeze_interval_s=600, clock=clock)
    policy.start()
    try:
        assert gc.get_freeze_count() > 0
        assert policy.freezes == 1
        kept = [[i] for i in range(100)]  # survivors to come: tracked lists
        gc.collect(0)  # a young collection: nothing to do
        run_pending(loop)
        assert (policy.full_collections, policy.freezes) == (0, 1)
        assert not frozen(kept[0])
        gc.collect()  # a full collection: its survivors are frozen
        run_pending(loop)
        assert (policy.full_collections, policy.freezes) == (1, 2)
        assert frozen(kept[0])
        assert frozen(kept[-1])
    finally:
        policy.stop()


@pytest.mark.unit
def test_the_whole_heap_goes_back_once_an_interval(loop: asyncio.AbstractEventLoop) -> None:
    clock = Clock()
    policy = GcPolicy(loop, unfreeze_interval_s=600, clock=clock)
    policy.start()
    try:
        clock.now += 601
        gc.collect()
        run_pending(loop)
        assert policy.unfreezes == 1
        assert gc.get_freeze_count() == 0  # the next full collection scans everything
        gc.collect()
        run_pending(loop)  # and freezing resumes after it
        assert (policy.unfreezes, policy.freezes) == (1, 2)
        assert gc.get_freeze_count() > 0
    finally:
        policy.stop()


@pytest.mark.unit
def test_a_stopped_policy_follows_nothing(loop: asyncio.AbstractEventLoop) -> None:
    policy = GcPolicy(loop)
    policy.start()
    policy.stop()
    gc.collect()
    run_pending(loop)
    assert (policy.full_collections, policy.freezes) == (0, 1)
    with pytest.raises(ValueError, match="unfreeze_interval_s"):
        GcPolicy(loop, unfreeze_interval_s=0)
