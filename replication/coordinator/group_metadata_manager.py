"""Where a broker's consumer groups and their committed offsets live: the partitions of
``__consumer_offsets`` it leads, as Kafka's GroupMetadataManager. It loads a partition back
when it becomes its leader, writes groups and offsets to it (acks=all, before a commit is
answered), holds the offsets of open transactions until their markers, expires an empty
group's offsets, and keeps each partition bounded by snapshots. What a group does between its
records (joins, rebalances) is :mod:`replication.coordinator.group`'s.

Groups live on ``__consumer_offsets`` partitioned by group id (Kafka's
``abs(groupId.hashCode) % offsets.topic.num.partitions``, :func:`partition_for`).

What is on the log, one record per key (the newest wins; a null value deletes)::

    key ``offset\\0<group>\\0<topic>\\0<partition>``  value: JSON offset, leader epoch, metadata
    key ``group\\0<group>``                          value: JSON generation, protocol, members

Both values carry ``format_version``. A group is written once its assignment is known (the
leader's SyncGroup), and offsets are written before a commit is answered, acks=all: a
coordinator that takes over knows every acknowledged commit.

Where replog differs from Kafka, and why: Kafka compacts ``__consumer_offsets``; replog's logs
are objects that are never rewritten. Instead, once a partition has taken
:data:`SNAPSHOT_MIN_RECORDS` records (and at least twice its live keys) since its last snapshot,
the manager appends a snapshot (one record per live key: every group and committed offset)
and moves the log start to it (DeleteRecords; followers follow the leader's log start). So a
partition holds its live state plus what came after the last snapshot, and a load reads no
more. A snapshot waits while a transaction has offsets pending on the partition: their records
must stay in the log until the marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
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
from logstore.errors import ReplogError
from logstore.wall_clock import MonotonicWallClock
from replication.broker.partition import Partition
from replication.common import TopicPartition
from replication.coordinator.group_metadata import (
    GROUP_RECORD_FORMAT_VERSION,
    GroupConfig,
    GroupMetadata,
    GroupState,
    MemberMetadata,
    OffsetAndMetadata,
)
from replication.coordinator.records import versioned_json
from replication.coordinator.snapshots import SnapshotSchedule, take_snapshot
from replication.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    IllegalGenerationError,
    InvalidGroupIdError,
    NotCoordinatorError,
    UnknownTopicOrPartitionError,
)
from replication.metadata.image import MetadataImage

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
#: records appended to an offsets partition since its last snapshot before the next one
SNAPSHOT_MIN_RECORDS = 1000

#: a commit's answer: per partition, the error class, or None where it was stored
CommitErrors = dict[TopicPartition, type[ReplogError] | None]
#: offsets committed in open transactions: producer id -> group -> offsets
PendingOffsets = dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]]


_clock = MonotonicWallClock()


def now_ms() -> int:
    """The group coordinator's clock: session and rebalance deadlines, commit timestamps and
    offset expiry. A step of the wall clock moves none of them (as Kafka's timers)."""
    return _clock()


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


@dataclass(slots=True)
class OffsetsPartition:
    """One __consumer_offsets partition this broker leads: its groups, and whether loaded."""

    index: int
    leader_epoch: int
    loaded: bool = False
    groups: dict[str, GroupMetadata] = field(default_factory=dict)
    #: offsets committed in open transactions: producer id -> group -> offsets
    pending: PendingOffsets = field(default_factory=dict)
    #: the partition (its log is cut at each snapshot); None in unit tests
    partition: Partition | None = None
    #: when the next snapshot is due (records since the last one)
    schedule: SnapshotSchedule = field(default_factory=SnapshotSchedule)
    #: held around each append, and by a snapshot from building its records to appending them
    append_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def live_keys(self) -> int:
        return sum(1 + len(g.offsets) for g in self.groups.values())


class GroupMetadataManager:
    """The offsets partitions one broker leads, their groups and offsets, and their log.

    ``append(index, batch)`` appends to partition ``index`` (acks=all); ``hold_groups(*ids)``
    holds the coordinator's locks of those groups, so that a snapshot reads no group between
    a write and its update in memory."""

    def __init__(
        self,
        broker_id: int,
        config: GroupConfig,
        image: Callable[[], MetadataImage],
        append: Callable[[int, bytes], Awaitable[int]],
        time_ms: Callable[[], int],
        hold_groups: Callable[..., AbstractAsyncContextManager[None]],
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.image = image
        self._append = append
        self._time_ms = time_ms
        self._hold_groups = hold_groups
        self.partitions: dict[int, OffsetsPartition] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # --- becoming (and stopping being) the leader of a partition -----------------------------

    async def load(self, partition: Partition) -> bool:
        """Read an offsets partition back once its leader's HW covers its log, and serve it.
        False if it was left meanwhile (not led at this epoch any more)."""
        index, epoch = partition.index, partition.leader_epoch
        state = OffsetsPartition(index, epoch, partition=partition)
        self.partitions[index] = state
        end = partition.log.log_end_offset
        while partition.high_watermark < end:
            if not partition.is_leader or partition.leader_epoch != epoch:
                return False
            partition.maybe_increment_high_watermark()
            await asyncio.sleep(0.05)
        groups, pending = await asyncio.to_thread(_read_groups, partition, end, self._time_ms())
        if self.partitions.get(index) is not state:
            return False  # unloaded, or loaded again at a newer epoch, meanwhile
        state.groups, state.pending, state.loaded = groups, pending, True
        log.info(
            "group coordinator for %s-%d (epoch %d): %d groups",
            OFFSETS_TOPIC,
            index,
            epoch,
            len(groups),
        )
        return True

    def unload(self, index: int) -> OffsetsPartition | None:
        """Forget partition ``index``; its state (None if it was not led here)."""
        return self.partitions.pop(index, None)

    def partition(self, group_id: str) -> OffsetsPartition:
        """The loaded partition of ``group_id`` (NOT_COORDINATOR if not led here,
        COORDINATOR_LOAD_IN_PROGRESS until it is read back)."""
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

    def group(self, group_id: str, *, create: bool = False) -> GroupMetadata | None:
        groups = self.partition(group_id).groups
        group = groups.get(group_id)
        if group is None and create:
            group = groups[group_id] = GroupMetadata(group_id, state_since_ms=self._time_ms())
        return group

    def groups(self) -> list[GroupMetadata]:
        """Every group of the loaded partitions, but the dead."""
        return [
            g
            for s in self.partitions.values()
            if s.loaded
            for g in s.groups.values()
            if not g.is_(GroupState.DEAD)
        ]

    # --- groups and offsets ------------------------------------------------------------------

    async def store_group(self, group: GroupMetadata) -> None:
        """Write the group (its generation, protocol, members and their assignments)."""
        await self._write(group.group_id, [_group_record(group, self._time_ms())])

    async def store_offsets(
        self,
        group: GroupMetadata,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        owned: set[TopicPartition] | None,
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
    ) -> CommitErrors:
        """Write the offsets of the partitions that exist (and that the member owns, if
        ``owned`` is not None) and answer per partition. Inside a producer's transaction
        (``producer_id``) they are pending until its marker (:meth:`complete_txn`)."""
        state = self.partition(group.group_id)
        errors, accepted = self._screen(offsets, owned)
        if accepted:
            records = [_offset_record(group.group_id, tp, v) for tp, v in accepted.items()]
            await self._write(
                group.group_id, records, producer_id=producer_id, producer_epoch=producer_epoch
            )
            if producer_id == NO_PRODUCER_ID:
                group.offsets.update(accepted)
            else:
                pending = state.pending.setdefault(producer_id, {})
                pending.setdefault(group.group_id, {}).update(accepted)
            errors.update(dict.fromkeys(accepted))
        return errors

    def _screen(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        owned: set[TopicPartition] | None,
    ) -> tuple[CommitErrors, dict[TopicPartition, OffsetAndMetadata]]:
        """Split a commit into refused partitions (unknown, or not owned by the member) and
        accepted offsets, stamped with the commit time."""
        image = self.image()
        errors: CommitErrors = {}
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

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        group = self.group(group_id)
        offsets = group.offsets if group is not None else {}
        if partitions is None:
            return dict(offsets)
        return {tp: offsets.get(tp) for tp in partitions}

    def unstable(self, group_id: str) -> set[TopicPartition]:
        """Partitions of the group with offsets in a transaction that has not ended: a
        read_committed consumer asks with ``require_stable`` and waits for them (KIP-447), or
        it could start before what an open transaction will commit."""
        state = self.partition(group_id)
        return {tp for txn in state.pending.values() for tp in txn.get(group_id, {})}

    async def expire_offsets(self, state: OffsetsPartition, group: GroupMetadata, now: int) -> None:
        """An empty group's offsets go after offsets.retention.minutes, then the group."""
        if not group.is_(GroupState.EMPTY):
            return
        if now - group.state_since_ms < self.config.offsets_retention_ms:
            return
        try:
            await self.remove_group(state, group, now)
        except ReplogError as err:
            log.warning("group %s: expiring offsets failed: %s", group.group_id, err)
            return
        log.info(
            "group %s: empty for offsets.retention.minutes, its offsets expired", group.group_id
        )

    async def remove_group(self, state: OffsetsPartition, group: GroupMetadata, now: int) -> None:
        """Write tombstones of the group and its offsets, then forget it (it is dead)."""
        await self._write(group.group_id, _tombstones(group))
        group.transition(GroupState.DEAD, now)
        state.groups.pop(group.group_id, None)

    async def delete_offsets(
        self, group: GroupMetadata, partitions: Iterable[TopicPartition]
    ) -> None:
        """Write tombstones of the group's offsets of ``partitions`` that it has committed, or
        has pending in an open transaction, then forget them (Kafka's OffsetDelete)."""
        state = self.partition(group.group_id)
        held = {tp for txn in state.pending.values() for tp in txn.get(group.group_id, {})}
        gone = [tp for tp in partitions if tp in group.offsets or tp in held]
        if not gone:
            return
        now = self._time_ms()
        await self._write(
            group.group_id, [Record(_offset_key(group.group_id, tp), None, now) for tp in gone]
        )
        for tp in gone:
            _forget_offset(group.group_id, tp, group.offsets, state.pending)

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

    async def _snapshot(self, state: OffsetsPartition) -> None:
        """Append every live key of the partition, then start its log there."""
        if state.pending:
            state.schedule.snapshotting = False
            return  # open transactions' records must stay before their markers

        @contextlib.asynccontextmanager
        async def exclusive() -> AsyncIterator[None]:
            # No commit of a known group may sit between its append and its in-memory update
            # while the snapshot reads the state: hold every group's lock (in order), then
            # the append lock (commits of groups created meanwhile append after the snapshot).
            async with self._hold_groups(*state.groups), state.append_lock:
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
    now = now_ms()
    records = [Record(_offset_key(group.group_id, tp), None, now) for tp in group.offsets]
    return [*records, Record(_group_key(group.group_id), None, now)]


def _forget_offset(
    group_id: str,
    tp: TopicPartition,
    offsets: dict[TopicPartition, OffsetAndMetadata],
    pending: PendingOffsets,
) -> None:
    """An offset's tombstone: its committed offset goes, and what open transactions hold
    of it (their commit must not bring it back), as Kafka's OffsetMetadataManager replays it."""
    offsets.pop(tp, None)
    for txn in pending.values():
        txn.get(group_id, {}).pop(tp, None)


def _value(record_value: bytes, where: str) -> dict[str, Any]:
    return versioned_json(record_value, where, "group", GROUP_RECORD_FORMAT_VERSION)


def _read_groups(
    partition: Partition, end: int, now: int
) -> tuple[dict[str, GroupMetadata], PendingOffsets]:
    """Replay an offsets partition up to ``end``: the newest value of each key wins. Offsets
    of a transaction wait for its marker (COMMIT applies them, ABORT drops them); those of
    transactions still open come back as pending."""
    plog = partition.log
    groups: dict[str, GroupMetadata] = {}
    pending: PendingOffsets = {}
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
                        _forget_offset(group_id, tp, group.offsets, pending)
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


__all__ = [
    "OFFSETS_TOPIC",
    "SNAPSHOT_MIN_RECORDS",
    "CommitErrors",
    "GroupMetadataManager",
    "OffsetsPartition",
    "java_string_hash",
    "now_ms",
    "partition_for",
]
