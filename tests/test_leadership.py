"""Rules of leadership, in process on memory storage: broker incarnations, leader epochs, and
the high watermark a reader is shown.

A restarted broker is a new incarnation: it lost whatever it had not flushed. The controller
refuses it while the old one's session lives, fences the old one when it registers (out of every
ISR, leadership moved with a new leader epoch), and remembers incarnations in the metadata image
so that a controller that took over applies the same rules. The broker side: a process takes no
partition role from metadata that does not carry its own registration. A new leader answers
readers only once its high watermark has passed whatever its predecessor could have shown.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from logstore.batch import Record, build
from logstore.log import Log
from logstore.storage import Storage
from replication.broker.partition import Partition, TopicPolicy
from replication.broker.replica_manager import ReplicaManager
from replication.common import TopicPartition
from replication.config import BrokerConfig
from replication.controller.controller import Controller
from replication.errors import (
    DuplicateBrokerRegistrationError,
    IneligibleReplicaError,
    OffsetNotAvailableError,
)
from replication.metadata.image import (
    FORMAT_VERSION,
    NO_LEADER,
    BrokerInfo,
    MetadataImage,
    PartitionState,
)
from replication.metadata.store import MetadataStore
from tests.helpers import register_live

pytestmark = pytest.mark.unit

SESSION_MS = 3_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def store() -> MetadataStore:
    return MetadataStore(Storage.from_url(f"memory://controller-{uuid.uuid4().hex}/meta"))


def controller(metadata: MetadataStore, clock: Clock, controller_id: int = 100) -> Controller:
    c = Controller(
        metadata, controller_id, "127.0.0.1", 9000, session_timeout_ms=SESSION_MS, time_ms=clock
    )
    c.activate()
    return c


def cluster(clock: Clock) -> tuple[MetadataStore, Controller]:
    """Three brokers (incarnations a0, a1, a2) and topic t: 1 partition, RF 3."""
    metadata = store()
    c = controller(metadata, clock)
    for b in range(3):
        register_live(c, b, "127.0.0.1", 9100 + b, None, f"a{b}")
    c.create_topic("t", 1, 3)
    return metadata, c


def test_a_new_incarnation_is_refused_while_the_old_session_lives() -> None:
    clock = Clock()
    _, c = cluster(clock)
    with pytest.raises(DuplicateBrokerRegistrationError, match="another live process"):
        c.register_broker(0, "127.0.0.1", 9100, None, "b0")


def test_registering_a_new_incarnation_fences_the_old_one_and_bumps_the_leader_epoch() -> None:
    clock = Clock()
    _, c = cluster(clock)
    before = c.image.topic("t").partitions[0]  # type: ignore[union-attr]
    leader = before.leader
    clock.now += SESSION_MS + 1  # the old incarnation's session has expired, not yet checked
    for b in range(3):
        if b != leader:
            c.heartbeat(b, c.image.broker(b).epoch, c.image.version)  # type: ignore[union-attr]
    info = c.register_broker(leader, "127.0.0.1", 9100 + leader, None, "restarted")
    after = c.image.topic("t").partitions[0]  # type: ignore[union-attr]
    assert info.incarnation == "restarted"
    assert info.fenced  # until its heartbeat says it caught up
    assert after.leader != leader
    assert after.leader_epoch == before.leader_epoch + 1
    assert leader not in after.isr
    assert after.partition_epoch > before.partition_epoch


def test_the_same_incarnation_registering_again_keeps_its_leadership() -> None:
    clock = Clock()
    _, c = cluster(clock)
    before = c.image.topic("t").partitions[0]  # type: ignore[union-attr]
    # a registration whose answer was lost, sent again by the same process
    c.register_broker(before.leader, "127.0.0.1", 9100 + before.leader, None, f"a{before.leader}")
    assert c.image.topic("t").partitions[0] == before  # type: ignore[union-attr]


def test_a_sole_replica_restarting_leads_again_at_a_new_epoch() -> None:
    clock = Clock()
    metadata = store()
    c = controller(metadata, clock)
    register_live(c, 0, "127.0.0.1", 9100, None, "a0")
    c.create_topic("solo", 1, 1)
    before = c.image.topic("solo").partitions[0]  # type: ignore[union-attr]
    clock.now += SESSION_MS + 1
    info = c.register_broker(0, "127.0.0.1", 9100, None, "b0")
    offline = c.image.topic("solo").partitions[0]  # type: ignore[union-attr]
    assert offline.leader == NO_LEADER  # fenced: not elected yet
    c.heartbeat(0, info.epoch, c.image.version)
    after = c.image.topic("solo").partitions[0]  # type: ignore[union-attr]
    assert after.leader == 0
    assert after.isr == (0,)
    assert after.leader_epoch > before.leader_epoch


def test_a_restarted_broker_stays_fenced_until_it_has_the_metadata_of_its_registration() -> None:
    """As KRaft: a new registration is fenced; a heartbeat reporting an older metadata
    version than the registration's keeps it fenced (not placed, not elected, not let into
    an ISR); the one that reports it unfences it."""
    clock = Clock()
    _, c = cluster(clock)
    state = c.image.topic("t").partitions[0]  # type: ignore[union-attr]
    restarted = state.leader
    clock.now += SESSION_MS + 1
    for b in range(3):
        if b != restarted:
            c.heartbeat(b, c.image.broker(b).epoch, c.image.version)  # type: ignore[union-attr]
    info = c.register_broker(restarted, "127.0.0.1", 9100 + restarted, None, "restarted")
    registration = c.image.version
    c.create_topic("u", 4, 2)  # the metadata moves on
    assert all(
        restarted not in s.replicas
        for s in c.image.topic("u").partitions  # type: ignore[union-attr]
    )
    behind = c.heartbeat(restarted, info.epoch, registration - 1)
    assert behind.fenced
    assert not c.caught_up(restarted, registration - 1)
    assert c.image.broker(restarted).fenced  # type: ignore[union-attr]
    state = c.image.topic("t").partitions[0]  # type: ignore[union-attr]
    assert state.leader != restarted
    with pytest.raises(IneligibleReplicaError, match="fenced"):
        c.alter_partition(
            state.leader,
            "t",
            0,
            state.leader_epoch,
            state.partition_epoch,
            (*state.isr, restarted),
        )
    caught_up = c.heartbeat(restarted, info.epoch, registration)
    assert not caught_up.fenced
    assert not c.image.broker(restarted).fenced  # type: ignore[union-attr]
    state = c.image.topic("t").partitions[0]  # type: ignore[union-attr]
    grown = c.alter_partition(
        state.leader, "t", 0, state.leader_epoch, state.partition_epoch, (*state.isr, restarted)
    )
    assert restarted in grown.isr


def test_a_controller_that_took_over_knows_the_incarnations() -> None:
    clock = Clock()
    metadata, _ = cluster(clock)
    successor = controller(metadata, clock, controller_id=101)
    with pytest.raises(DuplicateBrokerRegistrationError):
        successor.register_broker(1, "127.0.0.1", 9101, None, "b1")
    successor.register_broker(1, "127.0.0.1", 9101, None, "a1")  # the live process itself


def test_metadata_keeps_incarnations_and_reads_format_1() -> None:
    image = MetadataImage(version=3, brokers=(BrokerInfo(0, "h", 1, None, 2, False, "inc"),))
    assert MetadataImage.from_bytes(image.to_bytes()).brokers[0].incarnation == "inc"
    old = json.loads(image.to_bytes())
    old["format_version"] = 1
    old["brokers"] = [b[:6] for b in old["brokers"]]
    read = MetadataImage.from_bytes(json.dumps(old).encode())
    assert read.brokers[0] == BrokerInfo(0, "h", 1, None, 2, False, "")
    assert FORMAT_VERSION == 8


def test_metadata_keeps_each_broker_s_kafka_listener_and_reads_format_2() -> None:
    kafka = (("KAFKA", "h", 9093),)
    image = MetadataImage(version=3, brokers=(BrokerInfo(0, "h", 1, None, 2, False, "inc", kafka),))
    read = MetadataImage.from_bytes(image.to_bytes()).brokers[0]
    assert read.endpoints == kafka
    assert read.endpoint("KAFKA") == ("h", 9093)
    assert read.endpoint("REPLOG") is None
    old = json.loads(image.to_bytes())
    old["format_version"] = 2
    old["brokers"] = [b[:7] for b in old["brokers"]]
    assert MetadataImage.from_bytes(json.dumps(old).encode()).brokers[0] == BrokerInfo(
        0, "h", 1, None, 2, False, "inc"
    )


def test_a_broker_takes_no_role_before_its_registration_is_in_the_metadata() -> None:
    # A ReplicaManager runs on the broker's event loop (its WAL writer is bound to it).
    async def scenario() -> None:
        clock = Clock()
        metadata, c = cluster(clock)
        leader = c.image.topic("t").partitions[0].leader  # type: ignore[union-attr]
        config = BrokerConfig(broker_id=leader)
        rm = ReplicaManager(config, Storage.from_url(f"memory://rm-{uuid.uuid4().hex}/logs"))
        try:
            # a restarted process reads the stored metadata, which still names it leader
            rm.apply_image(metadata.read_latest())
            assert await rm.wait_for_opens(30)
            assert rm.partitions == {}
            assert rm.image.version == metadata.latest_version()
            clock.now += SESSION_MS + 1
            info = c.register_broker(leader, "127.0.0.1", 9100 + leader, None, "restarted")
            rm.registered(info.epoch)
            rm.apply_image(metadata.read_latest())
            assert await rm.wait_for_opens(30)  # replicas open in the background
            partition = rm.partitions[TopicPartition("t", 0)]
            assert not partition.is_leader
            assert partition.leader_epoch == c.image.topic("t").partitions[0].leader_epoch  # type: ignore[union-attr]
        finally:
            await rm.shutdown()

    asyncio.run(scenario())


def test_a_new_leader_answers_readers_once_its_hw_reaches_its_epoch_start() -> None:
    plog = Log.open(Storage.from_url(f"memory://hw-{uuid.uuid4().hex}/t/0"))
    for i in range(10):
        plog.append(build([Record(None, b"v%d" % i, i)]), leader_epoch=1)
    plog.flush()
    plog.update_high_watermark(6)  # what it had learned as a follower
    follower = PartitionState((1, 0), (1, 0), 1, 1, 0)
    partition = Partition("t", 0, plog, 0, TopicPolicy(), follower)
    partition.check_high_watermark_known()  # a follower serves no reader anyway
    partition.apply_state(PartitionState((1, 0), (1, 0), 0, 2, 1))  # leads at epoch 2 from 10
    with pytest.raises(OffsetNotAvailableError, match="epoch 2"):
        partition.check_high_watermark_known()
    partition.update_follower_fetch(1, 8)
    with pytest.raises(OffsetNotAvailableError):
        partition.check_high_watermark_known()
    partition.update_follower_fetch(1, 10)
    assert partition.high_watermark == 10
    partition.check_high_watermark_known()


def test_a_diverged_fetch_moves_neither_the_followers_leo_nor_the_hw() -> None:
    plog = Log.open(Storage.from_url(f"memory://div-{uuid.uuid4().hex}/t/0"))
    plog.append(build([Record(None, b"a", 0)]), leader_epoch=1)
    plog.append(build([Record(None, b"b", 0)]), leader_epoch=3)
    plog.flush()
    partition = Partition("t", 0, plog, 0, TopicPolicy(), PartitionState((0, 1), (0, 1), 0, 3, 0))
    # the follower holds epoch 2 up to offset 5: this log has no epoch 2, and epoch 1 ends at 1
    assert partition.diverging_epoch(2, 5) == (1, 1)
    assert partition.diverging_epoch(3, 2) is None
    assert partition.diverging_epoch(-1, 0) is None


def test_a_follower_that_registered_again_is_heard_anew() -> None:
    plog = Log.open(Storage.from_url(f"memory://reg-{uuid.uuid4().hex}/t/0"))
    plog.append(build([Record(None, b"a", 0)]), leader_epoch=1)
    plog.flush()
    partition = Partition("t", 0, plog, 0, TopicPolicy(), PartitionState((0, 1), (0,), 0, 1, 0))
    partition.note_follower_registrations({0: 1, 1: 1})
    partition.update_follower_fetch(1, 1)
    assert partition.isr_to_expand() == (0, 1)
    # broker 1 restarted, maybe on an empty store: its old fetch offset no longer counts
    partition.note_follower_registrations({0: 1, 1: 2})
    assert partition.followers[1].log_end_offset == -1
    assert partition.isr_to_expand() is None
