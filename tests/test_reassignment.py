"""Partition operations on real broker processes: moving a partition under acks=all load
(KIP-455), a throttled move cancelled half-way, preferred leader elections (asked for and
automatic) and a broker decommission, driven through the `replog` CLI where an operator would.

Acked records are the point: a move keeps the old and new replicas in the ISR until every new
one has caught up, so nothing acked is lost and an idempotent producer writes nothing twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from logstore.log import open_replica_log
from logstore.storage import Storage
from replication.client import Admin, Producer, TopicPartition
from replication.client.describe import describe_topic_waiting
from replication.client.types import PartitionInfo
from replication.metadata.store import MetadataStore
from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.readback import read_to_end

pytestmark = pytest.mark.cluster

NO_REBALANCE = {"auto.leader.rebalance.enable": "false"}


def replog(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}{result.stdout}"
    return result.stdout


def replicas(admin: Admin, topic: str, partition: int = 0) -> tuple[int, ...]:
    return describe_topic_waiting(admin, topic).partitions[partition].replicas


def partition_dir(cluster: Cluster, broker: int, topic: str, partition: int = 0) -> Path:
    return cluster.brokers[broker].data_dir / "logs" / topic / str(partition)


def stored_bytes(cluster: Cluster, broker: int, topic: str, partition: int = 0) -> int:
    """Bytes of a replica's log on its broker's file storage, in either layout (its segment
    objects, or its chunks of the broker's WAL objects), as recovery reads them (read-only)."""
    if not partition_dir(cluster, broker, topic, partition).exists():
        return 0
    root = Storage.from_url(cluster.brokers[broker].log_dir)
    plog = open_replica_log(root, topic, partition, read_only=True)
    try:
        return plog.size_in_bytes
    finally:
        plog.close()


def place(admin: Admin, topic: str, target: list[int]) -> None:
    """Put partition 0 of ``topic`` on ``target`` (a move of an empty log: quick)."""
    if list(replicas(admin, topic)) != target:
        admin.alter_partition_reassignments({(topic, 0): target})
        wait_until(
            lambda: list(replicas(admin, topic)) == target,
            timeout=60,
            message=f"{topic} placed on {target}",
        )


def reassignment_file(tmp_path: Path, topic: str, target: list[int]) -> Path:
    path = tmp_path / f"move-{topic}.json"
    path.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": target}]}
        )
    )
    return path


