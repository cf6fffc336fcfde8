"""Offsets committed inside a transaction (Producer.send_offsets_to_transaction): visible with
the transaction's commit, never after an abort, kept across a broker's SIGKILL and restart, and
refused for a consumer that is no longer part of its group's generation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from replication.client import (
    Admin,
    ConsumerGroupMetadata,
    NewTopic,
    Producer,
    TopicPartition,
)
from replication.errors import CommitFailedError
from tests.cluster import BrokerProcess, wait_until
from tests.helpers import kill_while_running_then_finish, unique_name
from tests.readback import read_to_end

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

GROUPS = {"offsets.topic.num.partitions": "3", "group.initial.rebalance.delay.ms": "0"}


def group_offsets(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    with Admin(bootstrap_servers=bootstrap) as admin:
        return admin.list_consumer_group_offsets(group)


def test_offsets_commit_with_the_transaction_and_never_with_an_abort(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b", overrides=GROUPS).start()
    try:
        bootstrap = broker.bootstrap
        source, sink, group = unique_name("in"), unique_name("out"), unique_name("g")
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics([NewTopic(source, 2, 1), NewTopic(sink, 1, 1)])
        tp0, tp1 = TopicPartition(source, 0), TopicPartition(source, 1)
        with Producer(bootstrap_servers=bootstrap, transactional_id=unique_name("t")) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(sink, value=b"a")
            producer.send_offsets_to_transaction({tp0: 10, tp1: 3}, group)
            assert group_offsets(bootstrap, group) == {}  # not before the commit
            producer.commit_transaction()
            assert group_offsets(bootstrap, group) == {tp0: 10, tp1: 3}

            producer.begin_transaction()
            producer.send_offsets_to_transaction({tp0: 20}, group)  # offsets only, no records
            producer.abort_transaction()
            assert group_offsets(bootstrap, group) == {tp0: 10, tp1: 3}

            producer.begin_transaction()
            producer.send_offsets_to_transaction({tp1: 7}, ConsumerGroupMetadata(group))
            producer.commit_transaction()
            assert group_offsets(bootstrap, group) == {tp0: 10, tp1: 7}

        # the coordinator reads the log back: commits applied, the abort dropped
        broker.kill()
        broker.start()
        wait_until(
            lambda: group_offsets(broker.bootstrap, group) == {tp0: 10, tp1: 7},
            timeout=60,
            message="the group's offsets after the restart",
        )
    finally:
        broker.kill()


def test_offsets_of_a_member_no_longer_in_the_generation_are_refused(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b", overrides=GROUPS).start()
    try:
        bootstrap = broker.bootstrap
        source, group = unique_name("in"), unique_name("g")
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics([NewTopic(source, 1, 1)])
        stale = ConsumerGroupMetadata(group, generation_id=7, member_id="gone")
        with Producer(bootstrap_servers=bootstrap, transactional_id=unique_name("t")) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            with pytest.raises(CommitFailedError, match="must be aborted"):
                producer.send_offsets_to_transaction({TopicPartition(source, 0): 5}, stale)
            with pytest.raises(CommitFailedError):
                producer.commit_transaction()
            producer.abort_transaction()
        assert group_offsets(bootstrap, group) == {}
    finally:
        broker.kill()


ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.chaos
def test_consume_transform_produce_sigkilled_again_and_again_is_exactly_once(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path / "b", overrides=GROUPS).start()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        bootstrap = broker.bootstrap
        source, sink, group = unique_name("in"), unique_name("out"), unique_name("g")
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics([NewTopic(source, 2, 1), NewTopic(sink, 1, 1)])
        n = 3000
        with Producer(bootstrap_servers=bootstrap) as producer:
            for i in range(n):
                producer.send(source, value=f"r{i}".encode(), partition=i % 2)
        out = [TopicPartition(sink, 0)]

        def committed_output() -> list[bytes]:
            return [r.value or b"" for r in read_to_end(bootstrap, out).records]

        def start() -> subprocess.Popen[bytes]:
            with open(tmp_path / "worker.stderr", "a") as stderr:
                return subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.ctp_worker",
                        "--bootstrap",
                        bootstrap,
                        "--group",
                        group,
                        "--source",
                        source,
                        "--sink",
                        sink,
                        "--txn-id",
                        f"ctp-{group}",
                    ],
                    cwd=ROOT,
                    stderr=stderr,
                )

        values = kill_while_running_then_finish(start, committed_output, n, workers)
        assert sorted(values) == sorted(f"R{i}".encode() for i in range(n))  # once each
    finally:
        if workers and (worker := workers[-1]).poll() is None:
            worker.terminate()
            worker.wait(timeout=30)
        broker.kill()


def test_read_committed_consumers_wait_for_offsets_of_an_open_transaction(tmp_path: Path) -> None:
    from replication.client import Consumer
    from replication.errors import UnstableOffsetCommitError

    broker = BrokerProcess(tmp_path / "b", overrides=GROUPS).start()
    try:
        bootstrap = broker.bootstrap
        source, group = unique_name("in"), unique_name("g")
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics([NewTopic(source, 1, 1)])
        tp = TopicPartition(source, 0)
        with Producer(bootstrap_servers=bootstrap, transactional_id=unique_name("t")) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send_offsets_to_transaction({tp: 5}, group)
            producer.commit_transaction()
            producer.begin_transaction()
            producer.send_offsets_to_transaction({tp: 9}, group)  # open: not stable yet
            with Consumer(
                bootstrap_servers=bootstrap, group_id=group, isolation_level="read_committed"
            ) as stable:
                with pytest.raises(UnstableOffsetCommitError):
                    stable.committed([tp], timeout_ms=500)
                with Consumer(bootstrap_servers=bootstrap, group_id=group) as eager:
                    assert eager.committed([tp])[tp] == (5, None)  # read_uncommitted: as it is
                producer.commit_transaction()
                assert stable.committed([tp])[tp] == (9, None)
    finally:
        broker.kill()
