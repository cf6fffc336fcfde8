"""Incremental fetch sessions (KIP-227): the leader's cache and the fetcher's handler, in memory.

A fake leader (a dict of partition states behind a :class:`FetchSessionCache`) serves a
follower (a :class:`FetchSessionHandler` and its fetch offsets); requests can go over the wire
codec, responses can be lost, sessions evicted. A Hypothesis state machine checks the one
property that matters: after every successful fetch the follower knows every partition's high
watermark, log start offset and last stable offset exactly as the leader has them, although
incremental responses leave out what did not change.
"""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from replication.broker.fetch_metadata import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    FetchMetadata,
    PartitionFetchState,
    next_epoch,
)
from replication.broker.fetch_session import (
    FetchContext,
    FetchSessionCache,
    FullFetchContext,
    IncrementalFetchContext,
    SessionErrorContext,
    SessionlessFetchContext,
)
from replication.broker.fetch_session_handler import FetchRequestData, FetchSessionHandler
from replication.common import TopicPartition
from replication.errors import FetchSessionIdNotFoundError, InvalidFetchSessionEpochError
from replication.protocol import (
    ApiKey,
    EpochEndOffset,
    FetchRequest,
    FetchRequestPartition,
    FetchRequestTopic,
    FetchResponsePartition,
    ForgottenTopic,
    RequestHeader,
    decode_request,
    encode_request,
)

pytestmark = pytest.mark.unit

INT32_MAX = 2**31 - 1
EVICTION_MS = 120_000
MAX_BYTES = 1 << 20


class Clock:
    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


# --- the wire: FetchRequestData <-> FetchRequest ----------------------------------------------


def to_fetch_request(data: FetchRequestData, replica_id: int) -> FetchRequest:
    topics: dict[str, list[FetchRequestPartition]] = {}
    for (topic, partition), state in data.to_send:
        topics.setdefault(topic, []).append(
            FetchRequestPartition(
                partition=partition,
                current_leader_epoch=state.current_leader_epoch,
                fetch_offset=state.fetch_offset,
                last_fetched_epoch=state.last_fetched_epoch,
                log_start_offset=state.log_start_offset,
                partition_max_bytes=state.max_bytes,
            )
        )
    forgotten: dict[str, list[int]] = {}
    for topic, partition in data.to_forget:
        forgotten.setdefault(topic, []).append(partition)
    return FetchRequest(
        replica_id=replica_id,
        session_id=data.session_id,
        session_epoch=data.session_epoch,
        topics=[FetchRequestTopic(topic=t, partitions=ps) for t, ps in topics.items()],
        forgotten_topics_data=[
            ForgottenTopic(topic=t, partitions=ps) for t, ps in forgotten.items()
        ],
    )


def encode(data: FetchRequestData, replica_id: int = 1) -> bytes:
    header = RequestHeader(
        api_key=ApiKey.FETCH, api_version=0, correlation_id=1, client_id=f"replica-{replica_id}"
    )
    return encode_request(header, to_fetch_request(data, replica_id))


def request_partitions(req: FetchRequest) -> list[tuple[TopicPartition, PartitionFetchState]]:
    return [
        (
            TopicPartition(t.topic, p.partition),
            PartitionFetchState(
                fetch_offset=p.fetch_offset,
                max_bytes=p.partition_max_bytes,
                current_leader_epoch=p.current_leader_epoch,
                last_fetched_epoch=p.last_fetched_epoch,
                log_start_offset=p.log_start_offset,
            ),
        )
        for t in req.topics
        for p in t.partitions
    ]


def request_forgotten(req: FetchRequest) -> list[TopicPartition]:
    return [TopicPartition(t.topic, p) for t in req.forgotten_topics_data for p in t.partitions]


# --- a fake leader and a follower ---------------------------------------------------------------


@dataclass
class LeaderPartition:
    leo: int = 0
    hw: int = 0
    log_start: int = 0
    lso: int = 0
    error_code: int = 0
    diverging_epoch: int = -1


@dataclass
class Response:
    session_id: int
    error_code: int
    partitions: list[tuple[TopicPartition, FetchResponsePartition]]

    @property
    def names(self) -> list[TopicPartition]:
        return [tp for tp, _ in self.partitions]


