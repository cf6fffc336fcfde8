"""Replication as a Hypothesis state machine, driving the real code.

Three brokers, one topic of 1-2 partitions, replication factor 3, min.insync.replicas=2, all in
this process on memory storage, with no broker processes and no background loops. A rule is a
step of one process (or one fault), so Hypothesis chooses the interleaving and shrinks a
failure to a short schedule.

Real: ReplicaManager (acks=all produce parked in its purgatory, fetch, group commit, HW, ISR
expansion and shrink through AlterPartition), KafkaApis handlers (Fetch with fetch sessions,
BrokerRegistration, BrokerHeartbeat, AlterPartition), ReplicaFetcher (``_fetch_once``: flush
of a former leader, fetch session, append and flush, truncation by diverging epoch, out of
range), Controller on a MetadataStore (incarnations, heartbeats, session expiry, elections,
ISR commits, failover), Log on memory storage.

Modelled: time (one clock for the controller, the partitions' follower lag and the fetchers'
delays after an error: a tick lets running followers fetch and running brokers heartbeat, then
leaders shrink lagging followers out of the ISR and the controller expires sessions), processes
(an incarnation is a ReplicaManager with its handlers and fetchers; a crash drops it without a
flush, so the unflushed tail is lost; a restart opens a new one on the same storage and applies
the stored metadata at once, as ``replication.server.node`` does, then registers in a later
step, and keeps trying if refused), pauses (a paused broker takes no step and answers no
request), the network (a request reaches the broker's current process, or fails as unreachable)
and readers (a consumer fetches from a broker that says it leads, with the newest leader epoch
it knows, as KIP-320 clients do). Faults share one rule so that they stay rarer than normal
running.

Invariants, checked after every step on what each replica's storage holds (its segment
objects: what survives a crash), against the model of what was promised:
  1. every acked record, and every record a reader was shown below the HW, is at its offset in
     every ISR member's stored log and in the leader's log;
  2. the ISR members hold identical batches (base, last offset, leader epoch, CRC) below the
     committed end (the highest HW shown to a reader, or end of an acked produce);
  3. the HW shown to a reader never goes backwards (checked where the reader reads);
  4. a (leader epoch, offset) names one batch forever, on every replica, once any replica has
     stored it;
  5. nothing committed is below the log start offset of an ISR member;
and no replica stores a value twice.

``REPLOG_MODEL_EXAMPLES`` sets the number of schedules (default 300: about 20 s).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import replication.broker.partition
from logstore.batch import Record, build, iter_batches
from logstore.errors import ReplogError
from logstore.segment import base_offset_of
from logstore.storage import Storage
from replication import protocol as p
from replication.broker import replica_fetcher
from replication.broker.partition import Partition
from replication.broker.replica_fetcher import ReplicaFetcher
from replication.broker.replica_manager import ReplicaManager
from replication.common import TopicPartition
from replication.config import BrokerConfig, broker_config_from
from replication.controller.controller import Controller
from replication.errors import BrokerUnreachableError, StaleBrokerEpochError
from replication.metadata.image import NO_LEADER, PartitionState
from replication.metadata.store import MetadataStore
from replication.protocol.rpc import AsyncConnection
from replication.server.apis import KafkaApis
from replication.server.controller_apis import ControllerApis

pytestmark = pytest.mark.unit

T = TypeVar("T")

TOPIC = "events"
BROKERS = (0, 1, 2)
HOST = "127.0.0.1"
SESSION_TIMEOUT_MS = 3_000
LAG_TIME_MAX_MS = 2_000
MIN_INSYNC = 2
#: an acks=all produce never times out within a run: it completes, or its process crashes
PRODUCE_TIMEOUT_MS = 600_000
#: the controller's clock starts here (ms)
START_MS = 1_700_000_000_000

_runs = itertools.count()


def port_of(broker_id: int) -> int:
    return 19_092 + broker_id


def header(api_key: p.ApiKey) -> p.RequestHeader:
    return p.RequestHeader(api_key=int(api_key), api_version=0, correlation_id=0, client_id="model")


class Clock:
    """The controller's time (heartbeats, sessions), moved only by the model."""

    def __init__(self) -> None:
        self.now = START_MS

    def __call__(self) -> int:
        return self.now


# --- what a replica's storage holds -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredBatch:
    base_offset: int
    last_offset: int
    leader_epoch: int
    crc: int
    values: tuple[bytes, ...]

    @property
    def identity(self) -> tuple[int, int, int, int]:
        return self.base_offset, self.last_offset, self.leader_epoch, self.crc

    def __repr__(self) -> str:
        return f"[{self.base_offset}..{self.last_offset} e{self.leader_epoch}]"


