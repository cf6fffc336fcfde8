"""Client quotas on real broker processes: Kafka's kafka-configs sets and describes user,
client-id and default quotas (AlterClientQuotas, DescribeClientQuotas on the Kafka listener);
confluent-kafka producing above a producer_byte_rate, and consuming above a
consumer_byte_rate, is throttled (its throttle callback reports the broker's throttle time,
the broker's metrics of that entity show it) and loses nothing, kafka-python likewise; a
client over its request_percentage is throttled too; replog's own client waits
out the throttle_time_ms it is answered; the most specific quota applies; a quota removed
stops throttling; quotas survive a restart of the whole cluster; `replog configs` sets,
describes and removes them. Rates are measured by benchmarks/quotas.py, not here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import kafka
import pytest

from replication.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from replication.client.connection import BrokerConnection
from replication.metadata.image import QuotaEntity
from replication.protocol import ApiKey, MetadataRequest
from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.kafka_jvm import CONFIGS, tool
from tests.test_dynamic_configs import replog_configs
from tests.test_kafka_clients import wait_known
from tests.test_kafka_tools import ok
from tests.test_metrics import scrape, value

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

#: a quota low enough that a few dozen KB are throttled, high enough to run in seconds
RATE = 20_000
VALUE = b"q" * 1000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("quotas"), brokers=1, kafka=True, metrics=True).start()
    yield c
    c.stop()


def configs(cluster: Cluster, *args: str) -> str:
    return ok(tool(CONFIGS, "--bootstrap-server", cluster.kafka_bootstrap, *args))


def set_quota(cluster: Cluster, entity: dict[str, str | None], **quotas: float | None) -> None:
    """Set (a value) or remove (None) quotas of one entity with replog's admin client (the
    kafka-configs test runs Kafka's tool; the others need no JVM start per change)."""
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.alter_client_quotas(
            entity,
            set_quotas={k: v for k, v in quotas.items() if v is not None},
            remove=[k for k, v in quotas.items() if v is None],
        )


def topic(cluster: Cluster) -> str:
    name = unique_name("quota")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 1, 1)])
    wait_known(cluster, name, 1)
    return name


def quotas_of(cluster: Cluster, **entity: str | None) -> dict[QuotaEntity, dict[str, float]]:
    """replog's DescribeClientQuotas of the entities matching ``entity`` (client for
    client-id)."""
    wanted = {("client-id" if k == "client" else k): v for k, v in entity.items()}
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        return admin.describe_client_quotas(wanted)


def produce_confluent(cluster: Cluster, name: str, client_id: str, count: int) -> list[int]:
    """Produce ``count`` values with confluent-kafka; the throttle times it was told (ms)."""
    throttles: list[int] = []

    def throttled(event: Any) -> None:
        throttles.append(int(event.throttle_time * 1000))

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "client.id": client_id,
            "linger.ms": 5,
            "batch.size": 4096,
            "throttle_cb": throttled,
        }
    )
    failed: list[Any] = []

    def delivered(err: Any, message: Any) -> None:
        if err is not None:
            failed.append(err)

    for i in range(count):
        producer.produce(name, VALUE, key=str(i).encode(), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(120) == 0
    assert failed == []
    return throttles


def read_back(cluster: Cluster, name: str) -> list[bytes]:
    with Consumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(name, 0)])
        keys: list[bytes] = []
        end = consumer.end_offsets([TopicPartition(name, 0)])[TopicPartition(name, 0)]

        def done() -> bool:
            keys.extend(r.key for r in consumer.poll(timeout_ms=500) if r.key is not None)
            return len(keys) >= end

        wait_until(done, timeout=60, message=f"{end} records of {name} read back")
        return keys


