"""Dynamic configs (Kafka's AlterConfigs / IncrementalAlterConfigs, kafka-configs): a topic's
or a broker's configs change without a restart, validated as at start, kept in the metadata.

In process (unit): the metadata image keeps dynamic broker configs and still reads format 3;
the controller validates with the key named and refuses keys that need a restart; a replica
manager reconfigures the logs it hosts when it applies the new metadata.

On real brokers (cluster): retention.ms lowered on a live topic removes its old segments on
every replica; a broker-level dynamic default applies to topics without an override; config
sources as DescribeConfigs reports them; an alteration survives a broker restart and a
controller failover; `replog configs`; confluent-kafka's AdminClient through the Kafka
listener.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from confluent_kafka.admin import NewTopic as KafkaNewTopic  # type: ignore[attr-defined]

from logstore.errors import ConfigError
from logstore.storage import Storage
from replication.broker.replica_manager import ReplicaManager
from replication.client import Admin, NewTopic, Producer, TopicPartition
from replication.client.admin import LogObjects
from replication.common import TopicPartition as TP
from replication.config import BrokerConfig
from replication.controller.controller import Controller
from replication.dynamic_config import APPEND, DELETE, SET
from replication.errors import (
    BrokerNotAvailableError,
    InvalidRequestError,
    NotEnoughReplicasError,
    ReplogError,
)
from replication.metadata.image import MetadataImage
from replication.metadata.store import MetadataStore
from tests.cluster import Cluster
from tests.helpers import register_live, unique_name, wait_until

#: the tier is on each test (unit or cluster); every test is bounded
pytestmark = pytest.mark.timeout(300)

# --- in process ---------------------------------------------------------------------------------


def controller_with_topic() -> tuple[MetadataStore, Controller]:
    metadata = MetadataStore(Storage.from_url(f"memory://dyn-{uuid.uuid4().hex}/meta"))
    c = Controller(metadata, 100, "127.0.0.1", 9000)
    c.activate()
    for b in range(3):
        register_live(c, b, "127.0.0.1", 9100 + b, None, f"a{b}")
    c.create_topic("t", 1, 3, [("retention.ms", "1000")])
    return metadata, c


@pytest.mark.unit
def test_metadata_keeps_dynamic_broker_configs_and_reads_format_3() -> None:
    image = MetadataImage(version=3).with_broker_configs("", {"retention.ms": "5"})
    image = image.with_broker_configs("1", {"min.insync.replicas": "2"})
    read = MetadataImage.from_bytes(image.to_bytes())
    assert read.broker_config_map("") == {"retention.ms": "5"}
    assert read.broker_config_map("1") == {"min.insync.replicas": "2"}
    assert read.broker_config_map("2") == {}
    assert read.with_broker_configs("1", {}).broker_config_map("1") == {}
    old = json.loads(image.to_bytes())
    old["format_version"] = 3
    del old["broker_configs"]
    assert MetadataImage.from_bytes(json.dumps(old).encode()).broker_configs == ()


@pytest.mark.unit
def test_the_controller_refuses_bad_configs_naming_the_key() -> None:
    _, c = controller_with_topic()
    cases: list[tuple[Callable[[], object], type[Exception], str]] = [
        (
            lambda: c.alter_topic_configs("t", [(SET, "retention.ms", "abc")]),
            ConfigError,
            r"retention.ms='abc': expected an integer",
        ),
        (
            lambda: c.alter_topic_configs("t", [(SET, "min.insync.replicas", "0")]),
            ConfigError,
            r"min.insync.replicas='0': must be at least 1",
        ),
        (
            lambda: c.alter_topic_configs("t", [(SET, "unclean.leader.election.enable", "maybe")]),
            ConfigError,
            "unclean.leader.election.enable='maybe': expected true or false",
        ),
        (
            lambda: c.alter_topic_configs("t", [(SET, "message.timestamp.type", "LogAppendTime")]),
            ConfigError,
            "message.timestamp.type='LogAppendTime': expected CreateTime .*LogAppendTime is not",
        ),
        (
            lambda: c.alter_topic_configs("t", [(SET, "cleanup.policy", "compacted")]),
            ConfigError,
            "cleanup.policy='compacted': expected delete or compact or compact,delete",
        ),
        (
            lambda: c.alter_topic_configs("t", [(SET, "min.cleanable.dirty.ratio", "1.5")]),
            ConfigError,
            r"min.cleanable.dirty.ratio='1.5': must be at most 1",
        ),
        (
            lambda: c.alter_topic_configs("t", [(SET, "max.compaction.lag.ms", "0")]),
            ConfigError,
            r"max.compaction.lag.ms='0': must be at least 1",
        ),
        (
            lambda: c.alter_topic_configs("t", [(SET, "retention.msx", "1")]),
            ConfigError,
            "unknown topic config 'retention.msx'",
        ),
        (
            lambda: c.alter_broker_configs("", [(SET, "broker.id", "7")]),
            ConfigError,
            "Cannot update these configs dynamically: broker.id: they need a restart",
        ),
        (
            lambda: c.alter_broker_configs("1", [(SET, "no.such.key", "7")]),
            ConfigError,
            "unknown broker config 'no.such.key'",
        ),
        (
            lambda: c.alter_broker_configs("1", [(SET, "retention.bytes", "-5")]),
            ConfigError,
            r"retention.bytes='-5': must be at least -1",
        ),
        (
            lambda: c.alter_broker_configs("one", [(SET, "retention.ms", "1")]),
            InvalidRequestError,
            "name a broker id",
        ),
        (
            lambda: c.alter_topic_configs("t", [(APPEND, "retention.ms", "1")]),
            InvalidRequestError,
            "APPEND applies to list-typed configs",
        ),
        (
            lambda: c.alter_topic_configs("t", [(SET, "retention.ms", None)]),
            InvalidRequestError,
            "a null value cannot be set",
        ),
    ]
    before = c.image.version
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    assert c.image.version == before
    # what Kafka Streams names on its internal topics is taken
    c.alter_topic_configs("t", [(SET, "message.timestamp.type", "CreateTime")])
    # and the compaction configs Kafka Streams names on its changelogs
    c.alter_topic_configs(
        "t",
        [
            (SET, "cleanup.policy", "compact,delete"),
            (SET, "delete.retention.ms", "1000"),
            (SET, "min.cleanable.dirty.ratio", "0.01"),
            (SET, "min.compaction.lag.ms", "0"),
            (SET, "max.compaction.lag.ms", "60000"),
        ],
    )
    # at creation too, with the same messages
    with pytest.raises(ConfigError, match=r"min.insync.replicas='0': must be at least 1"):
        c.create_topic("u", 1, 1, [("min.insync.replicas", "0")])


@pytest.mark.unit
def test_incremental_alteration_sets_and_deletes_and_legacy_alteration_replaces() -> None:
    _, c = controller_with_topic()
    assert c.alter_topic_configs("t", [(SET, "segment.ms", "60000")], validate_only=True) == {
        "retention.ms": "1000",
        "segment.ms": "60000",
    }
    assert c.image.topic("t").config_map() == {"retention.ms": "1000"}  # type: ignore[union-attr]
    c.alter_topic_configs("t", [(SET, "segment.ms", "60000"), (DELETE, "retention.ms", None)])
    assert c.image.topic("t").config_map() == {"segment.ms": "60000"}  # type: ignore[union-attr]
    c.alter_topic_configs("t", [(SET, "retention.bytes", "10")], replace_all=True)
    assert c.image.topic("t").config_map() == {"retention.bytes": "10"}  # type: ignore[union-attr]
    c.alter_broker_configs("", [(SET, "retention.ms", "5")])
    c.alter_broker_configs("2", [(SET, "retention.ms", "6")])
    assert c.image.broker_config_map("") == {"retention.ms": "5"}
    assert c.image.broker_config_map("2") == {"retention.ms": "6"}
    c.alter_broker_configs("", [(DELETE, "retention.ms", None)])
    assert c.image.broker_configs == (("2", (("retention.ms", "6"),)),)


@pytest.mark.unit
def test_a_replica_manager_reconfigures_its_logs_when_it_applies_new_metadata() -> None:
    # A ReplicaManager runs on the broker's event loop (its WAL writer is bound to it).
    async def scenario() -> None:
        metadata, c = controller_with_topic()
        c.create_topic("plain", 1, 3)
        rm = ReplicaManager(
            BrokerConfig(broker_id=0), Storage.from_url(f"memory://rm-{uuid.uuid4().hex}/logs")
        )
        try:
            rm.registered(c.image.broker(0).epoch)  # type: ignore[union-attr]
            rm.apply_image(metadata.read_latest())
            assert await rm.wait_for_opens(30)  # replicas open in the background
            t, plain = rm.partitions[TP("t", 0)], rm.partitions[TP("plain", 0)]
            assert t.log.config.retention_ms == 1000
            assert plain.log.config.retention_ms == 7 * 24 * 3600 * 1000
            c.alter_topic_configs(
                "t", [(SET, "retention.ms", "42"), (SET, "min.insync.replicas", "3")]
            )
            c.alter_broker_configs(
                "", [(SET, "retention.ms", "77"), (SET, "segment.bytes", "4096")]
            )
            rm.apply_image(metadata.read_latest())
            assert rm.partitions[TP("t", 0)] is t  # the same open log, reconfigured
            assert (t.log.config.retention_ms, t.policy.min_insync_replicas) == (42, 3)
            assert t.log.config.segment_bytes == 4096  # the broker default under the topic's own
            assert (plain.log.config.retention_ms, plain.policy.min_insync_replicas) == (77, 1)
            # this broker's over the default; another broker's: not here
            c.alter_broker_configs("0", [(SET, "retention.ms", "88")])
            c.alter_broker_configs("1", [(SET, "retention.ms", "99")])
            rm.apply_image(metadata.read_latest())
            assert plain.log.config.retention_ms == 88
            c.alter_topic_configs("t", [(DELETE, "retention.ms", None)])
            rm.apply_image(metadata.read_latest())
            assert t.log.config.retention_ms == 88
        finally:
            await rm.shutdown()

    asyncio.run(scenario())


@pytest.mark.unit
def test_unclean_leader_election_enabled_dynamically_elects_a_leaderless_partition() -> None:
    now = [1_000_000]
    metadata = MetadataStore(Storage.from_url(f"memory://dyn-{uuid.uuid4().hex}/meta"))
    c = Controller(
        metadata, 100, "127.0.0.1", 9000, session_timeout_ms=3000, time_ms=lambda: now[0]
    )
    c.activate()
    for b in range(3):
        register_live(c, b, "127.0.0.1", 9100 + b, None, f"a{b}")
    c.create_topic("t", 1, 3)
    state = c.image.topic("t").partitions[0]  # type: ignore[union-attr]
    # the ISR shrinks to the leader, then the leader's session expires: no clean candidate
    c.alter_partition(
        state.leader, "t", 0, state.leader_epoch, state.partition_epoch, [state.leader]
    )
    now[0] += 3001
    for b in range(3):
        if b != state.leader:
            c.heartbeat(b, c.image.broker(b).epoch, c.image.version)  # type: ignore[union-attr]
    assert c.check_sessions() == [state.leader]
    assert c.image.topic("t").partitions[0].leader == -1  # type: ignore[union-attr]
    c.alter_broker_configs("", [(SET, "unclean.leader.election.enable", "true")])
    new = c.image.topic("t").partitions[0]  # type: ignore[union-attr]
    assert new.leader not in (-1, state.leader)
    assert new.isr == (new.leader,)


# --- on real brokers ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    overrides = {"log.retention.check.interval.ms": "200", "file.delete.delay.ms": "0"}
    c = Cluster(
        tmp_path_factory.mktemp("dynamic-configs"), brokers=3, kafka=True, overrides=overrides
    ).start()
    yield c
    c.stop()


def create(admin: Admin, topic: str, **configs: str) -> None:
    """Topic ``topic`` (1 partition, 3 replicas; configs as keywords, dots as underscores),
    once every replica has it open."""
    admin.create_topics(
        [NewTopic(topic, 1, 3, {k.replace("_", "."): v for k, v in configs.items()})]
    )

    tp = TopicPartition(topic, 0)

    def hosted() -> bool:  # each replica's broker has applied the metadata that creates it
        logs = admin.describe_log_dirs([tp])
        return sum(1 for r in logs.values() if not isinstance(r, Exception) and tp in r) == 3

    wait_until(hosted, message=f"{topic} is open on its 3 replicas")


def shows(admin: Admin, kind: str, name: str, key: str, value: str, source: str) -> None:
    """Wait until DescribeConfigs shows ``key`` at ``value`` from ``source``: the broker asked
    applies a change with the metadata version that holds it (as in Kafka, an AlterConfigs
    answer means committed by the controller, not yet applied everywhere)."""

    def seen() -> bool:
        try:
            entry = admin.describe_configs(kind, name).get(key)  # type: ignore[arg-type]
        except BrokerNotAvailableError:  # a restarted broker not yet back in every metadata
            return False
        return entry is not None and (entry.value, entry.source) == (value, source)

    wait_until(seen, message=f"{kind} {name!r} shows {key}={value} from {source}")


def segments(cluster: Cluster, topic: str) -> dict[int, int]:
    """Segment objects of partition 0 on each broker's storage."""
    return {
        i: len(list(Path(b.data_dir / "logs" / topic / "0").glob("*.seg")))
        for i, b in cluster.brokers.items()
    }


