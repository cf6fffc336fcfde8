"""A step of the wall clock (NTP correcting a node's clock by minutes, forward or back) moves
no timeout: sessions, ISR lag, transaction and group timeouts run on a monotonic clock, as
Kafka's do. The wall clock is what record timestamps, retention by timestamp and offset
expiry use; retention never deletes what the monotonic clock says is younger than its limit.

Each test steps ``time.time``/``time.time_ns`` (what every wall-clock reading in replog goes
through) by minutes under the code, as libfaketime steps a whole process in the chaos harness
(``clock_jump``, tests/chaos).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from logstore.config import LogConfig
from logstore.log import Log
from logstore.storage import Storage
from logstore.wall_clock import CATCH_UP_RATE, SteadyWallClock
from replication.broker.partition import Partition, TopicPolicy
from replication.controller.controller import Controller
from replication.coordinator.group import GroupCoordinator
from replication.coordinator.group_metadata import GroupConfig, JoinRequest
from replication.coordinator.group_metadata_manager import OffsetsPartition
from replication.coordinator.transaction import TxnState
from replication.metadata.image import MetadataImage, PartitionState, TopicInfo
from replication.metadata.store import MetadataStore
from tests.helpers import register_live, wait_until
from tests.test_bounded_state import DATA, TxnHarness, run
from tests.test_log import batch_of

pytestmark = pytest.mark.unit

MINUTES = 60.0


class WallClock:
    """The real wall clock plus an offset that :meth:`step` changes."""

    def __init__(self) -> None:
        self.offset_s = 0.0
        self.real_time = time.time
        self.real_time_ns = time.time_ns

    def step(self, seconds: float) -> None:
        self.offset_s += seconds

    def time(self) -> float:
        return self.real_time() + self.offset_s

    def time_ns(self) -> int:
        return self.real_time_ns() + int(self.offset_s * 1e9)


@pytest.fixture
def wall(monkeypatch: pytest.MonkeyPatch) -> WallClock:
    clock = WallClock()
    monkeypatch.setattr(time, "time", clock.time)
    monkeypatch.setattr(time, "time_ns", clock.time_ns)
    return clock


def test_controller_sessions_hold_across_wall_clock_steps(tmp_path: Path, wall: WallClock) -> None:
    store = MetadataStore(Storage.from_url(tmp_path.as_uri()))
    controller = Controller(store, 100, "127.0.0.1", 9100, session_timeout_ms=500)
    controller.activate()
    broker = register_live(controller, 0, "127.0.0.1", 9000, None, incarnation="a")
    wall.step(+10 * MINUTES)
    assert not controller.sessions_expired(), "a step forward is no silence"
    assert controller.check_sessions() == []
    controller.heartbeat(0, broker.epoch, controller.image.version)
    wall.step(-20 * MINUTES)
    assert controller.check_sessions() == []
    # the broker goes silent while the clock is 10 minutes behind: its session still ends
    wait_until(
        lambda: controller.check_sessions() == [0],
        timeout=10,
        message="the silent broker fenced",
    )
    info = controller.image.broker(0)
    assert info is not None
    assert info.fenced


def test_isr_lag_holds_across_wall_clock_steps(wall: WallClock) -> None:
    storage = Storage.from_url(f"memory://clock-steps-{uuid.uuid4().hex}/t/0")
    state = PartitionState((0, 1), (0, 1), 0, 1, 0)
    partition = Partition("t", 0, Log.open(storage, LogConfig()), 0, TopicPolicy(), state)
    partition.update_follower_fetch(1, partition.log.log_end_offset)  # caught up
    wall.step(+10 * MINUTES)
    assert partition.isr_to_shrink(lag_time_max_ms=1000) is None, "a step forward is no lag"
    wall.step(-20 * MINUTES)
    # the follower stops fetching while the clock is 10 minutes behind: it still leaves
    wait_until(
        lambda: partition.isr_to_shrink(lag_time_max_ms=200) == (0,),
        timeout=10,
        message="the stuck follower out of the ISR",
    )


def test_transaction_timeouts_hold_across_wall_clock_steps(tmp_path: Path, wall: WallClock) -> None:
    async def test(h: TxnHarness) -> None:
        c = h.coordinator
        pid, epoch = await c.init_producer_id("open", 300)
        await c.add_partitions("open", pid, epoch, [DATA])
        wall.step(+10 * MINUTES)
        assert await c.abort_timed_out() == 0, "a step forward ends no transaction"
        # a new coordinator loads it with a start time 10 minutes before its clock's now
        c = await h.failover()
        assert await c.abort_timed_out() == 0, "its timeout counts from the takeover"
        wall.step(-20 * MINUTES)
        # abandoned while the clock is 10 minutes behind: it still times out
        deadline = time.monotonic() + 10
        while await c.abort_timed_out() == 0:
            assert time.monotonic() < deadline, "the abandoned transaction never timed out"
            await asyncio.sleep(0.05)
        assert c.txns["open"].state in (TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT)

    run(tmp_path, test)


def test_retention_ignores_a_step_forward_of_the_wall_clock(wall: WallClock) -> None:
    storage = Storage.from_url(f"memory://clock-steps-{uuid.uuid4().hex}/t/0")
    cfg = LogConfig(segment_bytes=1, retention_bytes=-1, retention_ms=60_000)
    log = Log.open(storage, cfg)  # the process's clock: logstore.wall_clock.steady_wall_ms
    for i in range(3):
        log.append(batch_of(f"v{i}".encode(), ts=time.time_ns() // 1_000_000), leader_epoch=0)
        log.flush()  # segment.bytes=1: every object opens a segment
    log.update_high_watermark(3)
    wall.step(+10 * MINUTES)
    assert log.delete_retained_segments() == 0, "records seconds old are not 10 minutes old"
    assert log.log_start_offset == 0


def test_the_steady_wall_clock_follows_a_step_back_at_once_and_forward_slowly(
    wall: WallClock,
) -> None:
    clock = SteadyWallClock()
    before = clock()
    wall.step(-10 * MINUTES)
    assert before - clock() >= (10 * MINUTES - 1) * 1000, "a step back: at once"
    wall.step(+20 * MINUTES)  # 10 minutes ahead of the true time
    start, real_start = clock(), time.monotonic()
    assert start - wall.real_time_ns() // 1_000_000 < -9 * MINUTES * 1000, "forward: slowly"
    wait_until(lambda: clock() - start >= 100, timeout=10, message="the clock moving on")
    elapsed_ms = (time.monotonic() - real_start) * 1000
    assert clock() - start <= (elapsed_ms + 50) * CATCH_UP_RATE, "no faster than its rate"


def test_group_sessions_hold_across_wall_clock_steps(wall: WallClock) -> None:
    image = MetadataImage(topics=(TopicInfo("events", "id", (PartitionState((0,), (0,), 0),)),))
    appended: list[bytes] = []

    async def append(index: int, records: bytes) -> int:
        appended.append(records)
        return len(appended) - 1

    def join(member_id: str) -> JoinRequest:
        return JoinRequest("g", member_id, None, "c", "", 500, 500, "consumer", (("r", b""),))

    async def test() -> None:
        config = GroupConfig(
            num_partitions=1, initial_rebalance_delay_ms=0, min_session_timeout_ms=1
        )
        coordinator = GroupCoordinator(0, config, lambda: image, append)  # its own clock
        coordinator.partitions[0] = OffsetsPartition(0, 0, loaded=True)
        first = await coordinator.join_group(join(""))
        joined = await coordinator.join_group(join(first.member_id))
        await coordinator.sync_group("g", joined.generation_id, joined.member_id, None, {})
        wall.step(+10 * MINUTES)
        await coordinator.tick()
        group = coordinator.describe_group("g")
        assert group is not None
        assert list(group.members) == [joined.member_id], "a step forward is no silence"
        wall.step(-20 * MINUTES)
        # the member goes silent while the clock is 10 minutes behind: its session still ends
        deadline = time.monotonic() + 15
        while group.members:
            assert time.monotonic() < deadline, "the silent member's session never ended"
            await coordinator.tick()
            await asyncio.sleep(0.1)

    asyncio.run(test())
