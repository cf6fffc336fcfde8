"""The acks=all critical path waits for data, not for timers.

A controller and three brokers run as real :class:`~replication.server.node.Node` objects in
this test's event loop (real sockets, real fetch sessions, real local files with fsync), so
the tests can read the counters the fetchers and replica managers keep. Produces go through
the leader's real ``ReplicaManager.append_records`` with acks=all.

Every assertion is on counts and orderings (a fetcher's backoffs, flush-loop wake-ups,
storage requests), never on durations: the point of each test is that a timer is *not* on
the path, which a count shows on any machine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from logstore.batch import Record, build
from logstore.errors import ConfigError
from logstore.storage import Storage
from logstore.wal_index import WAL_PREFIX
from replication import protocol as p
from replication.broker.log_flush import compaction_window_bytes, flush_interval_ms
from replication.broker.partition import Partition
from replication.broker.replica_manager import ReplicaManager
from replication.common import TopicPartition
from replication.config import broker_config_from
from replication.errors import (
    KafkaStorageError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from replication.protocol.rpc import AsyncConnection
from replication.server.node import Node
from tests.cluster import FAST_FAILOVER
from tests.conftest import S3Location

TOPIC = "lat"
DEADLINE_S = 30.0


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` on the loop until it holds (a deadline, not a timing assertion)."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class InProcessCluster:
    """A controller and ``brokers`` brokers as Nodes in this event loop."""

    def __init__(self, root: Path, brokers: int, overrides: dict[str, Any]) -> None:
        metadata = (root / "metadata").as_uri()
        common = {**FAST_FAILOVER, "metadata.log.dir": metadata, **overrides}
        self.controller = Node(
            broker_config_from(
                {
                    **common,
                    "broker.id": 100,
                    "process.roles": "controller",
                    "listeners": "127.0.0.1:0",
                    "log.dir": (root / "controller").as_uri(),
                }
            )
        )
        self.brokers = {
            i: Node(
                broker_config_from(
                    {
                        **common,
                        "broker.id": i,
                        "process.roles": "broker",
                        "listeners": "127.0.0.1:0",
                        "log.dir": (root / f"broker-{i}").as_uri(),
                    }
                )
            )
            for i in range(brokers)
        }

    async def start(self) -> None:
        await self.controller.start()
        await asyncio.gather(*(b.start() for b in self.brokers.values()))

    async def stop(self) -> None:
        for node in [*self.brokers.values(), self.controller]:
            await node.stop()

    def rm(self, broker_id: int) -> ReplicaManager:
        rm = self.brokers[broker_id].replica_manager
        assert rm is not None
        return rm

    def replicas(self, topic: str, index: int = 0) -> dict[int, Partition]:
        key = TopicPartition(topic, index)
        return {
            i: part for i in self.brokers if (part := self.rm(i).partitions.get(key)) is not None
        }

    def leader(self, topic: str, index: int = 0) -> int:
        leaders = [i for i, part in self.replicas(topic, index).items() if part.is_leader]
        return leaders[0] if len(leaders) == 1 else -1

    async def request_topic(
        self, name: str, partitions: int = 1, rf: int = 3, *, node: Node | None = None
    ) -> None:
        """Send CreateTopics to ``node`` (broker 0 by default) and check the answer."""
        node = node or self.brokers[0]
        conn = AsyncConnection(node.host, node.port, client_id="test")
        try:
            response = await conn.request(
                p.ApiKey.CREATE_TOPICS,
                p.CreateTopicsRequest(
                    topics=[
                        p.CreatableTopic(
                            name=name, num_partitions=partitions, replication_factor=rf
                        )
                    ]
                ),
            )
        finally:
            await conn.close()
        assert response.topics[0].error_code == 0, response

    async def create_topic(self, name: str, partitions: int = 1, rf: int = 3) -> None:
        await self.request_topic(name, partitions, rf)

        def ready() -> bool:
            for index in range(partitions):
                replicas = self.replicas(name, index)
                leader = self.leader(name, index)
                if len(replicas) < rf or leader < 0:
                    return False
                if len(replicas[leader].state.isr) < rf:
                    return False
            return True

        await wait_for(ready, f"{name}: every partition led with a full ISR")

    async def produce(self, topic: str, index: int, values: list[bytes]) -> int:
        """acks=all through the leader's replica manager; the base offset."""
        leader = self.leader(topic, index)
        records = build([Record(None, v, 0) for v in values])
        result = await self.rm(leader).append_records(-1, 30_000, [(topic, index, records)])
        outcome = result[TopicPartition(topic, index)]
        assert outcome.error is None, outcome.error
        return outcome.base_offset


