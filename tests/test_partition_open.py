"""Replicas open off the broker's event loop (ReplicaManager.apply_image and its opener).

Opening a replica's log costs storage requests (a few per log on S3, the WAL index before any
log); done on the event loop, a topic of 1,000 partitions held a broker's loop for minutes and
got it fenced. These tests use real stores made slow or failing on command (FaultyStorage over
memory storage, in-process; the chaos launcher's control file, in broker processes) and check:
apply_image returns before any replica is opened; requests for a replica still opening get a
retriable NOT_LEADER_OR_FOLLOWER; opened replicas take the newest image's roles; a replica
dropped while it opened is deleted, never registered; a failed open is retried until the store
heals; and brokers creating many partitions on a slow store are never fenced.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from logstore.batch import Record, build
from logstore.storage import Storage
from replication.broker.partition import Partition
from replication.broker.replica_manager import ReplicaManager
from replication.client import Admin, NewTopic, Producer
from replication.client.describe import describe_topic_waiting
from replication.common import TopicPartition as TP
from replication.config import BrokerConfig
from replication.controller.controller import Controller
from replication.errors import NotLeaderOrFollowerError
from replication.metadata.image import PartitionState
from replication.metadata.store import MetadataStore
from tests.chaos.cluster import REPO_ROOT, LaunchedBroker
from tests.chaos.launcher import CONTROL_ENV, UNTIL_CHANGED, write_control
from tests.cluster import FAST_FAILOVER, Cluster
from tests.faulty_fs import FaultyStorage
from tests.helpers import unique_name, wait_until

T = TypeVar("T")

#: deadline of every wait here (opens on a stalled store take a few seconds)
DEADLINE_S = 60


def run(coro: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(coro())


async def poll(condition: Callable[[], Any], message: str) -> Any:
    """Await ``condition`` becoming truthy, checking every 10 ms for about DEADLINE_S (the
    event loop keeps running meanwhile)."""
    for _ in range(DEADLINE_S * 100):
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {message}")


class World:
    """A controller on memory metadata with brokers 0-2 registered, and broker 0's replica
    manager on a FaultyStorage over memory storage (real stores; faults on command)."""

    def __init__(self, *, wal: bool = False) -> None:
        root = f"memory://open-{uuid.uuid4().hex}"
        self.metadata = MetadataStore(Storage.from_url(f"{root}/meta"))
        self.controller = Controller(self.metadata, 100, "127.0.0.1", 9000)
        self.controller.activate()
        epochs = [
            self.controller.register_broker(b, "127.0.0.1", 9100 + b, None, f"i{b}").epoch
            for b in range(3)
        ]
        for b, epoch in enumerate(epochs):
            self.controller.heartbeat(b, epoch, self.controller.image.version)
        self.storage = FaultyStorage(Storage.from_url(f"{root}/broker-0"))
        config = BrokerConfig(broker_id=0, log_wal_enable=wal)
        self.rm = ReplicaManager(config, self.storage)
        self.rm.registered(epochs[0])
        #: (partition, leader, leader epoch) of every role the replica manager applied
        self.roles: list[tuple[TP, int, int]] = []
        self.rm.on_role_change.append(
            lambda p: self.roles.append((p.key, p.state.leader, p.state.leader_epoch))
        )

    def apply(self) -> None:
        self.rm.apply_image(self.metadata.read_latest())

    def leader_of(self, topic: str, index: int) -> int:
        info = self.controller.image.topic(topic)
        assert info is not None
        return info.partitions[index].leader

    def stall_a_led_replica(self, seconds: float) -> int:
        """Create topic t (3 partitions, RF 3) and stall every read of one replica broker 0
        leads for ``seconds`` (its open is slow); that replica's index."""
        self.controller.create_topic("t", 3, 3, [])
        index = next(i for i in range(3) if self.leader_of("t", i) == 0)
        self.storage.stall("read", seconds, times=UNTIL_CHANGED, path_prefix=f"t/{index}/")
        return index