class FakeLeader:
    """A leader's partitions (a dict) behind a fetch session cache."""

    def __init__(self, max_slots: int = 10, clock: Clock | None = None) -> None:
        self.clock = clock if clock is not None else Clock()
        self.cache = FetchSessionCache(max_slots, EVICTION_MS, self.clock, random.Random(7))
        self.partitions: dict[TopicPartition, LeaderPartition] = {}
        self.last_context: FetchContext | None = None

    def append(self, tp: TopicPartition, n: int = 1) -> None:
        """Append ``n`` records; the HW follows (one follower, in sync)."""
        part = self.partitions[tp]
        part.leo += n
        part.hw = part.leo
        part.lso = part.leo

    def read(self, tp: TopicPartition, state: PartitionFetchState) -> FetchResponsePartition:
        part = self.partitions[tp]
        n = max(part.leo - state.fetch_offset, 0)
        return FetchResponsePartition(
            partition_index=tp[1],
            error_code=part.error_code,
            high_watermark=part.hw,
            last_stable_offset=part.lso,
            log_start_offset=part.log_start,
            diverging_epoch=EpochEndOffset(epoch=part.diverging_epoch, end_offset=0)
            if part.diverging_epoch >= 0
            else EpochEndOffset(),
            records=bytes(n) if n and not part.error_code else None,
        )

    def serve(
        self,
        data: FetchRequestData,
        *,
        follower: bool = True,
        wire: bool = False,
    ) -> Response:
        if wire:
            _, req = decode_request(encode(data)[4:])
            session_id, epoch = req.session_id, req.session_epoch
            to_send, to_forget = request_partitions(req), request_forgotten(req)
        else:
            session_id, epoch = data.session_id, data.session_epoch
            to_send, to_forget = data.to_send, data.to_forget
        ctx = self.cache.new_context(
            session_id, epoch, to_send, to_forget, is_from_follower=follower
        )
        self.last_context = ctx
        results = {
            TopicPartition(t, p): self.read(TopicPartition(t, p), state)
            for t, p, state in ctx.partitions()
        }
        included = ctx.filter_response(results)
        return Response(ctx.session_id, ctx.error_code, included)


@dataclass
class FollowerPartition:
    fetch_offset: int = 0
    hw: int = -1
    log_start: int = -1
    lso: int = -1
    error_code: int = 0


@dataclass
class Follower:
    node_id: int = 1
    handler: FetchSessionHandler = field(init=False)
    partitions: dict[TopicPartition, FollowerPartition] = field(default_factory=dict)
    active: list[TopicPartition] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.handler = FetchSessionHandler(self.node_id)

    def fetch_states(self) -> dict[TopicPartition, PartitionFetchState]:
        return {
            tp: PartitionFetchState(
                fetch_offset=self.partitions.setdefault(tp, FollowerPartition()).fetch_offset,
                max_bytes=MAX_BYTES,
                current_leader_epoch=0,
            )
            for tp in self.active
        }

    def build(self) -> FetchRequestData:
        return self.handler.build(self.fetch_states())

    def accept(self, resp: Response) -> bool:
        ok = self.handler.handle_response(resp.session_id, resp.error_code, resp.names)
        if ok:
            for tp, p in resp.partitions:
                mine = self.partitions[tp]
                mine.error_code = p.error_code
                if p.error_code:
                    continue  # nothing else of a partition with an error is used
                if p.records is not None:
                    mine.fetch_offset += len(p.records)
                mine.hw, mine.log_start, mine.lso = (
                    p.high_watermark,
                    p.log_start_offset,
                    p.last_stable_offset,
                )
        return ok

    def round(self, leader: FakeLeader, *, wire: bool = False) -> tuple[FetchRequestData, Response]:
        req = self.build()
        resp = leader.serve(req, wire=wire)
        self.accept(resp)
        return req, resp


def tps(topic: str, n: int) -> list[TopicPartition]:
    return [TopicPartition(topic, i) for i in range(n)]


def wired(n: int = 3) -> tuple[FakeLeader, Follower]:
    """A leader of partitions t-0 .. t-(n-1), and a follower fetching all of them."""
    leader = FakeLeader()
    follower = Follower()
    for tp in tps("t", n):
        leader.partitions[tp] = LeaderPartition()
        follower.active.append(tp)
    return leader, follower


def resp_partition(**kwargs: Any) -> FetchResponsePartition:
    return FetchResponsePartition(partition_index=0, **kwargs)


def state(offset: int = 0) -> PartitionFetchState:
    return PartitionFetchState(fetch_offset=offset, max_bytes=MAX_BYTES)


# --- epochs -----------------------------------------------------------------------------------


def test_next_epoch_counts_up_wraps_to_one_and_final_stays_final() -> None:
    assert next_epoch(INITIAL_EPOCH) == 1
    assert next_epoch(41) == 42
    assert next_epoch(INT32_MAX) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH
    assert FetchMetadata(5, INITIAL_EPOCH).is_full
    assert FetchMetadata(5, FINAL_EPOCH).is_full
    assert not FetchMetadata(5, 1).is_full


# --- session flows ------------------------------------------------------------------------------


