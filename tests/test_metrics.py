"""Prometheus metrics: a real cluster scraped over HTTP, and the pieces behind it.

The cluster tests start a controller and three brokers with ``metrics.port=0``, scrape
``/metrics`` with urllib and parse it with prometheus_client's own parser: a paused follower
shows as under-replicated on the leaders and moves the ISR counters by exactly the partitions
it follows; produced records count once in ``messagesin``; requests are counted per Kafka API
(FetchFollower apart); the controller counts the cluster; a consumer group's lag is served
by its coordinator; the clients report their own metrics through ``metrics()``.
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from logstore.batch import Record, build, count_records
from logstore.errors import ConfigError, StorageError
from logstore.log import Log
from logstore.storage import Storage
from replication.broker.partition import Partition, TopicPolicy
from replication.client import Consumer, Producer, TopicPartition
from replication.client.admin import Admin
from replication.client.config import ProducerConfig
from replication.client.metrics import ProducerMetrics, Sensor
from replication.config import broker_config_from
from replication.controller.service import ControllerService
from replication.errors import UnknownTopicOrPartitionError
from replication.metadata.image import PartitionState
from replication.metadata.store import MetadataStore
from replication.metrics.controller import ControllerCollector
from replication.metrics.endpoint import MetricsEndpoint
from replication.metrics.storage import StorageMetrics
from replication.protocol import ApiKey
from replication.tools import local_cluster
from tests.cluster import BrokerProcess, Cluster
from tests.helpers import register_live, unique_name, wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(node: BrokerProcess) -> Samples:
    with urllib.request.urlopen(node.metrics_url, timeout=10) as response:
        assert response.status == 200
        return parse(response.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value (0 if the node does not export it)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(nodes: list[BrokerProcess], name: str, **labels: str) -> float:
    return sum(value(scrape(node), name, **labels) for node in nodes)


# --- unit: the pieces -------------------------------------------------------------------------


@pytest.mark.unit
def test_metrics_config_is_checked() -> None:
    assert broker_config_from({}).metrics_host_port is None
    config = broker_config_from({"listeners": "REPLOG://10.0.0.5:9092", "metrics.port": "0"})
    assert config.metrics_host_port == ("10.0.0.5", 0)
    config = broker_config_from({"metrics.port": "9404", "metrics.host": "0.0.0.0"})
    assert config.metrics_host_port == ("0.0.0.0", 9404)
    with pytest.raises(ConfigError, match=r"metrics\.port=-2: must be at least -1"):
        broker_config_from({"metrics.port": -2})
    with pytest.raises(ConfigError, match=r"metrics\.port=70000: a TCP port is at most 65535"):
        _ = broker_config_from({"metrics.port": "70000"}).metrics_host_port
    with pytest.raises(ConfigError, match=r"metrics\.host='h:9404'.*the port is metrics\.port"):
        _ = broker_config_from({"metrics.port": "1", "metrics.host": "h:9404"}).metrics_host_port


@pytest.mark.unit
def test_endpoint_serves_its_registry_and_names_a_taken_port() -> None:
    endpoint = MetricsEndpoint()
    port = endpoint.start("127.0.0.1", 0)
    try:
        endpoint.requests.observe("Produce", 0.002)
        endpoint.requests.observe("FetchFollower", 0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            samples = parse(r.read().decode())
        for request in ("Produce", "FetchFollower"):
            labels = {"request": request}
            assert value(samples, "kafka_network_requestmetrics_requests_total", **labels) == 1
            assert (
                value(samples, "kafka_network_requestmetrics_totaltime_seconds_count", **labels)
                == 1
            )
        assert not [name for name, _ in samples if name.endswith("_created")]
        with pytest.raises(ConfigError, match=rf"metrics\.port={port}: .*cannot listen"):
            MetricsEndpoint().start("127.0.0.1", port)
    finally:
        endpoint.stop()


@pytest.mark.unit
def test_kafka_api_names() -> None:
    assert ApiKey.PRODUCE.kafka_name == "Produce"
    assert ApiKey.LEADER_AND_ISR.kafka_name == "LeaderAndIsr"
    assert ApiKey.INIT_PRODUCER_ID.kafka_name == "InitProducerId"
    assert ApiKey.OFFSET_FOR_LEADER_EPOCH.kafka_name == "OffsetForLeaderEpoch"


@pytest.mark.unit
def test_count_records_reads_whole_batches_only() -> None:
    one = build([Record(None, b"a", 1), Record(None, b"b", 1), Record(None, b"c", 1)])
    two = build([Record(None, b"d", 1)], base_offset=3)
    assert count_records(one + two) == 4
    assert count_records(one + two[:-1]) == 3  # a partial batch at the end is not counted
    assert count_records(b"") == 0


@pytest.mark.unit
def test_storage_metrics_count_operations_and_backend_errors(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    storage = Storage.from_url(tmp_path.as_uri())
    storage.observer = StorageMetrics(registry)
    storage.write("a", b"x")
    child = storage.child("dir")  # children report to the same observer
    child.write("b", b"y")
    assert child.read("b") == b"y"
    assert not storage.exists("missing")
    with pytest.raises(FileNotFoundError):
        storage.read("missing")  # an answer, not an error
    with pytest.raises(StorageError, match="failed"):
        storage.write("a/c", b"z")  # "a" is an object, not a directory: a backend error
    samples = parse(generate(registry))
    assert value(samples, "replog_storage_requests_total", kind="put") == 3
    assert value(samples, "replog_storage_requests_total", kind="get") == 2
    assert value(samples, "replog_storage_requests_total", kind="exists") == 1
    assert value(samples, "replog_storage_request_duration_seconds_count", kind="put") == 3
    assert value(samples, "replog_storage_errors_total", kind="put") == 1
    assert value(samples, "replog_storage_errors_total", kind="get") == 0


def generate(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


@pytest.mark.unit
def test_controller_collector_counts_only_on_the_active_controller() -> None:
    config = broker_config_from({"broker.id": "100", "process.roles": "controller"})
    store = MetadataStore(Storage.from_url(f"memory://{unique_name('metrics')}/meta"))
    service = ControllerService(config, store, "127.0.0.1", 9000)
    collector = ControllerCollector(service)
    standby = parse_families(collector)
    assert standby["kafka_controller_kafkacontroller_activecontrollercount"] == 0
    controller = service.controller
    controller.activate()
    for broker_id in range(3):
        register_live(
            controller, broker_id, "127.0.0.1", 9092 + broker_id, None, f"inc-{broker_id}"
        )
    controller.create_topic("orders", 4, 3)
    controller.create_topic("audit", 2, 1)
    active = parse_families(collector)
    assert active["kafka_controller_kafkacontroller_activecontrollercount"] == 1
    assert active["kafka_controller_kafkacontroller_globaltopiccount"] == 2
    assert active["kafka_controller_kafkacontroller_globalpartitioncount"] == 6
    assert active["kafka_controller_kafkacontroller_activebrokercount"] == 3
    assert active["kafka_controller_kafkacontroller_fencedbrokercount"] == 0
    assert active["kafka_controller_kafkacontroller_offlinepartitionscount"] == 0


def parse_families(collector: ControllerCollector) -> dict[str, float]:
    return {s.name: s.value for family in collector.collect() for s in family.samples}


@pytest.mark.unit
def test_sensor_rates_averages_and_maxima_over_the_sampled_window() -> None:
    now = [1000.0]
    sensor = Sensor(30.0, 2, lambda: now[0])
    assert math.isnan(sensor.avg())
    assert math.isnan(sensor.max())
    assert sensor.rate() == 0
    sensor.record(10)
    now[0] += 20
    sensor.record(30)
    assert (sensor.total, sensor.count) == (40, 2)
    assert (sensor.avg(), sensor.max()) == (20, 30)
    assert sensor.rate() == pytest.approx(40 / 30)  # at least (samples - 1) windows
    assert sensor.rate(of_count=True) == pytest.approx(2 / 30)
    now[0] += 45  # the first sample (t=1000) fell out of the 60 s window, not the second
    sensor.record(5)
    assert (sensor.max(), sensor.avg()) == (5, 5)
    assert sensor.total == 45


@pytest.mark.unit
def test_producer_metrics_snapshot_names() -> None:
    metrics = ProducerMetrics(ProducerConfig(bootstrap_servers="127.0.0.1:9092"))
    metrics.record_send.record(5)
    metrics.request_latency.record(3.0)
    snapshot = metrics.snapshot()
    assert snapshot["record-send-total"] == 5
    assert snapshot["request-total"] == 1
    assert snapshot["request-latency-max"] == 3.0
    assert math.isnan(snapshot["batch-size-avg"])


# --- cluster: scraped over HTTP ---------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A controller and 3 brokers serving metrics. Followers leave the ISR after 2 s behind;
    brokers are fenced only after 30 s of silence, so that a paused follower leaves ISRs by its
    leaders' doing (counted in isrshrinks), not by the controller's fencing."""
    overrides = {
        "replica.lag.time.max.ms": "2000",
        "broker.session.timeout.ms": "30000",
        "group.initial.rebalance.delay.ms": "0",
    }
    c = Cluster(
        tmp_path_factory.mktemp("metrics"), 3, overrides=overrides, metrics=True, kafka=True
    )
    c.start()
    yield c
    c.stop()


