"""The controller's side of partition reassignment (KIP-455), leader elections (KIP-460) and
broker unregistration, in process on memory storage; and the replication throttle's bucket.

A move keeps every replica (target + original) in the partition until every target replica is
in the ISR; only then, in one metadata version, do the replicas become the target, the ISR the
ISR & target, and a leader being removed hand over with a new leader epoch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from logstore.storage import Storage
from replication.broker.throttle import TokenBucket
from replication.controller.controller import Controller
from replication.errors import (
    ElectionNotNeededError,
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    NoReassignmentInProgressError,
    PreferredLeaderNotAvailableError,
)
from replication.metadata.image import MetadataImage, PartitionState, TopicInfo
from replication.metadata.store import MetadataStore
from tests.helpers import register_live

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def cluster(brokers: int = 4) -> tuple[Controller, Clock]:
    """``brokers`` brokers and topic t with one partition on replicas [0, 1, 2], led by 0."""
    clock = Clock()
    metadata = MetadataStore(Storage.from_url(f"memory://reassign-{uuid.uuid4().hex}/meta"))
    c = Controller(metadata, 100, "127.0.0.1", 9000, session_timeout_ms=3_000, time_ms=clock)
    c.activate()
    for b in range(brokers):
        register_live(c, b, "127.0.0.1", 9100 + b, None, f"a{b}")
    c.create_topic("t", 1, 3)
    c.update_partition("t", 0, PartitionState((0, 1, 2), (0, 1, 2), 0, 0, 0))
    return c, clock


def state(c: Controller, topic: str = "t") -> PartitionState:
    info = c.image.topic(topic)
    assert info is not None
    return info.partitions[0]


def join_isr(c: Controller, replica: int) -> PartitionState:
    s = state(c)
    return c.alter_partition(s.leader, "t", 0, s.leader_epoch, s.partition_epoch, (*s.isr, replica))


def test_a_move_keeps_every_replica_until_the_new_ones_are_in_sync() -> None:
    c, _ = cluster()
    assert c.alter_partition_reassignments([("t", 0, [1, 2, 3])], throttled_rate=500) == [None]
    s = state(c)
    assert s.replicas == (1, 2, 3, 0)
    assert s.adding_replicas == (3,)
    assert s.removing_replicas == (0,)
    assert s.isr == (0, 1, 2)
    assert s.leader == 0
    assert s.leader_epoch == 0
    assert s.throttled_rate == 500
    assert [(t, i) for t, i, _ in c.list_partition_reassignments()] == [("t", 0)]
    # the ISR growing by the new replica completes the move in the next version
    join_isr(c, 3)
    done = state(c)
    assert done.replicas == (1, 2, 3)
    assert done.isr == (1, 2, 3)
    assert done.leader == 1
    assert done.leader_epoch == 1
    assert not done.reassigning
    assert done.throttled_rate == 0
    assert c.list_partition_reassignments() == []


def test_a_move_that_keeps_the_leader_keeps_its_epoch() -> None:
    c, _ = cluster()
    c.alter_partition_reassignments([("t", 0, [0, 1, 3])])
    join_isr(c, 3)
    done = state(c)
    assert done.replicas == (0, 1, 3)
    assert done.isr == (0, 1, 3)
    assert done.leader == 0
    assert done.leader_epoch == 0


def test_shrinking_the_replicas_completes_at_once() -> None:
    c, _ = cluster()
    c.alter_partition_reassignments([("t", 0, [1, 2])])
    done = state(c)
    assert done.replicas == (1, 2)
    assert done.isr == (1, 2)
    assert done.leader == 1
    assert not done.reassigning


def test_a_move_waits_for_every_target_replica_not_only_the_new_ones() -> None:
    c, _clock = cluster()
    c.alter_partition_reassignments([("t", 0, [1, 2, 3])])
    s = state(c)
    c.alter_partition(0, "t", 0, s.leader_epoch, s.partition_epoch, (0, 1))  # 2 fell behind
    join_isr(c, 3)
    assert state(c).reassigning  # 2 is a target replica and out of the ISR
    join_isr(c, 2)
    assert state(c).replicas == (1, 2, 3)


def test_cancel_goes_back_to_the_original_replicas() -> None:
    c, _ = cluster()
    c.alter_partition_reassignments([("t", 0, [3, 1, 2])])
    assert c.alter_partition_reassignments([("t", 0, None)]) == [None]
    s = state(c)
    # the replicas during the move less the adding ones, in that order (as Kafka's KRaft)
    assert s.replicas == (1, 2, 0)
    assert set(s.isr) == {0, 1, 2}
    assert s.leader == 0
    assert not s.reassigning
    assert s.partition_epoch > 0
    (err,) = c.alter_partition_reassignments([("t", 0, None)])
    assert isinstance(err, NoReassignmentInProgressError)


def test_cancel_after_a_new_replica_took_the_lead_hands_it_back() -> None:
    c, clock = cluster()
    c.alter_partition_reassignments([("t", 0, [3, 1, 2])])
    s = state(c)
    c.alter_partition(0, "t", 0, s.leader_epoch, s.partition_epoch, (0, 1))  # 2 fell behind
    join_isr(c, 3)
    assert state(c).reassigning  # 2, a target replica, is not in sync
    clock.now += 10_000
    for b in (1, 2, 3):
        c.heartbeat(b, c.image.broker(b).epoch, c.image.version)  # type: ignore[union-attr]
    c.check_sessions()  # 0, the leader, is fenced: 3 (first in the replicas, in sync) leads
    moved = state(c)
    assert moved.leader == 3
    assert moved.leader_epoch == 1
    assert c.alter_partition_reassignments([("t", 0, None)]) == [None]
    back = state(c)
    assert back.replicas == (1, 2, 0)
    assert back.isr == (1,)
    assert back.leader == 1
    assert back.leader_epoch == 2


def test_a_new_target_replaces_the_move_in_progress() -> None:
    c, _ = cluster()
    c.alter_partition_reassignments([("t", 0, [1, 2, 3])])
    c.alter_partition_reassignments([("t", 0, [0, 1, 2])])  # back to the original: a cancel
    assert state(c).replicas == (0, 1, 2)
    assert not state(c).reassigning


def test_bad_targets_are_refused_with_the_reason() -> None:
    c, _ = cluster()
    results = c.alter_partition_reassignments(
        [("t", 0, [1, 1]), ("t", 0, [7]), ("t", 0, []), ("missing", 0, [1])]
    )
    assert isinstance(results[0], InvalidReplicaAssignmentError)
    assert "not registered" in str(results[1])
    assert isinstance(results[2], InvalidReplicaAssignmentError)
    assert "unknown partition missing-0" in str(results[3])
    assert state(c).replicas == (0, 1, 2)


def test_preferred_election_moves_leadership_to_the_first_replica() -> None:
    c, _ = cluster()
    c.update_partition("t", 0, PartitionState((0, 1, 2), (1, 2), 1, 4, 9))
    (err,) = c.elect_leaders(True, [("t", 0)]).values()
    assert isinstance(err, PreferredLeaderNotAvailableError)  # 0 is not in the ISR
    c.update_partition("t", 0, PartitionState((0, 1, 2), (1, 2, 0), 1, 4, 10))
    assert c.elect_leaders(True, [("t", 0)]) == {("t", 0): None}
    s = state(c)
    assert s.leader == 0
    assert s.leader_epoch == 5
    assert s.partition_epoch == 11
    (err,) = c.elect_leaders(True, [("t", 0)]).values()
    assert isinstance(err, ElectionNotNeededError)
    assert c.elect_leaders(True, None) == {}  # every partition: none needed one


def test_unclean_election_picks_a_live_replica_outside_the_isr() -> None:
    c, clock = cluster()
    c.update_partition("t", 0, PartitionState((0, 1, 2), (0,), 0, 2, 2))
    clock.now += 10_000
    for b in (1, 2):
        c.heartbeat(b, c.image.broker(b).epoch, c.image.version)  # type: ignore[union-attr]
    c.check_sessions()  # 0 and 3 fenced: 0 was the ISR
    assert state(c).leader == -1
    assert c.elect_leaders(False, [("t", 0)]) == {("t", 0): None}
    s = state(c)
    assert s.leader == 1
    assert s.isr == (1,)
    assert s.leader_epoch > 2


def test_auto_rebalance_moves_leadership_back_past_the_imbalance_share() -> None:
    c, _ = cluster()
    c.update_partition("t", 0, PartitionState((0, 1, 2), (0, 1, 2), 1, 3, 3))
    assert c.rebalance_leaders(10) == [("t", 0)]
    assert state(c).leader == 0
    assert c.rebalance_leaders(10) == []


def test_unregistering_is_refused_while_the_broker_holds_replicas() -> None:
    c, _ = cluster()
    with pytest.raises(InvalidRequestError, match="still holds replicas of 1 partition"):
        c.unregister_broker(0)
    c.unregister_broker(3)
    assert c.image.broker(3) is None


def test_metadata_format_5_keeps_reassignments_and_reads_format_3() -> None:
    moving = PartitionState((1, 2, 3, 0), (0, 1, 2), 0, 1, 2, (3,), (0,), 1000)
    image = MetadataImage(version=4, topics=(TopicInfo("t", "id", (moving,)),))
    doc = json.loads(image.to_bytes())
    assert doc["format_version"] == 5
    assert MetadataImage.from_bytes(image.to_bytes()).topics[0].partitions[0] == moving
    doc["format_version"] = 3
    doc["topics"][0]["partitions"] = [p[:5] for p in doc["topics"][0]["partitions"]]
    old = MetadataImage.from_bytes(json.dumps(doc).encode()).topics[0].partitions[0]
    assert old == PartitionState((1, 2, 3, 0), (0, 1, 2), 0, 1, 2)
    assert not old.reassigning


def test_the_token_bucket_limits_bytes_to_the_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(1000, clock=lambda: now[0])
    fetched = 0
    # a fetcher that takes whatever the bucket allows, in 100-byte batches, every 10 ms
    for _ in range(500):
        allowance = bucket.available()
        if allowance > 0:
            size = max(int(allowance) // 100 * 100, 100)
            bucket.consume(size)
            fetched += size
        now[0] += 0.01
    assert fetched <= 1000 * (5 + 1) + 100  # 5 s at 1000 B/s, a one-second burst, a batch
    assert fetched >= 1000 * 4
    assert TokenBucket(0).available() == float("inf")


@pytest.mark.parametrize("url_kind", ["file", "memory"])
def test_a_deleted_log_leaves_nothing_on_storage(tmp_path: Path, url_kind: str) -> None:
    from logstore.batch import Record, build
    from logstore.config import LogConfig
    from logstore.log import Log

    url = (
        (tmp_path / "logs").as_uri()
        if url_kind == "file"
        else f"memory://deleted-{uuid.uuid4().hex}"
    )
    root = Storage.from_url(url)
    replica = root.child("t/0")
    plog = Log.open(replica, LogConfig())
    plog.append(build([Record(None, b"x", 0)]), leader_epoch=0)
    plog.flush()
    plog.checkpoint()
    assert replica.list()
    plog.delete()
    plog.checkpoint()  # a late checkpoint (a maintenance pass) brings nothing back
    assert replica.list() == []
    if url_kind == "file":
        assert not (tmp_path / "logs" / "t" / "0").exists()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("not json", "is not JSON"),
        ('{"version":1,"partitions":[]}', "names no partitions"),
        ('{"partitions":[{"topic":"t","partition":"0","replicas":[1]}]}', "integer partition"),
        (
            '{"partitions":[{"topic":"t","partition":0,"replicas":[1]},'
            '{"topic":"t","partition":0,"replicas":[2]}]}',
            "names t-0 twice",
        ),
    ],
)
def test_a_bad_reassignment_file_is_one_line_on_stderr(
    tmp_path: Path, content: str, words: str
) -> None:
    path = tmp_path / "move.json"
    path.write_text(content)
    result = cli(
        "partitions", "reassign", "--bootstrap-server", "127.0.0.1:1",
        "--reassignment-json-file", str(path),
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert words in lines[0]


def test_plans_keep_the_replication_factor_and_spread_the_load() -> None:
    from replication.client import TopicPartition
    from replication.client.reassignments import generate_assignment, plan_decommission
    from replication.client.types import PartitionInfo, TopicDescription
    from replication.errors import InvalidReplicaAssignmentError as Invalid

    parts = tuple(PartitionInfo(i, i % 4, 0, (i % 4, (i + 1) % 4), ()) for i in range(8))
    topic = TopicDescription("t", parts)
    plan = plan_decommission(3, [topic], [0, 1, 2, 3])
    assert len(plan) == 4  # partitions 2, 3, 6, 7 have a replica on 3
    for tp, new in plan.items():
        old = parts[tp.partition].replicas
        assert 3 not in new
        assert len(set(new)) == 2
        assert [r for r in new if r in old] == [r for r in old if r != 3]
    final = [plan.get(TopicPartition("t", p.partition), list(p.replicas)) for p in parts]
    load = [sum(r == b for replicas in final for r in replicas) for b in range(3)]
    assert sum(load) == 16
    assert max(load) - min(load) <= 1
    with pytest.raises(Invalid, match="already use every other live broker"):
        plan_decommission(1, [TopicDescription("u", (PartitionInfo(0, 0, 0, (0, 1), ()),))], [0, 1])
    proposed = generate_assignment([topic], [4, 5, 6])
    assert all(len(set(r)) == 2 and set(r) <= {4, 5, 6} for r in proposed.values())


def test_isr_expansion_proposes_only_live_followers() -> None:
    from logstore.batch import Record, build
    from logstore.log import Log
    from replication.broker.partition import Partition, TopicPolicy

    plog = Log.open(Storage.from_url(f"memory://live-{uuid.uuid4().hex}/t/0"))
    plog.append(build([Record(None, b"a", 0)]), leader_epoch=0)
    plog.flush()
    # a move to [0, 2, 3]: 1 (being removed) was fenced out of the ISR after its last fetch
    state = PartitionState((0, 2, 3, 1), (0, 2), 0, 0, 0, (3,), (1,))
    partition = Partition("t", 0, plog, 0, TopicPolicy(), state)
    partition.update_follower_fetch(1, 1)  # what it fetched before it died
    partition.update_follower_fetch(3, 1)
    assert partition.isr_to_expand(live={0, 2, 3}) == (0, 2, 3)
    assert partition.isr_to_expand() == (0, 2, 1, 3)  # without the metadata's view
