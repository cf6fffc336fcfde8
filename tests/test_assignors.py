"""Partition assignors (range, roundrobin, cooperative-sticky): properties over random groups,
and Kafka's own worked examples."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.client.assignors import (
    ASSIGNORS,
    CooperativeStickyAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    Subscription,
)
from replication.common import TopicPartition

pytestmark = pytest.mark.unit

TOPICS = ("a", "b", "c")


def tp(topic: str, partition: int) -> TopicPartition:
    return TopicPartition(topic, partition)


groups = st.fixed_dictionaries(
    {
        "counts": st.fixed_dictionaries({t: st.integers(0, 12) for t in TOPICS}),
        "members": st.dictionaries(
            st.sampled_from([f"m{i}" for i in range(6)]),
            st.sets(st.sampled_from(TOPICS), min_size=1).map(lambda s: tuple(sorted(s))),
            min_size=1,
        ),
    }
)


def everything(counts: dict[str, int], subs: dict[str, Subscription]) -> set[TopicPartition]:
    subscribed = {t for s in subs.values() for t in s.topics}
    return {tp(t, p) for t, n in counts.items() if t in subscribed for p in range(n)}


@settings(max_examples=200, deadline=None)
@given(groups, st.sampled_from(["range", "roundrobin"]))
def test_eager_assignors_give_every_partition_to_exactly_one_subscriber(
    group: dict[str, Any], name: str
) -> None:
    subs = {m: Subscription(topics) for m, topics in group["members"].items()}
    out = ASSIGNORS[name]().assign(group["counts"], subs)
    assigned = [p for parts in out.values() for p in parts]
    assert len(assigned) == len(set(assigned))
    assert set(assigned) == everything(group["counts"], subs)
    for member, parts in out.items():
        assert all(p.topic in subs[member].topics for p in parts)


@settings(max_examples=200, deadline=None)
@given(groups)
def test_cooperative_sticky_never_gives_a_partition_to_two_members_and_converges(
    group: dict[str, Any],
) -> None:
    assignor = CooperativeStickyAssignor()
    counts = group["counts"]
    members = dict(group["members"])
    owned: dict[str, frozenset[TopicPartition]] = {m: frozenset() for m in members}
    generation = 0

    def rebalance() -> dict[str, set[TopicPartition]]:
        nonlocal generation
        subs = {m: Subscription(members[m], owned[m], generation) for m in members}
        out = assignor.assign(counts, subs)
        generation += 1
        assigned = [p for parts in out.values() for p in parts]
        assert len(assigned) == len(set(assigned))  # never two owners
        for member, parts in out.items():
            assert all(p.topic in members[member] for p in parts)
            # a member keeps or revokes; it never takes what another still owns
            others = set().union(*(owned[o] for o in owned if o != member))
            assert not (parts - owned[member]) & others
        for member in members:
            owned[member] = frozenset(out[member])
        return out

    first = rebalance()
    second = rebalance()  # revoked partitions are handed out now
    subs = {m: Subscription(members[m]) for m in members}
    assert set().union(*second.values()) == everything(counts, subs)
    assert rebalance() == second  # stable: nothing moves without a change
    # a member leaves: where everyone subscribes to everything, the others keep all they had
    # (balance can force moves when subscriptions differ; Kafka's sticky assignor too)
    if len(members) > 1 and all(set(t) == set(TOPICS) for t in members.values()):
        gone = sorted(members)[0]
        del members[gone], owned[gone]
        after = rebalance()
        for member in members:
            assert second[member] <= after[member]
    assert first is not None


def test_balance_when_everyone_subscribes_to_everything() -> None:
    counts = {"a": 7, "b": 3}
    subs = {f"m{i}": Subscription(("a", "b")) for i in range(3)}
    for assignor in (RoundRobinAssignor(), CooperativeStickyAssignor()):
        sizes = sorted(len(p) for p in assignor.assign(counts, subs).values())
        assert sizes == [3, 3, 4]


def test_kafkas_range_example() -> None:
    # Kafka's RangeAssignor javadoc: two consumers, two topics of three partitions
    counts = {"t0": 3, "t1": 3}
    subs = {"C0": Subscription(("t0", "t1")), "C1": Subscription(("t0", "t1"))}
    out = RangeAssignor().assign(counts, subs)
    assert out == {
        "C0": {tp("t0", 0), tp("t0", 1), tp("t1", 0), tp("t1", 1)},
        "C1": {tp("t0", 2), tp("t1", 2)},
    }


def test_kafkas_roundrobin_example() -> None:
    # Kafka's RoundRobinAssignor javadoc: C0 subscribes t0; C1 t0, t1; C2 t0, t1, t2
    counts = {"t0": 1, "t1": 2, "t2": 3}
    subs = {
        "C0": Subscription(("t0",)),
        "C1": Subscription(("t0", "t1")),
        "C2": Subscription(("t0", "t1", "t2")),
    }
    out = RoundRobinAssignor().assign(counts, subs)
    assert out == {
        "C0": {tp("t0", 0)},
        "C1": {tp("t1", 0)},
        "C2": {tp("t1", 1), tp("t2", 0), tp("t2", 1), tp("t2", 2)},
    }


def test_cooperative_sticky_withholds_moving_partitions_for_one_generation() -> None:
    counts = {"a": 4}
    one = {"m1": Subscription(("a",), frozenset(tp("a", p) for p in range(4)), 1)}
    assert CooperativeStickyAssignor().assign(counts, one)["m1"] == {tp("a", p) for p in range(4)}
    two = {**one, "m2": Subscription(("a",))}
    out = CooperativeStickyAssignor().assign(counts, two)
    assert len(out["m1"]) == 2  # keeps two, revokes two
    assert out["m2"] == set()  # gets them in the next generation, once m1 revoked them