@pytest.fixture
def admin(cluster: Cluster) -> Iterator[Admin]:
    with Admin(bootstrap_servers=cluster.bootstrap) as a:
        yield a


def brokers(cluster: Cluster) -> list[BrokerProcess]:
    return list(cluster.brokers.values())


def partitions_of_every_topic(
    admin: Admin, created: str
) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """(leader, replicas, ISR) of every partition of every topic, internal ones included, as
    known by brokers whose metadata has topic ``created``."""

    def described() -> list[tuple[int, tuple[int, ...], tuple[int, ...]]] | None:
        names = admin.list_topics(include_internal=True)
        if created not in names:
            return None
        try:
            topics = admin.describe_topics(names)
        except UnknownTopicOrPartitionError:  # asked a broker with older metadata
            return None
        return [(p.leader, p.replicas, p.isr) for t in topics for p in t.partitions]

    return wait_until(described, message=f"every topic, {created} included")


def create(cluster: Cluster, admin: Admin, topic: str, partitions: int) -> None:
    """Create ``topic`` with RF 3 and wait until every broker hosts its partitions (so has
    the metadata that has it) and they are led with a full ISR."""
    admin.create_topic(topic, partitions, 3)
    for broker in brokers(cluster):
        wait_until(
            lambda b=broker: all(
                ("kafka_log_log_logendoffset", (("partition", str(i)), ("topic", topic)))
                in scrape(b)
                for i in range(partitions)
            ),
            message=f"broker {broker.broker_id} hosting {topic}",
        )

    def ready() -> bool:
        try:
            described = admin.describe_topic(topic).partitions
        except UnknownTopicOrPartitionError:  # the metadata has not reached that broker yet
            return False
        return all(p.leader >= 0 and len(p.isr) == 3 for p in described)

    wait_until(ready, message=f"{topic}: every partition led, with an ISR of 3")