def log_objects(admin: Admin, cluster: Cluster, topic: str) -> dict[int, int]:
    """Extents of partition 0's log on each broker (DescribeLogObjects, either layout: segment
    objects or chunks of WAL objects); -1 where the broker did not answer."""
    tp = TopicPartition(topic, 0)
    out = {}
    for i in cluster.brokers:
        found = admin.describe_log_objects(i, {tp: (0, -1)}).get(tp)
        out[i] = len(found.extents) if isinstance(found, LogObjects) else -1
    return out


@pytest.mark.cluster
@pytest.mark.parametrize("wal", [True, False], ids=["wal", "segments"])
def test_lowering_retention_ms_removes_old_segments_on_every_replica_without_a_restart(
    cluster_factory: Callable[..., Cluster], wal: bool
) -> None:
    overrides = {
        "log.retention.check.interval.ms": "200",
        "file.delete.delay.ms": "0",
        "log.wal.enable": str(wal).lower(),
    }
    cluster = cluster_factory(brokers=3, overrides=overrides)
    topic = unique_name("ret")
    pids = {i: b.pid for i, b in cluster.brokers.items()}
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        create(admin, topic, segment_bytes="1024")
        with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
            for i in range(6):  # each batch its own object, each object a segment of its own
                producer.send(topic, value=b"%d" % i * 2000, partition=0)
                producer.flush()
        tp = TopicPartition(topic, 0)
        wait_until(
            lambda: all(n >= 3 for n in log_objects(admin, cluster, topic).values()),
            message="several objects in every replica's log",
        )
        if not wal:
            assert all(n >= 3 for n in segments(cluster, topic).values())
        assert admin.list_offsets({tp: "earliest"})[tp] == 0
        admin.incremental_alter_configs("topic", topic, set_configs={"retention.ms": "1"})

        def starts() -> dict[int, int]:
            logs = admin.describe_log_dirs([tp])
            return {
                b: r[tp].log_start_offset for b, r in logs.items() if not isinstance(r, Exception)
            }

        wait_until(
            lambda: starts() == {0: 6, 1: 6, 2: 6},
            timeout=60,
            message="retention moved every replica's log start offset to its end",
        )
        assert log_objects(admin, cluster, topic) == {0: 0, 1: 0, 2: 0}
        if not wal:  # over the WAL, objects shared with other partitions go by compaction
            wait_until(
                lambda: set(segments(cluster, topic).values()) == {0},
                message="the retained-away segment objects are deleted from storage",
            )
        assert admin.list_offsets({tp: "earliest"})[tp] == 6
        shows(admin, "topic", topic, "retention.ms", "1", "DYNAMIC_TOPIC_CONFIG")
    assert {i: b.pid for i, b in cluster.brokers.items()} == pids  # nothing restarted


