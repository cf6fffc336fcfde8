"""Consumer groups end to end: real broker processes, consumers in threads and processes.

Members share a topic's partitions (each owned by exactly one), start from the group's
committed offsets, take over from a member that leaves or is SIGKILLed, and a zombie's commit
is refused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from replication.client import (
    Admin,
    Consumer,
    ConsumerRecord,
    ConsumerStateError,
    NewTopic,
    Producer,
    TopicPartition,
)
from replication.errors import CommitFailedError
from tests.cluster import BrokerProcess
from tests.helpers import unique_name, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

BROKER = {"offsets.topic.num.partitions": "3", "group.initial.rebalance.delay.ms": "500"}
MEMBER = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 300,
    "max_poll_interval_ms": 15000,
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("groups"), overrides=BROKER).start()
    yield proc
    proc.stop()


@dataclass
class Member:
    """A consumer polling in its own thread, committing after each poll."""

    bootstrap: str
    group: str
    topic: str
    strategy: str = "range"
    instance: str | None = None
    values: list[bytes] = field(default_factory=list)
    assignment: set[TopicPartition] = field(default_factory=set)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.stop = threading.Event()
        self.consumer = Consumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            partition_assignment_strategy=self.strategy,
            group_instance_id=self.instance,
            **MEMBER,
        )
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            self.consumer.subscribe([self.topic])
            while not self.stop.is_set():
                records = self.consumer.poll(timeout_ms=200)
                self.assignment = self.consumer.assignment()
                if records:
                    self.values += [r.value or b"" for r in records]
                    self.consumer.commit()
        except BaseException as err:
            self.error = err
        finally:
            self.consumer.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert self.error is None, repr(self.error)


def make_topic(bootstrap: str, partitions: int) -> str:
    topic = unique_name("groups")
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    return topic


def produce(bootstrap: str, topic: str, values: range) -> None:
    with Producer(bootstrap_servers=bootstrap) as producer:
        for i in values:
            producer.send(topic, value=str(i).encode(), key=str(i).encode())
        producer.flush()


def split_evenly(members: list[Member], partitions: int) -> bool:
    owned = [m.assignment for m in members]
    every = set().union(*owned)
    return sum(map(len, owned)) == len(every) == partitions and all(owned)


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_members_share_the_partitions_and_take_over_from_one_that_leaves(
    broker: BrokerProcess, strategy: str
) -> None:
    topic, group = make_topic(broker.bootstrap, 6), unique_name("g")
    members = [Member(broker.bootstrap, group, topic, strategy) for _ in range(3)]
    try:
        wait_until(lambda: split_evenly(members, 6), timeout=60, message="6 partitions over 3")
        assert sorted(len(m.assignment) for m in members) == [2, 2, 2]
        produce(broker.bootstrap, topic, range(600))
        wait_until(
            lambda: len({v for m in members for v in m.values}) == 600,
            timeout=60,
            message="every record consumed",
        )
        leaving = members.pop()
        leaving.close()  # leaves the group: its partitions move to the others
        wait_until(lambda: split_evenly(members, 6), timeout=60, message="6 partitions over 2")
        produce(broker.bootstrap, topic, range(600, 900))
        wait_until(
            lambda: len({v for m in [*members, leaving] for v in m.values}) == 900,
            timeout=60,
            message="records after the leave consumed",
        )
    finally:
        for m in members:
            m.close()
    consumed = [int(v) for m in [*members, leaving] for v in m.values]
    assert set(consumed) == set(range(900))
    # committed after each poll: the group's offsets are the end of every partition
    with Consumer(bootstrap_servers=broker.bootstrap, group_id=group) as probe:
        tps = [TopicPartition(topic, p) for p in range(6)]
        probe.assign(tps)
        committed = probe.committed(tps)
        assert {tp: c.offset for tp, c in committed.items() if c} == probe.end_offsets(tps)


def test_a_new_member_starts_from_the_committed_offsets(broker: BrokerProcess) -> None:
    topic, group = make_topic(broker.bootstrap, 2), unique_name("g")
    produce(broker.bootstrap, topic, range(100))
    with Consumer(bootstrap_servers=broker.bootstrap, group_id=group, **MEMBER) as first:
        first.subscribe([topic])
        seen: list[bytes | None] = []

        def all_seen() -> bool:
            seen.extend(r.value for r in first.poll(timeout_ms=200))
            return len(seen) >= 100

        wait_until(all_seen, timeout=60)
        first.commit({TopicPartition(topic, p): 20 for p in range(2)})
    with Consumer(bootstrap_servers=broker.bootstrap, group_id=group, **MEMBER) as second:
        second.subscribe([topic])
        records: list[ConsumerRecord] = []

        def rest_seen() -> bool:
            records.extend(second.poll(timeout_ms=200))
            return len(records) >= 60

        wait_until(rest_seen, timeout=60, message="the records after the committed offsets")
        first_offsets = {p: min(r.offset for r in records if r.partition == p) for p in range(2)}
        assert first_offsets == {0: 20, 1: 20}  # not 0: the committed offsets, not the reset
        assert len(records) == 100 - 2 * 20


def test_a_member_that_lost_its_partitions_cannot_commit(broker: BrokerProcess) -> None:
    topic, group = make_topic(broker.bootstrap, 2), unique_name("g")
    zombie = Consumer(bootstrap_servers=broker.bootstrap, group_id=group, **MEMBER)
    zombie.subscribe([topic])
    wait_until(lambda: zombie.poll(timeout_ms=200) is not None and zombie.assignment())
    # the zombie stops heartbeating (as if paused past its session); another member takes over
    assert zombie._coordinator is not None
    zombie._coordinator._closed.set()
    other = Member(broker.bootstrap, group, topic)
    try:
        wait_until(lambda: len(other.assignment) == 2, timeout=60, message="the takeover")
        with pytest.raises(CommitFailedError, match="rebalanced"):
            zombie.commit({TopicPartition(topic, 0): 5})
    finally:
        other.close()
        zombie._coordinator._closed.clear()
        zombie.close()


def test_subscribe_and_assign_are_exclusive_and_subscribe_needs_a_group(
    broker: BrokerProcess,
) -> None:
    with (
        Consumer(bootstrap_servers=broker.bootstrap) as loner,
        pytest.raises(ConsumerStateError, match="group_id"),
    ):
        loner.subscribe(["x"])
    with Consumer(bootstrap_servers=broker.bootstrap, group_id="g") as consumer:
        consumer.assign([TopicPartition("x", 0)])
        with pytest.raises(ConsumerStateError, match="unsubscribe"):
            consumer.subscribe(["x"])
    with Consumer(bootstrap_servers=broker.bootstrap, group_id="g") as consumer:
        consumer.subscribe(["x"])
        with pytest.raises(ConsumerStateError, match="unsubscribe"):
            consumer.assign([TopicPartition("x", 0)])


class RecordingListener:
    def __init__(self) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.events.append(("revoked", set(revoked)))

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.events.append(("assigned", set(assigned)))


def test_pattern_subscription_listener_and_async_commits(broker: BrokerProcess) -> None:
    prefix = unique_name("pat")
    topics = [f"{prefix}-a", f"{prefix}-b"]
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics([NewTopic(t, 1, 1) for t in [*topics, unique_name("other")]])
    group = unique_name("g")
    listener = RecordingListener()
    with Consumer(bootstrap_servers=broker.bootstrap, group_id=group, **MEMBER) as consumer:
        consumer.subscribe(pattern=f"{prefix}-.*", listener=listener)
        wait_until(lambda: consumer.poll(timeout_ms=100) is not None and consumer.assignment())
        expected = {TopicPartition(t, 0) for t in topics}
        assert consumer.assignment() == expected  # the matching topics only
        assert ("assigned", expected) in listener.events
        done: list[BaseException | None] = []
        future = consumer.commit_async(
            {TopicPartition(topics[0], 0): 3}, callback=lambda _, err: done.append(err)
        )
        future.result(timeout=30)
        wait_until(lambda: done == [None])
        assert consumer.committed([TopicPartition(topics[0], 0)]) == {
            TopicPartition(topics[0], 0): (3, None)
        }
    assert listener.events[-1] == ("revoked", expected)  # close() revokes before leaving


def test_a_static_member_restarting_keeps_its_partitions(broker: BrokerProcess) -> None:
    topic, group = make_topic(broker.bootstrap, 4), unique_name("g")
    first = Member(broker.bootstrap, group, topic, instance="i-1")
    second = Member(broker.bootstrap, group, topic, instance="i-2")
    try:
        wait_until(lambda: split_evenly([first, second], 4), timeout=60, message="2 + 2")
        before, others = first.assignment, second.assignment
        generation = second.consumer.group_metadata().generation_id
        first.close()  # a static member does not leave: its place waits for it
        first = Member(broker.bootstrap, group, topic, instance="i-1")
        wait_until(lambda: first.assignment == before, timeout=60, message="its partitions back")
        # no rebalance: the same generation, the other member's partitions never moved
        assert first.consumer.group_metadata().generation_id == generation
        assert second.consumer.group_metadata().generation_id == generation
        assert second.assignment == others
    finally:
        first.close()
        second.close()


def test_auto_commit_commits_the_positions_in_the_background(broker: BrokerProcess) -> None:
    topic, group = make_topic(broker.bootstrap, 1), unique_name("g")
    produce(broker.bootstrap, topic, range(50))
    tp = TopicPartition(topic, 0)
    settings = {**MEMBER, "enable_auto_commit": True, "auto_commit_interval_ms": 100}
    with Consumer(bootstrap_servers=broker.bootstrap, group_id=group, **settings) as consumer:
        consumer.subscribe([topic])
        seen: list[int] = []

        def all_read_and_committed() -> bool:
            seen.extend(r.offset for r in consumer.poll(timeout_ms=100))
            committed = consumer.committed([tp])[tp]
            return len(seen) == 50 and committed is not None and committed.offset == 50

        wait_until(all_read_and_committed, timeout=60, message="the position auto-committed")