def test_full_fetch_creates_a_session_and_incremental_fetches_continue_it() -> None:
    leader, follower = wired(3)
    leader.append(TopicPartition("t", 1), 5)

    req, resp = follower.round(leader)
    assert (req.is_full, req.session_id, req.session_epoch) == (True, INVALID_SESSION_ID, 0)
    assert isinstance(leader.last_context, FullFetchContext)
    assert resp.error_code == 0
    assert resp.session_id != INVALID_SESSION_ID
    assert resp.names == tps("t", 3)  # a full response names every partition
    assert follower.handler.next_metadata == FetchMetadata(resp.session_id, 1)
    session = leader.cache.get(resp.session_id)
    assert session is not None
    assert session.privileged
    assert session.epoch == 1
    assert (len(leader.cache), leader.cache.total_partitions) == (1, 3)
    assert follower.partitions[TopicPartition("t", 1)].fetch_offset == 5

    # Only t-1's fetch offset moved: the incremental request names only it.
    req, resp = follower.round(leader)
    assert (req.is_full, req.session_id, req.session_epoch) == (False, resp.session_id, 1)
    assert [tp for tp, _ in req.to_send] == [TopicPartition("t", 1)]
    assert req.to_forget == []
    assert isinstance(leader.last_context, IncrementalFetchContext)
    assert resp.names == []  # no news anywhere
    assert session.epoch == 2
    assert follower.handler.session_epoch == 2

    # Nothing changed at all: an empty incremental request, an empty response.
    req, resp = follower.round(leader)
    assert (req.to_send, req.to_forget, req.session_epoch) == ([], [], 2)
    assert resp.names == []
    assert follower.handler.session_epoch == 3


def test_incremental_request_reads_all_session_partitions() -> None:
    leader, follower = wired(4)
    follower.round(leader)
    leader.append(TopicPartition("t", 3), 2)
    req, resp = follower.round(leader)
    assert req.to_send == []
    ctx = leader.last_context
    assert isinstance(ctx, IncrementalFetchContext)
    assert [(t, p) for t, p, _ in ctx.partitions()] == [*tps("t", 3), TopicPartition("t", 3)]
    assert ctx.fetch_offset(TopicPartition("t", 2)) == 0
    assert ctx.fetch_offset(TopicPartition("u", 0)) is None
    assert resp.names == [TopicPartition("t", 3)]
    assert follower.partitions[TopicPartition("t", 3)].fetch_offset == 2


def test_thousand_partitions_ten_active_incremental_requests_are_small() -> None:
    leader = FakeLeader()
    follower = Follower()
    all_tps = [TopicPartition(f"topic-{t}", p) for t in range(10) for p in range(100)]
    for tp in all_tps:
        leader.partitions[tp] = LeaderPartition()
    follower.active = list(all_tps)
    active = random.Random(3).sample(all_tps, 10)

    full_req, full_resp = follower.round(leader, wire=True)
    assert full_req.is_full
    assert len(full_req.to_send) == 1000
    assert len(full_resp.partitions) == 1000
    assert full_resp.session_id != INVALID_SESSION_ID

    for _ in range(3):
        for tp in active:
            leader.append(tp, 3)
        # The response names only the 10 partitions with records and a new HW ...
        _, resp = follower.round(leader, wire=True)
        assert sorted(resp.names) == sorted(active)
        # ... and the next request names only the 10 whose fetch offsets moved.
        inc_req = follower.build()
        assert not inc_req.is_full
        assert len(inc_req.to_send) == 10
        assert sorted(tp for tp, _ in inc_req.to_send) == sorted(active)
        resp = leader.serve(inc_req, wire=True)
        assert follower.accept(resp)
        assert resp.names == []  # nothing new since

    full_bytes, inc_bytes = len(encode(full_req)), len(encode(inc_req))
    print(f"full fetch request: {full_bytes} bytes, incremental: {inc_bytes} bytes")
    assert inc_bytes <= 0.05 * full_bytes
    for tp in active:
        assert follower.partitions[tp].fetch_offset == 9
        assert follower.partitions[tp].hw == 9


