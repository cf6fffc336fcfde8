"""The group coordinator's rules, in process with a fake clock and a recording log: membership
(join, sync, heartbeat, leave, session expiry, static members), generations that fence a
zombie's commits, ownership of committed partitions, and what goes on __consumer_offsets."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from logstore.batch import iter_batches
from replication.common import TopicPartition
from replication.coordinator.group import (
    GroupCoordinator,
    decode_consumer_assignment,
    encode_consumer_assignment,
)
from replication.coordinator.group_metadata import (
    GroupConfig,
    GroupMetadata,
    GroupState,
    JoinRequest,
    JoinResult,
    OffsetAndMetadata,
)
from replication.coordinator.group_metadata_manager import OffsetsPartition, partition_for
from replication.errors import (
    FencedInstanceIdError,
    GroupIdNotFoundError,
    GroupNotEmptyError,
    GroupSubscribedToTopicError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidProducerIdMappingError,
    InvalidSessionTimeoutError,
    MemberIdRequiredError,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)
from replication.metadata.image import MetadataImage, PartitionState, TopicInfo
from replication.protocol.consumer import ConsumerProtocolSubscription, encode_embedded

pytestmark = pytest.mark.unit

SESSION = 10_000
DELAY = 3_000
REBALANCE = 30_000
PROTOCOLS = [("range", b"m")]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class Harness:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.appended: list[tuple[int, bytes]] = []
        self.fail_appends = False
        image = MetadataImage(
            topics=(
                TopicInfo("events", "id", tuple(PartitionState((0,), (0,), 0) for _ in range(4))),
                TopicInfo("other", "id2", (PartitionState((0,), (0,), 0),)),
            )
        )
        self.coordinator = GroupCoordinator(
            0,
            GroupConfig(num_partitions=3, initial_rebalance_delay_ms=DELAY),
            lambda: image,
            self.append,
            clock,
        )
        for index in range(3):
            self.coordinator.partitions[index] = OffsetsPartition(index, 0, loaded=True)

    async def append(self, index: int, records: bytes) -> int:
        if self.fail_appends:
            raise NotCoordinatorError("the log refused")
        self.appended.append((index, records))
        return len(self.appended) - 1

    def join(
        self, member_id: str = "", instance: str | None = None, **kw: Any
    ) -> Awaitable[JoinResult]:
        args: dict[str, Any] = {
            "session_timeout_ms": SESSION,
            "rebalance_timeout_ms": REBALANCE,
            "protocol_type": "consumer",
            "protocols": PROTOCOLS,
        }
        args.update(kw)
        return self.coordinator.join_group(
            JoinRequest(
                "g",
                member_id,
                instance,
                "client",
                "",
                args["session_timeout_ms"],
                args["rebalance_timeout_ms"],
                args["protocol_type"],
                tuple(args["protocols"]),
            )
        )

    def group(self) -> Any:
        return self.coordinator.describe_group("g")

    def records(self) -> list[tuple[bytes | None, bytes | None]]:
        out = []
        for _, data in self.appended:
            for batch in iter_batches(data):
                out += [(r.key, r.value) for r in batch.records()]
        return out


def run(test: Callable[[Harness], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test(Harness(Clock())))


async def join_new(
    h: Harness, instance: str | None = None, protocols: Any = PROTOCOLS
) -> asyncio.Task[JoinResult]:
    """A dynamic member's first join (MEMBER_ID_REQUIRED), then its join with the given id."""
    if instance is None:
        first = await h.join(protocols=protocols)
        assert first.error is MemberIdRequiredError
        assert first.member_id.startswith("client-")
        task = asyncio.ensure_future(h.join(first.member_id, protocols=protocols))
    else:
        task = asyncio.ensure_future(h.join(instance=instance, protocols=protocols))
    await asyncio.sleep(0)
    return task


async def after_initial_delay(h: Harness) -> None:
    """A new group waits group.initial.rebalance.delay.ms for more members: let it pass."""
    h.clock.now += DELAY + 1
    await h.coordinator.tick()


