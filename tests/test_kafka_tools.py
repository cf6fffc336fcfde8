"""Kafka's own tools (Apache Kafka 4.4.0, run from the jars' main classes as its bin/*.sh
scripts run them) against replog's Kafka listener on real broker processes: kafka-topics,
kafka-console-producer and -consumer with --group, kafka-consumer-groups (--delete-offsets too,
beside kafka-python's delete_group_offsets), kafka-configs, kafka-producer-perf-test,
kafka-consumer-perf-test, kafka-log-dirs, kafka-transactions list, describe (beside
kafka-python's describe_transactions), describe-producers and find-hanging, and kafka-acls with
SCRAM users added by kafka-configs (on a SASL_SSL cluster with ACLs on) work."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import kafka
import kafka.admin
import kafka.errors
import pytest

from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.kafka_jvm import (
    ACLS,
    CONFIGS,
    CONSOLE_CONSUMER,
    CONSOLE_PRODUCER,
    CONSUMER_GROUPS,
    CONSUMER_PERF,
    LOG_DIRS,
    PRODUCER_PERF,
    TOPICS,
    TRANSACTIONS,
    tool,
)
from tests.security_env import SecurityEnv
from tests.test_kafka_clients import wait_known

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("kafka-tools"), brokers=3, kafka=True).start()
    yield c
    c.stop()


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def create(cluster: Cluster, partitions: int = 3) -> str:
    """A topic made by kafka-topics, known (with its leaders) to every broker."""
    topic = unique_name("tool")
    out = ok(
        tool(TOPICS, "--bootstrap-server", cluster.kafka_bootstrap, "--create", "--topic", topic,
             "--partitions", str(partitions), "--replication-factor", "3")
    )  # fmt: skip
    assert f"Created topic {topic}." in out
    wait_known(cluster, topic, partitions)
    return topic


def test_kafka_topics_creates_lists_describes_alters_and_deletes(cluster: Cluster) -> None:
    bootstrap = cluster.kafka_bootstrap
    topic = create(cluster)
    assert topic in ok(tool(TOPICS, "--bootstrap-server", bootstrap, "--list")).split()

    ok(
        tool(
            TOPICS,
            "--bootstrap-server",
            bootstrap,
            "--alter",
            "--topic",
            topic,
            "--partitions",
            "5",
        )
    )
    wait_known(cluster, topic, 5)
    described = ok(tool(TOPICS, "--bootstrap-server", bootstrap, "--describe", "--topic", topic))
    assert re.search(
        rf"Topic: {topic}\tTopicId: \S+\tPartitionCount: 5\tReplicationFactor: 3", described
    )
    rows = re.findall(
        r"Partition: (\d+)\tLeader: (\d+)\tReplicas: ([\d,]+)\tIsr: ([\d,]+)", described
    )
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3, 4]
    for _, leader, replicas, isr in rows:
        assert sorted(replicas.split(",")) == ["0", "1", "2"]
        assert sorted(isr.split(",")) == ["0", "1", "2"]
        assert leader in replicas.split(",")
    # a topic's overrides, given with --config at create, are described under Configs:
    configured = unique_name("tool")
    ok(tool(TOPICS, "--bootstrap-server", bootstrap, "--create", "--topic", configured,
            "--partitions", "1", "--replication-factor", "3",
            "--config", "retention.ms=100000"))  # fmt: skip
    wait_known(cluster, configured, 1)
    described = ok(
        tool(TOPICS, "--bootstrap-server", bootstrap, "--describe", "--topic", configured)
    )
    assert re.search(r"\tConfigs: retention\.ms=100000\n", described), described
    # a topic that exists: Kafka's TopicExistsException, named
    again = tool(TOPICS, "--bootstrap-server", bootstrap, "--create", "--topic", topic,
                 "--partitions", "1", "--replication-factor", "3")  # fmt: skip
    assert again.returncode != 0
    assert "TopicExistsException" in again.stdout + again.stderr

    ok(tool(TOPICS, "--bootstrap-server", bootstrap, "--delete", "--topic", topic))
    wait_until(
        lambda: topic not in ok(tool(TOPICS, "--bootstrap-server", bootstrap, "--list")).split(),
        timeout=60,
        message=f"{topic} gone from kafka-topics --list",
    )


def test_console_producer_consumer_group_and_consumer_groups_tool(cluster: Cluster) -> None:
    bootstrap = cluster.kafka_bootstrap
    topic = create(cluster)
    group = unique_name("console")
    lines = [f"key-{i}:value-{i}" for i in range(30)]
    ok(
        tool(CONSOLE_PRODUCER, "--bootstrap-server", bootstrap, "--topic", topic,
             "--reader-property", "parse.key=true", "--reader-property", "key.separator=:",
             "--command-property", "acks=all", input="\n".join(lines) + "\n")
    )  # fmt: skip

    def consume() -> list[str]:
        out = ok(
            tool(CONSOLE_CONSUMER, "--bootstrap-server", bootstrap, "--topic", topic,
                 "--group", group, "--from-beginning", "--max-messages", "30",
                 "--timeout-ms", "60000", "--formatter-property", "print.key=true",
                 "--formatter-property", "key.separator=:")
        )  # fmt: skip
        return sorted(out.splitlines())

    assert consume() == sorted(lines)

    assert group in ok(tool(CONSUMER_GROUPS, "--bootstrap-server", bootstrap, "--list")).split()
    described = ok(
        tool(CONSUMER_GROUPS, "--bootstrap-server", bootstrap, "--describe", "--group", group)
    )
    rows = re.findall(rf"{group}\s+{topic}\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", described)
    assert len(rows) == 3
    # the group committed everything it read: lag 0 on every partition, 30 records in all
    assert sum(int(end) for _, _, end, _ in rows) == 30
    assert all(current == end and lag == "0" for _, current, end, lag in rows)

    reset = ok(
        tool(CONSUMER_GROUPS, "--bootstrap-server", bootstrap, "--reset-offsets", "--group",
             group, "--topic", topic, "--to-earliest", "--execute")
    )  # fmt: skip
    assert sorted(re.findall(rf"{group}\s+{topic}\s+(\d+)\s+(\d+)", reset)) == [
        ("0", "0"),
        ("1", "0"),
        ("2", "0"),
    ]
    # the group starts from the earliest offsets again: it reads all 30 a second time
    assert consume() == sorted(lines)
    state = ok(
        tool(CONSUMER_GROUPS, "--bootstrap-server", bootstrap, "--describe", "--group", group,
             "--state")
    )  # fmt: skip
    assert re.search(rf"{group}\s+\S+\s+\(\d\)\s+\S+\s+Empty\s+0", state), state


def test_consumer_groups_tool_and_kafka_python_delete_offsets(cluster: Cluster) -> None:
    """kafka-consumer-groups --delete-offsets and kafka-python's delete_group_offsets
    (OffsetDelete): an empty group's offsets of a partition go; while a member subscribes to
    the topic, they stay (GROUP_SUBSCRIBED_TO_TOPIC, per partition)."""
    bootstrap = cluster.kafka_bootstrap
    topic = create(cluster, partitions=2)
    group = unique_name("trim")
    committer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    committer.commit(
        offsets=[confluent_kafka.TopicPartition(topic, p, 5) for p in (0, 1)], asynchronous=False
    )
    committer.close()
    base = ["--bootstrap-server", bootstrap, "--delete-offsets", "--group", group]
    out = ok(tool(CONSUMER_GROUPS, *base, "--topic", f"{topic}:0"))
    assert f"Request succeeded for deleting offsets from group {group}." in out
    assert re.search(rf"^{topic}\s+0\s+Successful\s*$", out, re.M), out
    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=bootstrap)

    def committed() -> dict[int, int]:
        offsets = admin.list_group_offsets({group: None})[group]
        return {tp.partition: o.offset for tp, o in offsets.items() if o.offset >= 0}

    try:
        assert committed() == {1: 5}
        member = confluent_kafka.Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
        )
        try:
            member.subscribe([topic])
            wait_until(
                lambda: member.poll(0.2) is None and bool(member.assignment()),
                timeout=60,
                message="the member has its partitions",
            )
            held = tool(CONSUMER_GROUPS, *base, "--topic", topic)
            assert "Encountered some partition-level error" in held.stdout
            assert re.search(rf"^{topic}\s+1\s+Error: .*subscribed", held.stdout, re.M), held
            tp1 = kafka.TopicPartition(topic, 1)
            assert admin.delete_group_offsets(group, [tp1]) == {
                tp1: kafka.errors.GroupSubscribedToTopicError
            }
        finally:
            member.close()
        # empty again: kafka-python deletes the last one
        assert admin.delete_group_offsets(group, [tp1]) == {tp1: kafka.errors.NoError}
        assert committed() == {}
    finally:
        admin.close()


def test_kafka_configs_describes_and_alters_a_topic_config(cluster: Cluster) -> None:
    bootstrap = cluster.kafka_bootstrap
    topic = create(cluster)
    entity = ["--bootstrap-server", bootstrap, "--entity-type", "topics", "--entity-name", topic]
    assert ok(tool(CONFIGS, *entity, "--describe")).strip() == (
        f"Dynamic configs for topic {topic} are:"
    )
    out = ok(tool(CONFIGS, *entity, "--alter", "--add-config", "retention.ms=3600000"))
    assert f"Completed updating config for topic {topic}." in out

    def described() -> str:
        return ok(tool(CONFIGS, *entity, "--describe"))

    # each broker learns the change from the cluster metadata; the tool asks any one of them
    wait_until(
        lambda: "retention.ms=3600000" in described(), timeout=60, message="retention.ms shown"
    )
    everything = ok(tool(CONFIGS, *entity, "--describe", "--all"))
    assert "retention.ms=3600000" in everything
    assert re.search(r"segment\.bytes=\d+", everything)

    ok(tool(CONFIGS, *entity, "--alter", "--delete-config", "retention.ms"))
    wait_until(
        lambda: "retention.ms" not in described(), timeout=60, message="retention.ms deleted"
    )


def test_perf_tools_produce_and_consume(cluster: Cluster) -> None:
    bootstrap = cluster.kafka_bootstrap
    topic = create(cluster)
    produced = ok(
        tool(PRODUCER_PERF, "--topic", topic, "--num-records", "20000", "--record-size", "100",
             "--throughput", "-1", "--command-property", f"bootstrap.servers={bootstrap}",
             "acks=all")
    )  # fmt: skip
    assert re.search(r"^20000 records sent, [\d.]+ records/sec", produced, re.M), produced
    consumed = ok(
        tool(CONSUMER_PERF, "--bootstrap-server", bootstrap, "--topic", topic, "--num-records",
             "20000", "--timeout", "60000")
    )  # fmt: skip
    header, row = consumed.strip().splitlines()[-2:]
    names, values = header.split(","), row.split(",")
    fields = {n.strip(): v.strip() for n, v in zip(names, values, strict=True)}
    assert int(fields["data.consumed.in.nMsg"]) == 20000
    assert float(fields["data.consumed.in.MB"]) == pytest.approx(20000 * 100 / 2**20, rel=1e-3)


def test_kafka_transactions_lists_transactions(cluster: Cluster) -> None:
    bootstrap = cluster.kafka_bootstrap
    topic = create(cluster, partitions=2)
    open_id, done_id = unique_name("txn-open"), unique_name("txn-done")
    producers = []
    for transactional_id, partition in ((open_id, 1), (done_id, 0)):
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": transactional_id}
        )
        producer.init_transactions(60)
        producer.begin_transaction()
        producer.produce(topic, b"x", partition=partition)
        producer.flush(60)
        producers.append(producer)
    producers[1].commit_transaction(60)

    def rows(*args: str) -> dict[str, list[str]]:
        out = ok(tool(TRANSACTIONS, "--bootstrap-server", bootstrap, *args))
        _header, *lines = out.strip().splitlines()
        return {line.split()[0]: line.split() for line in lines}

    listed = rows("list")  # every broker asked; the coordinator's answer names both
    assert listed[open_id][-1] == "Ongoing"
    assert listed[done_id][-1] == "CompleteCommit"
    # --duration-filter: running for at least that long (only an open transaction runs)
    long_running = rows("list", "--duration-filter", "1")
    assert open_id in long_running
    assert done_id not in long_running
    assert open_id not in rows("list", "--duration-filter", "3600000")
    # --transactional-id-pattern (ListTransactions v2, KIP-1152): the pattern matches whole ids
    assert set(rows("list", "--transactional-id-pattern", f"{open_id}|{done_id}")) == {
        open_id,
        done_id,
    }
    assert rows("list", "--transactional-id-pattern", "txn-open") == {}

    # kafka-transactions describe (DescribeTransactions): an open transaction has a start
    # time and its partition; a committed one names no partition; one never begun has no
    # start time (-1 on the wire, as Kafka's coordinator answers): "None"
    empty_id = unique_name("txn-empty")
    idle = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": empty_id})
    idle.init_transactions(60)

    def describe(transactional_id: str) -> dict[str, str]:
        out = ok(
            tool(TRANSACTIONS, "--bootstrap-server", bootstrap, "describe",
                 "--transactional-id", transactional_id)
        )  # fmt: skip
        header, row = out.strip().splitlines()
        return dict(zip(header.split(), row.split(), strict=False))

    ongoing = describe(open_id)
    assert ongoing["TransactionState"] == "Ongoing"
    assert ongoing["TopicPartitions"] == f"{topic}-1"
    assert int(ongoing["CurrentTransactionStartTimeMs"]) > 0
    assert int(ongoing["TransactionDurationMs"]) >= 0
    assert ongoing["TransactionalId"] == open_id
    assert describe(done_id)["TransactionState"] == "CompleteCommit"
    empty = describe(empty_id)
    assert empty["TransactionState"] == "Empty"
    assert empty["CurrentTransactionStartTimeMs"] == "None"
    assert empty["TransactionDurationMs"] == "None"
    assert int(empty["ProducerId"]) >= 0
    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_transactions([open_id, empty_id])
    finally:
        admin.close()
    assert described[open_id].transaction_start_time_ms > 0
    assert described[open_id].topic_partitions == {kafka.TopicPartition(topic, 1)}
    assert described[empty_id].transaction_start_time_ms == -1
    producers[0].abort_transaction(60)


def test_kafka_log_dirs_describes_every_replica(cluster: Cluster) -> None:
    """kafka-log-dirs --describe (DescribeLogDirs): every broker's storage root, with each
    replica it holds and its size; --broker-list and --topic-list narrow it."""
    topic = create(cluster, partitions=2)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    for partition in (0, 1):
        producer.produce(topic, b"v" * 100, partition=partition)
    assert producer.flush(60) == 0

    def described(*args: str) -> dict[int, dict[str, int]]:
        out = ok(tool(LOG_DIRS, "--bootstrap-server", cluster.kafka_bootstrap, "--describe",
                      "--topic-list", topic, *args))  # fmt: skip
        doc = json.loads(out.strip().splitlines()[-1])
        return {
            b["broker"]: {p["partition"]: p["size"] for d in b["logDirs"] for p in d["partitions"]}
            for b in doc["brokers"]
        }

    # every replica holds its record once the followers have fetched it
    wait_until(
        lambda: all(
            len(sizes) == 2 and min(sizes.values()) > 100 for sizes in described().values()
        ),
        timeout=60,
        message=f"every broker's replicas of {topic} described with their record",
    )
    assert set(described()) == {0, 1, 2}
    assert list(described("--broker-list", "1")) == [1]


def test_kafka_transactions_describe_producers_and_find_hanging(cluster: Cluster) -> None:
    """kafka-transactions describe-producers and find-hanging (DescribeProducers, answered by
    any replica as Kafka's is): an open transaction's producer and first offset, on the
    leader and on a follower; nothing is hanging while it is younger than the timeout."""
    bootstrap = cluster.kafka_bootstrap
    topic = create(cluster, partitions=1)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": unique_name("txn-producers")}
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, b"x", partition=0)
    producer.flush(60)
    try:
        for broker in ("0", "1", "2"):  # the leader and both followers

            def producers(broker: str = broker) -> list[list[str]]:
                out = ok(tool(TRANSACTIONS, "--bootstrap-server", bootstrap,
                              "describe-producers", "--topic", topic, "--partition", "0",
                              "--broker-id", broker))  # fmt: skip
                return [line.split() for line in out.strip().splitlines()[1:]]

            # a follower knows the producer once it has fetched its batch
            wait_until(lambda: len(producers()) == 1, timeout=60, message=f"broker {broker}")
            (row,) = producers()
            assert row[-1] == "0"  # CurrentTransactionStartOffset: the open transaction's

        hanging = ok(tool(TRANSACTIONS, "--bootstrap-server", bootstrap, "find-hanging",
                          "--broker-id", "1"))  # fmt: skip
        header, *rows = hanging.strip().splitlines()
        assert header.split()[:3] == ["Topic", "Partition", "ProducerId"]
        assert rows == [], hanging  # open for seconds, not past the transaction timeout
    finally:
        producer.abort_transaction(60)
    assert all(b.alive for b in cluster.brokers.values())


# --- kafka-acls on a secured cluster -------------------------------------------------------


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    """One broker with SASL_SSL on both listeners and ACLs on; the super user's client
    properties for Kafka's tools (a PEM truststore, SCRAM-SHA-512)."""
    root = tmp_path_factory.mktemp("kafka-tools-secure")
    env = SecurityEnv.create(root / "secrets")
    c = Cluster(
        root,
        brokers=1,
        kafka=True,
        overrides=env.broker_overrides(
            "SASL_SSL",
            **{
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": "User:broker",
            },
        ),
        client=env.client_config("SASL_SSL"),
    )
    env.bootstrap(c.metadata_root)
    properties = root / "admin.properties"
    properties.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        f"sasl.jaas.config={env.jaas('broker')}\n"
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={env.ca}\n"
    )
    try:
        c.start()
        yield c, properties
    finally:
        c.stop()


