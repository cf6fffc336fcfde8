"""Kafka's own Java client (kafka-clients 4.4.0) against replog's Kafka listener on three real
broker processes: an idempotent acks=all producer, a transactional producer (commit, abort,
offsets in a transaction, a zombie fenced), a classic-protocol consumer group of two members
rebalancing, and the AdminClient. A Java driver (tests/java/KafkaClientDriver.java, compiled
with javac against the jars mvn fetched) runs one scenario per JVM and prints what the client
saw; the tests judge it, and read the same records back through replog's own client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from replication.client import TopicPartition
from tests.cluster import Cluster
from tests.helpers import unique_name
from tests.kafka_jvm import driver
from tests.readback import read_to_end
from tests.test_kafka_clients import create_topic

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("kafka-java"), brokers=3, kafka=True).start()
    yield c
    c.stop()


def test_an_idempotent_acks_all_producer_writes_each_record_once_in_order(cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=3)
    facts = driver("idempotent", cluster.kafka_bootstrap, topic)

    sent = facts["sent"]
    assert sent["count"] == 3000
    # five requests in flight per connection, yet each partition's offsets follow send order
    assert sent["offsets_dense_in_send_order"] is True
    assert sent["ranges"] == {"0": [0, 999], "1": [0, 999], "2": [0, 999]}
    assert facts["read"] == {"count": 3000, "distinct": 3000, "intact": True}

    # the same records through replog's own protocol: keys, values, headers, timestamps
    tps = [TopicPartition(topic, p) for p in range(3)]
    records = read_to_end(cluster.bootstrap, tps).records
    assert len(records) == 3000
    for r in records:
        assert r.value is not None
        i = int(r.value.decode().removeprefix("value-"))
        assert (r.partition, r.offset) == (i % 3, i // 3)
        assert r.key == f"key-{i}".encode()
        assert r.timestamp == 1_700_000_000_000 + i
        assert list(r.headers) == [("i", str(i).encode())]


def test_a_transactional_producer_commits_aborts_and_is_fenced(cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=2)
    group = unique_name("txn-group")
    facts = driver("transactional", cluster.kafka_bootstrap, topic, group)

    committed = sorted(
        [f"committed-{i}" for i in range(13)] + ["successor-0"]  # sorted as strings, as Java
    )
    # offsets sent to the transaction count once it commits, never when it aborts
    assert facts["after_commit"] == {"offset": 10, "metadata": "first"}
    assert facts["after_abort"] == {"offset": 10, "metadata": "first"}
    # an open transaction's record is held back from read_committed readers (the LSO)
    assert facts["open"]["read_committed"] == sorted(v for v in committed if v != "successor-0")
    # the successor's initTransactions fenced the first producer: its send is refused
    # (INVALID_PRODUCER_EPOCH on Produce, as Kafka's broker answers a zombie since KIP-588)
    fenced = facts["fenced"]
    assert "zombie_committed" not in fenced, fenced
    assert fenced["error"] in ("ProducerFencedException", "InvalidProducerEpochException")
    read = facts["read"]
    assert read["read_committed"] == committed
    # read_uncommitted also sees the aborted records and the fenced transaction's open-0
    assert read["read_uncommitted"] == sorted(
        committed + [f"aborted-{i}" for i in range(5)] + ["open-0"]
    )
    # replog's own read_committed consumer agrees
    tps = [TopicPartition(topic, p) for p in range(2)]
    values = sorted(
        r.value.decode() for r in read_to_end(cluster.bootstrap, tps).records if r.value
    )
    assert values == committed


def test_a_classic_consumer_group_rebalances_between_two_members(cluster: Cluster) -> None:
    topic = create_topic(cluster, partitions=4)
    group = unique_name("java-group")
    facts = driver("group", cluster.kafka_bootstrap, topic, group)
    judge_group(facts, protocol="Classic", assignor="range")


def judge_group(facts: dict[str, dict[str, Any]], *, protocol: str, assignor: str) -> None:
    """The driver's group scenario (``group``, or ``consumer-group`` for KIP-848's protocol):
    two members split four partitions, the second leaves and the first takes them back, each
    record read once, the commits at the log end."""
    split = facts["split"]
    assert sorted(split["a"] + split["b"]) == [0, 1, 2, 3]
    assert split["a"]
    assert split["b"]
    described = facts["described"]
    assert described["state"] == "Stable"
    assert described["protocol"] == protocol
    assert described["assignor"] == assignor
    assert [m["client_id"] for m in described["members"]] == ["member-a", "member-b"]
    assert [m["partitions"] for m in described["members"]] == [split["a"], split["b"]]
    assert facts["both_read"]["b"] > 0  # the second member read its share
    assert facts["rejoined"]["a"] == [0, 1, 2, 3]
    assert facts["consumed"] == {"count": 2000, "duplicates": 0, "failed": None}
    committed = facts["committed"]
    assert committed["offsets"] == committed["ends"] == {str(p): 500 for p in range(4)}
    assert committed["state"] == "Empty"


#: AdminClient calls whose API replog's Kafka listener does not serve yet (and a newer API
#: version): the client's clear refusal, and the broker goes on
NOT_SERVED = {
    "describe_metadata_quorum": "DESCRIBE_QUORUM",
}


def test_the_admin_client(cluster: Cluster) -> None:
    topic = unique_name("java-admin")
    group = unique_name("admin-group")
    facts = driver("admin", cluster.kafka_bootstrap, topic, group)

    value: dict[str, Any] = {name: fact.get("value") for name, fact in facts.items()}
    cluster_facts = value["describe_cluster"]
    assert cluster_facts["nodes"] == [0, 1, 2]
    assert cluster_facts["cluster_id"]
    assert value["create_topics"] is True
    assert facts["create_existing"]["error"] == "TopicExistsException"
    assert value["list_topics"] is True
    described = value["describe_topics"]
    assert described["name"] == topic
    assert described["internal"] is False
    assert [(p["partition"], p["replicas"], p["isr"]) for p in described["partitions"]] == [
        (0, 3, 3),
        (1, 3, 3),
        (2, 3, 3),
    ]
    assert value["describe_configs"] == {
        "retention.ms": {"value": "86400000", "source": "DYNAMIC_TOPIC_CONFIG"},
        "min.insync.replicas": {"value": "2", "source": "DYNAMIC_TOPIC_CONFIG"},
        "segment.bytes": {"value": "67108864", "source": "DEFAULT_CONFIG"},
    }
    assert value["incremental_alter_configs"] == {
        "retention.ms": "3600000",
        "min.insync.replicas": "DEFAULT_CONFIG",
    }
    assert value["describe_broker_configs"] is True
    assert value["create_partitions"] == 4
    # 100 records 1 s apart from 1_700_000_000_000: the first at or after +42.5 s is offset 43
    assert value["list_offsets"] == {
        "earliest": 0,
        "latest": 100,
        "for_timestamp": 43,
        "for_timestamp_ts": 1_700_000_043_000,
    }
    assert value["list_offsets_max_timestamp"] == 99  # the newest timestamp is the last record's
    assert value["delete_records"] == {"low_watermark": 30, "earliest": 30}
    assert value["alter_group_offsets"] == 40
    assert value["list_consumer_groups"] is True
    assert value["describe_consumer_groups"] == {"state": "Empty", "members": 0}
    assert value["delete_group_offsets"] is False  # tp0's offset no longer listed
    assert value["delete_consumer_groups"] is True
    assert value["list_partition_reassignments"] == 0
    assert isinstance(value["list_transactions"], int)  # every broker answered
    assert value["delete_topics"] is True

    assert value["describe_log_dirs"] == 1  # broker 0's one storage root
    assert value["describe_producers"] == 1  # the driver's idempotent producer, on partition 0
    assert value["describe_user_scram_credentials"] == 0  # no SCRAM users on this cluster
    # ACLs on a cluster without an authorizer: Kafka's answer, naming the setting to turn on
    assert facts["describe_acls"]["error"] == "SecurityDisabledException"
    assert "authorizer.class.name" in facts["describe_acls"]["message"]
    for name, api in NOT_SERVED.items():
        fact = facts[name]
        assert fact.get("error") == "UnsupportedVersionException", (name, fact)
        assert api in fact["message"], (name, fact)
    assert all(b.alive for b in cluster.brokers.values())