def stored_batches(
    storage: Storage, decoded: dict[tuple[int, int], tuple[bytes, ...]]
) -> list[StoredBatch]:
    """The batches in one replica's segment objects, in offset order up to the first gap (as
    recovery would take them): what this replica holds durably, whatever its process thinks.
    ``decoded`` caches record values by (CRC, record count)."""
    objects = sorted(
        (base, info.path)
        for info in storage.list()
        if "/" not in info.path and (base := base_offset_of(info.path)) is not None
    )
    out: list[StoredBatch] = []
    for _, name in objects:
        for batch in iter_batches(storage.read(name), validate=True):
            if out and batch.base_offset != out[-1].last_offset + 1:
                return out
            key = (batch.crc, batch.record_count)
            values = decoded.get(key)
            if values is None:
                values = tuple(r.value or b"" for r in batch.records())
                decoded[key] = values
            out.append(
                StoredBatch(
                    batch.base_offset,
                    batch.last_offset,
                    batch.partition_leader_epoch,
                    batch.crc,
                    values,
                )
            )
    return out


def by_offset(batches: list[StoredBatch]) -> dict[int, bytes]:
    return {sb.base_offset + i: value for sb in batches for i, value in enumerate(sb.values)}


# --- one broker process, and what stands in for its network -----------------------------------


@dataclass(slots=True)
class PendingProduce:
    task: asyncio.Task[Any]
    index: int
    values: tuple[bytes, ...]


class InProcessConnection:
    """Stands in for ``rpc.AsyncConnection``: a request reaches the broker's current process;
    a broker that is down refuses it and a paused one does not answer (both: unreachable)."""

    def __init__(self, cluster: ModelCluster, broker_id: int) -> None:
        self.cluster = cluster
        self.broker_id = broker_id
        self.host = HOST
        self.port = port_of(broker_id)
        self.bytes_sent = 0

    async def request(self, api_key: p.ApiKey, body: Any) -> Any:
        proc = self.cluster.procs[self.broker_id]
        if proc is None:
            raise BrokerUnreachableError(self.host, self.port, "the broker is down")
        if proc.paused:
            raise BrokerUnreachableError(self.host, self.port, "the broker does not answer")
        return await proc.apis.handle(header(api_key), body)

    async def close(self) -> None:
        return None


class InProcessFetchers:
    """A process's replica fetchers, one per leader (as ReplicaFetcherManager with
    num.replica.fetchers=1), never started: the machine runs one fetch per step."""

    def __init__(self, cluster: ModelCluster, proc: BrokerProcess) -> None:
        self.cluster = cluster
        self.proc = proc
        self.by_leader: dict[int, ReplicaFetcher] = {}
        self._assigned: dict[tuple[str, int], int] = {}

    def add(self, partition: Partition) -> None:
        leader = partition.state.leader
        old = self._assigned.get(partition.key)
        if old is not None and old != leader:
            self.by_leader[old].remove(partition.key)
        fetcher = self.by_leader.get(leader)
        if fetcher is None:
            rm = self.proc.rm
            fetcher = ReplicaFetcher(self.proc.config, rm, lambda: rm.image, leader, 0)
            fetcher._conn = cast(AsyncConnection, InProcessConnection(self.cluster, leader))
            self.by_leader[leader] = fetcher
        fetcher.add(partition)
        self._assigned[partition.key] = leader

    def remove(self, partition: Partition) -> None:
        leader = self._assigned.pop(partition.key, None)
        if leader is not None:
            self.by_leader[leader].remove(partition.key)

    def leaders(self) -> list[int]:
        return sorted(leader for leader, f in self.by_leader.items() if f.partitions)


class BrokerProcess:
    """One incarnation of a broker: replica manager, request handlers, fetchers."""

    def __init__(self, cluster: ModelCluster, broker_id: int, incarnation: uuid.UUID) -> None:
        self.broker_id = broker_id
        self.incarnation = incarnation
        self.config = cluster.broker_config(broker_id)
        self.rm = ReplicaManager(self.config, Storage.from_url(self.config.log_dir))
        self.apis = KafkaApis(self.config, self.rm, None, None)
        self.fetchers = InProcessFetchers(cluster, self)
        self.rm.fetchers = self.fetchers
        self.rm.send_alter_partition = cluster.send_alter_partition
        #: the broker epoch the controller gave this process (-1: not registered)
        self.broker_epoch = -1
        self.paused = False
        self.produces: list[PendingProduce] = []

    def partition(self, index: int) -> Partition | None:
        return self.rm.partitions.get(TopicPartition(TOPIC, index))

    def leads(self, index: int) -> bool:
        partition = self.partition(index)
        return partition is not None and partition.is_leader


class ActiveController:
    """The model's controller as a node sees it (ControllerApis asks it which one is active)."""

    def __init__(self, cluster: ModelCluster) -> None:
        self.cluster = cluster

    @property
    def controller(self) -> Controller:
        return self.cluster.controller

    @property
    def active(self) -> bool:
        return True


# --- the cluster and its model ----------------------------------------------------------------