class AckedLoad:
    """A thread sending unique values with an idempotent acks=all Producer; ``acked`` holds
    every value whose send succeeded, ``failed`` the errors of those that did not."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5
        )
        self.acked: list[bytes] = []
        self.failed: list[BaseException] = []
        self._futures: list[tuple[bytes, Future[Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="acked-load", daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            value = f"{self.topic}-{n}".encode()
            self._futures.append((value, self.producer.send(self.topic, value, partition=0)))
            self._stop.wait(0.003)

    def start(self) -> AckedLoad:
        self._thread.start()
        return self

    def acked_so_far(self) -> int:
        return sum(1 for _, f in list(self._futures) if f.done() and f.exception() is None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.producer.flush(timeout=120)
        for value, future in self._futures:
            error = future.exception()
            if error is None:
                self.acked.append(value)
            else:
                self.failed.append(error)
        self.producer.close()


def test_a_partition_moves_under_acks_all_load_and_loses_nothing(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster: Cluster = cluster_factory(brokers=4, overrides=NO_REBALANCE)
    topic = unique_name("moving")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
        place(admin, topic, [0, 1, 2])
        admin.elect_leaders("preferred", [(topic, 0)])  # 0 leads: the move hands leadership on
        wait_until(
            lambda: describe_topic_waiting(admin, topic).partitions[0].leader == 0,
            timeout=30,
            message="broker 0 leading",
        )
        load = AckedLoad(cluster.bootstrap, topic).start()
        wait_until(lambda: load.acked_so_far() >= 200, timeout=60, message="records acked")
        move = reassignment_file(tmp_path, topic, [1, 2, 3])
        out = ok(
            replog(
                "partitions", "reassign", "--bootstrap-server", cluster.bootstrap,
                "--reassignment-json-file", str(move),
            )
        )  # fmt: skip
        assert '"replicas": [0, 1, 2]' in out  # the rollback plan
        assert f"Successfully started partition reassignments for {topic}-0" in out

        def verified() -> bool:
            status = ok(
                replog(
                    "partitions", "reassign", "--bootstrap-server", cluster.bootstrap,
                    "--reassignment-json-file", str(move), "--verify",
                )
            )  # fmt: skip
            return f"Reassignment of partition {topic}-0 is complete." in status

        wait_until(verified, timeout=120, interval=0.5, message="the move verified complete")
        acked_at_completion = load.acked_so_far()
        # the producer follows the new leader: it keeps being acked after the move
        wait_until(
            lambda: load.acked_so_far() >= acked_at_completion + 100,
            timeout=60,
            message="records acked after the move",
        )
        load.stop()
        assert load.failed == []

        def moved() -> PartitionInfo | None:
            part = describe_topic_waiting(admin, topic).partitions[0]
            return part if part.replicas == (1, 2, 3) else None

        final = wait_until(moved, timeout=30, message="every broker's metadata showing the move")
        assert final.replicas == (1, 2, 3)
        assert final.leader in (1, 2, 3)
        assert set(final.isr) <= {1, 2, 3}
        assert admin.list_partition_reassignments() == {}

    read = read_to_end(cluster.bootstrap, [TopicPartition(topic, 0)], timeout=120)
    values = [r.value for r in read.records]
    assert len(values) == len(set(values)), "a record was written twice"
    assert set(load.acked) <= set(values), "an acked record was lost"
    assert len(values) == len(load.acked)
    # the old replica's storage is released
    wait_until(
        lambda: not partition_dir(cluster, 0, topic).exists(),
        timeout=30,
        message="broker 0's replica deleted",
    )
    assert stored_bytes(cluster, 3, topic) > 0


def test_a_throttled_move_stays_in_progress_and_cancel_reverts(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster: Cluster = cluster_factory(brokers=4, overrides=NO_REBALANCE)
    topic = unique_name("throttled")
    rate = 5_000
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topic(topic, 1, 3)
        place(admin, topic, [0, 1, 2])
        # one record per batch: a throttled fetch still returns one whole batch
        with Producer(bootstrap_servers=cluster.bootstrap, acks="all", batch_size=1024) as producer:
            for n in range(300):
                producer.send(topic, f"{n:04d}".encode() * 250, partition=0)
            producer.flush(timeout=60)
        move = reassignment_file(tmp_path, topic, [1, 2, 3])
        ok(
            replog(
                "partitions", "reassign", "--bootstrap-server", cluster.bootstrap,
                "--reassignment-json-file", str(move), "--throttle", str(rate),
            )
        )  # fmt: skip
        new_replica = partition_dir(cluster, 3, topic)
        fetched = wait_until(
            lambda: (n := stored_bytes(cluster, 3, topic)) >= 2 * rate and n,
            timeout=60,
            message="the new replica fetching",
        )
        # throttled: fetching, yet far behind the leader (unthrottled, a few fetches copy it all)
        assert fetched < stored_bytes(cluster, 0, topic) // 2, fetched
        ongoing = admin.list_partition_reassignments()
        assert TopicPartition(topic, 0) in ongoing  # 300 KB at 5 KB/s cannot be done yet
        assert ongoing[TopicPartition(topic, 0)].adding_replicas == (3,)
        assert ongoing[TopicPartition(topic, 0)].removing_replicas == (0,)
        status = ok(
            replog(
                "partitions", "reassign", "--bootstrap-server", cluster.bootstrap,
                "--reassignment-json-file", str(move), "--verify",
            )
        )  # fmt: skip
        assert "is still in progress" in status
        assert "adding [3], removing [0]" in status

        out = ok(
            replog(
                "partitions", "reassign", "--bootstrap-server", cluster.bootstrap,
                "--reassignment-json-file", str(move), "--cancel",
            )
        )  # fmt: skip
        assert f"Successfully cancelled partition reassignments for: {topic}-0" in out
        assert admin.list_partition_reassignments() == {}
        wait_until(  # the brokers' metadata follows the controller's
            lambda: set(replicas(admin, topic)) == {0, 1, 2},
            timeout=30,
            message="the original replicas back",
        )
    wait_until(lambda: not new_replica.exists(), timeout=30, message="broker 3's replica deleted")
    read = read_to_end(cluster.bootstrap, [TopicPartition(topic, 0)], timeout=60)
    assert len(read.records) == 300


def kill_and_restart_the_preferred_leader(cluster: Cluster, admin: Admin, topic: str) -> int:
    preferred = replicas(admin, topic)[0]
    wait_until(
        lambda: describe_topic_waiting(admin, topic).partitions[0].leader == preferred,
        timeout=30,
        message="the preferred replica leading at first",
    )
    cluster.brokers[preferred].kill()
    wait_until(
        lambda: describe_topic_waiting(admin, topic).partitions[0].leader not in (-1, preferred),
        timeout=60,
        message="leadership moved off the killed broker",
    )
    cluster.brokers[preferred].start()
    wait_until(
        lambda: preferred in describe_topic_waiting(admin, topic).partitions[0].isr,
        timeout=90,
        message="the restarted broker back in the ISR",
    )
    return preferred


def test_preferred_leader_election_moves_leadership_back(cluster_factory: Any) -> None:
    cluster: Cluster = cluster_factory(brokers=3, overrides=NO_REBALANCE)
    topic = unique_name("preferred")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topic(topic, 1, 3)
        preferred = kill_and_restart_the_preferred_leader(cluster, admin, topic)
        assert (
            describe_topic_waiting(admin, topic).partitions[0].leader != preferred
        )  # no auto rebalance
        out = ok(
            replog(
                "partitions", "elect-leaders", "--bootstrap-server", cluster.bootstrap,
                "--election-type", "preferred", "--topic", topic, "--partition", "0",
            )
        )  # fmt: skip
        assert f"Successfully completed leader election (preferred) for partitions {topic}-0" in out
        wait_until(  # the brokers' metadata follows the controller's
            lambda: describe_topic_waiting(admin, topic).partitions[0].leader == preferred,
            timeout=30,
            message="the preferred replica leading",
        )
        again = ok(
            replog(
                "partitions", "elect-leaders", "--bootstrap-server", cluster.bootstrap,
                "--election-type", "preferred", "--all-topic-partitions",
            )
        )  # fmt: skip
        assert "No partition needed an election." in again


def test_auto_leader_rebalance_moves_leadership_back_without_a_request(
    cluster_factory: Any,
) -> None:
    cluster: Cluster = cluster_factory(
        brokers=3, overrides={"leader.imbalance.check.interval.seconds": "1"}
    )
    topic = unique_name("rebalanced")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topic(topic, 1, 3)
        preferred = kill_and_restart_the_preferred_leader(cluster, admin, topic)
        wait_until(
            lambda: describe_topic_waiting(admin, topic).partitions[0].leader == preferred,
            timeout=60,
            message="the controller moving leadership back to the preferred replica",
        )


def test_decommission_empties_a_broker_and_unregisters_it_once_stopped(
    cluster_factory: Any,
) -> None:
    cluster: Cluster = cluster_factory(brokers=4, overrides=NO_REBALANCE)
    topic = unique_name("decommission")
    bootstrap = cluster.bootstrap
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topic(topic, 4, 2)
        with Producer(bootstrap_servers=bootstrap, acks="all") as producer:
            for n in range(200):
                producer.send(topic, f"r{n}".encode(), partition=n % 4)
            producer.flush(timeout=60)
        held = [
            p.partition for p in describe_topic_waiting(admin, topic).partitions if 3 in p.replicas
        ]
        assert held  # four partitions over four brokers: broker 3 holds some
        refused = replog(
            "brokers", "unregister", "--bootstrap-server", bootstrap, "--broker-id", "3"
        )
        assert refused.returncode == 1
        assert "still holds replicas" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1

        out = ok(
            replog("brokers", "decommission", "--bootstrap-server", bootstrap, "--broker-id", "3")
        )
        assert f"Moving {len(held)} partition(s) off broker 3" in out
        assert "Broker 3 holds no replicas." in out
        assert "is still running: stop it" in out
        wait_until(
            lambda: all(
                3 not in part.replicas for part in describe_topic_waiting(admin, topic).partitions
            ),
            timeout=30,
            message="every broker's metadata without broker 3's replicas",
        )
        for part in describe_topic_waiting(admin, topic).partitions:
            assert len(part.replicas) == 2
        for index in held:
            wait_until(
                lambda index=index: not partition_dir(cluster, 3, topic, index).exists(),
                timeout=30,
                message=f"broker 3's replica of partition {index} deleted",
            )
        cluster.brokers[3].kill()
        wait_until(
            lambda: 3 not in [b.node_id for b in admin.describe_cluster().brokers],
            timeout=30,
            message="broker 3 fenced",
        )
    bootstrap = cluster.bootstrap
    out = ok(replog("brokers", "unregister", "--bootstrap-server", bootstrap, "--broker-id", "3"))
    assert "Broker 3 unregistered." in out
    store = MetadataStore(Storage.from_url(cluster.metadata_root))
    assert store.read_latest().broker(3) is None
    read = read_to_end(bootstrap, [TopicPartition(topic, i) for i in range(4)], timeout=60)
    assert len(read.records) == 200


def test_kafka_admin_clients_move_partitions_and_elect_leaders(cluster_factory: Any) -> None:
    """Kafka's own admin clients through the Kafka listener: kafka-python's
    alter/list_partition_reassignments, confluent-kafka's elect_leaders."""
    from confluent_kafka import ElectionType
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    from confluent_kafka.admin import AdminClient
    from kafka import TopicPartition as PyTopicPartition
    from kafka.admin import KafkaAdminClient

    cluster: Cluster = cluster_factory(brokers=4, overrides=NO_REBALANCE, kafka=True)
    topic = unique_name("kafka-moved")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topic(topic, 1, 3)
        place(admin, topic, [0, 1, 2])
        admin.elect_leaders("preferred", [(topic, 0)])
        wait_until(
            lambda: describe_topic_waiting(admin, topic).partitions[0].leader == 0,
            timeout=30,
            message="broker 0 leading",
        )
        py_admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        try:
            py_admin.alter_partition_reassignments({PyTopicPartition(topic, 0): [3, 0, 1]})
            wait_until(
                lambda: list(replicas(admin, topic)) == [3, 0, 1],
                timeout=60,
                message="the move asked through kafka-python completed",
            )
            assert py_admin.list_partition_reassignments() == {}
        finally:
            py_admin.close()
        # kept its lead: asked of a broker whose metadata has the completed move (each
        # Metadata request may go to another broker, and one may still be catching up)
        moved = wait_until(
            lambda: next(
                (
                    p
                    for p in describe_topic_waiting(admin, topic).partitions
                    if p.replicas == (3, 0, 1)
                ),
                None,
            ),
            timeout=30,
            message="a broker's metadata with the completed move",
        )
        assert moved.leader == 0
        confluent = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
        elected = confluent.elect_leaders(
            ElectionType.PREFERRED, [KafkaTopicPartition(topic, 0)]
        ).result(timeout=60)
        assert [(tp.topic, tp.partition, tp.error) for tp in elected] == [(topic, 0, None)]
        wait_until(
            lambda: describe_topic_waiting(admin, topic).partitions[0].leader == 3,
            timeout=30,
            message="broker 3 leading after the preferred election",
        )