@asynccontextmanager
async def running(tmp_path: Path, **overrides: Any) -> AsyncIterator[InProcessCluster]:
    cluster = InProcessCluster(tmp_path, 3, overrides)
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop()


def fetchers_of(cluster: InProcessCluster, broker_id: int) -> list[Any]:
    manager = cluster.brokers[broker_id].fetchers
    assert manager is not None
    return list(manager.fetchers.values())


async def steady(cluster: InProcessCluster, topic: str, index: int = 0) -> int:
    """Wait until every replica is in the ISR and has the leader's whole log durable; the
    leader's id."""

    def caught_up() -> bool:
        leader = cluster.leader(topic, index)
        if leader < 0:
            return False
        replicas = cluster.replicas(topic, index)
        end = replicas[leader].log.log_end_offset
        return len(replicas[leader].state.isr) == len(cluster.brokers) and all(
            r.log.durable_end_offset == end for r in replicas.values()
        )

    await wait_for(caught_up, f"{topic}-{index}: a full ISR with the whole log durable")
    return cluster.leader(topic, index)


@pytest.mark.cluster
def test_idle_long_poll_does_not_put_the_follower_to_sleep(tmp_path: Path) -> None:
    """L6a: after the producer goes quiet, the followers' long polls come back without
    records (only HW news). That is no error, so no replica.fetch.backoff.ms: a produce that
    follows is fetched at once. The fetchers' backoff counters do not move from the steady
    state on, and the acks=all produce still needed every follower's durable copy."""

    async def scenario() -> None:
        async with running(tmp_path, **{"replica.fetch.wait.max.ms": 50}) as cluster:
            await cluster.create_topic(TOPIC)
            await cluster.produce(TOPIC, 0, [b"first"])
            leader = await steady(cluster, TOPIC)
            followers = [i for i in cluster.brokers if i != leader]
            fetchers = [f for i in followers for f in fetchers_of(cluster, i)]
            backoffs = [f.backoffs for f in fetchers]
            sent = [f.requests_sent for f in fetchers]
            # two whole fetches later: at least one long poll expired with no records
            await wait_for(
                lambda: all(f.requests_sent >= n + 2 for f, n in zip(fetchers, sent, strict=True)),
                "the followers' idle long polls to come back",
            )
            base = await cluster.produce(TOPIC, 0, [b"second"])
            replicas = cluster.replicas(TOPIC)
            assert len(replicas[leader].state.isr) == 3, "the ack needed every follower"
            for i in followers:
                assert replicas[i].log.durable_end_offset >= base + 1
            assert [f.backoffs for f in fetchers] == backoffs

    asyncio.run(scenario())


async def idle_window(cluster: InProcessCluster, leader: int) -> None:
    """Let the cluster idle for two whole follower long polls (counted, not slept)."""
    fetchers = [f for i in cluster.brokers if i != leader for f in fetchers_of(cluster, i)]
    sent = [f.requests_sent for f in fetchers]
    await wait_for(
        lambda: all(f.requests_sent >= n + 2 for f, n in zip(fetchers, sent, strict=True)),
        "two idle follower long polls",
    )