@pytest.mark.unit
def test_apply_image_returns_before_opening_and_replicas_open_in_the_background() -> None:
    world = World()
    world.controller.create_topic("t", 40, 3, [])
    rm = world.rm
    # every checkpoint read of a new log waits: opening is slow
    world.storage.stall("read", 0.05, times=UNTIL_CHANGED, path_prefix="t/")

    async def scenario() -> None:
        world.apply()
        # nothing was opened on the loop: every replica waits for the opener
        assert rm.partitions == {}
        for index in range(40):
            with pytest.raises(NotLeaderOrFollowerError, match="still opening"):
                rm.get_partition("t", index)
        # the loop keeps running while they open, and they register in batches: the first
        # are served before the last are open
        seen = await poll(lambda: len(rm.partitions) or None, "a first opened replica")
        assert seen < 40
        await rm.wait_for_opens()
        await rm.shutdown()

    run(scenario)
    assert len(world.rm.partitions) == 40
    for index in range(40):
        partition = world.rm.partitions[TP("t", index)]
        assert partition.state.leader == world.leader_of("t", index)
        assert partition.is_leader == (world.leader_of("t", index) == 0)
    assert sorted(key for key, _, _ in world.roles) == [TP("t", i) for i in range(40)]


@pytest.mark.unit
def test_a_produce_to_a_replica_still_opening_is_retriable_and_succeeds_once_it_is_open() -> None:
    world = World()
    led = world.stall_a_led_replica(1.0)
    rm = world.rm
    records = build([Record(None, b"v", 0)])

    async def scenario() -> None:
        world.apply()
        first = await rm.append_records(1, 1000, [("t", led, records)])
        assert isinstance(first[TP("t", led)].error, NotLeaderOrFollowerError)
        world.storage.heal()
        await rm.wait_for_opens()
        second = await rm.append_records(1, 1000, [("t", led, records)])
        assert second[TP("t", led)].error is None
        assert second[TP("t", led)].base_offset == 0
        await rm.shutdown()

    run(scenario)


@pytest.mark.unit
def test_a_failed_open_is_retried_until_the_store_heals() -> None:
    world = World()
    world.controller.create_topic("t", 2, 3, [])
    world.storage.fail("read", UNTIL_CHANGED, path_prefix="t/0/")
    rm = world.rm

    async def scenario() -> None:
        world.apply()
        await poll(lambda: TP("t", 1) in rm.partitions, "t-1 open")
        # t-0's open fails, and is tried again (with backoff) while the store fails
        await poll(lambda: rm._open_failures.get(TP("t", 0), 0) >= 3, "three failed opens")
        assert TP("t", 0) not in rm.partitions
        with pytest.raises(NotLeaderOrFollowerError, match="still opening"):
            rm.get_partition("t", 0)
        assert not rm._every_replica_open()
        world.storage.heal()
        await poll(lambda: TP("t", 0) in rm.partitions, "t-0 open once the store healed")
        assert rm._every_replica_open()
        await rm.shutdown()

    run(scenario)
    partition = world.rm.partitions[TP("t", 0)]
    assert partition.state.leader == world.leader_of("t", 0)
    assert TP("t", 0) not in world.rm._open_failures


@pytest.mark.unit
def test_a_replica_that_never_opens_does_not_hold_the_broker_start_for_ever() -> None:
    """A starting broker waits for its replicas' opens, but once every replica still waiting
    has failed at least once it goes on (wait_for_opens(tried_once=True) is False and names
    them), and the failing one is still retried: it opens once the store heals."""
    world = World()
    world.controller.create_topic("t", 3, 3, [])
    world.storage.fail("read", UNTIL_CHANGED, path_prefix="t/0/")
    rm = world.rm

    async def scenario() -> None:
        world.apply()
        assert not await rm.wait_for_opens(0.3)  # strict: t-0 keeps it waiting
        assert not await asyncio.wait_for(rm.wait_for_opens(tried_once=True), DEADLINE_S)
        assert {TP("t", 1), TP("t", 2)} <= set(rm.partitions)
        assert TP("t", 0) not in rm.partitions
        assert list(rm.failing_opens()) == [TP("t", 0)]
        world.storage.heal()
        assert await asyncio.wait_for(rm.wait_for_opens(), DEADLINE_S)
        assert TP("t", 0) in rm.partitions
        assert rm.failing_opens() == {}
        await rm.shutdown()

    run(scenario)