def test_a_replica_moved_away_while_its_broker_was_down_is_deleted_when_it_returns(
    cluster_factory: Any,
) -> None:
    cluster: Cluster = cluster_factory(brokers=4, overrides=NO_REBALANCE)
    topic = unique_name("stray")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topic(topic, 1, 3)
        place(admin, topic, [0, 1, 2])
        with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
            for n in range(50):
                producer.send(topic, f"s{n}".encode(), partition=0)
            producer.flush(timeout=60)
        stray = partition_dir(cluster, 0, topic)
        assert stored_bytes(cluster, 0, topic) > 0
        cluster.brokers[0].kill()
        wait_until(
            lambda: 0 not in describe_topic_waiting(admin, topic).partitions[0].isr,
            timeout=60,
            message="broker 0 out of the ISR",
        )
        # 0 is only being removed: the move completes without it
        admin.alter_partition_reassignments({(topic, 0): [1, 2, 3]})
        wait_until(
            lambda: list(replicas(admin, topic)) == [1, 2, 3],
            timeout=60,
            message="the move completed while broker 0 was down",
        )
        assert stray.exists()
        cluster.brokers[0].start()
        wait_until(lambda: not stray.exists(), timeout=60, message="the stray replica deleted")
    read = read_to_end(cluster.bootstrap, [TopicPartition(topic, 0)], timeout=60)
    assert len(read.records) == 50