@pytest.mark.cluster
def test_idle_broker_flush_loop_never_wakes_and_an_append_is_flushed_at_once(
    tmp_path: Path,
) -> None:
    """L2/L13: with the default log.flush.interval.ms (-1: 0 on local files) an idle broker's
    flush loop sleeps on its event (0 wake-ups over an idle window), and one acks=all append
    wakes it exactly once: one flush, no timer tick before or after it."""

    async def scenario() -> None:
        # Subject: the per-partition layout's flush loop (log.wal.enable=false stays available).
        overrides = {"replica.fetch.wait.max.ms": 50, "log.wal.enable": False}
        async with running(tmp_path, **overrides) as cluster:
            assert {cluster.rm(i).flush_interval_ms for i in cluster.brokers} == {0}
            await cluster.create_topic(TOPIC)
            await cluster.produce(TOPIC, 0, [b"first"])
            leader = await steady(cluster, TOPIC)
            rms = [cluster.rm(i) for i in cluster.brokers]
            wakeups = [rm.flush_wakeups for rm in rms]
            await idle_window(cluster, leader)
            assert [rm.flush_wakeups for rm in rms] == wakeups, "an idle broker woke to flush"
            rm = cluster.rm(leader)
            before = rm.flush_wakeups, rm.flushes
            await cluster.produce(TOPIC, 0, [b"second"])
            assert (rm.flush_wakeups, rm.flushes) == (before[0] + 1, before[1] + 1)

    asyncio.run(scenario())


def wal_objects_written(rm: ReplicaManager) -> int:
    """The L0 objects under the broker root (the WAL's fence included); 0 without the WAL."""
    return len(rm.storage.list(f"{WAL_PREFIX}/L0")) if rm.wal_writer is not None else 0


@pytest.mark.cluster
@pytest.mark.parametrize("wal", [True, False], ids=["wal", "segments"])
def test_flush_interval_is_the_least_spacing_between_flush_starts(
    tmp_path: Path, wal: bool
) -> None:
    """An explicit log.flush.interval.ms wins over the per-storage default. The first append
    is flushed at once (nothing flushed in the last interval; over the WAL: one object, the
    fence written at start is no flush start); the next one, appended right after, waits for
    the interval: the followers have it (replication overlaps the leader's flush) while the
    leader's durable end has not moved and it started no flush (wrote no WAL object). In the
    per-partition layout the followers store it too (they flush what they fetch at once);
    over the WAL their writers space their objects the same way (not asserted: a follower
    stops waiting after replica.lag.time.max.ms)."""

    async def scenario() -> None:
        async with running(
            tmp_path,
            **{
                "replica.fetch.wait.max.ms": 50,
                "log.flush.interval.ms": 600_000,
                "log.wal.enable": wal,
            },
        ) as cluster:
            assert {cluster.rm(i).flush_interval_ms for i in cluster.brokers} == {600_000}
            await cluster.create_topic(TOPIC)
            rm = cluster.rm(cluster.leader(TOPIC))
            objects = wal_objects_written(rm)
            await cluster.produce(TOPIC, 0, [b"first"])  # acks=all: flushed without the timer
            leader = await steady(cluster, TOPIC)
            assert cluster.rm(leader) is rm
            assert wal_objects_written(rm) == (objects + 1 if wal else 0)
            flushes = rm.flushes
            objects = wal_objects_written(rm)
            records = build([Record(None, b"second", 0)])
            result = await rm.append_records(1, 30_000, [(TOPIC, 0, records)])
            assert result[TopicPartition(TOPIC, 0)].error is None
            replicas = cluster.replicas(TOPIC)
            end = replicas[leader].log.log_end_offset
            await wait_for(
                lambda: all(
                    (r.log.log_end_offset if wal else r.log.durable_end_offset) == end
                    for i, r in replicas.items()
                    if i != leader
                ),
                "the followers to have the second record",
            )
            assert replicas[leader].log.durable_end_offset == end - 1
            assert rm.flushes == flushes
            assert wal_objects_written(rm) == objects

    asyncio.run(scenario())


