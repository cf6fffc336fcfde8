"""A partition replica on this broker: its log, its role, and (as leader) its followers.

As Kafka's Partition: the leader assigns offsets and stamps its leader epoch; it tracks every
follower's log end offset (the fetch offset of the follower's last fetch, which is the
follower's durable LEO) and moves the high watermark to the minimum durable LEO over the ISR.
Consumers never see offsets at or above the HW.

The invariants replication keeps, under any timing of crashes, pauses and restarts, and the
rule that guarantees each (the fault harness in tests/chaos checks them against real processes,
tests/test_replication_model.py against a model):

- An acked record is never lost while at most ISR-1 brokers lose their stores: acks=all waits
  for the HW, and the HW is the minimum *durable* LEO over the ISR (followers flush before they
  report a fetch offset; :meth:`Partition.maybe_increment_high_watermark`); ISR changes are
  committed by the controller before the leader acts on them; leaders are elected from the ISR
  only; a diverged follower's fetch offset counts for nothing (:meth:`Partition.diverging_epoch`)
  and a follower that registered again is heard anew
  (:meth:`Partition.note_follower_registrations`).
- All replicas hold identical batches below the HW, and the data of a (leader epoch, offset)
  never changes once a replica has it: a leader epoch is held by one incarnation of one broker.
  Every leadership change bumps it, a restarted broker's predecessor is fenced when it registers
  (``Controller.register_broker``), and a process takes no role before that
  (``ReplicaManager.apply_image``). So equal epochs mean equal batches, and truncation by
  diverging epoch (never to the HW alone) removes exactly what differs.
- The HW never goes backwards for a reader: a leader's HW only grows, and a new leader answers
  readers only once its HW has reached the start of its epoch
  (:meth:`Partition.check_high_watermark_known`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from logstore.batch import ControlType, build_control, iter_batches, parse_header
from logstore.config import LogConfig
from logstore.errors import CorruptRecordError, InvalidRecordError, ObjectNotFoundError
from logstore.log import AppendInfo, Log
from replication import events
from replication.broker.producer_state import SNAPSHOT_NAME, ProducerStateManager
from replication.common import TopicPartition
from replication.errors import (
    FencedLeaderEpochError,
    InvalidRequestError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetNotAvailableError,
    TransactionCoordinatorFencedError,
    UnknownLeaderEpochError,
)
from replication.metadata.image import PartitionState

log = logging.getLogger(__name__)

NO_EPOCH_CHECK = -1


def _now_ms() -> int:
    """The wall clock: for timestamps (producer state, LogAppendTime)."""
    return time.time_ns() // 1_000_000


def _monotonic_ms() -> int:
    """The clock of the followers' fetch and caught-up times (replica.lag.time.max.ms): a
    step of the wall clock neither drops every follower from the ISR nor keeps a stuck one."""
    return time.monotonic_ns() // 1_000_000


@dataclass(slots=True)
class ReplicaState:
    """What the leader knows of one follower (Kafka's Replica)."""

    log_end_offset: int = -1
    #: when this follower last fetched (the monotonic clock, as last_caught_up_ms)
    last_fetch_ms: int = 0
    #: the leader's LEO when this follower last fetched
    last_fetch_leader_leo: int = -1
    #: last time the follower had caught up to the leader's LEO (for replica.lag.time.max.ms)
    last_caught_up_ms: int = field(default_factory=_monotonic_ms)
    #: the follower broker's registration (broker epoch) this state was learned from
    broker_epoch: int = -1


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """Per-topic settings beyond the log's own (from topic configs over broker defaults)."""

    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False


class Partition:
    def __init__(
        self,
        topic: str,
        index: int,
        log: Log,
        broker_id: int,
        policy: TopicPolicy,
        state: PartitionState,
        *,
        producer_id_expiration_ms: int | None = None,
    ) -> None:
        self.topic = topic
        #: producer.id.expiration.ms (None: producer ids never expire)
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.index = index
        self.log = log
        self.broker_id = broker_id
        self.policy = policy
        self.state = PartitionState((), (), -1, -1, -1)  # nothing yet: the first state is news
        self.followers: dict[int, ReplicaState] = {}
        self.producer_state = ProducerStateManager(f"{topic}-{index}")
        self.rebuild_producer_state()
        self.apply_state(state)

    def __repr__(self) -> str:
        state = self.state
        where = f"{self.topic}-{self.index}"
        return f"Partition({where}, leader={state.leader}, epoch={state.leader_epoch})"

    @property
    def key(self) -> TopicPartition:
        return TopicPartition(self.topic, self.index)

    @property
    def is_leader(self) -> bool:
        return self.state.leader == self.broker_id

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def last_stable_offset(self) -> int:
        """First offset of the oldest transaction that is open or whose marker is not below
        the HW yet, or the HW (:meth:`ProducerStateManager.last_stable_offset`)."""
        return self.producer_state.last_stable_offset(self.log.high_watermark)

    @property
    def log_config(self) -> LogConfig:
        return self.log.config

    def apply_state(self, state: PartitionState) -> bool:
        """Take a leader/ISR state; True if the leader or leader epoch changed.

        A state older than the one held (a lower leader epoch, or the same leader epoch and a
        lower partition epoch: e.g. metadata that trails an AlterPartition answer) is ignored.
        """
        if (state.leader_epoch, state.partition_epoch) < (
            self.state.leader_epoch,
            self.state.partition_epoch,
        ):
            return False
        changed = (state.leader, state.leader_epoch) != (self.state.leader, self.state.leader_epoch)
        self.state = state
        if self.is_leader:
            now = _monotonic_ms()
            for replica in state.replicas:
                if replica != self.broker_id and replica not in self.followers:
                    self.followers[replica] = ReplicaState(last_caught_up_ms=now)
            for gone in set(self.followers) - set(state.replicas):
                del self.followers[gone]
            if changed:
                # Kafka's makeLeader: the new epoch starts at this replica's LEO, and the
                # followers' LEOs are unknown until they fetch
                self.log.leader_epoch_cache.assign(state.leader_epoch, self.log.log_end_offset)
                for follower in self.followers.values():
                    follower.log_end_offset = -1
                    follower.last_fetch_leader_leo = -1
                    follower.last_caught_up_ms = now
        else:
            self.followers.clear()
        return changed

    def note_follower_registrations(self, broker_epochs: dict[int, int]) -> None:
        """Forget what followers that registered again had fetched (as Kafka's KIP-903).

        A follower with a new broker epoch is a new process, maybe on a new, empty store: its
        earlier fetch offsets say nothing of what it holds now. Its LEO is unknown until it
        fetches again, so it neither counts towards the HW nor rejoins the ISR on old news.
        """
        for replica_id, replica in self.followers.items():
            epoch = broker_epochs.get(replica_id, -1)
            if replica.broker_epoch != epoch:
                if replica.broker_epoch >= 0:
                    replica.log_end_offset = -1
                    replica.last_fetch_leader_leo = -1
                replica.broker_epoch = epoch

    # --- leader epoch checks -------------------------------------------------------------------

    def check_leader_epoch(self, current_leader_epoch: int, *, require_leader: bool) -> None:
        if current_leader_epoch != NO_EPOCH_CHECK:
            if current_leader_epoch < self.state.leader_epoch:
                events.event(
                    log,
                    events.FENCED_LEADER_EPOCH,
                    topic=self.topic,
                    partition=self.index,
                    request_leader_epoch=current_leader_epoch,
                    leader_epoch=self.state.leader_epoch,
                    broker_id=self.broker_id,
                )
                raise FencedLeaderEpochError(
                    f"{self.topic}-{self.index}: request epoch {current_leader_epoch} is older "
                    f"than the current leader epoch {self.state.leader_epoch}; refresh metadata"
                )
            if current_leader_epoch > self.state.leader_epoch:
                raise UnknownLeaderEpochError(
                    f"{self.topic}-{self.index}: request epoch {current_leader_epoch} is newer "
                    f"than this broker knows ({self.state.leader_epoch}); retry shortly"
                )
        if require_leader and not self.is_leader:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.index} "
                f"(leader is {self.state.leader}); refresh metadata and retry"
            )

    def check_high_watermark_known(self) -> None:
        """Readers are answered only once this leader's HW has reached the start of its
        leader epoch (as Kafka's OFFSET_NOT_AVAILABLE for ListOffsets).

        Rule for "the HW never goes backwards for a reader": a new leader starts with the HW
        it learned as a follower, which may trail the HW its predecessor answered. It held
        everything below that HW (it was in the ISR), so its epoch starts at or above it; once
        its own HW reaches its epoch's start, it is past anything a reader was ever shown.
        """
        start = self.log.leader_epoch_cache.start_offset_of(self.state.leader_epoch)
        if start is not None and self.log.high_watermark < start:
            raise OffsetNotAvailableError(
                f"{self.topic}-{self.index}: broker {self.broker_id} became leader at epoch "
                f"{self.state.leader_epoch} and its high watermark ({self.log.high_watermark}) "
                f"has not reached that epoch's start ({start}) yet; retry shortly"
            )

    def diverging_epoch(self, last_fetched_epoch: int, fetch_offset: int) -> tuple[int, int] | None:
        """Where a fetcher's log diverges from this leader's, or None (Fetch v12, KIP-595).

        The fetcher's last batch is of ``last_fetched_epoch`` and its log ends at
        ``fetch_offset``. If this log ends that epoch earlier, or holds no such epoch, the
        answer is (largest epoch <= it here, where that epoch ends here); the fetcher truncates
        there. Sound because a leader epoch is held by one incarnation of one broker
        (``Controller.register_broker``): equal epochs below both ends mean equal batches.
        """
        if last_fetched_epoch < 0:
            return None
        epoch, end = self.log.end_offset_for_epoch(last_fetched_epoch)
        if epoch < last_fetched_epoch or end < fetch_offset:
            return epoch, end
        return None

    # --- produce -------------------------------------------------------------------------------

    def append_as_leader(self, records: bytes | bytearray | memoryview, acks: int) -> AppendInfo:
        """Append as leader. A batch the producer state recognises as a retry is not appended:
        the original batch's offsets come back (``AppendInfo.duplicate``)."""
        self.check_leader_epoch(NO_EPOCH_CHECK, require_leader=True)
        if acks == -1:
            self._check_min_isr()
        batches = list(iter_batches(records, validate=True))
        for batch in batches:
            duplicate = self.producer_state.check(batch)
            if duplicate is not None:
                if len(batches) > 1:
                    raise InvalidRecordError(
                        "a produce request carrying a retried batch must carry only that batch"
                    )
                return AppendInfo(
                    duplicate.first_offset,
                    duplicate.last_offset,
                    batch.max_timestamp,
                    batch.record_count,
                    self.log.log_start_offset,
                    duplicate=True,
                )
        # checked once: the log takes the batches parsed and CRC-checked above
        info = self.log.append(records, leader_epoch=self.state.leader_epoch, batches=batches)
        offset = info.first_offset
        now = _now_ms()
        for batch in batches:
            self.producer_state.update(batch, offset, now)
            offset += batch.record_count
        return info

    def _check_min_isr(self) -> None:
        if len(self.state.isr) < self.policy.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{self.topic}-{self.index}: ISR {list(self.state.isr)} is smaller than "
                f"min.insync.replicas={self.policy.min_insync_replicas}; acks=all cannot be "
                "met until replicas catch up"
            )

    def append_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> AppendInfo:
        """Write a transaction marker (COMMIT or ABORT control batch) as leader.

        A marker is written with acks=all, as Kafka's WriteTxnMarkers: below
        ``min.insync.replicas`` it is refused (NOT_ENOUGH_REPLICAS, which the coordinator
        retries), since a marker acked by a lone leader dies with that leader's store and its
        committed transaction with it."""
        self.check_leader_epoch(NO_EPOCH_CHECK, require_leader=True)
        self._check_min_isr()
        try:
            marker = build_control(
                ControlType.COMMIT if commit else ControlType.ABORT,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                coordinator_epoch=coordinator_epoch,
                timestamp=_now_ms(),
            )
        except ValueError as err:
            raise InvalidRequestError(f"transaction marker is not valid: {err}") from err
        entry = self.producer_state.producers.get(producer_id)
        if entry is not None and coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"{self.topic}-{self.index}: marker from coordinator epoch {coordinator_epoch}, "
                f"older than {entry.coordinator_epoch}"
            )
        batch = parse_header(marker)
        self.producer_state.check(batch)  # an older producer epoch is fenced
        info = self.log.append(marker, leader_epoch=self.state.leader_epoch)
        self.producer_state.update(batch, info.first_offset, _now_ms())
        return info

    def append_as_follower(self, records: bytes) -> AppendInfo:
        info = self.log.append_as_follower(records)
        now = _now_ms()
        for batch in iter_batches(records, validate=False):
            self.producer_state.update(batch, now_ms=now)
        return info

    def truncate_to(self, offset: int) -> int:
        end = self.log.truncate_to(offset)
        self.rebuild_producer_state()
        return end

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.log.truncate_fully_and_start_at(offset)
        self.producer_state = ProducerStateManager(f"{self.topic}-{self.index}")
        self.producer_state.map_end_offset = offset

    # --- producer state ------------------------------------------------------------------------

    def rebuild_producer_state(self) -> None:
        """Load the snapshot (if it is still within the log) and replay the batches after it."""
        name = f"{self.topic}-{self.index}"
        state = ProducerStateManager(name)
        try:
            # an empty log has no producer state to restore (and a new partition no snapshot:
            # on S3 the read would be one wasted GET per partition opened)
            if self.log.log_end_offset > self.log.log_start_offset:
                data = self.log.storage.read(SNAPSHOT_NAME)
                snapshot = ProducerStateManager.from_bytes(data, name)
                if self.log.log_start_offset <= snapshot.map_end_offset <= self.log.log_end_offset:
                    state = snapshot
        except (ObjectNotFoundError, CorruptRecordError):
            pass
        offset = max(state.map_end_offset, self.log.log_start_offset)
        end = self.log.log_end_offset
        while offset < end:
            chunk = self.log.read(offset, 8 * 1024 * 1024)
            batches = list(iter_batches(chunk, validate=False))
            if not batches:
                break
            for batch in batches:
                if batch.next_offset > offset:
                    state.update(batch)
            offset = batches[-1].next_offset
        state.truncate_head(self.log.log_start_offset)
        # the log has only its records' timestamps: a producer still in the log keeps the
        # time of its last append here, if this process saw it (a truncation)
        for pid, entry in state.producers.items():
            seen = self.producer_state.producers.get(pid)
            if seen is not None:
                entry.last_timestamp = max(entry.last_timestamp, seen.last_timestamp)
        self.producer_state = state
        # the log still holds the batches of producers that expired: the same rule removes
        # them again, so an expired id never comes back at recovery or after a truncation
        self.remove_expired_producers(_now_ms())

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Remove the producer ids that expired (producer.id.expiration.ms): no open
        transaction here and no batch for that long. Returns their ids."""
        if self.producer_id_expiration_ms is None:
            return []
        expired = self.producer_state.remove_expired(now_ms, self.producer_id_expiration_ms)
        if expired:
            log.debug(
                "%s-%d: %d producer id(s) expired after producer.id.expiration.ms=%d",
                self.topic,
                self.index,
                len(expired),
                self.producer_id_expiration_ms,
            )
        return expired

    def write_producer_snapshot(self) -> None:
        """Snapshot the producer state if it reflects only durable data (recovery replays
        what follows it)."""
        state = self.producer_state
        if state.map_end_offset <= self.log.durable_end_offset:
            self.log.storage.write(SNAPSHOT_NAME, state.to_bytes())

    def maybe_increment_high_watermark(self) -> bool:
        """HW = min durable LEO over the ISR. True if it moved."""
        if not self.is_leader:
            return False
        hw = self.log.durable_end_offset
        for replica_id in self.state.isr:
            if replica_id == self.broker_id:
                continue
            replica = self.followers.get(replica_id)
            leo = replica.log_end_offset if replica else -1
            if leo < 0:
                return False  # a follower not heard from since this leader took over
            hw = min(hw, leo)
        if hw > self.log.high_watermark:
            self.log.update_high_watermark(hw)
            return True
        return False

    def acks_satisfied(self, required_offset: int) -> bool:
        """acks=all: the ISR has everything below ``required_offset`` in its stores."""
        return self.log.high_watermark >= required_offset

    # --- followers -----------------------------------------------------------------------------

    def update_follower_fetch(self, replica_id: int, fetch_offset: int) -> bool:
        """A follower fetched from ``fetch_offset`` (its durable LEO). True if the HW moved.

        Caught-up tracking is Kafka's: the follower is caught up now if it fetched from the
        leader's LEO, or since its previous fetch if it has reached the LEO of that time.
        """
        replica = self.followers.get(replica_id)
        if replica is None:
            return False
        now = _monotonic_ms()
        leo = self.log.log_end_offset
        if fetch_offset >= leo:
            replica.last_caught_up_ms = now
        elif replica.last_fetch_leader_leo >= 0 and fetch_offset >= replica.last_fetch_leader_leo:
            replica.last_caught_up_ms = max(replica.last_caught_up_ms, replica.last_fetch_ms)
        replica.log_end_offset = fetch_offset
        replica.last_fetch_leader_leo = leo
        replica.last_fetch_ms = now
        return self.maybe_increment_high_watermark()

    # --- ISR -----------------------------------------------------------------------------------

    def isr_to_expand(
        self, fetched_by: int | None = None, live: Collection[int] | None = None
    ) -> tuple[int, ...] | None:
        """The ISR with every follower that has caught up added, or None if none has.

        ``fetched_by``: consider only that follower, the one whose fetch is being handled (as
        Kafka's ``maybeExpandIsr(followerReplica)``). A fetch of one follower says nothing of
        the others: a stalled follower whose last fetch offset still equals the HW of an idle
        partition would otherwise rejoin the ISR at every other follower's fetch, and leave it
        again at the next shrink check (the ISR, and under-replicated metrics, would flap).

        Only ``live`` brokers (registered, not fenced; None: any) join, as KIP-841: a dead
        follower's last fetch may still look caught up, and the controller refuses an ISR
        that names it, which would keep the live ones out too.
        """
        if not self.is_leader:
            return None
        epoch_start = self.log.leader_epoch_cache.start_offset_of(self.state.leader_epoch)
        joining = [
            replica_id
            for replica_id, replica in self.followers.items()
            if (fetched_by is None or replica_id == fetched_by)
            and replica_id not in self.state.isr
            and (live is None or replica_id in live)
            and replica.log_end_offset >= self.log.high_watermark
            and replica.log_end_offset >= (epoch_start if epoch_start is not None else 0)
        ]
        return (*self.state.isr, *sorted(joining)) if joining else None

    def isr_to_shrink(self, lag_time_max_ms: int) -> tuple[int, ...] | None:
        """The ISR without followers that have not caught up for ``lag_time_max_ms``."""
        if not self.is_leader:
            return None
        now = _monotonic_ms()
        lagging = {
            replica_id
            for replica_id in self.state.isr
            if replica_id != self.broker_id
            and now
            - self.followers.get(replica_id, ReplicaState(last_caught_up_ms=0)).last_caught_up_ms
            > lag_time_max_ms
        }
        if not lagging:
            return None
        return tuple(r for r in self.state.isr if r not in lagging)