@pytest.mark.cluster
@pytest.mark.chaos
def test_paused_follower_is_under_replicated_on_its_leaders(cluster: Cluster, admin: Admin) -> None:
    topic = unique_name("isr")
    create(cluster, admin, topic, 3)
    every = brokers(cluster)
    wait_until(
        lambda: total(every, "kafka_server_replicamanager_underreplicatedpartitions") == 0,
        message="no partition under-replicated",
    )
    victim = cluster.brokers[2]
    # every partition the victim follows (internal topics included) loses it from its ISR
    followed = [
        (leader, replicas)
        for leader, replicas, _ in partitions_of_every_topic(admin, topic)
        if victim.broker_id in replicas and leader != victim.broker_id
    ]
    assert followed
    others = [b for b in every if b is not victim]
    shrinks = total(others, "kafka_server_replicamanager_isrshrinks_total")
    expands = total(others, "kafka_server_replicamanager_isrexpands_total")
    victim.pause()
    try:
        wait_until(
            lambda: (
                total(others, "kafka_server_replicamanager_underreplicatedpartitions")
                == len(followed)
            ),
            timeout=30,
            message=f"{len(followed)} partitions under-replicated on the victim's leaders",
        )
        for broker in others:
            led = sum(1 for leader, _ in followed if leader == broker.broker_id)
            samples = scrape(broker)
            assert value(samples, "kafka_server_replicamanager_underreplicatedpartitions") == led
            # min.insync.replicas is 1: an ISR of 2 is not under min ISR
            assert value(samples, "kafka_server_replicamanager_underminisrpartitioncount") == 0
        assert total(others, "kafka_server_replicamanager_isrshrinks_total") == shrinks + len(
            followed
        )
    finally:
        victim.resume()
    wait_until(
        lambda: total(every, "kafka_server_replicamanager_underreplicatedpartitions") == 0,
        timeout=30,
        message="the resumed follower back in every ISR",
    )
    assert total(others, "kafka_server_replicamanager_isrexpands_total") == expands + len(followed)
    assert total(others, "kafka_server_replicamanager_isrshrinks_total") == shrinks + len(followed)