def test_kafka_acls_and_scram_users_on_a_secured_cluster(secure: tuple[Cluster, Path]) -> None:
    """Kafka's tools log in over SASL_SSL (SCRAM-SHA-512, PEM truststore) and manage the
    cluster's security: kafka-configs adds a SCRAM user (AlterUserScramCredentials), who logs
    in; kafka-acls adds, lists and removes her ACL (CreateAcls, DescribeAcls, DeleteAcls), and
    what she may see follows it."""
    cluster, properties = secure
    bootstrap = cluster.kafka_bootstrap
    login = ["--bootstrap-server", bootstrap, "--command-config", str(properties)]
    topic = unique_name("secure")
    ok(tool(TOPICS, *login, "--create", "--topic", topic, "--partitions", "1",
            "--replication-factor", "1"))  # fmt: skip
    wait_until(
        lambda: topic in ok(tool(TOPICS, *login, "--list")).split(),
        timeout=60,
        message=f"{topic} listed over SASL_SSL",
    )
    user = unique_name("alice")
    scram = "SCRAM-SHA-512=[iterations=8192,password=secret]"
    added_user = ok(tool(CONFIGS, *login, "--alter", "--entity-type", "users", "--entity-name",
                         user, "--add-config", scram))  # fmt: skip
    assert f"Completed updating config for user {user}." in added_user
    alice = properties.with_name("alice.properties")
    jaas = (
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
        f'required username="{user}" password="secret";'
    )
    alice.write_text(
        "\n".join(
            jaas if line.startswith("sasl.jaas.config=") else line
            for line in properties.read_text().splitlines()
        )
    )
    as_alice = ["--bootstrap-server", bootstrap, "--command-config", str(alice)]

    def alice_sees() -> list[str]:
        return ok(tool(TOPICS, *as_alice, "--list")).split()

    # she logs in (once the controller's credential has reached the broker), sees nothing
    wait_until(
        lambda: tool(TOPICS, *as_alice, "--list").returncode == 0,
        timeout=60,
        message=f"{user} logs in with the credential kafka-configs added",
    )
    assert topic not in alice_sees()

    acl = ["--allow-principal", f"User:{user}", "--operation", "Describe", "--topic", topic]
    added = ok(tool(ACLS, *login, "--add", *acl))
    assert f"(principal=User:{user}, host=*, operation=DESCRIBE, permissionType=ALLOW)" in added
    listed = ok(tool(ACLS, *login, "--list", "--topic", topic))
    assert f"name={topic}, patternType=LITERAL" in listed
    assert f"principal=User:{user}" in listed
    wait_until(lambda: topic in alice_sees(), timeout=60, message=f"{user} allowed to see {topic}")

    ok(tool(ACLS, *login, "--remove", "--force", *acl))
    assert f"User:{user}" not in ok(tool(ACLS, *login, "--list", "--topic", topic))
    wait_until(lambda: topic not in alice_sees(), timeout=60, message=f"{user}'s ACL removed")
    # a wrong password is refused as Kafka refuses it
    wrong = properties.with_name("wrong.properties")
    wrong.write_text(properties.read_text().replace('password="', 'password="x'))
    refused = tool(TOPICS, "--bootstrap-server", bootstrap, "--command-config", str(wrong),
                   "--list", timeout=120)  # fmt: skip
    assert refused.returncode != 0
    assert "SaslAuthenticationException" in refused.stdout + refused.stderr
    assert all(b.alive for b in cluster.brokers.values())


