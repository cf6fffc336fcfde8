"""The group coordinator: consumer group membership, as Kafka's classic group protocol
(JoinGroup, SyncGroup, Heartbeat, LeaveGroup), and the checks a commit passes (OffsetCommit,
TxnOffsetCommit) before its offsets are stored.

Every broker runs one. It coordinates the groups of the ``__consumer_offsets`` partitions it
leads; where those groups and their offsets are kept, loaded, written and expired is its
:class:`~replication.coordinator.group_metadata_manager.GroupMetadataManager`. Becoming leader
of a partition, it reads the partition back (:meth:`GroupCoordinator.load`); losing it, it
forgets them (``unload``), and clients find the new coordinator with FindCoordinator.

Membership (states as Kafka's ``GroupState``)::

    Empty --join--> PreparingRebalance --all joined--> CompletingRebalance --leader's sync--> Stable
                        ^                                                                    |
                        +----------- join / leave / session expiry / new metadata -----------+

A rebalance ends when every known member has rejoined, or at the longest rebalance timeout
(members that did not rejoin are removed). Each ends in a new generation; the leader (a member)
computes the assignment and sends it in its SyncGroup. A commit must name the current generation
and a member of it, so a zombie (a member that lost its session) cannot commit. A static member
(``group.instance.id``) that restarts takes its old place without a rebalance.

Groups of the consumer group protocol (KIP-848, ``group.protocol=consumer``) are
:attr:`GroupCoordinator.consumer`'s (:mod:`replication.coordinator.consumer_group_coordinator`);
they share the offsets, the locks and the ticker. A group id is one protocol's at a time: a
JoinGroup to a consumer group with members is refused (INCONSISTENT_GROUP_PROTOCOL), and a
ConsumerGroupHeartbeat to a classic group with members (GROUP_ID_NOT_FOUND), as in Kafka; an
empty group (offsets only) goes to whichever protocol joins it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from logstore.errors import CorruptRecordError, ReplogError
from replication.broker.partition import Partition
from replication.common import TopicPartition
from replication.coordinator.consumer_group_coordinator import (
    ConsumerGroupCoordinator,
    ConsumerHeartbeat,
    HeartbeatResult,
)
from replication.coordinator.group_metadata import (
    GroupConfig,
    GroupMetadata,
    GroupState,
    JoinRequest,
    JoinResult,
    MemberMetadata,
    OffsetAndMetadata,
)
from replication.coordinator.group_metadata_manager import (
    CommitErrors,
    GroupMetadataManager,
    OffsetsPartition,
    now_ms,
)
from replication.coordinator.snapshots import hold_all
from replication.errors import (
    CoordinatorNotAvailableError,
    CorruptFrameError,
    FencedInstanceIdError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    GroupNotEmptyError,
    GroupSubscribedToTopicError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidFieldError,
    InvalidProducerIdMappingError,
    InvalidSessionTimeoutError,
    MemberIdRequiredError,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from replication.metadata.image import MetadataImage
from replication.protocol.consumer import (
    ASSIGNMENT_VERSION,
    SUBSCRIPTION_VERSION,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    ConsumerProtocolTopicPartitions,
    decode_embedded,
    encode_embedded,
)

log = logging.getLogger(__name__)

#: a deadline the group ticker acted on and that still stands is tried again this much later
STANDING_DEADLINE_RETRY_MS = 1_000
CONSUMER_PROTOCOL_TYPE = "consumer"


class _MemberIdRequired(MemberIdRequiredError):
    """MEMBER_ID_REQUIRED with the member id the coordinator assigned (KIP-394)."""

    def __init__(self, member_id: str) -> None:
        super().__init__()
        self.member_id = member_id


@dataclass(slots=True)
class _GroupLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: holders and waiters
    users: int = 0


class GroupCoordinator:
    """Lives in every broker; coordinates the groups of the offsets partitions it leads."""

    def __init__(
        self,
        broker_id: int,
        config: GroupConfig,
        image: Callable[[], MetadataImage],
        append: Callable[[int, bytes], Awaitable[int]],
        time_ms: Callable[[], int] = now_ms,
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self._time_ms = time_ms
        #: the offsets partitions this broker leads, their groups and offsets
        self.manager = GroupMetadataManager(
            broker_id, config, image, append, time_ms, hold_groups=self._locked
        )
        self._locks: dict[str, _GroupLock] = {}
        #: the consumer group protocol's side (KIP-848)
        self.consumer = ConsumerGroupCoordinator(config, self.manager, image, self._locked, time_ms)
        # Set whenever a group's state may have moved a deadline earlier (a join, a sync, a
        # leave, a load): the ticker (server/node.py) sleeps until the next deadline or this,
        # instead of polling every 100 ms (Kafka arms a timer per member deadline the same way).
        self.changed = asyncio.Event()
        self.ticks = 0

    @property
    def partitions(self) -> dict[int, OffsetsPartition]:
        """The offsets partitions this broker leads (by index)."""
        return self.manager.partitions

    # --- becoming (and stopping being) a coordinator -----------------------------------------

    async def load(self, partition: Partition) -> None:
        """Read an offsets partition back once its leader's HW covers its log, and serve it."""
        if await self.manager.load(partition):
            self.changed.set()

    def unload(self, index: int) -> None:
        state = self.manager.unload(index)
        if state is None:
            return
        for group in state.groups.values():
            for member in group.members.values():
                _settle(member.join_waiter, JoinResult(error=NotCoordinatorError))
                _fail(member.sync_waiter, NotCoordinatorError())

    @contextlib.asynccontextmanager
    async def _locked(self, *group_ids: str, wake: bool = True) -> AsyncIterator[None]:
        """Hold the locks of ``group_ids``, in a fixed order. A group's lock lives only while
        someone holds or waits for it, so the map stays as small as the work in flight (a
        group id used once leaves nothing behind). On release it wakes the ticker (``wake``),
        since whatever was done under the lock may have moved a deadline; tick() itself
        does not, or it would wake itself forever."""
        ordered = sorted(set(group_ids))
        entries = [self._locks.setdefault(g, _GroupLock()) for g in ordered]
        for entry in entries:
            entry.users += 1
        try:
            async with hold_all([e.lock for e in entries]):
                yield
        finally:
            if wake:
                self.changed.set()
            for group_id, entry in zip(ordered, entries, strict=True):
                entry.users -= 1
                if entry.users == 0 and self._locks.get(group_id) is entry:
                    del self._locks[group_id]

    # --- JoinGroup ---------------------------------------------------------------------------

    async def join_group(self, request: JoinRequest) -> JoinResult:
        try:
            waiter = await self._join(request)
        except _MemberIdRequired as required:
            return JoinResult(error=MemberIdRequiredError, member_id=required.member_id)
        except ReplogError as err:
            return JoinResult(error=type(err))
        if isinstance(waiter, JoinResult):
            return waiter
        return await waiter

    async def _join(self, r: JoinRequest) -> JoinResult | asyncio.Future[JoinResult]:
        config = self.config
        if (
            not config.min_session_timeout_ms
            <= r.session_timeout_ms
            <= config.max_session_timeout_ms
        ):
            raise InvalidSessionTimeoutError(
                f"session.timeout.ms={r.session_timeout_ms} is outside the broker's "
                f"[{config.min_session_timeout_ms}, {config.max_session_timeout_ms}]"
            )
        if not r.protocol_type or not r.protocols:
            raise InconsistentGroupProtocolError(
                "a member must name its protocol type and protocols"
            )
        async with self._locked(r.group_id):
            group = self.manager.group(r.group_id, create=not r.member_id)
            if group is None:
                raise UnknownMemberIdError(f"group {r.group_id!r} has no member {r.member_id!r}")
            if group.is_(GroupState.DEAD):
                raise CoordinatorNotAvailableError()
            if group.consumer is not None:
                if group.consumer.members:
                    raise InconsistentGroupProtocolError(
                        f"group {r.group_id!r} is a consumer group (group.protocol=consumer) "
                        "with members; a classic member cannot join it"
                    )
                group.consumer = None  # empty: the classic protocol takes it
                group.protocol_type = None
            if not group.supports(r.protocol_type, r.protocols):
                raise InconsistentGroupProtocolError(
                    f"group {r.group_id!r} uses protocol type {group.protocol_type!r} with "
                    f"protocols {sorted(group.candidate_protocols())}"
                )
            now = self._time_ms()
            instance = r.group_instance_id
            if not r.member_id:
                if instance is not None and instance in group.static_members:
                    return self._replace_static_member(group, r, now)
                if len(group.members) + len(group.pending_members) >= config.max_size:
                    raise GroupMaxSizeReachedError()
                new_id = f"{r.client_id or 'member'}-{uuid.uuid4()}"
                if instance is not None:
                    # a static member joins at once: its id must stay its own across restarts
                    return self._await_join(group, self._add_member(group, new_id, r, now), now)
                group.pending_members.add(new_id)
                raise _MemberIdRequired(new_id)
            if r.member_id in group.pending_members:
                group.pending_members.discard(r.member_id)
                member = self._add_member(group, r.member_id, r, now)
                return self._await_join(group, member, now)
            member = self._member(group, r.member_id, instance)
            member.last_heartbeat_ms = now
            member.session_timeout_ms = r.session_timeout_ms
            member.rebalance_timeout_ms = r.rebalance_timeout_ms
            protocols = list(r.protocols)
            same = member.matches(protocols)
            if group.is_(GroupState.PREPARING_REBALANCE):
                member.protocols = protocols
                return self._await_join(group, member, now)
            if (
                group.is_(GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
                and same
                and (group.is_(GroupState.COMPLETING_REBALANCE) or r.member_id != group.leader_id)
            ):
                # it lost the response, or only rejoins: the current generation stands
                return self._join_result(group, member)
            member.protocols = protocols
            self._prepare_rebalance(group, now, f"member {r.member_id} rejoined")
            return self._await_join(group, member, now)

    def _add_member(
        self, group: GroupMetadata, member_id: str, r: JoinRequest, now: int
    ) -> MemberMetadata:
        if not group.members:
            group.protocol_type = r.protocol_type
        member = MemberMetadata(
            member_id,
            r.group_instance_id,
            r.client_id,
            r.client_host,
            r.session_timeout_ms,
            r.rebalance_timeout_ms,
            r.protocol_type,
            list(r.protocols),
            last_heartbeat_ms=now,
        )
        group.members[member_id] = member
        if r.group_instance_id is not None:
            group.static_members[r.group_instance_id] = member_id
        self._prepare_rebalance(group, now, f"member {member_id} joined")
        return member

    def _replace_static_member(
        self, group: GroupMetadata, r: JoinRequest, now: int
    ) -> JoinResult | asyncio.Future[JoinResult]:
        """A static member restarting: a new member id in its old place; the old id is fenced."""
        assert r.group_instance_id is not None
        instance = r.group_instance_id
        old = group.members.pop(group.static_members[instance])
        _settle(old.join_waiter, JoinResult(error=FencedInstanceIdError))
        _fail(old.sync_waiter, FencedInstanceIdError())
        member = MemberMetadata(
            f"{instance}-{uuid.uuid4()}",
            instance,
            r.client_id,
            r.client_host,
            r.session_timeout_ms,
            r.rebalance_timeout_ms,
            old.protocol_type,
            list(r.protocols),
            assignment=old.assignment,
            last_heartbeat_ms=now,
        )
        group.members[member.member_id] = member
        group.static_members[instance] = member.member_id
        if group.leader_id == old.member_id:
            group.leader_id = member.member_id
        if group.is_(GroupState.STABLE) and old.matches(list(r.protocols)):
            return self._join_result(group, member)  # no rebalance: it keeps its partitions
        if not group.is_(GroupState.PREPARING_REBALANCE):
            self._prepare_rebalance(group, now, f"static member {instance} rejoined")
        return self._await_join(group, member, now)

    def _member(
        self, group: GroupMetadata, member_id: str, group_instance_id: str | None
    ) -> MemberMetadata:
        if group_instance_id is not None:
            known = group.static_members.get(group_instance_id)
            if known is not None and known != member_id:
                raise FencedInstanceIdError(
                    f"group.instance.id {group_instance_id!r} now belongs to member {known}"
                )
        member = group.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(
                f"group {group.group_id!r} has no member {member_id!r}; rejoin"
            )
        return member

    def _await_join(
        self, group: GroupMetadata, member: MemberMetadata, now: int
    ) -> asyncio.Future[JoinResult]:
        _settle(member.join_waiter, JoinResult(error=RebalanceInProgressError))
        waiter: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join_waiter = waiter
        self._maybe_complete_join(group, now)  # may answer it at once
        return waiter

    def _join_result(self, group: GroupMetadata, member: MemberMetadata) -> JoinResult:
        protocol = group.protocol_name or ""
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if member.member_id == group.leader_id:
            members = tuple(
                (m.member_id, m.group_instance_id, m.metadata_for(protocol))
                for m in group.members.values()
            )
        return JoinResult(
            generation_id=group.generation_id,
            protocol_name=protocol,
            leader=group.leader_id or "",
            member_id=member.member_id,
            members=members,
        )

    # --- rebalances --------------------------------------------------------------------------

    def _prepare_rebalance(self, group: GroupMetadata, now: int, reason: str) -> None:
        if group.is_(GroupState.PREPARING_REBALANCE):
            if group.generation_id == 0 or not group.protocol_name:
                # a new group's first rebalance: each member that joins extends the initial
                # delay, up to the rebalance timeout (as Kafka's InitialDelayedJoin)
                group.rebalance_not_before_ms = min(
                    now + self.config.initial_rebalance_delay_ms, group.rebalance_deadline_ms
                )
            return
        if group.is_(GroupState.COMPLETING_REBALANCE):
            for member in group.members.values():
                _fail(member.sync_waiter, RebalanceInProgressError())
                member.sync_waiter = None
        was_empty = group.is_(GroupState.EMPTY)
        group.transition(GroupState.PREPARING_REBALANCE, now)
        longest = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        group.rebalance_deadline_ms = now + longest
        delay = self.config.initial_rebalance_delay_ms if was_empty else 0
        group.rebalance_not_before_ms = now + min(delay, longest)
        log.info("group %s: preparing rebalance (%s)", group.group_id, reason)

    def _maybe_complete_join(self, group: GroupMetadata, now: int) -> None:
        if not group.is_(GroupState.PREPARING_REBALANCE):
            return
        everyone = all(m.join_waiter is not None for m in group.members.values())
        ready = everyone and not group.pending_members and now >= group.rebalance_not_before_ms
        if not ready and now < group.rebalance_deadline_ms:
            return  # wait for the others (tick() ends it at the deadline)
        for member in [m for m in group.members.values() if m.join_waiter is None]:
            self._remove_member(group, member, now, "did not rejoin in time", rebalance=False)
        group.pending_members.clear()
        group.generation_id += 1
        if not group.members:
            group.protocol_name = group.leader_id = None
            group.transition(GroupState.EMPTY, now)
            log.info("group %s: empty at generation %d", group.group_id, group.generation_id)
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.transition(GroupState.COMPLETING_REBALANCE, now)
        log.info(
            "group %s: generation %d with %d members (protocol %s, leader %s)",
            group.group_id,
            group.generation_id,
            len(group.members),
            group.protocol_name,
            group.leader_id,
        )
        for member in group.members.values():
            _settle(member.join_waiter, self._join_result(group, member))
            member.join_waiter = None
            # A member waiting in JoinGroup does not heartbeat, and its session was not
            # running; it restarts now (Kafka's completeAndScheduleNextHeartbeatExpiration),
            # or one that joined early in a long rebalance would be expired at once, before
            # its JoinGroup answer even reached it.
            member.last_heartbeat_ms = now

    def _remove_member(
        self, group: GroupMetadata, member: MemberMetadata, now: int, why: str, *, rebalance: bool
    ) -> None:
        log.info("group %s: member %s leaves (%s)", group.group_id, member.member_id, why)
        group.members.pop(member.member_id, None)
        if member.group_instance_id is not None:
            group.static_members.pop(member.group_instance_id, None)
        _settle(member.join_waiter, JoinResult(error=UnknownMemberIdError))
        _fail(member.sync_waiter, UnknownMemberIdError())
        if not rebalance:
            return
        if group.is_(GroupState.PREPARING_REBALANCE):
            self._maybe_complete_join(group, now)
        elif group.is_(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now, f"member {member.member_id} left")
            self._maybe_complete_join(group, now)

    def next_deadline_ms(self, after: int = -1) -> int | None:
        """The earliest time later than ``after`` at which tick() has something to do: a
        session running out, a rebalance's initial delay or timeout, an empty group's offsets
        expiring; None if nothing is timed. Heartbeats only move deadlines later, so a ticker
        asleep until an older deadline wakes at worst early, finds nothing and sleeps again.
        The ticker passes the time of its last tick as ``after``: a deadline that tick already
        saw and left standing (a rebalance past its initial delay still waiting for members,
        an offsets expiry whose write failed, a tick that raised) must not make it tick again
        at once, in a loop that would never yield to the event loop; nor may it be dropped,
        or a failed expiry would wait for unrelated traffic (an idle broker has none): it
        comes back :data:`STANDING_DEADLINE_RETRY_MS` after that tick."""
        deadline: int | None = None

        def earliest(at: int) -> None:
            nonlocal deadline
            if at <= after:
                at = after + STANDING_DEADLINE_RETRY_MS
            deadline = at if deadline is None else min(deadline, at)

        for state in self.partitions.values():
            if not state.loaded:
                continue
            for group in state.groups.values():
                for member in group.members.values():
                    if member.join_waiter is None and member.sync_waiter is None:
                        earliest(member.last_heartbeat_ms + member.session_timeout_ms + 1)
                if group.is_(GroupState.PREPARING_REBALANCE):
                    earliest(group.rebalance_not_before_ms)
                    earliest(group.rebalance_deadline_ms)
                elif group.is_(GroupState.EMPTY):
                    earliest(group.state_since_ms + self.config.offsets_retention_ms)
                if (at := self.consumer.deadline_ms(group)) is not None:
                    earliest(at)
        return deadline

    def now_ms(self) -> int:
        """The coordinator's clock (deadlines are in it)."""
        return self._time_ms()

    def busy(self) -> bool:
        """Whether any group has members (the ticker then also wakes at a backstop interval,
        in case a waiter ended without a lock being taken, e.g. a dropped connection)."""
        return any(
            group.members or (group.consumer is not None and group.consumer.members)
            for state in self.partitions.values()
            if state.loaded
            for group in state.groups.values()
        )

    async def tick(self) -> int:
        """Expire members whose session ran out, and end rebalances that reached their time.
        Returns the time it acted at (the ``after`` of next_deadline_ms)."""
        self.ticks += 1
        now = self._time_ms()
        for state in list(self.partitions.values()):
            if not state.loaded:
                continue
            for group in list(state.groups.values()):
                async with self._locked(group.group_id, wake=False):
                    for member in list(group.members.values()):
                        busy = member.join_waiter is not None or member.sync_waiter is not None
                        if not busy and now - member.last_heartbeat_ms > member.session_timeout_ms:
                            self._remove_member(
                                group, member, now, "session timed out", rebalance=True
                            )
                    self._maybe_complete_join(group, now)
                    self.consumer.expire(group, now)
                    await self.manager.expire_offsets(state, group, now)
        return now

    # --- ConsumerGroupHeartbeat (KIP-848) ---------------------------------------------------

    async def consumer_group_heartbeat(self, request: ConsumerHeartbeat) -> HeartbeatResult:
        """A consumer-protocol member's heartbeat (raises the error of its answer)."""
        return await self.consumer.heartbeat(request)

    # --- SyncGroup, Heartbeat, LeaveGroup ----------------------------------------------------

    async def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        assignments: Mapping[str, bytes],
    ) -> bytes:
        """The member's assignment once the leader has sent them all (raises on errors)."""
        async with self._locked(group_id):
            group = self.manager.group(group_id)
            if group is None:
                raise UnknownMemberIdError(f"group {group_id!r} does not exist; rejoin")
            member = self._member(group, member_id, group_instance_id)
            if generation_id != group.generation_id:
                raise IllegalGenerationError(
                    f"generation {generation_id} is not group {group_id!r}'s {group.generation_id}"
                )
            if group.is_(GroupState.EMPTY, GroupState.DEAD):
                raise UnknownMemberIdError()
            if group.is_(GroupState.PREPARING_REBALANCE):
                raise RebalanceInProgressError()
            member.last_heartbeat_ms = self._time_ms()
            if group.is_(GroupState.STABLE):
                return member.assignment
            waiter: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            member.sync_waiter = waiter
            if member_id == group.leader_id:
                await self._complete_sync(group, assignments)
        return await waiter

    async def _complete_sync(self, group: GroupMetadata, assignments: Mapping[str, bytes]) -> None:
        for member in group.members.values():
            member.assignment = bytes(assignments.get(member.member_id, b""))
        generation = group.generation_id
        try:
            await self.manager.store_group(group)
        except ReplogError as err:
            log.warning(
                "group %s: storing generation %d failed: %s", group.group_id, generation, err
            )
            for member in group.members.values():
                member.assignment = b""
                _fail(member.sync_waiter, CoordinatorNotAvailableError())
                member.sync_waiter = None
            self._prepare_rebalance(group, self._time_ms(), "its assignment could not be stored")
            return
        if not group.is_(GroupState.COMPLETING_REBALANCE) or group.generation_id != generation:
            return  # a rebalance began meanwhile; its syncs were answered
        now = self._time_ms()
        group.transition(GroupState.STABLE, now)
        for member in group.members.values():
            _settle(member.sync_waiter, member.assignment)
            member.sync_waiter = None
            # as at the end of a join: a member that waited in SyncGroup for the leader did
            # not heartbeat meanwhile, so its session starts again from its assignment
            member.last_heartbeat_ms = now

    async def heartbeat(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> None:
        # A heartbeat only moves its member's deadline later, so it does not wake the ticker
        # (which would then look over every member of every group, per heartbeat).
        async with self._locked(group_id, wake=False):
            group = self.manager.group(group_id)
            if group is None or group.is_(GroupState.EMPTY):
                raise UnknownMemberIdError(f"group {group_id!r} has no member {member_id!r}")
            if group.is_(GroupState.DEAD):
                raise CoordinatorNotAvailableError()
            member = self._member(group, member_id, group_instance_id)
            if generation_id != group.generation_id:
                raise IllegalGenerationError(
                    f"generation {generation_id} is not group {group_id!r}'s {group.generation_id}"
                )
            member.last_heartbeat_ms = self._time_ms()
            if group.is_(GroupState.PREPARING_REBALANCE):
                raise RebalanceInProgressError()

    async def leave_group(
        self, group_id: str, members: Iterable[tuple[str, str | None]]
    ) -> list[type[ReplogError] | None]:
        """Remove each (member id, instance id); one error class (or None) per member."""
        async with self._locked(group_id):
            group = self.manager.group(group_id)
            if group is None:
                raise UnknownMemberIdError(f"group {group_id!r} does not exist")
            results: list[type[ReplogError] | None] = []
            now = self._time_ms()
            for member_id, instance_id in members:
                if instance_id is not None and not member_id:
                    member_id = group.static_members.get(instance_id, "")
                try:
                    member = self._member(group, member_id, instance_id)
                except ReplogError as err:
                    results.append(type(err))
                    continue
                self._remove_member(group, member, now, "left the group", rebalance=True)
                results.append(None)
            return results

    # --- offsets -----------------------------------------------------------------------------

    async def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> CommitErrors:
        """Store the offsets (acks=all) and answer per partition; raises for the whole group."""
        async with self._locked(group_id):
            group = self.manager.group(group_id, create=generation_id < 0)
            if group is None:
                raise IllegalGenerationError(f"group {group_id!r} does not exist; rejoin")
            if group.consumer is not None:
                self.consumer.check_commit(group, member_id, generation_id)
                return await self.manager.store_offsets(group, offsets, None)
            self._check_commit(group, generation_id, member_id, group_instance_id)
            return await self.manager.store_offsets(group, offsets, self._owned(group, member_id))

    async def commit_txn_offsets(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> CommitErrors:
        """Offsets committed inside the producer's transaction: written to the offsets log as
        part of it, visible when its COMMIT marker reaches this partition (:meth:`complete_txn`),
        dropped on ABORT. A member and generation, when given, are checked as for a commit
        (KIP-447): a zombie's transaction cannot commit offsets either."""
        if producer_id < 0 or producer_epoch < 0:
            # only a transactional producer (InitProducerId) commits offsets in a transaction
            raise InvalidProducerIdMappingError(
                f"TxnOffsetCommit for group {group_id!r} with producer id {producer_id} and "
                f"epoch {producer_epoch}: call InitProducerId (init_transactions()) first"
            )
        async with self._locked(group_id):
            group = self.manager.group(group_id, create=True)
            assert group is not None
            if group.consumer is not None and (generation_id >= 0 or member_id):
                self.consumer.check_commit(group, member_id, generation_id)
            elif generation_id >= 0 or member_id:
                self._check_commit(group, generation_id, member_id, group_instance_id)
            return await self.manager.store_offsets(
                group, offsets, None, producer_id=producer_id, producer_epoch=producer_epoch
            )

    def complete_txn(self, index: int, producer_id: int, commit: bool) -> None:
        """The transaction's marker was written to offsets partition ``index``: apply its
        offsets (COMMIT) or drop them (ABORT)."""
        self.manager.complete_txn(index, producer_id, commit)

    def _check_commit(
        self, group: GroupMetadata, generation_id: int, member_id: str, instance_id: str | None
    ) -> None:
        if group.is_(GroupState.DEAD):
            raise CoordinatorNotAvailableError()
        if generation_id < 0 and group.is_(GroupState.EMPTY):
            return  # a consumer outside the group (assign()), or an admin tool
        member = self._member(group, member_id, instance_id)
        if generation_id != group.generation_id:
            raise IllegalGenerationError(
                f"generation {generation_id} is not group {group.group_id!r}'s "
                f"{group.generation_id}: member {member.member_id} was part of an older one"
            )
        if group.is_(GroupState.COMPLETING_REBALANCE):
            raise RebalanceInProgressError()
        member.last_heartbeat_ms = self._time_ms()

    @staticmethod
    def _owned(group: GroupMetadata, member_id: str) -> set[TopicPartition] | None:
        """The partitions assigned to a consumer member (None: not a consumer, or no check)."""
        member = group.members.get(member_id)
        if member is None or group.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        try:
            return decode_consumer_assignment(member.assignment)
        except CorruptRecordError:
            return None

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        return self.manager.fetch_offsets(group_id, partitions)

    def unstable(self, group_id: str) -> set[TopicPartition]:
        """Partitions of the group with offsets in a transaction that has not ended: a
        read_committed consumer asks with ``require_stable`` and waits for them (KIP-447), or
        it could start before what an open transaction will commit."""
        return self.manager.unstable(group_id)

    # --- listing, describing, deleting -------------------------------------------------------

    def list_groups(self) -> list[GroupMetadata]:
        return self.manager.groups()

    def describe_group(self, group_id: str) -> GroupMetadata | None:
        return self.manager.group(group_id)

    async def delete_group(self, group_id: str) -> None:
        async with self._locked(group_id):
            state = self.manager.partition(group_id)
            group = state.groups.get(group_id)
            if group is None or group.is_(GroupState.DEAD):
                raise GroupIdNotFoundError(f"no group {group_id!r}")
            if not group.is_(GroupState.EMPTY):
                members = len(group.consumer.members) if group.consumer else len(group.members)
                raise GroupNotEmptyError(
                    f"group {group_id!r} has {members} members; stop them first"
                )
            await self.manager.remove_group(state, group, self._time_ms())

    async def delete_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, type[ReplogError] | None]:
        """Kafka's OffsetDelete: tombstones of the group's offsets of ``partitions``, one
        error class (or None) per partition. A group with members keeps the offsets of the
        topics they subscribe to (GROUP_SUBSCRIBED_TO_TOPIC); one with members of another
        protocol than Kafka's consumer protocol keeps all (NON_EMPTY_GROUP, for the whole
        request), as Kafka's ClassicGroup.validateOffsetDelete."""
        async with self._locked(group_id):
            group = self.manager.group(group_id)
            if group is None or group.is_(GroupState.DEAD):
                raise GroupIdNotFoundError(f"no group {group_id!r}")
            consumer = group.protocol_type == CONSUMER_PROTOCOL_TYPE
            if not group.is_(GroupState.EMPTY) and not consumer:
                raise GroupNotEmptyError(
                    f"group {group_id!r} has {len(group.members)} members of protocol type "
                    f"{group.protocol_type!r}; stop them first"
                )
            subscribed = _subscribed_topics(group)
            results: dict[TopicPartition, type[ReplogError] | None] = {}
            for tp in partitions:
                held = tp.topic in subscribed if subscribed is not None else consumer
                results[tp] = GroupSubscribedToTopicError if held else None
            await self.manager.delete_offsets(group, [tp for tp, e in results.items() if not e])
            return results

    async def stop(self) -> None:
        await self.manager.stop()


def _subscribed_topics(group: GroupMetadata) -> set[str] | None:
    """The topics a consumer group's members subscribe to (none while it has no members);
    None when that is not known: another protocol type, or a subscription that does not
    parse (Kafka's ClassicGroup.computeSubscribedTopics)."""
    if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return None
    if not group.members:
        return set()
    if not group.protocol_name:
        return None
    topics: set[str] = set()
    for member in group.members.values():
        try:
            _, subscription = decode_embedded(
                ConsumerProtocolSubscription,
                SUBSCRIPTION_VERSION,
                member.metadata_for(group.protocol_name),
            )
        except (CorruptFrameError, InvalidFieldError):
            return None
        topics.update(subscription.topics)
    return topics


# --- Kafka's ConsumerProtocol assignment ------------------------------------------------------


def decode_consumer_assignment(data: bytes) -> set[TopicPartition]:
    """The partitions of a ConsumerProtocolAssignment; CorruptRecordError if it is not one."""
    try:
        _, assignment = decode_embedded(ConsumerProtocolAssignment, ASSIGNMENT_VERSION, data)
    except (CorruptFrameError, InvalidFieldError) as err:
        raise CorruptRecordError(f"not a consumer protocol assignment: {err}") from err
    return {
        TopicPartition(t.topic, i) for t in assignment.assigned_partitions for i in t.partitions
    }


def encode_consumer_assignment(partitions: Iterable[TopicPartition], version: int = 0) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    assignment = ConsumerProtocolAssignment(
        assigned_partitions=[
            ConsumerProtocolTopicPartitions(topic=t, partitions=sorted(ps))
            for t, ps in sorted(by_topic.items())
        ]
    )
    return encode_embedded(assignment, version)


def _settle(waiter: asyncio.Future[Any] | None, value: Any) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(value)


def _fail(waiter: asyncio.Future[Any] | None, error: BaseException) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_exception(error)


__all__ = [
    "CONSUMER_PROTOCOL_TYPE",
    "STANDING_DEADLINE_RETRY_MS",
    "GroupCoordinator",
    "decode_consumer_assignment",
    "encode_consumer_assignment",
]