class ModelCluster:
    """Three brokers and a controller in one event loop; every method is one step."""

    def __init__(self, partitions: int) -> None:
        self.root = f"memory://replication-model-{uuid.uuid4().hex}-{next(_runs)}"
        self.partitions = partitions
        self.clock = Clock()
        # Partitions time followers' lag (replica.lag.time.max.ms) by the model's clock too.
        assert hasattr(replication.broker.partition, "_now_ms")
        self._wall_clock = replication.broker.partition._now_ms
        replication.broker.partition._now_ms = self.clock
        # and fetchers a partition's delay after an error (a replay must see the same delays)
        self._wall_monotonic = replica_fetcher._now_s
        replica_fetcher._now_s = lambda: self.clock.now / 1000
        self.loop = asyncio.new_event_loop()
        self.store = MetadataStore(Storage.from_url(f"{self.root}/meta"))
        self._controller_ids = itertools.count(100)
        self.controller = self._new_controller()
        self.controller.activate()
        self.controller_apis = ControllerApis(self.broker_config(0), ActiveController(self))
        self._incarnations = itertools.count(1)
        self._values = itertools.count()
        self.procs: dict[int, BrokerProcess | None] = dict.fromkeys(BROKERS)
        self._decoded: dict[tuple[int, int], tuple[bytes, ...]] = {}
        # the model: what was promised, per partition
        #: offset -> value of every acked record and every record a reader saw below the HW
        self.committed: list[dict[int, bytes]] = [{} for _ in range(partitions)]
        #: highest offset + 1 of anything committed (acked end, or HW shown to a reader)
        self.committed_end = [0] * partitions
        #: highest HW answered to a reader, and the newest leader epoch readers know
        self.shown_hw = [0] * partitions
        self.reader_epoch = [-1] * partitions
        #: (partition, leader epoch, offset) -> identity of the batch first stored there
        self.batch_at: dict[tuple[int, int, int], tuple[tuple[int, int, int, int], int]] = {}
        self.acked = 0
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        for broker_id in BROKERS:
            self.restart(broker_id)
            assert self.register(broker_id), f"broker {broker_id} could not register"
        self.controller.create_topic(
            TOPIC, self.partitions, len(BROKERS), [("min.insync.replicas", str(MIN_INSYNC))]
        )
        for index in range(self.partitions):  # a fixed assignment (create_topic's is random)
            replicas = tuple(BROKERS[(index + j) % len(BROKERS)] for j in range(len(BROKERS)))
            self.controller.update_partition(
                TOPIC, index, PartitionState(replicas, replicas, replicas[0], 0, 0)
            )
        for broker_id in BROKERS:
            self.propagate(broker_id)
        leading = self.leaders_running()
        for index in range(self.partitions):
            assert any(i == index for _, i in leading), (
                f"{TOPIC}-{index} has no leader after start: the harness is broken"
            )

    # --- plumbing ---------------------------------------------------------------------------

    def broker_config(self, broker_id: int) -> BrokerConfig:
        return broker_config_from(
            {
                "broker.id": broker_id,
                "listeners": f"{HOST}:{port_of(broker_id)}",
                "log.dir": f"{self.root}/broker-{broker_id}",
                "min.insync.replicas": MIN_INSYNC,
                "default.replication.factor": len(BROKERS),
                "replica.fetch.wait.max.ms": 0,
                "broker.session.timeout.ms": SESSION_TIMEOUT_MS,
                "replica.lag.time.max.ms": LAG_TIME_MAX_MS,
                # The per-partition layout (log.wal.enable=false stays available): the model
                # takes the group commit as a step (flush_dirty) and a crash drops exactly the
                # unflushed tail; over the WAL a writer thread commits on its own, which this
                # model does not drive (the WAL's own models: test_wal, test_wal_log).
                "log.wal.enable": False,
            }
        )

    def _new_controller(self) -> Controller:
        return Controller(
            MetadataStore(Storage.from_url(f"{self.root}/meta")),
            next(self._controller_ids),
            HOST,
            19_000,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            time_ms=self.clock,
        )

    def partition_storage(self, broker_id: int, index: int) -> Storage:
        return Storage.from_url(f"{self.root}/broker-{broker_id}").child(f"{TOPIC}/{index}")

    def proc(self, broker_id: int) -> BrokerProcess:
        """The broker's running process (it must be up)."""
        proc = self.procs[broker_id]
        assert proc is not None, f"broker {broker_id} is down"
        return proc

    def state(self, index: int) -> PartitionState:
        """The partition's state in the controller's newest image."""
        topic = self.controller.image.topic(TOPIC)
        assert topic is not None
        return topic.partitions[index]

    def running(self) -> list[BrokerProcess]:
        """Processes that can take a step: up and not paused."""
        return [proc for proc in self.procs.values() if proc is not None and not proc.paused]

    async def send_alter_partition(self, request: p.AlterPartitionRequest) -> Any:
        """ReplicaManager.send_alter_partition: straight to the controller's handler."""
        return await self.controller_apis.handle_alter_partition(
            header(p.ApiKey.ALTER_PARTITION), request
        )

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one step, then whatever it set off, until only parked produces are left."""

        async def step() -> T:
            result = await coro
            await self._settle()
            return result

        result = self.loop.run_until_complete(step())
        self._collect_produces()
        return result

    def call(self, fn: Callable[[], T]) -> T:
        """Run a synchronous step on the event loop (callees may create tasks)."""

        async def call() -> T:
            return fn()

        return self.run(call())

    async def _settle(self) -> None:
        me = asyncio.current_task()
        for _ in range(100):
            for _ in range(2):
                await asyncio.sleep(0)
            parked = {pp.task for proc in self.procs.values() if proc for pp in proc.produces}
            busy = [t for t in asyncio.all_tasks() if t is not me and t not in parked]
            if not busy:
                return
            for outcome in await asyncio.gather(*busy, return_exceptions=True):
                if isinstance(outcome, BaseException) and not isinstance(
                    outcome, asyncio.CancelledError
                ):
                    raise outcome
        raise AssertionError("tasks kept spawning tasks: the step did not settle")

    def _collect_produces(self) -> None:
        for proc in self.procs.values():
            if proc is None:
                continue
            waiting = []
            for pp in proc.produces:
                if not pp.task.done():
                    waiting.append(pp)
                elif not pp.task.cancelled():
                    result = pp.task.result()[(TOPIC, pp.index)]
                    if result.error is None:
                        self._ack(pp.index, result.base_offset, pp.values)
            proc.produces = waiting

    def _ack(self, index: int, base_offset: int, values: tuple[bytes, ...]) -> None:
        for i, value in enumerate(values):
            self._commit(index, base_offset + i, value, "acked")
        self.committed_end[index] = max(self.committed_end[index], base_offset + len(values))
        self.acked += len(values)

    def _commit(self, index: int, offset: int, value: bytes, how: str) -> None:
        before = self.committed[index].get(offset)
        assert before is None or before == value, (
            f"{TOPIC}-{index} offset {offset} held {before!r} (acked or read) and is now "
            f"{how} as {value!r}"
        )
        self.committed[index][offset] = value

    # --- steps --------------------------------------------------------------------------------

    def produce(self, broker_id: int, index: int, count: int) -> None:
        """An acks=all produce of ``count`` new values to a broker that says it leads."""
        proc = self.procs[broker_id]
        assert proc is not None
        values = tuple(f"p{index}-v{next(self._values)}".encode() for _ in range(count))
        records = build([Record(None, v, 1_000 + i) for i, v in enumerate(values)])

        async def send() -> None:
            task = asyncio.get_running_loop().create_task(
                proc.rm.append_records(-1, PRODUCE_TIMEOUT_MS, [(TOPIC, index, records)])
            )
            proc.produces.append(PendingProduce(task, index, values))

        self.run(send())

    def flush(self, broker_id: int) -> None:
        """Group commit: the leader's appended partitions become segment objects."""
        proc = self.procs[broker_id]
        assert proc is not None
        self.run(proc.rm.flush_dirty())

    def fetch(self, broker_id: int, leader_id: int) -> None:
        """One fetch of one follower's fetcher from one leader, and its handling."""
        proc = self.procs[broker_id]
        assert proc is not None
        fetcher = proc.fetchers.by_leader[leader_id]

        async def fetch() -> None:
            try:
                await fetcher._fetch_once()
            except ReplogError:
                pass  # ReplicaFetcher._run logs it and backs off

        self.run(fetch())

    def replicate_once(self, rounds: int = 2) -> None:
        """A moment of normal running: every running broker takes a lifecycle step (registers,
        or heartbeats and applies newer metadata) and flushes, then fetches once from each
        leader it follows; ``rounds`` times (two let the followers report what they fetched,
        so the HW moves)."""
        for _ in range(rounds):
            for proc in self.running():
                if proc.broker_epoch < 0:
                    self.register(proc.broker_id)
                else:
                    self.heartbeat(proc.broker_id)
                self.flush(proc.broker_id)
            for follower, leader in self.fetches():
                self.fetch(follower, leader)

    def propagate(self, broker_id: int) -> None:
        """The broker reads the newest metadata from the store and applies it."""
        proc = self.procs[broker_id]
        assert proc is not None
        image = self.store.read_latest()
        self.call(lambda: proc.rm.apply_image(image))

    def heartbeat(self, broker_id: int, *, apply: bool = True) -> None:
        """BrokerHeartbeat, then (as BrokerLifecycle) the newer metadata it names."""
        proc = self.procs[broker_id]
        assert proc is not None
        assert proc.broker_epoch >= 0
        request = p.BrokerHeartbeatRequest(
            broker_id=broker_id,
            broker_epoch=proc.broker_epoch,
            current_metadata_offset=proc.rm.image.version,
        )
        response = self.run(
            self.controller_apis.handle_broker_heartbeat(header(p.ApiKey.BROKER_HEARTBEAT), request)
        )
        if response.error_code == StaleBrokerEpochError.code:
            proc.broker_epoch = -1  # BrokerLifecycle registers again
        elif (
            apply and not response.error_code and response.metadata_version > proc.rm.image.version
        ):
            self.propagate(broker_id)

    def register(self, broker_id: int) -> bool:
        """BrokerRegistration of the current incarnation; True if the controller took it."""
        proc = self.procs[broker_id]
        assert proc is not None
        assert proc.broker_epoch < 0
        request = p.BrokerRegistrationRequest(
            broker_id=broker_id,
            cluster_id="",
            incarnation_id=proc.incarnation,
            listeners=[
                p.BrokerRegistrationListener(name="PLAINTEXT", host=HOST, port=port_of(broker_id))
            ],
        )
        response = self.run(
            self.controller_apis.handle_broker_registration(
                header(p.ApiKey.BROKER_REGISTRATION), request
            )
        )
        if response.error_code:
            return False  # e.g. DUPLICATE_BROKER_REGISTRATION: retried in a later step
        proc.broker_epoch = response.broker_epoch
        # As BrokerLifecycle._register: tell the replica manager, apply the metadata, then at
        # once the heartbeat that reports it (the controller unfences a broker caught up).
        proc.rm.registered(response.broker_epoch)
        self.propagate(broker_id)
        self.heartbeat(broker_id)
        return True

    def tick(self, ms: int) -> list[int]:
        """Time passes. Meanwhile running followers fetch, running registered brokers
        heartbeat, leaders drop followers that have not caught up for replica.lag.time.max.ms
        (as ReplicaManager._isr_loop), and the controller expires the sessions of brokers that
        did not heartbeat (Controller.check_sessions). Returns the brokers it fenced."""
        self.clock.now += ms
        for follower, leader in self.fetches():
            self.fetch(follower, leader)
        for proc in self.running():
            if proc.broker_epoch >= 0:
                self.heartbeat(proc.broker_id, apply=False)
        for proc in self.running():
            for partition in list(proc.rm.partitions.values()):
                shrunk = partition.isr_to_shrink(proc.config.replica_lag_time_max_ms)
                if shrunk is not None:
                    self.alter_isr(proc.broker_id, partition.index, shrunk)
        return self.call(self.controller.check_sessions)

    def crash(self, broker_id: int) -> None:
        """SIGKILL: the process is gone with whatever it had not flushed; produces parked on
        it get no answer (not acked)."""
        proc = self.procs[broker_id]
        assert proc is not None
        for pp in proc.produces:
            pp.task.cancel()
        proc.produces = []
        self.procs[broker_id] = None
        self.loop.run_until_complete(self._settle())

    def restart(self, broker_id: int) -> None:
        """A new incarnation on the same storage. As the node (replication.server.node), it
        reads the stored metadata at once; it registers in a later step."""
        assert self.procs[broker_id] is None
        incarnation = uuid.UUID(int=next(self._incarnations))
        self.procs[broker_id] = BrokerProcess(self, broker_id, incarnation)
        self.propagate(broker_id)

    def shrink_isr(self, broker_id: int, index: int, member: int) -> None:
        """The leader drops a follower from the ISR (as it may once the follower lagged)."""
        partition = self.proc(broker_id).partition(index)
        assert partition is not None
        self.alter_isr(broker_id, index, tuple(r for r in partition.state.isr if r != member))

    def alter_isr(self, broker_id: int, index: int, isr: tuple[int, ...]) -> None:
        """The leader's AlterPartition, through the controller, applied when committed."""
        rm = self.proc(broker_id).rm
        partition = rm.partitions[TopicPartition(TOPIC, index)]
        self.call(lambda: rm._alter_isr(partition, isr))

    def set_paused(self, broker_id: int, paused: bool) -> None:
        """SIGSTOP / SIGCONT."""
        proc = self.procs[broker_id]
        assert proc is not None
        proc.paused = paused

    def controller_failover(self) -> None:
        """A new controller takes over the metadata store (the old one is deposed)."""
        self.controller = self._new_controller()
        self.call(self.controller.activate)

    def read(self, broker_id: int, index: int) -> None:
        """A consumer fetches everything below the HW from a broker that says it leads, with
        the newest leader epoch it knows (KIP-320), and remembers what it saw."""
        proc = self.procs[broker_id]
        assert proc is not None
        topic = proc.rm.image.topic(TOPIC)
        known = topic.partitions[index].leader_epoch if topic is not None else -1
        epoch = max(self.reader_epoch[index], known)
        request = p.FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=1,
            session_id=0,
            session_epoch=-1,
            topics=[
                p.FetchRequestTopic(
                    topic=TOPIC,
                    partitions=[
                        p.FetchRequestPartition(
                            partition=index,
                            current_leader_epoch=epoch,
                            fetch_offset=0,
                            partition_max_bytes=1 << 22,
                        )
                    ],
                )
            ],
        )
        conn = InProcessConnection(self, broker_id)
        response = self.run(conn.request(p.ApiKey.FETCH, request))
        part = response.responses[0].partitions[0]
        if part.error_code:
            return
        hw = part.high_watermark
        assert hw >= self.shown_hw[index], (
            f"{TOPIC}-{index}: broker {broker_id} (leader epoch {epoch}) showed a reader HW "
            f"{hw}, below the {self.shown_hw[index]} shown before"
        )
        self.shown_hw[index] = hw
        self.reader_epoch[index] = epoch
        for batch in iter_batches(part.records or b""):
            for record in batch.records():
                if record.offset < hw:
                    self._commit(
                        index, record.offset, record.value or b"", f"read from {broker_id}"
                    )
        self.committed_end[index] = max(self.committed_end[index], hw)

    # --- what the rules may do now -----------------------------------------------------------

    def running_ids(self, registered: bool | None = None) -> list[int]:
        return [
            proc.broker_id
            for proc in self.running()
            if registered is None or (proc.broker_epoch >= 0) == registered
        ]

    def up_ids(self) -> list[int]:
        return [b for b in BROKERS if self.procs[b] is not None]

    def down_ids(self) -> list[int]:
        return [b for b in BROKERS if self.procs[b] is None]

    def paused_ids(self) -> list[int]:
        return [b for b, proc in self.procs.items() if proc is not None and proc.paused]

    def leaders_running(self) -> list[tuple[int, int]]:
        return [
            (proc.broker_id, index)
            for proc in self.running()
            for index in range(self.partitions)
            if proc.leads(index)
        ]

    def fetches(self) -> list[tuple[int, int]]:
        return [
            (proc.broker_id, leader)
            for proc in self.running()
            for leader in proc.fetchers.leaders()
        ]

    def shrinkable(self) -> list[tuple[int, int, int]]:
        out: list[tuple[int, int, int]] = []
        for broker_id, index in self.leaders_running():
            partition = self.proc(broker_id).partition(index)
            assert partition is not None
            out.extend((broker_id, index, m) for m in partition.state.isr if m != broker_id)
        return out

    # --- invariants -----------------------------------------------------------------------------

    def check(self) -> None:
        topic = self.controller.image.topic(TOPIC)
        assert topic is not None
        for index in range(self.partitions):
            stored = {
                b: stored_batches(self.partition_storage(b, index), self._decoded) for b in BROKERS
            }
            where = f"{TOPIC}-{index} ({topic.partitions[index]}; stored: {stored})"
            self._check_epoch_offsets(index, stored, where)
            for b, batches in stored.items():
                values = [v for sb in batches for v in sb.values]
                assert len(values) == len(set(values)), f"broker {b} stores a value twice: {where}"
            self._check_isr(index, topic.partitions[index], stored, where)

    def _check_epoch_offsets(
        self, index: int, stored: dict[int, list[StoredBatch]], where: str
    ) -> None:
        """(4) A (leader epoch, offset) names one batch, on every replica, forever."""
        for b, batches in stored.items():
            for sb in batches:
                for offset in range(sb.base_offset, sb.last_offset + 1):
                    first = self.batch_at.setdefault(
                        (index, sb.leader_epoch, offset), (sb.identity, b)
                    )
                    assert first[0] == sb.identity, (
                        f"leader epoch {sb.leader_epoch} offset {offset}: broker {b} stores "
                        f"batch {sb.identity}, broker {first[1]} stored {first[0]} there "
                        f"before: {where}"
                    )

    def _check_isr(
        self,
        index: int,
        state: PartitionState,
        stored: dict[int, list[StoredBatch]],
        where: str,
    ) -> None:
        committed = self.committed[index]
        end = self.committed_end[index]
        reference: tuple[int, list[tuple[int, int, int, int]]] | None = None
        for b in state.isr:
            batches = stored[b]
            if committed:
                # (5) nothing committed is below the log start offset
                start = batches[0].base_offset if batches else None
                assert start is not None, f"ISR member {b} holds nothing: {where}"
                assert start <= min(committed), (
                    f"ISR member {b} no longer holds the start of what was committed: {where}"
                )
            # (1) every acked or read record, at its offset
            held = by_offset(batches)
            lost = {o: v for o, v in committed.items() if held.get(o) != v}
            assert not lost, f"ISR member {b} lost committed records {lost}: {where}"
            # (2) identical batches below the committed end
            below = [sb.identity for sb in batches if sb.base_offset < end]
            if reference is None:
                reference = (b, below)
            else:
                assert below == reference[1], (
                    f"ISR members {reference[0]} and {b} differ below the committed end "
                    f"{end}: {where}"
                )
        # (1) and the leader serves it
        if state.leader == NO_LEADER:
            return
        proc = self.procs[state.leader]
        partition = proc.partition(index) if proc is not None else None
        if partition is None or not partition.is_leader or not committed:
            return
        plog = partition.log
        upper = min(end, plog.log_end_offset)
        data = plog.read(plog.log_start_offset, 1 << 24, max_offset=upper)
        served = {r.offset: r.value for b in iter_batches(data) for r in b.records()}
        missing = {o: v for o, v in committed.items() if served.get(o) != v}
        assert not missing, (
            f"leader {state.leader} (LEO {plog.log_end_offset}) does not serve committed "
            f"records {missing}: {where}"
        )

    # --- end ------------------------------------------------------------------------------------

    def close(self) -> None:
        async def stop() -> None:
            for proc in self.procs.values():
                for pp in proc.produces if proc else []:
                    pp.task.cancel()
            me = asyncio.current_task()
            await asyncio.gather(
                *(t for t in asyncio.all_tasks() if t is not me), return_exceptions=True
            )

        replication.broker.partition._now_ms = self._wall_clock
        replica_fetcher._now_s = self._wall_monotonic
        self.loop.run_until_complete(stop())
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()
        root = Storage.from_url(self.root)
        for info in root.list():
            root.delete(info.path)


