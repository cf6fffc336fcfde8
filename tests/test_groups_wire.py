"""Consumer group APIs on a real broker process, over the wire: a group forms, commits, and
its offsets survive the coordinator's crash (SIGKILL) and restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from replication import protocol as p
from replication.common import TopicPartition
from replication.coordinator.group import encode_consumer_assignment
from replication.errors import (
    IllegalGenerationError,
    MemberIdRequiredError,
    UnknownMemberIdError,
)
from tests.cluster import BrokerProcess, wait_until
from tests.wire import RawConnection, create_topic

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

GROUPS = {"offsets.topic.num.partitions": "3", "group.initial.rebalance.delay.ms": "0"}


def coordinator(conn: RawConnection, group: str) -> p.FindCoordinatorResponse:
    def found() -> p.FindCoordinatorResponse | None:
        response = conn.request(
            p.ApiKey.FIND_COORDINATOR, p.FindCoordinatorRequest(key=group, key_type=0)
        )
        return response if response.error_code == 0 else None

    return wait_until(found, timeout=30, message="a group coordinator")


def join(conn: RawConnection, group: str, member_id: str = "") -> p.JoinGroupResponse:
    def answered() -> p.JoinGroupResponse | None:
        response = conn.request(
            p.ApiKey.JOIN_GROUP,
            p.JoinGroupRequest(
                group_id=group,
                member_id=member_id,
                session_timeout_ms=10_000,
                rebalance_timeout_ms=10_000,
                protocols=[p.JoinGroupRequestProtocol(name="range", metadata=b"")],
            ),
        )
        # the offsets partition may still be loading (COORDINATOR_LOAD_IN_PROGRESS)
        return None if response.error_code in (14, 15, 16) else response

    return wait_until(answered, timeout=30, message="JoinGroup answered")


def commit(
    conn: RawConnection, group: str, generation: int, member: str, offset: int
) -> p.OffsetCommitResponse:
    return conn.request(  # type: ignore[no-any-return]
        p.ApiKey.OFFSET_COMMIT,
        p.OffsetCommitRequest(
            group_id=group,
            generation_id=generation,
            member_id=member,
            topics=[
                p.OffsetCommitRequestTopic(
                    name="events",
                    partitions=[
                        p.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset)
                    ],
                )
            ],
        ),
    )


def committed(conn: RawConnection, group: str) -> dict[tuple[str, int], int]:
    response = conn.request(p.ApiKey.OFFSET_FETCH, p.OffsetFetchRequest(group_id=group))
    assert response.error_code == 0
    return {
        (t.name, part.partition_index): part.committed_offset
        for t in response.topics
        for part in t.partitions
    }


def test_a_group_forms_commits_and_its_offsets_survive_a_sigkill(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b0", overrides=GROUPS).start()
    try:
        with RawConnection(broker.bootstrap) as conn:
            create_topic(conn, "events", partitions=2)
            found = coordinator(conn, "g1")
            assert (found.node_id, found.port) == (0, broker.port)

            first = join(conn, "g1")
            assert first.error_code == MemberIdRequiredError.code
            member = first.member_id
            joined = join(conn, "g1", member)
            assert joined.error_code == 0, joined
            assert (joined.generation_id, joined.leader) == (1, member)
            assert [m.member_id for m in joined.members] == [member]

            assignment = encode_consumer_assignment([TopicPartition("events", 0)])
            synced = conn.request(
                p.ApiKey.SYNC_GROUP,
                p.SyncGroupRequest(
                    group_id="g1",
                    generation_id=1,
                    member_id=member,
                    assignments=[
                        p.SyncGroupRequestAssignment(member_id=member, assignment=assignment)
                    ],
                ),
            )
            assert synced.error_code == 0
            assert bytes(synced.assignment) == assignment

            ok = commit(conn, "g1", 1, member, 42)
            assert ok.topics[0].partitions[0].error_code == 0
            stale = commit(conn, "g1", 0, member, 43)
            assert stale.topics[0].partitions[0].error_code == IllegalGenerationError.code
            stranger = commit(conn, "g1", 1, "nobody", 44)
            assert stranger.topics[0].partitions[0].error_code == UnknownMemberIdError.code
            assert committed(conn, "g1") == {("events", 0): 42}

            described = conn.request(
                p.ApiKey.DESCRIBE_GROUPS, p.DescribeGroupsRequest(groups=["g1"])
            ).groups[0]
            assert (described.group_state, described.protocol_data) == ("Stable", "range")
            listed = conn.request(p.ApiKey.LIST_GROUPS, p.ListGroupsRequest()).groups
            assert [g.group_id for g in listed] == ["g1"]

        broker.kill()
        broker.start()
        with RawConnection(broker.bootstrap) as conn:
            coordinator(conn, "g1")
            offsets = wait_until(
                lambda: _fetch_when_loaded(conn, "g1"), timeout=30, message="offsets loaded"
            )
            assert offsets == {("events", 0): 42}
            # the member's session carried over the restart: it still heartbeats
            beat = conn.request(
                p.ApiKey.HEARTBEAT,
                p.HeartbeatRequest(group_id="g1", generation_id=1, member_id=member),
            )
            assert beat.error_code == 0
    finally:
        broker.kill()


def _fetch_when_loaded(conn: RawConnection, group: str) -> dict[tuple[str, int], int] | None:
    response = conn.request(p.ApiKey.OFFSET_FETCH, p.OffsetFetchRequest(group_id=group))
    if response.error_code in (14, 15, 16):
        return None
    assert response.error_code == 0
    return {
        (t.name, part.partition_index): part.committed_offset
        for t in response.topics
        for part in t.partitions
    }


def test_the_offsets_log_is_cut_at_snapshots_and_the_offsets_survive(tmp_path: Path) -> None:
    from replication.client import Admin, Consumer
    from replication.coordinator.group_metadata_manager import (
        OFFSETS_TOPIC,
        SNAPSHOT_MIN_RECORDS,
        partition_for,
    )

    broker = BrokerProcess(tmp_path / "b0", overrides=GROUPS).start()
    try:
        with RawConnection(broker.bootstrap) as conn:
            create_topic(conn, "events", partitions=1)
        tp = TopicPartition("events", 0)
        offsets_tp = TopicPartition(OFFSETS_TOPIC, partition_for("busy", 3))
        with Consumer(bootstrap_servers=broker.bootstrap, group_id="busy") as consumer:
            consumer.assign([tp])
            for i in range(SNAPSHOT_MIN_RECORDS + 200):
                consumer.commit({tp: i})

        def log_start() -> int:
            with Admin(bootstrap_servers=broker.bootstrap) as admin:
                logs = admin.describe_log_dirs([offsets_tp])[0]
                assert isinstance(logs, dict)
                return logs[offsets_tp].log_start_offset

        wait_until(lambda: log_start() >= SNAPSHOT_MIN_RECORDS, timeout=30, message="a snapshot")
        broker.kill()
        broker.start()
        with Consumer(bootstrap_servers=broker.bootstrap, group_id="busy") as consumer:
            committed = wait_until(
                lambda: consumer.committed([tp]).get(tp), timeout=60, message="offsets loaded"
            )
            assert committed.offset == SNAPSHOT_MIN_RECORDS + 199
        assert log_start() >= SNAPSHOT_MIN_RECORDS
    finally:
        broker.kill()