@pytest.mark.unit
def test_a_replica_deleted_while_it_opens_is_never_registered_and_its_storage_goes() -> None:
    world = World()
    world.controller.create_topic("t", 1, 3, [])
    world.controller.create_topic("u", 1, 3, [])
    # t-0 has data from an earlier life of this broker (the storage a deletion removes)
    old = FaultyStorage(world.storage.inner).child("t/0")
    old.write("leftover", b"x")
    world.storage.stall("read", 2.0, times=UNTIL_CHANGED, path_prefix="t/0/")
    rm = world.rm

    async def scenario() -> None:
        world.apply()
        await poll(lambda: TP("u", 0) in rm.partitions, "u-0 open")
        assert TP("t", 0) in rm._opening  # its open is running (stalled) in a thread
        world.controller.delete_topic("t")
        world.apply()
        await rm.wait_for_opens()
        await rm.shutdown()

    run(scenario)
    assert TP("t", 0) not in world.rm.partitions
    assert [key for key, _, _ in world.roles] == [TP("u", 0)]  # t-0 never took a role
    assert world.storage.inner.list("t/") == []  # deleted, as an open replica's would be


@pytest.mark.unit
def test_a_replica_dropped_before_its_open_started_has_its_storage_deleted() -> None:
    world = World()
    world.controller.create_topic("t", 1, 3, [])
    world.storage.inner.child("t/0").write("leftover", b"x")
    rm = world.rm

    async def scenario() -> None:
        world.apply()  # queued: the opener has not run yet
        world.controller.delete_topic("t")
        world.apply()
        await rm.wait_for_opens()
        await rm.shutdown()

    run(scenario)
    assert world.rm.partitions == {}
    assert world.roles == []
    assert world.storage.inner.list("t/") == []


@pytest.mark.unit
def test_a_leadership_change_during_the_open_is_the_role_the_replica_takes() -> None:
    world = World()
    index = world.stall_a_led_replica(2.0)
    rm = world.rm
    key = TP("t", index)

    async def scenario() -> None:
        world.apply()
        await poll(lambda: key in rm._opening, "the open running")
        info = world.controller.image.topic("t")
        assert info is not None
        state = info.partitions[index]
        moved = PartitionState(
            state.replicas, state.isr, 1, state.leader_epoch + 1, state.partition_epoch + 1
        )
        world.controller.update_partition("t", index, moved)
        world.apply()
        await rm.wait_for_opens()
        await rm.shutdown()

    run(scenario)
    partition: Partition = world.rm.partitions[key]
    assert (partition.state.leader, partition.is_leader) == (1, False)
    # it took the newest role only: it never led at the epoch the first image gave it
    assert [r for r in world.roles if r[0] == key] == [(key, 1, partition.leader_epoch)]
    assert partition.log.leader_epoch_cache.entries() == []  # a follower that never led


@pytest.mark.unit
def test_the_wal_index_loads_off_the_loop_and_no_replica_opens_before_it() -> None:
    world = World(wal=True)
    world.controller.create_topic("t", 4, 3, [])
    world.storage.stall("list", 1.0, times=1, path_prefix="_replog/wal")
    rm = world.rm

    async def scenario() -> None:
        world.apply()
        assert rm.wal_index is None  # not loaded on the loop
        assert rm.partitions == {}
        await poll(lambda: rm.wal_index is not None, "the WAL index loaded")
        await rm.wait_for_opens()
        rm.start()
        await rm.shutdown()

    run(scenario)
    assert len(world.rm.partitions) == 4
    for partition in world.rm.partitions.values():
        assert partition.log.wal is not None  # every one opened over the WAL