# --- the state machine ----------------------------------------------------------------------


def _can(what: Callable[[ModelCluster], object]) -> Callable[[ReplicationMachine], bool]:
    return lambda self: self.cluster is not None and bool(what(self.cluster))


class ReplicationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cluster: ModelCluster | None = None

    @property
    def c(self) -> ModelCluster:
        assert self.cluster is not None
        return self.cluster

    @initialize(partitions=st.integers(1, 2))
    def start(self, partitions: int) -> None:
        self.cluster = ModelCluster(partitions)

    def teardown(self) -> None:
        if self.cluster is not None:
            self.cluster.close()

    @precondition(_can(ModelCluster.leaders_running))
    @rule(data=st.data(), count=st.integers(1, 3), flush=st.booleans())
    def produce(self, data: st.DataObject, count: int, flush: bool) -> None:
        """An acks=all produce to a broker that says it leads (and its group commit)."""
        broker_id, index = data.draw(st.sampled_from(self.c.leaders_running()), label="leader")
        self.c.produce(broker_id, index, count)
        if flush:
            self.c.flush(broker_id)

    @precondition(_can(ModelCluster.fetches))
    @rule(data=st.data())
    def fetch(self, data: st.DataObject) -> None:
        follower, leader = data.draw(st.sampled_from(self.c.fetches()), label="follower, leader")
        self.c.fetch(follower, leader)

    @precondition(_can(ModelCluster.running_ids))
    @rule()
    def replicate(self) -> None:
        """A moment of normal running, in one step (ModelCluster.replicate_once)."""
        self.c.replicate_once()

    @precondition(_can(ModelCluster.running_ids))
    @rule(data=st.data())
    def propagate_metadata(self, data: st.DataObject) -> None:
        self.c.propagate(data.draw(st.sampled_from(self.c.running_ids()), label="broker"))

    @precondition(_can(lambda c: c.running_ids(registered=False)))
    @rule(data=st.data())
    def register(self, data: st.DataObject) -> None:
        ids = self.c.running_ids(registered=False)
        self.c.register(data.draw(st.sampled_from(ids), label="broker"))

    @precondition(lambda self: self.cluster is not None)
    @rule(ms=st.sampled_from([500, LAG_TIME_MAX_MS + 100, SESSION_TIMEOUT_MS + 1]))
    def tick(self, ms: int) -> None:
        """Time passes (ModelCluster.tick): lagging followers leave the ISR, sessions of
        brokers that did not heartbeat expire."""
        self.c.tick(ms)

    @precondition(lambda self: self.cluster is not None)
    @rule(data=st.data())
    def fault(self, data: st.DataObject) -> None:
        """One fault (one rule for all, so that faults stay rarer than normal running):
        SIGKILL with a restart at once (a supervisor) or later, SIGSTOP / SIGCONT, a leader
        dropping a follower from the ISR, a controller failover. Before a SIGKILL, the
        victim's followers may fetch from it once (so they hold what it had not flushed: the
        race that once lost acked records)."""
        c = self.c
        kinds = ["controller_failover"]
        if c.up_ids():
            kinds += ["crash_restart", "crash_restart", "crash"]  # the supervisor's case first
        if c.down_ids():
            kinds.append("restart")
        if c.running_ids():
            kinds.append("pause")
        if c.paused_ids():
            kinds.append("resume")
        if c.shrinkable():
            kinds.append("shrink_isr")
        kind = data.draw(st.sampled_from(kinds), label="fault")
        if kind.startswith("crash"):
            leaders = [b for b, _ in c.leaders_running()]
            broker_id = data.draw(st.sampled_from(c.up_ids() + leaders), label="broker")
            if data.draw(st.booleans(), label="its followers fetch first"):
                for follower, leader in c.fetches():
                    if leader == broker_id:
                        c.fetch(follower, leader)
            c.crash(broker_id)
            if kind == "crash_restart":
                c.restart(broker_id)
        elif kind == "restart":
            c.restart(data.draw(st.sampled_from(c.down_ids()), label="broker"))
        elif kind == "pause":
            c.set_paused(data.draw(st.sampled_from(c.running_ids()), label="broker"), True)
        elif kind == "resume":
            c.set_paused(data.draw(st.sampled_from(c.paused_ids()), label="broker"), False)
        elif kind == "shrink_isr":
            broker_id, index, member = data.draw(
                st.sampled_from(c.shrinkable()), label="leader, partition, dropped"
            )
            c.shrink_isr(broker_id, index, member)
        else:
            c.controller_failover()

    @precondition(_can(ModelCluster.leaders_running))
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        broker_id, index = data.draw(st.sampled_from(self.c.leaders_running()), label="leader")
        self.c.read(broker_id, index)

    @invariant()
    def replicas_agree(self) -> None:
        if self.cluster is not None:
            self.cluster.check()