@pytest.mark.cluster
def test_bad_values_and_restart_only_keys_are_refused_naming_the_key(cluster: Cluster) -> None:
    topic = unique_name("bad")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        create(admin, topic)
        refused = {
            "retention.ms": ("abc", r"retention.ms='abc': expected an integer"),
            "min.insync.replicas": ("0", r"min.insync.replicas='0': must be at least 1"),
            "retention.msx": ("1", r"unknown topic config 'retention.msx'"),
        }
        for key, (value, message) in refused.items():
            with pytest.raises(ConfigError, match=message):
                admin.incremental_alter_configs("topic", topic, set_configs={key: value})
        with pytest.raises(ConfigError, match=r"Cannot update these configs dynamically: log\.dir"):
            admin.incremental_alter_configs("broker", "", set_configs={"log.dir": "file:///x"})
        with pytest.raises(ConfigError, match=r"retention\.bytes='x'"):
            admin.alter_configs("broker", "1", {"retention.bytes": "x"})
        admin.incremental_alter_configs(
            "topic", topic, set_configs={"retention.ms": "5"}, validate_only=True
        )
        configs = admin.describe_configs("topic", topic)
        assert configs["retention.ms"].source == "DEFAULT_CONFIG"
        assert not any(c.source == "DYNAMIC_TOPIC_CONFIG" for c in configs.values())