@pytest.mark.unit
def test_shutdown_while_replicas_open_waits_for_them_and_registers_none() -> None:
    world = World()
    world.controller.create_topic("t", 4, 3, [])
    world.storage.stall("read", 1.0, times=UNTIL_CHANGED, path_prefix="t/")
    rm = world.rm

    async def scenario() -> None:
        before = set(threading.enumerate())
        world.apply()
        await poll(lambda: rm._opening, "opens running")
        await rm.shutdown()
        # the opens running in threads ended before shutdown returned: none writes later
        assert [
            t.name
            for t in threading.enumerate()
            if t not in before and t.name.startswith("open-partition")
        ] == []

    run(scenario)
    assert world.rm.partitions == {}
    assert world.roles == []


# --- real broker processes ------------------------------------------------------------------


def launched_cluster(data_dir: Path, overrides: dict[str, str]) -> Cluster:
    """A Cluster whose brokers run through the chaos launcher (storage faults on command)."""
    cluster = Cluster(data_dir, overrides=overrides)
    python_path = str(REPO_ROOT)
    for i, proc in list(cluster.brokers.items()):
        control = proc.data_dir / "storage-control.json"
        cluster.brokers[i] = LaunchedBroker(
            proc.data_dir,
            broker_id=i,
            overrides=proc.overrides,
            env={CONTROL_ENV: str(control), "PYTHONPATH": python_path},
        )
        write_control(control, proc.log_dir, 0, [])
    return cluster


def set_faults(proc: Any, seq: int, faults: list[dict[str, Any]]) -> None:
    write_control(Path(proc.env[CONTROL_ENV]), proc.log_dir, seq, faults)


def text_events(path: Path, name: str) -> list[str]:
    return [line for line in path.read_text().splitlines() if f": {name} " in line]


@pytest.mark.cluster
def test_brokers_creating_many_partitions_on_a_slow_store_keep_heartbeating(
    tmp_path: Path,
) -> None:
    # A 3 s session; every replica's open waits 1.5 s on its first LIST: 48 replicas per
    # broker, 16 at a time, held the loop >= 4.5 s when they opened on it (fenced).
    session_ms = 3000
    cluster = launched_cluster(
        tmp_path, {**FAST_FAILOVER, "broker.session.timeout.ms": str(session_ms)}
    )
    cluster.start()
    try:
        for seq, proc in enumerate(cluster.brokers.values(), 1):
            set_faults(proc, seq, [{"kind": "stall", "op": "list", "seconds": 1.5}])
        topic = unique_name("slow-open")
        with Admin(bootstrap_servers=cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(topic, 48, 3)])
            # a produce while the replicas open: NOT_LEADER_OR_FOLLOWER, retried by the client
            with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
                sent = [producer.send(topic, b"v%d" % i, partition=i) for i in range(0, 48, 8)]
                offsets = [f.result(timeout=DEADLINE_S).offset for f in sent]
            assert offsets == [0] * 6

            def settled() -> bool:
                status = describe_topic_waiting(admin, topic)
                return all(p.leader >= 0 and len(p.isr) == 3 for p in status.partitions)

            wait_until(settled, timeout=DEADLINE_S, message="every partition with a full ISR")
            status = describe_topic_waiting(admin, topic)
        assert not text_events(cluster.controller.stderr_path, "broker_fenced")
        leaders = {p.partition: p.leader for p in status.partitions}
        for broker_id, proc in cluster.brokers.items():
            led = {
                int(line.split("partition=")[1].split()[0])
                for line in text_events(proc.stderr_path, "become_leader")
                if f"topic={topic} " in line
            }
            assert led == {i for i, b in leaders.items() if b == broker_id}
    finally:
        cluster.stop()
