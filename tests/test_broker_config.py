"""A broker configured as a Kafka broker is: Kafka's ``server.properties`` names
(``node.id``, ``log.dirs``, ``log.retention.hours``/``minutes``/``ms``, ``log.segment.bytes``,
``message.max.bytes``, ...) taken for replog's, a ``.properties`` file read as the broker's
config, the settings of Kafka's shipped file that mean nothing to replog named and ignored,
and anything else still refused by name."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from logstore.errors import ConfigError
from replication.client import Admin, Producer, TopicPartition
from replication.config import broker_config_from, load_broker_config
from tests.cluster import BrokerProcess
from tests.helpers import unique_name
from tests.readback import read_count


@pytest.mark.unit
def test_kafka_broker_names_are_taken_for_replogs() -> None:
    config = broker_config_from(
        {
            "node.id": "3",
            "log.dirs": "/var/lib/kafka",
            "log.retention.hours": "24",
            "log.retention.bytes": "1000000",
            "log.segment.bytes": "1048576",
            "log.roll.hours": "2",
            "message.max.bytes": "2000000",
            "log.cleanup.policy": "compact,delete",
            "log.cleaner.delete.retention.ms": "3600000",
            "log.cleaner.min.cleanable.ratio": "0.25",
            "log.cleaner.min.compaction.lag.ms": "1000",
            "log.cleaner.max.compaction.lag.ms": "86400000",
            "log.message.timestamp.type": "CreateTime",
        }
    )
    assert config.broker_id == 3
    assert config.log_dir == "/var/lib/kafka"
    assert config.log.retention_ms == 24 * 3_600_000
    assert config.log.retention_bytes == 1_000_000
    assert config.log.segment_bytes == 1_048_576
    assert config.log.segment_ms == 2 * 3_600_000
    assert config.log.max_message_bytes == 2_000_000
    assert config.log.cleanup_policy == "compact,delete"
    assert config.log.delete_retention_ms == 3_600_000
    assert config.log.min_cleanable_dirty_ratio == 0.25
    assert config.log.min_compaction_lag_ms == 1000
    assert config.log.max_compaction_lag_ms == 86_400_000
    assert config.log.message_timestamp_type == "CreateTime"


@pytest.mark.unit
def test_the_finest_retention_unit_wins_as_in_kafka() -> None:
    hours = {"log.retention.hours": "24"}
    assert (
        broker_config_from({**hours, "log.retention.minutes": "30"}).log.retention_ms == 1_800_000
    )
    assert (
        broker_config_from(
            {**hours, "log.retention.minutes": "30", "log.retention.ms": "5000"}
        ).log.retention_ms
        == 5000
    )
    assert broker_config_from({**hours, "retention.ms": "7000"}).log.retention_ms == 7000


@pytest.mark.unit
@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"node.id": "1", "broker.id": "2"}, ("node.id", "broker.id", "give one of them")),
        ({"log.dirs": "/a,/b"}, ("log.dirs", "one storage root")),
        ({"log.retention.hours": "a day"}, ("log.retention.hours", "whole number")),
        ({"log.segment.bytes": "0"}, ("segment.bytes", "at least 1")),
        ({"num.netwrok.threads": "3"}, ("unknown config key", "num.netwrok.threads")),
    ],
)
def test_a_bad_or_conflicting_kafka_name_is_refused_by_name(
    values: dict[str, str], words: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as caught:
        broker_config_from(values)
    for word in words:
        assert word in str(caught.value)


@pytest.mark.unit
def test_kafka_only_settings_are_named_once_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="replication.config"):
        config = broker_config_from(
            {"num.network.threads": "3", "num.io.threads": "8", "node.id": "1"}
        )
    assert config.broker_id == 1
    [warning] = [r.getMessage() for r in caplog.records]
    assert "num.io.threads, num.network.threads" in warning


#: Kafka's shipped config/server.properties (KRaft, combined mode), with only what a move to
#: replog must change: the listeners (replog's are REPLOG and KAFKA) and the directories.
SERVER_PROPERTIES = """\
# Licensed to the Apache Software Foundation (ASF) ...
############################# Server Basics #############################
process.roles=broker,controller
node.id=7
controller.quorum.bootstrap.servers=localhost:9093
############################# Socket Server Settings #############################
listeners=REPLOG://127.0.0.1:0,KAFKA://127.0.0.1:0
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
############################# Log Basics #############################
log.dirs={log_dirs}
num.partitions=2
num.recovery.threads.per.data.dir=1
############################# Internal Topic Settings  #############################
offsets.topic.replication.factor=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
############################# Log Retention Policy #############################
log.retention.hours=168
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
message.max.bytes=2000000
"""


class _PropertiesBroker(BrokerProcess):
    """A broker started from a config file alone, as ``replog broker start --conf FILE``."""

    def __init__(self, data_dir: Path, conf: Path) -> None:
        super().__init__(data_dir, kafka=True)
        self.conf = conf

    def command(self) -> list[str]:
        return [*super().command()[:5], "--conf", str(self.conf)]  # python -m ... broker start


@pytest.mark.cluster
def test_a_broker_starts_from_kafkas_server_properties(tmp_path: Path) -> None:
    conf = tmp_path / "server.properties"
    conf.write_text(SERVER_PROPERTIES.format(log_dirs=tmp_path / "kraft-combined-logs"))
    loaded = load_broker_config(conf)
    assert (loaded.broker_id, loaded.num_partitions) == (7, 2)
    assert loaded.log.retention_ms == 168 * 3_600_000
    broker = _PropertiesBroker(tmp_path / "node", conf).start()
    try:
        topic = unique_name("props")
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            admin.create_topic(topic, -1, 1)  # num.partitions from the file
            assert [b.node_id for b in admin.describe_cluster().brokers] == [7]
            configs = admin.describe_configs("topic", topic)
            assert configs["retention.ms"].value == str(168 * 3_600_000)
            assert configs["max.message.bytes"].value == "2000000"
            assert len(admin.describe_topic(topic).partitions) == 2
        with Producer(bootstrap_servers=broker.bootstrap, acks="all") as producer:
            for i in range(10):
                producer.send(topic, f"v{i}".encode())
        tps = [TopicPartition(topic, p) for p in range(2)]
        assert len(read_count(broker.bootstrap, tps, 10)) == 10
        assert (tmp_path / "kraft-combined-logs").is_dir()
        assert "ignored Kafka settings" in broker.stderr_tail(100_000)
    finally:
        broker.stop()