@pytest.mark.cluster
def test_a_dynamic_broker_default_applies_to_topics_without_an_override(cluster: Cluster) -> None:
    plain, own = unique_name("plain"), unique_name("own")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        create(admin, plain)
        create(admin, own, min_insync_replicas="1")

        def produce(topic: str) -> ReplogError | None:
            with Producer(
                bootstrap_servers=cluster.bootstrap,
                acks="all",
                retries=0,
                delivery_timeout_ms=5000,
                request_timeout_ms=4000,
            ) as producer:
                future = producer.send(topic, value=b"v", partition=0)
                try:
                    future.result(timeout=30)
                except ReplogError as err:
                    return err
            return None

        try:
            admin.incremental_alter_configs("broker", "", set_configs={"min.insync.replicas": "4"})
            wait_until(
                lambda: isinstance(produce(plain), NotEnoughReplicasError),
                message="acks=all refused: 3 in sync, min.insync.replicas=4 by default",
            )
            wait_until(lambda: produce(own) is None, message="the topic's own value wins")
            for b in ("0", "1", "2"):
                shows(
                    admin, "broker", b, "min.insync.replicas", "4", "DYNAMIC_DEFAULT_BROKER_CONFIG"
                )
            configs = admin.describe_configs("topic", plain)
            assert configs["min.insync.replicas"].value == "4"
            assert configs["min.insync.replicas"].source == "DYNAMIC_DEFAULT_BROKER_CONFIG"
            assert configs["min.insync.replicas"].read_only is False
            assert admin.describe_configs("topic", own)["min.insync.replicas"].source == (
                "DYNAMIC_TOPIC_CONFIG"
            )
            # broker 0's own dynamic value over the default, on broker 0 only
            admin.incremental_alter_configs("broker", "0", set_configs={"retention.ms": "3600000"})
            shows(admin, "broker", "0", "retention.ms", "3600000", "DYNAMIC_BROKER_CONFIG")
            broker0 = admin.describe_configs("broker", "0")
            assert broker0["min.insync.replicas"].source == "DYNAMIC_DEFAULT_BROKER_CONFIG"
            assert broker0["file.delete.delay.ms"].source == "STATIC_BROKER_CONFIG"
            assert broker0["max.message.bytes"].source == "DEFAULT_CONFIG"
            assert broker0["broker.id"].read_only is True
            assert broker0["retention.ms"].read_only is False
            assert admin.describe_configs("broker", "1")["retention.ms"].source == (
                "DEFAULT_CONFIG"
            )
            defaults = admin.describe_configs("broker", "")
            assert {k: (c.value, c.source) for k, c in defaults.items()} == {
                "min.insync.replicas": ("4", "DYNAMIC_DEFAULT_BROKER_CONFIG")
            }
        finally:
            admin.incremental_alter_configs("broker", "", delete_configs=["min.insync.replicas"])
            admin.incremental_alter_configs("broker", "0", delete_configs=["retention.ms"])
        wait_until(lambda: produce(plain) is None, message="acks=all accepted again")
        wait_until(lambda: admin.describe_configs("broker", "") == {}, message="no default left")


