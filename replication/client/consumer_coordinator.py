"""A consumer's side of its group (Kafka's ConsumerCoordinator): joining, the leader's
assignment, heartbeats, committed offsets.

The consumer's thread drives membership from ``poll()``: when the group needs a (re)join, it
sends JoinGroup (again with the member id MEMBER_ID_REQUIRED hands out), the leader computes
the assignment with the first assignor every member supports and sends it in SyncGroup, and
every member learns its partitions from SyncGroup's answer. A heartbeat thread keeps the
session alive between polls, on a connection of its own so it never waits behind a JoinGroup;
it learns of rebalances (REBALANCE_IN_PROGRESS) and of losing membership (UNKNOWN_MEMBER_ID,
ILLEGAL_GENERATION, FENCED_INSTANCE_ID), and leaves the group when the consumer has not polled
for max.poll.interval.ms.

Eager assignors (range, roundrobin) revoke every partition before rejoining; the
cooperative-sticky assignor revokes only what moves, after the rebalance, and rejoins once
more so the partitions it gave up reach their new owner (KIP-429). The rebalance listener's
``on_partitions_revoked`` runs before partitions are given up, where a consumer commits what
it has processed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

from replication.client.assignors import ASSIGNORS, Assignor, Subscription
from replication.client.cluster import Cluster
from replication.client.config import ConsumerConfig
from replication.client.coordinator import COORDINATOR_SLOT, CoordinatorClient
from replication.client.retry import RetryPolicy, call_with_retries
from replication.client.types import OffsetAndMetadata
from replication.common import TopicPartition
from replication.errors import (
    BrokerNotAvailableError,
    BrokerUnreachableError,
    CommitFailedError,
    CoordinatorNotAvailableError,
    FencedInstanceIdError,
    IllegalGenerationError,
    MemberIdRequiredError,
    NetworkError,
    NotCoordinatorError,
    RebalanceInProgressError,
    ReplogError,
    RequestTimedOutError,
    UnknownMemberIdError,
    for_code,
)
from replication.protocol import (
    GROUP_KEY_TYPE,
    ApiKey,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    LeaveGroupRequest,
    MemberIdentity,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetFetchRequest,
    OffsetFetchRequestTopic,
    SyncGroupRequest,
    SyncGroupRequestAssignment,
)
from replication.protocol.consumer import (
    ASSIGNMENT_VERSION,
    SUBSCRIPTION_VERSION,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    ConsumerProtocolTopicPartitions,
    decode_embedded,
    encode_embedded,
)

__all__ = ["ConsumerCoordinator", "ConsumerRebalanceListener", "OffsetAndMetadata"]

log = logging.getLogger(__name__)

_GROUP_SLOT: Final = COORDINATOR_SLOT + 1
_HEARTBEAT_SLOT: Final = COORDINATOR_SLOT + 2
#: coordinator errors after which the coordinator is found again and the request resent
_FIND_AGAIN: Final = (
    NotCoordinatorError,
    CoordinatorNotAvailableError,
    BrokerUnreachableError,
    BrokerNotAvailableError,
    NetworkError,
    RequestTimedOutError,
)
#: errors that mean this member is no longer (this generation of) the group
_MEMBERSHIP_LOST: Final = (UnknownMemberIdError, IllegalGenerationError, FencedInstanceIdError)


class ConsumerRebalanceListener(Protocol):
    """Called in poll() around rebalances (Kafka's ConsumerRebalanceListener)."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...


def _by_topic(partitions: Iterable[TopicPartition]) -> list[ConsumerProtocolTopicPartitions]:
    topics: dict[str, list[int]] = {}
    for tp in partitions:
        topics.setdefault(tp.topic, []).append(tp.partition)
    return [
        ConsumerProtocolTopicPartitions(topic=t, partitions=sorted(ps))
        for t, ps in sorted(topics.items())
    ]


class ConsumerCoordinator:
    """Membership of one consumer in its group, and the group's committed offsets."""

    def __init__(
        self,
        cluster: Cluster,
        config: ConsumerConfig,
        *,
        subscribed_topics: Callable[[], set[str]],
        on_assignment: Callable[[set[TopicPartition]], None],
        positions: Callable[[], dict[TopicPartition, int]],
    ) -> None:
        assert config.group_id is not None
        self.cluster = cluster
        self.config = config
        self.group_id = config.group_id
        self._subscribed_topics = subscribed_topics
        self._on_assignment = on_assignment
        self._positions = positions
        self._client = CoordinatorClient(
            cluster, self.group_id, key_type=GROUP_KEY_TYPE, slot=_GROUP_SLOT
        )
        self._heartbeat_client = self._client.with_slot(_HEARTBEAT_SLOT)
        self.assignors: list[Assignor] = [ASSIGNORS[n]() for n in config.assignment_strategies]
        self.listener: ConsumerRebalanceListener | None = None
        self._lock = threading.Lock()
        self.member_id = ""
        self.generation_id = -1
        self.protocol: str | None = None
        self.assignment: set[TopicPartition] = set()
        self._rejoin_needed = True
        self._last_poll = time.monotonic()
        self._next_auto_commit = time.monotonic() + config.auto_commit_interval_ms / 1000
        self._closed = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return (
            f"ConsumerCoordinator({self.group_id!r}, member={self.member_id!r}, "
            f"generation={self.generation_id})"
        )

    # --- driven by poll() ---------------------------------------------------------------------

    def poll(self, timeout_ms: int) -> None:
        """Rejoin if the group needs it, and auto-commit when due. Called by Consumer.poll.

        A coordinator that is moving or unreachable does not fail poll(): the rejoin is tried
        again at the next poll, as Kafka's consumer does (its partitions wait meanwhile)."""
        self._last_poll = time.monotonic()
        if self.config.enable_auto_commit and time.monotonic() >= self._next_auto_commit:
            self._auto_commit()
        if self.need_rejoin():
            try:
                self.join(max(timeout_ms, self.config.request_timeout_ms))
            except ReplogError as err:
                if not self.cluster.retriable(err):
                    raise
                log.warning("group %s: joining failed (%s); poll() tries again", self.group_id, err)

    def stand_alone(self) -> None:
        """Commit and fetch offsets only, never join: for a consumer that assign()s its own
        partitions (its commits carry generation -1, as Kafka's)."""
        with self._lock:
            self._rejoin_needed = False

    def need_rejoin(self) -> bool:
        with self._lock:
            return self._rejoin_needed

    def request_rejoin(self, why: str) -> None:
        with self._lock:
            if not self._rejoin_needed:
                log.info("group %s: rejoining (%s)", self.group_id, why)
            self._rejoin_needed = True

    def join(self, timeout_ms: int) -> None:
        """Join (or rejoin) the group and take the assignment of its new generation."""
        eager = not self._cooperative()
        if eager and self.assignment:
            self._revoke(set(self.assignment))
        # each round (JoinGroup, then SyncGroup) may wait up to the rebalance timeout
        budget = timeout_ms / 1000 + self.config.max_poll_interval_ms / 1000
        while True:
            joined = self._join_once(time.monotonic() + budget)
            if joined is None:
                continue
            assignment = self._sync(joined, time.monotonic() + budget)
            if assignment is not None:
                break
        with self._lock:
            self._rejoin_needed = False
        old = set(self.assignment)
        revoked = old - assignment
        if revoked:
            self._revoke(revoked)
        self.assignment = set(assignment)
        self._on_assignment(set(assignment))
        added = assignment - old if not eager else set(assignment)
        if self.listener is not None:
            self.listener.on_partitions_assigned(added)
        if revoked and not eager:
            self.request_rejoin("gave up partitions another member is to own")
        self._start_heartbeats()

    def _cooperative(self) -> bool:
        chosen = next((a for a in self.assignors if a.name == self.protocol), self.assignors[0])
        return chosen.cooperative

    def _revoke(self, revoked: set[TopicPartition]) -> None:
        if self.config.enable_auto_commit and self.generation_id >= 0:
            try:
                self.commit(
                    {
                        tp: OffsetAndMetadata(o)
                        for tp, o in self._positions().items()
                        if tp in revoked
                    }
                )
            except ReplogError as err:
                log.warning("group %s: commit before revoking failed: %s", self.group_id, err)
        if self.listener is not None:
            self.listener.on_partitions_revoked(set(revoked))
        self.assignment -= revoked
        self._on_assignment(set(self.assignment))

    def _join_once(self, deadline: float) -> tuple[Any, dict[str, Subscription]] | None:
        topics = sorted(self._subscribed_topics())
        subscription = ConsumerProtocolSubscription(
            topics=topics,
            owned_partitions=_by_topic(self.assignment),
            generation_id=self.generation_id,
        )
        metadata = encode_embedded(subscription, SUBSCRIPTION_VERSION)
        request = JoinGroupRequest(
            group_id=self.group_id,
            session_timeout_ms=self.config.session_timeout_ms,
            rebalance_timeout_ms=self.config.max_poll_interval_ms,
            member_id=self.member_id,
            group_instance_id=self.config.group_instance_id,
            protocols=[
                JoinGroupRequestProtocol(name=a.name, metadata=metadata) for a in self.assignors
            ],
        )
        response = self._send(
            ApiKey.JOIN_GROUP,
            request,
            what=f"joining group {self.group_id!r}",
            deadline=deadline,
            wait_ms=self.config.max_poll_interval_ms,
        )
        error = for_code(response.error_code)
        if error is MemberIdRequiredError:
            self.member_id = response.member_id
            return None
        if error is UnknownMemberIdError:
            self.member_id = ""
            return None
        if error is RebalanceInProgressError:
            return None
        if error is not None:
            raise error(f"joining group {self.group_id!r}: {error()}")
        self.member_id = response.member_id
        self.generation_id = response.generation_id
        self.protocol = response.protocol_name
        members: dict[str, Subscription] = {}
        for member in response.members:
            _, sub = decode_embedded(
                ConsumerProtocolSubscription, SUBSCRIPTION_VERSION, member.metadata
            )
            owned = frozenset(
                TopicPartition(t.topic, p) for t in sub.owned_partitions for p in t.partitions
            )
            members[member.member_id] = Subscription(tuple(sub.topics), owned, sub.generation_id)
        log.info(
            "group %s: joined generation %d as %s%s",
            self.group_id,
            self.generation_id,
            self.member_id,
            " (leader)" if response.leader == self.member_id else "",
        )
        return response, members

    def _sync(
        self, joined: tuple[Any, dict[str, Subscription]], deadline: float
    ) -> set[TopicPartition] | None:
        response, members = joined
        assignments: list[SyncGroupRequestAssignment] = []
        if response.leader == self.member_id:
            assignments = self._assign(response.protocol_name, members)
        sync = self._send(
            ApiKey.SYNC_GROUP,
            SyncGroupRequest(
                group_id=self.group_id,
                generation_id=self.generation_id,
                member_id=self.member_id,
                group_instance_id=self.config.group_instance_id,
                assignments=assignments,
            ),
            what=f"syncing group {self.group_id!r}",
            deadline=deadline,
            wait_ms=self.config.max_poll_interval_ms,
        )
        error = for_code(sync.error_code)
        if error is RebalanceInProgressError:
            return None
        if error in _MEMBERSHIP_LOST:
            self._reset_generation(error is not IllegalGenerationError)
            return None
        if error is not None:
            raise error(f"syncing group {self.group_id!r}: {error()}")
        if not bytes(sync.assignment):
            return set()
        _, assignment = decode_embedded(
            ConsumerProtocolAssignment, ASSIGNMENT_VERSION, sync.assignment
        )
        return {
            TopicPartition(t.topic, p) for t in assignment.assigned_partitions for p in t.partitions
        }

    def _assign(
        self, protocol: str, members: dict[str, Subscription]
    ) -> list[SyncGroupRequestAssignment]:
        assignor = next(a for a in self.assignors if a.name == protocol)
        topics = {t for s in members.values() for t in s.topics}
        self.cluster.add_interest(topics)
        self.cluster.refresh(topics=sorted(topics))
        snapshot = self.cluster.snapshot
        counts = {
            t: len(info.partitions)
            for t, info in snapshot.topics.items()
            if t in topics and info.error_code == 0
        }
        result = assignor.assign(counts, members)
        log.info("group %s: assigned %s with %s", self.group_id, counts, assignor.name)
        return [
            SyncGroupRequestAssignment(
                member_id=member,
                assignment=encode_embedded(
                    ConsumerProtocolAssignment(assigned_partitions=_by_topic(parts)),
                    ASSIGNMENT_VERSION,
                ),
            )
            for member, parts in result.items()
        ]

    def _reset_generation(self, forget_member: bool) -> None:
        with self._lock:
            self.generation_id = -1
            if forget_member:
                self.member_id = ""
            self._rejoin_needed = True

    # --- requests -------------------------------------------------------------------------

    def _send(
        self,
        api_key: ApiKey,
        request: Any,
        *,
        what: str,
        deadline: float,
        wait_ms: int = 0,
        client: CoordinatorClient | None = None,
    ) -> Any:
        """Send to the group coordinator (found again while it moves); the caller reads the
        response's errors."""
        return (client or self._client).request(
            api_key, request, what=what, deadline=deadline, wait_ms=wait_ms
        )

    # --- heartbeats ---------------------------------------------------------------------------

    def _start_heartbeats(self) -> None:
        if self._heartbeat_thread is not None and self._heartbeat_thread.is_alive():
            return
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"replog-heartbeat-{self.group_id}", daemon=True
        )
        self._heartbeat_thread.start()

    def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        while not self._closed.wait(interval):
            with self._lock:
                member, generation, rejoining = (
                    self.member_id,
                    self.generation_id,
                    self._rejoin_needed,
                )
            if generation < 0 or rejoining:
                continue
            if time.monotonic() - self._last_poll > self.config.max_poll_interval_ms / 1000:
                log.warning(
                    "group %s: poll() was not called for max.poll.interval.ms=%d; leaving the "
                    "group (its partitions go to the other members)",
                    self.group_id,
                    self.config.max_poll_interval_ms,
                )
                self._leave("max.poll.interval.ms passed without a poll()")
                continue
            try:
                response = self._send(
                    ApiKey.HEARTBEAT,
                    HeartbeatRequest(
                        group_id=self.group_id,
                        generation_id=generation,
                        member_id=member,
                        group_instance_id=self.config.group_instance_id,
                    ),
                    what=f"heartbeat to group {self.group_id!r}",
                    deadline=time.monotonic() + self.config.session_timeout_ms / 1000,
                    client=self._heartbeat_client,
                )
            except ReplogError as err:
                log.warning("group %s: heartbeat failed: %s", self.group_id, err)
                continue
            error = for_code(response.error_code)
            if error is RebalanceInProgressError:
                self.request_rejoin("the group is rebalancing")
            elif error in _MEMBERSHIP_LOST:
                log.warning("group %s: membership lost (%s)", self.group_id, error.__name__)
                self._reset_generation(error is not IllegalGenerationError)

    # --- offsets ------------------------------------------------------------------------------

    def commit(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout_ms: int | None = None
    ) -> None:
        """Commit ``offsets`` for the group; CommitFailedError if this member lost its
        partitions (a rebalance happened: the offsets may belong to another member now)."""
        if not offsets:
            return
        by_topic: dict[str, list[OffsetCommitRequestPartition]] = {}
        for tp, value in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append(
                OffsetCommitRequestPartition(
                    partition_index=tp.partition,
                    committed_offset=value.offset,
                    committed_metadata=value.metadata,
                )
            )
        with self._lock:
            generation, member = self.generation_id, self.member_id
        request = OffsetCommitRequest(
            group_id=self.group_id,
            generation_id=generation,
            member_id=member if generation >= 0 else "",
            group_instance_id=self.config.group_instance_id if generation >= 0 else None,
            topics=[OffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
        )
        timeout = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + timeout / 1000
        what = f"committing offsets of group {self.group_id!r}"

        def attempt() -> None:
            response = self._send(ApiKey.OFFSET_COMMIT, request, what=what, deadline=deadline)
            for topic in response.topics:
                for part in topic.partitions:
                    self._check_commit_error(
                        for_code(part.error_code), f"{topic.name}-{part.partition_index}"
                    )

        # A coordinator that could not store the offsets (its log refused the write, it is
        # moving) answers per partition: find it again and commit again, as Kafka's client.
        call_with_retries(
            what,
            attempt,
            RetryPolicy.of(self.config, None),
            retriable=self.cluster.retriable,
            deadline=deadline,
        )

    def _check_commit_error(self, error: type[ReplogError] | None, where: str) -> None:
        if error is None:
            return
        if error in (*_MEMBERSHIP_LOST, RebalanceInProgressError):
            if error is not RebalanceInProgressError:
                self._reset_generation(error is not IllegalGenerationError)
            else:
                self.request_rejoin("the group is rebalancing")
            raise CommitFailedError(
                f"committing {where} for group {self.group_id!r} failed: "
                f"{error.__name__} (the group rebalanced; its partitions may have "
                "moved to another member): poll() again to rejoin"
            )
        if issubclass(error, NotCoordinatorError | CoordinatorNotAvailableError):
            self._client.forget()
        raise error(f"committing {where} for group {self.group_id!r}: {error()}")

    def _auto_commit(self) -> None:
        self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_ms / 1000
        if self.generation_id < 0:
            return
        offsets = {
            tp: OffsetAndMetadata(o) for tp, o in self._positions().items() if tp in self.assignment
        }
        try:
            self.commit(offsets)
        except ReplogError as err:
            log.warning("group %s: auto-commit failed: %s", self.group_id, err)

    def committed(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offset of each partition (None where there is none).

        With read_committed, offsets a transaction has committed but not finished are waited
        for (``require_stable``, KIP-447): starting before them would read records that
        transaction is about to account for."""
        tps = list(partitions)
        topics: dict[str, list[int]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(tp.partition)
        timeout = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + timeout / 1000
        what = f"fetching committed offsets of group {self.group_id!r}"
        request = OffsetFetchRequest(
            group_id=self.group_id,
            topics=[
                OffsetFetchRequestTopic(name=t, partition_indexes=ps) for t, ps in topics.items()
            ],
            require_stable=self.config.read_committed,
        )

        def attempt() -> dict[TopicPartition, OffsetAndMetadata | None]:
            response = self._send(ApiKey.OFFSET_FETCH, request, what=what, deadline=deadline)
            if response.error_code:
                error = for_code(response.error_code) or ReplogError
                raise error(f"{what}: {error()}")
            found: dict[TopicPartition, OffsetAndMetadata | None] = dict.fromkeys(tps)
            for topic in response.topics:
                for part in topic.partitions:
                    tp = TopicPartition(topic.name, part.partition_index)
                    failed = for_code(part.error_code)
                    if failed is not None:
                        raise failed(f"{what}: {tp}: {failed()}")
                    if part.committed_offset >= 0:
                        found[tp] = OffsetAndMetadata(part.committed_offset, part.metadata)
            return found

        return call_with_retries(
            what,
            attempt,
            RetryPolicy.of(self.config, None),
            retriable=self.cluster.retriable,
            deadline=deadline,
        )

    # --- leaving ------------------------------------------------------------------------------

    def _leave(self, why: str) -> None:
        with self._lock:
            member, generation = self.member_id, self.generation_id
            self.generation_id = -1
            self._rejoin_needed = True
        if not member or generation < 0 or self.config.group_instance_id is not None:
            return  # a static member keeps its place: its session expiry frees it
        try:
            self._send(
                ApiKey.LEAVE_GROUP,
                LeaveGroupRequest(
                    group_id=self.group_id, members=[MemberIdentity(member_id=member)]
                ),
                what=f"leaving group {self.group_id!r}",
                deadline=time.monotonic() + self.config.request_timeout_ms / 1000,
                client=self._heartbeat_client,
            )
            log.info("group %s: %s left (%s)", self.group_id, member, why)
        except ReplogError as err:
            log.warning(
                "group %s: leaving failed (%s); its session will expire", self.group_id, err
            )

    def close(self, *, commit: bool = True) -> None:
        """Commit (with auto-commit), revoke, leave the group, stop heartbeating."""
        if self._closed.is_set():
            return
        if commit and self.config.enable_auto_commit:
            self._auto_commit()
        if self.assignment and self.listener is not None:
            try:
                self.listener.on_partitions_revoked(set(self.assignment))
            except Exception:
                log.exception("group %s: on_partitions_revoked raised on close", self.group_id)
        self._closed.set()
        self._leave("the consumer closed")
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=self.config.request_timeout_ms / 1000)