def test_responses_name_only_partitions_with_news() -> None:
    cache = FetchSessionCache(10, time_ms=Clock())
    names = tps("t", 8)
    full = cache.new_context(0, INITIAL_EPOCH, [(tp, state()) for tp in names])
    quiet = resp_partition(high_watermark=10, log_start_offset=0, last_stable_offset=10)
    assert len(full.filter_response(dict.fromkeys(names, quiet))) == 8
    sid = full.session_id

    news = {
        TopicPartition("t", 0): resp_partition(
            high_watermark=10, log_start_offset=0, last_stable_offset=10
        ),
        TopicPartition("t", 1): resp_partition(
            high_watermark=10, log_start_offset=0, last_stable_offset=10, records=b"abc"
        ),
        TopicPartition("t", 2): resp_partition(
            high_watermark=11, log_start_offset=0, last_stable_offset=10
        ),
        TopicPartition("t", 3): resp_partition(
            high_watermark=10, log_start_offset=4, last_stable_offset=10
        ),
        TopicPartition("t", 4): resp_partition(
            high_watermark=10, log_start_offset=0, last_stable_offset=7
        ),
        TopicPartition("t", 5): resp_partition(error_code=6),
        TopicPartition("t", 6): resp_partition(
            high_watermark=10,
            log_start_offset=0,
            last_stable_offset=10,
            diverging_epoch=EpochEndOffset(epoch=3, end_offset=8),
        ),
        TopicPartition("t", 7): resp_partition(
            high_watermark=10, log_start_offset=0, last_stable_offset=10, records=b""
        ),
    }
    inc = cache.new_context(sid, 1, [])
    assert [tp for tp, _ in inc.filter_response(news)] == tps("t", 7)[1:]

    # The same answers again: only the error and the divergence are news a second time; the
    # partition whose error cleared is resent (its HW was forgotten).
    again = dict(news)
    again[TopicPartition("t", 1)] = quiet
    again[TopicPartition("t", 5)] = quiet
    inc = cache.new_context(sid, 2, [])
    assert [tp for tp, _ in inc.filter_response(again)] == [
        TopicPartition("t", 5),
        TopicPartition("t", 6),
    ]
    inc = cache.new_context(sid, 3, [])
    assert [tp for tp, _ in inc.filter_response(again)] == [TopicPartition("t", 6)]

    # An error is news even when every value is the same as last sent.
    again[TopicPartition("t", 0)] = resp_partition(
        error_code=6, high_watermark=10, log_start_offset=0, last_stable_offset=10
    )
    for epoch in (4, 5):
        inc = cache.new_context(sid, epoch, [])
        assert [tp for tp, _ in inc.filter_response(again)] == [
            TopicPartition("t", 0),
            TopicPartition("t", 6),
        ]


def test_answered_partitions_move_to_the_end_of_the_session() -> None:
    cache = FetchSessionCache(10, time_ms=Clock())
    names = tps("t", 4)
    quiet = resp_partition(high_watermark=1)
    full = cache.new_context(0, INITIAL_EPOCH, [(tp, state()) for tp in names])
    full.filter_response(dict.fromkeys(names, quiet))
    inc = cache.new_context(full.session_id, 1, [])
    results = dict.fromkeys(names, quiet)
    results[TopicPartition("t", 1)] = resp_partition(high_watermark=2)
    inc.filter_response(results)
    nxt = cache.new_context(full.session_id, 2, [])
    assert [(t, p) for t, p, _ in nxt.partitions()] == [
        TopicPartition("t", 0),
        TopicPartition("t", 2),
        TopicPartition("t", 3),
        TopicPartition("t", 1),
    ]


def test_new_and_changed_fetch_states_are_sent_and_update_the_leader() -> None:
    leader, follower = wired(3)
    _, resp = follower.round(leader)
    sid = resp.session_id
    handler = follower.handler
    base = follower.fetch_states()
    changed = dict(base)
    changed[TopicPartition("t", 0)] = PartitionFetchState(0, MAX_BYTES, current_leader_epoch=1)
    changed[TopicPartition("t", 1)] = PartitionFetchState(
        0, MAX_BYTES, current_leader_epoch=0, log_start_offset=5
    )
    changed[TopicPartition("t", 2)] = PartitionFetchState(0, 512, current_leader_epoch=0)
    changed[TopicPartition("u", 0)] = state(7)
    leader.partitions[TopicPartition("u", 0)] = LeaderPartition(leo=7)
    req = handler.build(changed)
    # New partitions first, then the altered ones (as Kafka's builder).
    assert [tp for tp, _ in req.to_send] == [
        TopicPartition("u", 0),
        TopicPartition("t", 0),
        TopicPartition("t", 1),
        TopicPartition("t", 2),
    ]
    resp = leader.serve(req)
    assert handler.handle_response(resp.session_id, resp.error_code, resp.names)
    session = leader.cache.get(sid)
    assert session is not None
    assert {tp: c.state for tp, c in session.partitions.items()} == changed
    assert session.partitions[TopicPartition("t", 1)].fetcher_log_start_offset == 5
    assert session.partitions[TopicPartition("t", 2)].max_bytes == 512
    assert resp.names == [TopicPartition("u", 0)]


