"""Spark against a secured cluster: the replog source and the exactly-once sink on a 3-broker
cluster whose REPLOG listener is SASL_SSL (SCRAM-SHA-512 over TLS) with the StandardAuthorizer
on, the Spark user (``alice``) holding exactly the ACLs docs/security.md says a Spark
pipeline needs, and no more.

The settings are given as a Spark user gives them (``kafka.``-prefixed on the source,
unprefixed on the sink) and must reach every client of a query: the driver's, and those of the
executors, which are Python workers Spark starts and which get the settings pickled
(ReadSettings, SinkOptions). A direct read (segments from storage), a read through the brokers
and an exactly-once pipeline surviving a SIGKILLed output leader all run as alice; a wrong
password and a missing ACL fail the query with errors naming what failed, and no password
shows in an error or in the driver's logs.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from replication.client import Admin, NewTopic, Producer
from replication.common import TopicPartition
from replication.errors import AuthorizationError
from replication.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.readback import read_to_end
from tests.security_env import SecurityEnv
from tests.test_spark_sink_faults import ids, open_sink_transactions

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

ALICE = "User:alice"
#: alice reads the topics named so, and writes those named OUTPUT...; DENIED... she may not write
INPUT, OUTPUT, DENIED = "sec-in", "sec-out", "sec-denied"
WRONG_PASSWORD = "not-alices-password-5e0a"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> SecurityEnv:
    return SecurityEnv.create(tmp_path_factory.mktemp("spark-secrets"))


def allow(rt: ResourceType, name: str, pattern: PatternType, op: AclOperation) -> AclBinding:
    return AclBinding(rt, name, pattern, ALICE, "*", op, AclPermissionType.ALLOW)


def alice_acls() -> list[AclBinding]:
    """What docs/security.md says a Spark pipeline needs: Read and Describe on the
    input topics, Describe on the cluster (direct reads list log dirs), Write and Describe on
    the output topics, Write on the transactional ids ``replog-sink/`` (prefixed)."""
    topic, prefixed = ResourceType.TOPIC, PatternType.PREFIXED
    return [
        allow(topic, INPUT, prefixed, AclOperation.READ),
        allow(topic, INPUT, prefixed, AclOperation.DESCRIBE),
        allow(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL, AclOperation.DESCRIBE),
        allow(topic, OUTPUT, prefixed, AclOperation.WRITE),
        allow(topic, OUTPUT, prefixed, AclOperation.DESCRIBE),
        allow(ResourceType.TRANSACTIONAL_ID, "replog-sink/", prefixed, AclOperation.WRITE),
    ]


def super_user(env: SecurityEnv, cluster: Cluster) -> dict[str, Any]:
    """Client settings of the super user (``broker``): it sets up topics and ACLs and checks
    what the pipelines wrote."""
    return {
        **env.client_config("SASL_SSL"),
        "sasl.username": "broker",
        "sasl.password": env.users["broker"],
        "bootstrap.servers": cluster.bootstrap,
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, env: SecurityEnv) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("spark-secure-cluster"),
        brokers=3,
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
    try:
        c.start()
        probe = unique_name(INPUT)
        create(env, c, NewTopic(probe, 1, 3))
        grant(env, c, *alice_acls(), probe=probe)
        yield c
    finally:
        c.stop()  # also after a failed start: no process left behind


def grant(env: SecurityEnv, cluster: Cluster, *acls: AclBinding, probe: str) -> None:
    """Add ``acls`` (as the super user) and wait until every broker lets alice describe topic
    ``probe`` (ACLs reach the brokers with the metadata)."""
    with Admin(super_user(env, cluster)) as admin:
        admin.create_acls(acls)
    for broker in cluster.brokers.values():
        config = {**env.client_config("SASL_SSL"), "bootstrap.servers": broker.bootstrap}
        with Admin(config) as alice:
            wait_until(
                lambda alice=alice: _may_describe(alice, probe),
                timeout=30,
                message=f"alice's ACLs on broker {broker.broker_id}",
            )


def _may_describe(admin: Admin, topic: str) -> bool:
    try:
        admin.describe_topic(topic)
    except AuthorizationError:
        return False
    return True


def pipeline(
    spark: Any,
    env: SecurityEnv,
    cluster: Cluster,
    source: str,
    sink: str,
    checkpoint: Path,
    *,
    source_settings: dict[str, str] | None = None,
    max_offsets: int | None = None,
    sink_id: str | None = None,
) -> Any:
    """replog ``source`` -> replog ``sink`` as alice, exactly once, availableNow: the settings
    ``kafka.``-prefixed on the source (``source_settings`` replacing some), unprefixed on the
    sink."""
    reader = (
        spark.readStream.format("replog")
        .options(**spark_options(env, cluster, "kafka.", **(source_settings or {})))
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
    )
    if max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    writer = (
        reader.load()
        .select("value")
        .writeStream.format("replog")
        .options(**spark_options(env, cluster, ""))
        .option("topic", sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    if sink_id is not None:
        writer = writer.option("sink.id", sink_id)
    return writer.start()


def spark_options(env: SecurityEnv, cluster: Cluster, prefix: str, **over: str) -> dict[str, str]:
    """alice's settings as Spark options, each name with ``prefix`` (``kafka.`` or none)."""
    settings = {
        "bootstrap.servers": cluster.bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.truststore.location": str(env.ca),
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": env.jaas("alice"),
        **over,
    }
    return {prefix + k: v for k, v in settings.items()}