def test_confluent_kafka_admin_manages_acls_and_scram_users(
    secure: tuple[Cluster, Path],
) -> None:
    """The same security APIs through librdkafka's AdminClient (confluent-kafka), on the same
    secured cluster: a SCRAM user upserted, described and deleted; an ACL created, described
    by a filter and deleted."""
    ck: Any = confluent_kafka.admin  # its stubs leave out the names it exports
    cluster, properties = secure
    password = re.search(r'password="([^"]+)"', properties.read_text())
    assert password is not None
    ca = re.search(r"ssl.truststore.location=(.+)", properties.read_text())
    assert ca is not None
    client = ck.AdminClient(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "broker",
            "sasl.password": password.group(1),
            "ssl.ca.location": ca.group(1).strip(),
        }
    )
    user = unique_name("bob")
    sha512 = ck.ScramMechanism.SCRAM_SHA_512
    upsert = ck.UserScramCredentialUpsertion(user, ck.ScramCredentialInfo(sha512, 4096), b"pw")
    client.alter_user_scram_credentials([upsert])[user].result(60)
    described = client.describe_user_scram_credentials([user])[user].result(60)
    assert [(c.mechanism, c.iterations) for c in described.scram_credential_infos] == [
        (sha512, 4096)
    ]

    topic = unique_name("acl-topic")
    binding = ck.AclBinding(
        ck.ResourceType.TOPIC, topic, ck.ResourcePatternType.LITERAL, f"User:{user}", "*",
        ck.AclOperation.READ, ck.AclPermissionType.ALLOW,
    )  # fmt: skip
    for future in client.create_acls([binding]).values():
        future.result(60)
    match = ck.AclBindingFilter(
        ck.ResourceType.TOPIC, topic, ck.ResourcePatternType.MATCH, None, None,
        ck.AclOperation.ANY, ck.AclPermissionType.ANY,
    )  # fmt: skip
    wait_until(
        lambda: client.describe_acls(match).result(60) == [binding],
        timeout=60,
        message=f"the ACL on {topic} described",
    )
    (deleted,) = client.delete_acls([match]).values()
    assert deleted.result(60) == [binding]
    assert client.describe_acls(match).result(60) == []

    deletion = ck.UserScramCredentialDeletion(user, sha512)
    client.alter_user_scram_credentials([deletion])[user].result(60)
    with pytest.raises(confluent_kafka.KafkaException) as gone:
        client.describe_user_scram_credentials([user])[user].result(60)
    assert gone.value.args[0].code() == confluent_kafka.KafkaError.RESOURCE_NOT_FOUND