def test_forgotten_partitions_leave_the_session() -> None:
    leader, follower = wired(3)
    _, resp = follower.round(leader)
    sid = resp.session_id
    follower.active.remove(TopicPartition("t", 1))
    req, resp = follower.round(leader, wire=True)
    assert (req.to_send, req.to_forget) == ([], [TopicPartition("t", 1)])
    session = leader.cache.get(sid)
    assert session is not None
    assert list(session.partitions) == [TopicPartition("t", 0), TopicPartition("t", 2)]
    assert leader.cache.total_partitions == 2
    leader.append(TopicPartition("t", 1), 4)
    leader.append(TopicPartition("t", 2), 4)
    _, resp = follower.round(leader)
    assert resp.names == [TopicPartition("t", 2)]  # t-1 is no longer read nor answered

    # Forgetting the last partitions closes the session; the next fetch is full again.
    follower.active.clear()
    req, resp = follower.round(leader)
    assert sorted(req.to_forget) == [TopicPartition("t", 0), TopicPartition("t", 2)]
    assert isinstance(leader.last_context, SessionlessFetchContext)
    assert resp.session_id == INVALID_SESSION_ID
    assert sid not in leader.cache
    assert follower.handler.next_metadata == FetchMetadata(INVALID_SESSION_ID, INITIAL_EPOCH)
    follower.active.append(TopicPartition("t", 1))
    req, resp = follower.round(leader)
    assert req.is_full
    assert resp.names == [TopicPartition("t", 1)]
    assert resp.session_id not in (INVALID_SESSION_ID, sid)


# --- errors and recovery ----------------------------------------------------------------------


def test_unknown_session_id_falls_back_to_a_full_fetch_that_recreates_the_session() -> None:
    leader, follower = wired(3)
    _, resp = follower.round(leader)
    old = resp.session_id
    leader.cache.remove(old)  # e.g. evicted, or the broker restarted
    leader.append(TopicPartition("t", 2), 3)

    req, resp = follower.round(leader)
    assert not req.is_full
    assert isinstance(leader.last_context, SessionErrorContext)
    assert leader.last_context.error is FetchSessionIdNotFoundError
    assert (resp.error_code, resp.session_id, resp.partitions) == (70, INVALID_SESSION_ID, [])
    assert follower.handler.next_metadata == FetchMetadata(INVALID_SESSION_ID, INITIAL_EPOCH)
    assert follower.partitions[TopicPartition("t", 2)].fetch_offset == 0

    req, resp = follower.round(leader)
    assert (req.is_full, req.session_id, req.session_epoch) == (True, INVALID_SESSION_ID, 0)
    assert len(req.to_send) == 3
    assert resp.session_id not in (INVALID_SESSION_ID, old)
    assert follower.partitions[TopicPartition("t", 2)].fetch_offset == 3
    req, resp = follower.round(leader)
    assert (req.is_full, req.session_epoch, resp.error_code) == (False, 1, 0)


def test_invalid_epoch_falls_back_to_a_full_fetch_that_recreates_the_session() -> None:
    leader, follower = wired(3)
    _, resp = follower.round(leader)
    old = resp.session_id
    req = follower.build()
    leader.serve(req)  # delivered, but a duplicate of it arrives too
    resp = leader.serve(req)
    assert isinstance(leader.last_context, SessionErrorContext)
    assert leader.last_context.error is InvalidFetchSessionEpochError
    assert (resp.error_code, resp.session_id, resp.partitions) == (71, INVALID_SESSION_ID, [])
    assert not follower.accept(resp)
    # The next request closes the old session and asks for a new one.
    assert follower.handler.next_metadata == FetchMetadata(old, INITIAL_EPOCH)

    req, resp = follower.round(leader)
    assert (req.is_full, req.session_id, req.session_epoch) == (True, old, INITIAL_EPOCH)
    assert old not in leader.cache
    assert resp.session_id not in (INVALID_SESSION_ID, old)
    assert len(leader.cache) == 1
    _, resp = follower.round(leader)
    assert resp.error_code == 0


def test_session_moved_on_before_the_response_is_an_epoch_error() -> None:
    cache = FetchSessionCache(10, time_ms=Clock())
    full = cache.new_context(0, INITIAL_EPOCH, [(TopicPartition("t", 0), state())])
    full.filter_response({TopicPartition("t", 0): resp_partition()})
    sid = full.session_id
    first = cache.new_context(sid, 1, [])
    second = cache.new_context(sid, 2, [])
    assert first.filter_response({TopicPartition("t", 0): resp_partition(records=b"x")}) == []
    assert first.error is InvalidFetchSessionEpochError
    assert first.session_id == sid
    assert len(second.filter_response({TopicPartition("t", 0): resp_partition(records=b"x")})) == 1
    assert second.error is None