def create(env: SecurityEnv, cluster: Cluster, *topics: NewTopic) -> None:
    with Admin(super_user(env, cluster)) as admin:
        admin.create_topics(list(topics))


def committed_values(
    env: SecurityEnv, cluster: Cluster, topic: str, partitions: int
) -> list[bytes]:
    """Every record of ``topic``, read_committed, as the super user."""
    settings = super_user(env, cluster)
    bootstrap = settings.pop("bootstrap.servers")
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    read = read_to_end(bootstrap, tps, timeout=120, **settings)
    return [r.value or b"" for r in read.records]


def produce(env: SecurityEnv, cluster: Cluster, topic: str, n: int) -> None:
    """``{"id": 0}`` .. ``{"id": n-1}`` into ``topic``, as the super user."""
    values = [json.dumps({"id": i}) for i in range(n)]
    with Producer(super_user(env, cluster)) as producer:
        for future in producer.send_arrow(
            topic, pa.table({"value": pa.array(values, pa.string())})
        ):
            future.result()


class DriverLogs:
    """What the driver writes from now on: the Spark JVM's stderr (log4j's console and the
    stderr of the Python workers it starts, which Spark copies there) and this process's
    Python logging (``caplog``).

    The JVM inherited this process's fd 2; under pytest's fd capture that is a file, read here
    through /proc. When it is not a file (``-s``: a terminal), only Python logging is checked.
    """

    def __init__(self, spark: Any, caplog: pytest.LogCaptureFixture) -> None:
        runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
        self.path = f"/proc/{runtime.getName().split('@')[0]}/fd/2"  # the name is pid@host
        self.start = os.stat(self.path).st_size if self.readable else 0
        self.caplog = caplog
        caplog.set_level(logging.INFO)
        for name in ("replication", "datasource", "logstore"):
            caplog.set_level(logging.DEBUG, logger=name)

    @property
    def readable(self) -> bool:
        return stat.S_ISREG(os.stat(self.path).st_mode)

    def text(self) -> str:
        out = self.caplog.text
        if self.readable:
            with open(self.path, "rb") as f:
                f.seek(self.start)
                out += f.read().decode("utf-8", "replace")
        return out


def assert_no_password(env: SecurityEnv, *texts: str) -> None:
    for text in texts:
        for secret in (WRONG_PASSWORD, *env.users.values()):
            assert secret not in text


# --- reads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["direct", "broker"])
def test_a_batch_read_returns_every_record(
    spark: Any, env: SecurityEnv, cluster: Cluster, mode: str
) -> None:
    topic = unique_name(INPUT)
    create(env, cluster, NewTopic(topic, 2, 3))
    produce(env, cluster, topic, 500)
    rows = (
        spark.read.format("replog")
        .options(**spark_options(env, cluster, "kafka."))
        .option("subscribe", topic)
        .option("read.mode", mode)
        .load()
        .selectExpr("CAST(value AS STRING) AS v")
        .collect()
    )
    assert Counter(json.loads(r["v"])["id"] for r in rows) == Counter(range(500))