@pytest.mark.unit
def test_flush_interval_default_follows_the_storage_kind(tmp_path: Path) -> None:
    """-1 (the default) resolves to 0 for local files and memory, 250 ms for object stores;
    any explicit value is kept."""
    default = broker_config_from({})
    assert default.log_flush_interval_ms == -1
    local = Storage.from_url(tmp_path.as_uri())
    memory = Storage.from_url("memory://lat-flush-default/x")
    assert flush_interval_ms(default, local) == 0
    assert flush_interval_ms(default, memory) == 0
    explicit = broker_config_from({"log.flush.interval.ms": 200})
    assert flush_interval_ms(explicit, local) == 200


@pytest.mark.s3
def test_flush_interval_default_on_s3(s3_url: S3Location) -> None:
    storage = Storage.from_url(s3_url.url, **s3_url.storage_options)
    assert flush_interval_ms(broker_config_from({}), storage) == 250
    assert flush_interval_ms(broker_config_from({"log.flush.interval.ms": 0}), storage) == 0
    # each packed object is a PUT there: bigger compaction windows
    assert compaction_window_bytes(broker_config_from({}), storage) == 64 * MIB


MIB = 1024 * 1024


@pytest.mark.unit
def test_compaction_window_default_follows_the_storage_kind(tmp_path: Path) -> None:
    """-1 (the default) resolves to 16 MiB for local files and memory (short rounds: the
    foreground writes wait behind them); any explicit value is kept; 0 is refused by name."""
    default = broker_config_from({})
    assert default.wal_compaction_window_bytes == -1
    local = Storage.from_url(tmp_path.as_uri())
    memory = Storage.from_url("memory://lat-window-default/x")
    assert compaction_window_bytes(default, local) == 16 * MIB
    assert compaction_window_bytes(default, memory) == 16 * MIB
    explicit = broker_config_from({"wal.compaction.window.bytes": 4096})
    assert compaction_window_bytes(explicit, local) == 4096
    with pytest.raises(ConfigError, match=r"wal\.compaction\.window\.bytes=0"):
        compaction_window_bytes(broker_config_from({"wal.compaction.window.bytes": 0}), local)


@pytest.mark.cluster
def test_a_fetch_response_of_many_partitions_is_stored_whole(tmp_path: Path) -> None:
    """L5: one acks=all produce to 20 partitions reaches each follower in one or a few fetch
    responses, appended in one hop and flushed concurrently; the produce completes only when
    every follower has every partition durable (its next fetch offset), one object each."""
    partitions = 20

    async def scenario() -> None:
        # Subject: one segment object per partition per flush, the per-partition layout's
        # (log.wal.enable=false stays available; the WAL's own test: test_wal_cluster).
        overrides = {"replica.fetch.wait.max.ms": 50, "log.wal.enable": False}
        async with running(tmp_path, **overrides) as cluster:
            await cluster.create_topic(TOPIC, partitions)
            by_leader: dict[int, list[tuple[str, int, bytes | bytearray | memoryview | None]]] = {}
            for index in range(partitions):
                await steady(cluster, TOPIC, index)
                records = build([Record(None, f"v{index}".encode(), 0)])
                by_leader.setdefault(cluster.leader(TOPIC, index), []).append(
                    (TOPIC, index, records)
                )
            fetchers = [f for i in cluster.brokers for f in fetchers_of(cluster, i)]
            backoffs = [f.backoffs for f in fetchers]
            objects_before = {
                (i, index): len(replica.log.segments())
                for index in range(partitions)
                for i, replica in cluster.replicas(TOPIC, index).items()
            }
            results = await asyncio.gather(
                *(
                    cluster.rm(leader).append_records(-1, 30_000, e)
                    for leader, e in by_leader.items()
                )
            )
            assert all(r.error is None for result in results for r in result.values())
            for index in range(partitions):
                replicas = cluster.replicas(TOPIC, index)
                leader = cluster.leader(TOPIC, index)
                assert len(replicas[leader].state.isr) == 3
                for i, replica in replicas.items():
                    assert replica.log.durable_end_offset == 1, (i, index)
                    assert len(replica.log.segments()) == objects_before[(i, index)] + 1
            assert [f.backoffs for f in fetchers] == backoffs

    asyncio.run(scenario())


