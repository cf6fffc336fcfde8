"""An idle broker does not poll: the group coordinator's timed work (session expiry, the end
of a rebalance) runs at its deadlines or when a request moves one, not on a fixed 100 ms tick;
the controller renews a steady broker's session without a thread hop or a metadata write.
These tests count passes and writes over idle windows; they never time anything."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from logstore.storage import Storage
from replication.config import broker_config_from
from replication.controller.controller import Controller
from replication.controller.service import ControllerService
from replication.coordinator.group import GroupCoordinator
from replication.coordinator.group_metadata import GroupConfig, GroupState, JoinRequest, JoinResult
from replication.coordinator.group_metadata_manager import OffsetsPartition, now_ms
from replication.errors import MemberIdRequiredError, NotEnoughReplicasError
from replication.metadata.image import MetadataImage
from replication.metadata.store import MetadataStore
from replication.server.node import Node
from tests.helpers import register_live

pytestmark = pytest.mark.unit

SESSION_MS = 300


def coordinator(
    time_ms: Callable[[], int] = now_ms,
    append: Callable[[int, bytes], Awaitable[int]] | None = None,
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000,
) -> GroupCoordinator:
    async def appended(index: int, records: bytes) -> int:
        return 0

    c = GroupCoordinator(
        0,
        GroupConfig(
            num_partitions=1,
            min_session_timeout_ms=1,
            initial_rebalance_delay_ms=0,
            offsets_retention_ms=offsets_retention_ms,
        ),
        MetadataImage,
        append or appended,
        time_ms,
    )
    c.partitions[0] = OffsetsPartition(0, 0, loaded=True)
    return c


def join(
    c: GroupCoordinator, member_id: str = "", rebalance_timeout_ms: int = SESSION_MS
) -> asyncio.Future[JoinResult]:
    request = JoinRequest(
        "g",
        member_id,
        None,
        "client",
        "",
        SESSION_MS,
        rebalance_timeout_ms,
        "consumer",
        (("range", b""),),
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
    info = register_live(c, 0, "127.0.0.1", 9000)
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


class Clock:
    """The coordinator's clock, moved by the test (its deadlines are in it); the ticker's
    sleeps stay real, so a deadline passes only when the test moves the clock."""

    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def test_a_member_that_waited_long_in_a_rebalance_gets_a_whole_session_after_it() -> None:
    """A member waits in JoinGroup (no heartbeats) longer than its session while the
    rebalance waits for a slower member; when the rebalance ends its session restarts (as
    Kafka's completeAndScheduleNextHeartbeatExpiration), so the ticker, woken by that join,
    does not expire it before its JoinGroup answer even reached it. Likewise a member that
    waited in SyncGroup for the leader. The clock only moves when the test moves it."""

    async def main() -> None:
        clock = Clock()
        c = coordinator(clock)
        ticker = asyncio.create_task(Node._tick_groups(c))
        first = await join(c, rebalance_timeout_ms=10 * SESSION_MS)
        a = await join(c, first.member_id, rebalance_timeout_ms=10 * SESSION_MS)
        await c.sync_group("g", a.generation_id, a.member_id, None, {})
        group = c.describe_group("g")
        assert group is not None
        assert group.is_(GroupState.STABLE)
        b_id = (await join(c)).member_id  # pending: the rebalance waits for b to join
        a_waiting = join(c, a.member_id, rebalance_timeout_ms=10 * SESSION_MS)
        await idle_window(0.05)
        assert group.is_(GroupState.PREPARING_REBALANCE)
        assert not a_waiting.done()
        clock.ms += 3 * SESSION_MS  # a waits in JoinGroup three sessions long
        b = await join(c, b_id)  # everyone is in: the rebalance ends, the ticker wakes
        a2 = await a_waiting
        assert a2.error is None
        assert b.error is None
        await idle_window(0.1)  # the ticker runs (its wake-up) at the same clock time
        assert set(group.members) == {a.member_id, b_id}, "a was expired on the spot"
        assert group.is_(GroupState.COMPLETING_REBALANCE)
        # b waits in SyncGroup for the leader (a) longer than its session; a heartbeats
        b_sync = asyncio.ensure_future(c.sync_group("g", b.generation_id, b_id, None, {}))
        await idle_window(0.05)
        for _ in range(3):
            clock.ms += SESSION_MS // 2
            await c.heartbeat("g", a2.generation_id, a.member_id, None)
        clock.ms += SESSION_MS // 2
        await c.sync_group("g", a2.generation_id, a.member_id, None, {a.member_id: b"x"})
        await b_sync
        await idle_window(0.1)
        assert set(group.members) == {a.member_id, b_id}, "b was expired on the spot"
        assert group.is_(GroupState.STABLE)
        # and a session still runs out: nobody heartbeats for a whole session
        clock.ms += SESSION_MS + 1
        c.changed.set()  # what the next request would do; the clock moved, not real time
        for _ in range(100):
            if not group.members:
                break
            await idle_window(0.05)
        assert not group.members
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker

    asyncio.run(main())


def test_a_failed_offsets_expiry_is_tried_again_without_other_traffic() -> None:
    """An empty group's offsets expire at offsets.retention: when that write fails (here: the
    log refuses it once, as with too few in-sync replicas), the deadline stands. The ticker
    must come back to it by itself, STANDING_DEADLINE_RETRY_MS later, not wait for unrelated
    traffic that an idle broker never gets (it would keep the group and its offsets
    forever)."""
    refused: list[int] = []
    fail_next = False

    async def append(index: int, records: bytes) -> int:
        nonlocal fail_next
        if fail_next:
            fail_next = False
            refused.append(index)
            raise NotEnoughReplicasError("refused once by the test")
        return 0

    async def main() -> None:
        nonlocal fail_next
        c = coordinator(append=append, offsets_retention_ms=200)
        ticker = asyncio.create_task(Node._tick_groups(c))
        first = await join(c)
        a = await join(c, first.member_id)
        await c.sync_group("g", a.generation_id, a.member_id, None, {})
        fail_next = True  # the next write is the expiry's tombstones
        assert await c.leave_group("g", [(a.member_id, None)]) == [None]
        group = c.describe_group("g")
        assert group is not None
        assert group.is_(GroupState.EMPTY)
        for _ in range(200):  # bounded wait: retention 0.2 s, one retry 1 s later
            if c.partitions[0].groups.get("g") is None:
                break
            await idle_window(0.05)
        assert refused == [0], "the expiry was never attempted"
        assert c.partitions[0].groups.get("g") is None, "a failed expiry was never retried"
        assert group.is_(GroupState.DEAD)
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker

    asyncio.run(main())


def test_a_standby_pings_once_per_heartbeat_while_answered_and_twice_once_not(
    tmp_path: Path,
) -> None:
    """A standby controller (every broker is one by default) pings the active once per
    heartbeat interval while it answers, and rereads the claim at most once a second. Once a
    ping goes unanswered it pings every half interval and rereads the claim every time: it
    takes over at its first failed ping after broker.session.timeout.ms of silence, so a dead
    active is noticed no later than when every ping came every half interval. The active is
    a real controller Node in this loop; the standby's passes are driven one by one."""
    metadata = (tmp_path / "metadata").as_uri()
    common = {
        "metadata.log.dir": metadata,
        "process.roles": "controller",
        "listeners": "127.0.0.1:0",
        "broker.heartbeat.interval.ms": 500,
        "broker.session.timeout.ms": 60_000,  # no takeover in this test
    }

    async def main() -> None:
        active = Node(
            broker_config_from(
                {**common, "broker.id": 100, "log.dir": (tmp_path / "c100").as_uri()}
            )
        )
        await active.start()
        config = broker_config_from(
            {**common, "broker.id": 101, "log.dir": (tmp_path / "c101").as_uri()}
        )
        standby = ControllerService(
            config, MetadataStore(Storage.from_url(metadata)), "127.0.0.1", 1
        )
        try:
            assert active.controller_service is not None
            service = active.controller_service
            for _ in range(100):  # bounded: the first controller claims at once
                if service.active:
                    break
                await idle_window(0.05)
            assert service.active
            assert standby.pause_s() == 0.25  # nothing watched yet
            await standby._maybe_take_over()
            assert standby._watched is not None
            assert standby._watched.controller_id == 100
            assert standby.pause_s() == 0.5  # answered: once per heartbeat interval
            await active.stop()
            await standby._maybe_take_over()  # unanswered
            assert not standby.active
            assert standby.pause_s() == 0.25
            reads: list[str] = []
            standby.store.storage.observer = lambda op, seconds, err: reads.append(op)
            await standby._maybe_take_over()  # rereads the claim, whatever its age
            assert reads, "a standby whose ping failed went on with its cached claim"
            assert not standby.active
            assert standby.pause_s() == 0.25
        finally:
            await standby.stop()

    asyncio.run(main())


def test_a_heartbeat_does_not_wake_the_ticker() -> None:
    """Heartbeats only move deadlines later, so they leave the ticker asleep: woken by each
    one, it would look over every member of every group per heartbeat (quadratic in the
    members) where a 100 ms poll looked ten times a second. A join still wakes it."""

    async def main() -> None:
        c = coordinator()
        first = await join(c)
        a = await join(c, first.member_id)
        await c.sync_group("g", a.generation_id, a.member_id, None, {})
        c.changed.clear()
        for _ in range(5):
            await c.heartbeat("g", a.generation_id, a.member_id, None)
        assert not c.changed.is_set()
        await join(c)  # a new member: MEMBER_ID_REQUIRED, a pending member
        assert c.changed.is_set()

    asyncio.run(main())