# --- refusals -------------------------------------------------------------------------------------


def test_a_wrong_password_fails_the_query_naming_sasl_and_the_user_not_the_password(
    spark: Any, env: SecurityEnv, cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source, sink = unique_name(INPUT), unique_name(OUTPUT)
    create(env, cluster, NewTopic(source, 1, 3), NewTopic(sink, 1, 3))
    produce(env, cluster, source, 10)
    logs = DriverLogs(spark, caplog)
    wrong = {"sasl.jaas.config": env.jaas("alice", WRONG_PASSWORD)}
    query = pipeline(spark, env, cluster, source, sink, tmp_path / "ckpt", source_settings=wrong)
    with pytest.raises(Exception, match="SaslAuthenticationFailedError") as failed:
        query.awaitTermination(120)
    message = str(failed.value)
    assert "SASL authentication as User:alice" in message, message
    driver_logs = logs.text()
    if logs.readable:  # the logs were read: the failure is in them, the passwords are not
        assert "SASL authentication as User:alice" in driver_logs
    assert_no_password(env, message, driver_logs)
    assert committed_values(env, cluster, sink, 1) == []


@pytest.mark.parametrize(
    ("acl", "denied"),
    [
        # no ACL at all: the driver's check of option topic fails before any task runs
        (None, "Describe"),
        # Describe only: the driver's check passes, the executors' writes are refused
        (AclOperation.DESCRIBE, "Write"),
    ],
    ids=["no-acl", "describe-only"],
)
def test_the_sink_without_an_acl_on_its_topic_fails_naming_the_principal(
    spark: Any,
    env: SecurityEnv,
    cluster: Cluster,
    tmp_path: Path,
    acl: AclOperation | None,
    denied: str,
) -> None:
    source, sink = unique_name(INPUT), unique_name(DENIED)
    create(env, cluster, NewTopic(source, 1, 3), NewTopic(sink, 1, 3))
    produce(env, cluster, source, 10)
    if acl is not None:
        grant(env, cluster, allow(ResourceType.TOPIC, sink, PatternType.LITERAL, acl), probe=sink)
    query = pipeline(spark, env, cluster, source, sink, tmp_path / "ckpt")
    # the driver's refusal is a TopicAuthorizationFailedError; an executor's is the
    # CommitFailedError of the task's transaction, naming the refusal
    with pytest.raises(Exception, match="not authorized") as failed:
        query.awaitTermination(120)
    message = str(failed.value)
    assert f"{ALICE} is not authorized to {denied} Topic:{sink}" in message, message
    assert committed_values(env, cluster, sink, 1) == []


# --- the exactly-once pipeline -------------------------------------------------------------------


def test_exactly_once_pipeline_with_a_sigkilled_output_leader(
    spark: Any, env: SecurityEnv, cluster: Cluster, tmp_path: Path
) -> None:
    source, sink, sink_id = unique_name(INPUT), unique_name(OUTPUT), unique_name("eo")
    create(
        env,
        cluster,
        NewTopic(source, 2, 3),
        NewTopic(sink, 3, 3, {"min.insync.replicas": "2"}),
    )
    produce(env, cluster, source, 2000)
    query = pipeline(
        spark, env, cluster, source, sink, tmp_path / "ckpt", max_offsets=200, sink_id=sink_id
    )
    with Admin(super_user(env, cluster)) as admin:
        # a batch is being written: a task's transaction is open on some output partition
        # (after at least one batch has committed, so the kill lands mid-stream)
        def writing() -> list[Any]:
            if admin.last_committed_batch(sink_id) < 1:
                return []
            return open_sink_transactions(admin, sink_id)

        open_txn = wait_until(writing, timeout=120, message="a sink transaction in flight")[0]
        partition = open_txn.partitions[0]
        leader = admin.describe_topic(sink).partitions[partition.partition].leader
    cluster.brokers[leader].kill()  # SIGKILL
    try:
        query.awaitTermination(180)
        assert query.exception() is None
        assert ids(committed_values(env, cluster, sink, 3)) == Counter(range(2000))
    finally:
        cluster.brokers[leader].start()  # the module's cluster whole again, whatever runs next