def replog_configs(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "replication.tools.cli",
            "configs",
            *args,
            "--bootstrap-server",
            cluster.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.cluster
def test_configs_cli_alters_and_describes_as_kafka_configs(cluster: Cluster) -> None:
    topic = unique_name("cli")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        create(admin, topic)
    entity = ["--entity-type", "topics", "--entity-name", topic]
    done = replog_configs(
        cluster, "alter", *entity, "--add-config", "retention.ms=3600000,segment.bytes=2097152"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"Completed updating config for topic {topic}."
    expected = [
        f"Dynamic configs for topic {topic} are:",
        "  retention.ms=3600000 source=DYNAMIC_TOPIC_CONFIG read_only=false sensitive=false",
        "  segment.bytes=2097152 source=DYNAMIC_TOPIC_CONFIG read_only=false sensitive=false",
    ]
    wait_until(
        lambda: replog_configs(cluster, "describe", *entity).stdout.splitlines() == expected,
        message="describe shows both overrides",
    )
    removed = replog_configs(cluster, "alter", *entity, "--delete-config", "segment.bytes")
    assert removed.returncode == 0, removed.stderr

    def described() -> dict[str, dict[str, object]]:
        shown = replog_configs(cluster, "describe", *entity, "--all", "--json")
        assert shown.returncode == 0, shown.stderr
        return {c["name"]: c for c in json.loads(shown.stdout)}

    wait_until(
        lambda: described()["segment.bytes"]["source"] == "DEFAULT_CONFIG",
        message="segment.bytes back to its default",
    )
    assert described()["retention.ms"]["value"] == "3600000"
    default = replog_configs(
        cluster,
        "alter",
        "--entity-type",
        "brokers",
        "--entity-default",
        "--add-config",
        "retention.bytes=1000000000",
    )
    assert default.returncode == 0, default.stderr
    assert default.stdout.strip() == "Completed updating default config for brokers in the cluster."
    wait_until(
        lambda: (
            "  retention.bytes=1000000000 source=DYNAMIC_DEFAULT_BROKER_CONFIG"
            in replog_configs(
                cluster, "describe", "--entity-type", "brokers", "--entity-default"
            ).stdout
        ),
        message="the cluster default shown",
    )
    undo = replog_configs(
        cluster,
        "alter",
        "--entity-type",
        "brokers",
        "--entity-default",
        "--delete-config",
        "retention.bytes",
    )
    assert undo.returncode == 0, undo.stderr
    for args, message in [
        ([*entity, "--add-config", "retention.ms=abc"], "retention.ms='abc': expected an integer"),
        (
            ["--entity-type", "brokers", "--entity-name", "0", "--add-config", "listeners=x:1"],
            "Cannot update these configs dynamically: listeners",
        ),
        ([*entity, "--add-config", "retention.ms"], "expected key=value pairs"),
        (
            ["--entity-type", "groups", "--entity-name", "g", "--add-config", "a=b"],
            "--entity-type 'groups': use topics, brokers, users, clients",
        ),
    ]:
        failed = replog_configs(cluster, "alter", *args)
        assert failed.returncode == 1, failed.stdout
        assert failed.stderr.count("\n") == 1, failed.stderr
        assert message in failed.stderr, failed.stderr


def confluent_configs(client: AdminClient, kind: Any, name: str) -> dict[str, Any]:
    (future,) = client.describe_configs([ConfigResource(kind, name)]).values()
    return dict(future.result(30))


@pytest.mark.cluster
def test_confluent_kafka_admin_alters_and_describes_through_the_kafka_listener(
    cluster: Cluster,
) -> None:
    topic = unique_name("ck")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        create(admin, topic)
    client = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    topic_type = ConfigResource.Type.TOPIC
    resource = ConfigResource(
        topic_type,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    client.incremental_alter_configs([resource])[resource].result(30)
    wait_until(
        lambda: confluent_configs(client, topic_type, topic)["retention.ms"].value == "7200000",
        message="confluent-kafka sees the new retention.ms",
    )
    configs = confluent_configs(client, topic_type, topic)
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not configs["retention.ms"].is_read_only
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value

    legacy = ConfigResource(topic_type, topic, set_config={"segment.ms": "60000"})
    # the legacy AlterConfigs (33) replaces the whole set; confluent-kafka deprecates its call
    with pytest.warns(DeprecationWarning, match="alter_configs has been deprecated"):
        altered = client.alter_configs([legacy])
    altered[legacy].result(30)

    def overrides() -> dict[str, str]:
        return {
            k: c.value
            for k, c in confluent_configs(client, topic_type, topic).items()
            if c.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
        }

    wait_until(lambda: overrides() == {"segment.ms": "60000"}, message="the set replaced")

    bad = ConfigResource(
        topic_type,
        topic,
        incremental_configs=[
            ConfigEntry("min.insync.replicas", "0", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(confluent_kafka.KafkaException, match=r"min\.insync\.replicas='0'"):
        client.incremental_alter_configs([bad])[bad].result(30)
    append = ConfigResource(
        topic_type,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND)
        ],
    )
    with pytest.raises(confluent_kafka.KafkaException, match=r"list-typed"):
        client.incremental_alter_configs([append])[append].result(30)
    broker_type = ConfigResource.Type.BROKER
    broker = ConfigResource(
        broker_type,
        "1",
        incremental_configs=[
            ConfigEntry("retention.bytes", "123456789", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    try:
        client.incremental_alter_configs([broker])[broker].result(30)
        wait_until(
            lambda: (
                confluent_configs(client, broker_type, "1")["retention.bytes"].value == "123456789"
            ),
            message="broker 1 shows its dynamic retention.bytes",
        )
        configs = confluent_configs(client, broker_type, "1")
        assert configs["retention.bytes"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert configs["broker.id"].is_read_only
    finally:
        undo = ConfigResource(
            broker_type,
            "1",
            incremental_configs=[
                ConfigEntry("retention.bytes", None, incremental_operation=AlterConfigOpType.DELETE)
            ],
        )
        client.incremental_alter_configs([undo])[undo].result(30)


@pytest.mark.cluster
def test_alterations_survive_a_broker_restart_and_a_controller_failover(
    cluster_factory: Callable[..., Cluster],
) -> None:
    c = cluster_factory(brokers=3)
    topic = unique_name("keep")
    claims = Path(c.data_dir / "metadata" / "controller")
    with Admin(bootstrap_servers=c.bootstrap) as admin:
        create(admin, topic)
        admin.incremental_alter_configs("topic", topic, set_configs={"retention.ms": "123456"})
        admin.incremental_alter_configs("broker", "", set_configs={"retention.bytes": "987654"})
    c.brokers[1].kill()
    c.brokers[1].start()
    c.controller.kill()
    with Admin(bootstrap_servers=c.bootstrap) as admin:
        wait_until(
            lambda: 1 in [b.node_id for b in admin.describe_cluster().brokers],
            timeout=60,
            message="the restarted broker 1 is back in the cluster",
        )
    wait_until(
        lambda: len(list(claims.glob("*.json"))) >= 2,
        timeout=60,
        message="a broker-controller takes over at epoch 2",
    )
    with Admin(bootstrap_servers=c.bootstrap) as admin:
        # the new controller keeps what the old one wrote, and writes more on top of it
        admin.incremental_alter_configs("topic", topic, set_configs={"segment.ms": "600000"})
        shows(admin, "broker", "1", "retention.bytes", "987654", "DYNAMIC_DEFAULT_BROKER_CONFIG")
        shows(admin, "topic", topic, "segment.ms", "600000", "DYNAMIC_TOPIC_CONFIG")
        configs = admin.describe_configs("topic", topic)
        assert (configs["retention.ms"].value, configs["retention.ms"].source) == (
            "123456",
            "DYNAMIC_TOPIC_CONFIG",
        )
        assert configs["retention.bytes"].value == "987654"


@pytest.mark.cluster
def test_a_compacted_topic_through_the_kafka_listener(cluster: Cluster) -> None:
    topic = unique_name("compacted")
    client = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    created = client.create_topics(
        [
            KafkaNewTopic(
                topic,
                1,
                3,
                config={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"},
            )
        ]
    )
    created[topic].result(30)
    topic_type = ConfigResource.Type.TOPIC
    configs = confluent_configs(client, topic_type, topic)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["min.cleanable.dirty.ratio"].value == "0.01"
    assert configs["delete.retention.ms"].value == "86400000"
    assert configs["delete.retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    outcomes: list[confluent_kafka.KafkaError | None] = []

    def delivered(err: confluent_kafka.KafkaError | None, _msg: Any) -> None:
        outcomes.append(err)

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all", "retries": 0}
    )
    producer.produce(topic, key=b"k", value=b"v1", on_delivery=delivered)
    producer.flush(30)
    producer.produce(topic, value=b"no key", on_delivery=delivered)
    producer.flush(30)
    assert outcomes[0] is None
    error = outcomes[1]
    assert error is not None
    assert error.code() == confluent_kafka.KafkaError.INVALID_RECORD, error