@pytest.mark.cluster
def test_a_follower_that_learned_a_new_topic_first_is_not_put_off_by_its_leader(
    tmp_path: Path,
) -> None:
    """Brokers learn a new version of the metadata at their next heartbeat, so up to a
    heartbeat interval apart. A follower that learned of a new topic before its leader
    fetches, and the leader does not know the partition: the refusal makes the leader read
    the metadata store at once (a catch-up), and the follower asks again within
    METADATA_RETRY_MS instead of replica.fetch.backoff.ms. Here the brokers' heartbeat
    loops are stopped once they registered (sessions of 3 minutes keep them unfenced) and the
    backoff is a minute: only the catch-up teaches the leader, and only the short retry lets
    the follower in before the deadline. The third replica is taught the same way (a fetch of
    its own), and an acks=all produce completes."""

    async def scenario() -> None:
        overrides = {
            "broker.session.timeout.ms": 180_000,
            "replica.fetch.backoff.ms": 60_000,
            "replica.fetch.wait.max.ms": 50,
        }
        async with running(tmp_path, **overrides) as cluster:
            for broker in cluster.brokers.values():
                assert broker.lifecycle is not None
                await broker.lifecycle.stop()  # no heartbeat names a new version from here on
            # straight to the controller: a broker forwarding it would read the new metadata
            # before answering (KIP-590's promise), and so know the topic from the start
            await cluster.request_topic(TOPIC, node=cluster.controller)
            lifecycle = cluster.brokers[0].lifecycle
            assert lifecycle is not None
            image = await asyncio.to_thread(lifecycle.store.read_latest, None)
            topic = image.topic(TOPIC)
            assert topic is not None
            leader = topic.partitions[0].leader
            first, second = (i for i in cluster.brokers if i != leader)
            assert all(not cluster.rm(i).partitions for i in cluster.brokers), (
                "no broker may know the topic before the test teaches one"
            )

            async def teach(broker: int) -> None:
                taught = cluster.brokers[broker].lifecycle
                assert taught is not None
                await taught.refresh_metadata()

            def fetched_by(follower: int) -> bool:
                replica = cluster.replicas(TOPIC).get(leader)
                return (
                    replica is not None
                    and replica.is_leader
                    and replica.followers[follower].last_fetch_leader_leo >= 0
                )

            await teach(first)
            await wait_for(lambda: fetched_by(first), "the leader to serve the first follower")
            leader_lifecycle = cluster.brokers[leader].lifecycle
            assert leader_lifecycle is not None
            assert leader_lifecycle.catch_ups >= 1
            await teach(second)
            await wait_for(lambda: fetched_by(second), "the leader to serve the second follower")
            await wait_for(
                lambda: len(cluster.replicas(TOPIC)[leader].state.isr) == 3, "a full ISR"
            )
            base = await cluster.produce(TOPIC, 0, [b"after the catch-up"])
            for replica in cluster.replicas(TOPIC).values():
                assert replica.log.durable_end_offset == base + 1
            fetchers = [f for i in (first, second) for f in fetchers_of(cluster, i)]
            assert [f.backoffs for f in fetchers] == [0] * len(fetchers)
            # However many requests show the leader behind, one store read at a time, spaced;
            # reads that find nothing new (all from here on) space the next ones out, up to a
            # heartbeat interval.
            heartbeat_s = cluster.brokers[leader].config.broker_heartbeat_interval_ms / 1000
            reads = leader_lifecycle.catch_ups
            calls = 0

            def spaced_out() -> bool:
                nonlocal calls
                for _ in range(10):  # a burst of requests each poll
                    leader_lifecycle.catch_up()
                    calls += 1
                return leader_lifecycle.catch_up_spacing_s == heartbeat_s

            await wait_for(spaced_out, "fruitless catch-up reads to space out")
            assert leader_lifecycle.catch_ups - reads <= 3 < calls

    asyncio.run(scenario())


