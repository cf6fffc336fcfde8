"""The group coordinator: consumer group membership and committed offsets, as Kafka's classic
group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch).

Every broker runs one. Groups live on the internal topic ``__consumer_offsets``, partitioned
by group id (Kafka's ``abs(groupId.hashCode) % offsets.topic.num.partitions``); a broker
coordinates the groups of the partitions it leads. Becoming leader of a partition, it reads the
partition back (:meth:`GroupCoordinator.load`); losing it, it forgets them (``unload``), and
clients find the new coordinator with FindCoordinator.

Membership (states as Kafka's ``GroupState``)::

    Empty --join--> PreparingRebalance --all joined--> CompletingRebalance --leader's sync--> Stable
                        ^                                                                    |
                        +----------- join / leave / session expiry / new metadata -----------+

A rebalance ends when every known member has rejoined, or at the longest rebalance timeout
(members that did not rejoin are removed). Each ends in a new generation; the leader (a member)
computes the assignment and sends it in its SyncGroup. A commit must name the current generation
and a member of it, so a zombie (a member that lost its session) cannot commit. A static member
(``group.instance.id``) that restarts takes its old place without a rebalance.

What is on the log, one record per key (the newest wins; a null value deletes)::

    key ``offset\\0<group>\\0<topic>\\0<partition>``  value: JSON offset, leader epoch, metadata
    key ``group\\0<group>``                          value: JSON generation, protocol, members

Both values carry ``format_version``. A group is written once its assignment is known (the
leader's SyncGroup), and offsets are written before a commit is answered, acks=all: a
coordinator that takes over knows every acknowledged commit.

Where replog differs from Kafka, and why: Kafka compacts ``__consumer_offsets``; replog's logs
are objects that are never rewritten. Instead, once a partition has taken
:data:`SNAPSHOT_MIN_RECORDS` records (and at least twice its live keys) since its last snapshot,
the coordinator appends a snapshot (one record per live key: every group and committed offset)
and moves the log start to it (DeleteRecords; followers follow the leader's log start). So a
partition holds its live state plus what came after the last snapshot, and a load reads no
more. A snapshot waits while a transaction has offsets pending on the partition: their records
must stay in the log until the marker.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import json
import logging
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from logstore.batch import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    ControlType,
    Record,
    build,
    iter_batches,
)
from logstore.errors import CorruptRecordError, ReplogError
from replication.broker.partition import Partition
from replication.common import TopicPartition
from replication.coordinator.records import versioned_json
from replication.coordinator.snapshots import SnapshotSchedule, hold_all, take_snapshot
from replication.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    CorruptFrameError,
    FencedInstanceIdError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    GroupNotEmptyError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidFieldError,
    InvalidGroupIdError,
    InvalidProducerIdMappingError,
    InvalidSessionTimeoutError,
    MemberIdRequiredError,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)
from replication.metadata.image import MetadataImage
from replication.protocol.consumer import (
    ASSIGNMENT_VERSION,
    ConsumerProtocolAssignment,
    ConsumerProtocolTopicPartitions,
    decode_embedded,
    encode_embedded,
)

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
#: records appended to an offsets partition since its last snapshot before the next one
SNAPSHOT_MIN_RECORDS = 1000
#: the format of the JSON values on __consumer_offsets; 0 reads as 1
GROUP_RECORD_FORMAT_VERSION = 1
#: a deadline the group ticker acted on and that still stands is tried again this much later
STANDING_DEADLINE_RETRY_MS = 1_000
CONSUMER_PROTOCOL_TYPE = "consumer"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def java_string_hash(value: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, int32 overflow), so a group lands on the
    partition Kafka would give it."""
    h = 0
    for unit in struct.unpack(
        f">{len(value.encode('utf-16-be')) // 2}H", value.encode("utf-16-be")
    ):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int) -> int:
    """The __consumer_offsets partition of a group (Kafka's ``Utils.abs(hash) % n``)."""
    return (java_string_hash(group_id) & 0x7FFFFFFF) % partitions


