"""`replog consumer-groups` (as kafka-consumer-groups.sh) and the Admin calls behind it, on a
real broker: list, describe with lag, reset offsets (dry run, then --execute), delete."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from replication.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from replication.errors import GroupIdNotFoundError, GroupNotEmptyError
from tests.cluster import BrokerProcess
from tests.helpers import unique_name, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    overrides = {"offsets.topic.num.partitions": "3", "group.initial.rebalance.delay.ms": "0"}
    proc = BrokerProcess(tmp_path_factory.mktemp("groups-cli"), overrides=overrides).start()
    yield proc
    proc.stop()


def replog(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "replication.tools.cli",
            "consumer-groups",
            *args,
            "--bootstrap-server",
            broker.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_list_describe_reset_and_delete(broker: BrokerProcess) -> None:
    topic, group = unique_name("cg"), unique_name("g")
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    with Producer(bootstrap_servers=broker.bootstrap) as producer:
        for i in range(100):
            producer.send(topic, value=b"x", partition=i % 2)
    tps = [TopicPartition(topic, p) for p in range(2)]
    with Consumer(bootstrap_servers=broker.bootstrap, group_id=group) as consumer:
        consumer.assign(tps)
        consumer.commit({tps[0]: 10, tps[1]: 30})  # from outside the group (generation -1)

    listed = replog(broker, "list")
    assert listed.returncode == 0, listed.stderr
    assert group in listed.stdout.split()

    described = replog(broker, "describe", group, "--json")
    assert described.returncode == 0, described.stderr
    doc = json.loads(described.stdout)
    assert doc["state"] == "Empty"
    lags = {
        (r["partition"], r["current_offset"], r["log_end_offset"], r["lag"])
        for r in doc["partitions"]
    }
    assert lags == {(0, 10, 50, 40), (1, 30, 50, 20)}

    plan = replog(broker, "reset-offsets", group, "--topic", topic, "--to-earliest")
    assert plan.returncode == 0, plan.stderr
    assert "dry run" in plan.stdout
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert admin.list_consumer_group_offsets(group) == {tps[0]: 10, tps[1]: 30}
    done = replog(broker, "reset-offsets", group, "--topic", topic, "--shift-by", "-5", "--execute")
    assert done.returncode == 0, done.stderr
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert admin.list_consumer_group_offsets(group) == {tps[0]: 5, tps[1]: 25}

    both = replog(broker, "reset-offsets", group, "--topic", topic, "--to-earliest", "--to-latest")
    assert both.returncode == 1
    assert "exactly one of --to-earliest" in both.stderr

    deleted = replog(broker, "delete", group)
    assert deleted.returncode == 0, deleted.stderr
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert admin.list_consumer_group_offsets(group) == {}
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_consumer_groups([group])


def test_an_active_group_cannot_be_reset_or_deleted(broker: BrokerProcess) -> None:
    topic, group = unique_name("cg"), unique_name("g")
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    member = Consumer(
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        session_timeout_ms=6000,
        heartbeat_interval_ms=300,
    )
    try:
        member.subscribe([topic])
        wait_until(lambda: member.poll(timeout_ms=100) is not None and member.assignment())
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            description = admin.describe_consumer_group(group)
            assert description.state == "Stable"
            assert [m.assignment for m in description.members] == [{TopicPartition(topic, 0)}]
            with pytest.raises(GroupNotEmptyError, match="stop its consumers"):
                admin.alter_consumer_group_offsets(group, {TopicPartition(topic, 0): 0})
            with pytest.raises(GroupNotEmptyError):
                admin.delete_consumer_groups([group])
        refused = replog(broker, "delete", group)
        assert refused.returncode == 1
        assert "GroupNotEmpty" in refused.stderr or "members" in refused.stderr
    finally:
        member.close()
