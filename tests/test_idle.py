"""An idle broker does not poll: the group coordinator's timed work (session expiry, the end
of a rebalance) runs at its deadlines or when a request moves one, not on a fixed 100 ms tick;
the controller renews a steady broker's session without a thread hop or a metadata write.
These tests count passes and writes over idle windows; they never time anything."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest

from logstore.storage import Storage
from replication.controller.controller import Controller
from replication.coordinator.group import (
    GroupConfig,
    GroupCoordinator,
    GroupState,
    JoinRequest,
    JoinResult,
    _now_ms,
    _OffsetsPartition,
)
from replication.errors import MemberIdRequiredError
from replication.metadata.image import MetadataImage
from replication.metadata.store import MetadataStore
from replication.server.node import Node

pytestmark = pytest.mark.unit

SESSION_MS = 300


def coordinator() -> GroupCoordinator:
    async def append(index: int, records: bytes) -> int:
        return 0

    c = GroupCoordinator(
        0,
        GroupConfig(num_partitions=1, min_session_timeout_ms=1, initial_rebalance_delay_ms=0),
        MetadataImage,
        append,
        _now_ms,
    )
    c.partitions[0] = _OffsetsPartition(0, 0, loaded=True)
    return c


def join(c: GroupCoordinator, member_id: str = "") -> asyncio.Future[JoinResult]:
    request = JoinRequest(
        "g", member_id, None, "client", "", SESSION_MS, SESSION_MS, "consumer", (("range", b""),)
    )
    return asyncio.ensure_future(c.join_group(request))


async def idle_window(seconds: float) -> None:
    """Let the loop run with nothing to do (this is the window counted over, not a wait for
    a condition)."""
    await asyncio.sleep(seconds)


def test_ticker_sleeps_with_no_groups() -> None:
    async def main() -> None:
        c = coordinator()
        ticker = asyncio.create_task(Node._tick_groups(c))
        await idle_window(1.0)  # ten 100 ms ticks' worth
        assert c.ticks == 0
        assert c.next_deadline_ms() is None
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker

    asyncio.run(main())


def test_ticker_expires_a_silent_member_at_its_deadline() -> None:
    """A member joins and syncs, then never heartbeats: the ticker removes it once its session
    runs out, after a bounded number of passes (a 100 ms poll would make many more while the
    group rebalances and waits)."""

    async def main() -> None:
        c = coordinator()
        ticker = asyncio.create_task(Node._tick_groups(c))
        first = await join(c)
        assert first.error is MemberIdRequiredError
        result = await join(c, first.member_id)
        assert result.error is None
        await c.sync_group("g", result.generation_id, result.member_id, None, {})
        group = c.describe_group("g")
        assert group is not None
        assert group.is_(GroupState.STABLE)
        deadline = c.next_deadline_ms()
        member = group.members[result.member_id]
        assert deadline == member.last_heartbeat_ms + SESSION_MS + 1
        for _ in range(100):  # the session is 300 ms; wait for the ticker to act, bounded
            if not group.members:
                break
            await idle_window(0.1)
        assert not group.members, "the silent member's session ran out but it is still there"
        assert group.is_(GroupState.EMPTY)
        # one pass per join/sync wake-up and one at the deadline (plus at most a couple of
        # backstop wake-ups while the member was there), not one per 100 ms
        assert c.ticks <= 8, c.ticks
        ticks = c.ticks
        await idle_window(1.0)
        assert c.ticks == ticks  # empty group: next deadline is offsets retention, days away
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker

    asyncio.run(main())


def test_ticker_does_not_spin_on_a_rebalance_waiting_for_members() -> None:
    """A rebalance past its initial delay that still waits for a member to rejoin has a
    deadline in the past that tick() cannot resolve: the ticker must sleep until the
    rebalance timeout (or a join), not tick again at once in a loop that starves the event
    loop. The waiting join completes at the rebalance timeout, without the old member."""

    async def main() -> None:
        c = coordinator()
        ticker = asyncio.create_task(Node._tick_groups(c))
        first = await join(c)
        a = await join(c, first.member_id)
        await c.sync_group("g", a.generation_id, a.member_id, None, {})
        second = await join(c)
        assert second.error is MemberIdRequiredError
        waiting = join(c, second.member_id)  # a rebalance: member a has not rejoined
        loop_turns = 0
        while not waiting.done() and loop_turns < 100:
            await idle_window(0.05)  # would never return if the ticker held the loop
            loop_turns += 1
        assert waiting.done(), "the rebalance never ended at its timeout"
        b = waiting.result()
        assert b.error is None
        assert b.members is not None
        assert [m[0] for m in b.members] == [second.member_id]
        assert c.ticks <= 10, c.ticks
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker

    asyncio.run(main())


def test_steady_heartbeat_renews_the_session_without_a_metadata_write(tmp_path: Path) -> None:
    """The controller's loop-side heartbeat (no thread hop) renews a registered, unfenced
    broker's session and writes nothing; a stale epoch, a fenced broker, or a lock held by
    a metadata write fall back to heartbeat() in a thread (None here)."""
    c = Controller(MetadataStore(Storage.from_url(tmp_path.as_uri())), 100, "127.0.0.1", 9100)
    c.activate()
    info = c.register_broker(0, "127.0.0.1", 9000, None)
    writes: list[str] = []
    c.store.storage.observer = lambda op, seconds, err: writes.append(op)
    version = c.image.version
    assert c.heartbeat_in_memory(0, info.epoch) == info
    assert c.heartbeat_in_memory(0, info.epoch + 1) is None  # stale epoch: heartbeat() raises
    assert c.heartbeat_in_memory(1, 1) is None  # unknown broker
    assert not c.sessions_expired()
    held = threading.Event()
    release = threading.Event()

    def hold_lock() -> None:
        with c._lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=hold_lock)
    thread.start()
    held.wait()
    try:
        assert c.heartbeat_in_memory(0, info.epoch) is None  # never waits for the lock
    finally:
        release.set()
        thread.join()
    assert writes == []
    assert c.image.version == version
