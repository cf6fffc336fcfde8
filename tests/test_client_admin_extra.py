"""Admin.describe_log_dirs and Admin.aborted_transactions, and Consumer errors for partitions
that do not exist, against a real broker."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator

import pytest

from replication.client import Admin, Consumer, Producer, ReplicaLog, TopicPartition
from replication.errors import BrokerNotAvailableError, ReplogError, UnknownTopicOrPartitionError
from tests import cluster
from tests.cluster import BrokerProcess, wait_until

pytestmark = pytest.mark.cluster

broker = cluster.broker


def _topic(prefix: str) -> str:
    return f"{prefix}-{random.randrange(10**9)}"


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[Admin]:
    with Admin(bootstrap_servers=broker.bootstrap, default_api_timeout_ms=10_000) as client:
        yield client


def test_describe_log_dirs_reports_each_replica_log(broker: BrokerProcess, admin: Admin) -> None:
    name = _topic("logdirs")
    admin.create_topic(name, 2, 1)
    tp0, tp1 = TopicPartition(name, 0), TopicPartition(name, 1)
    with Producer(bootstrap_servers=broker.bootstrap, acks="all") as producer:
        for i in range(5):
            producer.send(name, b"v%d" % i, partition=0)
        producer.flush(30)

    answers = admin.describe_log_dirs([tp0, tp1])
    assert list(answers) == [0]
    logs = answers[0]
    assert not isinstance(logs, ReplogError)
    assert set(logs) == {tp0, tp1}  # only the partitions asked for
    assert logs[tp0] == ReplicaLog(
        broker_id=0,
        log_dir=broker.log_dir,
        log_start_offset=0,
        log_end_offset=5,
        durable_end_offset=5,  # acks=all: in the replica's segment objects
        high_watermark=5,
        leader_epoch=logs[tp0].leader_epoch,
        is_leader=True,
        size_bytes=logs[tp0].size_bytes,
    )
    assert logs[tp0].size_bytes > 0
    assert (logs[tp1].log_end_offset, logs[tp1].durable_end_offset) == (0, 0)

    # every replica of the broker when no partitions are named
    everything = admin.describe_log_dirs(brokers=[0])[0]
    assert not isinstance(everything, ReplogError)
    assert {tp0, tp1} <= set(everything)

    # a broker that is not in the cluster is an entry with its error, not a failed call
    answers = admin.describe_log_dirs([tp0], brokers=[0, 7])
    assert isinstance(answers[7], BrokerNotAvailableError)
    assert "broker 7" in str(answers[7])
    assert not isinstance(answers[0], ReplogError)
    assert answers[0][tp0].log_end_offset == 5


def test_aborted_transactions_as_a_read_committed_fetch_reports_them(
    broker: BrokerProcess, admin: Admin
) -> None:
    name = _topic("aborted")
    admin.create_topic(name, 1, 1)
    tp = TopicPartition(name, 0)
    txn_id = _topic("txn")
    with Producer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(3):
            producer.send(name, b"aborted-%d" % i, partition=0)  # offsets 0..2
        producer.flush(30)
        producer.abort_transaction()  # ABORT marker at 3
        producer.begin_transaction()
        producer.send(name, b"committed", partition=0)  # offset 4
        producer.commit_transaction()  # COMMIT marker at 5
    (listing,) = [t for t in admin.list_transactions() if t.transactional_id == txn_id]

    assert admin.aborted_transactions(tp, 0) == ((listing.producer_id, 0),)
    assert admin.aborted_transactions(tp, 3) == ((listing.producer_id, 0),)  # its marker
    assert admin.aborted_transactions(tp, 4) == ()
    assert admin.aborted_transactions((name, 0), 6) == ()
    with pytest.raises(ValueError, match="start_offset"):
        admin.aborted_transactions(tp, -1)


def test_aborted_transactions_of_a_missing_partition(admin: Admin) -> None:
    with pytest.raises(UnknownTopicOrPartitionError, match="no-such-topic") as info:
        admin.aborted_transactions(TopicPartition("no-such-topic", 0), 0, timeout_ms=500)
    assert "aborted transactions" in str(info.value)


#: Far above the grace for missing partitions: the error must come from the grace (5 s).
LONG_API_TIMEOUT_MS = 600_000


def test_consumer_poll_names_a_topic_that_does_not_exist(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    with Consumer(
        bootstrap_servers=broker.bootstrap, default_api_timeout_ms=LONG_API_TIMEOUT_MS
    ) as consumer:
        consumer.assign([TopicPartition("missing-topic", 0)])
        with (
            caplog.at_level(logging.WARNING, logger="replication.client.offsets"),
            pytest.raises(UnknownTopicOrPartitionError, match="topic 'missing-topic'") as info,
        ):
            wait_until(lambda: consumer.poll(200) and False, timeout=60)
    assert "does not exist" in str(info.value)
    # said when first missed, not only when raised
    assert "missing-topic-0 is not in the cluster metadata" in caplog.text


def test_consumer_poll_names_a_partition_past_the_topic_count(
    broker: BrokerProcess, admin: Admin
) -> None:
    name = _topic("count")
    admin.create_topic(name, 2, 1)
    with Consumer(
        bootstrap_servers=broker.bootstrap, default_api_timeout_ms=LONG_API_TIMEOUT_MS
    ) as consumer:
        consumer.assign([TopicPartition(name, 0), TopicPartition(name, 5)])
        with pytest.raises(UnknownTopicOrPartitionError, match=f"{name}-5 does not exist") as info:
            wait_until(lambda: consumer.poll(200) and False, timeout=60)
        assert f"topic {name!r} has 2 partitions" in str(info.value)
        # the partition that exists is still readable
        consumer.assign([TopicPartition(name, 0)])
        assert consumer.poll(200) == []


def test_consumer_waits_for_a_topic_created_after_assign(
    broker: BrokerProcess, admin: Admin
) -> None:
    """A topic created while the consumer already polls (within the grace) is read."""
    name = _topic("late")
    with Consumer(
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
        default_api_timeout_ms=LONG_API_TIMEOUT_MS,
    ) as consumer:
        tp = TopicPartition(name, 0)
        consumer.assign([tp])
        assert consumer.poll(100) == []  # missed once: the grace starts
        admin.create_topic(name, 1, 1)
        assert consumer.position(tp) == 0  # found within the grace
        with Producer(bootstrap_servers=broker.bootstrap) as producer:
            producer.send(name, b"hello", partition=0).result(timeout=30)
        records = wait_until(lambda: consumer.poll(200), timeout=60)
        assert [r.value for r in records] == [b"hello"]