async def stable_group(h: Harness, n: int, protocols: Any = PROTOCOLS) -> list[JoinResult]:
    tasks = [await join_new(h, protocols=protocols) for _ in range(n)]
    assert not any(t.done() for t in tasks)  # the first rebalance waits for more members
    await after_initial_delay(h)
    results = list(await asyncio.gather(*tasks))
    leader = next(r for r in results if r.member_id == r.leader)
    assert len(leader.members) == n
    parts = [TopicPartition("events", i) for i in range(4)]
    assignments = {
        r.member_id: encode_consumer_assignment(parts[i::n]) for i, r in enumerate(results)
    }
    syncs = [
        h.coordinator.sync_group(
            "g", r.generation_id, r.member_id, None, assignments if r is leader else {}
        )
        for r in results
    ]
    got = await asyncio.gather(*syncs)
    assert [decode_consumer_assignment(a) for a in got] == [set(parts[i::n]) for i in range(n)]
    assert h.group().state is GroupState.STABLE
    return results


def test_a_group_forms_one_generation_and_stores_it() -> None:
    async def test(h: Harness) -> None:
        results = await stable_group(h, 3)
        assert {r.generation_id for r in results} == {1}
        assert len({r.leader for r in results}) == 1
        assert next(r for r in results if r.member_id != r.leader).members == ()
        keys = [k for k, _ in h.records()]
        assert keys == [b"group\0g"]  # the generation is stored once the leader synced
        assert h.appended[0][0] == partition_for("g", 3)

    run(test)


def test_join_checks_session_timeout_and_protocols() -> None:
    async def test(h: Harness) -> None:
        result = await h.join(session_timeout_ms=10)
        assert result.error is InvalidSessionTimeoutError
        await stable_group(h, 1)
        first = await h.join(protocols=[("roundrobin", b"")])
        assert first.error is InconsistentGroupProtocolError
        other_type = await h.join(protocol_type="connect")
        assert other_type.error is InconsistentGroupProtocolError

    run(test)


def test_a_zombie_cannot_commit_and_heartbeats_learn_of_rebalances() -> None:
    async def test(h: Harness) -> None:
        a, b = await stable_group(h, 2)
        tp = next(iter(decode_consumer_assignment(h.group().members[a.member_id].assignment)))
        ok = await h.coordinator.commit_offsets(
            "g", 1, a.member_id, None, {tp: OffsetAndMetadata(5)}
        )
        assert ok == {tp: None}
        # b goes silent past its session; a keeps heartbeating
        h.clock.now += SESSION - 1
        await h.coordinator.heartbeat("g", 1, a.member_id, None)
        h.clock.now += 2
        await h.coordinator.tick()
        assert b.member_id not in h.group().members
        with pytest.raises(RebalanceInProgressError):
            await h.coordinator.heartbeat("g", 1, a.member_id, None)
        rejoin = await h.join(a.member_id)
        assert rejoin.generation_id == 2
        # b (the zombie) comes back and tries to commit with its old generation
        with pytest.raises(UnknownMemberIdError):
            await h.coordinator.commit_offsets(
                "g", 1, b.member_id, None, {tp: OffsetAndMetadata(99)}
            )
        with pytest.raises(IllegalGenerationError):
            await h.coordinator.commit_offsets(
                "g", 1, a.member_id, None, {tp: OffsetAndMetadata(99)}
            )
        assert h.coordinator.fetch_offsets("g", [tp]) == {
            tp: OffsetAndMetadata(5, -1, None, 1_000_000 + DELAY + 1)
        }

    run(test)


def test_a_commit_for_a_partition_the_member_does_not_own_is_refused() -> None:
    async def test(h: Harness) -> None:
        a, _ = await stable_group(h, 2)
        owned = decode_consumer_assignment(h.group().members[a.member_id].assignment)
        other = next(
            TopicPartition("events", i)
            for i in range(4)
            if TopicPartition("events", i) not in owned
        )
        mine = next(iter(owned))
        result = await h.coordinator.commit_offsets(
            "g",
            1,
            a.member_id,
            None,
            {
                mine: OffsetAndMetadata(3),
                other: OffsetAndMetadata(3),
                TopicPartition("nope", 0): OffsetAndMetadata(3),
            },
        )
        assert result == {
            mine: None,
            other: IllegalGenerationError,
            TopicPartition("nope", 0): UnknownTopicOrPartitionError,
        }
        assert set(h.coordinator.fetch_offsets("g", None)) == {mine}

    run(test)