def test_lost_response_recovers_through_a_full_fetch() -> None:
    leader, follower = wired(3)
    _, resp = follower.round(leader)
    old = resp.session_id
    leader.append(TopicPartition("t", 0), 4)
    req = follower.build()
    lost = leader.serve(req)  # the leader now believes it sent HW 4 for t-0 ...
    assert lost.names == [TopicPartition("t", 0)]
    follower.handler.handle_error(ConnectionResetError("lost"))  # ... but it never arrived

    assert follower.handler.next_metadata == FetchMetadata(old, INITIAL_EPOCH)
    req, resp = follower.round(leader)
    assert (req.is_full, req.session_id, req.session_epoch) == (True, old, INITIAL_EPOCH)
    assert old not in leader.cache
    assert resp.session_id not in (INVALID_SESSION_ID, old)
    assert follower.partitions[TopicPartition("t", 0)].fetch_offset == 4
    assert follower.partitions[TopicPartition("t", 0)].hw == 4
    req, resp = follower.round(leader)
    assert (req.is_full, req.session_epoch, resp.names) == (False, 1, [])


def test_a_lost_full_response_retries_the_full_fetch() -> None:
    leader, follower = wired(2)
    req = follower.build()
    leader.serve(req)  # created a session the follower never hears of
    follower.handler.handle_error()
    assert follower.handler.next_metadata == FetchMetadata(INVALID_SESSION_ID, INITIAL_EPOCH)
    _, resp = follower.round(leader)
    assert resp.names == tps("t", 2)
    # The orphan session lingers until it goes stale (as in Kafka).
    assert len(leader.cache) == 2


def test_handler_rejects_responses_that_do_not_match_the_session() -> None:
    handler = FetchSessionHandler(node_id=1)
    wanted = {tp: state() for tp in tps("t", 2)}
    handler.build(wanted)
    # A full response must name every partition of the request.
    assert not handler.handle_response(9, 0, [TopicPartition("t", 0)])
    assert handler.next_metadata == FetchMetadata(INVALID_SESSION_ID, INITIAL_EPOCH)
    handler.build(wanted)
    assert not handler.handle_response(9, 0, [*tps("t", 2), TopicPartition("u", 0)])
    handler.build(wanted)
    # An empty full response with a throttle time only says "throttled".
    assert not handler.handle_response(9, 0, [], throttle_time_ms=100)
    handler.build(wanted)
    assert handler.handle_response(9, 0, tps("t", 2))
    assert handler.next_metadata == FetchMetadata(9, 1)
    # An incremental response may name only the session's partitions.
    handler.build(wanted)
    assert not handler.handle_response(9, 0, [TopicPartition("u", 0)])
    assert handler.next_metadata == FetchMetadata(9, INITIAL_EPOCH)
    # A full response without a session id: no session, keep doing full fetches.
    assert handler.build(wanted).is_full
    assert handler.handle_response(INVALID_SESSION_ID, 0, tps("t", 2))
    assert handler.build(wanted).is_full


@pytest.mark.parametrize("error_code", [6, 7, 71, -1])
def test_any_top_level_error_closes_the_session_and_asks_for_a_new_one(error_code: int) -> None:
    handler = FetchSessionHandler(node_id=1)
    handler.next_metadata = FetchMetadata(9, 5)
    assert not handler.handle_response(INVALID_SESSION_ID, error_code, [])
    assert handler.next_metadata == FetchMetadata(9, INITIAL_EPOCH)


def test_final_epoch_fetches_have_no_session_and_close_the_named_one() -> None:
    leader, follower = wired(2)
    _, resp = follower.round(leader)
    sid = resp.session_id
    follower.handler.notify_close()
    req, resp = follower.round(leader)
    assert (req.is_full, req.session_id, req.session_epoch) == (True, sid, FINAL_EPOCH)
    assert isinstance(leader.last_context, SessionlessFetchContext)
    assert resp.session_id == INVALID_SESSION_ID
    assert resp.names == tps("t", 2)
    assert len(leader.cache) == 0
    assert follower.handler.next_metadata == FetchMetadata(INVALID_SESSION_ID, INITIAL_EPOCH)

    ctx = leader.cache.new_context(
        INVALID_SESSION_ID, FINAL_EPOCH, [(TopicPartition("t", 0), state())]
    )
    assert ctx.filter_response({TopicPartition("t", 0): resp_partition()}) == [
        (TopicPartition("t", 0), resp_partition())
    ]
    assert (ctx.session_id, len(leader.cache)) == (INVALID_SESSION_ID, 0)


def test_epoch_wraps_from_int32_max_to_one() -> None:
    leader, follower = wired(2)
    _, resp = follower.round(leader)
    session = leader.cache.get(resp.session_id)
    assert session is not None
    session.epoch = INT32_MAX
    follower.handler.next_metadata = FetchMetadata(resp.session_id, INT32_MAX)
    leader.append(TopicPartition("t", 0))
    req, resp = follower.round(leader, wire=True)
    assert req.session_epoch == INT32_MAX
    assert (resp.error_code, resp.names) == (0, [TopicPartition("t", 0)])
    assert session.epoch == 1
    assert follower.handler.session_epoch == 1
    req, resp = follower.round(leader, wire=True)
    assert (req.session_epoch, resp.error_code) == (1, 0)
    assert session.epoch == follower.handler.session_epoch == 2


