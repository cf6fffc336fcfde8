"""The consumer group protocol (KIP-848, ``group.protocol=consumer``) with clients nobody here
wrote, on three real broker processes: librdkafka's (confluent-kafka 2.16) members share the
partitions, one leaves and its partitions move, every record is consumed once with commits,
beside a classic group on the same topic; Kafka's Java consumer (4.4) does the same; the
AdminClient lists and describes the groups by type, and ``kafka-consumer-groups --describe
--members`` describes a live one (ConsumerGroupDescribe). The brokers' heartbeat interval is
500 ms (group.consumer.heartbeat.interval.ms), so a reconciliation takes a second or two."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # type: ignore[attr-defined]

from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.kafka_jvm import CONSUMER_GROUPS, driver, tool
from tests.test_kafka_clients import create_topic
from tests.test_kafka_java_client import judge_group

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("kafka-consumer-protocol"),
        brokers=3,
        kafka=True,
        overrides={"group.consumer.heartbeat.interval.ms": "500"},
    ).start()
    yield c
    c.stop()


def produce(cluster: Cluster, topic: str, partitions: int, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"})
    for i in range(start, start + count):
        producer.produce(topic, value=str(i).encode(), partition=i % partitions)
    assert producer.flush(30) == 0


class Members:
    """Group members polled in turn from one thread; each record is committed (synchronously)
    before its member polls again, so a partition that moves carries its offsets with it. A
    commit refused with STALE_MEMBER_EPOCH (the member's epoch moved on while the commit was
    on its way) is retried, as KIP-848 has applications do. Used as a context manager, it
    closes the members that are left (a consumer never closed holds up the interpreter's
    exit)."""

    def __init__(
        self, cluster: Cluster, topic: str, group: str, protocol: str, **config: str
    ) -> None:
        self.cluster, self.topic, self.group, self.protocol = cluster, topic, group, protocol
        #: more consumer settings (dots as underscores: group_remote_assignor="range")
        self.config = {k.replace("_", "."): v for k, v in config.items()}
        self.consumers: dict[str, Consumer] = {}
        #: (partition, offset) -> how many times it was read
        self.read: dict[tuple[int, int], int] = {}

    def add(self, name: str) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": self.cluster.kafka_bootstrap,
                "group.id": self.group,
                "group.protocol": self.protocol,
                "client.id": name,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **self.config,
            }
        )
        consumer.subscribe([self.topic])
        self.consumers[name] = consumer
        return consumer

    def poll(self) -> None:
        for consumer in self.consumers.values():
            message = consumer.poll(0.05)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            partition, offset = message.partition(), message.offset()
            assert partition is not None
            assert offset is not None
            key = (partition, offset)
            self.read[key] = self.read.get(key, 0) + 1
            wait_until(
                lambda c=consumer, m=message: _committed(c, m), timeout=30, message="a commit"
            )

    def assignments(self) -> dict[str, set[int]]:
        return {n: {tp.partition for tp in c.assignment()} for n, c in self.consumers.items()}

    def until(self, condition: Callable[[], bool], what: str) -> None:
        def step() -> bool:
            self.poll()
            return condition()

        wait_until(step, timeout=60, interval=0, message=what)

    def close(self, name: str) -> None:
        self.consumers.pop(name).close()  # leaves the group (member epoch -1)

    def __enter__(self) -> Members:
        return self

    def __exit__(self, *exc: object) -> None:
        for name in list(self.consumers):
            self.close(name)


#: a commit refused with these is given up: the member is no longer the partition's owner as
#: far as the coordinator knows (it failed over), and the record may be read again
LOST_COMMIT = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError._TRANSPORT,
    KafkaError.REQUEST_TIMED_OUT,
}


def _committed(consumer: Consumer, message: Message) -> bool:
    """Commit the message: True when done (or given up, see LOST_COMMIT), False to retry."""
    try:
        consumer.commit(message=message, asynchronous=False)
    except KafkaException as err:
        code = err.args[0].code()
        if code in LOST_COMMIT:
            return True
        if code != KafkaError.STALE_MEMBER_EPOCH:
            raise
        return False
    return True


def balanced(assignments: dict[str, set[int]], partitions: int) -> bool:
    every = [p for ps in assignments.values() for p in ps]
    sizes = {len(ps) for ps in assignments.values()}
    return sorted(every) == list(range(partitions)) and max(sizes) - min(sizes) <= 1


def test_librdkafka_members_share_move_and_read_each_record_once(cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=6)
    produce(cluster, topic, 6, 0, 600)
    with (
        Members(cluster, topic, unique_name("kip848"), "consumer") as members,
        Members(cluster, topic, unique_name("classic"), "classic") as classic,
    ):
        share_move_and_read_once(cluster, topic, members, classic)


def share_move_and_read_once(
    cluster: Cluster, topic: str, members: Members, classic: Members
) -> None:
    group = members.group
    classic.add("classic-0")
    for name in ("m0", "m1", "m2"):
        members.add(name)
    members.until(
        lambda: balanced(members.assignments(), 6) and all(members.assignments().values()),
        "three members to share six partitions",
    )
    assert [len(ps) for ps in members.assignments().values()] == [2, 2, 2]
    members.until(lambda: len(members.read) == 600, "the first 600 records")

    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=30)
    assert str(described.type) == "ConsumerGroupType.CONSUMER"
    assert sorted(m.client_id for m in described.members) == ["m0", "m1", "m2"]
    assert described.partition_assignor == "uniform"

    # a classic member cannot join it while it has members
    def members_go_on() -> bool:
        members.poll()
        return False

    with Members(cluster, topic, group, "classic") as intruder:
        intruder.add("intruder")
        with pytest.raises(KafkaException) as refused:
            intruder.until(members_go_on, "the classic member's refusal")
    assert refused.value.args[0].code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL

    # one leaves: its partitions move to the other two, and nothing is read twice
    produce(cluster, topic, 6, 600, 300)
    members.close("m1")
    members.until(
        lambda: balanced(members.assignments(), 6) and len(members.read) == 900,
        "two members to take over m1's partitions and read the rest",
    )
    assert [len(ps) for ps in members.assignments().values()] == [3, 3]
    assert set(members.read.values()) == {1}

    # the classic group beside it read everything too, with its own offsets
    classic.until(lambda: len(classic.read) == 900, "the classic group to read everything")
    listed = admin.list_consumer_groups().result(timeout=30)
    types = {g.group_id: str(g.type) for g in listed.valid}
    assert types[group] == "ConsumerGroupType.CONSUMER"
    assert types[classic.group] == "ConsumerGroupType.CLASSIC"

    committed = members.consumers["m0"].committed(
        [KafkaTopicPartition(topic, p) for p in range(6)], timeout=30
    )
    assert [tp.offset for tp in committed] == [150] * 6


def test_kafka_consumer_groups_describes_a_live_consumer_group(cluster: Cluster) -> None:
    """Two members that ask for the ``range`` server assignor (group.remote.assignor)."""
    topic = create_topic(cluster, partitions=4)
    group = unique_name("kip848-tool")
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    with Members(cluster, topic, group, "consumer", group_remote_assignor="range") as members:
        members.add("tool-a")
        members.add("tool-b")
        members.until(
            lambda: balanced(members.assignments(), 4) and all(members.assignments().values()),
            "two members to share four partitions",
        )
        out = tool(
            CONSUMER_GROUPS, "--bootstrap-server", cluster.kafka_bootstrap,
            "--describe", "--members", "--group", group,
        )  # fmt: skip
        described = admin.describe_consumer_groups([group])[group].result(timeout=30)
    assert described.partition_assignor == "range"
    assert sorted(sorted(tp.partition for tp in m.assignment.topic_partitions)
                  for m in described.members) == [[0, 1], [2, 3]]  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if group in line]
    # GROUP CONSUMER-ID HOST CLIENT-ID #PARTITIONS
    assert "#PARTITIONS" in out.stdout
    assert sorted((row[2], row[3], row[4]) for row in rows) == [
        ("/127.0.0.1", "tool-a", "2"),
        ("/127.0.0.1", "tool-b", "2"),
    ], out.stdout


def test_the_java_consumer_shares_moves_and_commits(cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=4)
    group = unique_name("java-kip848")
    facts = driver("consumer-group", cluster.kafka_bootstrap, topic, group)
    judge_group(facts, protocol="Consumer", assignor="uniform")


def test_a_regex_subscription_follows_new_topics_and_partitions(cluster: Cluster) -> None:
    """librdkafka sends a ``^`` subscription as KIP-848's SubscribedTopicRegex: a topic created
    later that matches it, and partitions added to one, bump the group epoch and are
    assigned."""
    prefix = unique_name("kip848-rx")
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})

    def create(name: str, partitions: int) -> None:
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=60)

    create(f"{prefix}-a", 2)
    with Members(cluster, f"^{prefix}-.*", unique_name("kip848-rx"), "consumer") as members:
        member = members.add("rx")

        def held() -> set[tuple[str, int]]:
            members.poll()
            return {(tp.topic, tp.partition) for tp in member.assignment()}

        wait_until(lambda: len(held()) == 2, timeout=60, interval=0, message="the first topic")
        create(f"{prefix}-b", 1)
        admin.create_partitions([NewPartitions(f"{prefix}-a", 3)])[f"{prefix}-a"].result(timeout=60)
        want = {(f"{prefix}-a", 0), (f"{prefix}-a", 1), (f"{prefix}-a", 2), (f"{prefix}-b", 0)}
        wait_until(lambda: held() == want, timeout=60, interval=0, message="the new partitions")


def test_members_rejoin_after_a_coordinator_failover_and_resume_from_their_commits(
    cluster: Cluster,
) -> None:
    """The coordinator keeps membership in memory only: after its broker is SIGKILLed the new
    coordinator answers the members UNKNOWN_MEMBER_ID, they join again, and read on from the
    offsets committed before the kill (which are on __consumer_offsets)."""
    topic = create_topic(cluster, partitions=4)
    produce(cluster, topic, 4, 0, 400)
    with Members(cluster, topic, unique_name("kip848-failover"), "consumer") as members:
        members.add("f0")
        members.add("f1")
        members.until(lambda: len(members.read) == 400, "the first 400 records")
        admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
        described = admin.describe_consumer_groups([members.group])[members.group]
        victim = cluster.brokers[described.result(timeout=30).coordinator.id]
        victim.kill()
        try:
            produce(cluster, topic, 4, 400, 400)
            members.until(
                lambda: len(members.read) == 800 and balanced(members.assignments(), 4),
                "the members to rejoin and read the rest",
            )
        finally:
            victim.start()
    first = {key: n for key, n in members.read.items() if key[1] < 100}
    assert set(first.values()) == {1}  # committed before the kill: never read again