@pytest.mark.cluster
def test_metadata_disagreements_are_retried_soon_then_less_often(tmp_path: Path) -> None:
    """A follower refused for a metadata disagreement (the leader does not know the partition
    or epoch; it is not the leader, or still opening the replica) fetches that partition
    again after METADATA_RETRY_MS, doubled for each such refusal in a row up to
    replica.fetch.backoff.ms; another error waits the whole backoff; a served fetch starts the
    count again. A refusal that says this follower may be behind makes it read the metadata
    store (its own catch-up)."""

    async def scenario() -> None:
        async with running(tmp_path, **{"replica.fetch.backoff.ms": 1_000}) as cluster:
            await cluster.create_topic(TOPIC)
            leader = await steady(cluster, TOPIC)
            follower = next(i for i in cluster.brokers if i != leader)
            (fetcher,) = fetchers_of(cluster, follower)
            key = TopicPartition(TOPIC, 0)
            replica = cluster.replicas(TOPIC)[follower]
            # served once (a refusal while the leader opened its replica may come first)
            await cluster.produce(TOPIC, 0, [b"served"])
            await wait_for(lambda: key not in fetcher._disagreements, "a served fetch")

            def delay_after(error: type[Exception]) -> float:
                before = time.monotonic()
                fetcher._delay(key, error)
                due: float = fetcher._delayed.pop(key)
                return due - before

            schedule = [delay_after(NotLeaderOrFollowerError) for _ in range(6)]
            expected = [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]
            assert all(e <= d < e + 0.05 for d, e in zip(schedule, expected, strict=True)), schedule
            assert delay_after(UnknownTopicOrPartitionError) >= 1.0  # still in a row
            assert delay_after(KafkaStorageError) >= 1.0  # not a disagreement: the backoff
            fetcher._disagreements.pop(key)
            assert delay_after(UnknownLeaderEpochError) < 0.1  # a new run starts at the bottom
            # served again: the run ends (the fetcher fetches it with the next response)
            await cluster.produce(TOPIC, 0, [b"served again"])
            await wait_for(lambda: key not in fetcher._disagreements, "a served fetch")
            await wait_for(lambda: replica.log.durable_end_offset == 2, "the record replicated")

            lifecycle = cluster.brokers[follower].lifecycle
            assert lifecycle is not None
            reads = lifecycle.catch_ups
            part = p.FetchResponsePartition(
                partition_index=0, error_code=NotLeaderOrFollowerError.code or -1
            )
            deadline = time.monotonic() + DEADLINE_S  # past the spacing of an earlier read
            while lifecycle.catch_ups == reads:
                assert not await fetcher._settle(replica, part)
                assert time.monotonic() < deadline, "the refusal started no catch-up read"
                await asyncio.sleep(0.01)

    asyncio.run(scenario())