# --- eviction -----------------------------------------------------------------------------------


def open_session(cache: FetchSessionCache, n: int, *, privileged: bool, topic: str = "t") -> int:
    ctx = cache.new_context(
        INVALID_SESSION_ID,
        INITIAL_EPOCH,
        [(tp, state()) for tp in tps(topic, n)],
        is_from_follower=privileged,
    )
    ctx.filter_response({tp: resp_partition() for tp in tps(topic, n)})
    return ctx.session_id


def use(cache: FetchSessionCache, session_id: int) -> None:
    session = cache.get(session_id)
    assert session is not None
    ctx = cache.new_context(session_id, session.epoch, [])
    assert ctx.error is None


def test_stale_sessions_are_evicted_first() -> None:
    clock = Clock()
    cache = FetchSessionCache(2, EVICTION_MS, clock)
    follower = open_session(cache, 50, privileged=True)
    consumer = open_session(cache, 1, privileged=False)
    clock.now = 100_000
    use(cache, consumer)
    clock.now = EVICTION_MS + 1  # the follower's session is stale, the consumer's is not
    new = open_session(cache, 1, privileged=False)
    assert new != INVALID_SESSION_ID
    assert follower not in cache
    assert consumer in cache
    assert cache.evictions == 1


def test_privileged_sessions_evict_unprivileged_ones() -> None:
    clock = Clock()
    cache = FetchSessionCache(2, EVICTION_MS, clock)
    big = open_session(cache, 5, privileged=False)
    small = open_session(cache, 3, privileged=False)
    clock.now = 1_000
    # A consumer's new session may not evict sessions this young, however big it is ...
    assert open_session(cache, 100, privileged=False) == INVALID_SESSION_ID
    # ... a follower's may: it evicts the least valuable one (fewest partitions).
    new = open_session(cache, 1, privileged=True)
    assert new != INVALID_SESSION_ID
    assert small not in cache
    assert big in cache
    assert (len(cache), cache.total_partitions) == (2, 6)


def test_bigger_sessions_evict_smaller_established_unprivileged_ones() -> None:
    clock = Clock()
    cache = FetchSessionCache(2, EVICTION_MS, clock)
    a = open_session(cache, 4, privileged=False)
    b = open_session(cache, 2, privileged=False)
    clock.now = EVICTION_MS + 1
    use(cache, a)
    use(cache, b)  # both in use (not stale), and created over eviction_ms ago
    assert open_session(cache, 2, privileged=False) == INVALID_SESSION_ID  # not bigger than b
    new = open_session(cache, 3, privileged=False)
    assert new != INVALID_SESSION_ID
    assert b not in cache
    assert a in cache
    assert cache.evictions == 1


def test_a_cache_full_of_privileged_sessions_gives_consumers_no_session() -> None:
    clock = Clock()
    cache = FetchSessionCache(2, EVICTION_MS, clock)
    f1 = open_session(cache, 1, privileged=True)
    f2 = open_session(cache, 1, privileged=True)
    clock.now = EVICTION_MS + 1
    use(cache, f1)
    use(cache, f2)
    ctx = cache.new_context(INVALID_SESSION_ID, INITIAL_EPOCH, [(TopicPartition("c", 0), state())])
    results = {TopicPartition("c", 0): resp_partition()}
    assert ctx.filter_response(results) == list(results.items())  # still a full answer
    assert ctx.session_id == INVALID_SESSION_ID
    assert ctx.error is None
    assert set(cache._sessions) == {f1, f2}
    # A consumer with no session keeps doing full fetches.
    handler = FetchSessionHandler(node_id=-1)
    handler.build({TopicPartition("c", 0): state()})
    assert handler.handle_response(ctx.session_id, ctx.error_code, [TopicPartition("c", 0)])
    assert handler.build({TopicPartition("c", 0): state()}).is_full


def test_privileged_sessions_evict_smaller_established_privileged_ones_only() -> None:
    clock = Clock()
    cache = FetchSessionCache(1, EVICTION_MS, clock)
    old = open_session(cache, 2, privileged=True)
    clock.now = 1_000
    assert open_session(cache, 10, privileged=True) == INVALID_SESSION_ID  # old is too young
    clock.now = EVICTION_MS + 1
    use(cache, old)
    assert open_session(cache, 2, privileged=True) == INVALID_SESSION_ID  # not bigger
    new = open_session(cache, 3, privileged=True)
    assert new != INVALID_SESSION_ID
    assert old not in cache


def test_a_cache_without_slots_never_opens_sessions() -> None:
    cache = FetchSessionCache(0, EVICTION_MS, Clock())
    assert open_session(cache, 3, privileged=True) == INVALID_SESSION_ID
    assert len(cache) == 0