def test_commits_from_outside_the_group_work_only_while_it_is_empty() -> None:
    async def test(h: Harness) -> None:
        tp = TopicPartition("events", 0)
        assert await h.coordinator.commit_offsets(
            "g", -1, "", None, {tp: OffsetAndMetadata(7)}
        ) == {tp: None}
        assert h.coordinator.fetch_offsets("g", [tp])[tp].offset == 7  # type: ignore[union-attr]
        await stable_group(h, 1)
        with pytest.raises(UnknownMemberIdError):
            await h.coordinator.commit_offsets("g", -1, "", None, {tp: OffsetAndMetadata(8)})

    run(test)


def test_a_static_member_restarting_keeps_its_partitions_without_a_rebalance() -> None:
    async def test(h: Harness) -> None:
        joining = await join_new(h, instance="i-1")
        await after_initial_delay(h)
        first = await joining
        assert first.error is None
        assignment = encode_consumer_assignment([TopicPartition("events", 0)])
        await h.coordinator.sync_group(
            "g", 1, first.member_id, "i-1", {first.member_id: assignment}
        )
        again = await h.join(instance="i-1")  # restarted: no member id
        assert again.error is None
        assert again.generation_id == 1  # no new generation
        assert again.member_id != first.member_id
        got = await h.coordinator.sync_group("g", 1, again.member_id, "i-1", {})
        assert got == assignment
        with pytest.raises(FencedInstanceIdError):
            await h.coordinator.heartbeat("g", 1, first.member_id, "i-1")

    run(test)


def test_leaving_rebalances_and_the_last_one_out_leaves_an_empty_group() -> None:
    async def test(h: Harness) -> None:
        a, b = await stable_group(h, 2)
        assert await h.coordinator.leave_group("g", [(b.member_id, None), ("ghost", None)]) == [
            None,
            UnknownMemberIdError,
        ]
        rejoined = await h.join(a.member_id)
        assert rejoined.generation_id == 2
        assert rejoined.leader == a.member_id
        with pytest.raises(GroupNotEmptyError):
            await h.coordinator.delete_group("g")
        await h.coordinator.leave_group("g", [(a.member_id, None)])
        assert h.group().state is GroupState.EMPTY
        await h.coordinator.delete_group("g")
        assert h.group() is None
        assert (b"group\0g", None) in h.records()

    run(test)


def test_a_member_that_does_not_rejoin_in_time_is_removed() -> None:
    async def test(h: Harness) -> None:
        a, _ = await stable_group(h, 2)
        waiting = asyncio.ensure_future(h.join(a.member_id, protocols=[("range", b"new")]))
        await asyncio.sleep(0)
        assert not waiting.done()  # waits for b
        h.clock.now += REBALANCE + 1
        await h.coordinator.tick()
        result = await waiting
        assert result.generation_id == 2
        assert set(h.group().members) == {a.member_id}

    run(test)


def test_a_failed_write_of_the_assignment_fails_the_sync_and_rebalances() -> None:
    async def test(h: Harness) -> None:
        task = await join_new(h)
        await after_initial_delay(h)
        joined = await task
        h.fail_appends = True
        with pytest.raises(ReplogErrorAny):
            await h.coordinator.sync_group("g", 1, joined.member_id, None, {joined.member_id: b"x"})
        assert h.group().state is GroupState.PREPARING_REBALANCE

    run(test)


def test_an_empty_groups_offsets_expire_after_retention() -> None:
    async def test(h: Harness) -> None:
        tp = TopicPartition("events", 1)
        await h.coordinator.commit_offsets("g", -1, "", None, {tp: OffsetAndMetadata(7)})
        h.clock.now += h.coordinator.config.offsets_retention_ms + 1
        await h.coordinator.tick()
        assert h.group() is None
        assert (b"offset\0g\0events\x001", None) in h.records()

    run(test)