def test_kafka_configs_sets_and_describes_user_client_and_default_quotas(cluster: Cluster) -> None:
    user = ["--entity-type", "users", "--entity-name", "alice"]
    out = configs(cluster, "--alter", *user,
                  "--add-config", "producer_byte_rate=1024,consumer_byte_rate=2048")  # fmt: skip
    assert "Completed updating config for user alice." in out, out
    configs(cluster, "--alter", "--entity-type", "clients", "--entity-default",
            "--add-config", "request_percentage=50")  # fmt: skip
    configs(cluster, "--alter", *user, "--entity-type", "clients", "--entity-name", "app",
            "--add-config", "producer_byte_rate=4096")  # fmt: skip
    described = configs(cluster, "--describe", *user)
    assert re.search(
        r"Quota configs for user-principal 'alice' are "
        r"(consumer_byte_rate=2048\.0, producer_byte_rate=1024\.0|"
        r"producer_byte_rate=1024\.0, consumer_byte_rate=2048\.0)",
        described,
    ), described
    assert "Quota configs for the default client-id are request_percentage=50.0" in configs(
        cluster, "--describe", "--entity-type", "clients", "--entity-default"
    )
    both = configs(cluster, "--describe", *user, "--entity-type", "clients", "--entity-name", "app")
    assert "user-principal 'alice', client-id 'app'" in both
    assert "producer_byte_rate=4096.0" in both
    # replog's admin client reads the same entities
    assert quotas_of(cluster, user="alice") == {
        (("user", "alice"),): {"consumer_byte_rate": 2048.0, "producer_byte_rate": 1024.0},
        (("client-id", "app"), ("user", "alice")): {"producer_byte_rate": 4096.0},
    }
    # a bad key or value is refused, naming it
    bad = tool(CONFIGS, "--bootstrap-server", cluster.kafka_bootstrap, "--alter", *user,
               "--add-config", "producer_byte_rate=10.5")  # fmt: skip
    assert bad.returncode != 0
    assert "whole number" in bad.stdout + bad.stderr
    for args in (
        [*user, "--delete-config", "producer_byte_rate,consumer_byte_rate"],
        ["--entity-type", "clients", "--entity-default", "--delete-config", "request_percentage"],
        [*user, "--entity-type", "clients", "--entity-name", "app", "--delete-config",
         "producer_byte_rate"],
    ):
        configs(cluster, "--alter", *args)
    assert quotas_of(cluster, user="alice") == {}
    assert quotas_of(cluster, client=None) == {}
    assert "alice" not in configs(cluster, "--describe", "--entity-type", "users")


def test_a_producer_and_a_consumer_over_their_quotas_are_throttled_and_lose_nothing(
    cluster: Cluster,
) -> None:
    name = topic(cluster)
    producer_id, consumer_id = unique_name("slow-producer"), unique_name("slow-consumer")
    set_quota(cluster, {"client-id": producer_id}, producer_byte_rate=RATE)
    set_quota(cluster, {"client-id": consumer_id}, consumer_byte_rate=RATE)
    # 80 KB at 20 KB/s: throttled after the first second's burst
    throttles = produce_confluent(cluster, name, producer_id, 80)
    assert max(throttles, default=0) > 0
    # the broker's metrics of that quota entity (a client-id quota: no user tag)
    samples = scrape(cluster.brokers[0])
    tags = {"user": "", "client_id": producer_id}
    assert value(samples, "kafka_server_produce_byte_rate", **tags) > 0
    assert value(samples, "kafka_server_produce_throttle_time", **tags) > 0
    assert value(samples, "kafka_server_request_request_time", **tags) == 0  # no such quota
    assert sorted(read_back(cluster, name)) == sorted(str(i).encode() for i in range(80))

    consumer_throttles: list[int] = []
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "client.id": consumer_id,
            "group.id": unique_name("g"),
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 1_000_000,
            "throttle_cb": lambda e: consumer_throttles.append(int(e.throttle_time * 1000)),
        }
    )
    try:
        consumer.subscribe([name])
        got: list[bytes | None] = []

        def consumed() -> bool:
            for m in consumer.consume(100, 0.5):
                if m.error() is None:
                    got.append(m.key())
            return len(got) >= 80

        wait_until(consumed, timeout=120, message="80 records consumed")
    finally:
        consumer.close()
    assert sorted(k or b"" for k in got) == sorted(str(i).encode() for i in range(80))
    assert max(consumer_throttles, default=0) > 0
    samples = scrape(cluster.brokers[0])
    assert value(samples, "kafka_server_fetch_byte_rate", user="", client_id=consumer_id) > 0


def test_replog_s_client_waits_out_the_throttle_time(cluster: Cluster) -> None:
    name = topic(cluster)
    client_id = unique_name("replog-producer")
    set_quota(cluster, {"client-id": client_id}, producer_byte_rate=RATE)
    with Producer(bootstrap_servers=cluster.bootstrap, client_id=client_id, acks="all",
                  batch_size=4096, linger_ms=5) as producer:  # fmt: skip
        futures = [producer.send(name, VALUE, key=str(i).encode()) for i in range(80)]
        for f in futures:
            f.result(timeout=120)
        throttle_max = producer.metrics()["produce-throttle-time-max"]
        connections = producer._cluster.connections()
    assert throttle_max > 0
    # each throttled answer made the next request to that broker wait (KIP-219)
    assert sum(c.throttle_time_ms_total for c in connections) > 0
    assert sum(c.throttled_requests for c in connections) > 0
    assert sorted(read_back(cluster, name)) == sorted(str(i).encode() for i in range(80))