def test_full_fetch_naming_a_session_closes_it_first() -> None:
    clock = Clock()
    cache = FetchSessionCache(1, EVICTION_MS, clock)
    first = open_session(cache, 3, privileged=False)
    ctx = cache.new_context(first, INITIAL_EPOCH, [(TopicPartition("t", 0), state())])
    assert first not in cache
    ctx.filter_response({TopicPartition("t", 0): resp_partition()})
    assert ctx.session_id not in (INVALID_SESSION_ID, first)
    assert cache.evictions == 0


# --- a state machine: the follower's view never drifts from the leader's --------------------------

ALL_TPS = [TopicPartition(t, p) for t, p in [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)]]
_machines = itertools.count()


class FetchSessionMachine(RuleBasedStateMachine):
    """A leader and a follower fetching through sessions, with losses, evictions and restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.leader = FakeLeader(max_slots=2, clock=self.clock)
        self.leader.cache._rng = random.Random(next(_machines))
        for tp in ALL_TPS:
            self.leader.partitions[tp] = LeaderPartition()
        self.follower = Follower()
        self.follower.active = list(ALL_TPS[:3])
        self.fetches = 0

    def pick(self, data: st.DataObject) -> TopicPartition:
        """A partition, mostly one the follower fetches."""
        return data.draw(st.sampled_from(self.follower.active or ALL_TPS))

    @rule(data=st.data(), n=st.integers(1, 3))
    def append(self, data: st.DataObject, n: int) -> None:
        self.leader.append(self.pick(data), n)

    @rule(data=st.data(), what=st.sampled_from(["log_start", "lso", "hw"]))
    def move_offsets(self, data: st.DataObject, what: str) -> None:
        """Move one of the values a response carries, and nothing else."""
        part = self.leader.partitions[self.pick(data)]
        if what == "log_start":
            part.log_start += 1
        elif what == "lso":
            part.lso += 1
        else:
            part.hw += 1
            part.leo = max(part.leo, part.hw)

    @rule(data=st.data())
    def toggle_error(self, data: st.DataObject) -> None:
        part = self.leader.partitions[self.pick(data)]
        part.error_code = 0 if part.error_code else 6

    @rule(active=st.lists(st.sampled_from(ALL_TPS), unique=True))
    def reassign(self, active: list[TopicPartition]) -> None:
        self.follower.active = active

    @rule(wire=st.booleans())
    def fetch(self, wire: bool) -> None:
        req = self.follower.build()
        resp = self.leader.serve(req, wire=wire)
        ok = self.follower.accept(resp)
        assert ok == (resp.error_code == 0)
        self.fetches += 1
        if ok:
            self.check_follower_knows_what_the_leader_has()

    @rule()
    def fetch_lost(self) -> None:
        req = self.follower.build()
        self.leader.serve(req)
        self.follower.handler.handle_error(TimeoutError())

    @rule()
    def duplicate_request(self) -> None:
        """The leader gets the request twice; the follower hears the second answer only."""
        req = self.follower.build()
        self.leader.serve(req)
        resp = self.leader.serve(req)
        if self.follower.accept(resp):  # a full fetch: both answers are good
            self.check_follower_knows_what_the_leader_has()

    @rule()
    def evict(self) -> None:
        self.leader.cache.remove(self.follower.handler.session_id)

    @rule()
    def consumer_session(self) -> None:
        open_session(self.leader.cache, 1, privileged=False, topic="a")

    @rule(ms=st.sampled_from([1_000, EVICTION_MS + 1]))
    def tick(self, ms: int) -> None:
        self.clock.now += ms

    @rule()
    def restart_leader(self) -> None:
        cache = FetchSessionCache(2, EVICTION_MS, self.clock, random.Random(next(_machines)))
        self.leader.cache = cache

    def check_follower_knows_what_the_leader_has(self) -> None:
        """After a successful fetch, nothing the leader changed is missing on the follower."""
        for tp in self.follower.active:
            part = self.leader.partitions[tp]
            mine = self.follower.partitions[tp]
            assert mine.error_code == part.error_code, tp
            if part.error_code:
                continue
            assert (mine.hw, mine.log_start, mine.lso) == (part.hw, part.log_start, part.lso), tp
            assert mine.fetch_offset == part.leo, tp

    @invariant()
    def cache_is_bounded(self) -> None:
        assert len(self.leader.cache) <= 2
        assert self.leader.cache.total_partitions == sum(
            len(s) for s in self.leader.cache._sessions.values()
        )


TestFetchSessionMachine = FetchSessionMachine.TestCase
TestFetchSessionMachine.settings = settings(
    max_examples=int(os.environ.get("FETCH_SESSION_MACHINE_EXAMPLES", "150")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
