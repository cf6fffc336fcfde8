"""A secured cluster as a user meets it: `replog cluster up --secure` (3 brokers, SASL_SSL on
every listener, ACLs on), its admin working through client.properties, a new user refused
until an ACL allows it (the refusal naming principal, operation and resource), a Kafka client
(confluent-kafka) logging in over SASL_SSL on the Kafka listener, and nothing secret in any
node's log or any command's output."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from replication.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from replication.errors import (
    GroupAuthorizationFailedError,
    SaslAuthenticationFailedError,
    TopicAuthorizationFailedError,
    for_code,
)
from replication.protocol import ApiKey, FindCoordinatorRequest
from replication.tools.cli_common import read_properties
from tests.helpers import unique_name, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ALICE_PASSWORD = "alice-Pa55-7c2e"


def replog(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        capture_output=True,
        text=True,
        input=input,
        timeout=180,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


class SecureLocalCluster:
    def __init__(self, data: Path) -> None:
        self.data = data
        up = ok(
            replog(
                "cluster", "up", "--secure", "--brokers", "3", "--data", str(data),
                "--port-base", "0", "--detach",
                "--set", "broker.heartbeat.interval.ms=200",
                "--set", "broker.session.timeout.ms=2000",
            )
        )  # fmt: skip
        self.output = up
        self.bootstrap = up.split("bootstrap servers: ")[1].split()[0]
        self.kafka_bootstrap = up.split("Kafka clients (kcat, confluent-kafka, ...): ")[1].split()[
            0
        ]
        self.properties = data / "secrets" / "client.properties"
        self.admin_config = read_properties(self.properties)

    def client(self, **more: Any) -> dict[str, Any]:
        return {**self.admin_config, "bootstrap.servers": self.bootstrap, **more}

    def alice(self, **more: Any) -> dict[str, Any]:
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="alice" password="{ALICE_PASSWORD}";'
        )
        return self.client(**{"sasl.jaas.config": jaas, **more})


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureLocalCluster]:
    data = tmp_path_factory.mktemp("secure-cluster")
    try:
        yield SecureLocalCluster(data)
    finally:
        replog("cluster", "down", "--data", str(data))


def test_the_admin_works_and_a_plaintext_client_is_refused(secure: SecureLocalCluster) -> None:
    assert oct((secure.data / "secrets").stat().st_mode & 0o777) == "0o700"
    status = json.loads(ok(replog("cluster", "status", "--data", str(secure.data), "--json")))
    assert all(n["alive"] and n["answering"] for n in status["nodes"])
    cc = ("--bootstrap-server", secure.bootstrap, "--command-config", str(secure.properties))
    topic = unique_name("sec")
    ok(replog("topics", "create", topic, "--partitions", "3", "--replication-factor", "3", *cc))
    ok(replog("produce", topic, *cc, input="a\nb\nc\n"))
    consumed = ok(replog("consume", topic, "--from-beginning", "--max-messages", "3", *cc))
    assert sorted(consumed.split()) == ["a", "b", "c"]
    plain = replog("topics", "list", "--bootstrap-server", secure.bootstrap)
    assert plain.returncode == 1
    assert "Traceback" not in plain.stderr


def test_a_user_is_refused_until_an_acl_allows_it(secure: SecureLocalCluster) -> None:
    cc = ("--bootstrap-server", secure.bootstrap, "--command-config", str(secure.properties))
    ok(replog("users", "add", "alice", "--password-file", "-", *cc, input=ALICE_PASSWORD + "\n"))
    topic, group = unique_name("alice"), unique_name("g")
    with Admin(secure.client()) as admin:
        admin.create_topics([NewTopic(topic, 2, 3)])

    def alice_logs_in_everywhere() -> bool:
        """The new user reaches each broker with its next metadata (as in Kafka, `users add`
        answers once the controller has it): what is refused below must be the ACL, not a
        broker that has not heard of alice yet."""
        for address in secure.bootstrap.split(","):
            try:
                with Admin(secure.alice(**{"bootstrap.servers": address})) as admin:
                    admin.describe_cluster()
            except SaslAuthenticationFailedError:
                return False
        return True

    wait_until(alice_logs_in_everywhere, timeout=30, message="alice known to every broker")
    producer = Producer(secure.alice(**{"max.block.ms": 5000}))
    try:
        with pytest.raises(
            TopicAuthorizationFailedError, match="User:alice is not authorized to Describe Topic:"
        ):
            producer.send(topic, b"denied").result(timeout=30)
    finally:
        producer.close()
    ok(
        replog(
            "acls", "add", "--allow-principal", "User:alice", "--producer", "--topic", topic, *cc
        )
    )
    ok(
        replog(
            "acls", "add", "--allow-principal", "User:alice", "--consumer", "--topic", topic,
            "--group", group, *cc,
        )
    )  # fmt: skip

    def group_acl_everywhere() -> bool:
        """`acls add` answers once the controller has the bindings; each broker authorizes
        with the metadata it has applied (as Kafka's brokers do with their ACL cache). A
        consumer whose FindCoordinator reaches a broker that has not applied them yet fails
        for good (GroupAuthorizationFailedError, as in Kafka): wait until every broker
        authorizes alice's FindCoordinator itself, as above for her login."""
        with Admin(secure.alice()) as admin:
            cluster = admin._cluster
            for address in secure.bootstrap.split(","):
                host, port = address.rsplit(":", 1)
                response = cluster.connection_to(host, int(port)).send(
                    ApiKey.FIND_COORDINATOR, 0, FindCoordinatorRequest(key=group, key_type=0)
                )
                if for_code(response.error_code) is GroupAuthorizationFailedError:
                    return False
        return True

    wait_until(group_acl_everywhere, timeout=30, message="alice's group ACL on every broker")
    with Producer(secure.alice()) as producer:
        for i in range(10):
            producer.send(topic, str(i).encode(), partition=i % 2)
        producer.flush()
    seen: set[bytes] = set()

    def read_all(c: Consumer) -> bool:
        seen.update(r.value for r in c.poll(500) if r.value)
        return len(seen) == 10

    with Consumer(secure.alice(**{"group.id": group, "auto.offset.reset": "earliest"})) as c:
        c.subscribe([topic])
        wait_until(lambda: read_all(c), timeout=60)
        c.commit()
        committed = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    assert sum(o.offset for o in committed.values() if o is not None) == 10
    # every node's log names the refusal, and no password appears anywhere
    logs = "".join(p.read_text() for p in secure.data.glob("**/*.log"))
    assert f"principal=User:alice host=127.0.0.1 operation=Describe resource=Topic:{topic}" in logs
    for user in ("broker", "admin"):
        password = (secure.data / "secrets" / f"{user}.password").read_text().strip()
        assert password not in logs
        assert password not in secure.output
    assert ALICE_PASSWORD not in logs


def test_confluent_kafka_logs_in_on_the_kafka_listener(secure: SecureLocalCluster) -> None:
    topic = unique_name("ck")
    with Admin(secure.client()) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
    config = {
        "bootstrap.servers": secure.kafka_bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(secure.data / "secrets" / "ca.pem"),
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "admin",
        "sasl.password": (secure.data / "secrets" / "admin.password").read_text().strip(),
    }
    producer = confluent_kafka.Producer({**config, "acks": "all"})
    producer.produce(topic, b"from-librdkafka")
    assert producer.flush(30) == 0
    with Consumer(secure.client(**{"auto.offset.reset": "earliest"})) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        values: list[bytes] = []

        def read() -> bool:
            values.extend(r.value for r in consumer.poll(500) if r.value)
            return bool(values)

        wait_until(read, timeout=60)
    assert values == [b"from-librdkafka"]
