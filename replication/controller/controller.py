"""The controller: the one writer of cluster metadata.

It claims a controller epoch in the metadata store, then every change (a broker registering, a
topic created or deleted, a leader elected, an ISR committed, a reassignment started, completed
or cancelled) becomes the next metadata version,
written put-if-absent so that a stale controller can never write. Brokers read each new version
from the metadata store when their heartbeat names it (``BrokerLifecycle``).

Methods are synchronous (they do storage I/O); the broker calls them off its event loop.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from replication import events
from replication.controller.acl_control import AclControlManager
from replication.controller.placement import assign_replicas
from replication.controller.quota_control import QuotaControlManager
from replication.controller.reassignment import PartitionReassignmentControl, log_reassignment
from replication.controller.state_change import log_state_changes
from replication.dynamic_config import (
    apply_config_ops,
    broker_entity,
    dynamic_broker_overrides,
    validate_broker_configs,
    validate_topic_configs,
)
from replication.errors import (
    BrokerIdNotRegisteredError,
    DuplicateBrokerRegistrationError,
    ElectionNotNeededError,
    EligibleLeadersNotAvailableError,
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    InvalidUpdateVersionError,
    NotControllerError,
    NotLeaderOrFollowerError,
    PreferredLeaderNotAvailableError,
    ReplogError,
    StaleBrokerEpochError,
    StaleControllerEpochError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from replication.metadata.image import (
    NO_LEADER,
    BrokerInfo,
    MetadataImage,
    PartitionState,
    TopicInfo,
)
from replication.metadata.store import (
    PRUNE_INTERVAL_VERSIONS,
    RETAINED_SNAPSHOTS,
    RETAINED_VERSIONS,
    SNAPSHOT_MIN_INTERVAL_VERSIONS,
    ControllerClaim,
    MetadataStore,
)

log = logging.getLogger(__name__)

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")

#: more partitions than this in one topic is a mistake, not a plan (each is a log to open)
MAX_PARTITIONS_PER_TOPIC = 10_000


def _shown(name: str) -> str:
    return repr(name) if len(name) <= 80 else repr(name[:77] + "...")


def validate_topic_name(name: str) -> None:
    if name in (".", "..") or not _LEGAL_TOPIC.match(name):
        raise InvalidTopicError(
            f"topic name {_shown(name)} is not legal: use 1-249 characters from a-z A-Z 0-9 . _ -"
        )


class Controller(AclControlManager, QuotaControlManager, PartitionReassignmentControl):
    """The active controller of a cluster (one per metadata root at a time)."""

    def __init__(
        self,
        store: MetadataStore,
        controller_id: int,
        host: str,
        port: int,
        *,
        session_timeout_ms: int = 3_000,
        unclean_leader_election: bool = False,
        incarnation: str = "",
        time_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
    ) -> None:
        self.store = store
        self.session_timeout_ms = session_timeout_ms
        self.unclean_leader_election = unclean_leader_election
        self.incarnation = incarnation or uuid.uuid4().hex
        #: broker id -> time of its last heartbeat (ms, ``time_ms``: a monotonic clock, so a
        #: step of the wall clock neither fences every broker nor keeps a dead one unfenced),
        #: for the brokers this controller saw
        self._last_heartbeat: dict[int, int] = {}
        #: broker id -> the metadata version of its registration: a fenced broker is unfenced
        #: once its heartbeat reports that it applied that version (Kafka's
        #: registerBrokerRecordOffset). A controller that took over learns the bar at a
        #: broker's first heartbeat to it: the version it holds then.
        self._registered_at: dict[int, int] = {}
        self.active = False
        self.controller_id = controller_id
        self.host = host
        self.port = port
        self._time_ms = time_ms
        self._lock = threading.RLock()
        self.epoch = 0
        self.image = MetadataImage()
        #: the newest snapshot's version and size, and the bytes of the deltas written since
        self._snapshot_version = 0
        self._snapshot_bytes = 0
        self._delta_bytes = 0
        #: the snapshots this controller wrote, oldest first
        self._snapshots: list[int] = []

    def activate(self, after: int | None = None) -> MetadataImage:
        """Claim the controller epoch after ``after`` (default: after the newest claimed one)
        and write a version that records it; StaleControllerEpochError if this controller is
        beaten to the claim or deposed before its first version.

        A standby passes the epoch it found silent, so it never deposes a controller that
        claimed a newer epoch meanwhile (and that it has not watched).
        """
        with self._lock:
            if after is None:
                latest = self.store.latest_claim()
                after = latest.epoch if latest else 0
            epoch = after + 1
            self.store.claim(
                ControllerClaim(
                    epoch,
                    self.controller_id,
                    self.host,
                    self.port,
                    time.time_ns() // 1_000_000,  # when, for a reader: a wall-clock time
                    self.incarnation,
                )
            )
            self.epoch = epoch
            image = self.store.read_latest()
            if image.controller_epoch > epoch:
                # Overtaken between the claim and this read: a newer controller has written
                # its first version. Building on it would put a version of this (deposed)
                # epoch after the successor's: never write, step down.
                self.active = False
                raise StaleControllerEpochError(
                    f"controller {self.controller_id} claimed epoch {epoch}, but controller "
                    f"{image.controller_id} (epoch {image.controller_epoch}) wrote metadata "
                    f"version {image.version} before it could"
                )
            now = self._time_ms()
            # every broker gets a full session to heartbeat to this controller
            self._last_heartbeat = {b.broker_id: now for b in image.brokers}
            self.active = True
            snapshots = self.store.snapshot_versions()
            self._snapshot_version = snapshots[-1] if snapshots else 0
            self._snapshot_bytes = self.store.snapshot_size(snapshots[-1]) if snapshots else 0
            self._delta_bytes = 0
            self._snapshots = []
            # A version a deposed controller wrote after this read is skipped by the store's
            # write; any other StaleControllerEpochError means this controller lost its epoch
            # (_commit steps it down): it must not retry on top of its successor's versions.
            try:
                committed = self._commit(
                    image.next(
                        controller_epoch=epoch,
                        controller_id=self.controller_id,
                        cluster_id=image.cluster_id or uuid.uuid4().hex,
                    ),
                    base=image,
                )
            except BaseException:
                # not active without a version of its own: it would answer as the active
                # controller from the image it held before (the empty one, for a new standby),
                # and the store would refuse its commits; the service activates it again
                self.active = False
                raise
            events.event(
                log,
                events.CONTROLLER_ACTIVE,
                controller_id=self.controller_id,
                controller_epoch=epoch,
                metadata_version=committed.version,
            )
            return committed

    def _commit(self, image: MetadataImage, base: MetadataImage | None = None) -> MetadataImage:
        """Write ``image``, which follows ``base`` (by default the current image), as the
        next metadata version (the delta from ``base``)."""
        if not self.active:
            raise NotControllerError(
                f"controller {self.controller_id} is not the active controller; retry on the "
                "active one"
            )
        # the version this one follows (not so when activating on a version read from storage)
        before = self.image if image.version == self.image.version + 1 else None
        try:
            image = self.store.write(image, self.image if base is None else base)
        except StaleControllerEpochError:
            self.active = False
            log.warning(
                "controller %d lost its epoch %d: a newer controller wrote version %d",
                self.controller_id,
                self.epoch,
                image.version,
            )
            raise
        if before is not None:
            log_state_changes(before, image)
        self.image = image
        self._delta_bytes += self.store.last_write_bytes
        if (
            not self._snapshot_version
            or image.version - self._snapshot_version >= PRUNE_INTERVAL_VERSIONS
            or (
                self._delta_bytes > self._snapshot_bytes
                and image.version - self._snapshot_version >= SNAPSHOT_MIN_INTERVAL_VERSIONS
            )
        ):
            self._snapshot(image)
        if image.version % PRUNE_INTERVAL_VERSIONS == 0:
            self._prune(image.version - RETAINED_VERSIONS)
        return image

    def _snapshot(self, image: MetadataImage) -> None:
        """Write the full image of a committed version, where readers start (a reader reads
        the newest snapshot and the deltas after it)."""
        try:
            self._snapshot_bytes = self.store.write_snapshot(image)
        except ReplogError as err:  # the next commit tries again; the commit stands
            log.warning(
                "could not write the snapshot of metadata version %d: %s",
                image.version,
                err,
            )
            return
        self._snapshot_version = image.version
        self._delta_bytes = 0
        # the older snapshots this controller wrote go now (the store's prune finds the rest)
        self._snapshots.append(image.version)
        while len(self._snapshots) > RETAINED_SNAPSHOTS:
            old = self._snapshots.pop(0)
            try:
                self.store.delete_snapshot(old)
            except ReplogError as err:
                log.warning("could not delete the snapshot of metadata version %d: %s", old, err)

    def _prune(self, below: int) -> None:
        """Delete metadata versions older than ``below`` (bounded store, bounded listings)."""
        try:
            pruned = self.store.prune(below)
        except ReplogError as err:  # the next interval tries again; the commit stands
            log.warning("could not prune metadata versions below %d: %s", below, err)
            return
        log.info("pruned %d metadata versions below %d", pruned, below)

    # --- brokers ------------------------------------------------------------------------------

    def register_broker(
        self,
        broker_id: int,
        host: str,
        port: int,
        rack: str | None,
        incarnation: str = "",
        endpoints: tuple[tuple[str, str, int], ...] = (),
    ) -> BrokerInfo:
        """(Re-)register a broker: a new broker epoch, fenced until its heartbeat reports that
        it caught up with the metadata (:meth:`heartbeat`), as KRaft registers brokers: a
        fenced broker is not elected leader, does not join an ISR and is not listed to clients.
        A retried registration of the same incarnation keeps the fencing it had.

        A second live incarnation of a broker id is refused (DUPLICATE_BROKER_REGISTRATION) until
        the first one's session expires, as in Kafka. The incarnation is kept in the metadata
        image, so a controller that took over refuses it too.

        A new incarnation is a restarted process: whatever its predecessor appended and had not
        flushed is gone, though followers may have fetched it. So the predecessor is fenced in
        the same metadata version that registers its successor (as KRaft does for a broker
        that re-registers with a new incarnation): it leaves every ISR and every partition it
        led gets a new leader and a new leader epoch. Rule: no leader epoch is ever held by two
        incarnations, so (leader epoch, offset) names the same batch on every replica, which
        is what truncation by diverging epoch relies on.
        """
        if not host or not 0 < port < 65536 or broker_id < 0:
            raise InvalidRequestError(
                f"broker registration of id {broker_id} at {host!r}:{port} is not valid"
            )
        with self._lock:
            old = self.image.broker(broker_id)
            now = self._time_ms()
            successor = old is not None and old.incarnation != incarnation
            if (
                old is not None
                and successor
                and not old.fenced
                and now - self._last_heartbeat.get(broker_id, 0) <= self.session_timeout_ms
            ):
                raise DuplicateBrokerRegistrationError(
                    f"broker {broker_id} is registered by another live process (at "
                    f"{old.host}:{old.port}); it can register once that session expires"
                )
            image = self.image.next()
            if old is not None and successor:
                image = self._fence_replicas(
                    image.with_broker(replace(old, fenced=True)), {broker_id}
                )
                events.event(
                    log,
                    events.BROKER_FENCED,
                    broker_id=broker_id,
                    broker_epoch=old.epoch,
                    reason="replaced by a new incarnation",
                    old_incarnation=old.incarnation or None,
                    new_incarnation=incarnation,
                )
            info = BrokerInfo(
                broker_id,
                host,
                port,
                rack or None,
                (old.epoch + 1) if old else 1,
                fenced=old is None or successor or old.fenced,
                incarnation=incarnation,
                endpoints=endpoints,
            )
            self._last_heartbeat[broker_id] = now
            committed = self._commit(self._elect_offline_leaders(image.with_broker(info)))
            self._registered_at[broker_id] = committed.version
            events.event(
                log,
                events.BROKER_REGISTERED,
                broker_id=broker_id,
                broker_epoch=info.epoch,
                host=host,
                port=port,
                incarnation=incarnation,
                fenced=info.fenced,
                metadata_version=committed.version,
            )
            return info

    def heartbeat(self, broker_id: int, broker_epoch: int, metadata_version: int) -> BrokerInfo:
        """A broker is alive, and has applied metadata up to ``metadata_version``. A fenced
        broker is unfenced once that reaches the version of its registration (Kafka's
        BrokerHeartbeatManager: currentMetadataOffset against the registration's offset);
        until then it stays fenced and its heartbeat only renews its session."""
        with self._lock:
            info = self.image.broker(broker_id)
            if info is None or info.epoch != broker_epoch:
                raise StaleBrokerEpochError(
                    f"broker {broker_id} epoch {broker_epoch} is not registered "
                    f"(current: {info.epoch if info else 'none'}); register again"
                )
            self._last_heartbeat[broker_id] = self._time_ms()
            if info.fenced and self.caught_up(broker_id, metadata_version):
                info = replace(info, fenced=False)
                image = self.image.next().with_broker(info)
                self._commit(self._elect_offline_leaders(image))
                events.event(
                    log,
                    events.BROKER_UNFENCED,
                    broker_id=broker_id,
                    broker_epoch=info.epoch,
                    metadata_version=metadata_version,
                )
            return info

    def caught_up(self, broker_id: int, metadata_version: int) -> bool:
        """Whether a broker that applied ``metadata_version`` has caught up with the metadata
        of its registration (BrokerHeartbeat's isCaughtUp). Without the lock, as
        :meth:`heartbeat_in_memory`: the heartbeat handler asks on the event loop, and the
        dict's setdefault and the image's version are each read atomically."""
        required = self._registered_at.setdefault(broker_id, self.image.version)
        return metadata_version >= required

    def heartbeat_in_memory(self, broker_id: int, broker_epoch: int) -> BrokerInfo | None:
        """heartbeat() for the steady case, callable on the event loop: a registered,
        unfenced broker at its current epoch only has its session renewed, no metadata
        write. None when that is not the case or the lock is busy (a thread may hold it
        through a metadata write, which the loop must not wait for): then call heartbeat()
        in a thread, which also unfences or raises."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            info = self.image.broker(broker_id)
            if info is None or info.epoch != broker_epoch or info.fenced:
                return None
            self._last_heartbeat[broker_id] = self._time_ms()
            return info
        finally:
            self._lock.release()

    def sessions_expired(self) -> bool:
        """Whether some unfenced broker's session ran out: a cheap look (no I/O), so the
        service's loop can skip the thread hop of check_sessions when, as nearly always,
        none has. Without the lock on purpose: a thread may hold it through a metadata write,
        and the event loop must not wait for that; the image is immutable and the heartbeat
        map's get is atomic, and check_sessions decides again under the lock."""
        now = self._time_ms()
        last = self._last_heartbeat
        return any(
            not b.fenced and now - last.get(b.broker_id, now) > self.session_timeout_ms
            for b in self.image.brokers
        )

    def check_sessions(self) -> list[int]:
        """Fence brokers whose session expired; move leadership off them. Returns them."""
        with self._lock:
            now = self._time_ms()
            expired = [
                b.broker_id
                for b in self.image.brokers
                if not b.fenced
                and now - self._last_heartbeat.get(b.broker_id, now) > self.session_timeout_ms
            ]
            if not expired:
                return []
            image = self.image.next()
            for broker_id in expired:
                info = image.broker(broker_id)
                assert info is not None
                image = image.with_broker(replace(info, fenced=True))
            image = self._fence_replicas(image, set(expired))
            self._commit(image)
            epochs = {b.broker_id: b.epoch for b in self.image.brokers}
            for broker_id in expired:
                events.event(
                    log,
                    events.BROKER_FENCED,
                    broker_id=broker_id,
                    broker_epoch=epochs[broker_id],
                    reason=f"no heartbeat for {self.session_timeout_ms} ms",
                )
            return expired

    # --- leadership and ISR ---------------------------------------------------------------------

    def _live(self, image: MetadataImage) -> set[int]:
        return {b.broker_id for b in image.brokers if not b.fenced}

    def _unclean_allowed(self, topic: TopicInfo, image: MetadataImage | None = None) -> bool:
        """The topic's unclean.leader.election.enable, else the dynamic broker value (this
        controller's own, else the cluster default), else this controller's static one."""
        key = "unclean.leader.election.enable"
        value = topic.config_map().get(key)
        if value is None:
            value = dynamic_broker_overrides(image or self.image, self.controller_id).get(key)
        return self.unclean_leader_election if value is None else value.lower() == "true"

    def _elect(self, state: PartitionState, live: set[int], unclean: bool) -> PartitionState:
        """Kafka's election: the first replica (in assignment order) that is live and in the
        ISR; with unclean election, any live replica (its ISR restarts with it alone)."""
        candidates = [r for r in state.replicas if r in state.isr and r in live]
        if candidates:
            leader, isr = candidates[0], tuple(r for r in state.isr if r in live)
        else:
            outside = [r for r in state.replicas if r in live] if unclean else []
            if outside:
                leader, isr = outside[0], (outside[0],)
            else:
                leader, isr = NO_LEADER, state.isr
        if leader == state.leader and isr == state.isr:
            return state
        return replace(
            state,
            isr=isr,
            leader=leader,
            leader_epoch=state.leader_epoch + (1 if leader != state.leader else 0),
            partition_epoch=state.partition_epoch + 1,
        )

    def _fence_replicas(self, image: MetadataImage, fenced: set[int]) -> MetadataImage:
        """Take fenced brokers out of every ISR (keeping a last member, as KRaft keeps it so
        the partition can come back without data loss) and re-elect where they led."""
        live = self._live(image)
        for topic in image.topics:
            parts = []
            for state in topic.partitions:
                if not fenced & set(state.replicas):
                    parts.append(state)
                    continue
                isr = tuple(r for r in state.isr if r not in fenced) or state.isr[:1]
                shrunk = (
                    state
                    if isr == state.isr
                    else replace(state, isr=isr, partition_epoch=state.partition_epoch + 1)
                )
                if shrunk.leader in fenced or shrunk.leader == NO_LEADER:
                    shrunk = self._elect(
                        replace(shrunk, isr=isr), live, self._unclean_allowed(topic, image)
                    )
                    if shrunk.leader == NO_LEADER and state.leader != NO_LEADER:
                        shrunk = replace(
                            shrunk, leader=NO_LEADER, leader_epoch=state.leader_epoch + 1
                        )
                parts.append(shrunk)
            image = image.with_topic(replace(topic, partitions=tuple(parts)))
        return image

    def _elect_offline_leaders(self, image: MetadataImage) -> MetadataImage:
        live = self._live(image)
        for topic in image.topics:
            if all(s.leader != NO_LEADER for s in topic.partitions):
                continue
            parts = tuple(
                self._elect(s, live, self._unclean_allowed(topic, image))
                if s.leader == NO_LEADER
                else s
                for s in topic.partitions
            )
            image = image.with_topic(replace(topic, partitions=parts))
        return image

    def alter_partition(
        self,
        broker_id: int,
        topic: str,
        index: int,
        leader_epoch: int,
        partition_epoch: int,
        new_isr: Sequence[int],
    ) -> PartitionState:
        """Commit an ISR change asked for by a partition's leader (Kafka's AlterPartition)."""
        with self._lock:
            info = self.image.topic(topic)
            if info is None or not 0 <= index < len(info.partitions):
                raise UnknownTopicOrPartitionError(f"unknown partition {topic}-{index}")
            state = info.partitions[index]
            if state.leader != broker_id:
                raise NotLeaderOrFollowerError(
                    f"broker {broker_id} is not the leader of {topic}-{index}"
                )
            if leader_epoch != state.leader_epoch:
                raise FencedLeaderEpochError(
                    f"{topic}-{index}: leader epoch {leader_epoch} is not current "
                    f"({state.leader_epoch})"
                )
            if partition_epoch != state.partition_epoch:
                raise InvalidUpdateVersionError(
                    f"{topic}-{index}: partition epoch {partition_epoch} is stale "
                    f"(current {state.partition_epoch}); apply the newer metadata first"
                )
            live = self._live(self.image)
            isr = tuple(dict.fromkeys(new_isr))
            if broker_id not in isr or any(r not in state.replicas for r in isr):
                raise InvalidRequestError(f"{topic}-{index}: ISR {list(isr)} is not valid")
            added = set(isr) - set(state.isr)
            if any(r not in live for r in added):
                raise IneligibleReplicaError(
                    f"{topic}-{index}: replicas {sorted(added - live)} are fenced and cannot "
                    "join the ISR"
                )
            new_state = replace(state, isr=isr, partition_epoch=state.partition_epoch + 1)
            self.update_partition(topic, index, new_state)
            if new_state.reassigning:
                for joined in sorted(added & set(new_state.adding_replicas)):
                    log_reassignment("replica_caught_up", topic, index, new_state, replica=joined)
                self._maybe_complete_reassignment(topic, index)
            return new_state

    # --- topics -------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Sequence[tuple[str, str]] = (),
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        validate_topic_name(name)
        if not 1 <= num_partitions <= MAX_PARTITIONS_PER_TOPIC:
            raise InvalidPartitionsError(
                f"topic {name!r}: number of partitions must be between 1 and "
                f"{MAX_PARTITIONS_PER_TOPIC}, got {num_partitions}"
            )
        validate_topic_configs(configs)
        with self._lock:
            if self.image.topic(name) is not None:
                raise TopicAlreadyExistsError(f"topic {name!r} already exists")
            live = [b for b in self.image.brokers if not b.fenced]
            if replication_factor < 1 or replication_factor > len(live):
                raise InvalidReplicationFactorError(
                    f"topic {name!r}: replication factor {replication_factor} is not possible "
                    f"with {len(live)} live broker(s); use 1..{len(live)}"
                )
            assignment = assign_replicas(live, num_partitions, replication_factor)
            topic = TopicInfo(
                name=name,
                topic_id=uuid.uuid4().hex,
                partitions=tuple(
                    PartitionState(tuple(r), tuple(r), r[0], 0, 0) for r in assignment
                ),
                configs=tuple((str(k), str(v)) for k, v in configs),
            )
            if not validate_only:
                self._commit(self.image.next().with_topic(topic))
            return topic

    def create_partitions(
        self,
        name: str,
        count: int,
        assignments: Sequence[Sequence[int]] | None = None,
        *,
        validate_only: bool = False,
    ) -> TopicInfo:
        """Grow topic ``name`` to ``count`` partitions (Kafka's CreatePartitions).

        The new partitions get the topic's replication factor, on the replicas ``assignments``
        names (one list per new partition) or else chosen as at creation. Partitions only grow:
        records keep their partition, but keys hash to new partitions from now on, as in Kafka.
        """
        with self._lock:
            info = self.image.topic(name)
            if info is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            current = len(info.partitions)
            if not current < count <= MAX_PARTITIONS_PER_TOPIC:
                raise InvalidPartitionsError(
                    f"topic {name!r} has {current} partitions: a new count must be between "
                    f"{current + 1} and {MAX_PARTITIONS_PER_TOPIC}, got {count}"
                )
            rf = len(info.partitions[0].replicas)
            live = [b for b in self.image.brokers if not b.fenced]
            live_ids = {b.broker_id for b in live}
            if assignments is None:
                if rf > len(live):
                    raise InvalidReplicationFactorError(
                        f"topic {name!r} has replication factor {rf} but only {len(live)} "
                        "broker(s) are live"
                    )
                new = assign_replicas(live, count - current, rf)
            else:
                new = [list(a) for a in assignments]
                if len(new) != count - current:
                    raise InvalidReplicaAssignmentError(
                        f"topic {name!r}: {len(new)} assignments for {count - current} new "
                        "partitions"
                    )
                for replicas in new:
                    if len(replicas) != rf or len(set(replicas)) != rf:
                        raise InvalidReplicaAssignmentError(
                            f"topic {name!r}: assignment {replicas} does not name {rf} "
                            "distinct brokers (the topic's replication factor)"
                        )
                    if not set(replicas) <= live_ids:
                        raise InvalidReplicaAssignmentError(
                            f"topic {name!r}: assignment {replicas} names brokers that are not "
                            f"live (live: {sorted(live_ids)})"
                        )
            grown = replace(
                info,
                partitions=info.partitions
                + tuple(PartitionState(tuple(r), tuple(r), r[0], 0, 0) for r in new),
            )
            if not validate_only:
                self._commit(self.image.next().with_topic(grown))
            return grown

    def delete_topic(self, name: str) -> None:
        with self._lock:
            if self.image.topic(name) is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            self._commit(self.image.next().without_topic(name))

    # --- dynamic configs --------------------------------------------------------------------------

    def alter_topic_configs(
        self,
        name: str,
        ops: Sequence[tuple[int, str, str | None]],
        *,
        replace_all: bool = False,
        validate_only: bool = False,
    ) -> dict[str, str]:
        """Change a topic's configs (AlterConfigs with ``replace_all``, else
        IncrementalAlterConfigs); every broker hosting it applies them with the new metadata.
        Returns the topic's configs after the change."""
        with self._lock:
            info = self.image.topic(name)
            if info is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            configs = apply_config_ops(info.config_map(), ops, replace_all=replace_all)
            validate_topic_configs(sorted(configs.items()))
            if not validate_only:
                image = self.image.next().with_topic(
                    replace(info, configs=tuple(sorted(configs.items())))
                )
                # unclean.leader.election.enable=true elects where no leader is (as KRaft)
                self._commit(self._elect_offline_leaders(image))
            return configs

    def alter_broker_configs(
        self,
        name: str,
        ops: Sequence[tuple[int, str, str | None]],
        *,
        replace_all: bool = False,
        validate_only: bool = False,
    ) -> dict[str, str]:
        """Change the dynamic configs of broker ``name`` (an id), or of every broker (``""``,
        the cluster-wide default). Returns the entity's dynamic configs after the change."""
        entity = broker_entity(name)
        with self._lock:
            current = self.image.broker_config_map(entity)
            configs = apply_config_ops(current, ops, replace_all=replace_all)
            validate_broker_configs(configs)
            if not validate_only:
                image = self.image.next().with_broker_configs(entity, configs)
                self._commit(self._elect_offline_leaders(image))
                events.log_config_changes(log, "broker", entity, current, configs)
            return configs

    def allocate_producer_ids(self, count: int = 1000) -> range:
        """A block of producer ids, durable before use (unique across controller failover)."""
        with self._lock:
            first = self.image.next_producer_id
            self._commit(self.image.next(next_producer_id=first + count))
            return range(first, first + count)

    def update_partition(self, topic: str, index: int, state: PartitionState) -> MetadataImage:
        with self._lock:
            info = self.image.topic(topic)
            if info is None:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
            parts = list(info.partitions)
            parts[index] = state
            return self._commit(
                self.image.next().with_topic(replace(info, partitions=tuple(parts)))
            )

    # --- leader elections (KIP-460), unregistration ---------------------------------------------

    def elect_leaders(
        self, preferred: bool, partitions: Sequence[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], ReplogError | None]:
        """Kafka's ElectLeaders: PREFERRED moves leadership to the first replica if it is live
        and in the ISR; UNCLEAN (``preferred=False``) elects a leader for partitions that have
        none, from outside the ISR if it must. With ``partitions`` None, every partition is
        considered and only those elected (or failing for a reason other than not needing an
        election) are in the answer. One metadata version for all."""
        with self._lock:
            image = self.image.next()
            live = self._live(image)
            named = partitions is not None
            keys = (
                list(partitions)
                if partitions is not None
                else [(t.name, i) for t in image.topics for i in range(len(t.partitions))]
            )
            results: dict[tuple[str, int], ReplogError | None] = {}
            elected: list[tuple[str, int, PartitionState]] = []
            for topic, index in keys:
                info = image.topic(topic)
                try:
                    if info is None or not 0 <= index < len(info.partitions):
                        raise UnknownTopicOrPartitionError(f"unknown partition {topic}-{index}")
                    state = info.partitions[index]
                    new = (
                        self._preferred(topic, index, state, live)
                        if preferred
                        else self._unclean(topic, index, state, live)
                    )
                except ElectionNotNeededError as err:
                    if named:
                        results[(topic, index)] = err
                    continue
                except ReplogError as err:
                    results[(topic, index)] = err
                    continue
                assert info is not None
                parts = list(info.partitions)
                parts[index] = new
                image = image.with_topic(replace(info, partitions=tuple(parts)))
                results[(topic, index)] = None
                elected.append((topic, index, new))
            if elected:
                self._commit(image)
            for topic, index, state in elected:
                log.info(
                    "%s-%d: %s leader election: leader %d (leader epoch %d, partition epoch %d)",
                    topic,
                    index,
                    "preferred" if preferred else "unclean",
                    state.leader,
                    state.leader_epoch,
                    state.partition_epoch,
                )
            return results

    @staticmethod
    def _preferred(topic: str, index: int, state: PartitionState, live: set[int]) -> PartitionState:
        first = state.replicas[0]
        if state.leader == first:
            raise ElectionNotNeededError(f"{topic}-{index}: the preferred leader {first} leads")
        if first not in live or first not in state.isr:
            raise PreferredLeaderNotAvailableError(
                f"{topic}-{index}: the preferred leader {first} is "
                f"{'not in the ISR ' + str(list(state.isr)) if first in live else 'not live'}; "
                "elect again once it has caught up"
            )
        return replace(
            state,
            leader=first,
            leader_epoch=state.leader_epoch + 1,
            partition_epoch=state.partition_epoch + 1,
        )

    def _unclean(
        self, topic: str, index: int, state: PartitionState, live: set[int]
    ) -> PartitionState:
        if state.leader != NO_LEADER and state.leader in live:
            raise ElectionNotNeededError(f"{topic}-{index} has a leader ({state.leader})")
        new = self._elect(replace(state, leader=NO_LEADER), live, unclean=True)
        if new.leader == NO_LEADER:
            raise EligibleLeadersNotAvailableError(
                f"{topic}-{index}: no replica of {list(state.replicas)} is live"
            )
        return replace(new, leader_epoch=max(new.leader_epoch, state.leader_epoch + 1))

    def rebalance_leaders(self, imbalance_percentage: int) -> list[tuple[str, int]]:
        """Kafka's auto leader rebalance: for every live broker whose share of partitions it
        is the preferred leader of but does not lead exceeds ``imbalance_percentage``
        (leader.imbalance.per.broker.percentage), move those partitions' leadership back to it
        where it is in the ISR. Partitions being reassigned are left alone. Returns the moved."""
        with self._lock:
            live = self._live(self.image)
            preferred_of: dict[int, list[tuple[str, int, PartitionState]]] = {}
            for topic in self.image.topics:
                for index, state in enumerate(topic.partitions):
                    if state.replicas:
                        preferred_of.setdefault(state.replicas[0], []).append(
                            (topic.name, index, state)
                        )
            moves: list[tuple[str, int]] = []
            for broker, parts in sorted(preferred_of.items()):
                if broker not in live:
                    continue
                off = [(t, i, s) for t, i, s in parts if s.leader != broker]
                if len(off) * 100 <= imbalance_percentage * len(parts):
                    continue
                moves.extend((t, i) for t, i, s in off if broker in s.isr and not s.reassigning)
            if not moves:
                return []
            results = self.elect_leaders(True, moves)
            moved = [key for key, err in results.items() if err is None]
            if moved:
                log.info(
                    "leader rebalance moved %d partition(s) to their preferred leader", len(moved)
                )
            return moved

    def unregister_broker(self, broker_id: int) -> None:
        """Remove a broker's registration (Kafka's UnregisterBroker), refused while it still
        holds replicas: move them off first (`replog brokers decommission`)."""
        with self._lock:
            if self.image.broker(broker_id) is None:
                raise BrokerIdNotRegisteredError(f"broker {broker_id} is not registered")
            held = [
                f"{topic.name}-{index}"
                for topic in self.image.topics
                for index, state in enumerate(topic.partitions)
                if broker_id in state.replicas
            ]
            if held:
                shown = ", ".join(held[:5]) + (
                    f" and {len(held) - 5} more" if len(held) > 5 else ""
                )
                raise InvalidRequestError(
                    f"broker {broker_id} still holds replicas of {len(held)} partition(s) "
                    f"({shown}); move them off first with `replog brokers decommission "
                    f"--broker-id {broker_id}`"
                )
            self._commit(self.image.next().without_broker(broker_id))
            self._last_heartbeat.pop(broker_id, None)
            self._registered_at.pop(broker_id, None)
            log.info("broker %d unregistered", broker_id)