def test_the_most_specific_quota_applies_and_a_removed_one_stops_throttling(
    cluster: Cluster,
) -> None:
    name = topic(cluster)
    fast = unique_name("fast")
    # every client id is limited, but this user's client `fast` has a generous quota of its own
    set_quota(cluster, {"client-id": None}, producer_byte_rate=RATE)
    set_quota(cluster, {"user": "ANONYMOUS", "client-id": fast}, producer_byte_rate=1e8)
    try:
        assert produce_confluent(cluster, name, fast, 80) == []
        assert produce_confluent(cluster, name, unique_name("other"), 80)
        set_quota(cluster, {"client-id": None}, producer_byte_rate=None)
        wait_until(lambda: not quotas_of(cluster, client=None), timeout=30, message="removed")
        assert produce_confluent(cluster, name, unique_name("other"), 80) == []
    finally:
        set_quota(cluster, {"user": "ANONYMOUS", "client-id": fast}, producer_byte_rate=None)


def test_quotas_survive_a_restart_of_the_cluster(cluster: Cluster) -> None:
    name = topic(cluster)
    client_id = unique_name("restarted")
    set_quota(cluster, {"client-id": client_id}, producer_byte_rate=RATE)
    broker = cluster.brokers[0]
    broker.stop()
    cluster.controller.stop()
    cluster.controller.start()
    broker.start()
    wait_known(cluster, name, 1)
    assert quotas_of(cluster, client=client_id) == {
        (("client-id", client_id),): {"producer_byte_rate": float(RATE)}
    }
    assert produce_confluent(cluster, name, client_id, 80)


def test_replog_configs_sets_describes_and_removes_client_quotas(cluster: Cluster) -> None:
    def run(*args: str) -> str:
        return ok(replog_configs(cluster, *args))

    out = run("alter", "--user", "carol", "--client", "etl", "--add-config",
              "producer_byte_rate=1048576,request_percentage=25")  # fmt: skip
    assert "Completed updating client quotas for user-principal 'carol', client-id 'etl'." in out
    run("alter", "--entity-type", "users", "--entity-default", "--add-config",
        "consumer_byte_rate=2097152")  # fmt: skip
    described = run("describe", "--entity-type", "users")
    assert "Quota configs for the default user-principal are consumer_byte_rate=2097152.0" in (
        described
    )
    assert (
        "Quota configs for user-principal 'carol', client-id 'etl' are "
        "producer_byte_rate=1048576.0, request_percentage=25.0"
    ) in described
    assert run("describe", "--user", "carol").strip() == ""  # strict: carol alone has none
    refused = replog_configs(cluster, "alter", "--client", "etl", "--add-config", "byte_rate=1")
    assert refused.returncode == 1
    assert "unknown quota 'byte_rate'" in refused.stderr
    run("alter", "--user", "carol", "--client", "etl", "--delete-config",
        "producer_byte_rate,request_percentage")  # fmt: skip
    run("alter", "--user-defaults", "--delete-config", "consumer_byte_rate")
    assert quotas_of(cluster, user="carol") == {}
    assert quotas_of(cluster, user=None) == {}


def test_kafka_python_is_throttled_under_a_producer_byte_rate(cluster: Cluster) -> None:
    name = topic(cluster)
    client_id = unique_name("kafka-python")
    set_quota(cluster, {"client-id": client_id}, producer_byte_rate=RATE)
    producer = kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap, client_id=client_id, acks="all",
        linger_ms=5, batch_size=4096,
    )  # fmt: skip
    try:
        futures = [producer.send(name, VALUE, key=str(i).encode()) for i in range(80)]
        producer.flush(120)
        offsets = [f.get(timeout=60).offset for f in futures]
        throttle_max = producer.metrics()["producer-metrics"]["throttle-time-max"]
    finally:
        producer.close()
    assert sorted(offsets) == list(range(80))
    assert throttle_max > 0


def test_request_percentage_throttles_a_client_that_keeps_the_broker_busy(
    cluster: Cluster,
) -> None:
    client_id = unique_name("busy")
    # 1% of a handler: 10 ms of handling per second
    set_quota(cluster, {"client-id": client_id}, request_percentage=1)
    broker = cluster.brokers[0]
    conn = BrokerConnection("127.0.0.1", broker.port, client_id, 30_000)
    try:

        def throttled() -> bool:
            # back to back: more handling time than the quota's 10 ms per second
            for _ in range(100):
                response = conn.send(ApiKey.METADATA, 0, MetadataRequest(topics=None))
                if response.throttle_time_ms > 0:
                    return True
            return False

        wait_until(throttled, timeout=60, message="a Metadata answer with throttle_time_ms")
        # the connection waits out the throttle before its next request (KIP-219)
        conn.send(ApiKey.METADATA, 0, MetadataRequest(topics=None))
        assert conn.throttled_requests > 0
    finally:
        conn.close()
    samples = scrape(broker)
    tags = {"user": "", "client_id": client_id}
    assert value(samples, "kafka_server_request_request_time", **tags) > 0
    assert value(samples, "kafka_server_request_throttle_time", **tags) > 0
