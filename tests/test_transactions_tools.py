"""The transactions tools against real brokers: describe (DescribeTransactions), describe
producers (DescribeProducers), find-hanging and abort (WriteTxnMarkers), as kafka-transactions.sh
has them; and ``__transaction_state`` snapshots surviving a coordinator SIGKILL.

The hanging transaction is made the way one happens: transactional records reach a partition
from a producer the coordinator has no transaction of (a raw Produce of a transactional batch
with a producer id from InitProducerId, never added to a transaction). Nothing will write its
marker: the partition's LSO stays at its first offset until ``replog transactions abort``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from logstore.batch import Record, build
from replication import protocol as p
from replication.client import Admin, Consumer, Producer, TopicPartition
from replication.coordinator.transaction import TRANSACTION_TOPIC
from replication.errors import (
    ReplogError,
    TransactionalIdNotFoundError,
    UnknownTopicOrPartitionError,
)
from replication.tools.cli_transactions import transactions_app
from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.readback import read_to_end
from tests.wire import RawConnection, produce

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

FAST = {"linger_ms": 2, "retry_backoff_ms": 20, "request_timeout_ms": 10_000}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("txn-tools"), brokers=3)
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Iterator[Admin]:
    with Admin(bootstrap_servers=cluster.bootstrap, default_api_timeout_ms=30_000) as client:
        yield client


def leader_of(admin: Admin, tp: TopicPartition) -> int:
    def known() -> list[int]:
        try:
            parts = admin.describe_topic(tp.topic).partitions
        except UnknownTopicOrPartitionError:
            return []  # not in the answering broker's metadata yet
        leader = parts[tp.partition].leader
        return [leader] if leader >= 0 else []

    found: list[int] = wait_until(known, message=f"a leader of {tp}")
    return found[0]


def committed_end(bootstrap: str, tp: TopicPartition) -> int:
    with Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed") as consumer:
        return int(consumer.end_offsets([tp])[tp])


def cli(*args: str) -> Any:
    return CliRunner().invoke(transactions_app, list(args))


def test_a_hanging_transaction_is_found_and_aborting_it_moves_the_lso(
    cluster: Cluster, admin: Admin
) -> None:
    bootstrap = cluster.bootstrap
    topic = unique_name("hanging")
    admin.create_topic(topic, 2, 3, {"min.insync.replicas": "2"})
    hung, other = TopicPartition(topic, 0), TopicPartition(topic, 1)
    leader = leader_of(admin, hung)
    with Producer(bootstrap_servers=bootstrap, **FAST) as plain:
        for i in range(3):
            plain.send(topic, b"before-%d" % i, partition=0).result()

    # a transaction the coordinator knows, open on both partitions: not hanging
    transactional_id = unique_name("tx-open")
    ongoing = Producer(bootstrap_servers=bootstrap, transactional_id=transactional_id, **FAST)
    ongoing.init_transactions()
    ongoing.begin_transaction()
    ongoing.send(topic, b"open", partition=1)
    ongoing.flush()

    # the hanging one: transactional records at offsets 3..4 the coordinator knows nothing of
    address = cluster.brokers[leader].bootstrap
    with RawConnection(address) as conn:
        init = conn.request(p.ApiKey.INIT_PRODUCER_ID, p.InitProducerIdRequest())
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        batch = build(
            [Record(None, b"hung-%d" % i, time.time_ns() // 1_000_000) for i in range(2)],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            is_transactional=True,
        )
        answer = produce(conn, topic, 0, batch)
        assert answer.responses[0].partition_responses[0].error_code == 0
    with Producer(bootstrap_servers=bootstrap, **FAST) as plain:
        plain.send(topic, b"after", partition=0).result()
    assert committed_end(bootstrap, hung) == 3  # the LSO is stuck at the hanging transaction

    producers = admin.describe_producers([hung])[hung]
    assert [
        (s.producer_id, s.current_transaction_start_offset)
        for s in producers
        if s.current_transaction_start_offset >= 0
    ] == [(pid, 3)]

    # describe: the coordinator's view of the known transaction
    described = admin.describe_transactions([transactional_id])[transactional_id]
    assert described.state == "Ongoing"
    assert other in described.partitions
    shown = cli(
        "describe",
        "--bootstrap-server",
        bootstrap,
        "--transactional-id",
        transactional_id,
        "--json",
    )
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["state"] == "Ongoing"
    unknown = cli("describe", "--bootstrap-server", bootstrap, "--transactional-id", "nope-x")
    assert unknown.exit_code == 1
    assert "transactional id 'nope-x'" in unknown.output
    assert "knows no such transactional id" in unknown.output
    with pytest.raises(TransactionalIdNotFoundError):
        admin.describe_transactions(["nope-x"])

    # find-hanging on every broker: only the crafted one, on the broker that leads it
    found: list[dict[str, Any]] = []
    for broker_id in cluster.brokers:
        result = cli(
            "find-hanging",
            "--bootstrap-server",
            bootstrap,
            "--broker-id",
            str(broker_id),
            "--max-transaction-timeout",
            "0",
            "--json",
        )
        assert result.exit_code == 0, result.output
        found += [dict(r, broker=broker_id) for r in json.loads(result.output)]
    assert [
        (r["broker"], r["topic"], r["partition"], r["producer_id"], r["start_offset"])
        for r in found
    ] == [(leader, topic, 0, pid, 3)]
    # ... and not while it is younger than the max transaction timeout (15 minutes)
    young = cli("find-hanging", "--bootstrap-server", bootstrap, "--broker-id", str(leader))
    assert "no hanging transactions" in young.output

    bad = cli("abort", "--bootstrap-server", bootstrap, "--topic", topic, "--partition", "0")
    assert bad.exit_code == 1
    assert "--start-offset" in bad.output
    aborted = cli(
        "abort",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--partition",
        "0",
        "--start-offset",
        "3",
    )
    assert aborted.exit_code == 0, aborted.output

    # the LSO moves past it: read_committed readers get everything but its records
    wait_until(lambda: committed_end(bootstrap, hung) == 7, message="the LSO past the abort")
    values = [
        r.value for r in read_to_end(bootstrap, [hung], isolation_level="read_committed").records
    ]
    assert values == [b"before-0", b"before-1", b"before-2", b"after"]
    again = cli(
        "find-hanging",
        "--bootstrap-server",
        bootstrap,
        "--broker-id",
        str(leader),
        "--max-transaction-timeout",
        "0",
        "--json",
    )
    assert json.loads(again.output) == []

    ongoing.commit_transaction()
    ongoing.close()
    assert [
        r.value for r in read_to_end(bootstrap, [other], isolation_level="read_committed").records
    ] == [b"open"]


def test_transaction_log_snapshots_survive_a_coordinator_sigkill(
    cluster: Cluster, admin: Admin
) -> None:
    """Enough transactions for several snapshots of __transaction_state, then the coordinator
    is SIGKILLed: the new one loads from the moved log start and every id is where it was."""
    bootstrap = cluster.bootstrap
    topic = unique_name("snap")
    admin.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    ids = [unique_name(f"tx-snap-{i}") for i in range(4)]
    producers = {t: Producer(bootstrap_servers=bootstrap, transactional_id=t, **FAST) for t in ids}
    killed: list[int] = []
    try:
        for prod in producers.values():
            prod.init_transactions()
        # 3 records per transaction: 1,000 records since the last snapshot make the next one due
        for i in range(400):
            prod = producers[ids[i % len(ids)]]
            prod.begin_transaction()
            prod.send(topic, b"%d" % i, partition=0)
            prod.commit_transaction()
        log_start = TopicPartition(TRANSACTION_TOPIC, 0)
        assert admin.list_offsets({log_start: "earliest"})[log_start] > 0  # snapshots cut it
        before = admin.describe_transactions(ids)
        coordinator = leader_of(admin, log_start)
        cluster.brokers[coordinator].kill()
        killed.append(coordinator)
        wait_until(
            lambda: leader_of(admin, log_start) != coordinator,
            timeout=60,
            message="a new transaction coordinator",
        )
        after = wait_until(
            lambda: _describe(admin, ids), timeout=60, message="the new coordinator loaded"
        )
        assert {t: (d.producer_id, d.producer_epoch, d.state) for t, d in after.items()} == {
            t: (d.producer_id, d.producer_epoch, d.state) for t, d in before.items()
        }
        prod = producers[ids[0]]
        prod.begin_transaction()
        prod.send(topic, b"after-failover", partition=0)
        prod.commit_transaction()
        values = [
            r.value
            for r in read_to_end(
                bootstrap, [TopicPartition(topic, 0)], isolation_level="read_committed"
            ).records
        ]
        assert len(values) == 401
        assert values[-1] == b"after-failover"
    finally:
        for prod in producers.values():
            prod.close()
        for broker_id in killed:
            cluster.brokers[broker_id].start()


def _describe(admin: Admin, ids: list[str]) -> Any:
    try:
        return admin.describe_transactions(ids, timeout_ms=5_000)
    except ReplogError:  # polled until the new coordinator answers
        return None