class StorageRequests:
    """A storage observer counting every operation (as the metrics endpoint's does)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, op: str, seconds: float, err: BaseException | None) -> None:
        self.count += 1


@pytest.mark.cluster
@pytest.mark.parametrize("wal", [True, False], ids=["wal", "segments"])
def test_an_idle_broker_makes_no_storage_request(tmp_path: Path, wal: bool) -> None:
    """L10/L13: the periodic checkpoint writes only logs that changed since their last
    checkpoint (over the WAL: the broker checkpoint only when an HW moved). After traffic, once
    the checkpoints caught up, idle checkpoint rounds make no storage request at all (no
    checkpoint, no flush) on any broker, in either layout."""

    async def scenario() -> None:
        async with running(
            tmp_path,
            **{
                "replica.fetch.wait.max.ms": 50,
                "log.checkpoint.interval.ms": 100,
                "log.wal.enable": wal,
            },
        ) as cluster:
            await cluster.create_topic(TOPIC, 2)
            for index in range(2):
                await cluster.produce(TOPIC, index, [b"a", b"b"])
                await steady(cluster, TOPIC, index)
            requests = StorageRequests()
            rms = [cluster.rm(i) for i in cluster.brokers]
            for rm in rms:
                rm.storage.observer = requests
                for part in rm.partitions.values():
                    part.log.storage.observer = requests

            def settled() -> bool:
                return all(
                    not part.log.checkpoint_needed()
                    and part.log.high_watermark == part.log.log_end_offset
                    for rm in rms
                    for part in rm.partitions.values()
                ) and all(
                    # over the WAL the HWs live in the broker checkpoint: it caught up too
                    rm.wal_writer is None or rm._hw_written == rm._wal_high_watermarks()
                    for rm in rms
                )

            await wait_for(settled, "every replica's HW at its end, checkpointed")
            before = requests.count, [rm.checkpoints for rm in rms]
            rounds = [rm.checkpoint_rounds for rm in rms]
            await wait_for(
                lambda: all(
                    rm.checkpoint_rounds >= n + 3 for rm, n in zip(rms, rounds, strict=True)
                ),
                "three idle checkpoint rounds on every broker",
            )
            assert (requests.count, [rm.checkpoints for rm in rms]) == before

    asyncio.run(scenario())


@pytest.mark.unit
def test_checkpoint_is_written_only_when_the_log_changed() -> None:
    """Log.checkpoint skips a write that would repeat the last one; any change to what the
    checkpoint records (objects, HW, log start, epochs) makes the next one write."""
    from logstore.log import Log

    storage = Storage.from_url("memory://lat-checkpoint-on-change/t/0")
    requests = StorageRequests()
    storage.observer = requests
    plog = Log.open(storage)
    assert plog.checkpoint() is True
    assert plog.checkpoint() is False
    assert not plog.checkpoint_needed()
    plog.append(build([Record(None, b"v", 0)]), leader_epoch=0)
    plog.flush()
    assert plog.checkpoint_needed()
    assert plog.checkpoint() is True
    plog.update_high_watermark(1)
    assert plog.checkpoint() is True
    count = requests.count
    assert plog.checkpoint() is False
    assert requests.count == count
    plog.close()
    assert requests.count == count  # close: nothing to flush, the checkpoint is current


@pytest.mark.unit
def test_read_from_memory_returns_what_read_returns_or_none() -> None:
    """L4: Log.read_from_memory answers exactly what Log.read would (same batches, same
    budget rules) when every byte is unflushed or in the tail cache as written by this
    process; bytes it would have to read from storage, or cached from a storage read (not
    CRC-checked yet), make it answer None so that the caller takes the checked path."""
    from logstore.log import Log

    url = "memory://lat-read-from-memory/t/0"
    plog = Log.open(Storage.from_url(url))
    for n in range(12):
        plog.append(build([Record(None, f"v{n}".encode() * (n + 1), 0)]), leader_epoch=0)
        if n % 3 == 2:
            plog.flush()  # objects [0,3), [3,6), [6,9), [9,12) ...
    plog.append(build([Record(None, b"tail", 0)]), leader_epoch=0)  # unflushed: 12
    cases = [
        (offset, max_bytes, max_offset, first)
        for offset in (0, 2, 3, 7, 11, 12, 13)
        for max_bytes in (1, 150, 1 << 20)
        for max_offset in (None, 5, 12)
        for first in (True, False)
    ]
    for offset, max_bytes, max_offset, first in cases:
        expected = plog.read(offset, max_bytes, max_offset=max_offset, min_one_batch=first)
        got = plog.read_from_memory(offset, max_bytes, max_offset=max_offset, min_one_batch=first)
        assert got == expected, (offset, max_bytes, max_offset, first)
    assert plog.read_from_memory(14, 100) is None  # out of range: read raises the error
    plog.close()

    reopened = Log.open(Storage.from_url(url))
    assert reopened.read_from_memory(0, 1 << 20) is None  # on storage only
    assert reopened.read(0, 1 << 20)  # loads the first object's index into the cache
    assert reopened.read_from_memory(0, 100) is None  # cached from storage: not checked yet
    reopened.close()


@pytest.mark.cluster
def test_leader_serves_follower_fetches_from_memory(tmp_path: Path) -> None:
    """L4: the followers of a steady partition fetch what the leader just appended (or just
    flushed): the leader serves those reads from memory, without a worker-thread read."""

    async def scenario() -> None:
        async with running(tmp_path, **{"replica.fetch.wait.max.ms": 50}) as cluster:
            await cluster.create_topic(TOPIC)
            await cluster.produce(TOPIC, 0, [b"first"])
            leader = await steady(cluster, TOPIC)
            rm = cluster.rm(leader)
            before = rm.memory_reads, rm.storage_reads
            for n in range(5):
                await cluster.produce(TOPIC, 0, [f"v{n}".encode()])
            assert rm.storage_reads == before[1]
            assert rm.memory_reads > before[0]

    asyncio.run(scenario())


@pytest.mark.unit
def test_leader_append_checks_each_crc_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """L9: a caller that parsed and CRC-checked the batches (the partition, for its producer
    state) hands them to Log.append, which does not check them again; without them the log
    checks every batch itself, and a corrupt batch is still refused."""
    from logstore.batch import RecordBatch, iter_batches
    from logstore.errors import CorruptRecordError
    from logstore.log import Log

    checks = 0
    real = RecordBatch.ensure_valid

    def counted(self: RecordBatch) -> None:
        nonlocal checks
        checks += 1
        real(self)

    monkeypatch.setattr(RecordBatch, "ensure_valid", counted)
    plog = Log.open(Storage.from_url("memory://lat-crc-once/t/0"))
    data = build([Record(None, b"a", 0)]) + build([Record(None, b"b", 0)])
    batches = list(iter_batches(data, validate=True))
    assert checks == 2
    plog.append(data, leader_epoch=0, batches=batches)
    assert checks == 2
    plog.append(data, leader_epoch=0)
    assert checks == 4
    corrupt = bytearray(build([Record(None, b"c", 0)]))
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        plog.append(bytes(corrupt), leader_epoch=0)
    assert plog.log_end_offset == 4


@pytest.mark.unit
def test_checkpoint_does_not_wait_for_a_flush_in_progress() -> None:
    """L10: a checkpoint takes neither the flush lock (a partition's flush, on the acks=all
    path, never waits for a checkpoint being built) nor the state lock beyond its snapshot.
    With the flush lock held elsewhere, a checkpoint still completes and is written."""
    import threading

    from logstore.log import Log

    plog = Log.open(Storage.from_url("memory://lat-checkpoint-no-flush-lock/t/0"))
    plog.append(build([Record(None, b"v", 0)]), leader_epoch=0)
    plog.flush()
    written: list[bool] = []
    with plog._flush_lock:  # a flush in progress in another thread
        worker = threading.Thread(target=lambda: written.append(plog.checkpoint()))
        worker.start()
        worker.join(DEADLINE_S)
        assert not worker.is_alive(), "the checkpoint waited for the flush lock"
    assert written == [True]
    plog.close()