TestReplicationModel = ReplicationMachine.TestCase
TestReplicationModel.settings = settings(
    max_examples=int(os.environ.get("REPLOG_MODEL_EXAMPLES", "300")),
    stateful_step_count=40,
    deadline=None,
    # shrinking a stateful failure takes minutes: one is enough
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# --- the restarted-leader race, step by step ----------------------------------------------


def replicate(cluster: ModelCluster, rounds: int = 6) -> None:
    """Every running broker applies metadata, flushes and fetches, a few times over."""
    for _ in range(rounds):
        for proc in cluster.running():
            cluster.propagate(proc.broker_id)
            cluster.flush(proc.broker_id)
        cluster.check()
        for follower, leader in cluster.fetches():
            cluster.fetch(follower, leader)
            cluster.check()


def produce_to_leaders(cluster: ModelCluster, count: int) -> None:
    for broker_id, index in cluster.leaders_running():
        cluster.produce(broker_id, index, count)
        cluster.check()


def test_restart_of_leader_while_follower_paused_loses_no_acked_record() -> None:
    """The restarted-leader race: leader 0 at epoch E with ISR {0,1,2}; the followers fetched
    its unflushed tail; broker 1 is paused; broker 0 is killed and restarted at once (its
    registration is refused while its old session lives); producers carry on; broker 1
    resumes; the old session expires and leaders are elected. No acked record may be lost,
    the replicas must end identical, and the restarted broker must not lead again at epoch E."""
    cluster = ModelCluster(1)
    try:
        state = cluster.state(0)
        assert state.leader == 0
        assert state.isr == (0, 1, 2)
        epoch = state.leader_epoch
        for _ in range(2):
            produce_to_leaders(cluster, 2)
            replicate(cluster)
        acked_before = cluster.acked
        assert acked_before == 4
        cluster.read(0, 0)

        # an unflushed tail on leader 0, which both followers fetch (and flush)
        cluster.produce(0, 0, 3)
        cluster.fetch(1, 0)
        cluster.fetch(2, 0)
        cluster.check()
        leader_log = cluster.proc(0).partition(0)
        assert leader_log is not None
        assert leader_log.log.durable_end_offset == 4
        assert leader_log.log.log_end_offset == 7

        cluster.set_paused(1, True)
        cluster.crash(0)
        cluster.restart(0)
        cluster.check()
        assert not cluster.register(0), "a second live incarnation of broker 0 was accepted"
        cluster.check()
        restarted = cluster.proc(0).partition(0)
        assert restarted is None or not restarted.is_leader or restarted.leader_epoch > epoch, (
            f"the restarted broker leads again at leader epoch {epoch}"
        )

        # producers carry on with whoever says it leads; broker 2 keeps fetching
        for _ in range(3):
            produce_to_leaders(cluster, 2)
            for proc in cluster.running():
                cluster.flush(proc.broker_id)
                cluster.check()
            for follower, leader in cluster.fetches():
                cluster.fetch(follower, leader)
                cluster.check()

        cluster.set_paused(1, False)
        replicate(cluster, rounds=2)
        for broker_id, _ in cluster.leaders_running():
            cluster.read(broker_id, 0)

        # the old session expires; broker 0 registers; elections; producers carry on
        cluster.tick(SESSION_TIMEOUT_MS + 1)
        broker_0 = cluster.controller.image.broker(0)
        assert broker_0 is not None
        assert broker_0.fenced, "broker 0's old session did not expire"
        cluster.check()
        assert cluster.register(0)
        cluster.check()
        for _ in range(3):
            replicate(cluster)
            produce_to_leaders(cluster, 2)
            for broker_id, _ in cluster.leaders_running():
                cluster.read(broker_id, 0)
        for _ in range(3):
            cluster.tick(500)
            replicate(cluster)

        assert cluster.state(0).leader_epoch > epoch, "leadership never moved off broker 0"
        assert cluster.acked > acked_before, "nothing was acked after the restart"
        logs = {
            b: [sb.identity for sb in stored_batches(cluster.partition_storage(b, 0), {})]
            for b in BROKERS
        }
        assert logs[0] == logs[1] == logs[2], f"replicas differ at the end: {logs}"
        held = by_offset(stored_batches(cluster.partition_storage(0, 0), {}))
        lost = {o: v for o, v in cluster.committed[0].items() if held.get(o) != v}
        assert not lost, f"acked or read records lost: {lost}"
    finally:
        cluster.close()


def test_a_fetch_step_with_every_partition_delayed_returns_at_once() -> None:
    """The machine drives ``ReplicaFetcher._fetch_once`` as one step: with every partition
    delayed by its error it returns False (back off) at once; the wait until the first is due
    is ``_run``'s (``_back_off``). When the step itself slept until then, each schedule that
    reached it waited in real time, and the 300 schedules took 8 minutes instead of 20 s."""
    cluster = ModelCluster(1)
    try:
        replicate(cluster)
        fetcher = cluster.proc(1).fetchers.by_leader[0]
        assert fetcher.partitions, "broker 1 follows no partition of broker 0"
        for key in fetcher.partitions:
            fetcher._delayed[key] = cluster.clock.now / 1000 + 3600
        # bounded so that a step that sleeps fails here instead of at the suite's timeout
        assert cluster.run(asyncio.wait_for(fetcher._fetch_once(), 60)) is False
    finally:
        cluster.close()