@pytest.mark.cluster
def test_produce_and_consume_are_counted_per_topic(cluster: Cluster, admin: Admin) -> None:
    topic = unique_name("traffic")
    create(cluster, admin, topic, 2)
    every = brokers(cluster)
    n = 500
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=5) as producer:
        for i in range(n):
            producer.send(topic, b"value-%d" % i, partition=i % 2)
        producer.flush(60)
        sent = producer.metrics()
    # the leaders counted each record once when they appended it (before acking it)
    assert total(every, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == n
    assert total(every, "kafka_server_brokertopicmetrics_bytesin_total", topic=topic) > n * 7
    wait_until(
        lambda: (
            total(every, "kafka_server_brokertopicmetrics_replicationbytesout_total", topic=topic)
            > 0
        ),
        message="followers fetched the records",
    )
    # the client's own view of the same records
    # every attempt counts, as Kafka's: a batch retried (a leader that did not know the new
    # topic yet) was sent twice
    assert sent["record-send-total"] == n + sent["record-retry-total"]
    assert sent["record-error-total"] == 0
    assert sent["request-total"] >= 1
    assert sent["request-latency-avg"] > 0
    assert sent["request-latency-max"] >= sent["request-latency-avg"]
    assert sent["batch-size-avg"] > 0
    assert sent["record-send-rate"] > 0

    consumer = Consumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        got: list[object] = []

        def read_all() -> bool:
            got.extend(consumer.poll(500))
            return len(got) >= n

        wait_until(read_all, timeout=60, message=f"{n} records consumed")
        received = consumer.metrics()
    finally:
        consumer.close()
    assert len(got) == n
    assert received["records-consumed-total"] == n
    assert received["fetch-total"] >= 1
    assert received["fetch-latency-avg"] >= 0
    assert received["bytes-consumed-total"] > 0
    assert received["records-lag-max"] == 0
    assert total(every, "kafka_server_brokertopicmetrics_messagesout_total", topic=topic) == n
    assert total(every, "kafka_network_requestmetrics_requests_total", request="Fetch") > 0
    assert total(every, "kafka_server_brokertopicmetrics_bytesout_total", topic=topic) > 0
    # the log gauges: each replica's LEO and HW at n/2, on every broker (RF=3)
    for broker in every:
        samples = scrape(broker)
        for index in ("0", "1"):
            labels = {"topic": topic, "partition": index}
            wait_until(
                lambda b=broker, labels=labels: (
                    value(scrape(b), "kafka_log_log_highwatermark", **labels) == n // 2
                ),
                message=f"broker {broker.broker_id}: HW of {topic}-{index}",
            )
            assert value(samples, "kafka_log_log_logendoffset", **labels) == n // 2
            assert value(samples, "kafka_log_log_size", **labels) > 0


@pytest.mark.cluster
def test_requests_controller_and_storage_metrics(cluster: Cluster, admin: Admin) -> None:
    topic = unique_name("requests")
    create(cluster, admin, topic, 1)
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        producer.send(topic, b"x").result(timeout=60)
    every = brokers(cluster)
    wait_until(
        lambda: (
            total(every, "kafka_network_requestmetrics_requests_total", request="FetchFollower") > 0
        ),
        message="follower fetches counted",
    )
    scrapes = [scrape(broker) for broker in every]
    for request in ("Produce", "Metadata", "FetchFollower"):
        labels = {"request": request}
        counts = [
            value(s, "kafka_network_requestmetrics_requests_total", **labels) for s in scrapes
        ]
        assert sum(counts) > 0, request
        # each request counted once and timed once
        assert [
            value(s, "kafka_network_requestmetrics_totaltime_seconds_count", **labels)
            for s in scrapes
        ] == counts
    for broker in every:
        samples = scrape(broker)
        assert value(samples, "replog_storage_requests_total", kind="put") > 0
        assert value(samples, "replog_storage_request_duration_seconds_count", kind="put") > 0
        assert value(samples, "kafka_server_replicamanager_partitioncount") > 0
    # followers long-poll their leaders (replica.fetch.wait.max.ms): their fetches wait in
    # the fetch purgatory of an idle leader
    wait_until(
        lambda: (
            total(
                every,
                "kafka_server_delayedoperationpurgatory_purgatorysize",
                delayedoperation="Fetch",
            )
            > 0
        ),
        message="follower fetches parked in a fetch purgatory",
    )
    controllers = [cluster.controller]
    assert total(controllers, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    wait_until(
        lambda: (
            total(controllers, "kafka_controller_kafkacontroller_globalpartitioncount")
            == len(partitions_of_every_topic(admin, topic))
        ),
        message="the controller's partition count",
    )
    assert total(controllers, "kafka_controller_kafkacontroller_globaltopiccount") == len(
        admin.list_topics(include_internal=True)
    )
    assert total(controllers, "kafka_controller_kafkacontroller_activebrokercount") == 3
    assert total(controllers, "kafka_controller_kafkacontroller_offlinepartitionscount") == 0
    assert total(controllers, "replog_metadata_write_duration_seconds_count") > 0


@pytest.mark.cluster
def test_consumer_group_lag_on_its_coordinator(cluster: Cluster, admin: Admin) -> None:
    topic = unique_name("lag")
    create(cluster, admin, topic, 1)
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=5) as producer:
        for i in range(100):
            producer.send(topic, b"%d" % i)
        producer.flush(60)
    group = unique_name("group")
    tp = TopicPartition(topic, 0)
    consumer = Consumer(bootstrap_servers=cluster.bootstrap, group_id=group)
    try:
        consumer.assign([tp])
        consumer.commit({tp: 30})
    finally:
        consumer.close()
    labels = {"group": group, "topic": topic, "partition": "0"}
    every = brokers(cluster)
    # exported once, by the coordinator (every broker has a replica of the partition)
    wait_until(
        lambda: (
            [value(scrape(b), "kafka_consumergroup_lag", **labels) for b in every].count(70) == 1
        ),
        message="the group's lag of 70 on its coordinator",
    )


@pytest.mark.unit
def test_a_fetch_expands_the_isr_with_its_own_follower_only() -> None:
    """A stalled follower of an idle partition (its last fetch offset is the HW) does not
    rejoin the ISR when another follower fetches: the ISR and under-replicated stay put."""
    plog = Log.open(Storage.from_url(f"memory://{unique_name('expand')}/t/0"))
    plog.append(build([Record(None, b"a", 0)]), leader_epoch=1)
    plog.flush()
    state = PartitionState((0, 1, 2), (0, 1), 0, 1, 0)
    partition = Partition("t", 0, plog, 0, TopicPolicy(), state)
    partition.note_follower_registrations({0: 1, 1: 1, 2: 1})
    partition.update_follower_fetch(1, 1)
    partition.update_follower_fetch(2, 1)  # broker 2 was caught up, then stalled
    partition.state = PartitionState((0, 1, 2), (0, 1), 0, 1, 1)  # shrunk without 2
    assert partition.isr_to_expand(1) is None  # broker 1's fetch does not bring back 2
    assert partition.isr_to_expand(2) == (0, 1, 2)  # broker 2's own fetch does


@pytest.mark.cluster
def test_transactions_by_state_on_their_coordinator(cluster: Cluster, admin: Admin) -> None:
    topic = unique_name("txn")
    create(cluster, admin, topic, 1)
    every = brokers(cluster)

    def in_state(state: str) -> float:
        return total(every, "kafka_coordinator_transaction_transactions", state=state)

    committed = in_state("CompleteCommit")
    with Producer(
        bootstrap_servers=cluster.bootstrap, transactional_id=unique_name("tx"), acks="all"
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"in a transaction").result(timeout=60)
        wait_until(lambda: in_state("Ongoing") == 1, message="one ongoing transaction")
        producer.commit_transaction()
    wait_until(lambda: in_state("Ongoing") == 0, message="no ongoing transaction")
    assert in_state("CompleteCommit") == committed + 1


@pytest.mark.cluster
def test_local_cluster_nodes_serve_metrics(tmp_path: Path) -> None:
    """``replog cluster up`` with a metrics port base: every node serves /metrics, and the
    state file knows where (port base 0: free ports, learnt from the nodes' lines)."""
    data = str(tmp_path / "data")
    nodes = local_cluster.cluster_up(data, 1, 0, kafka_port_base=None, metrics_port_base=0)
    try:
        assert [n.role for n in nodes] == ["controller", "broker"]
        assert all(n.metrics_port > 0 for n in nodes)
        assert local_cluster.ClusterLayout.of(data).read_state() == nodes
        for node in nodes:
            url = f"http://127.0.0.1:{node.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                samples = parse(response.read().decode())
            name = (
                "kafka_server_replicamanager_partitioncount"
                if node.role == "broker"
                else "kafka_controller_kafkacontroller_activecontrollercount"
            )
            assert (name, ()) in samples, node
    finally:
        local_cluster.cluster_down(data)


@pytest.mark.cluster
def test_kafka_listener_requests_count_under_kafka_names(cluster: Cluster, admin: Admin) -> None:
    """A Kafka client's requests are counted as replog's clients' are (nothing else produces
    meanwhile: the Produce requests counted are the Kafka producer's)."""
    topic = unique_name("kafka")
    create(cluster, admin, topic, 1)
    every = brokers(cluster)
    produces = total(every, "kafka_network_requestmetrics_requests_total", request="Produce")
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all", "linger.ms": 5}
    )
    for i in range(10):
        producer.produce(topic, b"kafka-%d" % i)
    assert producer.flush(60) == 0
    assert total(every, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == 10
    assert total(every, "kafka_network_requestmetrics_requests_total", request="Produce") > produces
    assert total(every, "kafka_network_requestmetrics_requests_total", request="ApiVersions") > 0
