"""A consumer group as its coordinator holds it, as Kafka's GroupMetadata and MemberMetadata:
its state, generation, protocol, members (static ones by ``group.instance.id``) and committed
offsets, and the JoinGroup a member sends and the answer it waits for.

The JSON a group and its members are stored as on ``__consumer_offsets`` is here beside them
(``to_json`` / ``from_json``, :data:`GROUP_RECORD_FORMAT_VERSION`); the records and the log
are :mod:`replication.coordinator.group_metadata_manager`'s, the state machine that moves a
group from state to state :mod:`replication.coordinator.group`'s.
"""

from __future__ import annotations

import asyncio
import base64
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from logstore.errors import ReplogError
from replication.common import TopicPartition
from replication.coordinator.consumer_group import ConsumerGroup

#: the format of the JSON values on __consumer_offsets; 0 reads as 1
GROUP_RECORD_FORMAT_VERSION = 1


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """The coordinator's policy, from the broker's configuration (Kafka's key names)."""

    num_partitions: int = 10
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000
    max_size: int = 1_000_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    #: the consumer group protocol (KIP-848): group.consumer.session.timeout.ms and
    #: group.consumer.heartbeat.interval.ms
    consumer_session_timeout_ms: int = 45_000
    consumer_heartbeat_interval_ms: int = 5_000


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
    #: the group's consumer-protocol state (KIP-848) if it is a consumer group, else None
    consumer: ConsumerGroup | None = None

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


__all__ = [
    "GROUP_RECORD_FORMAT_VERSION",
    "GroupConfig",
    "GroupMetadata",
    "GroupState",
    "JoinRequest",
    "JoinResult",
    "MemberMetadata",
    "OffsetAndMetadata",
]