def test_offset_delete_keeps_what_members_subscribe_to_and_writes_tombstones() -> None:
    """OffsetDelete as Kafka's classic groups: an empty group loses the offsets named (a
    tombstone each, none for a partition without one); members keep the offsets of topics
    they subscribe to (GROUP_SUBSCRIBED_TO_TOPIC) and lose the others'; a group of another
    protocol with members refuses it whole; an unknown group is GROUP_ID_NOT_FOUND."""

    async def test(h: Harness) -> None:
        e0, e1, o0 = (
            TopicPartition("events", 0),
            TopicPartition("events", 1),
            TopicPartition("other", 0),
        )
        with pytest.raises(GroupIdNotFoundError):
            await h.coordinator.delete_offsets("g", [e0])
        commit = {e0: OffsetAndMetadata(5), e1: OffsetAndMetadata(6), o0: OffsetAndMetadata(7)}
        h.coordinator.manager.partitions[partition_for("g", 3)].groups["g"] = GroupMetadata(
            "g", offsets=dict(commit)
        )
        before = len(h.records())
        results = await h.coordinator.delete_offsets("g", [e0, TopicPartition("events", 3)])
        assert results == {e0: None, TopicPartition("events", 3): None}
        assert h.records()[before:] == [(b"offset\0g\0events\x000", None)]
        assert set(h.coordinator.fetch_offsets("g", None)) == {e1, o0}

        subscription = encode_embedded(ConsumerProtocolSubscription(topics=["events"]), 1)
        await stable_group(h, 1, protocols=[("range", subscription)])
        assert await h.coordinator.delete_offsets("g", [e1, o0]) == {
            e1: GroupSubscribedToTopicError,
            o0: None,
        }
        assert set(h.coordinator.fetch_offsets("g", None)) == {e1}

        h.group().protocol_type = "connect"
        with pytest.raises(GroupNotEmptyError):
            await h.coordinator.delete_offsets("g", [e1])

    run(test)


ReplogErrorAny = Exception


def test_a_snapshot_of_the_live_keys_follows_enough_records_but_not_an_open_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import replication.coordinator.group_metadata_manager as group_module

    monkeypatch.setattr(group_module, "SNAPSHOT_MIN_RECORDS", 5)

    async def test(h: Harness) -> None:
        tp = TopicPartition("events", 0)
        # an open transaction's offsets hold snapshots back
        await h.coordinator.commit_txn_offsets("g", 42, 0, -1, "", None, {tp: OffsetAndMetadata(1)})
        for i in range(12):
            await h.coordinator.commit_offsets("g", -1, "", None, {tp: OffsetAndMetadata(i)})
        await asyncio.sleep(0)
        assert len(h.appended) == 13  # no snapshot
        h.coordinator.complete_txn(partition_for("g", 3), 42, commit=False)
        await h.coordinator.commit_offsets("g", -1, "", None, {tp: OffsetAndMetadata(99)})
        for _ in range(3):
            await asyncio.sleep(0)
        snapshot = h.appended[-1][1]
        keys = [r.key or b"" for b in iter_batches(snapshot) for r in b.records()]
        assert sorted(keys) == [b"group\0g", b"offset\0g\0events\x000"]
        values = {r.key: r.value for b in iter_batches(snapshot) for r in b.records()}
        assert b'"offset": 99' in (values[b"offset\0g\0events\x000"] or b"")

    run(test)


def test_group_locks_live_only_while_in_use() -> None:
    """A group's lock is dropped once nobody holds or waits for it: the coordinator keeps no
    entry per group id it ever saw (ids used once would accumulate forever)."""

    async def test(h: Harness) -> None:
        tasks = [await join_new(h) for _ in range(2)]
        assert h.coordinator._locks == {}, "joins waiting for the rebalance hold no lock"
        await after_initial_delay(h)
        await asyncio.gather(*tasks)
        assert h.coordinator._locks == {}

    run(test)


def test_a_transactional_offset_commit_without_a_producer_id_is_refused() -> None:
    """A TxnOffsetCommit carrying no producer id (-1) is refused, naming the fix, before it
    reaches the offsets log (a transactional batch needs one; the fuzz test found this)."""

    async def test(h: Harness) -> None:
        with pytest.raises(InvalidProducerIdMappingError, match="InitProducerId"):
            await h.coordinator.commit_txn_offsets(
                "g", -1, 0, -1, "", None, {TopicPartition("t", 0): OffsetAndMetadata(5)}
            )
        assert h.appended == []

    run(test)
