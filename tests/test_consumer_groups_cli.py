"""`replog consumer-groups` (as kafka-consumer-groups.sh) and the Admin calls behind it, on a
real broker: list, describe with lag, reset offsets (dry run, then --execute), delete offsets,
delete."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from replication.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from replication.errors import (
    GroupIdNotFoundError,
    GroupNotEmptyError,
    GroupSubscribedToTopicError,
    ReplogError,
)
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


def test_all_groups_members_state_and_resets_by_time(broker: BrokerProcess) -> None:
    """The kafka-consumer-groups flags a migrating user reaches for: --all-groups, --members,
    --state, --all-topics, --to-datetime and --by-duration."""
    topic, group, other = unique_name("cg"), unique_name("g"), unique_name("g")
    now = int(time.time() * 1000)
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    with Producer(bootstrap_servers=broker.bootstrap) as producer:
        for i in range(100):  # per partition: 25 records two hours old, then 25 of now
            old = i < 50
            producer.send(
                topic, value=b"x", partition=i % 2, timestamp=now - (7_200_000 if old else 0)
            )
    tps = [TopicPartition(topic, p) for p in range(2)]
    for g in (group, other):
        with Consumer(bootstrap_servers=broker.bootstrap, group_id=g) as consumer:
            consumer.assign(tps)
            consumer.commit({tps[0]: 40, tps[1]: 45})

    every = replog(broker, "describe", "--all-groups", "--json")
    assert every.returncode == 0, every.stderr
    assert {group, other} <= {d["group_id"] for d in json.loads(every.stdout)}

    # --by-duration PT1H: the first record of the last hour, 25 in each partition
    done = replog(
        broker, "reset-offsets", group, "--all-topics", "--by-duration", "PT1H", "--execute"
    )
    assert done.returncode == 0, done.stderr
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert admin.list_consumer_group_offsets(group) == {tps[0]: 25, tps[1]: 25}
    # --to-datetime three hours ago, with a zone: the start
    three_hours_ago = datetime.fromtimestamp((now - 3 * 3_600_000) / 1000, tz=UTC)
    done = replog(
        broker, "reset-offsets", group, "--topic", topic,
        "--to-datetime", three_hours_ago.isoformat(timespec="milliseconds"), "--execute",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert admin.list_consumer_group_offsets(group) == {tps[0]: 0, tps[1]: 0}
        assert admin.list_consumer_group_offsets(other) == {tps[0]: 40, tps[1]: 45}
    # --all-groups dry run: a plan for each group, nothing changed
    plan = replog(broker, "reset-offsets", "--all-groups", "--all-topics", "--to-latest")
    assert plan.returncode == 0, plan.stderr
    assert f"group {group}" in plan.stdout
    assert f"group {other}" in plan.stdout
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert admin.list_consumer_group_offsets(other) == {tps[0]: 40, tps[1]: 45}
    for bad, words in [
        (("--to-latest", "--all-topics"), "group id or --all-groups"),
        ((group, "--to-latest"), "--topic (repeatable) or --all-topics"),
        ((group, "--all-topics", "--by-duration", "1h"), "ISO-8601 duration"),
        ((group, "--all-topics", "--to-datetime", "yesterday"), "YYYY-MM-DDTHH:mm:SS.sss"),
    ]:
        refused = replog(broker, "reset-offsets", *bad)
        assert refused.returncode == 1, bad
        assert words in refused.stderr, (bad, refused.stderr)

    # --members and --state of a live group
    member = Consumer(
        bootstrap_servers=broker.bootstrap, group_id=other, client_id="cg-member",
        session_timeout_ms=6000, heartbeat_interval_ms=300,
    )  # fmt: skip
    try:
        member.subscribe([topic])
        wait_until(lambda: member.poll(timeout_ms=100) is not None and member.assignment())
        members = replog(broker, "describe", other, "--members", "--json")
        assert members.returncode == 0, members.stderr
        [described] = json.loads(members.stdout)["members"]
        assert described["client_id"] == "cg-member"
        assert described["assignment"] == [[topic, 0], [topic, 1]]
        state = replog(broker, "describe", other, "--state")
        assert state.returncode == 0, state.stderr
        assert "Stable" in state.stdout
        both = replog(broker, "describe", other, "--state", "--members")
        assert both.returncode == 1
        assert "at most one of --members and --state" in both.stderr
    finally:
        member.close()


def test_delete_offsets_of_an_empty_then_of_an_active_group(broker: BrokerProcess) -> None:
    """`replog consumer-groups delete-offsets` (kafka-consumer-groups --delete-offsets, the
    OffsetDelete API): an empty group loses the offsets named, topic by topic or partition by
    partition; while a member subscribes to a topic its offsets stay
    (GROUP_SUBSCRIBED_TO_TOPIC, exit status 1) and the others' go; the deletions are
    tombstones on __consumer_offsets, so they hold after the broker is killed and restarted."""
    topic, other, group = unique_name("cg"), unique_name("cg"), unique_name("g")
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2, 1), NewTopic(other, 1, 1)])
    a0, a1, b0 = TopicPartition(topic, 0), TopicPartition(topic, 1), TopicPartition(other, 0)
    with Consumer(bootstrap_servers=broker.bootstrap, group_id=group) as consumer:
        consumer.assign([a0, a1, b0])
        consumer.commit({a0: 1, a1: 2, b0: 3})

    done = replog(broker, "delete-offsets", "--group", group, "--topic", f"{topic}:0", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["partitions"] == [
        {"topic": topic, "partition": 0, "error": None}
    ]
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert admin.list_consumer_group_offsets(group) == {a1: 2, b0: 3}

    member = Consumer(
        bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False,
        session_timeout_ms=6000, heartbeat_interval_ms=300,
    )  # fmt: skip
    try:
        member.subscribe([topic])
        wait_until(lambda: member.poll(timeout_ms=100) is not None and member.assignment())
        held = replog(broker, "delete-offsets", "--group", group, "--topic", topic,
                      "--topic", other)  # fmt: skip
        assert held.returncode == 1, held.stdout + held.stderr
        assert "Successful" in held.stdout
        assert "subscribed" in held.stdout
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            assert admin.list_consumer_group_offsets(group) == {a1: 2}
            results = admin.delete_consumer_group_offsets(group, [a1])
            assert isinstance(results[a1], GroupSubscribedToTopicError)
    finally:
        member.close()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_consumer_group_offsets(unique_name("g"), [a1])
        assert admin.delete_consumer_group_offsets(group, [a1]) == {a1: None}
    broker.kill()
    broker.start()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        wait_until(
            lambda: _offsets_or_none(admin, group) == {},
            timeout=60,
            message="the group's offsets read back from __consumer_offsets, all deleted",
        )


def _offsets_or_none(admin: Admin, group: str) -> dict[TopicPartition, int] | None:
    """The group's offsets, or None while its coordinator is loading after a restart."""
    try:
        return admin.list_consumer_group_offsets(group, timeout_ms=2000)
    except ReplogError as err:
        if err.retriable:
            return None
        raise
