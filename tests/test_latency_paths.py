"""The acks=all critical path waits for data, not for timers (issue 19, WP3 step A).

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
from replication import protocol as p
from replication.broker.partition import Partition
from replication.broker.replica_manager import ReplicaManager
from replication.common import TopicPartition
from replication.config import broker_config_from
from replication.protocol.rpc import AsyncConnection
from replication.server.node import Node
from tests.cluster import FAST_FAILOVER

pytestmark = pytest.mark.cluster

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

    async def create_topic(self, name: str, partitions: int = 1, rf: int = 3) -> None:
        node = self.brokers[0]
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
