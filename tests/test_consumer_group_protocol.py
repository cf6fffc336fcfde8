"""The consumer group protocol (KIP-848) in process, with a fake clock: the server-side
assignors (uniform: balanced and sticky; range), the reconciliation state machine (a partition
reaches its new owner only once the old one revoked it), and the coordinator's heartbeats:
member epochs, fencing, leaving, static members, session expiry, topic changes, commits, and a
group id kept to one protocol."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from replication import protocol as p
from replication.common import TopicPartition
from replication.config import BrokerConfig
from replication.coordinator.consumer_group import ConsumerGroupMember, MemberState
from replication.coordinator.consumer_group_coordinator import ConsumerHeartbeat, HeartbeatResult
from replication.coordinator.current_assignment import next_member_state
from replication.coordinator.group import GroupCoordinator, decode_consumer_assignment
from replication.coordinator.group_metadata import GroupConfig, JoinRequest, OffsetAndMetadata
from replication.coordinator.group_metadata_manager import OffsetsPartition
from replication.coordinator.server_assignors import MemberSpec, RangeAssignor, UniformAssignor
from replication.errors import (
    FencedMemberEpochError,
    GroupIdNotFoundError,
    InconsistentGroupProtocolError,
    InvalidRequestError,
    StaleMemberEpochError,
    UnknownMemberIdError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
)
from replication.metadata.image import MetadataImage, PartitionState, TopicInfo
from replication.server.group_apis import GroupApis

pytestmark = pytest.mark.unit

SESSION = 45_000
T = "a" * 32  # the topic id of "events"
U = "b" * 32  # the topic id of "other"


def specs(**members: tuple[frozenset[str], dict[str, frozenset[int]]]) -> dict[str, MemberSpec]:
    return {m: MemberSpec(subscribed, target) for m, (subscribed, target) in members.items()}


def counts(assignment: dict[str, dict[str, set[int]]]) -> dict[str, int]:
    return {m: sum(len(ps) for ps in a.values()) for m, a in assignment.items()}


# --- assignors ----------------------------------------------------------------------------------


def test_uniform_balances_and_moves_only_what_it_must() -> None:
    both = frozenset({T})
    first = UniformAssignor().assign(specs(m1=(both, {}), m2=(both, {})), {T: 6})
    assert counts(first) == {"m1": 3, "m2": 3}
    assert first["m1"][T] | first["m2"][T] == set(range(6))
    # a third member: each of the others gives up one partition, and keeps the rest
    frozen = {m: {T: frozenset(a[T])} for m, a in first.items()}
    second = UniformAssignor().assign(
        specs(m1=(both, frozen["m1"]), m2=(both, frozen["m2"]), m3=(both, {})), {T: 6}
    )
    assert counts(second) == {"m1": 2, "m2": 2, "m3": 2}
    assert second["m1"][T] <= first["m1"][T]
    assert second["m2"][T] <= first["m2"][T]


def test_uniform_gives_each_topic_only_to_its_subscribers() -> None:
    out = UniformAssignor().assign(
        specs(m1=(frozenset({T}), {}), m2=(frozenset({T, U}), {})), {T: 2, U: 3}
    )
    assert out["m1"] == {T: {0, 1}} or set(out["m1"]) == {T}
    assert out["m2"][U] == {0, 1, 2}
    assert sorted(p for a in out.values() for p in a.get(T, ())) == [0, 1]
    # a partition beyond the topic's count (it shrank, or was another topic) is not kept
    kept = UniformAssignor().assign(specs(m1=(frozenset({T}), {T: frozenset({0, 7})})), {T: 1})
    assert kept == {"m1": {T: {0}}}


def test_range_gives_consecutive_ranges_the_first_members_one_more() -> None:
    both = frozenset({T, U})
    out = RangeAssignor().assign(specs(b=(both, {}), a=(both, {})), {T: 3, U: 4})
    assert out == {"a": {T: {0, 1}, U: {0, 1}}, "b": {T: {2}, U: {2, 3}}}


# --- the reconciliation state machine -------------------------------------------------------


def test_a_member_revokes_before_it_moves_to_the_new_epoch() -> None:
    member = ConsumerGroupMember("m1", member_epoch=1, assigned={T: frozenset({0, 1})})
    held = {(T, 0): 1, (T, 1): 1}
    owned_by = lambda topic, p: held.get((topic, p), -1)  # noqa: E731
    target = {T: frozenset({0})}
    step = next_member_state(member, 2, target, owned_by, {T: frozenset({0, 1})}, now_ms=5)
    assert step.state is MemberState.UNREVOKED_PARTITIONS
    assert (step.member_epoch, dict(step.assigned)) == (1, {T: frozenset({0})})
    assert dict(step.pending_revocation) == {T: frozenset({1})}
    # still reporting partition 1: it waits
    assert next_member_state(step, 2, target, owned_by, {T: frozenset({0, 1})}, 6) is step
    # revoked: the next epoch, stable
    done = next_member_state(step, 2, target, owned_by, {T: frozenset({0})}, 7)
    assert (done.state, done.member_epoch, done.previous_member_epoch) == (
        MemberState.STABLE,
        2,
        1,
    )
    assert dict(done.pending_revocation) == {}


def test_a_partition_still_held_by_another_member_is_given_once_released() -> None:
    member = ConsumerGroupMember("m2", member_epoch=1)
    held = {(T, 1): 1}  # m1 has not revoked partition 1 yet
    target = {T: frozenset({1, 2})}
    step = next_member_state(member, 2, target, lambda t, p: held.get((t, p), -1), {}, 0)
    assert step.state is MemberState.UNRELEASED_PARTITIONS
    assert (step.member_epoch, dict(step.assigned)) == (2, {T: frozenset({2})})
    held.clear()
    done = next_member_state(step, 2, target, lambda t, p: -1, {T: frozenset({2})}, 0)
    assert (done.state, dict(done.assigned)) == (MemberState.STABLE, {T: frozenset({1, 2})})


# --- the coordinator ----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def topic(name: str, topic_id: str, partitions: int) -> TopicInfo:
    return TopicInfo(
        name, topic_id, tuple(PartitionState((0,), (0,), 0) for _ in range(partitions))
    )


class Harness:
    def __init__(self) -> None:
        self.clock = Clock()
        self.image = MetadataImage(topics=(topic("events", T, 4), topic("other", U, 2)))
        self.coordinator = GroupCoordinator(
            0,
            GroupConfig(num_partitions=1, consumer_session_timeout_ms=SESSION),
            lambda: self.image,
            self.append,
            self.clock,
        )
        self.coordinator.partitions[0] = OffsetsPartition(0, 0, loaded=True)
        #: member id -> what it owns (as its heartbeats report it)
        self.owned: dict[str, dict[str, frozenset[int]]] = {}
        self.epochs: dict[str, int] = {}

    async def append(self, index: int, records: bytes) -> int:
        return 0

    async def beat(self, member_id: str, epoch: int | None = None, **kw: Any) -> HeartbeatResult:
        """One heartbeat of a member that takes whatever assignment it is given."""
        if epoch is None:
            epoch = self.epochs.get(member_id, 0)
        if epoch == 0:
            kw.setdefault("rebalance_timeout_ms", 60_000)
            kw.setdefault("subscribed_topic_names", ("events",))
        owned = {} if epoch == 0 else self.owned.get(member_id, {})
        result = await self.coordinator.consumer_group_heartbeat(
            ConsumerHeartbeat(
                "g",
                member_id,
                epoch,
                owned=kw.pop("owned", owned),
                client_id=member_id,
                **kw,
            )
        )
        self.epochs[member_id] = result.member_epoch
        if result.assignment is not None:
            self.owned[member_id] = dict(result.assignment)
        return result

    def partitions(self, member_id: str) -> set[int]:
        return set(self.owned.get(member_id, {}).get(T, frozenset()))

    def group(self) -> Any:
        return self.coordinator.describe_group("g")


def run(test: Callable[[Harness], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test(Harness()))


async def settle(h: Harness, *members: str) -> None:
    """Heartbeat every member until the group is stable (a bounded number of rounds)."""
    for _ in range(10):
        for m in members:
            await h.beat(m)
        if h.group().consumer.state.value == "Stable":
            return
    raise AssertionError(f"not stable: {h.group().consumer}")


def test_members_join_share_the_partitions_and_a_leaver_s_move() -> None:
    async def test(h: Harness) -> None:
        first = await h.beat("m1")
        assert (first.member_epoch, h.partitions("m1")) == (1, {0, 1, 2, 3})
        second = await h.beat("m2")
        # m1 has not revoked anything yet: m2 waits at the new epoch with nothing
        assert (second.member_epoch, h.partitions("m2")) == (2, set())
        revoke = await h.beat("m1")
        assert revoke.member_epoch == 1
        assert len(h.partitions("m1")) == 2
        await settle(h, "m1", "m2")
        assert h.partitions("m1") | h.partitions("m2") == {0, 1, 2, 3}
        assert not h.partitions("m1") & h.partitions("m2")
        assert h.epochs == {"m1": 2, "m2": 2}
        # m2 leaves: its partitions go back to m1 at the next epoch
        left = await h.beat("m2", -1)
        assert left.member_epoch == -1
        await settle(h, "m1")
        assert (h.epochs["m1"], h.partitions("m1")) == (3, {0, 1, 2, 3})

    run(test)


def test_epochs_ahead_or_behind_are_fenced_and_unknown_members_rejoin() -> None:
    async def test(h: Harness) -> None:
        await h.beat("m1")
        with pytest.raises(FencedMemberEpochError):
            await h.beat("m1", 5)
        with pytest.raises(UnknownMemberIdError):
            await h.beat("nobody", 1)
        await h.beat("m2")
        await settle(h, "m1", "m2")
        # the previous epoch with a subset of the assignment is taken (a lost answer)...
        previous = h.group().consumer.members["m1"].previous_member_epoch
        assert (await h.beat("m1", previous)).member_epoch == 2
        # ...not with more than it is assigned
        with pytest.raises(FencedMemberEpochError):
            await h.beat("m1", previous, owned={T: frozenset({0, 1, 2, 3})})
        # a fenced member joins again with epoch 0 under its id and gets its share back
        await h.beat("m1", 0)
        await settle(h, "m1", "m2")
        assert len(h.partitions("m1")) == len(h.partitions("m2")) == 2

    run(test)


def test_a_silent_member_is_removed_after_its_session() -> None:
    async def test(h: Harness) -> None:
        await h.beat("m1")
        await h.beat("m2")
        await settle(h, "m1", "m2")
        assert h.coordinator.next_deadline_ms() == h.clock.now + SESSION + 1
        h.clock.now += SESSION // 2
        await h.beat("m1")
        h.clock.now += SESSION // 2 + 1
        await h.coordinator.tick()
        assert set(h.group().consumer.members) == {"m1"}
        await settle(h, "m1")
        assert h.partitions("m1") == {0, 1, 2, 3}
        with pytest.raises(UnknownMemberIdError):
            await h.beat("m2")

    run(test)


def test_a_member_that_does_not_revoke_in_time_is_removed() -> None:
    async def test(h: Harness) -> None:
        with pytest.raises(UnknownMemberIdError):
            await h.beat("m1", 3)  # no such group yet (or a coordinator that failed over)
        await h.beat("m1", rebalance_timeout_ms=5_000)
        await h.beat("m2")
        everything = {T: frozenset({0, 1, 2, 3})}
        for _ in range(3):  # m1 is asked to revoke two partitions, and keeps reporting them
            assert (await h.beat("m1", owned=everything)).member_epoch == 1
        assert h.group().consumer.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
        h.clock.now += 5_001
        await h.coordinator.tick()
        assert set(h.group().consumer.members) == {"m2"}
        await settle(h, "m2")
        assert h.partitions("m2") == {0, 1, 2, 3}

    run(test)


def test_a_static_member_leaves_for_now_and_comes_back_to_its_partitions() -> None:
    async def test(h: Harness) -> None:
        await h.beat("s1", instance_id="one")
        await h.beat("m2")
        await settle(h, "s1", "m2")
        mine = h.partitions("s1")
        assert (await h.beat("s1", -2, instance_id="one")).member_epoch == -2
        # its partitions wait for it; another member may not take its instance id meanwhile
        await h.beat("m2")
        assert h.partitions("m2").isdisjoint(mine)
        back = await h.beat("s1-again", 0, instance_id="one")
        assert back.assignment is not None
        assert set(back.assignment[T]) == mine
        assert "s1" not in h.group().consumer.members
        with pytest.raises(UnreleasedInstanceIdError):
            await h.beat("intruder", 0, instance_id="one")

    run(test)


def test_new_partitions_and_a_deleted_topic_reassign() -> None:
    async def test(h: Harness) -> None:
        await h.beat("m1", subscribed_topic_regex="ev.*|oth.*", subscribed_topic_names=())
        await h.beat("m2", subscribed_topic_regex="ev.*|oth.*", subscribed_topic_names=())
        await settle(h, "m1", "m2")
        epoch = h.group().consumer.group_epoch
        assert set(h.group().consumer.subscription_metadata) == {"events", "other"}
        h.image = h.image.with_topic(topic("events", T, 6))
        await settle(h, "m1", "m2")
        assert h.group().consumer.group_epoch == epoch + 1
        assert h.partitions("m1") | h.partitions("m2") == set(range(6))
        h.image = h.image.without_topic("other")
        await settle(h, "m1", "m2")
        assert h.group().consumer.group_epoch == epoch + 2
        assert all(set(h.owned[m]) == {T} for m in ("m1", "m2"))

    run(test)


def test_bad_heartbeats_are_refused_as_kafka_refuses_them() -> None:
    async def test(h: Harness) -> None:
        with pytest.raises(InvalidRequestError):
            await h.beat("m1", 0, subscribed_topic_names=())
        with pytest.raises(InvalidRequestError):
            await h.beat("m1", 0, rebalance_timeout_ms=-1)
        with pytest.raises(UnsupportedAssignorError):
            await h.beat("m1", 0, server_assignor="sticky")
        await h.beat("m1", 0, server_assignor="range")
        assert h.group().consumer.assignor_name == "range"

    run(test)


def test_commits_carry_the_member_epoch() -> None:
    async def test(h: Harness) -> None:
        offsets = {TopicPartition("events", 0): OffsetAndMetadata(5)}
        await h.beat("m1")
        commit = h.coordinator.commit_offsets
        assert await commit("g", 1, "m1", None, offsets) == {TopicPartition("events", 0): None}
        with pytest.raises(StaleMemberEpochError):
            await commit("g", 0, "m1", None, offsets)
        with pytest.raises(UnknownMemberIdError):
            await commit("g", 1, "ghost", None, offsets)
        with pytest.raises(UnknownMemberIdError):
            await commit("g", -1, "", None, offsets)  # from outside, while it has members
        await h.beat("m1", -1)
        assert await commit("g", -1, "", None, offsets) == {TopicPartition("events", 0): None}
        stored = h.coordinator.fetch_offsets("g", None)[TopicPartition("events", 0)]
        assert stored is not None
        assert stored.offset == 5

    run(test)


def test_a_group_id_serves_one_protocol_at_a_time() -> None:
    async def test(h: Harness) -> None:
        join = JoinRequest("g", "", None, "c", "", 10_000, 30_000, "consumer", (("range", b""),))
        await h.beat("m1")
        assert (await h.coordinator.join_group(join)).error is InconsistentGroupProtocolError
        await h.beat("m1", -1)
        # empty: the classic protocol takes it (its first join asks for a member id)
        first = await h.coordinator.join_group(join)
        classic = asyncio.ensure_future(
            h.coordinator.join_group(dataclasses.replace(join, member_id=first.member_id))
        )
        await asyncio.sleep(0)
        assert h.group().consumer is None
        assert h.group().members
        with pytest.raises(GroupIdNotFoundError):
            await h.beat("m2")
        classic.cancel()

    run(test)


# --- the group APIs' answers ----------------------------------------------------------------------


def test_listings_and_descriptions_name_a_consumer_group_as_kafka_does() -> None:
    async def test(h: Harness) -> None:
        async def no_topic(name: str, partitions: int, replication: int) -> None:
            raise AssertionError("no topic is created here")

        apis = GroupApis(BrokerConfig(), h.coordinator, lambda: h.image, no_topic)
        header = p.RequestHeader(api_key=0, api_version=0, correlation_id=1, client_id="t")
        await h.beat("m1", instance_id="one")
        await h.beat("m2")
        await settle(h, "m1", "m2")

        listed = await apis.handle_list_groups(header, p.ListGroupsRequest())
        assert [
            (g.group_id, g.protocol_type, g.group_state, g.group_type) for g in listed.groups
        ] == [("g", "consumer", "Stable", "consumer")]
        only_classic = p.ListGroupsRequest(types_filter=["classic"])
        assert (await apis.handle_list_groups(header, only_classic)).groups == []
        stable = p.ListGroupsRequest(states_filter=["stable"], types_filter=["Consumer"])
        assert len((await apis.handle_list_groups(header, stable)).groups) == 1

        request = p.ConsumerGroupDescribeRequest(group_ids=["g", "nope"])
        described, missing = (await apis.handle_consumer_group_describe(header, request)).groups
        assert missing.error_code == GroupIdNotFoundError.code
        assert (described.group_state, described.assignor_name) == ("Stable", "uniform")
        assert described.group_epoch == described.assignment_epoch == 2
        members = {m.member_id: m for m in described.members}
        assert members["m1"].instance_id == "one"
        for m in members.values():
            (topic_partitions,) = m.assignment.topic_partitions
            assert topic_partitions.topic_name == "events"
            assert set(topic_partitions.partitions) == h.partitions(m.member_id)
            assert m.target_assignment == m.assignment

        classic = await apis.handle_describe_groups(header, p.DescribeGroupsRequest(groups=["g"]))
        (group,) = classic.groups
        assert (group.protocol_type, group.group_state) == ("consumer", "Stable")
        assert {
            m.member_id: decode_consumer_assignment(m.member_assignment) for m in group.members
        } == {m: {TopicPartition("events", i) for i in h.partitions(m)} for m in ("m1", "m2")}

    run(test)