class _MemberIdRequired(MemberIdRequiredError):
    """MEMBER_ID_REQUIRED with the member id the coordinator assigned (KIP-394)."""

    def __init__(self, member_id: str) -> None:
        super().__init__()
        self.member_id = member_id


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class _GroupLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: holders and waiters
    users: int = 0


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """The coordinator's policy, from the broker's configuration (Kafka's key names)."""

    num_partitions: int = 10
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000
    max_size: int = 1_000_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None
    commit_timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class JoinResult:
    """What a JoinGroup answers (the error class, or the generation and its members)."""

    error: type[ReplogError] | None = None
    generation_id: int = -1
    protocol_name: str = ""
    leader: str = ""
    member_id: str = ""
    #: (member id, group instance id, metadata), for the leader only
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """What a JoinGroup asks (and who asks: the client id and host of its connection)."""

    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    #: (name, metadata) in the member's order of preference
    protocols: tuple[tuple[str, bytes], ...]


@dataclass(slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    #: (name, metadata), in the member's order of preference
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_heartbeat_ms: int = 0
    join_waiter: asyncio.Future[JoinResult] | None = None
    sync_waiter: asyncio.Future[bytes] | None = None

    def metadata_for(self, protocol: str) -> bytes:
        return next((m for n, m in self.protocols if n == protocol), b"")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def to_json(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "group_instance_id": self.group_instance_id,
            "client_id": self.client_id,
            "client_host": self.client_host,
            "session_timeout_ms": self.session_timeout_ms,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "protocols": [[n, base64.b64encode(m).decode()] for n, m in self.protocols],
            "assignment": base64.b64encode(self.assignment).decode(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], protocol_type: str, now_ms: int) -> MemberMetadata:
        return cls(
            member_id=str(doc["member_id"]),
            group_instance_id=doc.get("group_instance_id"),
            client_id=str(doc.get("client_id", "")),
            client_host=str(doc.get("client_host", "")),
            session_timeout_ms=int(doc["session_timeout_ms"]),
            rebalance_timeout_ms=int(doc["rebalance_timeout_ms"]),
            protocol_type=protocol_type,
            protocols=[(str(n), base64.b64decode(m)) for n, m in doc.get("protocols", [])],
            assignment=base64.b64decode(doc.get("assignment", "")),
            # a loaded member gets a whole session to find the new coordinator
            last_heartbeat_ms=now_ms,
        )


@dataclass(slots=True)
class GroupMetadata:
    group_id: str
    state: GroupState = GroupState.EMPTY
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation_id: int = 0
    leader_id: str | None = None
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    #: group.instance.id -> member id of the static members
    static_members: dict[str, str] = field(default_factory=dict)
    #: member ids handed out with MEMBER_ID_REQUIRED, not joined yet
    pending_members: set[str] = field(default_factory=set)
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    state_since_ms: int = 0
    rebalance_deadline_ms: int = 0
    #: a new group waits this long for more members (group.initial.rebalance.delay.ms)
    rebalance_not_before_ms: int = 0

    def is_(self, *states: GroupState) -> bool:
        return self.state in states

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_since_ms = now_ms

    def candidate_protocols(self) -> set[str]:
        sets = [{n for n, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def supports(self, protocol_type: str, protocols: Sequence[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocols)
        return protocol_type == self.protocol_type and bool(
            self.candidate_protocols() & {n for n, _ in protocols}
        )

    def select_protocol(self) -> str:
        """The protocol every member supports that most members prefer (Kafka's vote)."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = next(n for n, _ in member.protocols if n in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(sorted(votes), key=lambda n: votes[n])

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": GROUP_RECORD_FORMAT_VERSION,
            "protocol_type": self.protocol_type,
            "protocol": self.protocol_name,
            "generation": self.generation_id,
            "leader": self.leader_id,
            "state_since_ms": self.state_since_ms,
            "members": [m.to_json() for m in self.members.values()],
        }


@dataclass(slots=True)
class _OffsetsPartition:
    """One __consumer_offsets partition this broker leads: its groups, and whether loaded."""

    index: int
    leader_epoch: int
    loaded: bool = False
    groups: dict[str, GroupMetadata] = field(default_factory=dict)
    #: offsets committed in open transactions: producer id -> group -> offsets
    pending: dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]] = field(
        default_factory=dict
    )
    #: the partition (its log is cut at each snapshot); None in unit tests
    partition: Partition | None = None
    #: when the next snapshot is due (records since the last one)
    schedule: SnapshotSchedule = field(default_factory=SnapshotSchedule)
    #: held around each append, and by a snapshot from building its records to appending them
    append_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def live_keys(self) -> int:
        return sum(1 + len(g.offsets) for g in self.groups.values())


class GroupCoordinator:
    """Lives in every broker; coordinates the groups of the offsets partitions it leads."""

    def __init__(
        self,
        broker_id: int,
        config: GroupConfig,
        image: Callable[[], MetadataImage],
        append: Callable[[int, bytes], Awaitable[int]],
        time_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.image = image
        self._append = append
        self._time_ms = time_ms
        self.partitions: dict[int, _OffsetsPartition] = {}
        self._locks: dict[str, _GroupLock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Set whenever a group's state may have moved a deadline earlier (a join, a sync, a
        # leave, a load): the ticker (server/node.py) sleeps until the next deadline or this,
        # instead of polling every 100 ms (Kafka arms a timer per member deadline the same way).
        self.changed = asyncio.Event()
        self.ticks = 0

    # --- becoming (and stopping being) a coordinator -----------------------------------------

    async def load(self, partition: Partition) -> None:
        """Read an offsets partition back once its leader's HW covers its log, and serve it."""
        index, epoch = partition.index, partition.leader_epoch
        state = _OffsetsPartition(index, epoch, partition=partition)
        self.partitions[index] = state
        end = partition.log.log_end_offset
        while partition.high_watermark < end:
            if not partition.is_leader or partition.leader_epoch != epoch:
                return
            partition.maybe_increment_high_watermark()
            await asyncio.sleep(0.05)
        groups, pending = await asyncio.to_thread(_read_groups, partition, end, self._time_ms())
        if self.partitions.get(index) is not state:
            return  # unloaded, or loaded again at a newer epoch, meanwhile
        state.groups, state.pending, state.loaded = groups, pending, True
        self.changed.set()
        log.info(
            "group coordinator for %s-%d (epoch %d): %d groups",
            OFFSETS_TOPIC,
            index,
            epoch,
            len(groups),
        )

    def unload(self, index: int) -> None:
        state = self.partitions.pop(index, None)
        if state is None:
            return
        for group in state.groups.values():
            for member in group.members.values():
                _settle(member.join_waiter, JoinResult(error=NotCoordinatorError))
                _fail(member.sync_waiter, NotCoordinatorError())

    def _partition(self, group_id: str) -> _OffsetsPartition:
        if not group_id:
            raise InvalidGroupIdError()
        index = partition_for(group_id, self.config.num_partitions)
        state = self.partitions.get(index)
        if state is None:
            raise NotCoordinatorError(
                f"broker {self.broker_id} is not the coordinator of group {group_id!r}; find it "
                "again"
            )
        if not state.loaded:
            raise CoordinatorLoadInProgressError()
        return state

    def _group(self, group_id: str, *, create: bool = False) -> GroupMetadata | None:
        groups = self._partition(group_id).groups
        group = groups.get(group_id)
        if group is None and create:
            group = groups[group_id] = GroupMetadata(group_id, state_since_ms=self._time_ms())
        return group

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
            group = self._group(r.group_id, create=not r.member_id)
            if group is None:
                raise UnknownMemberIdError(f"group {r.group_id!r} has no member {r.member_id!r}")
            if group.is_(GroupState.DEAD):
                raise CoordinatorNotAvailableError()
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
        return deadline

    def now_ms(self) -> int:
        """The coordinator's clock (deadlines are in it)."""
        return self._time_ms()

    def busy(self) -> bool:
        """Whether any group has members (the ticker then also wakes at a backstop interval,
        in case a waiter ended without a lock being taken, e.g. a dropped connection)."""
        return any(
            group.members
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
                    await self._expire_offsets(state, group, now)
        return now

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
            group = self._group(group_id)
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
            await self._write(group.group_id, [_group_record(group, self._time_ms())])
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
            group = self._group(group_id)
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
            group = self._group(group_id)
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
    ) -> dict[TopicPartition, type[ReplogError] | None]:
        """Store the offsets (acks=all) and answer per partition; raises for the whole group."""
        async with self._locked(group_id):
            group = self._group(group_id, create=generation_id < 0)
            if group is None:
                raise IllegalGenerationError(f"group {group_id!r} does not exist; rejoin")
            self._check_commit(group, generation_id, member_id, group_instance_id)
            errors, accepted = self._screen(offsets, self._owned(group, member_id))
            if accepted:
                await self._write(
                    group_id, [_offset_record(group_id, tp, v) for tp, v in accepted.items()]
                )
                group.offsets.update(accepted)
                errors.update(dict.fromkeys(accepted))
            return errors

    async def commit_txn_offsets(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> dict[TopicPartition, type[ReplogError] | None]:
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
            state = self._partition(group_id)
            group = self._group(group_id, create=True)
            assert group is not None
            if generation_id >= 0 or member_id:
                self._check_commit(group, generation_id, member_id, group_instance_id)
            errors, accepted = self._screen(offsets, None)
            if accepted:
                records = [_offset_record(group_id, tp, v) for tp, v in accepted.items()]
                await self._write(
                    group_id,
                    records,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                )
                state.pending.setdefault(producer_id, {}).setdefault(group_id, {}).update(accepted)
                errors.update(dict.fromkeys(accepted))
            return errors

    def _screen(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        owned: set[TopicPartition] | None,
    ) -> tuple[
        dict[TopicPartition, type[ReplogError] | None], dict[TopicPartition, OffsetAndMetadata]
    ]:
        """Split a commit into refused partitions (unknown, or not owned by the member) and
        accepted offsets, stamped with the commit time."""
        image = self.image()
        errors: dict[TopicPartition, type[ReplogError] | None] = {}
        accepted: dict[TopicPartition, OffsetAndMetadata] = {}
        now = self._time_ms()
        for tp, value in offsets.items():
            topic = image.topic(tp.topic)
            if topic is None or not 0 <= tp.partition < len(topic.partitions):
                errors[tp] = UnknownTopicOrPartitionError
            elif owned is not None and tp not in owned:
                errors[tp] = IllegalGenerationError
            else:
                accepted[tp] = OffsetAndMetadata(
                    value.offset, value.leader_epoch, value.metadata, now
                )
        return errors, accepted

    def complete_txn(self, index: int, producer_id: int, commit: bool) -> None:
        """The transaction's marker was written to offsets partition ``index``: apply its
        offsets (COMMIT) or drop them (ABORT)."""
        state = self.partitions.get(index)
        if state is None:
            return  # not led here any more: the next leader replays the marker
        for group_id, offsets in state.pending.pop(producer_id, {}).items():
            group = state.groups.get(group_id)
            if commit and group is not None:
                group.offsets.update(offsets)
            log.info(
                "group %s: %d offsets of producer %d's transaction %s",
                group_id,
                len(offsets),
                producer_id,
                "committed" if commit else "aborted",
            )

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
        group = self._group(group_id)
        offsets = group.offsets if group is not None else {}
        if partitions is None:
            return dict(offsets)
        return {tp: offsets.get(tp) for tp in partitions}

    def unstable(self, group_id: str) -> set[TopicPartition]:
        """Partitions of the group with offsets in a transaction that has not ended: a
        read_committed consumer asks with ``require_stable`` and waits for them (KIP-447), or
        it could start before what an open transaction will commit."""
        state = self._partition(group_id)
        return {tp for txn in state.pending.values() for tp in txn.get(group_id, {})}

    async def _expire_offsets(
        self, state: _OffsetsPartition, group: GroupMetadata, now: int
    ) -> None:
        """An empty group's offsets go after offsets.retention.minutes, then the group."""
        if not group.is_(GroupState.EMPTY):
            return
        if now - group.state_since_ms < self.config.offsets_retention_ms:
            return
        try:
            await self._write(group.group_id, _tombstones(group))
        except ReplogError as err:
            log.warning("group %s: expiring offsets failed: %s", group.group_id, err)
            return
        log.info(
            "group %s: empty for offsets.retention.minutes, its offsets expired", group.group_id
        )
        group.transition(GroupState.DEAD, now)
        state.groups.pop(group.group_id, None)

    # --- listing, describing, deleting -------------------------------------------------------

    def list_groups(self) -> list[GroupMetadata]:
        return [
            g
            for s in self.partitions.values()
            if s.loaded
            for g in s.groups.values()
            if not g.is_(GroupState.DEAD)
        ]

    def describe_group(self, group_id: str) -> GroupMetadata | None:
        return self._group(group_id)

    async def delete_group(self, group_id: str) -> None:
        async with self._locked(group_id):
            state = self._partition(group_id)
            group = state.groups.get(group_id)
            if group is None or group.is_(GroupState.DEAD):
                raise GroupIdNotFoundError(f"no group {group_id!r}")
            if not group.is_(GroupState.EMPTY):
                raise GroupNotEmptyError(
                    f"group {group_id!r} has {len(group.members)} members; stop them first"
                )
            await self._write(group_id, _tombstones(group))
            group.transition(GroupState.DEAD, self._time_ms())
            state.groups.pop(group_id, None)

    # --- the log -----------------------------------------------------------------------------

    async def _write(
        self,
        group_id: str,
        records: list[Record],
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
    ) -> None:
        index = partition_for(group_id, self.config.num_partitions)
        batch = build(
            records,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            is_transactional=producer_id != NO_PRODUCER_ID,
        )
        state = self.partitions.get(index)
        if state is None:
            raise NotCoordinatorError(f"broker {self.broker_id} no longer leads {index}")
        async with state.append_lock:
            await self._append_to(index, batch)
        if state.schedule.note(len(records), state.live_keys(), SNAPSHOT_MIN_RECORDS):
            task = asyncio.ensure_future(self._snapshot(state))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _append_to(self, index: int, batch: bytes) -> int:
        try:
            return await self._append(index, batch)
        except ReplogError as err:
            raise CoordinatorNotAvailableError(
                f"the offsets log {OFFSETS_TOPIC}-{index} refused a write ({err}); retry"
            ) from err

    async def _snapshot(self, state: _OffsetsPartition) -> None:
        """Append every live key of the partition, then start its log there."""
        if state.pending:
            state.schedule.snapshotting = False
            return  # open transactions' records must stay before their markers

        @contextlib.asynccontextmanager
        async def exclusive() -> AsyncIterator[None]:
            # No commit of a known group may sit between its append and its in-memory update
            # while the snapshot reads the state: hold every group's lock (in order), then
            # the append lock (commits of groups created meanwhile append after the snapshot).
            async with self._locked(*state.groups), state.append_lock:
                yield

        def records() -> list[Record] | None:
            if state.pending:
                return None
            now = self._time_ms()
            out: list[Record] = []
            for group in state.groups.values():
                out.append(_group_record(group, now))
                out += [_offset_record(group.group_id, tp, v) for tp, v in group.offsets.items()]
            return out

        await take_snapshot(
            f"{OFFSETS_TOPIC}-{state.index}",
            state.schedule,
            exclusive,
            records,
            lambda batch: self._append_to(state.index, batch),
            state.partition,
            lambda: self.partitions.get(state.index) is state,
        )

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


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


# --- records on __consumer_offsets -------------------------------------------------------------


def _offset_key(group_id: str, tp: TopicPartition) -> bytes:
    return f"offset\0{group_id}\0{tp.topic}\0{tp.partition}".encode()


def _group_key(group_id: str) -> bytes:
    return f"group\0{group_id}".encode()


def _offset_record(group_id: str, tp: TopicPartition, value: OffsetAndMetadata) -> Record:
    doc = {
        "format_version": GROUP_RECORD_FORMAT_VERSION,
        "offset": value.offset,
        "leader_epoch": value.leader_epoch,
        "metadata": value.metadata,
        "commit_timestamp": value.commit_timestamp_ms,
    }
    return Record(_offset_key(group_id, tp), json.dumps(doc).encode(), value.commit_timestamp_ms)


def _group_record(group: GroupMetadata, now: int) -> Record:
    return Record(_group_key(group.group_id), json.dumps(group.to_json()).encode(), now)


def _tombstones(group: GroupMetadata) -> list[Record]:
    now = _now_ms()
    records = [Record(_offset_key(group.group_id, tp), None, now) for tp in group.offsets]
    return [*records, Record(_group_key(group.group_id), None, now)]


def _value(record_value: bytes, where: str) -> dict[str, Any]:
    return versioned_json(record_value, where, "group", GROUP_RECORD_FORMAT_VERSION)


def _read_groups(
    partition: Partition, end: int, now: int
) -> tuple[dict[str, GroupMetadata], dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]]]:
    """Replay an offsets partition up to ``end``: the newest value of each key wins. Offsets
    of a transaction wait for its marker (COMMIT applies them, ABORT drops them); those of
    transactions still open come back as pending."""
    plog = partition.log
    groups: dict[str, GroupMetadata] = {}
    pending: dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]] = {}
    offset = plog.log_start_offset
    while offset < end:
        batches = list(
            iter_batches(plog.read(offset, 8 * 1024 * 1024, max_offset=end), validate=True)
        )
        if not batches:
            break
        for batch in batches:
            if batch.is_control:
                done = pending.pop(batch.producer_id, {})
                if batch.control_type() is ControlType.COMMIT:
                    for group_id, offsets in done.items():
                        target = groups.setdefault(
                            group_id, GroupMetadata(group_id, state_since_ms=now)
                        )
                        target.offsets.update(offsets)
                continue
            for record in batch.records():
                if record.offset < offset or record.key is None:
                    continue
                where = f"{partition.key} offset {record.offset}"
                kind, _, rest = record.key.decode().partition("\0")
                if kind == "offset":
                    group_id, topic, index = rest.split("\0")
                    group = groups.setdefault(group_id, GroupMetadata(group_id, state_since_ms=now))
                    tp = TopicPartition(topic, int(index))
                    if record.value is None:
                        group.offsets.pop(tp, None)
                        continue
                    doc = _value(record.value, where)
                    into = group.offsets
                    if batch.is_transactional:
                        into = pending.setdefault(batch.producer_id, {}).setdefault(group_id, {})
                    into[tp] = OffsetAndMetadata(
                        int(doc["offset"]),
                        int(doc.get("leader_epoch", -1)),
                        doc.get("metadata"),
                        int(doc.get("commit_timestamp", 0)),
                    )
                elif kind == "group":
                    group = groups.setdefault(rest, GroupMetadata(rest, state_since_ms=now))
                    if record.value is None:
                        groups.pop(rest, None)
                        continue
                    _load_group(group, _value(record.value, where), now)
        offset = batches[-1].next_offset
    return groups, pending


def _load_group(group: GroupMetadata, doc: Mapping[str, Any], now: int) -> None:
    group.protocol_type = doc.get("protocol_type")
    group.protocol_name = doc.get("protocol")
    group.generation_id = int(doc.get("generation", 0))
    group.leader_id = doc.get("leader")
    group.members = {}
    group.static_members = {}
    for m in doc.get("members", []):
        member = MemberMetadata.from_json(m, group.protocol_type or "", now)
        group.members[member.member_id] = member
        if member.group_instance_id is not None:
            group.static_members[member.group_instance_id] = member.member_id
    group.transition(GroupState.STABLE if group.members else GroupState.EMPTY, now)
    if not group.members:
        group.state_since_ms = int(doc.get("state_since_ms", now)) or now


def _settle(waiter: asyncio.Future[Any] | None, value: Any) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(value)


def _fail(waiter: asyncio.Future[Any] | None, error: BaseException) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_exception(error)


__all__ = [
    "CONSUMER_PROTOCOL_TYPE",
    "OFFSETS_TOPIC",
    "GroupConfig",
    "GroupCoordinator",
    "GroupMetadata",
    "GroupState",
    "JoinRequest",
    "JoinResult",
    "OffsetAndMetadata",
    "decode_consumer_assignment",
    "encode_consumer_assignment",
    "partition_for",
]
